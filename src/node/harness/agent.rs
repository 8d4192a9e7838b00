//! What the harness does around a preset's agent: makes its own state ready (the loop's,
//! seeded from the user's), watches for its provider's usage or rate limit while it runs
//! (a CLI that waits out the limit by itself is stopped at once, not at the timeout),
//! turns a limit into a skip every loop with that preset and credential shares, and
//! keeps the agent's own words when it fails.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::node::{NodeCtx, NodeOutput};
use crate::preset::limit::{LimitRule, LimitSource, Record};
use crate::preset::{Preset, home};
use crate::reason::SkipReason;

/// How often a running agent's output or log is looked at for a limit.
const WATCH_EVERY: Duration = Duration::from_millis(300);

/// The most of a stream or log read for a limit (its tail).
const READ_CAP: u64 = 1 << 20;

/// The agent's state, ready for the spawn.
pub(super) struct Prepared {
    pub env: Vec<(String, String)>,
    pub write: Vec<PathBuf>,
    pub root: Option<PathBuf>,
}

/// Makes `preset`'s own state ready for this loop (nothing for a preset without one).
pub(super) fn prepare(ctx: &NodeCtx<'_>, preset: &Preset) -> Result<Prepared, home::HomeError> {
    if preset.state.is_empty() {
        return Ok(Prepared {
            env: Vec::new(),
            write: Vec::new(),
            root: None,
        });
    }
    let scope = ctx.scope();
    let root = home::root(scope.project, scope.loop_name, preset.name)?;
    let h = home::prepare(&preset.state, &root)?;
    for note in h.notes {
        ctx.warn(format!("{}: {note}", preset.name));
    }
    Ok(Prepared {
        env: h.env,
        write: h.write,
        root: Some(root),
    })
}

/// Where a limit rule reads, for this run.
fn source_path(rule: &LimitRule, out: &Path, err: &Path, root: Option<&Path>) -> Option<PathBuf> {
    match &rule.from {
        LimitSource::Stdout => Some(out.to_path_buf()),
        LimitSource::Stderr => Some(err.to_path_buf()),
        LimitSource::Log(rel) => root.map(|r| r.join(rel)),
    }
}

/// The bytes of `path` after `from` (at most the last [`READ_CAP`] of them), as text.
fn read_after(path: &Path, from: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = crate::fs_safe::open_regular(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let start = from.max(len.saturating_sub(READ_CAP)).min(len);
    let mut bytes = Vec::new();
    if f.seek(SeekFrom::Start(start)).is_ok() {
        let _ = f.take(READ_CAP).read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn len_of(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).map_or(0, |m| m.len())
}

/// Watches a running agent for its provider's limit; see [`Watch::run`].
pub(super) struct Watch<'a> {
    rule: &'a LimitRule,
    path: PathBuf,
    /// Where the source stood when the agent started (a log outlives runs).
    start: u64,
    pub hit: Mutex<Option<String>>,
    done: AtomicBool,
}

impl<'a> Watch<'a> {
    pub(super) fn new(
        ctx: &NodeCtx<'_>,
        rule: &'a LimitRule,
        root: Option<&Path>,
    ) -> Option<Watch<'a>> {
        let out = ctx.output_file(ctx.id(), "stdout");
        let err = ctx.output_file(ctx.id(), "stderr");
        let path = source_path(rule, &out, &err, root)?;
        let start = match rule.from {
            LimitSource::Log(_) => len_of(&path),
            _ => 0,
        };
        Some(Watch {
            rule,
            path,
            start,
            hit: Mutex::new(None),
            done: AtomicBool::new(false),
        })
    }

    /// Until [`Watch::stop`]: looks at the source every [`WATCH_EVERY`]; on a limit,
    /// records it and stops the node's processes (the CLI would otherwise sleep out the
    /// provider's `retry-after`, an hour of a tick for nothing).
    pub(super) fn run(&self, ctx: &NodeCtx<'_>) {
        if !self.rule.watch {
            return;
        }
        let mut seen = self.start;
        while !self.done.load(Ordering::SeqCst) {
            std::thread::sleep(WATCH_EVERY);
            let len = len_of(&self.path);
            if len == seen {
                continue;
            }
            seen = len;
            if let Some(m) = self.rule.detect(&read_after(&self.path, self.start)) {
                if let Ok(mut h) = self.hit.lock() {
                    *h = Some(m);
                }
                let scope = ctx.scope();
                stop_node(scope.loop_name, scope.project, ctx.id());
                return;
            }
        }
    }

    pub(super) fn stop(&self) {
        self.done.store(true, Ordering::SeqCst);
    }

    /// The limit, from the watch or from what the agent left once it ended.
    pub(super) fn found(&self) -> Option<String> {
        if let Some(m) = self.hit.lock().ok().and_then(|h| h.clone()) {
            return Some(m);
        }
        self.rule.detect(&read_after(&self.path, self.start))
    }
}

/// Kills every process of this node (they carry the loop's and the node's marks in their
/// environment, as the tick set them). The agent's own `run` then ends by the signal.
fn stop_node(loop_name: &str, project: &Path, node: &str) {
    #[cfg(target_os = "linux")]
    {
        let mut marks: Vec<Vec<u8>> = crate::process::loop_marks(loop_name, project)
            .into_iter()
            .map(String::into_bytes)
            .collect();
        marks.push(format!("LOOPFLOW_NODE={node}").into_bytes());
        let me = std::process::id() as i32;
        // Twice: a child caught mid-fork the first time is seen the second.
        for _ in 0..2 {
            let Ok(rd) = std::fs::read_dir("/proc") else {
                return;
            };
            for e in rd.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                if pid == me {
                    continue;
                }
                let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
                    continue;
                };
                let entries: Vec<&[u8]> = env.split(|b| *b == 0).collect();
                if marks.iter().all(|m| entries.contains(&m.as_slice())) {
                    // SAFETY: a signal to a process identified by its marks just above.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (loop_name, project, node);
}

/// Records the limit `message` reported for every loop of `preset` with this credential
/// and says so in the log; the tick then ends as a skip.
pub(super) fn limited(
    ctx: &NodeCtx<'_>,
    preset: &Preset,
    rule: &LimitRule,
    message: &str,
) -> SkipReason {
    let now = jiff::Zoned::now();
    let until =
        crate::preset::limit::rfc3339(crate::preset::limit::until(message, rule.wait, &now));
    let scope = ctx.scope();
    let r = Record {
        preset: preset.name.to_string(),
        until: until.clone(),
        at: crate::preset::limit::rfc3339(now.timestamp()),
        message: one_line(message, 300),
        hit_by: format!("{}:{}", scope.project.display(), scope.loop_name),
    };
    let note = match crate::preset::limit::record(preset, &r) {
        Ok(_) => String::new(),
        Err(e) => format!(" (not recorded for other loops: {e})"),
    };
    ctx.warn(format!(
        "{}'s provider refused it for a usage or rate limit until {until}: {}{note}",
        preset.name, r.message
    ));
    SkipReason::UsageLimit { until }
}

/// The first line of `s`, at most `max` characters.
pub(super) fn one_line(s: &str, max: usize) -> String {
    let line = s
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    match line.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line.to_string(),
    }
}

/// Why a failed agent failed, in its words: the error its output reports, else the last
/// lines of its stderr (else of its stdout).
pub(super) fn why(o: &NodeOutput, reported: Option<&str>) -> Option<String> {
    if let Some(r) = reported.filter(|r| !r.trim().is_empty()) {
        return Some(tail_lines(r, 5, 600));
    }
    let read = |p: &Option<PathBuf>| p.as_deref().map(|p| read_after(p, 0)).unwrap_or_default();
    [read(&o.stderr_path), read(&o.stdout_path)]
        .into_iter()
        .find(|t| !t.trim().is_empty())
        .map(|t| tail_lines(&t, 5, 600))
}

/// The last `n` non-empty lines of `s`, at most `max` characters.
fn tail_lines(s: &str, n: usize, max: usize) -> String {
    let lines: Vec<&str> = s
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let text = lines[lines.len().saturating_sub(n)..].join("\n");
    let count = text.chars().count();
    if count <= max {
        return text;
    }
    let skip = count - max;
    let start = text.char_indices().nth(skip).map_or(0, |(i, _)| i);
    format!("…{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_keep_the_last_lines_within_bounds() {
        assert_eq!(tail_lines("a\n\nb\nc\n", 2, 100), "b\nc");
        assert_eq!(tail_lines("0123456789", 5, 4), "…6789");
        assert_eq!(one_line("\n  first  \nsecond", 3), "fir…");
    }
}
