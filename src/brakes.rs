//! The gate (DESIGN §6): every brake evaluated in order, shared by the `gate` node,
//! `loopflow gate` and `loopflow can-continue`, so all three always agree.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::config::{LoopConfig, WorkSource};
use crate::state::{LoopPaths, State};

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// What a failing gate does to the tick.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Pass,
    Skip(String),
    Halt { reason: String, detail: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct GateReport {
    pub ok: bool,
    pub reason: Option<String>,
    pub checks: Vec<Check>,
    #[serde(skip)]
    pub verdict: Verdict,
    /// The task the work source supplies, when there is one.
    #[serde(skip)]
    pub task: Option<Task>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// What `current_task` holds: a backlog item's bold slug, an audit line's `id`.
    pub id: String,
    /// The whole item text or audit `title` (the id when there is nothing more).
    pub title: String,
    /// Where it came from: `--task`, `backlog:BACKLOG.md`, `audit`.
    pub source: String,
}

/// The directory a loop's agents work in: its worktree, or the project root.
pub fn loop_cwd(config: &LoopConfig, state: &State, paths: &LoopPaths) -> PathBuf {
    if config.worktree {
        state
            .worktree_path
            .as_ref()
            .map(PathBuf::from)
            .unwrap_or_else(|| paths.worktree.clone())
    } else {
        paths.project.clone()
    }
}

/// Variables a work source's templates (backlog path, audit argv) may use.
fn source_vars(config: &LoopConfig, state: &State, paths: &LoopPaths) -> serde_json::Value {
    serde_json::json!({
        "loop": paths.name,
        "project": paths.project.display().to_string(),
        "cwd": loop_cwd(config, state, paths).display().to_string(),
    })
}

/// The task the loop works on now, from its work source.
pub fn current_task(
    config: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
) -> Result<Option<Task>, String> {
    match &config.work_source {
        WorkSource::Single => Ok(state.current_task.clone().map(|t| Task {
            title: t.clone(),
            id: t,
            source: state.task_source.clone().unwrap_or_else(|| "state".into()),
        })),
        WorkSource::Backlog { file } => {
            let file = match file.to_str() {
                Some(f) if f.contains("{{") => {
                    let hb = crate::template::engine();
                    let p = crate::template::render(&hb, f, &source_vars(config, state, paths))
                        .map_err(|e| format!("work_source.file `{f}`: {e}"))?;
                    PathBuf::from(p)
                }
                _ => file.clone(),
            };
            let text = crate::fs_safe::read_to_string(&file).map_err(|e| {
                format!(
                    "backlog {}: {e} (work_source.file in loop.toml)",
                    file.display()
                )
            })?;
            let name = file
                .strip_prefix(loop_cwd(config, state, paths))
                .or_else(|_| file.strip_prefix(&paths.project))
                .map_or_else(|_| file.display().to_string(), |p| p.display().to_string());
            Ok(backlog_item(&text).map(|(id, title)| Task {
                id,
                title,
                source: format!("backlog:{name}"),
            }))
        }
        WorkSource::Audit { command } => {
            if NO_SPAWN.load(Ordering::SeqCst) {
                // A dry run spawns nothing: show the task the state last recorded.
                return Ok(Some(Task {
                    id: state
                        .current_task
                        .clone()
                        .unwrap_or_else(|| "<first task of the audit command>".into()),
                    title: "the audit command is not run in a dry run".into(),
                    source: "audit".into(),
                }));
            }
            let key = (paths.dir.clone(), state.iteration_count);
            let memo = AUDIT_MEMO.lock().ok().and_then(|m| {
                m.as_ref()
                    .filter(|(k, _)| *k == key)
                    .map(|(_, t)| t.clone())
            });
            if let Some(t) = memo {
                return Ok(t);
            }
            let task = run_audit(command, config, state, paths)?.into_iter().next();
            if let Ok(mut m) = AUDIT_MEMO.lock() {
                *m = Some((key, task.clone()));
            }
            Ok(task)
        }
    }
}

/// The audit's answer for (loop, iteration) within this process: `run` evaluates the gate
/// before the tick and again in its `gate` node, and the audit runs once for both.
/// [`next_task`] bypasses it, since the work of the tick may have changed the answer.
type AuditMemo = Option<((PathBuf, u64), Option<Task>)>;
static AUDIT_MEMO: Mutex<AuditMemo> = Mutex::new(None);

/// Set by `run --dry-run`: work sources must not spawn processes.
static NO_SPAWN: AtomicBool = AtomicBool::new(false);

/// Called as a tick starts: forgets the previous tick's audit answer (a daemon runs many
/// ticks in one process) and, for a dry run, makes work sources spawn nothing.
pub fn begin_tick(dry_run: bool) {
    NO_SPAWN.store(dry_run, Ordering::SeqCst);
    if let Ok(mut m) = AUDIT_MEMO.lock() {
        *m = None;
    }
}

/// The task after a tick's work (the commit node's view): never memoized.
pub fn next_task(
    config: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
) -> Result<Option<Task>, String> {
    if let Ok(mut m) = AUDIT_MEMO.lock() {
        *m = None;
    }
    current_task(config, state, paths)
}

/// How long an audit command may take before it is killed.
const AUDIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Runs the audit command (argv templates, no shell) in the loop's working directory and
/// reads its tasks: one per line, or JSON lines with `id` and `title`. `#` lines and
/// blank lines are ignored. An argv starting with `loopflow` runs this very binary.
pub fn run_audit(
    command: &[crate::template::Tmpl],
    config: &LoopConfig,
    state: &State,
    paths: &LoopPaths,
) -> Result<Vec<Task>, String> {
    let hb = crate::template::engine();
    let vars = source_vars(config, state, paths);
    let mut argv = Vec::new();
    for t in command {
        argv.push(
            crate::template::render(&hb, &t.text, &vars)
                .map_err(|e| format!("work_source.command element `{}`: {e}", t.text))?,
        );
    }
    if argv.first().is_some_and(|a| a == "loopflow")
        && let Ok(exe) = std::env::current_exe()
    {
        argv[0] = exe.display().to_string();
    }
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir for the audit output: {e}"))?;
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let cwd = loop_cwd(config, state, paths);
    let cwd = if cwd.is_dir() {
        cwd
    } else {
        paths.project.clone()
    };
    let done = crate::process::run(&crate::process::Spawn {
        argv: &argv,
        cwd: &cwd,
        env: vec![
            ("LOOPFLOW_LOOP".into(), paths.name.clone()),
            (
                "LOOPFLOW_PROJECT".into(),
                paths.project.display().to_string(),
            ),
        ],
        stdout: out.clone(),
        stderr: err.clone(),
        timeout: Some(AUDIT_TIMEOUT),
        cancel: &cancel,
        on_spawn: None,
    });
    let lossy = |p: &std::path::Path| {
        crate::fs_safe::head(p, crate::fs_safe::TEXT_MAX)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let text = lossy(&out);
    match done.exit {
        crate::process::Exit::Code(0) => {}
        // Linters often exit non-zero exactly when they found something: keep their output.
        crate::process::Exit::Code(_) if !text.trim().is_empty() => {}
        other => {
            let stderr = lossy(&err);
            return Err(format!(
                "audit command `{}` failed ({}): {}",
                argv.join(" "),
                other.reason(),
                stderr.lines().next().unwrap_or("no output")
            ));
        }
    }
    Ok(audit_tasks(&text))
}

/// Parses audit output: plain lines, or JSON objects with `id` (and `title`).
pub fn audit_tasks(text: &str) -> Vec<Task> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let json = l
                .starts_with('{')
                .then(|| serde_json::from_str::<serde_json::Value>(l).ok())
                .flatten();
            let field = |v: &serde_json::Value, k: &str| match &v[k] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            match json {
                Some(v) if field(&v, "id").is_some() || field(&v, "title").is_some() => {
                    let id = field(&v, "id")
                        .or_else(|| field(&v, "title"))
                        .unwrap_or_default();
                    let title = field(&v, "title").unwrap_or_else(|| id.clone());
                    Task {
                        id,
                        title,
                        source: "audit".into(),
                    }
                }
                _ => Task {
                    id: l.to_string(),
                    title: l.to_string(),
                    source: "audit".into(),
                },
            }
        })
        .collect()
}

/// The topmost unchecked `- [ ]` item of a markdown checklist: its id (the bold slug,
/// else the text) and its whole text.
pub fn backlog_item(text: &str) -> Option<(String, String)> {
    text.lines().find_map(|l| {
        let t = l.trim_start();
        let rest = t
            .strip_prefix("- [ ]")
            .or_else(|| t.strip_prefix("* [ ]"))
            .or_else(|| t.strip_prefix("+ [ ]"))?;
        let rest = rest.trim();
        if let Some(after) = rest.strip_prefix("**")
            && let Some(end) = after.find("**")
        {
            let id = after[..end].trim().to_string();
            if !id.is_empty() {
                return Some((id, rest.to_string()));
            }
        }
        (!rest.is_empty()).then(|| (rest.to_string(), rest.to_string()))
    })
}

/// The id of the topmost unchecked `- [ ]` item; a bold slug is its id.
pub fn backlog_top(text: &str) -> Option<String> {
    backlog_item(text).map(|(id, _)| id)
}

fn plateau(history: &[f64], window: usize, epsilon: f64) -> Option<(f64, f64)> {
    if history.len() < window || window == 0 {
        return None;
    }
    let last = &history[history.len() - window..];
    let lo = last.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = last.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // A small tolerance so 0.1 + 0.2 style float noise never breaks "epsilon = 0".
    (hi - lo <= epsilon + 1e-9).then_some((lo, hi))
}

/// Shortest form, at most 4 decimals (`0.8`, `12.5`): cheap, unlike `{:.4}`.
fn fmt_num(n: f64) -> String {
    ((n * 10_000.0).round() / 10_000.0).to_string()
}

/// Evaluates every check in DESIGN §6's order; the first failing one decides.
pub fn evaluate(config: &LoopConfig, state: &State, paths: &LoopPaths) -> GateReport {
    let b = &config.brakes;
    let mut checks = Vec::new();
    let mut verdict = Verdict::Pass;
    let mut decide = |v: Verdict, checks: &mut Vec<Check>, c: Check| {
        if verdict == Verdict::Pass && !c.ok {
            verdict = v;
        }
        checks.push(c);
    };

    let halted = state.halt.as_ref();
    decide(
        Verdict::Skip(format!(
            "halted:{}",
            halted.map_or("", |h| h.reason.as_str())
        )),
        &mut checks,
        Check {
            name: "halted",
            ok: halted.is_none(),
            detail: match halted {
                None => "not halted".into(),
                Some(h) => format!(
                    "halted: {} at {} (run `loopflow approve --loop {}`)",
                    h.reason, h.at, state.name
                ),
            },
        },
    );

    let max = config.effective_max_iterations(state.extra_iterations);
    decide(
        Verdict::Halt {
            reason: "iterations_exhausted".into(),
            detail: format!("{} of {max} iterations used", state.iteration_count),
        },
        &mut checks,
        Check {
            name: "max_iterations",
            ok: state.iteration_count < max,
            detail: format!("{}/{max} iterations", state.iteration_count),
        },
    );

    let mut budget_fail = None;
    let mut budget_detail = Vec::new();
    if let Some(limit) = b.max_budget_usd {
        budget_detail.push(format!(
            "usd {}/{}",
            fmt_num(state.spent.usd),
            fmt_num(limit)
        ));
        if state.spent.usd >= limit {
            budget_fail.get_or_insert("usd");
        }
    }
    if let Some(limit) = b.max_tokens {
        budget_detail.push(format!("tokens {}/{limit}", state.spent.tokens));
        if state.spent.tokens >= limit {
            budget_fail.get_or_insert("tokens");
        }
    }
    if let Some(limit) = b.max_seconds {
        budget_detail.push(format!(
            "seconds {}/{}",
            fmt_num(state.spent.seconds),
            fmt_num(limit)
        ));
        if state.spent.seconds >= limit {
            budget_fail.get_or_insert("seconds");
        }
    }
    let budget_text = if budget_detail.is_empty() {
        "no budget limits".to_string()
    } else {
        budget_detail.join(", ")
    };
    decide(
        Verdict::Halt {
            reason: format!("budget_exhausted:{}", budget_fail.unwrap_or("")),
            detail: budget_text.clone(),
        },
        &mut checks,
        Check {
            name: "budget",
            ok: budget_fail.is_none(),
            detail: budget_text,
        },
    );

    let flat = plateau(
        &state.score_history,
        b.score_plateau_window,
        b.score_plateau_epsilon,
    );
    let recent = &state.score_history[state
        .score_history
        .len()
        .saturating_sub(b.score_plateau_window)..];
    let hist: Vec<String> = recent.iter().map(|s| fmt_num(*s)).collect();
    decide(
        Verdict::Halt {
            reason: "verifier_failed:score_plateau".into(),
            detail: format!(
                "last {} scores [{}] differ by at most {}",
                b.score_plateau_window,
                hist.join(", "),
                fmt_num(b.score_plateau_epsilon)
            ),
        },
        &mut checks,
        Check {
            name: "score_plateau",
            ok: flat.is_none(),
            detail: format!(
                "scores [{}], window {}, epsilon {}",
                hist.join(", "),
                b.score_plateau_window,
                fmt_num(b.score_plateau_epsilon)
            ),
        },
    );

    let task = current_task(config, state, paths);
    let (task_ok, task_detail, task) = match task {
        Ok(Some(t)) => (true, format!("{} (from {})", t.id, t.source), Some(t)),
        Ok(None) => (false, "no current task".to_string(), None),
        Err(e) => (false, format!("work source unreadable: {e}"), None),
    };
    decide(
        Verdict::Skip("no_current_task".into()),
        &mut checks,
        Check {
            name: "task",
            ok: task_ok,
            detail: task_detail,
        },
    );

    let phase_ok = b.run_phases.contains(&state.current_phase);
    decide(
        Verdict::Skip(format!("phase:{}", state.current_phase)),
        &mut checks,
        Check {
            name: "task_phase",
            ok: phase_ok,
            detail: format!(
                "phase `{}`; runs in [{}]",
                state.current_phase,
                b.run_phases.join(", ")
            ),
        },
    );

    let (wt_ok, wt_detail) = if !config.worktree {
        (true, "worktree disabled".to_string())
    } else {
        let path = crate::worktree::dir(paths, state);
        if path.join(".git").exists() {
            (true, format!("worktree at {}", path.display()))
        } else {
            (
                false,
                format!("worktree configured but missing at {}", path.display()),
            )
        }
    };
    decide(
        Verdict::Skip("worktree_missing".into()),
        &mut checks,
        Check {
            name: "worktree",
            ok: wt_ok,
            detail: wt_detail,
        },
    );

    let (ok, reason) = match &verdict {
        Verdict::Pass => (true, None),
        Verdict::Skip(r) => (false, Some(r.clone())),
        Verdict::Halt { reason, .. } => (false, Some(reason.clone())),
    };
    GateReport {
        ok,
        reason,
        checks,
        verdict,
        task,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_picks_topmost_open_item_and_slug() {
        let md = "# B\n- [x] done\n- [ ] **first-thing** — do it\n- [ ] second\n";
        assert_eq!(backlog_top(md).as_deref(), Some("first-thing"));
        assert_eq!(
            backlog_top("- [ ] plain task").as_deref(),
            Some("plain task")
        );
        assert_eq!(backlog_top("- [x] all done"), None);
        assert_eq!(
            backlog_item("- [ ] **a-b** fix it").map(|x| x.1).as_deref(),
            Some("**a-b** fix it")
        );
    }

    #[test]
    fn audit_lines_and_json() {
        let t = audit_tasks(
            "# header\n\nplain task\n{\"id\": \"x1\", \"title\": \"Fix x\"}\n{\"id\": 7}\n",
        );
        let ids: Vec<&str> = t.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["plain task", "x1", "7"]);
        assert_eq!(t[1].title, "Fix x");
        assert_eq!(t[2].title, "7");
    }

    #[test]
    fn plateau_needs_a_full_window() {
        assert_eq!(plateau(&[0.4, 0.4], 3, 0.0), None);
        assert!(plateau(&[0.4, 0.4, 0.4], 3, 0.0).is_some());
        assert!(plateau(&[0.4, 0.5, 0.4], 3, 0.0).is_none());
        assert!(plateau(&[0.4, 0.45, 0.4], 3, 0.05).is_some());
    }
}
