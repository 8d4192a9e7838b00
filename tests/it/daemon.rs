//! `loopflow daemon` reliability: per-loop intervals, a failing loop does not stop the
//! others, config edits are re-read, kill -9 mid-tick loses and doubles nothing, two
//! daemons never tick one loop at once, `--max-concurrent`.

use std::path::Path;
use std::process::{Child, Stdio};

use crate::support::{
    LoopToml, Project, live_group_members, wait_group_gone, wait_or_kill, wait_until,
};

fn spawn_daemon(p: &Project, args: &[&str]) -> Child {
    p.lf_cmd(&["daemon"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn daemon")
}

/// Waits for the daemon to exit, which it must do successfully; returns its stderr.
fn finish(mut c: Child) -> String {
    let st = wait_or_kill(&mut c, "daemon");
    let mut err = String::new();
    use std::io::Read;
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(st.success(), "daemon exited with {st}: {err}");
    err
}

/// The `iter=` values of the loop's TICK lines, in order.
fn tick_iters(p: &Project, name: &str) -> Vec<u64> {
    p.events(name)
        .iter()
        .filter(|e| e.starts_with("TICK "))
        .map(|e| {
            e.split(' ')
                .find_map(|kv| kv.strip_prefix("iter="))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("TICK without iter: {e}"))
        })
        .collect()
}

/// Every iteration committed exactly once: TICK lines are 1..=n and n is the state's count.
fn assert_consistent(p: &Project, name: &str) -> u64 {
    let iters = tick_iters(p, name);
    let n = p.state(name)["iteration_count"].as_u64().unwrap();
    assert_eq!(iters, (1..=n).collect::<Vec<_>>(), "{:?}", p.events(name));
    n
}

/// The loop.toml of [`daemon_loop`]: roles run `agent`, ticking every `interval` s.
fn daemon_toml(agent: &Path, interval: u64) -> LoopToml {
    LoopToml::new()
        .harness_agent(agent)
        .brakes("score_plateau_window = 100\nmax_iterations = 100")
        .table("schedule", &format!("interval_seconds = {interval}"))
}

/// A loop whose agent runs `implement` (a shell snippet) and passes with a constant
/// score (the plateau window is large so it never halts on it), ticking every `interval` s.
fn daemon_loop(p: &Project, name: &str, implement: &str, interval: u64) {
    let agent = p.script(
        &format!("{name}-agent.sh"),
        &format!(
            r#"case "$1" in
  implement) {implement} ;;
  verify) echo '{{"pass": false, "score": 0.5}}' ;;
esac"#
        ),
    );
    p.with_loop(name, &daemon_toml(&agent, interval));
}

#[test]
fn all_loops_tick_on_their_own_interval() {
    let p = Project::new();
    daemon_loop(&p, "fast", "true", 1);
    daemon_loop(&p, "slow", "true", 3600);
    let r = p.lf(&["daemon", "--all", "--max-iterations", "4"]);
    assert_eq!(r.code, 0, "{r:?}");
    // Both are due at start; then only `fast` comes round again (every second).
    assert_eq!(assert_consistent(&p, "fast"), 3);
    assert_eq!(assert_consistent(&p, "slow"), 1);
    assert!(
        p.events("slow")
            .last()
            .unwrap()
            .starts_with("DAEMON_STOPPED ticks=4")
    );
}

#[test]
fn a_loop_with_a_bad_config_does_not_stop_the_others() {
    let p = Project::new();
    daemon_loop(&p, "bad", "true", 1);
    daemon_loop(&p, "good", "true", 1);
    let cfg = p.read(".loopflow/loops/bad/loop.toml");
    p.loop_toml("bad", &format!("{cfg}\nnot_a_key = 1\n"));
    let r = p.lf(&["daemon", "--all", "--max-iterations", "4"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("not_a_key"), "{r:?}");
    assert_eq!(assert_consistent(&p, "good"), 2);
    let bad = p.events("bad");
    assert_eq!(
        bad.iter()
            .filter(|e| *e == "ERROR reason=invalid_config")
            .count(),
        2,
        "{bad:?}"
    );
    assert_eq!(p.state("bad")["iteration_count"], 0);
}

#[test]
fn config_edits_are_read_on_the_next_tick() {
    let p = Project::new();
    daemon_loop(&p, "l", "echo one >> impl.log", 1);
    let d = spawn_daemon(&p, &["--loop", "l", "--max-iterations", "100"]);
    wait_until("a first tick", || !tick_iters(&p, "l").is_empty());
    // A new agent (and interval) in loop.toml: picked up without restarting the daemon.
    let agent2 = p.script(
        "agent2.sh",
        r#"case "$1" in
  implement) echo two >> impl.log ;;
  verify) echo '{"pass": false, "score": 0.5}' ;;
esac"#,
    );
    p.loop_toml("l", &daemon_toml(&agent2, 1).render());
    wait_until("the edited agent to run", || {
        p.read("impl.log").contains("two")
    });
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    finish(d);
    assert!(p.events("l").last().unwrap().starts_with("DAEMON_STOPPED"));
    assert_consistent(&p, "l");
}

#[test]
fn kill_9_mid_tick_then_restart_loses_and_doubles_nothing() {
    let p = Project::new();
    let dir = p.path().display().to_string();
    // Tick 2's implement waits for `release`: the daemon is killed there.
    daemon_loop(
        &p,
        "k",
        &format!(
            r#"if [ "$LOOPFLOW_TICK" = 2 ]; then touch "{dir}/in-tick-2"; while [ ! -f "{dir}/release" ]; do sleep 0.05; done; fi"#
        ),
        1,
    );
    let mut d = spawn_daemon(&p, &["--loop", "k", "--max-iterations", "100"]);
    wait_until("tick 2 to be mid-way", || p.join("in-tick-2").exists());
    d.kill().unwrap(); // SIGKILL
    d.wait().unwrap();
    assert_eq!(
        assert_consistent(&p, "k"),
        1,
        "tick 2 has not committed yet"
    );

    // A new daemon finds tick 2 still holding the loop (its `run` outlived the daemon)
    // and skips instead of starting a second tick beside it.
    let d2 = spawn_daemon(&p, &["--loop", "k", "--max-iterations", "3"]);
    wait_until("the new daemon to find the loop locked", || {
        p.events("k").iter().any(|e| e == "SKIP reason=locked")
    });
    p.write("release", "");
    finish(d2);
    wait_until("tick 2 to commit", || tick_iters(&p, "k").contains(&2));
    // Tick 2 completed exactly once; every attempt of the new daemon either ticked or
    // skipped on the lock: nothing lost, nothing doubled.
    let n = assert_consistent(&p, "k");
    let skips = p
        .events("k")
        .iter()
        .filter(|e| *e == "SKIP reason=locked")
        .count() as u64;
    assert_eq!(n + skips, 2 + 3, "{:?}", p.events("k"));
}

#[test]
fn sigterm_interrupts_the_running_tick_and_stops_the_daemon() {
    let p = Project::new();
    let dir = p.path().display().to_string();
    daemon_loop(
        &p,
        "s",
        &format!(r#"touch "{dir}/in-tick"; while :; do sleep 0.05; done"#),
        1,
    );
    let d = spawn_daemon(&p, &["--loop", "s", "--max-iterations", "100"]);
    wait_until("the tick to start", || p.join("in-tick").exists());
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    finish(d);
    let ev = p.events("s");
    assert!(
        ev.iter()
            .any(|e| e == "ABORT node=implement reason=interrupted"),
        "{ev:?}"
    );
    assert!(ev.last().unwrap().starts_with("DAEMON_STOPPED"), "{ev:?}");
    assert_eq!(p.state("s")["iteration_count"], 0);
}

#[test]
fn two_daemons_never_tick_one_loop_at_once() {
    let p = Project::new();
    let dir = p.path().display().to_string();
    // `mkdir` is atomic: a second tick inside implement while one runs leaves OVERLAP.
    daemon_loop(
        &p,
        "t",
        &format!(
            r#"mkdir "{dir}/inflight" 2>/dev/null || echo OVERLAP >> "{dir}/overlap"
touch "{dir}/started"
while [ ! -f "{dir}/release" ]; do sleep 0.05; done
sleep 0.2
rmdir "{dir}/inflight""#
        ),
        1,
    );
    let a = spawn_daemon(&p, &["--loop", "t", "--max-iterations", "3"]);
    wait_until("daemon A's tick to start", || p.join("started").exists());
    let b = spawn_daemon(&p, &["--loop", "t", "--max-iterations", "3"]);
    wait_until("daemon B to find the loop locked", || {
        p.events("t").iter().any(|e| e == "SKIP reason=locked")
    });
    p.write("release", "");
    finish(a);
    finish(b);
    assert!(
        !p.join("overlap").exists(),
        "two ticks overlapped: {:?}",
        p.events("t")
    );
    let n = assert_consistent(&p, "t");
    let skips = p
        .events("t")
        .iter()
        .filter(|e| *e == "SKIP reason=locked")
        .count() as u64;
    assert_eq!(n + skips, 6, "{:?}", p.events("t"));
}

#[test]
fn max_concurrent_runs_loops_side_by_side() {
    let p = Project::new();
    let dir = p.path().display().to_string();
    // Each implement waits (up to 60 s) for the other loop's to have started: only
    // possible when both tick at once.
    for (me, other) in [("a", "b"), ("b", "a")] {
        daemon_loop(
            &p,
            me,
            &format!(
                r#"touch "{dir}/{me}-started"; i=0
while [ ! -f "{dir}/{other}-started" ]; do i=$((i+1)); [ $i -gt 1200 ] && exit 1; sleep 0.05; done"#
            ),
            3600,
        );
    }
    let r = p.lf(&[
        "daemon",
        "--all",
        "--max-concurrent",
        "2",
        "--max-iterations",
        "2",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let both = format!("a: {:?}\nb: {:?}\n{r:?}", p.events("a"), p.events("b"));
    assert_eq!(assert_consistent(&p, "a"), 1, "{both}");
    assert_eq!(assert_consistent(&p, "b"), 1, "{both}");
}

#[test]
fn bad_names_are_usage_errors() {
    // (`--max-iterations 0` means no limit, as in the seed's R3: tick.rs.)
    let p = Project::new();
    assert_eq!(p.lf(&["daemon", "--loop", "../z"]).code, 2);
    assert_eq!(p.lf(&["daemon"]).code, 2);
}

#[test]
fn daemon_all_picks_up_a_loop_created_while_it_runs() {
    let p = Project::new();
    daemon_loop(&p, "first", "true", 1);
    let d = spawn_daemon(&p, &["--all", "--max-iterations", "200"]);
    wait_until("the first loop to tick", || {
        !tick_iters(&p, "first").is_empty()
    });
    daemon_loop(&p, "second", "true", 1);
    wait_until("the new loop to tick", || {
        !tick_iters(&p, "second").is_empty()
    });
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    finish(d);
    assert_consistent(&p, "first");
    assert_consistent(&p, "second");
}

/// A tick the daemon ran is killed outright (the OOM killer, `kill -9`): it cannot stop
/// its agent, whose group would run on until the loop's next tick, an hour later here.
/// The daemon sees its tick die by a signal and stops what it left at once, logged as
/// the next tick would log it; the daemon carries on.
#[test]
fn a_killed_tick_s_agents_are_stopped_by_the_daemon_at_once() {
    let p = Project::new();
    let dir = p.path().display().to_string();
    daemon_loop(
        &p,
        "o",
        &format!(r#"echo $$ > "{dir}/agent.pid"; sleep 300 & exec sleep 301"#),
        3600,
    );
    let d = spawn_daemon(&p, &["--loop", "o"]);
    // The shell creates the file before `echo` writes to it: wait for the number.
    let agent_pid = || -> Option<i32> {
        std::fs::read_to_string(p.join("agent.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    wait_until("the agent to start", || agent_pid().is_some());
    let pgid: i32 = agent_pid().unwrap();
    // The tick's pid, from the mark it keeps in the lock file while it runs.
    let lock = p.loop_dir("o").join(".lock");
    let mut tick = 0;
    wait_until("the agent's group recorded", || {
        let t = std::fs::read_to_string(&lock).unwrap_or_default();
        tick = t
            .lines()
            .find_map(|l| l.strip_prefix("tick ")?.trim().parse().ok())
            .unwrap_or(0);
        tick > 0 && t.contains(&format!("pgid {pgid}\n"))
    });
    assert!(!live_group_members(pgid).is_empty());
    // SAFETY: kills the daemon's child tick, as the OOM killer would.
    unsafe { libc::kill(tick, libc::SIGKILL) };
    let left = wait_group_gone(pgid);
    assert!(left.is_empty(), "left running: {left:?}");
    wait_until("the daemon to log what it stopped", || {
        p.events("o")
            .iter()
            .any(|e| e.starts_with(&format!("WARN pgid={pgid} killed=2")))
    });
    // The lock file's marks were cleared (not left naming the daemon as a running tick).
    wait_until("the lock file's marks cleared", || {
        std::fs::read_to_string(&lock).is_ok_and(|t| t.is_empty())
    });
    // The daemon is still there, and the loop is not marked as running.
    let mut d = d;
    assert!(d.try_wait().unwrap().is_none(), "the daemon stopped");
    let s = p.lf(&["status", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&s.stdout).unwrap();
    assert_eq!(j["loops"][0]["running"], false, "{j}");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    let err = finish(d);
    // Both processes of the agent's group, each counted once.
    assert!(
        err.contains("was killed (signal 9); stopped the 2 process(es) it left running"),
        "{err}"
    );
    // Killed with its group, nothing of it is found again by the sweep for marks.
    assert!(
        !p.events("o")
            .iter()
            .any(|e| e.contains("outside its recorded groups")),
        "{:?}",
        p.events("o")
    );
    assert_eq!(p.state("o")["iteration_count"], 0);
}
