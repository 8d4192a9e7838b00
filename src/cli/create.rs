//! `create`: a new loop from a built-in template.

use std::path::Path;

use clap::Args;

use crate::create::{CreateError, CreateOptions};
use crate::exit;

#[derive(Args, Debug)]
pub struct CreateArgs {
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
            println!("created loop `{}` in {}", a.loop_name, paths.dir.display());
            if !a.no_worktree {
                println!(
                    "  worktree: {} (branch loopflow/{})",
                    paths.worktree.display(),
                    a.loop_name
                );
            }
            println!(
                "  next: edit {} (harness command, brakes), then",
                paths.dir.join("loop.toml").display()
            );
            println!("        loopflow run --loop {} --dry-run", a.loop_name);
            if a.task.is_none() {
                println!("  note: no --task given; the loop skips until it has one");
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
