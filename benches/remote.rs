//! Benchmark: what keeping a loop's state in its repository costs a tick (DESIGN §16).
//! Two loops that differ only in `[remote]`: the same three trivial agents, the same
//! worktree and branch, `[sandbox] mode = "off"`; the remote one reached over smart HTTP
//! (`git http-backend` behind `tests/remote/git_http.py` on 127.0.0.1). Every round times
//! a local tick and a remote tick back to back (alternating which goes first); the
//! remote's overhead — fetch, lease, checkpoints, settle — is the per-pair difference,
//! reported as the median, the 10th–90th percentile and the extremes. Then the loop is
//! halted and what a halted loop's scheduled run costs (one fetch, a skip) is timed.
//!
//! `cargo bench --bench remote` after a release build (or `scripts/bench remote`);
//! `BENCH_ROUNDS` (default 30) sets the pairs.

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

fn git(dir: &Path, args: &[&str]) {
    let st = Command::new("git")
        .args(["-c", "user.name=b", "-c", "user.email=b@b"])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("git");
    assert!(st.success(), "git {args:?}");
}

fn lf(bin: &Path, dir: &Path, args: &[&str]) -> (Duration, std::process::Output) {
    let mut c = Command::new(bin);
    c.arg("--project").arg(dir).args(args).current_dir(dir);
    support::timed_run(&mut c)
}

fn tick(bin: &Path, dir: &Path) -> Duration {
    let (t, out) = lf(bin, dir, &["run", "--loop", "bench"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    t
}

/// Milliseconds at the `p`th percentile of `v` (sorted here).
fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

fn report(what: &str, v: &mut [f64]) {
    println!(
        "{what:<34} median {:7.1} ms   p10–p90 {:7.1} – {:7.1}   min–max {:7.1} – {:7.1}",
        pct(v, 0.5),
        pct(v, 0.1),
        pct(v, 0.9),
        pct(v, 0.0),
        pct(v, 1.0)
    );
}

/// The smart-HTTP server, stopped when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(root: &Path) -> (Server, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/remote/git_http.py");
    let port_file = root.join("port");
    let child = Command::new("python3")
        .arg(script)
        .arg("--root")
        .arg(root)
        .arg("--port-file")
        .arg(&port_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3");
    let start = std::time::Instant::now();
    while !port_file.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "no server");
        std::thread::sleep(Duration::from_millis(20));
    }
    let port = std::fs::read_to_string(&port_file).expect("port");
    (
        Server(child),
        format!("http://127.0.0.1:{}/repo.git", port.trim()),
    )
}

fn main() {
    if support::listing() {
        return;
    }
    let bin = support::loopflow_bin();
    let rounds = support::rounds(30);
    let root = tempfile::tempdir().expect("tempdir");
    git(
        root.path(),
        &["init", "-q", "--bare", "-b", "main", "repo.git"],
    );
    git(
        &root.path().join("repo.git"),
        &["config", "http.receivepack", "true"],
    );
    let (_server, url) = serve(root.path());
    let toml = support::agent_loop_toml_in(1_000_000, "off", true);

    // The remote loop: created by a human, ticked in a runner's clone.
    let human: PathBuf = root.path().join("human");
    std::fs::create_dir(&human).expect("mkdir");
    git(&human, &["init", "-q", "-b", "main"]);
    std::fs::write(human.join("README.md"), "bench\n").expect("README");
    git(&human, &["add", "README.md"]);
    git(&human, &["commit", "-qm", "first"]);
    git(&human, &["remote", "add", "origin", &url]);
    git(&human, &["push", "-q", "origin", "main"]);
    let (_, out) = lf(
        &bin,
        &human,
        &[
            "create",
            "--loop",
            "bench",
            "--task",
            "benchmark",
            "--remote",
            "origin",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let remote_toml = format!("{toml}\n[remote]\nname = \"origin\"\n");
    std::fs::write(human.join(".loopflow/loops/bench/loop.toml"), remote_toml).expect("toml");
    git(&human, &["add", "-A"]);
    git(&human, &["commit", "-qm", "the loop"]);
    git(&human, &["push", "-q", "origin", "main"]);
    let runner = root.path().join("runner");
    git(root.path(), &["clone", "-q", &url, "runner"]);

    // The same loop, local.
    let local = tempfile::tempdir().expect("tempdir");
    let paths = support::new_worktree_loop(local.path(), "bench");
    std::fs::write(paths.dir.join("loop.toml"), &toml).expect("toml");

    for _ in 0..2 {
        tick(&bin, local.path());
        tick(&bin, &runner);
    }
    let (mut l, mut r, mut d) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds {
        let (a, b) = if i % 2 == 0 {
            let a = tick(&bin, local.path());
            (a, tick(&bin, &runner))
        } else {
            let b = tick(&bin, &runner);
            (tick(&bin, local.path()), b)
        };
        let ms = |t: Duration| t.as_secs_f64() * 1000.0;
        l.push(ms(a));
        r.push(ms(b));
        d.push(ms(b) - ms(a));
    }
    println!("{rounds} pairs, smart HTTP on 127.0.0.1, sandbox off");
    report("local tick", &mut l);
    report("remote tick", &mut r);
    report("remote overhead (per pair)", &mut d);

    let (_, out) = lf(
        &bin,
        &human,
        &["halt", "--loop", "bench", "--reason", "bench"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut h: Vec<f64> = (0..rounds.min(20))
        .map(|_| tick(&bin, &runner).as_secs_f64() * 1000.0)
        .collect();
    report("a halted loop's run (a skip)", &mut h);
}
