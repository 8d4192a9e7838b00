//! Source-span diagnostics: one type for every problem `check` and `run` can report,
//! with a stable kebab-case code, and the four renderings (human, json, github, sarif).

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

mod ignore;
mod render;
mod sarif;

use render::{render_github, render_human, render_json};
pub(crate) use sarif::render_sarif;

/// A file that diagnostics point into. `name` is what users see (relative when possible).
#[derive(Debug)]
pub struct Source {
    pub name: String,
    pub path: PathBuf,
    pub text: String,
    /// Byte offsets where lines start, computed on first use (line/column lookups
    /// stay cheap for files with thousands of diagnostics).
    line_starts: std::sync::OnceLock<Vec<usize>>,
    /// Set when this text was converted from another (a predecessor's `loop.json`
    /// rewritten as TOML): diagnostics about it are shown in the original.
    pub origin: Option<Origin>,
    /// The text read in place of `text` when it has TOML syntax errors: the statements
    /// they broke blanked out (same length, same lines), so what is left is read as
    /// written instead of as the parser's guesses.
    resynced: std::sync::OnceLock<String>,
}

/// Pairs of (span in a converted text, span in its original).
pub(crate) type SpanPairs = Vec<(Range<usize>, Range<usize>)>;

/// The file a converted text came from, and which of its pieces became which: one pair
/// per key and per value, made by `pair(original, converted)` the first time a finding
/// needs them (a clean load never does).
#[derive(Debug)]
pub struct Origin {
    pub source: SourceRef,
    pair: fn(&str, &str) -> SpanPairs,
    spans: std::sync::OnceLock<SpanPairs>,
}

impl Origin {
    pub fn new(source: SourceRef, pair: fn(&str, &str) -> SpanPairs) -> Origin {
        Origin {
            source,
            pair,
            spans: std::sync::OnceLock::new(),
        }
    }

    /// Where a span of the converted text came from: the innermost piece that holds all
    /// of it (else its start) — the same place within a string written alike in both
    /// files, else the whole piece — or the start of the original when nothing holds it.
    pub fn map(&self, span: &Range<usize>, converted: &str) -> Range<usize> {
        let spans = self
            .spans
            .get_or_init(|| (self.pair)(&self.source.text, converted));
        let innermost = |all: bool| {
            spans
                .iter()
                .filter(|(c, _)| {
                    c.start <= span.start
                        && (span.start < c.end || c == span)
                        && (!all || span.end <= c.end)
                })
                .min_by_key(|(c, _)| c.len())
        };
        // A finding about the whole file (its first line, or the empty span at its start)
        // is about no piece: the original's start.
        let all = innermost(true);
        let whole_file = span.start == 0 && (span.is_empty() || all.is_none());
        let holding = all.or_else(|| innermost(false));
        let (Some((c, o)), false) = (holding, whole_file) else {
            return 0..0;
        };
        let (ct, ot) = (converted.get(c.clone()), self.source.text.get(o.clone()));
        if c != span && span.end <= c.end && ct.is_some() && ct == ot {
            let shift = |i: usize| o.start + (i - c.start);
            return shift(span.start)..shift(span.end);
        }
        o.clone()
    }
}

pub(crate) type SourceRef = Arc<Source>;

impl Source {
    pub fn new(
        name: impl Into<String>,
        path: impl Into<PathBuf>,
        text: impl Into<String>,
    ) -> SourceRef {
        Source::made(name.into(), path.into(), text.into(), None)
    }

    /// A text converted from `origin.source`, read as itself and named as that file:
    /// findings about it are reported there (see [`Diagnostics::finish`]).
    pub fn converted(text: impl Into<String>, origin: Origin) -> SourceRef {
        let (name, path) = (origin.source.name.clone(), origin.source.path.clone());
        Source::made(name, path, text.into(), Some(origin))
    }

    fn made(name: String, path: PathBuf, text: String, origin: Option<Origin>) -> SourceRef {
        Arc::new(Source {
            name,
            path,
            text,
            line_starts: std::sync::OnceLock::new(),
            origin,
            resynced: std::sync::OnceLock::new(),
        })
    }

    /// Keeps `resynced` (see the field) for as long as the source lives; the first one
    /// set stays (the same text gives the same one).
    pub fn resynced(&self, resynced: String) -> &str {
        self.resynced.get_or_init(|| resynced)
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

/// The byte offset of a 1-based `line` and byte `column` (as parsers outside loopflow
/// count them: serde_json, handlebars), kept within that line and on a character
/// boundary; past the last line, the end of the text.
pub(crate) fn offset_of(text: &str, line: usize, column: usize) -> usize {
    let start: usize = text
        .split_inclusive('\n')
        .take(line.saturating_sub(1))
        .map(str::len)
        .sum();
    let line_len = text[start..]
        .split_inclusive('\n')
        .next()
        .map_or(0, str::len);
    floor_char_boundary(
        text,
        (start + column.saturating_sub(1)).min(start + line_len),
    )
}

/// `path` relative to `base` when it is under it, else as given.
pub(crate) fn display_name(path: &Path, base: &Path) -> String {
    // Both plain UTF-8 without `.`, empty or trailing components (nearly always): their
    // components are the `/`-separated pieces, so a byte prefix is a component prefix.
    #[cfg(unix)]
    if let (Some(p), Some(b)) = (path.to_str(), base.to_str())
        && plain_path(p)
        && plain_path(b)
    {
        return p
            .strip_prefix(b)
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|rest| !rest.is_empty())
            .unwrap_or(p)
            .to_owned();
    }
    path.strip_prefix(base)
        .ok()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A path whose components are exactly its `/`-separated pieces: no empty, `.` or
/// trailing component for [`Path::components`] to drop.
#[cfg(unix)]
fn plain_path(s: &str) -> bool {
    // One pass: only the root may be empty, no piece may be `.`.
    !s.is_empty()
        && s.as_bytes()
            .split(|&c| c == b'/')
            .enumerate()
            .all(|(i, piece)| (i == 0 || !piece.is_empty()) && piece != b".")
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
    ($($variant:ident = $code:literal, ignorable: $ign:literal,
        $desc:literal, $fix:literal,)*) => {
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

            /// How to fix a finding of this rule in general (each diagnostic's own
            /// `help:` line says it for the case at hand). SARIF's `help`.
            pub fn fix(self) -> &'static str {
                match self { $(Code::$variant => $fix,)* }
            }

            /// Whether `# loopflow: ignore[code]` may silence it: warnings, and errors
            /// that leave a file loopflow can still run as written. An error that would
            /// make `run` guess (a dropped value, a missing node) cannot be ignored.
            pub fn ignorable(self) -> bool {
                match self { $(Code::$variant => $ign,)* }
            }

            pub fn parse(s: &str) -> Option<Code> {
                Code::ALL.iter().copied().find(|c| c.as_str() == s)
            }
        }
    };
}

codes! {
    TomlSyntax = "toml-syntax", ignorable: false,
        "The file is not valid TOML.",
        "Fix the syntax at the position shown (an unclosed string, bracket or table header, a missing `=` or comma). loopflow files are TOML 1.0.",
    UnknownKey = "unknown-key", ignorable: true,
        "A key that loopflow does not know; it would otherwise be silently ignored.",
        "Fix the spelling (the help line suggests the nearest known key) or remove the key. A key kept on purpose can be silenced with `# loopflow: ignore[unknown-key]` on the line above.",
    WrongType = "wrong-type", ignorable: false,
        "A value of the wrong type for its key.",
        "Write the value with the type the key takes: quote strings, bracket lists, use `true`/`false` for booleans and bare numbers for integers.",
    MissingKey = "missing-key", ignorable: false,
        "A required key is absent.",
        "Add the key to the table named in the message; the help line gives an example value.",
    InvalidValue = "invalid-value", ignorable: false,
        "A value of the right type that is out of range or malformed.",
        "Use a value in the range the message gives (durations such as \"30m\", globs such as \"src/**\", known preset names).",
    TooManyNodes = "too-many-nodes", ignorable: false,
        "The pipeline has more nodes than loopflow accepts (20,000).",
        "Split the work into several pipelines or loops, or generate fewer nodes; nothing of a bigger file is checked or run.",
    UnknownNodeKind = "unknown-node-kind", ignorable: false,
        "A node's `kind` is not a built-in node kind.",
        "Set `kind` to one of gate, floor-check, harness, command, verdict, commit or git-commit.",
    UnknownNeed = "unknown-need", ignorable: false,
        "A `needs` entry names a node that does not exist.",
        "Name the id of a node of the same pipeline (the `<id>` of its `[nodes.<id>]` table), or remove the entry.",
    DependencyCycle = "dependency-cycle", ignorable: false,
        "Nodes depend on each other in a cycle, so none of them can start.",
        "Remove one `needs` entry among the nodes the message names, so every node waits only for nodes that run before it.",
    VerdictNotUpstream = "verdict-not-upstream", ignorable: false,
        "A verdict node reads a node that does not run before it.",
        "Add the node that `from` names to the verdict node's `needs`, directly or through another node.",
    UnknownVariable = "unknown-variable", ignorable: false,
        "A template uses a variable that does not exist.",
        "Fix the variable's name (the help line lists what is available at that node); `nodes.<id>.<field>` needs an existing node and one of stdout_path, exit_code, output.",
    VariableNotAvailable = "variable-not-available", ignorable: false,
        "A template uses a variable that is not yet produced at that point of the DAG.",
        "Make the node that produces it run first (add it to `needs`), or use the variable only in nodes downstream of it.",
    TemplateSyntax = "template-syntax", ignorable: false,
        "A template is not valid handlebars.",
        "Close every `{{#if}}`/`{{#each}}` block with its `{{/if}}`/`{{/each}}` and balance the braces; only the helpers eq, ne, gt, lt, and, or, not exist.",
    MissingRole = "missing-role", ignorable: false,
        "A harness node's role has no `[roles.<role>]` table in loop.toml.",
        "Add `[roles.<role>]` with a `prompt` to loop.toml, or change the node's `role` to a configured one.",
    UnusedRole = "unused-role", ignorable: true,
        "A `[roles.<name>]` table that no node of the loop's pipeline runs: its settings (`model`, `prompt`, `command`, …) never take effect. An error when its name is a near miss of a role that runs (a typo), else a warning.",
        "Fix the table's name (the help line suggests the role meant) or move its keys into that role's table, or remove it. A table kept for another pipeline (`run PIPELINE`) can be silenced with `# loopflow: ignore[unused-role]` on the line above.",
    MissingPrompt = "missing-prompt", ignorable: false,
        "A role's prompt file does not exist.",
        "Create the file or fix the path; relative paths resolve against the directory of loop.toml.",
    MissingFile = "missing-file", ignorable: false,
        "A file that is named (a loop's pipeline, a path given to check) cannot be read.",
        "Fix the path or the file's permissions; loopflow files are UTF-8 text.",
    NoCommit = "no-commit", ignorable: false,
        "No `commit` node is reachable, so a tick could never advance the loop.",
        "Add a `[nodes.commit]` table with `kind = \"commit\"` as the pipeline's last node.",
    EmptyArgv = "empty-argv", ignorable: false,
        "A command is an empty list, so there is nothing to run.",
        "Give the program and its arguments, e.g. `[\"cargo\", \"test\"]`, or remove the key to use the default.",
    PresetWithCommand = "preset-with-command", ignorable: false,
        "A table sets both `preset` and `command`; the command would silently replace the preset's.",
        "Keep `preset` to run that agent as shipped (its argv, prompt on stdin, sandbox paths, usage), or write your own `command` and remove `preset`.",
    ModelNotPassed = "model-not-passed", ignorable: true,
        "Implement and verify name different models but the harness command never passes `{{model}}`.",
        "Add the agent's model flag with `{{model}}` to the command (e.g. `\"--model\", \"{{model}}\"`), or use a preset, whose `model_args` pass it. When the agent takes the model from elsewhere, ignore the rule on that line.",
    LegacyPlaceholder = "legacy-placeholder", ignorable: true,
        "A single-brace `{name}` token from the predecessor's syntax; it is passed through literally.",
        "Write `{{name}}` (double braces) to substitute the variable, or ignore the rule where the braces are meant literally.",
    UnreachableNode = "unreachable-node", ignorable: true,
        "A node with no path to or from any `commit` node; its result never matters.",
        "Connect the node (add it to the `needs` of a node on the way to `commit`) or remove it.",
    UnusedIgnore = "unused-ignore", ignorable: false,
        "A `# loopflow: ignore[code]` comment that silences nothing: the code is misspelt, cannot be ignored, or nothing on the next line reports it.",
        "Remove the comment, fix the code's spelling, or move it to the line directly above the finding.",
}

impl Code {
    /// Findings that something is missing: unreliable in a file that did not fully parse.
    fn is_absence(self) -> bool {
        matches!(
            self,
            Code::MissingKey
                | Code::UnknownNeed
                | Code::NoCommit
                | Code::UnreachableNode
                | Code::VariableNotAvailable
                | Code::VerdictNotUpstream
                | Code::MissingRole
        )
    }
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
    /// The `# loopflow: ignore[…]` comments of the files read, applied by `finish`.
    ignores: Vec<ignore::Ignore>,
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
        self.ignores.extend(other.ignores);
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

    /// Once every check ran: drops the echoes of syntax errors, then sorts. What `check`
    /// prints and `run` refuses is what is left.
    pub fn finish(&mut self) {
        self.drop_syntax_echoes();
        ignore::apply(&mut self.items, &mut self.ignores);
        self.ignores.clear();
        // Findings in a converted text point into the file the user wrote.
        for d in &mut self.items {
            if let Some(origin) = &d.source.origin {
                let span = origin.map(&d.span, &d.source.text);
                let source = origin.source.clone();
                d.span = span;
                d.source = source;
            }
        }
        self.sort();
    }

    /// Notes the ignore comments of a file that is being checked (TOML files: loop.toml
    /// and pipelines).
    pub fn scan_ignores(&mut self, source: &SourceRef) {
        self.ignores.extend(ignore::scan(source));
    }

    /// A file with a syntax error is checked as far as it parses, so what seems *absent*
    /// (a required key, a node that `needs` names, an edge a template relies on) may sit
    /// in the part that did not parse: such findings are dropped for that file. What is
    /// there and wrong (an unknown key, a wrong type, a cycle, a bad template) stays.
    pub fn drop_syntax_echoes(&mut self) {
        let broken: std::collections::HashSet<usize> = self
            .items
            .iter()
            .filter(|d| d.code == Code::TomlSyntax)
            .map(|d| Arc::as_ptr(&d.source) as usize)
            .collect();
        if broken.is_empty() {
            return;
        }
        self.items.retain(|d| {
            !(broken.contains(&(Arc::as_ptr(&d.source) as usize)) && d.code.is_absence())
        });
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
pub(crate) enum Format {
    Human,
    Json,
    Github,
    Sarif,
}

/// Renders diagnostics in the chosen format. `color` applies to `human` only.
pub(crate) fn render(diags: &Diagnostics, format: Format, color: bool) -> String {
    match format {
        Format::Human => render_human(diags, color),
        Format::Json => render_json(diags),
        Format::Github => render_github(diags),
        Format::Sarif => render_sarif(diags, &std::env::current_dir().unwrap_or_default()),
    }
}

/// Edit distance, for "did you mean" suggestions.
pub(crate) fn levenshtein(a: &str, b: &str) -> usize {
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
pub(crate) fn suggest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3) && *d < c.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "`a`, `b` and `c`"
pub(crate) fn list(items: &[impl AsRef<str>]) -> String {
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
    fn a_converted_span_maps_to_its_piece_in_the_original() {
        let original = Source::new("o", "o", r#"{"a": "x{{y}}", "b": "p\u0071"}"#);
        let converted = "a = \"x{{y}}\"\nb = \"pq\"\n";
        let origin = Origin::new(original.clone(), |_, _| {
            vec![
                (0..1, 1..4),
                (4..12, 6..14),
                (13..14, 16..19),
                (17..21, 21..30),
            ]
        });
        // A whole value, a piece of a string written alike, of one written differently.
        assert_eq!(origin.map(&(4..12), converted), 6..14);
        assert_eq!(&original.text[origin.map(&(7..10), converted)], "{y}");
        assert_eq!(origin.map(&(18..19), converted), 21..30);
        // A span over two pieces maps to the piece holding both (here none: the first).
        assert_eq!(origin.map(&(4..14), converted), 6..14);
        // A key; and nothing holds the span: the original's start.
        assert_eq!(origin.map(&(0..1), converted), 1..4);
        assert_eq!(origin.map(&(40..41), converted), 0..0);
        // The whole file (its first line, the empty span at its start): its start too.
        assert_eq!(origin.map(&(0..12), converted), 0..0);
        assert_eq!(origin.map(&(0..0), converted), 0..0);
    }

    #[test]
    fn display_name_agrees_with_component_stripping() {
        let slow = |p: &str, b: &str| {
            let (p, b) = (Path::new(p), Path::new(b));
            p.strip_prefix(b)
                .ok()
                .filter(|r| !r.as_os_str().is_empty())
                .unwrap_or(p)
                .display()
                .to_string()
        };
        let cases = [
            ("/p/loop.toml", "/p"),
            ("/p/a/b.md", "/p/a"),
            ("/p/ab.md", "/p/a"),
            ("/p", "/p"),
            ("/p/x", "/"),
            ("/p//x", "/p"),
            ("/p/./x", "/p"),
            ("/p/x/", "/p"),
            ("/p/x/.", "/p"),
            ("./x", "."),
            ("x/y", "x"),
            ("x", "/p"),
            ("/p/../q", "/p"),
            ("/p/x", "/p/"),
            ("/p/x", ""),
        ];
        for (p, b) in cases {
            assert_eq!(
                display_name(Path::new(p), Path::new(b)),
                slow(p, b),
                "{p} from {b}"
            );
        }
    }

    #[test]
    fn offset_of_stays_in_its_line_and_on_a_character() {
        let t = "ab\nc日d\n";
        assert_eq!(offset_of(t, 1, 1), 0);
        assert_eq!(offset_of(t, 2, 2), 4);
        // Inside `日` (bytes 4..7): the character's start.
        assert_eq!(offset_of(t, 2, 3), 4);
        // Past the line's end: its end, not the next line.
        assert_eq!(offset_of(t, 1, 40), 3);
        // Past the last line: the text's end.
        assert_eq!(offset_of(t, 9, 1), t.len());
    }

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
