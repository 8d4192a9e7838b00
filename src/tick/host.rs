//! A running tick as its nodes see it ([`Host`]): how their processes are started (the
//! loop's environment, its sandbox, the record of every process group), where their
//! events go, how the commit is written, and the brakes that hold between nodes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::confine::Confinement;
use super::guard::HaltWatch;
use super::{DryRun, NodeSummary, Outcome, RunError, Summary};
use crate::brakes::{GateReport, GateVerdict};
use crate::exec::{DryNode, End, Stop, Walked};
use crate::lifecycle::{Committed, Delta, TickStart};
use crate::load::Loaded;
use crate::node::{Host, NodeOutput, Spawn, TickScope};
use crate::pipeline::Pipeline;
use crate::process::{Exit, Finished};
use crate::reason::{Budget, Failure, HaltReason, NodeStatus, SkipReason};
use crate::state::tamper::Watched;
use crate::state::{Event, Ledger, LogArg, LoopPaths, State, StateError, TickLock};
use crate::template::vars;
use crate::work_source::WorkSourceReader;

/// Everything one tick holds while its nodes run; it is also their [`Host`].
pub(super) struct Tick<'a> {
    /// The tick's trace context: each spawned process gets `TRACEPARENT` for its node.
    pub trace: Option<crate::telemetry::TraceIds>,
    pub paths: &'a LoopPaths,
    /// The log lines this tick appended (checked at its end).
    pub ledger: &'a Ledger,
    pub loaded: &'a Loaded,
    /// The state as the tick found it.
    pub state: &'a State,
    pub gate: &'a GateReport,
    pub cwd: &'a Path,
    /// The tick's private `TMPDIR`.
    pub tmp: &'a Path,
    /// Where agents write `{{output}}`.
    pub output_dir: &'a Path,
    pub cancel: &'a AtomicBool,
    /// The tick lock, which also records the process groups this tick spawns.
    pub lock: Option<&'a TickLock>,
    pub confine: Confinement,
    /// What its processes see of loopflow's environment.
    pub environ: crate::environ::Environ,
    /// (node, what) pairs already warned about this tick: refused hosts, withheld keys.
    pub warned: Mutex<std::collections::HashSet<(String, String)>>,
    /// The length of `.state.log` when the tick started: events after it are this tick's.
    pub log_start: u64,
    /// The files that steer the loop, with a digest of each at tick start.
    pub watched: Watched,
    /// Halts seen in the state file during the tick.
    pub halts: HaltWatch,
    /// [`crate::process::spawn_count`] when the loop's directories were last checked for
    /// planted symlinks (`u64::MAX`: not yet).
    pub symlinks_checked: std::sync::atomic::AtomicU64,
    /// The task this tick works on (the gate's, else the state's).
    pub task: Option<String>,
    pub cache_dir: PathBuf,
    /// The tree before the first node, when a node compares against it (`git-commit`).
    pub baseline: Option<Result<crate::node::Baseline, crate::node::BaselineError>>,
    /// What the nodes that ended so far produced, for the brakes between nodes.
    pub settled: Mutex<Vec<NodeOutput>>,
    /// Halts the walk's commit set, for the driver to announce once the walk is over.
    pub announcements: Mutex<Vec<crate::lifecycle::Announcement>>,
    /// A remote loop's hold on its record: spend is checkpointed to it after each node.
    pub remote: Option<&'a crate::remote::tick::Session<'a>>,
}

impl<'a> Tick<'a> {
    pub(super) fn pipeline(&self) -> &'a Pipeline {
        &self.loaded.pipeline
    }

    /// Whether `what` is news for `node` this tick (each is said once).
    fn first_time(&self, node: &str, what: &str) -> bool {
        self.warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((node.to_string(), what.to_string()))
    }

    pub(super) fn scope(
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
            output_dir: self.output_dir,
            cache_dir: &self.cache_dir,
            baseline: self.baseline.as_ref(),
            config: &self.loaded.config,
            prompts: &self.loaded.prompts,
            state: self.state,
            tick,
            cwd: self.cwd,
            gate: self.gate,
            work,
            hb,
            vars,
        }
    }

    pub(super) fn dry_run(&self, scope: &TickScope<'_>) -> Summary {
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
                trace: Default::default(),
            })
            .collect();
        s.dry_run = Some(DryRun {
            tick: scope.tick,
            gate: self.gate.reason.clone(),
            sandbox: format!(
                "{}\n{}",
                self.confine.describe(),
                crate::explain::sandbox(&self.loaded.config).trim_end()
            ),
            nodes,
        });
        s
    }

    /// Runs the tick's nodes (unless something stops it first) and settles the end.
    /// The halts the walk set, to be announced (each once).
    pub(super) fn take_announcements(&self) -> Vec<crate::lifecycle::Announcement> {
        self.announcements
            .lock()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }

    pub(super) fn execute(
        &self,
        scope: &TickScope<'_>,
        parallel: bool,
        repaired: &[String],
    ) -> Result<Summary, RunError> {
        let p = self.pipeline();
        let ended = |end| self.settle(Walked::ended(p.nodes.len(), end));
        if !repaired.is_empty() {
            return ended(End::Halt(
                super::guard::tampered(),
                Some(format!(
                    "{}; loopflow cannot lock the state safely until a human looks",
                    repaired.join("; ")
                )),
            ));
        }
        // The brakes are universal (D3) and a halt stands until a human approves it (D4):
        // a pipeline without a `gate` node still gets the gate, before any of its nodes.
        let gate_end = match &self.gate.verdict {
            GateVerdict::Pass => None,
            GateVerdict::Skip(r) => Some(End::Skip(r.clone())),
            GateVerdict::Halt { reason, detail } => {
                Some(End::Halt(reason.clone(), Some(detail.clone())))
            }
        };
        match gate_end {
            Some(end) if !p.nodes.iter().any(|n| n.spec.gates()) => return ended(end),
            Some(_) => {}
            // Only a tick that will run agents says what the sandbox can do.
            None => {
                if let Some(end) = self.credentials() {
                    return ended(end);
                }
                match self.confine.verdict() {
                    super::confine::Verdict::Ok => {}
                    super::confine::Verdict::Weaker(what) => self.event(
                        Event::Warn,
                        &[LogArg::Kv(
                            "msg",
                            format!("sandbox: {what}; agents run with less confinement"),
                        )],
                    ),
                    super::confine::Verdict::Refused(why) => {
                        return ended(End::Halt(
                            HaltReason::HumanIntervention(
                                crate::reason::Intervention::SandboxUnavailable,
                            ),
                            Some(format!(
                                "{why}; no agent ran ([sandbox] mode = \"enforce\")"
                            )),
                        ));
                    }
                }
            }
        }
        let w = crate::exec::walk(p, scope, self, parallel);
        self.settle(w)
    }

    /// A credential in the repository's git configuration, which the tick's processes
    /// could read (DESIGN §16): `enforce` halts before any agent runs, `auto` and `off`
    /// say where each one is and how to take it out.
    fn credentials(&self) -> Option<End> {
        // A worktree loop's processes read only its own repository, never the checkout's
        // configuration, when the kernel confines their reads.
        let checkout_readable = !self.loaded.config.worktree || !self.confine.reads_confined();
        let found = crate::git::credentials::exposed(&self.paths.project, checkout_readable);
        if found.is_empty() {
            return None;
        }
        if self.loaded.config.sandbox.mode == crate::config::SandboxMode::Enforce {
            let list: Vec<String> = found.iter().map(ToString::to_string).collect();
            return Some(End::Halt(
                HaltReason::HumanIntervention(crate::reason::Intervention::CredentialExposed),
                Some(format!(
                    "{}; no agent ran ([sandbox] mode = \"enforce\")",
                    list.join("; ")
                )),
            ));
        }
        for f in found {
            self.event(
                Event::Warn,
                &[LogArg::Kv("msg", format!("credential: {f}"))],
            );
        }
        None
    }

    /// The spend so far, and the first budget it crossed.
    fn crossed(&self) -> Option<(Budget, String)> {
        // With what approvals added (`approve --budget-usd +N`).
        let b = self.loaded.config.brakes.budget(&self.state.extra_budget);
        // No budget, nothing to cross: the spend (agent reports re-read) is not summed.
        if b.is_none() {
            return None;
        }
        let now = self
            .settled
            .lock()
            .map(|o| crate::node::spend_of(o.iter()))
            .unwrap_or_default();
        let start = &self.state.spent;
        let usd = start.usd + now.usd;
        let tokens = start.tokens.saturating_add(now.tokens);
        let seconds = start.seconds + now.seconds;
        if let Some(l) = b.usd
            && usd >= l
        {
            return Some((Budget::Usd, format!("usd {usd:.4} of {l}")));
        }
        if let Some(l) = b.tokens
            && tokens >= l
        {
            return Some((Budget::Tokens, format!("tokens {tokens} of {l}")));
        }
        if let Some(l) = b.seconds
            && seconds >= l
        {
            return Some((Budget::Seconds, format!("seconds {seconds:.1} of {l}")));
        }
        None
    }
}

impl Tick<'_> {
    /// The marks of the worktree, when the tick commits one (see `git_commit/leftovers.rs`).
    #[allow(clippy::type_complexity)]
    fn leftovers(
        &self,
    ) -> Option<(
        &crate::git::Repo,
        &crate::worktree::Copy,
        &str,
        &crate::node::Leftovers,
    )> {
        match &self.baseline {
            Some(Ok(crate::node::Baseline::Branch {
                repo,
                copy,
                base,
                leftovers,
            })) => Some((repo, copy, base.as_str(), leftovers)),
            _ => None,
        }
    }

    /// Marks the worktree before or after a process that is not an implementer; a mark git could not take is said, once per node.
    fn mark_leftovers(&self, node: &str, after: bool) {
        let Some((repo, copy, base, l)) = self.leftovers() else {
            return;
        };
        let r = if after {
            l.after(node, repo, &copy.branch, base)
        } else {
            l.before(repo, &copy.branch, base)
        };
        if let Err(e) = r
            && self.first_time(node, "leftovers")
        {
            self.event(
                Event::Warn,
                &[
                    LogArg::Kv("node", node.to_string()),
                    LogArg::Kv(
                        "msg",
                        format!("what this node leaves in the worktree cannot be told apart: {e}"),
                    ),
                ],
            );
        }
    }

    /// Runs one process of a node: the loop's environment, its sandbox and proxy, the
    /// record of its process group, and what it left behind stopped with the node.
    fn spawn_marked(&self, node: &str, s: &Spawn<'_>) -> Finished {
        let record = |pgid: u32| {
            if let Some(l) = self.lock {
                l.record_group(pgid);
            }
        };
        let watch = || self.halts.look(self.paths);
        let mut read = s.read.clone();
        // Only a sandbox needs to know where the program lives.
        if let Some(program) = s.argv.first().filter(|_| self.confine.confines()) {
            let path = std::env::var_os("PATH");
            read.extend(super::confine::install_prefix(
                program,
                path.as_deref(),
                &self.paths.project,
            ));
        }
        // One ruleset, proxy and supervisor for the tick; this spawn is a client of the
        // proxy of its own, so what it is refused is this node's.
        let (sandbox, refused) = self.confine.prepare_agent(&s.write, &read, &s.hosts);
        if !refused.is_empty() {
            let list: Vec<String> = refused.iter().map(|p| p.display().to_string()).collect();
            let _ = self.paths.log(
                Event::Warn,
                &[
                    LogArg::Kv("node", node.to_string()),
                    LogArg::Kv(
                        "msg",
                        format!(
                            "the agent may not write {}: it holds the project or its .loopflow (check the XDG_*_HOME variables)",
                            list.join(", ")
                        ),
                    ),
                ],
            );
        }
        if s.own_agent {
            let missing = self.environ.withheld_agent_vars(&s.pass_env);
            if !missing.is_empty() && self.first_time(node, &missing.join(",")) {
                self.event(
                    Event::Warn,
                    &[
                        LogArg::Kv("node", node.to_string()),
                        LogArg::Kv(
                            "msg",
                            format!(
                                "withheld from the agent: {} (set in loopflow's environment; pass them with [sandbox] env)",
                                missing.join(", ")
                            ),
                        ),
                    ],
                );
            }
        }
        let sandbox = match sandbox {
            Ok(p) => p,
            Err(e) => {
                return Finished {
                    exit: Exit::SpawnFailed(format!("sandbox: {e}")),
                    elapsed: std::time::Duration::ZERO,
                };
            }
        };
        let mut env = vec![
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
            // Agents (OpenCode) trust PWD over their real directory: never the inherited one.
            ("PWD".into(), self.cwd.display().to_string()),
            ("TMPDIR".into(), self.tmp.display().to_string()),
        ];
        if let Some(addr) = sandbox.as_ref().and(self.confine.proxy_addr()) {
            env.extend(crate::environ::proxy_vars(addr));
        }
        if let Some(t) = &self.trace {
            env.push(("TRACEPARENT".into(), t.traceparent(node)));
            if let Some(state) = &t.trace_state {
                env.push(("TRACESTATE".into(), state.clone()));
            }
        }
        env.extend(s.env.iter().cloned());
        let refused = Mutex::new(Vec::new());
        let done = crate::process::run(&crate::process::Spawn {
            argv: s.argv,
            cwd: self.cwd,
            base_env: Some(self.environ.pick(&s.pass_env)),
            env,
            stdin: s.stdin.as_deref(),
            stdout: s.stdout.clone(),
            stderr: s.stderr.clone(),
            timeout: s.timeout,
            idle: s.idle,
            grace: self
                .loaded
                .config
                .harness_grace
                .unwrap_or(crate::process::GRACE),
            cancel: self.cancel,
            sandbox: sandbox.as_ref(),
            on_spawn: Some(&record),
            on_poll: Some(&watch),
            refused: Some(&refused),
        });
        // What the node's processes detached (and left to loopflow, their subreaper) goes
        // with the node.
        let mut marks = crate::process::loop_marks(&self.paths.name, &self.paths.project).to_vec();
        marks.push(format!("LOOPFLOW_NODE={node}"));
        let killed = crate::process::reap_leftovers(&marks);
        let refused = refused.into_inner().unwrap_or_else(|e| e.into_inner());
        // The spawn's client goes with it: a connection its processes left open is cut.
        drop(sandbox);
        for what in refused {
            if self.first_time(node, &what) {
                self.event(
                    Event::Warn,
                    &[
                        LogArg::Kv("node", node.to_string()),
                        LogArg::Kv("msg", format!("network refused: {what}")),
                    ],
                );
            }
        }
        if killed > 0 {
            self.event(
                Event::Warn,
                &[
                    LogArg::Kv("node", node.to_string()),
                    LogArg::Kv("killed", killed.to_string()),
                    LogArg::Kv("msg", "stopped processes the node left running".into()),
                ],
            );
        }
        done
    }
}

impl Host for Tick<'_> {
    fn spawn(&self, node: &str, s: &Spawn<'_>) -> Finished {
        if !s.work {
            self.mark_leftovers(node, false);
        }
        let done = self.spawn_marked(node, s);
        if !s.work {
            self.mark_leftovers(node, true);
        }
        done
    }
    fn event(&self, event: Event, args: &[LogArg<'_>]) {
        let _ = self.paths.log(event, args);
    }

    fn commit(&self, delta: Delta) -> Result<Committed, StateError> {
        self.halts.look(self.paths);
        let mut c = crate::lifecycle::commit(
            self.paths,
            &TickStart {
                state: self.state,
                log_start: self.log_start,
                watched: &self.watched,
                task: self.task.as_deref(),
                seen_halt: self.halts.seen(),
            },
            &delta,
            self.loaded.config.brakes.score_plateau_window,
        )?;
        // Announced by the driver once the walk is over (`settle`), never from inside it.
        if let Some(a) = c.announce.take()
            && let Ok(mut q) = self.announcements.lock()
        {
            q.push(a);
        }
        Ok(c)
    }

    fn cancelled(&self) -> bool {
        // A remote tick whose lease was taken over stops: nothing of it can count.
        self.cancel.load(Ordering::SeqCst) || self.remote.is_some_and(|r| r.fenced())
    }

    fn before_node(&self, runs_process: bool) -> Result<(), Stop> {
        self.halts.look(self.paths);
        // Again before every node that follows a spawn: an agent earlier in this tick
        // may have swapped `outputs/` (or the loop directory) for a symlink. Only a
        // process can; between nodes that ran none, the last look still holds.
        let spawns = crate::process::spawn_count();
        if self.symlinks_checked.swap(spawns, Ordering::SeqCst) != spawns {
            self.paths.refuse_symlinks().map_err(|e| {
                // Looked at again before the next node too.
                self.symlinks_checked.store(u64::MAX, Ordering::SeqCst);
                Stop::Fail(Failure::State(e.to_string()))
            })?;
        }
        // Spend counts as soon as a node ends: past a budget, no further process runs.
        if runs_process && let Some((unit, detail)) = self.crossed() {
            return Err(Stop::Halt(HaltReason::BudgetExhausted(unit), detail));
        }
        Ok(())
    }

    fn settled(&self, out: &NodeOutput) {
        let Ok(mut s) = self.settled.lock() else {
            return;
        };
        s.push(out.clone());
        if let Some(r) = self.remote {
            let spend = crate::node::spend_of(s.iter());
            drop(s);
            r.checkpoint(&crate::state::Spent {
                usd: spend.usd,
                tokens: spend.tokens,
                seconds: spend.seconds,
            });
        }
    }
}
