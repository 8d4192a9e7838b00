//! Benchmark: `check` of a pipeline (parse + validate: keys, kinds, needs, cycles, every
//! template against the DAG) against a `toml::Table` parse of the same file, at 10,000
//! nodes for a chain (node i needs i-1 and reads its exit code) and a fan-in (9,998
//! nodes after the gate, and the commit needing all of them), plus 1,000 small files.
//!
//! Three measures, each a ratio to the parse of the same text:
//! - instructions (callgrind): one child process per side, the start-up of an empty run
//!   of the same binary subtracted;
//! - CPU time in this process, the two measured alternately in the same rounds (median
//!   and spread of the per-round ratio);
//! - peak RSS (`ru_maxrss` of a child process that does only that one thing), whole and
//!   above the empty run's.
//!
//! Run with `scripts/bench check` (or `cargo bench --bench check`); `BENCH_NODES` changes
//! the size (default 10000).

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
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use loopflow::testing::{Diagnostics, Pipeline, Source};

/// A chain: node i needs i-1; command nodes read the previous node's exit code, so the
/// template checks are exercised along the whole DAG.
fn chain(n: usize) -> String {
    let mut s = String::from("name = \"chain\"\n\n[nodes.n0]\nkind = \"gate\"\n");
    for i in 1..n {
        let _ = write!(s, "\n[nodes.n{i}]\n");
        if i == n - 1 {
            s.push_str("kind = \"commit\"\n");
        } else {
            let _ = writeln!(
                s,
                "kind = \"command\"\nargv = [\"echo\", \"{{{{nodes.n{}.exit_code}}}}\", \"{{{{loop}}}}\"]",
                i - 1
            );
        }
        let _ = writeln!(s, "needs = [\"n{}\"]", i - 1);
    }
    s
}

/// A fan-in: n-2 command nodes after the gate, reading its exit code, and the commit
/// needing every one of them.
fn fan_in(n: usize) -> String {
    let mut s = String::from("name = \"fan-in\"\n\n[nodes.n0]\nkind = \"gate\"\n");
    for i in 1..n - 1 {
        let _ = write!(
            s,
            "\n[nodes.n{i}]\nkind = \"command\"\nargv = [\"echo\", \"{{{{nodes.n0.exit_code}}}}\"]\nneeds = [\"n0\"]\n"
        );
    }
    let _ = write!(s, "\n[nodes.n{}]\nkind = \"commit\"\nneeds = [", n - 1);
    for i in 1..n - 1 {
        if i > 1 {
            s.push_str(", ");
        }
        let _ = write!(s, "\"n{i}\"");
    }
    s.push_str("]\n");
    s
}

/// A small pipeline of 8-12 nodes, as most files are.
fn small(i: usize) -> String {
    chain(8 + i % 5)
}

fn parse(text: &str) {
    let t: toml::Table = text.parse().expect("parse");
    std::hint::black_box(t);
}

fn check(text: &str) {
    let src = Source::new("p.toml", "p.toml", text.to_string());
    let mut d = Diagnostics::default();
    let p = Pipeline::load(&src, &mut d);
    assert!(!d.has_errors(), "{:?}", d.items.first());
    std::hint::black_box(p);
}

/// CPU time of this thread: `check` does no I/O here, and on a shared VM wall time also
/// counts other tenants' work.
fn cpu_now() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Per-round ratios b/a, `a` and `b` measured alternately so noise hits both alike.
fn ratios<A: FnMut(), B: FnMut()>(rounds: usize, mut a: A, mut b: B) -> (Vec<f64>, Duration) {
    let mut out = Vec::new();
    let mut ta = Vec::new();
    for _ in 0..rounds {
        let s = cpu_now();
        a();
        let da = cpu_now() - s;
        let s = cpu_now();
        b();
        let db = cpu_now() - s;
        out.push(db.as_secs_f64() / da.as_secs_f64());
        ta.push(da);
    }
    out.sort_by(f64::total_cmp);
    ta.sort();
    (out, ta[ta.len() / 2])
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// One measure in a child process of this benchmark: `--mode MODE FILE`.
fn child(mode: &str, file: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current exe"));
    c.args(["--mode", mode]).arg(file);
    c
}

/// Peak RSS (KiB) of a child that does `mode` once, as it reports it (`VmHWM`: the
/// rusage of a child spawned from this big process would count this one's pages too).
fn max_rss(mode: &str, file: &Path) -> i64 {
    let out = child(mode, file).output().expect("spawn");
    assert!(out.status.success(), "{mode} failed");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("VmHWM")
}

/// This process's peak resident set, KiB.
fn vm_hwm() -> i64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Instructions of a child that does `mode` once (callgrind), `None` without valgrind.
fn instructions(mode: &str, file: &Path) -> Option<u64> {
    let exe = std::env::current_exe().ok()?;
    let out = Command::new("valgrind")
        .stdout(std::process::Stdio::null())
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(exe)
        .args(["--mode", mode])
        .arg(file)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| {
            l.split_once("Collected : ")
                .map(|(_, n)| n.trim().parse().ok())
        })
        .flatten()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--mode") {
        let text = std::fs::read_to_string(&args[i + 2]).expect("file");
        match args[i + 1].as_str() {
            "parse" => parse(&text),
            "check" => check(&text),
            _ => {}
        }
        println!("{}", vm_hwm());
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("BENCH_NODES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().expect("tempdir");
    println!(
        "check benchmark: `check` (Pipeline::load) against a toml::Table parse of the same text"
    );
    for (name, text) in [("chain", chain(n)), ("fan-in", fan_in(n))] {
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, &text).expect("write");
        let (r, parse_cpu) = ratios(15, || parse(&text), || check(&text));
        println!(
            "  {n}-node {name} ({} KiB): CPU check/parse median {:.2}x (p10-p90 {:.2}-{:.2}x), parse {:.1} ms",
            text.len() / 1024,
            pct(&r, 0.5),
            pct(&r, 0.1),
            pct(&r, 0.9),
            parse_cpu.as_secs_f64() * 1e3
        );
        let (noop, p, c) = (
            max_rss("noop", &file),
            max_rss("parse", &file),
            max_rss("check", &file),
        );
        println!(
            "    peak RSS: parse {p} KiB, check {c} KiB: {:.2}x ({:.2}x above the empty run's {noop} KiB)",
            c as f64 / p as f64,
            (c - noop) as f64 / (p - noop).max(1) as f64
        );
        match (
            instructions("noop", &file),
            instructions("parse", &file),
            instructions("check", &file),
        ) {
            (Some(z), Some(p), Some(c)) => println!(
                "    instructions: parse {}, check {}: {:.2}x",
                p - z,
                c - z,
                (c - z) as f64 / (p - z) as f64
            ),
            _ => println!("    instructions: (install valgrind to count them)"),
        }
    }
    let files: Vec<String> = (0..1000).map(small).collect();
    let (r, _) = ratios(
        15,
        || files.iter().for_each(|f| parse(f)),
        || files.iter().for_each(|f| check(f)),
    );
    println!(
        "  1,000 pipeline files of 8-12 nodes: CPU check/parse median {:.2}x (p10-p90 {:.2}-{:.2}x)",
        pct(&r, 0.5),
        pct(&r, 0.1),
        pct(&r, 0.9)
    );
}
