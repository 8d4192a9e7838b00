//! A compiler for the plain subset of handlebars that prompts and argv elements mostly
//! are — text, `{{path}}`, and `{{#if|unless|each|with path}}…{{else}}…{{/…}}` — that
//! builds exactly the [`Template`] handlebars' own parser builds (a unit test compares the
//! two element for element on the shipped prompts and thousands of generated templates),
//! without that parser: pest spends ~35,000 instructions on each mustache, which made
//! compiling a tick's three prompts a third of its CPU time. Anything outside the subset
//! (helpers with arguments, `~`, comments, partials, escapes, `@index`, `../`, literals)
//! is `None`, and handlebars compiles it.
//!
//! What is not reproduced is the element-to-(line, column) map: it only serves render
//! errors, and a template compiled here that fails to render is rendered again from
//! handlebars' own compile (see `engine::render`), so every error message is its own.
//!
//! Cost: one pass over the text, linear in its length.

use std::collections::HashMap;
use std::sync::OnceLock;

use handlebars::template::{ExpressionSpecBuilder, HelperTemplate, Parameter, TemplateElement};
use handlebars::{Path, PathSeg, Template};

use super::bytes::find2;

/// The block helpers of the subset (each takes exactly one path argument).
const BLOCKS: &[&str] = &["if", "unless", "each", "with"];

/// Names the grammar reads as something other than a variable path.
const RESERVED: &[&str] = &["else", "as", "true", "false", "null"];

/// One piece of a template, by byte range.
enum Tok<'a> {
    Text(usize, usize),
    Expr(usize, usize, &'a str),
    Open(usize, usize, &'a str, &'a str),
    Else(usize, usize),
    Close(usize, usize, &'a str),
}

/// The whitespace pest skips between elements (the grammar's `WHITESPACE`).
fn pest_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// A variable path of the subset: `a`, `a.b.c`, `this`, `this.a` (segments of ASCII
/// letters, digits, `_` and `-`, the first starting with a letter or `_`). One pass over
/// the bytes: a prompt check calls this for every mustache.
fn is_path(p: &str) -> bool {
    let b = p.as_bytes();
    if !b
        .first()
        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
    {
        return false;
    }
    let mut seg_start = true;
    for &c in b {
        if c == b'.' {
            if seg_start {
                return false;
            }
            seg_start = true;
        } else if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' {
            seg_start = false;
        } else {
            return false;
        }
    }
    !seg_start && !RESERVED.contains(&p)
}

fn path(raw: &str) -> Parameter {
    // As handlebars reads a path: `this` segments name the current context, not a key.
    let segs = raw
        .split('.')
        .filter(|s| *s != "this")
        .map(|s| PathSeg::Named(s.to_string()))
        .collect();
    Parameter::Path(Path::Relative((segs, raw.to_string())))
}

/// Splits `text` into the subset's pieces; `None` for anything outside it.
fn tokens(text: &str) -> Option<Vec<Tok<'_>>> {
    // About two tokens (text, mustache) per mustache; prompts have one every few dozen
    // bytes: sized once instead of grown five times.
    let mut out = Vec::with_capacity(text.len() / 24 + 2);
    let mut i = 0;
    while i < text.len() {
        let Some(open) = find2(&text[i..], b'{').map(|p| i + p) else {
            out.push(Tok::Text(i, text.len()));
            break;
        };
        if open > i {
            out.push(Tok::Text(i, open));
        }
        // `\{{` is an escape; `{{{`, `{{~`, `{{!`, `{{>`, `{{&`, `{{*`, `{{^` are not ours.
        if text[..open].ends_with('\\') {
            return None;
        }
        let close = open + 2 + find2(&text[open + 2..], b'}')?;
        let inner = &text[open + 2..close];
        let body = inner.trim_start_matches(pest_ws);
        let body = body.strip_prefix('/').unwrap_or(body);
        if body.bytes().any(|b| {
            matches!(
                b,
                b'{' | b'}'
                    | b'~'
                    | b'!'
                    | b'>'
                    | b'&'
                    | b'*'
                    | b'^'
                    | b'('
                    | b'"'
                    | b'\''
                    | b'|'
                    | b'='
                    | b'@'
                    | b'['
                    | b'/'
            )
        }) {
            return None;
        }
        let s = inner.trim_matches(pest_ws);
        let end = close + 2;
        let tok = if let Some(rest) = s.strip_prefix('#') {
            let rest = rest.trim_start_matches(pest_ws);
            let (name, param) = rest.split_once(pest_ws)?;
            let param = param.trim_start_matches(pest_ws);
            if !BLOCKS.contains(&name) || !is_path(param) {
                return None;
            }
            Tok::Open(open, end, name, param)
        } else if let Some(rest) = s.strip_prefix('/') {
            let name = rest.trim_start_matches(pest_ws);
            if !BLOCKS.contains(&name) {
                return None;
            }
            Tok::Close(open, end, name)
        } else if s == "else" {
            Tok::Else(open, end)
        } else if is_path(s) {
            Tok::Expr(open, end, s)
        } else {
            return None;
        };
        out.push(tok);
        i = end;
    }
    Some(out)
}

fn space_or_tab(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// A raw string as handlebars keeps it: after a standalone tag, the rest of that tag's
/// line (blanks and one newline) is dropped.
fn raw(s: &str, trim_line: bool) -> TemplateElement {
    if !trim_line {
        return TemplateElement::RawString(s.to_string());
    }
    let s = s.trim_start_matches(space_or_tab);
    let s = s
        .strip_prefix("\r\n")
        .or_else(|| s.strip_prefix('\n'))
        .unwrap_or(s);
    TemplateElement::RawString(s.to_string())
}

/// Whether the tag at `a..b` stands alone on its line (handlebars then drops the line's
/// blanks and newline); drops the blanks before it from `front`'s last raw string.
fn standalone(source: &str, a: usize, b: usize, front: &mut Template) -> bool {
    let rest = &source[b..];
    let trailing = rest.is_empty()
        || rest
            .trim_start_matches(space_or_tab)
            .starts_with(['\n', '\r']);
    if !trailing {
        return false;
    }
    let before = source[..a].trim_end_matches(space_or_tab);
    let leading = before.is_empty() || before.ends_with(['\n', '\r']);
    if leading && let Some(TemplateElement::RawString(t)) = front.elements.last_mut() {
        let kept = t.trim_end_matches(space_or_tab).len();
        t.truncate(kept);
    }
    a == 0 || leading
}

/// A helper template, cloned from one of four made once (handlebars offers no
/// constructor but a builder, which clones every field on each build).
fn helper(
    name: Parameter,
    params: Vec<Parameter>,
    block: bool,
    indent: bool,
) -> Option<HelperTemplate> {
    static PROTOTYPES: OnceLock<Option<[HelperTemplate; 4]>> = OnceLock::new();
    let protos = PROTOTYPES.get_or_init(|| {
        let make = |block, indent| {
            let spec = ExpressionSpecBuilder::default()
                .name(Parameter::Name(String::new()))
                .params(Vec::new())
                .hash(HashMap::new())
                .omit_pre_ws(false)
                .omit_pro_ws(false)
                .build()
                .ok()?;
            Some(HelperTemplate::new(spec, block, indent))
        };
        Some([
            make(false, false)?,
            make(false, true)?,
            make(true, false)?,
            make(true, true)?,
        ])
    });
    let mut h = protos.as_ref()?[usize::from(block) * 2 + usize::from(indent)].clone();
    h.name = name;
    h.params = params;
    Some(h)
}

/// For a text [`compile_plain`] compiles, the variable paths it names outside `#each` and
/// `#with` blocks (whose context changes), each with its byte offset, in order: every
/// `{{path}}` and every block's argument. `None` when the text is outside the subset
/// (its tokens, blocks closed by name in order, at most one `else` each) — a check learns
/// that the text is valid handlebars and what it uses without building a template.
pub(super) fn plain_paths(source: &str) -> Option<Vec<(&str, usize)>> {
    let toks = tokens(source)?;
    let at = |p: &str| p.as_ptr().addr() - source.as_ptr().addr();
    let mut open: Vec<(&str, bool)> = Vec::new();
    let mut context_depth = 0usize;
    let mut paths = Vec::with_capacity(toks.len() / 2 + 1);
    for tok in toks {
        match tok {
            Tok::Expr(_, _, p) => {
                if context_depth == 0 {
                    paths.push((p, at(p)));
                }
            }
            Tok::Open(_, _, name, param) => {
                if context_depth == 0 {
                    paths.push((param, at(param)));
                }
                if matches!(name, "each" | "with") {
                    context_depth += 1;
                }
                open.push((name, false));
            }
            Tok::Else(..) => match open.last_mut() {
                Some((_, seen)) if !*seen => *seen = true,
                _ => return None,
            },
            Tok::Close(_, _, name) => match open.pop() {
                Some((opened, _)) if opened == name => {
                    if matches!(name, "each" | "with") {
                        context_depth -= 1;
                    }
                }
                _ => return None,
            },
            Tok::Text(..) => {}
        }
    }
    open.is_empty().then_some(paths)
}

/// The template handlebars would compile from `source`, when `source` is in the subset.
pub(super) fn compile_plain(source: &str) -> Option<Template> {
    let toks = tokens(source)?;
    // What handlebars' compile loop tracks, in the same order (its `compile2`).
    let mut templates = vec![Template::new()];
    let mut helpers: Vec<HelperTemplate> = Vec::new();
    let mut prev_end = 0;
    let mut trim_line = false;
    // pest skips whitespace before every element but the first of the whole template.
    let mut skips = false;
    for tok in toks {
        let (a, b) = match tok {
            Tok::Text(a, b) => {
                let start = if skips {
                    b - source[a..b].trim_start_matches(pest_ws).len()
                } else {
                    a
                };
                if start == b {
                    // Blanks only: no element of their own; the next tag (or the end)
                    // takes them.
                    continue;
                }
                templates
                    .last_mut()?
                    .elements
                    .push(raw(&source[prev_end..b], trim_line));
                trim_line = false;
                prev_end = b;
                skips = true;
                continue;
            }
            Tok::Expr(a, b, _) | Tok::Open(a, b, ..) | Tok::Else(a, b) | Tok::Close(a, b, _) => {
                (a, b)
            }
        };
        if a != prev_end {
            templates
                .last_mut()?
                .elements
                .push(raw(&source[prev_end..a], trim_line));
            trim_line = false;
        }
        match tok {
            Tok::Expr(_, _, p) => {
                let h = helper(path(p), Vec::new(), false, false)?;
                templates
                    .last_mut()?
                    .elements
                    .push(TemplateElement::Expression(Box::new(h)));
            }
            Tok::Open(_, _, name, param) => {
                trim_line = standalone(source, a, b, templates.last_mut()?);
                helpers.push(helper(
                    Parameter::Name(name.to_string()),
                    vec![path(param)],
                    true,
                    trim_line,
                )?);
                templates.push(Template::new());
            }
            Tok::Else(..) => {
                trim_line = standalone(source, a, b, templates.last_mut()?);
                let h = helpers.last_mut()?;
                if h.template.is_some() {
                    return None;
                }
                h.template = templates.pop();
                templates.push(Template::new());
            }
            Tok::Close(_, _, name) => {
                trim_line = standalone(source, a, b, templates.last_mut()?);
                let mut h = helpers.pop()?;
                if h.name != Parameter::Name(name.to_string()) {
                    return None;
                }
                let inner = templates.pop();
                if h.template.is_some() {
                    h.inverse = inner;
                } else {
                    h.template = inner;
                }
                templates
                    .last_mut()?
                    .elements
                    .push(TemplateElement::HelperBlock(Box::new(h)));
            }
            Tok::Text(..) => {}
        }
        prev_end = b;
        skips = true;
    }
    if !helpers.is_empty() || templates.len() != 1 {
        return None;
    }
    let mut root = templates.pop()?;
    if prev_end < source.len() {
        // Blanks after the last element, which the end of input takes like a tag would.
        root.elements.push(raw(&source[prev_end..], trim_line));
    }
    Some(root)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `t` without its element-to-position map, which this compiler does not build.
    fn unmapped(mut t: Template) -> Template {
        fn strip(t: &mut Template) {
            t.mapping.clear();
            for e in &mut t.elements {
                if let TemplateElement::HelperBlock(h) = e {
                    if let Some(t) = &mut h.template {
                        strip(t);
                    }
                    if let Some(t) = &mut h.inverse {
                        strip(t);
                    }
                }
            }
        }
        strip(&mut t);
        t
    }

    /// Compiles like handlebars, or declines; and [`plain_paths`] says which, without
    /// compiling.
    fn same(text: &str) -> bool {
        assert_eq!(
            plain_paths(text).is_some(),
            compile_plain(text).is_some(),
            "plain_paths disagrees with compile_plain on {text:?}"
        );
        match compile_plain(text) {
            None => false,
            Some(ours) => {
                let theirs = Template::compile(text).unwrap_or_else(|e| {
                    panic!("handlebars rejects what we accepted: {e}\n{text:?}")
                });
                assert_eq!(ours, unmapped(theirs), "template: {text:?}");
                true
            }
        }
    }

    /// The prompts loopflow ships: every one must stay in the subset.
    pub(in crate::template) const SHIPPED_PROMPTS: [&str; 5] = [
        include_str!("../../prompts/loop-implement.md"),
        include_str!("../../prompts/loop-verifier.md"),
        include_str!("../../prompts/loop-orchestrate.md"),
        include_str!("../../prompts/compaction.md"),
        include_str!("../../prompts/onboarding.md"),
    ];

    /// The pieces generated templates are built from.
    pub(in crate::template) const PIECES: &[&str] = &[
        "{{#if a}}",
        "{{#unless b.c}}",
        "{{#each items}}",
        "{{#with this.d}}",
        "{{else}}",
        "{{/CLOSE}}",
        "{{x}}",
        "{{ y.z }}",
        "{{this}}",
        "{{# if  a }}",
        "{{/ CLOSE }}",
        "text",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\n\n",
        "- ",
        "{",
        "}",
        "é",
    ];

    /// `n` templates walked from `pieces` with a fixed seed (the same on every run):
    /// blocks opened by `{{#…}}` pieces are nested properly, `{{/CLOSE}}` closes the
    /// innermost, an `{{else}}` is kept once per block, and what is left open is closed
    /// at the end.
    pub(in crate::template) fn generated(pieces: &[&str], n: usize) -> Vec<String> {
        let mut seed = 11u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize
        };
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let mut t = String::new();
            let mut open: Vec<(&str, bool)> = Vec::new();
            for _ in 0..(next() % 24) {
                let p = pieces[next() % pieces.len()];
                if p.starts_with("{{#") {
                    let name = ["unless", "each", "with"]
                        .into_iter()
                        .find(|b| p.contains(b))
                        .unwrap_or("if");
                    open.push((name, false));
                    t.push_str(p);
                } else if p == "{{else}}" {
                    match open.last_mut() {
                        Some((_, seen)) if !*seen => {
                            *seen = true;
                            t.push_str(p);
                        }
                        _ => {}
                    }
                } else if p.contains("CLOSE") {
                    if let Some((name, _)) = open.pop() {
                        t.push_str(&p.replace("CLOSE", name));
                    }
                } else {
                    t.push_str(p);
                }
            }
            while let Some((name, _)) = open.pop() {
                if next() % 2 == 0 {
                    t.push('\n');
                }
                t.push_str(&format!("{{{{/{name}}}}}"));
            }
            out.push(t);
        }
        out
    }

    #[test]
    fn the_shipped_prompts_compile_like_handlebars() {
        for p in SHIPPED_PROMPTS {
            assert!(same(p), "a shipped prompt left the fast path:\n{p}");
        }
        for t in [
            "{{prompt}}",
            "--cwd={{cwd}}",
            "plain",
            "",
            "{{nodes.a-b.exit_code}}",
        ] {
            assert!(same(t), "{t:?}");
        }
    }

    #[test]
    fn outside_the_subset_is_declined() {
        for t in [
            "{{not (eq a 0)}}",
            "{{~a}}",
            "{{a~}}",
            "{{!c}}",
            "{{{a}}}",
            "\\{{a}}",
            "{{@index}}",
            "{{../a}}",
            "{{#if a}}x",
            "{{/if}}",
            "{{else}}",
            "{{#if a}}{{else}}{{else}}{{/if}}",
            "{{#if a}}{{/unless}}",
            "{{#if true}}{{/if}}",
            "{{#each a as |x|}}{{/each}}",
            "{{a b}}",
            "{{> p}}",
            "{{",
            "{{a}",
        ] {
            assert!(compile_plain(t).is_none(), "{t:?}");
            assert!(plain_paths(t).is_none(), "{t:?}");
        }
    }

    /// Generated templates — blocks nested, standalone or inline, blanks and newlines
    /// everywhere — compile exactly as handlebars compiles them.
    #[test]
    fn generated_templates_compile_like_handlebars() {
        let all = generated(PIECES, 6000);
        let accepted = all.iter().filter(|t| same(t)).count();
        assert!(
            accepted * 3 > all.len() * 2,
            "only {accepted} of {} generated templates took the fast path",
            all.len()
        );
    }
}
