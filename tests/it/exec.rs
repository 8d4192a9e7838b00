//! The executor through the real binary: `command` nodes, `when`, `on_failure`,
//! retries, consecutive aborts, timeouts that leave no process behind, `--parallel`
//! producing what a sequential run produces, and SIGTERM mid-tick.

use std::path::PathBuf;
use std::process::Stdio;

use crate::support::{
    LoopToml, PipelineToml, Project, live_group_members, standard_agent, wait_for_line,
    wait_group_gone,
};
use serde_json::Value;

/// A loop `l` (roles run the standard agent, `brakes` set on top of the usual ones) whose
/// pipeline is `pipeline`, written to `pipelines/p.toml` and named by `loop.toml`'s
/// `pipeline` key.
fn pipeline_loop(p: &Project, brakes: &str, pipeline: &PipelineToml) {
    let agent = standard_agent(p, &[r#"{"pass": false, "score": 0.5}"#]);
    let pipe = p.write("pipelines/p.toml", &pipeline.render());
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            // A stopped node's group is KILLed 100 ms after TERM, not 5 s: the timeout
            // tests of groups that ignore TERM take a second, not six.
            .harness("grace = \"100ms\"")
            .brakes(brakes)
            .pipeline(&pipe),
    );
    let r = p.lf(&["check", pipe.to_str().unwrap()]);
    assert_eq!(r.code, 0, "the test pipeline must be valid: {r:?}");
}

/// A script that exits with the number in the file `rc` (0 when absent), printing a line.
fn exit_rc_script(p: &Project, name: &str) -> PathBuf {
    p.script(
        name,
        &format!(
            "echo \"{name} ran\"\necho \"$0\" >> \"{d}/calls.log\"\nrc=$(cat \"{d}/rc\" 2>/dev/null || echo 0)\nexit $rc",
            d = p.path().display()
        ),
    )
}

fn run_json(p: &Project, extra: &[&str]) -> Value {
    p.run_json("l", extra).json()
}

fn node_status(j: &Value, id: &str) -> String {
    j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == id)
        .unwrap_or_else(|| panic!("no node {id}: {j}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

// ---- command nodes and templates reading them ------------------------------------------

#[test]
fn command_node_exposes_exit_code_and_output_downstream() {
    let p = Project::new();
    let tests = exit_rc_script(&p, "tests.sh");
    // Records each argument into its own file, so newlines survive.
    let record = p.script(
        "record.sh",
        &format!(
            "i=0\nfor a in \"$@\"; do i=$((i+1)); printf '%s' \"$a\" > \"{d}/arg$i\"; done",
            d = p.path().display()
        ),
    );
    pipeline_loop(
        &p,
        "",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .script("tests", &tests, &[], &["gate"])
            .with("on_failure = \"continue\"")
            .script(
                "report",
                &record,
                &[
                    "exit={{nodes.tests.exit_code}}",
                    "{{nodes.tests.stdout_path}}",
                    "{{nodes.tests.output}}",
                    "{{iteration}} {{loop}}",
                ],
                &["tests"],
            )
            .commit("commit", &["report"]),
    );
    p.write("rc", "3");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
    assert_eq!(node_status(&j, "tests"), "failed");
    assert_eq!(node_status(&j, "report"), "ok");
    assert_eq!(p.read("arg1"), "exit=3");
    let stdout_path = p.loop_dir("l").join("outputs/1-tests.stdout");
    assert_eq!(p.read("arg2"), stdout_path.display().to_string());
    assert_eq!(
        std::fs::read_to_string(&stdout_path).unwrap(),
        "tests.sh ran\n"
    );
    assert_eq!(p.read("arg3"), "tests.sh ran\n");
    assert_eq!(p.read("arg4"), "1 l");
    // A commit without a verdict still counts the iteration.
    assert_eq!(p.events_after_create("l"), ["TICK iter=1"]);
    p.write("rc", "0");
    run_json(&p, &[]);
    assert_eq!(p.read("arg1"), "exit=0");
    assert_eq!(p.read("arg4"), "2 l");
    assert_eq!(p.state("l")["iteration_count"], 2);
}

// ---- when ------------------------------------------------------------------------------

fn ci_triage(p: &Project) {
    let tests = exit_rc_script(p, "tests.sh");
    pipeline_loop(
        p,
        "",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .script("tests", &tests, &[], &["gate"])
            .with("on_failure = \"continue\"")
            .harness("implement", "implement", &["tests"])
            .with("when = \"{{not (eq nodes.tests.exit_code 0)}}\"")
            .harness("verify", "verify", &["implement"])
            .verdict("parse", "verify", &["verify"])
            .commit("commit", &["parse"]),
    );
}

#[test]
fn when_false_skips_the_rest_and_uses_no_iteration() {
    let p = Project::new();
    ci_triage(&p);
    p.write("rc", "0");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "skip");
    assert_eq!(j["reason"], "when:implement");
    assert_eq!(j["iteration"], 0);
    assert_eq!(node_status(&j, "tests"), "ok");
    for id in ["implement", "verify", "parse", "commit"] {
        assert_eq!(node_status(&j, id), "skipped", "{id}: {j}");
    }
    assert_eq!(p.events_after_create("l"), ["SKIP reason=when:implement"]);
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 0);
    assert!(s["last_tick_at"].is_null());
    assert!(s["halt"].is_null());
    let calls = p.read("calls.log");
    assert!(
        calls.ends_with("tests.sh\n") && calls.lines().count() == 1,
        "{calls}"
    );

    // The tests fail: now the loop works.
    p.write("rc", "1");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
    assert_eq!(node_status(&j, "tests"), "failed");
    assert_eq!(node_status(&j, "implement"), "ok");
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        "TICK pass=false score=0.5 iter=1"
    );
    let calls = p.read("calls.log");
    assert!(calls.contains("implement 1\nverify 1\n"), "{calls}");
}

// ---- on_failure ------------------------------------------------------------------------

fn fail_pipeline(p: &Project, brakes: &str, node_extra: &str) {
    let x = exit_rc_script(p, "x.sh");
    pipeline_loop(
        p,
        brakes,
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .script("x", &x, &[], &["gate"])
            .with(node_extra)
            .command("after", &["true"], &["x"])
            .commit("commit", &["after"]),
    );
}

#[test]
fn failure_aborts_by_default_and_nothing_advances() {
    let p = Project::new();
    fail_pipeline(&p, "", "");
    p.write("rc", "1");
    let before = p.state("l");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "abort", "{j}");
    assert_eq!(j["iteration"], 0);
    assert_eq!(node_status(&j, "x"), "failed");
    assert_eq!(node_status(&j, "after"), "not_run");
    assert_eq!(node_status(&j, "commit"), "not_run");
    assert_eq!(p.events_after_create("l"), ["ABORT node=x reason=exit:1"]);
    let mut after = p.state("l");
    assert_eq!(after["consecutive_aborts"], 1);
    assert_eq!(after["last_abort"]["node"], "x");
    // Apart from the abort counter and its note, the state is exactly as it was.
    after["consecutive_aborts"] = before["consecutive_aborts"].clone();
    if let Some(m) = after.as_object_mut() {
        m.remove("last_abort");
    }
    assert_eq!(after, before);
}

#[test]
fn on_failure_continue_keeps_going() {
    let p = Project::new();
    fail_pipeline(&p, "", "on_failure = \"continue\"");
    p.write("rc", "7");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
    assert_eq!(node_status(&j, "x"), "failed");
    assert_eq!(node_status(&j, "after"), "ok");
    assert_eq!(p.events_after_create("l"), ["TICK iter=1"]);
}

#[test]
fn on_failure_halt_halts_without_advancing() {
    let p = Project::new();
    fail_pipeline(&p, "", "on_failure = \"halt\"");
    p.write("rc", "2");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "halt", "{j}");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 0);
    let reason = s["halt"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("human_intervention:"), "{reason}");
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(ev[0].starts_with(&format!("HALT {reason}")), "{ev:?}");
    assert!(
        ev[0].contains("exit:2"),
        "the detail names the failure: {ev:?}"
    );
    assert_eq!(node_status(&j, "after"), "not_run");
    // It stays halted until approved.
    run_json(&p, &[]);
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        &format!("SKIP reason=halted:{reason}")
    );
}

#[test]
fn retries_rerun_until_success() {
    let p = Project::new();
    // Fails on the first two attempts, succeeds on the third.
    let flaky = p.script(
        "flaky.sh",
        &format!(
            "n=$(cat \"{d}/count\" 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > \"{d}/count\"\n[ $n -ge 3 ]",
            d = p.path().display()
        ),
    );
    let pipeline = PipelineToml::named("p")
        .script("flaky", &flaky, &[], &[])
        .with("retries = 2")
        .commit("commit", &["flaky"]);
    pipeline_loop(&p, "", &pipeline);
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
    assert_eq!(node_status(&j, "flaky"), "ok");
    assert_eq!(p.read("count").trim(), "3");
    let ev = p.events_after_create("l");
    assert_eq!(
        ev.iter()
            .filter(|e| e.starts_with("RETRY node=flaky"))
            .count(),
        2,
        "{ev:?}"
    );
    assert_eq!(ev.last().unwrap(), "TICK iter=1");

    // One retry is not enough for a fresh counter: the tick aborts after two attempts.
    std::fs::remove_file(p.join("count")).unwrap();
    p.write(
        "pipelines/p.toml",
        &pipeline.set("flaky", "retries = 1").render(),
    );
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "abort", "{j}");
    assert_eq!(p.read("count").trim(), "2");
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        "ABORT node=flaky reason=exit:1"
    );
    assert_eq!(p.state("l")["iteration_count"], 1);
}

#[test]
fn consecutive_aborts_halt_harness_failing() {
    let p = Project::new();
    fail_pipeline(&p, "max_consecutive_aborts = 2", "");
    p.write("rc", "1");
    // abort, success (resets the count), abort: no halt yet.
    run_json(&p, &[]);
    p.write("rc", "0");
    assert_eq!(run_json(&p, &[])["outcome"], "tick");
    assert_eq!(p.state("l")["consecutive_aborts"], 0);
    p.write("rc", "1");
    assert_eq!(run_json(&p, &[])["outcome"], "abort");
    assert!(p.state("l")["halt"].is_null());
    // The second abort in a row halts.
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "halt", "{j}");
    assert_eq!(j["reason"], "human_intervention:harness_failing");
    let ev = p.events_after_create("l");
    let n = ev.len();
    assert_eq!(ev[n - 2], "ABORT node=x reason=exit:1");
    assert!(
        ev[n - 1].starts_with("HALT human_intervention:harness_failing"),
        "{ev:?}"
    );
    assert_eq!(p.state("l")["iteration_count"], 1);
    run_json(&p, &[]);
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        "SKIP reason=halted:human_intervention:harness_failing"
    );
    // Approval clears the halt and the count.
    assert_eq!(p.lf(&["approve", "--loop", "l"]).code, 0);
    let s = p.state("l");
    assert!(s["halt"].is_null());
    assert_eq!(s["consecutive_aborts"], 0);
}

// ---- timeouts -------------------------------------------------------------------------

/// A script that records its process group, forks a sleeping grandchild and sleeps.
/// With `ignore_term`, the whole group ignores SIGTERM (so only KILL ends it).
fn forker(p: &Project, ignore_term: bool) -> PathBuf {
    p.script(
        "forker.sh",
        &format!(
            r#"{trap}
echo $$ > "{d}/pgid"
sleep 300 &
echo $! > "{d}/grandchild"
sleep 300
echo "not reached" >> "{d}/calls.log""#,
            trap = if ignore_term { "trap '' TERM" } else { "" },
            d = p.path().display()
        ),
    )
}

/// An agent that records its process group in `pgid`, starts a sleeping child and sleeps.
fn sleeping_agent(p: &Project) -> PathBuf {
    p.script(
        "agent.sh",
        &format!(
            "echo $$ > \"{d}/pgid\"\nsleep 300 &\nsleep 300",
            d = p.path().display()
        ),
    )
}

fn timeout_case(ignore_term: bool) {
    let p = Project::new();
    let f = forker(&p, ignore_term);
    pipeline_loop(
        &p,
        "",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .script("slow", &f, &[], &["gate"])
            .with("timeout = \"1s\"")
            .commit("commit", &["slow"]),
    );
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "abort", "{j}");
    assert_eq!(
        p.events_after_create("l"),
        ["ABORT node=slow reason=timeout"]
    );
    assert_eq!(p.state("l")["iteration_count"], 0);
    let pgid: i32 = p.read("pgid").trim().parse().unwrap();
    let grandchild: i32 = p.read("grandchild").trim().parse().unwrap();
    assert_eq!(
        wait_group_gone(pgid),
        Vec::<i32>::new(),
        "processes of the node's group outlived it"
    );
    assert!(
        !live_group_members(pgid).contains(&grandchild),
        "the grandchild outlived its node"
    );
    assert!(!p.read("calls.log").contains("not reached"));
}

#[test]
fn timeout_kills_the_whole_process_group() {
    timeout_case(false);
}

#[test]
fn timeout_kills_a_group_that_ignores_term() {
    timeout_case(true);
}

#[test]
fn harness_timeout_from_loop_toml_aborts_the_tick() {
    let p = Project::new();
    let agent = sleeping_agent(&p);
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            .harness("timeout = \"1s\""),
    );
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "abort", "{j}");
    assert_eq!(
        p.events_after_create("l"),
        ["ABORT node=implement reason=timeout"]
    );
    let pgid: i32 = p.read("pgid").trim().parse().unwrap();
    assert_eq!(wait_group_gone(pgid), Vec::<i32>::new());
    assert_eq!(p.state("l")["iteration_count"], 0);
}

// ---- --parallel ----------------------------------------------------------------------

/// A diamond: gate → {a, b} → parse (verdict from a) → commit. `a` and `b` each wait
/// (up to 8 s) for the other to have started, recording whether they saw it: proof that
/// `--parallel` really ran them together, without asserting on time.
fn diamond(p: &Project) {
    let branch = |me: &str, other: &str, verdict: &str| {
        p.script(
            &format!("{me}.sh"),
            &format!(
                r#"d="{d}"
: > "$d/started-{me}"
i=0
while [ ! -e "$d/started-{other}" ] && [ $i -lt 80 ]; do sleep 0.1; i=$((i+1)); done
if [ -e "$d/started-{other}" ]; then echo "{me} saw {other}" >> "$d/seen"; else echo "{me} alone" >> "$d/seen"; fi
echo '{verdict}'"#,
                d = p.path().display()
            ),
        )
    };
    let a = branch(
        "a",
        "b",
        r#"{"pass": false, "score": 0.75, "reasons": ["from a"], "next_hint": "h"}"#,
    );
    let b = branch("b", "a", "b output");
    pipeline_loop(
        p,
        "",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .script("a", &a, &[], &["gate"])
            .script("b", &b, &[], &["gate"])
            .verdict("parse", "a", &["a", "b"])
            .commit("commit", &["parse"]),
    );
}

/// The state without the fields that hold times.
fn timeless(mut s: Value) -> Value {
    if s["last_abort"].is_object() {
        s["last_abort"]["at"] = Value::Null;
    }
    s["last_tick_at"] = Value::Null;
    s["created_at"] = Value::Null;
    s["spent"]["seconds"] = Value::Null;
    s
}

fn statuses(j: &Value) -> Vec<(String, String)> {
    j["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["id"].as_str().unwrap().to_string(),
                n["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn parallel_and_sequential_runs_agree() {
    let seq = Project::new();
    let par = Project::new();
    diamond(&seq);
    diamond(&par);
    let mut js = run_json(&seq, &[]);
    let mut jp = run_json(&par, &["--parallel"]);
    assert_eq!(js["outcome"], "tick", "{js}");
    assert_eq!(statuses(&js), statuses(&jp));
    for j in [&mut js, &mut jp] {
        j["nodes"] = Value::Null;
    }
    assert_eq!(js, jp);
    assert_eq!(
        seq.events_after_create("l"),
        ["TICK pass=false score=0.75 iter=1"]
    );
    assert_eq!(seq.events_after_create("l"), par.events_after_create("l"));
    assert_eq!(timeless(seq.state("l")), timeless(par.state("l")));
    // Sequentially, the first branch ran alone; in parallel each saw the other.
    let mut seen: Vec<String> = par.read("seen").lines().map(str::to_string).collect();
    seen.sort();
    assert_eq!(seen, ["a saw b", "b saw a"]);
    let seq_seen = seq.read("seen");
    assert!(seq_seen.contains("alone"), "{seq_seen}");
    // A second tick each: still identical.
    run_json(&seq, &[]);
    run_json(&par, &["--parallel"]);
    assert_eq!(seq.events_after_create("l"), par.events_after_create("l"));
    assert_eq!(timeless(seq.state("l")), timeless(par.state("l")));
}

#[test]
fn parallel_failure_aborts_like_sequential() {
    // One branch fails: both modes abort on the same node with the same state.
    let mk = || {
        let p = Project::new();
        let ok = p.script("ok.sh", "echo fine");
        let bad = p.script("bad.sh", "exit 5");
        pipeline_loop(
            &p,
            "",
            &PipelineToml::named("p")
                .node("gate", "gate", &[])
                .script("a", &ok, &[], &["gate"])
                .script("b", &bad, &[], &["gate"])
                .commit("commit", &["a", "b"]),
        );
        p
    };
    let seq = mk();
    let par = mk();
    let js = run_json(&seq, &[]);
    let jp = run_json(&par, &["--parallel"]);
    assert_eq!(js["outcome"], "abort");
    assert_eq!(js["reason"], jp["reason"]);
    assert_eq!(seq.events_after_create("l"), ["ABORT node=b reason=exit:5"]);
    assert_eq!(seq.events_after_create("l"), par.events_after_create("l"));
    assert_eq!(timeless(seq.state("l")), timeless(par.state("l")));
}

// ---- SIGTERM mid-tick -----------------------------------------------------------------

#[test]
fn sigterm_mid_tick_aborts_interrupted_and_leaves_state_alone() {
    let p = Project::new();
    let agent = sleeping_agent(&p);
    p.agent_loop("l", &agent, "");
    let state_path = p.loop_dir("l").join(".state.loop");
    let before = std::fs::read_to_string(&state_path).unwrap();
    let child = p
        .lf_cmd(&["run", "--loop", "l"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(&p.join("pgid"));
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        p.events_after_create("l"),
        ["ABORT node=implement reason=interrupted"]
    );
    assert_eq!(
        std::fs::read_to_string(&state_path).unwrap(),
        before,
        "an interrupted tick must leave .state.loop unchanged"
    );
    let pgid: i32 = p.read("pgid").trim().parse().unwrap();
    assert_eq!(wait_group_gone(pgid), Vec::<i32>::new());
    // No stale lock: the next run works.
    std::fs::write(
        &agent,
        "#!/bin/sh\n[ \"$1\" = verify ] && echo '{\"pass\": false, \"score\": 0.1}'\nexit 0\n",
    )
    .unwrap();
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
}

#[test]
fn parallel_commit_waits_for_every_node_a_sequential_run_would_finish_first() {
    // `commit` does not need `a`, but `a` comes first in file order: a sequential run
    // aborts on `a` before it ever reaches `commit`, so --parallel must too.
    let mk = || {
        let p = Project::new();
        let bad = p.script("bad.sh", "sleep 0.5\nexit 4");
        let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
        let pipe = p.write(
            "pipelines/p.toml",
            &PipelineToml::named("p")
                .node("gate", "gate", &[])
                .script("a", &bad, &[], &["gate"])
                .commit("commit", &["gate"])
                .render(),
        );
        p.with_loop("l", &LoopToml::new().harness_agent(&agent).pipeline(&pipe));
        p
    };
    let seq = mk();
    let par = mk();
    let js = run_json(&seq, &[]);
    let jp = run_json(&par, &["--parallel"]);
    assert_eq!(js["outcome"], "abort", "{js}");
    assert_eq!(jp["outcome"], js["outcome"], "{jp}");
    assert_eq!(seq.events_after_create("l"), ["ABORT node=a reason=exit:4"]);
    assert_eq!(seq.events_after_create("l"), par.events_after_create("l"));
    assert_eq!(timeless(seq.state("l")), timeless(par.state("l")));
    assert_eq!(par.state("l")["iteration_count"], 0);
}

#[test]
fn an_agent_that_cannot_start_aborts_the_tick() {
    let p = Project::new();
    p.agent_loop("l", &p.join("no-such-agent"), "");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "abort", "{j}");
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert!(
        ev[0].starts_with("ABORT node=implement reason=\"spawn:") && ev[0].contains("not found"),
        "{ev:?}"
    );
    assert_eq!(p.state("l")["iteration_count"], 0);
    // Not executable is named as such.
    p.write("not-exec.sh", "#!/bin/sh\nexit 0\n");
    p.loop_toml(
        "l",
        &LoopToml::new()
            .harness_agent(&p.join("not-exec.sh"))
            .render(),
    );
    run_json(&p, &[]);
    assert!(
        p.events_after_create("l")
            .last()
            .unwrap()
            .contains("not executable"),
        "{:?}",
        p.events_after_create("l")
    );
}

#[test]
fn sigterm_to_a_daemon_mid_tick_stops_it_cleanly() {
    let p = Project::new();
    let agent = sleeping_agent(&p);
    p.agent_loop("l", &agent, "");
    let state_path = p.loop_dir("l").join(".state.loop");
    let before = std::fs::read_to_string(&state_path).unwrap();
    let child = p
        .lf_cmd(&["daemon", "--loop", "l", "--interval", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_line(&p.join("pgid"));
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ev = p.events_after_create("l");
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert_eq!(ev[0], "ABORT node=implement reason=interrupted");
    assert!(ev[1].starts_with("DAEMON_STOPPED"), "{ev:?}");
    assert_eq!(std::fs::read_to_string(&state_path).unwrap(), before);
    let pgid: i32 = p.read("pgid").trim().parse().unwrap();
    assert_eq!(wait_group_gone(pgid), Vec::<i32>::new());
}

#[test]
fn a_node_that_exits_leaving_a_background_process_takes_it_along() {
    let p = Project::new();
    let agent = p.script(
        "agent.sh",
        &format!(
            "echo $$ > \"{d}/pgid-$1\"\nsleep 300 &\n[ \"$1\" = verify ] && echo '{{\"pass\": false, \"score\": 0.5}}'\nexit 0",
            d = p.path().display()
        ),
    );
    p.agent_loop("l", &agent, "");
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
    for role in ["implement", "verify", "orchestrate"] {
        let pgid: i32 = p.read(&format!("pgid-{role}")).trim().parse().unwrap();
        assert_eq!(wait_group_gone(pgid), Vec::<i32>::new(), "{role}");
    }
}

// ---- after the commit -----------------------------------------------------------------

#[test]
fn a_halt_after_the_commit_still_halts_the_loop() {
    let p = Project::new();
    let post = p.script("post.sh", "exit 6");
    pipeline_loop(
        &p,
        "",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .commit("commit", &["gate"])
            .script("post", &post, &[], &["commit"])
            .with("on_failure = \"halt\""),
    );
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "halt", "{j}");
    assert_eq!(
        j["iteration"], 1,
        "the commit happened: the iteration stands"
    );
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 1);
    let reason = s["halt"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("not halted: {s}"));
    assert!(reason.starts_with("human_intervention:"), "{reason}");
    let ev = p.events_after_create("l");
    assert_eq!(ev[0], "TICK iter=1");
    assert!(ev[1].starts_with(&format!("HALT {reason}")), "{ev:?}");
    run_json(&p, &[]);
    assert_eq!(
        p.events_after_create("l").last().unwrap(),
        &format!("SKIP reason=halted:{reason}")
    );
}

#[test]
fn an_abort_after_the_commit_keeps_the_iteration_and_warns() {
    let p = Project::new();
    pipeline_loop(
        &p,
        "max_consecutive_aborts = 1",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .commit("commit", &["gate"])
            .command("post", &["false"], &["commit"]),
    );
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "tick", "{j}");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 1);
    assert!(
        s["halt"].is_null(),
        "a committed tick is not an aborted one: {s}"
    );
    let ev = p.events_after_create("l");
    assert_eq!(ev[0], "TICK iter=1");
    assert!(ev[1].starts_with("WARN node=post reason=exit:1"), "{ev:?}");
}

#[test]
fn a_blast_radius_violation_after_the_commit_halts() {
    let p = Project::git();
    let agent = p.script(
        "agent.sh",
        "case \"$1\" in\n  implement) mkdir -p secret src; echo x > secret/key; echo y > src/ok.rs ;;\n  verify) echo '{\"pass\": false, \"score\": 0.5}' ;;\nesac\nexit 0",
    );
    let pipe = p.write(
        "pipelines/p.toml",
        &PipelineToml::named("p")
            .node("gate", "gate", &[])
            .harness("implement", "implement", &["gate"])
            .harness("verify", "verify", &["implement"])
            .verdict("parse", "verify", &["verify"])
            .commit("commit", &["parse"])
            .git_commit("save", &["commit"])
            .render(),
    );
    p.with_loop_task(
        "l",
        Some("t"),
        &LoopToml::new()
            .harness_agent(&agent)
            .worktree(true)
            .blast_radius(&["src/**"], &["secret/**"])
            .pipeline(&pipe),
    );
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "halt", "{j}");
    let s = p.state("l");
    assert_eq!(
        s["halt"]["reason"], "human_intervention:blast_radius",
        "{s}"
    );
    assert_eq!(s["iteration_count"], 1);
    let wt = p.worktree("l");
    let log = p.git_cmd(&["-C", wt.to_str().unwrap(), "log", "--oneline"]);
    assert_eq!(log.lines().count(), 1, "nothing may be committed: {log}");
}

#[test]
fn a_pipeline_without_a_gate_still_obeys_the_brakes() {
    let p = Project::new();
    pipeline_loop(
        &p,
        "max_iterations = 1",
        &PipelineToml::named("p")
            .command("work", &["true"], &[])
            .commit("commit", &["work"]),
    );
    assert_eq!(run_json(&p, &[])["outcome"], "tick");
    // The cap holds...
    let j = run_json(&p, &[]);
    assert_eq!(j["outcome"], "halt", "{j}");
    assert_eq!(j["reason"], "iterations_exhausted");
    assert_eq!(p.state("l")["iteration_count"], 1);
    // ...and so does a halt, until approved.
    assert_eq!(p.lf(&["approve", "--loop", "l", "--extend", "5"]).code, 0);
    assert_eq!(p.lf(&["halt", "--loop", "l", "--reason", "stop"]).code, 0);
    let j = run_json(&p, &[]);
    assert_eq!(j["reason"], "halted:stop", "{j}");
    assert_eq!(node_status(&j, "work"), "not_run");
    assert_eq!(p.state("l")["iteration_count"], 1);
    assert_eq!(p.lf(&["approve", "--loop", "l"]).code, 0);
    assert_eq!(run_json(&p, &[])["outcome"], "tick");
    assert_eq!(p.state("l")["iteration_count"], 2);
}
