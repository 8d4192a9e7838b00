//! Running child processes: argv only (never a shell), each in its own process group,
//! output to files, and on timeout or interruption TERM to the whole group, a grace
//! period, then KILL, so no grandchild outlives its node.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::reason::Failure;

/// How long a group gets between TERM and KILL.
pub const GRACE: Duration = Duration::from_secs(5);

pub struct Spawn<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: Vec<(String, String)>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub timeout: Option<Duration>,
    pub cancel: &'a AtomicBool,
    /// Told the child's process group as soon as it exists (the tick records it).
    pub on_spawn: Option<&'a (dyn Fn(u32) + Sync)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    TimedOut,
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

/// TERM the group, wait up to the grace period for it to empty, then KILL.
/// `reap` collects the group leader when it exits: until it is reaped it stays in the
/// group as a zombie, and the group would look alive for the whole grace period.
#[cfg(unix)]
/// The waiter thread reaps the group leader as soon as it exits, so a group that obeys
/// TERM is seen empty at once (an unreaped zombie would keep it "alive" for the whole
/// grace period).
fn stop_group(pgid: u32) {
    signal_group(pgid, libc::SIGTERM);
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        if !group_alive(pgid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_group(pgid, libc::SIGKILL);
}

pub fn run(spec: &Spawn<'_>) -> Finished {
    let start = Instant::now();
    let Some((program, args)) = spec.argv.split_first() else {
        return Finished {
            exit: Exit::SpawnFailed("empty argv".into()),
            elapsed: Duration::ZERO,
        };
    };
    // Created afresh, never through a symlink or hard link an earlier agent planted.
    let files = crate::fs_safe::create_owned(&spec.stdout)
        .and_then(|o| Ok((o, crate::fs_safe::create_owned(&spec.stderr)?)));
    let (out, err) = match files {
        Ok(f) => f,
        Err(e) => {
            return Finished {
                exit: Exit::SpawnFailed(format!("output files: {e}")),
                elapsed: start.elapsed(),
            };
        }
    };
    // std's Command rather than duct here: measured, duct's SIGCHLD waiter added ~0.3 ms
    // per spawn (a third of the cost of spawning `true`), and a tick spawns three agents.
    // `process_group` keeps std on its posix_spawn fast path.
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .current_dir(spec.cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .envs(spec.env.iter().map(|(k, v)| (k, v)));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => format!("`{program}` not found"),
                std::io::ErrorKind::PermissionDenied => format!("`{program}` is not executable"),
                _ => e.to_string(),
            };
            return Finished {
                exit: Exit::SpawnFailed(why),
                elapsed: start.elapsed(),
            };
        }
    };
    let pgid = child.id();
    if let Some(f) = spec.on_spawn {
        f(pgid);
    }
    // A waiter thread blocks in wait(); this thread watches the deadline and the
    // interrupt flag, so an exit is noticed at once and a signal within 100 ms.
    let (tx, rx) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let deadline = spec.timeout.map(|t| start + t);
    let outcome = loop {
        let step = match deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100)),
            None => Duration::from_millis(100),
        };
        match rx.recv_timeout(step) {
            Ok(Ok(status)) => break exit_of(&status),
            Ok(Err(e)) => break Exit::SpawnFailed(e.to_string()),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break Exit::SpawnFailed("lost the child".into());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if spec.cancel.load(Ordering::SeqCst) {
            break Exit::Interrupted;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Exit::TimedOut;
        }
    };
    #[cfg(unix)]
    match outcome {
        Exit::TimedOut | Exit::Interrupted => {
            stop_group(pgid);
            let _ = rx.recv();
        }
        // The node is over: whatever it left running in its group goes too.
        _ if group_alive(pgid) => stop_group(pgid),
        _ => {}
    }
    #[cfg(not(unix))]
    if matches!(outcome, Exit::TimedOut | Exit::Interrupted) {
        let _ = pgid;
    }
    let _ = waiter.join();
    Finished {
        exit: outcome,
        elapsed: start.elapsed(),
    }
}

/// Kills what is left of process group `pgid` from a tick that died (`kill -9` of
/// `loopflow run`), but only processes that carry this loop's `LOOPFLOW_LOOP` and
/// `LOOPFLOW_PROJECT`: a recycled group id never takes an unrelated process down.
/// Returns how many were killed. Linux only (it reads `/proc`).
pub fn kill_orphans(pgid: u32, loop_name: &str, project: &Path) -> usize {
    #[cfg(target_os = "linux")]
    {
        let want_loop = format!("LOOPFLOW_LOOP={loop_name}");
        let want_project = format!("LOOPFLOW_PROJECT={}", project.display());
        let mut killed = 0;
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return 0;
        };
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // "pid (comm) state ppid pgrp …": comm may hold spaces and parentheses.
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|g| g.parse::<u32>().ok());
            if pgrp != Some(pgid) {
                continue;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            if vars.contains(&want_loop.as_bytes()) && vars.contains(&want_project.as_bytes()) {
                // SAFETY: kill only sends a signal to a process we identified above.
                if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                    killed += 1;
                }
            }
        }
        killed
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (pgid, loop_name, project);
        0
    }
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
