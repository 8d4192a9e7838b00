//! `loopflow task --loop X TEXT`: a human sets or replaces a loop's current task.

use std::path::Path;

use clap::Args;

use super::control::{refuse_closed, who};
use super::{config, loop_paths, report};
use crate::config::WorkSource;
use crate::exit;
use crate::lifecycle::{Between, HumanError};
use crate::next::Next;
use crate::out::{self, outln};
use crate::reason::SkipReason;
use crate::tick::RunError;

#[derive(Args, Debug)]
pub(crate) struct TaskArgs {
    /// The loop whose task to set.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// The task, as the loop's agents will read it (`{{current_task}}` in prompts).
    #[arg(value_name = "TEXT")]
    pub text: String,
    /// Who sets it (default: $USER); recorded in the state and the log.
    #[arg(long)]
    pub by: Option<String>,
}

pub(super) fn task(project: &Path, a: TaskArgs) -> i32 {
    let text = a.text.trim();
    if text.is_empty() {
        eprintln!("error: a task is some text saying what the loop should do");
        return exit::USAGE;
    }
    let paths = match loop_paths(project, &a.loop_name) {
        Ok(p) => p,
        Err(c) => return c,
    };
    // Between ticks only: a tick works on the task it read at its start.
    let between = match Between::take(&paths, "task") {
        Ok(b) => b,
        Err(e @ HumanError::TickRunning(..)) => {
            eprintln!("error: {e}");
            return exit::NO;
        }
        Err(HumanError::State(e)) => return report(&RunError::State(e)),
    };
    let state = match paths.load() {
        Ok(s) => s,
        Err(e) => return report(&RunError::State(e)),
    };
    if let Some(code) = refuse_closed(&a.loop_name, &state, "task") {
        return code;
    }
    // A loop whose tasks come from a backlog or an audit would read its next task over
    // this one at its next tick.
    let cfg = config(&paths, project).ok();
    match cfg.as_ref().map(|c| &c.work_source) {
        Some(WorkSource::Backlog { file }) => {
            eprintln!(
                "error: loop {} takes its tasks from its backlog ({}): its topmost open item is the task; add or move an item (`- [ ] …`) there instead",
                a.loop_name,
                file.display()
            );
            return exit::USAGE;
        }
        Some(WorkSource::Audit { .. }) => {
            eprintln!(
                "error: loop {} takes its tasks from its audit command (`[work_source] kind = \"audit\"`): the first line it prints is the task",
                a.loop_name
            );
            return exit::USAGE;
        }
        _ => {}
    }
    if state.current_task.as_deref() == Some(text) {
        outln!(
            "loop {}: the task is already {}; nothing changed",
            a.loop_name,
            out::printable(text)
        );
        return exit::OK;
    }
    let by = who(a.by.as_deref());
    let had_scores = !state.score_history.is_empty() || state.last_verdict.is_some();
    let set = match crate::lifecycle::set_task(&paths, &between, text, &by) {
        Ok(s) => s,
        Err(e) => return report(&RunError::State(e)),
    };
    drop(between);
    match &set.previous {
        Some(old) => outln!(
            "loop {}: task set to {} (was {})",
            a.loop_name,
            out::printable(text),
            out::printable(old)
        ),
        None => outln!("loop {}: task set to {}", a.loop_name, out::printable(text)),
    }
    if had_scores {
        outln!(
            "the score history and the last verdict's reasons were about the old task: the plateau window starts afresh"
        );
    }
    let Some(cfg) = cfg else {
        outln!(
            "next: its loop.toml does not load, so no tick runs until `loopflow check` is clean"
        );
        return exit::OK;
    };
    let Ok(after) = paths.load() else {
        return exit::OK;
    };
    let name = &a.loop_name;
    match crate::next::next(&cfg, &after, &paths) {
        Next::Runs { iteration, max, .. } => {
            outln!("next: the next tick works on it (iteration {iteration} of {max})")
        }
        Next::Skips {
            reason: SkipReason::Halted(h),
            ..
        } => outln!(
            "next: the loop is halted ({}): it works on the new task once you `loopflow approve --loop {name}`",
            out::printable(&h.to_string())
        ),
        Next::Skips {
            reason,
            detail,
            fix,
        } => outln!(
            "next: the next tick still skips (`{reason}`: {}); {fix}",
            out::printable(&detail)
        ),
        Next::Halts { reason, detail, .. } => outln!(
            "next: the next tick halts at once ({reason}: {}): review it, then `loopflow approve --loop {name}` says what it needs",
            out::printable(&detail)
        ),
    }
    exit::OK
}
