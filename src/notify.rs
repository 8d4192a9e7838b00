//! Telling a human that a loop halted (DESIGN §13): the `[notify] command` of `loop.toml`
//! (else of `.loopflow/config.toml`) runs at every HALT, `goal_met` included, with the
//! event as one JSON object on stdin. Its argv elements are templates (strict, no shell);
//! it runs in its own process group under a timeout. A notifier that fails, hangs or
//! cannot be started logs `WARN notify=…` and changes nothing else: the halt, the state
//! and the exit code are the same with or without it.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::config::{LoopConfig, Notify, ProjectConfig};
use crate::diag::Diagnostics;
use crate::reason::HaltReason;
use crate::state::{Event, LogArg, LoopPaths, State};

/// Why a notifier did not succeed (the `reason=` of its `WARN` line).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NotifyError {
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
pub(crate) fn notifier(paths: &LoopPaths) -> Result<Option<Notify>, NotifyError> {
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
pub(crate) fn event(
    paths: &LoopPaths,
    state: &State,
    reason: &HaltReason,
    detail: Option<&str>,
) -> Value {
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
/// `state` is the state as the halt left it.
pub(crate) fn at_halt(paths: &LoopPaths, state: &State, reason: &HaltReason, detail: Option<&str>) {
    let notify = match notifier(paths) {
        Ok(Some(n)) => n,
        Ok(None) => return,
        Err(e) => return warn(paths, &e),
    };
    let ev = event(paths, state, reason, detail);
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

/// Runs `argv` (never a shell) through [`crate::process::run`], like a node: its own
/// process group, the timeout, TERM then KILL to the group, leftovers collected. The event
/// goes on stdin from a private temp file; the last of stderr is kept for the `WARN` line.
fn spawn(
    argv: &[String],
    cwd: &Path,
    env: &[(String, String)],
    input: &[u8],
    timeout: Duration,
) -> Result<(), NotifyError> {
    use crate::process::Exit;
    let io = |e: std::io::Error| NotifyError::Spawn(e.to_string());
    let dir = tempfile::tempdir().map_err(io)?;
    let event = dir.path().join("event.json");
    crate::fs_safe::write_owned(&event, input).map_err(io)?;
    let mut env = env.to_vec();
    env.push(("PWD".into(), cwd.display().to_string()));
    let never = std::sync::atomic::AtomicBool::new(false);
    // The user's own notifier, run by loopflow (no agent's): it inherits loopflow's
    // whole environment (its webhook token, say) and runs unconfined.
    let done = crate::process::run(&crate::process::Spawn {
        argv,
        cwd,
        base_env: None,
        env,
        stdin: Some(&event),
        stdout: dir.path().join("stdout"),
        stderr: dir.path().join("stderr"),
        timeout: Some(timeout),
        idle: None,
        grace: crate::process::GRACE,
        cancel: &never,
        sandbox: None,
        on_spawn: None,
        on_poll: None,
        refused: None,
    });
    match done.exit {
        Exit::Code(0) => Ok(()),
        Exit::Code(code) => Err(NotifyError::Exit {
            code,
            stderr: stderr_tail(&dir.path().join("stderr")),
        }),
        Exit::Signal(s) => Err(NotifyError::Signal(s)),
        Exit::TimedOut | Exit::Idle(_) | Exit::Interrupted => Err(NotifyError::Timeout(timeout)),
        Exit::SpawnFailed(why) => Err(NotifyError::Spawn(why)),
    }
}

/// The last line or so of what the notifier said on stderr, for the `WARN` line.
fn stderr_tail(path: &Path) -> String {
    let buf = crate::fs_safe::tail(path, 300).unwrap_or_default();
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
