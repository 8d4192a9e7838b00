//! `verdict`: parses the graded verdict (DESIGN §7) from another node's stdout. A missing
//! or invalid verdict halts the loop as `verifier_failed:unparseable`; nothing advances.

use crate::diag::Diagnostics;
use crate::node::{Key, KeyType, NodeCtx, NodeKind, NodeOutput, NodeRun, NodeSpec};
use crate::reason::{HaltReason, VerifierFailure};
use crate::toml_read::{Str, Table};

pub(super) struct VerdictKind;

impl NodeKind for VerdictKind {
    fn name(&self) -> &'static str {
        "verdict"
    }
    fn about(&self) -> &'static str {
        "parses the verifier's graded verdict from another node's stdout"
    }
    fn keys(&self) -> &'static [Key] {
        &[Key {
            name: "from",
            ty: KeyType::String,
            about: "verdict: the node whose stdout holds the verdict.",
        }]
    }
    fn parse(&self, t: &Table<'_, '_>, d: &mut Diagnostics) -> Option<Box<dyn NodeSpec>> {
        let from = t.str("from", d);
        if from.is_none() && t.get("from").is_none() {
            t.missing("from", "from = \"verify\"", d);
        }
        Some(Box::new(VerdictNode { from: from? }))
    }
}

#[derive(Debug)]
struct VerdictNode {
    from: Str,
}

impl NodeSpec for VerdictNode {
    fn reads(&self) -> Option<&Str> {
        Some(&self.from)
    }
    fn produces_verdict(&self) -> bool {
        true
    }

    fn run(&self, ctx: &NodeCtx<'_>) -> NodeRun {
        let unparseable = |detail: String| NodeRun::Halt {
            reason: HaltReason::VerifierFailed(VerifierFailure::Unparseable),
            detail: Some(detail),
        };
        let Some(src) = ctx.upstream_output(&self.from.value) else {
            return unparseable(format!("node {} produced no output", self.from.value));
        };
        // An agent whose output is a JSON envelope (a preset) has its answer extracted.
        // Otherwise the file's tail, not the capped in-memory head: the verdict is usually
        // last. At most `VERDICT_TAIL` bytes, so endless output cannot exhaust memory.
        let text = match (&src.answer, &src.stdout_path) {
            (Some(a), _) => a.clone(),
            (None, Some(p)) => crate::fs_safe::tail(p, crate::fs_safe::VERDICT_TAIL)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_else(|_| src.output.clone().unwrap_or_default()),
            (None, None) => src.output.clone().unwrap_or_default(),
        };
        match crate::verdict::parse(&text) {
            Ok(v) => NodeRun::Ok(NodeOutput {
                output: Some(serde_json::to_string(&v).unwrap_or_default()),
                verdict: Some(v),
                ..Default::default()
            }),
            Err(e) => {
                let big = src
                    .stdout_path
                    .as_ref()
                    .and_then(|p| std::fs::metadata(p).ok())
                    .is_some_and(|m| m.len() > crate::fs_safe::VERDICT_TAIL);
                let note = if big && src.answer.is_none() {
                    " (only the last MiB of a longer output is read: print the verdict last)"
                } else {
                    ""
                };
                unparseable(format!(
                    "{e} (in the stdout of node {}){note}",
                    self.from.value
                ))
            }
        }
    }

    fn dry_run(&self, _ctx: &NodeCtx<'_>) -> Result<Option<String>, String> {
        Ok(Some(format!("parses the stdout of `{}`", self.from.value)))
    }
}
