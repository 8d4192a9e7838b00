//! `gate`: every brake (DESIGN §6), as evaluated once at tick start; not ok ends the
//! tick as SKIP or HALT.

use crate::brakes::GateVerdict;
use crate::diag::Diagnostics;
use crate::node::{NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec};
use crate::toml_read::Table;

pub(super) struct Gate;

impl NodeKind for Gate {
    fn name(&self) -> &'static str {
        "gate"
    }
    fn about(&self) -> &'static str {
        "evaluates every brake; not ok ends the tick as SKIP or HALT"
    }
    fn parse(&self, _t: &Table<'_, '_>, _d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        Some(Box::new(GateNode))
    }
}

#[derive(Debug)]
struct GateNode;

impl NodeSpec for GateNode {
    fn gates(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        match &ctx.scope().gate.verdict {
            GateVerdict::Pass => NodeRun::Ok(NodeOutput::default()),
            GateVerdict::Skip(r) => NodeRun::Skip(r.clone()),
            GateVerdict::Halt { reason, detail } => NodeRun::Halt {
                reason: reason.clone(),
                detail: Some(detail.clone()),
            },
        }
    }

    fn dry_run(&self, ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        let failing: Vec<String> = ctx
            .scope()
            .gate
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        Ok(Some(if failing.is_empty() {
            "every brake ok".into()
        } else {
            failing.join("; ")
        }))
    }
}
