//! Benchmark: a worktree loop in a big repository (`BENCH_FILES`, default 50,000 files in
//! directories of 100). Measures, interleaved round by round:
//!
//! - the tick a user gets from `create` whose implement agent changes one tracked file
//!   (so `git-commit` stages, checks and commits it), against
//! - the baseline: the same one-file change made by hand in another worktree of the same
//!   repository and committed the way a person would, `git status --untracked-files=all`
//!   then `git commit -a`,
//!
//! and reports the per-pair ratio (median, 10th–90th percentile), with what `git status`
//! alone costs there. Then `create` of a worktree loop there (`BENCH_CREATES`, default 3),
//! against `git worktree add` of the same repository.
//!
//! Run it with `scripts/bench bigrepo` (builds the release binaries it needs);
//! `BENCH_ROUNDS` (default 15) sets the pairs.

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
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

fn git(dir: &Path, args: &[&str]) -> Duration {
    let start = Instant::now();
    let o = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b"])
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("git");
    let d = start.elapsed();
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    d
}

/// A repository of `files` small files, committed.
fn big_repo(dir: &Path, files: usize) {
    git(dir, &["-c", "init.defaultBranch=main", "init", "-q"]);
    for i in 0..files {
        let d = dir.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&d).expect("mkdir");
        }
        std::fs::write(
            d.join(format!("f{:02}.txt", i % 100)),
            format!("file {i}\n"),
        )
        .expect("write");
    }
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "big"]);
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// One line more in `file`: the change both sides commit.
fn touch(file: &Path, round: usize) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .expect("open");
    writeln!(f, "round {round}").expect("append");
}

fn main() {
    if support::listing() {
        return;
    }
    let files: usize = std::env::var("BENCH_FILES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50_000);
    let rounds = support::rounds(15);
    let creates = std::env::var("BENCH_CREATES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let bin = support::loopflow_bin();
    let project = tempfile::tempdir().expect("tempdir");
    let p = project.path();
    let start = Instant::now();
    big_repo(p, files);
    eprintln!(
        "{files} files committed in {:.1} s",
        start.elapsed().as_secs_f64()
    );

    // create: a worktree loop against a bare `git worktree add`, alternating which goes
    // first. Nothing is removed until the end: on a filesystem without a journal,
    // creating files right after 50,000 were deleted costs several times more, and that
    // would land on whichever came next.
    let mut create = Vec::new();
    let mut add = Vec::new();
    let plain = tempfile::tempdir().expect("tempdir");
    for i in 0..creates {
        let run_create = || {
            let (d, o) = support::timed_run(Command::new(&bin).args([
                "--project",
                &p.display().to_string(),
                "create",
                "--loop",
                &format!("c{i}"),
                "--task",
                "benchmark",
            ]));
            assert!(o.status.success(), "create: {o:?}");
            d
        };
        let wt = plain.path().join(format!("wt{i}"));
        let run_add = || {
            let branch = format!("plain{i}");
            git(
                p,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &branch,
                    &wt.display().to_string(),
                ],
            )
        };
        if i % 2 == 0 {
            create.push(run_create());
            add.push(run_add());
        } else {
            add.push(run_add());
            create.push(run_create());
        }
    }

    // The loop: implement appends a line to one tracked file, so every tick commits.
    let (_, o) = support::timed_run(Command::new(&bin).args([
        "--project",
        &p.display().to_string(),
        "create",
        "--loop",
        "big",
        "--task",
        "benchmark",
    ]));
    assert!(o.status.success(), "create: {o:?}");
    let dir = p.join(".loopflow/loops/big");
    let by_hand = tempfile::tempdir().expect("tempdir");
    let edit = by_hand.path().join("edit.sh");
    std::fs::write(&edit, "#!/bin/sh\ndate +%s%N >> d000/f00.txt\n").expect("edit.sh");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&edit, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let toml = support::agent_loop_toml_in(1_000_000, "auto", true).replace(
        "[roles.implement]\n",
        &format!(
            "[roles.implement]\ncommand = [{:?}]\n",
            edit.display().to_string()
        ),
    );
    std::fs::write(dir.join("loop.toml"), toml).expect("loop.toml");
    let hand = by_hand.path().join("wt");
    git(
        p,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "by-hand",
            &hand.display().to_string(),
        ],
    );
    let worktree = dir.join("worktree");

    let mut pairs = Vec::new();
    let mut ticks = Vec::new();
    let mut bases = Vec::new();
    let mut statuses = Vec::new();
    for round in 0..rounds {
        let tick = || {
            let (d, o) = support::timed_run(Command::new(&bin).args([
                "--project",
                &p.display().to_string(),
                "run",
                "--loop",
                "big",
            ]));
            assert!(o.status.success(), "tick: {o:?}");
            d
        };
        let base = || {
            touch(&hand.join("d000/f00.txt"), round);
            git(&hand, &["status", "--porcelain", "--untracked-files=all"])
                + git(&hand, &["commit", "-a", "-q", "-m", "by hand"])
        };
        let (t, b) = if round % 2 == 0 {
            let t = tick();
            (t, base())
        } else {
            let b = base();
            (tick(), b)
        };
        statuses.push(git(
            &worktree,
            &["status", "--porcelain", "--untracked-files=all"],
        ));
        pairs.push(t.as_secs_f64() / b.as_secs_f64());
        ticks.push(t);
        bases.push(b);
    }
    let commits = Command::new("git")
        .args(["rev-list", "--count", "loopflow/big"])
        .current_dir(p)
        .output()
        .expect("git");
    let commits: usize = String::from_utf8_lossy(&commits.stdout)
        .trim()
        .parse()
        .expect("count");
    assert_eq!(commits, rounds + 1, "every tick commits its one change");
    pairs.sort_by(f64::total_cmp);
    println!(
        "bigrepo ({files} files, {rounds} rounds): tick committing one file {:.0} ms, git status -uall + git commit -a {:.0} ms: {:.2}x (p10-p90 {:.2}-{:.2}); git status -uall alone {:.0} ms",
        ms(support::median(ticks)),
        ms(support::median(bases)),
        percentile(&pairs, 0.5),
        percentile(&pairs, 0.1),
        percentile(&pairs, 0.9),
        ms(support::median(statuses)),
    );
    if creates > 0 {
        println!(
            "bigrepo create of a worktree loop: {:.2} s (git worktree add alone {:.2} s; {creates} each)",
            support::median(create).as_secs_f64(),
            support::median(add).as_secs_f64(),
        );
    }
}
