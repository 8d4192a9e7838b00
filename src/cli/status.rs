//! `status` and `log`: where every loop stands, and its event log, made safe for the
//! terminal a human approves from.

use std::path::Path;

use clap::Args;
use serde_json::json;

use super::open;
use crate::exit;
use crate::out::{self, outln, printable};
use crate::row::{NoRow, Row, status_row};
use crate::state::LoopPaths;

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    /// Only this loop (default: every loop of the project).
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: Option<String>,
    /// Print one JSON document, `{"loops": [...], "errors": [...]}`, instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Every project in the registry (`loopflow projects`), loops named `project:loop`,
    /// halted first.
    #[arg(long)]
    pub all: bool,
}

#[derive(Args, Debug)]
pub(crate) struct LogArgs {
    /// The loop whose `.state.log` to print.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Keep printing new lines as they are appended.
    #[arg(long, short)]
    pub follow: bool,
    /// One JSON object per event line (JSON Lines): `{"at", "event", "args", "words"}`.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn status(project: &Path, a: StatusArgs) -> i32 {
    let names = match &a.loop_name {
        Some(n) => {
            // One named loop: a missing or unreadable one is an error of this command.
            if let Err(code) = open(project, n) {
                return code;
            }
            vec![n.clone()]
        }
        None => crate::state::list_loops(project),
    };
    let mut rows = Vec::new();
    let mut errors = Vec::new();
    // A committed loop.toml without state (a fresh clone): a loop nobody started yet.
    let mut unstarted = Vec::new();
    for n in &names {
        let paths = LoopPaths::new(project, n);
        if a.loop_name.is_none() {
            super::remote::refresh_listed(&paths, n);
        }
        match status_row(&paths) {
            Ok(r) => rows.push(r),
            Err(NoRow::Untracked) => {
                if paths.never_started() {
                    unstarted.push(n.clone());
                }
            }
            Err(NoRow::Unreadable(e)) => {
                eprintln!("error: {e}");
                errors.push((n.as_str(), e));
            }
        }
    }
    let code = if errors.is_empty() {
        exit::OK
    } else {
        exit::STATE
    };
    if a.json {
        let errors: Vec<_> = errors
            .iter()
            .map(|(n, e)| json!({"name": n, "error": e}))
            .collect();
        outln!(
            "{}",
            out::json(
                &json!({ "loops": rows, "errors": errors, "unstarted": unstarted }),
                true
            )
        );
        return code;
    }
    let not_started = || {
        for n in &unstarted {
            outln!(
                "not started: {n} has a loop.toml but no state yet (`loopflow create --loop {n}` starts it as committed)"
            );
        }
    };
    if rows.is_empty() && errors.is_empty() {
        if unstarted.is_empty() {
            outln!(
                "no loops in {} (create one with `loopflow create --loop NAME`)",
                project.display()
            );
        }
        not_started();
        return code;
    }
    let unreadable: Vec<&str> = errors.iter().map(|(n, _)| *n).collect();
    out::write(status_table(&rows, &unreadable).as_bytes());
    for r in &rows {
        let name = printable(&r.name).into_owned();
        if let Some(e) = &r.config_error {
            outln!(
                "note: {name}: invalid loop.toml: {} (`loopflow check` lists every problem)",
                printable(&cap(e, 200))
            );
        }
        for n in &r.notes {
            outln!("note: {name}: {}", printable(n));
        }
        if let Some(a) = &r.last_abort
            && let Some(m) = &a.message
        {
            outln!(
                "note: {name}: last abort ({} {}, {}): {}{}",
                printable(a.node.as_deref().unwrap_or("?")),
                printable(a.reason.as_deref().unwrap_or("?")),
                printable(&a.at),
                printable(&cap(&m.replace('\n', " | "), 300)),
                match a.outputs.first() {
                    Some(f) => format!(
                        " (see .loopflow/loops/{}/{})",
                        printable(r.loop_name.as_deref().unwrap_or(&r.name)),
                        printable(f)
                    ),
                    None => String::new(),
                }
            );
        }
        if let Some(k) = &r.skipping {
            outln!(
                "note: {name}: every tick skips ({}): {}; {}",
                printable(&k.reason),
                printable(&k.detail),
                printable(&k.fix)
            );
        }
    }
    not_started();
    // What the kernel can confine (each loop's `[sandbox] mode` is in `--json`).
    outln!("sandbox: {}", crate::sandbox::kernel_summary());
    code
}

/// `s` cut to `max` characters, with `…` when cut.
fn cap(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The aligned table `status` prints: a line per row, then one per loop whose state does
/// not load (`unreadable`, by name).
pub(super) fn status_table(rows: &[Row], unreadable: &[&str]) -> String {
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
    let cell = |v: Option<&str>| printable(v.unwrap_or("-")).into_owned();
    for r in rows {
        let iter = format!(
            "{}/{}",
            r.iteration_count,
            r.max_iterations.map_or("?".into(), |m| m.to_string())
        );
        let score = r.last_score.map_or("-".into(), |x| format!("{x:.2}"));
        // spent/limit per unit; a unit with no limit shows what was spent only.
        let limits = r.limits.as_ref();
        let spent = format!(
            "${:.2}{} {}{}tok {:.0}{}s",
            r.spent.usd,
            limits
                .and_then(|l| l.usd)
                .map_or(String::new(), |l| format!("/{l:.2}")),
            r.spent.tokens,
            limits
                .and_then(|l| l.tokens)
                .map_or(String::new(), |l| format!("/{l:.0}")),
            r.spent.seconds,
            limits
                .and_then(|l| l.seconds)
                .map_or(String::new(), |l| format!("/{l:.0}")),
        );
        let task = match (&r.task_source, &r.current_task) {
            (Some(src), Some(t)) => format!("{} ({})", printable(t), printable(src)),
            _ => cell(r.current_task.as_deref()),
        };
        table.push(vec![
            cell(Some(&r.name)),
            iter,
            state_cell(r),
            cell(Some(&r.current_phase)),
            score,
            spent,
            cell(r.last_tick_at.as_deref()),
            task,
        ]);
    }
    for name in unreadable {
        let mut row = vec!["-".to_string(); head.len()];
        row[0] = cell(Some(name));
        row[2] = "UNREADABLE STATE (see the error above)".into();
        table.push(row);
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

/// The STATE cell: what a human must look at first.
fn state_cell(r: &Row) -> String {
    if r.running {
        return "running".into();
    }
    if let Some(h) = &r.halt {
        if h.reason == crate::reason::HaltReason::Closed {
            return "closed".into();
        }
        return format!("HALTED {}", printable(&h.reason.to_string()));
    }
    if r.config_error.is_some() {
        return "INVALID CONFIG".into();
    }
    if let Some(k) = &r.skipping {
        return format!("SKIPPING ({})", printable(&k.reason));
    }
    match r.consecutive_aborts {
        0 => "ok".into(),
        n => {
            let why = match r.last_abort.as_ref().map(|a| (&a.node, &a.reason)) {
                Some((Some(node), Some(reason))) => {
                    format!(": {} {}", printable(node), printable(reason))
                }
                _ => String::new(),
            };
            format!("ABORTING ({n} in a row{why})")
        }
    }
}

/// The longest log line `log --json` reads whole; the rest of a longer one is dropped
/// (bounded memory whatever an agent appended).
const MAX_LINE: usize = 1 << 20;

/// Log bytes turned into JSON Lines, one object per complete line; an incomplete last
/// line waits for its end (`--follow`) or for [`JsonLines::finish`].
#[derive(Default)]
struct JsonLines {
    partial: Vec<u8>,
    /// The current line passed [`MAX_LINE`]: drop bytes until its newline.
    overlong: bool,
}

impl JsonLines {
    fn push(&mut self, mut chunk: &[u8], out: &mut Vec<u8>) {
        while let Some(i) = chunk.iter().position(|&b| b == b'\n') {
            self.take(&chunk[..i]);
            self.emit(out);
            chunk = &chunk[i + 1..];
        }
        self.take(chunk);
    }

    fn take(&mut self, bytes: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.partial.len());
        if bytes.len() > room {
            self.overlong = true;
        }
        self.partial
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    fn emit(&mut self, out: &mut Vec<u8>) {
        let text = String::from_utf8_lossy(&self.partial);
        let v = match crate::state::log::parse_line(&text) {
            Some(e) if !self.overlong => json!(e),
            _ => json!({"at": null, "event": null, "args": {}, "words": [], "unparsed": text}),
        };
        out.extend_from_slice(out::json(&v, false).as_bytes());
        out.push(b'\n');
        self.partial.clear();
        self.overlong = false;
    }

    fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.partial.is_empty() || self.overlong {
            self.emit(out);
        }
    }
}

pub(super) fn log(project: &Path, a: LogArgs) -> i32 {
    let (paths, _) = match open(project, &a.loop_name) {
        Ok(x) => x,
        Err(c) => return c,
    };
    use std::io::{Read, Seek, SeekFrom};
    let mut pos = 0u64;
    let mut text = out::ByteEscaper::default();
    let mut json = JsonLines::default();
    let mut convert = |chunk: &[u8], end: bool| {
        let mut o = Vec::with_capacity(chunk.len() + 64);
        if a.json {
            json.push(chunk, &mut o);
            if end {
                json.finish(&mut o);
            }
        } else {
            text.push(chunk, &mut o);
            if end {
                text.finish(&mut o);
            }
        }
        o
    };
    loop {
        // Never a plain open: a FIFO an agent put in place of the log would block it.
        if let Ok(mut f) = crate::fs_safe::open_regular(&paths.log) {
            let _ = f.seek(SeekFrom::Start(pos));
            // In chunks: a log of any size streams in bounded memory.
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = f.read(&mut buf) {
                if n == 0 {
                    break;
                }
                pos += n as u64;
                if !out::write(&convert(&buf[..n], false)) {
                    return exit::OK; // stdout closed (`| head`): stop quietly
                }
            }
        }
        if !a.follow {
            out::write(&convert(&[], true));
            return exit::OK;
        }
        if out::closed() {
            return exit::OK;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// `status` over many projects (`--all`, `--project` more than once): every loop named
/// `project:loop`, halted first, then by name; a project that cannot be read is listed
/// as broken (in `--json`, under `errors` with its `project_dir`) and the others shown.
pub(super) fn status_many(sources: &[crate::projects::Source], a: StatusArgs) -> i32 {
    let mut rows = Vec::new();
    let mut errors: Vec<serde_json::Value> = Vec::new();
    let mut unreadable: Vec<String> = Vec::new();
    let mut broken: Vec<(String, String)> = Vec::new();
    let mut unstarted = Vec::new();
    for src in sources {
        if let Some(why) = crate::projects::problem(&src.dir) {
            eprintln!("error: project {}: {why}", src.label);
            errors.push(json!({"project": src.label, "project_dir": src.dir, "error": why}));
            broken.push((src.label.clone(), why));
            continue;
        }
        for n in crate::state::list_loops(&src.dir) {
            let qualified = format!("{}:{n}", src.label);
            if a.loop_name
                .as_ref()
                .is_some_and(|want| *want != n && *want != qualified)
            {
                continue;
            }
            let paths = LoopPaths::new(&src.dir, &n);
            super::remote::refresh_listed(&paths, &qualified);
            match status_row(&paths) {
                Ok(r) => rows.push(r.in_project(&src.label, &src.dir)),
                Err(NoRow::Untracked) => {
                    if paths.never_started() {
                        unstarted.push(qualified);
                    }
                }
                Err(NoRow::Unreadable(e)) => {
                    eprintln!("error: {qualified}: {e}");
                    errors.push(json!({"name": qualified, "project": src.label, "project_dir": src.dir, "error": e}));
                    unreadable.push(qualified);
                }
            }
        }
    }
    // Halted loops wait for a human: first, across every project.
    // A closed loop waits for nobody.
    let waits = |r: &Row| {
        r.halt
            .as_ref()
            .is_some_and(|h| h.reason != crate::reason::HaltReason::Closed)
    };
    rows.sort_by(|x, y| (!waits(x), &x.name).cmp(&(!waits(y), &y.name)));
    let code = if errors.is_empty() {
        exit::OK
    } else {
        exit::STATE
    };
    if a.json {
        let projects: Vec<_> = sources
            .iter()
            .map(|s| json!({"label": s.label, "dir": s.dir}))
            .collect();
        outln!(
            "{}",
            out::json(
                &json!({ "projects": projects, "loops": rows, "errors": errors, "unstarted": unstarted }),
                true
            )
        );
        return code;
    }
    if rows.is_empty() && unreadable.is_empty() {
        outln!(
            "no loops in {} project(s) (create one with `loopflow create --loop NAME` in a project)",
            sources.len()
        );
    } else {
        let names: Vec<&str> = unreadable.iter().map(String::as_str).collect();
        out::write(status_table(&rows, &names).as_bytes());
    }
    for r in &rows {
        if let Some(k) = &r.skipping {
            outln!(
                "note: {}: every tick skips ({}): {}",
                printable(&r.name),
                printable(&k.reason),
                printable(&k.fix)
            );
        }
        if r.config_error.is_some() {
            outln!(
                "note: {}: invalid loop.toml (`loopflow check` in {} lists every problem)",
                printable(&r.name),
                printable(
                    &r.project_dir
                        .as_deref()
                        .unwrap_or(Path::new("."))
                        .display()
                        .to_string()
                )
            );
        }
    }
    for (label, why) in &broken {
        outln!(
            "broken project: {}: {}",
            printable(label),
            printable(&cap(why, 300))
        );
    }
    for n in &unstarted {
        outln!("not started: {n} has a loop.toml but no state yet");
    }
    code
}
