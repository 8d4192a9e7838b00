//! One diagnostic per TOML syntax error, not a cascade. The parser recovers from an error
//! by reading on, so one unclosed array (`allow = ["**",`) makes it take the following
//! lines for the array's elements and report each of them. Here, as a compiler does, the
//! first error is kept, the statement it broke is blanked out (spaces, so every offset
//! stays where it was), and the text is parsed again: what still fails is a problem of its
//! own. An error on a line that only looks like a fresh statement because a statement
//! before it never ended (`needs = ["x",` and then `[nodes.commit]`) is reported as what
//! it is: that statement's unclosed bracket or string.

use std::ops::Range;

use toml::de::{DeTable, Error};

/// The most errors reported per file; past that, the rest is left to the next run.
const MAX_ERRORS: usize = 32;

/// A syntax error to report: where and what.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Found {
    pub span: Range<usize>,
    pub message: String,
}

/// What a line starts, as far as a line can tell.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stmt {
    /// `[table]` or `[[array]]` (closed or not).
    Header,
    /// `key = …`, `a.b = …`, `"quoted" = …`.
    Key,
}

/// The syntax errors of `text` worth reporting, given the parser's own `errors` (not
/// empty), and the text with every statement they broke blanked out, which parses (or,
/// past [`MAX_ERRORS`], parses better).
pub(super) fn resync(text: &str, errors: Vec<Error>) -> (Vec<Found>, String) {
    let mut masked = text.to_string();
    let mut found = Vec::new();
    let mut errors = errors;
    // Errors before `from` lie in what was blanked out, or follow from it.
    let mut from = 0;
    while found.len() < MAX_ERRORS {
        let Some(first) = errors
            .iter()
            .filter(|e| start(e) >= from)
            .min_by_key(|e| start(e))
        else {
            break;
        };
        let at = start(first);
        let line = line_start(&masked, at);
        let kind = statement(line_text(&masked, line));
        // A statement before this line that never ended (an unclosed bracket or string)?
        let prefix_errors = DeTable::parse_recoverable(&masked[..line]).1;
        let (report, blank) = if prefix_errors.is_empty() {
            // The error is the statement's on this line (or a stray line's).
            let end = match kind {
                Some(Stmt::Header) => next_statement(&masked, line, true),
                _ => next_statement(&masked, line, false),
            };
            (found_at(first, &masked), line..end)
        } else {
            let began = statement_before(&masked, line).unwrap_or(line);
            match kind {
                // This line starts afresh; the one before it is what broke.
                Some(_) => {
                    let e = prefix_errors
                        .iter()
                        .filter(|e| start(e) >= from)
                        .min_by_key(|e| start(e))
                        .unwrap_or(first);
                    (found_at(e, &masked[..line]), began..line)
                }
                // The line continues the unended statement and fails on its own.
                None => (
                    found_at(first, &masked),
                    began..next_statement(&masked, line, false),
                ),
            }
        };
        found.push(report);
        blank_out(&mut masked, blank.clone());
        from = blank.end.max(at + 1);
        errors = DeTable::parse_recoverable(&masked).1;
    }
    (found, masked)
}

fn start(e: &Error) -> usize {
    e.span().map_or(0, |s| s.start)
}

/// A parser error as reported; one at the very end of `text` (an unclosed bracket at the
/// end of the file or of the statement) points just after the last character written.
fn found_at(e: &Error, text: &str) -> Found {
    let mut span = e.span().unwrap_or(0..0);
    let written = text.trim_end().len();
    if span.start >= written {
        span = written..written;
    }
    Found {
        span,
        message: e.message().trim().to_string(),
    }
}

/// The start of the line holding byte `at`.
fn line_start(text: &str, at: usize) -> usize {
    let at = at.min(text.len());
    text.as_bytes()[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1)
}

/// The line starting at `start`, without its newline.
fn line_text(text: &str, start: usize) -> &str {
    let rest = &text[start.min(text.len())..];
    rest.split('\n').next().unwrap_or("")
}

/// The start of the nearest line before `line` that starts a statement.
fn statement_before(text: &str, line: usize) -> Option<usize> {
    let mut l = line;
    while l > 0 {
        l = line_start(text, l - 1);
        if statement(line_text(text, l)).is_some() {
            return Some(l);
        }
    }
    None
}

/// The start of the first line after the one at `line` that starts a statement (only a
/// header, with `headers_only`: the keys under a broken header belong to no table), else
/// the end of the text.
fn next_statement(text: &str, line: usize, headers_only: bool) -> usize {
    let mut l = line;
    loop {
        match text[l..].find('\n') {
            None => return text.len(),
            Some(i) => l += i + 1,
        }
        match statement(line_text(text, l)) {
            Some(Stmt::Header) => return l,
            Some(Stmt::Key) if !headers_only => return l,
            _ => {}
        }
    }
}

/// Spaces for every byte of `range` but newlines: offsets and line numbers stay.
fn blank_out(text: &mut String, range: Range<usize>) {
    let blanked: String = text[range.clone()]
        .bytes()
        .map(|b| if b == b'\n' { '\n' } else { ' ' })
        .collect();
    text.replace_range(range, &blanked);
}

/// What `line` starts, judged by its first characters.
fn statement(line: &str) -> Option<Stmt> {
    let t = line.trim_start();
    if let Some(rest) = t.strip_prefix('[') {
        // A key right after the bracket(s), and no comma before a comment: an array on a
        // line of its own (`["a", "b"],`) has one.
        let rest = rest.strip_prefix('[').unwrap_or(rest).trim_start();
        let keyish = rest
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '"' | '\''));
        let code = t.split('#').next().unwrap_or(t);
        return (keyish && !code.contains(',')).then_some(Stmt::Header);
    }
    let mut rest = t;
    loop {
        rest = key(rest)?.trim_start();
        match rest.strip_prefix('.') {
            Some(r) => rest = r.trim_start(),
            None => return rest.starts_with('=').then_some(Stmt::Key),
        }
    }
}

/// `s` after one bare or quoted key at its start.
fn key(s: &str) -> Option<&str> {
    if let Some(q @ ('"' | '\'')) = s.chars().next() {
        let body = &s[1..];
        let end = body.find(q)?;
        return Some(&body[end + 1..]);
    }
    let n = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(s.len());
    (n > 0).then(|| &s[n..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The errors reported for `text`, as (1-based line, 1-based byte column, message).
    fn found(text: &str) -> Vec<(usize, usize, String)> {
        let errors = DeTable::parse_recoverable(text).1;
        if errors.is_empty() {
            return Vec::new();
        }
        let (found, masked) = resync(text, errors);
        assert_eq!(masked.len(), text.len());
        assert_eq!(
            masked.matches('\n').count(),
            text.matches('\n').count(),
            "lines stay"
        );
        found
            .into_iter()
            .map(|f| {
                let line = text[..f.span.start].matches('\n').count() + 1;
                let col = f.span.start - line_start(text, f.span.start) + 1;
                (line, col, f.message)
            })
            .collect()
    }

    fn messages(text: &str) -> Vec<(usize, usize)> {
        found(text).into_iter().map(|(l, c, _)| (l, c)).collect()
    }

    #[test]
    fn an_unclosed_array_is_one_error_at_its_end_not_one_per_following_line() {
        let text = "name = \"t\"\n\n[nodes.gate]\nkind = \"gate\"\nneeds = [\"x\",\n[nodes.commit]\nkind = \"commit\"\nneeds = [\"gate\"]\n";
        let f = found(text);
        assert_eq!(f.len(), 1, "{f:?}");
        // Just after the comma that leaves it open.
        assert_eq!((f[0].0, f[0].1), (5, 14), "{f:?}");
        assert!(f[0].2.contains("unclosed array"), "{f:?}");
        // In a loop.toml: `allow` left open swallowing `deny` and `[worktree]`.
        let text = "[blast_radius]\nallow = [\"**\",\ndeny = [\".git/**\"]\n\n[worktree]\nenabled = true\n";
        let f = found(text);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!((f[0].0, f[0].1), (2, 15), "{f:?}");
    }

    #[test]
    fn one_broken_statement_is_one_error() {
        // Two complaints about one line.
        assert_eq!(
            messages("[brakes]\nmax_iterations = = 10\nx = 1\n"),
            [(2, 18)]
        );
        // An unclosed string.
        assert_eq!(messages("[a]\nkind = \"gate\nneeds = []\n"), [(2, 13)]);
        // An unclosed header: its keys belong to no table, and are not reported again.
        assert_eq!(
            messages(
                "[roles.implement]\nprompt = \"a\"\n[roles.verify\nprompt = \"b\"\nmodel = \"m\"\n[worktree]\nenabled = true\n"
            ),
            [(3, 14)]
        );
        // A missing comma inside a multi-line array is the array's one error.
        assert_eq!(
            messages("needs = [\n  \"a\"\n  \"b\",\n]\nkind = \"x\"\n").len(),
            1
        );
        // An array never closed at the end of the file.
        let f = found("[x]\nneeds = [\n  \"a\",\n");
        assert_eq!((f.len(), f[0].0, f[0].1), (1, 3, 7), "{f:?}");
    }

    #[test]
    fn separate_errors_are_each_reported_once() {
        let text = "a = \"x\nb = 1\n[t]\nc = = 2\nd = 3\n[t]\n";
        let f = messages(text);
        // The unclosed string, the doubled `=`, and the table defined twice.
        assert_eq!(f.len(), 3, "{:?}", found(text));
        assert_eq!(f[0], (1, 7));
        assert_eq!(f[1].0, 4);
        assert_eq!(f[2].0, 6);
    }

    #[test]
    fn what_starts_a_statement() {
        assert_eq!(statement("[nodes.gate]"), Some(Stmt::Header));
        assert_eq!(statement("  [[arr]]  # x, y"), Some(Stmt::Header));
        assert_eq!(statement("[nodes.implement"), Some(Stmt::Header));
        assert_eq!(statement("[\"quoted key\"]"), Some(Stmt::Header));
        assert_eq!(statement("[\"a\", \"b\"],"), None);
        assert_eq!(statement("[1, 2]"), None);
        assert_eq!(statement("kind = \"x\""), Some(Stmt::Key));
        assert_eq!(statement("a.b . c= 1"), Some(Stmt::Key));
        assert_eq!(statement("\"a b\".'c' = 1"), Some(Stmt::Key));
        assert_eq!(statement("  \"a\","), None);
        assert_eq!(statement("]"), None);
        assert_eq!(statement(""), None);
        assert_eq!(statement("# comment = 1"), None);
    }

    #[test]
    fn many_errors_stop_at_the_cap_and_never_loop() {
        let text = "x = = 1\n".repeat(100);
        assert_eq!(found(&text).len(), MAX_ERRORS);
        // Garbage of every kind ends.
        for junk in [
            "[[[",
            "\"\"\"",
            "a = [[[[",
            "= = =",
            "[a\n[b\n[c",
            "a = {",
            "\u{feff}x",
        ] {
            let _ = found(junk);
        }
    }
}
