//! Every diagnostic of the pipeline checks, pinned to the exact bytes it points at and to
//! the line and column a reader sees.

use super::*;
use crate::diag::{Code, Severity, Source};
use crate::pipeline::Pipeline;

/// A diagnostic with its code, severity, the text its span covers and (line, column).
type Found = (Code, Severity, String, (usize, usize), Diagnostic);

/// Each diagnostic of `text`.
fn diags(text: &str) -> Vec<Found> {
    let src = Source::new("p.toml", "p.toml", text);
    let mut d = Diagnostics::default();
    Pipeline::load(&src, &mut d);
    d.items
        .into_iter()
        .map(|d| {
            let at = text[d.span.clone()].to_string();
            let lc = d.source.line_col(d.span.start);
            (d.code, d.severity, at, lc, d)
        })
        .collect()
}

/// The one diagnostic of `text`, checked to cover exactly `at`, starting at `line:col`.
fn one(text: &str, code: Code, at: &str, line_col: (usize, usize)) -> Diagnostic {
    let mut all = diags(text);
    assert_eq!(
        all.len(),
        1,
        "{:#?}",
        all.iter().map(|d| &d.4).collect::<Vec<_>>()
    );
    let (c, _, covered, lc, d) = all.remove(0);
    assert_eq!(
        (c, covered.as_str(), lc),
        (code, at, line_col),
        "{}",
        d.message
    );
    d
}

/// Byte range of the only occurrence of `needle` in `text`.
fn span_of(text: &str, needle: &str) -> std::ops::Range<usize> {
    assert_eq!(text.matches(needle).count(), 1, "`{needle}` must be unique");
    let s = text.find(needle).expect("present");
    s..s + needle.len()
}

const T: &str = "[nodes.t]\nkind=\"command\"\nargv=[\"a\"]\n";

#[test]
fn a_verdict_reading_an_unknown_node_points_at_from() {
    let text = format!(
        "{T}[nodes.v]\nkind=\"verdict\"\nfrom=\"vrify\"\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"v\"]\n"
    );
    let d = one(&text, Code::UnknownNeed, "\"vrify\"", (6, 6));
    assert_eq!(d.span, span_of(&text, "\"vrify\""));
    assert_eq!(d.severity, Severity::Error);
    assert_eq!(
        d.message,
        "verdict node `v` reads `vrify`, which is not a node"
    );
}

#[test]
fn a_verdict_reading_a_node_that_runs_later_points_at_from() {
    let text = format!(
        "{T}[nodes.u]\nkind=\"command\"\nargv=[\"b\"]\n\
         [nodes.v]\nkind=\"verdict\"\nfrom=\"t\"\nneeds=[\"u\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"v\", \"t\"]\n"
    );
    let d = one(&text, Code::VerdictNotUpstream, "\"t\"", (9, 6));
    let from = span_of(&text, "from=\"t\"");
    assert_eq!(d.span, from.start + 5..from.end);
    assert_eq!(
        d.help.as_deref(),
        Some(
            "add `needs = [\"t\"]` to `[nodes.v]` so the verifier's output exists when it is parsed"
        )
    );
    // Reading it through another node is enough.
    let ok = text.replace("needs=[\"u\"]", "needs=[\"u\", \"t\"]");
    assert!(diags(&ok).is_empty());
}

#[test]
fn no_commit_points_at_the_first_node_header() {
    let text =
        "# the gate only\n[nodes.g]\nkind=\"gate\"\n[nodes.h]\nkind=\"gate\"\nneeds=[\"g\"]\n";
    let d = one(text, Code::NoCommit, "[nodes.g]", (2, 1));
    assert_eq!(d.span, 16..25);
    assert_eq!(
        d.help.as_deref(),
        Some(
            "add `[nodes.commit]` with `kind = \"commit\"` and `needs = [\"h\"]` as the pipeline's last node"
        )
    );
}

#[test]
fn an_unconnected_node_warns_at_its_id() {
    let text = format!(
        "{T}[nodes.lone]\nkind=\"command\"\nargv=[\"b\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"t\"]\n"
    );
    let d = one(&text, Code::UnreachableNode, "lone", (4, 8));
    assert_eq!(d.severity, Severity::Warning);
    assert_eq!(d.span, span_of(&text, "lone"));
    // Downstream of the commit is connected too.
    let after = text.replace("argv=[\"b\"]", "argv=[\"b\"]\nneeds=[\"c\"]");
    assert!(diags(&after).is_empty());
}

#[test]
fn an_unclosed_expression_points_at_where_it_opens() {
    let text = format!(
        "{T}[nodes.x]\nkind=\"command\"\nargv=[\"ok\", \"{{{{iteration\"]\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
    );
    // The two braces that open it, inside the second argv literal.
    let d = one(&text, Code::TemplateSyntax, "{{", (6, 14));
    let lit = span_of(&text, "\"{{iteration\"");
    assert_eq!(d.span, lit.start + 1..lit.start + 3);
    assert!(d.message.starts_with("invalid template: "), "{}", d.message);
}

#[test]
fn artifact_without_an_implement_node_upstream() {
    let text = format!(
        "{T}[nodes.x]\nkind=\"command\"\nargv=[\"cat\", \"--file={{{{artifact}}}}\"]\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
    );
    let d = one(&text, Code::VariableNotAvailable, "artifact", (6, 24));
    assert_eq!(d.span, span_of(&text, "artifact"));
    assert_eq!(
        d.message,
        "`artifact` is not available at node `x`: no harness node with role `implement` runs before it"
    );
}

#[test]
fn a_node_reading_its_own_output() {
    let text = format!(
        "{T}[nodes.x]\nkind=\"command\"\nargv=[\"a\"]\nwhen=\"{{{{nodes.x.exit_code}}}}\"\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
    );
    let d = one(
        &text,
        Code::VariableNotAvailable,
        "nodes.x.exit_code",
        (7, 9),
    );
    assert!(
        d.message.ends_with("a node cannot read its own outputs"),
        "{}",
        d.message
    );
}

#[test]
fn an_incomplete_node_variable() {
    let text = format!(
        "{T}[nodes.x]\nkind=\"command\"\nargv=[\"{{{{nodes.t}}}}\"]\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
    );
    let d = one(&text, Code::UnknownVariable, "nodes.t", (6, 10));
    assert_eq!(d.message, "`nodes.t` is incomplete");
    assert_eq!(
        d.help.as_deref(),
        Some("write `nodes.<id>.{stdout_path,stderr_path,exit_code,output}`")
    );
}

#[test]
fn a_single_brace_placeholder_in_a_when() {
    let text = format!(
        "{T}[nodes.x]\nkind=\"command\"\nargv=[\"a\"]\nwhen = \"{{iteration}}\"\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
    );
    let d = one(&text, Code::LegacyPlaceholder, "{iteration}", (7, 9));
    assert_eq!(d.severity, Severity::Warning);
}

#[test]
fn several_problems_in_one_argv_each_get_their_own_span() {
    let text = format!(
        "{T}[nodes.x]\nkind=\"command\"\nargv=[\"{{{{nope}}}}\", \"{{{{verdict}}}}\", \"{{{{nodes.tt.output}}}}\"]\nneeds=[\"t\"]\n\
         [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
    );
    let got: Vec<(Code, String, (usize, usize))> = diags(&text)
        .into_iter()
        .map(|(c, _, at, lc, _)| (c, at, lc))
        .collect();
    assert_eq!(
        got,
        [
            (Code::UnknownVariable, "nope".to_string(), (6, 10)),
            (Code::VariableNotAvailable, "verdict".to_string(), (6, 22)),
            (
                Code::UnknownVariable,
                "nodes.tt.output".to_string(),
                (6, 37)
            ),
        ]
    );
}

#[test]
fn a_prompt_cannot_include_its_own_text() {
    let p = Pipeline::builtin(&mut Diagnostics::default()).expect("the built-in tick is valid");
    let src = Source::new(
        "p.md",
        "p.md",
        "# Task\n\nDo {{current_task}}.\n{{prompt_text}}\n",
    );
    let mut d = Diagnostics::default();
    p.view().check_template(
        &Tmpl::file(&src),
        p.index["implement"],
        TemplatePlace::Prompt,
        &mut d,
    );
    assert_eq!(d.items.len(), 1, "{:#?}", d.items);
    let d = &d.items[0];
    assert_eq!(d.code, Code::VariableNotAvailable);
    assert_eq!(&src.text[d.span.clone()], "prompt_text");
    assert_eq!(d.source.line_col(d.span.start), (4, 3));
    assert_eq!(
        d.help.as_deref(),
        Some("use `prompt_text` in the role's command (argv), not in the prompt file")
    );
}

#[test]
fn a_cycle_still_gets_its_names_checked() {
    // No DAG: `needs` that close a cycle, and an unknown variable, both reported; the
    // checks that need the DAG (`verdict` upstream, reachability) say nothing.
    let text = "[nodes.a]\nkind=\"command\"\nargv=[\"{{verdict}}\", \"{{nopee}}\"]\nneeds=[\"b\"]\n\
                [nodes.b]\nkind=\"commit\"\nneeds=[\"a\"]\n";
    let got: Vec<(Code, String, (usize, usize))> = diags(text)
        .into_iter()
        .map(|(c, _, at, lc, _)| (c, at, lc))
        .collect();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert!(
        got.contains(&(Code::UnknownVariable, "nopee".into(), (3, 25))),
        "{got:#?}"
    );
    assert!(
        got.iter().any(|(c, _, _)| *c == Code::DependencyCycle),
        "{got:#?}"
    );
}

#[test]
fn no_commit_skips_a_header_quoted_in_a_comment() {
    let text = "# like [nodes.x] below\n[nodes.g]\nkind=\"gate\"\n";
    let d = one(text, Code::NoCommit, "[nodes.g]", (2, 1));
    assert_eq!(d.span, 23..32);
}
