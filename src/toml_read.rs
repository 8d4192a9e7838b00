//! Reading TOML with spans kept on every key and value, pushing every problem (wrong type,
//! unknown key with a suggestion, missing key) into a diagnostics list instead of stopping
//! at the first one. Built on `toml::de::DeTable`, which keeps spans everywhere. The
//! value shapes loopflow's files share (argv templates, durations) are read here too.

use std::ops::Range;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::diag::{Code, Diagnostic, Diagnostics, SourceRef, suggest};
use crate::template::Tmpl;

/// A string value with the span of its TOML literal (quotes included).
#[derive(Debug, Clone, PartialEq)]
pub struct Str {
    pub value: String,
    pub span: Range<usize>,
}

mod resync;

/// Parses a document, reporting every syntax error once (see [`resync`]). Returns `None`
/// when it has any.
pub(crate) fn parse<'s>(
    source: &'s SourceRef,
    diags: &mut Diagnostics,
) -> Option<Spanned<DeTable<'s>>> {
    let (table, errors) = DeTable::parse_recoverable(&source.text);
    if errors.is_empty() {
        return Some(table);
    }
    report(source, resync::resync(&source.text, errors).0, diags);
    None
}

fn report(source: &SourceRef, errors: Vec<resync::Found>, diags: &mut Diagnostics) {
    for e in errors {
        let (first, rest) = e.message.split_once('\n').unwrap_or((&e.message, ""));
        let mut d = Diagnostic::error(
            Code::TomlSyntax,
            source,
            e.span,
            format!("invalid TOML: {first}"),
        )
        .label(first.to_string());
        let rest = rest.trim();
        d = d.help(if rest.is_empty() {
            "fix the TOML syntax; loopflow files are TOML 1.0 (what this error breaks is left out of the other checks until it is fixed)".to_string()
        } else {
            rest.to_string()
        });
        diags.push(d);
    }
}

/// Parses a document as far as it goes: each syntax error is reported once, and the table
/// comes back even when there were some, read from the text without the statements they
/// broke ([`resync`]: the parser's guesses past an error would be reported as wrong
/// types or unknown keys). `.1` is whether there were syntax errors: checks of what seems
/// *absent* then say nothing, see [`Diagnostics::drop_syntax_echoes`].
pub(crate) fn parse_partial<'s>(
    source: &'s SourceRef,
    diags: &mut Diagnostics,
) -> (Spanned<DeTable<'s>>, bool) {
    diags.scan_ignores(source);
    let (table, errors) = DeTable::parse_recoverable(&source.text);
    if errors.is_empty() {
        return (table, false);
    }
    let (found, resynced) = resync::resync(&source.text, errors);
    report(source, found, diags);
    let text = source.resynced(resynced);
    let (mut table, left) = DeTable::parse_recoverable(text);
    // Past the most errors reported, what still fails is left out as before.
    if !left.is_empty() {
        let spans: Vec<Range<usize>> = left.iter().map(|e| e.span().unwrap_or(0..0)).collect();
        strip(table.get_mut(), text, &spans);
    }
    (table, true)
}

/// Whether a value spanning `v` is touched by a syntax error (an empty error span is a
/// point; one at the value's end counts, e.g. an unclosed string).
fn touched(v: &Range<usize>, errors: &[Range<usize>]) -> bool {
    v.is_empty()
        || errors.iter().any(|e| {
            if e.is_empty() {
                v.start <= e.start && e.start <= v.end
            } else {
                e.start < v.end && v.start < e.end
            }
        })
}

/// Removes every value a syntax error touches, recursing into `[table]`s (whose span is
/// only their header) and dropping inline tables and arrays whole.
fn strip(t: &mut DeTable<'_>, text: &str, errors: &[Range<usize>]) {
    for (k, mut v) in std::mem::take(t) {
        let span = v.span();
        let inline = text.get(span.start..).is_some_and(|s| s.starts_with('{'));
        let keep = match v.get_mut() {
            DeValue::Table(sub) if !inline => {
                strip(sub, text, errors);
                true
            }
            _ => !touched(&span, errors),
        };
        if keep {
            t.insert(k, v);
        }
    }
}

/// A view of one table being read: `path` is its dotted name (for messages).
pub struct Table<'a, 's> {
    pub source: &'a SourceRef,
    pub table: &'a DeTable<'s>,
    pub span: Range<usize>,
    pub path: String,
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    match v {
        DeValue::String(_) => "a string",
        DeValue::Integer(_) => "an integer",
        DeValue::Float(_) => "a float",
        DeValue::Boolean(_) => "a boolean",
        DeValue::Datetime(_) => "a datetime",
        DeValue::Array(_) => "an array",
        DeValue::Table(_) => "a table",
    }
}

impl<'a, 's> Table<'a, 's> {
    pub fn new(
        source: &'a SourceRef,
        table: &'a DeTable<'s>,
        span: Range<usize>,
        path: impl Into<String>,
    ) -> Self {
        Table {
            source,
            table,
            span,
            path: path.into(),
        }
    }

    fn dotted(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            [self.path.as_str(), ".", key].concat()
        }
    }

    pub fn get(&self, key: &str) -> Option<&'a Spanned<DeValue<'s>>> {
        self.entry(key).map(|(_, v)| v)
    }

    pub fn key_span(&self, key: &str) -> Option<Range<usize>> {
        self.entry(key).map(|(k, _)| k.span())
    }

    /// The entry of `key`. A small table (every table of a `loop.toml` is: a dozen keys
    /// at most) is scanned: comparing a few short keys costs less than hashing one, even
    /// with foldhash (toml's `fast_hash`), and `status`/`report` look up every key of
    /// every loop's tables (0.7% of `report`'s instructions against `get_key_value`).
    fn entry(
        &self,
        key: &str,
    ) -> Option<(
        &'a Spanned<std::borrow::Cow<'s, str>>,
        &'a Spanned<DeValue<'s>>,
    )> {
        if self.table.len() <= 16 {
            self.table.iter().find(|(k, _)| k.get_ref().as_ref() == key)
        } else {
            self.table.get_key_value(key)
        }
    }

    /// The span to point at for "this table": its header or inline braces.
    pub fn header_span(&self) -> Range<usize> {
        self.span.clone()
    }

    /// Reports every key not in `known`, suggesting the closest known one.
    pub fn deny_unknown(&self, known: &[&str], diags: &mut Diagnostics) {
        for (k, _) in self.table.iter() {
            let name: &str = k.get_ref();
            if known.contains(&name) {
                continue;
            }
            // A key is user text of any size: quote at most 80 characters of it, and
            // look for a near miss only among names of a plausible length.
            const SHOWN: usize = 80;
            let dotted = self.dotted(name);
            let shown = match dotted.char_indices().nth(SHOWN) {
                Some((i, _)) => format!("{}…", &dotted[..i]),
                None => dotted,
            };
            let mut d = Diagnostic::error(
                Code::UnknownKey,
                self.source,
                k.span(),
                format!("unknown key `{shown}`"),
            )
            .label("not a key loopflow knows here");
            let near = (name.len() <= SHOWN)
                .then(|| suggest(name, known.iter().copied()))
                .flatten();
            d = match near {
                Some(s) => d.help(format!(
                    "did you mean `{s}`? Known keys here: {}",
                    known.join(", ")
                )),
                None => d.help(format!("remove it; known keys here: {}", known.join(", "))),
            };
            diags.push(d);
        }
    }

    fn wrong_type(
        &self,
        key: &str,
        v: &Spanned<DeValue<'_>>,
        expected: &str,
        diags: &mut Diagnostics,
    ) {
        diags.push(
            Diagnostic::error(
                Code::WrongType,
                self.source,
                v.span(),
                format!(
                    "`{}` must be {expected}, found {}",
                    self.dotted(key),
                    type_name(v.get_ref())
                ),
            )
            .label(format!("expected {expected}"))
            .help(format!("write `{key}` as {expected}")),
        );
    }

    pub fn missing(&self, key: &str, example: &str, diags: &mut Diagnostics) {
        let what = if self.path.is_empty() {
            "the file".to_string()
        } else {
            format!("`[{}]`", self.path)
        };
        diags.push(
            Diagnostic::error(
                Code::MissingKey,
                self.source,
                self.header_span(),
                format!("missing required key `{}`", self.dotted(key)),
            )
            .label(format!("{what} needs `{key}`"))
            .help(format!("add `{example}`")),
        );
    }

    pub fn str(&self, key: &str, diags: &mut Diagnostics) -> Option<Str> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::String(s) => Some(Str {
                value: s.to_string(),
                span: v.span(),
            }),
            _ => {
                self.wrong_type(key, v, "a string", diags);
                None
            }
        }
    }

    pub fn bool(&self, key: &str, diags: &mut Diagnostics) -> Option<bool> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            _ => {
                self.wrong_type(key, v, "a boolean (true or false)", diags);
                None
            }
        }
    }

    /// A non-negative integer.
    pub fn uint(&self, key: &str, diags: &mut Diagnostics) -> Option<(u64, Range<usize>)> {
        let v = self.get(key)?;
        if let DeValue::Integer(i) = v.get_ref()
            && let Ok(n) = u64::from_str_radix(i.as_str(), i.radix())
        {
            return Some((n, v.span()));
        }
        self.wrong_type(key, v, "a non-negative integer", diags);
        None
    }

    /// A number (integer or float).
    pub fn number(&self, key: &str, diags: &mut Diagnostics) -> Option<(f64, Range<usize>)> {
        let v = self.get(key)?;
        match v.get_ref() {
            DeValue::Integer(i) => {
                if let Ok(n) = i64::from_str_radix(i.as_str(), i.radix()) {
                    return Some((n as f64, v.span()));
                }
            }
            DeValue::Float(f) => {
                if let Ok(n) = f.as_str().replace('_', "").parse::<f64>()
                    && n.is_finite()
                {
                    return Some((n, v.span()));
                }
            }
            _ => {}
        }
        self.wrong_type(key, v, "a number", diags);
        None
    }

    /// A list of strings; each element keeps its own span.
    pub fn str_list(&self, key: &str, diags: &mut Diagnostics) -> Option<(Vec<Str>, Range<usize>)> {
        let v = self.get(key)?;
        let DeValue::Array(items) = v.get_ref() else {
            if let DeValue::String(s) = v.get_ref() {
                // The commonest slip: one name without the brackets.
                diags.push(
                    Diagnostic::error(
                        Code::WrongType,
                        self.source,
                        v.span(),
                        format!(
                            "`{}` must be a list of strings, found a string",
                            self.dotted(key)
                        ),
                    )
                    .label("expected a list of strings")
                    .help(format!("put it in brackets: `{key} = [{:?}]`", s.as_ref())),
                );
                return None;
            }
            self.wrong_type(key, v, "a list of strings", diags);
            return None;
        };
        let mut out = Vec::new();
        let mut ok = true;
        for item in items.iter() {
            match item.get_ref() {
                DeValue::String(s) => out.push(Str {
                    value: s.to_string(),
                    span: item.span(),
                }),
                other => {
                    ok = false;
                    diags.push(
                        Diagnostic::error(
                            Code::WrongType,
                            self.source,
                            item.span(),
                            format!(
                                "`{}` must be a list of strings, found {} in it",
                                self.dotted(key),
                                type_name(other)
                            ),
                        )
                        .label("expected a string")
                        .help("quote the element"),
                    );
                }
            }
        }
        ok.then_some((out, v.span()))
    }

    pub fn table(&self, key: &str, diags: &mut Diagnostics) -> Option<Table<'a, 's>> {
        let (k, v) = self.entry(key)?;
        match v.get_ref() {
            DeValue::Table(t) => Some(Table::new(self.source, t, k.span(), self.dotted(key))),
            _ => {
                self.wrong_type(key, v, "a table", diags);
                None
            }
        }
    }

    /// Every entry of a table of tables (e.g. `[nodes.*]`), as (key, table).
    pub fn subtables(&self, diags: &mut Diagnostics) -> Vec<(Str, Table<'a, 's>)> {
        let mut out = Vec::new();
        for (k, v) in self.table.iter() {
            let name: &str = k.get_ref();
            match v.get_ref() {
                DeValue::Table(t) => out.push((
                    Str {
                        value: name.to_string(),
                        span: k.span(),
                    },
                    Table::new(self.source, t, k.span(), self.dotted(name)),
                )),
                _ => self.wrong_type(name, v, "a table", diags),
            }
        }
        out
    }
}

impl Table<'_, '_> {
    /// A command: a non-empty list of templates, one argv element each.
    pub fn argv(&self, key: &str, diags: &mut Diagnostics) -> Option<Vec<Tmpl>> {
        let (items, span) = self.str_list(key, diags)?;
        if items.is_empty() {
            diags.push(empty_argv(self.source, span, &self.dotted(key)));
            return None;
        }
        Some(
            items
                .iter()
                .map(|s| Tmpl::literal(self.source, &s.value, s.span.clone()))
                .collect(),
        )
    }

    /// A list of templates that may be empty (`model_args`).
    pub fn templates(&self, key: &str, diags: &mut Diagnostics) -> Option<Vec<Tmpl>> {
        self.str_list(key, diags).map(|(v, _)| {
            v.iter()
                .map(|s| Tmpl::literal(self.source, &s.value, s.span.clone()))
                .collect()
        })
    }

    /// A `timeout`-like key: a duration longer than zero.
    pub fn duration(&self, key: &str, diags: &mut Diagnostics) -> Option<std::time::Duration> {
        let s = self.str(key, diags)?;
        match crate::duration::parse_duration(&s.value) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        self.source,
                        s.span,
                        format!("`{key}` must be longer than zero"),
                    )
                    .label("zero")
                    .help("use a duration such as \"90s\", \"30m\" or \"1h30m\""),
                );
                None
            }
            Err(e) => {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        self.source,
                        s.span,
                        format!("invalid duration for `{key}`: {e}"),
                    )
                    .label("not a duration")
                    .help("use a duration such as \"90s\", \"30m\" or \"1h30m\""),
                );
                None
            }
        }
    }
}

impl Table<'_, '_> {
    /// Every entry of a table of scalars (strings, booleans, numbers) as JSON values,
    /// for filters like `{ "/type" = "text" }`.
    pub fn scalars(&self, diags: &mut Diagnostics) -> Vec<(Str, serde_json::Value)> {
        let mut out = Vec::new();
        for (k, v) in self.table.iter() {
            let key = Str {
                value: k.get_ref().to_string(),
                span: k.span(),
            };
            let value = match v.get_ref() {
                DeValue::String(s) => Some(serde_json::Value::from(s.to_string())),
                DeValue::Boolean(b) => Some(serde_json::Value::from(*b)),
                DeValue::Integer(i) => i64::from_str_radix(i.as_str(), i.radix())
                    .ok()
                    .map(serde_json::Value::from),
                DeValue::Float(f) => f
                    .as_str()
                    .replace('_', "")
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(serde_json::Value::Number),
                _ => None,
            };
            match value {
                Some(v) => out.push((key, v)),
                None => self.wrong_type(&key.value, v, "a string, boolean or number", diags),
            }
        }
        out
    }
}

/// `key` is an empty command.
pub(crate) fn empty_argv(source: &SourceRef, span: Range<usize>, key: &str) -> Diagnostic {
    Diagnostic::error(Code::EmptyArgv, source, span, format!("`{key}` is empty"))
        .label("nothing to run")
        .help("give the program and its arguments, e.g. [\"cargo\", \"test\"]")
}
