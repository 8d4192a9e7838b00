//! Benchmark: a tick's own cost is linear in nodes. A pipeline of N nodes — a gate, a
//! chain of `floor-check` nodes and a commit — is ticked (`loopflow run`, a process) and checked
//! (`loopflow check`, a process) alternately, at N = 2,500, 5,000, 10,000 and 20,000 (the
//! cap); reported: the medians, the time per node, and tick/check. Then `can-edit` of a
//! loop with 100,000 allow globs against `check` of that loop.toml.
//!
//! Run with `scripts/bench nodes` (builds the release binary first), or `cargo bench
//! --bench nodes` after `cargo build --release` (`LOOPFLOW_BIN` names another binary).
//! `BENCH_ROUNDS` (default 5) sets the runs per size.

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

use std::fmt::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

mod support;

fn timed(cmd: &mut Command) -> Duration {
    let (d, out) = support::timed_run(cmd);
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    d
}

/// A loop whose pipeline is `n` nodes: a gate, a chain of floor-check nodes, a commit.
fn chain_loop(n: usize) -> (tempfile::TempDir, PathBuf) {
    let project = tempfile::tempdir().expect("tempdir");
    let paths = support::new_loop(project.path(), "big");
    let mut p = String::from("name = \"big\"\n\n[nodes.gate]\nkind = \"gate\"\n");
    let mut prev = "gate".to_string();
    for i in 0..n - 2 {
        let _ = write!(
            p,
            "\n[nodes.f{i}]\nkind = \"floor-check\"\nneeds = [\"{prev}\"]\n"
        );
        prev = format!("f{i}");
    }
    let _ = write!(
        p,
        "\n[nodes.commit]\nkind = \"commit\"\nneeds = [\"{prev}\"]\n"
    );
    let pipeline = paths.dir.join("big.toml");
    std::fs::write(&pipeline, p).expect("pipeline");
    // The context is known, so a floor-check logs nothing: what is measured is the walk.
    std::fs::write(
        paths.dir.join("loop.toml"),
        "pipeline = \"big.toml\"\n\n[brakes]\nmax_iterations = 1000000\ncontext_tokens = 32000\n\n[worktree]\nenabled = false\n",
    )
    .expect("loop.toml");
    (project, pipeline)
}

fn main() {
    if support::listing() {
        return;
    }
    let rounds = support::rounds(5);
    let exe = support::loopflow_bin();
    println!(
        "nodes benchmark: a tick of a chain of floor-check nodes against check of its pipeline"
    );
    for n in [2_500, 5_000, 10_000, 20_000] {
        let (project, pipeline) = chain_loop(n);
        let (mut tick, mut check) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            tick.push(timed(
                Command::new(&exe)
                    .args(["run", "--loop", "big", "--project"])
                    .arg(project.path()),
            ));
            check.push(timed(Command::new(&exe).arg("check").arg(&pipeline)));
        }
        let (t, c) = (support::median(tick), support::median(check));
        println!(
            "  {n:>6} nodes: tick {:>8.1} ms ({:.1} µs/node), check {:>7.1} ms, tick/check {:.2}x",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() * 1e6 / n as f64,
            c.as_secs_f64() * 1e3,
            t.as_secs_f64() / c.as_secs_f64()
        );
    }
    // can-edit with 100,000 allow globs, each with a directory of its own.
    let project = tempfile::tempdir().expect("tempdir");
    let paths = support::new_loop(project.path(), "edit");
    let globs: Vec<String> = (0..100_000)
        .map(|i| format!("\"src/m{i}/**/*.rs\""))
        .collect();
    let config = paths.dir.join("loop.toml");
    // The template's loop.toml (roles, prompts) with its [blast_radius] replaced.
    let mut text = String::new();
    let mut skipping = false;
    for line in std::fs::read_to_string(&config).expect("loop.toml").lines() {
        if line.starts_with('[') {
            skipping = line.trim() == "[blast_radius]";
        }
        if !skipping {
            text.push_str(line);
            text.push('\n');
        }
    }
    let _ = write!(text, "\n[blast_radius]\nallow = [{}]\n", globs.join(", "));
    std::fs::write(&config, text).expect("loop.toml");
    let (mut edit, mut check) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        edit.push(timed(
            Command::new(&exe)
                .args([
                    "can-edit",
                    "--loop",
                    "edit",
                    "src/m77777/a/b.rs",
                    "src/other.rs",
                    "--project",
                ])
                .arg(project.path())
                .current_dir(project.path()),
        ));
        check.push(timed(Command::new(&exe).arg("check").arg(&config)));
    }
    let (e, c) = (support::median(edit), support::median(check));
    println!(
        "  can-edit, 100,000 allow globs: {:.1} ms; check of that loop.toml {:.1} ms ({:.2}x)",
        e.as_secs_f64() * 1e3,
        c.as_secs_f64() * 1e3,
        e.as_secs_f64() / c.as_secs_f64()
    );
}
