//! `commit`: the only node that writes `.state.loop`: iteration, timestamps, verdict,
//! score history (capped at the plateau window) and spend (verdict, agents' reported
//! usage, wall time), in one atomic write; then the
//! `TICK` log line. A verdict that meets the goal also halts the loop as `goal_met`.

use crate::config::WorkSource;
use crate::diag::Diagnostics;
use crate::exec::NodeCtx;
use crate::node::{NodeKind, NodeRun, NodeSpec};
use crate::state::{Halt, LogArg, now};
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
    let Some(v) = std::fs::read_to_string(path)
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
        v["usage"]["input_tokens"].as_u64().unwrap_or(0)
            + v["usage"]["output_tokens"].as_u64().unwrap_or(0)
    });
    (usd, tokens)
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
            .fold((0.0, 0), |(u, t), (du, dt)| (u + du, t + dt));
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
            .reduce(|a, b| a + b);
        let goal = verdict
            .as_ref()
            .is_some_and(|v| v.pass && v.score >= brakes.goal_score);
        let result = env.paths.update(|s| {
            // Re-read under the state lock: a `transition` or `halt` made during the tick
            // (by the orchestrator, say) is kept.
            s.iteration_count += 1;
            s.last_tick_at = Some(now());
            s.consecutive_aborts = 0;
            s.spent.seconds += seconds;
            s.spent.usd += usage_usd;
            s.spent.tokens += usage_tokens;
            s.spent.usd += agent_usd.unwrap_or(0.0);
            s.spent.tokens += agent_tokens.unwrap_or(0);
            if let Some(v) = &verdict {
                s.score_history.push(v.score);
                let window = brakes.score_plateau_window.max(1);
                if s.score_history.len() > window {
                    let drop = s.score_history.len() - window;
                    s.score_history.drain(..drop);
                }
                if agent_usd.is_none() {
                    s.spent.usd += v.cost_usd.unwrap_or(0.0);
                }
                if agent_tokens.is_none() {
                    s.spent.tokens += v.tokens.unwrap_or(0);
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
            if goal && s.halt.is_none() {
                s.halt = Some(Halt {
                    reason: "goal_met".into(),
                    detail: verdict
                        .as_ref()
                        .map(|v| format!("pass=true score={}", fmt_score(v.score))),
                    at: now(),
                    iteration: s.iteration_count,
                });
                return true;
            }
            false
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
        if halted_now {
            let _ = env.paths.log("HALT", &[LogArg::Word("goal_met")]);
        }
        NodeRun::Committed {
            state: Box::new(state),
            halted: halted_now.then(|| "goal_met".to_string()),
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(format!(
            "would advance iteration_count to {}",
            ctx.env.tick
        )))
    }
}
