//! The gate (DESIGN §6): every brake evaluated in order, shared by the `gate` node,
//! `loopflow gate` and `loopflow can-continue`, so all three always agree.

use serde::Serialize;

use crate::config::{LoopConfig, WorkSource};
use crate::state::{LoopPaths, State};

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// What a failing gate does to the tick.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass,
    Skip(String),
    Halt { reason: String, detail: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct GateReport {
    pub ok: bool,
    pub reason: Option<String>,
    pub checks: Vec<Check>,
    #[serde(skip)]
    pub verdict: Verdict,
    /// The task the work source supplies, when there is one.
    #[serde(skip)]
    pub task: Option<Task>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub title: String,
    pub source: String,
}

/// The task the loop works on now, from its work source.
pub fn current_task(
    config: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
) -> Result<Option<Task>, String> {
    match &config.work_source {
        WorkSource::Single => Ok(state.current_task.clone().map(|t| Task {
            title: t,
            source: state.task_source.clone().unwrap_or_else(|| "state".into()),
        })),
        WorkSource::Backlog { file } => {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(format!("{}: {e}", file.display())),
            };
            let name = crate::diag::display_name(file, &paths.project);
            Ok(backlog_top(&text).map(|title| Task {
                title,
                source: format!("backlog:{name}"),
            }))
        }
        WorkSource::Audit { .. } => Ok(state.current_task.clone().map(|t| Task {
            title: t,
            source: "audit".into(),
        })),
    }
}

/// The topmost unchecked `- [ ]` item of a markdown checklist; a bold slug is its id.
pub fn backlog_top(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let t = l.trim_start();
        let rest = t
            .strip_prefix("- [ ]")
            .or_else(|| t.strip_prefix("* [ ]"))
            .or_else(|| t.strip_prefix("+ [ ]"))?;
        let rest = rest.trim();
        if let Some(after) = rest.strip_prefix("**")
            && let Some(end) = after.find("**")
        {
            return Some(after[..end].trim().to_string());
        }
        (!rest.is_empty()).then(|| rest.to_string())
    })
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

fn fmt_num(n: f64) -> String {
    let s = format!("{n:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Evaluates every check in DESIGN §6's order; the first failing one decides.
pub fn evaluate(config: &LoopConfig, state: &State, paths: &LoopPaths) -> GateReport {
    let b = &config.brakes;
    let mut checks = Vec::new();
    let mut verdict = Verdict::Pass;
    let mut decide = |v: Verdict, checks: &mut Vec<Check>, c: Check| {
        if verdict == Verdict::Pass && !c.ok {
            verdict = v;
        }
        checks.push(c);
    };

    let halted = state.halt.as_ref();
    decide(
        Verdict::Skip(format!(
            "halted:{}",
            halted.map_or("", |h| h.reason.as_str())
        )),
        &mut checks,
        Check {
            name: "halted",
            ok: halted.is_none(),
            detail: match halted {
                None => "not halted".into(),
                Some(h) => format!(
                    "halted: {} at {} (run `loopflow approve --loop {}`)",
                    h.reason, h.at, state.name
                ),
            },
        },
    );

    let max = config.effective_max_iterations(state.extra_iterations);
    decide(
        Verdict::Halt {
            reason: "iterations_exhausted".into(),
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
    if let Some(limit) = b.max_budget_usd {
        budget_detail.push(format!(
            "usd {}/{}",
            fmt_num(state.spent.usd),
            fmt_num(limit)
        ));
        if state.spent.usd >= limit {
            budget_fail.get_or_insert("usd");
        }
    }
    if let Some(limit) = b.max_tokens {
        budget_detail.push(format!("tokens {}/{limit}", state.spent.tokens));
        if state.spent.tokens >= limit {
            budget_fail.get_or_insert("tokens");
        }
    }
    if let Some(limit) = b.max_seconds {
        budget_detail.push(format!(
            "seconds {}/{}",
            fmt_num(state.spent.seconds),
            fmt_num(limit)
        ));
        if state.spent.seconds >= limit {
            budget_fail.get_or_insert("seconds");
        }
    }
    let budget_text = if budget_detail.is_empty() {
        "no budget limits".to_string()
    } else {
        budget_detail.join(", ")
    };
    decide(
        Verdict::Halt {
            reason: format!("budget_exhausted:{}", budget_fail.unwrap_or("")),
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
    let hist: Vec<String> = state.score_history.iter().map(|s| fmt_num(*s)).collect();
    decide(
        Verdict::Halt {
            reason: "verifier_failed:score_plateau".into(),
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

    let task = current_task(config, state, paths);
    let (task_ok, task_detail, task) = match task {
        Ok(Some(t)) => (true, format!("{} (from {})", t.title, t.source), Some(t)),
        Ok(None) => (false, "no current task".to_string(), None),
        Err(e) => (false, format!("work source unreadable: {e}"), None),
    };
    decide(
        Verdict::Skip("no_current_task".into()),
        &mut checks,
        Check {
            name: "task",
            ok: task_ok,
            detail: task_detail,
        },
    );

    let phase_ok = b.run_phases.contains(&state.current_phase);
    decide(
        Verdict::Skip(format!("phase:{}", state.current_phase)),
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

    let (wt_ok, wt_detail) = if !config.worktree {
        (true, "worktree disabled".to_string())
    } else {
        let path = crate::worktree::dir(paths, state);
        if path.join(".git").exists() {
            (true, format!("worktree at {}", path.display()))
        } else {
            (
                false,
                format!("worktree configured but missing at {}", path.display()),
            )
        }
    };
    decide(
        Verdict::Skip("worktree_missing".into()),
        &mut checks,
        Check {
            name: "worktree",
            ok: wt_ok,
            detail: wt_detail,
        },
    );

    let (ok, reason) = match &verdict {
        Verdict::Pass => (true, None),
        Verdict::Skip(r) => (false, Some(r.clone())),
        Verdict::Halt { reason, .. } => (false, Some(reason.clone())),
    };
    GateReport {
        ok,
        reason,
        checks,
        verdict,
        task,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_picks_topmost_open_item_and_slug() {
        let md = "# B\n- [x] done\n- [ ] **first-thing** — do it\n- [ ] second\n";
        assert_eq!(backlog_top(md).as_deref(), Some("first-thing"));
        assert_eq!(
            backlog_top("- [ ] plain task").as_deref(),
            Some("plain task")
        );
        assert_eq!(backlog_top("- [x] all done"), None);
    }

    #[test]
    fn plateau_needs_a_full_window() {
        assert_eq!(plateau(&[0.4, 0.4], 3, 0.0), None);
        assert!(plateau(&[0.4, 0.4, 0.4], 3, 0.0).is_some());
        assert!(plateau(&[0.4, 0.5, 0.4], 3, 0.0).is_none());
        assert!(plateau(&[0.4, 0.45, 0.4], 3, 0.05).is_some());
    }
}
