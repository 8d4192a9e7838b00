//! `status` finds a running tick without taking its lock: ticks started while `status`
//! runs over and over beside them are never turned away as `locked` because of it, and a
//! tick killed with `kill -9` (its mark left in the lock file) is not reported running.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use crate::support::{LoopToml, Project};

fn fast_loop(p: &Project) {
    let agent = p.script(
        "agent.sh",
        r#"case "$1" in
  verify) echo '{"pass": false, "score": 0.5}' ;;
esac"#,
    );
    p.with_loop(
        "l",
        &LoopToml::new()
            .harness_agent(&agent)
            .brakes("score_plateau_window = 1000\nmax_iterations = 1000"),
    );
}

#[test]
fn status_in_a_loop_never_makes_a_starting_tick_skip_locked() {
    let p = Arc::new(Project::new());
    fast_loop(&p);
    let stop = Arc::new(AtomicBool::new(false));
    let looks = Arc::new(AtomicUsize::new(0));
    let lookers: Vec<_> = (0..3)
        .map(|_| {
            let (p, stop, looks) = (Arc::clone(&p), Arc::clone(&stop), Arc::clone(&looks));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let r = p.lf(&["status", "--loop", "l", "--json"]);
                    assert_eq!(r.code, 0, "{r:?}");
                    looks.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    let mut skipped = Vec::new();
    for i in 0..100 {
        let r = p.lf(&["run", "--loop", "l", "--json"]);
        assert_eq!(r.code, 0, "{r:?}");
        if r.json()["outcome"] != "tick" {
            skipped.push((i, r.stdout.clone()));
        }
    }
    stop.store(true, Ordering::SeqCst);
    for l in lookers {
        l.join().unwrap();
    }
    assert!(looks.load(Ordering::SeqCst) > 60, "status ran too rarely");
    assert_eq!(skipped, Vec::<(i32, String)>::new());
}

/// `status`'s `running` for loop `l`.
fn running(p: &Project) -> serde_json::Value {
    let r = p.lf(&["status", "--loop", "l", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let j: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    j["loops"][0]["running"].clone()
}

#[test]
fn a_tick_killed_mid_run_is_not_reported_running() {
    let p = Project::new();
    fast_loop(&p);
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    // What `kill -9` leaves: the lock file's mark of a process that is gone.
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let pid = dead.id();
    dead.wait().unwrap();
    p.write(".loopflow/loops/l/.lock", &format!("tick {pid}\n"));
    assert_eq!(running(&p), false);
    // A live process's mark is a running tick.
    let mut live = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    p.write(".loopflow/loops/l/.lock", &format!("tick {}\n", live.id()));
    let seen = running(&p);
    let _ = live.kill();
    let _ = live.wait();
    assert_eq!(seen, true);
}

/// The collision above is a window of microseconds, rarely hit; this one is certain: the
/// lock file held (shared) by someone else makes any probe that takes the lock fail, and
/// `status` must not care, as it never tries.
#[test]
fn status_decides_running_without_trying_the_lock() {
    use std::os::fd::AsRawFd;
    let p = Project::new();
    fast_loop(&p);
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let f = std::fs::File::open(p.join(".loopflow/loops/l/.lock")).unwrap();
    // SAFETY: flock on a descriptor we own.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) }, 0);
    assert_eq!(running(&p), false);
    // And a tick still runs once it is free.
    drop(f);
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
}
