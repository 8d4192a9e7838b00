//! `contracts/loop-integration.md`, the contract agent wrappers are written against, is
//! held to the code: every template variable the tick sets (`src/template/vars.rs`) and
//! every `LOOPFLOW_*` variable the tick sets or reads is documented there, and the
//! variables it documents exist. README links to it.

use std::path::Path;

use crate::support::api::{NODE_FIELDS, SOURCE, template_names};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn contract() -> String {
    std::fs::read_to_string(root().join("contracts/loop-integration.md")).expect("contract")
}

/// The rows of the contract's "Template variables" table: each row's first cell, without
/// its backticks (`nodes.<id>.stdout_path`, `loop`, …).
fn documented_variables(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| l.trim() != "## Template variables")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(name, _)| name.to_string()))
        .collect()
}

/// Every `"LOOPFLOW_…` string literal (or format string) in the Rust files under `dir`.
fn loopflow_vars_in(dir: &Path, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src dir")
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            loopflow_vars_in(&p, out);
            continue;
        }
        if p.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&p).expect("source");
        for (i, _) in text.match_indices("\"LOOPFLOW_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
}

#[test]
fn every_template_variable_is_documented() {
    let text = contract();
    let documented = documented_variables(&text);
    let mut missing = Vec::new();
    for name in template_names() {
        let want: Vec<String> = if name == "nodes" {
            NODE_FIELDS
                .iter()
                .map(|f| format!("nodes.<id>.{f}"))
                .collect()
        } else {
            vec![name.to_string()]
        };
        missing.extend(want.into_iter().filter(|w| !documented.contains(w)));
    }
    assert!(
        missing.is_empty(),
        "contracts/loop-integration.md documents no row for {missing:?}"
    );
    // …and documents nothing the tick does not set.
    let known: Vec<String> = template_names()
        .filter(|n| *n != "nodes")
        .map(str::to_string)
        .chain(NODE_FIELDS.iter().map(|f| format!("nodes.<id>.{f}")))
        .collect();
    let stale: Vec<&String> = documented.iter().filter(|d| !known.contains(d)).collect();
    assert!(stale.is_empty(), "documented but never set: {stale:?}");
    // What a work source's templates see is said too.
    let quoted: Vec<String> = SOURCE.iter().map(|n| format!("`{n}`")).collect();
    let (last, rest) = quoted.split_last().expect("work-source variables");
    let list = format!("see only {} and {last}", rest.join(", "));
    assert!(text.contains(&list), "the contract does not say {list:?}");
}

#[test]
fn every_loopflow_variable_of_a_tick_is_documented() {
    // What a tick's processes get (tick/, node/, process/, the audit command of
    // work_source.rs), and what the tick reads (floor-check's override).
    let mut vars = Vec::new();
    for dir in ["src/tick", "src/node", "src/process"] {
        loopflow_vars_in(&root().join(dir), &mut vars);
    }
    for file in ["src/work_source.rs"] {
        let text = std::fs::read_to_string(root().join(file)).expect("source");
        for (i, _) in text.match_indices("\"LOOPFLOW_") {
            let name: String = text[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                .collect();
            if !vars.contains(&name) {
                vars.push(name);
            }
        }
    }
    for must in [
        "LOOPFLOW_LOOP",
        "LOOPFLOW_PROJECT",
        "LOOPFLOW_TICK",
        "LOOPFLOW_NODE",
        "LOOPFLOW_CONTEXT_TOKENS",
    ] {
        assert!(
            vars.contains(&must.to_string()),
            "{must} not found in the sources: {vars:?}"
        );
    }
    let text = contract();
    let missing: Vec<&String> = vars
        .iter()
        .filter(|v| {
            !text.contains(&format!("| `{v}` |")) && !text.contains(&format!("`{v}` overrides"))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "contracts/loop-integration.md does not document {missing:?}"
    );
    for v in ["PWD", "TMPDIR"] {
        assert!(
            text.contains(&format!("| `{v}` |")),
            "{v} is not documented"
        );
    }
}

#[test]
fn the_readme_and_the_book_link_the_contract() {
    for (doc, link) in [
        ("README.md", "(contracts/loop-integration.md)"),
        (
            "book/src/agents.md",
            "(../../contracts/loop-integration.md)",
        ),
    ] {
        let text = std::fs::read_to_string(root().join(doc)).expect(doc);
        assert!(
            text.contains(link),
            "{doc} does not link contracts/loop-integration.md"
        );
    }
}
