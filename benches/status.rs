//! Benchmark: `status --json` and `report --html -` (the dashboard's data for every loop)
//! at 100 and 1,000 loops: CPU per loop (the command's user+system time, from the
//! kernel's accounting of the child) between the two sizes, so the fixed start-up cost
//! drops out, against reading the files each command reads in this process
//! (`.state.loop`, `loop.toml`, `.lock`, the log's last 64 KiB; for `report` also the
//! prompts it checks). Target: at most 50 us per loop beyond the
//! reading, and linear (per-loop cost flat from 100 to 1,000).
//!
//! Run it with `scripts/bench status`, or `cargo bench --bench status` after
//! `cargo build --release`. `BENCH_ROUNDS` (default 7) sets the runs per size (median).

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

/// Median CPU of `rounds` runs of `loopflow <args> --project DIR`.
fn cpu(exe: &Path, project: &Path, args: &[&str], rounds: usize) -> f64 {
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
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
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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

/// Microseconds of CPU to read every loop's files once, per loop (median of rounds):
/// `.state.loop`, `loop.toml`, `.lock` and the log's last 64 KiB (what `status` reads),
/// and with `prompts` the prompt files its `loop.toml` names too (`report` checks each
/// prompt's template, so it reads them; `status` does not).
fn read_cost(dirs: &[PathBuf], prompts: bool, rounds: usize) -> f64 {
    let self_cpu = || {
        // SAFETY: getrusage fills the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
        ru.ru_utime.tv_sec as f64 * 1e6
            + ru.ru_utime.tv_usec as f64
            + ru.ru_stime.tv_sec as f64 * 1e6
            + ru.ru_stime.tv_usec as f64
    };
    let prompt_files: Vec<Vec<PathBuf>> = dirs
        .iter()
        .map(|d| if prompts { prompt_files(d) } else { Vec::new() })
        .collect();
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = self_cpu();
            let mut bytes = 0usize;
            for (d, prompts) in dirs.iter().zip(&prompt_files) {
                for f in [".state.loop", "loop.toml", ".lock"] {
                    bytes += std::fs::read(d.join(f)).map_or(0, |b| b.len());
                }
                let log = std::fs::read(d.join(".state.log")).unwrap_or_default();
                bytes += log.len().min(64 << 10);
                for p in prompts {
                    bytes += std::fs::read(p).map_or(0, |b| b.len());
                }
            }
            std::hint::black_box(bytes);
            (self_cpu() - t) / dirs.len() as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if support::listing() {
        return;
    }
    let rounds = support::rounds(7);
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
    let read = read_cost(&big_dirs, false, rounds);
    let read_prompts = read_cost(&big_dirs, true, rounds);
    println!("  reading a loop's files (state, loop.toml, .lock, log): {read:.1} us");
    println!("  ... and the prompts its loop.toml names: {read_prompts:.1} us");
    for (what, args, read) in [
        ("status --json", &["status", "--json"][..], read),
        ("report --html -", &["report", "--html", "-"][..], read_prompts),
    ] {
        // Warm the page cache first.
        cpu(&exe, big.path(), args, 1);
        let a = cpu(&exe, small.path(), args, rounds);
        let b = cpu(&exe, big.path(), args, rounds);
        let per = (b - a) / 900.0;
        println!(
            "  {what:<16}: {:.1} ms at 100, {:.1} ms at 1,000 loops: {per:.1} us/loop, {:.1} us beyond reading (target <= 50), per loop at 100 {:.1} vs 1,000 {:.1} us",
            a / 1e3,
            b / 1e3,
            per - read,
            a / 100.0,
            b / 1000.0,
        );
    }
}
