//! `check --format sarif` as GitHub code scanning reads it: every rule with its full
//! description and help, result paths relative to `%SRCROOT%` and percent-encoded, valid
//! against the SARIF 2.1.0 schema, and (when Microsoft's SARIF multitool is installed: CI
//! installs it) free of errors under the multitool's own SARIF and GitHub rules.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{Project, Run};

fn schema_errors(doc: &Value) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("tests/fixtures/sarif-schema-2.1.0.json"))
            .expect("schema"),
    )
    .expect("schema JSON");
    let v = jsonschema::validator_for(&schema).expect("compile SARIF schema");
    v.iter_errors(doc)
        .map(|e| format!("{e} at {}", e.instance_path()))
        .collect()
}

/// A project with a broken pipeline whose file name has a space, a `%` and a non-ASCII
/// letter, in a subdirectory.
fn broken() -> (Project, Run) {
    let p = Project::new();
    p.write(
        "pipes/my tick%é.toml",
        "[nodes.c]\nkind = \"commit\"\nneeds = [\"nope\"]\n",
    );
    let r = p.lf(&["check", "pipes/my tick%é.toml", "--format", "sarif"]);
    assert_eq!(r.code, 3, "{r:?}");
    (p, r)
}

#[test]
fn rules_have_full_descriptions_and_help() {
    let (_p, r) = broken();
    let doc: Value = serde_json::from_str(&r.stdout).expect("SARIF is JSON");
    assert_eq!(schema_errors(&doc), Vec::<String>::new());
    let driver = &doc["runs"][0]["tool"]["driver"];
    let rules = driver["rules"].as_array().expect("rules");
    for rule in rules {
        let id = rule["id"].as_str().expect("id");
        for key in [
            "/shortDescription/text",
            "/fullDescription/text",
            "/help/text",
            "/help/markdown",
        ] {
            let text = rule.pointer(key).and_then(Value::as_str).unwrap_or("");
            assert!(text.len() > 20, "{id}: {key} is {text:?}");
        }
        // The full description says how to fix, beyond the one-line description.
        assert_ne!(rule["fullDescription"], rule["shortDescription"], "{id}");
        assert!(
            rule["help"]["markdown"]
                .as_str()
                .unwrap_or("")
                .contains(&format!("`{id}`")),
            "{id}"
        );
    }
    // No made-up URLs: links only to the repository Cargo.toml names, if any.
    let repo = env!("CARGO_PKG_REPOSITORY");
    if repo.is_empty() {
        assert!(driver.get("informationUri").is_none(), "{driver}");
        assert!(rules.iter().all(|r| r.get("helpUri").is_none()));
    } else {
        assert!(
            driver["informationUri"]
                .as_str()
                .unwrap_or("")
                .starts_with(repo)
        );
        for r in rules {
            let help = r["helpUri"].as_str().unwrap_or("");
            assert!(
                help.starts_with(&format!(
                    "{repo}/blob/v{}/book/src/reference.md#",
                    env!("CARGO_PKG_VERSION")
                )),
                "{help}"
            );
        }
    }
}

#[test]
fn result_paths_are_relative_to_srcroot_and_percent_encoded() {
    let (p, r) = broken();
    let doc: Value = serde_json::from_str(&r.stdout).expect("SARIF is JSON");
    let run = &doc["runs"][0];
    let loc = &run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"];
    assert_eq!(loc["uri"], "pipes/my%20tick%25%C3%A9.toml", "{loc}");
    assert_eq!(loc["uriBaseId"], "%SRCROOT%", "{loc}");
    let base = run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
        .as_str()
        .expect("base");
    let root = p.path().canonicalize().expect("root");
    // Temp dirs are named with URI-safe characters only.
    assert_eq!(base, format!("file://{}/", root.display()));
    // Run from a subdirectory with `--project`, the path stays relative to the project.
    let sub = p.join("pipes");
    let r = Run::of(crate::support::loopflow(&sub).args([
        "--project",
        "..",
        "check",
        "my tick%é.toml",
        "--format",
        "sarif",
    ]));
    assert_eq!(r.code, 3, "{r:?}");
    let doc: Value = serde_json::from_str(&r.stdout).expect("SARIF is JSON");
    let loc = &doc["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"];
    assert_eq!(loc["uri"], "pipes/my%20tick%25%C3%A9.toml", "{loc}");
}

/// Microsoft's SARIF multitool: `LOOPFLOW_SARIF_MULTITOOL` (the `Sarif.Multitool` binary
/// of the npm package `@microsoft/sarif-multitool-linux`), else `sarif-multitool` on PATH.
fn multitool() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LOOPFLOW_SARIF_MULTITOOL").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("sarif-multitool"))
            .find(|f| f.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("LOOPFLOW_REQUIRE_VALIDATORS").as_deref() != Ok("1"),
            "the SARIF multitool is required (LOOPFLOW_REQUIRE_VALIDATORS=1) but not installed"
        );
        println!("NOTICE: the SARIF multitool is not installed; skipping it (CI installs it)");
    }
    found
}

/// The multitool's findings on a file, for one rule kind, as (level, ruleId, message).
fn multitool_findings(tool: &Path, file: &Path, kind: &str) -> Vec<(String, String, String)> {
    let out = file.with_extension(format!("{kind}.sarif"));
    let o = Command::new(tool)
        .args([
            "validate",
            "--log",
            "ForceOverwrite",
            "--rule-kind",
            kind,
            "-o",
        ])
        .arg(&out)
        .arg(file)
        // The self-contained .NET binary needs ICU unless told not to use it.
        .env("DOTNET_SYSTEM_GLOBALIZATION_INVARIANT", "1")
        .env("DOTNET_CLI_TELEMETRY_OPTOUT", "1")
        .output()
        .expect("run the SARIF multitool");
    let said = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "multitool: {said}");
    let log: Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("multitool output"))
            .unwrap_or_else(|e| panic!("multitool output is not JSON ({e}): {said}"));
    log["runs"][0]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r| {
            (
                r["level"].as_str().unwrap_or("warning").to_string(),
                r["ruleId"].as_str().unwrap_or("").to_string(),
                r["message"]["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn the_sarif_multitool_finds_no_error() {
    let Some(tool) = multitool() else { return };
    let (p, r) = broken();
    let file = p.write("check.sarif", &r.stdout);
    for kind in ["Sarif", "Gh"] {
        let bad: Vec<_> = multitool_findings(&tool, &file, kind)
            .into_iter()
            .filter(|(level, rule, _)| {
                // SARIF2005 asks for `informationUri`, which needs a repository that
                // Cargo.toml does not name (no URL is made up).
                level == "error"
                    || level == "warning"
                        && !(rule == "SARIF2005" && env!("CARGO_PKG_REPOSITORY").is_empty())
            })
            .collect();
        assert!(bad.is_empty(), "{kind} rules: {bad:#?}");
    }
    // The control: the same rules reject what loopflow used to write (rules without help,
    // a path with a bare space).
    let old = r#"{"$schema":"https://json.schemastore.org/sarif-2.1.0.json","version":"2.1.0","runs":[{"tool":{"driver":{"name":"loopflow","rules":[{"id":"unknown-need","shortDescription":{"text":"x"}}]}},"results":[{"ruleId":"unknown-need","message":{"text":"m"},"locations":[{"physicalLocation":{"artifactLocation":{"uri":"my tick.toml"},"region":{"startLine":1}}}]}]}]}"#;
    let old = p.write("old.sarif", old);
    let errors: Vec<String> = ["Sarif", "Gh"]
        .iter()
        .flat_map(|k| multitool_findings(&tool, &old, k))
        .filter(|(level, _, _)| level == "error")
        .map(|(_, rule, _)| rule)
        .collect();
    assert!(errors.contains(&"GH2012".to_string()), "{errors:?}");
    assert!(errors.contains(&"SARIF1002".to_string()), "{errors:?}");
}

/// `helpUri` points at the book's table of codes: every code has its anchor there.
#[test]
fn the_book_lists_every_code_with_an_anchor() {
    let book = "book/src/reference.md";
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(book))
        .expect("the book's reference");
    let (_p, r) = broken();
    let doc: Value = serde_json::from_str(&r.stdout).expect("SARIF is JSON");
    for rule in doc["runs"][0]["tool"]["driver"]["rules"]
        .as_array()
        .expect("rules")
    {
        let id = rule["id"].as_str().expect("id");
        assert!(
            readme.contains(&format!("<a id=\"{id}\"></a>`{id}`")),
            "{book} has no row for `{id}`"
        );
    }
}
