//! A loop's life between ticks and at their ends: the commit that advances it, halts
//! (one function, whatever the cause, each returning the announcement its caller makes), the
//! count of aborted ticks, and the human's commands between ticks: approvals, a new
//! task, closing, phase transitions. Everything that writes `.state.loop` goes through
//! here, under the state lock.

use crate::reason::{Failure, HaltReason, Intervention};
use crate::state::tamper::{Watched, forged_fields};
use crate::state::{Approval, Event, Halt, LogArg, LoopPaths, State, StateError, now};
use crate::verdict::{Verdict, fmt_score};
use crate::work_source::Task;

/// What a tick's commit adds to the state, as the commit node computed it.
#[derive(Debug, Clone, Default)]
pub struct Delta {
    pub verdict: Option<Verdict>,
    /// Wall time of this tick's processes.
    pub seconds: f64,
    pub usd: f64,
    pub tokens: u64,
    pub task: TaskUpdate,
    /// The verifier's output was replayed from the verdict cache.
    pub cached: bool,
    /// The verdict met the goal: the loop halts `goal_met` in the same write.
    pub goal: bool,
}

/// What becomes of `current_task` after the tick.
#[derive(Debug, Clone, Default)]
pub enum TaskUpdate {
    /// `single`: the task stays; the tick's own is put back if the state lost it.
    #[default]
    Single,
    /// The work source's next task (the agent may have checked its item off).
    Next(Option<Task>),
    /// The source could not be read now: keep what this tick worked on.
    Unreadable(Option<Task>),
}

/// The state after a commit, and the halt it set (if any), to be announced.
#[derive(Debug, Clone)]
pub struct Committed {
    pub state: State,
    pub halted: Option<HaltReason>,
    pub announce: Option<Announcement>,
}

/// What the tick knew at its start, to tell its own changes from anyone else's.
pub(crate) struct TickStart<'a> {
    pub state: &'a State,
    /// The length of `.state.log` when the tick started: events after it are this tick's.
    pub log_start: u64,
    pub watched: &'a Watched,
    /// The task the tick worked on.
    pub task: Option<&'a str>,
    /// A halt the tick saw in the state file while it ran (a human's): it stands, even if
    /// the file and the log lost it since.
    pub seen_halt: Option<Halt>,
}

/// Sets a halt unless the loop is already halted. Returns the halt it set.
pub(crate) fn set_halt(s: &mut State, reason: HaltReason, detail: Option<String>) -> Option<Halt> {
    if s.halt.is_some() {
        return None;
    }
    let h = Halt {
        reason,
        detail,
        at: now(),
        iteration: s.iteration_count,
    };
    s.halt = Some(h.clone());
    Some(h)
}

/// A halt to be announced: the `HALT` line, the installed schedule switched off, the
/// human told through the loop's `[notify]` command. This module only says so; whoever
/// drives the tick or the command performs it (the `announce` module), after the state write
/// that set the halt — a process killed in between leaves a halt whose line is missing,
/// which the next tick finds and announces ([`recover_halt`]).
#[derive(Debug, Clone)]
#[must_use = "a halt set is announced by its caller"]
pub struct Announcement {
    /// The state the halt was written into.
    pub state: State,
    pub reason: HaltReason,
    pub detail: Option<String>,
    /// Announced by a later tick (the one that set it was killed first).
    pub recovered: bool,
}

impl Announcement {
    fn new(state: State, reason: HaltReason, detail: Option<&str>) -> Announcement {
        Announcement {
            state,
            reason,
            detail: detail.map(str::to_string),
            recovered: false,
        }
    }
}

/// A halt is written to the state first and announced after: a `loopflow run` killed in
/// between leaves a halted loop whose `HALT` line was never logged, whose schedule still
/// fires and whose human was never told. Asked at the start of the next tick, under the
/// tick lock: such a halt is to be announced then, with `recovered=true`. A log whose tail
/// cannot tell (rotated) is left alone, as [`LoopPaths::recover_tick_line`] leaves it.
pub(crate) fn recover_halt(paths: &LoopPaths, state: &State) -> Option<Announcement> {
    let h = state.halt.as_ref()?;
    if crate::state::log::halt_logged(&paths.log) != Some(false) {
        return None;
    }
    Some(Announcement {
        state: state.clone(),
        reason: h.reason.clone(),
        detail: h.detail.clone(),
        recovered: true,
    })
}

/// Halts a loop (unless it is halted already). Only `approve` clears it. Returns the
/// halt to announce when this call set it.
pub(crate) fn halt(
    paths: &LoopPaths,
    reason: HaltReason,
    detail: Option<&str>,
) -> Result<Option<Announcement>, StateError> {
    let (state, set) = paths.update(|s| set_halt(s, reason.clone(), detail.map(str::to_string)))?;
    Ok(set.map(|_| Announcement::new(state, reason, detail)))
}

/// `loopflow halt --reason R`: a human's halt replaces whatever halt stood, except
/// `closed` (a closed loop stays closed: halting and approving it must not reopen it).
/// `None` when the loop is closed; else the halt to announce.
pub(crate) fn human_halt(
    paths: &LoopPaths,
    text: &str,
) -> Result<Option<Announcement>, StateError> {
    let reason: HaltReason = text
        .replace(['\n', '\r'], " ")
        .parse()
        .unwrap_or_else(|never| match never {});
    let (state, set) = paths.update(|s| {
        if s.halt
            .as_ref()
            .is_some_and(|h| h.reason == HaltReason::Closed)
        {
            return false;
        }
        s.halt = Some(Halt {
            reason: reason.clone(),
            detail: Some("halted by `loopflow halt`".into()),
            at: now(),
            iteration: s.iteration_count,
        });
        true
    })?;
    Ok(set.then(|| Announcement::new(state, reason, None)))
}

/// Counts an aborted tick; `max` in a row halts the loop `human_intervention:harness_failing`.
/// Returns the halt to announce when it happened.
pub(crate) fn count_abort(
    paths: &LoopPaths,
    start: &State,
    max: u32,
    node: &str,
    reason: &Failure,
    note: Option<crate::state::AbortNote>,
) -> Result<Option<Announcement>, StateError> {
    let (state, _) = paths.update(|s| {
        s.last_abort = note;
        // Never below the count at tick start: an agent that rewrote the state file to
        // zero it must not dodge `harness_failing`.
        s.consecutive_aborts = s
            .consecutive_aborts
            .max(start.consecutive_aborts)
            .saturating_add(1);
    })?;
    if state.consecutive_aborts < max {
        return Ok(None);
    }
    let why = HaltReason::HumanIntervention(Intervention::HarnessFailing);
    let detail = format!(
        "{} ticks aborted in a row; last: node {node} {reason}",
        state.consecutive_aborts
    );
    halt(paths, why, Some(&detail))
}

/// The commit of a tick (DESIGN §8): iteration, timestamps, verdict, score history,
/// spend, next task, in one atomic write under the state lock; then `TICK` and `TASK`
/// lines, and any halt for the tick's driver to announce. The write starts from the state as the tick found it for every field
/// only a tick may change, so rewriting the file mid-tick cannot lower the count, raise
/// the caps, forge approvals or clear a halt: that halts `state_tampered`. Config changed
/// during the tick halts `config_changed`; a goal met halts `goal_met`.
pub(crate) fn commit(
    paths: &LoopPaths,
    start: &TickStart<'_>,
    delta: &Delta,
    window: usize,
) -> Result<Committed, StateError> {
    let log_len = std::fs::metadata(&paths.log).map_or(0, |m| m.len());
    let logged_halt = crate::state::log::halt_since(&paths.log, start.log_start);
    let config_changed = start.watched.changed();
    let (state, halted) = paths.update(|s| {
        // Re-read under the state lock: a `transition` or `halt` made during the tick (by
        // the orchestrator, say) is kept. Everything else starts from the tick's start.
        let mut forged = forged_fields(start.state, s);
        if log_len < start.log_start {
            forged.push(".state.log (truncated)");
        }
        if !forged.is_empty() {
            let halt = s.halt.take().or_else(|| start.state.halt.clone());
            let phase = std::mem::take(&mut s.current_phase);
            *s = start.state.clone();
            s.halt = halt;
            s.current_phase = phase;
        }
        if s.halt.is_none()
            && let Some(h) = &start.seen_halt
        {
            s.halt = Some(h.clone());
            forged.push("halt (erased during the tick)");
        }
        if s.halt.is_none()
            && let Some(reason) = &logged_halt
        {
            s.halt = Some(Halt {
                reason: reason.parse().unwrap_or_else(|never| match never {}),
                detail: Some(
                    "halted during the tick; restored from .state.log after the state file lost it"
                        .into(),
                ),
                at: now(),
                iteration: s.iteration_count,
            });
        }
        apply(s, delta, start.task, window);
        // The first of these that applies halts the loop in this same write; a halt
        // already set (by `loopflow halt` during the tick, say) stands.
        let why = if !forged.is_empty() {
            Some((
                HaltReason::HumanIntervention(Intervention::StateTampered),
                Some(format!(
                    "the state file was rewritten during the tick ({}); loopflow kept its own values",
                    forged.join(", ")
                )),
            ))
        } else if !config_changed.is_empty() {
            Some((
                HaltReason::HumanIntervention(Intervention::ConfigChanged),
                Some(format!(
                    "changed during the tick: {}; review the change, then approve",
                    config_changed.join(", ")
                )),
            ))
        } else if delta.goal {
            Some((HaltReason::GoalMet, None))
        } else {
            None
        };
        let (reason, logged) = why?;
        let detail = logged.clone().or_else(|| {
            delta
                .verdict
                .as_ref()
                .map(|v| format!("pass=true score={}", fmt_score(v.score)))
        });
        set_halt(s, reason.clone(), detail)?;
        Some((reason, logged))
    })?;
    let mut args = Vec::new();
    if let Some(v) = &delta.verdict {
        args.push(LogArg::Kv("pass", v.pass.to_string()));
        args.push(LogArg::Kv("score", fmt_score(v.score)));
    }
    args.push(LogArg::Kv("iter", state.iteration_count.to_string()));
    if delta.cached {
        args.push(LogArg::Kv("cached", "true".into()));
    }
    let _ = paths.log(Event::Tick, &args);
    if let TaskUpdate::Next(n) = &delta.task {
        let done = start.task.unwrap_or("");
        let now_id = n.as_ref().map_or("", |t| t.id.as_str());
        if done != now_id {
            let _ = paths.log(
                Event::Task,
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
    let announce = halted.as_ref().map(|(reason, detail)| {
        Announcement::new(state.clone(), reason.clone(), detail.as_deref())
    });
    Ok(Committed {
        state,
        halted: halted.map(|(r, _)| r),
        announce,
    })
}

/// The commit's own changes to the state.
fn apply(s: &mut State, delta: &Delta, task: Option<&str>, window: usize) {
    s.iteration_count = s.iteration_count.saturating_add(1);
    s.last_tick_at = Some(now());
    s.consecutive_aborts = 0;
    s.last_abort = None;
    s.spent.seconds += delta.seconds;
    // Clamped: an infinite sum would be saved as JSON `null` and brick the state file.
    // Saturating: counts come from agents, and a wrapped sum would reset the brakes.
    s.spent.usd = (s.spent.usd + delta.usd).min(f64::MAX);
    s.spent.tokens = s.spent.tokens.saturating_add(delta.tokens);
    if let Some(v) = &delta.verdict {
        s.score_history.push(v.score);
        let window = window.max(1);
        if s.score_history.len() > window {
            let drop = s.score_history.len() - window;
            s.score_history.drain(..drop);
        }
        s.last_verdict = Some(v.clone());
    }
    match &delta.task {
        TaskUpdate::Single => {
            if s.current_task.is_none() {
                s.current_task = task.map(str::to_string);
            }
        }
        TaskUpdate::Next(n) => {
            s.current_task = n.as_ref().map(|t| t.id.clone());
            s.task_source = n.as_ref().map(|t| t.source.clone());
        }
        TaskUpdate::Unreadable(t) => {
            if let Some(t) = t {
                s.current_task = Some(t.id.clone());
                s.task_source = Some(t.source.clone());
            }
        }
    }
}

/// A human's command between ticks (`approve`, `task`, `close`, `delete`): it holds the
/// loop's tick lock, so no tick is running when it is taken and none starts until it is
/// dropped (a scheduled one logs `SKIP reason=locked`). An agent inside a tick can
/// therefore never approve, extend, retask, close or delete its own loop, and a tick never
/// starts on a state half-way through a human's change.
pub(crate) struct Between {
    _lock: crate::state::TickLock,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum HumanError {
    #[error(
        "refused: a tick of loop {0} is running; `{1}` is a human's decision between ticks: run it again when the tick ends"
    )]
    TickRunning(String, &'static str),
    #[error(transparent)]
    State(#[from] StateError),
}

impl Between {
    /// Takes the loop's tick lock for `verb`, without waiting.
    pub(crate) fn take(paths: &LoopPaths, verb: &'static str) -> Result<Between, HumanError> {
        match paths.try_lock_tick()? {
            Some(lock) => Ok(Between { _lock: lock }),
            None => Err(HumanError::TickRunning(paths.name.clone(), verb)),
        }
    }
}

/// A human's approval (D4).
#[derive(Debug, Clone, Default)]
pub(crate) struct Approve<'a> {
    pub by: &'a str,
    pub note: Option<&'a str>,
    pub extend: u64,
    /// Budget added on top of `[brakes]`'s limits (`--budget-usd +N`, …).
    pub budget: crate::state::Spent,
    /// Forget the score history, so the plateau window fills afresh.
    pub reset_scores: bool,
    /// The halt the human saw and approves: only that one is cleared (a halt set since
    /// stands). A `closed` halt is never cleared.
    pub clears: Option<Halt>,
}

/// What an approval did.
pub(crate) struct Approved {
    pub state: State,
    pub cleared: Option<HaltReason>,
}

/// An approval's change to the state; returns the halt it cleared. [`approve`] writes it,
/// and `approve` on the command line first looks at what the next tick would do after it.
pub(crate) fn apply_approval(
    s: &mut State,
    a: &Approve<'_>,
    head: Option<String>,
) -> Option<HaltReason> {
    let clears = s.halt.is_some()
        && s.halt == a.clears
        && s.halt
            .as_ref()
            .is_some_and(|h| h.reason != HaltReason::Closed);
    let cleared = if clears {
        s.halt.take().map(|h| h.reason)
    } else {
        None
    };
    let plateau = HaltReason::VerifierFailed(crate::reason::VerifierFailure::ScorePlateau);
    if cleared.as_ref() == Some(&plateau) || a.reset_scores {
        // Otherwise the same flat window would halt the very next tick.
        s.score_history.clear();
    }
    s.consecutive_aborts = 0;
    s.extra_iterations = s.extra_iterations.saturating_add(a.extend);
    let e = &mut s.extra_budget;
    e.usd = (e.usd + a.budget.usd.max(0.0)).min(f64::MAX);
    e.tokens = e.tokens.saturating_add(a.budget.tokens);
    e.seconds = (e.seconds + a.budget.seconds.max(0.0)).min(f64::MAX);
    s.approvals.push(Approval {
        by: a.by.to_string(),
        at: now(),
        note: a.note.map(str::to_string),
        cleared: cleared.as_ref().map(ToString::to_string),
        extend: a.extend,
        head,
    });
    cleared
}

/// Clears the halt the human saw and/or extends the caps, recorded in state and log with
/// `head`, the branch tip the human approved. Only between ticks ([`Between`]); the
/// command re-enables a schedule the halt disabled.
pub(crate) fn approve(
    paths: &LoopPaths,
    _between: &Between,
    a: &Approve<'_>,
    head: Option<String>,
) -> Result<Approved, StateError> {
    let (state, cleared) = paths.update(|s| apply_approval(s, a, head))?;
    let mut args = vec![LogArg::Kv("by", a.by.to_string())];
    if let Some(n) = a.note {
        args.push(LogArg::Kv("note", n.to_string()));
    }
    if let Some(c) = &cleared {
        args.push(LogArg::Kv("cleared", c.to_string()));
    }
    if a.extend > 0 {
        args.push(LogArg::Kv("extend", a.extend.to_string()));
    }
    if a.budget.usd > 0.0 {
        args.push(LogArg::Kv("budget_usd", fmt_score(a.budget.usd)));
    }
    if a.budget.tokens > 0 {
        args.push(LogArg::Kv("budget_tokens", a.budget.tokens.to_string()));
    }
    if a.budget.seconds > 0.0 {
        args.push(LogArg::Kv("budget_seconds", fmt_score(a.budget.seconds)));
    }
    if a.reset_scores {
        args.push(LogArg::Kv("reset_scores", "true".into()));
    }
    paths.log(Event::Approve, &args)?;
    Ok(Approved { state, cleared })
}

/// What `close` did.
pub(crate) struct ClosedLoop {
    /// The halt the close replaced, if the loop was halted.
    pub was: Option<HaltReason>,
}

/// `loopflow close`: a human accepts the loop's work and ends it. The `closed` halt
/// replaces any other and `approve` never clears it; the command uninstalls the schedule
/// (a closed loop has nothing left to tick). Logged `CLOSE by=… [note=…] [was=<halt>]`; no
/// notifier runs (the human is the one who closed it). `None` when it was closed already.
pub(crate) fn close(
    paths: &LoopPaths,
    _between: &Between,
    by: &str,
    note: Option<&str>,
) -> Result<Option<ClosedLoop>, StateError> {
    let (_, was) = paths.update(|s| {
        if s.halt
            .as_ref()
            .is_some_and(|h| h.reason == HaltReason::Closed)
        {
            return None;
        }
        let was = s.halt.take().map(|h| h.reason);
        s.halt = Some(Halt {
            reason: HaltReason::Closed,
            detail: Some(match note {
                Some(n) => format!("closed by {by}: {n}"),
                None => format!("closed by {by}"),
            }),
            at: now(),
            iteration: s.iteration_count,
        });
        Some(was)
    })?;
    let Some(was) = was else {
        return Ok(None);
    };
    let mut args = vec![LogArg::Kv("by", by.to_string())];
    if let Some(n) = note {
        args.push(LogArg::Kv("note", n.to_string()));
    }
    if let Some(w) = &was {
        args.push(LogArg::Kv("was", w.to_string()));
    }
    paths.log(Event::Close, &args)?;
    Ok(Some(ClosedLoop { was }))
}

/// What `task` did: the task it replaced, and whether the text changed.
pub(crate) struct TaskSet {
    pub previous: Option<String>,
    pub changed: bool,
}

/// `loopflow task TEXT`: sets or replaces the current task, recorded as `TASK by=…
/// task=… [was=…]` with `task_source` saying who set it. A different task starts the
/// plateau window afresh and drops the last verdict, whose reasons and hint were about
/// the old one. Only between ticks ([`Between`]).
pub(crate) fn set_task(
    paths: &LoopPaths,
    _between: &Between,
    text: &str,
    by: &str,
) -> Result<TaskSet, StateError> {
    let (_, set) = paths.update(|s| {
        let previous = s.current_task.replace(text.to_string());
        let changed = previous.as_deref() != Some(text);
        if changed {
            s.score_history.clear();
            s.last_verdict = None;
        }
        s.task_source = Some(format!("task by {by}"));
        TaskSet { previous, changed }
    })?;
    let mut args = vec![
        LogArg::Kv("by", by.to_string()),
        LogArg::Kv("task", text.to_string()),
    ];
    if let Some(p) = set.previous.as_ref().filter(|_| set.changed) {
        args.push(LogArg::Kv("was", p.clone()));
    }
    paths.log(Event::Task, &args)?;
    Ok(set)
}

/// Moves the loop's task to another phase; returns the phase it left.
pub(crate) fn transition(paths: &LoopPaths, to: &str) -> Result<String, StateError> {
    let (_, from) = paths.update(|s| std::mem::replace(&mut s.current_phase, to.to_string()))?;
    paths.log(
        Event::Transition,
        &[
            LogArg::Kv("from", from.clone()),
            LogArg::Kv("to", to.to_string()),
        ],
    )?;
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::VerifierFailure;

    fn halted(reason: HaltReason) -> State {
        let mut s = State::new("l", Some("t".into()), None);
        s.halt = Some(Halt {
            reason,
            detail: None,
            at: "2026-12-07T10:00:00Z".into(),
            iteration: 3,
        });
        s.score_history = vec![0.5, 0.5, 0.5];
        s
    }

    #[test]
    fn an_approval_clears_only_the_halt_the_human_saw() {
        let mut s = halted(HaltReason::IterationsExhausted);
        let seen = s.halt.clone();
        let a = Approve {
            by: "me",
            extend: 2,
            clears: seen.clone(),
            ..Approve::default()
        };
        assert_eq!(
            apply_approval(&mut s, &a, None),
            Some(HaltReason::IterationsExhausted)
        );
        assert_eq!(s.halt, None);
        assert_eq!(s.extra_iterations, 2);
        assert_eq!(s.score_history, [0.5, 0.5, 0.5], "kept unless asked");
        // A halt set since the human looked stands.
        let mut s = halted(HaltReason::Other("newer".into()));
        assert_eq!(apply_approval(&mut s, &a, None), None);
        assert!(s.halt.is_some());
        assert_eq!(s.approvals.len(), 1, "the approval is still recorded");
    }

    #[test]
    fn a_closed_loop_is_never_reopened_by_an_approval() {
        let mut s = halted(HaltReason::Closed);
        let a = Approve {
            by: "me",
            clears: s.halt.clone(),
            ..Approve::default()
        };
        assert_eq!(apply_approval(&mut s, &a, None), None);
        assert_eq!(s.halt.map(|h| h.reason), Some(HaltReason::Closed));
    }

    #[test]
    fn plateau_and_reset_scores_empty_the_window_and_budgets_add_up() {
        let plateau = HaltReason::VerifierFailed(VerifierFailure::ScorePlateau);
        let mut s = halted(plateau.clone());
        let a = Approve {
            by: "me",
            clears: s.halt.clone(),
            ..Approve::default()
        };
        assert_eq!(apply_approval(&mut s, &a, None), Some(plateau));
        assert!(s.score_history.is_empty());
        let mut s = halted(HaltReason::GoalMet);
        let a = Approve {
            by: "me",
            reset_scores: true,
            budget: crate::state::Spent {
                usd: 2.5,
                tokens: 100,
                seconds: 60.0,
            },
            ..Approve::default()
        };
        apply_approval(&mut s, &a, None);
        apply_approval(&mut s, &a, None);
        assert!(s.score_history.is_empty());
        assert_eq!(s.halt.map(|h| h.reason), Some(HaltReason::GoalMet));
        assert_eq!(
            s.extra_budget,
            crate::state::Spent {
                usd: 5.0,
                tokens: 200,
                seconds: 120.0
            }
        );
    }
}
