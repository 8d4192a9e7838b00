//! How a tick ended, said: the log line, the halt, the abort count, the spend of a tick a
//! budget stopped — and, for every end, the check that nobody else changed the state or
//! the log lines the tick wrote.

use super::host::Tick;
use super::{NodeSummary, Outcome, RunError, Summary, guard, skip};
use crate::exec::{End, Walked};
use crate::reason::{HaltReason, SkipReason};
use crate::state::{Event, LogArg, StateError};

impl Tick<'_> {
    /// Says how the tick ended: the log line, the halt, the abort count.
    pub(super) fn settle(&self, w: Walked) -> Result<Summary, RunError> {
        // What the walk's commit decided, performed now that the walk is over.
        for a in self.take_announcements() {
            let _ = crate::announce::announce(self.paths, &a);
        }
        let mut summary = self.summary(&w);
        if let Some((state, halted)) = &w.committed {
            self.after_commit(&w.end, state.iteration_count, halted.clone(), &mut summary)?;
        } else {
            self.without_commit(w, &mut summary)?;
        }
        self.check_log(&mut summary)?;
        Ok(summary)
    }

    fn summary(&self, w: &Walked) -> Summary {
        let nodes: Vec<NodeSummary> = self
            .pipeline()
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let out = w.outputs[i].as_ref();
                NodeSummary {
                    id: n.id.value.clone(),
                    status: w.status[i],
                    ms: w.ms[i],
                    trace: super::NodeTrace {
                        kind: n.kind,
                        role: n.spec.role().map(|r| r.value.clone()),
                        timing: w.timing[i],
                        exit_code: out.and_then(|o| o.exit_code),
                        cost_usd: out.and_then(|o| o.cost_usd),
                        tokens: out.and_then(|o| o.tokens),
                        cached: out.is_some_and(|o| o.cached),
                    },
                }
            })
            .collect();
        let verdict = w.verdict();
        let spend = crate::node::spend_of(w.outputs.iter().flatten());
        Summary {
            loop_name: self.paths.name.clone(),
            outcome: Outcome::Tick,
            reason: None,
            iteration: self.state.iteration_count,
            pass: verdict.map(|v| v.pass),
            score: verdict.map(|v| v.score),
            nodes,
            interrupted: false,
            spent: (spend.usd, spend.tokens),
            dry_run: None,
            until: None,
            failure: self.failure_note(w),
        }
    }

    /// The failed node that ended the tick — the aborting one, else (a halt on a
    /// failure) the first that failed — with its own words and output files.
    fn failure_note(&self, w: &Walked) -> Option<super::FailureNote> {
        let p = self.pipeline();
        let i = match &w.end {
            End::Abort { node, .. } => p.nodes.iter().position(|n| &n.id.value == node)?,
            End::Halt(..) => w
                .status
                .iter()
                .position(|s| *s == crate::reason::NodeStatus::Failed)?,
            _ => return None,
        };
        let out = w.outputs[i].as_ref();
        let outputs: Vec<std::path::PathBuf> = out
            .into_iter()
            .flat_map(|o| [o.stdout_path.clone(), o.stderr_path.clone()])
            .flatten()
            .filter(|p| p.exists())
            .collect();
        let message = out.and_then(|o| o.why.clone());
        (message.is_some() || !outputs.is_empty()).then(|| super::FailureNote {
            node: p.nodes[i].id.value.clone(),
            message,
            outputs,
        })
    }

    /// A commit already happened: the tick counts, whatever came after it.
    fn after_commit(
        &self,
        end: &End,
        iteration: u64,
        halted: Option<HaltReason>,
        summary: &mut Summary,
    ) -> Result<(), StateError> {
        let paths = self.paths;
        summary.iteration = iteration;
        if let Some(h) = &halted {
            summary.outcome = Outcome::Halt;
            summary.reason = Some(h.to_string());
        }
        match end {
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
                self.halt(reason.clone(), detail.as_deref(), summary)?;
            }
            End::Done | End::Skip(_) => {}
        }
        Ok(())
    }

    fn without_commit(&self, w: Walked, summary: &mut Summary) -> Result<(), StateError> {
        let paths = self.paths;
        // Whatever the end, the state holds only what the tick may leave in it.
        let forged = guard::restore_state(paths, self.state, self.halts.seen())?;
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
                if let SkipReason::UsageLimit { until } = &reason {
                    summary.until = Some(until.clone());
                }
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
                // A work source that cannot be read (a backlog file that is not there) is
                // not the same as one with nothing left to do: the log says which.
                if reason == SkipReason::NoCurrentTask
                    && let Some(why) = &self.gate.work_unreadable
                {
                    paths.log(Event::Warn, &[LogArg::Kv("msg", why.clone())])?;
                }
                skip(paths, &reason)?;
                summary.outcome = Outcome::Skip;
                summary.reason = Some(reason.to_string());
            }
            End::Halt(reason, detail) => {
                // What the tick's nodes spent counts, though the tick did not advance the
                // loop (a budget crossed, a verdict unparseable, work refused).
                self.commit_spend()?;
                self.halt(reason, detail.as_deref(), summary)?;
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
                if !summary.interrupted {
                    let max = self.loaded.config.brakes.max_consecutive_aborts;
                    let note = crate::state::AbortNote {
                        at: crate::state::now(),
                        node: node.clone(),
                        reason: reason.to_string(),
                        message: summary.failure.as_ref().and_then(|f| f.message.clone()),
                        outputs: summary
                            .failure
                            .iter()
                            .flat_map(|f| &f.outputs)
                            .filter_map(|p| p.strip_prefix(&paths.dir).ok())
                            .map(|p| p.display().to_string())
                            .collect(),
                    };
                    if let Some(a) = crate::lifecycle::count_abort(
                        paths,
                        self.state,
                        max,
                        &node,
                        &reason,
                        Some(note),
                    )? {
                        crate::announce::announce(paths, &a)?;
                        summary.outcome = Outcome::Halt;
                        summary.reason = Some(a.reason.to_string());
                    }
                }
            }
        }
        if !forged.is_empty() {
            self.halt(
                guard::tampered(),
                Some(&format!(
                    "the state file was rewritten during the tick ({}); loopflow kept its own values",
                    forged.join(", ")
                )),
                summary,
            )?;
        }
        Ok(())
    }

    /// Halts the loop (a halt already standing stays; this one is then only logged).
    fn halt(
        &self,
        reason: HaltReason,
        detail: Option<&str>,
        summary: &mut Summary,
    ) -> Result<(), StateError> {
        if let Some(a) = crate::lifecycle::halt(self.paths, reason.clone(), detail)? {
            crate::announce::announce(self.paths, &a)?;
            summary.outcome = Outcome::Halt;
            summary.reason = Some(reason.to_string());
            return Ok(());
        }
        let mut args = vec![
            LogArg::Kv("reason", reason.to_string()),
            LogArg::Kv("msg", "the loop was already halted".into()),
        ];
        if let Some(d) = detail {
            args.push(LogArg::Kv("detail", d.to_string()));
        }
        self.paths.log(Event::Warn, &args)
    }

    /// A tick that halted before its commit: what it spent counts, though it did not
    /// advance the loop.
    fn commit_spend(&self) -> Result<(), StateError> {
        let spend = self
            .settled
            .lock()
            .map(|o| crate::node::spend_of(o.iter()))
            .unwrap_or_default();
        if spend.usd == 0.0 && spend.tokens == 0 && spend.seconds == 0.0 {
            return Ok(());
        }
        self.paths.update(|s| {
            s.spent.usd = (s.spent.usd + spend.usd).min(f64::MAX);
            s.spent.tokens = s.spent.tokens.saturating_add(spend.tokens);
            s.spent.seconds += spend.seconds;
        })?;
        Ok(())
    }

    /// The log lines this tick wrote must still be there, unchanged.
    fn check_log(&self, summary: &mut Summary) -> Result<(), StateError> {
        let ours = self.ledger.lock().map(|l| l.clone()).unwrap_or_default();
        if let Err(why) = guard::log_intact(self.paths, self.log_start, &ours) {
            self.halt(guard::tampered(), Some(&why), summary)?;
        }
        Ok(())
    }
}
