//! Running child processes: argv only (never a shell), each in its own process group,
//! output to files, and on timeout or interruption TERM to the whole group, a grace
//! period, then KILL, so no grandchild outlives its node.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long a group gets between TERM and KILL.
pub const GRACE: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Spawn<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: Vec<(String, String)>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    pub timeout: Option<Duration>,
    pub cancel: &'a AtomicBool,
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
    /// `exit:1`, `signal:9`, `timeout`, `interrupted`, `spawn:<why>`: used in log lines.
    pub fn reason(&self) -> String {
        match self {
            Exit::Code(c) => format!("exit:{c}"),
            Exit::Signal(s) => format!("signal:{s}"),
            Exit::TimedOut => "timeout".into(),
            Exit::Interrupted => "interrupted".into(),
            Exit::SpawnFailed(e) => format!("spawn:{e}"),
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
fn stop_group(pgid: u32, reap: impl Fn()) {
    signal_group(pgid, libc::SIGTERM);
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        reap();
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
    let mut expr = duct::cmd(program, args)
        .dir(spec.cwd)
        .stdin_null()
        .stdout_path(&spec.stdout)
        .stderr_path(&spec.stderr)
        .unchecked();
    for (k, v) in &spec.env {
        expr = expr.env(k, v);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        expr = expr.before_spawn(|cmd| {
            cmd.process_group(0);
            Ok(())
        });
    }
    let handle = match expr.start() {
        Ok(h) => h,
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
    let pgid = handle.pids().first().copied().unwrap_or(0);
    let deadline = spec.timeout.map(|t| start + t);
    let outcome = loop {
        let step = match deadline {
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100)),
            None => Duration::from_millis(100),
        };
        match handle.wait_timeout(step) {
            Ok(Some(out)) => break exit_of(&out.status),
            Ok(None) => {}
            Err(e) => break Exit::SpawnFailed(e.to_string()),
        }
        if spec.cancel.load(Ordering::SeqCst) {
            break Exit::Interrupted;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Exit::TimedOut;
        }
    };
    #[cfg(unix)]
    if pgid != 0 {
        match outcome {
            Exit::TimedOut | Exit::Interrupted => {
                stop_group(pgid, || {
                    let _ = handle.try_wait();
                });
                let _ = handle.wait();
            }
            // The node is over: whatever it left running in its group goes too.
            _ if group_alive(pgid) => stop_group(pgid, || {}),
            _ => {}
        }
    }
    #[cfg(not(unix))]
    if matches!(outcome, Exit::TimedOut | Exit::Interrupted) {
        let _ = handle.kill();
    }
    Finished {
        exit: outcome,
        elapsed: start.elapsed(),
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
