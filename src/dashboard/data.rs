//! What the page shows about each loop, assembled from its files: the `status --json` row,
//! the state (last verdict, halt), whether its configuration loads, and an incremental
//! scan of `.state.log` (halts by death, scores by iteration, the last lines). A loop is
//! rebuilt only when one of its files changed, and its log is read from where the last
//! scan stopped, so the cost of a refresh is a few `stat`s per unchanged loop.

use std::collections::VecDeque;
use std::io::{Seek, SeekFrom};
use std::path::Path;
use std::time::SystemTime;

use crate::reason::{Death, HaltReason};
use crate::row::Row;
use crate::state::{LoopPaths, State};

/// How much of a log the first scan reads: its newest 64 MiB. Older halts are not counted
/// (the page says so), and a giant log cannot stall the page.
const FIRST_SCAN: u64 = 64 << 20;
/// Scores kept for the chart, and log lines kept per loop.
const MAX_SCORES: usize = 120;
const MAX_TAIL: usize = 12;
/// New lines one update hands on for the page's log tail.
pub(super) const NEW_MAX: usize = 60;

/// One `TICK` with a verdict: the chart's points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Point {
    pub iteration: u64,
    pub score: f64,
    pub pass: bool,
}

/// What a scan of `.state.log` found so far, and where it stopped.
#[derive(Debug, Clone, Default)]
pub(super) struct LogScan {
    offset: u64,
    /// A line the last read cut in the middle.
    carry: Vec<u8>,
    /// HALT lines by death, in [`Death::ALL`] order.
    pub deaths: [u64; 5],
    pub points: VecDeque<Point>,
    pub tail: VecDeque<String>,
    /// The first scan started past the log's beginning (older halts are not counted).
    pub partial: bool,
}

impl LogScan {
    /// Reads what was appended since the last call, and returns the newest of the complete
    /// new lines (at most [`NEW_MAX`]). A log that shrank (rotated, truncated) is scanned
    /// afresh.
    pub(super) fn update(&mut self, path: &Path) -> Vec<String> {
        // Never a plain open: a FIFO in place of the log would block the server.
        let Ok((mut f, len)) = crate::fs_safe::open_regular_len(path) else {
            return Vec::new();
        };
        if len < self.offset {
            *self = LogScan::default();
        }
        if self.offset == 0 && len > FIRST_SCAN {
            self.offset = len - FIRST_SCAN;
            self.partial = true;
        }
        // A fresh open is at 0 already: the seek only when the scan resumes.
        if len == self.offset || (self.offset > 0 && f.seek(SeekFrom::Start(self.offset)).is_err())
        {
            return Vec::new();
        }
        let mut buf = std::mem::take(&mut self.carry);
        let start = buf.len();
        let new = len - self.offset;
        if crate::fs_safe::read_capped(&mut f, new, new, &mut buf).is_err() {
            return Vec::new();
        }
        self.offset += (buf.len() - start) as u64;
        let complete = match buf.iter().rposition(|b| *b == b'\n') {
            Some(i) => {
                self.carry = buf.split_off(i + 1);
                buf
            }
            None => {
                self.carry = buf;
                return Vec::new();
            }
        };
        let text = String::from_utf8_lossy(&complete);
        let mut lines = text.lines();
        if self.partial && start == 0 && self.deaths == [0; 5] && self.tail.is_empty() {
            lines.next(); // the first read began mid-line
        }
        let mut new = VecDeque::new();
        for line in lines {
            self.line(line);
            new.push_back(line.to_string());
            if new.len() > NEW_MAX {
                new.pop_front();
            }
        }
        new.into()
    }

    fn line(&mut self, line: &str) {
        // The log's own parser: a timestamp, an event, quoted values unquoted.
        let entry = crate::state::log::parse_line(line);
        match entry.as_ref().map(|e| (e.event.as_str(), e)) {
            Some(("HALT", e)) => {
                let reason: HaltReason = e
                    .words
                    .join(" ")
                    .parse()
                    .unwrap_or_else(|never| match never {});
                let death = reason.death();
                if let Some(i) = Death::ALL.iter().position(|d| *d == death) {
                    self.deaths[i] += 1;
                }
            }
            Some(("TICK", e)) => {
                let arg = |k: &str| e.args.get(k).map(String::as_str);
                let iteration = arg("iter").and_then(|v| v.parse().ok());
                let score = arg("score").and_then(|v| v.parse::<f64>().ok());
                let pass = arg("pass").and_then(|v| v.parse().ok());
                if let (Some(iteration), Some(score), Some(pass)) = (iteration, score, pass)
                    && score.is_finite()
                {
                    self.points.push_back(Point {
                        iteration,
                        score: score.clamp(0.0, 1.0),
                        pass,
                    });
                    if self.points.len() > MAX_SCORES {
                        self.points.pop_front();
                    }
                }
            }
            _ => {}
        }
        self.tail.push_back(line.to_string());
        if self.tail.len() > MAX_TAIL {
            self.tail.pop_front();
        }
    }
}

/// Where a loop stands, for the badge and the order of the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Standing {
    /// Halted: a human must review and approve (goal met or not).
    Halted,
    /// Its state or configuration does not load: every tick fails until a human fixes it.
    Broken,
    Running,
    Ready,
}

/// Everything the page shows about one loop.
#[derive(Debug, Clone)]
pub(super) struct LoopView {
    /// The loop as the page names it: over many projects `<project>:<loop>`.
    pub name: String,
    /// The loop's own name and its project's directory (what the commands shown use).
    pub loop_name: String,
    pub dir: std::path::PathBuf,
    /// Over many projects, the project's label.
    pub project: Option<String>,
    /// Not a loop: a project of many that cannot be read (`broken` says why).
    pub project_broken: bool,
    /// The `status --json` row; `None` when it cannot be built (no or unreadable state).
    pub row: Option<Row>,
    /// Why the state does not load, as `status --json` lists it under `errors`.
    pub row_error: Option<String>,
    /// A committed `loop.toml` without state yet, as `status --json` lists it under
    /// `unstarted`.
    pub unstarted: bool,
    pub state: Option<State>,
    /// Why the loop cannot tick, when it cannot.
    pub broken: Option<String>,
    pub scan: LogScan,
}

impl LoopView {
    /// A project of many that cannot be read, shown as a card of its own.
    pub(super) fn broken_project(label: &str, dir: &Path, why: String) -> LoopView {
        LoopView {
            name: format!("{label}:"),
            loop_name: String::new(),
            dir: dir.to_path_buf(),
            project: Some(label.to_string()),
            project_broken: true,
            row: None,
            row_error: None,
            unstarted: false,
            state: None,
            broken: Some(why),
            scan: LogScan::default(),
        }
    }

    /// This view as one of project `label`'s over many.
    pub(super) fn in_project(mut self, label: &str) -> LoopView {
        self.name = format!("{label}:{}", self.loop_name);
        self.row = self.row.map(|r| r.in_project(label, &self.dir));
        self.project = Some(label.to_string());
        self
    }

    pub(super) fn standing(&self) -> Standing {
        if self.state.as_ref().is_some_and(|s| s.halt.is_some()) {
            Standing::Halted
        } else if self.broken.is_some() {
            Standing::Broken
        } else if self.row.as_ref().is_some_and(|r| r.running) {
            Standing::Running
        } else {
            Standing::Ready
        }
    }

    pub(super) fn halt_reason(&self) -> Option<&HaltReason> {
        self.state.as_ref()?.halt.as_ref().map(|h| &h.reason)
    }
}

/// Why a loop's files do not load, in a sentence with what to do.
fn broken(
    paths: &LoopPaths,
    state: &Result<State, String>,
    loaded: &Option<Result<crate::load::Loaded, crate::load::LoadError>>,
) -> Option<String> {
    if let Err(e) = state {
        return Some(e.clone());
    }
    match loaded.as_ref()? {
        Ok(_) => None,
        Err(crate::load::LoadError::Config(d)) => Some(format!(
            "invalid configuration ({} error(s)){}; every tick exits 3 until it is fixed: run `loopflow check {}`",
            d.error_count(),
            d.items
                .iter()
                .find(|x| x.is_error())
                .map(|x| {
                    let (line, col) = x.start();
                    format!(": {}:{line}:{col}: {}", x.source.name, x.message)
                })
                .unwrap_or_default(),
            paths.config().display()
        )),
        Err(e) => Some(format!("cannot load the loop: {e}")),
    }
}

/// Builds (or, given the previous view, updates) one loop's view; also returns the log
/// lines that are new since `prev`.
pub(super) fn view(project: &Path, name: &str, prev: Option<LoopView>) -> (LoopView, Vec<String>) {
    let paths = LoopPaths::new(project, name);
    // The state is read straight away: a missing file is the open's NotFound, not a
    // `stat` first.
    let loaded_state = paths.load();
    let has_state = !loaded_state
        .as_ref()
        .is_err_and(crate::state::StateError::is_not_found);
    let unstarted = !has_state && paths.never_started();
    let state = if has_state {
        loaded_state.map_err(|e| format!("the state file does not load: {e}"))
    } else if unstarted {
        Err(format!(
            "not started: it has a loop.toml but no state yet (`loopflow create --loop {name}` starts it as committed)"
        ))
    } else {
        Err(format!(
            "no .state.loop in {}: not a loop loopflow tracks (create one with `loopflow create --loop {name}`)",
            paths.dir.display()
        ))
    };
    let mut scan = prev.map(|p| p.scan).unwrap_or_default();
    let new = scan.update(&paths.log);
    // One load says whether the loop can tick and gives the status row its config.
    let loaded = state
        .is_ok()
        .then(|| crate::load::load(&paths, None, project));
    let row = if has_state {
        let known = match (&state, &loaded) {
            (Ok(s), Some(Ok(l))) => Some((s, &l.config)),
            _ => None,
        };
        crate::row::of(&paths, known)
    } else {
        Err(None)
    };
    let (row, row_error) = match row {
        Ok(r) => (Some(r), None),
        Err(e) => (None, e),
    };
    let view = LoopView {
        name: name.to_string(),
        loop_name: name.to_string(),
        dir: project.to_path_buf(),
        project: None,
        project_broken: false,
        row,
        row_error,
        unstarted,
        broken: broken(&paths, &state, &loaded),
        state: state.ok(),
        scan,
    };
    (view, new)
}

/// What changes when a loop's files change: size and mtime of each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct Fingerprint(Vec<Option<(u64, SystemTime)>>);

impl Fingerprint {
    pub(super) fn of(project: &Path, name: &str) -> Fingerprint {
        let p = LoopPaths::new(project, name);
        Fingerprint(
            [&p.state, &p.log, &p.lock, &p.config()]
                .iter()
                .map(|f| {
                    let m = std::fs::metadata(f).ok()?;
                    Some((m.len(), m.modified().ok()?))
                })
                .collect(),
        )
    }
}

/// The five-deaths audit: halts by death, summed over `views`.
pub(super) fn total_deaths<'a>(views: impl IntoIterator<Item = &'a LoopView>) -> [u64; 5] {
    let mut t = [0; 5];
    for v in views {
        for (a, b) in t.iter_mut().zip(v.scan.deaths) {
            *a += b;
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_counts_halts_by_death_and_reads_only_what_is_new() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(".state.log");
        std::fs::write(
            &log,
            "2026-12-01T00:00:00Z TICK pass=false score=0.4 iter=1\n2026-12-01T00:00:00Z HALT goal_met detail=x\n2026-12-01T00:00:00Z HALT lunch break\n2026-12-01T00:00:00Z HALT budget_exhausted:usd\n2026-12-01T00:00:00Z TICK pass=true scor",
        )
        .unwrap();
        let mut s = LogScan::default();
        assert_eq!(s.update(&log).len(), 4);
        assert_eq!(s.deaths, [0, 1, 0, 1, 1]);
        assert_eq!(
            s.points.iter().copied().collect::<Vec<_>>(),
            [Point {
                iteration: 1,
                score: 0.4,
                pass: false
            }]
        );
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(b"e=0.9 iter=2\n2026-12-01T00:00:00Z HALT iterations_exhausted\n")
            .unwrap();
        let new = s.update(&log);
        assert_eq!(
            new,
            [
                "2026-12-01T00:00:00Z TICK pass=true score=0.9 iter=2",
                "2026-12-01T00:00:00Z HALT iterations_exhausted"
            ]
        );
        assert_eq!(s.deaths, [1, 1, 0, 1, 1]);
        assert_eq!(s.points.len(), 2);
        assert!(s.update(&log).is_empty());
        // Truncated: scanned afresh.
        std::fs::write(
            &log,
            "2026-12-01T00:00:00Z HALT verifier_failed:unparseable\n",
        )
        .unwrap();
        s.update(&log);
        assert_eq!(s.deaths, [0, 0, 1, 0, 0]);
    }
}
