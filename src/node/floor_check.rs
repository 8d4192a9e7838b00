//! `floor-check`: the context floor (D13). The user's `brakes.context_tokens` is
//! authoritative; otherwise a best-effort detection. Below the floor the loop halts
//! before any agent runs.

use crate::config::HARD_CONTEXT_FLOOR;
use crate::diag::Diagnostics;
use crate::node::{NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec};
use crate::reason::{HaltReason, Intervention};
use crate::toml_read::Table;

pub(crate) struct FloorCheck;

impl NodeKind for FloorCheck {
    fn name(&self) -> &'static str {
        "floor-check"
    }
    fn about(&self) -> &'static str {
        "halts when the agent's context window is below the floor"
    }
    fn parse(&self, _t: &Table<'_, '_>, _d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        Some(Box::new(FloorNode))
    }
}

#[derive(Debug)]
struct FloorNode;

/// Best-effort detection from the environment the agents will run in.
/// Returns the value and where it came from.
pub(crate) fn detect() -> Option<(u64, &'static str)> {
    [
        "LOOPFLOW_CONTEXT_TOKENS",
        "OLLAMA_CONTEXT_LENGTH",
        "OLLAMA_NUM_CTX",
    ]
    .into_iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok().map(|n| (n, k)))
}

impl FloorNode {
    fn measure(ctx: &NodeCtx<'_>) -> (Option<(u64, String)>, u64) {
        let b = &ctx.config().brakes;
        let floor = b.min_context_tokens.max(HARD_CONTEXT_FLOOR);
        let tokens = b
            .context_tokens
            .map(|n| (n, "brakes.context_tokens".to_string()))
            .or_else(|| detect().map(|(n, k)| (n, k.to_string())));
        (tokens, floor)
    }
}

impl NodeSpec for FloorNode {
    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        match Self::measure(ctx) {
            (Some((n, from)), floor) if n < floor => NodeRun::Halt {
                reason: HaltReason::HumanIntervention(Intervention::ContextBelowFloor),
                detail: Some(format!(
                    "context {n} tokens ({from}) is below the floor of {floor}"
                )),
            },
            (Some(_), _) => NodeRun::Ok(NodeOutput::default()),
            (None, floor) => {
                ctx.warn(format!(
                    "context size unknown; set brakes.context_tokens to enforce the {floor}-token floor"
                ));
                NodeRun::Ok(NodeOutput::default())
            }
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(match Self::measure(ctx) {
            (Some((n, from)), floor) => format!(
                "context {n} ({from}), floor {floor}: {}",
                if n < floor { "would halt" } else { "ok" }
            ),
            (None, floor) => format!("context unknown, floor {floor}: would pass with a warning"),
        }))
    }
}
