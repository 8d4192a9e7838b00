//! Schedules whose loop is gone. `uninstall` reads the loop's `.schedule.json`, so deleting
//! a loop directory leaves its timer, crontab block or launch agent firing `loopflow run`
//! for a loop that no longer exists, every interval. They are found by their label
//! (`loopflow-<loop>-<hash of the project path>`, see [`Target::label`]): this project's
//! labels whose loop directory is missing.
//!
//! [`Target::label`]: super::Target::label

use std::path::{Path, PathBuf};

use super::cron::{CRON_BEGIN, cron_markers, crontab_read};
use super::install::{home, stop_and_remove, systemd_dir};
use super::{Platform, ScheduleError, fnv32};
use crate::state::LoopPaths;

/// A schedule installed for a loop of this project whose directory is gone.
#[derive(Debug, Clone)]
pub(crate) struct Orphan {
    pub platform: Platform,
    pub label: String,
    pub loop_name: String,
    /// Its files on this machine (unit files, launch agent); none for a crontab block.
    pub files: Vec<PathBuf>,
}

/// The loop a label names when it is one of `project`'s (its hash suffix), else `None`.
fn loop_of<'a>(label: &'a str, suffix: &str) -> Option<&'a str> {
    label
        .strip_prefix("loopflow-")?
        .strip_suffix(suffix)
        .filter(|n| !n.is_empty())
}

/// The files of `dir` whose name ends in one of `suffixes`, as (name without it, path),
/// sorted (a unit's `.timer` and `.service` next to each other).
fn labeled(dir: &Path, suffixes: &[&str]) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let label = suffixes.iter().find_map(|s| name.strip_suffix(s))?;
            Some((label.to_string(), e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Every schedule on this machine (systemd user timers, the crontab, launch agents) of a
/// loop of `project` (as canonicalized at install) that no longer exists. A scheduler
/// that cannot be read (no `crontab` program) contributes nothing.
pub(crate) fn orphans(project: &Path) -> Vec<Orphan> {
    let suffix = format!("-{:08x}", fnv32(project));
    // Deleted means not there: a loop directory that cannot be looked at (no permission,
    // a symlink to a disk not mounted) is not taken for a deleted one.
    let gone = |name: &str| {
        crate::state::check_loop_name(name).is_ok()
            && std::fs::symlink_metadata(LoopPaths::new(project, name).dir)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
    };
    // The label's hash is 32 bits: a schedule counts only when its own text names this
    // project too, so another project's schedule is never taken for one of ours.
    let project_text = project.display().to_string();
    let names_project = |f: &Path| {
        crate::fs_safe::head(f, 1 << 20)
            .is_ok_and(|b| String::from_utf8_lossy(&b).contains(&*project_text))
    };
    let mut out: Vec<Orphan> = Vec::new();
    if let Ok(dir) = systemd_dir() {
        for (label, path) in labeled(&dir, &[".timer", ".service"]) {
            let Some(name) = loop_of(&label, &suffix).filter(|n| gone(n)) else {
                continue;
            };
            match out.iter_mut().find(|o| o.label == label) {
                Some(o) => o.files.push(path),
                None => out.push(Orphan {
                    platform: Platform::Systemd,
                    loop_name: name.to_string(),
                    label,
                    files: vec![path],
                }),
            }
        }
    }
    out.retain(|o| o.files.iter().any(|f| names_project(f)));
    if let Ok(tab) = crontab_read() {
        // The text after the label on a block's first line, as `cron_markers` writes it.
        let (begin, _) = cron_markers("");
        let after_label = begin.strip_prefix(CRON_BEGIN).unwrap_or(&begin).to_string();
        let mut lines = tab.lines();
        while let Some(line) = lines.next() {
            let Some(label) = line
                .strip_prefix(CRON_BEGIN)
                .and_then(|rest| rest.strip_suffix(after_label.as_str()))
            else {
                continue;
            };
            let (_, end) = cron_markers(label);
            let body: Vec<&str> = lines.by_ref().take_while(|l| *l != end).collect();
            if let Some(name) = loop_of(label, &suffix).filter(|n| gone(n))
                && body.iter().any(|l| l.contains(&*project_text))
            {
                out.push(Orphan {
                    platform: Platform::Cron,
                    label: label.to_string(),
                    loop_name: name.to_string(),
                    files: Vec::new(),
                });
            }
        }
    }
    if let Ok(dir) = home().map(|h| h.join("Library/LaunchAgents")) {
        for (label, path) in labeled(&dir, &[".plist"]) {
            if let Some(name) = loop_of(&label, &suffix).filter(|n| gone(n))
                && names_project(&path)
            {
                out.push(Orphan {
                    platform: Platform::Launchd,
                    loop_name: name.to_string(),
                    label,
                    files: vec![path],
                });
            }
        }
    }
    out
}

/// Stops and removes one orphan as `schedule uninstall` would its loop's schedule (the
/// scheduler was told at install: a unit file or crontab block is only there then).
pub(crate) fn remove(o: &Orphan) -> Result<Vec<String>, ScheduleError> {
    stop_and_remove(o.platform, &o.label, &o.files, true)
}

/// What an orphan is, for one line of output.
pub(crate) fn describe(o: &Orphan) -> String {
    let place = match o.platform {
        Platform::Cron => "the crontab".to_string(),
        _ => o
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "schedule {} ({}, {place}) of deleted loop {}",
        o.label,
        o.platform.name(),
        o.loop_name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_names_a_loop_of_this_project_only() {
        let suffix = "-0badc0de";
        assert_eq!(
            loop_of("loopflow-nightly-0badc0de", suffix),
            Some("nightly")
        );
        assert_eq!(loop_of("loopflow-a-b-0badc0de", suffix), Some("a-b"));
        assert_eq!(loop_of("loopflow-nightly-12345678", suffix), None);
        assert_eq!(loop_of("other-nightly-0badc0de", suffix), None);
        assert_eq!(loop_of("loopflow--0badc0de", suffix), None);
    }
}
