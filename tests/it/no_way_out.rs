//! No way out (DESIGN §12): a prompt-injected agent under the sandbox of the default loop
//! (a worktree, `network = "hosts"`, here `mode = "enforce"`) tries the routes an
//! independent attacker suite found open — the user's terminal, root's capabilities, other
//! processes reached through their limits, priorities, affinity, I/O class or memory, the
//! kernel objects the user's processes share, descriptors loopflow was started with, the
//! secrets beside its toolchains, stalling loopflow or outliving the tick, and planting the
//! next node's output — each test fails if one works. Every attack runs twice: as root
//! (these machines run as root) and as an ordinary user (`support::runas`), since
//! Landlock, ptrace and capabilities treat root differently.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::runas::{User, as_user, git_any, runners, who};
use crate::support::toml::string;
use crate::support::{LoopToml, PATIENCE, Project, Run};

const HALF: &str = r#"{"pass": false, "score": 0.5}"#;
const PY: &str = "/usr/bin/python3";

/// The sandbox tests' probe (Landlock ABI >= 6, required under CI), and the interpreter
/// the attacks are written in.
fn ready() -> bool {
    if !crate::sandbox::landlock() {
        return false;
    }
    assert!(
        Path::new(PY).exists() || std::env::var_os("LOOPFLOW_REQUIRE_SANDBOX").is_none(),
        "no {PY}, and LOOPFLOW_REQUIRE_SANDBOX is set"
    );
    Path::new(PY).exists()
}

/// A project whose loop `l` (a worktree, `[sandbox]` with `sandbox` lines on top of
/// `mode = "enforce"`) runs `body` as its implement role, in the worktree, with `loot/`
/// made; its verifier says 0.5. `files` are written into the project's `tools/` first
/// (the attack scripts: `$T` in `body` names that directory, which the agent may read).
/// Handed to `user` when given.
fn hostile(user: Option<&User>, body: &str, sandbox: &str, files: &[(&str, &str)]) -> Project {
    let p = Project::git();
    p.write("verdict.json", &format!("{HALF}\n"));
    std::fs::create_dir_all(p.join("tools")).expect("tools");
    for (name, text) in files {
        p.write(&format!("tools/{name}"), text);
    }
    let agent = p.script(
        "agent.sh",
        &format!(
            "T={t}\ncase \"$1\" in\n  implement) mkdir -p loot\n{body}\n  ;;\n  verify) cat \"{v}\" ;;\n  *) echo ok ;;\nesac\nexit 0",
            t = p.join("tools").display(),
            v = p.join("verdict.json").display()
        ),
    );
    let toml = LoopToml::new()
        .without("worktree")
        .table(
            "sandbox",
            &format!(
                "mode = \"enforce\"\nread = [{}, {}]\n{sandbox}",
                string(&p.join("verdict.json").display().to_string()),
                string(&p.join("tools").display().to_string())
            ),
        )
        .harness_command(&agent, &["{{role}}"]);
    p.with_loop("l", &toml);
    std::fs::create_dir_all(p.join("home")).expect("home");
    if let Some(u) = user {
        u.own_project(&p);
    }
    p
}

/// `loopflow run --loop l --json` as `user`, `HOME` in the project, `env` on top; it must
/// end within [`PATIENCE`] (a bound against hangs, not a timing), else the test fails.
fn tick(p: &Project, user: Option<&User>, env: &[(&str, &str)]) -> Run {
    let mut c = p.lf_cmd(&["run", "--loop", "l", "--json"]);
    c.env("HOME", p.join("home")).envs(env.iter().copied());
    bounded(as_user(user, c), &who(user))
}

/// Runs `c` to its end, its output captured; kills it and fails the test past
/// [`PATIENCE`] (loopflow must never block: that is what some attacks try).
fn bounded(mut c: Command, what: &str) -> Run {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn loopflow");
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let reader = std::thread::spawn(move || {
        let mut e = Vec::new();
        if let Some(s) = err.as_mut() {
            let _ = s.read_to_end(&mut e);
        }
        e
    });
    let mut o = Vec::new();
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("loopflow ({what}) did not end within {PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if let Some(s) = out.as_mut() {
        let _ = s.read_to_end(&mut o);
    }
    let e = reader.join().unwrap_or_default();
    Run {
        code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o).into_owned(),
        stderr: String::from_utf8_lossy(&e).into_owned(),
    }
}

fn loot(p: &Project, name: &str) -> String {
    std::fs::read_to_string(p.worktree("l").join("loot").join(name)).unwrap_or_default()
}

/// The results an attack script printed (`name result` lines) that say it worked: every
/// one but a refusal (`EPERM`, `EACCES`, `ENOSYS`, `ENOTTY`, `ENXIO`, …).
fn breaches(text: &str) -> Vec<String> {
    const REFUSED: &[&str] = &[
        "Operation not permitted",
        "Permission denied",
        "Function not implemented",
        "Inappropriate ioctl for device",
        "No such device or address",
        "No such file or directory",
        "Bad file descriptor",
    ];
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !REFUSED.iter().any(|r| l.contains(r)))
        .map(str::to_string)
        .collect()
}

/// The tick ran to its `TICK` line (loopflow was neither killed nor stalled).
fn assert_ticked(p: &Project, r: &Run, who: &str) {
    assert_eq!(r.code, 0, "{who}: {r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{who}: {r:?}");
    let events = p.events_after_create("l");
    assert!(
        events.iter().any(|e| e.starts_with("TICK ")),
        "{who}: no TICK line: {events:?}"
    );
}

/// The attack scripts share this prelude: raw syscalls by name on x86_64 and aarch64, and
/// `t(name, f)` printing `name ok` or `name <error>`.
const PRELUDE: &str = r#"import ctypes, os, sys, platform
X86 = platform.machine() == "x86_64"
NR = {
    "process_vm_readv": 310 if X86 else 270, "kcmp": 312 if X86 else 272,
    "pidfd_open": 434, "pidfd_getfd": 438, "perf_event_open": 298 if X86 else 241,
    "ioprio_set": 251 if X86 else 30, "unshare": 272 if X86 else 97,
    "userfaultfd": 323 if X86 else 282, "bpf": 321 if X86 else 280,
    "io_uring_setup": 425, "add_key": 248 if X86 else 217,
    "keyctl": 250 if X86 else 219, "request_key": 249 if X86 else 218,
    "setns": 308 if X86 else 268, "pidfd_send_signal": 424,
    "ptrace": 101 if X86 else 117,
}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, *a):
    r = libc.syscall(ctypes.c_long(NR[name]), *[x if isinstance(x, ctypes._SimpleCData) or isinstance(x, ctypes.Array) else ctypes.c_long(x) for x in a])
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def ck(r):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
def t(name, f):
    try:
        f()
        print(name, "ok", flush=True)
    except OSError as e:
        print(name, e.strerror or e, flush=True)
    except Exception as e:
        print(name, "error:", repr(e), flush=True)
def perf_attr():
    a = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(a, 0).value = 1  # PERF_TYPE_SOFTWARE
    ctypes.c_uint32.from_buffer(a, 4).value = 128
    ctypes.c_uint64.from_buffer(a, 8).value = 1  # PERF_COUNT_SW_TASK_CLOCK
    return a
"#;

// ---------------------------------------------------------------------------------------
// No terminal

/// The agent, loopflow's process tree and its terminal: TIOCSTI into every terminal it can
/// name, the foreground taken, the user's keystrokes read.
const TTY: &str = r#"
import fcntl, termios, glob
for fd in (0, 1, 2):
    t(f"sti-fd{fd}", lambda: fcntl.ioctl(fd, termios.TIOCSTI, b"X"))
    t(f"foreground-fd{fd}", lambda: os.tcsetpgrp(fd, os.getpgrp()))
def dev_tty():
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NONBLOCK)
    try:
        os.tcsetpgrp(fd, os.getpgrp())
    except OSError:
        pass
    fcntl.ioctl(fd, termios.TIOCSTI, b"Y")
t("sti-dev-tty", dev_tty)
def named():
    for p in sorted(set(glob.glob("/dev/pts/[0-9]*") + [open(sys.argv[1]).read().strip()])):
        fd = os.open(p, os.O_RDWR | os.O_NONBLOCK)
        fcntl.ioctl(fd, termios.TIOCSTI, b"Z")
        os.read(fd, 100)
t("sti-and-read-pts", named)
t("ttyname", lambda: os.ttyname(0))
"#;

/// A pty: (master, slave, the slave's path).
fn pty() -> (OwnedFd, OwnedFd, String) {
    let (mut m, mut s) = (0, 0);
    let mut name = [0 as libc::c_char; 128];
    // SAFETY: openpty writes two fds and the slave's name into our buffers.
    let r = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            name.as_mut_ptr(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty");
    // SAFETY: two fresh fds; the name is NUL-terminated.
    let (m, s) = unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
    let path = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    // Raw: what is typed is read back byte for byte, and nothing echoes.
    // SAFETY: tcgetattr/tcsetattr on our own terminal.
    unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        libc::tcgetattr(s.as_raw_fd(), &mut t);
        libc::cfmakeraw(&mut t);
        libc::tcsetattr(s.as_raw_fd(), libc::TCSANOW, &t);
    }
    (m, s, path)
}

/// Runs `c` as a session leader whose controlling terminal (and stdin, stdout, stderr) is
/// a fresh pty, after `typed` was typed on it. Returns its exit code, everything it wrote
/// to the terminal, what is left unread of the typed input, the terminal's foreground
/// process groups seen while it ran (its own unless someone took the foreground), and
/// its pid.
fn on_terminal(mut c: Command, typed: &[u8]) -> (i32, Vec<u8>, Vec<u8>, Vec<i32>, i32) {
    use std::os::unix::process::CommandExt;
    let (master, slave, _) = pty();
    // SAFETY: writes `typed` to the master: the user's keystrokes, queued for the slave.
    unsafe { libc::write(master.as_raw_fd(), typed.as_ptr().cast(), typed.len()) };
    let s = slave.as_raw_fd();
    // SAFETY: in the child before exec: setsid, take the pty, point 0–2 at it (syscalls).
    unsafe {
        c.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(s, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for fd in 0..3 {
                libc::dup2(s, fd);
            }
            Ok(())
        });
    }
    let mut child = c.spawn().expect("spawn on a terminal");
    let pid = child.id() as i32;
    // SAFETY: the master is ours; non-blocking so the reader can look at the clock.
    unsafe { libc::fcntl(master.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let start = Instant::now();
    let drain = |out: &mut Vec<u8>, buf: &mut [u8]| loop {
        // SAFETY: reads into our buffer.
        let n = unsafe { libc::read(master.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        out.extend_from_slice(&buf[..n as usize]);
    };
    let mut fgs = Vec::new();
    let status = loop {
        drain(&mut out, &mut buf);
        let mut fg: libc::pid_t = 0;
        // SAFETY: TIOCGPGRP on the master writes the slave's foreground group.
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPGRP, &mut fg) };
        if fg > 0 && !fgs.contains(&fg) {
            fgs.push(fg);
        }
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            panic!(
                "loopflow on a terminal did not end (foreground groups seen: {fgs:?}, its own {pid}): {:?}",
                String::from_utf8_lossy(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drain(&mut out, &mut buf);
    // SAFETY: non-blocking read of what is left of the typed input, on our slave fd.
    unsafe { libc::fcntl(s, libc::F_SETFL, libc::O_NONBLOCK) };
    let mut left = Vec::new();
    loop {
        // SAFETY: reads into our buffer.
        let n = unsafe { libc::read(s, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        left.extend_from_slice(&buf[..n as usize]);
    }
    (status.code().unwrap_or(-1), out, left, fgs, pid)
}

#[test]
fn an_agent_has_no_terminal_and_what_it_prints_reaches_the_terminal_escaped() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        // The agent learns the terminal's name (it could guess it) and prints escape
        // sequences: OSC 52 (the clipboard), OSC 8 (a link), OSC 0 (the title), CSI.
        let escapes = r"printf '\033]52;c;cHduZWQ=\007\033]8;;http://evil.example\007link\033]8;;\007\033]0;owned\007\033[2J\233H'";
        let p = hostile(
            user,
            &format!("{PY} $T/attack.py $T/tty-name > loot/tty 2>&1\n{escapes}\n{escapes} >&2"),
            "",
            &[("attack.py", &format!("{PRELUDE}{TTY}"))],
        );
        let mut c = p.lf_cmd(&["run", "--loop", "l"]);
        c.env("HOME", p.join("home"));
        let c = as_user(user, c);
        // The terminal is made by on_terminal: a shell in front of loopflow writes its
        // name where the agent looks for it, then becomes loopflow.
        let mut wrapped = Command::new("sh");
        wrapped
            .arg("-c")
            .arg(format!(
                "readlink /proc/$$/fd/0 > {f}; chmod 644 {f}; exec \"$@\"",
                f = p.join("tools/tty-name").display()
            ))
            .arg("sh")
            .arg(c.get_program())
            .args(c.get_args());
        if let Some(d) = c.get_current_dir() {
            wrapped.current_dir(d);
        }
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        let typed = b"the user types a secret\n";
        let (code, out, left, fgs, pid) = on_terminal(wrapped, typed);
        assert_eq!(code, 0, "{who}: {}", String::from_utf8_lossy(&out));
        let tty = loot(&p, "tty");
        assert!(
            tty.contains("sti-fd0"),
            "{who}: the attack did not run: {tty}"
        );
        assert_eq!(breaches(&tty), Vec::<String>::new(), "{who}: {tty}");
        assert_eq!(
            left, typed,
            "{who}: the user's keystrokes were read or something was typed into the terminal"
        );
        assert_eq!(fgs, [pid], "{who}: the foreground was taken");
        assert!(
            !out.contains(&0x1b) && !out.windows(2).any(|w| w == [0xc2, 0x9b]),
            "{who}: an escape sequence reached the terminal: {:?}",
            String::from_utf8_lossy(&out)
        );
        // What loopflow shows of the agent's output later is escaped too.
        let mut c = p.lf_cmd(&["log", "--loop", "l"]);
        c.env("HOME", p.join("home"));
        let r = bounded(as_user(user, c), &who);
        assert!(!r.stdout.contains('\u{1b}'), "{who}: {:?}", r.stdout);
    }
}

// ---------------------------------------------------------------------------------------
// No privilege

const PRIV: &str = r#"
import socket
t("chown", lambda: os.chown("loot", 12345, 12345))
name = socket.gethostname().encode()
t("sethostname-same", lambda: ck(libc.sethostname(name, len(name))))
cad = open("/proc/sys/kernel/ctrl-alt-del").read().strip()
how = ctypes.c_int(0x89ABCDEF - (1 << 32)) if cad == "1" else ctypes.c_int(0)
t("reboot-same-cad", lambda: ck(libc.reboot(how)))
t("perf-on-loopflow", lambda: sc("perf_event_open", perf_attr(), int(sys.argv[1]), -1, -1, 0))
t("userfaultfd", lambda: sc("userfaultfd", 0))
t("io_uring", lambda: sc("io_uring_setup", 1, (ctypes.c_uint8 * 120)()))
def bpf():
    a = (ctypes.c_uint32 * 32)()
    a[0], a[1], a[2], a[3] = 2, 4, 4, 1  # BPF_MAP_TYPE_ARRAY, key, value, entries
    sc("bpf", 0, a, 128)
t("bpf-map", bpf)
def klog():
    buf = ctypes.create_string_buffer(4096)
    ck(libc.klogctl(3, buf, 4096))
t("syslog", klog)
def mount():
    os.makedirs("loot/mnt", exist_ok=True)
    ck(libc.mount(b"none", b"loot/mnt", b"tmpfs", 0, None))
    libc.umount2(b"loot/mnt", 2)  # it worked: undo it (MNT_DETACH)
t("mount", mount)
t("unshare-net", lambda: sc("unshare", 0x40000000))
t("unshare-user", lambda: sc("unshare", 0x10000000))
t("setuid", lambda: os.setuid(12345))
"#;

#[test]
fn an_agent_has_no_privilege_even_as_root() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        // The shell reads its own status (the only /proc/<pid> it may read): its
        // capability sets; then the attacks, and a route change with `ip`.
        let body = format!(
            r#"while read l; do case "$l" in Cap*|NoNewPrivs*|Seccomp:*) echo "$l" >> loot/status;; esac; done < /proc/$$/status
{PY} $T/attack.py $PPID > loot/priv 2>&1
mtu=$(cat /sys/class/net/lo/mtu)
ip link set lo mtu "$mtu" > loot/ip 2>&1 && echo "ip-link ok" >> loot/priv"#
        );
        let p = hostile(
            user,
            &body,
            "",
            &[("attack.py", &format!("{PRELUDE}{PRIV}"))],
        );
        let r = tick(&p, user, &[]);
        assert_ticked(&p, &r, &who);
        let status = loot(&p, "status");
        for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
            assert!(
                status.contains(&format!("{set}:\t0000000000000000")),
                "{who}: {set} not empty:\n{status}"
            );
        }
        if user.is_none() && unsafe { libc::geteuid() } == 0 {
            // Root's bounding set is emptied too: nothing to regain at an exec.
            assert!(
                status.contains("CapBnd:\t0000000000000000"),
                "{who}: bounding set:\n{status}"
            );
        }
        assert!(status.contains("NoNewPrivs:\t1"), "{who}: {status}");
        let priv_ = loot(&p, "priv");
        assert!(
            priv_.contains("setuid"),
            "{who}: the attack did not run: {priv_}"
        );
        assert_eq!(breaches(&priv_), Vec::<String>::new(), "{who}:\n{priv_}");
    }
}

// ---------------------------------------------------------------------------------------
// Other processes, by other means than signals; kernel objects the user's processes share

/// A process of the user's own (as whoever runs loopflow) that holds what the user's
/// processes share: a key in the user's keyring, a SysV shared memory segment, a file in
/// `/dev/shm`; it writes `pid keyid shmid` to `argv[1]` when ready and cleans up on TERM.
const HOLDER: &str = r#"
import signal, time
kid = sc("add_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(b"loopflow-test-secret"), ctypes.c_char_p(b"SECRET-KEYRING"), 14, -4)
libc.shmget.restype = ctypes.c_int
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0x4c465431 + os.getpid(), 4096, 0o1600)
addr = libc.shmat(shmid, None, 0)
ctypes.memmove(addr, b"SECRET-SYSV\0", 12)
shm = f"/dev/shm/loopflow-test-{os.getpid()}"
open(shm, "w").write("SECRET-DEVSHM")
def bye(*_):
    sc("keyctl", 21, kid)  # KEYCTL_INVALIDATE
    libc.shmctl(shmid, 0, None)  # IPC_RMID
    os.unlink(shm)
    os._exit(0)
signal.signal(signal.SIGTERM, bye)
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {kid} {shmid} {0x4c465431 + os.getpid()}\n")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(1)
"#;

/// The holder of [`HOLDER`], run as `user`; killed (TERM: it cleans up) when dropped.
struct Holder {
    child: std::process::Child,
    pid: i32,
    shm_key: String,
}

impl Holder {
    fn start(p: &Project, user: Option<&User>) -> Holder {
        let script = p.write("holder.py", &format!("{PRELUDE}{HOLDER}"));
        let ready = p.join("holder.ready");
        if let Some(u) = user {
            u.own_project(p);
        }
        let mut c = Command::new(PY);
        c.arg(&script).arg(&ready).current_dir(p.path());
        let child = as_user(user, c)
            .stdin(Stdio::null())
            .spawn()
            .expect("holder");
        crate::support::wait_for_file(&ready);
        let text = std::fs::read_to_string(&ready).expect("holder ready");
        let f: Vec<&str> = text.split_whitespace().collect();
        Holder {
            child,
            pid: f[0].parse().expect("pid"),
            shm_key: f[3].to_string(),
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // SAFETY: TERM to our own helper, which cleans up and exits.
        unsafe { libc::kill(self.pid, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// One process's limits, nice value, CPUs and I/O class, as `/proc` and `ionice` say.
fn standing(pid: i32) -> String {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let nice = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().nth(16).map(str::to_string))
        .unwrap_or_default();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let cpus = status
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap_or_default()
        .to_string();
    let io = Command::new("ionice")
        .args(["-p", &pid.to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    format!("{limits}\nnice {nice}\n{cpus}\n{io}")
}

const PROCS: &str = r#"
import resource
for who, pid in (("loopflow", int(sys.argv[1])), ("user", int(sys.argv[2]))):
    t(f"{who}.prlimit-fsize", lambda: resource.prlimit(pid, resource.RLIMIT_FSIZE, (1, 1)))
    t(f"{who}.prlimit-nofile", lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (3, 3)))
    t(f"{who}.setpriority", lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    t(f"{who}.affinity", lambda: os.sched_setaffinity(pid, {0}))
    t(f"{who}.ioprio", lambda: sc("ioprio_set", 1, pid, 3 << 13))
    t(f"{who}.sched", lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)))
    def vm():
        buf = ctypes.create_string_buffer(64)
        local = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 64)
        remote = (ctypes.c_void_p * 2)(0x10000, 64)
        sc("process_vm_readv", pid, local, 1, remote, 1, 0)
    t(f"{who}.process_vm_readv", vm)
    t(f"{who}.kcmp", lambda: sc("kcmp", pid, os.getpid(), 0, 0, 0))
    def getfd():
        pfd = sc("pidfd_open", pid, 0)
        sc("pidfd_getfd", pfd, 0, 0)
    t(f"{who}.pidfd_getfd", getfd)
    t(f"{who}.perf_event_open", lambda: sc("perf_event_open", perf_attr(), pid, -1, -1, 0))
    # Signals are Landlock's to scope: signal 0 asks whether one would be delivered.
    t(f"{who}.kill-0", lambda: os.kill(pid, 0))
    t(f"{who}.pidfd_send_signal-0", lambda: sc("pidfd_send_signal", sc("pidfd_open", pid, 0), 0, 0, 0))
    # PTRACE_SEIZE does not stop the process; this one exits (and detaches) at once.
    t(f"{who}.ptrace-seize", lambda: sc("ptrace", 0x4206, pid, 0, 0))
"#;

#[test]
fn an_agent_reaches_no_other_process_through_limits_priorities_or_memory() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        let p = hostile(
            user,
            &format!(
                "{PY} $T/attack.py $PPID \"$(cat $T/victim.pid)\" > loot/procs 2>&1\nprlimit --pid $PPID --fsize=1 >> loot/procs 2>&1 && echo 'prlimit-cmd ok' >> loot/procs"
            ),
            "",
            &[("attack.py", &format!("{PRELUDE}{PROCS}"))],
        );
        // A process of the user's own, beside loopflow.
        let holder = Holder::start(&p, user);
        p.write("tools/victim.pid", &holder.pid.to_string());
        if let Some(u) = user {
            u.own(&p.join("tools"));
        }
        let before = standing(holder.pid);
        let r = tick(&p, user, &[]);
        // prlimit(loopflow, RLIMIT_FSIZE=1) would have killed it at its next write.
        assert_ticked(&p, &r, &who);
        let procs = loot(&p, "procs");
        assert!(
            procs.contains("user.kcmp"),
            "{who}: the attack did not run: {procs}"
        );
        assert_eq!(breaches(&procs), Vec::<String>::new(), "{who}:\n{procs}");
        assert_eq!(
            standing(holder.pid),
            before,
            "{who}: the user's process changed"
        );
    }
}

const SHARED: &str = r#"
def keyring():
    kid = sc("keyctl", 10, -4, ctypes.c_char_p(b"user"), ctypes.c_char_p(b"loopflow-test-secret"), 0)
    buf = ctypes.create_string_buffer(256)
    n = sc("keyctl", 11, kid, buf, 256)
    print("key:", buf.raw[:n])
t("keyring-search-read", keyring)
t("request_key", lambda: print("key:", sc("request_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(b"loopflow-test-secret"), 0, -4)))
def sysv():
    libc.shmget.restype = ctypes.c_int
    libc.shmat.restype = ctypes.c_void_p
    i = libc.shmget(int(sys.argv[1]), 0, 0)
    if i < 0:
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    a = libc.shmat(i, None, 0o10000)  # SHM_RDONLY
    if a in (None, ctypes.c_void_p(-1).value):
        e = ctypes.get_errno(); raise OSError(e, os.strerror(e))
    print("sysv:", ctypes.string_at(a, 16))
t("sysv-shm", sysv)
def devshm():
    for f in os.listdir("/dev/shm"):
        print("devshm:", open("/dev/shm/" + f).read())
t("dev-shm", devshm)
t("proc-keys", lambda: print(open("/proc/keys").read()))
"#;

#[test]
fn an_agent_reaches_no_kernel_object_the_users_processes_share() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        let p = hostile(
            user,
            &format!("{PY} $T/attack.py \"$(cat $T/shm.key)\" > loot/shared 2>&1"),
            "",
            &[("attack.py", &format!("{PRELUDE}{SHARED}"))],
        );
        let holder = Holder::start(&p, user);
        p.write("tools/shm.key", &holder.shm_key);
        if let Some(u) = user {
            u.own(&p.join("tools"));
        }
        let r = tick(&p, user, &[]);
        assert_ticked(&p, &r, &who);
        let shared = loot(&p, "shared");
        assert!(
            shared.contains("sysv-shm"),
            "{who}: the attack did not run: {shared}"
        );
        assert!(
            !shared.contains("SECRET"),
            "{who}: a shared object was read:\n{shared}"
        );
        assert_eq!(breaches(&shared), Vec::<String>::new(), "{who}:\n{shared}");
    }
}

// ---------------------------------------------------------------------------------------
// Nothing inherited

#[test]
fn an_agent_inherits_no_descriptor_loopflow_was_started_with() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        // Reads every descriptor from 3 to 9 and writes into each (a pipe a scheduler
        // left open, a secret file), and leaves a process behind that would hold them.
        let body = format!(
            r#"for fd in 3 4 5 6 7 8 9; do
  (cat <&$fd) >> loot/fds 2>/dev/null
  (echo "written by the agent" >&$fd) 2>/dev/null && echo "wrote $fd" >> loot/fds
done
setsid {PY} -c 'import time; time.sleep(600)' holds-the-pipe </dev/null >/dev/null 2>&1 &
true"#
        );
        let p = hostile(user, &body, "", &[]);
        let secret = p.write("secret.txt", "SECRET-INHERITED\n");
        let f = std::fs::File::open(&secret).expect("secret");
        let (rx, tx) = {
            let mut fds = [0; 2];
            // SAFETY: pipe2 writes two fds.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: fresh fds of ours.
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        let (sf, tf) = (f.as_raw_fd(), tx.as_raw_fd());
        let mut c = p.lf_cmd(&["run", "--loop", "l", "--json"]);
        c.env("HOME", p.join("home"));
        let mut c = as_user(user, c);
        use std::os::unix::process::CommandExt;
        // SAFETY: in the child before exec: dup2 (which leaves the copies inheritable).
        unsafe {
            c.pre_exec(move || {
                libc::dup2(sf, 7);
                libc::dup2(tf, 9);
                Ok(())
            });
        }
        let r = bounded(c, &who);
        drop(tx);
        assert_ticked(&p, &r, &who);
        let fds = loot(&p, "fds");
        assert!(
            !fds.contains("SECRET"),
            "{who}: an inherited file was read: {fds}"
        );
        assert!(!fds.contains("wrote"), "{who}: {fds}");
        // Nobody holds the pipe: it ends (within a bound, not a timing), empty.
        let mut pfd = libc::pollfd {
            fd: rx.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, 30_000) };
        assert_eq!(ready, 1, "{who}: something still holds the pipe open");
        let mut got = Vec::new();
        std::fs::File::from(rx).read_to_end(&mut got).expect("pipe");
        assert!(got.is_empty(), "{who}: {:?}", String::from_utf8_lossy(&got));
    }
}

// ---------------------------------------------------------------------------------------
// Reads are the toolchains' own parts

#[test]
fn an_agent_reads_no_secret_beside_its_toolchains() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        let p = Project::git();
        let h = p.join("home");
        let secrets = [
            ".cargo/credentials.toml",
            ".cargo/credentials",
            ".cargo/config.toml",
            ".local/share/keyrings/login.keyring",
            ".pulumi/credentials.json",
            ".fly/config.yml",
            ".config/git/credentials",
            ".git-credentials",
            ".venv/secret.txt",
        ];
        for s in secrets {
            p.write(&format!("home/{s}"), &format!("SECRET {s}\n"));
        }
        p.write("home/.config/git/config", "[user]\n\tname = agent\n");
        for (bin, out) in [
            (".cargo/bin/cargo-tool", "cargo-tool-ok"),
            (".fly/bin/flyctl", "fly-ok"),
            (".local/bin/tool", "local-tool-ok"),
        ] {
            p.script(&format!("home/{bin}"), &format!("echo {out}"));
        }
        // A virtualenv on PATH: its python finds its own packages beside `bin`.
        p.write(
            "home/.venv/pyvenv.cfg",
            "home = /usr/bin\ninclude-system-site-packages = false\n",
        );
        let pyver = Command::new(PY)
            .args([
                "-c",
                "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .expect("python version");
        p.write(
            &format!("home/.venv/lib/{pyver}/site-packages/venvmod.py"),
            "print('venv-ok')\n",
        );
        std::fs::create_dir_all(h.join(".venv/bin")).expect("venv");
        std::os::unix::fs::symlink(PY, h.join(".venv/bin/python")).expect("venv python");
        let mut body = String::new();
        for s in secrets {
            body.push_str(&format!("cat \"$HOME/{s}\" >> loot/secrets 2>/dev/null\n"));
        }
        body.push_str(
            r#"ls -a "$HOME/.fly" "$HOME/.local" "$HOME/.cargo" "$HOME/.venv" "$HOME/.config/git" >> loot/listed 2>/dev/null
ls -a /dev/pts /dev/shm /dev/mqueue >> loot/listed 2>/dev/null
cargo-tool >> loot/works; flyctl >> loot/works; tool >> loot/works
python -c 'import venvmod' >> loot/works 2>&1
git status --porcelain > /dev/null 2>loot/git && echo git-ok >> loot/works
node -e 'console.log("node-ok")' >> loot/works 2>&1
/usr/bin/python3 -c 'print("py-ok")' >> loot/works 2>&1"#,
        );
        let agent = p.script(
            "agent.sh",
            &format!(
                "case \"$1\" in\n  implement) mkdir -p loot\n{body}\n  ;;\n  verify) echo '{HALF}' ;;\n  *) echo ok ;;\nesac\nexit 0"
            ),
        );
        p.with_loop(
            "l",
            &LoopToml::new()
                .without("worktree")
                .table("sandbox", "mode = \"enforce\"")
                .harness_command(&agent, &["{{role}}"]),
        );
        if let Some(u) = user {
            u.own_project(&p);
        }
        let path = format!(
            "{h}/.cargo/bin:{h}/.fly/bin:{h}/.local/bin:{h}/.venv/bin:/usr/local/bin:/usr/bin:/bin",
            h = h.display()
        );
        let mut c = p.lf_cmd(&["run", "--loop", "l", "--json"]);
        c.env("HOME", &h).env("XDG_CONFIG_HOME", h.join(".config"));
        let mut c = as_user(user, c);
        c.env("PATH", &path);
        let r = bounded(c, &who);
        assert_ticked(&p, &r, &who);
        let got = loot(&p, "secrets");
        assert!(!got.contains("SECRET"), "{who}: secrets were read:\n{got}");
        let listed = loot(&p, "listed");
        for never in ["config.yml", "share", "credentials", "secret.txt", "ptmx"] {
            assert!(!listed.contains(never), "{who}: {never} listed:\n{listed}");
        }
        let works = loot(&p, "works");
        for w in [
            "cargo-tool-ok",
            "fly-ok",
            "local-tool-ok",
            "venv-ok",
            "git-ok",
            "node-ok",
            "py-ok",
        ] {
            assert!(
                works.contains(w),
                "{who}: {w} missing:\n{works}\n{}",
                loot(&p, "git")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Nothing outlives or stalls the tick

/// Processes whose command line holds `mark`, alive (not zombies).
fn marked(mark: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
            .unwrap_or(true);
        if !zombie && String::from_utf8_lossy(&cmd).contains(mark) {
            out.push(pid);
        }
    }
    out
}

/// Kills what a failed test left (so one failure does not leave a storm behind).
struct Sweep(String);

impl Drop for Sweep {
    fn drop(&mut self) {
        for _ in 0..50 {
            let left = marked(&self.0);
            if left.is_empty() {
                return;
            }
            for pid in left {
                // SAFETY: kill only sends a signal to a process this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A stopped child, a traced one, a fork storm, a process that leaves the session with
/// a cleared environment and one that ignores TERM: each started by the agent and left
/// behind, in `mode`.
fn leftovers(mark: &str, approve: &str) -> String {
    let sleep = format!("{PY} -c \"import time; time.sleep(600)\" {mark}");
    format!(
        r#"sh -c 'kill -STOP $$; {sleep}' {mark}-stopped </dev/null >/dev/null 2>&1 &
{PY} -c '
import os, signal, time, ctypes
if os.fork() == 0:
    ctypes.CDLL(None).ptrace(0, 0, 0, 0)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(600)
os.setsid()
time.sleep(600)' {mark}-traced </dev/null >/dev/null 2>&1 &
setsid {PY} -c '
import os
while True:
    try:
        if os.fork():
            os._exit(0)
    except OSError:
        pass' {mark}-storm </dev/null >/dev/null 2>&1 &
setsid env -i /bin/sh -c 'trap "" TERM HUP; sleep 3; {approve}; {sleep}' {mark}-cleared </dev/null >/dev/null 2>&1 &
sh -c 'trap "" TERM; {sleep}' {mark}-ignores-term </dev/null >/dev/null 2>&1 &
sleep 1
true"#
    )
}

#[test]
fn nothing_a_tick_started_outlives_or_stalls_it() {
    if !ready() {
        return;
    }
    for mode in ["enforce", "off"] {
        for user in runners() {
            let user = user.as_ref();
            let who = format!("{} in mode {mode}", who(user));
            let mark = format!("leftover{}x{}", std::process::id(), mode.len());
            let _sweep = Sweep(mark.clone());
            let lf = crate::support::bin().display().to_string();
            let p = Project::git();
            let approve = format!(
                "{lf} approve --loop l --by agent --extend 100 --project {}",
                p.path().display()
            );
            let body = leftovers(&mark, &approve);
            let agent = p.script(
                "agent.sh",
                &format!(
                    "case \"$1\" in\n  implement)\n{body}\n  ;;\n  verify) echo '{HALF}' ;;\n  *) echo ok ;;\nesac\nexit 0"
                ),
            );
            p.with_loop(
                "l",
                &LoopToml::new()
                    .without("worktree")
                    .table("sandbox", &format!("mode = \"{mode}\""))
                    .harness_command(&agent, &["{{role}}"]),
            );
            std::fs::create_dir_all(p.join("home")).expect("home");
            if let Some(u) = user {
                u.own_project(&p);
            }
            let r = tick(&p, user, &[]);
            assert_ticked(&p, &r, &who);
            let halt = {
                let mut c = p.lf_cmd(&["halt", "--loop", "l", "--reason", "a human looks"]);
                c.env("HOME", p.join("home"));
                bounded(as_user(user, c), &who)
            };
            assert_eq!(halt.code, 0, "{who}: {halt:?}");
            assert_eq!(
                marked(&mark),
                Vec::<i32>::new(),
                "{who}: processes outlived the tick"
            );
            // Past the moment the leftovers would have tried to approve the halt.
            std::thread::sleep(Duration::from_secs(4));
            assert!(
                !p.events("l").iter().any(|e| e.starts_with("APPROVE")),
                "{who}: {:?}",
                p.events("l")
            );
            assert!(
                !p.state("l")["halt"].is_null(),
                "{who}: the halt was lifted"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// A node reads only its own output

#[test]
fn a_node_never_reads_an_output_another_process_planted() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        let p = Project::git();
        // The implementer plants the verifier's {{output}} (usage that would spend the
        // budget) and leaves a process that rewrites its own once it is copied; the
        // verifier rewrites the implementer's after it ended.
        let agent = p.script(
            "agent.sh",
            &format!(
                r#"out="$2"
case "$1" in
  implement)
    echo '{{"cost_usd": 1}}' > "$out"
    echo '{{"cost_usd": 500, "tokens": 900000}}' > "$(dirname "$out")/1-verify.json"
    ;;
  verify)
    echo '{{"cost_usd": 700}}' > "$(dirname "$out")/1-implement.json"
    echo '{HALF}' ;;
  *) echo ok ;;
esac
exit 0"#
            ),
        );
        p.with_loop(
            "l",
            &LoopToml::new()
                .without("worktree")
                .table("sandbox", "mode = \"enforce\"")
                .harness_command(&agent, &["{{role}}", "{{output}}"]),
        );
        std::fs::create_dir_all(p.join("home")).expect("home");
        if let Some(u) = user {
            u.own_project(&p);
        }
        let r = tick(&p, user, &[]);
        assert_ticked(&p, &r, &who);
        // Only what the implementer wrote into its own output counts.
        let spent = &p.state("l")["spent"];
        assert_eq!(spent["usd"], 1.0, "{who}: {spent}");
        assert_eq!(spent["tokens"], 0, "{who}: {spent}");
        assert_eq!(
            p.output("l", "1-implement.json").trim(),
            r#"{"cost_usd": 1}"#,
            "{who}"
        );
        assert!(
            !p.loop_dir("l").join("outputs/1-verify.json").exists(),
            "{who}: the planted verify output was kept"
        );
        // The branch has no trace of it either.
        let tree = git_any(p.path(), &["ls-tree", "-r", "--name-only", "loopflow/l"]);
        assert!(!tree.unwrap_or_default().contains(".loopflow-out"), "{who}");
    }
}

// ---------------------------------------------------------------------------------------
// One proxy per tick, each refusal its node's

#[test]
fn one_proxy_serves_the_tick_and_each_refusal_is_its_nodes() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        let p = Project::git();
        // Each role asks the tick's proxy for a host nobody allows, its own; the
        // implementer also records the proxy it was given.
        let agent = p.script(
            "agent.sh",
            &format!(
                r#"ask() {{ {PY} -c 'import os, socket, sys
h, p = os.environ["HTTPS_PROXY"].split("//")[1].rsplit(":", 1)
s = socket.create_connection((h, int(p)), 5)
s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode())
print(s.recv(100).decode().split("\r\n")[0])' "$1"; }}
case "$1" in
  implement) ask implement.invalid > /dev/null; echo "$HTTPS_PROXY" > proxy-seen ;;
  verify) ask verify.invalid > /dev/null
    # What a verifier changes is put back after it: it says what it saw in its verdict.
    same=different; [ "$(cat proxy-seen)" = "$HTTPS_PROXY" ] && same=same
    echo '{{"pass": false, "score": 0.5, "next_hint": "'$same'"}}' ;;
  *) ask orchestrate.invalid > /dev/null; echo ok ;;
esac
exit 0"#
            ),
        );
        p.with_loop(
            "l",
            &LoopToml::new()
                .without("worktree")
                .table("sandbox", "mode = \"enforce\"")
                .harness_command(&agent, &["{{role}}"]),
        );
        std::fs::create_dir_all(p.join("home")).expect("home");
        if let Some(u) = user {
            u.own_project(&p);
        }
        let r = tick(&p, user, &[]);
        assert_ticked(&p, &r, &who);
        let state = p.state("l");
        assert_eq!(
            state["last_verdict"]["next_hint"], "same",
            "{who}: a proxy per spawn: {state}"
        );
        let log = p.events("l");
        for node in ["implement", "verify", "orchestrate"] {
            for host in ["implement", "verify", "orchestrate"] {
                let line = format!("WARN node={node} msg=\"network refused: {host}.invalid:443\"");
                let n = log.iter().filter(|l| **l == line).count();
                assert_eq!(n, usize::from(node == host), "{who}: {line}\n{log:#?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// What works inside

#[test]
fn cargo_python_and_node_still_work_inside() {
    if !ready() {
        return;
    }
    for user in runners() {
        let user = user.as_ref();
        let who = who(user);
        // Root's toolchain lives in root's home: only root builds with cargo here.
        let cargo = if user.is_none() {
            r#"cargo init --vcs none --name probe crate > /dev/null 2>&1
(cd crate && cargo build --offline > ../loot/cargo 2>&1 && cargo test --offline >> ../loot/cargo 2>&1) && echo cargo-ok >> loot/works"#
        } else {
            ""
        };
        let body = format!(
            r#"{cargo}
{PY} -c 'import subprocess, threading, concurrent.futures as f, os, tempfile
t = tempfile.NamedTemporaryFile(dir=os.environ["TMPDIR"]); t.write(b"x"); t.flush()
assert subprocess.run(["true"]).returncode == 0
assert list(f.ThreadPoolExecutor(2).map(abs, [-1, -2])) == [1, 2]
print("py-ok")' >> loot/works 2>loot/py
node -e 'const {{ Worker }} = require("worker_threads");
const cp = require("child_process");
if (cp.execSync("echo hi").toString().trim() !== "hi") process.exit(1);
new Worker("require(\"worker_threads\").parentPort.postMessage(1)", {{ eval: true }})
  .on("message", () => console.log("node-ok"));' >> loot/works 2>loot/node"#
        );
        let p = hostile(user, &body, "", &[]);
        // HOME is the project's: the toolchain keeps its own.
        let real = std::env::var("HOME").unwrap_or_default();
        let rustup = std::env::var("RUSTUP_HOME").unwrap_or(format!("{real}/.rustup"));
        let cargo_home = std::env::var("CARGO_HOME").unwrap_or(format!("{real}/.cargo"));
        let env: &[(&str, &str)] = match user {
            None => &[("RUSTUP_HOME", &rustup), ("CARGO_HOME", &cargo_home)],
            Some(_) => &[],
        };
        let r = tick(&p, user, env);
        assert_ticked(&p, &r, &who);
        let works = loot(&p, "works");
        let mut want = vec!["py-ok", "node-ok"];
        if user.is_none() {
            want.push("cargo-ok");
        }
        for w in want {
            assert!(
                works.contains(w),
                "{who}: {w} missing:\n{works}\n{}{}{}",
                loot(&p, "cargo"),
                loot(&p, "py"),
                loot(&p, "node")
            );
        }
    }
}
