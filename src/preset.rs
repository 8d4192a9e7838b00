//! Agent presets: `preset = "claude-code"` in `[harness]` or `[roles.<role>]` expands to
//! the argv that agent's CLI accepts for a headless run, and says where in its output the
//! agent reports its answer, cost and tokens. Each preset is a small data file under
//! `presets/`, embedded in the binary; keys given next to `preset` override it key by key.

use serde_json::Value;

use crate::diag::{Code, Diagnostic, Diagnostics, Source, SourceRef};
use crate::template::Tmpl;
use crate::toml_read::{self, Table};

/// Every preset: (name, file text).
pub const PRESETS: &[(&str, &str)] = &[
    ("claude-code", include_str!("../presets/claude-code.toml")),
    ("opencode", include_str!("../presets/opencode.toml")),
    ("codex", include_str!("../presets/codex.toml")),
    ("aider", include_str!("../presets/aider.toml")),
    ("gemini", include_str!("../presets/gemini.toml")),
    ("goose", include_str!("../presets/goose.toml")),
];

pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

/// How the agent's stdout is read for usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// One JSON document.
    Json,
    /// One JSON document per line (an event stream).
    Jsonl,
}

/// Where the answer, cost and tokens are in the agent's JSON output. Every field is
/// optional so a loop's `[harness.usage]` can override one key of a preset's rule.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRule {
    pub format: Option<OutputFormat>,
    /// JSON pointer to the agent's answer text (what verdict parsing reads).
    pub text: Option<String>,
    /// JSON pointers whose numbers are added up as USD.
    pub cost_usd: Option<Vec<String>>,
    /// JSON pointers whose numbers are added up as tokens.
    pub tokens: Option<Vec<String>>,
}

impl UsageRule {
    /// `self`'s keys where set, else `base`'s.
    pub fn over(&self, base: &UsageRule) -> UsageRule {
        UsageRule {
            format: self.format.or(base.format),
            text: self.text.clone().or_else(|| base.text.clone()),
            cost_usd: self.cost_usd.clone().or_else(|| base.cost_usd.clone()),
            tokens: self.tokens.clone().or_else(|| base.tokens.clone()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_none() && self.cost_usd.is_none() && self.tokens.is_none()
    }

    /// Reads a `usage` table (in a preset or in loop.toml).
    pub fn read(t: &Table<'_, '_>, diags: &mut Diagnostics) -> UsageRule {
        t.deny_unknown(&["format", "text", "cost_usd", "tokens"], diags);
        let format = t.str("format", diags).and_then(|s| match s.value.as_str() {
            "json" => Some(OutputFormat::Json),
            "jsonl" => Some(OutputFormat::Jsonl),
            other => {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        t.source,
                        s.span,
                        format!("`{}.format` cannot be `{other}`", t.path),
                    )
                    .label("not an output format")
                    .help("use \"json\" (stdout is one JSON document) or \"jsonl\" (one JSON document per line)"),
                );
                None
            }
        });
        let pointer_ok = |s: &toml_read::Str, diags: &mut Diagnostics| {
            if s.value.is_empty() || s.value.starts_with('/') {
                return true;
            }
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    s.span.clone(),
                    format!("`{}` is not a JSON pointer", s.value),
                )
                .label("a JSON pointer starts with `/`")
                .help("write a JSON pointer such as \"/usage/input_tokens\"; `*` matches every key or element"),
            );
            false
        };
        let text = t
            .str("text", diags)
            .filter(|s| pointer_ok(s, diags))
            .map(|s| s.value);
        let list = |key: &str, diags: &mut Diagnostics| {
            t.str_list(key, diags).map(|(v, _)| {
                v.iter()
                    .filter(|s| pointer_ok(s, diags))
                    .map(|s| s.value.clone())
                    .collect::<Vec<_>>()
            })
        };
        let cost_usd = list("cost_usd", diags);
        let tokens = list("tokens", diags);
        UsageRule {
            format,
            text,
            cost_usd,
            tokens,
        }
    }
}

/// A preset, parsed from its embedded file.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub source: SourceRef,
    pub command: Vec<Tmpl>,
    /// Appended to the command when the role names a `model`.
    pub model_args: Vec<Tmpl>,
    pub usage: UsageRule,
}

/// Loads a preset by name. The embedded files are tested to be valid; problems in them
/// would be reported against `presets/<name>.toml`.
pub fn load(name: &str, diags: &mut Diagnostics) -> Option<Preset> {
    let (name, text) = PRESETS.iter().find(|(n, _)| *n == name)?;
    let file = format!("presets/{name}.toml (built in)");
    let source = Source::new(file.clone(), file, *text);
    let doc = toml_read::parse(&source, diags)?;
    let root = Table::new(&source, doc.get_ref(), 0..0, "");
    root.deny_unknown(&["command", "model_args", "usage"], diags);
    let command = root.argv("command", diags)?;
    let model_args = root.templates("model_args", diags).unwrap_or_default();
    let usage = root
        .table("usage", diags)
        .map(|t| UsageRule::read(&t, diags))
        .unwrap_or_default();
    Some(Preset {
        name,
        source: source.clone(),
        command,
        model_args,
        usage,
    })
}

/// What an agent reported about its run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    pub text: Option<String>,
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
}

/// Every value a pointer reaches. Plain RFC 6901 pointers go to
/// `serde_json::Value::pointer` (escapes included); a `*` segment fans out over every key
/// or element, and each branch continues with the rest of the pointer.
fn resolve<'a>(v: &'a Value, pointer: &str) -> Vec<&'a Value> {
    let Some((head, rest)) = pointer.split_once("/*") else {
        return v.pointer(pointer).into_iter().collect();
    };
    // `/*` must be a whole segment: `/a*b` is the key "a*b".
    if !(rest.is_empty() || rest.starts_with('/')) {
        return v.pointer(pointer).into_iter().collect();
    }
    let Some(base) = v.pointer(head) else {
        return Vec::new();
    };
    let children: Vec<&Value> = match base {
        Value::Object(m) => m.values().collect(),
        Value::Array(a) => a.iter().collect(),
        _ => Vec::new(),
    };
    children
        .into_iter()
        .flat_map(|c| resolve(c, rest))
        .collect()
}

/// The documents of an agent's stdout: the whole text, or each line that is JSON.
fn documents(rule: &UsageRule, stdout: &str) -> Vec<Value> {
    match rule.format.unwrap_or(OutputFormat::Json) {
        OutputFormat::Json => serde_json::from_str(stdout.trim()).into_iter().collect(),
        OutputFormat::Jsonl => stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l.trim()).ok())
            .collect(),
    }
}

/// Reads the answer, cost and tokens from an agent's stdout. Numbers are added up over
/// every pointer and every document (an event stream reports each step); the answer is
/// the last string found. Output that is not JSON yields nothing.
pub fn extract(rule: &UsageRule, stdout: &str) -> Usage {
    if rule.is_empty() {
        return Usage::default();
    }
    let docs = documents(rule, stdout);
    let sum = |pointers: &Option<Vec<String>>| -> Option<f64> {
        let mut total = None;
        for d in &docs {
            for p in pointers.iter().flatten() {
                for v in resolve(d, p) {
                    if let Some(n) = v.as_f64() {
                        *total.get_or_insert(0.0) += n;
                    }
                }
            }
        }
        total
    };
    let text = rule.text.as_ref().and_then(|p| {
        docs.iter()
            .flat_map(|d| resolve(d, p))
            .filter_map(Value::as_str)
            .next_back()
            .map(str::to_string)
    });
    Usage {
        text,
        cost_usd: sum(&rule.cost_usd),
        tokens: sum(&rule.tokens).map(|n| n.max(0.0).round() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_loads_cleanly() {
        for name in names() {
            let mut d = Diagnostics::default();
            let p = load(name, &mut d).unwrap_or_else(|| panic!("{name}: {d:?}"));
            assert!(d.is_empty(), "{name}: {d:?}");
            assert!(!p.command.is_empty(), "{name}");
            // Every preset hands the agent its prompt, one way or the other.
            assert!(
                p.command.iter().any(|t| t.text.contains("{{prompt")),
                "{name} never passes the prompt"
            );
            assert!(
                p.model_args.iter().any(|t| t.text.contains("{{model}}")),
                "{name} cannot select a model"
            );
        }
    }

    #[test]
    fn claude_code_json_result() {
        let mut d = Diagnostics::default();
        let p = load("claude-code", &mut d).expect("preset");
        let out = r#"{"type":"result","subtype":"success","is_error":false,
            "result":"done\n```json\n{\"pass\":true,\"score\":0.9}\n```",
            "total_cost_usd":0.0123,"usage":{"input_tokens":1000,"output_tokens":234}}"#;
        let u = extract(&p.usage, out);
        assert_eq!(u.cost_usd, Some(0.0123));
        assert_eq!(u.tokens, Some(1234));
        assert!(u.text.expect("text").contains("\"pass\":true"));
    }

    #[test]
    fn event_streams_add_up_and_keep_the_last_answer() {
        let mut d = Diagnostics::default();
        let p = load("opencode", &mut d).expect("preset");
        let out = concat!(
            "{\"type\":\"text\",\"part\":{\"type\":\"text\",\"text\":\"thinking\"}}\n",
            "{\"type\":\"step_finish\",\"part\":{\"cost\":0.01,\"tokens\":{\"input\":100,\"output\":10}}}\n",
            "not json at all\n",
            "{\"type\":\"text\",\"part\":{\"type\":\"text\",\"text\":\"final answer\"}}\n",
            "{\"type\":\"step_finish\",\"part\":{\"cost\":0.02,\"tokens\":{\"input\":200,\"output\":20}}}\n",
        );
        let u = extract(&p.usage, out);
        assert_eq!(u.text.as_deref(), Some("final answer"));
        assert_eq!(u.tokens, Some(330));
        assert!((u.cost_usd.expect("cost") - 0.03).abs() < 1e-9);
    }

    #[test]
    fn wildcards_sum_over_models() {
        let mut d = Diagnostics::default();
        let p = load("gemini", &mut d).expect("preset");
        let out = r#"{"response":"ok","stats":{"models":{
            "gemini-2.5-pro":{"tokens":{"total":300}},
            "gemini-2.5-flash":{"tokens":{"total":45}}}}}"#;
        let u = extract(&p.usage, out);
        assert_eq!(
            (u.text.as_deref(), u.tokens, u.cost_usd),
            (Some("ok"), Some(345), None)
        );
    }

    #[test]
    fn pointers_follow_rfc_6901_and_fan_out_on_star() {
        let v: Value = serde_json::json!({
            "a/b": {"~k": 1},
            "m": {"x": {"n": 2}, "y": {"n": 3}},
            "l": [{"n": 4}, {"n": 5}],
            "s*t": 6
        });
        let nums =
            |p: &str| -> Vec<i64> { resolve(&v, p).iter().filter_map(|x| x.as_i64()).collect() };
        assert_eq!(nums("/a~1b/~0k"), [1]);
        assert_eq!(nums("/m/*/n"), [2, 3]);
        assert_eq!(nums("/l/*/n"), [4, 5]);
        assert_eq!(nums("/l/1/n"), [5]);
        assert_eq!(nums("/s*t"), [6]);
        assert_eq!(nums("/*/n"), Vec::<i64>::new());
        assert!(nums("/missing/*").is_empty());
    }

    #[test]
    fn plain_text_output_yields_nothing() {
        let mut d = Diagnostics::default();
        let p = load("claude-code", &mut d).expect("preset");
        assert_eq!(extract(&p.usage, "just words\n"), Usage::default());
        let p = load("aider", &mut d).expect("preset");
        assert!(p.usage.is_empty());
    }

    #[test]
    fn overrides_are_key_by_key() {
        let base = UsageRule {
            format: Some(OutputFormat::Json),
            text: Some("/result".into()),
            cost_usd: Some(vec!["/cost".into()]),
            tokens: Some(vec!["/t".into()]),
        };
        let over = UsageRule {
            cost_usd: Some(vec!["/my/cost".into()]),
            ..Default::default()
        };
        let merged = over.over(&base);
        assert_eq!(merged.cost_usd, Some(vec!["/my/cost".to_string()]));
        assert_eq!(merged.text.as_deref(), Some("/result"));
        assert_eq!(merged.format, Some(OutputFormat::Json));
    }
}

#[cfg(test)]
mod schema_tests {
    /// `schemas/loop.schema.json` offers exactly the presets that exist, for completion.
    #[test]
    fn the_loop_schema_lists_every_preset() {
        let schema: serde_json::Value =
            serde_json::from_str(crate::schema::get("loop").expect("schema")).expect("JSON");
        let listed: Vec<&str> = schema["definitions"]["PresetName"]["enum"]
            .as_array()
            .expect("PresetName enum")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        let mut names = super::names();
        let mut listed = listed;
        names.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, names);
    }
}
