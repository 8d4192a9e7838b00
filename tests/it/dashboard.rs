//! `loopflow dashboard`: the real server on a free loopback port, over raw HTTP (status,
//! server-sent events, Host checking, read-only), and in headless Chromium through the
//! Node script `tests/web/dashboard.mjs` (the page lists the loops, the chart renders, a
//! tick shows up without a reload, agent text stays text; a screenshot lands in
//! `target/dashboard.png`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{PATIENCE, Project, standard_agent};

/// A running `loopflow dashboard --port 0`, stopped when dropped.
pub(crate) struct Dashboard {
    child: Child,
    url: String,
    addr: String,
    /// Its stderr, kept in a file (outside the project, whose files it watches).
    stderr: tempfile::NamedTempFile,
}

impl Dashboard {
    fn start(p: &Project) -> Dashboard {
        Dashboard::start_with(p, &[])
    }

    /// With `extra` arguments before the command (`--project DIR` for more projects).
    pub(crate) fn start_with(p: &Project, extra: &[&str]) -> Dashboard {
        let mut cmd = p.lf_cmd(&[]);
        cmd.args(extra).args(["dashboard", "--port", "0"]);
        Dashboard::spawn(cmd)
    }

    /// `cmd`, a `loopflow … dashboard --port 0` (perhaps through a wrapper that execs it),
    /// started.
    fn spawn(mut cmd: Command) -> Dashboard {
        let stderr = tempfile::NamedTempFile::new().expect("stderr file");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().expect("stderr file"))
            .spawn()
            .expect("spawn dashboard");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the dashboard prints its address");
        let url = line.trim().to_string();
        assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        Dashboard {
            child,
            url,
            addr,
            stderr,
        }
    }

    /// What it said on stderr so far.
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }

    /// One request with `Connection: close`: (status, headers, body).
    fn request(&self, method: &str, path: &str, host: &str) -> (u16, String, String) {
        let mut s = TcpStream::connect(&self.addr).expect("connect");
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut raw = String::new();
        s.read_to_string(&mut raw).expect("response");
        let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        (status, head.to_string(), body.to_string())
    }

    pub(crate) fn get(&self, path: &str) -> (u16, String, String) {
        self.request("GET", path, &self.addr.clone())
    }

    pub(crate) fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A project with three loops on fake agents: `alpha` ticked twice and left running,
/// `done` halted at goal_met, `xss` whose verdict carries markup.
fn project() -> Project {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[
            r#"{"pass": false, "score": 0.3, "reasons": ["two tests fail"], "cost_usd": 0.0123}"#,
            r#"{"pass": false, "score": 0.6, "reasons": ["one test fails"], "next_hint": "fix the parser", "cost_usd": 0.02}"#,
            r#"{"pass": false, "score": 0.8, "reasons": ["nearly"], "cost_usd": 0.01}"#,
            // For a second run of the browser test, which ticks once more.
            r#"{"pass": false, "score": 0.85, "reasons": ["nearly"], "cost_usd": 0.01}"#,
        ],
    );
    p.agent_loop(
        "alpha",
        &agent,
        "max_budget_usd = 1.0\nscore_plateau_window = 50",
    );
    p.run_json("alpha", &[]);
    p.run_json("alpha", &[]);
    let good = p.script(
        "good.sh",
        r#"[ "$1" = verify ] && echo '{"pass": true, "score": 1.0, "reasons": ["all tests pass"]}'; true"#,
    );
    p.agent_loop("done", &good, "");
    p.run_json("done", &[]);
    let evil = p.script(
        "evil.sh",
        r#"[ "$1" = verify ] && cat <<'V'
{"pass": false, "score": 0.4, "reasons": ["<script>window.__xss=1</script>", "<img src=x onerror=\"window.__xss=2\">"], "next_hint": "</details></article><script>window.__xss=3</script>"}
V
true"#,
    );
    p.agent_loop("xss", &evil, "");
    p.run_json("xss", &[]);
    p
}

pub(crate) fn events_of(d: &Dashboard) -> (BufReader<TcpStream>, Instant) {
    let mut s = TcpStream::connect(&d.addr).expect("connect");
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(s, "GET /events HTTP/1.1\r\nHost: {}\r\n\r\n", d.addr).unwrap();
    (BufReader::new(s), Instant::now())
}

/// Reads server-sent events until one whose data satisfies `want`; returns it.
pub(crate) fn next_update(r: &mut BufReader<TcpStream>, want: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    let mut line = String::new();
    loop {
        assert!(start.elapsed() < PATIENCE, "no such event");
        line.clear();
        if r.read_line(&mut line).expect("read event") == 0 {
            panic!("the event stream ended");
        }
        // Chunked transfer: data lines arrive whole inside chunks.
        if let Some(data) = line.trim_end().strip_prefix("data: ") {
            let v: Value = serde_json::from_str(data).expect("event JSON");
            if want(&v) {
                return v;
            }
        }
    }
}

#[test]
fn the_server_serves_status_events_and_refuses_foreign_hosts() {
    let p = project();
    let d = Dashboard::start(&p);

    let (code, head, page) = d.get("/");
    assert_eq!(code, 200, "{head}");
    assert!(head.contains("content-security-policy"), "{head}");
    for name in ["alpha", "done", "xss"] {
        assert!(page.contains(&format!("id=\"loop-{name}\"")), "{name}");
    }
    assert!(!page.contains("<script>window"), "agent markup in the page");
    assert!(page.contains("&lt;script&gt;window.__xss=1&lt;/script&gt;"));
    assert!(page.contains("<script src=\"/app.js\" defer></script>"));

    // /api/status is `status --json`, document for document.
    let (code, _, body) = d.get("/api/status");
    assert_eq!(code, 200);
    let status = p.lf(&["status", "--json"]);
    let a: Value = serde_json::from_str(&body).expect("json");
    let b: Value = serde_json::from_str(&status.stdout).expect("json");
    assert_eq!(a, b);

    // DNS rebinding: a page on another name that resolves to 127.0.0.1.
    let port = d.addr.rsplit(':').next().unwrap().to_string();
    for host in [
        format!("attacker.example:{port}"),
        "127.0.0.1".to_string(),
        format!("127.0.0.1:{}", port.parse::<u32>().unwrap() + 1),
        String::new(),
    ] {
        let (code, _, body) = d.request("GET", "/api/status", &host);
        assert_eq!(code, 403, "Host {host:?}: {body}");
        assert!(!body.contains("alpha"), "{body}");
    }
    assert_eq!(d.request("GET", "/", &format!("localhost:{port}")).0, 200);
    // Read-only.
    let (code, head, _) = d.request("POST", "/api/status", &d.addr);
    assert_eq!(code, 405, "{head}");

    // A tick reaches /events as an update of that loop's card.
    let (mut ev, _) = events_of(&d);
    let first = next_update(&mut ev, |_| true);
    let cards = first["loops"].as_object().unwrap();
    assert_eq!(cards.len(), 3, "the first update carries every card");
    assert_eq!(
        first["order"][0], "done",
        "halted first: {}",
        first["order"]
    );
    let r = p.lf(&["run", "--loop", "alpha"]);
    assert_eq!(r.code, 0, "{r:?}");
    let ticked = Instant::now();
    // The tick's own state writes (it starts, it runs) may come first: the update that
    // counts is the one with its third iteration.
    let upd = next_update(&mut ev, |v| {
        v["loops"]["alpha"]
            .as_str()
            .is_some_and(|c| c.contains("3 / 10"))
    });
    let latency = ticked.elapsed();
    eprintln!("NOTICE: /events carried the tick {latency:?} after it ended");
    assert!(upd["loops"]["xss"].is_null(), "only what changed is sent");
    assert!(
        upd["log"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("TICK")),
        "{upd}"
    );
    // A halt too.
    assert_eq!(p.lf(&["halt", "--loop", "xss", "--reason", "stop"]).code, 0);
    let upd = next_update(&mut ev, |v| v["loops"]["xss"].is_string());
    assert!(
        upd["loops"]["xss"].as_str().unwrap().contains("needs you"),
        "{upd}"
    );
}

/// Whether `tool` is on PATH.
fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

#[test]
fn the_page_in_headless_chromium() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let p = project();
    let d = Dashboard::start(&p);
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard.png");
    let cfg = serde_json::json!({
        "url": d.url,
        "bin": crate::support::bin(),
        "project": p.path(),
        "tick_loop": "alpha",
        "tick_points": 2,
        "xss_loop": "xss",
        "loops": ["alpha", "done", "xss"],
        "screenshot": shot,
        "chromium": browser.chromium,
    });
    browser.run(&p, cfg, "alpha", None);
}

/// The same page over three projects (`--project` three times): the first project's loops
/// as `label:loop`, a second project with a halted loop, a third that is gone and shows
/// as a broken project; a tick in the first still reaches the page live. The screenshot
/// lands in `target/dashboard-projects.png`.
#[test]
fn the_page_over_many_projects_in_headless_chromium() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let p = project();
    let second = Project::new();
    let agent = standard_agent(&second, &[r#"{"pass": false, "score": 0.5}"#]);
    second.agent_loop("deploy-docs", &agent, "");
    second.run_json("deploy-docs", &[]);
    let r = second.lf(&[
        "halt",
        "--loop",
        "deploy-docs",
        "--reason",
        "check the preview",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    let gone = tempfile::tempdir().unwrap();
    let gone_dir = gone.path().join("old-checkout");
    let label = |d: &Path| {
        d.canonicalize()
            .unwrap_or_else(|_| d.to_path_buf())
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let (l1, l2) = (label(p.path()), label(second.path()));
    let d = Dashboard::start_with(
        &p,
        &[
            "--project",
            second.path().to_str().unwrap(),
            "--project",
            gone_dir.to_str().unwrap(),
        ],
    );
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-projects.png");
    let loops: Vec<String> = ["alpha", "done", "xss"]
        .iter()
        .map(|l| format!("{l1}:{l}"))
        .chain([format!("{l2}:deploy-docs")])
        .collect();
    let cfg = serde_json::json!({
        "url": d.url,
        "bin": crate::support::bin(),
        "project": p.path(),
        "tick_loop": "alpha",
        "tick_id": format!("{l1}:alpha"),
        "tick_points": 2,
        "xss_loop": "xss",
        "xss_id": format!("{l1}:xss"),
        "loops": loops,
        "broken_ids": ["old-checkout:"],
        "screenshot": shot,
        "chromium": browser.chromium,
    });
    browser.run(&p, cfg, "alpha", Some("3 projects: "));
}

/// Node, Debian's Chromium and playwright-core, when all are here (else the test skips,
/// unless `LOOPFLOW_REQUIRE_BROWSER` says they must be).
struct Browser {
    node: PathBuf,
    chromium: PathBuf,
    web: PathBuf,
}

impl Browser {
    fn find() -> Option<Browser> {
        let web = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web");
        let chromium = Path::new("/usr/bin/chromium");
        let node = which("node");
        let modules = web.join("node_modules/playwright-core");
        let missing: Vec<&str> = [
            (node.is_none(), "node"),
            (!chromium.exists(), "/usr/bin/chromium"),
            (
                !modules.exists(),
                "tests/web/node_modules (npm ci in tests/web)",
            ),
        ]
        .into_iter()
        .filter_map(|(m, what)| m.then_some(what))
        .collect();
        if !missing.is_empty() {
            assert!(
                std::env::var_os("LOOPFLOW_REQUIRE_BROWSER").is_none(),
                "LOOPFLOW_REQUIRE_BROWSER is set but {missing:?} are missing"
            );
            eprintln!("NOTICE: skipping the browser test: missing {missing:?}");
            return None;
        }
        Some(Browser {
            node: node?,
            chromium: chromium.to_path_buf(),
            web,
        })
    }

    /// Runs `tests/web/dashboard.mjs` with `cfg` against the page (which ticks
    /// `tick_loop` of project `p` once); `title`, when given, must be in the page's title.
    fn run(&self, p: &Project, mut cfg: Value, tick_loop: &str, title: Option<&str>) {
        let shot = PathBuf::from(cfg["screenshot"].as_str().expect("screenshot"));
        if let Some(t) = title {
            let url = cfg["url"].as_str().unwrap().to_string();
            let addr = url.trim_start_matches("http://").trim_end_matches('/');
            let mut s = TcpStream::connect(addr).expect("connect");
            write!(
                s,
                "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut page = String::new();
            s.read_to_string(&mut page).unwrap();
            assert!(page.contains(&format!("<title>loopflow · {t}")), "{page}");
        }
        let cfg_path = p.write("web-test.json", &cfg.to_string());
        let run = || {
            std::process::Command::new(&self.node)
                .arg(self.web.join("dashboard.mjs"))
                .arg(&cfg_path)
                .current_dir(&self.web)
                .env("NO_COLOR", "1")
                .output()
                .expect("run node")
        };
        let mut out = run();
        if !out.status.success() {
            // Once in many full-suite runs on a loaded 2-core machine the browser run failed
            // and passed when run again, and its message was not kept: it is run a second
            // time, with the first failure printed, and the second must pass. The first may
            // have ticked the loop already: the chart's starting count is read again.
            // Written past libtest's capture (which drops a passing test's output) and kept
            // in target/, so a flake that the second run hides still leaves its message.
            let first = format!(
                "NOTICE: the browser test failed once, running it again:\n{}\n{}\n",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), first.as_bytes());
            let _ = std::fs::write(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-first-failure.txt"),
                &first,
            );
            let points = p.state(tick_loop)["score_history"]
                .as_array()
                .map_or(0, Vec::len);
            cfg["tick_points"] = points.into();
            std::fs::write(&cfg_path, cfg.to_string()).unwrap();
            out = run();
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("{stdout}");
        assert!(
            out.status.success(),
            "browser test failed:\n{stdout}\n{stderr}"
        );
        assert!(stdout.contains("dashboard browser test: ok"), "{stdout}");
        assert!(shot.exists());
    }
}

// --- How the server learns of changes: the kernel's notification while a client listens,
// polling where that cannot work, and nothing at all with no client.

/// The environment variable that makes the dashboard poll as where the kernel cannot
/// notify (a test hook, and a way out).
const POLL_ENV: &str = "LOOPFLOW_DASHBOARD_POLL";

/// A project of two loops, `a` and `b`, whose agent always answers, each ticked once.
fn two_loops() -> Project {
    let p = Project::new();
    let agent = p.script(
        "agent.sh",
        r#"[ "$1" = verify ] && echo '{"pass": false, "score": 0.5}'; true"#,
    );
    for l in ["a", "b"] {
        p.agent_loop(
            l,
            &agent,
            "score_plateau_window = 100\nmax_iterations = 100",
        );
        p.run_json(l, &[]);
    }
    p
}

/// Replaces loop `name`'s state the way loopflow writes it (a new file renamed over the
/// old one), its task now `task`.
fn replace_state(p: &Project, name: &str, task: &str) {
    let dir = p.loop_dir(name);
    let mut v = p.state(name);
    v["current_task"] = task.into();
    let tmp = dir.join(".state.loop.swap");
    std::fs::write(&tmp, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    std::fs::rename(&tmp, dir.join(".state.loop")).unwrap();
}

/// Changes loops as ticks and people do: a tick of `a`, a new loop `new-N`, and `b`'s state
/// replaced with task `task-N`; over two seconds at least (four polls of old).
fn churn(p: &Project, n: u32) {
    let start = Instant::now();
    p.run_json("a", &[]);
    assert_eq!(p.create(&format!("new-{n}"), Some("t")).code, 0);
    replace_state(p, "b", &format!("task-{n}"));
    std::thread::sleep(Duration::from_secs(2).saturating_sub(start.elapsed()));
}

/// The dashboard's wake-ups so far (the context switches of its threads, summed), its CPU
/// time in clock ticks (`/proc/<pid>/stat` utime + stime) and how many threads it has (the
/// watcher's exists only while a client listens).
fn wakes(d: &Dashboard) -> (u64, u64, usize) {
    let proc = PathBuf::from(format!("/proc/{}", d.child.id()));
    let (mut switches, mut threads) = (0, 0);
    for t in std::fs::read_dir(proc.join("task"))
        .expect("/proc")
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        threads += 1;
        for l in status.lines() {
            if let Some(n) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += n.trim().parse::<u64>().expect("a count");
            }
        }
    }
    let stat = std::fs::read_to_string(proc.join("stat")).expect("stat");
    // The fields after the command's closing parenthesis; utime and stime are the 14th
    // and 15th of the line.
    let rest: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let cpu = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
    (switches, cpu, threads)
}

/// Waits until the dashboard has not woken for half a second (the last change taken in),
/// or gives up after ten tries: one that never settles fails the measurement that follows,
/// with its count.
fn settle(d: &Dashboard) {
    for _ in 0..10 {
        let before = wakes(d).0;
        std::thread::sleep(Duration::from_millis(500));
        if wakes(d).0 == before {
            return;
        }
    }
}

/// Whether an update's page order has loop `key`.
fn has_loop(v: &Value, key: &str) -> bool {
    v["order"]
        .as_array()
        .is_some_and(|o| o.iter().any(|n| n == key))
}

/// Whether an update carries `key`'s card with `text` in it.
fn card_has(v: &Value, key: &str, text: &str) -> bool {
    v["loops"][key].as_str().is_some_and(|c| c.contains(text))
}

#[test]
fn with_no_client_the_dashboard_sleeps_while_loops_change() {
    let p = two_loops();
    let d = Dashboard::start(&p);
    // A client comes and goes: the watching it started goes with it.
    {
        let (mut ev, _) = events_of(&d);
        next_update(&mut ev, |_| true);
        crate::support::wait_until("the watcher's thread", || wakes(&d).2 == 2);
    }
    crate::support::wait_until("the watcher to stop with its client", || wakes(&d).2 == 1);
    settle(&d);
    let before = wakes(&d);
    churn(&p, 1);
    let after = wakes(&d);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1, after.2),
        (0, 0, 1),
        "with no client, while loops changed, the dashboard woke (context switches, CPU ticks, threads)"
    );
    // What changed is read when asked for.
    let (_, _, body) = d.get("/api/status");
    assert!(
        body.contains("\"new-1\"") && body.contains("task-1"),
        "{body}"
    );

    // With a client the same changes wake it (the count sees wake-ups) ...
    let (mut ev, _) = events_of(&d);
    next_update(&mut ev, |_| true);
    let before = wakes(&d);
    churn(&p, 2);
    next_update(&mut ev, |v| card_has(v, "b", "task-2"));
    assert!(wakes(&d).0 > before.0, "a change reached the client");
    // ... and once they stop, it sleeps: nothing polls (the keepalive is 15 s away).
    settle(&d);
    let before = wakes(&d);
    std::thread::sleep(Duration::from_secs(2));
    let after = wakes(&d);
    assert_eq!(
        after.0 - before.0,
        0,
        "a watching dashboard woke with nothing changing"
    );
    assert!(!d.stderr().contains("polled"), "{}", d.stderr());
}

#[test]
fn the_watcher_sees_ticks_new_and_deleted_loops_and_renamed_state_in_every_project() {
    let p = two_loops();
    // A second project with no loops yet, not even `.loopflow/`: watched through its
    // directory until its loops directory appears.
    let second = Project::new();
    let label = |d: &Path| {
        d.canonicalize()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let (l1, l2) = (label(p.path()), label(second.path()));
    let d = Dashboard::start_with(&p, &["--project", second.path().to_str().unwrap()]);
    let (mut ev, _) = events_of(&d);
    next_update(&mut ev, |v| has_loop(v, &format!("{l1}:b")));

    // A tick: its TICK line and its card.
    let a = format!("{l1}:a");
    p.run_json("a", &[]);
    let upd = next_update(&mut ev, |v| card_has(v, &a, "2 / 100"));
    assert!(
        upd["loops"][&format!("{l1}:b")].is_null(),
        "only `a` changed"
    );
    // Its state replaced by a rename, as loopflow writes it.
    let b = format!("{l1}:b");
    replace_state(&p, "b", "renamed into place");
    next_update(&mut ev, |v| card_has(v, &b, "renamed into place"));
    // A loop created in the project that had none.
    assert_eq!(second.create("fresh", Some("t")).code, 0);
    let fresh = format!("{l2}:fresh");
    next_update(&mut ev, |v| {
        has_loop(v, &fresh) && v["loops"][&fresh].is_string()
    });
    // ... whose own files are then watched too.
    replace_state(&second, "fresh", "seen in the new loop");
    next_update(&mut ev, |v| card_has(v, &fresh, "seen in the new loop"));
    // A loop deleted.
    std::fs::remove_dir_all(p.loop_dir("b")).unwrap();
    next_update(&mut ev, |v| has_loop(v, &a) && !has_loop(v, &b));
    assert!(!d.stderr().contains("polled"), "{}", d.stderr());
}

#[test]
fn where_the_kernel_cannot_tell_it_polls_only_while_a_client_listens() {
    let p = two_loops();
    let mut cmd = p.lf_cmd(&["dashboard", "--port", "0"]);
    cmd.env(POLL_ENV, "1");
    let d = Dashboard::spawn(cmd);
    settle(&d);
    let before = wakes(&d);
    churn(&p, 1);
    let after = wakes(&d);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (0, 0),
        "with no client the polling dashboard woke"
    );
    for round in 2..4 {
        let (mut ev, _) = events_of(&d);
        next_update(&mut ev, |v| has_loop(v, &format!("new-{}", round - 1)));
        p.run_json("a", &[]);
        let iter = format!("{} / 100", round + 1);
        next_update(&mut ev, |v| card_has(v, "a", &iter));
        assert_eq!(p.create(&format!("new-{round}"), None).code, 0);
        next_update(&mut ev, |v| has_loop(v, &format!("new-{round}")));
        // Nothing changes, and it wakes all the same: it polls.
        let before = wakes(&d);
        std::thread::sleep(Duration::from_secs(2));
        assert!(wakes(&d).0 >= before.0 + 2, "polling shows as wake-ups");
    }
    // Said once, though two clients started it.
    let err = d.stderr();
    assert_eq!(
        err.matches(
            "LOOPFLOW_DASHBOARD_POLL is set: the loops are polled every 500 ms while a page is open"
        )
        .count(),
        1,
        "{err}"
    );
}

/// The kernel's limit on inotify watches, lowered for the dashboard alone: in a user
/// namespace of its own (`/proc/sys/user/max_inotify_watches` is per namespace), where it
/// may watch two directories and needs three.
#[test]
fn the_kernel_watch_limit_reached_falls_back_to_polling() {
    let ok = Command::new("unshare")
        .args(["--user", "--map-root-user", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("NOTICE: skipping: no user namespaces here (unshare --user)");
        return;
    }
    let p = two_loops();
    let cmd = p.lf_cmd_via(
        &[
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            r#"echo 2 > /proc/sys/user/max_inotify_watches && exec "$0" "$@""#,
        ],
        &["dashboard", "--port", "0"],
    );
    let d = Dashboard::spawn(cmd);
    let (mut ev, _) = events_of(&d);
    next_update(&mut ev, |v| has_loop(v, "b"));
    p.run_json("a", &[]);
    next_update(&mut ev, |v| card_has(v, "a", "2 / 100"));
    assert_eq!(p.create("late", None).code, 0);
    next_update(&mut ev, |v| has_loop(v, "late"));
    let err = d.stderr();
    assert!(
        err.contains("the kernel's limit on watched directories is reached")
            && err.contains("the loops are polled every 500 ms while a page is open"),
        "{err}"
    );
}
