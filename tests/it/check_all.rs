//! `check` reports every problem of every phase in one run: a cycle does not hide name
//! errors, a broken `[brakes]` or a TOML syntax error does not hide the cross-checks,
//! an unreadable pipeline does not hide missing prompts; and a missing prompt file comes
//! with the nearest existing file as a suggestion.

use serde_json::Value;

use crate::support::{Project, Run};

fn diagnostics(r: &Run) -> Vec<Value> {
    let v: Value =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {r:?}"));
    v["diagnostics"].as_array().expect("diagnostics").clone()
}

/// `line:column code` of every diagnostic, in output order.
fn found(r: &Run) -> Vec<String> {
    diagnostics(r)
        .iter()
        .map(|d| {
            format!(
                "{}:{} {}",
                d["line"],
                d["column"],
                d["code"].as_str().unwrap_or("")
            )
        })
        .collect()
}

fn codes(r: &Run) -> Vec<String> {
    diagnostics(r)
        .iter()
        .map(|d| d["code"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn a_cycle_does_not_hide_name_errors() {
    let p = Project::new();
    p.write(
        "p.toml",
        r#"[nodes.gate]
kind = "gate"
needs = ["commit"]

[nodes.verify]
kind = "command"
argv = ["echo", "{{verdict.pas}}"]
needs = ["gate"]

[nodes.parse]
kind = "verdict"
from = "verifyy"
needs = ["verify"]

[nodes.commit]
kind = "commit"
needs = ["parse"]
"#,
    );
    let r = p.lf(&["check", "p.toml", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(
        found(&r),
        [
            "3:10 dependency-cycle",
            "7:20 unknown-variable",
            "12:8 unknown-need",
        ],
        "{}",
        r.stdout
    );
}

const BROKEN_LOOP: &str = r#"[brakes]
max_iteration = 10

[harness]
command = ["agent", "{prompt}", "{{cwdd}}", "{{#if iteration}}x"]

[roles.implement]
prompt = "prompts/implment.md"
[roles.verify]
prompt = "prompts/verify.md"
[roles.orchestrate]
prompt = "prompts/verify.md"
"#;

/// A typo in `[brakes]` made the loop invalid and, before, hid everything else.
#[test]
fn a_broken_brakes_table_does_not_hide_the_cross_checks() {
    let p = Project::new();
    p.write(".loopflow/loops/b/loop.toml", BROKEN_LOOP);
    p.write(".loopflow/loops/b/prompts/implement.md", "Do it.\n");
    p.write(".loopflow/loops/b/prompts/verify.md", "Check it.\n");
    let r = p.lf(&["check", ".loopflow/loops/b/loop.toml", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(
        found(&r),
        [
            "2:1 unknown-key",
            "5:22 legacy-placeholder",
            "5:36 unknown-variable",
            "5:46 template-syntax",
            "8:10 missing-prompt",
        ],
        "{}",
        r.stdout
    );
    // The typo is reported once, as an unknown key that names the right one.
    assert!(
        r.stdout.contains("did you mean `max_iterations`?"),
        "{}",
        r.stdout
    );
    // The missing prompt comes with the nearest file of its directory.
    assert!(
        r.stdout.contains("did you mean `prompts/implement.md`?"),
        "{}",
        r.stdout
    );
    let human = p.lf(&["check", ".loopflow/loops/b/loop.toml"]);
    assert!(human.stdout.contains("4 errors, 1 warning"), "{human:?}");
}

#[test]
fn a_loop_whose_brakes_do_not_read_still_cannot_run() {
    let p = Project::new();
    assert_eq!(p.create("b", Some("t")).code, 0);
    let cfg = p.read(".loopflow/loops/b/loop.toml");
    p.write(
        ".loopflow/loops/b/loop.toml",
        &cfg.replace("max_iterations", "max_iteration"),
    );
    let r = p.lf(&["run", "--loop", "b"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert!(r.stderr.contains("max_iteration"), "{r:?}");
    assert_eq!(p.lf(&["gate", "--loop", "b"]).code, 3);
}

/// After a syntax error the file is checked as far as it parses: what is there and
/// wrong is reported, what only seems missing is not.
#[test]
fn a_syntax_error_does_not_hide_the_rest_of_the_file() {
    let p = Project::new();
    p.write(
        "p.toml",
        r#"[nodes.gate]
kind = "gate

[nodes.x]
kind = "command"
argv = ["echo", "{{cwdd}}"]
needs = ["gate"]
retrys = 2

[nodes.commit]
kind = "commit"
needs = ["x"]
timeout = 5
"#,
    );
    let r = p.lf(&["check", "p.toml", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(
        codes(&r),
        [
            "toml-syntax",
            "unknown-variable",
            "unknown-key",
            "wrong-type"
        ],
        "{}",
        r.stdout
    );
    // A value the parser could only guess at (`kind = "gate` unclosed) is not judged.
    let p2 = Project::new();
    p2.write(
        "p.toml",
        "[nodes.a]\nkind = = \"gate\"\n[nodes.c]\nkind = \"commit\"\nneeds = [\"a\"]\n",
    );
    let r = p2.lf(&["check", "p.toml", "--format", "json"]);
    assert!(codes(&r).iter().all(|c| c == "toml-syntax"), "{}", r.stdout);
}

#[test]
fn a_loop_with_a_syntax_error_is_still_cross_checked() {
    let p = Project::new();
    p.write(
        "l/loop.toml",
        "[brakes]\nmax_iterations = 3\nbad = = 1\n[roles.implement]\nprompt = \"nope.md\"\n",
    );
    let r = p.lf(&["check", "l/loop.toml", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    let c = codes(&r);
    assert!(c.contains(&"toml-syntax".to_string()), "{c:?}");
    assert!(c.contains(&"missing-prompt".to_string()), "{c:?}");
    // Roles the built-in tick needs but the (broken) file may have held: not claimed.
    assert!(!c.contains(&"missing-role".to_string()), "{c:?}");
}

#[test]
fn an_unreadable_pipeline_does_not_hide_missing_prompts() {
    let p = Project::new();
    p.write(
        "l/loop.toml",
        "pipeline = \"nope.toml\"\n[brakes]\nmax_iterations = 3\n[roles.implement]\nprompt = \"p/implement.md\"\n",
    );
    let r = p.lf(&["check", "l/loop.toml", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(
        codes(&r),
        ["missing-file", "missing-prompt"],
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("the directory l/p does not exist either"),
        "{}",
        r.stdout
    );
}

/// `check -` with the file on stdin.
fn check_stdin(p: &Project, args: &[&str], input: &str) -> Run {
    use std::io::Write;
    let mut c = p
        .lf_cmd(&[&["check", "-"], args].concat())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    c.stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    Run::from(c.wait_with_output().expect("wait"))
}

#[test]
fn check_reads_one_file_from_stdin() {
    let p = Project::new();
    // A pipeline, told apart by its `nodes`.
    let r = check_stdin(
        &p,
        &["--format", "json"],
        "[nodes.c]\nkind = \"commit\"\nneeds = [\"x\"]\n",
    );
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(codes(&r), ["unknown-need"]);
    assert!(r.stdout.contains("\"file\": \"<stdin>\""), "{}", r.stdout);
    // A loop config, told apart by its keys; named, and its prompt paths resolved
    // against the directory of that name.
    p.write("l/prompts/implement.md", "Do it.\n");
    let cfg = "[brakes]\nmax_iteration = 3\n[roles.implement]\nprompt = \"prompts/implment.md\"\n";
    let r = check_stdin(
        &p,
        &["--stdin-name", "l/loop.toml", "--format", "json"],
        cfg,
    );
    assert_eq!(r.code, 3, "{r:?}");
    let c = codes(&r);
    assert!(c.contains(&"unknown-key".to_string()), "{c:?}");
    assert!(c.contains(&"missing-prompt".to_string()), "{c:?}");
    assert!(
        r.stdout.contains("\"file\": \"l/loop.toml\""),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("did you mean `prompts/implement.md`?"),
        "{}",
        r.stdout
    );
    // The name decides when it is a pipeline's: keys of a loop config are unknown there.
    let r = check_stdin(&p, &["--stdin-name", "p.toml", "--format", "json"], cfg);
    assert!(codes(&r).contains(&"unknown-key".to_string()), "{r:?}");
    assert!(r.stdout.contains("\"file\": \"p.toml\""), "{}", r.stdout);
    // Clean input, human output.
    let tick = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("pipelines/tick.toml"),
    )
    .expect("tick");
    let r = check_stdin(&p, &[], &tick);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "checked 1 file(s): no problems found\n")
    );
    assert_eq!(p.lf(&["check", "--stdin-name", "x.toml"]).code, 2);
}

#[test]
fn ignore_comments_silence_one_finding_and_say_when_they_silence_nothing() {
    let p = Project::new();
    let text = r#"[nodes.t]
kind = "command"
argv = ["a"]
# loopflow: ignore[unknown-key]
owner = "alice"
team = "core"

[nodes.c]
kind = "commit"
# loopflow: ignore[unknown-need, unreachable-nod]
needs = ["t", "x"]
"#;
    p.write("p.toml", text);
    let r = p.lf(&["check", "p.toml", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(
        found(&r),
        [
            // `owner` is silenced; `team`, one line further down, is not.
            "6:1 unknown-key",
            // An error `run` could not run with is never silenced...
            "10:20 unused-ignore",
            // ...and a misspelt code is pointed out.
            "10:34 unused-ignore",
            "11:15 unknown-need",
        ],
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("did you mean `unreachable-node`?"),
        "{}",
        r.stdout
    );
    // What check accepts, run accepts: an ignored unknown key does not stop a loop.
    assert_eq!(p.create("l", Some("t")).code, 0);
    let cfg = p.read(".loopflow/loops/l/loop.toml");
    p.write(
        ".loopflow/loops/l/loop.toml",
        &cfg.replace(
            "[brakes]\n",
            "[brakes]\n# loopflow: ignore[unknown-key]\nowner = 1\n",
        ),
    );
    assert_eq!(p.lf(&["check", ".loopflow/loops/l/loop.toml"]).code, 0);
    let r = p.lf(&["run", "--loop", "l", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    p.write(
        ".loopflow/loops/l/loop.toml",
        &cfg.replace("[brakes]\n", "[brakes]\nowner = 1\n"),
    );
    assert_eq!(p.lf(&["run", "--loop", "l", "--dry-run"]).code, 3);
}

/// Thousands of findings in one big file render in about the time they take to find:
/// the snippet renderer is handed each finding's own lines, not the whole file.
#[test]
fn ten_thousand_findings_render_quickly() {
    let p = Project::new();
    let mut text = String::from("[nodes.c]\nkind = \"commit\"\n");
    for i in 0..10_000 {
        text.push_str(&format!("[nodes.n{i}]\nkind = \"gate\"\nbogus = {i}\n"));
    }
    p.write("big.toml", &text);
    let start = std::time::Instant::now();
    let r = p.lf(&["check", "big.toml"]);
    let took = start.elapsed();
    assert_eq!(r.code, 3);
    let tail: String = r.stdout.lines().last().unwrap_or("").to_string();
    assert_eq!(tail, "10000 errors, 0 warnings");
    assert!(
        r.stdout.contains("big.toml:30002:1: error[unknown-key]")
            && r.stdout.contains(" 30002 │ bogus = 9999"),
        "line numbers deep in the file"
    );
    // Generous (a loaded debug build): it took a minute when each snippet walked the file.
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

/// A misspelt `kind` is an unknown key with the right one named, not a missing `kind`
/// and silence about the key that is there.
#[test]
fn a_misspelt_kind_is_named() {
    let p = Project::new();
    p.write(
        "p.toml",
        "[nodes.g]\nknd = \"gate\"\n[nodes.c]\nkind = \"commit\"\nneeds = [\"g\"]\n",
    );
    let r = p.lf(&["check", "p.toml", "--format", "json"]);
    assert_eq!(found(&r), ["2:1 unknown-key"], "{}", r.stdout);
    assert!(r.stdout.contains("did you mean `kind`?"), "{}", r.stdout);
}
