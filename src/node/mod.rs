//! Node kinds. Each kind is one file implementing [`NodeKind`] (its name, its keys, how to
//! read them) and [`NodeSpec`] (run, given a [`NodeCtx`]); [`REGISTRY`] maps `kind = "…"`
//! to it, and the pipeline's JSON Schema is generated from the registry too. The executor
//! only sees outcomes, never kind names.

use std::fmt::Debug;
use std::path::PathBuf;

use crate::diag::Diagnostics;
use crate::reason::{Failure, HaltReason, SkipReason};
use crate::state::State;
use crate::template::Tmpl;
use crate::toml_read::{Str, Table};
use crate::verdict::Verdict;

mod command;
mod commit;
pub(crate) use commit::spend_of;
pub(crate) use git_commit::{Baseline, BaselineError, Leftovers};
mod ctx;
pub(crate) mod floor_check;
mod gate;
mod git_commit;
mod harness;
mod verdict;

pub(crate) use ctx::{ArgvError, Host, NodeCtx, Settled, Spawn, Stop, TickScope, Upstream};

/// A key a node kind accepts besides the common ones, for `check` and the JSON Schema.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub name: &'static str,
    pub ty: KeyType,
    /// One line for the schema's description.
    pub about: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    String,
    StringList,
}

/// A node kind: its name, its own keys, and how to read them.
pub trait NodeKind: Sync {
    fn name(&self) -> &'static str;
    /// One line for `graph` and documentation.
    fn about(&self) -> &'static str;
    /// Keys this kind accepts besides the common ones.
    fn keys(&self) -> &'static [Key] {
        &[]
    }
    /// Reads the kind's keys, pushing every problem into `diags`.
    fn parse(&self, table: &Table<'_, '_>, diags: &mut Diagnostics) -> Option<Box<dyn NodeSpec>>;
}

/// A configured node, ready to run.
pub trait NodeSpec: Debug + Send + Sync {
    /// The role a harness node plays (`implement`, `verify`, …).
    fn role(&self) -> Option<&Str> {
        None
    }
    /// The node whose stdout a verdict node parses.
    fn reads(&self) -> Option<&Str> {
        None
    }
    /// Whether this node produces the `verdict` variable downstream.
    fn produces_verdict(&self) -> bool {
        false
    }
    /// Whether this node writes the loop's state (advances the iteration).
    fn commits(&self) -> bool {
        false
    }
    /// Whether this node applies the brakes. A pipeline without one gets them from the
    /// tick before its first node: brakes are never optional.
    fn gates(&self) -> bool {
        false
    }
    /// Whether this node runs an agent for a role (and gets the role variables).
    fn spawns(&self) -> bool {
        false
    }
    /// Whether this node runs a process at all (the brakes between nodes stop those).
    fn runs_process(&self) -> bool {
        self.spawns()
    }
    /// Whether the tick must note, before its first node, what the tree looked like
    /// (`git-commit` compares against it).
    fn wants_baseline(&self) -> bool {
        false
    }
    /// Templates in the node's own keys, checked statically against the DAG.
    fn templates(&self) -> Vec<&Tmpl> {
        Vec::new()
    }
    /// Runs the node.
    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun;
    /// What `run --dry-run` prints for this node (rendered argv, for instance).
    fn dry_run(&self, _ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(None)
    }
}

/// What a node produced, exposed downstream as `nodes.<id>.*`.
#[derive(Debug, Clone, Default)]
pub struct NodeOutput {
    pub exit_code: Option<i32>,
    pub stdout_path: Option<PathBuf>,
    pub stderr_path: Option<PathBuf>,
    /// The node's stdout text (capped), for templates and verdict parsing.
    pub output: Option<String>,
    /// The path agents may write their output file to (`{{output}}`).
    pub output_path: Option<PathBuf>,
    /// loopflow's copy of that file, taken when the node ended (what loopflow reads of it:
    /// a later node's process can rewrite `output_path`, not this).
    pub output_kept: Option<PathBuf>,
    pub verdict: Option<Verdict>,
    /// Wall time of spawned processes, counted against `max_seconds`.
    pub seconds: f64,
    /// The output was replayed from the verdict cache instead of running the process.
    pub cached: bool,
    /// Spend the agent reported in its own output (a preset's `usage` rule).
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
    /// The agent's answer extracted from its JSON output; verdict parsing reads it.
    pub answer: Option<String>,
    /// Why it failed in its own words (the error its output reports, else the tail of
    /// its stderr), for the human: `run`, `status`, `review`.
    pub why: Option<String>,
}

/// How a node ended.
#[derive(Debug)]
pub enum NodeRun {
    Ok(NodeOutput),
    /// The node failed; `on_failure` and `retries` decide what happens next.
    Failed {
        reason: Failure,
        output: NodeOutput,
    },
    /// The tick ends here as a SKIP; nothing advances.
    Skip(SkipReason),
    /// The loop halts; nothing else advances.
    Halt {
        reason: HaltReason,
        detail: Option<String>,
    },
    /// State was written; the tick counts. `halted` is set when the write also halted
    /// the loop (goal met, tampering found).
    Committed {
        state: Box<State>,
        halted: Option<HaltReason>,
    },
}

impl NodeRun {
    pub fn fail(reason: Failure) -> NodeRun {
        NodeRun::Failed {
            reason,
            output: NodeOutput::default(),
        }
    }
}

/// Every built-in node kind. Adding a kind: one file and one line here.
pub static REGISTRY: &[&dyn NodeKind] = &[
    &gate::Gate,
    &floor_check::FloorCheck,
    &harness::Harness,
    &command::Command,
    &verdict::VerdictKind,
    &commit::Commit,
    &git_commit::GitCommit,
];

pub(crate) fn kind(name: &str) -> Option<&'static dyn NodeKind> {
    REGISTRY.iter().copied().find(|k| k.name() == name)
}

pub fn kind_names() -> Vec<&'static str> {
    REGISTRY.iter().map(|k| k.name()).collect()
}

/// Common to every node kind (DESIGN §3).
pub const COMMON_KEYS: &[&str] = &[
    "kind",
    "needs",
    "timeout",
    "retries",
    "on_failure",
    "when",
    "description",
];

/// A placeholder for a node whose configuration had errors; never run.
#[derive(Debug)]
pub(crate) struct Broken;

impl NodeSpec for Broken {
    fn run(&self, _ctx: &NodeCtx<'_>) -> NodeRun {
        NodeRun::fail(Failure::InvalidConfig)
    }
}

/// How much of a node's stdout is kept in memory for `nodes.<id>.output`.
pub(crate) const OUTPUT_CAP: usize = 64 * 1024;

/// Shell-style quoting for showing an argv to people (never for running it).
pub(crate) fn show_argv(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', "'\\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}
