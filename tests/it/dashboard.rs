//! `loopflow dashboard`: the real server on a free loopback port, over raw HTTP (status,
//! server-sent events, Host checking, read-only), and in headless Chromium through the
//! Node script `tests/web/dashboard.mjs` (the page lists the loops, the chart renders, a
//! tick shows up without a reload, agent text stays text; a screenshot lands in
//! `target/dashboard.png`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Instant;

use serde_json::Value;

use crate::support::{PATIENCE, Project, standard_agent};

/// A running `loopflow dashboard --port 0`, stopped when dropped.
pub(crate) struct Dashboard {
    child: Child,
    url: String,
    addr: String,
}

impl Dashboard {
    fn start(p: &Project) -> Dashboard {
        Dashboard::start_with(p, &[])
    }

    /// With `extra` arguments before the command (`--project DIR` for more projects).
    pub(crate) fn start_with(p: &Project, extra: &[&str]) -> Dashboard {
        let mut cmd = p.lf_cmd(&[]);
        cmd.args(extra).args(["dashboard", "--port", "0"]);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
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
        Dashboard { child, url, addr }
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
