//! `loopflow report --html FILE`: one self-contained HTML page with every loop of the
//! project (state, brakes, spend, the last verdict, the recent log), for a human deciding
//! whether to approve. Every value is agent-influenced text and is HTML-escaped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::Value;

use crate::exit;
use crate::state::LoopPaths;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Where to write the page (replaced atomically).
    #[arg(long, value_name = "FILE")]
    pub html: PathBuf,
    /// How many of each loop's latest log lines to include.
    #[arg(long, default_value_t = 30)]
    pub log_lines: usize,
}

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn tail(path: &Path, n: usize) -> Vec<String> {
    let bytes = crate::fs_safe::tail(path, 256 * 1024).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn loop_section(out: &mut String, project: &Path, name: &str, row: &Value, log_lines: usize) {
    let paths = LoopPaths::new(project, name);
    let state = paths.load().ok();
    let halted = row["halt"]["reason"].as_str();
    let badge = match halted {
        Some(r) => format!("<span class=\"halt\">HALTED {}</span>", escape(r)),
        None if row["running"].as_bool() == Some(true) => {
            "<span class=\"run\">running</span>".into()
        }
        None => "<span class=\"ok\">ok</span>".into(),
    };
    let _ = writeln!(out, "<section><h2>{} {badge}</h2>", escape(name));
    let _ = writeln!(out, "<table>");
    let iter = format!(
        "{} / {}",
        text(&row["iteration_count"]),
        text(&row["max_iterations"])
    );
    let mut facts: Vec<(&str, String)> = vec![
        ("iteration", iter),
        ("phase", text(&row["current_phase"])),
        ("task", text(&row["current_task"])),
        ("task source", text(&row["task_source"])),
        ("last tick", text(&row["last_tick_at"])),
        ("last score", text(&row["last_score"])),
        ("goal score", text(&row["goal_score"])),
    ];
    for unit in ["usd", "tokens", "seconds"] {
        let spent = text(&row["spent"][unit]);
        let limit = &row["limits"][unit];
        let v = if limit.is_null() {
            spent
        } else {
            format!("{spent} / {}", text(limit))
        };
        facts.push((unit, v));
    }
    if let Some(h) = row["halt"].as_object() {
        facts.push(("halt detail", h.get("detail").map(text).unwrap_or_default()));
        facts.push(("halted at", h.get("at").map(text).unwrap_or_default()));
    }
    if let Some(s) = &state {
        let hist: Vec<String> = s.score_history.iter().map(|x| x.to_string()).collect();
        facts.push(("score history", hist.join(", ")));
        if let Some(v) = &s.last_verdict {
            facts.push(("last verdict", format!("pass={} score={}", v.pass, v.score)));
            facts.push(("reasons", v.reasons.join(" · ")));
            facts.push(("next hint", v.next_hint.clone().unwrap_or_default()));
        }
        if let Some(a) = s.approvals.last() {
            facts.push((
                "last approval",
                format!(
                    "{} at {}{}",
                    a.by,
                    a.at,
                    a.note
                        .as_ref()
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default()
                ),
            ));
        }
    }
    for (k, v) in facts {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(k),
            escape(&v)
        );
    }
    let _ = writeln!(out, "</table>");
    let log = tail(&paths.log, log_lines);
    let _ = writeln!(
        out,
        "<details open><summary>last {} log lines</summary><pre>",
        log.len()
    );
    for l in log {
        let _ = writeln!(out, "{}", escape(&l));
    }
    let _ = writeln!(out, "</pre></details>");
    if halted.is_some() {
        let _ = writeln!(
            out,
            "<p class=\"next\">Approve after review: <code>loopflow --project {} approve --loop {} --note \"…\"</code></p>",
            escape(&project.display().to_string()),
            escape(name)
        );
    }
    let _ = writeln!(out, "</section>");
}

pub fn report(project: &Path, a: ReportArgs) -> i32 {
    let names = crate::state::list_loops(project);
    let mut body = String::new();
    for n in &names {
        if let Ok(row) = super::status::status_row(project, n) {
            loop_section(&mut body, project, n, &row, a.log_lines);
        }
    }
    if names.is_empty() {
        body.push_str(
            "<p>No loops in this project yet: <code>loopflow create --loop NAME</code>.</p>\n",
        );
    }
    let page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
<title>loopflow report: {title}</title>\n<style>\n\
body{{font:15px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}\n\
h1{{font-size:1.4rem}} h2{{font-size:1.15rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}}\n\
table{{border-collapse:collapse;margin:.5rem 0}} th{{text-align:left;padding:.15rem 1rem .15rem 0;color:#555;font-weight:500;vertical-align:top}}\n\
td{{padding:.15rem 0;white-space:pre-wrap}} pre{{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:13px}}\n\
.halt{{color:#a00;font-size:.9rem}} .ok{{color:#070;font-size:.9rem}} .run{{color:#06c;font-size:.9rem}} .next{{font-size:.9rem}}\n\
</style></head><body>\n<h1>loopflow report: {title}</h1>\n<p>Generated {at} · {n} loop(s)</p>\n{body}</body></html>\n",
        title = escape(&project.display().to_string()),
        at = crate::state::now(),
        n = names.len(),
    );
    let dir = a
        .html
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    match crate::fs_safe::write_atomic(dir, &a.html, page.as_bytes()) {
        Ok(()) => {
            println!("wrote {} ({} loop(s))", a.html.display(), names.len());
            exit::OK
        }
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", a.html.display());
            exit::STATE
        }
    }
}
