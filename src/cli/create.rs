//! `create`: a new loop from a built-in template.

use std::path::Path;

use clap::Args;

use crate::config::WorkSource;
use crate::create::{CreateError, CreateOptions};
use crate::exit;
use crate::out::{self, outln};

#[derive(Args, Debug)]
pub struct CreateArgs {
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
    #[arg(long)]
    pub no_worktree: bool,
}

pub fn create(project: &Path, a: CreateArgs) -> i32 {
    let o = CreateOptions {
        name: &a.loop_name,
        template: &a.template,
        task: a.task.clone(),
        worktree: !a.no_worktree,
        harness: None,
    };
    match crate::create::create(project, &o) {
        Ok(paths) => {
            outln!("created loop `{}` in {}", a.loop_name, paths.dir.display());
            if !a.no_worktree {
                outln!(
                    "  worktree: {} (branch loopflow/{})",
                    paths.worktree.display(),
                    a.loop_name
                );
            }
            outln!(
                "  next: edit {} (harness command, brakes), then",
                paths.dir.join("loop.toml").display()
            );
            outln!("        loopflow run --loop {} --dry-run", a.loop_name);
            // Only a single-task loop without a task waits: a template may bring its
            // task (ci-triage), a backlog or audit loop finds its own.
            let task = paths.load().ok().and_then(|s| s.current_task);
            let single = crate::load::config(&paths, project)
                .is_ok_and(|c| matches!(c.work_source, WorkSource::Single));
            match (&a.task, task) {
                (None, Some(t)) => outln!("  task: {} (the template's)", out::printable(&t)),
                (None, None) if single => {
                    outln!("  note: no --task given; the loop skips until it has one")
                }
                _ => {}
            }
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
