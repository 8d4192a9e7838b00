//! One tick of one loop (DESIGN §10 `run`), top to bottom: open the loop, take its lock,
//! stop what a killed tick left running, read the state (recovering a lost `TICK` line),
//! load the config, evaluate the gate, walk the DAG, and settle how the tick ended.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::brakes::{GateReport, GateVerdict};
use crate::diag::Diagnostics;
use crate::exec::{DryNode, End, Walked};
use crate::lifecycle::{Committed, Delta, TickStart};
use crate::load::{LoadError, Loaded};
use crate::node::{Host, Spawn, TickScope};
use crate::pipeline::Pipeline;
use crate::process::Finished;
use crate::reason::{Failure, NodeStatus, SkipReason};
use crate::state::tamper::Watched;
use crate::state::{Event, LogArg, LoopPaths, State, StateError, TickLock};
use crate::template::vars;
use crate::work_source::WorkSourceReader;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Tick,
    Skip,
    Halt,
    Abort,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeSummary {
    pub id: String,
    pub status: NodeStatus,
    pub ms: u64,
}

/// The `--json` tick summary (DESIGN §10).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    #[serde(rename = "loop")]
    pub loop_name: String,
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub iteration: u64,
    pub pass: Option<bool>,
    pub score: Option<f64>,
    pub nodes: Vec<NodeSummary>,
    #[serde(skip)]
    pub interrupted: bool,
    /// What a dry run would do (`run --dry-run`).
    #[serde(skip)]
    pub dry_run: Option<DryRun>,
}

/// `run --dry-run`: the gate and each node's account of itself.
#[derive(Debug, Clone)]
pub struct DryRun {
    pub tick: u64,
    /// `None` when the gate passes, else why a real run would stop there.
    pub gate: Option<String>,
    pub nodes: Vec<(String, &'static str, Option<String>, String)>,
}

impl Summary {
    fn bare(name: &str, outcome: Outcome, reason: impl ToString, iteration: u64) -> Summary {
        Summary {
            loop_name: name.to_string(),
            outcome,
            reason: Some(reason.to_string()),
            iteration,
            pass: None,
            score: None,
            nodes: Vec::new(),
            interrupted: false,
            dry_run: None,
        }
    }

    /// One line for people: `loop demo ticked, iteration 3, pass=true score=0.8`.
    pub fn human(&self) -> String {
        let what = match self.outcome {
            Outcome::Tick => "ticked",
            Outcome::Skip => "skipped",
            Outcome::Halt => "halted",
            Outcome::Abort => "aborted",
        };
        let mut s = format!("loop {} {what}", self.loop_name);
        if let Some(r) = &self.reason {
            s.push_str(&format!(" ({r})"));
        }
        s.push_str(&format!(", iteration {}", self.iteration));
        if let (Some(p), Some(sc)) = (self.pass, self.score) {
            s.push_str(&format!(", pass={p} score={sc}"));
        }
        s
    }
}

/// Why a tick could not run at all. Each maps to one exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Usage(String),
    #[error("invalid configuration")]
    Config(Diagnostics),
    #[error(transparent)]
    State(#[from] StateError),
}

impl From<LoadError> for RunError {
    fn from(e: LoadError) -> Self {
        match e {
            LoadError::Config(d) => RunError::Config(d),
            LoadError::Io { path, source } => RunError::State(StateError::Io { path, source }),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub pipeline: Option<PathBuf>,
    pub dry_run: bool,
    pub parallel: bool,
}

/// One tick of one loop.
pub fn run_tick(
    project: &Path,
    name: &str,
    opts: &RunOptions,
    cancel: &AtomicBool,
) -> Result<Summary, RunError> {
    crate::state::check_loop_name(name).map_err(|e| RunError::Usage(e.to_string()))?;
    // Agents run in another directory (the worktree) and get paths as arguments and in
    // LOOPFLOW_PROJECT: every path they see must be absolute, whatever `--project` was.
    let project = &std::path::absolute(project).map_err(|e| {
        RunError::State(StateError::Io {
            path: project.to_path_buf(),
            source: e,
        })
    })?;
    let paths = LoopPaths::new(project, name);
    if !paths.dir.is_dir() {
        return Ok(Summary::bare(
            name,
            Outcome::Skip,
            SkipReason::UnknownLoop,
            0,
        ));
    }
    // Before the first write: a planted symlink must not redirect the log, locks or outputs.
    paths.refuse_symlinks()?;
    if !paths.state.exists() {
        if !opts.dry_run {
            skip(&paths, &SkipReason::Untracked)?;
        }
        return Ok(Summary::bare(name, Outcome::Skip, SkipReason::Untracked, 0));
    }
    let lock = if opts.dry_run {
        None
    } else {
        match paths.try_lock_tick()? {
            Some(l) => Some(l),
            None => {
                skip(&paths, &SkipReason::Locked)?;
                // The state is replaced atomically, so reading it beside a running tick is
                // safe; the summary reports where the loop stands, not 0.
                let iteration = paths.load().map_or(0, |s| s.iteration_count);
                return Ok(Summary::bare(
                    name,
                    Outcome::Skip,
                    SkipReason::Locked,
                    iteration,
                ));
            }
        }
    };
    if let Some(lock) = &lock {
        stop_orphans(&paths, lock)?;
    }
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    let state = match paths.load() {
        Ok(s) => s,
        Err(e) => {
            if !opts.dry_run {
                let _ = paths.log(
                    Event::Error,
                    &[LogArg::Kv("reason", "state_unreadable".into())],
                );
            }
            return Err(e.into());
        }
    };
    if !opts.dry_run {
        paths.recover_tick_line(&state)?;
    }
    let loaded = match crate::load::load(&paths, opts.pipeline.as_deref(), &base) {
        Ok(l) => l,
        Err(e) => {
            if !opts.dry_run && matches!(e, LoadError::Config(_)) {
                let _ = paths.log(
                    Event::Error,
                    &[LogArg::Kv("reason", "invalid_config".into())],
                );
            }
            return Err(e.into());
        }
    };
    let work = WorkSourceReader::new(&loaded.config, &state, &paths, opts.dry_run);
    let gate = crate::brakes::evaluate(&loaded.config, &state, &paths, &work);
    let cwd = crate::work_source::loop_cwd(&loaded.config, &state, &paths);
    if loaded.config.worktree
        && std::fs::symlink_metadata(&cwd).is_ok_and(|m| m.file_type().is_symlink())
    {
        // Agents would run wherever it points (the main checkout, say), not in isolation.
        return Err(StateError::Io {
            path: cwd,
            source: std::io::Error::other(
                "the loop's worktree is a symlink; loopflow runs agents only in a real worktree (remove it and run `git worktree repair`, or recreate the loop)",
            ),
        }
        .into());
    }
    let tick = Tick {
        paths: &paths,
        loaded: &loaded,
        state: &state,
        gate: &gate,
        cwd: &cwd,
        cancel,
        lock: lock.as_ref(),
        log_start: std::fs::metadata(&paths.log).map_or(0, |m| m.len()),
        watched: Watched::new(
            std::iter::once(paths.config())
                .chain(loaded.pipeline_path.clone())
                .chain(loaded.config.prompt_files().map(Path::to_path_buf)),
        ),
        task: gate
            .task
            .as_ref()
            .map(|t| t.id.clone())
            .or_else(|| state.current_task.clone()),
        cache_dir: paths.cache_dir(),
    };
    let hb = crate::template::engine();
    let scope = tick.scope(&work, &hb);
    if opts.dry_run {
        return Ok(tick.dry_run(&scope));
    }
    std::fs::create_dir_all(&paths.outputs).map_err(|e| StateError::Io {
        path: paths.outputs.clone(),
        source: e,
    })?;
    let result = tick.execute(&scope, opts.parallel);
    // Every group this tick spawned has been stopped by the process layer.
    if let Some(lock) = &lock {
        lock.clear_groups();
    }
    result
}

/// Logs `SKIP reason=…`.
fn skip(paths: &LoopPaths, reason: &SkipReason) -> Result<(), StateError> {
    paths.log(Event::Skip, &[LogArg::Kv("reason", reason.to_string())])
}

/// A tick killed outright (kill -9) cannot stop its agents; the next one does, before
/// anything else runs in the loop's worktree.
fn stop_orphans(paths: &LoopPaths, lock: &TickLock) -> Result<(), StateError> {
    for pgid in lock.take_groups() {
        let killed = crate::process::kill_orphans(pgid, &paths.name, &paths.project);
        if killed > 0 {
            paths.log(
                Event::Warn,
                &[
                    LogArg::Kv("pgid", pgid.to_string()),
                    LogArg::Kv("killed", killed.to_string()),
                    LogArg::Kv(
                        "msg",
                        "stopped processes left running by an interrupted tick".into(),
                    ),
                ],
            )?;
        }
    }
    Ok(())
}

/// Everything one tick holds while its nodes run; it is also their [`Host`].
struct Tick<'a> {
    paths: &'a LoopPaths,
    loaded: &'a Loaded,
    /// The state as the tick found it.
    state: &'a State,
    gate: &'a GateReport,
    cwd: &'a Path,
    cancel: &'a AtomicBool,
    /// The tick lock, which also records the process groups this tick spawns.
    lock: Option<&'a TickLock>,
    /// The length of `.state.log` when the tick started: events after it are this tick's.
    log_start: u64,
    /// The files that steer the loop, with a digest of each at tick start.
    watched: Watched,
    /// The task this tick works on (the gate's, else the state's).
    task: Option<String>,
    cache_dir: PathBuf,
}

impl<'a> Tick<'a> {
    fn pipeline(&self) -> &'a Pipeline {
        &self.loaded.pipeline
    }

    fn scope(
        &'a self,
        work: &'a WorkSourceReader<'a>,
        hb: &'a handlebars::Handlebars<'static>,
    ) -> TickScope<'a> {
        let last = self.state.last_verdict.as_ref();
        let empty = Vec::new();
        let task = self.task.as_deref().unwrap_or("");
        let title = self.gate.task.as_ref().map_or(task, |t| t.title.as_str());
        let tick = self.state.iteration_count.saturating_add(1);
        let vars = vars::tick(&vars::Tick {
            loop_name: &self.paths.name,
            project: &self.paths.project.display().to_string(),
            iteration: tick,
            cwd: &self.cwd.display().to_string(),
            current_task: task,
            task_title: title,
            current_phase: &self.state.current_phase,
            reasons: last.map_or(&empty, |v| &v.reasons),
            next_hint: last.and_then(|v| v.next_hint.as_deref()).unwrap_or(""),
        });
        TickScope {
            loop_name: &self.paths.name,
            project: &self.paths.project,
            outputs: &self.paths.outputs,
            cache_dir: &self.cache_dir,
            config: &self.loaded.config,
            state: self.state,
            tick,
            cwd: self.cwd,
            gate: self.gate,
            work,
            hb,
            vars,
        }
    }

    fn dry_run(&self, scope: &TickScope<'_>) -> Summary {
        let nodes: Vec<DryNode> = crate::exec::dry_run(self.pipeline(), scope, self);
        let mut s = Summary::bare(
            &self.paths.name,
            if self.gate.ok {
                Outcome::Tick
            } else {
                Outcome::Skip
            },
            SkipReason::DryRun,
            self.state.iteration_count,
        );
        s.nodes = self
            .pipeline()
            .nodes
            .iter()
            .map(|n| NodeSummary {
                id: n.id.value.clone(),
                status: NodeStatus::NotRun,
                ms: 0,
            })
            .collect();
        s.dry_run = Some(DryRun {
            tick: scope.tick,
            gate: self.gate.reason.clone(),
            nodes: nodes
                .into_iter()
                .map(|n| (n.id, n.kind, n.when, n.what))
                .collect(),
        });
        s
    }

    fn execute(&self, scope: &TickScope<'_>, parallel: bool) -> Result<Summary, RunError> {
        let p = self.pipeline();
        // The brakes are universal (D3) and a halt stands until a human approves it (D4):
        // a pipeline without a `gate` node still gets the gate, before any of its nodes.
        if !p.nodes.iter().any(|n| n.spec.gates()) {
            let end = match &self.gate.verdict {
                GateVerdict::Pass => None,
                GateVerdict::Skip(r) => Some(End::Skip(r.clone())),
                GateVerdict::Halt { reason, detail } => {
                    Some(End::Halt(reason.clone(), Some(detail.clone())))
                }
            };
            if let Some(end) = end {
                return self.settle(Walked::ended(p.nodes.len(), end));
            }
        }
        let w = crate::exec::walk(p, scope, self, parallel);
        self.settle(w)
    }

    /// Says how the tick ended: the log line, the halt, the abort count.
    fn settle(&self, w: Walked) -> Result<Summary, RunError> {
        let p = self.pipeline();
        let paths = self.paths;
        let nodes: Vec<NodeSummary> = p
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeSummary {
                id: n.id.value.clone(),
                status: w.status[i],
                ms: w.ms[i],
            })
            .collect();
        let verdict = w.verdict();
        let mut summary = Summary {
            loop_name: paths.name.clone(),
            outcome: Outcome::Tick,
            reason: None,
            iteration: self.state.iteration_count,
            pass: verdict.map(|v| v.pass),
            score: verdict.map(|v| v.score),
            nodes,
            interrupted: false,
            dry_run: None,
        };
        // A commit already happened: the tick counts, whatever came after it.
        if let Some((state, halted)) = w.committed {
            summary.iteration = state.iteration_count;
            if let Some(h) = &halted {
                summary.outcome = Outcome::Halt;
                summary.reason = Some(h.to_string());
            }
            match &w.end {
                End::Abort { node, reason } => {
                    // Nodes after the commit failed: logged, but the iteration stands.
                    paths.log(
                        Event::Warn,
                        &[
                            LogArg::Kv("node", node.clone()),
                            LogArg::Kv("reason", reason.to_string()),
                            LogArg::Kv("msg", "failed after commit".into()),
                        ],
                    )?;
                }
                End::Halt(reason, detail) if halted.is_some() => {
                    // The commit already halted the loop (goal met): that halt stands, and
                    // this one is recorded beside it.
                    let mut args = vec![
                        LogArg::Kv("reason", reason.to_string()),
                        LogArg::Kv(
                            "msg",
                            "halt after commit; the loop was already halted".into(),
                        ),
                    ];
                    if let Some(d) = detail {
                        args.push(LogArg::Kv("detail", d.clone()));
                    }
                    paths.log(Event::Warn, &args)?;
                }
                End::Halt(reason, detail) => {
                    // A halt after the commit (git-commit refusing a path outside the blast
                    // radius) still halts the loop; the iteration it spent stands.
                    crate::lifecycle::halt(paths, reason.clone(), detail.as_deref())?;
                    summary.outcome = Outcome::Halt;
                    summary.reason = Some(reason.to_string());
                }
                End::Done | End::Skip(_) => {}
            }
            return Ok(summary);
        }
        match w.end {
            End::Done => {
                let reason = match w.when_skip {
                    Some(n) => SkipReason::When(n),
                    None => SkipReason::NoCommit,
                };
                skip(paths, &reason)?;
                summary.outcome = Outcome::Skip;
                summary.reason = Some(reason.to_string());
            }
            End::Skip(reason) => {
                if reason == SkipReason::WorktreeMissing {
                    paths.log(
                        Event::Warn,
                        &[LogArg::Kv(
                            "msg",
                            format!(
                                "worktree missing at {}; not running in the main checkout (bring it back with `loopflow worktree restore --loop {}`)",
                                self.cwd.display(),
                                paths.name
                            ),
                        )],
                    )?;
                }
                skip(paths, &reason)?;
                summary.outcome = Outcome::Skip;
                summary.reason = Some(reason.to_string());
            }
            End::Halt(reason, detail) => {
                crate::lifecycle::halt(paths, reason.clone(), detail.as_deref())?;
                summary.outcome = Outcome::Halt;
                summary.reason = Some(reason.to_string());
            }
            End::Abort { node, reason } => {
                summary.outcome = Outcome::Abort;
                summary.interrupted = reason.is_interrupt();
                paths.log(
                    Event::Abort,
                    &[
                        LogArg::Kv("node", node.clone()),
                        LogArg::Kv("reason", reason.to_string()),
                    ],
                )?;
                summary.reason = Some(format!("{node}:{reason}"));
                // An interrupted tick (SIGINT/SIGTERM) says nothing about the harness and
                // must leave `.state.loop` exactly as it was (R6), so it is not counted.
                if summary.interrupted {
                    return Ok(summary);
                }
                let max = self.loaded.config.brakes.max_consecutive_aborts;
                if let Some(h) =
                    crate::lifecycle::count_abort(paths, self.state, max, &node, &reason)?
                {
                    summary.outcome = Outcome::Halt;
                    summary.reason = Some(h.to_string());
                }
            }
        }
        Ok(summary)
    }
}

impl Host for Tick<'_> {
    fn spawn(&self, node: &str, s: &Spawn<'_>) -> Finished {
        let record = |pgid: u32| {
            if let Some(l) = self.lock {
                l.record_group(pgid);
            }
        };
        crate::process::run(&crate::process::Spawn {
            argv: s.argv,
            cwd: self.cwd,
            env: vec![
                ("LOOPFLOW_LOOP".into(), self.paths.name.clone()),
                (
                    "LOOPFLOW_PROJECT".into(),
                    self.paths.project.display().to_string(),
                ),
                (
                    "LOOPFLOW_TICK".into(),
                    self.state.iteration_count.saturating_add(1).to_string(),
                ),
                ("LOOPFLOW_NODE".into(), node.to_string()),
            ],
            stdout: s.stdout.clone(),
            stderr: s.stderr.clone(),
            timeout: s.timeout,
            cancel: self.cancel,
            on_spawn: Some(&record),
        })
    }

    fn event(&self, event: Event, args: &[LogArg<'_>]) {
        let _ = self.paths.log(event, args);
    }

    fn commit(&self, delta: Delta) -> Result<Committed, StateError> {
        crate::lifecycle::commit(
            self.paths,
            &TickStart {
                state: self.state,
                log_start: self.log_start,
                watched: &self.watched,
                task: self.task.as_deref(),
            },
            &delta,
            self.loaded.config.brakes.score_plateau_window,
        )
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    fn before_node(&self) -> Result<(), Failure> {
        // Again before every node: an agent earlier in this tick may have swapped
        // `outputs/` (or the loop directory) for a symlink.
        self.paths
            .refuse_symlinks()
            .map_err(|e| Failure::State(e.to_string()))
    }
}
