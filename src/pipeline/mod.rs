//! Pipeline files (DESIGN §3): TOML with spans → a [`Draft`] of nodes → a validated
//! [`Pipeline`] whose DAG always exists. Every problem is collected (syntax, keys, kinds,
//! needs, cycles, verdict sources, templates, commit reachability) so `check` reports all
//! of them at once.

use std::ops::Range;
use std::time::Duration;

use indexmap::IndexMap;

use crate::diag::{Diagnostics, SourceRef};
use crate::node::NodeSpec;
use crate::template::Tmpl;
use crate::toml_read::Str;

mod check;
pub(crate) mod graph;
mod parse;

pub(crate) use check::{TemplatePlace, View};
pub(crate) use graph::Dag;
pub(crate) use parse::Draft;

/// The default tick, embedded so a copied binary works on its own.
pub(crate) const DEFAULT_TICK: &str = include_str!("../../pipelines/tick.toml");
pub(crate) const DEFAULT_TICK_NAME: &str = "pipelines/tick.toml (built in)";

/// The most nodes a pipeline may have: far beyond any real tick, and a bound on what a
/// hostile file can make `check` and `run` do (each is linear in nodes up to here).
pub(crate) const MAX_NODES: usize = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    Abort,
    Halt,
    Continue,
}

#[derive(Debug)]
pub struct Node {
    pub id: Str,
    /// The kind's registered name; `"?"` when `kind` is missing or unknown.
    pub kind: &'static str,
    pub kind_span: Range<usize>,
    pub needs: Vec<Str>,
    pub timeout: Option<Duration>,
    pub retries: u32,
    pub on_failure: OnFailure,
    pub when: Option<Tmpl>,
    pub spec: Box<dyn NodeSpec>,
}

/// A pipeline known to be a DAG. It may still carry template or reachability errors:
/// callers look at the diagnostics before running it.
#[derive(Debug)]
pub struct Pipeline {
    pub source: SourceRef,
    pub name: String,
    pub description: Option<String>,
    pub nodes: Vec<Node>,
    pub index: IndexMap<String, usize>,
    pub dag: Dag,
}

impl Pipeline {
    /// Parses and validates a pipeline; `None` when it has no DAG.
    pub fn load(source: &SourceRef, diags: &mut Diagnostics) -> Option<Pipeline> {
        Draft::parse(source, diags).validate(diags).ok()
    }

    /// The embedded default tick. A unit test keeps it clean; were it ever not, its
    /// diagnostics go to `diags` (naming the built-in file) and there is no pipeline.
    pub fn builtin(diags: &mut Diagnostics) -> Option<Pipeline> {
        let source = crate::diag::Source::new(DEFAULT_TICK_NAME, DEFAULT_TICK_NAME, DEFAULT_TICK);
        let mut own = Diagnostics::default();
        let p = Pipeline::load(&source, &mut own).filter(|_| !own.has_errors());
        if p.is_none() {
            diags.extend(own);
        }
        p
    }

    /// [`Pipeline::builtin`], parsed once per process and shared: `status`, `report` and
    /// the dashboard load every loop, and most run the built-in tick.
    pub fn builtin_shared(diags: &mut Diagnostics) -> Option<std::sync::Arc<Pipeline>> {
        static BUILTIN: std::sync::OnceLock<Option<std::sync::Arc<Pipeline>>> =
            std::sync::OnceLock::new();
        let p = BUILTIN
            .get_or_init(|| Pipeline::builtin(&mut Diagnostics::default()).map(std::sync::Arc::new))
            .clone();
        if p.is_none() {
            // Cached as broken: parse again so this caller gets the diagnostics.
            let _ = Pipeline::builtin(diags);
        }
        p
    }

    pub fn node(&self, id: &str) -> Option<&Node> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::{Code, Diagnostic, Source};

    fn check(text: &str) -> Diagnostics {
        let src = Source::new("p.toml", "p.toml", text);
        let mut d = Diagnostics::default();
        Pipeline::load(&src, &mut d);
        d
    }

    fn codes(text: &str) -> Vec<&'static str> {
        check(text).items.iter().map(|d| d.code.as_str()).collect()
    }

    #[test]
    fn default_tick_is_clean() {
        let d = check(DEFAULT_TICK);
        assert!(d.items.is_empty(), "{d:?}");
    }

    #[test]
    fn unknown_need_points_at_the_entry() {
        let text = "[nodes.a]\nkind = \"commit\"\nneeds = [\"nope\"]\n";
        let d = check(text);
        assert_eq!(d.items.len(), 1);
        assert_eq!(d.items[0].code, Code::UnknownNeed);
        assert_eq!(&text[d.items[0].span.clone()], "\"nope\"");
    }

    #[test]
    fn cycle_names_all_nodes() {
        let text = "[nodes.a]\nkind=\"gate\"\nneeds=[\"c\"]\n[nodes.b]\nkind=\"gate\"\nneeds=[\"a\"]\n[nodes.c]\nkind=\"commit\"\nneeds=[\"b\"]\n";
        let d = check(text);
        assert_eq!(d.items.len(), 1);
        assert!(
            d.items[0].message.contains("a → b → c → a"),
            "{}",
            d.items[0].message
        );
    }

    #[test]
    fn verdict_variable_needs_a_verdict_upstream() {
        let text = "[nodes.t]\nkind=\"command\"\nargv=[\"echo\", \"{{verdict}}\"]\n[nodes.c]\nkind=\"commit\"\nneeds=[\"t\"]\n";
        let d = check(text);
        assert_eq!(codes(text), ["variable-not-available"]);
        assert_eq!(&text[d.items[0].span.clone()], "verdict");
    }

    /// The one diagnostic a pipeline yields, with the exact text its span covers.
    fn only(text: &str) -> (Diagnostic, &str) {
        let d = check(text);
        assert_eq!(d.items.len(), 1, "{:#?}", d.items);
        let d = d.items.into_iter().next().expect("one");
        let at = &text[d.span.clone()];
        (d, at)
    }

    const HEAD: &str = "[nodes.t]\nkind=\"command\"\nargv=[\"a\"]\n";

    #[test]
    fn verdict_outside_a_verdict_downstream_points_inside_the_string() {
        let text = format!(
            "{HEAD}[nodes.v]\nkind=\"verdict\"\nfrom=\"t\"\nneeds=[\"t\"]\n\
             [nodes.x]\nkind=\"command\"\nargv=[\"echo\", \"pass={{{{ verdict.pass }}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"v\", \"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::VariableNotAvailable);
        assert_eq!(at, "verdict.pass");
        let start = text.find("verdict.pass").expect("in text");
        assert_eq!(d.span, start..start + "verdict.pass".len());
        let help = d.help.expect("help");
        assert!(help.contains("add `needs = [\"v\"]`"), "{help}");
        assert!(help.contains("available at node `x`"), "{help}");
        assert!(
            help.contains("nodes.t.*") && !help.contains("verdict,"),
            "{help}"
        );
    }

    #[test]
    fn node_outputs_only_from_upstream_nodes() {
        let text = format!(
            "{HEAD}[nodes.y]\nkind=\"command\"\nargv=[\"a\"]\n\
             [nodes.x]\nkind=\"command\"\nargv=[\"show\", \"--code={{{{nodes.y.exit_code}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\", \"y\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::VariableNotAvailable);
        assert_eq!(at, "nodes.y.exit_code");
        assert!(
            d.message.contains("node `y` does not run before it"),
            "{}",
            d.message
        );
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .starts_with("add `needs = [\"y\"]` to `[nodes.x]`")
        );
        // Upstream is fine, through any number of nodes.
        let ok = text.replace("needs=[\"t\"]", "needs=[\"t\", \"y\"]");
        assert!(check(&ok).items.is_empty(), "{:?}", check(&ok).items);
    }

    #[test]
    fn node_outputs_from_downstream_say_so() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"{{{{nodes.c2.output}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c2]\nkind=\"command\"\nargv=[\"a\"]\nneeds=[\"x\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"c2\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(at, "nodes.c2.output");
        assert!(d.message.contains("runs after it"), "{}", d.message);
    }

    #[test]
    fn unknown_variable_suggests_the_nearest() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"--task\", \"{{{{curent_task}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::UnknownVariable);
        assert_eq!(at, "curent_task");
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .starts_with("did you mean `current_task`?"),
            "{:?}",
            d.help
        );
        // A typo in a node id gets the same treatment.
        let text = text.replace("curent_task", "nodes.tt.output");
        let (d, at) = only(&text);
        assert_eq!(at, "nodes.tt.output");
        assert!(
            d.message.contains("names node `tt`, which does not exist"),
            "{}",
            d.message
        );
        // And an unknown field of a real node.
        let text = text.replace("nodes.tt.output", "nodes.t.exitcode");
        let (d, _) = only(&text);
        assert!(
            d.help.as_deref().unwrap_or("").contains("`exit_code`"),
            "{:?}",
            d.help
        );
    }

    #[test]
    fn harness_only_variables_are_not_set_for_commands() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"cat\", \"{{{{prompt}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::VariableNotAvailable, "prompt"));
    }

    #[test]
    fn single_brace_tokens_warn_with_the_fix() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"run\", \"--prompt-file={{prompt}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::LegacyPlaceholder);
        assert_eq!(d.severity, crate::diag::Severity::Warning);
        assert_eq!(at, "{prompt}");
        assert_eq!(
            d.help.as_deref(),
            Some("write `{{prompt}}` to substitute the variable")
        );
    }

    #[test]
    fn when_templates_are_checked_with_exact_spans() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"fix\"]\nwhen = \"{{{{not (eq nodes.z.exit_code 0)}}}}\"\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::UnknownVariable, "nodes.z.exit_code"));
        let (line, col) = d.source.line_col(d.span.start);
        assert_eq!((line, col), (7, 19));
    }

    #[test]
    fn escaped_literals_still_point_at_the_variable() {
        // A basic string with an escape: the span is found in the raw literal.
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"say \\\"hi\\\" {{{{nope}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::UnknownVariable, "nope"));
    }

    #[test]
    fn unclosed_blocks_point_at_the_opening_tag() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"a {{{{#if iteration}}}}b\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::TemplateSyntax, "{{#if iteration}}"));
        assert!(d.message.contains("never closed"), "{}", d.message);
    }

    #[test]
    fn unreachable_warnings_wait_for_errors_to_be_fixed() {
        // `nede` is an unknown key; the echo (`t` unreachable) is not reported.
        let text = format!("{HEAD}[nodes.c]\nkind=\"commit\"\nnede=[\"t\"]\n");
        assert_eq!(codes(&text), ["unknown-key"]);
        let text = format!("{HEAD}[nodes.c]\nkind=\"commit\"\n");
        assert_eq!(codes(&text), ["unreachable-node"]);
    }

    #[test]
    fn prompts_warn_on_single_braces_only_for_known_variables() {
        let p = Pipeline::builtin(&mut Diagnostics::default()).expect("the built-in tick is valid");
        let v = p.index["implement"];
        let src = Source::new(
            "p.md",
            "p.md",
            "Fix {task} in `fn f() {x}`; then read {prompt}.\n",
        );
        let mut d = Diagnostics::default();
        p.view()
            .check_template(&Tmpl::file(&src), v, TemplatePlace::Prompt, &mut d);
        assert_eq!(d.items.len(), 1, "{:?}", d.items);
        assert_eq!(&src.text[d.items[0].span.clone()], "{prompt}");
    }

    #[test]
    fn plain_variables_have_no_fields() {
        let text = format!(
            "{HEAD}[nodes.v]\nkind=\"verdict\"\nfrom=\"t\"\nneeds=[\"t\"]\n\
             [nodes.x]\nkind=\"command\"\nargv=[\"a\"]\nwhen=\"{{{{verdict.pass}}}}\"\nneeds=[\"v\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::UnknownVariable, "verdict.pass"));
        assert_eq!(d.help.as_deref(), Some("write `{{verdict}}`"));
        // `reasons` is a list that is empty on the first tick.
        let text = text.replace("verdict.pass", "reasons.0");
        let (d, _) = only(&text);
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .contains("{{#each reasons}}")
        );
    }

    #[test]
    fn missing_commit() {
        assert_eq!(codes("[nodes.g]\nkind=\"gate\"\n"), ["no-commit"]);
    }
}
