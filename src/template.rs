//! Handlebars templates: the rendering engine (strict, no HTML escaping) and a static
//! scanner that finds every variable a template uses, with its exact character range, so
//! `check` can say which variables are unknown or not yet produced at a node.

use std::ops::Range;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use handlebars::{Context, Handlebars, RenderContext, Renderable, StringOutput, Template};
use serde_json::Value;

use crate::diag::SourceRef;
use crate::toml_read::inner_span;

/// Where a template's text lives, so a range inside the text maps back to the file.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A TOML string literal at this span.
    Literal(Range<usize>),
    /// A whole file (a prompt): offsets map one to one.
    File,
}

/// A template together with where it came from.
#[derive(Debug, Clone)]
pub struct Tmpl {
    pub text: String,
    pub source: SourceRef,
    pub origin: Origin,
}

impl Tmpl {
    pub fn literal(source: &SourceRef, text: &str, span: Range<usize>) -> Self {
        Tmpl {
            text: text.to_string(),
            source: source.clone(),
            origin: Origin::Literal(span),
        }
    }

    pub fn file(source: &SourceRef) -> Self {
        Tmpl {
            text: source.text.clone(),
            source: source.clone(),
            origin: Origin::File,
        }
    }

    /// The file span of characters `range` of the template text.
    pub fn span_of(&self, range: Range<usize>) -> Range<usize> {
        match &self.origin {
            Origin::File => range,
            Origin::Literal(lit) => inner_span(&self.source, lit, &self.text, range),
        }
    }

    /// The span of the whole template (the literal, or the first line of a file).
    pub fn whole_span(&self) -> Range<usize> {
        match &self.origin {
            Origin::Literal(lit) => lit.clone(),
            Origin::File => 0..self.text.find('\n').unwrap_or(self.text.len()),
        }
    }
}

/// Helpers usable in templates: handlebars' built-ins.
pub const HELPERS: &[&str] = &[
    "eq", "ne", "gt", "gte", "lt", "lte", "and", "or", "not", "len", "if", "unless", "each",
    "with", "lookup", "log", "raw",
];

/// A variable path used by a template: `nodes.tests.exit_code` → ["nodes","tests","exit_code"].
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub path: Vec<String>,
    pub range: Range<usize>,
}

/// A problem found while scanning (unbalanced braces, unknown helper, bad syntax).
#[derive(Debug, Clone, PartialEq)]
pub struct ScanError {
    pub message: String,
    pub range: Range<usize>,
}

/// Every variable path used outside `#each`/`#with` blocks (whose context changes), in order.
pub fn scan(text: &str) -> Result<Vec<Usage>, ScanError> {
    if !text.contains("{{") {
        return Ok(Vec::new());
    }
    if let Some(usages) = plain_usages(text) {
        return Ok(usages);
    }
    check_blocks(text)?;
    // Plain `{{a.b}}` mustaches cannot be a syntax error: leave handlebars' (slow) parser
    // for rendering time, so `check` on a 10,000-node pipeline stays cheap.
    if let Err(e) = if only_plain_mustaches(text) {
        Ok(())
    } else {
        compiled(text).map(|_| ())
    } {
        let range = e
            .pos()
            .map(|(line, col)| {
                let start = offset_of(text, line, col);
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
                let helper = body.split(|c: char| c.is_whitespace()).next().unwrap_or("");
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

/// The common case of argv elements, `--cwd={{cwd}}`: when every mustache is a plain
/// path, its usages without the general tokenizer.
fn plain_usages(text: &str) -> Option<Vec<Usage>> {
    if !only_plain_mustaches(text) {
        return None;
    }
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(found) = find2(&text[i..], b'{') {
        let open = i + found + 2;
        let close = open + find2(&text[open..], b'}')?;
        let raw = &text[open..close];
        let start = open + (raw.len() - raw.trim_start().len());
        let name = raw.trim();
        out.push(Usage {
            path: name.split('.').map(str::to_string).collect(),
            range: start..start + name.len(),
        });
        i = close + 2;
    }
    Some(out)
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

/// Position of the first doubled byte (`{{` or `}}`). A plain byte scan: `str::find`
/// with a two-byte pattern builds a searcher per call, which dominated `check`.
fn find2(s: &str, b: u8) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut from = 0;
    while let Some(p) = bytes[from..].iter().position(|&x| x == b) {
        let at = from + p;
        if bytes.get(at + 1) == Some(&b) {
            return Some(at);
        }
        from = at + 1;
    }
    None
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
        if let Some(rest) = inner.strip_prefix('#') {
            let rest = rest.trim_start_matches(['>', '*']);
            open.push((name(rest), start..end));
        } else if let Some(rest) = inner.strip_prefix('/') {
            let closing = name(rest);
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

fn offset_of(text: &str, line: usize, col: usize) -> usize {
    let mut offset = 0;
    for (n, l) in text.split_inclusive('\n').enumerate() {
        if n + 1 == line {
            return (offset + col.saturating_sub(1)).min(text.len());
        }
        offset += l.len();
    }
    text.len()
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
        let path: Vec<String> = value
            .split(['.', '/'])
            .map(|s| s.trim_start_matches('[').trim_end_matches(']').to_string())
            .collect();
        out.push(Usage {
            path,
            range: value_start..value_start + value.len(),
        });
    }
    Ok(out)
}

/// Single-brace `{name}` tokens (the predecessor's placeholder syntax), with their ranges.
pub fn legacy_placeholders(text: &str) -> Vec<(String, Range<usize>)> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'{' {
            if bytes.get(i + 1) == Some(&b'{') {
                // skip a whole mustache
                i = find2(&text[i..], b'}').map_or(bytes.len(), |p| i + p + 2);
                continue;
            }
            let rest = &text[i + 1..];
            let name_len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if name_len > 0
                && rest[name_len..].starts_with('}')
                && rest.as_bytes()[0].is_ascii_alphabetic()
            {
                out.push((rest[..name_len].to_string(), i..i + name_len + 2));
                i += name_len + 2;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The engine: strict mode (a missing variable is an error), no HTML escaping (an argv
/// element must reach the agent byte for byte).
pub fn engine() -> Handlebars<'static> {
    let mut hb = Handlebars::new();
    hb.set_strict_mode(true);
    hb.register_escape_fn(handlebars::no_escape);
    hb
}

/// Compiles a template once per process: `check` and rendering share the result, so a
/// tick parses each prompt and argv element once (handlebars' parser dominated a tick's
/// CPU time before this cache).
fn compiled(text: &str) -> Result<Arc<Template>, handlebars::TemplateError> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Template>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(t) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(text) {
        return Ok(Arc::clone(t));
    }
    let t = Arc::new(compile_fast(text).map_or_else(|| Template::compile(text), Ok)?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(text.to_string(), Arc::clone(&t));
    Ok(t)
}

/// Placeholder brackets: private-use code points, never in a template we fast-path.
const PH_OPEN: char = '\u{E000}';
const PH_CLOSE: char = '\u{E001}';

/// Compiles a long, mostly plain-text template (a prompt) without feeding its plain lines
/// through handlebars' parser, which costs about a thousand instructions per character
/// and was half of a tick's CPU time. Every line outside a mustache that has no brace is
/// reduced to a placeholder for its non-blank middle (its leading and trailing blanks
/// and its newline stay, so standalone-tag and `~` trimming see exactly what they would
/// have seen); the skeleton is compiled, and the placeholders in its raw strings are put
/// back. `None` (use the plain compile) when the template has nothing to gain, uses raw
/// blocks, or does not compile, so errors always come from the real text.
fn compile_fast(text: &str) -> Option<Template> {
    if text.len() < 256
        || text.contains("{{{{")
        || text.contains("{{!--")
        || text.contains("\\{{")
        || text.contains(PH_OPEN)
        || text.contains(PH_CLOSE)
    {
        return None;
    }
    let mut skeleton = String::with_capacity(text.len() / 2);
    let mut pieces: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < text.len() {
        // A raw run up to the next mustache (or the end), then the mustache verbatim.
        let open = find2(&text[i..], b'{').map_or(text.len(), |p| i + p);
        for line in text[i..open].split_inclusive('\n') {
            let body = line.trim_end_matches(['\n', '\r']);
            let start = body.len() - body.trim_start().len();
            let end = body.trim_end().len();
            if start < end && !body[start..end].contains(['{', '}']) {
                skeleton.push_str(&line[..start]);
                skeleton.push(PH_OPEN);
                skeleton.push_str(&pieces.len().to_string());
                skeleton.push(PH_CLOSE);
                skeleton.push_str(&line[end..]);
                pieces.push(&body[start..end]);
            } else {
                skeleton.push_str(line);
            }
        }
        if open >= text.len() {
            break;
        }
        let closer: &[u8] = if text[open..].starts_with("{{{") {
            b"}}}"
        } else {
            b"}}"
        };
        let close = text.as_bytes()[open + 2..]
            .windows(closer.len())
            .position(|w| w == closer)
            .map(|p| open + 2 + p + closer.len())?;
        skeleton.push_str(&text[open..close]);
        i = close;
    }
    if pieces.len() < 2 {
        return None;
    }
    let mut t = Template::compile(&skeleton).ok()?;
    restore(&mut t, &pieces).then_some(t)
}

/// Puts the placeholders' text back into every raw string, nested blocks included.
/// `false` if a placeholder turned up anywhere else (then the fast path is not used).
fn restore(t: &mut Template, pieces: &[&str]) -> bool {
    use handlebars::template::TemplateElement as E;
    t.elements.iter_mut().all(|e| match e {
        E::RawString(s) => {
            if s.contains(PH_OPEN) {
                *s = unplace(s, pieces);
            }
            true
        }
        E::HelperBlock(h) | E::Expression(h) | E::HtmlExpression(h) => {
            h.template.as_mut().is_none_or(|t| restore(t, pieces))
                && h.inverse.as_mut().is_none_or(|t| restore(t, pieces))
        }
        E::DecoratorBlock(d)
        | E::PartialBlock(d)
        | E::DecoratorExpression(d)
        | E::PartialExpression(d) => d.template.as_mut().is_none_or(|t| restore(t, pieces)),
        E::Comment(c) => !c.contains(PH_OPEN),
        // Elements a newer handlebars may add: give up the fast path.
        #[allow(unreachable_patterns)]
        _ => false,
    })
}

fn unplace(s: &str, pieces: &[&str]) -> String {
    let mut out = String::with_capacity(s.len() * 8);
    let mut rest = s;
    while let Some(open) = rest.find(PH_OPEN) {
        out.push_str(&rest[..open]);
        let after = &rest[open + PH_OPEN.len_utf8()..];
        let Some(close) = after.find(PH_CLOSE) else {
            out.push_str(&rest[open..]);
            return out;
        };
        match after[..close]
            .parse::<usize>()
            .ok()
            .and_then(|i| pieces.get(i))
        {
            Some(p) => out.push_str(p),
            None => {
                out.push_str(&rest[open..open + PH_OPEN.len_utf8() + close + PH_CLOSE.len_utf8()])
            }
        }
        rest = &after[close + PH_CLOSE.len_utf8()..];
    }
    out.push_str(rest);
    out
}

/// Renders one template against a JSON context.
pub fn render(hb: &Handlebars<'_>, text: &str, ctx: &Value) -> Result<String, String> {
    if !text.contains("{{") {
        return Ok(text.to_string());
    }
    let describe = |e: &handlebars::RenderError| {
        let reason = e.reason().to_string();
        match (e.line_no, e.column_no) {
            (Some(l), Some(c)) => format!("{reason} (line {l}, column {c})"),
            _ => reason,
        }
    };
    let tpl = compiled(text).map_err(|e| e.reason().to_string())?;
    let data = Context::wraps(ctx).map_err(|e| describe(&e))?;
    let mut rc = RenderContext::new(None);
    let mut out = StringOutput::new();
    tpl.render(hb, &data, &mut rc, &mut out)
        .map_err(|e| describe(&e))?;
    out.into_string().map_err(|e| e.to_string())
}

/// Is a rendered `when` condition true? Empty, `false` and `0` are false.
pub fn truthy(rendered: &str) -> bool {
    let t = rendered.trim();
    !(t.is_empty() || t == "false" || t == "0" || t == "0.0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(t: &str) -> Vec<String> {
        scan(t)
            .unwrap()
            .into_iter()
            .map(|u| u.path.join("."))
            .collect()
    }

    #[test]
    fn finds_plain_and_helper_params() {
        assert_eq!(paths("--p {{prompt}} {{cwd}}"), ["prompt", "cwd"]);
        assert_eq!(
            paths("{{not (eq nodes.tests.exit_code 0)}}"),
            ["nodes.tests.exit_code"]
        );
        assert_eq!(
            paths("{{#if verdict}}x{{else}}{{loop}}{{/if}}"),
            ["verdict", "loop"]
        );
        assert_eq!(
            paths("{{#each reasons}}- {{this}} {{x}}{{/each}}"),
            ["reasons"]
        );
        assert_eq!(
            paths("{{{raw_thing}}} {{~ trimmed ~}}"),
            ["raw_thing", "trimmed"]
        );
        assert_eq!(paths("{{! a comment }}"), Vec::<String>::new());
    }

    #[test]
    fn ranges_point_at_the_name() {
        let t = "a {{ verdict }} b";
        let u = scan(t).unwrap();
        assert_eq!(&t[u[0].range.clone()], "verdict");
        let t = "{{not (eq nodes.x.exit_code 0)}}";
        let u = scan(t).unwrap();
        assert_eq!(&t[u[0].range.clone()], "nodes.x.exit_code");
    }

    #[test]
    fn unknown_helper_and_syntax_errors() {
        assert!(scan("{{frob a b}}").unwrap_err().message.contains("frob"));
        assert!(scan("{{#if a}}").is_err());
    }

    #[test]
    fn unbalanced_blocks_point_at_the_wrong_tag() {
        let e = scan("a {{#if x}}b{{/each}} c").unwrap_err();
        assert_eq!(e.message, "`{{/each}}` closes a `{{#if}}` block");
        assert_eq!(e.range, 12..21);
        let e = scan("{{/if}}").unwrap_err();
        assert_eq!(e.message, "`{{/if}}` has no `{{#if}}` before it");
        let e = scan("x {{#each reasons}}- {{this}}").unwrap_err();
        assert_eq!(e.range, 2..19);
        assert!(e.message.contains("add `{{/each}}`"), "{}", e.message);
        let e = scan("x {{y").unwrap_err();
        assert_eq!(e.range, 2..4);
        // Escaped and balanced ones are fine.
        assert!(scan("\\{{#if}} {{#if a}}{{#unless b}}x{{/unless}}{{/if}}").is_ok());
    }

    #[test]
    fn parser_errors_are_short() {
        let e = scan("{{a b c d (}}").unwrap_err();
        assert!(!e.message.contains("expected escape"), "{}", e.message);
    }

    #[test]
    fn legacy_tokens() {
        let l = legacy_placeholders("--prompt-file {prompt} {{cwd}} {not-a-token");
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].0, "prompt");
    }

    /// The fast compile must render exactly what handlebars' own compile renders.
    #[test]
    fn fast_compile_renders_like_handlebars() {
        let hb = engine();
        let base = serde_json::json!({
            "loop": "l", "x": "", "reasons": ["a", "b"], "next_hint": "h", "t": true,
            "iteration": 3, "cwd": "/w", "current_task": "task", "current_phase": "implement",
            "output": "/o.json", "artifact": "/a.json", "task_title": "T", "prompt": "/p.md",
        });
        let mut ctx = base.clone();
        ctx["items"] = serde_json::json!([base.clone(), base]);
        let mut cases: Vec<String> = vec![
            include_str!("../prompts/loop-implement.md").into(),
            include_str!("../prompts/loop-verifier.md").into(),
            include_str!("../prompts/loop-orchestrate.md").replace("{{verdict}}", "{{loop}}"),
        ];
        let lines = [
            "plain text line",
            "   indented text   ",
            "",
            "   ",
            "{{#if t}}",
            "{{/if}}",
            "  {{#each items}}- {{@index}}",
            "- {{loop}}",
            "  {{/each}}",
            "{{~loop~}}",
            "text {{loop}} text",
            "{{#unless x}}",
            "{{else}}",
            "{{/unless}}",
            "{{!-- a",
            "   comment --}}",
            "tail\r",
        ];
        // Deterministic pseudo-random templates made of those lines, blocks kept balanced.
        let mut seed = 7u64;
        for _ in 0..300 {
            let mut t = String::new();
            let mut open: Vec<&str> = Vec::new();
            for _ in 0..40 {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let l = lines[(seed >> 33) as usize % lines.len()];
                let closes = l.contains("{{/") || l.contains("{{else}}");
                if l.contains("{{#if") {
                    open.push("{{/if}}");
                } else if l.contains("{{#each") {
                    // Items have no `items`: no each inside an each.
                    if open.contains(&"  {{/each}}") {
                        continue;
                    }
                    open.push("  {{/each}}");
                } else if l.contains("{{#unless") {
                    open.push("{{/unless}}");
                } else if closes || l.contains("--}}") || l.contains("{{!--") {
                    continue;
                }
                t.push_str(l);
                t.push('\n');
                t.push_str("filler words here\n  more filler  \n");
            }
            while let Some(c) = open.pop() {
                t.push_str(c);
                t.push('\n');
            }
            cases.push(t);
        }
        cases.push("{{!-- multi\nline comment\nwith plain lines --}}\n".repeat(20));
        let (mut fast_paths, mut rendered) = (0, 0);
        for c in &cases {
            let Some(fast) = compile_fast(c) else {
                continue;
            };
            fast_paths += 1;
            let slow = Template::compile(c).expect("compiles");
            let render = |t: &Template| {
                let data = Context::wraps(&ctx).unwrap();
                let mut rc = RenderContext::new(None);
                let mut out = StringOutput::new();
                t.render(&hb, &data, &mut rc, &mut out)
                    .map(|_| out.into_string().unwrap())
            };
            let (f, sl) = (render(&fast).ok(), render(&slow).ok());
            rendered += usize::from(sl.is_some());
            assert_eq!(f, sl, "template:\n{c}");
        }
        assert!(
            fast_paths > 250,
            "the fast path was taken only {fast_paths} times"
        );
        assert!(rendered > 250, "only {rendered} templates rendered");
    }

    #[test]
    fn plain_mustaches_are_recognised_conservatively() {
        assert!(only_plain_mustaches(
            "--p {{prompt}} {{ nodes.floor-check.exit_code }}"
        ));
        for not_plain in [
            "{{#if x}}y{{/if}}",
            "{{{raw}}}",
            "{{eq a b}}",
            "{{a..b}}",
            "{{.a}}",
            "x}}",
            "\\{{a}}",
            "{{else}}",
            "{{!c}}",
            "{{a}",
        ] {
            assert!(!only_plain_mustaches(not_plain), "{not_plain}");
        }
    }

    #[test]
    fn renders_verbatim() {
        let hb = engine();
        let ctx = serde_json::json!({"x": "a<b>&\"$(touch pwned)"});
        assert_eq!(render(&hb, "{{x}}", &ctx).unwrap(), "a<b>&\"$(touch pwned)");
        assert!(render(&hb, "{{missing}}", &ctx).is_err());
    }
}
