//! `[notify]`: a command run at every halt with the event JSON on stdin. Notifiers here are
//! sh scripts that record their argv and stdin; failing and hanging ones must change
//! nothing but a `WARN` line.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{LoopToml, Project, array, standard_agent, wait_until};

/// A notifier that appends its argv (one line, `|`-separated) to `argv.log` and its stdin
/// (one JSON line) to `events.log`, then runs `tail` (a shell snippet).
fn recorder(p: &Project, tail: &str) -> PathBuf {
    p.script(
        "notify.sh",
        &format!(
            r#"printf '%s|' "$@" >> "{argv}"; echo >> "{argv}"
cat >> "{events}"
echo "pwd=$(pwd -P) loop=$LOOPFLOW_LOOP" >> "{env}"
{tail}"#,
            argv = p.join("argv.log").display(),
            events = p.join("events.log").display(),
            env = p.join("env.log").display(),
        ),
    )
}

fn events(p: &Project) -> Vec<Value> {
    p.read("events.log")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn notify_table(cmd: &Path, args: &[&str]) -> String {
    let mut argv = vec![cmd.display().to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    format!("command = {}", array(&argv))
}

/// Loop `l` on the standard agent with `verdicts`, `brakes`, and `[notify] notify`.
fn loop_with(p: &Project, verdicts: &[&str], brakes: &str, notify: &str) {
    let agent = standard_agent(p, verdicts);
    let mut t = LoopToml::new().harness_agent(&agent).brakes(brakes);
    if !notify.is_empty() {
        t = t.table("notify", notify);
    }
    p.with_loop("l", &t);
}

#[test]
fn goal_met_notifies_with_the_event_on_stdin_and_rendered_argv() {
    let p = Project::new();
    let n = recorder(&p, "");
    loop_with(
        &p,
        &[r#"{"pass": true, "score": 1.0, "reasons": ["all done"], "cost_usd": 0.25}"#],
        "",
        &notify_table(
            &n,
            &[
                "{{loop}} {{reason}}",
                "iter={{iteration}}",
                "{{review}}",
                "{{death}}/{{task}}",
            ],
        ),
    );
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "halt", "{r:?}");
    let ev = events(&p);
    assert_eq!(ev.len(), 1, "one halt, one event: {ev:?}");
    let e = &ev[0];
    let keys: Vec<&str> = e.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "event",
            "loop",
            "project",
            "reason",
            "detail",
            "iteration",
            "at",
            "spent",
            "last_verdict",
            "review",
        ],
        "exactly DESIGN §13's keys"
    );
    assert_eq!(e["event"], "halt");
    assert_eq!(e["loop"], "l");
    assert_eq!(e["project"], p.path().display().to_string());
    assert_eq!(e["reason"], "goal_met");
    assert_eq!(e["iteration"], 1);
    assert_eq!(e["spent"]["usd"], 0.25);
    assert_eq!(e["last_verdict"]["reasons"][0], "all done");
    assert_eq!(e["at"], p.state("l")["halt"]["at"]);
    let review = format!("loopflow review --loop l --project {}", p.path().display());
    assert_eq!(e["review"], review.as_str());
    assert_eq!(
        p.read("argv.log").trim_end(),
        format!("l goal_met|iter=1|{review}|goal_met/the task|")
    );
    // The notifier runs in the project, told which loop.
    let env = p.read("env.log");
    assert!(
        env.contains(&format!(
            "pwd={} loop=l",
            p.path().canonicalize().unwrap().display()
        )),
        "{env}"
    );
    assert!(
        !p.events("l").iter().any(|e| e.starts_with("WARN")),
        "{:?}",
        p.events("l")
    );
}

#[test]
fn every_kind_of_halt_notifies_once() {
    let p = Project::new();
    let n = recorder(&p, "");
    // Tick 1 fails, tick 2's verdict is unparseable, and the cap of 3 comes after.
    loop_with(
        &p,
        &[r#"{"pass": false, "score": 0.2}"#, "no verdict here"],
        "max_iterations = 1",
        &notify_table(&n, &["{{reason}}", "{{death}}"]),
    );
    assert_eq!(p.run_json("l", &[]).json()["outcome"], "tick");
    assert_eq!(p.run_json("l", &[]).json()["outcome"], "halt");
    assert_eq!(p.lf(&["approve", "--loop", "l", "--extend", "1"]).code, 0);
    assert_eq!(p.run_json("l", &[]).json()["outcome"], "halt");
    assert_eq!(p.lf(&["approve", "--loop", "l"]).code, 0);
    let r = p.lf(&["halt", "--loop", "l", "--reason", "lunch break"]);
    assert_eq!(r.code, 0, "{r:?}");
    let reasons: Vec<String> = events(&p)
        .iter()
        .map(|e| e["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        reasons,
        [
            "iterations_exhausted",
            "verifier_failed:unparseable",
            "lunch break"
        ]
    );
    assert_eq!(
        p.read("argv.log"),
        "iterations_exhausted|iterations_exhausted|\nverifier_failed:unparseable|verifier_failed|\nlunch break|human_intervention|\n"
    );
}

#[test]
fn a_failing_notifier_logs_warn_and_changes_nothing_else() {
    let p = Project::new();
    let n = recorder(&p, "echo 'boom: no route' >&2; exit 3");
    loop_with(
        &p,
        &[r#"{"pass": true, "score": 1.0}"#],
        "",
        &notify_table(&n, &[]),
    );
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "halt");
    assert_eq!(p.state("l")["halt"]["reason"], "goal_met");
    assert_eq!(p.state("l")["iteration_count"], 1);
    let warn: Vec<String> = p
        .events("l")
        .into_iter()
        .filter(|e| e.starts_with("WARN"))
        .collect();
    assert_eq!(
        warn,
        ["WARN notify=failed reason=\"exit:3: boom: no route\""]
    );
    // A notifier that cannot even start: same.
    let q = Project::new();
    loop_with(
        &q,
        &[r#"{"pass": true, "score": 1.0}"#],
        "",
        &notify_table(&q.join("no-such-notifier"), &[]),
    );
    assert_eq!(q.run_json("l", &[]).json()["outcome"], "halt");
    let warn = q.events("l").into_iter().find(|e| e.starts_with("WARN"));
    assert!(
        warn.as_deref().is_some_and(
            |w| w.starts_with("WARN notify=failed reason=\"spawn:") && w.contains("not found")
        ),
        "{warn:?}"
    );
}

#[test]
fn a_hanging_notifier_is_stopped_at_its_timeout_with_its_children() {
    let p = Project::new();
    let pidfile = p.join("child.pid");
    let n = recorder(
        &p,
        &format!("sleep 300 & echo $! > \"{}\"; wait", pidfile.display()),
    );
    loop_with(
        &p,
        &[r#"{"pass": true, "score": 1.0}"#],
        "",
        &format!("{}\ntimeout = \"1s\"", notify_table(&n, &[])),
    );
    let start = Instant::now();
    let r = p.run_json("l", &[]);
    let took = start.elapsed();
    assert_eq!(r.json()["outcome"], "halt");
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let warn = p.events("l").into_iter().find(|e| e.starts_with("WARN"));
    assert_eq!(
        warn.as_deref(),
        Some("WARN notify=failed reason=\"timeout after 1s\"")
    );
    let pid = p.read("child.pid").trim().to_string();
    wait_until("the notifier's child to be gone", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_or(true, |s| s.split(' ').nth(2) == Some("Z"))
    });
}

#[test]
fn the_project_config_notifies_every_loop_and_a_loop_config_wins() {
    let p = Project::new();
    let n = recorder(&p, "");
    loop_with(&p, &[r#"{"pass": true, "score": 1.0}"#], "", "");
    let agent = p.join("agent.sh");
    p.with_loop(
        "own",
        &LoopToml::new()
            .harness_agent(&agent)
            .table("notify", &notify_table(&n, &["own:{{loop}}"])),
    );
    p.write(
        ".loopflow/config.toml",
        &format!("[notify]\n{}\n", notify_table(&n, &["project:{{loop}}"])),
    );
    assert_eq!(p.run_json("l", &[]).json()["outcome"], "halt");
    assert_eq!(p.run_json("own", &[]).json()["outcome"], "halt");
    assert_eq!(p.read("argv.log"), "project:l|\nown:own|\n");
    let c = p.lf(&["check"]);
    assert_eq!(c.code, 0, "{c:?}");
}

#[test]
fn check_reports_problems_in_the_project_config_and_notify_templates() {
    let p = Project::new();
    loop_with(&p, &[r#"{"pass": true, "score": 1.0}"#], "", "");
    p.write(
        ".loopflow/config.toml",
        "[notify]\ncommand = [\"notify-send\", \"{{loops}}\"]\ntimeot = \"5s\"\n\n[brakes]\n",
    );
    let r = p.lf(&["check", "--format", "json"]);
    assert_eq!(r.code, 3, "{r:?}");
    let doc: Value = serde_json::from_str(&r.stdout).expect("json");
    let found: Vec<(String, String, u64)> = doc["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["code"].as_str().unwrap().to_string(),
                d["file"].as_str().unwrap().to_string(),
                d["line"].as_u64().unwrap(),
            )
        })
        .collect();
    for (code, line) in [
        ("unknown-variable", 2),
        ("unknown-key", 3),
        ("unknown-key", 5),
    ] {
        assert!(
            found
                .iter()
                .any(|(c, f, l)| c == code && f.ends_with(".loopflow/config.toml") && *l == line),
            "{code} at line {line} in {found:?}"
        );
    }
    let human = p.lf(&["check"]);
    assert!(human.stdout.contains("did you mean `loop`?"), "{human:?}");
    // A broken project config does not stop halts from being recorded (or the loop).
    assert_eq!(p.run_json("l", &[]).json()["outcome"], "halt");
    let warn = p.events("l").into_iter().find(|e| e.starts_with("WARN"));
    assert!(
        warn.as_deref()
            .is_some_and(|w| w.contains("config.toml has errors")),
        "{warn:?}"
    );
}

/// The shipped examples parse as `[notify]` tables (in loop.toml and as a project config)
/// and render: fake `notify-send`, `curl` and `gh` on PATH record what they were given.
#[test]
fn the_shipped_example_notifiers_check_and_render() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/notify");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".config.toml"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    for example in names {
        let text = std::fs::read_to_string(&example).unwrap();
        let p = Project::new();
        let fakes = p.join("fakes");
        for tool in ["notify-send", "curl", "gh"] {
            p.script(
                &format!("fakes/{tool}"),
                &format!(
                    "printf '%s\\n' \"$@\" > \"{argv}\"; cat > \"{stdin}\"",
                    argv = p.join("argv.txt").display(),
                    stdin = p.join("stdin.txt").display()
                ),
            );
        }
        // As one loop's [notify] table...
        let agent = standard_agent(&p, &[r#"{"pass": true, "score": 1.0}"#]);
        let body = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.trim() != "[notify]")
            .collect::<Vec<_>>()
            .join("\n");
        p.with_loop(
            "l",
            &LoopToml::new().harness_agent(&agent).table("notify", &body),
        );
        let c = p.lf(&["check", "--deny-warnings"]);
        assert_eq!(c.code, 0, "{}: {c:?}", example.display());
        // ...and as the project's config.
        p.write(".loopflow/config.toml", &text);
        let c = p.lf(&["check", "--deny-warnings"]);
        assert_eq!(c.code, 0, "{}: {c:?}", example.display());
        let path = format!(
            "{}:{}",
            fakes.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let r = p.lf_env(&["run", "--loop", "l"], &[("PATH", &path)]);
        assert_eq!(r.code, 0, "{r:?}");
        let argv = p.read("argv.txt");
        assert!(
            !argv.is_empty(),
            "{}: the notifier did not run",
            example.display()
        );
        assert!(
            !argv.contains("{{"),
            "{}: unrendered: {argv}",
            example.display()
        );
        if text.contains("{{reason}}") {
            assert!(argv.contains("goal_met"), "{}: {argv}", example.display());
        }
        let stdin: Value = serde_json::from_str(p.read("stdin.txt").trim()).expect("event");
        assert_eq!(stdin["reason"], "goal_met");
        assert!(
            !p.events("l").iter().any(|e| e.starts_with("WARN")),
            "{}: {:?}",
            example.display(),
            p.events("l")
        );
    }
}

#[test]
fn a_broken_loop_toml_does_not_silence_the_project_notifier() {
    let p = Project::new();
    let n = recorder(&p, "");
    loop_with(&p, &[r#"{"pass": true, "score": 1.0}"#], "", "");
    p.write(
        ".loopflow/config.toml",
        &format!(
            "[notify]\n{}\n",
            notify_table(&n, &["{{loop}}: {{reason}}"])
        ),
    );
    let toml = p.loop_dir("l").join("loop.toml");
    let broken = std::fs::read_to_string(&toml).unwrap() + "\nnot toml at all [[[\n";
    std::fs::write(&toml, broken).unwrap();
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 3);
    let r = p.lf(&["halt", "--loop", "l", "--reason", "fix the config"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.read("argv.log"), "l: fix the config|\n");
}

/// A `loopflow run` killed after writing a halt and before announcing it leaves a halted
/// loop nobody was told about: the next run announces it — the `HALT` line marked
/// `recovered=true`, the notifier — once, and a dry run never does.
#[test]
fn a_halt_whose_announcement_was_lost_is_announced_by_the_next_run() {
    let p = Project::new();
    let n = recorder(&p, "");
    loop_with(
        &p,
        &[r#"{"pass": true, "score": 1.0, "reasons": ["all done"]}"#],
        "",
        &notify_table(&n, &["{{reason}}"]),
    );
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(events(&p).len(), 1);
    // What a kill right after the commit's state write and TICK line leaves behind.
    let log_path = p.loop_dir("l").join(".state.log");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let kept: Vec<&str> = log
        .lines()
        .filter(|l| !l.contains(" HALT ") && !l.contains(" SCHEDULE "))
        .collect();
    std::fs::write(&log_path, kept.join("\n") + "\n").unwrap();
    std::fs::write(p.join("events.log"), "").unwrap();

    assert_eq!(p.lf(&["run", "--loop", "l", "--dry-run"]).code, 0);
    assert!(!p.events("l").iter().any(|e| e.starts_with("HALT")));
    assert_eq!(p.read("events.log"), "", "a dry run tells nobody");

    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let halts: Vec<String> = p
        .events("l")
        .into_iter()
        .filter(|e| e.starts_with("HALT"))
        .collect();
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(halts[0].starts_with("HALT goal_met"), "{halts:?}");
    assert!(halts[0].ends_with("recovered=true"), "{halts:?}");
    let ev = events(&p);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["reason"], "goal_met", "{ev:?}");
    // The iteration did not move: the recovered halt still stops the loop.
    assert_eq!(p.state("l")["iteration_count"], 1);

    // Announced once: the next run finds the line and only skips.
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(
        p.events("l")
            .iter()
            .filter(|e| e.starts_with("HALT"))
            .count(),
        1
    );
    assert_eq!(events(&p).len(), 1);
    // A halt stamped later than its line (a commit that restored a halt the state lost
    // stamps its own time) still has its line: order decides, not times.
    let state_path = p.loop_dir("l").join(".state.loop");
    let mut st: Value =
        serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
    st["halt"]["at"] = "2099-01-01T00:00:00Z".into();
    std::fs::write(&state_path, serde_json::to_string_pretty(&st).unwrap()).unwrap();
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let halts = p
        .events("l")
        .into_iter()
        .filter(|e| e.starts_with("HALT"))
        .count();
    assert_eq!(halts, 1);
    assert_eq!(events(&p).len(), 1);
}
