//! Source-span diagnostics: one type for every problem `check` and `run` can report,
//! with a stable kebab-case code, and the four renderings (human, json, github, sarif).

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

mod render;
mod sarif;

use render::{render_github, render_human, render_json};
use sarif::render_sarif;

/// A file that diagnostics point into. `name` is what users see (relative when possible).
#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub path: PathBuf,
    pub text: String,
    /// Byte offsets where lines start, computed on first use (line/column lookups
    /// stay cheap for files with thousands of diagnostics).
    line_starts: std::sync::OnceLock<Vec<usize>>,
}

pub type SourceRef = Arc<Source>;

impl Source {
    pub fn new(
        name: impl Into<String>,
        path: impl Into<PathBuf>,
        text: impl Into<String>,
    ) -> SourceRef {
        Arc::new(Source {
            name: name.into(),
            path: path.into(),
            text: text.into(),
            line_starts: std::sync::OnceLock::new(),
        })
    }

    /// Reads a file, naming it relative to `base` when it lies under it.
    pub fn read(path: &Path, base: &Path) -> std::io::Result<SourceRef> {
        let text = crate::fs_safe::read_to_string(path)?;
        Ok(Source::new(display_name(path, base), path, text))
    }

    /// 1-based line and column (in characters) of a byte offset.
    pub fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = floor_char_boundary(&self.text, offset.min(self.text.len()));
        let starts = self.line_starts.get_or_init(|| {
            std::iter::once(0)
                .chain(self.text.match_indices('\n').map(|(i, _)| i + 1))
                .collect()
        });
        // The last line start at or before `offset`.
        let line = starts.partition_point(|&s| s <= offset).max(1);
        let line_start = starts[line - 1];
        let col = self.text[line_start..offset].chars().count() + 1;
        (line, col)
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `path` relative to `base` when it is under it, else as given.
pub fn display_name(path: &Path, base: &Path) -> String {
    path.strip_prefix(base)
        .ok()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

macro_rules! codes {
    ($($variant:ident = $code:literal: $desc:literal,)*) => {
        /// Every diagnostic code loopflow can emit. The string form is stable: scripts,
        /// SARIF `ruleId`s and suppressions rely on it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code { $($variant,)* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }

            /// One sentence describing the rule, for SARIF and `--help` listings.
            pub fn description(self) -> &'static str {
                match self { $(Code::$variant => $desc,)* }
            }
        }
    };
}

codes! {
    TomlSyntax = "toml-syntax": "The file is not valid TOML.",
    UnknownKey = "unknown-key": "A key that loopflow does not know; it would otherwise be silently ignored.",
    WrongType = "wrong-type": "A value of the wrong type for its key.",
    MissingKey = "missing-key": "A required key is absent.",
    InvalidValue = "invalid-value": "A value of the right type that is out of range or malformed.",
    UnknownNodeKind = "unknown-node-kind": "A node's `kind` is not a built-in node kind.",
    UnknownNeed = "unknown-need": "A `needs` entry names a node that does not exist.",
    DependencyCycle = "dependency-cycle": "Nodes depend on each other in a cycle, so none of them can start.",
    VerdictNotUpstream = "verdict-not-upstream": "A verdict node reads a node that does not run before it.",
    UnknownVariable = "unknown-variable": "A template uses a variable that does not exist.",
    VariableNotAvailable = "variable-not-available": "A template uses a variable that is not yet produced at that point of the DAG.",
    TemplateSyntax = "template-syntax": "A template is not valid handlebars.",
    MissingRole = "missing-role": "A harness node's role has no `[roles.<role>]` table in loop.toml.",
    MissingPrompt = "missing-prompt": "A role's prompt file does not exist.",
    MissingFile = "missing-file": "A file that is named (a loop's pipeline, a path given to check) cannot be read.",
    NoCommit = "no-commit": "No `commit` node is reachable, so a tick could never advance the loop.",
    EmptyArgv = "empty-argv": "A command is an empty list, so there is nothing to run.",
    ModelNotPassed = "model-not-passed": "Implement and verify name different models but the harness command never passes `{{model}}`.",
    LegacyPlaceholder = "legacy-placeholder": "A single-brace `{name}` token from the predecessor's syntax; it is passed through literally.",
    UnreachableNode = "unreachable-node": "A node with no path to or from any `commit` node; its result never matters.",
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem, pointing at an exact byte span of a source file.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub source: SourceRef,
    pub span: Range<usize>,
    pub severity: Severity,
    pub code: Code,
    pub message: String,
    pub label: String,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(
        code: Code,
        source: &SourceRef,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            source: source.clone(),
            span,
            severity: Severity::Error,
            code,
            message: message.into(),
            label: String::new(),
            help: None,
        }
    }

    pub fn warning(
        code: Code,
        source: &SourceRef,
        span: Range<usize>,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            ..Diagnostic::error(code, source, span, message)
        }
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = label.into();
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    pub fn start(&self) -> (usize, usize) {
        self.source.line_col(self.span.start)
    }

    pub fn end(&self) -> (usize, usize) {
        self.source.line_col(self.span.end)
    }
}

/// Collects diagnostics across files; the order of insertion is kept for display.
#[derive(Debug, Default)]
pub struct Diagnostics {
    pub items: Vec<Diagnostic>,
    /// (code, span, source) of every item, so deduplication stays linear.
    seen: std::collections::HashSet<(Code, usize, usize, usize)>,
}

impl Diagnostics {
    pub fn push(&mut self, d: Diagnostic) {
        // One report per problem at the same characters: a template shared by several
        // nodes (`[harness] command`) is reported for the first node it fails at.
        let key = (
            d.code,
            d.span.start,
            d.span.end,
            Arc::as_ptr(&d.source) as usize,
        );
        if self.seen.insert(key) {
            self.items.push(d);
        }
    }

    pub fn extend(&mut self, other: Diagnostics) {
        for d in other.items {
            self.push(d);
        }
    }

    pub fn has_errors(&self) -> bool {
        self.items.iter().any(Diagnostic::is_error)
    }

    pub fn error_count(&self) -> usize {
        self.items.iter().filter(|d| d.is_error()).count()
    }

    pub fn warning_count(&self) -> usize {
        self.items.len() - self.error_count()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Sorts by file, then position, so output is stable however checks were ordered.
    pub fn sort(&mut self) {
        self.items.sort_by(|a, b| {
            (&a.source.name, a.span.start, a.span.end).cmp(&(
                &b.source.name,
                b.span.start,
                b.span.end,
            ))
        });
    }
}

/// Output format of `check` (and of configuration errors reported by `run`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
    Github,
    Sarif,
}

/// Renders diagnostics in the chosen format. `color` applies to `human` only.
pub fn render(diags: &Diagnostics, format: Format, color: bool) -> String {
    match format {
        Format::Human => render_human(diags, color),
        Format::Json => render_json(diags),
        Format::Github => render_github(diags),
        Format::Sarif => render_sarif(diags),
    }
}

/// Edit distance, for "did you mean" suggestions.
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The closest candidate within a small edit distance, if any.
pub fn suggest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < c.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "`a`, `b` and `c`"
pub fn list(items: &[impl AsRef<str>]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("`{}`", s.as_ref())).collect();
    match quoted.len() {
        0 => "none".to_string(),
        1 => quoted[0].clone(),
        n => format!("{} and {}", quoted[..n - 1].join(", "), quoted[n - 1]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_is_one_based_and_counts_chars() {
        let s = Source::new("f", "f", "ab\ncé d");
        assert_eq!(s.line_col(0), (1, 1));
        assert_eq!(s.line_col(3), (2, 1));
        assert_eq!(s.line_col(7), (2, 4));
    }

    #[test]
    fn suggestions_are_close_only() {
        assert_eq!(
            suggest("implemnt", ["gate", "implement"]),
            Some("implement")
        );
        assert_eq!(suggest("zzz", ["gate", "implement"]), None);
    }
}
