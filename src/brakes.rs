//! The gate (DESIGN §6): every brake evaluated in order, shared by the `gate` node,
//! `loopflow gate` and `loopflow can-continue`, so all three always agree.

use serde::Serialize;

use crate::config::LoopConfig;
use crate::reason::{Budget, HaltReason, SkipReason, VerifierFailure};
use crate::state::{LoopPaths, State};
pub(crate) use crate::work_source::Task;
use crate::work_source::WorkSourceReader;

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// What a failing gate does to the tick.
#[derive(Debug, Clone, PartialEq)]
pub enum GateVerdict {
    Pass,
    Skip(SkipReason),
    Halt { reason: HaltReason, detail: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct GateReport {
    pub ok: bool,
    /// The failing check's reason, as the log would say it.
    pub reason: Option<String>,
    pub checks: Vec<Check>,
    #[serde(skip)]
    pub verdict: GateVerdict,
    /// The task the work source supplies, when there is one.
    #[serde(skip)]
    pub task: Option<Task>,
    /// Why the work source could not be read (a backlog file that is not there), as the
    /// `task` check says it: not the same as a source with nothing left to do.
    #[serde(skip)]
    pub work_unreadable: Option<String>,
}

fn plateau(history: &[f64], window: usize, epsilon: f64) -> Option<(f64, f64)> {
    if history.len() < window || window == 0 {
        return None;
    }
    let last = &history[history.len() - window..];
    let lo = last.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = last.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // A small tolerance so 0.1 + 0.2 style float noise never breaks "epsilon = 0".
    (hi - lo <= epsilon + 1e-9).then_some((lo, hi))
}

/// Shortest form, at most 4 decimals (`0.8`, `12.5`): cheap, unlike `{:.4}`.
fn fmt_num(n: f64) -> String {
    ((n * 10_000.0).round() / 10_000.0).to_string()
}

/// Evaluates every check in DESIGN §6's order; the first failing one decides.
pub(crate) fn evaluate(
    config: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
    work: &WorkSourceReader<'_>,
) -> GateReport {
    let place = config
        .worktree
        .then(|| crate::worktree::place(paths, config.worktree_dir.as_deref()));
    evaluate_at(config, state, paths, work, place)
}

/// [`evaluate`] with the worktree's [`Place`](crate::worktree::Place) its caller already
/// found (`None`: worktrees off), so a tick looks at it once.
pub(crate) fn evaluate_at(
    config: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
    work: &WorkSourceReader<'_>,
    place: Option<Result<crate::worktree::Place, crate::worktree::LocationError>>,
) -> GateReport {
    let b = &config.brakes;
    let mut checks = Vec::new();
    let mut verdict = GateVerdict::Pass;
    let mut decide = |v: GateVerdict, checks: &mut Vec<Check>, c: Check| {
        if verdict == GateVerdict::Pass && !c.ok {
            verdict = v;
        }
        checks.push(c);
    };

    let halted = state.halt.as_ref();
    decide(
        GateVerdict::Skip(SkipReason::Halted(
            halted.map_or(HaltReason::Other(String::new()), |h| h.reason.clone()),
        )),
        &mut checks,
        Check {
            name: "halted",
            ok: halted.is_none(),
            detail: match halted {
                None => "not halted".into(),
                Some(h) => format!(
                    "halted: {} at {} (run `loopflow approve --loop {}`)",
                    h.reason, h.at, paths.name
                ),
            },
        },
    );

    let max = config.effective_max_iterations(state.extra_iterations);
    decide(
        GateVerdict::Halt {
            reason: HaltReason::IterationsExhausted,
            detail: format!("{} of {max} iterations used", state.iteration_count),
        },
        &mut checks,
        Check {
            name: "max_iterations",
            ok: state.iteration_count < max,
            detail: format!("{}/{max} iterations", state.iteration_count),
        },
    );

    let mut budget_fail = None;
    let mut budget_detail = Vec::new();
    let limits = b.budget(&state.extra_budget);
    if let Some(limit) = limits.usd {
        budget_detail.push(format!(
            "usd {}/{}",
            fmt_num(state.spent.usd),
            fmt_num(limit)
        ));
        if state.spent.usd >= limit {
            budget_fail.get_or_insert(Budget::Usd);
        }
    }
    if let Some(limit) = limits.tokens {
        budget_detail.push(format!("tokens {}/{limit}", state.spent.tokens));
        if state.spent.tokens >= limit {
            budget_fail.get_or_insert(Budget::Tokens);
        }
    }
    if let Some(limit) = limits.seconds {
        budget_detail.push(format!(
            "seconds {}/{}",
            fmt_num(state.spent.seconds),
            fmt_num(limit)
        ));
        if state.spent.seconds >= limit {
            budget_fail.get_or_insert(Budget::Seconds);
        }
    }
    let budget_text = if budget_detail.is_empty() {
        "no budget limits".to_string()
    } else {
        budget_detail.join(", ")
    };
    decide(
        GateVerdict::Halt {
            reason: HaltReason::BudgetExhausted(budget_fail.unwrap_or(Budget::Usd)),
            detail: budget_text.clone(),
        },
        &mut checks,
        Check {
            name: "budget",
            ok: budget_fail.is_none(),
            detail: budget_text,
        },
    );

    let flat = plateau(
        &state.score_history,
        b.score_plateau_window,
        b.score_plateau_epsilon,
    );
    let recent = &state.score_history[state
        .score_history
        .len()
        .saturating_sub(b.score_plateau_window)..];
    let hist: Vec<String> = recent.iter().map(|s| fmt_num(*s)).collect();
    decide(
        GateVerdict::Halt {
            reason: HaltReason::VerifierFailed(VerifierFailure::ScorePlateau),
            detail: format!(
                "last {} scores [{}] differ by at most {}",
                b.score_plateau_window,
                hist.join(", "),
                fmt_num(b.score_plateau_epsilon)
            ),
        },
        &mut checks,
        Check {
            name: "score_plateau",
            ok: flat.is_none(),
            detail: format!(
                "scores [{}], window {}, epsilon {}",
                hist.join(", "),
                b.score_plateau_window,
                fmt_num(b.score_plateau_epsilon)
            ),
        },
    );

    let mut unreadable = None;
    let (task_ok, task_detail, task) = match work.current() {
        Ok(Some(t)) => (true, format!("{} (from {})", t.id, t.source), Some(t)),
        Ok(None) => (false, "no current task".to_string(), None),
        Err(e) => {
            let why = format!("work source unreadable: {e}");
            unreadable = Some(why.clone());
            (false, why, None)
        }
    };
    decide(
        GateVerdict::Skip(SkipReason::NoCurrentTask),
        &mut checks,
        Check {
            name: "task",
            ok: task_ok,
            detail: task_detail,
        },
    );

    let phase_ok = b.run_phases.contains(&state.current_phase);
    decide(
        GateVerdict::Skip(SkipReason::Phase(state.current_phase.clone())),
        &mut checks,
        Check {
            name: "task_phase",
            ok: phase_ok,
            detail: format!(
                "phase `{}`; runs in [{}]",
                state.current_phase,
                b.run_phases.join(", ")
            ),
        },
    );

    let worktree = match place {
        None => Some((true, "worktree disabled".to_string())),
        Some(Ok(crate::worktree::Place::Own(c))) => {
            Some((true, format!("worktree at {}", c.work_tree.display())))
        }
        Some(Ok(crate::worktree::Place::Missing(c))) => Some((
            false,
            format!(
                "worktree configured but missing at {} (`loopflow worktree restore --loop {}` makes it)",
                c.work_tree.display(),
                paths.name
            ),
        )),
        Some(Ok(crate::worktree::Place::Nested { old, new })) => Some((
            true,
            format!(
                "worktree in the old layout at {}; the next tick moves it to {}",
                old.display(),
                new.work_tree.display()
            ),
        )),
        Some(Err(e)) => Some((false, e.to_string())),
    };
    if let Some((ok, detail)) = worktree {
        decide(
            GateVerdict::Skip(SkipReason::WorktreeMissing),
            &mut checks,
            Check {
                name: "worktree",
                ok,
                detail,
            },
        );
    }

    // A provider's usage or rate limit, recorded by any loop of the same preset and
    // credential (in any project): no agent is started before it lifts.
    let presets = limited_presets(config);
    if !presets.is_empty() {
        let standing = crate::preset::limit::standing_any(&presets);
        let detail = match &standing {
            None => format!(
                "no usage limit standing for {}",
                presets
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some(r) => format!(
                "{}: usage limit until {} (hit by {}: {})",
                r.preset, r.until, r.hit_by, r.message
            ),
        };
        decide(
            GateVerdict::Skip(SkipReason::UsageLimit {
                until: standing
                    .as_ref()
                    .map(|r| r.until.clone())
                    .unwrap_or_default(),
            }),
            &mut checks,
            Check {
                name: "usage_limit",
                ok: standing.is_none(),
                detail,
            },
        );
    }

    let (ok, reason) = match &verdict {
        GateVerdict::Pass => (true, None),
        GateVerdict::Skip(r) => (false, Some(r.to_string())),
        GateVerdict::Halt { reason, .. } => (false, Some(reason.to_string())),
    };
    GateReport {
        ok,
        reason,
        checks,
        verdict,
        task,
        work_unreadable: unreadable,
    }
}

/// The presets a loop's roles run that know how their CLI reports a limit, each once.
pub(crate) fn limited_presets(config: &LoopConfig) -> Vec<std::sync::Arc<crate::preset::Preset>> {
    let mut out: Vec<std::sync::Arc<crate::preset::Preset>> = Vec::new();
    for role in config.roles.keys() {
        if let Some(p) = config.agent(role).def
            && p.limit.is_some()
            && !out.iter().any(|q| q.name == p.name)
        {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plateau_needs_a_full_window() {
        assert_eq!(plateau(&[0.4, 0.4], 3, 0.0), None);
        assert!(plateau(&[0.4, 0.4, 0.4], 3, 0.0).is_some());
        assert!(plateau(&[0.4, 0.5, 0.4], 3, 0.0).is_none());
        assert!(plateau(&[0.4, 0.45, 0.4], 3, 0.05).is_some());
    }
}
