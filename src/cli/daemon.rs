//! `daemon`: ticks loops on their intervals when no native scheduler is at hand. Each tick
//! runs as its own `loopflow run` process, so a tick outlives a killed daemon.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;

use super::run::install_signals;
use crate::exit;
use crate::state::{Event, LogArg, LoopPaths};

#[derive(Args, Debug)]
pub struct DaemonArgs {
    /// Pipeline file; default: each loop's `pipeline` key, else the built-in tick.
    pub pipeline: Option<PathBuf>,
    /// The loop to tick.
    #[arg(
        long = "loop",
        value_name = "NAME",
        required_unless_present = "all",
        conflicts_with = "all"
    )]
    pub loop_name: Option<String>,
    /// Tick every loop of the project, each on its own interval.
    #[arg(long)]
    pub all: bool,
    /// Seconds between ticks; default: each loop's schedule.interval_seconds, else 3600.
    #[arg(long, value_name = "S")]
    pub interval: Option<u64>,
    /// Exit 0 after this many tick attempts (does not touch the loops' brakes); 0 means
    /// no limit, as when the flag is absent.
    #[arg(long, value_name = "N")]
    pub max_iterations: Option<u64>,
    /// Print each tick's JSON summary on stdout, one document per line (JSON Lines).
    #[arg(long)]
    pub json: bool,
    /// How many loops may tick at the same time (never two ticks of one loop).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub max_concurrent: usize,
}

/// Runs one tick as a child `loopflow run` process and waits for it. A tick of its own
/// process means a tick survives the daemon: when the daemon is killed (even with
/// SIGKILL) the tick finishes and commits, holding the loop's lock until then, instead
/// of leaving its agent running unlocked beside the next tick. SIGINT/SIGTERM to the
/// daemon are passed on as SIGTERM, which the tick handles as an interruption.
fn tick_child(
    exe: &Path,
    project: &Path,
    name: &str,
    a: &DaemonArgs,
    cancel: &AtomicBool,
) -> Result<i32, String> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--project").arg(project).arg("run");
    if let Some(p) = &a.pipeline {
        cmd.arg(p);
    }
    cmd.args(["--loop", name]);
    if a.json {
        cmd.arg("--json");
    }
    cmd.stdin(std::process::Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("spawn loopflow run: {e}"))?;
    let mut passed_on = false;
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(st.code().unwrap_or(exit::INTERRUPTED));
        }
        if cancel.load(Ordering::SeqCst) && !passed_on {
            passed_on = true;
            #[cfg(unix)]
            // SAFETY: kill only sends a signal to our own child.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
            #[cfg(not(unix))]
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn daemon(project: &Path, a: DaemonArgs) -> i32 {
    let cancel = install_signals();
    let names: Vec<String> = match &a.loop_name {
        Some(n) => {
            if let Err(e) = crate::state::check_loop_name(n) {
                eprintln!("error: {e}");
                return exit::USAGE;
            }
            vec![n.clone()]
        }
        None => Vec::new(),
    };
    let max_concurrent = a.max_concurrent.max(1);
    // Taken once, while it surely exists: after an upgrade replaces the file, the path
    // names the new binary (Linux's /proc/self/exe would say "… (deleted)").
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot find the path of the running loopflow binary: {e}");
            return exit::STATE;
        }
    };
    let mut attempts = 0u64;
    // Due times sit on a grid of each loop's interval measured from the daemon's start,
    // so loops sharing an interval wake together and nothing drifts; a slot missed while
    // a tick ran long is skipped, not made up in a burst.
    let start = Instant::now();
    let mut due: BTreeMap<String, Instant> = BTreeMap::new();
    // The last interval each loop's config gave: a config that does not read (being
    // edited, say) keeps it, and a loop never read yet retries after a minute.
    let mut known: BTreeMap<String, Duration> = BTreeMap::new();
    let mut interval_of = |name: &str| -> Duration {
        if let Some(s) = a.interval {
            return Duration::from_secs(s.max(1));
        }
        // Re-read every time: an edited interval applies from the next tick on.
        let paths = LoopPaths::new(project, name);
        let mut d = crate::diag::Diagnostics::default();
        match crate::config::LoopConfig::read(&paths.config(), project, &mut d) {
            Ok(Some(c)) => {
                let iv = Duration::from_secs(c.interval_seconds.max(1));
                known.insert(name.to_string(), iv);
                iv
            }
            _ => known.get(name).copied().unwrap_or(Duration::from_secs(60)),
        }
    };
    let next_slot = |iv: Duration, now: Instant| -> Instant {
        let k = now.saturating_duration_since(start).as_nanos() / iv.as_nanos().max(1) + 1;
        start + iv * u32::try_from(k).unwrap_or(u32::MAX)
    };
    let stopped = |names: &[String], attempts: u64| {
        for n in names {
            let p = LoopPaths::new(project, n);
            if p.dir.is_dir() {
                let _ = p.log(
                    Event::DaemonStopped,
                    &[LogArg::Kv("ticks", attempts.to_string())],
                );
            }
        }
        eprintln!("loopflow daemon stopped after {attempts} tick attempt(s)");
    };
    loop {
        // Re-read the set of loops each round so new loops are picked up.
        let current: Vec<String> = if a.all {
            crate::state::list_loops(project)
        } else {
            names.clone()
        };
        let now = Instant::now();
        for n in &current {
            due.entry(n.clone()).or_insert(now);
        }
        due.retain(|n, _| current.contains(n));
        let mut ready: Vec<String> = due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(n, _)| n.clone())
            .collect();
        while !ready.is_empty() && !cancel.load(Ordering::SeqCst) {
            let left = a.max_iterations.filter(|&m| m > 0).map_or(usize::MAX, |m| {
                usize::try_from(m.saturating_sub(attempts)).unwrap_or(usize::MAX)
            });
            let take = ready.len().min(max_concurrent).min(left);
            let batch: Vec<String> = ready.drain(..take).collect();
            // Up to --max-concurrent loops tick at once, each as its own `run` process;
            // each loop's lock still keeps two ticks of one loop (from another daemon,
            // say) apart.
            let results: Vec<(String, Result<i32, String>)> = std::thread::scope(|s| {
                let handles: Vec<_> = batch
                    .iter()
                    .map(|n| {
                        let (a, cancel, exe) = (&a, &cancel, &exe);
                        s.spawn(move || (n.clone(), tick_child(exe, project, n, a, cancel)))
                    })
                    .collect();
                handles
                    .into_iter()
                    .zip(&batch)
                    .map(|(h, n)| {
                        h.join()
                            .unwrap_or_else(|_| (n.clone(), Err("the tick thread panicked".into())))
                    })
                    .collect()
            });
            for (n, r) in results {
                match r {
                    Ok(code) if code == exit::OK || code == exit::INTERRUPTED => {}
                    // One loop's failure never stops the others; `run` said why on stderr.
                    Ok(code) => eprintln!(
                        "loopflow daemon: the tick of loop {n} exited with {code}; carrying on"
                    ),
                    Err(e) => {
                        eprintln!("loopflow daemon: could not tick loop {n}: {e}; carrying on")
                    }
                }
                attempts += 1;
                due.insert(n.clone(), next_slot(interval_of(&n), Instant::now()));
            }
            if a.max_iterations.is_some_and(|m| m > 0 && attempts >= m) {
                stopped(&current, attempts);
                return exit::OK;
            }
        }
        if cancel.load(Ordering::SeqCst) {
            stopped(&current, attempts);
            return exit::OK;
        }
        let next = due
            .values()
            .min()
            .copied()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
        // With --all and no loop yet, look again for new loops now and then.
        let next = if due.is_empty() {
            next.min(Instant::now() + Duration::from_secs(5))
        } else {
            next
        };
        while Instant::now() < next && !cancel.load(Ordering::SeqCst) {
            std::thread::sleep(
                next.saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
            );
        }
    }
}
