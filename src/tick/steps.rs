//! The tick's steps around its walk: [`open`] the state, [`load`] the config and
//! pipeline, [`prepare`] the worktree, the tick's directories and the sandbox; and
//! [`finish`] once the walk has settled.

use std::path::{Path, PathBuf};

use super::confine::{self, Confinement};
use super::{OUTPUT_DIR, RunError, RunOptions, guard, worktree};
use crate::load::LoadError;
use crate::state::{Event, LogArg, LoopPaths, StateError};

/// Logs `ERROR reason=<why>` (not in a dry run, which writes nothing).
fn log_error(paths: &LoopPaths, opts: &RunOptions, why: &str) {
    if !opts.dry_run {
        let _ = paths.log(Event::Error, &[LogArg::Kv("reason", why.into())]);
    }
}

/// The state as the tick found it, and when it was taken (taken before the read:
/// whatever changes the file after it is looked at again).
pub(super) struct Opened {
    pub(super) stamp: Option<(u64, u64, i128)>,
    pub(super) state: crate::state::State,
}

/// Step 1: reads the loop's state, refuses another loop's, and (not in a dry run) logs
/// what a killed tick left unsaid: its `TICK` line, its halt's announcement.
pub(super) fn open(paths: &LoopPaths, opts: &RunOptions) -> Result<Opened, RunError> {
    let stamp = guard::stamp_now(paths);
    let state = paths.load().inspect_err(|_| {
        log_error(paths, opts, "state_unreadable");
    })?;
    paths.owns(&state).inspect_err(|_| {
        log_error(paths, opts, "state_of_another_loop");
    })?;
    if !opts.dry_run {
        paths.recover_tick_line(&state)?;
        if let Some(a) = crate::lifecycle::recover_halt(paths, &state) {
            crate::announce::announce(paths, &a)?;
        }
    }
    Ok(Opened { stamp, state })
}

/// Step 2: the loop's config and pipeline, and where its processes work.
pub(super) fn load(
    paths: &LoopPaths,
    opts: &RunOptions,
) -> Result<(crate::load::Loaded, PathBuf), RunError> {
    let base = std::env::current_dir().unwrap_or_else(|_| paths.project.clone());
    let loaded = crate::load::load(paths, opts.pipeline.as_deref(), &base).inspect_err(|e| {
        if matches!(e, LoadError::Config(_)) {
            log_error(paths, opts, "invalid_config");
        }
    })?;
    let cwd = crate::work_source::loop_cwd(&loaded.config, paths);
    crate::state::text_path(&paths.dir)
        .and(crate::state::text_path(&cwd))
        .inspect_err(|_| log_error(paths, opts, "path_not_utf8"))?;
    Ok((loaded, cwd))
}

/// What [`prepare`] made ready.
pub(super) struct Prepared {
    pub(super) stamp: Option<(u64, u64, i128)>,
    pub(super) state: crate::state::State,
    pub(super) ready: worktree::Ready,
    pub(super) tmp: PathBuf,
    pub(super) output_dir: PathBuf,
    pub(super) confine: Confinement,
    /// The sandbox of an audit work source's command, when the gate will run one.
    pub(super) audit_box: Option<crate::sandbox::Prepared>,
}

/// Step 3: the worktree (moved, repaired, in step with the user's branch), the tick's
/// directories, and the sandbox its processes run in.
pub(super) fn prepare(
    paths: &LoopPaths,
    opts: &RunOptions,
    loaded: &crate::load::Loaded,
    cwd: &Path,
    opened: Opened,
) -> Result<Prepared, RunError> {
    let Opened {
        mut stamp,
        mut state,
    } = opened;
    let ready = worktree::prepare(paths, &loaded.config, opts.dry_run)?;
    if ready.moved {
        // The move recorded the worktree's new place in the state: that is where this
        // tick starts from.
        stamp = guard::stamp_now(paths);
        state = paths.load()?;
    }
    let tmp = paths.tick_tmp();
    // Per loop: with worktrees off, several loops share the project as working directory.
    let output_dir = cwd.join(OUTPUT_DIR).join(&paths.name);
    if !opts.dry_run {
        prepare_dirs(paths, &tmp, &output_dir, cwd)?;
    }
    let confine = Confinement::new(&loaded.config, &paths.project, cwd, &tmp, &paths.outputs);
    let audit_box = if opts.dry_run {
        None
    } else {
        audit_confinement(paths, &loaded.config, &confine)
    };
    Ok(Prepared {
        stamp,
        state,
        ready,
        tmp,
        output_dir,
        confine,
        audit_box,
    })
}

/// The sandbox an audit work source's command runs in at the gate (only an audit source
/// spawns anything there, so only it pays for a ruleset): it may read where it runs — the
/// worktree, or the project before the worktree exists — and its program's install prefix.
fn audit_confinement(
    paths: &LoopPaths,
    config: &crate::config::LoopConfig,
    confine: &Confinement,
) -> Option<crate::sandbox::Prepared> {
    let crate::config::WorkSource::Audit { command } = &config.work_source else {
        return None;
    };
    let at = crate::work_source::loop_cwd(config, paths);
    let at = if at.is_dir() {
        at
    } else {
        paths.project.clone()
    };
    let mut read = vec![at.clone()];
    if let Some(program) = command.first() {
        // A relative path runs from where the audit runs; a bare name from PATH.
        let program = match program.text.contains('/') {
            true => at.join(&program.text).to_string_lossy().into_owned(),
            false => program.text.clone(),
        };
        let path = std::env::var_os("PATH");
        read.extend(confine::install_prefix(
            &program,
            path.as_deref(),
            &paths.project,
        ));
    }
    confine.prepare_with(&[], &read, None).ok().flatten()
}

/// The last step: the tick's `TMPDIR` emptied, and the worktree's `.git` naming the loop's
/// repository again whatever its agents did to it, so the human's own git there (and the
/// next tick's) finds it.
pub(super) fn finish(paths: &LoopPaths, tmp: &Path, copy: Option<&crate::worktree::Copy>) {
    empty_dir(tmp, None);
    if let Some(c) = copy
        && let Ok((_, true)) = c.open()
    {
        let _ = paths.log(
            Event::Warn,
            &[LogArg::Kv(
                "msg",
                format!(
                    "{}/.git named another repository at the tick's end; it names the loop's own again",
                    c.work_tree.display()
                ),
            )],
        );
    }
}

/// The tick's own directories: `outputs/`, its private `TMPDIR` (emptied: a killed tick
/// leaves its files, and anything else under `tmp/` goes), and the `{{output}}` directory
/// in the working directory, which ignores itself so `git status` and `git-commit` never
/// see it.
fn prepare_dirs(paths: &LoopPaths, tmp: &Path, out: &Path, cwd: &Path) -> Result<(), StateError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |source| StateError::Io { path: p, source }
    };
    if !std::fs::symlink_metadata(&paths.outputs).is_ok_and(|m| m.is_dir()) {
        std::fs::create_dir_all(&paths.outputs).map_err(io(&paths.outputs))?;
    }
    if let Some(root) = tmp.parent() {
        empty_dir(root, tmp.file_name());
    }
    if !empty_dir(tmp, None) {
        std::fs::create_dir_all(tmp).map_err(io(tmp))?;
    }
    if cwd.is_dir() {
        // `<cwd>/.loopflow-out/<loop>/`: never through a link an agent planted, and
        // emptied of the last tick's files (empty_dir follows no link).
        let root = out.parent().unwrap_or(out);
        if std::fs::symlink_metadata(root).is_ok_and(|m| !m.is_dir()) {
            let _ = std::fs::remove_file(root);
        }
        if !empty_dir(out, None) {
            std::fs::create_dir_all(out).map_err(io(out))?;
        }
        let ignore = root.join(".gitignore");
        let ignored = || std::fs::read(&ignore).ok().as_deref() == Some(b"*\n");
        // Another loop sharing the working directory may be writing it right now.
        if !ignored() && crate::fs_safe::write_owned(&ignore, b"*\n").is_err() && !ignored() {
            return Err(StateError::Io {
                path: ignore,
                source: std::io::Error::other("cannot write the output directory's .gitignore"),
            });
        }
    }
    Ok(())
}

/// Removes everything in directory `dir` but the entry named `keep`, best effort, never
/// through a symlink; something at `dir` that is not a directory is removed. Whether a
/// directory is there now.
pub(super) fn empty_dir(dir: &Path, keep: Option<&std::ffi::OsStr>) -> bool {
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            let _ = std::fs::remove_file(dir);
            return false;
        }
        Err(_) => return false,
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if keep.is_some_and(|k| k == e.file_name()) {
            continue;
        }
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(&p);
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }
    true
}
