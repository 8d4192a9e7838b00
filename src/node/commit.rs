//! `commit`: the only node that advances the loop. It adds up what this tick produced —
//! the verdict, the spend (verdict, agents' reported usage, wall time), the next task —
//! and hands it to the tick, which writes it in one atomic write (see
//! [`crate::lifecycle::commit`]). A verdict that meets the goal also halts `goal_met`.

use crate::config::WorkSource;
use crate::diag::Diagnostics;
use crate::lifecycle::{Delta, TaskUpdate};
use crate::node::{NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec};
use crate::toml_read::Table;

pub(super) struct Commit;

impl NodeKind for Commit {
    fn name(&self) -> &'static str {
        "commit"
    }
    fn about(&self) -> &'static str {
        "writes the loop's state: the iteration advances"
    }
    fn parse(&self, _t: &Table<'_, '_>, _d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        Some(Box::new(CommitNode))
    }
}

#[derive(Debug)]
struct CommitNode;

/// Usage an agent reported in its `{{output}}` file (loopflow's copy, taken when its node
/// ended), when that file is a JSON object:
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

/// What a set of node outputs spent, by the commit's rules: usage an agent reported in
/// its `{{output}}` file, plus the agent CLIs' own reports (preset `usage` rules) — which,
/// when there are any, replace the verifier's guess (`cost_usd` / `tokens` in the
/// verdict) that would otherwise count the same spend twice — plus wall time.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Spend {
    pub usd: f64,
    pub tokens: u64,
    pub seconds: f64,
}

pub(crate) fn spend_of<'a>(outputs: impl Iterator<Item = &'a NodeOutput> + Clone) -> Spend {
    // A replay from the verdict cache ran nothing and spent nothing: neither what its
    // replayed output reports nor the replayed verdict's own figures count again.
    let replayed = outputs.clone().any(|o| o.cached);
    let live = || outputs.clone().filter(|o| !o.cached);
    let (file_usd, file_tokens) = live()
        .filter_map(|o| o.output_kept.as_deref())
        .map(reported_usage)
        .fold((0.0, 0u64), |(u, t), (du, dt)| {
            (u + du, t.saturating_add(dt))
        });
    let agent_usd = live().filter_map(|o| o.cost_usd).reduce(|a, b| a + b);
    let agent_tokens = live()
        .filter_map(|o| o.tokens)
        .reduce(|a, b| a.saturating_add(b));
    let guess = outputs
        .clone()
        .filter_map(|o| o.verdict.as_ref())
        .last()
        .filter(|_| !replayed);
    Spend {
        usd: file_usd + agent_usd.unwrap_or_else(|| guess.and_then(|v| v.cost_usd).unwrap_or(0.0)),
        tokens: file_tokens.saturating_add(
            agent_tokens.unwrap_or_else(|| guess.and_then(|v| v.tokens).unwrap_or(0)),
        ),
        seconds: outputs.map(|o| o.seconds).sum(),
    }
}

impl NodeSpec for CommitNode {
    fn commits(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let scope = ctx.scope();
        let verdict = ctx.verdict().cloned();
        let up = ctx.upstream();
        let spend = spend_of(up.iter().map(|(_, o)| *o));
        // Backlog and audit sources: the task after this tick's work (the agent may have
        // checked its item off), so `status` shows what the next tick will take.
        let task = match ctx.config().work_source {
            WorkSource::Single => TaskUpdate::Single,
            _ => match scope.work.next() {
                Ok(n) => TaskUpdate::Next(n),
                Err(_) => TaskUpdate::Unreadable(scope.task().cloned()),
            },
        };
        let goal = verdict
            .as_ref()
            .is_some_and(|v| v.pass && v.score >= ctx.config().brakes.goal_score);
        ctx.commit(Delta {
            verdict,
            seconds: spend.seconds,
            usd: spend.usd,
            tokens: spend.tokens,
            task,
            cached: up.iter().any(|(_, o)| o.cached),
            goal,
        })
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(format!(
            "would advance iteration_count to {}",
            ctx.scope().tick
        )))
    }
}
