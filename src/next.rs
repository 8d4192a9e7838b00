//! What a loop's next tick will do, for the human who just changed its state (`approve`,
//! `task`) or looks at it (`status`): the gate evaluated exactly as the tick evaluates it,
//! with the command or setting that changes the answer.

use crate::brakes::GateVerdict;
use crate::config::{LoopConfig, WorkSource};
use crate::reason::{Budget, HaltReason, SkipReason, VerifierFailure};
use crate::state::{LoopPaths, State};
use crate::work_source::WorkSourceReader;

/// What the next tick does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Next {
    /// It runs its nodes: iteration `iteration` of `max`, on `task`.
    Runs {
        iteration: u64,
        max: u64,
        task: Option<String>,
    },
    /// It ends as `SKIP reason=…` before any agent runs, and so does every tick after it
    /// until a human acts.
    Skips {
        reason: SkipReason,
        detail: String,
        fix: String,
    },
    /// Its gate halts the loop at once.
    Halts {
        reason: HaltReason,
        detail: String,
        fix: String,
    },
}

/// The next tick of a loop in `state`. Nothing is spawned: an audit work source is not
/// run (its task is the one the state last recorded), a backlog file is read.
pub(crate) fn next(cfg: &LoopConfig, state: &State, paths: &LoopPaths) -> Next {
    let place = cfg
        .worktree
        .then(|| crate::worktree::place(paths, cfg.worktree_dir.as_deref()));
    next_at(cfg, state, paths, place)
}

fn next_at(
    cfg: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
    place: Option<Result<crate::worktree::Place, crate::worktree::LocationError>>,
) -> Next {
    let work = WorkSourceReader::new(cfg, state, paths, true);
    let gate = crate::brakes::evaluate_at(cfg, state, paths, &work, place);
    let failing = || {
        gate.checks
            .iter()
            .find(|c| !c.ok)
            .map(|c| c.detail.clone())
            .unwrap_or_default()
    };
    match gate.verdict {
        GateVerdict::Pass => Next::Runs {
            iteration: state.iteration_count.saturating_add(1),
            max: cfg.effective_max_iterations(state.extra_iterations),
            task: gate.task.map(|t| t.id),
        },
        GateVerdict::Skip(reason) => Next::Skips {
            fix: skip_fix(&reason, cfg, &paths.name, gate.work_unreadable.is_some()),
            detail: failing(),
            reason,
        },
        GateVerdict::Halt { reason, detail } => Next::Halts {
            fix: halt_fix(&reason),
            detail,
            reason,
        },
    }
}

/// What makes a skipping loop tick again.
fn skip_fix(reason: &SkipReason, cfg: &LoopConfig, name: &str, unreadable: bool) -> String {
    match reason {
        SkipReason::NoCurrentTask => match &cfg.work_source {
            WorkSource::Backlog { file } if unreadable => format!(
                "create the backlog file {} (its topmost `- [ ]` item is the task), or fix `[work_source] file` in loop.toml",
                file.display()
            ),
            WorkSource::Backlog { file } => format!(
                "add an open item (`- [ ] …`) to {}, or end the loop with `loopflow close --loop {name}` if its work is done",
                file.display()
            ),
            WorkSource::Audit { .. } => {
                "the audit command reported no task: nothing to do until it reports one".into()
            }
            WorkSource::Single => {
                format!("give it one: `loopflow task --loop {name} \"…\"`")
            }
        },
        SkipReason::Phase(p) => match cfg.brakes.run_phases.first() {
            Some(run) => format!(
                "`loopflow transition --loop {name} --to {run}`, or add `{p}` to brakes.run_phases"
            ),
            None => "brakes.run_phases is empty: list the phases the loop runs in".into(),
        },
        SkipReason::WorktreeMissing => {
            format!("`loopflow worktree restore --loop {name}` makes its own worktree again")
        }
        SkipReason::Halted(_) => format!(
            "`loopflow review --loop {name}`, then `loopflow approve --loop {name}` (or `close` it)"
        ),
        _ => String::new(),
    }
}

/// What an approval must add so the gate does not halt the loop again at once.
fn halt_fix(reason: &HaltReason) -> String {
    let budget = |key: &str, flag: &str| {
        format!(
            "raise brakes.{key} in loop.toml, or pass `--{flag} +N` (N more, recorded in the state)"
        )
    };
    match reason {
        HaltReason::IterationsExhausted => {
            "pass `--extend N` for N more iterations, or raise brakes.max_iterations in loop.toml"
                .into()
        }
        HaltReason::BudgetExhausted(Budget::Usd) => budget("max_budget_usd", "budget-usd"),
        HaltReason::BudgetExhausted(Budget::Tokens) => budget("max_tokens", "budget-tokens"),
        HaltReason::BudgetExhausted(Budget::Seconds) => budget("max_seconds", "budget-seconds"),
        HaltReason::VerifierFailed(VerifierFailure::ScorePlateau) => {
            "pass `--reset-scores` so the plateau window fills afresh, or widen brakes.score_plateau_window or score_plateau_epsilon in loop.toml".into()
        }
        _ => String::new(),
    }
}

/// The skips that repeat every tick until a human acts: what `status` shows as a problem
/// (a halt, a `when` or a lock is not one of them).
pub(crate) fn persistent(reason: &SkipReason) -> bool {
    matches!(
        reason,
        SkipReason::NoCurrentTask | SkipReason::Phase(_) | SkipReason::WorktreeMissing
    )
}
