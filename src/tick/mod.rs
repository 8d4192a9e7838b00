//! One tick of one loop (DESIGN §10 `run`), top to bottom: open the loop, take its lock,
//! stop what a killed tick left running, read the state (recovering a lost `TICK` line),
//! load the config, set up the sandbox, evaluate the gate, walk the DAG, settle how the
//! tick ended, and stop whatever its processes left behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Serialize;

use crate::diag::Diagnostics;
use crate::load::LoadError;
use crate::reason::{NodeStatus, SkipReason};
use crate::state::tamper::Watched;
use crate::state::{Event, LogArg, LoopPaths, StateError, TickLock};
use crate::work_source::WorkSourceReader;

pub(crate) mod confine;
mod guard;
mod host;
mod settle;
mod steps;
mod trace;
mod worktree;

use host::Tick;

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
    /// For the tick's trace (DESIGN §14); not in `--json`.
    #[serde(skip)]
    pub trace: NodeTrace,
}

/// What a node's span says beyond the summary: its kind and role, when it ran, how often
/// it was tried, its exit code and the spend its agent reported.
#[derive(Debug, Clone, Default)]
pub struct NodeTrace {
    pub kind: &'static str,
    pub role: Option<String>,
    pub timing: crate::exec::Timing,
    pub exit_code: Option<i32>,
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
    pub cached: bool,
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
    /// What the tick's nodes spent, by the commit's rules (for its trace).
    #[serde(skip)]
    pub spent: (f64, u64),
    /// What a dry run would do (`run --dry-run`); only in a dry run's summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRun>,
    /// When a usage limit lifts (RFC 3339 UTC); only in a `usage_limit` skip's summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The node whose failure ended the tick (an abort, or a halt on its failure), with
    /// its own words and where its output is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureNote>,
}

/// What failed, said where the human looks (`run`, `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct FailureNote {
    pub node: String,
    /// The agent's own words (its reported error, else the tail of its stderr).
    pub message: Option<String>,
    /// The node's output files.
    pub outputs: Vec<PathBuf>,
}

/// `run --dry-run`: the gate and each node's account of itself (`"dry_run"` in `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    pub tick: u64,
    /// `None` when the gate passes, else why a real run would stop there.
    pub gate: Option<String>,
    /// What the sandbox lets the tick's processes do.
    pub sandbox: String,
    pub nodes: Vec<crate::exec::DryNode>,
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
            spent: (0.0, 0),
            dry_run: None,
            until: None,
            failure: None,
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
        match (&self.reason, &self.until) {
            (Some(r), Some(u)) => s.push_str(&format!(" ({r} until {u})")),
            (Some(r), None) => s.push_str(&format!(" ({r})")),
            _ => {}
        }
        s.push_str(&format!(", iteration {}", self.iteration));
        if let (Some(p), Some(sc)) = (self.pass, self.score) {
            s.push_str(&format!(", pass={p} score={sc}"));
        }
        if let Some(f) = &self.failure {
            if let Some(m) = &f.message {
                s.push_str(&format!(
                    "\n  {} said: {}",
                    f.node,
                    m.replace('\n', "\n    ")
                ));
            }
            if !f.outputs.is_empty() {
                let files: Vec<String> =
                    f.outputs.iter().map(|p| p.display().to_string()).collect();
                s.push_str(&format!("\n  its output: {}", files.join(", ")));
            }
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
    /// A remote loop's record could not be read or written (DESIGN §16).
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
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
    /// The tick's trace context, when telemetry is configured (set by [`run_tick`]).
    pub trace: Option<crate::telemetry::TraceIds>,
    /// Export no trace whatever is configured (`demo`: offline, in a throw-away project).
    pub no_telemetry: bool,
    /// The slot a remote loop's tick takes (`run --slot`, DESIGN §16): at most one tick
    /// per slot across every runner.
    pub slot: Option<String>,
}

/// One tick of one loop; with telemetry configured (DESIGN §14), its trace is exported
/// when it ends, whatever the outcome.
pub fn run_tick(
    project: &Path,
    name: &str,
    opts: &RunOptions,
    cancel: &AtomicBool,
) -> Result<Summary, RunError> {
    if opts.dry_run || opts.no_telemetry {
        return tick_once(project, name, opts, cancel);
    }
    let exporter = match crate::telemetry::Exporter::configured(project) {
        None => return tick_once(project, name, opts, cancel),
        Some(Err(e)) => {
            let result = tick_once(project, name, opts, cancel);
            telemetry_warn(project, name, format!("no trace exported: {e}"));
            return result;
        }
        Some(Ok(ex)) => ex,
    };
    let start_ns = crate::exec::unix_ns();
    let ids = crate::telemetry::TraceIds::start();
    let traced = RunOptions {
        trace: Some(ids.clone()),
        ..opts.clone()
    };
    let result = tick_once(project, name, &traced, cancel);
    if let Ok(summary) = &result
        && ids.sampled
    {
        let spans = trace::tick_spans(&ids, (start_ns, crate::exec::unix_ns()), project, summary);
        if let Err(e) = exporter.export(&spans) {
            let msg = format!("the tick's trace was not exported to {}: {e}", exporter.url);
            telemetry_warn(project, name, msg);
        }
    }
    result
}

/// The one `WARN` (and stderr line) of a tick whose trace did not go out.
fn telemetry_warn(project: &Path, name: &str, msg: String) {
    let paths = LoopPaths::new(project, name);
    eprintln!("warning: {msg}");
    if paths.dir.is_dir() && paths.state.exists() {
        let _ = paths.log(Event::Warn, &[LogArg::Kv("msg", msg)]);
    }
}

fn tick_once(
    project: &Path,
    name: &str,
    opts: &RunOptions,
    cancel: &AtomicBool,
) -> Result<Summary, RunError> {
    crate::state::check_loop_name(name).map_err(|e| RunError::Usage(e.to_string()))?;
    let active = Active::enter();
    // Agents run in another directory (the worktree) and get paths as arguments and in
    // LOOPFLOW_PROJECT: every path they see must be absolute, whatever `--project` was.
    let project = &std::path::absolute(project).map_err(|e| {
        RunError::State(StateError::Io {
            path: project.to_path_buf(),
            source: e,
        })
    })?;
    let (paths, ledger) = LoopPaths::new(project, name).with_ledger();
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
    let remote = crate::remote::RemoteLoop::open(&paths).map_err(|e| match e {
        crate::remote::OpenError::Config(e) => RunError::from(e),
        crate::remote::OpenError::Remote(e) => RunError::Remote(e),
    })?;
    // A remote loop's state is its record's: a fresh clone has no cache yet.
    if remote.is_none() && !paths.state.exists() {
        if !opts.dry_run {
            skip(&paths, &SkipReason::Untracked)?;
        }
        return Ok(Summary::bare(name, Outcome::Skip, SkipReason::Untracked, 0));
    }
    // Lock and log files an agent replaced (a directory, a FIFO) are moved aside first:
    // a state loopflow cannot lock must halt the loop, not fail every tick after its agents.
    let repaired = if opts.dry_run {
        Vec::new()
    } else {
        guard::repair_files(&paths)
    };
    let lock = if opts.dry_run {
        None
    } else {
        match lock(&paths)? {
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
        // A tick killed outright (kill -9) cannot stop its agents; this one does, before
        // anything else runs in the loop's worktree.
        after_previous_tick(&paths, lock)?;
    }
    let result = match remote {
        None => run_locked(
            &paths,
            &ledger,
            lock.as_ref(),
            &repaired,
            opts,
            cancel,
            None,
        ),
        Some(r) => remote_tick(r, &paths, &ledger, lock.as_ref(), &repaired, opts, cancel),
    };
    if let Some(lock) = &lock {
        // What the tick's processes left behind (detached, reparented to loopflow) goes
        // before the lock is let go: nothing may outlive the tick that started it.
        let marks = crate::process::loop_marks(&paths.name, &paths.project);
        let mut killed = crate::process::reap_leftovers(&marks);
        // A leftover that cleared its environment carries no marks; once no other tick
        // runs in this process (always, outside a daemon), every untracked child is one.
        if active.alone() {
            killed += crate::process::reap_leftovers(&[]);
        }
        if killed > 0 {
            let _ = paths.log(
                Event::Warn,
                &[
                    LogArg::Kv("killed", killed.to_string()),
                    LogArg::Kv(
                        "msg",
                        "stopped processes the tick's agents left running".into(),
                    ),
                ],
            );
        }
        lock.clear();
    }
    result
}

/// A remote loop's tick (DESIGN §16) around the local one, at its seams: begin (fetch,
/// the record's gate, the lease), the nodes as for any loop (checkpointing spend after
/// each spawning node), settle (one atomic push). Its skips before the lease are logged
/// here only: every losing runner would race to write one into the record.
fn remote_tick(
    r: crate::remote::RemoteLoop<'_>,
    paths: &LoopPaths,
    ledger: &crate::state::Ledger,
    lock: Option<&TickLock>,
    repaired: &[String],
    opts: &RunOptions,
    cancel: &AtomicBool,
) -> Result<Summary, RunError> {
    use crate::remote::tick::{BeginError, Begun, Settled};
    let o = crate::remote::tick::Options {
        slot: opts.slot.as_deref(),
        dry_run: opts.dry_run,
        pipeline: opts.pipeline.as_deref(),
    };
    let session = match crate::remote::tick::begin(r, lock, &o) {
        Err(BeginError::Load(e)) => return Err(e.into()),
        Err(BeginError::Remote(e)) => return Err(e.into()),
        Ok(Begun::Look) => return run_locked(paths, ledger, lock, repaired, opts, cancel, None),
        Ok(Begun::Skip { reason, iteration }) => {
            if !opts.dry_run {
                skip(paths, &reason)?;
            }
            return Ok(Summary::bare(&paths.name, Outcome::Skip, reason, iteration));
        }
        Ok(Begun::Go(s)) => s,
    };
    let result = run_locked(paths, ledger, lock, repaired, opts, cancel, Some(&session));
    let iteration = match &result {
        Ok(s) => s.iteration,
        Err(_) => 0,
    };
    let run = session.run().to_string();
    match session.settle()? {
        Settled::Recorded => result,
        Settled::Fenced { orphans } => {
            let kept = orphans.map_or("it had no commits".into(), |o| {
                format!("its commits are on {o}")
            });
            let _ = paths.log(
                Event::Warn,
                &[
                    LogArg::Kv("run", run),
                    LogArg::Kv(
                        "msg",
                        format!("fenced: another runner took the lease over; nothing of this tick was recorded ({kept})"),
                    ),
                ],
            );
            Ok(Summary::bare(
                &paths.name,
                Outcome::Abort,
                "fenced",
                iteration,
            ))
        }
    }
}

/// What the next tick would do first, done now: the daemon calls it when a tick it ran
/// was killed (a signal, the OOM killer), so the agents that tick left running are
/// stopped at once rather than at the loop's next tick, an interval later. Takes the
/// tick lock without waiting (`false`: another tick holds it and will clean up itself),
/// stops the recorded groups and, since the tick died, every process carrying the
/// loop's marks, removes its stale temp files, and clears the lock file's marks (even
/// when logging what it stopped failed). Returns how many processes it stopped.
pub(crate) fn clean_up_after_killed_tick(
    project: &Path,
    name: &str,
) -> Result<Option<usize>, StateError> {
    let project = std::path::absolute(project).map_err(|source| StateError::Io {
        path: project.to_path_buf(),
        source,
    })?;
    let paths = LoopPaths::new(&project, name);
    paths.refuse_symlinks()?;
    let Some(lock) = lock(&paths)? else {
        return Ok(None);
    };
    let stopped = after_previous_tick(&paths, &lock);
    lock.clear();
    stopped.map(Some)
}

/// What every holder of a loop's tick lock does first: stop what an earlier tick left
/// running (see [`guard::stop_leftovers`]) and remove the temp files a killed writer
/// left, the temps even when logging the stops failed. Returns how many it stopped.
fn after_previous_tick(paths: &LoopPaths, lock: &TickLock) -> Result<usize, StateError> {
    let stopped = guard::stop_leftovers(paths, &lock.take_previous());
    paths.remove_stale_temps();
    stopped
}

/// The tick lock, taken without waiting for another tick — but a tick killed a moment
/// ago may leave a half-started child holding it for a few milliseconds, so contention
/// is looked at again briefly before the tick says `locked`.
fn lock(paths: &LoopPaths) -> Result<Option<TickLock>, StateError> {
    for attempt in 0..4 {
        if let Some(l) = paths.try_lock_tick()? {
            return Ok(Some(l));
        }
        if attempt < 3 {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(None)
}

/// The tick, once its lock is held (and, for a remote loop, its lease: `remote`), as its
/// steps: [`steps::open`] the state, [`steps::load`] the config and pipeline,
/// [`steps::prepare`] the worktree and the sandbox, evaluate the gate, walk the pipeline
/// and settle how it ended ([`Tick::execute`]), then [`steps::finish`].
fn run_locked(
    paths: &LoopPaths,
    ledger: &crate::state::Ledger,
    lock: Option<&TickLock>,
    repaired: &[String],
    opts: &RunOptions,
    cancel: &AtomicBool,
    remote: Option<&crate::remote::tick::Session<'_>>,
) -> Result<Summary, RunError> {
    let opened = steps::open(paths, opts)?;
    let (loaded, cwd) = steps::load(paths, opts)?;
    let prepared = steps::prepare(paths, opts, &loaded, &cwd, opened)?;
    let steps::Prepared {
        stamp,
        state,
        ready,
        tmp,
        output_dir,
        confine,
        audit_box,
    } = prepared;
    let work = WorkSourceReader::new(&loaded.config, &state, paths, opts.dry_run)
        .confined(audit_box.as_ref());
    let copy = match &ready.place {
        Some(Ok(crate::worktree::Place::Own(c))) => Some(c.clone()),
        _ => None,
    };
    let repo = ready.repo;
    let gate = crate::brakes::evaluate_at(&loaded.config, &state, paths, &work, ready.place);
    // The ledger holds what the tick writes from `log_start` on.
    let log_start = std::fs::metadata(&paths.log).map_or(0, |m| m.len());
    if let Ok(mut l) = ledger.lock() {
        l.clear();
    }
    let tick = Tick {
        trace: opts.trace.clone(),
        paths,
        ledger,
        loaded: &loaded,
        state: &state,
        gate: &gate,
        cwd: &cwd,
        tmp: &tmp,
        output_dir: &output_dir,
        cancel,
        lock,
        environ: crate::environ::Environ::new(
            &loaded.config.sandbox,
            loaded.config.sandbox.mode != crate::config::SandboxMode::Off,
        ),
        warned: Default::default(),
        confine,
        log_start,
        watched: Watched::with_known(
            std::iter::once(paths.config())
                .chain(loaded.pipeline_path.clone())
                .chain(loaded.config.prompt_files().map(Path::to_path_buf)),
            &loaded.digests(),
        ),
        halts: guard::HaltWatch::starting_from(stamp, &state),
        // Checked again before the first node: until the leftovers of a killed tick were
        // stopped (just above, under the lock) they could still plant a link.
        symlinks_checked: std::sync::atomic::AtomicU64::new(u64::MAX),
        task: gate
            .task
            .as_ref()
            .map(|t| t.id.clone())
            .or_else(|| state.current_task.clone()),
        cache_dir: paths.cache_dir(),
        // Before any agent runs; only for a tick that will run nodes.
        baseline: (!opts.dry_run
            && gate.ok
            && loaded
                .pipeline
                .nodes
                .iter()
                .any(|n| n.spec.wants_baseline()))
        .then(|| {
            crate::node::Baseline::take(
                loaded.config.worktree.then_some(repo.as_ref()),
                copy.as_ref(),
                &cwd,
            )
        }),
        settled: Default::default(),
        announcements: Default::default(),
        remote,
    };
    let hb = crate::template::engine();
    let scope = tick.scope(&work, &hb);
    if opts.dry_run {
        return Ok(tick.dry_run(&scope));
    }
    crate::process::become_subreaper();
    let result = tick.execute(&scope, opts.parallel, repaired);
    steps::finish(paths, &tmp, copy.as_ref());
    result
}

/// Where agents write their `{{output}}` files, inside their working directory.
pub(crate) use crate::blast::OUTPUT_DIR;

/// How many ticks run in this process (more than one only in a daemon).
static ACTIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// This tick, counted in [`ACTIVE`] while it lives.
struct Active;

impl Active {
    fn enter() -> Active {
        ACTIVE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Active
    }

    /// No other tick runs in this process right now.
    fn alone(&self) -> bool {
        ACTIVE.load(std::sync::atomic::Ordering::SeqCst) == 1
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Logs `SKIP reason=…` (and `until=…` for a usage limit).
fn skip(paths: &LoopPaths, reason: &SkipReason) -> Result<(), StateError> {
    let mut args = vec![LogArg::Kv("reason", reason.to_string())];
    if let Some((k, v)) = reason.extra() {
        args.push(LogArg::Kv(k, v.to_string()));
    }
    paths.log(Event::Skip, &args)
}
