//! What a node sees when it runs: the tick's shared facts ([`TickScope`]), its own id,
//! timeout and upstream outputs, its template variables (built on first use), and the
//! [`Host`] through which it spawns processes, logs events and commits state. A node kind
//! is unit-tested by handing it a scope and a host of the test's own.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use handlebars::Handlebars;
use serde_json::{Map, Value};

use super::{NodeOutput, NodeRun, OUTPUT_CAP};
use crate::brakes::GateReport;
use crate::config::LoopConfig;
use crate::lifecycle::{Committed, Delta};
use crate::process::{Exit, Finished};
use crate::reason::{Failure, HaltReason};
use crate::state::{Event, LogArg, State, StateError};
use crate::template::{self, RenderError, Tmpl, vars};
use crate::verdict::Verdict;
use crate::work_source::Task;
use crate::work_source::WorkSourceReader;

/// An argv element that did not render.
#[derive(Debug, Clone, thiserror::Error)]
#[error("argv element `{element}`: {error}")]
pub struct ArgvError {
    pub element: String,
    pub error: RenderError,
}

/// What every node of one tick shares.
pub struct TickScope<'a> {
    pub loop_name: &'a str,
    pub project: &'a Path,
    /// `outputs/` of the loop directory.
    pub outputs: &'a Path,
    /// Where agents write their `{{output}}` files: `<cwd>/.loopflow-out/<loop>/`.
    pub output_dir: &'a Path,
    /// The loop's verdict cache directory.
    pub cache_dir: &'a Path,
    /// What the tree looked like before the first node, when a node asked
    /// ([`super::NodeSpec::wants_baseline`]); `Err` says why it could not be taken.
    pub baseline: Option<&'a Result<super::git_commit::Baseline, super::git_commit::BaselineError>>,
    pub config: &'a LoopConfig,
    /// The prompt files as the load read and checked them (path, text).
    pub prompts: &'a [(std::path::PathBuf, crate::diag::SourceRef)],
    /// The state as it was when the tick started.
    pub state: &'a State,
    /// The tick number: `iteration_count + 1`.
    pub tick: u64,
    /// Where the agents work: the worktree, or the project root.
    pub cwd: &'a Path,
    /// The brakes as the tick found them (evaluated once).
    pub gate: &'a GateReport,
    /// The loop's work source, for the task after this tick.
    pub work: &'a WorkSourceReader<'a>,
    pub hb: &'a Handlebars<'static>,
    /// The variables every node shares (`loop`, `iteration`, …).
    pub vars: Map<String, Value>,
}

impl TickScope<'_> {
    /// The task this tick works on: the work source's, else the state's.
    pub fn task(&self) -> Option<&Task> {
        self.gate.task.as_ref()
    }

    /// `outputs/<N>-<name>.<ext>`
    pub fn output_file(&self, name: &str, ext: &str) -> PathBuf {
        self.outputs.join(format!("{}-{}.{}", self.tick, name, ext))
    }
}

/// Why the tick stops a node before it runs (the host's brakes between nodes).
#[derive(Debug, Clone)]
pub enum Stop {
    /// The node fails with this reason: its `on_failure` applies, its `retries` do not
    /// (what stopped it stands for the rest of the tick).
    Fail(Failure),
    /// The loop halts here; nothing else runs.
    Halt(HaltReason, String),
}

/// A process a node wants run. The host adds the loop's environment (`LOOPFLOW_*`,
/// `PWD`, `TMPDIR`), the working directory, the sandbox, the interrupt flag and the
/// record of its process group.
#[derive(Debug, Clone, Default)]
pub struct Spawn<'a> {
    pub argv: &'a [String],
    pub timeout: Option<Duration>,
    /// Stop it when it writes nothing for this long.
    pub idle: Option<Duration>,
    /// A file to feed on stdin (an agent's prompt).
    pub stdin: Option<PathBuf>,
    /// Environment on top of the loop's (a preset's settings).
    pub env: Vec<(String, String)>,
    /// Paths it needs to write besides the loop's own (an agent's state directories).
    pub write: Vec<PathBuf>,
    /// Paths it needs to read besides the loop's own (a preset's `sandbox_read`).
    pub read: Vec<PathBuf>,
    /// Variables of loopflow's environment it sees beyond the tick's (a preset's `env`).
    pub pass_env: Vec<String>,
    /// Hosts it may reach beyond the loop's (a preset's `hosts`).
    pub hosts: Vec<String>,
    /// An agent the user's own `command` runs (no preset): told which agents' keys
    /// it does not see.
    pub own_agent: bool,
    /// What it changes in the worktree is the tick's work (an implementer). Anything
    /// else's changes (a verifier's, an orchestrator's, a `command` node's) are left out
    /// of the commit and put back (DESIGN §9).
    pub work: bool,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

/// What a node (and the executor) asks of the tick running it.
pub trait Host: Sync {
    /// Runs a process to its end (or timeout, or interruption).
    fn spawn(&self, node: &str, spawn: &Spawn<'_>) -> Finished;
    /// Appends an event to the loop's log (best effort: a node's report never fails it).
    fn event(&self, event: Event, args: &[LogArg<'_>]);
    /// Writes this tick's iteration into the loop's state.
    fn commit(&self, delta: Delta) -> Result<Committed, StateError>;
    /// Whether SIGINT/SIGTERM asked the tick to stop.
    fn cancelled(&self) -> bool;
    /// Checked before every node runs (and re-runs); `spawns` says whether it runs a
    /// process. A `Stop` fails the node or halts the loop there.
    fn before_node(&self, _spawns: bool) -> Result<(), Stop> {
        Ok(())
    }
    /// Told each node's output as it ends (its spend counts from then on).
    fn settled(&self, _out: &NodeOutput) {}
}

/// Which nodes run before which (the pipeline's DAG), asked only by the nodes that need
/// their upstream: a pipeline of 10,000 nodes keeps no per-node ancestor set.
pub trait Upstream: Sync {
    /// Every node upstream of `v`, in topological order.
    fn upstream_of(&self, v: usize) -> Vec<usize>;
}

/// The outputs of the nodes settled so far, and how the nodes relate, for building a
/// node's upstream view on demand (most nodes never ask for it).
#[derive(Clone, Copy)]
pub struct Settled<'a> {
    /// Node ids, by index.
    pub ids: &'a [&'a str],
    /// Each node's role, for harness nodes.
    pub roles: &'a [Option<&'a str>],
    /// How the nodes relate.
    pub dag: &'a dyn Upstream,
    /// Outputs of settled nodes, by index.
    pub outputs: &'a [Option<NodeOutput>],
}

/// One node's view of the tick.
pub struct NodeCtx<'a> {
    scope: &'a TickScope<'a>,
    host: &'a dyn Host,
    id: &'a str,
    timeout: Option<Duration>,
    /// The name of the node's `{{output}}` file: its role, else its id.
    output_name: &'a str,
    settled: Settled<'a>,
    /// This node's index.
    v: usize,
    /// The nodes upstream of this one, in topological order, once asked for.
    ancestors: OnceLock<Vec<usize>>,
    /// Outputs of every settled node upstream of this one, in topological order, once
    /// asked for.
    upstream: OnceLock<Vec<(&'a str, &'a NodeOutput)>>,
    vars: OnceLock<Value>,
}

impl<'a> NodeCtx<'a> {
    pub fn new(
        scope: &'a TickScope<'a>,
        host: &'a dyn Host,
        v: usize,
        timeout: Option<Duration>,
        settled: Settled<'a>,
    ) -> Self {
        NodeCtx {
            scope,
            host,
            id: settled.ids[v],
            timeout,
            output_name: settled.roles[v].unwrap_or(settled.ids[v]),
            settled,
            v,
            ancestors: OnceLock::new(),
            upstream: OnceLock::new(),
            vars: OnceLock::new(),
        }
    }

    pub fn id(&self) -> &'a str {
        self.id
    }

    pub fn scope(&self) -> &'a TickScope<'a> {
        self.scope
    }

    pub fn config(&self) -> &'a LoopConfig {
        self.scope.config
    }

    /// The node's own `timeout`.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    pub fn host(&self) -> &'a dyn Host {
        self.host
    }

    /// `outputs/<N>-<name>.<ext>`
    pub fn output_file(&self, name: &str, ext: &str) -> PathBuf {
        self.scope.output_file(name, ext)
    }

    /// `outputs/<N>-<role>.json`: where the `{{output}}` file is kept after the node.
    pub fn archive_path(&self) -> PathBuf {
        self.output_file(self.output_name, "json")
    }

    /// `{{output}}`: where the node's agent may write its output file. It lies inside the
    /// agent's working directory (agents refuse to write elsewhere) in a directory that
    /// ignores itself, so `git-commit` never commits it.
    pub fn output_path(&self) -> PathBuf {
        self.scope
            .output_dir
            .join(format!("{}-{}.json", self.scope.tick, self.output_name))
    }

    /// The nodes upstream of this one, in topological order: linear in the pipeline's
    /// size, once per node that asks.
    fn ancestors(&self) -> &[usize] {
        self.ancestors
            .get_or_init(|| self.settled.dag.upstream_of(self.v))
    }

    /// Outputs of every settled node upstream of this one, in topological order.
    /// Linear in the pipeline's size, once per node that asks.
    pub fn upstream(&self) -> &[(&'a str, &'a NodeOutput)] {
        self.upstream.get_or_init(|| {
            let s = self.settled;
            self.ancestors()
                .iter()
                .filter_map(|&u| Some((s.ids[u], s.outputs[u].as_ref()?)))
                .collect()
        })
    }

    /// The output of upstream node `id`.
    pub fn upstream_output(&self, id: &str) -> Option<&'a NodeOutput> {
        let s = self.settled;
        let u = *self.ancestors().iter().find(|&&u| s.ids[u] == id)?;
        s.outputs[u].as_ref()
    }

    /// The verdict of the nearest upstream verdict node.
    pub fn verdict(&self) -> Option<&'a Verdict> {
        self.upstream()
            .iter()
            .rev()
            .find_map(|(_, o)| o.verdict.as_ref())
    }

    /// Seconds spent in processes upstream (for `max_seconds`).
    pub fn upstream_seconds(&self) -> f64 {
        self.upstream().iter().map(|(_, o)| o.seconds).sum()
    }

    /// `{{artifact}}`: the `{{output}}` of the last upstream implement node.
    fn artifact(&self) -> Option<String> {
        let s = self.settled;
        self.ancestors()
            .iter()
            .filter(|&&u| s.roles[u] == Some("implement"))
            .filter_map(|&u| s.outputs[u].as_ref()?.output_path.as_ref())
            .next_back()
            .map(|p| p.display().to_string())
    }

    /// The template variables at this node (DESIGN §5), as a JSON object, built on first
    /// use (most nodes render nothing).
    pub fn vars(&self) -> &Value {
        self.vars.get_or_init(|| {
            let mut m = self.scope.vars.clone();
            let up = self.upstream();
            let paths: Vec<(String, String)> = up
                .iter()
                .map(|(_, o)| {
                    (
                        display(o.stdout_path.as_ref()),
                        display(o.stderr_path.as_ref()),
                    )
                })
                .collect();
            let upstream: Vec<(&str, vars::Upstream<'_>)> = up
                .iter()
                .zip(&paths)
                .map(|((id, o), (out, err))| {
                    (
                        *id,
                        vars::Upstream {
                            stdout_path: out,
                            stderr_path: err,
                            exit_code: o.exit_code,
                            output: o.output.as_deref().unwrap_or(""),
                        },
                    )
                })
                .collect();
            let verdict = self
                .verdict()
                .map(|v| serde_json::to_string(v).unwrap_or_default());
            let artifact = self.artifact();
            vars::at_node(
                &mut m,
                self.id,
                &self.output_path().display().to_string(),
                &upstream,
                artifact.as_deref(),
                verdict.as_deref(),
            );
            Value::Object(m)
        })
    }

    /// Renders a template against this node's variables.
    pub fn render(&self, text: &str) -> Result<String, RenderError> {
        self.render_with(text, self.vars())
    }

    /// Renders a template against `vars` (this node's, extended by the caller).
    pub fn render_with(&self, text: &str, vars: &Value) -> Result<String, RenderError> {
        template::render(self.scope.hb, text, vars)
    }

    /// Renders every argv element separately: one template, one argv element, no shell.
    pub fn render_argv(&self, argv: &[Tmpl], vars: &Value) -> Result<Vec<String>, ArgvError> {
        argv.iter()
            .map(|t| {
                template::render(self.scope.hb, &t.text, vars).map_err(|error| ArgvError {
                    element: t.text.clone(),
                    error,
                })
            })
            .collect()
    }

    /// Spawns `spawn` for this node: its stdout/stderr go to
    /// `outputs/<N>-<id>.{stdout,stderr}` (whatever it set there), the loop's environment
    /// and sandbox on top. A non-zero exit is a failure.
    pub fn spawn(&self, mut spawn: Spawn<'_>) -> NodeRun {
        let stdout = self.output_file(self.id, "stdout");
        let stderr = self.output_file(self.id, "stderr");
        spawn.stdout.clone_from(&stdout);
        spawn.stderr.clone_from(&stderr);
        let done = self.host.spawn(self.id, &spawn);
        // Only the capped head: a runaway agent's gigabytes stay on disk.
        let cut = crate::fs_safe::head(&stdout, OUTPUT_CAP as u64).unwrap_or_default();
        let output = NodeOutput {
            exit_code: done.exit.code(),
            stdout_path: Some(stdout),
            stderr_path: Some(stderr),
            output: Some(String::from_utf8_lossy(&cut).into_owned()),
            seconds: done.elapsed.as_secs_f64(),
            ..Default::default()
        };
        match done.exit {
            Exit::Code(0) => NodeRun::Ok(output),
            other => NodeRun::Failed {
                reason: other.failure(),
                output,
            },
        }
    }

    /// Logs an event (a node's own report: a warning, a compaction).
    pub fn event(&self, event: Event, args: &[LogArg<'_>]) {
        self.host.event(event, args);
    }

    /// Logs `WARN node=<id> msg=…`.
    pub fn warn(&self, msg: String) {
        self.event(
            Event::Warn,
            &[
                LogArg::Kv("node", self.id.to_string()),
                LogArg::Kv("msg", msg),
            ],
        );
    }

    /// Writes the tick's iteration (the commit node).
    pub fn commit(&self, delta: Delta) -> NodeRun {
        match self.host.commit(delta) {
            Ok(c) => NodeRun::Committed {
                state: Box::new(c.state),
                halted: c.halted,
            },
            Err(e) => NodeRun::fail(Failure::State(e.to_string())),
        }
    }
}

fn display(p: Option<&PathBuf>) -> String {
    p.map(|p| p.display().to_string()).unwrap_or_default()
}
