//! `commit`: the only node that writes `.state.loop`: iteration, timestamps, verdict,
//! score history (capped at the plateau window) and spend, in one atomic write; then the
//! `TICK` log line. A verdict that meets the goal also halts the loop as `goal_met`.

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

impl NodeSpec for CommitNode {
    fn commits(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let env = ctx.env;
        let brakes = &env.config.brakes;
        let verdict = ctx.verdict().cloned();
        let seconds = ctx.upstream_seconds();
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
            if s.current_task.is_none()
                && let Some(t) = &env.task
            {
                s.current_task = Some(t.clone());
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
        let _ = env.paths.log("TICK", &args);
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
