//! Where a loop's files live (DESIGN §2), and the operations that go through them: load,
//! locked read-modify-write, append to the log, the symlink refusal that comes first.

use std::io;
use std::path::{Path, PathBuf};

use super::log::{self, Event, LogArg};
use super::{State, StateError, io_err, load, save};
use crate::fs_safe::TEMP_PREFIX;

/// A loop name that is not `^[a-z0-9][a-z0-9_-]{0,63}$` (a usage error, exit 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid loop name {0:?}: use 1–64 characters from a-z, 0-9, `_` and `-`, starting with a letter or digit"
)]
pub(crate) struct LoopNameError(String);

/// Loop names match `^[a-z0-9][a-z0-9_-]{0,63}$`: never a path.
pub(crate) fn check_loop_name(name: &str) -> Result<(), LoopNameError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_lowercase() | name.as_bytes()[0].is_ascii_digit()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(LoopNameError(name.to_string()))
    }
}

/// Every loop directory of a project, sorted by name.
pub(crate) fn list_loops(project: &Path) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(loops_dir(project))
        .into_iter()
        .flatten()
        .flatten()
        // The entry's type as the directory records it (std asks `lstat` where it does
        // not); only a link is followed, as `is_dir` would: no `stat` per loop.
        .filter(|e| match e.file_type() {
            Ok(t) if !t.is_symlink() => t.is_dir(),
            _ => e.path().is_dir(),
        })
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| check_loop_name(n).is_ok())
        .collect();
    out.sort();
    out
}

/// `.loopflow/loops` of a project.
pub(crate) fn loops_dir(project: &Path) -> PathBuf {
    project.join(".loopflow").join("loops")
}

/// The event lines one tick appended, in order (see [`LoopPaths::with_ledger`]).
pub(crate) type Ledger = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// The files of one loop.
#[derive(Debug, Clone)]
pub struct LoopPaths {
    pub name: String,
    pub project: PathBuf,
    pub dir: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub lock: PathBuf,
    pub state_lock: PathBuf,
    pub outputs: PathBuf,
    pub worktree: PathBuf,
    /// When set, every line [`LoopPaths::log`] appends is also kept here.
    ledger: Option<Ledger>,
    /// Set once `loop.toml` was seen: [`LoopPaths::config`] then stops `stat`ing it (a
    /// `loop.toml` never turns back into a predecessor's `loop.json`).
    toml_seen: std::sync::OnceLock<()>,
}

/// Agents get paths as text (`{{cwd}}`, `{{prompt}}`, `{{output}}` are JSON strings): a
/// path that is not UTF-8 would reach them changed (U+FFFD for its odd bytes) and name no
/// file, so every agent would fail on its own prompt. Said once, up front, instead.
pub(crate) fn text_path(path: &Path) -> Result<(), StateError> {
    if path.to_str().is_some() {
        return Ok(());
    }
    Err(io_err(path)(io::Error::other(
        "this path is not valid UTF-8: loopflow hands paths to agents as text ({{cwd}}, {{prompt}}, {{output}}), where it would arrive changed; use a project directory whose path is UTF-8",
    )))
}

impl LoopPaths {
    pub fn new(project: &Path, name: &str) -> LoopPaths {
        let dir = loops_dir(project).join(name);
        LoopPaths {
            name: name.to_string(),
            project: project.to_path_buf(),
            state: dir.join(".state.loop"),
            log: dir.join(".state.log"),
            lock: dir.join(".lock"),
            state_lock: dir.join(".state.lock"),
            outputs: dir.join("outputs"),
            worktree: dir.join("worktree"),
            dir,
            ledger: None,
            toml_seen: std::sync::OnceLock::new(),
        }
    }

    /// These paths, keeping every log line they append (a tick checks at its end that
    /// nobody rewrote the lines it wrote).
    pub fn with_ledger(mut self) -> (LoopPaths, Ledger) {
        let ledger = Ledger::default();
        self.ledger = Some(ledger.clone());
        (self, ledger)
    }

    /// `tmp/tick`: the running tick's private `TMPDIR`, emptied when the tick ends and
    /// again when the next one starts. It stays: making and removing a directory every
    /// tick cost an inode allocation each, which ext4 slows down by skipping every
    /// recently freed inode (a tenth of a tick's CPU on a loop that had ticked a while).
    pub fn tick_tmp(&self) -> PathBuf {
        self.dir.join("tmp").join("tick")
    }

    /// `loop.toml`, or a predecessor-style `loop.json` when only that exists.
    pub fn config(&self) -> PathBuf {
        let toml = self.dir.join("loop.toml");
        if self.toml_seen.get().is_some() {
            return toml;
        }
        if toml.exists() {
            let _ = self.toml_seen.set(());
            return toml;
        }
        let json = self.dir.join("loop.json");
        if json.exists() { json } else { toml }
    }

    /// [`LoopPaths::config`], read: `loop.toml` opened straight away (no `stat` before:
    /// `status`, `report` and the dashboard read every loop's), `loop.json` only when
    /// there is no `loop.toml`. The error names the file that could not be read.
    pub fn read_config(&self) -> Result<(PathBuf, String), (PathBuf, std::io::Error)> {
        let toml = self.dir.join("loop.toml");
        let e = match crate::fs_safe::read_to_string(&toml) {
            Ok(text) => {
                let _ = self.toml_seen.set(());
                return Ok((toml, text));
            }
            Err(e) => e,
        };
        // loop.toml did not read: which file it should have been is `config`'s choice.
        let path = self.config();
        if path == toml {
            return Err((toml, e));
        }
        crate::fs_safe::read_to_string(&path)
            .map(|text| (path.clone(), text))
            .map_err(|e| (path, e))
    }

    /// The verdict cache of the loop's roles.
    pub fn cache_dir(&self) -> PathBuf {
        self.dir.join("cache")
    }

    /// A loop directory committed but never started (a fresh clone): its `loop.toml`, and
    /// neither state nor log (a lost state leaves its log behind).
    pub fn never_started(&self) -> bool {
        !self.state.exists() && !self.log.exists() && self.config().is_file()
    }

    pub fn load(&self) -> Result<State, StateError> {
        load(&self.state)
    }

    /// Refuses a state file that names another loop: its directory was copied or renamed
    /// with it, and a tick would run on that loop's history and in its worktree (two loops
    /// in one worktree, each under its own lock).
    pub fn owns(&self, state: &State) -> Result<(), StateError> {
        if state.name == self.name {
            return Ok(());
        }
        Err(StateError::Foreign {
            path: self.state.clone(),
            // The file's text, printed to a terminal: escaped like everything a loop's
            // files say (a loop's own name is checked when it is made; this one was not).
            named: crate::out::printable(&state.name).into_owned(),
            dir: self.name.clone(),
        })
    }

    /// Read-modify-write of the state under the state lock, so concurrent writers (a
    /// tick's commit, `halt`, `transition` from inside the tick) never lose an update.
    pub fn update<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<(State, R), StateError> {
        self.refuse_symlinks()?;
        let _guard = self.lock_state()?;
        let mut state = self.load()?;
        let r = f(&mut state);
        save(&self.state, &state)?;
        Ok((state, r))
    }

    /// Replaces the state and the whole log at once, under the state lock: a remote
    /// loop's cache, refreshed from its record (DESIGN §16).
    pub fn replace_all(&self, state: &State, log: &[u8]) -> Result<(), StateError> {
        self.refuse_symlinks()?;
        let _guard = self.lock_state()?;
        save(&self.state, state)?;
        crate::fs_safe::write_atomic(&self.dir, &self.log, log).map_err(io_err(&self.log))
    }

    /// The log's bytes (empty when there is none), at most 64 MiB.
    pub fn log_bytes(&self) -> Result<Vec<u8>, StateError> {
        match crate::fs_safe::head(&self.log, 64 << 20) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io_err(&self.log)(e)),
        }
    }

    /// Refuses a loop directory, `outputs/` or `cache/` that is a symlink: loopflow writes
    /// only inside the loop's own directory, never where a planted link points.
    pub fn refuse_symlinks(&self) -> Result<(), StateError> {
        for p in [
            &self.dir,
            &self.outputs,
            &self.cache_dir(),
            &self.dir.join("tmp"),
        ] {
            if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(io_err(p)(io::Error::other(
                    "is a symlink; loopflow never writes through one (remove it, or move the real directory here)",
                )));
            }
        }
        Ok(())
    }

    /// The commit writes the state, then its `TICK` line; a crash in between leaves an
    /// iteration without its line. Called at the start of the next tick, under the tick
    /// lock: when the log's last `TICK` is exactly one iteration behind the state, the
    /// missing line is appended as `TICK iter=N recovered=true`. Anything else (no log,
    /// a rotated log) is left alone.
    pub fn recover_tick_line(&self, state: &State) -> Result<(), StateError> {
        if state.iteration_count == 0 {
            return Ok(());
        }
        match log::last_tick(&self.log) {
            Some(last) if last + 1 == state.iteration_count => self.log(
                Event::Tick,
                &[
                    LogArg::Kv("iter", state.iteration_count.to_string()),
                    LogArg::Kv("recovered", "true".into()),
                ],
            ),
            _ => Ok(()),
        }
    }

    /// Removes the `.state.tmp*` files a killed atomic write left in the loop directory
    /// (called at the start of a tick, under the tick lock): those whose writer (the pid
    /// in the name) is gone, and any older than a minute. A write in progress — `halt`,
    /// `schedule install` beside the tick — is never pulled from under its rename: its
    /// writer is alive and its file young. Best effort; returns how many went.
    pub fn remove_stale_temps(&self) -> usize {
        let old = std::time::Duration::from_secs(60);
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        rd.flatten()
            .filter(|e| {
                let name = e.file_name();
                let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(TEMP_PREFIX)) else {
                    return false;
                };
                // Not followed: a symlink is never a temp file of ours.
                let Ok(m) = e.metadata() else { return false };
                if !m.is_file() {
                    return false;
                }
                let writer_gone = rest
                    .strip_prefix('.')
                    .and_then(|r| r.split_once('.'))
                    .and_then(|(pid, _)| pid.parse::<i32>().ok())
                    .is_some_and(|pid| !super::lock::alive(pid));
                writer_gone
                    || m.modified()
                        .is_ok_and(|t| t.elapsed().is_ok_and(|a| a >= old))
            })
            .filter(|e| std::fs::remove_file(e.path()).is_ok())
            .count()
    }

    /// Appends one event line: `<time> <EVENT> <args>`.
    pub fn log(&self, event: Event, args: &[LogArg<'_>]) -> Result<(), StateError> {
        let line = log::append(&self.log, event, args)?;
        if let Some(l) = &self.ledger
            && let Ok(mut l) = l.lock()
        {
            l.push(line);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read_config` picks the file `config` names: loop.json stands in for a loop.toml
    /// that does not `stat` (missing, a link loop), never for one that does.
    #[test]
    fn read_config_falls_back_to_loop_json_as_config_does() {
        let project = tempfile::tempdir().unwrap();
        let p = LoopPaths::new(project.path(), "l");
        std::fs::create_dir_all(&p.dir).unwrap();
        let name = |r: &Result<(PathBuf, String), (PathBuf, std::io::Error)>| {
            let path = match r {
                Ok((path, _)) | Err((path, _)) => path,
            };
            path.file_name().unwrap().to_string_lossy().into_owned()
        };
        // Neither file: the error names loop.toml.
        let r = p.read_config();
        assert!(r.is_err());
        assert_eq!(name(&r), "loop.toml");
        std::fs::write(p.dir.join("loop.json"), "{}").unwrap();
        for toml_is in ["missing", "a link loop"] {
            let fresh = LoopPaths::new(project.path(), "l");
            if toml_is == "a link loop" {
                std::os::unix::fs::symlink("loop.toml", p.dir.join("loop.toml")).unwrap();
            }
            let r = fresh.read_config();
            assert_eq!(name(&r), "loop.json", "loop.toml {toml_is}");
            assert_eq!(
                fresh.config(),
                p.dir.join("loop.json"),
                "loop.toml {toml_is}"
            );
        }
        // A loop.toml that exists but does not read (a directory) is the error.
        std::fs::remove_file(p.dir.join("loop.toml")).unwrap();
        std::fs::create_dir(p.dir.join("loop.toml")).unwrap();
        let fresh = LoopPaths::new(project.path(), "l");
        let r = fresh.read_config();
        assert!(r.is_err());
        assert_eq!(name(&r), "loop.toml");
        assert_eq!(fresh.config(), p.dir.join("loop.toml"));
        // A readable loop.toml wins.
        std::fs::remove_dir(p.dir.join("loop.toml")).unwrap();
        std::fs::write(p.dir.join("loop.toml"), "x = 1\n").unwrap();
        let r = LoopPaths::new(project.path(), "l").read_config();
        assert_eq!(r.map(|(_, t)| t).ok().as_deref(), Some("x = 1\n"));
    }
}
