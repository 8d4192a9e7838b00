//! A tick's spans (DESIGN §14): the root `tick <loop>` and one child per node that ran,
//! with the attributes the design names.

use std::path::Path;

use super::{Outcome, Summary};
use crate::reason::NodeStatus;
use crate::telemetry::{Span, TraceIds, Value};

/// The spans of the tick `summary` describes, which ran from `start_ns` to `end_ns`.
pub(super) fn tick_spans(
    ids: &TraceIds,
    (start_ns, end_ns): (u64, u64),
    project: &Path,
    summary: &Summary,
) -> Vec<Span> {
    let span = |span_id, parent, name: String, start_ns, end_ns, attributes, error| Span {
        span_id,
        parent,
        name,
        start_ns,
        end_ns,
        attributes,
        error,
        trace: ids.trace,
        trace_state: ids.trace_state.clone(),
        remote_parent: parent.is_some() && parent == ids.parent,
    };
    let outcome = match summary.outcome {
        Outcome::Tick => "tick",
        Outcome::Skip => "skip",
        Outcome::Halt => "halt",
        Outcome::Abort => "abort",
    };
    let mut root: Vec<(&'static str, Value)> = vec![
        ("loopflow.loop", Value::Str(summary.loop_name.clone())),
        (
            "loopflow.project",
            Value::Str(project.display().to_string()),
        ),
        (
            "loopflow.iteration",
            Value::Int(i64::try_from(summary.iteration).unwrap_or(i64::MAX)),
        ),
        ("loopflow.outcome", Value::Str(outcome.into())),
    ];
    if let Some(r) = &summary.reason {
        let key = match summary.outcome {
            Outcome::Halt => "loopflow.halt_reason",
            Outcome::Skip => "loopflow.skip_reason",
            _ => "loopflow.abort_reason",
        };
        root.push((key, Value::Str(r.clone())));
    }
    if let Some(p) = summary.pass {
        root.push(("loopflow.verdict.pass", Value::Bool(p)));
    }
    if let Some(s) = summary.score {
        root.push(("loopflow.verdict.score", Value::Float(s)));
    }
    let (usd, tokens) = summary.spent;
    root.push(("loopflow.spent.usd", Value::Float(usd)));
    root.push((
        "loopflow.spent.tokens",
        Value::Int(i64::try_from(tokens).unwrap_or(i64::MAX)),
    ));
    let error = (summary.outcome == Outcome::Abort).then(|| {
        summary
            .reason
            .clone()
            .unwrap_or_else(|| "the tick aborted".into())
    });
    let mut out = vec![span(
        ids.root,
        ids.parent,
        format!("tick {}", summary.loop_name),
        start_ns,
        end_ns,
        root,
        error,
    )];
    for n in &summary.nodes {
        if matches!(n.status, NodeStatus::NotRun | NodeStatus::Skipped)
            || n.trace.timing.start_ns == 0
        {
            continue;
        }
        let t = &n.trace;
        let mut a: Vec<(&'static str, Value)> = vec![
            ("loopflow.node", Value::Str(n.id.clone())),
            ("loopflow.node.kind", Value::Str(t.kind.into())),
            ("loopflow.node.status", Value::Str(n.status.to_string())),
            (
                "loopflow.node.attempts",
                Value::Int(i64::from(t.timing.attempts)),
            ),
        ];
        if let Some(r) = &t.role {
            a.push(("loopflow.node.role", Value::Str(r.clone())));
        }
        if let Some(c) = t.exit_code {
            a.push(("process.exit.code", Value::Int(i64::from(c))));
        }
        if let Some(c) = t.cost_usd {
            a.push(("loopflow.node.cost.usd", Value::Float(c)));
        }
        if let Some(k) = t.tokens {
            a.push((
                "loopflow.node.tokens",
                Value::Int(i64::try_from(k).unwrap_or(i64::MAX)),
            ));
        }
        if t.cached {
            a.push(("loopflow.node.cached", Value::Bool(true)));
        }
        let error = (n.status == NodeStatus::Failed).then(|| format!("node {} failed", n.id));
        out.push(span(
            ids.span_of(&n.id),
            Some(ids.root),
            n.id.clone(),
            t.timing.start_ns,
            t.timing.end_ns,
            a,
            error,
        ));
    }
    out
}
