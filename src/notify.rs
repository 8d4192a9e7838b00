//! Telling a human that a loop halted (DESIGN §13): the `[notify] command` of `loop.toml`
//! (else of `.loopflow/config.toml`) runs at every HALT, `goal_met` included, with the
//! event as one JSON object on stdin. Its argv elements are templates (strict, no shell);
//! it runs in its own process group under a timeout. A notifier that fails, hangs or
//! cannot be started logs `WARN notify=…` and changes nothing else: the halt, the state
//! and the exit code are the same with or without it.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::config::{LoopConfig, Notify, ProjectConfig};
use crate::diag::Diagnostics;
use crate::reason::HaltReason;
use crate::state::{Event, LogArg, LoopPaths, State};

/// How long a timed-out notifier's group gets between TERM and KILL: a notifier is small,
/// and a halt should not wait long on one.
const GRACE: Duration = Duration::from_secs(2);

/// Why a notifier did not succeed (the `reason=` of its `WARN` line).
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("{0}")]
    Config(String),
    #[error("template: {0}")]
    Template(String),
    #[error("spawn: {0}")]
    Spawn(String),
    #[error("timeout after {0:?}")]
    Timeout(Duration),
    #[error("exit:{code}{}", stderr_suffix(.stderr))]
    Exit { code: i32, stderr: String },
    #[error("signal:{0}")]
    Signal(i32),
}

fn stderr_suffix(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(": {s}")
    }
}

/// The notifier a loop uses: its own `[notify]`, else the project's. A loop.toml that does
/// not parse does not silence the project's notifier (a halt for a broken config is
/// exactly when a human must hear of it).
pub fn notifier(paths: &LoopPaths) -> Result<Option<Notify>, NotifyError> {
    let mut diags = Diagnostics::default();
    let own = LoopConfig::read(&paths.config(), &paths.project, &mut diags)
        .ok()
        .flatten()
        .and_then(|c| c.notify);
    if own.is_some() {
        return Ok(own);
    }
    ProjectConfig::load(&paths.project)
        .map(|c| c.notify)
        .map_err(NotifyError::Config)
}

/// The event JSON, exactly DESIGN §13's keys, for the halt the state now records.
pub fn event(paths: &LoopPaths, state: &State, reason: &HaltReason, detail: Option<&str>) -> Value {
    let halt = state.halt.as_ref().filter(|h| &h.reason == reason);
    json!({
        "event": "halt",
        "loop": paths.name,
        "project": paths.project.display().to_string(),
        "reason": reason.to_string(),
        "detail": detail.map(str::to_string).or_else(|| halt.and_then(|h| h.detail.clone())),
        "iteration": halt.map_or(state.iteration_count, |h| h.iteration),
        "at": halt.map_or_else(crate::state::now, |h| h.at.clone()),
        "spent": state.spent,
        "last_verdict": state.last_verdict,
        "review": crate::human::command("review", &paths.name, &paths.project),
    })
}

/// The variables a notifier's argv may use (`config::notify::VARS`): the event's values,
/// and which of the five deaths it is, the task, a one-line summary, the JSON as text.
fn vars(event: &Value, reason: &HaltReason, task: Option<&str>) -> Value {
    let s = |k: &str| event[k].as_str().unwrap_or("").to_string();
    let detail = s("detail");
    let summary = if detail.is_empty() {
        format!("loopflow: loop {} halted: {}", s("loop"), s("reason"))
    } else {
        format!(
            "loopflow: loop {} halted: {} ({detail})",
            s("loop"),
            s("reason")
        )
    };
    json!({
        "event": event.to_string(),
        "loop": s("loop"),
        "project": s("project"),
        "reason": s("reason"),
        "death": reason.death().as_str(),
        "detail": detail,
        "iteration": event["iteration"],
        "at": s("at"),
        "task": task.unwrap_or(""),
        "score": event["last_verdict"]["score"].as_f64().map_or(String::new(), crate::verdict::fmt_score),
        "spent_usd": event["spent"]["usd"],
        "spent_tokens": event["spent"]["tokens"],
        "spent_seconds": event["spent"]["seconds"],
        "review": s("review"),
        "summary": summary,
    })
}

/// At a halt: runs the loop's notifier, if it has one. Never fails: what goes wrong is a
/// `WARN` line in the loop's log.
pub fn at_halt(paths: &LoopPaths, reason: &HaltReason, detail: Option<&str>) {
    let notify = match notifier(paths) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => return warn(paths, &e),
    };
    let Ok(state) = paths.load() else {
        return warn(
            paths,
            &NotifyError::Config("the state file cannot be read".into()),
        );
    };
    let ev = event(paths, &state, reason, detail);
    let ctx = vars(&ev, reason, state.current_task.as_deref());
    if let Err(e) = run(paths, &notify, &ev, &ctx) {
        warn(paths, &e);
    }
}

fn warn(paths: &LoopPaths, e: &NotifyError) {
    let _ = paths.log(
        Event::Warn,
        &[
            LogArg::Kv("notify", "failed".into()),
            LogArg::Kv("reason", e.to_string()),
        ],
    );
}

/// Renders the argv with `ctx` and runs it with the event on stdin.
fn run(paths: &LoopPaths, notify: &Notify, event: &Value, ctx: &Value) -> Result<(), NotifyError> {
    let hb = crate::template::engine();
    let argv = notify
        .command
        .iter()
        .map(|t| crate::template::render(&hb, &t.text, ctx))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| NotifyError::Template(e.to_string()))?;
    let mut stdin = event.to_string();
    stdin.push('\n');
    let env = [
        ("LOOPFLOW_LOOP", paths.name.as_str()),
        ("LOOPFLOW_PROJECT", &paths.project.display().to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    spawn(
        &argv,
        &paths.project,
        &env,
        stdin.as_bytes(),
        notify.timeout,
    )
}

/// Runs `argv` (never a shell) in its own process group with `input` on stdin, and waits
/// at most `timeout`; then TERM to the group, a short grace, KILL. `crate::process::run`
/// cannot give a child stdin, so this is its small sibling: same group handling, with a
/// pipe in and the last of stderr kept for the `WARN` line.
fn spawn(
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
    input: &[u8],
    timeout: Duration,
) -> Result<(), NotifyError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(NotifyError::Spawn("empty argv".into()));
    };
    let stderr = tempfile::tempfile().map_err(|e| NotifyError::Spawn(e.to_string()))?;
    let err_copy = stderr
        .try_clone()
        .map_err(|e| NotifyError::Spawn(e.to_string()))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .current_dir(cwd)
        .env("PWD", cwd)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(err_copy);
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().map_err(|e| {
        NotifyError::Spawn(match e.kind() {
            std::io::ErrorKind::NotFound => format!("`{program}` not found"),
            std::io::ErrorKind::PermissionDenied => format!("`{program}` is not executable"),
            _ => e.to_string(),
        })
    })?;
    let pgid = child.id();
    // Written from a thread: a notifier that never reads stdin must not block the halt,
    // and one that exits early only breaks the pipe (loopflow ignores SIGPIPE).
    if let Some(mut pipe) = child.stdin.take() {
        let bytes = input.to_vec();
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
        });
    }
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(NotifyError::Spawn(e.to_string())),
        }
    };
    // Whatever the notifier left running in its group goes too (as for a node).
    stop_group(pgid, &mut child);
    let Some(status) = status else {
        return Err(NotifyError::Timeout(timeout));
    };
    if status.success() {
        return Ok(());
    }
    let tail = stderr_tail(stderr);
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(s) = status.signal() {
            return Err(NotifyError::Signal(s));
        }
    }
    Err(NotifyError::Exit {
        code: status.code().unwrap_or(-1),
        stderr: tail,
    })
}

/// The last line or so of what the notifier said on stderr, for the `WARN` line.
fn stderr_tail(mut f: std::fs::File) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(300)));
    let mut buf = Vec::new();
    let _ = f.take(300).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// TERM the group, wait up to [`GRACE`] for it to empty, then KILL; the leader is reaped
/// meanwhile (a zombie leader would keep the group "alive" for the whole grace).
#[cfg(unix)]
fn stop_group(pgid: u32, leader: &mut std::process::Child) {
    let pg = pgid as libc::pid_t;
    let alive = |leader: &mut std::process::Child| {
        let _ = leader.try_wait();
        // SAFETY: killpg with signal 0 only checks; a group that is gone yields ESRCH.
        unsafe { libc::killpg(pg, 0) == 0 }
    };
    if !alive(leader) {
        return;
    }
    // SAFETY: killpg only sends a signal to the notifier's own group.
    unsafe { libc::killpg(pg, libc::SIGTERM) };
    let deadline = Instant::now() + GRACE;
    while Instant::now() < deadline {
        if !alive(leader) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: as above.
    unsafe { libc::killpg(pg, libc::SIGKILL) };
    let _ = leader.wait();
}

#[cfg(not(unix))]
fn stop_group(_pgid: u32, leader: &mut std::process::Child) {
    let _ = leader.kill();
    let _ = leader.wait();
}
