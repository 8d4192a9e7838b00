//! Benchmark: `status --json` and `report --html -` (the dashboard's data for every loop)
//! at 100 and 1,000 loops: CPU per loop (the command's user+system time, from the
//! kernel's accounting of the child) between the two sizes, so the fixed start-up cost
//! drops out, against reading the files each command reads in this process
//! (`.state.loop`, `loop.toml`, `.lock`, the log's last 64 KiB; for `report` also the
//! prompts it checks). Target: at most 50 us per loop beyond the
//! reading, and linear (per-loop cost flat from 100 to 1,000).
//!
//! Run it with `scripts/bench status`, or `cargo bench --bench status` after
//! `cargo build --release`. `BENCH_ROUNDS` (default 15) sets the rounds; each round
//! measures the reading and both commands at both sizes once, interleaved, and the
//! median and spread are over the rounds.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod support;

/// `n` loops as `create` makes them (loop.toml, prompts, state, log), copies of one.
fn project(n: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = support::new_loop(dir.path(), "l00000");
    let loops = first.dir.parent().expect("loops").to_path_buf();
    let mut dirs = vec![first.dir.clone()];
    for i in 1..n {
        let d = loops.join(format!("l{i:05}"));
        support::copy_dir(&first.dir, &d);
        dirs.push(d);
    }
    (dir, dirs)
}

fn children_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::new(t.tv_sec as u64, 0) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU of one run of `loopflow <args> --project DIR`, in microseconds.
fn cpu(exe: &Path, project: &Path, args: &[&str]) -> f64 {
    let before = children_cpu();
    let st = Command::new(exe)
        .args(args)
        .arg("--project")
        .arg(project)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    assert!(st.success(), "{args:?}: {st}");
    (children_cpu() - before).as_secs_f64() * 1e6
}

/// The prompt files a loop's `loop.toml` names (`prompt`, `compaction_prompt` of each
/// role): the ones `report` reads to check their templates.
fn prompt_files(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string(dir.join("loop.toml")).expect("loop.toml");
    let table: toml::Table = text.parse().expect("loop.toml parses");
    let mut files = Vec::new();
    for role in table
        .get("roles")
        .and_then(|r| r.as_table())
        .into_iter()
        .flat_map(|r| r.values())
    {
        for key in ["prompt", "compaction_prompt"] {
            if let Some(p) = role.get(key).and_then(|p| p.as_str()) {
                files.push(dir.join(p));
            }
        }
    }
    files
}

/// Microseconds of CPU to read every loop's files once, per loop: `.state.loop`,
/// `loop.toml`, `.lock` and the log's last 64 KiB (what `status` reads), and the prompt
/// files in `prompts` (`report` checks each prompt's template, so it reads them too).
fn read_cost(dirs: &[PathBuf], prompts: &[Vec<PathBuf>]) -> f64 {
    let self_cpu = || {
        // SAFETY: getrusage fills the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        ru.ru_utime.tv_sec as f64 * 1e6
            + ru.ru_utime.tv_usec as f64
            + ru.ru_stime.tv_sec as f64 * 1e6
            + ru.ru_stime.tv_usec as f64
    };
    let t = self_cpu();
    let mut bytes = 0usize;
    for (i, d) in dirs.iter().enumerate() {
        for f in [".state.loop", "loop.toml", ".lock"] {
            bytes += std::fs::read(d.join(f)).map_or(0, |b| b.len());
        }
        let log = std::fs::read(d.join(".state.log")).unwrap_or_default();
        bytes += log.len().min(64 << 10);
        for p in prompts.get(i).into_iter().flatten() {
            bytes += std::fs::read(p).map_or(0, |b| b.len());
        }
    }
    std::hint::black_box(bytes);
    (self_cpu() - t) / dirs.len() as f64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

fn main() {
    if support::listing() {
        return;
    }
    let rounds = support::rounds(15);
    let exe = support::loopflow_bin();
    let (small, small_dirs) = project(100);
    let (big, big_dirs) = project(1000);
    // One tick each for the first loops would not change the per-loop reading; the
    // loops as `create` leaves them (state, log, config) are what status reads.
    let _ = small_dirs;
    println!(
        "status benchmark ({}), CPU per loop between 100 and 1,000 loops:",
        exe.display()
    );
    let prompts: Vec<Vec<PathBuf>> = big_dirs.iter().map(|d| prompt_files(d)).collect();
    let commands: [(&str, &[&str], bool); 2] = [
        ("status --json", &["status", "--json"], false),
        ("report --html -", &["report", "--html", "-"], true),
    ];
    // Warm the page cache first.
    for (_, args, _) in &commands {
        cpu(&exe, big.path(), args);
    }
    // Each round measures everything once, interleaved, so a slow moment of the machine
    // lands on one round's numbers instead of on one of the quantities compared.
    let mut read = [Vec::new(), Vec::new()];
    let mut per = [Vec::new(), Vec::new()];
    let mut beyond = [Vec::new(), Vec::new()];
    let mut whole = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        let r = [read_cost(&big_dirs, &[]), read_cost(&big_dirs, &prompts)];
        for (i, (_, args, with_prompts)) in commands.iter().enumerate() {
            let a = cpu(&exe, small.path(), args);
            let b = cpu(&exe, big.path(), args);
            let p = (b - a) / 900.0;
            let base = r[usize::from(*with_prompts)];
            per[i].push(p);
            beyond[i].push(p - base);
            whole[2 * i].push(a / 100.0);
            whole[2 * i + 1].push(b / 1000.0);
        }
        read[0].push(r[0]);
        read[1].push(r[1]);
    }
    let med = |v: &[f64]| percentile(&sorted(v.to_vec()), 0.5);
    println!(
        "  reading a loop's files (state, loop.toml, .lock, log): {:.1} us; with the prompts its loop.toml names: {:.1} us (medians of {rounds} rounds)",
        med(&read[0]),
        med(&read[1]),
    );
    for (i, (what, _, with_prompts)) in commands.iter().enumerate() {
        let b = sorted(beyond[i].clone());
        println!(
            "  {what:<16}: {:.1} us/loop, {:.1} us beyond reading {} (p10-p90 {:.1}-{:.1}; target <= 50); whole command per loop at 100 {:.1} vs 1,000 {:.1} us",
            med(&per[i]),
            percentile(&b, 0.5),
            if *with_prompts {
                "its files and prompts"
            } else {
                "its files"
            },
            percentile(&b, 0.1),
            percentile(&b, 0.9),
            med(&whole[2 * i]),
            med(&whole[2 * i + 1]),
        );
    }
}
