//! A loop's files: versioned state JSON (written only by atomic replace), where each file
//! lives, the append-only event log, the locks, and the checks that notice when someone
//! other than loopflow changed them during a tick.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fs_safe::write_atomic;
use crate::reason::HaltReason;
use crate::verdict::Verdict;

mod lock;
pub(crate) mod log;
pub(crate) mod machine;
mod paths;
pub(crate) mod tamper;

pub(crate) use lock::{Previous, TickLock};
pub(crate) use log::{Event, LogArg};
pub use paths::LoopPaths;
pub(crate) use paths::{Ledger, check_loop_name, list_loops, loops_dir, text_path};

pub(crate) const SCHEMA_VERSION: u32 = 1;

/// `.state.loop`: a loop's state, written only by loopflow.
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
    /// Budget added by `approve --budget-usd/--budget-tokens/--budget-seconds`, on top of
    /// `[brakes]`'s limits (a unit without a limit stays without one).
    #[serde(default, skip_serializing_if = "Spent::is_zero")]
    pub extra_budget: Spent,
    #[serde(default)]
    pub created_at: Option<String>,
    /// Where `current_task` came from (`--task`, `backlog:FILE`, `audit`).
    #[serde(default)]
    pub task_source: Option<String>,
    /// The last aborted tick's failure, in the agent's own words; cleared by a committed
    /// tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_abort: Option<AbortNote>,
}

/// Why a tick aborted, for the human (`status`, `review`, the dashboard).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AbortNote {
    /// RFC 3339 UTC.
    pub at: String,
    pub node: String,
    /// As the `ABORT` line says it (`exit:1`, `timeout`, `agent_error:…`).
    pub reason: String,
    /// The agent's own words: the error its output reported, else the tail of its stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The node's output files, relative to the loop's directory (`outputs/3-implement.stderr`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Halt {
    #[schemars(with = "String")]
    pub reason: HaltReason,
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

impl Spent {
    pub fn is_zero(&self) -> bool {
        *self == Spent::default()
    }
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
    /// The commit the human approved: the tip of `loopflow/<name>` (the checkout's HEAD
    /// for a loop without a worktree) when they approved; `review` starts there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
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
            extra_budget: Spent::default(),
            created_at: Some(now()),
            last_abort: None,
        }
    }
}

/// The current time as RFC 3339 UTC with second precision.
pub(crate) fn now() -> String {
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
    #[error(
        "{path}: this state file is loop `{named}`'s, not `{dir}`'s: the loop directory was copied or renamed with it\n  a tick would carry `{named}`'s iterations, spend, approvals and worktree into `{dir}`, so none runs; if you renamed it, rename it back to `{named}`; if you copied it, start `{dir}` fresh: remove its .state.loop, .state.log, .schedule.json and worktree/ (copies of `{named}`'s, where it has them), then `loopflow create --loop {dir}` starts the loop.toml there as it is"
    )]
    Foreign {
        path: PathBuf,
        named: String,
        dir: String,
    },
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl StateError {
    /// The state file is not there (its open said so).
    pub fn is_not_found(&self) -> bool {
        matches!(self, StateError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Reads a state file. A file that does not parse is reported with line and column.
pub fn load(path: &Path) -> Result<State, StateError> {
    let text = crate::fs_safe::read_to_string(path).map_err(io_err(path))?;
    from_text(path, &text)
}

/// A state file's text, parsed once. A newer format is named as such, not as corruption:
/// by the parsed version, or — when a newer format does not parse as this one — by a
/// second, untyped look at its `schema_version`.
pub(crate) fn from_text(path: &Path, text: &str) -> Result<State, StateError> {
    let too_new = |found: u64| StateError::TooNew {
        path: path.to_path_buf(),
        found: found as u32,
    };
    match serde_json::from_str::<State>(text) {
        Ok(s) if s.schema_version > SCHEMA_VERSION => Err(too_new(u64::from(s.schema_version))),
        Ok(s) => Ok(s),
        Err(e) => {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text)
                && let Some(found) = v.get("schema_version").and_then(serde_json::Value::as_u64)
                && found > u64::from(SCHEMA_VERSION)
            {
                return Err(too_new(found));
            }
            Err(StateError::Corrupt {
                path: path.to_path_buf(),
                line: e.line(),
                column: e.column(),
                message: e.to_string(),
            })
        }
    }
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
}
