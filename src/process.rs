//! Running child processes: argv only (never a shell), each in its own process group,
//! output to files, optionally confined by the sandbox, and on timeout, silence or
//! interruption TERM to the whole group, a grace period, then KILL, so no grandchild
//! outlives its node. Processes that escape their group (`setsid`, double forks) are
//! caught too: loopflow is their subreaper, and what is left when a node or a tick ends
//! is killed ([`reap_leftovers`]); a tick that was itself killed leaves a mark the next
//! one finds ([`kill_loop_processes`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use crate::reason::Failure;
use crate::sandbox::Prepared;

/// How long a group gets between TERM and KILL.
pub const GRACE: Duration = Duration::from_secs(5);

/// How often a running child is looked at (deadline, silence, interrupt, the tick's own
/// watch). An exit is noticed at once; everything else within this.
const POLL: Duration = Duration::from_millis(100);

pub struct Spawn<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    /// What the child inherits of loopflow's environment: `None`, everything (the
    /// user's own notifier); else exactly these (DESIGN §12: the tick's processes).
    pub base_env: Option<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
    /// Set on top (`PWD`, `TMPDIR`, `LOOPFLOW_*`, the proxy, a preset's settings).
    pub env: Vec<(String, String)>,
    /// A file fed on stdin (the prompt, for agents that read it there); else /dev/null.
    pub stdin: Option<&'a Path>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub timeout: Option<Duration>,
    /// Stop the child when it writes nothing to stdout or stderr for this long.
    pub idle: Option<Duration>,
    pub cancel: &'a AtomicBool,
    /// Confinement, when the tick has one.
    pub sandbox: Option<&'a Prepared>,
    /// Told the child's process group as soon as it exists (the tick records it).
    pub on_spawn: Option<&'a (dyn Fn(u32) + Sync)>,
    /// Called at every poll while the child runs (the tick watches its state file).
    pub on_poll: Option<&'a (dyn Fn() + Sync)>,
    /// Where the connections the sandbox refused are told (`host:port`), at the end.
    pub refused: Option<&'a std::sync::Mutex<Vec<String>>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    TimedOut,
    /// Silent (no output) for this long.
    Idle(Duration),
    Interrupted,
    /// The program could not be started (not found, not executable).
    SpawnFailed(String),
}

impl Exit {
    /// The failure this exit is, for a node (`exit:1`, `signal:9`, `timeout`, …).
    pub fn failure(&self) -> Failure {
        match self {
            Exit::Code(c) => Failure::Exit(*c),
            Exit::Signal(s) => Failure::Signal(*s),
            Exit::TimedOut => Failure::Timeout,
            Exit::Idle(d) => Failure::Idle(crate::duration::human(*d)),
            Exit::Interrupted => Failure::Interrupted,
            Exit::SpawnFailed(e) => Failure::Spawn(e.clone()),
        }
    }

    pub fn code(&self) -> Option<i32> {
        match self {
            Exit::Code(c) => Some(*c),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct Finished {
    pub exit: Exit,
    pub elapsed: Duration,
}

/// How many processes [`run`] started in this process so far.
static SPAWNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many processes [`run`] has started (or tried to) in this process: what an agent
/// can change on disk can only have changed when this did.
pub fn spawn_count() -> u64 {
    SPAWNS.load(Ordering::SeqCst)
}

/// The pids of children a `run` is waiting for: never reaped or killed as leftovers.
fn tracked() -> &'static Mutex<HashSet<u32>> {
    static TRACKED: std::sync::OnceLock<Mutex<HashSet<u32>>> = std::sync::OnceLock::new();
    TRACKED.get_or_init(Default::default)
}

#[cfg(unix)]
fn signal_group(pgid: u32, sig: i32) {
    // SAFETY: killpg only sends a signal; a stale pgid yields ESRCH, which we ignore.
    unsafe {
        libc::killpg(pgid as libc::pid_t, sig);
    }
}

#[cfg(unix)]
fn group_alive(pgid: u32) -> bool {
    // SAFETY: signal 0 checks for existence only.
    unsafe { libc::killpg(pgid as libc::pid_t, 0) == 0 }
}

/// TERM the group, wait up to the grace period for it to empty, then KILL. The waiter
/// thread reaps the group leader as soon as it exits, so a group that obeys TERM is seen
/// empty at once (an unreaped zombie would keep it "alive" for the whole grace period).
#[cfg(unix)]
fn stop_group(pgid: u32) {
    signal_group(pgid, libc::SIGTERM);
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        // Members that exited were reparented here (the subreaper): collected, or their
        // zombies would keep the group "alive" for the whole grace period.
        collect_zombies();
        if !group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(pgid, libc::SIGKILL);
    // KILL cannot be ignored, but dying takes a moment: wait (briefly) until the members
    // are gone, so they are not counted again as leftovers of the node.
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        collect_zombies();
        if !group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Bytes written so far to the child's output files (for the idle timeout).
fn output_len(a: &Path, b: &Path) -> u64 {
    let len = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    len(a) + len(b)
}

pub fn run(spec: &Spawn<'_>) -> Finished {
    SPAWNS.fetch_add(1, Ordering::SeqCst);
    let start = Instant::now();
    let failed = |why: String| Finished {
        exit: Exit::SpawnFailed(why),
        elapsed: start.elapsed(),
    };
    let Some((program, args)) = spec.argv.split_first() else {
        return failed("empty argv".into());
    };
    // Created afresh, never through a symlink or hard link an earlier agent planted.
    let files = crate::fs_safe::create_owned(&spec.stdout)
        .and_then(|o| Ok((o, crate::fs_safe::create_owned(&spec.stderr)?)));
    let (out, err) = match files {
        Ok(f) => f,
        Err(e) => return failed(format!("output files: {e}")),
    };
    let stdin = match spec.stdin {
        None => Stdio::null(),
        Some(p) => match crate::fs_safe::open_regular(p) {
            Ok(f) => Stdio::from(f),
            Err(e) => return failed(format!("stdin {}: {e}", p.display())),
        },
    };
    // std's Command rather than duct: measured, duct's SIGCHLD waiter added ~0.3 ms per
    // spawn. `process_group` keeps std on its posix_spawn fast path, and the sandbox is
    // entered by a short-lived spawning thread, not a pre_exec hook, for the same reason.
    let mut cmd = std::process::Command::new(program);
    if let Some(base) = &spec.base_env {
        cmd.env_clear().envs(base.iter().map(|(k, v)| (k, v)));
    }
    cmd.args(args)
        .current_dir(spec.cwd)
        .stdin(stdin)
        .stdout(out)
        .stderr(err)
        .envs(spec.env.iter().map(|(k, v)| (k, v)));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    // The child is recorded before anyone can look: a node reaping leftovers on another
    // thread must never collect it (its own wait would then fail with ECHILD).
    let mut tracking = tracked().lock().unwrap_or_else(|e| e.into_inner());
    let spawned = match spec.sandbox {
        Some(s) => s.spawn_via_thread(&mut cmd),
        None => cmd.spawn().map(|c| (c, None)),
    };
    let (child, supervisor) = match spawned {
        Ok(c) => c,
        Err(e) => {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => format!("`{program}` not found"),
                std::io::ErrorKind::PermissionDenied => format!("`{program}` is not executable"),
                _ => e.to_string(),
            };
            return failed(why);
        }
    };
    let pgid = child.id();
    tracking.insert(pgid);
    drop(tracking);
    if let Some(f) = spec.on_spawn {
        f(pgid);
    }
    // This thread waits for the exit (a pidfd, else a waiter thread) with a timeout, and
    // between waits watches the deadline, the output's growth and the interrupt flag, so
    // an exit is noticed at once and the rest within POLL.
    let mut waiting = Waiting::new(child);
    let deadline = spec.timeout.map(|t| start + t);
    // Only an idle timeout needs the output's growth.
    let mut heard = (
        spec.idle
            .map_or(0, |_| output_len(&spec.stdout, &spec.stderr)),
        Instant::now(),
    );
    let outcome = loop {
        let step = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(POLL),
            None => POLL,
        };
        match waiting.wait_for(step) {
            Some(Ok(status)) => break exit_of(&status),
            Some(Err(e)) => break Exit::SpawnFailed(e.to_string()),
            None => {}
        }
        if let Some(f) = spec.on_poll {
            f();
        }
        if spec.cancel.load(Ordering::SeqCst) {
            break Exit::Interrupted;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Exit::TimedOut;
        }
        if let Some(idle) = spec.idle {
            let now = output_len(&spec.stdout, &spec.stderr);
            if now != heard.0 {
                heard = (now, Instant::now());
            } else if heard.1.elapsed() >= idle {
                break Exit::Idle(idle);
            }
        }
    };
    #[cfg(unix)]
    match outcome {
        Exit::TimedOut | Exit::Interrupted | Exit::Idle(_) => {
            stop_group(pgid);
            let _ = waiting.wait();
        }
        // The node is over: whatever it left running in its group goes too.
        _ if group_alive(pgid) => stop_group(pgid),
        _ => {}
    }
    waiting.finish();
    if let Ok(mut t) = tracked().lock() {
        t.remove(&pgid);
    }
    // Its processes are gone (or detached, to be reaped): from now on a connect they try
    // fails, as the supervisor is dropped.
    if let (Some(sup), Some(out)) = (supervisor, spec.refused) {
        out.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(sup.take_refused());
    }
    Finished {
        exit: outcome,
        elapsed: start.elapsed(),
    }
}

/// A child being waited for: through a pidfd (Linux 5.3+: readable once the child has
/// exited, so a wait with a timeout is one `poll`), else through a thread blocked in
/// `wait` (what every spawn cost before: a thread, a channel and their syscalls).
enum Waiting {
    #[cfg(target_os = "linux")]
    Fd(std::process::Child, std::os::fd::OwnedFd),
    Thread {
        rx: mpsc::Receiver<Waited>,
        thread: Option<std::thread::JoinHandle<()>>,
    },
}

type Waited = std::io::Result<std::process::ExitStatus>;

impl Waiting {
    fn new(child: std::process::Child) -> Waiting {
        #[cfg(target_os = "linux")]
        if let Some(fd) = pidfd_open(child.id()) {
            return Waiting::Fd(child, fd);
        }
        let (tx, rx) = mpsc::channel();
        let mut child = child;
        let thread = std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        Waiting::Thread {
            rx,
            thread: Some(thread),
        }
    }

    /// The exit, if the child ends within `timeout`.
    fn wait_for(&mut self, timeout: Duration) -> Option<Waited> {
        match self {
            #[cfg(target_os = "linux")]
            Waiting::Fd(child, fd) => {
                use std::os::fd::AsRawFd;
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // Rounded up: a deadline less than a millisecond away must not spin.
                let ms = i32::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
                // SAFETY: one valid pollfd, its count, a timeout.
                let ready = unsafe { libc::poll(&mut p, 1, ms) };
                if ready <= 0 {
                    return None; // timed out, or a signal (EINTR): the caller looks again
                }
                match child.try_wait() {
                    Ok(Some(status)) => Some(Ok(status)),
                    Ok(None) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            Waiting::Thread { rx, .. } => match rx.recv_timeout(timeout) {
                Ok(r) => Some(r),
                Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    Some(Err(std::io::Error::other("lost the child")))
                }
            },
        }
    }

    /// Waits for the exit, however long it takes.
    fn wait(&mut self) -> Waited {
        match self {
            #[cfg(target_os = "linux")]
            Waiting::Fd(child, _) => child.wait(),
            Waiting::Thread { rx, .. } => rx
                .recv()
                .unwrap_or_else(|_| Err(std::io::Error::other("lost the child"))),
        }
    }

    /// Lets the waiter thread (if any) end.
    fn finish(self) {
        if let Waiting::Thread { mut thread, .. } = self
            && let Some(t) = thread.take()
        {
            let _ = t.join();
        }
    }
}

/// A pidfd for `pid` (close-on-exec, as the kernel always makes it); `None` where the
/// kernel has no `pidfd_open` (before 5.3) or refuses it.
#[cfg(target_os = "linux")]
pub(crate) fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open(pid, flags) takes integers and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns it.
    Some(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Makes this process the reaper of its orphaned descendants (Linux), so a process an
/// agent detached (`setsid`, a double fork) becomes loopflow's child instead of init's
/// and can be found and stopped. Best effort: elsewhere, escapes are only found by
/// their environment.
pub fn become_subreaper() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// A process's environment, as `KEY=VALUE` byte strings (Linux `/proc`).
#[cfg(target_os = "linux")]
fn environ(pid: i32) -> Vec<Vec<u8>> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(<[u8]>::to_vec)
        .collect()
}

/// Whether this process has any child at all, running or exited, of any of its threads:
/// one `waitid` that reaps nothing, against reading `/proc` for every thread.
#[cfg(target_os = "linux")]
fn has_children() -> bool {
    // SAFETY: waitid writes only the siginfo we pass; WNOWAIT leaves every child as it is.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WSTOPPED | libc::WCONTINUED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    // Only "no child processes" says there are none; anything else, look.
    !(r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
}

/// The direct children of this process (every thread's), from `/proc`.
#[cfg(target_os = "linux")]
fn own_children() -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// Collects this process's children that exited and that no [`run`] waits for (a killed
/// group's members, reparented here): they are not leftovers. Returns the live ones.
fn collect_zombies() -> Vec<i32> {
    #[cfg(target_os = "linux")]
    {
        // Held while listing and collecting, so a child being spawned right now is either
        // tracked already or not yet a child.
        let tracked = tracked().lock().unwrap_or_else(|e| e.into_inner());
        let untracked: Vec<i32> = own_children()
            .into_iter()
            .filter(|p| !tracked.contains(&(*p as u32)))
            .collect();
        let (zombies, live): (Vec<i32>, Vec<i32>) =
            untracked.into_iter().partition(|p| is_zombie(*p));
        for pid in zombies {
            // SAFETY: reaps a child of this very process that has exited.
            unsafe {
                libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        live
    }
    #[cfg(not(target_os = "linux"))]
    {
        Vec::new()
    }
}

/// The environment entries every process of one loop's ticks carries (the tick sets
/// them), by which leftovers are found.
pub fn loop_marks(loop_name: &str, project: &Path) -> [String; 2] {
    [
        format!("LOOPFLOW_LOOP={loop_name}"),
        format!("LOOPFLOW_PROJECT={}", project.display()),
    ]
}

/// Kills and reaps this process's children that no [`run`] is waiting for: the
/// leftovers agents detached, reparented to loopflow as their subreaper. Only those whose
/// environment carries every one of `marks` (`LOOPFLOW_LOOP=…`, `LOOPFLOW_PROJECT=…`,
/// and for one node `LOOPFLOW_NODE=…`), so a daemon ticking several loops at once never
/// touches another loop's processes, nor its own git. Their own children come to
/// loopflow in turn, so this repeats until none is left. Returns how many were killed.
pub fn reap_leftovers(marks: &[String]) -> usize {
    #[cfg(target_os = "linux")]
    {
        let mut killed = 0;
        for _ in 0..64 {
            // Nothing to look for (the common case) costs one waitid, not a /proc scan.
            if !has_children() {
                break;
            }
            let live = collect_zombies();
            let mine: Vec<i32> = live
                .into_iter()
                .filter(|p| {
                    let env = environ(*p);
                    marks.iter().all(|m| env.contains(&m.as_bytes().to_vec()))
                })
                .collect();
            if mine.is_empty() {
                break;
            }
            for pid in mine {
                // SAFETY: signals and waits for a child of this very process.
                unsafe {
                    if libc::kill(pid, libc::SIGKILL) == 0 {
                        killed += 1;
                    }
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
            }
        }
        killed
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = marks;
        0
    }
}

/// Kills every process that carries this loop's `LOOPFLOW_LOOP` and `LOOPFLOW_PROJECT`
/// (Linux: read from `/proc`), whatever its group or session: what a tick killed outright
/// (`kill -9`, OOM) left running, found by the next tick. Matching the environment, not
/// a recorded group id, means a recycled id never takes an unrelated process down and a
/// process started before its group was recorded is still found. Returns how many were
/// killed; `seen` holds the pids killed by earlier calls (a process killed a moment ago
/// may not have exited yet) and gains this call's, so no process is counted twice.
pub fn kill_loop_processes(
    loop_name: &str,
    project: &Path,
    only_group: Option<u32>,
    seen: &mut HashSet<i32>,
) -> usize {
    #[cfg(target_os = "linux")]
    {
        let [want_loop, want_project] = loop_marks(loop_name, project).map(String::into_bytes);
        let me = std::process::id() as i32;
        let mut killed = 0;
        // Twice: a process caught half-way through exec the first time is seen the second.
        for _ in 0..2 {
            let Ok(rd) = std::fs::read_dir("/proc") else {
                return killed;
            };
            for e in rd.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                if pid == me
                    || seen.contains(&pid)
                    || only_group.is_some_and(|g| group_of(pid) != Some(g))
                {
                    continue;
                }
                let env = environ(pid);
                if env.contains(&want_loop) && env.contains(&want_project) {
                    // SAFETY: kill only sends a signal to a process identified above.
                    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                        killed += 1;
                        seen.insert(pid);
                    }
                }
            }
        }
        killed
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (loop_name, project, only_group, seen);
        0
    }
}

/// Whether `pid` has exited and waits to be reaped (state `Z` in `/proc/<pid>/stat`).
#[cfg(target_os = "linux")]
fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|st| st == "Z"))
        })
        .unwrap_or(false)
}

/// The process group of `pid`, from `/proc/<pid>/stat` (`pid (comm) state ppid pgrp …`;
/// comm may hold spaces and parentheses).
#[cfg(target_os = "linux")]
fn group_of(pid: i32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2))
        .and_then(|g| g.parse().ok())
}

fn exit_of(status: &std::process::ExitStatus) -> Exit {
    if let Some(c) = status.code() {
        return Exit::Code(c);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(s) = status.signal() {
            return Exit::Signal(s);
        }
    }
    Exit::Code(-1)
}
