//! The short helper programs loopflow runs for itself — `crontab`, `systemctl`,
//! `launchctl`, a browser opener, loopflow itself in the demo — through one door: argv
//! only, a process group of their own (a terminal's Ctrl-C reaches loopflow, which
//! decides), stdin given or `/dev/null`, output captured, and a bound on how long they
//! may take, after which the whole group is killed. The agents' and the user's commands
//! go through [`super::run`] instead (files, sandbox, grace period); git through
//! `crate::git`, whose environment is its own.

use std::time::{Duration, Instant};

/// What a helper program printed and how it ended.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) status: std::process::ExitStatus,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

/// Why a helper program has no result.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ToolError {
    #[error("{0}")]
    Spawn(std::io::Error),
    #[error("still running after {} s; stopped", .0.as_secs())]
    TimedOut(Duration),
}

/// How long a helper may take unless its caller says otherwise: a scheduler's command
/// line answers in milliseconds; a minute means it hangs (a password prompt, a dead bus).
pub(crate) const TOOL_TIMEOUT: Duration = Duration::from_secs(60);

fn expression(argv: &[&str], input: Option<&[u8]>) -> Option<duct::Expression> {
    let (prog, args) = argv.split_first()?;
    let cmd = duct::cmd(*prog, args)
        .stdout_capture()
        .stderr_capture()
        .unchecked();
    #[cfg(unix)]
    let cmd = cmd.before_spawn(|c| {
        use std::os::unix::process::CommandExt;
        c.process_group(0);
        Ok(())
    });
    Some(match input {
        Some(i) => cmd.stdin_bytes(i.to_vec()),
        None => cmd.stdin_null(),
    })
}

/// Runs `argv` to its end, or kills its group after `timeout`.
pub(crate) fn run(
    argv: &[&str],
    input: Option<&[u8]>,
    timeout: Duration,
) -> Result<Ran, ToolError> {
    let Some(expr) = expression(argv, input) else {
        return Err(ToolError::Spawn(std::io::Error::other("empty argv")));
    };
    let handle = expr.start().map_err(ToolError::Spawn)?;
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match handle.try_wait() {
            Ok(Some(out)) => {
                return Ok(Ran {
                    status: out.status,
                    stdout: out.stdout.clone(),
                    stderr: out.stderr.clone(),
                });
            }
            Ok(None) => {}
            Err(e) => return Err(ToolError::Spawn(e)),
        }
        if Instant::now() >= deadline {
            #[cfg(unix)]
            for pid in handle.pids() {
                // SAFETY: signals the group this helper leads (its own, from `before_spawn`).
                unsafe { libc::killpg(pid as libc::pid_t, libc::SIGKILL) };
            }
            let _ = handle.kill();
            return Err(ToolError::TimedOut(timeout));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Starts `argv` and leaves it running (a browser opener, whose group may be the browser
/// it starts: never killed), reaped in the background so it never lingers as a zombie.
pub(crate) fn start(argv: &[&str]) -> Result<(), ToolError> {
    let Some(expr) = expression(argv, None) else {
        return Err(ToolError::Spawn(std::io::Error::other("empty argv")));
    };
    let handle = expr
        .stdout_null()
        .stderr_null()
        .start()
        .map_err(ToolError::Spawn)?;
    std::thread::spawn(move || handle.wait().map(|_| ()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_and_status_come_back() {
        let r = run(
            &["sh", "-c", "cat; echo err >&2; exit 3"],
            Some(b"in"),
            TOOL_TIMEOUT,
        )
        .unwrap();
        assert_eq!(r.stdout, b"in");
        assert_eq!(r.stderr, b"err\n");
        assert_eq!(r.status.code(), Some(3));
    }

    #[test]
    fn a_helper_that_hangs_is_stopped_with_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let e = run(&["sh", "-c", &script], None, Duration::from_millis(300)).unwrap_err();
        assert!(matches!(e, ToolError::TimedOut(_)), "{e}");
        let child: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild went with the group (give the kernel a moment to deliver).
        let gone = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            stat.is_empty() || stat.contains(") Z ")
        });
        assert!(gone, "the helper's child outlived it");
    }

    #[test]
    fn a_missing_program_is_a_spawn_error() {
        let e = run(&["/nonexistent/loopflow-tool"], None, TOOL_TIMEOUT).unwrap_err();
        assert!(matches!(e, ToolError::Spawn(_)), "{e}");
    }
}
