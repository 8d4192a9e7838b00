//! Exactly once per slot, across every runner: N runner clones race on each slot, over
//! every transport; one TICK per slot in the record's log, one commit per slot on the
//! branch, and every loser exits 0.

use std::process::Stdio;

use crate::support::remote::{Remote, Transport, quick_agent, remote_toml, start_loop};
use crate::support::{Run, count};

const RUNNERS: usize = 8;
const SLOTS: usize = 4;

fn race(t: Transport) {
    let remote = Remote::new(t);
    let tools = tempfile::tempdir().expect("tempdir");
    let agent = quick_agent(tools.path());
    let toml = remote_toml(&agent).brakes("max_iterations = 100");
    let _human = start_loop(&remote, "r", &toml);
    let runners: Vec<_> = (0..RUNNERS).map(|_| remote.clone()).collect();
    for slot in 0..SLOTS {
        let slot = format!("2026-12-07T1{slot}:23Z");
        let children: Vec<_> = runners
            .iter()
            .map(|p| {
                p.lf_cmd(&["run", "--loop", "r", "--slot", &slot, "--json"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn loopflow")
            })
            .collect();
        let runs: Vec<Run> = children
            .into_iter()
            .map(|c| Run::from(c.wait_with_output().expect("wait")))
            .collect();
        let mut ticked = 0;
        for r in &runs {
            assert_eq!(r.code, 0, "every runner exits 0: {r:?}");
            let j = r.json();
            match j["outcome"].as_str() {
                Some("tick") => ticked += 1,
                Some("skip") => assert!(
                    matches!(j["reason"].as_str(), Some("locked" | "slot_taken")),
                    "{r:?}"
                ),
                _ => panic!("{r:?}"),
            }
        }
        assert_eq!(ticked, 1, "one tick for slot {slot}: {runs:?}");
    }
    let events = remote.events("r");
    let ticks: Vec<&String> = events.iter().filter(|e| e.starts_with("TICK ")).collect();
    assert_eq!(ticks.len(), SLOTS, "{events:#?}");
    let mut slots: Vec<String> = events
        .iter()
        .filter(|e| e.starts_with("LEASE "))
        .filter_map(|e| e.split(' ').find_map(|w| w.strip_prefix("slot=")))
        .map(str::to_string)
        .collect();
    slots.dedup();
    assert_eq!(slots.len(), SLOTS, "one lease per slot: {events:#?}");
    assert_eq!(
        count(&events, "TICK pass=true score=0.4 iter=4"),
        1,
        "{events:#?}"
    );
    assert_eq!(remote.state("r")["iteration_count"], SLOTS as u64);
    assert_eq!(remote.branch_commits("r"), SLOTS, "one commit per slot");
    assert!(
        remote.file("r", "lease.json").is_none(),
        "no lease left behind"
    );
}

#[test]
fn one_tick_per_slot_over_file() {
    race(Transport::File);
}

#[test]
fn one_tick_per_slot_over_git_daemon() {
    race(Transport::Daemon);
}

#[test]
fn one_tick_per_slot_over_smart_http() {
    race(Transport::Http);
}
