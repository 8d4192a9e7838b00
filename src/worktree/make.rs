//! Making a loop's worktree, bringing it back, moving one of the old layout to its place,
//! removing it, and keeping its branch in step with the user's repository.

use std::path::{Path, PathBuf};

use super::{Copy, LocationError, Place, place};
use crate::git::{CopySettings, GitError, LOOPFLOW_IDENTITY, Repo};
use crate::state::{Event, LogArg, LoopPaths, StateError};

/// Why a worktree could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MakeError {
    #[error("{} is not a git repository", .0.display())]
    NotGit(PathBuf),
    #[error("the repository has no commit yet")]
    NoCommit,
    #[error(transparent)]
    Location(#[from] LocationError),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("{} exists and is not a loop's worktree; move it away, then try again", .0.display())]
    InTheWay(PathBuf),
    #[error(
        "{} is a symlink: a loop's worktree is a directory of its own; remove the link, then try again",
        .0.display()
    )]
    Symlink(PathBuf),
}

/// What `info/exclude` of a loop's repository holds: the agents' output directory, and
/// the build output a fresh project of its language would ignore (DESIGN §9) — but what
/// the blast radius `allow`s by name.
pub(crate) fn exclude_text(allow: &[String]) -> String {
    let mut s = String::from(
        "# written by loopflow: never committed as a loop's work (the blast radius can allow one by name)\n",
    );
    s.push_str(crate::blast::OUTPUT_DIR);
    s.push_str("/\n");
    for pattern in crate::blast::BUILD_OUTPUT {
        if !crate::blast::allowed_by_name(pattern, allow) {
            s.push_str(pattern);
            s.push('\n');
        }
    }
    s
}

/// The settings a new loop repository of `checkout`'s is made with: its identity (the
/// user's, as git resolves it in the checkout; loopflow's only where none is set).
fn settings_for<'a>(
    checkout: &'a Repo,
    identity: &'a mut Option<(String, String)>,
    exclude: &'a str,
) -> CopySettings<'a> {
    *identity = checkout.identity();
    let id = match identity {
        Some((n, e)) => (n.as_str(), e.as_str()),
        None => LOOPFLOW_IDENTITY,
    };
    CopySettings {
        identity: id,
        exclude,
    }
}

/// The user's repository, with a commit.
fn checkout(project: &Path) -> Result<(Repo, String), MakeError> {
    let repo = Repo::checkout(project)?.ok_or_else(|| MakeError::NotGit(project.to_path_buf()))?;
    let head = repo.rev("HEAD")?.ok_or(MakeError::NoCommit)?;
    Ok((repo, head))
}

/// Makes `copy` from the user's repository: the loop's branch there (made at HEAD when
/// missing) fetched into a repository of its own and checked out. Anything left at its
/// place by a copy that was half made (a git directory without its work tree, an empty
/// work tree) goes first.
fn make(
    project: &Path,
    checkout: &Repo,
    head: &str,
    copy: &Copy,
    allow: &[String],
) -> Result<bool, MakeError> {
    let branch_existed = checkout.rev(&copy.branch)?.is_some();
    if !branch_existed {
        checkout.move_ref(&copy.branch, head, "", "loopflow: the loop's branch")?;
    }
    let is_link = |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    for p in [&copy.work_tree, &copy.git_dir] {
        if is_link(p) {
            return Err(MakeError::Symlink(p.clone()));
        }
    }
    let occupied = std::fs::read_dir(&copy.work_tree).is_ok_and(|mut d| d.next().is_some());
    if occupied {
        return Err(MakeError::InTheWay(copy.work_tree.clone()));
    }
    let _ = std::fs::remove_dir(&copy.work_tree);
    if std::fs::symlink_metadata(&copy.git_dir).is_ok() {
        std::fs::remove_dir_all(&copy.git_dir).map_err(GitError::Spawn)?;
    }
    let exclude = exclude_text(allow);
    let mut id = None;
    let settings = settings_for(checkout, &mut id, &exclude);
    Repo::make_copy(
        checkout,
        &copy.branch,
        &copy.git_dir,
        &copy.work_tree,
        &settings,
    )?;
    super::mark(copy, project).map_err(GitError::Spawn)?;
    Ok(branch_existed)
}

/// `create`: the worktree of a new loop (its branch made at HEAD, or the existing one
/// used). Its work tree's path.
pub(crate) fn create(
    paths: &LoopPaths,
    dir: Option<&Path>,
    allow: &[String],
) -> Result<PathBuf, MakeError> {
    let (checkout, head) = checkout(&paths.project)?;
    let copy = super::location(&paths.project, &paths.name, dir)?;
    make(&paths.project, &checkout, &head, &copy, allow)?;
    Ok(copy.work_tree)
}

/// Why `worktree restore` could not bring a worktree back.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RestoreError {
    #[error(transparent)]
    Make(#[from] MakeError),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    Copy(#[from] crate::git::CopyError),
    #[error(transparent)]
    State(#[from] StateError),
    #[error("a tick of loop {0} is running; try again when it ends")]
    Busy(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl From<LocationError> for RestoreError {
    fn from(e: LocationError) -> Self {
        RestoreError::Make(MakeError::Location(e))
    }
}

/// What `worktree restore` did.
pub(crate) struct Restored {
    pub path: PathBuf,
    pub branch: String,
    /// False when the worktree was there already (nothing was done but checks).
    pub created: bool,
    /// Whether the branch existed (else it was made from HEAD).
    pub branch_existed: bool,
    /// The old layout's worktree it was moved from, if it was one.
    pub moved: Option<Moved>,
}

/// Makes the loop's worktree again at its place (from its branch, or a new one from HEAD)
/// when it is missing, moves one of the old layout there, or puts a rewritten `.git`
/// back; records where it is. Holds the tick lock, so no tick runs meanwhile.
pub(crate) fn restore(
    paths: &LoopPaths,
    dir: Option<&Path>,
    allow: &[String],
) -> Result<Restored, RestoreError> {
    let lock = paths
        .try_lock_tick()?
        .ok_or_else(|| RestoreError::Busy(paths.name.clone()))?;
    restore_held(paths, &lock, dir, allow)
}

/// [`restore`] by a caller that already holds the loop's tick lock (a remote loop's tick,
/// which makes its worktree from the branch it fetched).
pub(crate) fn restore_held(
    paths: &LoopPaths,
    _lock: &crate::state::TickLock,
    dir: Option<&Path>,
    allow: &[String],
) -> Result<Restored, RestoreError> {
    let state = paths.load()?;
    paths.owns(&state)?;
    let short = |c: &Copy| c.branch.trim_start_matches("refs/heads/").to_string();
    match place(paths, dir)? {
        Place::Own(copy) => {
            copy.open()?;
            if state.worktree_path.as_deref() != copy.work_tree.to_str() {
                record(paths, &copy, "restored")?;
            }
            Ok(Restored {
                branch: short(&copy),
                path: copy.work_tree,
                created: false,
                branch_existed: true,
                moved: None,
            })
        }
        Place::Nested { old, new } => {
            let moved = migrate(paths, &old, &new, allow)?;
            Ok(Restored {
                branch: short(&new),
                path: new.work_tree,
                created: true,
                branch_existed: true,
                moved: Some(moved),
            })
        }
        Place::Missing(copy) => {
            let (checkout, head) = checkout(&paths.project)?;
            let branch_existed = make(&paths.project, &checkout, &head, &copy, allow)?;
            record(paths, &copy, "restored")?;
            Ok(Restored {
                branch: short(&copy),
                path: copy.work_tree,
                created: true,
                branch_existed,
                moved: None,
            })
        }
    }
}

/// Points the state at the worktree and logs `WORKTREE <what>=<path>`.
fn record(paths: &LoopPaths, copy: &Copy, what: &'static str) -> Result<(), StateError> {
    let shown = copy.work_tree.display().to_string();
    paths.update(|s| s.worktree_path = Some(shown.clone()))?;
    paths.log(
        Event::Worktree,
        &[
            LogArg::Kv(what, shown),
            LogArg::Kv(
                "branch",
                copy.branch.trim_start_matches("refs/heads/").to_string(),
            ),
        ],
    )
}

/// What moving an old-layout worktree did.
#[derive(Debug, Clone)]
pub(crate) struct Moved {
    pub from: PathBuf,
    /// Uncommitted files carried over (changed, added, deleted).
    pub carried: usize,
    /// Why the old worktree is still there, when it could not be removed.
    pub left: Option<String>,
}

/// Moves a loop's worktree of the old layout (`.loopflow/loops/<name>/worktree`, a linked
/// worktree of the user's repository) to its place: a repository of its own made from the
/// branch, the old worktree's uncommitted changes carried over, the old one removed. The
/// caller holds the tick lock. Nothing is lost: the old worktree goes only once
/// everything it held uncommitted is in the new one.
pub(crate) fn migrate(
    paths: &LoopPaths,
    old: &Path,
    new: &Copy,
    allow: &[String],
) -> Result<Moved, RestoreError> {
    paths.owns(&paths.load()?)?;
    let (checkout, head) = checkout(&paths.project)?;
    // The old worktree's own record in the user's repository (its `.git` file is an
    // agent's to rewrite: the record that names the old worktree back is the one).
    let admin = record_of(&checkout, old);
    // Its branch, as the record says, is what the new worktree starts from.
    if let Some(admin) = &admin
        && let Some(b) = crate::fs_safe::head(&admin.join("HEAD"), 4096)
            .ok()
            .and_then(|h| String::from_utf8(h).ok())
        && b.trim() != format!("ref: {}", new.branch)
    {
        return Err(RestoreError::Copy(crate::git::CopyError::WrongBranch {
            head: b.trim().to_string(),
            branch: new.branch.clone(),
            loop_name: paths.name.clone(),
        }));
    }
    let changes = match &admin {
        Some(a) => checkout.linked(a, old).status(true)?,
        None => Vec::new(),
    };
    make(&paths.project, &checkout, &head, new, allow)?;
    let mut carried = 0;
    for e in &changes {
        for rel in std::iter::once(&e.path).chain(e.orig.as_ref()) {
            carry(&old.join(rel), &new.work_tree.join(rel)).map_err(|source| RestoreError::Io {
                path: new.work_tree.join(rel),
                source,
            })?;
            carried += 1;
        }
    }
    // Everything it held is in the new worktree: it goes, through git where git knows
    // it, else (records git cannot read, e.g. relative ones of a newer git) by hand.
    let left = match (checkout.remove_linked(old), &admin) {
        (Ok(()), _) => None,
        (Err(_), Some(a)) => [old, a.as_path()]
            .iter()
            .filter_map(|d| {
                std::fs::remove_dir_all(d)
                    .err()
                    .map(|e| format!("{}: {e}", d.display()))
            })
            .next(),
        (Err(e), None) => Some(e.to_string()),
    };
    let _ = checkout.prune_linked();
    record(paths, new, "moved")?;
    let mut args = vec![
        LogArg::Kv("from", old.display().to_string()),
        LogArg::Kv("carried", carried.to_string()),
    ];
    if let Some(l) = &left {
        args.push(LogArg::Kv("msg", format!("the old worktree stays: {l}")));
    }
    paths.log(Event::Worktree, &args)?;
    Ok(Moved {
        from: old.to_path_buf(),
        carried,
        left,
    })
}

/// The record (`<common>/worktrees/<id>`) of the user's repository whose `gitdir` names
/// `wt/.git`.
pub(super) fn record_of(checkout: &Repo, wt: &Path) -> Option<PathBuf> {
    let me = wt.join(".git");
    let me = me.canonicalize().unwrap_or(me);
    std::fs::read_dir(checkout.common.join("worktrees"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|rec| {
            crate::fs_safe::head(&rec.join("gitdir"), 4096)
                .ok()
                .map(|b| crate::git::path_of(b.trim_ascii_end()))
                .map(|p| if p.is_absolute() { p } else { rec.join(p) })
                .map(|p| p.canonicalize().unwrap_or(p))
                .is_some_and(|p| p == me)
        })
}

/// One path of the old worktree as it is now, at the same place in the new one: a file
/// (its mode kept) or a link copied, a path that is gone removed. Never through a link
/// in the new tree.
fn carry(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(from);
    if let Ok(m) = std::fs::symlink_metadata(to)
        && !m.is_dir()
    {
        std::fs::remove_file(to)?;
    }
    let Ok(meta) = meta else {
        return Ok(()); // gone in the old one: gone in the new one
    };
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if meta.file_type().is_symlink() {
        #[cfg(unix)]
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
        return Ok(());
    }
    if meta.is_file() {
        std::fs::copy(from, to)?;
    }
    Ok(())
}

/// Removes a loop's worktree (both directories), an old-layout one (and git's record of
/// it), and the state its agents kept on this machine; what went.
pub(crate) fn remove(paths: &LoopPaths, dir: Option<&Path>) -> Result<Vec<PathBuf>, RestoreError> {
    let mut gone = Vec::new();
    let copy = super::location(&paths.project, &paths.name, dir)?;
    for d in [&copy.work_tree, &copy.git_dir] {
        if std::fs::symlink_metadata(d).is_ok() {
            remove_any(d)?;
            gone.push(d.clone());
        }
    }
    let old = super::nested(paths);
    if std::fs::symlink_metadata(&old).is_ok() {
        let removed = Repo::checkout(&paths.project)
            .ok()
            .flatten()
            .is_some_and(|c| c.remove_linked(&old).is_ok());
        if !removed {
            remove_any(&old)?;
        }
        gone.push(old);
    }
    if let Some(base) = crate::state::machine::base() {
        let agents = base
            .join("agents")
            .join(crate::state::machine::project_key(&paths.project))
            .join(&paths.name);
        if std::fs::symlink_metadata(&agents).is_ok() {
            remove_any(&agents)?;
            gone.push(agents);
        }
    }
    Ok(gone)
}

/// Removes a directory tree, or a file or link standing there.
fn remove_any(p: &Path) -> Result<(), RestoreError> {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    };
    r.map_err(|source| RestoreError::Io {
        path: p.to_path_buf(),
        source,
    })
}

/// How the loop's branch stood between its repository and the user's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Synced {
    /// The same commit in both: nothing to do (two file reads).
    InStep,
    /// The loop's repository was ahead (its last commit never reached the user's, a
    /// tick killed in between): the user's branch moved forward to it.
    Published { from: String, to: String },
    /// The user's branch moved (a `land --squash`, a human, another machine): the loop's
    /// repository follows it, uncommitted files kept.
    Followed { from: String, to: String },
}

/// Puts the loop's branch in step between `copy` and the user's repository before a
/// tick's agents run. `Err` names what a human must look at (the two histories parted
/// and the loop's files could not follow).
pub(crate) fn sync(checkout: &Repo, copy: &Repo, branch: &str) -> Result<Synced, String> {
    let ours = copy.rev(branch).map_err(|e| e.to_string())?;
    let theirs = checkout.rev(branch).map_err(|e| e.to_string())?;
    match (ours, theirs) {
        (Some(o), Some(t)) if o == t => Ok(Synced::InStep),
        (Some(o), Some(t)) if copy.is_ancestor(&t, &o) => {
            checkout
                .fetch_branch(&copy.git_dir, branch, false)
                .map_err(|e| e.to_string())?;
            Ok(Synced::Published { from: t, to: o })
        }
        (Some(o), Some(t)) => {
            copy.fetch_branch(&checkout.common, branch, true)
                .map_err(|e| e.to_string())?;
            match copy.switch_files(&o, &t) {
                Ok(()) => Ok(Synced::Followed { from: o, to: t }),
                Err(why) => {
                    // Back where it was: the tick goes on from the loop's own commit and
                    // its commit says where the two parted.
                    let _ = copy.move_ref(branch, &o, &t, "loopflow: back");
                    Err(format!(
                        "{} moved to {} in your repository, and the loop's worktree cannot follow it: {why}",
                        branch.trim_start_matches("refs/heads/"),
                        short(&t)
                    ))
                }
            }
        }
        (Some(o), None) => {
            checkout
                .fetch_branch(&copy.git_dir, branch, false)
                .map_err(|e| e.to_string())?;
            Ok(Synced::Published {
                from: String::new(),
                to: o,
            })
        }
        (None, _) => Err(format!(
            "the loop's repository has no {}",
            branch.trim_start_matches("refs/heads/")
        )),
    }
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}
