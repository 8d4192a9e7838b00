//! Benchmark: the daemon's own cost, in one run.
//!
//! 1. `daemon --all` ticking 100 loops (each due at start, `--max-iterations 100`)
//!    against the same 100 ticks run one by one as `loopflow run --loop X` processes,
//!    interleaved round by round (alternating which goes first); the ratio per round.
//! 2. Wakes: `daemon --loop X --interval 1 --max-iterations 5` counts its wakes
//!    (`LOOPFLOW_DAEMON_STATS=1`): an idle daemon wakes only for a tick's end and for
//!    its loop being due, about two per tick.
//! 3. Scale: `daemon --all --max-iterations 20` over 100, 1,000 and 10,000 loops: its
//!    own CPU before the first tick (listing and scheduling every loop) and per wake
//!    after it (one tick started and collected), so linear startup and flat per-wake
//!    cost show as numbers.
//!
//! Run it with `scripts/bench daemon`, or `cargo bench --bench daemon` after
//! `cargo build --release`. `BENCH_ROUNDS` (default 6) sets the rounds of part 1.

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

mod support;

/// A project of `n` loops `l00000`…, copies of one made by `create`.
fn project(n: usize) -> (tempfile::TempDir, Vec<String>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = support::new_loop(dir.path(), "l00000");
    let toml = support::agent_loop_toml(1000, "off") + "\n[schedule]\ninterval_seconds = 3600\n";
    std::fs::write(first.dir.join("loop.toml"), toml).expect("loop.toml");
    let loops = first.dir.parent().expect("loops dir").to_path_buf();
    let names: Vec<String> = (0..n).map(|i| format!("l{i:05}")).collect();
    for name in &names[1..] {
        support::copy_loop(&first.dir, &loops.join(name));
    }
    (dir, names)
}

fn run(cmd: &mut Command) -> (Duration, String) {
    let (d, out) = support::timed_run(cmd);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{err}",
        out.status
    );
    (d, err)
}

fn stats(err: &str) -> serde_json::Value {
    err.lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no stats line:\n{err}"))
}

fn daemon(exe: &Path, project: &Path, args: &[&str]) -> (Duration, serde_json::Value) {
    let mut c = Command::new(exe);
    c.arg("--project")
        .arg(project)
        .arg("daemon")
        .args(args)
        .env("LOOPFLOW_DAEMON_STATS", "1");
    let (d, err) = run(&mut c);
    (d, stats(&err))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    if support::listing() {
        return;
    }
    let rounds = support::rounds(6);
    let exe = support::loopflow_bin();
    println!("daemon benchmark ({})", exe.display());

    // 1. 100 loops: the daemon against the same ticks one by one.
    let (p, names) = project(100);
    let sequential = |exe: &Path| {
        let start = Instant::now();
        for n in &names {
            let mut c = Command::new(exe);
            c.args(["run", "--loop", n, "--project"]).arg(p.path());
            run(&mut c);
        }
        start.elapsed()
    };
    let all = ["--all", "--max-iterations", "100", "--interval", "3600"];
    // Warm-up, not counted.
    sequential(&exe);
    daemon(&exe, p.path(), &all);
    let mut ratios = Vec::new();
    let (mut seq_ms, mut dae_ms) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (s, d) = if r % 2 == 0 {
            let s = sequential(&exe);
            (s, daemon(&exe, p.path(), &all).0)
        } else {
            let d = daemon(&exe, p.path(), &all).0;
            (sequential(&exe), d)
        };
        seq_ms.push(s.as_secs_f64() * 1e3);
        dae_ms.push(d.as_secs_f64() * 1e3);
        ratios.push(d.as_secs_f64() / s.as_secs_f64());
    }
    for v in [&mut ratios, &mut seq_ms, &mut dae_ms] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "  100 loops, {rounds} interleaved rounds: 100 `run` processes one by one {:.0} ms, `daemon --all` {:.0} ms (medians)",
        percentile(&seq_ms, 0.5),
        percentile(&dae_ms, 0.5)
    );
    println!(
        "    daemon/sequential median {:.3}x, min-max {:.3}-{:.3}x (target <= 1.5x)",
        percentile(&ratios, 0.5),
        ratios[0],
        ratios[ratios.len() - 1]
    );
    drop(p);

    // 2. Wakes of a daemon that is idle between ticks.
    let (p, _) = project(1);
    let (d, s) = daemon(
        &exe,
        p.path(),
        &[
            "--loop",
            "l00000",
            "--interval",
            "1",
            "--max-iterations",
            "5",
        ],
    );
    println!(
        "  idle: 5 ticks 1 s apart in {:.1} s: {} wakes ({:.1} per tick; a 100 ms poll would be ~{})",
        d.as_secs_f64(),
        s["wakes"],
        s["wakes"].as_f64().unwrap_or(0.0) / 5.0,
        (d.as_secs_f64() * 10.0).round()
    );
    drop(p);

    // 3. Startup and per-wake cost against the number of loops.
    println!("  scale (`daemon --all --max-iterations 20`, the daemon's own CPU):");
    for n in [100usize, 1_000, 10_000] {
        let (p, _) = project(n);
        // The second of two runs: the first pages the loops' directories in.
        daemon(&exe, p.path(), &["--all", "--max-iterations", "20"]);
        let (_, s) = daemon(&exe, p.path(), &["--all", "--max-iterations", "20"]);
        let f = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
        let wakes = f("wakes");
        let per_wake = (f("cpu_ms") - f("startup_cpu_ms")) / wakes;
        println!(
            "    {n:>6} loops: startup {:>8.2} ms ({:.2} us/loop), {wakes} wakes at {:.3} ms each, stop (a DAEMON_STOPPED line per loop) {:.2} ms",
            f("startup_cpu_ms"),
            f("startup_cpu_ms") * 1e3 / n as f64,
            per_wake,
            f("stop_cpu_ms"),
        );
    }
}
