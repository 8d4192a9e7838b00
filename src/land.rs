//! `land` and `discard`: taking a loop's work home, or throwing it away. Both hold the
//! loop's tick lock for their whole run (so no tick starts halfway), refuse while a tick
//! holds it, and leave the checkout exactly as it was whenever they refuse: `land`
//! computes the merge with `git merge-tree` before touching anything, and aborts a merge
//! that fails anyway.

use std::path::Path;

use crate::git::{GitError, git, ok};
use crate::review::{branch, count_range, current_branch, status_lines};
use crate::state::{Event, LogArg, LoopPaths, State, StateError, TickLock};

#[derive(Debug, thiserror::Error)]
pub enum LandError {
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
pub struct Landed {
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

/// `-c user.name=… -c user.email=…` when the repository has no identity of its own: a
/// merge needs one, and the human's own is used when it is set.
fn identity(project: &Path) -> Vec<&'static str> {
    let has = git(project, &["config", "user.email"]).is_ok_and(|o| o.status.success());
    if has {
        Vec::new()
    } else {
        vec![
            "-c",
            "user.name=loopflow",
            "-c",
            "user.email=loopflow@localhost",
        ]
    }
}

/// Files a merge of `br` into HEAD would conflict in, computed without touching the
/// checkout (`git merge-tree --write-tree`, git ≥ 2.38). `None` when git cannot tell.
fn conflicts(project: &Path, br: &str) -> Option<Vec<String>> {
    let out = git(
        project,
        &[
            "merge-tree",
            "--write-tree",
            "--name-only",
            "-z",
            "HEAD",
            br,
        ],
    )
    .ok()?;
    match out.status.code() {
        Some(0) => Some(Vec::new()),
        Some(1) => {
            // <tree>\0<file>\0<file>\0\0<messages>
            let mut files: Vec<String> = out
                .stdout
                .split(|b| *b == 0)
                .skip(1)
                .take_while(|f| !f.is_empty())
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            files.dedup();
            Some(files)
        }
        _ => None,
    }
}

/// What `land` and `discard` start with: the tick lock (held to the end), the loop's
/// branch, which must exist, and the checkout's HEAD commit.
fn prelude(paths: &LoopPaths, verb: &'static str) -> Result<(TickLock, String, String), LandError> {
    let lock = lock(paths)?;
    let project = &paths.project;
    let br = branch(&paths.name);
    let Some(head) = crate::git::rev(project, "HEAD")? else {
        return Err(LandError::NotGit(project.clone()));
    };
    if crate::git::rev(project, &format!("refs/heads/{br}"))?.is_none() {
        return Err(LandError::NoBranch(paths.name.clone(), verb));
    }
    Ok((lock, br, head))
}

/// Merges `loopflow/<name>` into the checkout's current branch (`--no-ff`, or one squash
/// commit), then logs `LAND`.
pub fn land(paths: &LoopPaths, state: &State, squash: bool) -> Result<Landed, LandError> {
    let (_lock, br, head_before) = prelude(paths, "land")?;
    // Before the merge: after it, the loop's worktree is moved onto the new HEAD, and a
    // worktree that is another checkout's must not be.
    let wt = crate::worktree::checked(paths, state).map_err(LandError::Elsewhere)?;
    let project = &paths.project;
    let into = current_branch(project).ok_or(LandError::Detached)?;
    if into == br {
        return Err(LandError::OnLoopBranch(br));
    }
    let dirty = status_lines(project, false)?;
    if !dirty.is_empty() {
        return Err(LandError::Dirty(dirty));
    }
    let commits = count_range(project, &format!("HEAD..{br}")).unwrap_or(0);
    if commits == 0 {
        return Ok(Landed {
            into,
            commits,
            head: None,
            note: None,
        });
    }
    if let Some(files) = conflicts(project, &br)
        && !files.is_empty()
    {
        return Err(LandError::Conflict {
            name: paths.name.clone(),
            branch: br,
            into,
            files,
        });
    }
    let id = identity(project);
    let message = format!(
        "loopflow: land loop {} ({commits} commit{})",
        paths.name,
        if commits == 1 { "" } else { "s" }
    );
    let mut args: Vec<&str> = id.clone();
    if squash {
        args.extend(["merge", "--squash", "--quiet", &br]);
    } else {
        args.extend([
            "merge",
            "--no-ff",
            "--no-edit",
            "--quiet",
            "-m",
            &message,
            &br,
        ]);
    }
    let merged = git(project, &args)?;
    let committed = if !merged.status.success() {
        Err(String::from_utf8_lossy(&merged.stderr).trim().to_string())
    } else if squash {
        let body = squash_message(project, &br, &message);
        let mut c: Vec<&str> = id.clone();
        c.extend(["commit", "--quiet", "--no-verify", "-m", &body]);
        let out = git(project, &c)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    } else {
        Ok(())
    };
    if let Err(why) = committed {
        // Back to exactly where we were: the merge state, the index and the files.
        let _ = git(project, &["merge", "--abort"]);
        let _ = git(project, &["reset", "--quiet", "--hard", &head_before]);
        return Err(LandError::MergeFailed(format!("git merge {br}: {why}")));
    }
    let head = crate::git::rev(project, "HEAD")?.unwrap_or_default();
    // A squash leaves the loop's branch beside the commit that now holds its work: moved
    // onto it, the loop goes on from what landed and the next land does not repeat it.
    let note = if squash {
        rebase_branch(paths, &wt, &head).err()
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

fn squash_message(project: &Path, br: &str, title: &str) -> String {
    let subjects = git(
        project,
        &["log", "--reverse", "--format=- %s", &format!("HEAD..{br}")],
    )
    .ok()
    .and_then(|o| ok(o, "log").ok())
    .map(|b| String::from_utf8_lossy(&b).into_owned())
    .unwrap_or_default();
    format!("{title}\n\n{subjects}")
}

/// Moves the loop's branch (and its worktree `wt`, when it has one: the one `land` checked)
/// to `to`, keeping uncommitted work in the worktree (`reset --keep` refuses rather than
/// lose it).
fn rebase_branch(paths: &LoopPaths, wt: &Path, to: &str) -> Result<(), String> {
    let br = branch(&paths.name);
    let out = if wt.is_dir() {
        git(wt, &["reset", "--quiet", "--keep", to])
    } else {
        git(&paths.project, &["branch", "--force", &br, to])
    }
    .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{br} was left where it was ({}); run `loopflow discard --loop {} --yes` to start it from the landed commit",
            String::from_utf8_lossy(&out.stderr).trim(),
            paths.name
        ))
    }
}

/// What `discard` would do or did.
#[derive(Debug)]
pub struct Discard {
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
pub fn discard(paths: &LoopPaths, state: &State, yes: bool) -> Result<Discard, LandError> {
    let (_lock, br, to) = prelude(paths, "discard")?;
    let project = &paths.project;
    let wt = crate::worktree::checked(paths, state).map_err(LandError::Elsewhere)?;
    let worktree = wt.is_dir().then_some(wt);
    let mut d = Discard {
        commits: count_range(project, &format!("HEAD..{br}")).unwrap_or(0),
        uncommitted: match &worktree {
            Some(w) => status_lines(w, true)?,
            None => Vec::new(),
        },
        branch: br.clone(),
        to,
        worktree,
        done: false,
    };
    if !yes {
        return Ok(d);
    }
    match &d.worktree {
        Some(w) => {
            ok(
                git(w, &["reset", "--quiet", "--hard", &d.to])?,
                "reset --hard",
            )?;
            ok(git(w, &["clean", "--quiet", "-d", "--force"])?, "clean")?;
        }
        None => {
            ok(
                git(project, &["branch", "--force", &br, &d.to])?,
                "branch --force",
            )?;
        }
    }
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
