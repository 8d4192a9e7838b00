//! Benchmark: `status --json` and `report --html -` (the dashboard's data for every loop)
//! at 100 and 1,000 loops: CPU per loop (the command's user+system time, from the
//! kernel's accounting of the child) between the two sizes, so the fixed start-up cost
//! drops out, against reading the files each command reads in this process
//! (`.state.loop`, `loop.toml`, `.lock`, the log's last 64 KiB; for `report` also the
//! prompts it checks). Target: at most 50 us per loop beyond the
//! reading, and linear (per-loop cost flat from 100 to 1,000). `report` runs twice: on
//! loops as `create` makes them (identical prompts, whose checks loopflow remembers per
//! text) and on loops whose prompts were each edited. Both run again with the loops spread
//! over 20 projects (`--project` 20 times: 5 and 50 loops each, DESIGN §15).
//!
//! Run it with `scripts/bench status`, or `cargo bench --bench status` after
//! `cargo build --release`. `BENCH_ROUNDS` (default 15) sets the rounds; each round
//! measures the reading and both commands at both sizes once, interleaved, and the
//! median and spread are over the rounds.

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
use std::time::Duration;

mod support;

/// `n` loops as `create` makes them (loop.toml, prompts, state, log), copies of one; with
/// `edited`, each loop's prompts have a line naming the loop appended, as a user who
/// tailors a loop's prompts would: loopflow remembers a template's scan per text, so
/// loops with identical prompts check them once for all.
fn project(n: usize, edited: bool) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = support::new_loop(dir.path(), "l00000");
    let loops = first.dir.parent().expect("loops").to_path_buf();
    let mut dirs = vec![first.dir.clone()];
    for i in 1..n {
        let d = loops.join(format!("l{i:05}"));
        support::copy_loop(&first.dir, &d);
        dirs.push(d);
    }
    for d in dirs.iter().filter(|_| edited) {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or("loop");
        for e in std::fs::read_dir(d.join("prompts"))
            .expect("prompts")
            .flatten()
        {
            let mut text = std::fs::read_to_string(e.path()).expect("prompt");
            text.push_str(&format!("\nNotes for {name}: {{{{current_task}}}}\n"));
            std::fs::write(e.path(), text).expect("prompt");
        }
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

/// `k` projects of `n / k` loops each, as [`project`] makes them (DESIGN §15's view over
/// many projects); the loops' directories of all.
fn projects(n: usize, k: usize) -> (Vec<tempfile::TempDir>, Vec<PathBuf>) {
    let (mut dirs, mut loops) = (Vec::new(), Vec::new());
    for _ in 0..k {
        let (d, l) = project(n / k, false);
        dirs.push(d);
        loops.extend(l);
    }
    (dirs, loops)
}

/// CPU of one run of `loopflow <args> --project DIR`, in microseconds.
fn cpu(exe: &Path, project: &Path, args: &[&str]) -> f64 {
    cpu_of(exe, &[project], args)
}

/// [`cpu`] with `--project` once per directory (more than one: the view over many).
fn cpu_of(exe: &Path, projects: &[&Path], args: &[&str]) -> f64 {
    let before = children_cpu();
    let mut cmd = Command::new(exe);
    for p in projects {
        cmd.arg("--project").arg(p);
    }
    let st = cmd
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn");
    // Over many projects `status` exits 4 only for a broken one: none is broken here.
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

/// One command measured on one pair of projects.
struct Measured {
    what: &'static str,
    /// Over 20 projects (`--project` 20 times) instead of one.
    many: bool,
    args: &'static [&'static str],
    with_prompts: bool,
    edited: bool,
    per: Vec<f64>,
    beyond: Vec<f64>,
    at_small: Vec<f64>,
    at_big: Vec<f64>,
}

fn main() {
    if support::listing() {
        return;
    }
    let rounds = support::rounds(15);
    let exe = support::loopflow_bin();
    // [as `create` makes them, with edited prompts]: (100 loops, 1,000 loops, their dirs).
    let sets = [false, true].map(|edited| {
        let (small, _) = project(100, edited);
        let (big, dirs) = project(1000, edited);
        let prompts: Vec<Vec<PathBuf>> = dirs.iter().map(|d| prompt_files(d)).collect();
        (small, big, dirs, prompts)
    });
    println!(
        "status benchmark ({}), CPU per loop between 100 and 1,000 loops:",
        exe.display()
    );
    // The same sizes over 20 projects: 5 and 50 loops each.
    let (small_many, _) = projects(100, 20);
    let (big_many, many_dirs) = projects(1000, 20);
    let many_prompts: Vec<Vec<PathBuf>> = many_dirs.iter().map(|d| prompt_files(d)).collect();
    let paths = |v: &[tempfile::TempDir]| -> Vec<PathBuf> {
        v.iter().map(|d| d.path().to_path_buf()).collect()
    };
    let (small_many, big_many) = (paths(&small_many), paths(&big_many));
    let run = |c: &Measured, big: bool| -> f64 {
        if c.many {
            let dirs = if big { &big_many } else { &small_many };
            let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
            return cpu_of(&exe, &dirs, c.args);
        }
        let (small, large, ..) = &sets[usize::from(c.edited)];
        cpu(&exe, if big { large.path() } else { small.path() }, c.args)
    };
    let measured = |what, args, with_prompts, edited| Measured {
        what,
        many: false,
        args,
        with_prompts,
        edited,
        per: Vec::new(),
        beyond: Vec::new(),
        at_small: Vec::new(),
        at_big: Vec::new(),
    };
    let mut commands = [
        measured("status --json", &["status", "--json"], false, false),
        measured("report --html -", &["report", "--html", "-"], true, false),
        measured("report --html -", &["report", "--html", "-"], true, true),
        Measured {
            many: true,
            ..measured("status --json", &["status", "--json"], false, false)
        },
        Measured {
            many: true,
            ..measured("report --html -", &["report", "--html", "-"], true, false)
        },
    ];
    // Warm the page cache first.
    for c in &commands {
        run(c, true);
    }
    // Each round measures everything once, interleaved, so a slow moment of the machine
    // lands on one round's numbers instead of on one of the quantities compared.
    let mut read = [Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..rounds {
        let r = [
            read_cost(&sets[0].2, &[]),
            read_cost(&sets[0].2, &sets[0].3),
            read_cost(&sets[1].2, &sets[1].3),
            read_cost(&many_dirs, &[]),
            read_cost(&many_dirs, &many_prompts),
        ];
        for c in &mut commands {
            let a = run(c, false);
            let b = run(c, true);
            let p = (b - a) / 900.0;
            let base = match (c.many, c.with_prompts, c.edited) {
                (true, false, _) => r[3],
                (true, true, _) => r[4],
                (false, false, _) => r[0],
                (false, true, false) => r[1],
                (false, true, true) => r[2],
            };
            c.per.push(p);
            c.beyond.push(p - base);
            c.at_small.push(a / 100.0);
            c.at_big.push(b / 1000.0);
        }
        for (v, x) in read.iter_mut().zip(r) {
            v.push(x);
        }
    }
    let med = |v: &[f64]| percentile(&sorted(v.to_vec()), 0.5);
    println!(
        "  reading a loop's files (state, loop.toml, .lock, log): {:.1} us; with the prompts its loop.toml names: {:.1} us, edited prompts {:.1} us (medians of {rounds} rounds)",
        med(&read[0]),
        med(&read[1]),
        med(&read[2]),
    );
    for c in &commands {
        let b = sorted(c.beyond.clone());
        println!(
            "  {:<16}{}: {:.1} us/loop, {:.1} us beyond reading {} (p10-p90 {:.1}-{:.1}; target <= 50); whole command per loop at 100 {:.1} vs 1,000 {:.1} us",
            c.what,
            match (c.many, c.edited) {
                (true, _) => ", over 20 projects",
                (false, true) => ", edited prompts",
                (false, false) => ", loops as created",
            },
            med(&c.per),
            percentile(&b, 0.5),
            if c.with_prompts {
                "its files and prompts"
            } else {
                "its files"
            },
            percentile(&b, 0.1),
            percentile(&b, 0.9),
            med(&c.at_small),
            med(&c.at_big),
        );
    }
}
