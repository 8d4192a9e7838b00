//! `loopflow worktree gc`: prunes the worktrees and `loopflow/*` branches of loops that
//! were deleted, and (with `--include-idle`) of live loops idle longer than a maximum age.
//! A worktree with uncommitted changes is never removed without `--force`, and a branch
//! with commits that are not merged into the main checkout's HEAD is kept (git's own
//! `branch -d` rule) unless forced. A live loop without its worktree skips every tick
//! (`worktree_missing`), so its worktree stays unless asked; `worktree restore` brings a
//! removed one back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::git::{GitError, git, ok};
use crate::state::{Event, LogArg, LoopPaths, State};

/// The loop's worktree directory: `worktree_path` from the state (a relative one, as
/// older loopflow wrote when run with `--project .`, resolves against the project, never
/// against the current directory), else `.loopflow/loops/<name>/worktree`.
pub fn dir(paths: &LoopPaths, state: &State) -> PathBuf {
    match &state.worktree_path {
        Some(p) if Path::new(p).is_absolute() => PathBuf::from(p),
        Some(p) => paths.project.join(p),
        None => paths.worktree.clone(),
    }
}

/// Where a loop's state says its worktree is, against the loop's own directory for it.
#[derive(Debug, PartialEq, Eq)]
pub enum Place {
    /// `.loopflow/loops/<name>/worktree`, a git worktree (its `.git` is there).
    Own(PathBuf),
    /// Neither is there: removed (`worktree restore` makes it again).
    Missing(PathBuf),
    /// Somewhere else: the project was copied or moved with its loops, and the state still
    /// names the worktree of the old place — another checkout's, if it is still there.
    Elsewhere { recorded: PathBuf, own: PathBuf },
}

/// [`Place`] of the worktree a tick of this loop would run in: the same directory as the
/// loop's own (compared by device and inode, so a symlinked project path still matches),
/// else missing or elsewhere. Two `stat`s.
pub fn place(paths: &LoopPaths, state: &State) -> Place {
    let recorded = dir(paths, state);
    let id = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    };
    match (id(&recorded), id(&paths.worktree)) {
        (Some(a), Some(b)) if a == b && recorded.join(".git").exists() => {
            if linked_here(&paths.project, &recorded) {
                Place::Own(recorded)
            } else {
                // The loop's own directory, but a copied worktree: its `.git` still
                // names the first checkout's record, where git would do its work.
                Place::Elsewhere {
                    recorded: git_dir_of(&recorded).unwrap_or(recorded),
                    own: paths.worktree.clone(),
                }
            }
        }
        (Some(a), Some(b)) if a == b => Place::Missing(recorded),
        (None, None) => Place::Missing(recorded),
        _ => Place::Elsewhere {
            recorded,
            own: paths.worktree.clone(),
        },
    }
}

/// The record a linked worktree's `.git` file names (`gitdir: …`, relative to the worktree
/// when git wrote it so), if it is such a file.
fn git_dir_of(wt: &Path) -> Option<PathBuf> {
    let text = crate::fs_safe::head(&wt.join(".git"), 4096).ok()?;
    let named = std::str::from_utf8(&text)
        .ok()?
        .trim_end()
        .strip_prefix("gitdir: ")?;
    Some(wt.join(named))
}

/// Whether the worktree's `.git` file names a record in this project's repository (the
/// `.git` directory found upward from the project). A copied worktree's names the first
/// checkout's record, a moved one's a record that is gone. Where it cannot be told (a
/// `.git` directory in the worktree, a project inside a linked worktree) it counts as
/// here: `git-commit` checks the rest before it commits.
fn linked_here(project: &Path, wt: &Path) -> bool {
    let Some(named) = git_dir_of(wt) else {
        return true;
    };
    let Some(dotgit) = project
        .ancestors()
        .map(|a| a.join(".git"))
        .find(|d| d.symlink_metadata().is_ok())
    else {
        return true;
    };
    if !dotgit.is_dir() {
        return true;
    }
    match (named.canonicalize(), dotgit.canonicalize()) {
        (Ok(named), Ok(common)) => named.starts_with(common.join("worktrees")),
        (Err(_), _) => false,
        (Ok(_), Err(_)) => true,
    }
}

/// The loop's worktree for a command that reads or changes it (`review`, `land`,
/// `discard`): refused when the state is another loop's, or names another checkout's
/// worktree — git would run there.
pub fn checked(paths: &LoopPaths, state: &State) -> Result<PathBuf, String> {
    paths.owns(state).map_err(|e| e.to_string())?;
    match place(paths, state) {
        Place::Elsewhere { recorded, own } => Err(elsewhere(&recorded, &own, &paths.name)),
        Place::Own(p) | Place::Missing(p) => Ok(p),
    }
}

/// What a human does about a state that names a worktree outside the loop (the gate's
/// detail, the tick's `WARN`, the refusal of `review`, `land` and `discard`).
pub fn elsewhere(recorded: &Path, own: &Path, name: &str) -> String {
    format!(
        "the loop's worktree is {}, not this loop's {} (the project was copied or moved with its loops); nothing runs in another checkout: `loopflow worktree restore --loop {name}` points the loop at its own",
        recorded.display(),
        own.display(),
    )
}

/// One worktree git knows about.
#[derive(Debug, Clone)]
pub struct Worktree {
    pub path: PathBuf,
    pub branch: Option<String>,
}

/// `git worktree list --porcelain`.
pub fn list(project: &Path) -> Result<Vec<Worktree>, GitError> {
    let stdout = ok(
        git(project, &["worktree", "list", "--porcelain", "-z"])?,
        "worktree list",
    )?;
    let mut all = Vec::new();
    let mut cur: Option<Worktree> = None;
    for field in stdout.split(|b| *b == 0) {
        let f = String::from_utf8_lossy(field);
        if let Some(p) = f.strip_prefix("worktree ") {
            if let Some(w) = cur.take() {
                all.push(w);
            }
            cur = Some(Worktree {
                path: PathBuf::from(p),
                branch: None,
            });
        } else if let Some(b) = f.strip_prefix("branch ")
            && let Some(w) = cur.as_mut()
        {
            w.branch = Some(b.trim_start_matches("refs/heads/").to_string());
        }
    }
    all.extend(cur);
    Ok(all)
}

/// Branches named `loopflow/*`.
fn loop_branches(project: &Path) -> Result<Vec<String>, GitError> {
    let out = git(
        project,
        &[
            "for-each-ref",
            "--format=%(refname:short)",
            "refs/heads/loopflow/",
        ],
    )?;
    let stdout = ok(out, "for-each-ref")?;
    Ok(String::from_utf8_lossy(&stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

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

fn dirty(wt: &Path) -> Result<bool, GitError> {
    let out = git(wt, &["status", "--porcelain", "--untracked-files=all"])?;
    Ok(!ok(out, "status")?.is_empty())
}

pub struct GcOptions {
    pub max_age: Duration,
    pub force: bool,
    pub dry_run: bool,
    /// Also prune live loops idle longer than `max_age` (they then skip until restored).
    pub include_idle: bool,
}

/// What gc did, one line each, and whether anything was kept back.
pub struct GcReport {
    pub lines: Vec<String>,
    pub kept: usize,
}

/// Prunes stale loop worktrees and branches.
pub fn gc(project: &Path, o: &GcOptions) -> Result<GcReport, GitError> {
    let mut lines = Vec::new();
    let mut kept = 0;
    let verb = |s: &str| {
        if o.dry_run {
            format!("would {s}")
        } else {
            s.to_string()
        }
    };
    // Records of worktrees whose directory is gone go first.
    if !o.dry_run {
        let _ = git(project, &["worktree", "prune"]);
    }
    let worktrees = list(project)?;
    let mut handled = Vec::new();
    for w in &worktrees {
        let Some(name) = w
            .branch
            .as_deref()
            .and_then(|b| b.strip_prefix("loopflow/"))
        else {
            continue;
        };
        let Some(stale) = stale(project, name, o.max_age) else {
            continue;
        };
        handled.push(name.to_string());
        let why = stale.why();
        if matches!(stale, Stale::Idle(_)) && !o.include_idle {
            lines.push(format!(
                "kept worktree {} (loop {name}, {why}): the loop still exists and would skip every tick without it; pass --include-idle to remove it (`loopflow worktree restore --loop {name}` brings it back)",
                w.path.display()
            ));
            continue;
        }
        if w.path.exists() && dirty(&w.path)? && !o.force {
            kept += 1;
            lines.push(format!(
                "kept worktree {} (loop {name}, {why}): it has uncommitted changes; commit them or pass --force",
                w.path.display()
            ));
            continue;
        }
        lines.push(format!(
            "{} worktree {} (loop {name}, {why})",
            verb("remove"),
            w.path.display()
        ));
        if !o.dry_run {
            let p = w.path.display().to_string();
            let mut args = vec!["worktree", "remove"];
            if o.force {
                args.extend(["--force", "--force"]);
            }
            args.push(&p);
            ok(git(project, &args)?, &format!("worktree remove {p}"))?;
            let paths = LoopPaths::new(project, name);
            if paths.dir.is_dir() {
                let _ = paths.log(
                    Event::Worktree,
                    &[
                        LogArg::Kv("removed", p.clone()),
                        LogArg::Kv("reason", why.clone()),
                    ],
                );
            }
        }
        delete_branch(project, name, o, &mut lines, &mut kept)?;
    }
    // Branches of deleted or idle loops that have no worktree (any more).
    for b in loop_branches(project)? {
        let name = b.trim_start_matches("loopflow/");
        if handled.iter().any(|h| h == name)
            || worktrees
                .iter()
                .any(|w| w.branch.as_deref() == Some(b.as_str()))
        {
            continue;
        }
        match stale(project, name, o.max_age) {
            None => continue,
            Some(Stale::Idle(_)) if !o.include_idle => continue,
            Some(_) => {}
        }
        delete_branch(project, name, o, &mut lines, &mut kept)?;
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

fn delete_branch(
    project: &Path,
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
    let flag = if o.force { "-D" } else { "-d" };
    let out = git(project, &["branch", flag, &branch])?;
    if out.status.success() {
        lines.push(format!("deleted branch {branch}"));
    } else {
        *kept += 1;
        lines.push(format!(
            "kept branch {branch}: {} (merge it, or pass --force to delete it)",
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .lines()
                .next()
                .unwrap_or("git refused")
        ));
    }
    Ok(())
}

/// Why `worktree restore` could not bring a worktree back.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("a tick of loop {0} is running; try again when it ends")]
    Busy(String),
    #[error("{} exists and is not a git worktree; move it away, then run restore again", .0.display())]
    InTheWay(PathBuf),
    #[error(
        "{} is a symlink: a loop's worktree is a directory of its own; remove the link, then run restore again",
        .0.display()
    )]
    Symlink(PathBuf),
    #[error("{}: {source}", path.display())]
    Relink {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What `worktree restore` did.
pub struct Restored {
    pub path: PathBuf,
    pub branch: String,
    /// False when the worktree was there already (nothing was done).
    pub created: bool,
    /// Whether the branch existed (else it was made from HEAD).
    pub branch_existed: bool,
}

/// A worktree copied or moved with its project: its `.git` file still names the old
/// repository's record of it (`<old>/.git/worktrees/<id>`), which the copy or move brought
/// along as `<this>/.git/worktrees/<id>`. Points the file at this repository's record and
/// lets git repair the way back from it. Never touches the old repository (`git worktree
/// repair` run on the copy as it is would: it follows the `.git` file and rewrites the
/// old repository's record to name the copy). False when there was nothing to relink.
fn relink(paths: &LoopPaths) -> Result<bool, RestoreError> {
    let dotgit = paths.worktree.join(".git");
    // The agent's file to write: only a regular file is read, and it is replaced, never
    // written through.
    if !std::fs::symlink_metadata(&dotgit).is_ok_and(|m| m.file_type().is_file()) {
        return Ok(false);
    }
    let Ok(text) = crate::fs_safe::head(&dotgit, 4096) else {
        return Ok(false);
    };
    let Some(old) = std::str::from_utf8(&text)
        .ok()
        .and_then(|t| t.trim_end().strip_prefix("gitdir: "))
        .map(PathBuf::from)
    else {
        return Ok(false);
    };
    let common = common_dir(&paths.project)?;
    // The file is the agent's to write, so its id is checked to be one plain name, and the
    // record of that id here must be about this loop's worktree (its `gitdir` names
    // `…/.loopflow/loops/<name>/worktree/.git`, wherever the first checkout was).
    let Some(id) = old
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| {
            n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        })
        .filter(|n| !n.starts_with('.'))
    else {
        return Ok(false);
    };
    let admin = common.join("worktrees").join(id);
    let ours = format!("/.loopflow/loops/{}/worktree/.git", paths.name);
    let about_this_loop = crate::fs_safe::head(&admin.join("gitdir"), 4096)
        .is_ok_and(|g| g.trim_ascii_end().ends_with(ours.as_bytes()));
    if old == admin || old.starts_with(&common) || !about_this_loop {
        return Ok(false);
    }
    // Created new (O_EXCL: never through a link planted under that name), then renamed
    // over `.git`.
    let tmp = paths.worktree.join(".git.loopflow-relink");
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(format!("gitdir: {}\n", admin.display()).as_bytes())
        })
        .and_then(|()| std::fs::rename(&tmp, &dotgit))
        .map_err(|source| RestoreError::Relink {
            path: dotgit.clone(),
            source,
        })?;
    let wt = paths.worktree.display().to_string();
    ok(
        git(&paths.project, &["worktree", "repair", &wt])?,
        "worktree repair",
    )?;
    Ok(true)
}

/// This repository's absolute common directory (`.git` of the main checkout).
fn common_dir(project: &Path) -> Result<PathBuf, GitError> {
    let out = ok(
        git(
            project,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )?,
        "rev-parse",
    )?;
    Ok(crate::git::path_of(out.trim_ascii_end()))
}

/// A copied project's records of the first checkout's worktree of this loop: `worktree
/// prune` keeps one while that path exists, and `worktree add` then refuses the branch
/// ("already used by worktree at …"). Removes, from this repository only, each record
/// naming this loop's place in another project whose worktree does not name it back —
/// a worktree that does is a live one of this repository and stays.
fn drop_copied_records(paths: &LoopPaths) -> Result<(), RestoreError> {
    let records = common_dir(&paths.project)?.join("worktrees");
    let Ok(entries) = std::fs::read_dir(&records) else {
        return Ok(());
    };
    let suffix = format!("/.loopflow/loops/{}/worktree/.git", paths.name);
    let own = paths.worktree.join(".git");
    for rec in entries.flatten().map(|e| e.path()) {
        let Ok(named) = crate::fs_safe::head(&rec.join("gitdir"), 4096) else {
            continue;
        };
        let named = crate::git::path_of(named.trim_ascii_end());
        if !named.to_string_lossy().ends_with(&suffix) || named == own {
            continue;
        }
        let named_back = named
            .parent()
            .and_then(git_dir_of)
            .and_then(|g| g.canonicalize().ok())
            .is_some_and(|g| rec.canonicalize().is_ok_and(|r| r == g));
        if !named_back {
            std::fs::remove_dir_all(&rec).map_err(|source| RestoreError::Relink {
                path: rec.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

/// Re-creates a loop's worktree at `.loopflow/loops/<name>/worktree` on `loopflow/<name>`
/// (the branch if it exists, else a new one from HEAD) and points the state's
/// `worktree_path` at it. Holds the tick lock, so no tick runs meanwhile.
pub fn restore(paths: &LoopPaths) -> Result<Restored, RestoreError> {
    let _lock = paths
        .try_lock_tick()?
        .ok_or_else(|| RestoreError::Busy(paths.name.clone()))?;
    let state = paths.load()?;
    paths.owns(&state)?;
    // Restore writes in the worktree and records where it is: only ever the loop's own
    // directory, never where a link planted in its place points.
    if std::fs::symlink_metadata(&paths.worktree).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(RestoreError::Symlink(paths.worktree.clone()));
    }
    let branch = format!("loopflow/{}", paths.name);
    let known = list(&paths.project)?;
    let registered = |p: &Path| {
        let canon = p.canonicalize().ok();
        known
            .iter()
            .any(|w| Some(&w.path) == canon.as_ref() || w.path == p)
    };
    let target = paths.worktree.clone();
    // Only the loop's own directory counts: a state naming another checkout's worktree
    // (a copied or moved project) is pointed back here once git knows this one.
    let known = if !registered(&target) && relink(paths)? {
        list(&paths.project)?
    } else {
        known
    };
    let registered = |p: &Path| {
        let canon = p.canonicalize().ok();
        known
            .iter()
            .any(|w| Some(&w.path) == canon.as_ref() || w.path == p)
    };
    if target.join(".git").exists() && registered(&target) {
        let path = target.canonicalize().unwrap_or(target);
        let moved = !matches!(place(paths, &state), Place::Own(_));
        if moved {
            let shown = path.display().to_string();
            paths.update(|s| s.worktree_path = Some(shown.clone()))?;
            let _ = paths.log(
                Event::Worktree,
                &[
                    LogArg::Kv("restored", shown),
                    LogArg::Kv("branch", branch.clone()),
                ],
            );
        }
        return Ok(Restored {
            path,
            branch,
            created: moved,
            branch_existed: true,
        });
    }
    let occupied = std::fs::read_dir(&target).is_ok_and(|mut d| d.next().is_some());
    if occupied {
        return Err(RestoreError::InTheWay(target));
    }
    // Records of worktrees whose directory is gone would make `worktree add` refuse.
    ok(
        git(&paths.project, &["worktree", "prune"])?,
        "worktree prune",
    )?;
    drop_copied_records(paths)?;
    let branch_existed = git(
        &paths.project,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ],
    )?
    .status
    .success();
    let t = target.display().to_string();
    let args: Vec<&str> = if branch_existed {
        vec!["worktree", "add", "--quiet", &t, &branch]
    } else {
        vec!["worktree", "add", "--quiet", "-b", &branch, &t, "HEAD"]
    };
    ok(git(&paths.project, &args)?, "worktree add")?;
    let path = target.canonicalize().unwrap_or(target);
    let shown = path.display().to_string();
    paths.update(|s| s.worktree_path = Some(shown.clone()))?;
    let _ = paths.log(
        Event::Worktree,
        &[
            LogArg::Kv("restored", shown),
            LogArg::Kv("branch", branch.clone()),
        ],
    );
    Ok(Restored {
        path,
        branch,
        created: true,
        branch_existed,
    })
}
