//! Reading what an agent reported about its run from its JSON output: the answer (what
//! verdict parsing reads), cost, tokens (cache tokens included, where the CLI reports
//! them apart), an error it reported while exiting 0, and the tool calls it was refused.
//! Everything is a JSON pointer (RFC 6901, plus `*` for every key or element).

use serde_json::Value;

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::toml_read::{self, Table};

/// How the agent's stdout is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// One JSON document.
    Json,
    /// One JSON document per line (an event stream).
    Jsonl,
}

/// Lines (documents) whose pointers hold these values: `{ "/type" = "text" }`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter(pub Vec<(String, Value)>);

impl Filter {
    pub(super) fn admits(&self, doc: &Value) -> bool {
        self.0.iter().all(|(p, want)| doc.pointer(p) == Some(want))
    }
}

/// Where the answer, cost and tokens are in the agent's JSON output. Every field is
/// optional so a loop's `[harness.usage]` can override one key of a preset's rule.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageRule {
    pub format: Option<OutputFormat>,
    /// JSON pointer to the agent's answer text (what verdict parsing reads).
    pub text: Option<String>,
    /// Only documents that pass count for `text` (an event stream's text events).
    pub text_filter: Option<Filter>,
    /// JSON pointers whose numbers are added up as USD.
    pub cost_usd: Option<Vec<String>>,
    /// JSON pointers whose numbers are added up as tokens.
    pub tokens: Option<Vec<String>>,
    /// A truthy value here means the run failed, whatever the exit code.
    pub error: Option<String>,
    pub error_filter: Option<Filter>,
    /// Tool calls the agent was refused (an array, a string, or a count).
    pub denials: Option<String>,
    pub denials_filter: Option<Filter>,
}

/// What an agent reported about its run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Usage {
    pub text: Option<String>,
    pub cost_usd: Option<f64>,
    pub tokens: Option<u64>,
    /// The failure the agent reported (exit 0 notwithstanding).
    pub error: Option<String>,
    /// One line per refused tool call, e.g. `Bash: npm test`.
    pub denials: Vec<String>,
}

impl UsageRule {
    /// `self`'s keys where set, else `base`'s.
    pub fn over(&self, base: &UsageRule) -> UsageRule {
        let pick = |a: &Option<Filter>, b: &Option<Filter>| a.clone().or_else(|| b.clone());
        UsageRule {
            format: self.format.or(base.format),
            text: self.text.clone().or_else(|| base.text.clone()),
            text_filter: pick(&self.text_filter, &base.text_filter),
            cost_usd: self.cost_usd.clone().or_else(|| base.cost_usd.clone()),
            tokens: self.tokens.clone().or_else(|| base.tokens.clone()),
            error: self.error.clone().or_else(|| base.error.clone()),
            error_filter: pick(&self.error_filter, &base.error_filter),
            denials: self.denials.clone().or_else(|| base.denials.clone()),
            denials_filter: pick(&self.denials_filter, &base.denials_filter),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_none()
            && self.cost_usd.is_none()
            && self.tokens.is_none()
            && self.error.is_none()
            && self.denials.is_none()
    }

    /// Reads a `usage` table (in a preset or in loop.toml).
    pub fn read(t: &Table<'_, '_>, diags: &mut Diagnostics) -> UsageRule {
        t.deny_unknown(
            &[
                "format",
                "text",
                "text_filter",
                "cost_usd",
                "tokens",
                "error",
                "error_filter",
                "denials",
                "denials_filter",
            ],
            diags,
        );
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
        let one = |key: &str, diags: &mut Diagnostics| {
            t.str(key, diags)
                .filter(|s| pointer_ok(s, diags))
                .map(|s| s.value)
        };
        let list = |key: &str, diags: &mut Diagnostics| {
            t.str_list(key, diags).map(|(v, _)| {
                v.iter()
                    .filter(|s| pointer_ok(s, diags))
                    .map(|s| s.value.clone())
                    .collect::<Vec<_>>()
            })
        };
        let filter = |key: &str, diags: &mut Diagnostics| {
            let ft = t.table(key, diags)?;
            let mut out = Vec::new();
            for (k, v) in ft.scalars(diags) {
                if pointer_ok(&k, diags) {
                    out.push((k.value, v));
                }
            }
            Some(Filter(out))
        };
        UsageRule {
            format,
            text: one("text", diags),
            text_filter: filter("text_filter", diags),
            cost_usd: list("cost_usd", diags),
            tokens: list("tokens", diags),
            error: one("error", diags),
            error_filter: filter("error_filter", diags),
            denials: one("denials", diags),
            denials_filter: filter("denials_filter", diags),
        }
    }
}

/// Every value a pointer reaches. Plain RFC 6901 pointers go to
/// `serde_json::Value::pointer` (escapes included); a `*` segment fans out over every key
/// or element, and each branch continues with the rest of the pointer.
pub(super) fn resolve<'a>(v: &'a Value, pointer: &str) -> Vec<&'a Value> {
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

/// Whether a reported value means "yes": true, a non-empty string, a non-zero number, a
/// non-empty array or object.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// One refused tool call as a short line: its tool and input when the agent names them.
fn denial_line(v: &Value) -> String {
    let short = |s: &str| -> String {
        let s = s.trim();
        match s.char_indices().nth(80) {
            Some((i, _)) => format!("{}…", &s[..i]),
            None => s.to_string(),
        }
    };
    match v {
        Value::String(s) => short(s),
        Value::Object(o) => {
            let tool = o
                .get("tool_name")
                .or_else(|| o.get("tool"))
                .and_then(Value::as_str)
                .unwrap_or("tool");
            let input = o.get("tool_input").or_else(|| o.get("input"));
            let what = input
                .and_then(|i| {
                    ["command", "file_path", "path", "filePath"]
                        .iter()
                        .find_map(|k| i.get(*k).and_then(Value::as_str))
                })
                .map(short);
            match what {
                Some(w) => format!("{tool}: {w}"),
                None => tool.to_string(),
            }
        }
        other => short(&other.to_string()),
    }
}

/// Reads the answer, cost, tokens, error and refusals from an agent's stdout. Numbers
/// are added up over every pointer and every document (an event stream reports each
/// step); the answer is the last string found (in documents the filter admits). Output
/// that is not JSON yields nothing.
pub(crate) fn extract(rule: &UsageRule, stdout: &str) -> Usage {
    if rule.is_empty() {
        return Usage::default();
    }
    let docs = documents(rule, stdout);
    let admitted = |f: &Option<Filter>| -> Vec<&Value> {
        docs.iter()
            .filter(|d| f.as_ref().is_none_or(|f| f.admits(d)))
            .collect()
    };
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
        admitted(&rule.text_filter)
            .into_iter()
            .flat_map(|d| resolve(d, p))
            .filter_map(Value::as_str)
            .next_back()
            .map(str::to_string)
    });
    let error = rule.error.as_ref().and_then(|p| {
        admitted(&rule.error_filter)
            .into_iter()
            .flat_map(|d| resolve(d, p))
            .find(|v| truthy(v))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                // `is_error: true`: the answer says what went wrong.
                _ => text
                    .clone()
                    .unwrap_or_else(|| "the agent reported an error".into()),
            })
    });
    let denials = rule.denials.as_ref().map_or_else(Vec::new, |p| {
        admitted(&rule.denials_filter)
            .into_iter()
            .flat_map(|d| resolve(d, p))
            .flat_map(|v| match v {
                Value::Array(a) => a.iter().map(denial_line).collect::<Vec<_>>(),
                Value::Number(n) => match n.as_u64() {
                    Some(0) | None => Vec::new(),
                    Some(k) => vec![format!("{k} failed tool call(s)")],
                },
                v if truthy(v) => vec![denial_line(v)],
                _ => Vec::new(),
            })
            .collect()
    });
    Usage {
        text,
        cost_usd: sum(&rule.cost_usd),
        tokens: sum(&rule.tokens).map(|n| n.max(0.0).round() as u64),
        error,
        denials,
    }
}
