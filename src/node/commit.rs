//! `commit`: the only node that writes `.state.loop`: iteration, timestamps, verdict,
//! score history (capped at the plateau window) and spend (verdict, agents' reported
//! usage, wall time), in one atomic write; then the
//! `TICK` log line. A verdict that meets the goal also halts the loop as `goal_met`.

use crate::config::WorkSource;
use crate::diag::Diagnostics;
use crate::exec::NodeCtx;
use crate::node::{NodeKind, NodeRun, NodeSpec};
use crate::state::{Halt, LogArg, State, now};

/// The halt reason when an agent rewrote `.state.loop` during its tick.
const TAMPERED: &str = "human_intervention:state_tampered";

/// The halt reason when `loop.toml`, the pipeline or a prompt changed during the tick.
const CONFIG_CHANGED: &str = "human_intervention:config_changed";
use crate::toml_read::Table;

pub struct Commit;

impl NodeKind for Commit {
    fn name(&self) -> &'static str {
        "commit"
    }
    fn about(&self) -> &'static str {
        "writes the loop's state: the iteration advances"
    }
    fn keys(&self) -> &'static [&'static str] {
        &[]
    }
    fn parse(&self, _t: &Table<'_, '_>, _d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        Some(Box::new(CommitNode))
    }
}

#[derive(Debug)]
struct CommitNode;

fn fmt_score(s: f64) -> String {
    let t = format!("{s:.4}");
    let t = t.trim_end_matches('0');
    if t.ends_with('.') {
        format!("{t}0")
    } else {
        t.to_string()
    }
}

/// Usage an agent reported in its `{{output}}` file, when that file is a JSON object:
/// `cost_usd` (or Claude Code's `total_cost_usd`) and `tokens` (or `usage.input_tokens`
/// + `usage.output_tokens`). Counted on top of the verdict's own `cost_usd`/`tokens`.
fn reported_usage(path: &std::path::Path) -> (f64, u64) {
    let Some(v) = crate::fs_safe::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .filter(serde_json::Value::is_object)
    else {
        return (0.0, 0);
    };
    let usd = v["cost_usd"]
        .as_f64()
        .or_else(|| v["total_cost_usd"].as_f64())
        .filter(|x| x.is_finite() && *x >= 0.0)
        .unwrap_or(0.0);
    let tokens = v["tokens"].as_u64().unwrap_or_else(|| {
        v["usage"]["input_tokens"]
            .as_u64()
            .unwrap_or(0)
            .saturating_add(v["usage"]["output_tokens"].as_u64().unwrap_or(0))
    });
    (usd, tokens)
}

/// Fields of `.state.loop` that only a tick's own commit or `approve` may change. `approve`
/// is refused while a tick holds the lock, so at commit time they must still hold their
/// tick-start values; a difference means something with write access to the file (an
/// agent) rewrote it. `halt` may be set during a tick (`loopflow halt`), never cleared;
/// `current_phase` may change (`loopflow transition`).
fn tampered(start: &State, disk: &State) -> Vec<&'static str> {
    let mut f = Vec::new();
    let mut check = |changed: bool, name: &'static str| {
        if changed {
            f.push(name);
        }
    };
    check(
        disk.schema_version != start.schema_version,
        "schema_version",
    );
    check(disk.name != start.name, "name");
    check(
        disk.iteration_count != start.iteration_count,
        "iteration_count",
    );
    check(
        disk.extra_iterations != start.extra_iterations,
        "extra_iterations",
    );
    check(disk.approvals != start.approvals, "approvals");
    check(disk.score_history != start.score_history, "score_history");
    check(disk.spent != start.spent, "spent");
    check(disk.last_verdict != start.last_verdict, "last_verdict");
    check(disk.last_tick_at != start.last_tick_at, "last_tick_at");
    check(
        disk.consecutive_aborts != start.consecutive_aborts,
        "consecutive_aborts",
    );
    check(disk.current_task != start.current_task, "current_task");
    check(disk.task_source != start.task_source, "task_source");
    check(disk.worktree_path != start.worktree_path, "worktree_path");
    check(disk.created_at != start.created_at, "created_at");
    check(start.halt.is_some() && disk.halt != start.halt, "halt");
    f
}

/// The most recent halt logged during this tick (by `loopflow halt`), for when the state
/// file no longer shows it. `None` when the log holds no such event.
fn halt_logged_since(log: &std::path::Path, start: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(log).ok()?;
    let len = f.metadata().ok()?.len();
    // Bounded: the newest 4 MiB of this tick's events at most.
    let from = start.max(len.saturating_sub(4 << 20));
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut text = String::new();
    f.take(4 << 20).read_to_string(&mut text).ok()?;
    text.lines()
        .filter_map(|l| l.split_once(' ').map(|(_, rest)| rest))
        .filter_map(|rest| rest.strip_prefix("HALT "))
        .map(|r| r.split(" detail=\"").next().unwrap_or(r).to_string())
        .next_back()
}

impl NodeSpec for CommitNode {
    fn commits(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let env = ctx.env;
        let brakes = &env.config.brakes;
        let verdict = ctx.verdict().cloned();
        let seconds = ctx.upstream_seconds();
        let cached = ctx.upstream.iter().any(|(_, o)| o.cached);
        let (usage_usd, usage_tokens) = ctx
            .upstream
            .iter()
            .filter_map(|(_, o)| o.output_path.as_deref())
            .map(reported_usage)
            .fold((0.0, 0u64), |(u, t), (du, dt)| {
                (u + du, t.saturating_add(dt))
            });
        // Backlog and audit sources: the task after this tick's work (the agent may have
        // checked its item off), so `status` shows what the next tick will take.
        let next = match env.config.work_source {
            WorkSource::Single => None,
            _ => Some(crate::brakes::next_task(env.config, &env.state, env.paths)),
        };
        // Spend the agent CLIs reported (preset `usage` rules). When there is any, it
        // replaces the verifier's own guess (`cost_usd` / `tokens` in the verdict), which
        // would otherwise count the same spend twice.
        let agent_usd: Option<f64> = ctx
            .upstream
            .iter()
            .filter_map(|(_, o)| o.cost_usd)
            .reduce(|a, b| a + b);
        let agent_tokens: Option<u64> = ctx
            .upstream
            .iter()
            .filter_map(|(_, o)| o.tokens)
            .reduce(|a, b| a.saturating_add(b));
        let goal = verdict
            .as_ref()
            .is_some_and(|v| v.pass && v.score >= brakes.goal_score);
        let log_len = std::fs::metadata(&env.paths.log).map_or(0, |m| m.len());
        let logged_halt = halt_logged_since(&env.paths.log, env.log_start);
        let config_changed = crate::exec::changed_since(&env.watched);
        let result = env.paths.update(|s| {
            // Re-read under the state lock: a `transition` or `halt` made during the tick
            // (by the orchestrator, say) is kept. Everything else starts from the state as
            // the tick found it, so rewriting the file mid-tick cannot lower the count,
            // raise the caps, forge approvals or clear a halt.
            let mut forged = tampered(&env.state, s);
            if log_len < env.log_start {
                forged.push(".state.log (truncated)");
            }
            if !forged.is_empty() {
                let halt = s.halt.take().or_else(|| env.state.halt.clone());
                let phase = std::mem::take(&mut s.current_phase);
                *s = env.state.clone();
                s.halt = halt;
                s.current_phase = phase;
            }
            if s.halt.is_none()
                && let Some(reason) = &logged_halt
            {
                s.halt = Some(Halt {
                    reason: reason.clone(),
                    detail: Some(
                        "halted during the tick; restored from .state.log after the state file lost it"
                            .into(),
                    ),
                    at: now(),
                    iteration: s.iteration_count,
                });
            }
            s.iteration_count = s.iteration_count.saturating_add(1);
            s.last_tick_at = Some(now());
            s.consecutive_aborts = 0;
            s.spent.seconds += seconds;
            // Clamped: an infinite sum would be saved as JSON `null` and brick the state file.
            // Saturating: counts come from agents, and a wrapped sum would reset the brakes.
            let usd = usage_usd + agent_usd.unwrap_or(0.0);
            s.spent.usd = (s.spent.usd + usd).min(f64::MAX);
            let tokens = usage_tokens.saturating_add(agent_tokens.unwrap_or(0));
            s.spent.tokens = s.spent.tokens.saturating_add(tokens);
            if let Some(v) = &verdict {
                s.score_history.push(v.score);
                let window = brakes.score_plateau_window.max(1);
                if s.score_history.len() > window {
                    let drop = s.score_history.len() - window;
                    s.score_history.drain(..drop);
                }
                // The verdict's own figures count only when no agent reported its spend.
                if agent_usd.is_none() {
                    s.spent.usd = (s.spent.usd + v.cost_usd.unwrap_or(0.0)).min(f64::MAX);
                }
                if agent_tokens.is_none() {
                    s.spent.tokens = s.spent.tokens.saturating_add(v.tokens.unwrap_or(0));
                }
                s.last_verdict = Some(v.clone());
            }
            match &next {
                None => {
                    if s.current_task.is_none()
                        && let Some(t) = &env.task
                    {
                        s.current_task = Some(t.clone());
                    }
                }
                Some(Ok(n)) => {
                    s.current_task = n.as_ref().map(|t| t.id.clone());
                    s.task_source = n.as_ref().map(|t| t.source.clone());
                }
                // The source could not be read now: keep what this tick worked on.
                Some(Err(_)) => {
                    if let Some(t) = &env.work_task {
                        s.current_task = Some(t.id.clone());
                        s.task_source = Some(t.source.clone());
                    }
                }
            }
            // The first of these that applies halts the loop in this same write; a halt
            // already set (by `loopflow halt` during the tick, say) stands.
            let why: Option<(&'static str, Option<String>)> = if s.halt.is_some() {
                None
            } else if !forged.is_empty() {
                Some((
                    TAMPERED,
                    Some(format!(
                        "the state file was rewritten during the tick ({}); loopflow kept its own values",
                        forged.join(", ")
                    )),
                ))
            } else if !config_changed.is_empty() {
                Some((
                    CONFIG_CHANGED,
                    Some(format!(
                        "changed during the tick: {}; review the change, then approve",
                        config_changed.join(", ")
                    )),
                ))
            } else if goal {
                Some(("goal_met", None))
            } else {
                None
            };
            let (reason, logged) = why?;
            s.halt = Some(Halt {
                reason: reason.into(),
                detail: logged.clone().or_else(|| {
                    verdict
                        .as_ref()
                        .map(|v| format!("pass=true score={}", fmt_score(v.score)))
                }),
                at: now(),
                iteration: s.iteration_count,
            });
            Some((reason, logged))
        });
        let (state, halted_now) = match result {
            Ok(x) => x,
            Err(e) => {
                return NodeRun::Failed {
                    reason: format!("state:{e}"),
                    output: Default::default(),
                };
            }
        };
        let iter = state.iteration_count.to_string();
        let mut args = Vec::new();
        if let Some(v) = &verdict {
            args.push(LogArg::Kv("pass", v.pass.to_string()));
            args.push(LogArg::Kv("score", fmt_score(v.score)));
        }
        args.push(LogArg::Kv("iter", iter));
        if cached {
            args.push(LogArg::Kv("cached", "true".into()));
        }
        let _ = env.paths.log("TICK", &args);
        if let Some(Ok(n)) = &next {
            let done = env.task.as_deref().unwrap_or("");
            let now_id = n.as_ref().map_or("", |t| t.id.as_str());
            if done != now_id {
                let _ = env.paths.log(
                    "TASK",
                    &[
                        LogArg::Kv("done", done.to_string()),
                        LogArg::Kv("next", n.as_ref().map_or("none".into(), |t| t.id.clone())),
                        LogArg::Kv(
                            "source",
                            n.as_ref().map_or("-".into(), |t| t.source.clone()),
                        ),
                    ],
                );
            }
        }
        if let Some((reason, detail)) = &halted_now {
            let mut args = vec![LogArg::Word(reason)];
            if let Some(d) = detail {
                args.push(LogArg::Kv("detail", d.clone()));
            }
            let _ = env.paths.log("HALT", &args);
        }
        NodeRun::Committed {
            state: Box::new(state),
            halted: halted_now.map(|(r, _)| r.to_string()),
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(format!(
            "would advance iteration_count to {}",
            ctx.env.tick
        )))
    }
}
