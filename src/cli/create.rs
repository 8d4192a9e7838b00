//! `create`: a new loop from a built-in template, with the agent it runs.

use std::path::Path;

use clap::Args;

use crate::config::{LoopConfig, WorkSource};
use crate::create::{AgentChoice, CreateError, CreateOptions, Harness};
use crate::exit;
use crate::out::{self, outln};

#[derive(Args, Debug)]
pub(crate) struct CreateArgs {
    /// The new loop's name: 1–64 of a-z, 0-9, `_`, `-` (its directory under
    /// .loopflow/loops/).
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Built-in template to start from: default, ci-triage, self-improvement, goal,
    /// design-update (an unknown name lists them with what each does).
    #[arg(long, default_value = "default")]
    pub template: String,
    /// The task the loop works on (work_source "single").
    #[arg(long)]
    pub task: Option<String>,
    /// Work in the project checkout instead of a git worktree of its own.
    #[arg(long, conflicts_with = "remote")]
    pub no_worktree: bool,
    /// Where the loop's worktree lives (absolute, outside the project), written to its
    /// loop.toml as `[worktree] dir`; default `~/.local/state/loopflow/worktrees`.
    #[arg(long, value_name = "DIR", conflicts_with = "no_worktree")]
    pub worktree_dir: Option<std::path::PathBuf>,
    /// Keep the loop's state of record in the repository on this git remote (`origin`):
    /// pushed as `refs/loopflow/<loop>/state` only if it is not there yet; then any
    /// runner ticks it and any clone approves it.
    #[arg(long, value_name = "REMOTE")]
    pub remote: Option<String>,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// `--agent`, `--model`, `--verify-model`: shared by `create` and `init`.
#[derive(Args, Debug, Default)]
pub(crate) struct AgentArgs {
    /// The agent the roles run, as a shipped preset: claude-code, opencode, codex, gemini,
    /// aider, goose (written as `[harness] preset`; the templates' default is opencode).
    #[arg(long, value_name = "PRESET")]
    pub agent: Option<String>,
    /// The model every role uses, in the agent's own naming (`sonnet`, `gpt-5.5`,
    /// `anthropic/claude-sonnet-4-5` for opencode); default: the agent's.
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// The verifier's model instead, so another model grades the work.
    #[arg(long, value_name = "M")]
    pub verify_model: Option<String>,
}

impl AgentArgs {
    /// What `create` writes for these flags (`None`: the template as it is).
    pub(crate) fn harness(&self) -> Option<Harness> {
        if self.agent.is_none() && self.model.is_none() && self.verify_model.is_none() {
            return None;
        }
        Some(Harness {
            agent: self.agent.clone().map(AgentChoice::Preset),
            model: self.model.clone().filter(|m| !m.is_empty()),
            verify_model: self.verify_model.clone().filter(|m| !m.is_empty()),
        })
    }
}

/// One line on the agent a new loop runs: its preset and whether its program is on PATH
/// (and how to install it when not).
pub(super) fn agent_note(config: &LoopConfig) {
    let agent = config.agent("implement");
    let Some(name) = agent.preset else {
        return;
    };
    let mut d = crate::diag::Diagnostics::default();
    let Some(p) = crate::preset::load(name, &mut d) else {
        return;
    };
    let program = p.program();
    match crate::preset::find_on_path(program) {
        Some(path) => outln!("  agent: {name} ({})", path.display()),
        None => {
            let how = p
                .install_command()
                .map(|c| format!("; install it: {c}"))
                .unwrap_or_default();
            outln!("  agent: {name} (`{program}` is not on PATH{how})");
        }
    }
}

pub(super) fn create(project: &Path, a: CreateArgs) -> i32 {
    let o = CreateOptions {
        name: &a.loop_name,
        template: &a.template,
        task: a.task.clone(),
        worktree: !a.no_worktree,
        harness: a.agent.harness(),
        remote: a.remote.clone(),
        worktree_dir: a
            .worktree_dir
            .as_ref()
            .map(|d| std::path::absolute(d).unwrap_or_else(|_| d.clone())),
    };
    // A loop directory committed with its loop.toml but never started (a fresh clone).
    let adopting = crate::state::check_loop_name(&a.loop_name).is_ok()
        && crate::create::adoptable(&crate::state::LoopPaths::new(project, &a.loop_name));
    let paths = crate::state::LoopPaths::new(project, &a.loop_name);
    if crate::state::check_loop_name(&a.loop_name).is_ok() {
        if let Some(r) = &a.remote
            && let Err(code) = super::remote::check_new(&paths, r)
        {
            return code;
        }
        // A committed loop.toml with [remote]: the remote may have the loop already.
        if a.remote.is_none()
            && adopting
            && let Ok(Some(r)) = crate::remote::configured(&paths)
            && let Err(code) = super::remote::check_new(&paths, &r.name)
        {
            return code;
        }
    }
    match crate::create::create(project, &o) {
        Ok(paths) => {
            if adopting {
                outln!(
                    "started loop `{}` from the loop.toml already in {}",
                    a.loop_name,
                    paths.dir.display()
                );
            } else {
                outln!("created loop `{}` in {}", a.loop_name, paths.dir.display());
            }
            if let Err(code) = super::remote::publish(&paths) {
                return code;
            }
            let config = crate::load::config(&paths, project).ok();
            // What the loop's own loop.toml says (an adopted one may turn worktrees off).
            if config.as_ref().map_or(!a.no_worktree, |c| c.worktree) {
                outln!(
                    "  worktree: {} (branch loopflow/{})",
                    paths.worktree.display(),
                    a.loop_name
                );
            }
            if let Some(c) = &config {
                agent_note(c);
            }
            outln!(
                "  next: edit {} (agent, models, brakes), then",
                paths.dir.join("loop.toml").display()
            );
            outln!("        loopflow run --loop {} --dry-run", a.loop_name);
            // Only a single-task loop without a task waits: a template may bring its
            // task (ci-triage), a backlog or audit loop finds its own.
            let task = paths.load().ok().and_then(|s| s.current_task);
            let single = config
                .as_ref()
                .is_some_and(|c| matches!(c.work_source, WorkSource::Single));
            match (&a.task, task) {
                (None, Some(t)) => outln!("  task: {} (the template's)", out::printable(&t)),
                (None, None) if single => outln!(
                    "  note: no --task given; the loop skips until it has one: `loopflow task --loop {} \"…\"`",
                    a.loop_name
                ),
                _ => {}
            }
            if let Some(h) = super::doctor::hint(project, &a.loop_name) {
                outln!("{}", out::printable(&h));
            }
            super::projects::offer(project);
            exit::OK
        }
        Err(CreateError::Usage(m)) => {
            eprintln!("error: {m}");
            exit::USAGE
        }
        Err(CreateError::Io(m)) => {
            eprintln!("error: {m}");
            exit::STATE
        }
    }
}
