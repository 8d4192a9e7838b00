//! `loopflow delete --loop X [--branch] --yes`: removes a loop — its schedule, its
//! worktree, its directory (configuration, state, log, outputs) and, with `--branch`, its
//! branch. Without `--yes` it only says what it would remove.

use std::path::{Path, PathBuf};

use clap::Args;

use super::report;
use crate::exit;
use crate::lifecycle::{Between, HumanError};
use crate::out::{self, outln};
use crate::state::{LoopPaths, State};
use crate::tick::RunError;
use crate::worktree::Place;

#[derive(Args, Debug)]
pub struct DeleteArgs {
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
    worktree: Option<PathBuf>,
    /// A worktree the state names that is not this loop's own (a copied project's): kept.
    foreign: Option<String>,
    /// The branch and the commit it points at.
    branch: Option<(String, String)>,
    /// `<project>/.loopflow-out/<loop>` (agents' `{{output}}` files without a worktree).
    outputs: Option<PathBuf>,
}

fn plan(paths: &LoopPaths, state: Option<&State>) -> Plan {
    let schedule = crate::schedule::read_record(paths).map(|r| {
        let files: Vec<String> = r.files.iter().map(|f| f.display().to_string()).collect();
        if files.is_empty() {
            format!("its {} schedule", r.platform.name())
        } else {
            format!("its {} schedule ({})", r.platform.name(), files.join(", "))
        }
    });
    // The state names the worktree; without a readable one, the loop's default place.
    let fallback = State::new(&paths.name, None, None);
    let (worktree, foreign) = match crate::worktree::place(paths, state.unwrap_or(&fallback)) {
        Place::Own(p) => (Some(p), None),
        Place::Missing(_) => (None, None),
        p @ (Place::Elsewhere { .. } | Place::Unlinked { .. }) => (None, p.refusal(&paths.name)),
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
        foreign,
        branch,
        outputs,
    }
}

/// How many paths of the worktree have uncommitted changes (asked through loopflow's
/// own record of the worktree, never its `.git` file).
fn uncommitted(paths: &LoopPaths, wt: &Path) -> Option<usize> {
    let branch = format!("refs/heads/{}", crate::review::branch(&paths.name));
    let linked = crate::git::Linked::open(&paths.project, wt, &branch).ok()?;
    linked.status().ok().map(|s| s.len())
}

pub fn delete(project: &Path, a: DeleteArgs) -> i32 {
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
    // A state that does not read still leaves a loop to remove.
    let state = paths.load().ok();
    let p = plan(&paths, state.as_ref());
    let mut lines = Vec::new();
    if let Some(s) = &p.schedule {
        lines.push(s.clone());
    }
    if let Some(wt) = &p.worktree {
        let dirty = match uncommitted(&paths, wt) {
            Some(0) | None => String::new(),
            Some(n) => format!(" with {n} uncommitted change(s), which are lost"),
        };
        lines.push(format!("its worktree {}{dirty}", wt.display()));
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
    if let Some(why) = &p.foreign {
        outln!("keeps: {}", out::printable(why));
    }
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
    if let Some(wt) = &p.worktree {
        if let Err(e) = crate::worktree::remove(&paths.project, wt, true) {
            eprintln!("error: {e}; the loop's directory is left as it was");
            return exit::STATE;
        }
        outln!("removed worktree {}", wt.display());
    }
    if a.branch
        && let Some((b, sha)) = &p.branch
    {
        // A record of a worktree whose directory is gone still holds the branch.
        let _ = crate::git::git(&paths.project, &["worktree", "prune"]);
        match crate::git::git(&paths.project, &["branch", "-D", b])
            .and_then(|o| crate::git::ok(o, "branch -D"))
        {
            Ok(_) => outln!(
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
