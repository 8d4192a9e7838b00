//! The human's controls: `gate`, `can-continue`, `halt`, `approve`, `transition`,
//! `can-edit`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{config, open, report};
use crate::exit;
use crate::lifecycle::{Approve, Between, HumanError};
use crate::next::Next;
use crate::out::{self, outln};
use crate::reason::HaltReason;
use crate::remote::human::Guard;
use crate::tick::RunError;

#[derive(Args, Debug)]
pub(crate) struct LoopArg {
    /// The loop to ask about.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub(crate) struct GateArgs {
    /// The loop whose brakes to evaluate.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Print the gate's report as one JSON document: `{"ok", "reason", "checks", …}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct HaltArgs {
    /// The loop to halt.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Why; any text, stored as halt.reason.
    #[arg(long)]
    pub reason: String,
}

#[derive(Args, Debug)]
pub(crate) struct ApproveArgs {
    /// The halted loop to approve (or extend).
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// A note recorded with the approval.
    #[arg(long)]
    pub note: Option<String>,
    /// Allow N more iterations on top of brakes.max_iterations (recorded in the state).
    #[arg(long, value_name = "N")]
    pub extend: Option<u64>,
    /// Raise the dollar budget by N on top of brakes.max_budget_usd (`+5` or `5`;
    /// recorded in the state, loop.toml is left as it is).
    #[arg(long, value_name = "+N", value_parser = more::<f64>)]
    pub budget_usd: Option<f64>,
    /// Raise the token budget by N on top of brakes.max_tokens (recorded in the state).
    #[arg(long, value_name = "+N", value_parser = more::<u64>)]
    pub budget_tokens: Option<u64>,
    /// Raise the time budget by N seconds on top of brakes.max_seconds (recorded in the
    /// state).
    #[arg(long, value_name = "+N", value_parser = more::<f64>)]
    pub budget_seconds: Option<f64>,
    /// Forget the score history, so the plateau window fills afresh (approving a
    /// `score_plateau` halt does this by itself).
    #[arg(long)]
    pub reset_scores: bool,
    /// Who approves (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

/// An amount to add: `+N` or `N`, a positive finite number.
fn more<T>(s: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + Default + Copy,
{
    let n: T = s
        .strip_prefix('+')
        .unwrap_or(s)
        .parse()
        .map_err(|_| format!("`{s}` is not an amount to add: write `+N` or `N`, e.g. `+5`"))?;
    // NaN compares as nothing (not greater than zero); `inf` and `1e999` are infinite.
    let positive = n.partial_cmp(&T::default()) == Some(std::cmp::Ordering::Greater);
    let finite = s
        .strip_prefix('+')
        .unwrap_or(s)
        .parse::<f64>()
        .is_ok_and(f64::is_finite);
    if !positive || !finite {
        return Err(format!(
            "`{s}` is not an amount to add: it must be a positive number"
        ));
    }
    Ok(n)
}

/// Who runs a human's command: `--by`, else the user's name.
pub(super) fn who(by: Option<&str>) -> String {
    by.map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("USERNAME").ok())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

#[derive(Args, Debug)]
pub(crate) struct TransitionArgs {
    /// The loop whose task moves.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// The phase to move the task to.
    #[arg(long)]
    pub to: String,
}

#[derive(Args, Debug)]
pub(crate) struct CanEditArgs {
    /// The loop whose blast radius to check against.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Paths to check (relative paths resolve against the current directory).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// The gate's report for a loop, or the exit code of why it cannot be evaluated.
fn evaluate_gate(project: &Path, name: &str) -> Result<crate::brakes::GateReport, i32> {
    let (paths, state) = open(project, name)?;
    // What `run` refuses, `gate` and `can-continue` do not pass.
    paths
        .owns(&state)
        .map_err(|e| report(&RunError::State(e)))?;
    let cfg = config(&paths, project)?;
    let work = crate::work_source::WorkSourceReader::new(&cfg, &state, &paths, false);
    if cfg.remote.is_some() {
        // A remote loop's worktree is made from its branch when a tick begins, wherever
        // it runs: a clone without one yet may still tick.
        return Ok(crate::brakes::evaluate_at(
            &cfg, &state, &paths, &work, None,
        ));
    }
    Ok(crate::brakes::evaluate(&cfg, &state, &paths, &work))
}

pub(super) fn gate(project: &Path, a: GateArgs) -> i32 {
    let r = match evaluate_gate(project, &a.loop_name) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if a.json {
        outln!("{}", out::json(&r, false));
    } else {
        outln!(
            "gate for loop {}: {}",
            a.loop_name,
            r.reason
                .as_deref()
                .map_or("ok".into(), |x| format!("not ok ({})", out::printable(x)))
        );
        for c in &r.checks {
            outln!(
                "  {} {:<14} {}",
                if c.ok { "ok " } else { "NO " },
                c.name,
                out::printable(&c.detail)
            );
        }
    }
    if r.ok { exit::OK } else { exit::NO }
}

pub(super) fn can_continue(project: &Path, a: LoopArg) -> i32 {
    let r = match evaluate_gate(project, &a.loop_name) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(reason) = &r.reason {
        eprintln!(
            "loop {} cannot continue: {}",
            a.loop_name,
            out::printable(reason)
        );
        exit::NO
    } else {
        exit::OK
    }
}

pub(super) fn halt(project: &Path, a: HaltArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    // A human may always stop a loop, even during a tick (whose settle keeps the halt);
    // a remote loop's halt goes to its record.
    let halted = super::remote::write(&paths, Guard::AllowLease, false, || {
        let set = crate::lifecycle::human_halt(&paths, &a.reason)?;
        if let Some(x) = &set {
            crate::announce::announce(&paths, x)?;
        }
        Ok(set.map(|x| x.reason))
    });
    let halted = match halted {
        Ok(h) => h,
        Err(code) => return code,
    };
    match halted {
        Ok(Some(reason)) => {
            outln!(
                "halted loop {}: {}",
                a.loop_name,
                out::printable(&reason.to_string())
            );
            // What becomes of a tick running now: the tick looks at the state before each
            // node and keeps a halt it finds, but does not stop for it.
            match paths.running_tick_pid() {
                Some(pid) => outln!(
                    "a tick is running (pid {pid}): it runs its remaining nodes, agents included, and commits what they did; the halt stands after it, and every later tick skips until `loopflow approve --loop {n}`. To stop it now: `kill {pid}` (it stops its agents and ends as ABORT, advancing nothing)",
                    n = a.loop_name
                ),
                None => outln!(
                    "no tick is running; every tick skips (`halted:{}`) until `loopflow approve --loop {}`",
                    out::printable(&reason.to_string()),
                    a.loop_name
                ),
            }
            exit::OK
        }
        Ok(None) => {
            eprintln!(
                "error: loop {} is closed (`loopflow close`): it is already ended, and a halt would let `approve` reopen it",
                a.loop_name
            );
            exit::NO
        }
        Err(e) => report(&RunError::State(e)),
    }
}

/// Refuses a closed loop for `verb`; prints why and what to do instead.
pub(super) fn refuse_closed(name: &str, state: &crate::state::State, verb: &str) -> Option<i32> {
    let h = state.halt.as_ref()?;
    if h.reason != HaltReason::Closed {
        return None;
    }
    eprintln!(
        "error: loop {name} is closed ({}, at {}): `{verb}` does not reopen a closed loop, whose work was accepted",
        out::printable(h.detail.as_deref().unwrap_or("closed")),
        out::printable(&h.at)
    );
    eprintln!(
        "  for new work, create a loop (`loopflow create --loop NAME --task \"…\"`), or remove this one first to use its name again (`loopflow delete --loop {name} --yes`)"
    );
    Some(exit::NO)
}

pub(super) fn approve(project: &Path, a: ApproveArgs) -> i32 {
    let paths = match super::loop_paths(project, &a.loop_name) {
        Ok(p) => p,
        Err(c) => return c,
    };
    // The lock first, whatever the state: an agent inside a tick can never approve or
    // extend its own loop. Held until the approval is written.
    let between = match Between::take(&paths, "approve") {
        Ok(b) => b,
        Err(e @ HumanError::TickRunning(..)) => {
            eprintln!("error: {e}");
            return exit::NO;
        }
        Err(HumanError::State(e)) => return report(&RunError::State(e)),
    };
    // A remote loop's state is its record's, fetched now.
    if let Err(code) = super::remote::refresh(&paths, true) {
        return code;
    }
    let state = match paths.load() {
        Ok(s) => s,
        Err(e) => return report(&RunError::State(e)),
    };
    if let Some(code) = refuse_closed(&a.loop_name, &state, "approve") {
        return code;
    }
    let budget = crate::state::Spent {
        usd: a.budget_usd.unwrap_or(0.0),
        tokens: a.budget_tokens.unwrap_or(0),
        seconds: a.budget_seconds.unwrap_or(0.0),
    };
    let extend = a.extend.unwrap_or(0);
    let more = extend > 0 || !budget.is_zero() || a.reset_scores;
    if state.halt.is_none() && !more {
        outln!("loop {} is not halted; nothing to approve", a.loop_name);
        return exit::OK;
    }
    // Without a loop.toml that loads, what the next tick does cannot be known (it will
    // not run); a budget cannot be raised without knowing the limit.
    let cfg = config(&paths, project);
    if let Err(code) = &cfg
        && !budget.is_zero()
    {
        return *code;
    }
    let cfg = cfg.ok();
    if let Some(c) = &cfg
        && let Some(code) = no_such_budget(c, &budget)
    {
        return code;
    }
    let by = who(a.by.as_deref());
    let approval = Approve {
        by: &by,
        note: a.note.as_deref(),
        extend,
        budget: budget.clone(),
        reset_scores: a.reset_scores,
        clears: state.halt.clone(),
    };
    // What the next tick would do after this approval: one that halts again at once is
    // refused, with what would let it run.
    let mut after = state.clone();
    let clears = crate::lifecycle::apply_approval(&mut after, &approval, None);
    let next = cfg.as_ref().map(|c| crate::next::next(c, &after, &paths));
    if let (
        Some(cleared),
        Some(Next::Halts {
            reason,
            detail,
            fix,
        }),
    ) = (&clears, &next)
    {
        eprintln!(
            "error: refused: approving loop {} (halted {}) would halt it again at once: {} ({})",
            a.loop_name,
            out::printable(&cleared.to_string()),
            reason,
            out::printable(detail)
        );
        eprintln!("  {fix}");
        return exit::NO;
    }
    // A remote loop: one read-modify-write of its record, refused while any runner holds
    // its lease, as the lock refuses it here.
    let approved = super::remote::write(&paths, Guard::RefuseLease, true, || {
        let head = crate::review::approved_head(&paths);
        let approved = crate::lifecycle::approve(&paths, &between, &approval, head)?;
        // A schedule the halt switched off runs again.
        crate::schedule::enable_best_effort(&paths);
        Ok(approved)
    });
    let approved = match approved {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return report(&RunError::State(e)),
        Err(code) => return code,
    };
    drop(between);
    let mut added = Vec::new();
    if extend > 0 {
        added.push(format!("+{extend} iterations"));
    }
    if budget.usd > 0.0 {
        added.push(format!("+{} budget", crate::human::usd(budget.usd)));
    }
    if budget.tokens > 0 {
        added.push(format!("+{} tokens", crate::human::count(budget.tokens)));
    }
    if budget.seconds > 0.0 {
        added.push(format!(
            "+{} of time",
            crate::human::seconds(budget.seconds)
        ));
    }
    if a.reset_scores {
        added.push("score history reset".into());
    }
    outln!(
        "approved loop {}{}{}",
        a.loop_name,
        approved
            .cleared
            .as_ref()
            .map(|c| format!(" (cleared halt {})", out::printable(&c.to_string())))
            .unwrap_or_default(),
        if added.is_empty() {
            String::new()
        } else {
            format!(", {}", added.join(", "))
        }
    );
    match cfg {
        Some(c) => say_next(&paths, &c, &approved),
        None => outln!(
            "next: its loop.toml does not load, so no tick runs until `loopflow check` is clean"
        ),
    }
    exit::OK
}

/// `--budget-usd` and the like on a unit `[brakes]` sets no limit for: there is nothing
/// to raise. Prints why.
fn no_such_budget(cfg: &crate::config::LoopConfig, budget: &crate::state::Spent) -> Option<i32> {
    let b = &cfg.brakes;
    let missing = [
        (
            budget.usd > 0.0 && b.max_budget_usd.is_none(),
            "--budget-usd",
            "max_budget_usd",
        ),
        (
            budget.tokens > 0 && b.max_tokens.is_none(),
            "--budget-tokens",
            "max_tokens",
        ),
        (
            budget.seconds > 0.0 && b.max_seconds.is_none(),
            "--budget-seconds",
            "max_seconds",
        ),
    ];
    let (_, flag, key) = missing.into_iter().find(|(m, _, _)| *m)?;
    eprintln!(
        "error: {flag} raises brakes.{key}, which this loop does not set: it has no such limit to raise (set one in loop.toml)"
    );
    Some(exit::USAGE)
}

/// After an approval: what the next tick does, and what fires it.
fn say_next(
    paths: &crate::state::LoopPaths,
    cfg: &crate::config::LoopConfig,
    approved: &crate::lifecycle::Approved,
) {
    let name = &paths.name;
    let s = &approved.state;
    match crate::next::next(cfg, s, paths) {
        Next::Runs {
            iteration,
            max,
            task,
        } => {
            let fired = match crate::schedule::read_record(paths) {
                Some(r) if r.enabled => format!(
                    "its {} schedule fires it (every {})",
                    r.platform.name(),
                    crate::human::seconds(r.interval_seconds as f64)
                ),
                Some(r) => format!(
                    "its {} schedule could not be switched back on (`loopflow log --loop {name}` says why); `loopflow run --loop {name}` runs it now",
                    r.platform.name()
                ),
                None => format!(
                    "no schedule is installed: `loopflow run --loop {name}` runs it now, `loopflow schedule install --loop {name}` on a timer"
                ),
            };
            outln!(
                "next: the next tick runs iteration {iteration} of {max}{}; {fired}",
                task.map(|t| format!(" on task {}", out::printable(&t)))
                    .unwrap_or_default()
            );
        }
        Next::Skips {
            reason,
            detail,
            fix,
        } => outln!(
            "next: the next tick skips (`{reason}`: {}); {fix}",
            out::printable(&detail)
        ),
        Next::Halts {
            reason,
            detail,
            fix,
        } => outln!(
            "note: the next tick halts at once ({reason}: {}); {fix}",
            out::printable(&detail)
        ),
    }
    if approved.cleared == Some(HaltReason::GoalMet) {
        outln!(
            "note: the verifier already passed this task (goal_met), so the next tick works on finished work; to accept it and end the loop, `loopflow close --loop {name}`; for new work, `loopflow task --loop {name} \"…\"`"
        );
    }
}

pub(super) fn transition(project: &Path, a: TransitionArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    if a.to.trim().is_empty() || a.to.chars().any(char::is_whitespace) {
        eprintln!("error: a phase is one word, e.g. `implement`, `review`, `done`");
        return exit::USAGE;
    }
    let moved = super::remote::write(&paths, Guard::AllowLease, false, || {
        crate::lifecycle::transition(&paths, &a.to)
    });
    let moved = match moved {
        Ok(m) => m,
        Err(code) => return code,
    };
    match moved {
        Ok(from) => {
            outln!(
                "loop {}: phase {} → {}",
                a.loop_name,
                out::printable(&from),
                out::printable(&a.to)
            );
            // Phases are free-form, so a typo parks the loop as surely as a decision does:
            // say which one this is (quietly: a loop.toml that does not load is `check`'s
            // to report, not this command's).
            if let Ok(cfg) = crate::load::config(&paths, project)
                && !cfg.brakes.run_phases.contains(&a.to)
            {
                let runs = out::printable(&cfg.brakes.run_phases.join(", ")).into_owned();
                let back = match cfg.brakes.run_phases.first() {
                    Some(p) => format!(
                        "until `loopflow transition --loop {} --to {}`",
                        a.loop_name,
                        out::printable(p)
                    ),
                    None => "whatever the phase (run_phases is empty)".to_string(),
                };
                outln!(
                    "note: `{}` is not in brakes.run_phases [{runs}]: its ticks skip (`phase:{}`) {back}",
                    out::printable(&a.to),
                    out::printable(&a.to),
                );
            }
            exit::OK
        }
        Err(e) => report(&RunError::State(e)),
    }
}

pub(super) fn can_edit(project: &Path, a: CanEditArgs) -> i32 {
    let (paths, _state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let cfg = match config(&paths, project) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let root = crate::work_source::loop_cwd(&cfg, &paths);
    let radius = match crate::blast::Radius::new(&root, &cfg.allow, &cfg.deny) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot evaluate the blast radius: {e}");
            return exit::STATE;
        }
    };
    let mut ok = true;
    for p in &a.paths {
        if let Err(why) = radius.check(p) {
            ok = false;
            outln!("refused: {}: {why}", p.display());
        }
    }
    if ok { exit::OK } else { exit::NO }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_to_add_are_positive_numbers() {
        assert_eq!(more::<f64>("+5"), Ok(5.0));
        assert_eq!(more::<f64>("2.5"), Ok(2.5));
        assert_eq!(more::<u64>("+100"), Ok(100));
        for bad in [
            "0",
            "+0",
            "-1",
            "inf",
            "+infinity",
            "NaN",
            "",
            "+",
            "five",
            "1e999",
        ] {
            assert!(more::<f64>(bad).is_err(), "{bad}");
        }
        assert!(more::<u64>("1.5").is_err());
    }
}
