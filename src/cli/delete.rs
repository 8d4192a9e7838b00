//! `loopflow delete --loop X [--branch] --yes`: removes a loop — its schedule, its
//! worktree, its directory (configuration, state, log, outputs) and, with `--branch`, its
//! branch. Without `--yes` it only says what it would remove.

use std::path::{Path, PathBuf};

use clap::Args;

use super::report;
use crate::exit;
use crate::lifecycle::{Between, HumanError};
use crate::out::{self, outln};
use crate::state::LoopPaths;
use crate::tick::RunError;
use crate::worktree::Place;

#[derive(Args, Debug)]
pub(crate) struct DeleteArgs {
    /// The loop to remove.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Also delete its branch `loopflow/NAME` (commits not merged anywhere are lost; the
    /// command prints the commit it pointed at).
    #[arg(long)]
    pub branch: bool,
    /// Remove it; without this, print what would be removed and exit 2.
    #[arg(long)]
    pub yes: bool,
}

/// What deleting a loop removes.
struct Plan {
    schedule: Option<String>,
    worktree: Option<crate::worktree::Copy>,
    /// A worktree of the old layout, inside the loop's directory.
    nested: Option<PathBuf>,
    /// The branch and the commit it points at.
    branch: Option<(String, String)>,
    /// `<project>/.loopflow-out/<loop>` (agents' `{{output}}` files without a worktree).
    outputs: Option<PathBuf>,
}

fn plan(paths: &LoopPaths, dir: Option<&Path>) -> Plan {
    let schedule = crate::schedule::read_record(paths).map(|r| {
        let files: Vec<String> = r.files.iter().map(|f| f.display().to_string()).collect();
        if files.is_empty() {
            format!("its {} schedule", r.platform.name())
        } else {
            format!("its {} schedule ({})", r.platform.name(), files.join(", "))
        }
    });
    // The worktree at its place (derived from the project, never from the state).
    let (worktree, nested) = match crate::worktree::place(paths, dir) {
        Ok(Place::Own(c)) => (Some(c), None),
        Ok(Place::Nested { old, .. }) => (None, Some(old)),
        Ok(Place::Missing(_)) | Err(_) => (None, None),
    };
    let name = crate::review::branch(&paths.name);
    let branch = crate::git::rev(&paths.project, &format!("refs/heads/{name}"))
        .ok()
        .flatten()
        .map(|sha| (name, sha));
    let outputs =
        Some(paths.project.join(".loopflow-out").join(&paths.name)).filter(|p| p.is_dir());
    Plan {
        schedule,
        worktree,
        nested,
        branch,
        outputs,
    }
}

/// How many paths of the worktree have uncommitted changes (asked of the loop's own
/// repository, never through its `.git` file).
fn uncommitted(copy: &crate::worktree::Copy) -> Option<usize> {
    let (repo, _) = copy.open().ok()?;
    repo.status(true).ok().map(|s| s.len())
}

pub(super) fn delete(project: &Path, a: DeleteArgs) -> i32 {
    let name = &a.loop_name;
    if let Err(code) = super::valid_name(project, name) {
        return code;
    }
    let paths = LoopPaths::new(project, name);
    if !paths.dir.is_dir() {
        eprintln!("error: {}", super::no_loop(project, name));
        return exit::USAGE;
    }
    // Nothing is removed from under a running tick (its agents work in the worktree).
    let between = match Between::take(&paths, "delete") {
        Ok(b) => b,
        Err(e @ HumanError::TickRunning(..)) => {
            eprintln!("error: {e}");
            return exit::NO;
        }
        Err(HumanError::State(e)) => return report(&RunError::State(e)),
    };
    let dir = crate::worktree::configured_dir(&paths);
    let p = plan(&paths, dir.as_deref());
    let mut lines = Vec::new();
    if let Some(s) = &p.schedule {
        lines.push(s.clone());
    }
    if let Some(c) = &p.worktree {
        let dirty = match uncommitted(c) {
            Some(0) | None => String::new(),
            Some(n) => format!(" with {n} uncommitted change(s), which are lost"),
        };
        lines.push(format!("its worktree {}{dirty}", c.work_tree.display()));
    }
    if let Some(old) = &p.nested {
        lines.push(format!(
            "its worktree {} (an older layout's)",
            old.display()
        ));
    }
    match (&p.branch, a.branch) {
        (Some((b, sha)), true) => lines.push(format!("its branch {b} (at {sha})")),
        (Some((b, _)), false) => {
            outln!("keeps: its branch {b} (pass --branch to delete it too)");
        }
        (None, _) => {}
    }
    if let Some(o) = &p.outputs {
        lines.push(format!("its agents' output directory {}", o.display()));
    }
    lines.push(format!(
        "its directory {} (loop.toml, prompts, state, log, outputs)",
        paths.dir.display()
    ));
    if !a.yes {
        outln!("loopflow delete --loop {name} would remove:");
        for l in &lines {
            outln!("  {}", out::printable(l));
        }
        eprintln!("nothing removed: pass --yes to remove them");
        return exit::USAGE;
    }
    // The schedule first: its record lives in the loop's directory, and a timer left
    // behind would fire `run` on a loop that is gone.
    if p.schedule.is_some() {
        match crate::schedule::uninstall(&paths) {
            Ok(said) => {
                for l in said {
                    outln!("{}", out::printable(&l));
                }
            }
            Err(e) => {
                eprintln!(
                    "error: its schedule could not be uninstalled: {e}; nothing was removed (fix that, or `loopflow schedule uninstall --loop {name}`, and run delete again)"
                );
                return exit::STATE;
            }
        }
    }
    match crate::worktree::remove(&paths, dir.as_deref()) {
        Ok(gone) => {
            for g in gone {
                outln!("removed {}", g.display());
            }
        }
        Err(e) => {
            eprintln!("error: {e}; the loop's directory is left as it was");
            return exit::STATE;
        }
    }
    if a.branch
        && let Some((b, sha)) = &p.branch
    {
        let deleted = crate::git::Repo::checkout(&paths.project)
            .map_err(|e| e.to_string())
            .and_then(|r| r.ok_or_else(|| "not a git repository".to_string()))
            .and_then(|r| r.delete_branch(b, true).map_err(|e| e.to_string())?);
        match deleted {
            Ok(()) => outln!(
                "deleted branch {b} (was {sha}; `git branch {b} {sha}` brings it back while git keeps the commit)"
            ),
            Err(e) => eprintln!("warning: branch {b} was not deleted: {e}"),
        }
    }
    if let Some(o) = &p.outputs
        && std::fs::remove_dir_all(o).is_ok()
    {
        outln!("removed {}", o.display());
    }
    if let Err(e) = std::fs::remove_dir_all(&paths.dir) {
        eprintln!("error: {}: {e}", paths.dir.display());
        return exit::STATE;
    }
    drop(between);
    outln!("removed {}", paths.dir.display());
    outln!("deleted loop {name}");
    exit::OK
}
