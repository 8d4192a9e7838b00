//! `status` and `log`: where every loop stands, and its event log, made safe for the
//! terminal a human approves from.

use std::path::Path;

use clap::Args;
use serde_json::json;

use super::open;
use crate::config::LoopConfig;
use crate::diag::Diagnostics;
use crate::exit;

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
        None => crate::state::list_loops(project),
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
    // comfy-table aligns by display width (CJK, emoji), not by `char` count.
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING)
        .set_content_arrangement(comfy_table::ContentArrangement::Disabled);
    let mut rows = table.into_iter();
    if let Some(h) = rows.next() {
        t.set_header(h);
    }
    for r in rows {
        t.add_row(r);
    }
    for c in t.column_iter_mut() {
        c.set_padding((0, 2));
    }
    let mut out = String::new();
    for line in t.lines() {
        out.push_str(line.trim_end());
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
