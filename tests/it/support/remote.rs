//! Remotes for the tests of loops whose state lives in their repository (DESIGN §16): a
//! bare repository reached over `file://`, over `git://` (`git daemon` on 127.0.0.1) or
//! over smart HTTP (`git http-backend` behind `tests/remote/git_http.py`, which also
//! injects a remote's faults), and the clones runners and humans work in.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{LoopToml, PATIENCE, Project, git};

/// How a remote is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    File,
    Daemon,
    Http,
}

/// A bare repository `repo.git` under a temp dir, and the server in front of it.
pub struct Remote {
    pub root: tempfile::TempDir,
    pub url: String,
    server: Option<Child>,
    /// The HTTP server's control file (faults), when there is one.
    pub control: Option<PathBuf>,
}

impl Drop for Remote {
    fn drop(&mut self) {
        if let Some(s) = self.server.as_mut() {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

/// A TCP port free right now on 127.0.0.1 (git daemon cannot take port 0).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn wait_port(port: u16) {
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < PATIENCE,
            "server on port {port} never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Remote {
    pub fn new(t: Transport) -> Remote {
        Remote::with_token(t, None)
    }

    /// A remote whose HTTP server requires `token` (smart HTTP only).
    pub fn with_token(t: Transport, token: Option<&str>) -> Remote {
        let root = tempfile::tempdir().expect("tempdir");
        git(
            root.path(),
            &["init", "-q", "--bare", "-b", "main", "repo.git"],
        );
        let bare = root.path().join("repo.git");
        // Pushes over http need it; harmless elsewhere.
        git(&bare, &["config", "http.receivepack", "true"]);
        let mut r = Remote {
            url: format!("file://{}", bare.display()),
            root,
            server: None,
            control: None,
        };
        match t {
            Transport::File => {}
            Transport::Daemon => {
                let port = free_port();
                let child = Command::new("git")
                    .args([
                        "daemon",
                        "--reuseaddr",
                        "--listen=127.0.0.1",
                        &format!("--port={port}"),
                        &format!("--base-path={}", r.root.path().display()),
                        "--export-all",
                        "--enable=receive-pack",
                    ])
                    .arg(r.root.path())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("git daemon");
                r.server = Some(child);
                wait_port(port);
                r.url = format!("git://127.0.0.1:{port}/repo.git");
            }
            Transport::Http => {
                let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/remote/git_http.py");
                let port_file = r.root.path().join("port");
                let control = r.root.path().join("control.json");
                let mut c = Command::new("python3");
                c.arg(script)
                    .arg("--root")
                    .arg(r.root.path())
                    .arg("--port-file")
                    .arg(&port_file)
                    .arg("--control")
                    .arg(&control)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                if let Some(t) = token {
                    c.args(["--token", t]);
                }
                r.server = Some(c.spawn().expect("python3 git_http.py"));
                super::wait_for_file(&port_file);
                let port: u16 = std::fs::read_to_string(&port_file)
                    .expect("port")
                    .trim()
                    .parse()
                    .expect("port number");
                wait_port(port);
                r.url = format!("http://127.0.0.1:{port}/repo.git");
                r.control = Some(control);
            }
        }
        r
    }

    pub fn bare(&self) -> PathBuf {
        self.root.path().join("repo.git")
    }

    /// `git ARGS` in the bare repository.
    pub fn git(&self, args: &[&str]) -> String {
        git(&self.bare(), args)
    }

    /// The object a ref of the bare repository names, `None` when it has none.
    pub fn rev(&self, name: &str) -> Option<String> {
        let o = Command::new("git")
            .args(["rev-parse", "--verify", "--quiet", name])
            .current_dir(self.bare())
            .output()
            .expect("git");
        let s = String::from_utf8_lossy(&o.stdout).trim().to_string();
        (o.status.success() && !s.is_empty()).then_some(s)
    }

    /// A file of the state ref's tree (`state.json`, `log`, `lease.json`, `slots`).
    pub fn file(&self, name: &str, file: &str) -> Option<String> {
        let o = Command::new("git")
            .args([
                "cat-file",
                "blob",
                &format!("refs/loopflow/{name}/state:{file}"),
            ])
            .current_dir(self.bare())
            .output()
            .expect("git");
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The record's state.
    pub fn state(&self, name: &str) -> Value {
        serde_json::from_str(&self.file(name, "state.json").expect("state.json")).expect("JSON")
    }

    /// The record's log, each line without its timestamp.
    pub fn events(&self, name: &str) -> Vec<String> {
        self.file(name, "log")
            .unwrap_or_default()
            .lines()
            .map(|l| {
                l.split_once(' ')
                    .map_or(l.to_string(), |(_, r)| r.to_string())
            })
            .collect()
    }

    /// Commits on the remote's `loopflow/<name>` that are not on `main`.
    pub fn branch_commits(&self, name: &str) -> usize {
        self.git(&["rev-list", "--count", &format!("main..loopflow/{name}")])
            .trim()
            .parse()
            .expect("count")
    }

    /// Sets the HTTP server's faults (see `tests/remote/git_http.py`).
    pub fn faults(&self, json: &str) {
        let c = self.control.as_ref().expect("an http remote");
        std::fs::write(c, json).expect("control file");
    }

    /// A fresh clone, as a runner or a human makes one.
    pub fn clone(&self) -> Project {
        let p = Project::new();
        let o = Command::new("git")
            .args(["clone", "-q", &self.url, "."])
            .current_dir(p.path())
            .output()
            .expect("git clone");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        p
    }
}

/// A fake agent that returns at once: implement appends to `work.txt`, verify passes
/// with score 0.N on tick N (no plateau), orchestrate says so. In `dir`, outside every clone (loop.toml, which
/// every clone shares, names it by its absolute path).
pub fn quick_agent(dir: &Path) -> PathBuf {
    let p = dir.join("agent.sh");
    std::fs::write(
        &p,
        r#"#!/bin/sh
case "$1" in
  implement) echo "tick $LOOPFLOW_TICK" >> work.txt; echo implemented ;;
  verify) echo "{\"pass\": true, \"score\": 0.$LOOPFLOW_TICK}" ;;
  orchestrate) echo orchestrated ;;
esac
"#,
    )
    .expect("agent");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    p
}

/// The loop.toml of a remote loop on `origin` whose roles run `agent`.
pub fn remote_toml(agent: &Path) -> LoopToml {
    LoopToml::new()
        .harness_agent(agent)
        .worktree(true)
        .table("remote", "name = \"origin\"")
}

/// A repository on `remote` with loop `name` created there (its first state pushed by
/// `create --remote`) and its `loop.toml` (`toml`) committed on `main` and pushed: what a
/// human does once. Returns the human's checkout.
pub fn start_loop(remote: &Remote, name: &str, toml: &LoopToml) -> Project {
    let p = Project::git();
    p.git_cmd(&["remote", "add", "origin", &remote.url]);
    p.git_cmd(&["push", "-q", "origin", "main"]);
    let r = p.lf(&[
        "create", "--loop", name, "--task", "the task", "--remote", "origin",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    p.loop_toml(name, &toml.render());
    p.commit_all("the loop");
    p.git_cmd(&["push", "-q", "origin", "main"]);
    p
}

/// What [`FaultAgent`] runs: the usual roles, each reporting $0.25 of spend, and the
/// role named in `wait-role` (a `pause` node's too) waiting, the first time it runs
/// anywhere, until `go` exists.
pub struct FaultAgent {
    pub dir: tempfile::TempDir,
    pub agent: PathBuf,
}

impl FaultAgent {
    pub fn new() -> FaultAgent {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent = dir.path().join("agent.sh");
        let d = dir.path().display();
        std::fs::write(
            &agent,
            format!(
                r#"#!/bin/sh
role="$1"; out="$2"
if [ "$role" = "$(cat {d}/wait-role 2>/dev/null)" ] && mkdir "{d}/waiting" 2>/dev/null; then
  echo $$ > "{d}/started.tmp" && mv "{d}/started.tmp" "{d}/started"
  i=0; while [ ! -e "{d}/go" ] && [ $i -lt 3000 ]; do sleep 0.02; i=$((i+1)); done
fi
case "$role" in
  implement) echo "tick $LOOPFLOW_TICK" >> work.txt; echo implemented ;;
  verify) echo "{{\"pass\": true, \"score\": 0.$LOOPFLOW_TICK}}" ;;
  orchestrate) echo orchestrated ;;
  pause) echo paused ;;
esac
[ -n "$out" ] && echo '{{"cost_usd": 0.25, "tokens": 100}}' > "$out"
exit 0
"#
            ),
        )
        .expect("agent");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        FaultAgent { dir, agent }
    }

    /// The first run of `role` (anywhere) waits until [`FaultAgent::go`].
    pub fn wait_in(&self, role: &str) {
        std::fs::write(self.dir.path().join("wait-role"), role).expect("wait-role");
    }

    /// Waits until the waiting role has started.
    pub fn started(&self) {
        super::wait_for_file(&self.dir.path().join("started"));
    }

    /// Lets the waiting role go on.
    pub fn go(&self) {
        std::fs::write(self.dir.path().join("go"), "").expect("go");
    }

    /// A remote loop running this agent with 2 s role timeouts and a 1 s lease margin (a
    /// lease of a few seconds), with a `pause` command node after the branch commit when
    /// `pause` (its pipeline file beside the agent).
    pub fn toml(&self, pause: bool) -> LoopToml {
        let mut t = LoopToml::new()
            .harness_command(&self.agent, &["{{role}}", "{{output}}"])
            .harness("timeout = \"2s\"")
            .worktree(true)
            .table("remote", "name = \"origin\"\nlease_margin = \"1s\"");
        if pause {
            let p = super::PipelineToml::named("tick-then-pause")
                .node("gate", "gate", &[])
                .node("floor-check", "floor-check", &["gate"])
                .harness("implement", "implement", &["floor-check"])
                .harness("verify", "verify", &["implement"])
                .verdict("parse", "verify", &["verify"])
                .harness("orchestrate", "orchestrate", &["parse"])
                .commit("commit", &["orchestrate"])
                .git_commit("land", &["commit"])
                .script("pause", &self.agent, &["pause"], &["land"])
                .with("timeout = \"2s\"");
            let path = self.dir.path().join("pipeline.toml");
            std::fs::write(&path, p.render()).expect("pipeline");
            t = t.pipeline(&path);
        }
        t
    }
}

/// Where libfaketime is (Debian's `faketime`), `None` when it is not installed.
pub fn faketime_lib() -> Option<PathBuf> {
    let lib = std::fs::read_dir("/usr/lib")
        .ok()?
        .flatten()
        .map(|e| e.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.is_file());
    if lib.is_none() && std::env::var("LOOPFLOW_REQUIRE_VALIDATORS").as_deref() == Ok("1") {
        panic!("libfaketime is required (LOOPFLOW_REQUIRE_VALIDATORS=1): apt-get install faketime");
    }
    lib
}

/// `http.extraHeader=Authorization: Basic base64(x-access-token:TOKEN)`, as the test's own
/// git sends it.
pub fn header(token: &str) -> String {
    let b64 = Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .expect("stdin")
                .write_all(format!("x-access-token:{token}").as_bytes())?;
            c.wait_with_output()
        })
        .expect("base64");
    format!(
        "http.extraHeader=Authorization: Basic {}",
        String::from_utf8_lossy(&b64.stdout).trim()
    )
}

/// The test's own git with the token for this command only.
pub fn git_auth(dir: &Path, token: &str, args: &[&str]) {
    let h = header(token);
    let mut all = vec!["-c", &h];
    all.extend(args);
    git(dir, &all);
}

/// [`start_loop`] on a remote that requires `token`: the human's git and loopflow use it.
pub fn start_with_token(remote: &Remote, name: &str, toml: &LoopToml, token: &str) -> Project {
    let p = Project::git();
    p.git_cmd(&["remote", "add", "origin", &remote.url]);
    git_auth(p.path(), token, &["push", "-q", "origin", "main"]);
    let r = p.lf_env(
        &[
            "create", "--loop", name, "--task", "t", "--remote", "origin",
        ],
        &[("LOOPFLOW_GIT_TOKEN", token)],
    );
    assert_eq!(r.code, 0, "{r:?}");
    p.loop_toml(name, &toml.render());
    p.commit_all("the loop");
    git_auth(p.path(), token, &["push", "-q", "origin", "main"]);
    p
}

/// A clone made through `token`.
pub fn clone_with_token(remote: &Remote, token: &str) -> Project {
    let p = Project::new();
    git_auth(p.path(), token, &["clone", "-q", &remote.url, "."]);
    p
}
