//! Rendering: one handlebars registry in strict mode with HTML escaping off, and a
//! per-process cache of compiled templates (with a fast compile for long prompts).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use handlebars::{Context, Handlebars, RenderContext, Renderable, StringOutput, Template};
use serde_json::Value;

use super::bytes::find2;
use super::compile::compile_plain;

/// The engine: strict mode (a missing variable is an error), no HTML escaping (an argv
/// element must reach the agent byte for byte).
pub(crate) fn engine() -> Handlebars<'static> {
    let mut hb = Handlebars::new();
    hb.set_strict_mode(true);
    hb.register_escape_fn(handlebars::no_escape);
    hb
}

/// Compiles a template once per process: `check` and rendering share the result, so a
/// tick parses each prompt and argv element once (handlebars' parser dominated a tick's
/// CPU time before this cache).
///
/// Three compilers, cheapest first: the plain subset ([`compile_plain`]: no parser at
/// all), the skeleton of a long prompt ([`compile_fast`]), handlebars itself. The first two
/// build the same elements as the third but not its element-to-position map, so the
/// second value says whether render errors from this template carry exact positions.
pub(super) fn compiled(text: &str) -> Result<(Arc<Template>, bool), handlebars::TemplateError> {
    // foldhash: the keys are whole prompts, which std's SipHash costs more to hash than
    // the lookup saves.
    type Cache = Mutex<HashMap<String, (Arc<Template>, bool), foldhash::fast::RandomState>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((t, exact)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(text) {
        return Ok((Arc::clone(t), *exact));
    }
    let (t, exact) = match compile_plain(text).or_else(|| compile_fast(text)) {
        Some(t) => (t, false),
        None => (Template::compile(text)?, true),
    };
    let t = Arc::new(t);
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(text.to_string(), (Arc::clone(&t), exact));
    Ok((t, exact))
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

/// Why a template did not render: handlebars' reason, with line and column when known.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct RenderError(String);

/// Renders one template against a JSON context.
pub(crate) fn render(hb: &Handlebars<'_>, text: &str, ctx: &Value) -> Result<String, RenderError> {
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
    let (tpl, exact) = compiled(text).map_err(|e| RenderError(e.reason().to_string()))?;
    // A clone, not `Context::wraps`, which copies the value through serde.
    let data = Context::from(ctx.clone());
    let run = |tpl: &Template| {
        let mut rc = RenderContext::new(None);
        let mut out = StringOutput::new();
        tpl.render(hb, &data, &mut rc, &mut out)
            .map_err(|e| RenderError(describe(&e)))?;
        out.into_string().map_err(|e| RenderError(e.to_string()))
    };
    match run(&tpl) {
        // The error of a template compiled without positions is handlebars' own, with
        // its line and column: rendered once more from handlebars' compile.
        Err(_) if !exact => {
            let exact = Template::compile(text).map_err(|e| RenderError(e.reason().to_string()))?;
            run(&exact)
        }
        r => r,
    }
}

/// Is a rendered `when` condition true? Empty, `false` and `0` are false.
pub(crate) fn truthy(rendered: &str) -> bool {
    let t = rendered.trim();
    !(t.is_empty() || t == "false" || t == "0" || t == "0.0")
}

#[cfg(test)]
mod tests {
    use super::*;

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
            include_str!("../../prompts/loop-implement.md").into(),
            include_str!("../../prompts/loop-verifier.md").into(),
            include_str!("../../prompts/loop-orchestrate.md").replace("{{verdict}}", "{{loop}}"),
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

    /// A template compiled without positions still fails with handlebars' own message,
    /// line and column included.
    #[test]
    fn render_errors_keep_their_positions() {
        let hb = engine();
        let ctx = serde_json::json!({"a": 1});
        let text = "line {{a}}\n  {{missing}}";
        assert!(compiled(text).is_ok_and(|(_, exact)| !exact));
        let e = render(&hb, text, &ctx).unwrap_err();
        assert!(e.to_string().contains("(line 2, column 3)"), "{e}");
    }

    #[test]
    fn renders_verbatim() {
        let hb = engine();
        let ctx = serde_json::json!({"x": "a<b>&\"$(touch pwned)"});
        assert_eq!(render(&hb, "{{x}}", &ctx).unwrap(), "a<b>&\"$(touch pwned)");
        assert!(render(&hb, "{{missing}}", &ctx).is_err());
    }
}
