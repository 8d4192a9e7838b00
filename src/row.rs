//! One loop's row: what `status` prints, `status --json` writes, and the dashboard and
//! `report` show on its card — built here once, from the loop's state, its configuration
//! and (for a loop aborting without a recorded reason) its log.

use crate::config::LoopConfig;
use crate::load::LoadError;
use crate::state::{Event, LoopPaths};

/// One loop's row of `status --json` (DESIGN §10 keys, and what the table needs
/// besides), its keys in the order written. A struct, not a JSON map: the dashboard and
/// `report` make one per loop and read it back, and a map hashed every key twice.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Row {
    /// The loop's name; over many projects, `<project>:<loop>`.
    pub name: String,
    /// Over many projects: the project's label (`name`'s prefix), its directory and the
    /// loop's own name (what `--loop` takes there). Absent for one project.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_dir: Option<std::path::PathBuf>,
    #[serde(rename = "loop", skip_serializing_if = "Option::is_none")]
    pub loop_name: Option<String>,
    pub iteration_count: u64,
    /// The cap with `approve --extend`'s iterations; `None` when the config does not load.
    pub max_iterations: Option<u64>,
    pub halt: Option<crate::state::Halt>,
    pub current_task: Option<String>,
    pub task_source: Option<String>,
    pub current_phase: String,
    pub last_tick_at: Option<String>,
    pub last_score: Option<f64>,
    pub spent: crate::state::Spent,
    pub limits: Option<Limits>,
    pub goal_score: Option<f64>,
    /// Whether implement and verify name different models; `None` when either names none.
    pub model_diverse: Option<bool>,
    pub sandbox: Option<&'static str>,
    pub config_error: Option<String>,
    pub consecutive_aborts: u32,
    pub last_abort: Option<LastAbort>,
    pub notes: Vec<String>,
    pub running: bool,
    /// Why every tick of this loop skips before any agent runs until a human acts (no
    /// task, a phase it does not run in, its worktree missing); `None` when ticks run.
    pub skipping: Option<Skipping>,
}

/// A loop whose every tick skips: the skip's reason as the log says it, what the gate
/// saw, and what makes it tick again.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Skipping {
    pub reason: String,
    pub detail: String,
    pub fix: String,
}

/// A row's budget limits (`null`: no limit on that unit).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Limits {
    pub usd: Option<f64>,
    pub tokens: Option<u64>,
    pub seconds: Option<f64>,
}

/// The last aborted tick of a loop that has not ticked since: its `ABORT` line, and the
/// agent's own words with its output files (relative to the loop's directory).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct LastAbort {
    pub at: String,
    pub node: Option<String>,
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
}

impl Row {
    /// This row as one of project `label`'s (at `dir`) over many: named `label:loop`.
    pub(crate) fn in_project(mut self, label: &str, dir: &std::path::Path) -> Row {
        self.loop_name = Some(std::mem::take(&mut self.name));
        self.name = format!("{label}:{}", self.loop_name.as_deref().unwrap_or(""));
        self.project = Some(label.to_string());
        self.project_dir = Some(dir.to_path_buf());
        self
    }
}

/// Why a loop of the listing has no row.
pub(crate) enum NoRow {
    /// A directory without `.state.loop` yet: not a loop to list.
    Untracked,
    /// The state cannot be read (the message says which file and why).
    Unreadable(String),
}

/// [`status_row`] for the dashboard and the report: a loop without a row is `Err(None)`
/// when it is no loop yet, `Err(Some(why))` when its state does not load.
/// With the state and configuration the caller already loaded, nothing is read again.
pub(crate) fn of(
    paths: &LoopPaths,
    known: Option<(&crate::state::State, &LoopConfig)>,
) -> Result<Row, Option<String>> {
    if let Some((s, c)) = known {
        return Ok(row(paths, s, Some(c), None));
    }
    status_row(paths).map_err(|e| match e {
        NoRow::Untracked => None,
        NoRow::Unreadable(e) => Some(e),
    })
}

/// One loop's row of `status` (DESIGN §10 keys, and what the table needs besides).
pub(crate) fn status_row(paths: &LoopPaths) -> Result<Row, NoRow> {
    let project = paths.project.as_path();
    let s = match paths.load() {
        Err(e) if e.is_not_found() => return Err(NoRow::Untracked),
        loaded => loaded.map_err(|e| NoRow::Unreadable(e.to_string()))?,
    };
    // Paths in the problem read from where the user stands, as `check` prints them.
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    let (cfg, config_error) = match crate::load::config(paths, &base) {
        Ok(c) => (Some(c), None),
        Err(LoadError::Config(d)) => (
            None,
            d.items.iter().find(|d| d.is_error()).map(|d| {
                let (line, col) = d.start();
                format!("{}:{line}:{col}: {}", d.source.name, d.message)
            }),
        ),
        Err(LoadError::Io { path, source }) => {
            (None, Some(format!("{}: {source}", path.display())))
        }
    };
    Ok(row(paths, &s, cfg.as_ref(), config_error))
}

/// The row from what was loaded: the state, the configuration (`None`: it does not
/// load, `config_error` says why).
fn row(
    paths: &LoopPaths,
    s: &crate::state::State,
    cfg: Option<&LoopConfig>,
    config_error: Option<String>,
) -> Row {
    // D12: verification by the same model as the implementation is weaker; say so. With
    // a model missing on either side nothing is known: null, not a reassuring `true`.
    fn model<'c>(c: &'c LoopConfig, role: &str) -> Option<&'c str> {
        c.roles.get(role)?.model.as_deref()
    }
    let models = cfg.and_then(|c| Some((model(c, "implement")?, model(c, "verify")?)));
    // An aborting loop (ticks failing in a row, not yet halted) is not `ok`. The state
    // keeps the agent's own words until a tick commits; a state written before it did
    // falls back on the log's ABORT line.
    let last_abort = match &s.last_abort {
        Some(a) => Some(LastAbort {
            at: a.at.clone(),
            node: Some(a.node.clone()),
            reason: Some(a.reason.clone()),
            message: a.message.clone(),
            outputs: a.outputs.clone(),
        }),
        None => (s.consecutive_aborts > 0)
            .then(|| crate::state::log::last_event(&paths.log, Event::Abort))
            .flatten()
            .map(|mut e| LastAbort {
                at: e.at,
                node: e.args.shift_remove("node"),
                reason: e.args.shift_remove("reason"),
                message: None,
                outputs: Vec::new(),
            }),
    };
    Row {
        // The loop is its directory (`--loop NAME` finds it there): a state file copied
        // with its directory still carries the first loop's name.
        name: paths.name.clone(),
        project: None,
        project_dir: None,
        loop_name: None,
        iteration_count: s.iteration_count,
        max_iterations: cfg.map(|c| c.effective_max_iterations(s.extra_iterations)),
        halt: s.halt.clone(),
        current_task: s.current_task.clone(),
        task_source: s.task_source.clone(),
        current_phase: s.current_phase.clone(),
        last_tick_at: s.last_tick_at.clone(),
        last_score: s
            .score_history
            .last()
            .copied()
            .or(s.last_verdict.as_ref().map(|v| v.score)),
        spent: s.spent.clone(),
        limits: cfg.map(|c| {
            let l = c.brakes.budget(&s.extra_budget);
            Limits {
                usd: l.usd,
                tokens: l.tokens,
                seconds: l.seconds,
            }
        }),
        goal_score: cfg.map(|c| c.brakes.goal_score),
        model_diverse: models.map(|(a, b)| a != b),
        sandbox: cfg.map(|c| c.sandbox.mode.as_str()),
        config_error,
        consecutive_aborts: s.consecutive_aborts,
        last_abort,
        notes: models
            .filter(|(a, b)| a == b)
            .map(|(m, _)| {
                format!(
                    "implement and verify both use model `{m}`: verification is not model-diverse"
                )
            })
            .into_iter()
            .chain(paths.owns(s).err().map(|_| {
                format!(
                    "its state file is loop `{}`'s (the directory was copied or renamed with it): its ticks are refused until it is started fresh (`loopflow run --loop {}` says how)",
                    s.name, paths.name
                )
            }))
            .collect(),
        running: paths.tick_seen_running(),
        skipping: cfg.and_then(|c| skipping(paths, s, c)),
    }
}

/// Why every tick of a loop that is neither halted nor running skips, as its gate would
/// say it: a loop that can never tick is a problem, not `ok`. Spawns nothing (an audit
/// command is not run); a backlog file is read.
fn skipping(paths: &LoopPaths, s: &crate::state::State, cfg: &LoopConfig) -> Option<Skipping> {
    if s.halt.is_some() || paths.owns(s).is_err() {
        return None;
    }
    match crate::next::next(cfg, s, paths) {
        crate::next::Next::Skips {
            reason,
            detail,
            fix,
        } if crate::next::persistent(&reason) => Some(Skipping {
            reason: reason.to_string(),
            detail,
            fix,
        }),
        _ => None,
    }
}
