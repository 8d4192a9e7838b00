//! What a tick does so nobody else's doing survives it, sandbox or not: it stops what a
//! killed tick left running, repairs lock files an agent replaced, remembers every halt
//! it saw during the tick, and at its end — whatever the end — checks that the state and
//! the log lines it wrote are still what it wrote, restoring or halting
//! `human_intervention:state_tampered` when they are not.

use std::path::Path;
use std::sync::Mutex;

use crate::reason::{HaltReason, Intervention};
use crate::state::tamper::forged_fields;
use crate::state::{Event, Halt, LogArg, LoopPaths, Previous, State, StateError};

/// Stops everything a killed tick left running: members of the process groups it
/// recorded and, when it died mid-tick, every process that still carries the loop's
/// environment (it may have spawned one before recording its group). Every kill happens
/// before anything is logged, so a log that cannot be written stops no kill; returns how
/// many processes were stopped, or the first logging error after all of them.
pub(super) fn stop_leftovers(paths: &LoopPaths, previous: &Previous) -> Result<usize, StateError> {
    let mut lines = Vec::new();
    // One set across the calls: a process killed with its group may still be dying when
    // the sweep by marks looks, and must not be killed (and counted) again.
    let mut seen = std::collections::HashSet::new();
    for &pgid in &previous.groups {
        let killed =
            crate::process::kill_loop_processes(&paths.name, &paths.project, Some(pgid), &mut seen);
        if killed > 0 {
            lines.push((Some(pgid), killed));
        }
    }
    if previous.died {
        let killed =
            crate::process::kill_loop_processes(&paths.name, &paths.project, None, &mut seen);
        if killed > 0 {
            lines.push((None, killed));
        }
    }
    let mut logged = Ok(());
    for (pgid, killed) in &lines {
        let mut args = Vec::new();
        let msg = match pgid {
            Some(g) => {
                args.push(LogArg::Kv("pgid", g.to_string()));
                "stopped processes left running by an interrupted tick"
            }
            None => "stopped processes an interrupted tick left outside its recorded groups",
        };
        args.push(LogArg::Kv("killed", killed.to_string()));
        args.push(LogArg::Kv("msg", msg.into()));
        let r = paths.log(Event::Warn, &args);
        if logged.is_ok() {
            logged = r;
        }
    }
    logged.map(|()| lines.iter().map(|(_, k)| k).sum())
}

/// Lock and log files loopflow must own as regular files: one that is a directory, a
/// FIFO or a symlink (an agent put it there) is moved aside, so the next lock or append
/// works, and named for the halt that follows.
pub(super) fn repair_files(paths: &LoopPaths) -> Vec<String> {
    let mut moved = Vec::new();
    for p in [&paths.lock, &paths.state_lock, &paths.log] {
        let Ok(m) = std::fs::symlink_metadata(p) else {
            continue;
        };
        if m.file_type().is_file() {
            continue;
        }
        let what = if m.is_dir() {
            "a directory"
        } else if m.file_type().is_symlink() {
            "a symlink"
        } else {
            "not a regular file"
        };
        let aside = p.with_extension(format!(
            "{}.tampered-{}",
            p.extension()
                .map(|e| e.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        if std::fs::rename(p, &aside).is_ok() {
            moved.push(format!(
                "{} was {what} (moved to {})",
                name(p),
                aside.display()
            ));
        }
    }
    moved
}

fn name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Halts seen in the state file while the tick ran: a human's `loopflow halt` stands even
/// if an agent then erased it from the file (and its line from the log).
#[derive(Default)]
pub(super) struct HaltWatch {
    seen: Mutex<Option<Halt>>,
    /// (inode, length, mtime) of `.state.loop` at the last look.
    last: Mutex<Option<(u64, u64, i128)>>,
}

impl HaltWatch {
    /// A watch that has already looked: the state the tick read at its start, and the
    /// file's stamp taken just before that read (so any change after it is looked at).
    pub(super) fn starting_from(stamp: Option<(u64, u64, i128)>, start: &State) -> HaltWatch {
        HaltWatch {
            seen: Mutex::new(start.halt.clone()),
            last: Mutex::new(stamp),
        }
    }

    /// Looks at the state file if it changed since the last look (one `stat`).
    pub(super) fn look(&self, paths: &LoopPaths) {
        let Ok(m) = std::fs::symlink_metadata(&paths.state) else {
            return;
        };
        let stamp = stamp(&m);
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        if *last == Some(stamp) {
            return;
        }
        *last = Some(stamp);
        drop(last);
        if let Ok(s) = paths.load()
            && let Some(h) = s.halt
            && let Ok(mut seen) = self.seen.lock()
            && seen.is_none()
        {
            *seen = Some(h);
        }
    }

    /// The first halt seen during the tick.
    pub(super) fn seen(&self) -> Option<Halt> {
        self.seen.lock().ok().and_then(|s| s.clone())
    }
}

/// The state file's stamp now, `None` when it cannot be read.
pub(super) fn stamp_now(paths: &LoopPaths) -> Option<(u64, u64, i128)> {
    std::fs::symlink_metadata(&paths.state)
        .ok()
        .map(|m| stamp(&m))
}

fn stamp(m: &std::fs::Metadata) -> (u64, u64, i128) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (
            m.ino(),
            m.len(),
            i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        )
    }
    #[cfg(not(unix))]
    {
        let t = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as i128);
        (0, m.len(), t)
    }
}

/// At the end of a tick that did not commit: the state must hold what it held at the
/// start (a halt may have been set, the phase moved). Anything else someone rewrote is
/// put back, a halt seen during the tick but gone from the file is restored, and
/// returns what was forged, for the halt.
pub(super) fn restore_state(
    paths: &LoopPaths,
    start: &State,
    seen: Option<Halt>,
) -> Result<Vec<&'static str>, StateError> {
    // Most ticks find nothing: look first, and write only to repair.
    let now = paths.load()?;
    if forged_fields(start, &now).is_empty() && (now.halt.is_some() || seen.is_none()) {
        return Ok(Vec::new());
    }
    let (_, forged) = paths.update(|s| {
        let mut forged = forged_fields(start, s);
        if !forged.is_empty() {
            let halt = s.halt.take().or_else(|| start.halt.clone());
            let phase = std::mem::take(&mut s.current_phase);
            *s = start.clone();
            s.halt = halt;
            s.current_phase = phase;
        }
        if s.halt.is_none()
            && let Some(h) = seen
        {
            s.halt = Some(h);
            forged.push("halt (erased during the tick)");
        }
        forged
    })?;
    Ok(forged)
}

/// Whether every line this tick appended to the log is still there, in order, after
/// the tick's start offset (others may have appended between them: `loopflow halt`,
/// `transition`). `Err` says what is wrong.
pub(super) fn log_intact(paths: &LoopPaths, start: u64, ours: &[String]) -> Result<(), String> {
    let len = std::fs::metadata(&paths.log).map_or(0, |m| m.len());
    if len < start {
        return Err(format!(
            ".state.log shrank during the tick ({start} → {len} bytes)"
        ));
    }
    if ours.is_empty() {
        return Ok(());
    }
    let bytes =
        crate::fs_safe::tail(&paths.log, len - start).map_err(|e| format!(".state.log: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let mut rest = text.as_ref();
    for line in ours {
        match rest.find(line.as_str()) {
            Some(i) => rest = &rest[i + line.len()..],
            None => {
                return Err(format!(
                    ".state.log lost or changed a line this tick wrote: {}",
                    line.trim_end()
                ));
            }
        }
    }
    Ok(())
}

/// The halt for state someone else changed during the tick.
pub(super) fn tampered() -> HaltReason {
    HaltReason::HumanIntervention(Intervention::StateTampered)
}
