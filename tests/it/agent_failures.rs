//! An agent that fails says why where the human looks: `run` prints its own words (the
//! error its JSON result reports, else the tail of its stderr, escaped) and where its
//! output files are; `status`, `status --json`, `review --json` and the state keep the last
//! abort's reason until a tick commits. A provider's usage limit, reported the way Claude
//! Code reports it, is a skip that every loop of that credential shares, never an abort.

use std::path::Path;

use serde_json::Value;

use crate::support::{LoopToml, Project};

/// A loop whose every role runs `agent`, a fake agent script.
fn failing_loop(p: &Project, body: &str) {
    let agent = p.script("agent.sh", body);
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            .brakes("max_consecutive_aborts = 2"),
    );
}

#[test]
fn a_failing_agent_says_why_in_run_status_and_review() {
    let p = Project::new();
    failing_loop(
        &p,
        "echo 'starting up'\n\
         printf 'Traceback (most recent call last):\\n  File \"agent.py\", line 3\\n\\033[31mValueError: no API key configured\\033[0m\\n' >&2\n\
         exit 1",
    );
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let out = p.loop_dir("l").join("outputs");
    let want = format!(
        "loop l aborted (implement:exit:1), iteration 0\n  implement said: Traceback (most recent call last):\n      File \"agent.py\", line 3\n    \\u{{1b}}[31mValueError: no API key configured\\u{{1b}}[0m\n  its output: {}, {}\n",
        out.join("1-implement.stdout").display(),
        out.join("1-implement.stderr").display()
    );
    assert_eq!(r.stdout, want, "{r:?}");

    // --json: the same, for scripts.
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    let s = r.json();
    assert_eq!(s["outcome"], "halt", "{r:?}");
    assert_eq!(s["reason"], "human_intervention:harness_failing");
    assert_eq!(s["failure"]["node"], "implement");
    assert!(
        s["failure"]["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("ValueError: no API key configured\u{1b}[0m")),
        "{s}"
    );
    assert!(r.stderr.contains("implement said: Traceback"), "{r:?}");

    // The state keeps it, relative to the loop's directory; status and review show it.
    let st = p.state("l");
    let a = &st["last_abort"];
    assert_eq!(
        (a["node"].as_str(), a["reason"].as_str()),
        (Some("implement"), Some("exit:1")),
        "{st}"
    );
    assert_eq!(
        a["outputs"],
        serde_json::json!(["outputs/1-implement.stdout", "outputs/1-implement.stderr"])
    );
    let r = p.lf(&["status"]);
    assert!(
        r.stdout.contains(
            "note: l: last abort (implement exit:1, "
        ) && r.stdout.contains(
            "): Traceback (most recent call last): |   File \"agent.py\", line 3 | \\u{1b}[31mValueError: no API key configured\\u{1b}[0m (see .loopflow/loops/l/outputs/1-implement.stdout)\n"
        ),
        "{r:?}"
    );
    let v: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).expect("json");
    assert!(
        v["loops"][0]["last_abort"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("no API key configured")),
        "{v}"
    );
    let v: Value =
        serde_json::from_str(&p.lf(&["review", "--loop", "l", "--json"]).stdout).expect("json");
    assert_eq!(v["last_abort"]["node"], "implement", "{v}");
    let r = p.lf(&["review", "--loop", "l"]);
    assert!(r.stdout.contains("last abort "), "{r:?}");
    assert!(r.stdout.contains("(implement exit:1): Traceback"), "{r:?}");
}

/// A fake `claude` on PATH that answers as Claude Code does with `body` as its JSON
/// result (exit `code`).
fn fake_claude(p: &Project, json: &str, code: i32) -> std::path::PathBuf {
    let bin = p.join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    p.script(
        "bin/claude",
        &format!("cat >/dev/null\nprintf '%s\\n' '{json}'\nexit {code}"),
    );
    bin
}

fn preset_loop(p: &Project) {
    p.with_loop(
        "l",
        &LoopToml::new()
            .table("harness", "preset = \"claude-code\"")
            .brakes("max_consecutive_aborts = 2"),
    );
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn a_preset_agent_says_why_in_its_own_words() {
    let p = Project::new();
    let home = Project::new();
    let bin = fake_claude(
        &p,
        r#"{"type":"result","subtype":"success","is_error":true,"result":"Invalid API key · Please run /login","total_cost_usd":0}"#,
        1,
    );
    preset_loop(&p);
    let path = path_with(&bin);
    let env = [
        ("PATH", path.as_str()),
        ("HOME", home.path().to_str().expect("utf-8")),
    ];
    let r = p.lf_env(&["run", "--loop", "l"], &env);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.starts_with(
            "loop l aborted (implement:exit:1), iteration 0\n  implement said: Invalid API key · Please run /login\n  its output: "
        ),
        "{r:?}"
    );
    assert_eq!(
        p.state("l")["last_abort"]["message"],
        "Invalid API key · Please run /login"
    );
}

#[test]
fn a_usage_limit_skips_every_loop_of_the_credential_and_counts_no_abort() {
    let home = Project::new();
    let limited = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"API Error: Request rejected (429) · rate limit"}"#;
    let p = Project::new();
    let bin = fake_claude(&p, limited, 1);
    preset_loop(&p);
    let path = path_with(&bin);
    let key = [
        ("PATH", path.as_str()),
        ("HOME", home.path().to_str().expect("utf-8")),
        (
            "XDG_STATE_HOME",
            home.state_home.path().to_str().expect("utf-8"),
        ),
        ("ANTHROPIC_API_KEY", "sk-one"),
    ];
    for _ in 0..3 {
        let r = p.lf_env(&["run", "--loop", "l", "--json"], &key);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(
            (r.json()["outcome"].as_str(), r.json()["reason"].as_str()),
            (Some("skip"), Some("usage_limit")),
            "{r:?}"
        );
    }
    let st = p.state("l");
    assert_eq!(
        (
            st["consecutive_aborts"].as_u64(),
            st["iteration_count"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert!(st["halt"].is_null() && st["last_abort"].is_null(), "{st}");
    let skips: Vec<String> = p
        .events_after_create("l")
        .into_iter()
        .filter(|e| e.starts_with("SKIP"))
        .collect();
    assert_eq!(skips.len(), 3, "{skips:?}");
    assert!(
        skips
            .iter()
            .all(|s| s.starts_with("SKIP reason=usage_limit until=20")),
        "{skips:?}"
    );
    // Only the first tick ran the agent: the others skipped at the gate.
    let warns = p
        .events_after_create("l")
        .into_iter()
        .filter(|e| e.starts_with("WARN node=implement"))
        .count();
    assert_eq!(warns, 1);

    // Another project, the same credential: skips. Another key: runs its agent.
    let q = Project::new();
    let qbin = fake_claude(&q, r#"{"type":"result","is_error":false,"result":"ok"}"#, 0);
    preset_loop(&q);
    let qpath = path_with(&qbin);
    let same = [
        ("PATH", qpath.as_str()),
        ("HOME", home.path().to_str().expect("utf-8")),
        (
            "XDG_STATE_HOME",
            home.state_home.path().to_str().expect("utf-8"),
        ),
        ("ANTHROPIC_API_KEY", "sk-one"),
    ];
    let r = q.lf_env(&["run", "--loop", "l", "--json"], &same);
    assert_eq!(r.json()["reason"], "usage_limit", "{r:?}");
    let other = [
        ("PATH", qpath.as_str()),
        ("HOME", home.path().to_str().expect("utf-8")),
        (
            "XDG_STATE_HOME",
            home.state_home.path().to_str().expect("utf-8"),
        ),
        ("ANTHROPIC_API_KEY", "sk-two"),
    ];
    let r = q.lf_env(&["run", "--loop", "l", "--json"], &other);
    assert_ne!(r.json()["reason"], "usage_limit", "{r:?}");
    // The record names neither key.
    let limits = home.state_home.path().join("loopflow/limits");
    for e in std::fs::read_dir(&limits).expect("limits dir").flatten() {
        let text = std::fs::read_to_string(e.path()).expect("record");
        assert!(
            !text.contains("sk-one") && !e.file_name().to_string_lossy().contains("sk-"),
            "{text}"
        );
    }
}

#[test]
fn the_daemon_sleeps_until_a_usage_limit_lifts() {
    let home = Project::new();
    let p = Project::new();
    let bin = fake_claude(
        &p,
        r#"{"type":"result","is_error":true,"api_error_status":429,"result":"API Error: Request rejected (429) · rate limit"}"#,
        1,
    );
    preset_loop(&p);
    let path = path_with(&bin);
    let mut c = p.lf_cmd(&["daemon", "--loop", "l", "--interval", "1"]);
    c.env("PATH", &path)
        .env("HOME", home.path())
        .env("ANTHROPIC_API_KEY", "sk-one")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let child = c.spawn().expect("daemon");
    let skips = || {
        p.events_after_create("l")
            .into_iter()
            .filter(|e| e.starts_with("SKIP"))
            .count()
    };
    crate::support::wait_until("the first tick's skip", || skips() >= 1);
    // Every second it would tick again; it sleeps until the limit lifts instead.
    std::thread::sleep(std::time::Duration::from_secs(4));
    assert_eq!(skips(), 1, "{:?}", p.events_after_create("l"));
    // SAFETY: a signal to the daemon this test started.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().expect("daemon output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("loopflow daemon: loop l waits for its agent's usage limit until 20"),
        "{err}"
    );
}
