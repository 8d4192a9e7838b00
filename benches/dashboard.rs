//! Benchmark: an idle dashboard over 10,000 loops, in one run.
//!
//! Each way of serving runs as its own `loopflow dashboard` process over the same project:
//! `watch` (this build: the kernel says what changed, and only while a client listens),
//! `poll` (this build with `LOOPFLOW_DASHBOARD_POLL=1`: every loop's files `stat`ed every
//! 500 ms while a client listens, as where the kernel cannot tell — the polling the server
//! before the watcher ran all the time, client or none) and, given `BENCH_BEFORE_BIN`,
//! `before` (another build, such as the one before the watcher). For each:
//!
//! 1. CPU of the dashboard process (`/proc/<pid>/stat`, utime + stime) and its wake-ups
//!    (context switches of its threads) over a window of `BENCH_WINDOW` seconds (default
//!    10): with no client, and with one `/events` client while nothing changes.
//! 2. What a client connecting costs (the dashboard's CPU until the client has its first
//!    update, every card), and how many directories it then watches (the inotify fd's
//!    `fdinfo`).
//! 3. Latency from a tick's state write to the `/events` update carrying that loop's card:
//!    the state written as a tick writes it (a new file renamed over `.state.loop`), then
//!    its `TICK` line appended, a different loop each time; `BENCH_ROUNDS` samples (default
//!    20), median, p90 and max.
//!
//! Run it with `scripts/bench dashboard`, or `cargo bench --bench dashboard` after
//! `cargo build --release`. `BENCH_LOOPS` (default 10,000) sets the project's size.

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod support;

/// A project of `n` loops `l00000`…, copies of one made by `create`.
fn project(n: usize) -> (tempfile::TempDir, Vec<PathBuf>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = support::new_loop(dir.path(), "l00000");
    let loops = first.dir.parent().expect("loops dir").to_path_buf();
    let mut dirs = vec![first.dir.clone()];
    for i in 1..n {
        let d = loops.join(format!("l{i:05}"));
        support::copy_loop(&first.dir, &d);
        dirs.push(d);
    }
    (dir, dirs)
}

/// A running dashboard, stopped when dropped.
struct Dash {
    child: Child,
    addr: String,
}

impl Dash {
    fn start(exe: &Path, project: &Path, poll: bool) -> Dash {
        let mut c = Command::new(exe);
        c.arg("--project")
            .arg(project)
            .args(["dashboard", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if poll {
            c.env("LOOPFLOW_DASHBOARD_POLL", "1");
        }
        let mut child = c.spawn().expect("spawn dashboard");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the dashboard prints its address");
        let addr = line
            .trim()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        assert!(!addr.is_empty(), "no address from the dashboard");
        let d = Dash { child, addr };
        // Serving: one request answered (a full refresh with no client).
        d.get("/api/status");
        d
    }

    fn get(&self, path: &str) -> usize {
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.addr
        )
        .expect("request");
        let mut body = Vec::new();
        s.read_to_end(&mut body).expect("response");
        body.len()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Dash {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An `/events` client: each `data:` line with the moment it arrived.
struct Client {
    rx: mpsc::Receiver<(Instant, String)>,
    stream: TcpStream,
}

impl Client {
    fn connect(d: &Dash) -> Client {
        let mut s = TcpStream::connect(&d.addr).expect("connect");
        write!(s, "GET /events HTTP/1.1\r\nHost: {}\r\n\r\n", d.addr).expect("request");
        let (tx, rx) = mpsc::channel();
        let reader = s.try_clone().expect("clone");
        std::thread::spawn(move || {
            let mut r = BufReader::new(reader);
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                let at = Instant::now();
                if let Some(data) = line.trim_end().strip_prefix("data: ")
                    && tx.send((at, data.to_string())).is_err()
                {
                    return;
                }
                line.clear();
            }
        });
        Client { rx, stream: s }
    }

    /// Waits for an update carrying loop `name`'s card; when it arrived.
    fn card_of(&self, name: &str) -> Instant {
        loop {
            let (at, data) = self
                .rx
                .recv_timeout(Duration::from_secs(60))
                .expect("an update within a minute");
            let v: serde_json::Value = serde_json::from_str(&data).expect("event JSON");
            if v["loops"][name].is_string() {
                return at;
            }
        }
    }

    fn drain(&self) {
        while self.rx.try_recv().is_ok() {}
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// CPU seconds (utime + stime) and context switches of process `pid` so far.
fn usage(pid: u32) -> (f64, u64) {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let stat = std::fs::read_to_string(proc.join("stat")).expect("stat");
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat")
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 =
        rest[11].parse::<u64>().expect("utime") + rest[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut switches = 0;
    for t in std::fs::read_dir(proc.join("task"))
        .expect("tasks")
        .flatten()
    {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        for l in status.lines() {
            if let Some(n) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += n.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    (ticks as f64 / hz, switches)
}

/// CPU (ms per second) and wake-ups (per second) of `pid` over `window`.
fn idle(pid: u32, window: Duration) -> (f64, f64) {
    let (c0, s0) = usage(pid);
    std::thread::sleep(window);
    let (c1, s1) = usage(pid);
    let secs = window.as_secs_f64();
    ((c1 - c0) * 1000.0 / secs, (s1 - s0) as f64 / secs)
}

/// Waits until `pid` has not woken for a second (at most `limit` seconds: a server that
/// polls never is).
fn quiet(pid: u32, limit: u32) {
    for _ in 0..limit {
        let before = usage(pid).1;
        std::thread::sleep(Duration::from_secs(1));
        if usage(pid).1 == before {
            return;
        }
    }
}

/// How many inotify watches `pid` holds (0 without an inotify fd).
fn watches(pid: u32) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten();
    fds.filter(|e| {
        std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:inotify")
    })
    .map(|e| {
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            e.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        info.lines()
            .filter(|l| l.starts_with("inotify wd:"))
            .count()
    })
    .sum()
}

/// Ends loop `dir`'s "tick" as a tick does: its state renamed into place (task `task`),
/// then its `TICK` line appended; returns the moment the state landed.
fn tick_like(dir: &Path, task: &str, iteration: usize) -> Instant {
    let state = dir.join(".state.loop");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("JSON");
    v["current_task"] = task.into();
    let tmp = dir.join(".state.loop.bench");
    std::fs::write(&tmp, serde_json::to_string_pretty(&v).expect("JSON")).expect("write");
    std::fs::rename(&tmp, &state).expect("rename");
    let at = Instant::now();
    let mut log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join(".state.log"))
        .expect("log");
    writeln!(
        log,
        "2026-12-07T00:00:00Z TICK pass=false score=0.5 iter={iteration}"
    )
    .expect("log");
    at
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// One way of serving, measured.
struct Row {
    what: String,
    no_client: (f64, f64),
    client: (f64, f64),
    connect_ms: f64,
    watched: usize,
    latency: Vec<f64>,
}

fn measure(
    what: &str,
    exe: &Path,
    project: &Path,
    dirs: &[PathBuf],
    poll: bool,
    window: Duration,
    samples: usize,
) -> Row {
    let d = Dash::start(exe, project, poll);
    quiet(d.pid(), 10);
    let no_client = idle(d.pid(), window);
    let (c0, _) = usage(d.pid());
    let client = Client::connect(&d);
    // The first update carries every card, sent once the watches are in place and the
    // loops read: its arrival ends what connecting costs (waiting for quiet would count a
    // polling server's polls too).
    client
        .rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the first update");
    let connect_ms = (usage(d.pid()).0 - c0) * 1000.0;
    quiet(d.pid(), 3);
    let watched = watches(d.pid());
    client.drain();
    let with_client = idle(d.pid(), window);
    let mut latency = Vec::new();
    for i in 0..samples {
        let n = (i * 997 + 13) % dirs.len();
        let dir = &dirs[n];
        let name = dir
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        client.drain();
        let wrote = tick_like(dir, &format!("bench {what} {i}"), i + 2);
        let seen = client.card_of(&name);
        latency.push(seen.duration_since(wrote).as_secs_f64() * 1000.0);
        // Between samples, as between ticks: the next write lands at another point of a
        // poll's period.
        std::thread::sleep(Duration::from_millis(150 + (i as u64 * 37) % 300));
    }
    latency.sort_by(f64::total_cmp);
    Row {
        what: what.to_string(),
        no_client,
        client: with_client,
        connect_ms,
        watched,
        latency,
    }
}

fn main() {
    if support::listing() {
        return;
    }
    let samples = support::rounds(20);
    let n: usize = std::env::var("BENCH_LOOPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000);
    let window = Duration::from_secs(
        std::env::var("BENCH_WINDOW")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    );
    let exe = support::loopflow_bin();
    let before = std::env::var_os("BENCH_BEFORE_BIN").map(PathBuf::from);
    let made = Instant::now();
    let (p, dirs) = project(n);
    println!(
        "dashboard benchmark ({}), {n} loops (made in {:.1} s), windows of {} s:",
        exe.display(),
        made.elapsed().as_secs_f64(),
        window.as_secs()
    );
    let mut rows = vec![
        measure("watch", &exe, p.path(), &dirs, false, window, samples),
        measure("poll", &exe, p.path(), &dirs, true, window, samples),
    ];
    if let Some(b) = &before {
        rows.push(measure(
            "before",
            b,
            p.path(),
            &dirs,
            false,
            window,
            samples,
        ));
    }
    for r in &rows {
        let l = &r.latency;
        println!(
            "  {:<6} idle, no client: {:.1} ms CPU/s ({:.1} wake-ups/s); one client, nothing changing: {:.1} ms CPU/s ({:.1} wake-ups/s); a client connecting: {:.0} ms CPU, {} directories watched; state write -> event: median {:.0} ms, p90 {:.0}, max {:.0} ({} samples)",
            r.what,
            r.no_client.0,
            r.no_client.1,
            r.client.0,
            r.client.1,
            r.connect_ms,
            r.watched,
            percentile(l, 0.5),
            percentile(l, 0.9),
            l[l.len() - 1],
            l.len(),
        );
    }
    if let Some(b) = &before {
        println!("  before: {}", b.display());
    }
}
