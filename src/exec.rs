//! The executor: loads a loop, takes its tick lock, walks the pipeline's DAG and runs each
//! node through the same machinery (conditions, retries, timeouts, `on_failure`,
//! optional parallel waves). It knows outcomes, never node kinds by name.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use handlebars::Handlebars;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::config::LoopConfig;
use crate::diag::{Diagnostics, Source};
use crate::node::{NodeOutput, NodeRun};
use crate::pipeline::{Node, OnFailure, Pipeline};
use crate::state::{LogArg, LoopPaths, State, StateError};
use crate::template;
use crate::verdict::Verdict;

/// Everything a tick's nodes share.
pub struct TickEnv<'a> {
    pub paths: &'a LoopPaths,
    pub config: &'a LoopConfig,
    pub pipeline: &'a Pipeline,
    /// The state as it was when the tick started.
    pub state: State,
    /// The tick number: `iteration_count + 1`.
    pub tick: u64,
    pub cwd: PathBuf,
    pub hb: Handlebars<'static>,
    pub cancel: &'a AtomicBool,
    pub dry_run: bool,
    /// The task the gate found (work sources other than `single` supply it).
    pub task: Option<String>,
    /// The brakes as the tick found them, evaluated once (work sources read once) and
    /// shared by the `gate` node, the implicit gate and `--dry-run`.
    pub gate: crate::brakes::GateReport,
    /// The tick lock, which also records the process groups this tick spawns.
    pub lock: Option<&'a crate::state::TickLock>,
    /// The same task with its title and source (for state and `{{task_title}}`).
    pub work_task: Option<crate::brakes::Task>,
    /// The length of `.state.log` when the tick started: events after it are this tick's.
    pub log_start: u64,
    /// The files that steer the loop, with a digest of each at tick start (see [`watch`]).
    pub watched: Vec<(PathBuf, u64)>,
}

/// The files that steer a tick (`loop.toml`, the pipeline, every role's prompts) with a
/// digest of their contents now. The commit compares them again: an agent that edits them
/// during its tick (raising its own cap, rewriting the verifier's prompt) halts the loop.
pub fn watch(
    paths: &LoopPaths,
    config: &LoopConfig,
    pipeline: Option<&Path>,
) -> Vec<(PathBuf, u64)> {
    let mut files = vec![paths.config()];
    files.extend(pipeline.map(Path::to_path_buf));
    for role in config.roles.values() {
        files.extend(role.prompt.iter().map(|(p, _)| p.clone()));
        files.extend(role.compaction_prompt.iter().map(|(p, _)| p.clone()));
    }
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let d = digest(&f);
            (f, d)
        })
        .collect()
}

/// The watched files whose contents changed since [`watch`].
pub fn changed_since(watched: &[(PathBuf, u64)]) -> Vec<String> {
    watched
        .iter()
        .filter(|(f, d)| digest(f) != *d)
        .map(|(f, _)| f.display().to_string())
        .collect()
}

fn digest(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    match crate::fs_safe::head(path, crate::fs_safe::TEXT_MAX + 1) {
        Ok(bytes) => bytes.hash(&mut h),
        Err(e) => e.kind().to_string().hash(&mut h),
    }
    h.finish()
}

/// What one node sees when it runs.
pub struct NodeCtx<'a> {
    pub env: &'a TickEnv<'a>,
    pub index: usize,
    pub node: &'a Node,
    /// Template variables at this node (DESIGN §5).
    pub vars: Value,
    /// Outputs of every node upstream of this one, in topological order.
    pub upstream: Vec<(&'a str, NodeOutput)>,
}

impl NodeCtx<'_> {
    /// The verdict of the nearest upstream verdict node.
    pub fn verdict(&self) -> Option<&Verdict> {
        self.upstream
            .iter()
            .rev()
            .find_map(|(_, o)| o.verdict.as_ref())
    }

    pub fn upstream_output(&self, id: &str) -> Option<&NodeOutput> {
        self.upstream.iter().find(|(i, _)| *i == id).map(|(_, o)| o)
    }

    /// Seconds spent in processes upstream (for `max_seconds`).
    pub fn upstream_seconds(&self) -> f64 {
        self.upstream.iter().map(|(_, o)| o.seconds).sum()
    }

    /// `outputs/<N>-<name>.<ext>`
    pub fn output_file(&self, name: &str, ext: &str) -> PathBuf {
        self.env
            .paths
            .outputs
            .join(format!("{}-{}.{}", self.env.tick, name, ext))
    }

    pub fn render(&self, text: &str) -> Result<String, String> {
        template::render(&self.env.hb, text, &self.vars).map_err(|e| e.to_string())
    }

    /// Environment every spawned process gets.
    pub fn child_env(&self) -> Vec<(String, String)> {
        vec![
            ("LOOPFLOW_LOOP".into(), self.env.paths.name.clone()),
            (
                "LOOPFLOW_PROJECT".into(),
                self.env.paths.project.display().to_string(),
            ),
            ("LOOPFLOW_TICK".into(), self.env.tick.to_string()),
            ("LOOPFLOW_NODE".into(), self.node.id.value.clone()),
        ]
    }
}

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
    /// ok | failed | skipped | not_run
    pub status: &'static str,
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
}

impl Summary {
    fn bare(name: &str, outcome: Outcome, reason: &str, iteration: u64) -> Summary {
        Summary {
            loop_name: name.to_string(),
            outcome,
            reason: Some(reason.to_string()),
            iteration,
            pass: None,
            score: None,
            nodes: Vec::new(),
            interrupted: false,
        }
    }

    /// One line for people: `tick 3 of demo: pass=true score=0.8`.
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

#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub pipeline: Option<PathBuf>,
    pub dry_run: bool,
    pub parallel: bool,
}

/// Where the tick ended up, before the summary is assembled.
enum End {
    Done,
    Skip(String),
    Halt(String, Option<String>),
    Abort { node: String, reason: String },
}

/// What a successful tick load produced: the config and pipeline, checked.
pub struct Loaded {
    pub config: LoopConfig,
    pub pipeline: Pipeline,
}

/// Reads and cross-checks `loop.toml` and its pipeline; every problem is returned.
pub fn load_loop(
    paths: &LoopPaths,
    pipeline_arg: Option<&Path>,
    base: &Path,
) -> Result<Loaded, RunError> {
    let mut diags = Diagnostics::default();
    let cfg_path = paths.config();
    let config = match LoopConfig::read(&cfg_path, base, &mut diags) {
        Ok(c) => c,
        Err(e) => return Err(read_error(&cfg_path, base, e)),
    };
    let pipeline_path = pipeline_arg.map(Path::to_path_buf).or_else(|| {
        config
            .as_ref()
            .and_then(|c| c.pipeline.as_ref().map(|p| p.0.clone()))
    });
    let pipeline = match &pipeline_path {
        None => Some(Pipeline::builtin()),
        Some(p) => match Source::read(p, base) {
            Ok(src) => Pipeline::load(&src, &mut diags),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(read_error(p, base, e));
            }
            Err(e) => {
                return Err(RunError::Usage(format!(
                    "cannot read pipeline {}: {e}",
                    p.display()
                )));
            }
        },
    };
    if let (Some(c), Some(p)) = (&config, &pipeline) {
        c.check_against(p, base, &mut diags);
    }
    if diags.has_errors() {
        diags.sort();
        return Err(RunError::Config(diags));
    }
    match (config, pipeline) {
        (Some(config), Some(pipeline)) => Ok(Loaded { config, pipeline }),
        _ => Err(RunError::Config(diags)),
    }
}

/// A configuration file that cannot be read. One that exists but is not UTF-8 text is
/// invalid configuration (exit 3, located at its first bad byte); anything else is I/O.
pub fn read_error(path: &Path, base: &Path, e: std::io::Error) -> RunError {
    if e.kind() != std::io::ErrorKind::InvalidData {
        return RunError::State(StateError::Io {
            path: path.to_path_buf(),
            source: e,
        });
    }
    let bytes = std::fs::read(path).unwrap_or_default();
    let good = std::str::from_utf8(&bytes)
        .err()
        .map_or(0, |u| u.valid_up_to());
    // Only the valid prefix is shown, with control characters blanked (same byte
    // length, so offsets hold) so binary junk never reaches the terminal.
    let prefix: String = String::from_utf8_lossy(&bytes[..good])
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                " ".repeat(c.len_utf8())
            } else {
                c.to_string()
            }
        })
        .collect();
    let src = Source::new(crate::diag::display_name(path, base), path, prefix);
    let mut d = Diagnostics::default();
    d.push(
        crate::diag::Diagnostic::error(
            crate::diag::Code::TomlSyntax,
            &src,
            good..good,
            "the file is not UTF-8 text, so it cannot be TOML",
        )
        .label("first byte that is not UTF-8")
        .help("a TOML file must be UTF-8 text; is this the right file, or was it overwritten by a binary?"),
    );
    RunError::Config(d)
}

/// One tick of one loop (DESIGN §10 `run`).
pub fn run_tick(
    project: &Path,
    name: &str,
    opts: &RunOptions,
    cancel: &AtomicBool,
) -> Result<Summary, RunError> {
    crate::project::check_loop_name(name).map_err(RunError::Usage)?;
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
        return Ok(Summary::bare(name, Outcome::Skip, "unknown_loop", 0));
    }
    // Before the first write: a planted symlink must not redirect the log, locks or outputs.
    paths.refuse_symlinks()?;
    if !paths.state.exists() {
        if !opts.dry_run {
            paths.log("SKIP", &[LogArg::Kv("reason", "untracked".into())])?;
        }
        return Ok(Summary::bare(name, Outcome::Skip, "untracked", 0));
    }
    let _lock = if opts.dry_run {
        None
    } else {
        match paths.try_lock_tick()? {
            Some(l) => Some(l),
            None => {
                paths.log("SKIP", &[LogArg::Kv("reason", "locked".into())])?;
                // The state is replaced atomically, so reading it beside a running tick is
                // safe; the summary reports where the loop stands, not 0.
                let iteration = paths.load().map_or(0, |s| s.iteration_count);
                return Ok(Summary::bare(name, Outcome::Skip, "locked", iteration));
            }
        }
    };
    if let Some(lock) = &_lock {
        // A tick killed outright (kill -9) cannot stop its agents; this one does, before
        // anything else runs in the loop's worktree.
        for pgid in lock.take_groups() {
            let killed = crate::process::kill_orphans(pgid, name, project);
            if killed > 0 {
                paths.log(
                    "WARN",
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
    }
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    let state = match paths.load() {
        Ok(s) => s,
        Err(e) => {
            if !opts.dry_run {
                let _ = paths.log("ERROR", &[LogArg::Kv("reason", "state_unreadable".into())]);
            }
            return Err(e.into());
        }
    };
    if !opts.dry_run {
        paths.recover_tick_line(&state)?;
    }
    let loaded = match load_loop(&paths, opts.pipeline.as_deref(), &base) {
        Ok(l) => l,
        Err(e) => {
            if !opts.dry_run && matches!(e, RunError::Config(_)) {
                let _ = paths.log("ERROR", &[LogArg::Kv("reason", "invalid_config".into())]);
            }
            return Err(e);
        }
    };
    crate::brakes::begin_tick(opts.dry_run); // a dry run spawns nothing, audits included
    let gate = crate::brakes::evaluate(&loaded.config, &state, &paths);
    let cwd = if loaded.config.worktree {
        crate::worktree::dir(&paths, &state)
    } else {
        project.to_path_buf()
    };
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
    let env = TickEnv {
        lock: _lock.as_ref(),
        paths: &paths,
        config: &loaded.config,
        pipeline: &loaded.pipeline,
        tick: state.iteration_count.saturating_add(1),
        task: gate
            .task
            .as_ref()
            .map(|t| t.id.clone())
            .or_else(|| state.current_task.clone()),
        work_task: gate.task.clone(),
        gate,
        state,
        cwd,
        hb: template::engine(),
        cancel,
        dry_run: opts.dry_run,
        log_start: std::fs::metadata(&paths.log).map_or(0, |m| m.len()),
        watched: watch(
            &paths,
            &loaded.config,
            opts.pipeline
                .as_deref()
                .or(loaded.config.pipeline.as_ref().map(|p| p.0.as_path())),
        ),
    };
    if opts.dry_run {
        return Ok(dry_run(&env));
    }
    std::fs::create_dir_all(&paths.outputs).map_err(|e| StateError::Io {
        path: paths.outputs.clone(),
        source: e,
    })?;
    let result = execute(&env, opts.parallel);
    // Every group this tick spawned has been stopped by the process layer.
    if let Some(lock) = &_lock {
        lock.clear_groups();
    }
    result
}

/// Variables every node sees.
fn base_vars(env: &TickEnv<'_>) -> Map<String, Value> {
    let last = env.state.last_verdict.as_ref();
    let mut m = Map::new();
    m.insert("loop".into(), json!(env.paths.name));
    m.insert(
        "project".into(),
        json!(env.paths.project.display().to_string()),
    );
    m.insert("iteration".into(), json!(env.tick));
    m.insert("cwd".into(), json!(env.cwd.display().to_string()));
    m.insert(
        "current_task".into(),
        json!(env.task.clone().unwrap_or_default()),
    );
    m.insert(
        "task_title".into(),
        json!(
            env.work_task
                .as_ref()
                .map(|t| t.title.clone())
                .or_else(|| env.task.clone())
                .unwrap_or_default()
        ),
    );
    m.insert("current_phase".into(), json!(env.state.current_phase));
    m.insert(
        "reasons".into(),
        json!(last.map(|v| v.reasons.clone()).unwrap_or_default()),
    );
    m.insert(
        "next_hint".into(),
        json!(last.and_then(|v| v.next_hint.clone()).unwrap_or_default()),
    );
    m
}

struct Walk<'a> {
    env: &'a TickEnv<'a>,
    base: Map<String, Value>,
    outputs: Vec<Option<NodeOutput>>,
    status: Vec<&'static str>,
    ms: Vec<u64>,
    committed: Option<(Box<State>, Option<String>)>,
    when_skip: Option<String>,
}

impl<'a> Walk<'a> {
    fn new(env: &'a TickEnv<'a>) -> Self {
        let n = env.pipeline.nodes.len();
        Walk {
            env,
            base: base_vars(env),
            outputs: vec![None; n],
            status: vec!["not_run"; n],
            ms: vec![0; n],
            committed: None,
            when_skip: None,
        }
    }

    fn ctx(&self, v: usize) -> NodeCtx<'a> {
        let p = self.env.pipeline;
        let node = &p.nodes[v];
        let mut vars = self.base.clone();
        let mut nodes = Map::new();
        let mut upstream = Vec::new();
        let mut verdict_text = None;
        let mut artifact = None;
        if let Some(dag) = &p.dag {
            for &u in &dag.order {
                if !dag.is_ancestor(u, v) {
                    continue;
                }
                let Some(out) = &self.outputs[u] else {
                    continue;
                };
                let id = p.nodes[u].id.value.as_str();
                nodes.insert(
                    id.to_string(),
                    json!({
                        "stdout_path": out.stdout_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                        "stderr_path": out.stderr_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
                        "exit_code": out.exit_code,
                        "output": out.output.clone().unwrap_or_default(),
                    }),
                );
                if let Some(vd) = &out.verdict {
                    verdict_text = Some(serde_json::to_string(vd).unwrap_or_default());
                }
                if p.nodes[u]
                    .spec
                    .role()
                    .is_some_and(|r| r.value == "implement")
                {
                    artifact = out.output_path.as_ref().map(|p| p.display().to_string());
                }
                upstream.push(u);
            }
        }
        vars.insert("nodes".into(), Value::Object(nodes));
        vars.insert("node".into(), json!(node.id.value));
        let out_name = node
            .spec
            .role()
            .map_or(node.id.value.as_str(), |r| r.value.as_str());
        vars.insert(
            "output".into(),
            json!(
                self.env
                    .paths
                    .outputs
                    .join(format!("{}-{}.json", self.env.tick, out_name))
                    .display()
                    .to_string()
            ),
        );
        if let Some(vt) = verdict_text {
            vars.insert("verdict".into(), json!(vt));
        }
        if let Some(a) = artifact {
            vars.insert("artifact".into(), json!(a));
        }
        let upstream = upstream
            .into_iter()
            .filter_map(|u| Some((p.nodes[u].id.value.as_str(), self.outputs[u].clone()?)))
            .collect();
        NodeCtx {
            env: self.env,
            index: v,
            node,
            vars: Value::Object(vars),
            upstream,
        }
    }

    /// Marks `v` and everything downstream as skipped by a false `when`.
    fn skip_from(&mut self, v: usize) {
        let p = self.env.pipeline;
        let Some(dag) = &p.dag else { return };
        let mut set = dag.descendants(v);
        set.push(v);
        for d in set {
            if self.status[d] == "not_run" {
                self.status[d] = "skipped";
                if p.nodes[d].spec.commits() && self.when_skip.is_none() {
                    self.when_skip = Some(p.nodes[v].id.value.clone());
                }
            }
        }
    }
}

/// Runs one node with its retries; the walk applies the result.
fn run_node(ctx: &NodeCtx<'_>) -> (NodeRun, u64) {
    let start = Instant::now();
    let mut attempt = 0;
    loop {
        // Again before every node: an agent earlier in this tick may have swapped
        // `outputs/` (or the loop directory) for a symlink.
        if let Err(e) = ctx.env.paths.refuse_symlinks() {
            return (
                NodeRun::Failed {
                    reason: format!("state:{e}"),
                    output: NodeOutput::default(),
                },
                start.elapsed().as_millis() as u64,
            );
        }
        let r = ctx.node.spec.run(ctx);
        if let NodeRun::Failed { reason, .. } = &r
            && attempt < ctx.node.retries
            && reason != "interrupted"
        {
            attempt += 1;
            let _ = ctx.env.paths.log(
                "RETRY",
                &[
                    LogArg::Kv("node", ctx.node.id.value.clone()),
                    LogArg::Kv("attempt", (attempt + 1).to_string()),
                    LogArg::Kv("reason", reason.clone()),
                ],
            );
            continue;
        }
        return (r, start.elapsed().as_millis() as u64);
    }
}

fn execute(env: &TickEnv<'_>, parallel: bool) -> Result<Summary, RunError> {
    let p = env.pipeline;
    let Some(dag) = &p.dag else {
        return Err(RunError::Config(Diagnostics::default()));
    };
    let mut walk = Walk::new(env);
    // The brakes are universal (D3) and a halt stands until a human approves it (D4): a
    // pipeline without a `gate` node still gets the gate, before any of its nodes runs.
    if !p.nodes.iter().any(|n| n.spec.gates()) {
        match env.gate.verdict.clone() {
            crate::brakes::Verdict::Pass => {}
            crate::brakes::Verdict::Skip(r) => return finish(env, walk, End::Skip(r)),
            crate::brakes::Verdict::Halt { reason, detail } => {
                return finish(env, walk, End::Halt(reason, Some(detail)));
            }
        }
    }
    let mut end = End::Done;
    let mut remaining: Vec<usize> = dag.order.clone();
    'waves: while !remaining.is_empty() {
        // A wave: every node whose needs are all settled. Sequential runs take one node.
        let mut wave = Vec::new();
        for (k, &v) in remaining.iter().enumerate() {
            let ready = p.nodes[v].needs.iter().all(|n| {
                p.index
                    .get(&n.value)
                    .is_some_and(|&u| walk.status[u] != "not_run" || walk.outputs[u].is_some())
            });
            // A committing node waits until every node before it in the sequential order
            // has settled, so `--parallel` commits exactly when a sequential run would
            // (an earlier failure on an independent branch aborts both before the commit).
            let commit_early = k > 0 && p.nodes[v].spec.commits();
            if ready && !commit_early {
                wave.push(v);
                if !parallel {
                    break;
                }
            }
        }
        if wave.is_empty() {
            break;
        }
        remaining.retain(|v| !wave.contains(v));
        let mut to_run = Vec::new();
        for &v in &wave {
            if walk.status[v] == "skipped" {
                continue;
            }
            if env.cancel.load(std::sync::atomic::Ordering::SeqCst) {
                end = End::Abort {
                    node: p.nodes[v].id.value.clone(),
                    reason: "interrupted".into(),
                };
                break 'waves;
            }
            let ctx = walk.ctx(v);
            if let Some(when) = &p.nodes[v].when {
                match ctx.render(&when.text) {
                    Ok(r) if template::truthy(&r) => {}
                    Ok(_) => {
                        walk.skip_from(v);
                        continue;
                    }
                    Err(e) => {
                        end = End::Abort {
                            node: p.nodes[v].id.value.clone(),
                            reason: format!("when:{e}"),
                        };
                        break 'waves;
                    }
                }
            }
            to_run.push((v, ctx));
        }
        let results: Vec<(usize, NodeRun, u64)> = if to_run.len() > 1 {
            std::thread::scope(|s| {
                let handles: Vec<_> = to_run
                    .iter()
                    .map(|(v, ctx)| {
                        let v = *v;
                        s.spawn(move || {
                            let (r, ms) = run_node(ctx);
                            (v, r, ms)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            (
                                0,
                                NodeRun::Failed {
                                    reason: "panic".into(),
                                    output: NodeOutput::default(),
                                },
                                0,
                            )
                        })
                    })
                    .collect()
            })
        } else {
            to_run
                .iter()
                .map(|(v, ctx)| {
                    let (r, ms) = run_node(ctx);
                    (*v, r, ms)
                })
                .collect()
        };
        drop(to_run);
        // Apply results in topological order so parallel and sequential runs agree.
        let mut stop = None;
        for (v, r, ms) in results {
            walk.ms[v] = ms;
            let node = &p.nodes[v];
            match r {
                NodeRun::Ok(out) => {
                    walk.status[v] = "ok";
                    walk.outputs[v] = Some(out);
                }
                NodeRun::Failed { reason, output } => {
                    walk.status[v] = "failed";
                    walk.outputs[v] = Some(output);
                    if reason == "interrupted" {
                        stop.get_or_insert(End::Abort {
                            node: node.id.value.clone(),
                            reason,
                        });
                        continue;
                    }
                    match node.on_failure {
                        OnFailure::Continue => {}
                        OnFailure::Abort => {
                            stop.get_or_insert(End::Abort {
                                node: node.id.value.clone(),
                                reason,
                            });
                        }
                        OnFailure::Halt => {
                            stop.get_or_insert(End::Halt(
                                "human_intervention:node_failed".into(),
                                Some(format!("node {} failed: {reason}", node.id.value)),
                            ));
                        }
                    }
                }
                NodeRun::Skip(reason) => {
                    walk.status[v] = "ok";
                    stop.get_or_insert(End::Skip(reason));
                }
                NodeRun::Halt { reason, detail } => {
                    walk.status[v] = "ok";
                    stop.get_or_insert(End::Halt(reason, detail));
                }
                NodeRun::Committed { state, halted } => {
                    walk.status[v] = "ok";
                    walk.outputs[v] = Some(NodeOutput::default());
                    walk.committed = Some((state, halted));
                }
            }
        }
        if let Some(s) = stop {
            end = s;
            break;
        }
    }
    finish(env, walk, end)
}

fn finish(env: &TickEnv<'_>, walk: Walk<'_>, end: End) -> Result<Summary, RunError> {
    let p = env.pipeline;
    let paths = env.paths;
    let nodes: Vec<NodeSummary> = p
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSummary {
            id: n.id.value.clone(),
            status: walk.status[i],
            ms: walk.ms[i],
        })
        .collect();
    let verdict = walk
        .outputs
        .iter()
        .flatten()
        .rev()
        .find_map(|o| o.verdict.clone());
    let mut summary = Summary {
        loop_name: paths.name.clone(),
        outcome: Outcome::Tick,
        reason: None,
        iteration: env.state.iteration_count,
        pass: verdict.as_ref().map(|v| v.pass),
        score: verdict.as_ref().map(|v| v.score),
        nodes,
        interrupted: false,
    };
    // A commit already happened: the tick counts, whatever came after it.
    if let Some((state, halted)) = walk.committed {
        summary.iteration = state.iteration_count;
        if let Some(h) = halted {
            summary.outcome = Outcome::Halt;
            summary.reason = Some(h);
        }
        match &end {
            End::Abort { node, reason } => {
                // Nodes after the commit failed: logged, but the iteration stands.
                paths.log(
                    "WARN",
                    &[
                        LogArg::Kv("node", node.clone()),
                        LogArg::Kv("reason", reason.clone()),
                        LogArg::Kv("msg", "failed after commit".into()),
                    ],
                )?;
            }
            End::Halt(reason, detail) if summary.outcome == Outcome::Halt => {
                // The commit already halted the loop (goal met): that halt stands, and
                // this one is recorded beside it.
                let mut args = vec![
                    LogArg::Kv("reason", reason.clone()),
                    LogArg::Kv(
                        "msg",
                        "halt after commit; the loop was already halted".into(),
                    ),
                ];
                if let Some(d) = detail {
                    args.push(LogArg::Kv("detail", d.clone()));
                }
                paths.log("WARN", &args)?;
            }
            End::Halt(reason, detail) => {
                // A halt after the commit (git-commit refusing a path outside the blast
                // radius) still halts the loop; the iteration it spent stands.
                halt(paths, reason, detail.as_deref())?;
                summary.outcome = Outcome::Halt;
                summary.reason = Some(reason.clone());
            }
            End::Done | End::Skip(_) => {}
        }
        return Ok(summary);
    }
    match end {
        End::Done => {
            summary.outcome = Outcome::Skip;
            let reason = match walk.when_skip {
                Some(n) => format!("when:{n}"),
                None => "no_commit".into(),
            };
            paths.log("SKIP", &[LogArg::Kv("reason", reason.clone())])?;
            summary.reason = Some(reason);
        }
        End::Skip(reason) => {
            summary.outcome = Outcome::Skip;
            if reason == "worktree_missing" {
                paths.log(
                    "WARN",
                    &[LogArg::Kv(
                        "msg",
                        format!(
                            "worktree missing at {}; not running in the main checkout",
                            env.cwd.display()
                        ),
                    )],
                )?;
            }
            paths.log("SKIP", &[LogArg::Kv("reason", reason.clone())])?;
            summary.reason = Some(reason);
        }
        End::Halt(reason, detail) => {
            halt(paths, &reason, detail.as_deref())?;
            summary.outcome = Outcome::Halt;
            summary.reason = Some(reason);
        }
        End::Abort { node, reason } => {
            summary.outcome = Outcome::Abort;
            summary.interrupted = reason == "interrupted";
            paths.log(
                "ABORT",
                &[
                    LogArg::Kv("node", node.clone()),
                    LogArg::Kv("reason", reason.clone()),
                ],
            )?;
            summary.reason = Some(format!("{node}:{reason}"));
            // An interrupted tick (SIGINT/SIGTERM) says nothing about the harness and must
            // leave `.state.loop` exactly as it was (R6), so it is not counted.
            if summary.interrupted {
                return Ok(summary);
            }
            let max = env.config.brakes.max_consecutive_aborts;
            let (state, _) = paths.update(|s| {
                // Never below the count at tick start: an agent that rewrote the state
                // file to zero it must not dodge `harness_failing`.
                s.consecutive_aborts = s
                    .consecutive_aborts
                    .max(env.state.consecutive_aborts)
                    .saturating_add(1);
            })?;
            if state.consecutive_aborts >= max {
                halt(
                    paths,
                    "human_intervention:harness_failing",
                    Some(&format!(
                        "{} ticks aborted in a row; last: node {node} {reason}",
                        state.consecutive_aborts
                    )),
                )?;
                summary.outcome = Outcome::Halt;
                summary.reason = Some("human_intervention:harness_failing".into());
            }
        }
    }
    Ok(summary)
}

/// Halts a loop: sets `halt` (unless already halted), logs `HALT <reason>`, and disables
/// its installed schedule best-effort. Only `approve` clears it.
pub fn halt(paths: &LoopPaths, reason: &str, detail: Option<&str>) -> Result<(), StateError> {
    let (_, fresh) = paths.update(|s| {
        if s.halt.is_some() {
            return false;
        }
        s.halt = Some(crate::state::Halt {
            reason: reason.to_string(),
            detail: detail.map(str::to_string),
            at: crate::state::now(),
            iteration: s.iteration_count,
        });
        true
    })?;
    if fresh {
        let mut args = vec![LogArg::Word(reason)];
        if let Some(d) = detail {
            args.push(LogArg::Kv("detail", d.to_string()));
        }
        paths.log("HALT", &args)?;
        crate::schedule::disable_best_effort(paths);
    }
    Ok(())
}

fn dry_run(env: &TickEnv<'_>) -> Summary {
    let gate = &env.gate;
    let p = env.pipeline;
    let mut walk = Walk::new(env);
    println!(
        "dry run of loop {} (tick {}); nothing is spawned or written",
        env.paths.name, env.tick
    );
    println!(
        "gate: {}",
        match &gate.reason {
            None => "ok".to_string(),
            Some(r) => format!("not ok ({r}); a real run would end here"),
        }
    );
    let order = p.dag.as_ref().map(|d| d.order.clone()).unwrap_or_default();
    for v in order {
        let node = &p.nodes[v];
        let ctx = walk.ctx(v);
        let line = match node.spec.dry_run(&ctx) {
            Ok(Some(s)) => s,
            Ok(None) => String::new(),
            Err(e) => format!("error: {e}"),
        };
        let when = node
            .when
            .as_ref()
            .map(|w| format!(" when {}", w.text))
            .unwrap_or_default();
        println!(
            "  {} ({}){when}{}{line}",
            node.id.value,
            node.kind,
            if line.is_empty() { "" } else { ": " }
        );
        // Placeholders so downstream templates render.
        walk.outputs[v] = Some(NodeOutput {
            exit_code: Some(0),
            stdout_path: Some(ctx.output_file(&node.id.value, "stdout")),
            stderr_path: Some(ctx.output_file(&node.id.value, "stderr")),
            output: Some(format!("<output of {}>", node.id.value)),
            output_path: Some(ctx.output_file(
                node.spec.role().map_or(&node.id.value, |r| &r.value),
                "json",
            )),
            verdict: node.spec.produces_verdict().then(|| Verdict {
                pass: false,
                score: 0.0,
                reasons: vec![format!("<reasons from {}>", node.id.value)],
                next_hint: Some(format!("<next_hint from {}>", node.id.value)),
                cost_usd: None,
                tokens: None,
            }),
            seconds: 0.0,
            ..Default::default()
        });
        walk.status[v] = "not_run";
    }
    let mut s = Summary::bare(
        &env.paths.name,
        if gate.ok {
            Outcome::Tick
        } else {
            Outcome::Skip
        },
        "dry_run",
        env.state.iteration_count,
    );
    s.nodes = p
        .nodes
        .iter()
        .map(|n| NodeSummary {
            id: n.id.value.clone(),
            status: "not_run",
            ms: 0,
        })
        .collect();
    s
}
