//! Benchmark: `loopflow run` as a scheduler fires it (`<exe> run --loop X --project DIR`,
//! a process of its own) against the floor (`benches/floor.rs`: a small process that
//! spawns the same three agents with output to per-tick files and writes one state file
//! atomically), in one interleaved run: every round times a floor process and a tick
//! back to back (alternating which goes first), with `[sandbox] mode = "off"` against
//! the bare floor and with the sandbox on (`"auto"`: Landlock and seccomp here, the
//! default `network = "hosts"`) against the confined floor (`benches/floor_confined.rs`:
//! the lock, the state read, three prompts, one ruleset and one filter of loopflow's size
//! built once, a `clone(CLONE_VM|CLONE_VFORK)` child per spawn that confines itself, the
//! atomic state write and a log line); each for a plain loop (the project is no repository)
//! and for the loop a user gets from `create` in a repository (its own worktree and
//! branch, the blast radius checked and the tick's changes committed by `git-commit`;
//! the agents change nothing, so nothing is committed). Reported: the per-pair ratio (median, the
//! 10th–90th percentile and the extremes), so machine noise shows as spread instead of
//! hiding in a mean.
//!
//! The loop is in its steady state: its `.state.log` is past 64 KiB (a loop that has
//! ticked for a while) and its outputs accumulate tick after tick, as the floor's do —
//! in the same directories: the floor writes its files into the loop's own `outputs/`
//! and loop directory, so both pay the same for creating a file there.
//!
//! Run it with `scripts/bench tick` (builds the release binaries it needs), or
//! `cargo bench --bench tick` after `cargo build --release` with `LOOPFLOW_FLOOR_BIN` and
//! `LOOPFLOW_FLOOR_CONFINED_BIN` naming the built floors. `BENCH_ROUNDS` (default 60) sets the pairs per mode.

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use loopflow::testing::LoopPaths;

mod support;

/// A release binary: `var` when set, else the first path that exists.
fn binary(var: &str, candidates: &[PathBuf]) -> PathBuf {
    if let Some(p) = std::env::var_os(var) {
        return PathBuf::from(p);
    }
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!("set {var} (or run scripts/bench, which builds and finds the binaries)")
        })
}

/// The newest `target/release/deps/<name>-*` executable (what `cargo bench` built).
fn built(root: &Path, name: &str) -> Vec<PathBuf> {
    let prefix = format!("{name}-");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> =
        std::fs::read_dir(root.join("target/release/deps"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && !n.contains('.'))
            })
            .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
            .collect();
    found.sort();
    found.into_iter().rev().map(|(_, p)| p).collect()
}

/// A loop set up for the benchmark, with a log past 64 KiB.
fn project(sandbox: &str, worktree: bool) -> (tempfile::TempDir, LoopPaths) {
    let project = tempfile::tempdir().expect("tempdir");
    let paths = if worktree {
        support::new_worktree_loop(project.path(), "bench")
    } else {
        support::new_loop(project.path(), "bench")
    };
    std::fs::write(
        paths.dir.join("loop.toml"),
        support::agent_loop_toml_in(50, sandbox, worktree),
    )
    .expect("loop.toml");
    let old: String = (0..1600)
        .map(|i| format!("2026-11-01T00:00:00Z WARN msg=\"an older event, number {i:05}\"\n"))
        .collect();
    std::fs::write(&paths.log, old).expect("log");
    (project, paths)
}

/// What creating one empty file in `dir` costs now, in microseconds (median of 41; the
/// files stay until the project goes). Printed beside the ratios: on a filesystem
/// without a journal it is 15–20 us in a quiet directory and 200–500 us in one whose
/// block group lost thousands of files in the last minutes, and a tick creates three
/// more files than the floor.
fn creation_us(dir: &Path, tag: &str) -> f64 {
    let mut us: Vec<f64> = (0..41)
        .map(|i| {
            let start = Instant::now();
            std::fs::File::create_new(dir.join(format!("probe-{tag}-{i}"))).expect("probe file");
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    us.sort_by(f64::total_cmp);
    percentile(&us, 0.5)
}

/// The verifier always says 0.5: clear the score history (untimed) before the plateau
/// brake would end the benchmark.
fn reset_history(paths: &LoopPaths) {
    let mut s = paths.load().expect("state");
    if s.score_history.len() >= 40 {
        s.score_history.clear();
        loopflow::testing::save(&paths.state, &s).expect("save");
    }
}

/// The CPU time (user and system) this process's reaped children used so far.
fn children_cpu() -> Duration {
    // SAFETY: getrusage writes one rusage.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut r) };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000);
    t(r.ru_utime) + t(r.ru_stime)
}

/// Runs `cmd` to its end; its wall time, and the CPU time it and its children used.
fn timed(cmd: &mut Command, cpu: &mut Vec<Duration>) -> Duration {
    let before = children_cpu();
    let start = Instant::now();
    let st = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .expect("spawn");
    let d = start.elapsed();
    cpu.push(children_cpu().saturating_sub(before));
    assert!(st.success(), "{cmd:?} failed: {st}");
    d
}

struct Mode {
    name: &'static str,
    /// The floor this mode's tick is paired with.
    floor_bin: PathBuf,
    /// With the sandbox on, the confined floor again with a session per spawn (as
    /// loopflow's confined children have), timed in the same rounds: what sessions cost.
    session: Option<Vec<Duration>>,
    project: tempfile::TempDir,
    paths: LoopPaths,
    floor: Vec<Duration>,
    tick: Vec<Duration>,
    /// CPU time (user + system, children included) of each floor and tick: what a busy
    /// machine's waiting for the CPU leaves out.
    floor_cpu: Vec<Duration>,
    tick_cpu: Vec<Duration>,
}

impl Mode {
    fn new(name: &'static str, sandbox: &str, worktree: bool, floor: &Path) -> Mode {
        let (project, paths) = project(sandbox, worktree);
        Mode {
            name,
            floor_bin: floor.to_path_buf(),
            session: (sandbox != "off").then(Vec::new),
            project,
            paths,
            floor: Vec::new(),
            tick: Vec::new(),
            floor_cpu: Vec::new(),
            tick_cpu: Vec::new(),
        }
    }

    fn round(&mut self, exe: &Path, round: usize, tick_first: bool) {
        let mut f = Command::new(&self.floor_bin);
        f.arg(&self.paths.dir).arg(round.to_string());
        let mut t = Command::new(exe);
        t.args(["run", "--loop", "bench", "--project"])
            .arg(self.project.path());
        if tick_first {
            self.tick.push(timed(&mut t, &mut self.tick_cpu));
            self.floor.push(timed(&mut f, &mut self.floor_cpu));
        } else {
            self.floor.push(timed(&mut f, &mut self.floor_cpu));
            self.tick.push(timed(&mut t, &mut self.tick_cpu));
        }
        // After the pair (the first tick makes the loop's outputs/), in the same round.
        if let Some(s) = &mut self.session {
            let mut fs = Command::new(&self.floor_bin);
            fs.arg(&self.paths.dir)
                .arg((round + 5_000_000).to_string())
                .arg("--session");
            s.push(timed(&mut fs, &mut Vec::new()));
        }
        reset_history(&self.paths);
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

fn median_ms(v: &[Duration]) -> f64 {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    percentile(&ms, 0.5)
}

/// Syscalls one process made, from an `strace -f` log: its own threads only (a clone
/// that makes a child hands that pid to the child), by name.
fn syscalls(log: &str) -> std::collections::BTreeMap<String, u64> {
    let mut threads = std::collections::HashSet::new();
    let mut clone_thread = std::collections::HashMap::new();
    let mut counts = std::collections::BTreeMap::new();
    for line in log.lines() {
        let Some((pid, rest)) = line.split_once(char::is_whitespace) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if threads.is_empty() {
            threads.insert(pid);
        }
        if !threads.contains(&pid) {
            continue;
        }
        let rest = rest.trim_start();
        let name = if let Some(r) = rest.strip_prefix("<... ") {
            r.split(' ').next().unwrap_or("")
        } else {
            let n = rest.split('(').next().unwrap_or("");
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                continue;
            }
            *counts.entry(n.to_string()).or_insert(0) += 1;
            n
        };
        if matches!(name, "clone" | "clone3" | "vfork" | "fork") {
            if !rest.starts_with("<...") {
                clone_thread.insert(pid, rest.contains("CLONE_THREAD"));
            }
            if !rest.ends_with("<unfinished ...>")
                && let Some(new) = rest.rsplit("= ").next().and_then(|n| n.trim().parse().ok())
                && clone_thread.remove(&pid) == Some(true)
            {
                threads.insert(new);
            }
        }
    }
    counts
}

/// Instructions (callgrind, this process only; `None` with the sandbox on, as valgrind
/// does not know Landlock's syscalls) and syscalls (strace) of one run.
fn count(
    cmd: &[std::ffi::OsString],
    instructions: bool,
) -> (Option<u64>, u64, std::collections::BTreeMap<String, u64>) {
    let ir = instructions.then(|| callgrind(cmd));
    let log = tempfile::NamedTempFile::new().expect("temp");
    let st = Command::new("strace")
        .args(["-f", "-o"])
        .arg(log.path())
        .args(cmd)
        .stdout(Stdio::null())
        .status()
        .expect("strace (install it: apt-get install strace)");
    assert!(st.success());
    let by_name = syscalls(&std::fs::read_to_string(log.path()).expect("strace log"));
    (ir, by_name.values().sum(), by_name)
}

fn callgrind(cmd: &[std::ffi::OsString]) -> u64 {
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .args(cmd)
        .stdout(Stdio::null())
        .output()
        .expect("valgrind (install it: apt-get install valgrind)");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} under valgrind:\n{text}");
    text.lines()
        .find_map(|l| {
            l.split_once("Collected : ")
                .map(|(_, n)| n.trim().parse().ok())
        })
        .flatten()
        .unwrap_or_else(|| panic!("no instruction count from valgrind:\n{text}"))
}

/// `--counts`: one tick and one floor per mode, counted.
fn counts(exe: &Path, modes: &mut [Mode]) {
    println!("instructions (callgrind, the process itself) and syscalls (strace -f, its threads):");
    for m in modes {
        let floor_cmd: Vec<std::ffi::OsString> = [m.floor_bin.as_os_str(), m.paths.dir.as_os_str()]
            .into_iter()
            .map(Into::into)
            .chain(["999".into()])
            .collect();
        let tick_cmd: Vec<std::ffi::OsString> = [exe.as_os_str()]
            .into_iter()
            .map(Into::into)
            .chain(["run", "--loop", "bench", "--project"].map(Into::into))
            .chain([m.project.path().as_os_str().into()])
            .collect();
        let instructions = !m.name.contains("sandbox on");
        let (fi, fs, _) = count(&floor_cmd, instructions);
        let (ti, ts, by_name) = count(&tick_cmd, instructions);
        reset_history(&m.paths);
        let ir = |n: Option<u64>| {
            n.map_or("(n/a under valgrind)".to_string(), |n| {
                format!("{n} instructions")
            })
        };
        println!(
            "  {}: floor {}, {fs} syscalls; tick {}, {ts} syscalls",
            m.name,
            ir(fi),
            ir(ti)
        );
        if std::env::var_os("BENCH_SYSCALLS").is_some() {
            let mut v: Vec<_> = by_name.into_iter().collect();
            v.sort_by_key(|e| std::cmp::Reverse(e.1));
            let line: Vec<String> = v.iter().map(|(n, c)| format!("{n} {c}")).collect();
            println!("    {}", line.join(", "));
        }
    }
}

fn main() {
    if support::listing() {
        return;
    }
    let rounds = support::rounds(60);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = support::loopflow_bin();
    let floor = binary("LOOPFLOW_FLOOR_BIN", &built(root, "floor"));
    let confined = binary(
        "LOOPFLOW_FLOOR_CONFINED_BIN",
        &built(root, "floor_confined"),
    );
    let mut modes = [
        Mode::new("plain, sandbox off   ", "off", false, &floor),
        Mode::new("plain, sandbox on    ", "auto", false, &confined),
        Mode::new("worktree, sandbox off", "off", true, &floor),
        Mode::new("worktree, sandbox on ", "auto", true, &confined),
    ];
    // Warm up caches and page in the binaries; not counted.
    for m in &mut modes {
        for r in 0..5 {
            m.round(&exe, 1_000_000 + r, r % 2 == 0);
        }
        m.floor.clear();
        m.tick.clear();
        m.floor_cpu.clear();
        m.tick_cpu.clear();
        if let Some(s) = &mut m.session {
            s.clear();
        }
    }
    if std::env::args().any(|a| a == "--counts") {
        counts(&exe, &mut modes);
        return;
    }
    let outputs = modes[0].paths.dir.join("outputs");
    let created_before = creation_us(&outputs, "before");
    for r in 0..rounds {
        for m in &mut modes {
            m.round(&exe, r, r % 2 == 1);
        }
    }
    println!(
        "tick benchmark: {rounds} interleaved pairs per mode ({})",
        exe.display()
    );
    println!("  `loopflow run` (a process) against the floor (a process: 3 spawns, output to");
    println!("  per-tick files, 1 fsync'd atomic state write; sandbox on: the confined floor,");
    println!("  with the lock, prompts, one ruleset and filter, a vfork child per spawn and a");
    println!("  log line), ratio per pair:");
    println!(
        "  creating a file in the loop's outputs/: {created_before:.1} us before the rounds, {:.1} us after",
        creation_us(&outputs, "after")
    );
    for m in &modes {
        let mut ratios: Vec<f64> = m
            .tick
            .iter()
            .zip(&m.floor)
            .map(|(t, f)| t.as_secs_f64() / f.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        println!(
            "  {}: floor {:>6.3} ms, tick {:>6.3} ms (medians); tick/floor median {:.3}x, p10-p90 {:.3}-{:.3}x, min-max {:.3}-{:.3}x",
            m.name,
            median_ms(&m.floor),
            median_ms(&m.tick),
            percentile(&ratios, 0.5),
            percentile(&ratios, 0.1),
            percentile(&ratios, 0.9),
            ratios[0],
            ratios[ratios.len() - 1],
        );
        let cpu = |v: &[Duration]| {
            let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            ms.sort_by(f64::total_cmp);
            percentile(&ms, 0.5)
        };
        println!(
            "    CPU time (user + system, the agents included): floor {:.2} ms, tick {:.2} ms (medians), {:.3}x",
            cpu(&m.floor_cpu),
            cpu(&m.tick_cpu),
            cpu(&m.tick_cpu) / cpu(&m.floor_cpu),
        );
        if let Some(s) = &m.session {
            let mut ratios: Vec<f64> = m
                .tick
                .iter()
                .zip(s)
                .map(|(t, f)| t.as_secs_f64() / f.as_secs_f64())
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "    the confined floor with a session per spawn: {:>6.3} ms; tick/it median {:.3}x, p10-p90 {:.3}-{:.3}x",
                median_ms(s),
                percentile(&ratios, 0.5),
                percentile(&ratios, 0.1),
                percentile(&ratios, 0.9),
            );
        }
    }
}
