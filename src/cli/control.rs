//! The human's controls: `gate`, `can-continue`, `halt`, `approve`, `transition`,
//! `can-edit`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::{config, open, report};
use crate::exit;
use crate::out::{self, outln};
use crate::remote::human::Guard;
use crate::tick::RunError;

#[derive(Args, Debug)]
pub struct LoopArg {
    /// The loop to ask about.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub struct GateArgs {
    /// The loop whose brakes to evaluate.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Print the gate's report as one JSON document: `{"ok", "reason", "checks", …}`.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct HaltArgs {
    /// The loop to halt.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Why; any text, stored as halt.reason.
    #[arg(long)]
    pub reason: String,
}

#[derive(Args, Debug)]
pub struct ApproveArgs {
    /// The halted loop to approve (or extend).
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// A note recorded with the approval.
    #[arg(long)]
    pub note: Option<String>,
    /// Allow N more iterations on top of brakes.max_iterations.
    #[arg(long, value_name = "N")]
    pub extend: Option<u64>,
    /// Who approves (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

#[derive(Args, Debug)]
pub struct TransitionArgs {
    /// The loop whose task moves.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// The phase to move the task to.
    #[arg(long)]
    pub to: String,
}

#[derive(Args, Debug)]
pub struct CanEditArgs {
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

pub fn gate(project: &Path, a: GateArgs) -> i32 {
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

pub fn can_continue(project: &Path, a: LoopArg) -> i32 {
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

pub fn halt(project: &Path, a: HaltArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    // A human may always stop a loop, even during a tick (whose settle keeps the halt).
    let halted = super::remote::write(&paths, Guard::AllowLease, false, || {
        crate::lifecycle::human_halt(&paths, &a.reason)
    });
    let halted = match halted {
        Ok(h) => h,
        Err(code) => return code,
    };
    match halted {
        Ok(reason) => {
            outln!(
                "halted loop {}: {}",
                a.loop_name,
                out::printable(&reason.to_string())
            );
            exit::OK
        }
        Err(e) => report(&RunError::State(e)),
    }
}

pub fn approve(project: &Path, a: ApproveArgs) -> i32 {
    if let Err(e) = crate::state::check_loop_name(&a.loop_name) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    // The lock first, whatever the state: an agent inside a tick can never approve or
    // extend its own loop.
    let paths = crate::state::LoopPaths::new(project, &a.loop_name);
    match paths.tick_running() {
        Ok(false) => {}
        Ok(true) => {
            eprintln!(
                "error: {}",
                crate::lifecycle::ApproveError::TickRunning(a.loop_name.clone())
            );
            return exit::NO;
        }
        Err(e) => return report(&RunError::State(e)),
    }
    let (paths, state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    if state.halt.is_none() && a.extend.is_none() {
        outln!("loop {} is not halted; nothing to approve", a.loop_name);
        return exit::OK;
    }
    let by =
        a.by.clone()
            .or_else(|| std::env::var("USER").ok())
            .or_else(|| std::env::var("USERNAME").ok())
            .unwrap_or_else(|| "unknown".into());
    let extend = a.extend.unwrap_or(0);
    // A remote loop: refused while any runner holds its lease, as the lock refuses it here.
    let approved = super::remote::write(&paths, Guard::RefuseLease, true, || {
        crate::lifecycle::approve(
            &paths,
            &crate::lifecycle::Approve {
                by: &by,
                note: a.note.as_deref(),
                extend,
            },
        )
    });
    let approved = match approved {
        Ok(x) => x,
        Err(code) => return code,
    };
    let approved = match approved {
        Ok(x) => x,
        Err(crate::lifecycle::ApproveError::TickRunning(n)) => {
            eprintln!("error: {}", crate::lifecycle::ApproveError::TickRunning(n));
            return exit::NO;
        }
        Err(crate::lifecycle::ApproveError::State(e)) => return report(&RunError::State(e)),
    };
    outln!(
        "approved loop {}{}{}",
        a.loop_name,
        approved
            .cleared
            .map(|c| format!(" (cleared halt {})", out::printable(&c.to_string())))
            .unwrap_or_default(),
        if extend > 0 {
            format!(", +{extend} iterations")
        } else {
            String::new()
        }
    );
    if let Ok(cfg) = config(&paths, project) {
        let s = &approved.state;
        let max = cfg.effective_max_iterations(s.extra_iterations);
        if s.iteration_count >= max {
            outln!(
                "note: the loop is at its cap ({}/{max}); it will halt again on its next tick unless you pass --extend N",
                s.iteration_count
            );
        }
    }
    exit::OK
}

pub fn transition(project: &Path, a: TransitionArgs) -> i32 {
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

pub fn can_edit(project: &Path, a: CanEditArgs) -> i32 {
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
