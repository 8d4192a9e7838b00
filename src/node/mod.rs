//! Node kinds. Each kind is one file implementing [`NodeKind`] (parse and check its own
//! keys) and [`NodeSpec`] (run given a context); [`REGISTRY`] maps `kind = "…"` to it.
//! The executor only sees outcomes, never kind names.

use std::fmt::Debug;
use std::path::PathBuf;

use crate::diag::Diagnostics;
use crate::exec::NodeCtx;
use crate::state::State;
use crate::template::Tmpl;
use crate::toml_read::{Str, Table};
use crate::verdict::Verdict;

mod command;
mod commit;
pub mod floor_check;
mod gate;
mod git_commit;
mod harness;
mod verdict;

/// A node kind: its name, its own keys, and how to read them.
pub trait NodeKind: Sync {
    fn name(&self) -> &'static str;
    /// One line for `graph` and documentation.
    fn about(&self) -> &'static str;
    /// Keys this kind accepts besides the common ones.
    fn keys(&self) -> &'static [&'static str];
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
    /// executor before its first node: brakes are never optional.
    fn gates(&self) -> bool {
        false
    }
    /// Whether this node spawns a process (and gets the role variables).
    fn spawns(&self) -> bool {
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
}

/// How a node ended.
#[derive(Debug)]
pub enum NodeRun {
    Ok(NodeOutput),
    /// The node failed; `on_failure` and `retries` decide what happens next.
    Failed {
        reason: String,
        output: NodeOutput,
    },
    /// The tick ends here as a SKIP; nothing advances.
    Skip(String),
    /// The loop halts; nothing else advances.
    Halt {
        reason: String,
        detail: Option<String>,
    },
    /// State was written; the tick counts. `halt` is set when the write also halted
    /// the loop (goal met).
    Committed {
        state: Box<State>,
        halted: Option<String>,
    },
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

pub fn kind(name: &str) -> Option<&'static dyn NodeKind> {
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
pub struct Broken;

impl NodeSpec for Broken {
    fn run(&self, _ctx: &NodeCtx<'_>) -> NodeRun {
        NodeRun::Failed {
            reason: "invalid_config".into(),
            output: NodeOutput::default(),
        }
    }
}

/// How much of a node's stdout is kept in memory for `nodes.<id>.output`.
pub const OUTPUT_CAP: usize = 64 * 1024;

/// Renders every argv element separately: one template, one argv element, no shell.
pub fn render_argv(ctx: &NodeCtx<'_>, argv: &[Tmpl]) -> Result<Vec<String>, String> {
    argv.iter()
        .map(|t| {
            ctx.render(&t.text)
                .map_err(|e| format!("argv element `{}`: {e}", t.text))
        })
        .collect()
}

/// Spawns `argv` for a node: stdout/stderr to `outputs/<N>-<id>.{stdout,stderr}`, the
/// node's timeout, the loop's environment. Non-zero exit is a failure.
pub fn spawn_node(
    ctx: &NodeCtx<'_>,
    argv: &[String],
    timeout: Option<std::time::Duration>,
) -> NodeRun {
    let id = &ctx.node.id.value;
    let stdout = ctx.output_file(id, "stdout");
    let stderr = ctx.output_file(id, "stderr");
    let record = |pgid: u32| {
        if let Some(l) = ctx.env.lock {
            l.record_group(pgid);
        }
    };
    let spec = crate::process::Spawn {
        argv,
        cwd: &ctx.env.cwd,
        env: ctx.child_env(),
        stdout: stdout.clone(),
        stderr: stderr.clone(),
        timeout,
        cancel: ctx.env.cancel,
        on_spawn: Some(&record),
    };
    let done = crate::process::run(&spec);
    // Only the capped head: a runaway agent's gigabytes stay on disk.
    let cut = crate::fs_safe::head(&stdout, OUTPUT_CAP as u64).unwrap_or_default();
    let output = NodeOutput {
        exit_code: done.exit.code(),
        stdout_path: Some(stdout),
        stderr_path: Some(stderr),
        output: Some(String::from_utf8_lossy(&cut).into_owned()),
        output_path: None,
        verdict: None,
        seconds: done.elapsed.as_secs_f64(),
        ..Default::default()
    };
    match done.exit {
        crate::process::Exit::Code(0) => NodeRun::Ok(output),
        other => NodeRun::Failed {
            reason: other.reason(),
            output,
        },
    }
}

/// Shell-style quoting for showing an argv to people (never for running it).
pub fn show_argv(argv: &[String]) -> String {
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
