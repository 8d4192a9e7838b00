//! Running child processes: argv only (never a shell), each in a session (confined) or a
//! process group (unconfined) of its own, output to files, optionally confined by the sandbox, and on timeout,
//! silence or interruption TERM to the whole group, a grace period, then KILL, so no
//! grandchild outlives its node. On Linux the child is started by the sandbox's launcher
//! (a `clone(CLONE_VM|CLONE_VFORK)` child that confines itself and `exec`s the program
//! resolved here: no copy of loopflow, no thread) and waited for through its pidfd.
//! Processes that escape the group (`setpgid`, `setsid`, double forks) are caught too:
//! loopflow is their subreaper, and what is left when a node or a tick ends is killed
//! ([`reap_leftovers`]); a tick that was itself killed leaves a mark the next one finds
//! ([`kill_loop_processes`]). Nothing here waits without a bound.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::reason::Failure;
use crate::sandbox::Prepared;

mod reap;
pub(crate) mod tool;

pub(crate) use reap::{become_subreaper, kill_loop_processes, loop_marks, reap_leftovers};

/// How long a group gets between TERM and KILL.
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// How often a running child is looked at (deadline, silence, interrupt, the tick's own
/// watch). An exit is noticed at once; everything else within this.
const POLL: Duration = Duration::from_millis(100);

/// How long a child that was sent KILL is waited for before loopflow goes on without it
/// (one in uninterruptible sleep: the tick's end looks again).
const KILLED_WAIT: Duration = Duration::from_secs(1);

pub(crate) struct Spawn<'a> {
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
    /// How long its process group has between TERM and KILL when it is stopped
    /// (`[harness] grace`; [`GRACE`] by default).
    pub grace: Duration,
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
pub(crate) fn spawn_count() -> u64 {
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

/// TERM the group, wait up to `grace` for it to empty, then KILL the group and
/// the leader itself. The leader is reaped as soon as it exits (through `waiting`), so a
/// group that obeys TERM is seen empty at once (an unreaped zombie would keep it "alive"
/// for the whole grace period). Returns within the grace period and [`KILLED_WAIT`].
#[cfg(unix)]
fn stop_group(pgid: u32, waiting: &mut Waiting, grace: Duration) {
    signal_group(pgid, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        // Members that exited were reparented here (the subreaper): collected, or their
        // zombies would keep the group "alive" for the whole grace period.
        reap::collect_zombies();
        let _ = waiting.wait_for(Duration::ZERO);
        if !group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(pgid, libc::SIGKILL);
    waiting.kill();
    // KILL cannot be ignored, but dying takes a moment: wait (briefly) until the members
    // are gone, so they are not counted again as leftovers of the node.
    let deadline = Instant::now() + KILLED_WAIT;
    while Instant::now() < deadline {
        reap::collect_zombies();
        let _ = waiting.wait_for(Duration::ZERO);
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

/// The failure to report for a child that could not be started.
fn start_error(program: &str, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOENT) => format!("`{program}` not found"),
        Some(libc::EACCES) => format!("`{program}` is not executable"),
        Some(libc::ENOEXEC) => format!("`{program}` is not executable (no #! line?)"),
        _ => e.to_string(),
    }
}

pub(crate) fn run(spec: &Spawn<'_>) -> Finished {
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
        None => std::fs::File::open("/dev/null"),
        Some(p) => crate::fs_safe::open_regular(p),
    };
    let stdin = match stdin {
        Ok(f) => f,
        Err(e) => {
            let what = spec
                .stdin
                .map_or("/dev/null".into(), |p| p.display().to_string());
            return failed(format!("stdin {what}: {e}"));
        }
    };
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = match &spec.base_env {
        Some(base) => base.clone(),
        None => std::env::vars_os().collect(),
    };
    env.extend(spec.env.iter().map(|(k, v)| (k.into(), v.into())));
    // The child is recorded before anyone can look: a node reaping leftovers on another
    // thread must never collect it (its own wait would then fail with ECHILD).
    let mut tracking = tracked().lock().unwrap_or_else(|e| e.into_inner());
    let child = match start_child(spec, program, args, &env, [&stdin, &out, &err]) {
        Ok(c) => c,
        Err(why) => return failed(why),
    };
    drop((stdin, out, err));
    let pgid = child.pid;
    tracking.insert(pgid);
    drop(tracking);
    if let Some(f) = spec.on_spawn {
        f(pgid);
    }
    // This thread waits for the exit (a pidfd) with a timeout, and between waits watches
    // the deadline, the output's growth and the interrupt flag, so an exit is noticed at
    // once and the rest within POLL.
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
    // The node is over: whatever it left running in its group goes too.
    #[cfg(unix)]
    if group_alive(pgid) {
        stop_group(pgid, &mut waiting, spec.grace);
    }
    // Members of its session that left the group (`setpgid`) go with it.
    reap::kill_session(pgid);
    if let Ok(mut t) = tracked().lock() {
        t.remove(&pgid);
    }
    // Its processes are gone (or detached, to be reaped): what the sandbox refused them
    // is told now.
    if let (Some(sb), Some(out)) = (spec.sandbox, spec.refused) {
        out.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(sb.take_refused());
    }
    Finished {
        exit: outcome,
        elapsed: start.elapsed(),
    }
}

/// A started child: its pid and, where the kernel gives one, a pidfd to wait on.
struct Started {
    pid: u32,
    #[cfg(target_os = "linux")]
    pidfd: Option<std::os::fd::OwnedFd>,
    #[cfg(not(target_os = "linux"))]
    child: std::process::Child,
}

/// Starts the child in a session of its own: the sandbox's launcher, confined by
/// `spec.sandbox` when given.
#[cfg(target_os = "linux")]
fn start_child(
    spec: &Spawn<'_>,
    program: &str,
    args: &[String],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    stdio: [&std::fs::File; 3],
) -> Result<Started, String> {
    use crate::sandbox::launch;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let p = launch::Program::new(program, args, env, spec.cwd).map_err(|e| e.to_string())?;
    // The launcher wants its stdio fds at 3 or above (a loopflow started with fd 0 closed
    // may have opened one of them there): duplicates, closed after the launch.
    let mut keep: Vec<OwnedFd> = Vec::new();
    let mut fds = [0; 3];
    for (slot, f) in fds.iter_mut().zip(stdio) {
        let fd = f.as_raw_fd();
        *slot = if fd > 2 {
            fd
        } else {
            // SAFETY: F_DUPFD_CLOEXEC returns a new fd of ours (>= 3) or -1.
            let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if d < 0 {
                return Err(std::io::Error::last_os_error().to_string());
            }
            // SAFETY: just created, ours.
            keep.push(unsafe { OwnedFd::from_raw_fd(d) });
            d
        };
    }
    let child = match spec.sandbox {
        Some(s) => s.launch(&p, fds),
        None => launch::launch(&p, fds, None).map(|(c, _)| c),
    };
    drop(keep);
    let child = child.map_err(|e| start_error(program, &e))?;
    Ok(Started {
        pid: child.pid,
        pidfd: child.pidfd,
    })
}

/// Elsewhere: std's spawn, in a process group of its own.
#[cfg(not(target_os = "linux"))]
fn start_child(
    spec: &Spawn<'_>,
    program: &str,
    args: &[String],
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    stdio: [&std::fs::File; 3],
) -> Result<Started, String> {
    let mut cmd = std::process::Command::new(program);
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .args(args)
        .current_dir(spec.cwd);
    let io = |f: &std::fs::File| f.try_clone().map(std::process::Stdio::from);
    let [i, o, e] = stdio;
    cmd.stdin(io(i).map_err(|e| e.to_string())?)
        .stdout(io(o).map_err(|e| e.to_string())?)
        .stderr(io(e).map_err(|e| e.to_string())?);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let child = cmd.spawn().map_err(|e| start_error(program, &e))?;
    Ok(Started {
        pid: child.id(),
        child,
    })
}

type Waited = std::io::Result<std::process::ExitStatus>;

/// A child being waited for: through its pidfd (readable once it has exited, so a wait
/// with a timeout is one `poll`), else by looking every few milliseconds. Reaped at once.
struct Waiting {
    started: Started,
    done: Option<std::process::ExitStatus>,
}

impl Waiting {
    fn new(started: Started) -> Waiting {
        Waiting {
            started,
            done: None,
        }
    }

    /// The exit, if the child ends within `timeout`.
    fn wait_for(&mut self, timeout: Duration) -> Option<Waited> {
        if let Some(s) = self.done {
            return Some(Ok(s));
        }
        let got = self.wait_os(timeout);
        if let Some(Ok(s)) = &got {
            self.done = Some(*s);
        }
        got
    }

    #[cfg(target_os = "linux")]
    fn wait_os(&mut self, timeout: Duration) -> Option<Waited> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::ExitStatusExt;
        match &self.started.pidfd {
            Some(fd) => {
                let mut p = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // Rounded up: a deadline less than a millisecond away must not spin.
                let ms = i32::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
                // SAFETY: one valid pollfd, its count, a timeout.
                if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
                    return None; // timed out, or a signal (EINTR): the caller looks again
                }
            }
            None => std::thread::sleep(timeout.min(Duration::from_millis(10))),
        }
        let mut status = 0;
        // SAFETY: waits, without blocking, for our own child.
        let r = unsafe { libc::waitpid(self.started.pid as i32, &mut status, libc::WNOHANG) };
        match r {
            0 => None,
            r if r < 0 => Some(Err(std::io::Error::last_os_error())),
            _ => Some(Ok(std::process::ExitStatus::from_raw(status))),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn wait_os(&mut self, timeout: Duration) -> Option<Waited> {
        let end = Instant::now() + timeout;
        loop {
            match self.started.child.try_wait() {
                Ok(Some(s)) => return Some(Ok(s)),
                Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// KILL to the child itself, unless it was reaped (its pid may be another's then).
    fn kill(&self) {
        #[cfg(unix)]
        if self.done.is_none() {
            // SAFETY: kill only sends a signal to our own, unreaped child.
            unsafe { libc::kill(self.started.pid as i32, libc::SIGKILL) };
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

/// Marks every descriptor loopflow was started with, but stdin, stdout and stderr,
/// close-on-exec (DESIGN §12 "nothing inherited"): a pipe, socket or file its parent
/// leaked (a scheduler's, a terminal's) reaches none of the processes loopflow starts.
/// Called first thing in `main`; loopflow's own descriptors are close-on-exec already.
pub(crate) fn seal_inherited_fds() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: close_range with integer arguments; CLOEXEC closes nothing now.
        let r = unsafe { libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_CLOEXEC as i32) };
        if r == 0 {
            return;
        }
        // Before Linux 5.11: one by one.
        let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|fd| *fd > 2)
            .collect();
        for fd in fds {
            // SAFETY: sets a flag on an fd of ours (one that closed meanwhile: EBADF).
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
    }
}
