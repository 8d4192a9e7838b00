//! Telling the world a halt happened, after the state write that set it: the `HALT`
//! line, the installed schedule switched off (best effort: a halt stands whatever the
//! scheduler says), and the human told through the loop's `[notify]` command (best effort
//! too: a failing notifier only logs `WARN`). The tick's driver and the human's commands
//! call it with what `lifecycle` returned; nothing the executor reaches runs a scheduler
//! or a notifier.

use crate::lifecycle::Announcement;
use crate::state::{Event, LogArg, LoopPaths, StateError};

/// Announces `a`: its line, the schedule off, the notifier. The line's failure is
/// returned after the rest was tried.
pub(crate) fn announce(paths: &LoopPaths, a: &Announcement) -> Result<(), StateError> {
    let text = a.reason.to_string();
    let mut args = vec![LogArg::Word(&text)];
    if let Some(d) = &a.detail {
        args.push(LogArg::Kv("detail", d.clone()));
    }
    if a.recovered {
        args.push(LogArg::Kv("recovered", "true".into()));
    }
    let logged = paths.log(Event::Halt, &args);
    crate::schedule::disable_best_effort(paths);
    crate::notify::at_halt(paths, &a.state, &a.reason, a.detail.as_deref());
    logged
}
