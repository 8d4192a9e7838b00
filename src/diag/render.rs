//! The human (miette snippets), JSON and GitHub-annotation renderings of diagnostics.

use std::fmt;

use serde::Serialize;

use super::{Diagnostic, Diagnostics, Severity, floor_char_boundary};

/// A diagnostic as miette sees it: its label offsets are relative to the window of text
/// it is shown with (`.2` is where that window starts in the file).
struct MietteView<'a>(&'a Diagnostic, NamedText<'a>, usize);

/// The lines a snippet shows, under the file's display name, so the snippet header reads
/// `╭─[path:line:col]` like the first line does. Only these lines are handed to miette,
/// which walks its text from the start for every span: with the whole file, 10,000
/// findings in a big file took a minute.
struct NamedText<'a> {
    name: &'a str,
    text: &'a str,
    /// Lines of the file before the window.
    line_offset: usize,
}

impl miette::SourceCode for NamedText<'_> {
    fn read_span<'b>(
        &'b self,
        span: &miette::SourceSpan,
        before: usize,
        after: usize,
    ) -> Result<Box<dyn miette::SpanContents<'b> + 'b>, miette::MietteError> {
        let c = self.text.read_span(span, before, after)?;
        // miette counts the column in bytes; the first line of a finding counts characters
        // (`Source::line_col`), and so does the snippet's `╭─[path:line:col]` header now.
        let start = floor_char_boundary(self.text, c.span().offset().min(self.text.len()));
        let line_start = self.text[..start].rfind('\n').map_or(0, |i| i + 1);
        let column = self.text[line_start..start].chars().count();
        Ok(Box::new(miette::MietteSpanContents::new_named(
            self.name.to_string(),
            c.data(),
            *c.span(),
            c.line() + self.line_offset,
            column,
            c.line_count(),
        )))
    }
}

impl fmt::Display for MietteView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl fmt::Debug for MietteView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.message)
    }
}

impl std::error::Error for MietteView<'_> {}

impl miette::Diagnostic for MietteView<'_> {
    fn severity(&self) -> Option<miette::Severity> {
        Some(match self.0.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.0
            .help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.1)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = miette::LabeledSpan> + '_>> {
        let d = self.0;
        let len = d.span.end.saturating_sub(d.span.start);
        let label = (!d.label.is_empty()).then(|| d.label.clone());
        let start = d.span.start.saturating_sub(self.2);
        Some(Box::new(std::iter::once(
            miette::LabeledSpan::new_primary_with_span(label, (start, len)),
        )))
    }
}

/// `path:line:col: severity[code]: message`, then the source snippet with the label on
/// the exact span and a `help:` line, then a one-line summary.
pub(super) fn render_human(diags: &Diagnostics, color: bool) -> String {
    use miette::{GraphicalReportHandler, GraphicalTheme};
    let theme = if color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_links(false)
        .with_width(100)
        .with_context_lines(1);
    let mut out = String::new();
    for d in &diags.items {
        let (line, col) = d.start();
        out.push_str(&format!(
            "{}:{}:{}: {}[{}]: {}\n",
            d.source.name, line, col, d.severity, d.code, d.message
        ));
        let mut snippet = String::new();
        if d.source.text.is_empty() || snippet_too_wide(d) {
            // Nothing to quote (an unreadable file), or a line too long to show.
            if !d.source.text.is_empty() {
                out.push_str(&format!(
                    "  {} (the source line is too long to show)\n",
                    d.label
                ));
            }
            if let Some(h) = &d.help {
                out.push_str(&format!("  help: {h}\n"));
            }
        } else if handler
            .render_report(&mut snippet, &{
                let w = window(d);
                let line_offset = d.source.line_col(w.start).0 - 1;
                MietteView(
                    d,
                    NamedText {
                        name: &d.source.name,
                        text: &d.source.text[w.clone()],
                        line_offset,
                    },
                    w.start,
                )
            })
            .is_ok()
        {
            // miette repeats the message as its first line; the header above already says it.
            let body: Vec<&str> = snippet
                .lines()
                .skip_while(|l| !l.trim_start().starts_with('╭'))
                .collect();
            for l in body {
                out.push_str(l.trim_end());
                out.push('\n');
            }
        }
        out.push('\n');
    }
    out.push_str(&summary(diags));
    out.push('\n');
    out
}

/// The longest source line shown in a snippet. miette panics on a label past column
/// 65 535 (a one-line generated file, say), and such a snippet would help nobody anyway.
const SNIPPET_MAX_LINE: usize = 1000;

/// The lines a snippet shows: the span's, plus one line of context on each side (the
/// last one with its newline).
fn window(d: &Diagnostic) -> std::ops::Range<usize> {
    let text = d.source.text.as_str();
    let start = floor_char_boundary(text, d.span.start.min(text.len()));
    let end = floor_char_boundary(text, d.span.end.min(text.len())).max(start);
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let from = text[..line_start.saturating_sub(1)]
        .rfind('\n')
        .map_or(0, |i| i + 1);
    let line_end = text[end..].find('\n').map_or(text.len(), |i| end + i);
    let after = (line_end + 1).min(text.len());
    let to = text[after..]
        .find('\n')
        .map_or(text.len(), |i| after + i + 1);
    from..to
}

/// Whether the lines a snippet would show include one longer than [`SNIPPET_MAX_LINE`].
fn snippet_too_wide(d: &Diagnostic) -> bool {
    d.source.text[window(d)]
        .split('\n')
        .any(|l| l.len() > SNIPPET_MAX_LINE)
}

fn summary(diags: &Diagnostics) -> String {
    let (e, w) = (diags.error_count(), diags.warning_count());
    let plural = |n: usize, s: &str| {
        if n == 1 {
            format!("{n} {s}")
        } else {
            format!("{n} {s}s")
        }
    };
    match (e, w) {
        (0, 0) => "no problems found".to_string(),
        _ => format!("{}, {}", plural(e, "error"), plural(w, "warning")),
    }
}

#[derive(Serialize)]
struct JsonDiag<'a> {
    file: &'a str,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    severity: Severity,
    code: &'static str,
    message: &'a str,
    label: &'a str,
    help: Option<&'a str>,
}

fn json_items(diags: &Diagnostics) -> Vec<JsonDiag<'_>> {
    diags
        .items
        .iter()
        .map(|d| {
            let (line, column) = d.start();
            let (end_line, end_column) = d.end();
            JsonDiag {
                file: &d.source.name,
                line,
                column,
                end_line,
                end_column,
                severity: d.severity,
                code: d.code.as_str(),
                message: &d.message,
                label: &d.label,
                help: d.help.as_deref(),
            }
        })
        .collect()
}

/// `{"diagnostics": [...]}` as DESIGN §3 documents it.
pub(super) fn render_json(diags: &Diagnostics) -> String {
    let doc = serde_json::json!({ "diagnostics": json_items(diags) });
    let mut s = serde_json::to_string_pretty(&doc).unwrap_or_default();
    s.push('\n');
    s
}

fn gh_escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn gh_escape_prop(s: &str) -> String {
    gh_escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// GitHub Actions workflow commands; each finding annotates the pull request.
pub(super) fn render_github(diags: &Diagnostics) -> String {
    let mut out = String::new();
    for d in &diags.items {
        let (line, col) = d.start();
        let (end_line, end_col) = d.end();
        let cmd = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let mut msg = d.message.clone();
        if let Some(h) = &d.help {
            msg.push_str("\nhelp: ");
            msg.push_str(h);
        }
        out.push_str(&format!(
            "::{cmd} file={},line={line},col={col},endLine={end_line},endColumn={end_col},title={}::{}\n",
            gh_escape_prop(&d.source.name),
            gh_escape_prop(&format!("loopflow {}", d.code)),
            gh_escape_data(&msg)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_escapes_properties_and_data() {
        assert_eq!(gh_escape_prop("a:b,c%"), "a%3Ab%2Cc%25");
        assert_eq!(gh_escape_data("a\nb:c"), "a%0Ab:c");
    }
}
