//! The loop commands: create, status, log, gate, can-continue, halt, approve,
//! transition, can-edit.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::json;

use crate::config::LoopConfig;
use crate::diag::Diagnostics;
use crate::exec::RunError;
use crate::exit;
use crate::project::{CreateError, CreateOptions, check_loop_name};
use crate::state::{Approval, LogArg, LoopPaths, State, now};

use super::run::report;

#[derive(Args, Debug)]
pub struct LoopArg {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Built-in template to start from: default, ci-triage, self-improvement, goal,
    /// design-update (an unknown name lists them with what each does).
    #[arg(long, default_value = "default")]
    pub template: String,
    /// The task the loop works on (work_source "single").
    #[arg(long)]
    pub task: Option<String>,
    /// Work in the project checkout instead of a git worktree of its own.
    #[arg(long)]
    pub no_worktree: bool,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct LogArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Keep printing new lines as they are appended.
    #[arg(long, short)]
    pub follow: bool,
}

#[derive(Args, Debug)]
pub struct GateArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct HaltArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Why; any text, stored as halt.reason.
    #[arg(long)]
    pub reason: String,
}

#[derive(Args, Debug)]
pub struct ApproveArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// A note recorded with the approval.
    #[arg(long)]
    pub note: Option<String>,
    /// Allow N more iterations on top of brakes.max_iterations.
    #[arg(long, value_name = "N")]
    pub extend: Option<u64>,
    /// Who approves (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
}

#[derive(Args, Debug)]
pub struct TransitionArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// The phase to move the task to.
    #[arg(long)]
    pub to: String,
}

#[derive(Args, Debug)]
pub struct CanEditArgs {
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Paths to check (relative paths resolve against the current directory).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Validates the name and requires the loop's state; prints why not.
fn open(project: &Path, name: &str) -> Result<(LoopPaths, State), i32> {
    if let Err(e) = check_loop_name(name) {
        eprintln!("error: {e}");
        return Err(exit::USAGE);
    }
    let paths = LoopPaths::new(project, name);
    if !paths.state.exists() {
        eprintln!(
            "error: no loop `{name}` in {} (create it with `loopflow create --loop {name}`)",
            project.display()
        );
        return Err(exit::USAGE);
    }
    match paths.load() {
        Ok(s) => Ok((paths, s)),
        Err(e) => Err(report(&RunError::State(e))),
    }
}

fn config(paths: &LoopPaths, project: &Path) -> Result<LoopConfig, i32> {
    let mut d = Diagnostics::default();
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    match LoopConfig::read(&paths.config(), &base, &mut d) {
        Ok(Some(c)) if !d.has_errors() => Ok(c),
        Ok(_) => Err(report(&RunError::Config(d))),
        Err(e) => Err(report(&crate::exec::read_error(&paths.config(), &base, e))),
    }
}

pub fn create(project: &Path, a: CreateArgs) -> i32 {
    let o = CreateOptions {
        name: &a.loop_name,
        template: &a.template,
        task: a.task.clone(),
        worktree: !a.no_worktree,
        harness: None,
    };
    match crate::project::create(project, &o) {
        Ok(paths) => {
            println!("created loop `{}` in {}", a.loop_name, paths.dir.display());
            if !a.no_worktree {
                println!(
                    "  worktree: {} (branch loopflow/{})",
                    paths.worktree.display(),
                    a.loop_name
                );
            }
            println!(
                "  next: edit {} (harness command, brakes), then",
                paths.dir.join("loop.toml").display()
            );
            println!("        loopflow run --loop {} --dry-run", a.loop_name);
            if a.task.is_none() {
                println!("  note: no --task given; the loop skips until it has one");
            }
            exit::OK
        }
        Err(CreateError::Usage(m)) => {
            eprintln!("error: {m}");
            exit::USAGE
        }
        Err(CreateError::Io(m)) => {
            eprintln!("error: {m}");
            exit::STATE
        }
    }
}

pub(super) fn status_row(project: &Path, name: &str) -> Result<serde_json::Value, i32> {
    let (paths, s) = open(project, name)?;
    let cfg = {
        let mut d = Diagnostics::default();
        LoopConfig::read(&paths.config(), project, &mut d)
            .ok()
            .flatten()
    };
    let max = cfg
        .as_ref()
        .map(|c| c.effective_max_iterations(s.extra_iterations));
    let limits = cfg.as_ref().map(|c| {
        json!({
            "usd": c.brakes.max_budget_usd,
            "tokens": c.brakes.max_tokens,
            "seconds": c.brakes.max_seconds,
        })
    });
    // D12: verification by the same model as the implementation is weaker; say so.
    let model = |c: &LoopConfig, r: &str| c.roles.get(r).and_then(|r| r.model.clone());
    let same_model = cfg
        .as_ref()
        .and_then(|c| match (model(c, "implement"), model(c, "verify")) {
            (Some(a), Some(b)) if a == b => Some(a),
            _ => None,
        });
    let task_source = s.task_source.clone();
    Ok(json!({
        "name": s.name,
        "iteration_count": s.iteration_count,
        "max_iterations": max,
        "halt": s.halt,
        "current_task": s.current_task,
        "task_source": task_source,
        "current_phase": s.current_phase,
        "last_tick_at": s.last_tick_at,
        "last_score": s.score_history.last().copied().or(s.last_verdict.as_ref().map(|v| v.score)),
        "spent": s.spent,
        "limits": limits,
        "goal_score": cfg.as_ref().map(|c| c.brakes.goal_score),
        "model_diverse": same_model.is_none(),
        "notes": same_model.map(|m| vec![format!(
            "implement and verify both use model `{m}`: verification is not model-diverse"
        )]).unwrap_or_default(),
        "running": paths.tick_running().unwrap_or(false),
    }))
}

pub fn status(project: &Path, a: StatusArgs) -> i32 {
    let names = match &a.loop_name {
        Some(n) => vec![n.clone()],
        None => crate::project::list_loops(project),
    };
    let mut rows = Vec::new();
    for n in &names {
        match status_row(project, n) {
            Ok(r) => rows.push(r),
            Err(code) if a.loop_name.is_some() => return code,
            Err(_) => {}
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "loops": rows })).unwrap_or_default()
        );
        return exit::OK;
    }
    if rows.is_empty() {
        println!(
            "no loops in {} (create one with `loopflow create --loop NAME`)",
            project.display()
        );
        return exit::OK;
    }
    print!("{}", status_table(&rows));
    for r in &rows {
        for n in r["notes"].as_array().into_iter().flatten() {
            println!(
                "note: {}: {}",
                r["name"].as_str().unwrap_or("?"),
                n.as_str().unwrap_or("")
            );
        }
    }
    exit::OK
}

/// The aligned table `status` prints.
pub fn status_table(rows: &[serde_json::Value]) -> String {
    let head = [
        "LOOP",
        "ITER",
        "STATE",
        "PHASE",
        "SCORE",
        "SPENT",
        "LAST TICK",
        "TASK",
    ];
    let mut table: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for r in rows {
        let s = |k: &str| printable(r.get(k).and_then(|v| v.as_str()).unwrap_or("-"));
        let iter = format!(
            "{}/{}",
            r["iteration_count"],
            r["max_iterations"]
                .as_u64()
                .map_or("?".into(), |m| m.to_string())
        );
        let state = if r["running"].as_bool() == Some(true) {
            "running".to_string()
        } else {
            match r["halt"]["reason"].as_str() {
                Some(h) => format!("HALTED {}", printable(h)),
                None => "ok".into(),
            }
        };
        let score = r["last_score"]
            .as_f64()
            .map_or("-".into(), |x| format!("{x:.2}"));
        // spent/limit per unit; a unit with no limit shows what was spent only.
        let lim = |k: &str| r["limits"][k].as_f64();
        let spent = format!(
            "${:.2}{} {}{}tok {:.0}{}s",
            r["spent"]["usd"].as_f64().unwrap_or(0.0),
            lim("usd").map_or(String::new(), |l| format!("/{l:.2}")),
            r["spent"]["tokens"].as_u64().unwrap_or(0),
            lim("tokens").map_or(String::new(), |l| format!("/{l:.0}")),
            r["spent"]["seconds"].as_f64().unwrap_or(0.0),
            lim("seconds").map_or(String::new(), |l| format!("/{l:.0}")),
        );
        let task = match r["task_source"].as_str() {
            Some(src) if r["current_task"].is_string() => {
                format!("{} ({})", s("current_task"), printable(src))
            }
            _ => s("current_task"),
        };
        table.push(vec![
            s("name"),
            iter,
            state,
            s("current_phase"),
            score,
            spent,
            s("last_tick_at"),
            task,
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in table {
        let line: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i + 1 == row.len() {
                    cell.clone()
                } else {
                    format!("{cell:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Text from the state (a halt reason, a task title) made safe for a terminal: control
/// characters (ESC and the rest) are shown escaped, so an agent cannot repaint what a
/// human reads before approving.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Log bytes made safe for a terminal: line breaks and tabs pass, other control bytes are
/// shown as `\xNN` (an agent can append to the log file directly).
fn printable_bytes(buf: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(buf.len());
    for &b in buf {
        if (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

pub fn log(project: &Path, a: LogArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut pos = 0u64;
    loop {
        if let Ok(mut f) = std::fs::File::open(&paths.log) {
            let _ = f.seek(SeekFrom::Start(pos));
            // In chunks: a log of any size streams in bounded memory.
            let mut buf = vec![0u8; 64 * 1024];
            let mut out = std::io::stdout().lock();
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                pos += n as u64;
                if out.write_all(&printable_bytes(&buf[..n])).is_err() {
                    return exit::OK; // stdout closed (e.g. `| head`)
                }
            }
            if out.flush().is_err() {
                return exit::OK;
            }
        }
        if !a.follow {
            return exit::OK;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// The gate's report for a loop, or the exit code of why it cannot be evaluated.
fn evaluate_gate(project: &Path, name: &str) -> Result<crate::brakes::GateReport, i32> {
    let (paths, state) = open(project, name)?;
    let cfg = config(&paths, project)?;
    Ok(crate::brakes::evaluate(&cfg, &state, &paths))
}

pub fn gate(project: &Path, a: GateArgs) -> i32 {
    let r = match evaluate_gate(project, &a.loop_name) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if a.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        println!(
            "gate for loop {}: {}",
            a.loop_name,
            r.reason
                .as_deref()
                .map_or("ok".into(), |x| format!("not ok ({x})"))
        );
        for c in &r.checks {
            println!(
                "  {} {:<14} {}",
                if c.ok { "ok " } else { "NO " },
                c.name,
                c.detail
            );
        }
    }
    if r.ok { exit::OK } else { exit::NO }
}

pub fn can_continue(project: &Path, a: LoopArg) -> i32 {
    let r = match evaluate_gate(project, &a.loop_name) {
        Ok(r) => r,
        Err(code) => return code,
    };
    if let Some(reason) = &r.reason {
        eprintln!("loop {} cannot continue: {reason}", a.loop_name);
        exit::NO
    } else {
        exit::OK
    }
}

pub fn halt(project: &Path, a: HaltArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let reason = a.reason.replace(['\n', '\r'], " ");
    let r = paths.update(|s| {
        s.halt = Some(crate::state::Halt {
            reason: reason.clone(),
            detail: Some("halted by `loopflow halt`".into()),
            at: now(),
            iteration: s.iteration_count,
        });
    });
    if let Err(e) = r.and_then(|_| paths.log("HALT", &[LogArg::Word(&reason)])) {
        return report(&RunError::State(e));
    }
    crate::schedule::disable_best_effort(&paths);
    println!("halted loop {}: {reason}", a.loop_name);
    exit::OK
}

pub fn approve(project: &Path, a: ApproveArgs) -> i32 {
    if let Err(e) = check_loop_name(&a.loop_name) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    // The lock first, whatever the state: an agent inside a tick can never approve or
    // extend its own loop.
    let paths = LoopPaths::new(project, &a.loop_name);
    match paths.tick_running() {
        Ok(false) => {}
        Ok(true) => {
            eprintln!(
                "error: refused: a tick of loop {} is running; approvals are made by a human between ticks",
                a.loop_name
            );
            return exit::NO;
        }
        Err(e) => return report(&RunError::State(e)),
    }
    let (paths, state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    if state.halt.is_none() && a.extend.is_none() {
        println!("loop {} is not halted; nothing to approve", a.loop_name);
        return exit::OK;
    }
    let by =
        a.by.clone()
            .or_else(|| std::env::var("USER").ok())
            .or_else(|| std::env::var("USERNAME").ok())
            .unwrap_or_else(|| "unknown".into());
    let extend = a.extend.unwrap_or(0);
    let r = paths.update(|s| {
        let cleared = s.halt.take().map(|h| h.reason);
        if cleared.as_deref() == Some("verifier_failed:score_plateau") {
            // Otherwise the same flat window would halt the very next tick.
            s.score_history.clear();
        }
        s.consecutive_aborts = 0;
        s.extra_iterations = s.extra_iterations.saturating_add(extend);
        s.approvals.push(Approval {
            by: by.clone(),
            at: now(),
            note: a.note.clone(),
            cleared: cleared.clone(),
            extend,
        });
        cleared
    });
    let (new_state, cleared) = match r {
        Ok(x) => x,
        Err(e) => return report(&RunError::State(e)),
    };
    let mut args = vec![LogArg::Kv("by", by.clone())];
    if let Some(n) = &a.note {
        args.push(LogArg::Kv("note", n.clone()));
    }
    if let Some(c) = &cleared {
        args.push(LogArg::Kv("cleared", c.clone()));
    }
    if extend > 0 {
        args.push(LogArg::Kv("extend", extend.to_string()));
    }
    if let Err(e) = paths.log("APPROVE", &args) {
        return report(&RunError::State(e));
    }
    crate::schedule::enable_best_effort(&paths);
    println!(
        "approved loop {}{}{}",
        a.loop_name,
        cleared
            .map(|c| format!(" (cleared halt {c})"))
            .unwrap_or_default(),
        if extend > 0 {
            format!(", +{extend} iterations")
        } else {
            String::new()
        }
    );
    if let Ok(cfg) = config(&paths, project) {
        let max = cfg.effective_max_iterations(new_state.extra_iterations);
        if new_state.iteration_count >= max {
            println!(
                "note: the loop is at its cap ({}/{max}); it will halt again on its next tick unless you pass --extend N",
                new_state.iteration_count
            );
        }
    }
    exit::OK
}

pub fn transition(project: &Path, a: TransitionArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    if a.to.trim().is_empty() || a.to.chars().any(char::is_whitespace) {
        eprintln!("error: a phase is one word, e.g. `implement`, `review`, `done`");
        return exit::USAGE;
    }
    let r = paths.update(|s| std::mem::replace(&mut s.current_phase, a.to.clone()));
    match r {
        Ok((_, from)) => {
            if let Err(e) = paths.log(
                "TRANSITION",
                &[
                    LogArg::Kv("from", from.clone()),
                    LogArg::Kv("to", a.to.clone()),
                ],
            ) {
                return report(&RunError::State(e));
            }
            println!("loop {}: phase {from} → {}", a.loop_name, a.to);
            exit::OK
        }
        Err(e) => report(&RunError::State(e)),
    }
}

pub fn can_edit(project: &Path, a: CanEditArgs) -> i32 {
    let (paths, state) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    let cfg = match config(&paths, project) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let root = if cfg.worktree {
        crate::worktree::dir(&paths, &state)
    } else {
        project.to_path_buf()
    };
    let radius = match crate::blast::Radius::new(&root, &cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot evaluate the blast radius: {e}");
            return exit::STATE;
        }
    };
    let mut ok = true;
    for p in &a.paths {
        if let Err(why) = radius.check(p) {
            ok = false;
            println!("refused: {}: {why}", p.display());
        }
    }
    if ok { exit::OK } else { exit::NO }
}
