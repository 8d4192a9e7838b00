//! A loop's files: versioned state JSON (written only by atomic replace), the append-only
//! event log, and the two locks (the tick lock held for a whole tick, and the short state
//! lock held around every read-modify-write of `.state.loop`).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fs_safe::{nofollow, refuse_hard_link, write_atomic};
use crate::verdict::Verdict;

pub const SCHEMA_VERSION: u32 = 1;

/// `.state.loop` (DESIGN §8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct State {
    pub schema_version: u32,
    pub name: String,
    pub iteration_count: u64,
    pub current_task: Option<String>,
    pub current_phase: String,
    /// The last `score_plateau_window` verdict scores, oldest first.
    pub score_history: Vec<f64>,
    pub last_verdict: Option<Verdict>,
    /// RFC 3339 UTC.
    pub last_tick_at: Option<String>,
    pub halt: Option<Halt>,
    pub spent: Spent,
    pub worktree_path: Option<String>,
    pub approvals: Vec<Approval>,
    /// Ticks aborted in a row; reset by a committed tick or an approval.
    #[serde(default)]
    pub consecutive_aborts: u32,
    /// Iterations added by `approve --extend`, on top of `brakes.max_iterations`.
    #[serde(default)]
    pub extra_iterations: u64,
    #[serde(default)]
    pub created_at: Option<String>,
    /// Where `current_task` came from (`--task`, `backlog:FILE`, `audit`).
    #[serde(default)]
    pub task_source: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Halt {
    pub reason: String,
    pub detail: Option<String>,
    pub at: String,
    pub iteration: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Spent {
    pub usd: f64,
    pub tokens: u64,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Approval {
    pub by: String,
    pub at: String,
    pub note: Option<String>,
    /// The halt this approval cleared.
    pub cleared: Option<String>,
    #[serde(default)]
    pub extend: u64,
}

impl State {
    pub fn new(name: &str, task: Option<String>, worktree: Option<String>) -> State {
        State {
            schema_version: SCHEMA_VERSION,
            name: name.to_string(),
            iteration_count: 0,
            task_source: task.as_ref().map(|_| "--task".to_string()),
            current_task: task,
            current_phase: "implement".into(),
            score_history: Vec::new(),
            last_verdict: None,
            last_tick_at: None,
            halt: None,
            spent: Spent::default(),
            worktree_path: worktree,
            approvals: Vec::new(),
            consecutive_aborts: 0,
            extra_iterations: 0,
            created_at: Some(now()),
        }
    }
}

/// The current time as RFC 3339 UTC with second precision.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Failures reading or writing a loop's files. All map to exit code 4.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "{path}:{line}:{column}: the state file is not valid: {message}\n  it was left untouched; fix or restore it (loopflow never overwrites a state file it cannot read)"
    )]
    Corrupt {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error(
        "{path}: state schema_version {found} is newer than this loopflow understands ({SCHEMA_VERSION}); upgrade loopflow"
    )]
    TooNew { path: PathBuf, found: u32 },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

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
        }
    }

    /// `loop.toml`, or a predecessor-style `loop.json` when only that exists.
    pub fn config(&self) -> PathBuf {
        let toml = self.dir.join("loop.toml");
        let json = self.dir.join("loop.json");
        if !toml.exists() && json.exists() {
            json
        } else {
            toml
        }
    }

    pub fn load(&self) -> Result<State, StateError> {
        load(&self.state)
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

    /// Refuses a loop directory, `outputs/` or `cache/` that is a symlink: loopflow writes
    /// only inside the loop's own directory, never where a planted link points.
    pub fn refuse_symlinks(&self) -> Result<(), StateError> {
        for p in [&self.dir, &self.outputs, &self.dir.join("cache")] {
            if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(io_err(p)(io::Error::other(
                    "is a symlink; loopflow never writes through one (remove it, or move the real directory here)",
                )));
            }
        }
        Ok(())
    }

    fn lock_state(&self) -> Result<File, StateError> {
        let f = nofollow(OpenOptions::new().create(true).truncate(false).write(true))
            .open(&self.state_lock)
            .map_err(io_err(&self.state_lock))?;
        f.lock().map_err(io_err(&self.state_lock))?;
        Ok(f)
    }

    /// Takes the tick lock without waiting. `None` when another tick holds it.
    pub fn try_lock_tick(&self) -> Result<Option<TickLock>, StateError> {
        let Some(dir) = self.try_lock_dir()? else {
            return Ok(None);
        };
        let f = nofollow(
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true),
        )
        .open(&self.lock)
        .map_err(io_err(&self.lock))?;
        match f.try_lock() {
            Ok(()) => Ok(Some(TickLock {
                _dir: dir,
                _file: f,
            })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(io_err(&self.lock)(e)),
        }
    }

    /// The loop directory's own lock, taken with `.lock`: an agent that deletes `.lock`
    /// during its tick must not let `approve` or a second tick in. `Some(None)` where
    /// directories cannot be locked.
    fn try_lock_dir(&self) -> Result<Option<Option<File>>, StateError> {
        #[cfg(unix)]
        {
            let d = File::open(&self.dir).map_err(io_err(&self.dir))?;
            match d.try_lock() {
                Ok(()) => Ok(Some(Some(d))),
                Err(std::fs::TryLockError::WouldBlock) => Ok(None),
                Err(std::fs::TryLockError::Error(e)) => Err(io_err(&self.dir)(e)),
            }
        }
        #[cfg(not(unix))]
        Ok(Some(None))
    }

    /// Whether a tick holds the loop right now.
    pub fn tick_running(&self) -> Result<bool, StateError> {
        if !self.dir.is_dir() {
            return Ok(false);
        }
        if !self.lock.exists() {
            return Ok(self.try_lock_dir()?.is_none());
        }
        Ok(self.try_lock_tick()?.is_none())
    }

    /// The `iter=` of the last `TICK` line in the log's tail (the last 64 KiB); 0 when
    /// the whole log was read and holds none; `None` when that cannot be known.
    fn last_logged_tick(&self) -> Option<u64> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = File::open(&self.log).ok()?;
        let len = f.metadata().ok()?.len();
        let start = len.saturating_sub(64 * 1024);
        f.seek(SeekFrom::Start(start)).ok()?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf).ok()?;
        let last = String::from_utf8_lossy(&buf).lines().rev().find_map(|l| {
            let mut words = l.split(' ');
            words.next()?; // the time
            if words.next()? != "TICK" {
                return None;
            }
            words.find_map(|w| w.strip_prefix("iter=")?.parse().ok())
        });
        last.or((start == 0).then_some(0))
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
        match self.last_logged_tick() {
            Some(last) if last + 1 == state.iteration_count => self.log(
                "TICK",
                &[
                    LogArg::Kv("iter", state.iteration_count.to_string()),
                    LogArg::Kv("recovered", "true".into()),
                ],
            ),
            _ => Ok(()),
        }
    }

    /// Appends one event line: `<time> <EVENT> <args>`.
    pub fn log(&self, event: &str, args: &[LogArg<'_>]) -> Result<(), StateError> {
        append_log(&self.log, event, args)
    }
}

/// Held for the whole of a tick: the `.lock` file and the loop directory, both flocked.
/// The lock file also lists the process groups the tick spawned (`pgid N` lines), so
/// the next tick can stop what a tick killed with `kill -9` left running.
pub struct TickLock {
    _dir: Option<File>,
    _file: File,
}

impl TickLock {
    /// Records a spawned process group (one small write to the already open file).
    pub fn record_group(&self, pgid: u32) {
        let _ = (&self._file).write_all(format!("pgid {pgid}\n").as_bytes());
    }

    /// The groups an earlier tick recorded and did not clear (it died), and clears them.
    pub fn take_groups(&self) -> Vec<u32> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = &self._file;
        let mut text = String::new();
        let _ = f.seek(SeekFrom::Start(0));
        let _ = f.take(64 * 1024).read_to_string(&mut text);
        self.clear_groups();
        text.lines()
            .filter_map(|l| l.strip_prefix("pgid ")?.trim().parse().ok())
            .filter(|&g: &u32| g > 1)
            .collect()
    }

    /// Forgets the recorded groups: the tick stopped all of them itself.
    pub fn clear_groups(&self) {
        use std::io::{Seek, SeekFrom};
        let _ = self._file.set_len(0);
        let _ = (&self._file).seek(SeekFrom::Start(0));
    }
}

pub fn loops_dir(project: &Path) -> PathBuf {
    project.join(".loopflow").join("loops")
}

/// One item after the event name: a bare word or `key=value`.
pub enum LogArg<'a> {
    Word(&'a str),
    Kv(&'a str, String),
}

/// Characters some reader treats as a line break (Rust's `lines`, Python's `splitlines`,
/// JavaScript's line terminators), or that a terminal acts on: none may reach the log raw,
/// or a reason could forge an event line.
fn breaks_lines(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

/// Quotes a log value when it holds whitespace, quotes or `=`, so lines stay parseable.
/// Inside quotes every line-breaking character is escaped (`\n`, `\u2028`).
pub fn quote(v: &str) -> String {
    if v.is_empty()
        || v.chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || breaks_lines(c))
    {
        let json = serde_json::to_string(v).unwrap_or_else(|_| "\"?\"".into());
        // serde_json leaves U+0085, U+2028, U+2029 and DEL raw; escape them too.
        let mut out = String::with_capacity(json.len());
        for c in json.chars() {
            if breaks_lines(c) {
                out.push_str(&format!("\\u{:04x}", c as u32));
            } else {
                out.push(c);
            }
        }
        out
    } else {
        v.to_string()
    }
}

/// A bare word in a log line: line-breaking characters become spaces.
fn word(w: &str) -> String {
    w.chars()
        .map(|c| if breaks_lines(c) { ' ' } else { c })
        .collect()
}

pub fn append_log(path: &Path, event: &str, args: &[LogArg<'_>]) -> Result<(), StateError> {
    let mut line = format!("{} {}", now(), event);
    for a in args {
        line.push(' ');
        match a {
            LogArg::Word(w) => line.push_str(&word(w)),
            LogArg::Kv(k, v) => {
                line.push_str(k);
                line.push('=');
                line.push_str(&quote(v));
            }
        }
    }
    line.push('\n');
    let mut f = nofollow(OpenOptions::new().create(true).append(true))
        .open(path)
        .map_err(io_err(path))?;
    refuse_hard_link(&f).map_err(io_err(path))?;
    // One write call per line: O_APPEND keeps concurrent writers' lines whole.
    f.write_all(line.as_bytes()).map_err(io_err(path))
}

/// Reads a state file. A file that does not parse is reported with line and column.
pub fn load(path: &Path) -> Result<State, StateError> {
    let text = crate::fs_safe::read_to_string(path).map_err(io_err(path))?;
    // Look at the version first so a newer format is named as such, not as corruption.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text)
        && let Some(found) = v.get("schema_version").and_then(serde_json::Value::as_u64)
        && found > u64::from(SCHEMA_VERSION)
    {
        return Err(StateError::TooNew {
            path: path.to_path_buf(),
            found: found as u32,
        });
    }
    serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

/// Atomic replace: temp file in the same directory, fsync, rename, fsync the directory.
/// A crash at any point leaves either the old file or the new one, never a mix.
pub fn save(path: &Path, state: &State) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut json =
        serde_json::to_vec_pretty(state).map_err(|e| io_err(path)(io::Error::other(e)))?;
    json.push(b'\n');
    write_atomic(dir, path, &json).map_err(io_err(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_corrupt_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(".state.loop");
        let s = State::new("x", Some("t".into()), None);
        save(&p, &s).unwrap();
        assert_eq!(load(&p).unwrap(), s);
        std::fs::write(&p, "{\n  \"schema_version\": 1,\n  oops\n}").unwrap();
        match load(&p) {
            Err(StateError::Corrupt { line, column, .. }) => assert_eq!((line, column), (3, 3)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("abc"), "abc");
        assert_eq!(quote("extend 5"), "\"extend 5\"");
        assert_eq!(quote(""), "\"\"");
        assert_eq!(quote("a\u{2028}b"), "\"a\\u2028b\"");
        assert_eq!(quote("a\u{85}b\u{b}"), "\"a\\u0085b\\u000b\"");
        assert_eq!(word("a\u{2029}b\rc\u{c}"), "a b c ");
    }
}
