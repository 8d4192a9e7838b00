//! Faults lose nothing of record: a runner killed (`kill -9`) at each step of the protocol,
//! a push whose answer is lost, a remote answering 503, a runner whose clock is off by
//! minutes, and one fenced because its lease was taken over. After each, the next
//! runner's tick is correct: a dead tick is recorded as `ABORT reason=lease_expired`, at
//! most one node's spend is lost, and nothing of the fenced runner reaches the branch.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::remote::{FaultAgent, Remote, Transport, faketime_lib, start_loop};
use crate::support::{PATIENCE, Project, Run, count};

fn tick(p: &Project, env: &[(&str, &str)]) -> Run {
    let r = p.lf_env(&["run", "--loop", "r", "--json"], env);
    assert_eq!(r.code, 0, "{r:?}");
    r
}

fn spawn(p: &Project) -> Child {
    p.lf_cmd(&["run", "--loop", "r", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loopflow")
}

/// Ticks until the loop is no longer `locked` (the dead runner's lease ran out).
fn tick_after_expiry(p: &Project) -> Run {
    let start = Instant::now();
    loop {
        let r = tick(p, &[]);
        if r.json()["reason"] != "locked" {
            return r;
        }
        assert!(start.elapsed() < PATIENCE, "the lease never expired: {r:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn lines_starting(events: &[String], prefix: &str) -> usize {
    events.iter().filter(|e| e.starts_with(prefix)).count()
}

fn usd(remote: &Remote) -> f64 {
    remote.state("r")["spent"]["usd"].as_f64().expect("usd")
}

/// Runner A is killed with `kill -9` while its verify agent runs: it holds the lease, and
/// its implement node's spend was checkpointed. The next runner finds the lease expired,
/// records the dead tick, counts its checkpointed spend, and ticks iteration 1.
#[test]
fn a_runner_killed_mid_agent_is_recorded_and_loses_one_node_of_spend() {
    let remote = Remote::new(Transport::File);
    let f = FaultAgent::new();
    f.wait_in("verify");
    let _human = start_loop(&remote, "r", &f.toml(false));
    let (a, b) = (remote.clone(), remote.clone());
    let mut runner = spawn(&a);
    f.started();
    runner.kill().expect("kill -9");
    let _ = runner.wait();
    let lease: Value = serde_json::from_str(
        &remote
            .file("r", "lease.json")
            .expect("the dead runner's lease"),
    )
    .expect("JSON");
    assert_eq!(
        lease["spent"]["usd"], 0.25,
        "implement's spend checkpointed"
    );
    // While the lease lives, nobody else ticks.
    assert_eq!(tick(&b, &[]).json()["reason"], "locked");
    let r = tick_after_expiry(&b);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(r.json()["iteration"], 1, "{r:?}");
    f.go();
    let events = remote.events("r");
    assert_eq!(
        lines_starting(&events, "ABORT reason=lease_expired holder="),
        1,
        "{events:#?}"
    );
    assert_eq!(lines_starting(&events, "TICK "), 1, "{events:#?}");
    // A's implement (0.25, checkpointed) and B's three roles; A's verify is the one lost.
    assert_eq!(usd(&remote), 1.0, "{events:#?}");
    let state = remote.state("r");
    assert_eq!(state["iteration_count"], 1);
    assert_eq!(
        state["consecutive_aborts"], 0,
        "the tick after it reset the count"
    );
    assert_eq!(remote.branch_commits("r"), 1);
}

/// Runner A is killed after its branch commit, before its settle push: nothing of it is on
/// the remote's branch; the next runner records the dead tick (with all three roles'
/// checkpointed spend) and its own tick is the branch's one commit.
#[test]
fn a_runner_killed_before_its_settle_leaves_nothing_on_the_branch() {
    let remote = Remote::new(Transport::File);
    let f = FaultAgent::new();
    f.wait_in("pause");
    let _human = start_loop(&remote, "r", &f.toml(true));
    let (a, b) = (remote.clone(), remote.clone());
    let mut runner = spawn(&a);
    f.started();
    runner.kill().expect("kill -9");
    let _ = runner.wait();
    assert_eq!(remote.branch_commits("r"), 0, "the settle never happened");
    let r = tick_after_expiry(&b);
    f.go();
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let events = remote.events("r");
    assert_eq!(
        lines_starting(&events, "ABORT reason=lease_expired"),
        1,
        "{events:#?}"
    );
    assert_eq!(remote.state("r")["iteration_count"], 1);
    assert_eq!(remote.branch_commits("r"), 1, "only B's commit");
    assert_eq!(usd(&remote), 1.5, "A's three roles and B's: {events:#?}");
}

/// Runner A is killed while its lease push waits at the server; the push is then refused.
/// A never held the loop: the next runner ticks iteration 1 and the log records no abort.
#[test]
fn a_runner_killed_before_its_lease_leaves_no_trace() {
    let remote = Remote::new(Transport::Http);
    let f = FaultAgent::new();
    let _human = start_loop(&remote, "r", &f.toml(false));
    let (a, b) = (remote.clone(), remote.clone());
    let held = remote.root.path().join("held");
    let release = remote.root.path().join("release");
    remote.faults(&format!(
        r#"{{"hold_pushes": 1, "held": "{}", "release": "{}", "then": "fail"}}"#,
        held.display(),
        release.display()
    ));
    let mut runner = spawn(&a);
    crate::support::wait_for_file(&held);
    runner.kill().expect("kill -9");
    let _ = runner.wait();
    std::fs::write(&release, "").expect("release");
    let r = tick(&b, &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(r.json()["iteration"], 1);
    let events = remote.events("r");
    assert_eq!(lines_starting(&events, "ABORT "), 0, "{events:#?}");
    assert_eq!(lines_starting(&events, "LEASE "), 1, "{events:#?}");
}

/// Every push's answer is lost (the server applied it): the runner learns from the remote
/// what it did, and its tick is recorded exactly once.
#[test]
fn pushes_whose_answers_are_lost_count_once() {
    let remote = Remote::new(Transport::Http);
    let f = FaultAgent::new();
    let _human = start_loop(&remote, "r", &f.toml(false));
    let a = remote.clone();
    remote.faults(r#"{"drop_pushes": 100}"#);
    let r = tick(&a, &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    remote.faults("{}");
    let r = tick(&a, &[]);
    assert_eq!(r.json()["iteration"], 2, "{r:?}");
    let events = remote.events("r");
    assert_eq!(
        count(&events, "TICK pass=true score=0.1 iter=1"),
        1,
        "{events:#?}"
    );
    assert_eq!(
        count(&events, "TICK pass=true score=0.2 iter=2"),
        1,
        "{events:#?}"
    );
    assert_eq!(remote.branch_commits("r"), 2);
    let log = std::fs::read_to_string(remote.control.as_ref().unwrap().with_extension("json.log"))
        .unwrap_or_default();
    assert!(
        log.lines().filter(|l| *l == "drop_pushes").count() >= 3,
        "{log}"
    );
}

/// A remote answering 503: a refused lease push is tried again; a remote that answers
/// nothing else fails the run (exit 4, nothing changed); one that fails the settle leaves
/// the lease to expire, and the next runner records the dead tick with its spend.
#[test]
fn a_remote_answering_503_loses_nothing_of_record() {
    let remote = Remote::new(Transport::Http);
    let f = FaultAgent::new();
    let _human = start_loop(&remote, "r", &f.toml(false));
    let (a, b) = (remote.clone(), remote.clone());
    remote.faults(r#"{"fail_pushes": 1, "status": 503}"#);
    assert_eq!(tick(&a, &[]).json()["outcome"], "tick");
    remote.faults(r#"{"fail_all": 503}"#);
    let before = remote.rev("refs/loopflow/r/state");
    let r = a.lf(&["run", "--loop", "r", "--json"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("503"), "{r:?}");
    assert_eq!(
        remote.rev("refs/loopflow/r/state"),
        before,
        "nothing changed"
    );
    // The lease and three checkpoints go through; every settle push gets 503.
    remote.faults(r#"{"pass_pushes": 4, "fail_pushes": 100, "status": 503}"#);
    let r = a.lf(&["run", "--loop", "r", "--json"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("did not take the tick's result"), "{r:?}");
    remote.faults("{}");
    let r = tick_after_expiry(&b);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(r.json()["iteration"], 2, "{r:?}");
    let events = remote.events("r");
    assert_eq!(
        lines_starting(&events, "ABORT reason=lease_expired"),
        1,
        "{events:#?}"
    );
    // Tick 1 (0.75), the unsettled tick's checkpointed roles (0.75), tick 2 (0.75).
    assert_eq!(usd(&remote), 2.25, "{events:#?}");
    assert_eq!(remote.branch_commits("r"), 2);
}

/// A runner whose clock runs minutes ahead (less than the lease margin) does not take a
/// live lease; one a day ahead does: it records the holder's tick as dead and ticks,
/// and the holder, fenced, pushes nothing to the state or the branch — its commit goes to
/// an orphans ref.
#[test]
fn skewed_clocks_never_record_a_fenced_runners_work() {
    let Some(lib) = faketime_lib() else { return };
    let lib = lib.display().to_string();
    let remote = Remote::new(Transport::File);
    let f = FaultAgent::new();
    f.wait_in("pause");
    // A lease of minutes: the margin covers a skew of minutes.
    let toml = f.toml(true).table("remote", "lease_margin = \"5m\"");
    let _human = start_loop(&remote, "r", &toml);
    let (a, b, c) = (remote.clone(), remote.clone(), remote.clone());
    let runner = spawn(&a);
    f.started();
    let minutes = tick(&b, &[("LD_PRELOAD", &lib), ("FAKETIME", "+4m")]);
    assert_eq!(minutes.json()["reason"], "locked", "{minutes:?}");
    let day = tick(&c, &[("LD_PRELOAD", &lib), ("FAKETIME", "+1d")]);
    assert_eq!(day.json()["outcome"], "tick", "{day:?}");
    f.go();
    let fenced = Run::from(runner.wait_with_output().expect("wait"));
    assert_eq!(fenced.code, 0, "{fenced:?}");
    assert_eq!(fenced.json()["outcome"], "abort", "{fenced:?}");
    assert_eq!(fenced.json()["reason"], "fenced", "{fenced:?}");
    let events = remote.events("r");
    assert_eq!(lines_starting(&events, "TICK "), 1, "{events:#?}");
    assert_eq!(
        lines_starting(&events, "ABORT reason=lease_expired"),
        1,
        "{events:#?}"
    );
    assert_eq!(remote.state("r")["iteration_count"], 1);
    assert_eq!(remote.branch_commits("r"), 1, "C's commit only");
    let orphans = remote.git(&[
        "for-each-ref",
        "--format=%(refname)",
        "refs/loopflow/r/orphans/",
    ]);
    let orphan = orphans.lines().next().expect("an orphans ref").to_string();
    let branch = remote.rev("refs/heads/loopflow/r").expect("branch");
    assert_ne!(remote.rev(&orphan), Some(branch.clone()));
    let merged = remote.git(&["branch", "--contains", &remote.rev(&orphan).unwrap()]);
    assert!(
        merged.trim().is_empty(),
        "the fenced commit is on no branch: {merged}"
    );
}
