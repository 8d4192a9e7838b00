//! `loopflow close --loop X [--note N]`: a human accepts a loop's work and ends it.

use std::path::Path;

use clap::Args;

use super::control::who;
use super::{loop_paths, report};
use crate::exit;
use crate::lifecycle::{Between, HumanError};
use crate::out::{self, outln};
use crate::state::{Event, LogArg};
use crate::tick::RunError;

#[derive(Args, Debug)]
pub(crate) struct CloseArgs {
    /// The loop whose work to accept and end.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// A note recorded with the close (why the work is accepted).
    #[arg(long)]
    pub note: Option<String>,
    /// Who closes it (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

pub(super) fn close(project: &Path, a: CloseArgs) -> i32 {
    let paths = match loop_paths(project, &a.loop_name) {
        Ok(p) => p,
        Err(c) => return c,
    };
    // A running tick is still changing what would be accepted.
    let between = match Between::take(&paths, "close") {
        Ok(b) => b,
        Err(e @ HumanError::TickRunning(..)) => {
            eprintln!("error: {e}");
            eprintln!(
                "  (`loopflow halt --loop {} --reason …` stops the ticks after it now)",
                a.loop_name
            );
            return exit::NO;
        }
        Err(HumanError::State(e)) => return report(&RunError::State(e)),
    };
    let by = who(a.by.as_deref());
    let closed = match crate::lifecycle::close(&paths, &between, &by, a.note.as_deref()) {
        Ok(c) => c,
        Err(e) => return report(&RunError::State(e)),
    };
    drop(between);
    let name = &a.loop_name;
    let Some(c) = closed else {
        outln!("loop {name} is already closed; nothing changed");
        return exit::OK;
    };
    // A closed loop has nothing left to tick: its schedule goes.
    let schedule = crate::schedule::read_record(&paths).map(|_| {
        let done = crate::schedule::uninstall(&paths);
        let mut args = vec![LogArg::Kv("uninstalled", done.is_ok().to_string())];
        if let Err(e) = &done {
            args.push(LogArg::Kv("reason", e.to_string()));
        }
        let _ = paths.log(Event::Schedule, &args);
        done
    });
    outln!(
        "closed loop {name}: its work is accepted and it ticks no more{}",
        c.was
            .as_ref()
            .map(|w| format!(" (it was halted {})", out::printable(&w.to_string())))
            .unwrap_or_default()
    );
    match &schedule {
        None => outln!("no schedule was installed"),
        Some(Ok(said)) => {
            for l in said {
                outln!("schedule: {}", out::printable(l));
            }
        }
        Some(Err(e)) => eprintln!(
            "warning: its schedule could not be uninstalled ({e}); `loopflow schedule uninstall --loop {name}` tries again (its ticks skip `halted:closed` meanwhile)"
        ),
    }
    let branch = format!("refs/heads/{}", crate::review::branch(name));
    if crate::git::rev(project, &branch).is_ok_and(|b| b.is_some()) {
        outln!(
            "its branch and state stay: `loopflow review --loop {name}` shows the work, `loopflow land --loop {name}` merges it, `loopflow delete --loop {name} --yes` removes the loop (`--branch` its branch too)"
        );
    } else {
        outln!("its state stays: `loopflow delete --loop {name} --yes` removes the loop");
    }
    exit::OK
}
