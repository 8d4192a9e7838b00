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
    check_blocks(text)?;
    if let Err(e) = compiled(text) {
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
fn tokens(expr: &str, base: usize) -> Vec<(String, Range<usize>)> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = expr.char_indices().collect();
    let mut k = 0;
    while k < chars.len() {
        let (pos, c) = chars[k];
        if c.is_whitespace() {
            k += 1;
            continue;
        }
        if c == '(' || c == ')' || c == '|' {
            out.push((c.to_string(), base + pos..base + pos + 1));
            k += 1;
            continue;
        }
        if c == '"' || c == '\'' {
            let mut j = k + 1;
            while j < chars.len() && chars[j].1 != c {
                j += 1;
            }
            let end = chars.get(j + 1).map_or(expr.len(), |x| x.0);
            out.push((expr[pos..end].to_string(), base + pos..base + end));
            k = j + 1;
            continue;
        }
        let mut j = k;
        let mut bracket = false;
        while j < chars.len() {
            let ch = chars[j].1;
            if ch == '[' {
                bracket = true;
            } else if ch == ']' {
                bracket = false;
            } else if !bracket && (ch.is_whitespace() || ch == '(' || ch == ')' || ch == '|') {
                break;
            }
            j += 1;
        }
        let end = chars.get(j).map_or(expr.len(), |x| x.0);
        out.push((expr[pos..end].to_string(), base + pos..base + end));
        k = j;
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
        match tok.as_str() {
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
            if !HELPERS.contains(&tok.as_str()) {
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
            _ => (tok.as_str(), range.start),
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
    let t = Arc::new(Template::compile(text)?);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(text.to_string(), Arc::clone(&t));
    Ok(t)
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

    #[test]
    fn renders_verbatim() {
        let hb = engine();
        let ctx = serde_json::json!({"x": "a<b>&\"$(touch pwned)"});
        assert_eq!(render(&hb, "{{x}}", &ctx).unwrap(), "a<b>&\"$(touch pwned)");
        assert!(render(&hb, "{{missing}}", &ctx).is_err());
    }
}
