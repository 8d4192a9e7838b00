//! `[notify]` (DESIGN §13): a command run at every halt with the event as JSON on stdin.

use std::time::Duration;

use crate::diag::Diagnostics;
use crate::template::Tmpl;
use crate::toml_read::Table;

/// How long a notifier may run before it is stopped.
pub const DEFAULT_NOTIFY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Notify {
    /// Argv templates (no shell), rendered like the harness's.
    pub command: Vec<Tmpl>,
    pub timeout: Duration,
}

pub(super) fn read(t: Option<Table<'_, '_>>, diags: &mut Diagnostics) -> Option<Notify> {
    let t = t?;
    t.deny_unknown(&["command", "timeout"], diags);
    let command = t.argv("command", diags);
    if command.is_none() && t.get("command").is_none() {
        t.missing(
            "command",
            "command = [\"notify-send\", \"loopflow\"]",
            diags,
        );
    }
    let timeout = t
        .duration("timeout", diags)
        .unwrap_or(DEFAULT_NOTIFY_TIMEOUT);
    Some(Notify {
        command: command?,
        timeout,
    })
}
