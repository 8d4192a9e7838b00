//! Installing, uninstalling and toggling a schedule, recorded in `.schedule.json` so a
//! HALT can disable it and `approve` re-enable it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::cron::{CRON_BEGIN, cron, cron_markers, crontab_read, crontab_set};
use super::github::github_actions;
use super::kubernetes::kubernetes;
use super::launchd::launchd;
use super::schtasks::task_file_bytes;
use super::systemd::systemd;
use super::{Platform, ScheduleError, Target, auto, io, tool, tool_input};
use crate::state::{Event, LogArg, LoopPaths};

/// What `install` left on this machine, kept in the loop dir (git-ignored).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    pub platform: Platform,
    pub label: String,
    /// Files written (absolute paths).
    pub files: Vec<PathBuf>,
    pub interval_seconds: u64,
    pub exe: PathBuf,
    pub installed_at: String,
    /// False while a HALT has disabled it.
    pub enabled: bool,
    /// Whether the scheduler itself was told (systemctl, crontab, launchctl, schtasks);
    /// false for platforms where install only writes a file.
    pub activated: bool,
}

pub(super) fn record_path(paths: &LoopPaths) -> PathBuf {
    paths.dir.join(".schedule.json")
}

pub(crate) fn read_record(paths: &LoopPaths) -> Option<Record> {
    let text = std::fs::read_to_string(record_path(paths)).ok()?;
    serde_json::from_str(&text).ok()
}

pub(super) fn write_record(paths: &LoopPaths, r: &Record) -> Result<(), ScheduleError> {
    let p = record_path(paths);
    let mut json =
        serde_json::to_vec_pretty(r).map_err(|e| io(&paths.dir)(std::io::Error::other(e)))?;
    json.push(b'\n');
    crate::fs_safe::write_atomic(&paths.dir, &p, &json).map_err(io(&p))
}

/// Makes sure the loop's `.gitignore` hides what scheduling writes (loops created by an
/// older loopflow lack these lines).
pub(super) fn ensure_ignored(paths: &LoopPaths) -> Result<(), ScheduleError> {
    let p = paths.dir.join(".gitignore");
    let text = std::fs::read_to_string(&p).unwrap_or_default();
    let missing: Vec<&str> = [".schedule.json", ".schedule.lock", ".schedule.log"]
        .into_iter()
        .filter(|l| !text.lines().any(|x| x.trim() == *l))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut out = text;
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for l in missing {
        out.push_str(l);
        out.push('\n');
    }
    std::fs::write(&p, out).map_err(io(&p))
}

pub(super) fn home() -> Result<PathBuf, ScheduleError> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| ScheduleError::Unsupported("HOME is not set".into()))
}

/// `$XDG_CONFIG_HOME/systemd/user` (default `~/.config/systemd/user`).
pub(super) fn systemd_dir() -> Result<PathBuf, ScheduleError> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => home()?.join(".config"),
    };
    Ok(base.join("systemd").join("user"))
}

pub(super) fn write_file(path: &Path, text: &str) -> Result<(), ScheduleError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(io(d))?;
    }
    std::fs::write(path, text).map_err(io(path))
}

pub(super) fn not_native(p: Platform) -> String {
    let os = if cfg!(target_os = "macos") {
        "macOS"
    } else if cfg!(windows) {
        "Windows"
    } else {
        "Linux"
    };
    let (home, hint) = match p {
        Platform::Launchd => (
            "macOS",
            "on the Mac, run `loopflow schedule install --platform launchd` (or save the output of `schedule print --platform launchd` to ~/Library/LaunchAgents/ and `launchctl bootstrap gui/$(id -u)` it)",
        ),
        _ => (
            "Windows",
            "on Windows, run `loopflow schedule install --platform schtasks` (or save the output of `schedule print --platform schtasks` and `schtasks /Create /XML FILE /TN NAME`)",
        ),
    };
    format!(
        "{} schedules are installed on {home}, and this is {os}; {hint}",
        p.name()
    )
}

/// Installs the schedule (idempotent: installing again replaces the same files/block).
/// Returns the record and human lines saying what was done.
pub(crate) fn install(
    p: Platform,
    t: &Target,
    paths: &LoopPaths,
) -> Result<(Record, Vec<String>), ScheduleError> {
    let p = if p == Platform::Auto { auto() } else { p };
    // A schedule on another platform is removed first, so a loop has one schedule.
    if let Some(old) = read_record(paths)
        && old.platform != p
    {
        uninstall(paths)?;
    }
    let label = t.label();
    let mut said = Vec::new();
    let mut files = Vec::new();
    let mut activated = false;
    // An error after files were written: they are recorded first, so uninstall removes them.
    let mut pending = None;
    match p {
        Platform::Systemd => {
            let dir = systemd_dir()?;
            for f in systemd(t) {
                let path = dir.join(&f.name);
                write_file(&path, &f.text)?;
                said.push(format!("wrote {}", path.display()));
                files.push(path);
            }
            let timer = format!("{label}.timer");
            match tool(&["systemctl", "--user", "daemon-reload"])
                .and_then(|_| tool(&["systemctl", "--user", "enable", "--now", &timer]))
            {
                Ok(_) => {
                    activated = true;
                    said.push(format!("enabled and started {timer}"));
                    if !super::systemd::lingering() {
                        said.push(
                            "note: a user timer stops when you log out; on a server run `loginctl enable-linger $USER` once so it keeps firing".to_string(),
                        );
                    }
                }
                Err(e) => {
                    pending = Some(format!(
                        "the unit files are written ({}) but could not be enabled: {e}\n  run `systemctl --user daemon-reload && systemctl --user enable --now {timer}` in your login session, or use --platform cron (`schedule uninstall` removes the files)",
                        dir.display()
                    ));
                }
            }
        }
        Platform::Cron => {
            let f = cron(t);
            let body = f.text.trim_end().to_string();
            crontab_set(&label, Some(&body))?;
            activated = true;
            said.push(format!("crontab: installed the `{label}` entry"));
        }
        Platform::Launchd => {
            if !cfg!(target_os = "macos") {
                return Err(ScheduleError::Unsupported(not_native(p)));
            }
            let f = launchd(t);
            let path = home()?.join("Library/LaunchAgents").join(&f.name);
            write_file(&path, &f.text)?;
            said.push(format!("wrote {}", path.display()));
            files.push(path.clone());
            let domain = format!("gui/{}", uid());
            // bootout first so a re-install picks up the new plist.
            let _ = tool(&["launchctl", "bootout", &format!("{domain}/{label}")]);
            tool(&[
                "launchctl",
                "bootstrap",
                &domain,
                &path.display().to_string(),
            ])?;
            activated = true;
            said.push(format!("launchctl: bootstrapped {label}"));
        }
        Platform::Schtasks => {
            if !cfg!(windows) {
                return Err(ScheduleError::Unsupported(not_native(p)));
            }
            let (name, bytes) = task_file_bytes(t);
            let dir = std::env::var_os("LOCALAPPDATA")
                .map(PathBuf::from)
                .unwrap_or(home()?)
                .join("loopflow");
            let path = dir.join(&name);
            std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            std::fs::write(&path, bytes).map_err(io(&path))?;
            files.push(path.clone());
            let tn = format!("\\loopflow\\{label}");
            tool(&[
                "schtasks",
                "/Create",
                "/F",
                "/TN",
                &tn,
                "/XML",
                &path.display().to_string(),
            ])?;
            activated = true;
            said.push(format!("schtasks: created {tn}"));
        }
        Platform::GithubActions => {
            let f = github_actions(t);
            let path = super::github::workflows_dir(&t.project).join(&f.name);
            write_file(&path, &f.text)?;
            said.push(format!(
                "wrote {} (commit and push it; GitHub runs it on its schedule)",
                path.display()
            ));
            files.push(path);
        }
        Platform::Kubernetes => {
            let f = kubernetes(t);
            let path = t.loop_dir.join(&f.name);
            write_file(&path, &f.text)?;
            said.push(format!(
                "wrote {} (apply it with `kubectl apply -f {}`; loopflow never touches a cluster itself)",
                path.display(),
                path.display()
            ));
            files.push(path);
        }
        Platform::Auto => unreachable_auto()?,
    }
    let record = Record {
        platform: p,
        label,
        files,
        interval_seconds: t.interval,
        exe: t.exe.clone(),
        installed_at: crate::state::now(),
        enabled: true,
        activated,
    };
    ensure_ignored(paths)?;
    write_record(paths, &record)?;
    match pending {
        Some(e) => Err(ScheduleError::Tool(e)),
        None => Ok((record, said)),
    }
}

pub(super) fn unreachable_auto() -> Result<(), ScheduleError> {
    Err(ScheduleError::Unsupported(
        "internal: `auto` was not resolved to a platform".into(),
    ))
}

#[cfg(unix)]
pub(super) fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

#[cfg(not(unix))]
pub(super) fn uid() -> u32 {
    0
}

/// Removes what `install` did; fine to run when nothing is installed.
pub(crate) fn uninstall(paths: &LoopPaths) -> Result<Vec<String>, ScheduleError> {
    let Some(r) = read_record(paths) else {
        return Ok(vec![format!(
            "no schedule installed for loop {} (nothing to do)",
            paths.name
        )]);
    };
    let said = stop_and_remove(r.platform, &r.label, &r.files, r.activated)?;
    let rp = record_path(paths);
    std::fs::remove_file(&rp).map_err(io(&rp))?;
    Ok(said)
}

/// Tells the scheduler to stop `label` (when it was told at install: `activated`) and
/// removes its files; what it did, one line each. `uninstall` uses it with a loop's
/// record, `worktree gc` with what it found of a deleted loop.
pub(super) fn stop_and_remove(
    platform: Platform,
    label: &str,
    files: &[PathBuf],
    activated: bool,
) -> Result<Vec<String>, ScheduleError> {
    let mut said = Vec::new();
    match platform {
        Platform::Systemd => {
            let timer = format!("{label}.timer");
            if activated {
                match tool(&["systemctl", "--user", "disable", "--now", &timer]) {
                    Ok(_) => said.push(format!("disabled and stopped {timer}")),
                    Err(e) => said.push(format!("warning: {e}")),
                }
            }
        }
        Platform::Cron => {
            crontab_set(label, None)?;
            said.push(format!("crontab: removed the `{label}` entry"));
        }
        Platform::Launchd => {
            let _ = tool(&["launchctl", "bootout", &format!("gui/{}/{}", uid(), label)]);
        }
        Platform::Schtasks => {
            let _ = tool(&[
                "schtasks",
                "/Delete",
                "/F",
                "/TN",
                &format!("\\loopflow\\{label}"),
            ]);
        }
        Platform::GithubActions | Platform::Kubernetes | Platform::Auto => {}
    }
    for f in files {
        match std::fs::remove_file(f) {
            Ok(()) => said.push(format!("removed {}", f.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(f)(e)),
        }
    }
    if platform == Platform::Systemd && activated {
        let _ = tool(&["systemctl", "--user", "daemon-reload"]);
    }
    Ok(said)
}

/// Turns the installed schedule off or on without removing it.
pub(super) fn set_enabled(r: &Record, on: bool) -> Result<(), ScheduleError> {
    match r.platform {
        Platform::Systemd => {
            let timer = format!("{}.timer", r.label);
            let verb = if on { "enable" } else { "disable" };
            tool(&["systemctl", "--user", verb, "--now", &timer]).map(|_| ())
        }
        Platform::Cron => {
            let current = crontab_read()?;
            let (b, e) = cron_markers(&r.label);
            let mut out = String::new();
            let mut inside = false;
            let mut found = false;
            for line in current.lines() {
                if line.starts_with(&format!("{CRON_BEGIN}{} begin", r.label)) {
                    inside = true;
                    found = true;
                    out.push_str(&b);
                } else if inside && line == e {
                    inside = false;
                    out.push_str(line);
                } else if inside && !line.starts_with("# ") {
                    // The entry itself: commented out while halted.
                    let bare = line.strip_prefix("#halted# ").unwrap_or(line);
                    if on {
                        out.push_str(bare);
                    } else {
                        out.push_str("#halted# ");
                        out.push_str(bare);
                    }
                } else {
                    out.push_str(line);
                }
                out.push('\n');
            }
            if !found {
                return Err(ScheduleError::Unsupported(format!(
                    "crontab has no `{}` entry any more",
                    r.label
                )));
            }
            if out != current {
                tool_input(&["crontab", "-"], Some(&out))?;
            }
            Ok(())
        }
        Platform::Launchd => {
            // `launchctl disable` only affects the next load: unload/load the job itself.
            let domain = format!("gui/{}", uid());
            if on {
                let plist = r.files.first().ok_or_else(|| {
                    ScheduleError::Unsupported("the record names no plist".into())
                })?;
                tool(&[
                    "launchctl",
                    "bootstrap",
                    &domain,
                    &plist.display().to_string(),
                ])
                .map(|_| ())
            } else {
                tool(&["launchctl", "bootout", &format!("{domain}/{}", r.label)]).map(|_| ())
            }
        }
        Platform::Schtasks => {
            let flag = if on { "/ENABLE" } else { "/DISABLE" };
            tool(&[
                "schtasks",
                "/Change",
                "/TN",
                &format!("\\loopflow\\{}", r.label),
                flag,
            ])
            .map(|_| ())
        }
        Platform::GithubActions | Platform::Kubernetes | Platform::Auto => {
            Err(ScheduleError::Unsupported(format!(
                "a {} schedule runs elsewhere; its ticks skip while the loop is halted",
                r.platform.name()
            )))
        }
    }
}

pub(super) fn toggle_best_effort(paths: &LoopPaths, on: bool) {
    let Some(mut r) = read_record(paths) else {
        return;
    };
    if r.enabled == on {
        return;
    }
    let key = if on { "enabled" } else { "disabled" };
    let result = set_enabled(&r, on);
    let mut args = vec![LogArg::Kv("platform", r.platform.name().to_string())];
    match &result {
        Ok(()) => {
            args.insert(0, LogArg::Kv(key, "true".into()));
            r.enabled = on;
            let _ = write_record(paths, &r);
        }
        Err(e) => {
            args.insert(0, LogArg::Kv(key, "false".into()));
            args.push(LogArg::Kv("reason", e.to_string()));
        }
    }
    let _ = paths.log(Event::Schedule, &args);
}

/// Called on every HALT: turns the installed schedule off when it can and logs
/// `SCHEDULE disabled=true|false …`. Does nothing (and logs nothing) when no schedule
/// is installed. Never fails: a halt must stand whatever the scheduler says.
pub(crate) fn disable_best_effort(paths: &LoopPaths) {
    toggle_best_effort(paths, false);
}

/// Called by `approve`: turns a schedule a HALT disabled back on (`SCHEDULE enabled=…`).
pub(crate) fn enable_best_effort(paths: &LoopPaths) {
    toggle_best_effort(paths, true);
}
