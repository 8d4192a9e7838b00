//! `loopflow worktree gc`: prunes the worktrees and `loopflow/*` branches of loops that
//! were deleted, and (with `--include-idle`) of live loops idle longer than a maximum age.
//! A worktree with uncommitted changes is never removed without `--force`, and a branch
//! with commits that are not merged into the main checkout's HEAD is kept (git's own
//! `branch -d` rule) unless forced. A live loop without its worktree skips every tick
//! (`worktree_missing`), so its worktree stays unless asked; `worktree restore` brings a
//! removed one back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::git::{GitError, Repo};
use crate::state::{Event, LogArg, LoopPaths};

/// Why a loop's worktree may go.
enum Stale {
    /// The loop is gone: nothing will ever tick in it.
    Deleted,
    /// A live loop that has not ticked for this long.
    Idle(String),
}

impl Stale {
    fn why(&self) -> String {
        match self {
            Stale::Deleted => "loop deleted".into(),
            Stale::Idle(d) => d.clone(),
        }
    }
}

/// Why a loop's worktree may go, or `None` when it stays.
fn stale(project: &Path, name: &str, max_age: Duration) -> Option<Stale> {
    let paths = LoopPaths::new(project, name);
    if !paths.state.exists() {
        return Some(Stale::Deleted);
    }
    let state = paths.load().ok()?;
    if paths.tick_running().unwrap_or(true) {
        return None;
    }
    let last = state
        .last_tick_at
        .as_deref()
        .or(state.created_at.as_deref())?;
    let at: jiff::Timestamp = last.parse().ok()?;
    let idle = jiff::Timestamp::now().duration_since(at);
    let idle = Duration::try_from(idle).ok()?;
    (idle >= max_age).then(|| Stale::Idle(format!("idle {}d", idle.as_secs() / 86400)))
}

pub(crate) struct GcOptions {
    pub max_age: Duration,
    pub force: bool,
    pub dry_run: bool,
    /// Also prune live loops idle longer than `max_age` (they then skip until restored).
    pub include_idle: bool,
}

/// What gc did, one line each, and whether anything was kept back.
pub(crate) struct GcReport {
    pub lines: Vec<String>,
    pub kept: usize,
}

/// One loop worktree gc found: its name and where its work tree is.
struct Found {
    name: String,
    work_tree: PathBuf,
    /// Its repository, when it is one of this layout's (else a linked worktree of the
    /// old layout).
    git_dir: Option<PathBuf>,
}

/// The worktrees of this project's loops: those at their place (every `<name>.git`
/// beside a `<name>` under the project's directory of worktrees) and those of the old
/// layout (linked worktrees on `loopflow/*` branches).
fn found(project: &Path, checkout: &Repo) -> Result<Vec<Found>, GitError> {
    let mut out = Vec::new();
    let mut dirs: Vec<Option<PathBuf>> = vec![None];
    // Every `[worktree] dir` the project's loops name, and the default place.
    for name in crate::state::list_loops(project) {
        dirs.push(super::configured_dir(&LoopPaths::new(project, &name)));
    }
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        let Ok(base) = super::project_root(project, dir.as_deref()) else {
            continue;
        };
        let Ok(rd) = std::fs::read_dir(&base) else {
            continue;
        };
        for e in rd.flatten() {
            let file = e.file_name();
            let Some(name) = file.to_str().and_then(|n| n.strip_suffix(".git")) else {
                continue;
            };
            if crate::state::check_loop_name(name).is_err() {
                continue;
            }
            out.push(Found {
                name: name.to_string(),
                work_tree: base.join(name),
                git_dir: Some(e.path()),
            });
        }
    }
    for (path, branch) in crate::git::linked_worktrees(checkout)? {
        if let Some(name) = branch.as_deref().and_then(|b| b.strip_prefix("loopflow/"))
            && path.ends_with(Path::new(".loopflow/loops").join(name).join("worktree"))
            && path.starts_with(project)
        {
            out.push(Found {
                name: name.to_string(),
                work_tree: path,
                git_dir: None,
            });
        }
    }
    out.sort_by(|a, b| a.work_tree.cmp(&b.work_tree));
    out.dedup_by(|a, b| a.work_tree == b.work_tree);
    Ok(out)
}

/// Prunes stale loop worktrees and branches.
pub(crate) fn gc(project: &Path, o: &GcOptions) -> Result<GcReport, GitError> {
    let mut lines = Vec::new();
    let mut kept = 0;
    let verb = |s: &str| {
        if o.dry_run {
            format!("would {s}")
        } else {
            s.to_string()
        }
    };
    let checkout = Repo::checkout(project)?.ok_or_else(|| GitError::Failed {
        what: "rev-parse".into(),
        stderr: format!("{} is not a git repository", project.display()),
    })?;
    // Records of old-layout worktrees whose directory is gone go first.
    if !o.dry_run {
        let _ = checkout.prune_linked();
    }
    let mut handled = Vec::new();
    for f in found(project, &checkout)? {
        let name = f.name.as_str();
        let Some(stale) = stale(project, name, o.max_age) else {
            continue;
        };
        handled.push(name.to_string());
        let why = stale.why();
        let shown = f.work_tree.display();
        if matches!(stale, Stale::Idle(_)) && !o.include_idle {
            lines.push(format!(
                "kept worktree {shown} (loop {name}, {why}): the loop still exists and would skip every tick without it; pass --include-idle to remove it (`loopflow worktree restore --loop {name}` brings it back)"
            ));
            continue;
        }
        let repo = match &f.git_dir {
            Some(g) => Repo::copy(g, &f.work_tree),
            None => match super::make::record_of(&checkout, &f.work_tree) {
                Some(admin) => checkout.linked(&admin, &f.work_tree),
                None => checkout.clone(),
            },
        };
        let dirty = f.work_tree.is_dir() && !repo.status(true)?.is_empty();
        if dirty && !o.force {
            kept += 1;
            lines.push(format!(
                "kept worktree {shown} (loop {name}, {why}): it has uncommitted changes; commit them or pass --force"
            ));
            continue;
        }
        lines.push(format!(
            "{} worktree {shown} (loop {name}, {why})",
            verb("remove")
        ));
        if !o.dry_run {
            match &f.git_dir {
                Some(g) => {
                    for d in [&f.work_tree, g] {
                        if d.is_dir() {
                            std::fs::remove_dir_all(d).map_err(GitError::Spawn)?;
                        }
                    }
                }
                None => checkout.remove_linked(&f.work_tree)?,
            }
            let paths = LoopPaths::new(project, name);
            if paths.dir.is_dir() && paths.state.exists() {
                let _ = paths.log(
                    Event::Worktree,
                    &[
                        LogArg::Kv("removed", f.work_tree.display().to_string()),
                        LogArg::Kv("reason", why.clone()),
                    ],
                );
            }
        }
        if matches!(stale, Stale::Deleted) && !o.dry_run {
            forget_agents(project, name, &mut lines);
        }
        delete_branch(&checkout, name, o, &mut lines, &mut kept)?;
    }
    // Branches of deleted or idle loops that have no worktree (any more).
    for b in checkout.branches("loopflow/")? {
        let name = b.trim_start_matches("loopflow/");
        if handled.iter().any(|h| h == name) {
            continue;
        }
        match stale(project, name, o.max_age) {
            None => continue,
            Some(Stale::Idle(_)) if !o.include_idle => continue,
            Some(_) => {}
        }
        delete_branch(&checkout, name, o, &mut lines, &mut kept)?;
    }
    if lines.is_empty() {
        lines.push(if o.include_idle {
            format!(
                "nothing to prune (no deleted loop, none idle longer than {}d)",
                o.max_age.as_secs() / 86400
            )
        } else {
            "nothing to prune (no deleted loop; idle loops are pruned only with --include-idle)"
                .to_string()
        });
    }
    Ok(GcReport { lines, kept })
}

/// The state a deleted loop's agents kept on this machine (their CLIs' own directories).
fn forget_agents(project: &Path, name: &str, lines: &mut Vec<String>) {
    let Some(base) = crate::state::machine::base() else {
        return;
    };
    let dir = base
        .join("agents")
        .join(crate::state::machine::project_key(project))
        .join(name);
    if dir.is_dir() && std::fs::remove_dir_all(&dir).is_ok() {
        lines.push(format!(
            "removed {} (loop {name}'s agents' state)",
            dir.display()
        ));
    }
}

fn delete_branch(
    checkout: &Repo,
    name: &str,
    o: &GcOptions,
    lines: &mut Vec<String>,
    kept: &mut usize,
) -> Result<(), GitError> {
    let branch = format!("loopflow/{name}");
    if o.dry_run {
        lines.push(format!(
            "would delete branch {branch} (if merged, or with --force)"
        ));
        return Ok(());
    }
    match checkout.delete_branch(&branch, o.force)? {
        Ok(()) => lines.push(format!("deleted branch {branch}")),
        Err(why) => {
            *kept += 1;
            lines.push(format!(
                "kept branch {branch}: {why} (merge it, or pass --force to delete it)"
            ));
        }
    }
    Ok(())
}
