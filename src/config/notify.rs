//! `[notify]` (DESIGN §13): a command run at every halt with the event as JSON on stdin.
//! Read from `loop.toml` or `.loopflow/config.toml`; its argv templates may use only
//! [`VARS`], and `check` says so at the exact span.

use std::time::Duration;

use crate::diag::{Code, Diagnostic, Diagnostics, list, suggest};
use crate::template::Tmpl;
use crate::toml_read::Table;

/// How long a notifier may run before it is stopped.
pub(crate) const DEFAULT_NOTIFY_TIMEOUT: Duration = Duration::from_secs(30);

/// The variables a notifier's argv templates may use (the contract `crate::notify`
/// renders with): the halt, the loop and the command a human runs next.
pub(crate) const VARS: &[&str] = &[
    "event",
    "loop",
    "project",
    "reason",
    "death",
    "detail",
    "iteration",
    "at",
    "task",
    "score",
    "spent_usd",
    "spent_tokens",
    "spent_seconds",
    "review",
    "summary",
];

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
    for tmpl in command.iter().flatten() {
        check_template(tmpl, diags);
    }
    Some(Notify {
        command: command?,
        timeout,
    })
}

/// A notifier's argv is rendered at a halt, outside any tick's DAG: only [`VARS`] exist.
fn check_template(t: &Tmpl, diags: &mut Diagnostics) {
    match crate::template::scan(&t.text) {
        Err(e) => diags.push(
            Diagnostic::error(
                Code::TemplateSyntax,
                &t.source,
                t.span_of(e.range),
                format!("`notify.command` is not a valid template: {}", e.message),
            )
            .label("here")
            .help("templates use handlebars: \"loopflow: {{loop}} halted ({{reason}})\""),
        ),
        Ok(usages) => {
            for u in usages.iter() {
                let path = u.path(&t.text);
                if path.len() == 1 && VARS.contains(&path.root()) {
                    continue;
                }
                let name = path.to_string();
                let help = match suggest(path.root(), VARS.iter().copied()) {
                    Some(s) if path.len() == 1 => {
                        format!("did you mean `{s}`? A notifier may use {}", list(VARS))
                    }
                    _ => format!(
                        "a notifier runs at a halt, outside the tick; it may use {}",
                        list(VARS)
                    ),
                };
                diags.push(
                    Diagnostic::error(
                        Code::UnknownVariable,
                        &t.source,
                        t.span_of(u.range.clone()),
                        format!("`notify.command` uses `{name}`, which a notifier is not given"),
                    )
                    .label("not a notify variable")
                    .help(help),
                );
            }
        }
    }
}
