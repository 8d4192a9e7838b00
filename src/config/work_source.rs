//! `[work_source]`: where a loop's task comes from — the state (`single`), the topmost
//! open item of a markdown checklist (`backlog`), or a command's output lines (`audit`).

use std::path::{Path, PathBuf};

use crate::diag::{Code, Diagnostic, Diagnostics, list};
use crate::template::{Tmpl, vars};
use crate::toml_read::Table;

#[derive(Debug, Clone)]
pub enum WorkSource {
    Single,
    /// A checklist; a path with `{{…}}` (`{{cwd}}/BACKLOG.md`) is rendered per tick.
    Backlog {
        file: PathBuf,
    },
    Audit {
        command: Vec<Tmpl>,
    },
}

/// Reads `[work_source]`; relative paths resolve against `dir` (the loop.toml's).
pub(super) fn read(t: Option<Table<'_, '_>>, dir: &Path, diags: &mut Diagnostics) -> WorkSource {
    let Some(t) = t else {
        return WorkSource::Single;
    };
    t.deny_unknown(&["kind", "file", "command"], diags);
    let Some(k) = t.str("kind", diags) else {
        return WorkSource::Single;
    };
    match k.value.as_str() {
        "single" => WorkSource::Single,
        "backlog" => {
            let file_str = t.str("file", diags);
            if let Some(f) = &file_str {
                check_template(
                    &Tmpl::literal(t.source, &f.value, f.span.clone()),
                    "work_source.file",
                    diags,
                );
            }
            let file = file_str.map_or("BACKLOG.md".to_string(), |s| s.value);
            WorkSource::Backlog {
                file: if file.contains("{{") {
                    PathBuf::from(file)
                } else {
                    super::resolve(dir, &file)
                },
            }
        }
        "audit" => match t.argv("command", diags) {
            Some(command) => {
                for c in &command {
                    check_template(c, "work_source.command", diags);
                }
                WorkSource::Audit { command }
            }
            None => {
                if t.get("command").is_none() {
                    t.missing("command", "command = [\"./audit.sh\"]", diags);
                }
                WorkSource::Single
            }
        },
        other => {
            diags.push(
                Diagnostic::error(Code::InvalidValue, t.source, k.span, format!("unknown work source `{other}`"))
                    .label("not a work source")
                    .help("use \"single\" (the state's current task), \"backlog\" (a markdown checklist) or \"audit\" (a command's output lines)"),
            );
            WorkSource::Single
        }
    }
}

/// Work-source templates are rendered by the gate, before any node runs: only
/// [`vars::SOURCE`] exist there.
fn check_template(t: &Tmpl, key: &str, diags: &mut Diagnostics) {
    match crate::template::scan(&t.text) {
        Err(e) => diags.push(
            Diagnostic::error(
                Code::TemplateSyntax,
                &t.source,
                t.span_of(e.range),
                format!("`{key}` is not a valid template: {}", e.message),
            )
            .label("here")
            .help("templates use handlebars: `{{cwd}}/BACKLOG.md`"),
        ),
        Ok(usages) => {
            for u in usages.iter() {
                let path = u.path(&t.text);
                if path.len() == 1 && vars::SOURCE.contains(&path.root()) {
                    continue;
                }
                diags.push(
                    Diagnostic::error(
                        Code::UnknownVariable,
                        &t.source,
                        t.span_of(u.range.clone()),
                        format!(
                            "`{key}` uses `{}`, which does not exist when the work source is read",
                            path
                        ),
                    )
                    .label("not available here")
                    .help(format!(
                        "the work source is read by the gate, before any node runs; use {}",
                        list(vars::SOURCE)
                    )),
                );
            }
        }
    }
}
