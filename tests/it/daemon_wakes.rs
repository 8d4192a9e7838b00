//! The daemon sleeps until something needs it: counted with `LOOPFLOW_DAEMON_STATS`, an
//! idle daemon wakes about twice per tick (the tick's end, then its loop being due), never
//! on a fixed period, and a loop made while it sleeps wakes it through the directory
//! watch rather than at the next due time.

use std::process::{Child, Stdio};

use crate::support::{LoopToml, Project, wait_or_kill, wait_until};

fn loop_of(p: &Project, name: &str, interval: u64) {
    let agent = p.script(
        &format!("{name}-agent.sh"),
        r#"case "$1" in
  verify) echo '{"pass": false, "score": 0.5}' ;;
esac"#,
    );
    p.with_loop(
        name,
        &LoopToml::new()
            .harness_agent(&agent)
            .brakes("score_plateau_window = 100\nmax_iterations = 100")
            .table("schedule", &format!("interval_seconds = {interval}")),
    );
}

fn ticks(p: &Project, name: &str) -> usize {
    p.events(name)
        .iter()
        .filter(|e| e.starts_with("TICK "))
        .count()
}

/// Waits for the daemon to exit 0; its stats line (the last JSON line on stderr).
fn stats(mut c: Child) -> serde_json::Value {
    let st = wait_or_kill(&mut c, "daemon");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut c.stderr.take().unwrap(), &mut err).unwrap();
    assert!(st.success(), "daemon exited with {st}: {err}");
    err.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .unwrap_or_else(|| panic!("no stats line: {err}"))
}

fn spawn(p: &Project, args: &[&str]) -> Child {
    p.lf_cmd(&["daemon"])
        .args(args)
        .env("LOOPFLOW_DAEMON_STATS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn daemon")
}

#[test]
fn an_idle_daemon_wakes_only_for_a_tick_ending_or_a_loop_due() {
    let p = Project::new();
    loop_of(&p, "l", 1);
    // Three ticks a second apart: about two seconds asleep, which a 100 ms poll would
    // have cut into twenty wakes.
    let s = stats(spawn(&p, &["--loop", "l", "--max-iterations", "3"]));
    assert_eq!(s["ticks"], 3, "{s}");
    assert_eq!(ticks(&p, "l"), 3);
    let wakes = s["wakes"].as_u64().unwrap();
    assert!(wakes <= 2 * 3 + 1, "woke {wakes} times for 3 ticks: {s}");
}

#[test]
fn a_loop_made_while_the_daemon_sleeps_wakes_it() {
    let p = Project::new();
    loop_of(&p, "first", 3600);
    let d = spawn(&p, &["--all"]);
    wait_until("the first loop to tick", || ticks(&p, "first") == 1);
    // `first` is due again in an hour: only the directory watch can bring `second` in.
    loop_of(&p, "second", 3600);
    wait_until("the new loop to tick", || ticks(&p, "second") == 1);
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
    let s = stats(d);
    assert_eq!(s["ticks"], 2, "{s}");
    assert_eq!(ticks(&p, "first"), 1);
    // Two tick ends, a few directory events while `second` was made, the signal.
    let wakes = s["wakes"].as_u64().unwrap();
    assert!(wakes <= 12, "woke {wakes} times: {s}");
}
