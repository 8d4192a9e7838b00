//! Reading a loop's task from its work source (DESIGN §4): the state (`single`), the
//! topmost open `- [ ]` item of a checklist (`backlog`), or the first line a command
//! prints (`audit`). One reader per tick, remembering its answer, so the gate and the
//! dry run never run an audit twice; nothing is kept between ticks.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use crate::config::{LoopConfig, WorkSource};
use crate::state::{LoopPaths, State};
use crate::template::{Tmpl, vars};

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// What `current_task` holds: a backlog item's bold slug, an audit line's `id`.
    pub id: String,
    /// The whole item text or audit `title` (the id when there is nothing more).
    pub title: String,
    /// Where it came from: `--task`, `backlog:BACKLOG.md`, `audit`.
    pub source: String,
}

/// Why the work source could not say what the task is.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkSourceError {
    #[error("{key} `{template}`: {error}")]
    Template {
        key: &'static str,
        template: String,
        error: String,
    },
    #[error("backlog {}: {error} (work_source.file in loop.toml)", path.display())]
    Backlog { path: PathBuf, error: String },
    #[error("temp dir for the audit output: {0}")]
    TempDir(String),
    #[error("audit command `{argv}` failed ({reason}): {stderr}")]
    Audit {
        argv: String,
        reason: String,
        stderr: String,
    },
}

/// How long an audit command may take before it is killed.
const AUDIT_TIMEOUT: Duration = Duration::from_secs(600);

/// The directory a loop's agents work in: its worktree, or the project root. (A worktree
/// with no place on this machine — no home directory — is said by the tick; its old
/// place, which is not there, stands in.)
pub(crate) fn loop_cwd(config: &LoopConfig, paths: &LoopPaths) -> PathBuf {
    if config.worktree {
        crate::worktree::location(&paths.project, &paths.name, config.worktree_dir.as_deref())
            .map_or_else(|_| crate::worktree::nested(paths), |c| c.work_tree)
    } else {
        paths.project.clone()
    }
}

/// One tick's view of the work source.
pub struct WorkSourceReader<'a> {
    config: &'a LoopConfig,
    state: &'a State,
    paths: &'a LoopPaths,
    /// A dry run spawns nothing, audits included.
    dry_run: bool,
    /// The sandbox audit commands run in (the tick's), if any.
    sandbox: Option<&'a crate::sandbox::Prepared>,
    current: OnceLock<Result<Option<Task>, WorkSourceError>>,
}

impl<'a> WorkSourceReader<'a> {
    pub fn new(
        config: &'a LoopConfig,
        state: &'a State,
        paths: &'a LoopPaths,
        dry_run: bool,
    ) -> Self {
        WorkSourceReader {
            config,
            state,
            paths,
            dry_run,
            sandbox: None,
            current: OnceLock::new(),
        }
    }

    /// Runs audit commands in `sandbox`.
    pub fn confined(mut self, sandbox: Option<&'a crate::sandbox::Prepared>) -> Self {
        self.sandbox = sandbox;
        self
    }

    /// The task the loop works on now (read once per reader).
    pub fn current(&self) -> Result<Option<Task>, WorkSourceError> {
        self.current.get_or_init(|| self.read()).clone()
    }

    /// The task after this tick's work (the agent may have checked its item off): read
    /// afresh.
    pub fn next(&self) -> Result<Option<Task>, WorkSourceError> {
        self.read()
    }

    fn vars(&self) -> serde_json::Value {
        vars::source(
            &self.paths.name,
            &self.paths.project.display().to_string(),
            &loop_cwd(self.config, self.paths).display().to_string(),
        )
    }

    fn read(&self) -> Result<Option<Task>, WorkSourceError> {
        match &self.config.work_source {
            WorkSource::Single => Ok(self.state.current_task.clone().map(|t| Task {
                title: t.clone(),
                id: t,
                source: self
                    .state
                    .task_source
                    .clone()
                    .unwrap_or_else(|| "state".into()),
            })),
            WorkSource::Backlog { file } => self.backlog(file),
            WorkSource::Audit { command } => {
                if self.dry_run {
                    // A dry run spawns nothing: show the task the state last recorded.
                    return Ok(Some(Task {
                        id: self
                            .state
                            .current_task
                            .clone()
                            .unwrap_or_else(|| "<first task of the audit command>".into()),
                        title: "the audit command is not run in a dry run".into(),
                        source: "audit".into(),
                    }));
                }
                Ok(self.audit(command)?.into_iter().next())
            }
        }
    }

    fn backlog(&self, file: &Path) -> Result<Option<Task>, WorkSourceError> {
        let file = match file.to_str() {
            Some(f) if f.contains("{{") => {
                let hb = crate::template::engine();
                let p = crate::template::render(&hb, f, &self.vars()).map_err(|e| {
                    WorkSourceError::Template {
                        key: "work_source.file",
                        template: f.to_string(),
                        error: e.to_string(),
                    }
                })?;
                PathBuf::from(p)
            }
            _ => file.to_path_buf(),
        };
        let text = crate::fs_safe::read_to_string(&file).map_err(|e| WorkSourceError::Backlog {
            path: file.clone(),
            error: e.to_string(),
        })?;
        let name = file
            .strip_prefix(loop_cwd(self.config, self.paths))
            .or_else(|_| file.strip_prefix(&self.paths.project))
            .map_or_else(|_| file.display().to_string(), |p| p.display().to_string());
        Ok(backlog_item(&text).map(|(id, title)| Task {
            id,
            title,
            source: format!("backlog:{name}"),
        }))
    }

    /// Runs the audit command (argv templates, no shell) in the loop's working directory
    /// and reads its tasks: one per line, or JSON lines with `id` and `title`. `#` lines
    /// and blank lines are ignored. An argv starting with `loopflow` runs this very binary.
    fn audit(&self, command: &[Tmpl]) -> Result<Vec<Task>, WorkSourceError> {
        let hb = crate::template::engine();
        let vars = self.vars();
        let mut argv = Vec::new();
        for t in command {
            argv.push(crate::template::render(&hb, &t.text, &vars).map_err(|e| {
                WorkSourceError::Template {
                    key: "work_source.command element",
                    template: t.text.clone(),
                    error: e.to_string(),
                }
            })?);
        }
        if argv.first().is_some_and(|a| a == "loopflow")
            && let Ok(exe) = std::env::current_exe()
        {
            argv[0] = exe.display().to_string();
        }
        let dir = tempfile::tempdir().map_err(|e| WorkSourceError::TempDir(e.to_string()))?;
        let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let cwd = loop_cwd(self.config, self.paths);
        let cwd = if cwd.is_dir() {
            cwd
        } else {
            self.paths.project.clone()
        };
        // Confined like the agents: it sees the tick's environment, not loopflow's.
        let sb = &self.config.sandbox;
        let environ = crate::environ::Environ::new(sb, sb.mode != crate::config::SandboxMode::Off);
        let done = crate::process::run(&crate::process::Spawn {
            argv: &argv,
            cwd: &cwd,
            base_env: Some(environ.pick(&[])),
            env: vec![
                ("LOOPFLOW_LOOP".into(), self.paths.name.clone()),
                (
                    "LOOPFLOW_PROJECT".into(),
                    self.paths.project.display().to_string(),
                ),
            ],
            stdin: None,
            stdout: out.clone(),
            stderr: err.clone(),
            timeout: Some(AUDIT_TIMEOUT),
            idle: None,
            grace: self.config.harness_grace.unwrap_or(crate::process::GRACE),
            cancel: &cancel,
            sandbox: self.sandbox,
            on_spawn: None,
            on_poll: None,
            refused: None,
        });
        let lossy = |p: &Path| {
            crate::fs_safe::head(p, crate::fs_safe::TEXT_MAX)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        let text = lossy(&out);
        match done.exit {
            crate::process::Exit::Code(0) => {}
            // Linters often exit non-zero exactly when they found something: keep their output.
            crate::process::Exit::Code(_) if !text.trim().is_empty() => {}
            other => {
                let stderr = lossy(&err);
                return Err(WorkSourceError::Audit {
                    argv: argv.join(" "),
                    reason: other.failure().to_string(),
                    stderr: stderr.lines().next().unwrap_or("no output").to_string(),
                });
            }
        }
        Ok(audit_tasks(&text))
    }
}

/// Parses audit output: plain lines, or JSON objects with `id` (and `title`).
pub(crate) fn audit_tasks(text: &str) -> Vec<Task> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let json = l
                .starts_with('{')
                .then(|| serde_json::from_str::<serde_json::Value>(l).ok())
                .flatten();
            let field = |v: &serde_json::Value, k: &str| match &v[k] {
                serde_json::Value::String(s) => Some(s.clone()),
                serde_json::Value::Number(n) => Some(n.to_string()),
                _ => None,
            };
            match json {
                Some(v) if field(&v, "id").is_some() || field(&v, "title").is_some() => {
                    let id = field(&v, "id")
                        .or_else(|| field(&v, "title"))
                        .unwrap_or_default();
                    let title = field(&v, "title").unwrap_or_else(|| id.clone());
                    Task {
                        id,
                        title,
                        source: "audit".into(),
                    }
                }
                _ => Task {
                    id: l.to_string(),
                    title: l.to_string(),
                    source: "audit".into(),
                },
            }
        })
        .collect()
}

/// The topmost unchecked `- [ ]` item of a markdown checklist: its id (the bold slug,
/// else the text) and its whole text.
pub(crate) fn backlog_item(text: &str) -> Option<(String, String)> {
    text.lines().find_map(|l| {
        let t = l.trim_start();
        let rest = t
            .strip_prefix("- [ ]")
            .or_else(|| t.strip_prefix("* [ ]"))
            .or_else(|| t.strip_prefix("+ [ ]"))?;
        let rest = rest.trim();
        if let Some(after) = rest.strip_prefix("**")
            && let Some(end) = after.find("**")
        {
            let id = after[..end].trim().to_string();
            if !id.is_empty() {
                return Some((id, rest.to_string()));
            }
        }
        (!rest.is_empty()).then(|| (rest.to_string(), rest.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backlog_picks_topmost_open_item_and_slug() {
        let top = |md: &str| backlog_item(md).map(|x| x.0);
        let md = "# B\n- [x] done\n- [ ] **first-thing** — do it\n- [ ] second\n";
        assert_eq!(top(md).as_deref(), Some("first-thing"));
        assert_eq!(top("- [ ] plain task").as_deref(), Some("plain task"));
        assert_eq!(top("- [x] all done"), None);
        assert_eq!(
            backlog_item("- [ ] **a-b** fix it").map(|x| x.1).as_deref(),
            Some("**a-b** fix it")
        );
    }

    #[test]
    fn audit_lines_and_json() {
        let t = audit_tasks(
            "# header\n\nplain task\n{\"id\": \"x1\", \"title\": \"Fix x\"}\n{\"id\": 7}\n",
        );
        let ids: Vec<&str> = t.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["plain task", "x1", "7"]);
        assert_eq!(t[1].title, "Fix x");
        assert_eq!(t[2].title, "7");
    }
}
