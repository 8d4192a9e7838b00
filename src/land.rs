//! `land` and `discard`: taking a loop's work home, or throwing it away. Both hold the
//! loop's tick lock for their whole run (so no tick starts halfway), refuse while a tick
//! holds it, and leave the checkout exactly as it was whenever they refuse: `land`
//! computes the merge with `git merge-tree` before touching anything, and aborts a merge
//! that fails anyway.

use crate::git::{GitError, Repo};
use crate::review::{branch, status_lines};
use crate::state::{Event, LogArg, LoopPaths, State, StateError, TickLock};
use crate::worktree::Copy;

#[derive(Debug, thiserror::Error)]
pub(crate) enum LandError {
    #[error(
        "refused: a tick of loop {0} is running; wait for it to end (`loopflow status`), then run this again"
    )]
    TickRunning(String),
    #[error(
        "loop {0} has no branch of its own ({branch} does not exist): a loop without a worktree commits on the checkout's branch directly, so there is nothing to {1}",
        branch = branch(.0)
    )]
    NoBranch(String, &'static str),
    #[error("{} is not a git repository with a commit", .0.display())]
    NotGit(std::path::PathBuf),
    #[error(
        "refused: the checkout's HEAD is detached; check out the branch to land on (`git switch main`), then run this again"
    )]
    Detached,
    #[error(
        "refused: the checkout is on {0} itself; switch to the branch to land on (`git switch main`)"
    )]
    OnLoopBranch(String),
    #[error(
        "refused: the checkout has uncommitted changes to tracked files:\n{}\n  commit or stash them (`git stash`), then run this again; nothing was changed",
        indent(.0)
    )]
    Dirty(Vec<String>),
    #[error(
        "refused: merging {branch} into {into} conflicts in:\n{}\n  nothing was changed; merge by hand (`git merge {branch}`), or discard the loop's work (`loopflow discard --loop {name} --yes`)",
        indent(.files)
    )]
    Conflict {
        name: String,
        branch: String,
        into: String,
        files: Vec<String>,
    },
    #[error("{0}\n  the merge was aborted; the checkout is as it was")]
    MergeFailed(String),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    State(#[from] StateError),
    /// The state is another loop's, or names another checkout's worktree.
    #[error("refused: {0}")]
    Elsewhere(String),
}

fn indent(lines: &[String]) -> String {
    lines
        .iter()
        .map(|l| format!("    {}", crate::out::printable(l)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `land` did.
#[derive(Debug)]
pub(crate) struct Landed {
    pub into: String,
    pub commits: usize,
    /// The checkout's new HEAD (`None`: nothing to land).
    pub head: Option<String>,
    /// Why the loop's branch was not moved onto a squash commit, if it could not be.
    pub note: Option<String>,
}

/// Takes the tick lock, or says a tick is running.
fn lock(paths: &LoopPaths) -> Result<TickLock, LandError> {
    paths
        .try_lock_tick()?
        .ok_or_else(|| LandError::TickRunning(paths.name.clone()))
}

/// `user.name=…`, `user.email=…` settings when the repository has no identity of its own:
/// a merge needs one, and the human's own is used when it is set.
fn identity(checkout: &Repo) -> Vec<&'static str> {
    if checkout.config("user.email").is_some() {
        Vec::new()
    } else {
        vec!["user.name=loopflow", "user.email=loopflow@localhost"]
    }
}

/// What `land` and `discard` start with: the tick lock (held to the end), the user's
/// repository, the loop's branch, which must exist, and the checkout's HEAD commit.
fn prelude(
    paths: &LoopPaths,
    verb: &'static str,
) -> Result<(TickLock, Repo, String, String), LandError> {
    let lock = lock(paths)?;
    let project = &paths.project;
    let checkout = Repo::checkout(project)?.ok_or_else(|| LandError::NotGit(project.clone()))?;
    let br = branch(&paths.name);
    let Some(head) = checkout.rev("HEAD")? else {
        return Err(LandError::NotGit(project.clone()));
    };
    if checkout.rev(&format!("refs/heads/{br}"))?.is_none() {
        return Err(LandError::NoBranch(paths.name.clone(), verb));
    }
    Ok((lock, checkout, br, head))
}

/// The loop's worktree and its repository, when it is there (checked, its `.git` put
/// back), after its branch caught up with the user's.
fn copy_of(
    paths: &LoopPaths,
    state: &State,
    checkout: &Repo,
) -> Result<(Copy, Option<Repo>), LandError> {
    paths.owns(state)?;
    let dir = crate::worktree::configured_dir(paths);
    let copy = crate::worktree::checked(paths, dir.as_deref()).map_err(LandError::Elsewhere)?;
    if !copy.exists() {
        return Ok((copy, None));
    }
    let (repo, _) = copy
        .open()
        .map_err(|e| LandError::Elsewhere(e.to_string()))?;
    // Its last commit may not have reached the user's repository (a tick killed in
    // between): it does now, before anything is merged or dropped.
    crate::worktree::sync(checkout, &repo, &copy.branch).map_err(LandError::Elsewhere)?;
    Ok((copy, Some(repo)))
}

/// Merges `loopflow/<name>` into the checkout's current branch (`--no-ff`, or one squash
/// commit), then logs `LAND`.
pub(crate) fn land(paths: &LoopPaths, state: &State, squash: bool) -> Result<Landed, LandError> {
    let (_lock, checkout, br, head_before) = prelude(paths, "land")?;
    let (_, copy) = copy_of(paths, state, &checkout)?;
    let into = checkout.current_branch().ok_or(LandError::Detached)?;
    if into == br {
        return Err(LandError::OnLoopBranch(br));
    }
    let dirty = status_lines(&checkout, false)?;
    if !dirty.is_empty() {
        return Err(LandError::Dirty(dirty));
    }
    let commits = checkout.count(&format!("HEAD..{br}")).unwrap_or(0);
    if commits == 0 {
        return Ok(Landed {
            into,
            commits,
            head: None,
            note: None,
        });
    }
    if let Some(files) = checkout.merge_conflicts(&br)
        && !files.is_empty()
    {
        return Err(LandError::Conflict {
            name: paths.name.clone(),
            branch: br,
            into,
            files,
        });
    }
    let id = identity(&checkout);
    let message = format!(
        "loopflow: land loop {} ({commits} commit{})",
        paths.name,
        if commits == 1 { "" } else { "s" }
    );
    let committed = match checkout.merge(&br, squash, &message, &id)? {
        Ok(()) if squash => {
            let body = squash_message(&checkout, &br, &message);
            checkout.commit_index(&body, &id)?
        }
        other => other,
    };
    if let Err(why) = committed {
        // Back to exactly where we were: the merge state, the index and the files.
        checkout.merge_abort();
        let _ = checkout.reset_hard(&head_before);
        return Err(LandError::MergeFailed(format!("git merge {br}: {why}")));
    }
    let head = checkout.rev("HEAD")?.unwrap_or_default();
    // A squash leaves the loop's branch beside the commit that now holds its work: moved
    // onto it, the loop goes on from what landed and the next land does not repeat it.
    let note = if squash {
        rebase_branch(paths, &checkout, copy.as_ref(), &head).err()
    } else {
        None
    };
    let mut log = vec![
        LogArg::Kv("into", into.clone()),
        LogArg::Kv("commits", commits.to_string()),
        LogArg::Kv("squash", squash.to_string()),
        LogArg::Kv("head", head.clone()),
    ];
    if let Some(n) = &note {
        log.push(LogArg::Kv("note", n.clone()));
    }
    paths.log(Event::Land, &log)?;
    Ok(Landed {
        into,
        commits,
        head: Some(head),
        note,
    })
}

fn squash_message(checkout: &Repo, br: &str, title: &str) -> String {
    let subjects = checkout
        .subjects(&format!("HEAD..{br}"), 10_000, true)
        .unwrap_or_default();
    format!("{title}\n\n{subjects}")
}

/// Moves the loop's branch to `to` in the user's repository and in the loop's own (its
/// worktree following with its uncommitted work kept: `reset --keep` refuses rather
/// than lose it).
fn rebase_branch(
    paths: &LoopPaths,
    checkout: &Repo,
    copy: Option<&Repo>,
    to: &str,
) -> Result<(), String> {
    let br = branch(&paths.name);
    let full = format!("refs/heads/{br}");
    let refused = |why: String| {
        format!(
            "{br} was left where it was ({why}); run `loopflow discard --loop {} --yes` to start it from the landed commit",
            paths.name
        )
    };
    let old = checkout
        .rev(&full)
        .map_err(|e| refused(e.to_string()))?
        .unwrap_or_default();
    if let Some(repo) = copy {
        // The landed commit first, then the loop's files onto it.
        repo.fetch_object(&checkout.common, to)
            .map_err(|e| refused(e.to_string()))?;
        match repo.reset_keep(to) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => return Err(refused(why)),
            Err(e) => return Err(refused(e.to_string())),
        }
    }
    checkout
        .move_ref(&full, to, &old, "loopflow: land --squash")
        .map_err(|e| refused(e.to_string()))
}

/// What `discard` would do or did.
#[derive(Debug)]
pub(crate) struct Discard {
    pub branch: String,
    /// The commit the branch and worktree are reset to (the checkout's HEAD).
    pub to: String,
    /// Commits on the branch that are not on the checkout's HEAD (they are dropped).
    pub commits: usize,
    /// Uncommitted and untracked files in the worktree (they are removed).
    pub uncommitted: Vec<String>,
    pub worktree: Option<std::path::PathBuf>,
    pub done: bool,
}

/// Resets `loopflow/<name>` and its worktree to the checkout's HEAD, dropping the loop's
/// commits and uncommitted files (git-ignored files stay). With `yes` false it only says
/// what it would do.
pub(crate) fn discard(paths: &LoopPaths, state: &State, yes: bool) -> Result<Discard, LandError> {
    let (_lock, checkout, br, to) = prelude(paths, "discard")?;
    let (copy, repo) = copy_of(paths, state, &checkout)?;
    let mut d = Discard {
        commits: checkout.count(&format!("HEAD..{br}")).unwrap_or(0),
        uncommitted: match &repo {
            Some(r) => status_lines(r, true)?,
            None => Vec::new(),
        },
        branch: br.clone(),
        to,
        worktree: repo.is_some().then(|| copy.work_tree.clone()),
        done: false,
    };
    if !yes {
        return Ok(d);
    }
    if let Some(r) = &repo {
        r.fetch_object(&checkout.common, &d.to)?;
        r.reset_hard(&d.to)?;
        r.clean_untracked()?;
    }
    let old = checkout.rev(&copy.branch)?.unwrap_or_default();
    checkout.move_ref(&copy.branch, &d.to, &old, "loopflow: discard")?;
    paths.log(
        Event::Discard,
        &[
            LogArg::Kv("branch", br),
            LogArg::Kv("commits", d.commits.to_string()),
            LogArg::Kv("uncommitted", d.uncommitted.len().to_string()),
            LogArg::Kv("to", d.to.clone()),
        ],
    )?;
    d.done = true;
    Ok(d)
}
