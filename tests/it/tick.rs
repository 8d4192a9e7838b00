//! The tick end to end (the seed's R7 list, translated, plus the tick issue's extras),
//! driving the real binary with fake-agent scripts in temp dirs.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{
    LoopToml, Project, Run, assert_log_line, bin, count, has, loopflow, standard_agent,
    wait_for_file, wait_or_kill, wait_until,
};
use serde_json::Value;

const PASS_09: &str = r#"{"pass": true, "score": 0.9}"#;

// ---- R7 1: a passing tick -------------------------------------------------------------

#[test]
fn tick_pass_advances_and_logs() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "goal_score = 1.0");
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 1);
    assert_eq!(s["last_verdict"]["pass"], true);
    assert_eq!(s["last_verdict"]["score"], 0.9);
    assert_eq!(s["score_history"], serde_json::json!([0.9]));
    assert!(s["last_tick_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(s["halt"].is_null(), "{s}");
    assert_eq!(
        p.events_after_create("l"),
        vec!["TICK pass=true score=0.9 iter=1"]
    );
    // R7 13: implement → verify → orchestrate, once each.
    assert_eq!(
        p.read("calls.log"),
        "implement 1\nverify 1\norchestrate 1\n"
    );
    assert_eq!(p.read("work.txt"), "tick 1\n");
}

// ---- R7 2: halted loops skip ------------------------------------------------------------

#[test]
fn halted_loop_skips_without_advancing() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "");
    assert_eq!(p.lf(&["halt", "--loop", "l", "--reason", "paused"]).code, 0);
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.state("l")["iteration_count"], 0);
    assert_eq!(
        p.events_after_create("l"),
        vec!["HALT paused", "SKIP reason=halted:paused"]
    );
    assert!(!p.join("calls.log").exists(), "no agent may run");
}

// ---- R7 3: a loop directory without state -----------------------------------------------

#[test]
fn untracked_loop_dir_skips_cleanly() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "");
    std::fs::remove_file(p.loop_dir("l").join(".state.loop")).unwrap();
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.events_after_create("l"), vec!["SKIP reason=untracked"]);
    assert!(
        !p.loop_dir("l").join(".state.loop").exists(),
        "run must not invent a state file"
    );
    assert!(!p.join("calls.log").exists());
}

// ---- R7 4: no current task -------------------------------------------------------------

#[test]
fn no_current_task_skips() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.with_loop_task("l", None, &LoopToml::new().harness_agent(&agent));
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "skip");
    assert_eq!(r.json()["reason"], "no_current_task");
    assert_eq!(
        p.events_after_create("l"),
        vec!["SKIP reason=no_current_task"]
    );
    assert!(p.state("l")["current_task"].is_null());
    assert_eq!(p.state("l")["iteration_count"], 0);
}

// ---- R7 5 + extras: verdict parsing ------------------------------------------------------

fn one_tick_with_verdict(verdict: &str) -> (Project, Run) {
    let p = Project::new();
    let agent = p.script(
        "agent.sh",
        &format!(
            "echo \"$1\" >> \"{calls}\"\n[ \"$1\" = verify ] && cat \"{v}\"\nexit 0",
            calls = p.join("calls.log").display(),
            v = p.join("verdict.txt").display()
        ),
    );
    p.write("verdict.txt", verdict);
    p.agent_loop("l", &agent, "");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    (p, r)
}

fn assert_unparseable(verdict: &str) {
    let (p, r) = one_tick_with_verdict(verdict);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "halt", "{verdict}");
    assert_eq!(r.json()["reason"], "verifier_failed:unparseable");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 0, "R6: nothing advances");
    assert!(s["last_verdict"].is_null());
    assert_eq!(s["score_history"], serde_json::json!([]));
    assert_eq!(s["halt"]["reason"], "verifier_failed:unparseable");
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(
        ev[0].starts_with("HALT verifier_failed:unparseable"),
        "{ev:?}"
    );
    // The orchestrator never runs on a verdict that is not one.
    assert_eq!(p.read("calls.log"), "implement\nverify\n");
}

#[test]
fn garbage_verdict_halts_unparseable() {
    assert_unparseable("I think it went well!\n");
}

#[test]
fn out_of_range_or_malformed_verdicts_halt() {
    for bad in [
        r#"{"pass": true, "score": 1.5}"#,
        r#"{"pass": true, "score": -0.1}"#,
        r#"{"pass": "yes", "score": 0.5}"#,
        r#"{"score": 0.5}"#,
        r#"{"pass": true, "score": 0.5, "confidence": 3}"#,
        "",
    ] {
        assert_unparseable(bad);
    }
}

#[test]
fn fenced_and_commented_verdicts_parse() {
    let fenced = "Here is my review.\n```json\n{\"pass\": false, \"score\": 0.1}\n```\nand later:\n```json\n{\"pass\": true, \"score\": 0.7, \"reasons\": [\"ok\"]}\n```\nbye\n";
    let slashes = "// verifier v2\n// graded\n{\"pass\": true, \"score\": 0.6}\n";
    let hashes = "# verdict follows\n{\n  \"pass\": false,\n  \"score\": 0.25\n}\n";
    for (text, pass, score) in [
        (fenced, "true", "0.7"),
        (slashes, "true", "0.6"),
        (hashes, "false", "0.25"),
    ] {
        let (p, r) = one_tick_with_verdict(text);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(
            p.events_after_create("l"),
            vec![format!("TICK pass={pass} score={score} iter=1")],
            "{text}"
        );
        assert_eq!(p.state("l")["iteration_count"], 1);
    }
}

// ---- R7 6: score history capped, plateau halts at the right tick -------------------------

#[test]
fn score_history_is_capped_and_plateau_halts() {
    let p = Project::new();
    let v = |s: &str| format!(r#"{{"pass": false, "score": {s}}}"#);
    let verdicts = [v("0.5"), v("0.4"), v("0.4"), v("0.4"), v("0.4")];
    let refs: Vec<&str> = verdicts.iter().map(String::as_str).collect();
    let agent = standard_agent(&p, &refs);
    p.agent_loop("l", &agent, "score_plateau_window = 3");
    for _ in 0..5 {
        let r = p.lf(&["run", "--loop", "l"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    let s = p.state("l");
    assert_eq!(s["score_history"], serde_json::json!([0.4, 0.4, 0.4]));
    assert_eq!(s["iteration_count"], 4);
    assert_eq!(s["halt"]["reason"], "verifier_failed:score_plateau");
    let ev = p.events_after_create("l");
    assert_eq!(
        ev[..4],
        [
            "TICK pass=false score=0.5 iter=1",
            "TICK pass=false score=0.4 iter=2",
            "TICK pass=false score=0.4 iter=3",
            "TICK pass=false score=0.4 iter=4",
        ]
    );
    assert_eq!(ev.len(), 5, "{ev:?}");
    assert!(
        ev[4].starts_with("HALT verifier_failed:score_plateau"),
        "{ev:?}"
    );
    // The fifth run halted at the gate: no agent ran for it.
    assert_eq!(p.read("calls.log").lines().count(), 12);
}

// ---- R7 7: --json ----------------------------------------------------------------------

#[test]
fn json_summary_is_the_last_line() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j = r.json();
    let keys: Vec<&str> = j.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "loop",
            "outcome",
            "reason",
            "iteration",
            "pass",
            "score",
            "nodes"
        ]
    );
    assert_eq!(j["loop"], "l");
    assert_eq!(j["outcome"], "tick");
    assert!(j["reason"].is_null());
    assert_eq!(j["iteration"], 1);
    assert_eq!(j["pass"], true);
    assert_eq!(j["score"], 0.9);
    let nodes = j["nodes"].as_array().unwrap();
    let ids: Vec<&str> = nodes.iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "gate",
            "floor-check",
            "implement",
            "verify",
            "parse",
            "orchestrate",
            "land",
            "commit"
        ]
    );
    for n in nodes {
        assert_eq!(n["status"], "ok", "{n}");
        assert!(n["ms"].is_u64(), "{n}");
        assert_eq!(n.as_object().unwrap().len(), 3, "{n}");
    }
    // A skipped tick has the same shape.
    p.lf(&["halt", "--loop", "l", "--reason", "stop"]);
    let j = p.lf(&["run", "--loop", "l", "--json"]).json();
    assert_eq!(j["outcome"], "skip");
    assert_eq!(j["reason"], "halted:stop");
    assert_eq!(j["iteration"], 1);
}

// ---- R7 8: daemon ---------------------------------------------------------------------

#[test]
fn daemon_runs_n_ticks_and_stops() {
    let p = Project::new();
    let v = |s: &str| format!(r#"{{"pass": false, "score": {s}}}"#);
    let verdicts = [v("0.1"), v("0.2"), v("0.3")];
    let refs: Vec<&str> = verdicts.iter().map(String::as_str).collect();
    let agent = standard_agent(&p, &refs);
    p.agent_loop("l", &agent, "");
    let r = p.lf(&[
        "daemon",
        "--loop",
        "l",
        "--interval",
        "1",
        "--max-iterations",
        "3",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let ev = p.events_after_create("l");
    assert_eq!(
        ev,
        [
            "TICK pass=false score=0.1 iter=1",
            "TICK pass=false score=0.2 iter=2",
            "TICK pass=false score=0.3 iter=3",
            "DAEMON_STOPPED ticks=3",
        ]
    );
    assert_eq!(p.state("l")["iteration_count"], 3);
}

#[test]
fn daemon_stops_on_sigterm() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.1}"#]);
    p.agent_loop("l", &agent, "score_plateau_window = 50");
    let mut child = p.lf_spawn(&["daemon", "--loop", "l", "--interval", "3600"]);
    // The first tick runs at once; then the daemon sleeps for an hour.
    wait_until("the first tick", || {
        p.events_after_create("l")
            .iter()
            .any(|e| e.starts_with("TICK"))
    });
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(
        p.events_after_create("l"),
        ["TICK pass=false score=0.1 iter=1", "DAEMON_STOPPED ticks=1"]
    );
}

// ---- R7 9: the context floor -----------------------------------------------------------

#[test]
fn context_floor_halts_before_any_agent() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "context_tokens = 8000");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["reason"], "human_intervention:context_below_floor");
    let s = p.state("l");
    assert_eq!(
        s["halt"]["reason"],
        "human_intervention:context_below_floor"
    );
    assert_eq!(s["iteration_count"], 0);
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 1);
    assert!(
        ev[0].starts_with("HALT human_intervention:context_below_floor"),
        "{ev:?}"
    );
    assert!(!p.join("calls.log").exists(), "the agent must never run");
}

#[test]
fn context_floor_uses_min_context_tokens_and_detection() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    // Above the hard floor but below the loop's own floor.
    p.agent_loop(
        "l",
        &agent,
        "context_tokens = 20000\nmin_context_tokens = 32000",
    );
    p.lf(&["run", "--loop", "l"]);
    assert_eq!(
        p.state("l")["halt"]["reason"],
        "human_intervention:context_below_floor"
    );
    // No override: detection from the environment decides.
    p.with_loop(
        "m",
        &LoopToml::new()
            .harness_agent(&agent)
            .brakes_only("max_iterations = 10"),
    );
    let r = p.lf_env(
        &["run", "--loop", "m"],
        &[("LOOPFLOW_CONTEXT_TOKENS", "4096")],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        p.state("m")["halt"]["reason"],
        "human_intervention:context_below_floor"
    );
    assert!(!p.join("calls.log").exists());
}

// ---- R7 10: usage errors ----------------------------------------------------------------

#[test]
fn unknown_subcommand_or_flag_is_usage_error() {
    let p = Project::new();
    for args in [
        vec!["bogus"],
        vec!["run", "--loop", "l", "--bogus"],
        vec!["run"],
        vec!["daemon", "--loop", "l", "--interval", "soon"],
        vec!["approve", "--loop", "l", "--extend", "-1"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 2, "{args:?}: {r:?}");
        assert!(!r.stderr.is_empty());
    }
    assert!(!p.join(".loopflow").exists());
}

// ---- R7 11: an unknown loop -------------------------------------------------------------

#[test]
fn ghost_loop_warns_and_writes_nothing() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("other", &agent, "");
    let before = p.snapshot();
    let r = p.lf(&["run", "--loop", "ghost"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("warning") && r.stderr.contains("ghost"),
        "{r:?}"
    );
    assert_eq!(p.snapshot(), before, "nothing may be written anywhere");
    // Also in a project with no .loopflow at all.
    let q = Project::new();
    let r = q.lf(&["run", "--loop", "ghost", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(q.snapshot().is_empty());
}

// ---- R7 12: harness argv rendering -----------------------------------------------------

/// An agent that records its argv, one element per line, into `argv-<role>-<tick>.txt`.
fn argv_agent(p: &Project) -> std::path::PathBuf {
    p.script(
        "argv-agent.sh",
        &format!(
            r#"role="$1"
out="{dir}/argv-$role-$LOOPFLOW_TICK.txt"
: > "$out"
for a in "$@"; do printf '%s\n' "$a" >> "$out"; done
echo "$role" >> "{dir}/calls.log"
if [ "$role" = verify ]; then sed -n "${{LOOPFLOW_TICK}}p" "{dir}/verdicts" | grep . || tail -n 1 "{dir}/verdicts"; fi
exit 0"#,
            dir = p.path().display()
        ),
    )
}

fn argv_of(p: &Project, role: &str, tick: u32) -> Vec<String> {
    p.read(&format!("argv-{role}-{tick}.txt"))
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn harness_argv_reaches_the_agent_verbatim() {
    let p = Project::new();
    p.write("verdicts", "{\"pass\": false, \"score\": 0.2}\n");
    let agent = argv_agent(&p);
    p.with_loop_task(
        "l",
        Some("fix the \"parser\"; $(rm -rf /)"),
        &LoopToml::new().harness_command(
            &agent,
            &[
                "{{role}}",
                "--prompt-file",
                "{{prompt}}",
                "--cwd",
                "{{cwd}}",
                "--out={{output}}",
                "it's \"quoted\" $(touch pwned); x",
                "{{current_task}}",
                "{{iteration}}:{{loop}}:{{current_phase}}",
                "",
            ],
        ),
    );
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let outputs = p.loop_dir("l").join("outputs");
    for role in ["implement", "verify", "orchestrate"] {
        let argv = argv_of(&p, role, 1);
        let want = vec![
            role.to_string(),
            "--prompt-file".into(),
            outputs
                .join(format!("1-{role}.prompt.md"))
                .display()
                .to_string(),
            "--cwd".into(),
            p.path().display().to_string(),
            format!(
                "--out={}",
                p.join(&format!(".loopflow-out/l/1-{role}.json")).display()
            ),
            "it's \"quoted\" $(touch pwned); x".into(),
            "fix the \"parser\"; $(rm -rf /)".into(),
            "1:l:implement".into(),
            String::new(),
        ];
        assert_eq!(argv, want, "{role}");
        // The prompt file the agent is pointed at exists and is rendered.
        let prompt = std::fs::read_to_string(&want[2]).unwrap();
        assert!(!prompt.contains("{{"), "{prompt}");
        assert!(prompt.contains("iteration 1"), "{prompt}");
    }
    assert!(!p.join("pwned").exists());
    // R7 13: the order of calls.
    assert_eq!(p.read("calls.log"), "implement\nverify\norchestrate\n");
}

// ---- Extras: state safety, locking, approval ------------------------------------------

#[test]
fn corrupt_state_is_reported_and_never_overwritten() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "");
    let state_path = p.loop_dir("l").join(".state.loop");
    let corrupt = b"{\n  \"schema_version\": 1,\n  \"iteration_count\": 3,\n  oops\n}\n";
    std::fs::write(&state_path, corrupt).unwrap();
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains(".state.loop:4:3"), "{r:?}");
    assert_eq!(std::fs::read(&state_path).unwrap(), corrupt);
    assert!(!p.join("calls.log").exists(), "no agent on a corrupt state");
    // Every other writer refuses too, and leaves it alone.
    for args in [
        vec!["halt", "--loop", "l", "--reason", "x"],
        vec!["approve", "--loop", "l", "--extend", "1"],
        vec!["transition", "--loop", "l", "--to", "review"],
        vec!["gate", "--loop", "l"],
        vec!["status", "--loop", "l", "--json"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 4, "{args:?}: {r:?}");
        assert!(r.stderr.contains(".state.loop:4:3"), "{args:?}: {r:?}");
    }
    assert_eq!(std::fs::read(&state_path).unwrap(), corrupt);
    // A daemon keeps going (exit 0 after its attempts) but never rewrites it either.
    let r = p.lf(&[
        "daemon",
        "--loop",
        "l",
        "--interval",
        "1",
        "--max-iterations",
        "1",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(std::fs::read(&state_path).unwrap(), corrupt);
}

/// An agent whose implement role sleeps until `release` exists (or a minute passes),
/// after writing `started`.
fn slow_agent(p: &Project, verdict: &str) -> std::path::PathBuf {
    p.write("verdicts", &format!("{verdict}\n"));
    p.script(
        "slow.sh",
        &format!(
            r#"role="$1"
d="{dir}"
echo "$role" >> "$d/calls.log"
if [ "$role" = implement ]; then
  : > "$d/started"
  i=0
  while [ ! -e "$d/release" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
fi
[ "$role" = verify ] && head -n 1 "$d/verdicts"
exit 0"#,
            dir = p.path().display()
        ),
    )
}

#[test]
fn concurrent_runs_one_ticks_one_skips_locked() {
    let p = Project::new();
    let agent = slow_agent(&p, r#"{"pass": false, "score": 0.3}"#);
    p.agent_loop("l", &agent, "");
    // Start from iteration 1, so the locked summary's iteration can be checked.
    p.write("release", "");
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    std::fs::remove_file(p.join("release")).unwrap();
    std::fs::remove_file(p.join("calls.log")).unwrap();
    // The warm-up tick left its own marker; wait for the new tick's, not that one.
    std::fs::remove_file(p.join("started")).unwrap();
    let first = p.lf_spawn(&["run", "--loop", "l"]);
    wait_for_file(&p.join("started"));
    let second = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(second.code, 0, "{second:?}");
    assert_eq!(second.json()["outcome"], "skip");
    assert_eq!(second.json()["reason"], "locked");
    assert_eq!(second.json()["iteration"], 1);
    let status = p.lf(&["status", "--loop", "l", "--json"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(status.stdout.contains("\"running\": true"), "{status:?}");
    p.write("release", "");
    let out = first.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let ev = p.events_after_create("l");
    assert_eq!(count(&ev, "TICK pass=false score=0.3 iter=2"), 1, "{ev:?}");
    assert_eq!(count(&ev, "SKIP reason=locked"), 1, "{ev:?}");
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(p.state("l")["iteration_count"], 2);
    assert_eq!(p.read("calls.log"), "implement\nverify\norchestrate\n");
}

#[test]
fn approve_is_refused_inside_a_tick_and_accepted_after() {
    let p = Project::new();
    // The agent tries to extend its own loop from inside the tick, using the
    // environment loopflow gives it, and records the exit code.
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"role="$1"
if [ "$role" = implement ]; then
  "{bin}" approve --loop "$LOOPFLOW_LOOP" --project "$LOOPFLOW_PROJECT" --extend 50 --note self
  echo "approve=$?" >> "{dir}/approve.txt"
  "{bin}" approve --loop "$LOOPFLOW_LOOP" --extend 50
  echo "approve-env=$?" >> "{dir}/approve.txt"
fi
[ "$role" = verify ] && echo '{{"pass": false, "score": 0.4}}'
exit 0"#,
            bin = bin().display(),
            dir = p.path().display()
        ),
    );
    p.agent_loop("l", &agent, "");
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let got = p.read("approve.txt");
    let codes: Vec<&str> = got.lines().collect();
    assert_eq!(codes.len(), 2, "{got}");
    for c in codes {
        let code: i32 = c.split('=').nth(1).unwrap().parse().unwrap();
        assert_ne!(code, 0, "approve inside a tick must be refused: {c}");
    }
    let s = p.state("l");
    assert_eq!(s["extra_iterations"], 0);
    assert_eq!(s["approvals"], serde_json::json!([]));
    assert!(
        !p.events_after_create("l")
            .iter()
            .any(|e| e.starts_with("APPROVE"))
    );
    // After the tick, a human may.
    assert_eq!(p.lf(&["halt", "--loop", "l", "--reason", "review"]).code, 0);
    let r = p.lf(&[
        "approve",
        "--loop",
        "l",
        "--note",
        "looks fine",
        "--by",
        "alice",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let s = p.state("l");
    assert!(s["halt"].is_null());
    assert_eq!(s["approvals"][0]["by"], "alice");
    assert_eq!(s["approvals"][0]["note"], "looks fine");
    assert_eq!(s["approvals"][0]["cleared"], "review");
    assert!(
        p.events_after_create("l")
            .contains(&"APPROVE by=alice note=\"looks fine\" cleared=review".to_string()),
        "{:?}",
        p.events_after_create("l")
    );
}

#[test]
fn next_hint_reaches_argv_verbatim_and_is_never_run() {
    let p = Project::new();
    let hint = "$(touch pwned); rm -rf x `touch pwned2` <b>&amp;'";
    let verdict = serde_json::json!({
        "pass": false, "score": 0.3, "next_hint": hint, "reasons": ["$(touch pwned3)"]
    })
    .to_string();
    p.write("verdicts", &format!("{verdict}\n"));
    std::fs::create_dir(p.join("x")).unwrap();
    p.write("x/keep", "keep");
    let agent = argv_agent(&p);
    // The orchestrate role gets its own argv carrying the hint and the verdict.
    p.with_loop(
        "l",
        &LoopToml::new().harness_agent(&agent).role_command(
            "orchestrate",
            &agent,
            &["orchestrate", "--hint={{next_hint}}", "{{verdict}}"],
        ),
    );
    for _ in 0..2 {
        let r = p.lf(&["run", "--loop", "l"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    assert_eq!(
        p.state("l")["iteration_count"],
        2,
        "{:?}",
        p.events_after_create("l")
    );
    // Tick 1: no last verdict yet, so the hint is empty; the verdict is this tick's.
    let a1 = argv_of(&p, "orchestrate", 1);
    assert_eq!(a1[1], "--hint=");
    let v1: Value = serde_json::from_str(&a1[2]).unwrap();
    assert_eq!(v1["next_hint"], hint);
    // Tick 2: the hint of tick 1's verdict, verbatim.
    let a2 = argv_of(&p, "orchestrate", 2);
    assert_eq!(a2.len(), 3, "{a2:?}");
    assert_eq!(a2[1], format!("--hint={hint}"));
    let v2: Value = serde_json::from_str(&a2[2]).unwrap();
    assert_eq!(v2["next_hint"], hint);
    assert_eq!(v2["reasons"][0], "$(touch pwned3)");
    // The implement prompt of tick 2 shows the hint as text, unescaped.
    let prompt = p.output("l", "2-implement.prompt.md");
    assert!(prompt.contains(hint), "{prompt}");
    assert!(prompt.contains("$(touch pwned3)"), "{prompt}");
    for f in ["pwned", "pwned2", "pwned3"] {
        assert!(!p.join(f).exists(), "{f} was created");
        assert!(!p.loop_dir("l").join(f).exists(), "{f} was created");
    }
    assert_eq!(p.read("x/keep"), "keep");
}

#[test]
fn invalid_loop_names_are_usage_errors() {
    let p = Project::new();
    for name in ["../x", "A", "a/b", ".", "..", "-x", "x y", ""] {
        for args in [
            vec!["run", "--loop", name],
            vec!["create", "--loop", name, "--no-worktree"],
            vec!["status", "--loop", name],
            vec!["gate", "--loop", name],
            vec!["can-continue", "--loop", name],
            vec!["halt", "--loop", name, "--reason", "r"],
            vec!["approve", "--loop", name],
            vec!["transition", "--loop", name, "--to", "review"],
            vec!["log", "--loop", name],
            vec!["daemon", "--loop", name, "--max-iterations", "1"],
        ] {
            let r = p.lf(&args);
            assert_eq!(r.code, 2, "{args:?}: {r:?}");
        }
    }
    assert!(p.snapshot().is_empty(), "{:?}", p.snapshot().keys());
}

// ---- Extras: brakes and the approval cycle ---------------------------------------------

#[test]
fn iterations_exhausted_halts_once_then_skips_and_extend_allows_more() {
    let p = Project::new();
    let v = |s: &str| format!(r#"{{"pass": false, "score": {s}}}"#);
    let verdicts = [v("0.1"), v("0.2"), v("0.3"), v("0.4")];
    let refs: Vec<&str> = verdicts.iter().map(String::as_str).collect();
    let agent = standard_agent(&p, &refs);
    p.agent_loop("l", &agent, "max_iterations = 2");
    for _ in 0..4 {
        assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    }
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 4, "{ev:?}");
    assert_eq!(ev[0], "TICK pass=false score=0.1 iter=1");
    assert_eq!(ev[1], "TICK pass=false score=0.2 iter=2");
    assert!(ev[2].starts_with("HALT iterations_exhausted"), "{ev:?}");
    assert_eq!(ev[3], "SKIP reason=halted:iterations_exhausted");
    assert_eq!(p.lf(&["can-continue", "--loop", "l"]).code, 1);
    let r = p.lf(&["approve", "--loop", "l", "--extend", "2", "--by", "bob"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.lf(&["can-continue", "--loop", "l"]).code, 0);
    for _ in 0..3 {
        assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    }
    let ev = p.events_after_create("l");
    assert_eq!(
        ev[4],
        "APPROVE by=bob cleared=iterations_exhausted extend=2"
    );
    assert_eq!(ev[5], "TICK pass=false score=0.3 iter=3");
    assert_eq!(ev[6], "TICK pass=false score=0.4 iter=4");
    assert!(ev[7].starts_with("HALT iterations_exhausted"), "{ev:?}");
    assert_eq!(ev.len(), 8);
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 4);
    assert_eq!(s["extra_iterations"], 2);
    assert_eq!(p.read("calls.log").lines().count(), 12);
}

#[test]
fn halt_gate_can_continue_and_transition() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("l", &agent, "");
    assert_eq!(p.lf(&["can-continue", "--loop", "l"]).code, 0);
    let g: Value = serde_json::from_str(&p.lf(&["gate", "--loop", "l", "--json"]).stdout).unwrap();
    assert_eq!(g["ok"], true);
    assert!(g["reason"].is_null());
    let names: Vec<&str> = g["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "halted",
            "max_iterations",
            "budget",
            "score_plateau",
            "task",
            "task_phase",
            "worktree"
        ]
    );

    let r = p.lf(&["halt", "--loop", "l", "--reason", "needs review"]);
    assert_eq!(r.code, 0, "{r:?}");
    let g: Value = serde_json::from_str(&p.lf(&["gate", "--loop", "l", "--json"]).stdout).unwrap();
    assert_eq!(g["ok"], false);
    assert_eq!(g["reason"], "halted:needs review");
    assert_eq!(p.state("l")["halt"]["reason"], "needs review");
    assert_eq!(p.lf(&["can-continue", "--loop", "l"]).code, 1);
    assert!(has(&p.events_after_create("l"), "HALT needs review"));
    assert_eq!(p.lf(&["approve", "--loop", "l"]).code, 0);
    assert_eq!(p.lf(&["can-continue", "--loop", "l"]).code, 0);

    let r = p.lf(&["transition", "--loop", "l", "--to", "review"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.state("l")["current_phase"], "review");
    // A phase the loop does not run in parks it, typo or not: the command says so.
    assert!(
        r.stdout.contains(
            "note: `review` is not in brakes.run_phases [implement]: its ticks skip (`phase:review`) until `loopflow transition --loop l --to implement`"
        ),
        "{r:?}"
    );
    assert_eq!(p.lf(&["can-continue", "--loop", "l"]).code, 1);
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let ev = p.events_after_create("l");
    assert_eq!(ev.last().unwrap(), "SKIP reason=phase:review");
    assert!(has(&ev, "TRANSITION from=implement to=review"), "{ev:?}");
    assert_eq!(p.state("l")["iteration_count"], 0);
    assert!(!p.join("calls.log").exists());
}

#[test]
fn dry_run_prints_argv_and_writes_nothing() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("l", &agent, "");
    // One real tick first so there is a state, a log and outputs to (not) touch.
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let before = p.snapshot();
    let r = p.lf(&["run", "--loop", "l", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    let outputs = p.loop_dir("l").join("outputs");
    for role in ["implement", "verify", "orchestrate"] {
        let line = format!(
            "{} {role} {}",
            agent.display(),
            outputs.join(format!("2-{role}.prompt.md")).display()
        );
        assert!(r.stdout.contains(&line), "{line}\n{r:?}");
    }
    assert_eq!(p.snapshot(), before, "--dry-run wrote something");
    assert_eq!(p.read("calls.log").lines().count(), 3, "--dry-run spawned");
    // Also on a halted loop and with --json.
    p.lf(&["halt", "--loop", "l", "--reason", "x"]);
    let before = p.snapshot();
    let r = p.lf(&["run", "--loop", "l", "--dry-run", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["loop"], "l");
    assert_eq!(p.snapshot(), before);
}

#[test]
fn goal_met_commits_then_halts() {
    let p = Project::new();
    let v = |pass: bool, s: &str| format!(r#"{{"pass": {pass}, "score": {s}}}"#);
    let verdicts = [v(false, "0.85"), v(true, "0.85")];
    let refs: Vec<&str> = verdicts.iter().map(String::as_str).collect();
    let agent = standard_agent(&p, &refs);
    p.agent_loop("l", &agent, "goal_score = 0.8");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.json()["outcome"], "tick", "score alone is not the goal");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "halt");
    assert_eq!(r.json()["reason"], "goal_met");
    assert_eq!(r.json()["iteration"], 2);
    let ev = p.events_after_create("l");
    assert_eq!(
        ev,
        [
            "TICK pass=false score=0.85 iter=1",
            "TICK pass=true score=0.85 iter=2",
            "HALT goal_met"
        ]
    );
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 2);
    assert_eq!(s["halt"]["reason"], "goal_met");
    assert_eq!(s["halt"]["iteration"], 2);
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        "SKIP reason=halted:goal_met"
    );
}

#[test]
fn status_json_shape() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[r#"{"pass": false, "score": 0.6, "cost_usd": 0.25, "tokens": 1200}"#],
    );
    p.agent_loop("a", &agent, "");
    p.agent_loop("b", &agent, "");
    assert_eq!(p.lf(&["run", "--loop", "a"]).code, 0);
    let r = p.lf(&["status", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j: Value = serde_json::from_str(&r.stdout).unwrap();
    let loops = j["loops"].as_array().unwrap();
    assert_eq!(loops.len(), 2);
    let a = &loops[0];
    for key in [
        "name",
        "iteration_count",
        "max_iterations",
        "halt",
        "current_task",
        "current_phase",
        "last_tick_at",
        "last_score",
        "spent",
    ] {
        assert!(a.get(key).is_some(), "missing {key}: {a}");
    }
    assert_eq!(a["name"], "a");
    assert_eq!(a["iteration_count"], 1);
    assert_eq!(a["max_iterations"], 10);
    assert!(a["halt"].is_null());
    assert_eq!(a["current_task"], "the task");
    assert_eq!(a["current_phase"], "implement");
    assert!(a["last_tick_at"].is_string());
    assert_eq!(a["last_score"], 0.6);
    assert_eq!(a["spent"]["usd"], 0.25);
    assert_eq!(a["spent"]["tokens"], 1200);
    assert!(a["spent"]["seconds"].is_number());
    assert_eq!(loops[1]["name"], "b");
    assert_eq!(loops[1]["iteration_count"], 0);
    assert!(loops[1]["last_score"].is_null());
    // --loop narrows to one; the table names both loops.
    let j: Value =
        serde_json::from_str(&p.lf(&["status", "--loop", "b", "--json"]).stdout).unwrap();
    assert_eq!(j["loops"].as_array().unwrap().len(), 1);
    let t = p.lf(&["status"]);
    assert!(
        t.stdout.lines().count() == 4
            && t.stdout.contains("0.60")
            && t.stdout.lines().last().unwrap().starts_with("sandbox: "),
        "{t:?}"
    );
    // Unknown loop: a usage error, not an empty list.
    assert_eq!(p.lf(&["status", "--loop", "nope"]).code, 2);
}

// ---- Paths handed to agents ------------------------------------------------------------

/// Runs the binary from `cwd` with `--project <project>` given as is (maybe relative).
fn lf_from(cwd: &Path, project: &str, args: &[&str]) -> Run {
    Run::of(loopflow(cwd).arg("--project").arg(project).args(args))
}

/// An agent that records, per role, its working directory, whether its prompt argument
/// names an existing file, and the paths it was given.
fn where_agent(p: &Project) -> std::path::PathBuf {
    p.script(
        "where.sh",
        &format!(
            r#"{{ echo "pwd=$(pwd -P)"; echo "prompt=$2"; [ -f "$2" ] && echo "prompt-exists"; echo "cwd=$3"; echo "project=$LOOPFLOW_PROJECT"; }} > "{d}/where-$1.txt"
[ "$1" = verify ] && echo '{{"pass": false, "score": 0.2}}'
exit 0"#,
            d = p.path().display()
        ),
    )
}

fn where_toml(agent: &Path, worktree: bool) -> LoopToml {
    LoopToml::new()
        .harness_command(agent, &["{{role}}", "{{prompt}}", "{{cwd}}"])
        .worktree(worktree)
}

#[test]
fn a_relative_project_still_gives_agents_absolute_paths() {
    let p = Project::new();
    let agent = where_agent(&p);
    p.with_loop_task("l", Some("t"), &where_toml(&agent, false));
    let parent = p.path().parent().unwrap();
    let rel = p.path().file_name().unwrap().to_str().unwrap();
    let r = lf_from(parent, rel, &["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        p.events_after_create("l"),
        ["TICK pass=false score=0.2 iter=1"]
    );
    let real = p.path().canonicalize().unwrap();
    for role in ["implement", "verify", "orchestrate"] {
        let w = p.read(&format!("where-{role}.txt"));
        assert!(w.contains("prompt-exists"), "{role}: {w}");
        assert!(
            w.contains(&format!("pwd={}\n", real.display())),
            "{role}: {w}"
        );
        for key in ["prompt=", "cwd=", "project="] {
            let v = w.lines().find_map(|l| l.strip_prefix(key)).unwrap();
            assert!(Path::new(v).is_absolute(), "{role}: {key}{v} is relative");
        }
    }
}

#[test]
fn a_worktree_loop_created_from_its_repo_runs_from_anywhere() {
    let p = Project::git();
    let agent = where_agent(&p);
    // `loopflow create` as a user types it, in the repository, with the default project.
    let r = lf_from(p.path(), ".", &["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    p.loop_toml("l", &where_toml(&agent, true).render());
    // A scheduler runs it with an absolute project from somewhere else.
    let project = p.path().display().to_string();
    let r = lf_from(Path::new("/"), &project, &["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        p.events_after_create("l"),
        ["TICK pass=false score=0.2 iter=1"]
    );
    let wt = p.worktree("l").canonicalize().unwrap();
    let w = p.read("where-implement.txt");
    assert!(w.contains(&format!("pwd={}\n", wt.display())), "{w}");
    assert!(w.contains("prompt-exists"), "{w}");
    let g = lf_from(Path::new("/"), &project, &["gate", "--loop", "l", "--json"]);
    assert_eq!(g.code, 0, "{g:?}");
}

// ---- The orchestrator acts through loopflow; budgets; artifacts -----------------------

#[test]
fn orchestrator_transition_and_halt_inside_the_tick_are_kept_by_the_commit() {
    let p = Project::new();
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  verify) echo '{{"pass": true, "score": 0.7}}' ;;
  orchestrate)
    "{bin}" transition --loop "$LOOPFLOW_LOOP" --project "$LOOPFLOW_PROJECT" --to review || echo "transition failed" >> "{d}/errors"
    "{bin}" halt --loop "$LOOPFLOW_LOOP" --project "$LOOPFLOW_PROJECT" --reason human_intervention:needs_review || echo "halt failed" >> "{d}/errors" ;;
esac
exit 0"#,
            bin = bin().display(),
            d = p.path().display()
        ),
    );
    p.agent_loop("l", &agent, "");
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.read("errors"), "");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 1);
    assert_eq!(s["current_phase"], "review");
    assert_eq!(s["halt"]["reason"], "human_intervention:needs_review");
    assert_eq!(s["last_verdict"]["score"], 0.7);
    assert_eq!(
        p.events_after_create("l"),
        [
            "TRANSITION from=implement to=review",
            "HALT human_intervention:needs_review",
            "TICK pass=true score=0.7 iter=1"
        ]
    );
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        "SKIP reason=halted:human_intervention:needs_review"
    );
}

#[test]
fn budget_exhausted_halts_at_the_gate() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[r#"{"pass": false, "score": 0.5, "cost_usd": 0.3, "tokens": 100}"#],
    );
    p.agent_loop(
        "l",
        &agent,
        "max_budget_usd = 0.5\nscore_plateau_window = 10",
    );
    for _ in 0..3 {
        assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    }
    // The brake acts the moment spend passes the cap, inside the tick that passed it:
    // tick 2's verifier brings spend to $0.60, so the orchestrator never runs and the
    // tick halts with its spend committed. The third run is refused at the gate.
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 3, "{ev:?}");
    assert_eq!(ev[0], "TICK pass=false score=0.5 iter=1");
    assert!(ev[1].starts_with("HALT budget_exhausted:usd"), "{ev:?}");
    assert!(ev[2].starts_with("SKIP reason=halted"), "{ev:?}");
    let s = p.state("l");
    // The halted tick spent but did not advance the loop.
    assert_eq!(s["iteration_count"], 1);
    assert_eq!(s["spent"]["tokens"], 200);
    assert!(
        (s["spent"]["usd"].as_f64().unwrap() - 0.6).abs() < 1e-9,
        "{s}"
    );
    assert_eq!(s["halt"]["reason"], "budget_exhausted:usd");
}

#[test]
fn artifact_carries_implement_output_to_the_verifier() {
    let p = Project::new();
    // implement writes its result to {{output}}; verify reads {{artifact}} and grades it.
    let agent = p.script(
        "agent.sh",
        r#"case "$1" in
  implement) printf '{"pass": true, "score": 0.65, "reasons": ["from the artifact"]}' > "$2" ;;
  verify) cat "$2" ;;
esac
exit 0"#,
    );
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            .role_command("implement", &agent, &["implement", "{{output}}"])
            .role_command("verify", &agent, &["verify", "{{artifact}}"]),
    );
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        p.events_after_create("l"),
        ["TICK pass=true score=0.65 iter=1"]
    );
    // The agent wrote it in its working directory's self-ignoring `.loopflow-out/`;
    // the loop keeps a copy under outputs/.
    assert!(p.join(".loopflow-out/l/1-implement.json").exists());
    assert_eq!(p.read(".loopflow-out/.gitignore"), "*\n");
    assert!(
        p.loop_dir("l").join("outputs/1-implement.json").exists(),
        "the artifact is kept under outputs/"
    );
    assert_eq!(
        p.state("l")["last_verdict"]["reasons"][0],
        "from the artifact"
    );
}

// ---- daemon scheduling ------------------------------------------------------------------

#[test]
fn daemon_uses_the_loop_schedule_interval() {
    let p = Project::new();
    let v = |s: &str| format!(r#"{{"pass": false, "score": {s}}}"#);
    let verdicts = [v("0.1"), v("0.2")];
    let refs: Vec<&str> = verdicts.iter().map(String::as_str).collect();
    let agent = standard_agent(&p, &refs);
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            .table("schedule", "interval_seconds = 1"),
    );
    let mut child = p.lf_spawn(&["daemon", "--loop", "l", "--max-iterations", "2"]);
    let st = wait_or_kill(&mut child, "daemon with interval_seconds = 1");
    assert_eq!(st.code(), Some(0));
    assert_eq!(
        p.events_after_create("l"),
        [
            "TICK pass=false score=0.1 iter=1",
            "TICK pass=false score=0.2 iter=2",
            "DAEMON_STOPPED ticks=2"
        ]
    );
}

#[test]
fn daemon_all_ticks_every_loop() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("a", &agent, "score_plateau_window = 10");
    p.agent_loop("b", &agent, "score_plateau_window = 10");
    let mut child = p.lf_spawn(&[
        "daemon",
        "--all",
        "--interval",
        "1",
        "--max-iterations",
        "4",
    ]);
    let st = wait_or_kill(&mut child, "daemon --all");
    assert_eq!(st.code(), Some(0));
    for name in ["a", "b"] {
        assert_eq!(p.state(name)["iteration_count"], 2, "{name}");
        assert!(
            p.events_after_create(name)
                .last()
                .unwrap()
                .starts_with("DAEMON_STOPPED"),
            "{name}: {:?}",
            p.events_after_create(name)
        );
    }
}

#[test]
fn daemon_max_iterations_zero_means_no_limit() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("l", &agent, "score_plateau_window = 10");
    let mut child = p.lf_spawn(&[
        "daemon",
        "--loop",
        "l",
        "--interval",
        "1",
        "--max-iterations",
        "0",
    ]);
    let start = Instant::now();
    while p.state("l")["iteration_count"].as_u64().unwrap() < 3 {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "daemon exited early: {st:?}, {:?}",
                p.events_after_create("l")
            );
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert!(
        p.events_after_create("l")
            .last()
            .unwrap()
            .starts_with("DAEMON_STOPPED"),
        "{:?}",
        p.events_after_create("l")
    );
}

#[test]
fn log_prints_the_event_log() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("l", &agent, "");
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let r = p.lf(&["log", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.stdout,
        std::fs::read_to_string(p.loop_dir("l").join(".state.log")).unwrap()
    );
    // Every line: an RFC 3339 UTC time, an event, its arguments.
    for line in r.stdout.lines() {
        assert_log_line(line);
    }
    assert_eq!(p.lf(&["log", "--loop", "nope"]).code, 2);
}

#[test]
fn a_state_from_a_newer_loopflow_is_refused_and_kept() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS_09]);
    p.agent_loop("l", &agent, "");
    let state_path = p.loop_dir("l").join(".state.loop");
    let mut s = p.state("l");
    s["schema_version"] = serde_json::json!(99);
    s["a_future_field"] = serde_json::json!({"x": 1});
    let text = serde_json::to_string_pretty(&s).unwrap();
    std::fs::write(&state_path, &text).unwrap();
    for args in [
        vec!["run", "--loop", "l"],
        vec!["approve", "--loop", "l", "--extend", "1"],
        vec!["halt", "--loop", "l", "--reason", "x"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 4, "{args:?}: {r:?}");
        assert!(r.stderr.contains("newer"), "{args:?}: {r:?}");
    }
    assert_eq!(std::fs::read_to_string(&state_path).unwrap(), text);
    assert!(!p.join("calls.log").exists());
}

/// The README's first command: a real loop with the built-in fake agent, offline, in a
/// git repository of its own (`D/project`), ticked in its worktree until its own brakes
/// halt it, then the human's half for real: review, approve, land.
#[test]
fn demo_runs_a_real_loop_until_it_halts_then_reviews_approves_and_lands_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .args(["demo", "--dir"])
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let project = dir.path().join("project");
    let loop_dir = project.join(".loopflow/loops/demo");
    let log = std::fs::read_to_string(loop_dir.join(".state.log")).unwrap();
    let ticks = log.lines().filter(|l| l.contains(" TICK ")).count();
    assert_eq!(ticks, 6, "{log}");
    assert!(log.contains("HALT verifier_failed:score_plateau"), "{log}");
    // The human's half ran: an approval, then the branch landed on main.
    let events: Vec<&str> = log.lines().filter_map(|l| l.split(' ').nth(1)).collect();
    let tail: Vec<&str> = events.iter().rev().take(2).rev().copied().collect();
    assert_eq!(tail, ["APPROVE", "LAND"], "{log}");
    for said in [
        "$ loopflow --project",
        "review --loop demo",
        "approve --loop demo",
        "land --loop demo",
        "landed 6 commit(s) of loopflow/demo into main",
    ] {
        assert!(stdout.contains(said), "{said}: {stdout}");
    }
    // The agent worked in the worktree, on the loop's branch; main has its work now.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(loop_dir.join(".state.loop")).unwrap())
            .unwrap();
    let wt = std::path::PathBuf::from(state["worktree_path"].as_str().expect("a worktree"));
    assert!(wt.join(".git").is_file(), "{}", wt.display());
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p.join("NOTES.md"))
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("- iteration"))
            .count()
    };
    assert_eq!(lines(&wt), 6, "the fake agent edits a file each iteration");
    assert_eq!(lines(&project), 6, "landed on main");
    let git = |args: &[&str]| crate::support::git(&project, args);
    assert_eq!(git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(), "main");
    assert!(
        git(&["merge-base", "--is-ancestor", "loopflow/demo", "main"]).is_empty(),
        "the branch is merged"
    );
    assert!(
        git(&["status", "--porcelain"]).trim().is_empty(),
        "main is clean"
    );
    assert!(stdout.contains("why it stopped"), "{stdout}");
    assert_eq!(state["iteration_count"], 6);
    assert_eq!(state["halt"], serde_json::Value::Null, "approved");
    assert_eq!(state["approvals"][0]["note"], "looked good");
    // The second tick's prompt carries the first verdict's hint.
    let prompt = std::fs::read_to_string(loop_dir.join("outputs/2-implement.prompt.md")).unwrap();
    assert!(prompt.contains("cover the error paths next"), "{prompt}");
    // Nothing but the project and the loop's worktree (kept outside the checkout, as
    // every loop's is) in the throw-away directory.
    let mut entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    entries.sort();
    assert_eq!(entries, ["project", "worktrees"]);
    let copies: Vec<_> = std::fs::read_dir(dir.path().join("worktrees"))
        .unwrap()
        .flat_map(|e| std::fs::read_dir(e.unwrap().path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(copies.contains(&"demo".to_string()), "{copies:?}");
    // A second demo into the same directory is refused, not mixed into the first.
    let again = std::process::Command::new(bin())
        .args(["demo", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
}

/// On a machine without git (a slim container with only the Rust toolchain) the demo
/// still runs its loop, in the project itself, and says what it leaves out.
#[test]
fn demo_without_git_runs_its_loop_in_the_project() {
    let dir = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin())
        .args(["demo", "--dir"])
        .arg(dir.path())
        .env("NO_COLOR", "1")
        .env("PATH", empty.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("git was not found"), "{stdout}");
    let project = dir.path().join("project");
    assert!(!project.join(".git").exists());
    let notes = std::fs::read_to_string(project.join("NOTES.md")).unwrap();
    assert_eq!(
        notes
            .lines()
            .filter(|l| l.starts_with("- iteration"))
            .count(),
        6
    );
}
