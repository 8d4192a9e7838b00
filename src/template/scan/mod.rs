//! The static scanner: every variable path a template uses, with its exact character
//! range, and block balance reported at the tag that is wrong.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use super::bytes::{find_byte, find2};
use super::engine::compiled;

/// Helpers usable in templates: handlebars' built-ins.
pub(crate) const HELPERS: &[&str] = &[
    "eq", "ne", "gt", "gte", "lt", "lte", "and", "or", "not", "len", "if", "unless", "each",
    "with", "lookup", "log", "raw",
];

/// A variable path used by a template: `nodes.tests.exit_code` → ["nodes","tests","exit_code"].
/// Only where it is: the segments are read back from the scanned text ([`Usage::path`]),
/// nothing is copied — a check of every loop's prompts makes thousands of these.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Usage {
    /// The path's bytes in the text it was scanned from.
    pub range: Range<usize>,
    /// It has `/` separators (`../x`-style, only the general scan sees them).
    slash: bool,
}

impl Usage {
    /// A usage of `path`, found at byte `at` of the text; with `slash`, `/` separates
    /// segments as `.` does.
    fn new(path: &str, at: usize, slash: bool) -> Usage {
        Usage {
            range: at..at + path.len(),
            slash: slash && path.contains('/'),
        }
    }

    /// The path's segments in `text`, the text this usage was scanned from.
    pub(crate) fn path<'t>(&self, text: &'t str) -> Path<'t> {
        Path {
            path: text.get(self.range.clone()).unwrap_or(""),
            slash: self.slash,
        }
    }
}

/// A [`Usage`]'s path read from its text: segments split at `.` (and `/`), each without
/// the brackets of a `[literal]` segment; `Display` writes it dotted.
#[derive(Clone, Copy)]
pub(crate) struct Path<'t> {
    path: &'t str,
    slash: bool,
}

impl<'t> Path<'t> {
    fn segments(self) -> impl Iterator<Item = &'t str> {
        // Byte by byte: every separator and bracket is ASCII.
        let (path, slash) = (self.path, self.slash);
        let mut from = Some(0);
        std::iter::from_fn(move || {
            let start = from?;
            let rest = &path.as_bytes()[start..];
            let len = rest
                .iter()
                .position(|&b| b == b'.' || (slash && b == b'/'))
                .unwrap_or(rest.len());
            from = (start + len < path.len()).then_some(start + len + 1);
            let seg = &path.as_bytes()[start..start + len];
            let lead = seg.iter().take_while(|&&b| b == b'[').count();
            let trail = seg[lead..].iter().rev().take_while(|&&b| b == b']').count();
            Some(&path[start + lead..start + len - trail])
        })
    }

    pub(crate) fn len(&self) -> usize {
        let slash = self.slash;
        1 + self
            .path
            .bytes()
            .filter(|&b| b == b'.' || (slash && b == b'/'))
            .count()
    }

    pub(crate) fn get(&self, i: usize) -> Option<&'t str> {
        self.segments().nth(i)
    }

    /// The first segment (`nodes` of `nodes.x.exit_code`).
    pub(crate) fn root(&self) -> &'t str {
        self.get(0).unwrap_or("")
    }
}

impl std::fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, seg) in self.segments().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(seg)?;
        }
        Ok(())
    }
}

/// A problem found while scanning (unbalanced braces, unknown helper, bad syntax).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScanError {
    pub message: String,
    pub range: Range<usize>,
}

/// Every variable path used outside `#each`/`#with` blocks (whose context changes), in order.
///
/// Remembered per text for the process's first [`MEMO_CAP`] distinct texts of at most
/// [`MEMO_TEXT_MAX`] bytes: `status`, `report` and the dashboard check every loop, and
/// loops share texts — the argv of the agent preset they run, prompts made from one
/// template — which were scanned again for each. A text never seen is scanned as before;
/// the caps keep `check` of a pipeline with thousands of distinct templates, and a
/// dashboard that runs for weeks while prompts are edited, from holding them all.
/// The result is shared (`Arc`): a remembered scan is handed out without copying its
/// paths, and the memo's keys are hashed with foldhash (a prompt's few KiB cost less to
/// hash than to scan, which std's SipHash did not give).
pub(crate) fn scan(text: &str) -> Result<Arc<[Usage]>, ScanError> {
    if !text.contains("{{") {
        // Most argv elements (`claude`, `-p`): one shared empty list, not one each.
        static NONE: OnceLock<Arc<[Usage]>> = OnceLock::new();
        return Ok(NONE.get_or_init(|| Arc::from(Vec::new())).clone());
    }
    type Memo =
        Mutex<HashMap<Box<str>, Result<Arc<[Usage]>, ScanError>, foldhash::fast::RandomState>>;
    static MEMO: OnceLock<Memo> = OnceLock::new();
    let memo = MEMO.get_or_init(Default::default);
    if let Some(r) = memo.lock().unwrap_or_else(|e| e.into_inner()).get(text) {
        return r.clone();
    }
    let r = scan_text(text).map(Arc::from);
    let mut m = memo.lock().unwrap_or_else(|e| e.into_inner());
    if m.len() < MEMO_CAP && text.len() <= MEMO_TEXT_MAX {
        m.insert(text.into(), r.clone());
    }
    r
}

/// How many distinct texts [`scan`] remembers (at most 64 MiB of them).
const MEMO_CAP: usize = 1024;
/// The longest text [`scan`] remembers: prompts are a few KiB; a longer one is scanned
/// each time.
const MEMO_TEXT_MAX: usize = 64 << 10;

fn scan_text(text: &str) -> Result<Vec<Usage>, ScanError> {
    // Plain `{{a.b}}` mustaches cannot be a syntax error: leave handlebars' (slow) parser
    // for rendering time, so `check` on a 10,000-node pipeline stays cheap.
    // A block tag (`{{#if`) is never plain: prompts have one, argv elements seldom.
    if !text.contains("{{#") && only_plain_mustaches(text) {
        return Ok(plain_usages(text));
    }
    // The block subset loopflow compiles itself (`{{#if x}}…{{else}}…{{/if}}` and the
    // like, as the shipped prompts are) is valid by construction too: its tokenizer says
    // so and lists the paths, without building a template nobody renders here.
    if let Some(paths) = super::compile::plain_paths(text) {
        return Ok(subset_usages(paths));
    }
    scan_general(text)
}

/// [`plain_paths`](super::compile::plain_paths) as usages: what the general scan makes of
/// the same mustaches (literals and `this` name no variable).
fn subset_usages(paths: Vec<(&str, usize)>) -> Vec<Usage> {
    paths
        .into_iter()
        .filter(|(p, _)| !is_literal(p) && *p != "this" && !p.starts_with("this."))
        .map(|(p, at)| Usage::new(p, at, false))
        .collect()
}

/// Any template: block balance, handlebars' own parse for the syntax, then the paths.
fn scan_general(text: &str) -> Result<Vec<Usage>, ScanError> {
    check_blocks(text)?;
    if let Err(e) = compiled(text) {
        let range = e
            .pos()
            .map(|(line, col)| {
                let start = crate::diag::offset_of(text, line, col);
                start..(start + 2).min(text.len()).max(start)
            })
            .unwrap_or(0..text.len());
        let reason = e.reason().to_string();
        // The parser's message lists every grammar rule it expected; nobody needs that.
        let message = match reason.find(": expected ") {
            Some(i) => format!("{} here", &reason[..i]),
            None => reason,
        };
        return Err(ScanError { message, range });
    }
    let mut usages = Vec::new();
    let mut context_depth = 0usize;
    let mut i = 0;
    while let Some(found) = find2(&text[i..], b'{') {
        let open = i + found;
        if let Some(end) = skip_raw_block(text, open) {
            i = end;
            continue;
        }
        let Some(close_rel) = find2(&text[open..], b'}') else {
            break;
        };
        let close = open + close_rel;
        let mut inner_start = open + 2;
        let mut inner_end = close;
        let bytes = text.as_bytes();
        // `{{{raw}}}`, whitespace control `~`.
        while inner_start < inner_end && matches!(bytes[inner_start], b'{' | b'~') {
            inner_start += 1;
        }
        while inner_end > inner_start && matches!(bytes[inner_end - 1], b'}' | b'~') {
            inner_end -= 1;
        }
        let end = if text[close..].starts_with("}}}") {
            close + 3
        } else {
            close + 2
        };
        i = end;
        if open > 0 && bytes[open - 1] == b'\\' {
            continue; // escaped mustache: literal text
        }
        let inner = &text[inner_start..inner_end];
        let trimmed = inner.trim_start();
        let lead = inner_start + (inner.len() - trimmed.len());
        match trimmed.chars().next() {
            Some('!') | None => continue,
            Some('/') => {
                let name = trimmed[1..].trim();
                if matches!(name, "each" | "with") {
                    context_depth = context_depth.saturating_sub(1);
                }
                continue;
            }
            Some('#') | Some('^') => {
                let body = &trimmed[1..];
                // `{{# each xs}}` is an `each` too: the name after any blanks.
                let helper = body
                    .trim_start()
                    .split(|c: char| c.is_whitespace())
                    .next()
                    .unwrap_or("");
                let scanned = expression_paths(body, lead + 1, true)?;
                if context_depth == 0 {
                    usages.extend(scanned);
                }
                if matches!(helper, "each" | "with") {
                    context_depth += 1;
                }
                continue;
            }
            _ => {}
        }
        if trimmed.trim() == "else" || trimmed.starts_with("else ") {
            continue;
        }
        if context_depth == 0 {
            usages.extend(expression_paths(trimmed, lead, false)?);
        }
    }
    Ok(usages)
}

/// The common case of argv elements, `--cwd={{cwd}}`: the usages of a text whose every
/// mustache is a plain path ([`only_plain_mustaches`]), without the general tokenizer.
fn plain_usages(text: &str) -> Vec<Usage> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(found) = find2(&text[i..], b'{') {
        let open = i + found + 2;
        let Some(close) = find2(&text[open..], b'}').map(|c| open + c) else {
            break;
        };
        let raw = &text[open..close];
        let start = open + (raw.len() - raw.trim_start().len());
        let name = raw.trim();
        out.push(Usage::new(name, start, false));
        i = close + 2;
    }
    out
}

/// Whether every mustache in `text` is a plain variable path (`{{ nodes.x-y.exit_code }}`):
/// such a template is valid handlebars by construction.
fn only_plain_mustaches(text: &str) -> bool {
    let mut i = 0;
    let (mut opens, mut closes) = (0usize, 0usize);
    while let Some(found) = find2(&text[i..], b'{') {
        let open = i + found;
        let Some(close_rel) = find2(&text[open + 2..], b'}') else {
            return false;
        };
        let inner = text[open + 2..open + 2 + close_rel].trim();
        let path_ok = inner.split('.').all(|seg| {
            !seg.is_empty()
                && seg
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        });
        let first_ok = inner
            .bytes()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_');
        if !(path_ok && first_ok)
            || matches!(inner.split('.').next(), Some("else" | "this"))
            || (open > 0 && text.as_bytes()[open - 1] == b'\\')
        {
            return false;
        }
        opens += 1;
        i = open + 2 + close_rel + 2;
    }
    let mut k = 0;
    while let Some(found) = find2(&text[k..], b'}') {
        closes += 1;
        k += found + 2;
    }
    opens == closes
}

/// `{{{{raw}}}} … {{{{/raw}}}}` starting at `open`: everything inside is literal text.
/// Returns the index just past the closing tag (or the end of the text).
fn skip_raw_block(text: &str, open: usize) -> Option<usize> {
    if !text[open..].starts_with("{{{{") {
        return None;
    }
    let name_end = text[open + 4..].find("}}}}")?;
    let name = text[open + 4..open + 4 + name_end].trim();
    let close_tag = format!("{{{{{{{{/{name}}}}}}}}}");
    let body = open + 4 + name_end + 4;
    Some(
        text[body..]
            .find(&close_tag)
            .map_or(text.len(), |k| body + k + close_tag.len()),
    )
}

/// Unbalanced `{{#block}}…{{/block}}` pairs, reported at the tag that is wrong (the
/// handlebars parser only says where it gave up: the end of the text).
fn check_blocks(text: &str) -> Result<(), ScanError> {
    let mut open: Vec<(String, Range<usize>)> = Vec::new();
    let mut i = 0;
    while let Some(found) = find2(&text[i..], b'{') {
        let start = i + found;
        if let Some(end) = skip_raw_block(text, start) {
            i = end;
            continue;
        }
        let Some(close_rel) = find2(&text[start..], b'}') else {
            return Err(ScanError {
                message: "`{{` is never closed with `}}`".into(),
                range: start..start + 2,
            });
        };
        let end = start + close_rel + 2;
        i = end;
        if start > 0 && text.as_bytes()[start - 1] == b'\\' {
            continue;
        }
        let inner =
            text[start + 2..end - 2].trim_matches(|c: char| c == '~' || c == '{' || c == '}');
        let inner = inner.trim();
        let name = |s: &str| {
            s.split(|c: char| c.is_whitespace())
                .next()
                .unwrap_or("")
                .to_string()
        };
        // `{{# if a}}` and `{{/ if}}` are the same tags to handlebars: names after blanks.
        if let Some(rest) = inner.strip_prefix('#') {
            let rest = rest.trim_start_matches(['>', '*']).trim_start();
            open.push((name(rest), start..end));
        } else if let Some(rest) = inner.strip_prefix('/') {
            let closing = name(rest.trim_start());
            match open.pop() {
                Some((opened, _)) if opened == closing => {}
                Some((opened, _)) => {
                    return Err(ScanError {
                        message: format!("`{{{{/{closing}}}}}` closes a `{{{{#{opened}}}}}` block"),
                        range: start..end,
                    });
                }
                None => {
                    return Err(ScanError {
                        message: format!(
                            "`{{{{/{closing}}}}}` has no `{{{{#{closing}}}}}` before it"
                        ),
                        range: start..end,
                    });
                }
            }
        }
    }
    match open.pop() {
        Some((opened, range)) => Err(ScanError {
            message: format!("`{{{{#{opened}}}}}` is never closed: add `{{{{/{opened}}}}}`"),
            range,
        }),
        None => Ok(()),
    }
}

/// Tokens of an expression with their ranges; strings stay one token.
fn tokens(expr: &str, base: usize) -> Vec<(&str, Range<usize>)> {
    // Every delimiter is ASCII, so a byte scan never splits a character.
    let b = expr.as_bytes();
    let mut out = Vec::with_capacity(4);
    let mut k = 0;
    while k < b.len() {
        let c = b[k];
        if c.is_ascii_whitespace() {
            k += 1;
            continue;
        }
        let end = match c {
            b'(' | b')' | b'|' => k + 1,
            b'"' | b'\'' => b[k + 1..]
                .iter()
                .position(|&x| x == c)
                .map_or(b.len(), |p| k + 1 + p + 1),
            _ => {
                let mut j = k;
                let mut bracket = false;
                while j < b.len() {
                    match b[j] {
                        b'[' => bracket = true,
                        b']' => bracket = false,
                        x if !bracket
                            && (x.is_ascii_whitespace() || matches!(x, b'(' | b')' | b'|')) =>
                        {
                            break;
                        }
                        _ => {}
                    }
                    j += 1;
                }
                j
            }
        };
        out.push((&expr[k..end], base + k..base + end));
        k = end;
    }
    out
}

fn is_literal(tok: &str) -> bool {
    let first = tok.as_bytes().first().copied().unwrap_or(b' ');
    first == b'"'
        || first == b'\''
        || matches!(tok, "true" | "false" | "null" | "undefined")
        || ((first.is_ascii_digit() || first == b'-') && tok.parse::<f64>().is_ok())
}

/// The variable paths of one expression. `block` means the first token is a helper.
fn expression_paths(expr: &str, base: usize, block: bool) -> Result<Vec<Usage>, ScanError> {
    let toks = tokens(expr, base);
    let mut out = Vec::new();
    // A token is in helper position when it starts the expression (and has params, or is
    // a block) or follows `(`.
    let mut in_block_params = false;
    let n = toks.len();
    for (idx, (tok, range)) in toks.iter().enumerate() {
        match *tok {
            "(" | ")" => continue,
            "|" => {
                in_block_params = !in_block_params;
                continue;
            }
            "as" if idx + 1 < n && toks[idx + 1].0 == "|" => continue,
            _ => {}
        }
        if in_block_params {
            continue;
        }
        let helper_position = (idx == 0 && (block || n > 1)) || (idx > 0 && toks[idx - 1].0 == "(");
        if helper_position {
            if !HELPERS.contains(tok) {
                return Err(ScanError {
                    message: format!("unknown helper `{tok}`"),
                    range: range.clone(),
                });
            }
            continue;
        }
        // hash argument `key=value`: only the value can be a path.
        let (value, value_start) = match tok.find('=') {
            Some(eq) if !tok.starts_with('"') && !tok.starts_with('\'') => {
                (&tok[eq + 1..], range.start + eq + 1)
            }
            _ => (*tok, range.start),
        };
        if value.is_empty() || is_literal(value) {
            continue;
        }
        if value.starts_with('@')
            || value.starts_with("../")
            || value == "this"
            || value.starts_with("this.")
        {
            continue;
        }
        out.push(Usage::new(value, value_start, true));
    }
    Ok(out)
}

/// Single-brace `{name}` tokens (the predecessor's placeholder syntax), with their ranges.
pub(crate) fn legacy_placeholders(text: &str) -> Vec<(String, Range<usize>)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = find_byte(&text[i..], b'{') {
        i += p;
        if bytes.get(i + 1) == Some(&b'{') {
            // skip a whole mustache
            i = find2(&text[i..], b'}').map_or(bytes.len(), |p| i + p + 2);
            continue;
        }
        let rest = &bytes[i + 1..];
        let name_len = rest
            .iter()
            .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_'))
            .unwrap_or(rest.len());
        if name_len > 0 && rest.get(name_len) == Some(&b'}') && rest[0].is_ascii_alphabetic() {
            // ASCII throughout, so these are character boundaries.
            out.push((
                text[i + 1..i + 1 + name_len].to_string(),
                i..i + name_len + 2,
            ));
            i += name_len + 2;
            continue;
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests;
