//! CLI conventions (issue 12): completions and man pages that their tools accept, stdout
//! for data (one JSON document per `--json`, quiet on a closed pipe), the project found
//! upward from a subdirectory, `status` that never calls a broken loop `ok`, and text an
//! agent wrote escaped before a terminal sees it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{LoopToml, Project, Run, cp_a, have, loopflow, standard_agent, wait_or_kill};

const PASS: &str = r#"{"pass": true, "score": 0.9}"#;
const HALF: &str = r#"{"pass": false, "score": 0.5}"#;

/// `loopflow ARGS` run from `cwd` with no `--project` and no LOOPFLOW_PROJECT: the
/// project is whatever loopflow finds from there.
fn lf_in(cwd: &Path, args: &[&str]) -> Run {
    let mut c = loopflow(cwd);
    c.env_remove("LOOPFLOW_PROJECT").args(args);
    Run::of(&mut c)
}

/// Runs `c` with a stdout whose reader is already gone: every write to it fails with
/// EPIPE (what `| head -0` does to a slower writer).
fn with_closed_stdout(mut c: Command) -> Run {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    c.stdin(Stdio::null()).stdout(writer).stderr(Stdio::piped());
    Run::of(&mut c)
}

fn assert_quiet_end(r: &Run, what: &str) {
    assert!(
        r.code == 0 || r.code == 141,
        "{what}: exit {} (want 0 or 141)\n{r:?}",
        r.code
    );
    assert!(
        !r.stderr.contains("panicked") && !r.stderr.contains("Broken pipe"),
        "{what}: not quiet: {}",
        r.stderr
    );
}

/// A project with loop `l` driven by the standard agent (max 10 iterations).
fn agent_project(verdicts: &[&str], brakes: &str) -> Project {
    let p = Project::new();
    let a = standard_agent(&p, verdicts);
    p.agent_loop("l", &a, brakes);
    p
}

// ---- completions and man ----------------------------------------------------------------

#[test]
fn completion_scripts_are_accepted_by_their_shells() {
    let p = Project::new();
    for (shell, check) in [
        ("bash", Some(("bash", vec!["-n"]))),
        ("zsh", Some(("zsh", vec!["-n"]))),
        ("fish", Some(("fish", vec!["--no-execute"]))),
        // No PowerShell on Debian's archive: the script is generated and looked at.
        ("powershell", None),
    ] {
        let r = p.lf(&["completions", shell]);
        assert_eq!(r.code, 0, "{shell}: {r:?}");
        assert!(
            r.stdout.contains("approve") && r.stdout.contains("completions"),
            "{shell}: subcommands missing"
        );
        let file = p.write(&format!("completion.{shell}"), &r.stdout);
        match check {
            Some((tool, args)) if have(tool) => {
                let o = Command::new(tool).args(&args).arg(&file).output().unwrap();
                assert!(
                    o.status.success() && o.stderr.is_empty(),
                    "{tool} rejects the script: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            Some(_) => {}
            None => assert!(r.stdout.contains("Register-ArgumentCompleter")),
        }
    }
    let r = p.lf(&["completions", "tcsh"]);
    assert_eq!(r.code, 2, "{r:?}");
}

#[test]
fn bash_completion_completes_subcommands_and_loop_flags() {
    if !have("bash") {
        return;
    }
    let p = Project::new();
    let script = p.write("c.bash", &p.lf(&["completions", "bash"]).stdout);
    // What bash does on TAB: set COMP_WORDS/COMP_CWORD, call the completion function.
    let probe = format!(
        r#"source '{}'
COMP_WORDS=(loopflow app); COMP_CWORD=1; COMP_LINE="loopflow app"; COMP_POINT=12
_loopflow loopflow app loopflow; echo "${{COMPREPLY[@]}}"
COMP_WORDS=(loopflow status --); COMP_CWORD=2; COMP_LINE="loopflow status --"; COMP_POINT=18
_loopflow loopflow -- status; echo "${{COMPREPLY[@]}}""#,
        script.display()
    );
    let o = Command::new("bash").arg("-c").arg(probe).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first().copied(), Some("approve"), "{out}");
    assert!(
        lines
            .get(1)
            .is_some_and(|l| l.contains("--loop") && l.contains("--json")),
        "{out}"
    );
}

#[test]
fn man_pages_render_without_warnings() {
    let p = Project::new();
    let top = p.lf(&["man"]);
    assert_eq!(top.code, 0, "{top:?}");
    assert!(top.stdout.starts_with(".ie") || top.stdout.starts_with(".TH"));
    assert!(top.stdout.contains(".SH \"EXAMPLES\""), "{}", top.stdout);
    assert!(
        top.stdout.is_ascii(),
        "groff reads Latin-1: non-ASCII must be escaped"
    );
    let run = p.lf(&["man", "run"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains(".TH loopflow-run 1"), "{}", run.stdout);
    assert_eq!(p.lf(&["man", "no-such-command"]).code, 2);
    if !have("groff") {
        return;
    }
    for (name, page) in [("loopflow", &top.stdout), ("loopflow-run", &run.stdout)] {
        let mut c = Command::new("groff");
        // Plain text: no overstrike or SGR for bold and underline.
        c.args(["-man", "-Tutf8", "-ww", "-P-cbou"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(page.as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{name}: groff: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            text.contains("EXAMPLES") && text.contains("OPTIONS"),
            "{text}"
        );
    }
    if have("man") {
        let o = Command::new("sh")
            .arg("-c")
            .arg("\"$0\" man | MANWIDTH=100 man -l -")
            .arg(crate::support::bin())
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            text.contains("loopflow demo") && text.contains("EXIT STATUS"),
            "{text}"
        );
    }
}

#[test]
fn demo_refuses_a_project_it_would_ignore() {
    let p = Project::new();
    let help = p.lf(&["demo", "--help"]);
    assert_eq!(help.code, 0);
    assert!(!help.stdout.contains("--project <"), "{}", help.stdout);
    let target = p.join("mine");
    std::fs::create_dir_all(&target).unwrap();
    for args in [
        vec!["demo", "--project", target.to_str().unwrap()],
        vec!["--project", target.to_str().unwrap(), "demo"],
    ] {
        let r = Run::of(loopflow(p.path()).args(&args));
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(r.stderr.contains("--dir"), "{r:?}");
    }
    // LOOPFLOW_PROJECT (set inside every tick) does not send the demo into a project.
    let dir = p.join("demo");
    let r = Run::of(loopflow(p.path()).env("LOOPFLOW_PROJECT", &target).args([
        "demo",
        "--dir",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        dir.join("project/.loopflow/loops/demo/.state.loop")
            .is_file()
    );
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
}

// ---- stdout is for data --------------------------------------------------------------------

#[test]
fn run_json_is_exactly_one_document_and_people_read_stderr() {
    let p = agent_project(&[HALF], "");
    for extra in [&[][..], &["--dry-run"][..]] {
        let mut args = vec!["run", "--loop", "l", "--json"];
        args.extend(extra);
        let r = p.lf(&args);
        assert_eq!(r.code, 0, "{r:?}");
        let doc: Value = serde_json::from_str(&r.stdout)
            .unwrap_or_else(|e| panic!("{extra:?}: stdout is not one JSON document ({e}): {r:?}"));
        assert_eq!(doc["loop"], "l");
        assert!(r.stderr.contains("loop l "), "{extra:?}: {r:?}");
        // Only a dry run's summary carries its account of each node.
        assert_eq!(doc.get("dry_run").is_some(), !extra.is_empty(), "{doc}");
    }
    // Without --json the human lines are the output.
    let r = p.lf(&["run", "--loop", "l"]);
    assert!(r.stdout.starts_with("loop l ticked"), "{r:?}");
    for args in [
        &["status", "--json"][..],
        &["status", "--loop", "l", "--json"][..],
        &["gate", "--loop", "l", "--json"][..],
    ] {
        let r = p.lf(args);
        assert!(
            serde_json::from_str::<Value>(&r.stdout).is_ok(),
            "{args:?}: {r:?}"
        );
    }
    let dir = p.join("demo");
    let r = Run::of(loopflow(p.path()).args(["demo", "--json", "--dir", dir.to_str().unwrap()]));
    assert_eq!(r.code, 0, "{r:?}");
    let doc: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
    assert!(
        doc["ticks"].as_array().is_some_and(|t| t.len() >= 3),
        "{doc}"
    );
    assert_eq!(doc["status"]["name"], "demo");
    assert!(r.stderr.contains("Next steps"), "{r:?}");
}

#[test]
fn log_json_prints_one_event_object_per_line() {
    let p = agent_project(&[HALF], "");
    p.run_json("l", &[]);
    let r = p.lf(&["halt", "--loop", "l", "--reason", "waiting for review"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = p.lf(&[
        "approve",
        "--loop",
        "l",
        "--note",
        "a \"quoted\" note\nsecond line",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    // Something that is not an event line.
    let log = p.loop_dir("l").join(".state.log");
    let mut raw = std::fs::read(&log).unwrap();
    raw.extend_from_slice(b"not an event\n");
    std::fs::write(&log, raw).unwrap();
    let r = p.lf(&["log", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let events: Vec<Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(events.len(), p.log("l").len(), "{}", r.stdout);
    let find = |ev: &str| {
        events
            .iter()
            .find(|e| e["event"] == ev)
            .unwrap_or_else(|| panic!("no {ev}: {}", r.stdout))
    };
    let tick = find("TICK");
    assert_eq!(tick["args"]["iter"], "1");
    assert!(tick["at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let halt = find("HALT");
    let words: Vec<&str> = halt["words"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    assert_eq!(words.join(" "), "waiting for review", "{halt}");
    // Quoted values come back unescaped.
    assert_eq!(
        find("APPROVE")["args"]["note"],
        "a \"quoted\" note\nsecond line"
    );
    let last = events.last().unwrap();
    assert_eq!(last["event"], Value::Null);
    assert_eq!(last["unparsed"], "not an event");
}

/// The commands the issue names, each with a stdout already closed.
#[test]
fn a_closed_stdout_ends_every_command_quietly() {
    let p = Project::git();
    let a = standard_agent(&p, &[HALF]);
    p.agent_loop("l", &a, "");
    p.run_json("l", &[]);
    // A log bigger than a pipe's buffer, so `log` meets the closed pipe mid-stream.
    let log = p.loop_dir("l").join(".state.log");
    let mut raw = std::fs::read(&log).unwrap();
    for i in 0..5000 {
        raw.extend_from_slice(format!("2026-11-30T02:10:00Z WARN n={i} msg=filler\n").as_bytes());
    }
    std::fs::write(&log, raw).unwrap();
    for args in [
        &["status"][..],
        &["status", "--json"][..],
        &["run", "--loop", "l", "--dry-run"][..],
        &["run", "--loop", "l", "--json"][..],
        &["schedule", "print", "--loop", "l", "--platform", "cron"][..],
        &["check"][..],
        &["log", "--loop", "l"][..],
        &["log", "--loop", "l", "--json"][..],
        &["log", "--loop", "l", "--follow"][..],
        &["gate", "--loop", "l"][..],
        &["man"][..],
        &["completions", "bash"][..],
        &["--help"][..],
    ] {
        let r = with_closed_stdout(p.lf_cmd(args));
        assert_quiet_end(&r, &format!("{args:?}"));
    }
    // The tick that met a closed stdout still committed.
    assert_eq!(p.state("l")["iteration_count"], 2, "{}", p.state("l"));
}

/// A stdout that fails for another reason (a full disk) is an error, said once.
#[test]
fn a_full_stdout_is_an_error() {
    let p = agent_project(&[HALF], "");
    for args in [
        &["status"][..],
        &["schedule", "print", "--loop", "l", "--platform", "cron"][..],
    ] {
        let mut c = p.lf_cmd(args);
        c.stdout(std::fs::File::create("/dev/full").unwrap());
        let r = Run::of(&mut c);
        assert_eq!(r.code, 4, "{args:?}: {r:?}");
        assert!(
            r.stderr.contains("error: cannot write to stdout") && !r.stderr.contains("panicked"),
            "{args:?}: {r:?}"
        );
    }
}

/// `log --follow | head -1`: the reader leaves after one line, and `log` ends with it,
/// not at the next line appended (none comes).
#[test]
fn log_follow_ends_when_its_reader_leaves() {
    let p = agent_project(&[HALF], "");
    let mut child = p
        .lf_cmd(&["log", "--loop", "l", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut first = [0u8; 1];
    use std::io::Read;
    out.read_exact(&mut first).unwrap();
    drop(out);
    let st = wait_or_kill(&mut child, "log --follow after its reader left");
    assert!(st.code() == Some(0), "{st:?}");
}

// ---- the project is found upward -----------------------------------------------------------

#[test]
fn status_and_check_find_the_project_from_a_subdirectory() {
    let p = Project::git();
    let r = p.lf(&["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    let deep = p.join("src/deep/er");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::create_dir_all(p.worktree("l").join("src")).unwrap();
    let r = lf_in(&deep, &["status"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.lines().any(|l| l.starts_with("l ")), "{r:?}");
    let r = lf_in(&deep, &["check"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("checked 1 file"), "{r:?}");
    let r = lf_in(&deep, &["run", "--loop", "l", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("dry run of loop l"), "{r:?}");
    // Inside the loop's own worktree (outside the project, another repository) too.
    let r = Run::of(
        loopflow(&p.worktree("l").join("src"))
            .env("XDG_STATE_HOME", p.state_home.path())
            .args(["status", "--loop", "l"]),
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.lines().any(|l| l.starts_with("l ")), "{r:?}");
    // --project still names it: a directory without loops is just that.
    let other = tempfile::tempdir().unwrap();
    let r = lf_in(
        &deep,
        &["--project", other.path().to_str().unwrap(), "status"],
    );
    assert!(r.stdout.starts_with("no loops"), "{r:?}");
}

#[test]
fn create_in_a_fresh_repository_starts_the_project_at_its_top_level() {
    let p = Project::git();
    let sub = p.join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    let r = lf_in(
        &sub,
        &["create", "--loop", "l", "--task", "t", "--no-worktree"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(p.loop_dir("l").join(".state.loop").is_file(), "{r:?}");
    assert!(!sub.join(".loopflow").exists());
    // Outside any repository and project: the current directory.
    let plain = tempfile::tempdir().unwrap();
    let r = lf_in(plain.path(), &["create", "--loop", "m", "--no-worktree"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(plain.path().join(".loopflow/loops/m/.state.loop").is_file());
}

// ---- status never calls a broken loop ok ---------------------------------------------------

/// The STATE column of loop `name` in `status`.
fn state_cell(r: &Run, name: &str) -> String {
    let head = r.stdout.lines().next().unwrap_or("");
    let (from, to) = (head.find("STATE").unwrap(), head.find("PHASE").unwrap());
    let row = r
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no row {name}: {r:?}"));
    row.chars()
        .skip(from)
        .take(to - from)
        .collect::<String>()
        .trim()
        .to_string()
}

#[test]
fn status_shows_an_unparsable_config_as_invalid() {
    let p = agent_project(&[HALF], "");
    p.loop_toml("l", "[brakes]\nmax_iteration = 3\n");
    let r = p.lf(&["status"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(state_cell(&r, "l"), "INVALID CONFIG", "{r:?}");
    assert!(
        r.stdout
            .contains("note: l: invalid loop.toml: .loopflow/loops/l/loop.toml:2:"),
        "the first problem: {r:?}"
    );
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
    assert!(
        j["loops"][0]["config_error"]
            .as_str()
            .is_some_and(|e| e.starts_with(".loopflow/loops/l/loop.toml:")),
        "{j}"
    );
    assert_eq!(j["loops"][0]["max_iterations"], Value::Null);
}

#[test]
fn status_shows_an_aborting_loop_as_aborting() {
    let p = Project::new();
    let a = p.script("fail.sh", "exit 7");
    p.agent_loop("l", &a, "max_consecutive_aborts = 5");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&r.stdout).unwrap()["outcome"],
        "abort"
    );
    let r = p.lf(&["status"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        state_cell(&r, "l"),
        "ABORTING (1 in a row: implement exit:7)",
        "{r:?}"
    );
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
    assert_eq!(j["loops"][0]["consecutive_aborts"], 1);
    assert_eq!(j["loops"][0]["last_abort"]["node"], "implement");
}

#[test]
fn status_exits_4_for_an_unreadable_state_and_lists_the_others() {
    let p = agent_project(&[HALF], "");
    let a = p.join("agent.sh");
    p.agent_loop("m", &a, "");
    std::fs::write(p.loop_dir("m").join(".state.loop"), "{ not json").unwrap();
    let r = p.lf(&["status"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert_eq!(state_cell(&r, "l"), "ok", "{r:?}");
    assert!(state_cell(&r, "m").starts_with("UNREADABLE"), "{r:?}");
    assert!(r.stderr.contains(".state.loop:1:3"), "{r:?}");
    let r = p.lf(&["status", "--json"]);
    assert_eq!(r.code, 4, "{r:?}");
    let j: Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(j["loops"].as_array().unwrap().len(), 1);
    assert_eq!(j["errors"][0]["name"], "m");
    assert_eq!(p.lf(&["status", "--loop", "m"]).code, 4);
    assert_eq!(p.lf(&["status", "--loop", "l"]).code, 0);
}

#[test]
fn model_diversity_is_unknown_without_models() {
    let p = Project::new();
    let a = standard_agent(&p, &[HALF]);
    let diverse = |toml: LoopToml| {
        p.with_loop("x", &toml);
        let j: Value =
            serde_json::from_str(&p.lf(&["status", "--loop", "x", "--json"]).stdout).unwrap();
        std::fs::remove_dir_all(p.loop_dir("x")).unwrap();
        j["loops"][0]["model_diverse"].clone()
    };
    let base = || LoopToml::new().harness_agent(&a);
    assert_eq!(diverse(base()), Value::Null);
    assert_eq!(
        diverse(base().role("implement", "model = \"m1\"")),
        Value::Null
    );
    let two = |m: &str| {
        base()
            .role("implement", "model = \"m1\"")
            .role("verify", &format!("model = \"{m}\""))
    };
    assert_eq!(diverse(two("m2")), Value::Bool(true));
    assert_eq!(diverse(two("m1")), Value::Bool(false));
}

#[test]
fn create_says_a_task_is_missing_only_when_it_is() {
    let p = Project::new();
    let r = p.lf(&[
        "create",
        "--loop",
        "ci",
        "--template",
        "ci-triage",
        "--no-worktree",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stdout.contains("no --task"), "{r:?}");
    assert!(
        r.stdout.contains("task: make the failing tests pass"),
        "{r:?}"
    );
    let r = p.lf(&["create", "--loop", "d", "--no-worktree"]);
    assert!(r.stdout.contains("no --task given"), "{r:?}");
    let r = p.lf(&["create", "--loop", "t", "--task", "x", "--no-worktree"]);
    assert!(
        !r.stdout.contains("no --task") && !r.stdout.contains("task: "),
        "{r:?}"
    );
}

#[test]
fn the_gate_node_reports_how_it_ended_the_tick() {
    let p = agent_project(&[PASS], "max_iterations = 1");
    let gate = |j: &Value| -> String {
        let node = j["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["id"] == "gate");
        node.unwrap()["status"].as_str().unwrap().to_string()
    };
    let ran = p.run_json("l", &[]).json();
    assert_eq!(gate(&ran), "ok");
    let halted = p.run_json("l", &[]).json();
    assert_eq!(halted["outcome"], "halt");
    assert_eq!(gate(&halted), "halt");
    let skipped = p.run_json("l", &[]).json();
    assert_eq!(skipped["outcome"], "skip");
    assert_eq!(gate(&skipped), "skip");
}

/// A loop is its directory: one copied with its state file (`cp -r loops/l loops/m`, to
/// start a second loop like the first) is `m` everywhere — status and its rows — never the
/// `l` its copied state still names; the gate refuses it as run does, and it does not tick on
/// `l`'s history (nor in `l`'s worktree) until it is started fresh, as the refusal says.
#[test]
fn a_copied_loop_directory_is_named_by_its_directory_and_ticks_only_once_started() {
    let p = agent_project(&[HALF], "");
    let (from, to) = (p.loop_dir("l"), p.loop_dir("m"));
    cp_a(&from, &to);
    let state = std::fs::read(to.join(".state.loop")).unwrap();
    let r = p.lf(&["run", "--loop", "m"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(
        r.stderr
            .contains("this state file is loop `l`'s, not `m`'s")
            && r.stderr.contains("loopflow create --loop m"),
        "{r:?}"
    );
    assert_eq!(std::fs::read(to.join(".state.loop")).unwrap(), state);
    assert!(
        p.events("m")
            .last()
            .is_some_and(|e| e == "ERROR reason=state_of_another_loop"),
        "{:?}",
        p.events("m")
    );

    let r = p.lf(&["halt", "--loop", "m", "--reason", "copied"]);
    assert_eq!(r.code, 0, "{r:?}");
    let names = |p: &Project| -> Vec<String> {
        let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
        j["loops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&p), ["l", "m"]);
    let r = p.lf(&["status"]);
    assert_eq!(state_cell(&r, "l"), "ok", "{r:?}");
    assert!(state_cell(&r, "m").starts_with("HALTED"), "{r:?}");
    assert!(
        r.stdout
            .contains("note: m: its state file is loop `l`'s (the directory was copied"),
        "{r:?}"
    );
    // The gate and can-continue refuse what run refuses (and never advise approving `l`).
    for r in [
        p.lf(&["gate", "--loop", "m"]),
        p.lf(&["can-continue", "--loop", "m"]),
    ] {
        assert_eq!(r.code, 4, "{r:?}");
        assert!(
            r.stderr
                .contains("this state file is loop `l`'s, not `m`'s")
                && !r.stdout.contains("approve --loop l"),
            "{r:?}"
        );
    }

    // What the refusal says to do.
    std::fs::remove_file(to.join(".state.loop")).unwrap();
    std::fs::remove_file(to.join(".state.log")).unwrap();
    let r = p.create("m", Some("its own task"));
    assert_eq!(r.code, 0, "{r:?}");
    let r = p.lf(&["run", "--loop", "m", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let r = p.lf(&["status"]);
    assert!(!r.stdout.contains("note: m:"), "{r:?}");
    assert_eq!(names(&p), ["l", "m"]);

    // The name a foreign state file carries is its text, escaped before it is printed.
    cp_a(&from, &p.loop_dir("n"));
    p.edit_state("n", |s| s["name"] = "x\u{1b}]0;pwned\u{7}".into());
    for r in [p.lf(&["run", "--loop", "n"]), p.lf(&["status"])] {
        assert!(
            !r.stdout.contains('\u{1b}') && !r.stderr.contains('\u{1b}'),
            "{r:?}"
        );
        assert!(
            (r.stdout.clone() + &r.stderr).contains("x\\u{1b}]0;pwned\\u{7}"),
            "{r:?}"
        );
    }
}

// ---- display safety -----------------------------------------------------------------------

#[test]
fn status_escapes_what_splits_or_reorders_a_row() {
    let p = Project::new();
    let r = p.lf(&[
        "create",
        "--loop",
        "x",
        "--no-worktree",
        "--task",
        "first\u{2028}second\u{2029}third \u{202e}desrever\u{2066}x\u{200b}y",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = p.lf(&["status"]);
    assert_eq!(r.code, 0, "{r:?}");
    for c in ['\u{2028}', '\u{2029}', '\u{202e}', '\u{2066}', '\u{200b}'] {
        assert!(!r.stdout.contains(c), "{c:?} raw in {:?}", r.stdout);
    }
    assert_eq!(
        r.stdout
            .lines()
            .filter(|l| !l.starts_with("sandbox: "))
            .count(),
        2,
        "one header, one row: {:?}",
        r.stdout
    );
    assert!(r.stdout.contains("first\\u{2028}second"), "{:?}", r.stdout);
    // JSON keeps the value, escaped.
    let j = p.lf(&["status", "--json"]).stdout;
    assert!(!j.contains('\u{2028}') && j.contains("\\u2028"), "{j}");
    let v: Value = serde_json::from_str(&j).unwrap();
    assert!(
        v["loops"][0]["current_task"]
            .as_str()
            .unwrap()
            .contains('\u{2028}')
    );
}

#[test]
fn log_escapes_utf8_c1_controls_an_agent_wrote() {
    let p = agent_project(&[HALF], "");
    let log = p.loop_dir("l").join(".state.log");
    let mut raw = std::fs::read(&log).unwrap();
    // U+009B (CSI) and U+0085 (NEL) as UTF-8, U+2028, and a lone invalid byte.
    raw.extend_from_slice("forged \u{9b}2J \u{85}next\u{2028}line \u{202e}x\n".as_bytes());
    raw.extend_from_slice(b"bad \xff byte\n");
    std::fs::write(&log, raw).unwrap();
    let r = p.lf(&["log", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    for c in ['\u{9b}', '\u{85}', '\u{2028}', '\u{202e}'] {
        assert!(!r.stdout.contains(c), "{c:?} raw in {:?}", r.stdout);
    }
    assert!(
        r.stdout.contains("forged \\u{9b}2J \\u{85}next"),
        "{:?}",
        r.stdout
    );
    assert!(r.stdout.contains("bad \\xff byte"), "{:?}", r.stdout);
    let j = p.lf(&["log", "--loop", "l", "--json"]).stdout;
    assert!(!j.contains('\u{9b}') && j.contains("\\u009b"), "{j}");
}

#[test]
fn check_quotes_a_huge_unknown_key_in_part() {
    let p = Project::new();
    let key = "k".repeat(10_000_000);
    let file = p.write("big.toml", &format!("name = \"x\"\n{key} = 1\n"));
    let r = p.lf(&["check", file.to_str().unwrap()]);
    assert_eq!(r.code, 3, "{r:?}");
    let all = r.stdout.len() + r.stderr.len();
    assert!(all < 10_000, "{all} bytes of diagnostics");
    assert!(
        (r.stdout.clone() + &r.stderr).contains(&format!("unknown key `{}…`", &key[..80])),
        "{r:?}"
    );
}

// ---- state files left by killed writes ------------------------------------------------------

#[test]
fn a_tick_removes_temp_files_of_killed_writes() {
    let p = agent_project(&[HALF], "");
    let dir = p.loop_dir("l");
    let stale = dir.join(".state.tmpKILLED");
    let fresh = dir.join(".state.tmpRECENT");
    std::fs::write(&stale, "{\"half\":").unwrap();
    std::fs::write(&fresh, "{\"half\":").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // A dry run writes nothing, temp files included.
    assert_eq!(p.lf(&["run", "--loop", "l", "--dry-run"]).code, 0);
    assert!(stale.exists());
    p.run_json("l", &[]);
    assert!(!stale.exists(), "a leftover of a killed write stays");
    // A minute-young one may belong to a write in progress beside the tick.
    assert!(fresh.exists());
}

/// A write killed an instant before the next tick leaves a young temp file: its writer's
/// pid (in the name) is gone, so the tick removes it at once; a young one whose writer
/// lives (a `halt` writing beside the tick) stays.
#[test]
fn a_tick_removes_a_young_temp_file_whose_writer_is_dead() {
    let p = agent_project(&[HALF], "");
    let dir = p.loop_dir("l");
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let orphan = dir.join(format!(".state.tmp.{dead_pid}.Ab3dEf"));
    let live = dir.join(format!(".state.tmp.{}.Xy9zQw", std::process::id()));
    std::fs::write(&orphan, "{\"half\":").unwrap();
    std::fs::write(&live, "{\"half\":").unwrap();
    p.run_json("l", &[]);
    assert!(!orphan.exists(), "a dead writer's temp file stays");
    assert!(live.exists(), "a live writer's temp file was pulled away");
}

// ---- the demo's next steps work as printed -----------------------------------------------

#[test]
fn the_demo_prints_next_steps_that_work_as_printed() {
    let p = Project::new();
    // A directory name that needs quoting in a shell.
    let dir = p.join("my demo");
    let r = Run::of(loopflow(p.path()).args(["demo", "--dir", dir.to_str().unwrap()]));
    assert_eq!(r.code, 0, "{r:?}");
    let steps: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| !l.contains("Next steps"))
        .skip(1)
        .map(str::trim)
        .filter(|l| l.starts_with("loopflow "))
        .collect();
    assert_eq!(steps.len(), 3, "{r:?}");
    // `loopflow` on PATH, as README's Install section puts it there.
    let bin_dir: PathBuf = p.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(crate::support::bin(), bin_dir.join("loopflow")).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for step in steps {
        let o = Command::new("sh")
            .arg("-c")
            .arg(step)
            .current_dir(p.path())
            .env("PATH", &path)
            .env_remove("LOOPFLOW_PROJECT")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "`{step}`: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// A loop committed without worktrees (`[worktree] enabled = false`) is started as its
/// loop.toml says: `create` does not announce a worktree it never made.
#[test]
fn an_adopted_loop_without_worktrees_is_announced_without_one() {
    let p = Project::new();
    let r = p.lf(&["create", "--loop", "a", "--task", "t", "--no-worktree"]);
    assert_eq!(r.code, 0, "{r:?}");
    let a = p.loop_dir("a");
    p.write(
        ".loopflow/loops/b/loop.toml",
        &std::fs::read_to_string(a.join("loop.toml")).unwrap(),
    );
    for e in std::fs::read_dir(a.join("prompts")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        p.write(
            &format!(".loopflow/loops/b/prompts/{name}"),
            &std::fs::read_to_string(e.path()).unwrap(),
        );
    }
    let s = p.lf(&["status"]);
    assert!(s.stdout.contains("not started: b has a loop.toml"), "{s:?}");
    let r = p.lf(&["create", "--loop", "b"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("started loop `b`"), "{r:?}");
    assert!(!r.stdout.contains("worktree:"), "{r:?}");
    assert!(!p.loop_dir("b").join("worktree").exists());
    let s = p.lf(&["status"]);
    assert!(!s.stdout.contains("not started"), "{s:?}");
    assert_eq!(
        s.stdout.lines().filter(|l| l.starts_with("b ")).count(),
        1,
        "{s:?}"
    );
}
