//! `loopflow worktree gc`: prunes the worktrees and `loopflow/*` branches of loops that
//! were deleted, and (with `--include-idle`) of live loops idle longer than a maximum age.
//! A worktree with uncommitted changes is never removed without `--force`, and a branch
//! with commits that are not merged into the main checkout's HEAD is kept (git's own
//! `branch -d` rule) unless forced. A live loop without its worktree skips every tick
//! (`worktree_missing`), so its worktree stays unless asked; `worktree restore` brings a
//! removed one back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::git::{GitError, common_dir, git, ok};
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
    /// `.loopflow/loops/<name>/worktree`, a linked worktree whose record names it back.
    Own(PathBuf),
    /// Neither is there: removed (`worktree restore` makes it again).
    Missing(PathBuf),
    /// Somewhere else: the project was copied or moved with its loops, and the state still
    /// names the worktree of the old place — another checkout's, if it is still there.
    Elsewhere { recorded: PathBuf, own: PathBuf },
    /// The loop's own directory, but its `.git` names a record that does not name it back
    /// (a copied worktree: the first checkout's record; a moved one: a record that is
    /// gone), or is no linked worktree's file at all. Git run there would work elsewhere.
    Unlinked {
        own: PathBuf,
        named: Option<PathBuf>,
    },
}

impl Place {
    /// Why nothing may run in this worktree, and what a human does about it: `None` for a
    /// worktree of the loop's own (or one that is missing, which has its own skip).
    pub fn refusal(&self, name: &str) -> Option<String> {
        if matches!(self, Place::Own(_) | Place::Missing(_)) {
            return None;
        }
        let restore =
            format!("`loopflow worktree restore --loop {name}` points the loop at its own");
        match self {
            Place::Own(_) | Place::Missing(_) => None,
            Place::Elsewhere { recorded, own } => Some(format!(
                "the state names the worktree {}, not this loop's {} (the project was copied or moved with its loops); nothing runs in another checkout: {restore}",
                recorded.display(),
                own.display(),
            )),
            Place::Unlinked { own, named } => Some(format!(
                "{}/.git {} (the project was copied or moved with its loops, or the file was rewritten); nothing runs there, where git would work on another record: {restore}",
                own.display(),
                match named {
                    Some(n) => format!(
                        "names {}, a record that does not name this worktree back",
                        n.display()
                    ),
                    None => "is not a linked worktree's `gitdir:` file".to_string(),
                },
            )),
        }
    }
}

/// [`Place`] of the worktree a tick of this loop would run in: the same directory as the
/// loop's own (compared by device and inode, so a symlinked project path still matches)
/// whose `.git` and record name each other, else missing, elsewhere or unlinked. Two
/// `stat`s, and for the loop's own directory two small reads and two `realpath`s: no git.
pub fn place(paths: &LoopPaths, state: &State) -> Place {
    let recorded = dir(paths, state);
    let id = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    };
    match (id(&recorded), id(&paths.worktree)) {
        (Some(a), Some(b)) if a == b && recorded.join(".git").symlink_metadata().is_ok() => {
            match linked(&recorded) {
                Ok(()) => Place::Own(recorded),
                Err(named) => Place::Unlinked {
                    own: paths.worktree.clone(),
                    named,
                },
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

/// The record a linked worktree's `.git` file names (`gitdir: …`; a relative one, as git
/// writes with `worktree.useRelativePaths`, against the worktree), if it is such a file.
fn git_dir_of(wt: &Path) -> Option<PathBuf> {
    let text = crate::fs_safe::head(&wt.join(".git"), 4096).ok()?;
    let named = std::str::from_utf8(&text)
        .ok()?
        .trim_end()
        .strip_prefix("gitdir: ")?;
    Some(wt.join(named))
}

/// The worktree a record names (its `gitdir` file: the worktree's `.git`; relative to the
/// record when git wrote it so).
fn worktree_of(record: &Path) -> Option<PathBuf> {
    let text = crate::fs_safe::head(&record.join("gitdir"), 4096).ok()?;
    let named = crate::git::path_of(text.trim_ascii_end());
    Some(record.join(named))
}

/// Whether the worktree's `.git` names a record that names this worktree's `.git` back —
/// what git itself needs to work on the right repository's record. A copied worktree's
/// names the first checkout's record (which names the first checkout's worktree), a moved
/// one's a record that is gone. `Err` carries the record it names, if any.
fn linked(wt: &Path) -> Result<(), Option<PathBuf>> {
    let record = git_dir_of(wt).ok_or(None)?;
    let back = worktree_of(&record).and_then(|g| g.canonicalize().ok());
    let me = wt.join(".git").canonicalize().ok();
    match (back, me) {
        (Some(b), Some(m)) if b == m => Ok(()),
        _ => Err(Some(record)),
    }
}

/// The loop's worktree for a command that reads or changes it (`review`, `land`,
/// `discard`): refused when the state is another loop's, or names another checkout's
/// worktree — git would run there.
pub fn checked(paths: &LoopPaths, state: &State) -> Result<PathBuf, String> {
    paths.owns(state).map_err(|e| e.to_string())?;
    let place = place(paths, state);
    if let Some(why) = place.refusal(&paths.name) {
        return Err(why);
    }
    Ok(match place {
        Place::Own(p) | Place::Missing(p) => p,
        Place::Elsewhere { own, .. } | Place::Unlinked { own, .. } => own,
    })
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
    let common = common_dir(project)?.join("worktrees").canonicalize().ok();
    let theirs = |wt: &Path| {
        let record = git_dir_of(wt).and_then(|r| r.canonicalize().ok());
        wt.exists() && matches!((record, &common), (Some(r), Some(c)) if !r.starts_with(c))
    };
    let mut handled = Vec::new();
    for w in &worktrees {
        let Some(name) = w
            .branch
            .as_deref()
            .and_then(|b| b.strip_prefix("loopflow/"))
        else {
            continue;
        };
        // A copied project's record of the first checkout's worktree: not this
        // repository's to inspect (`git status` there refreshes the other's index) or
        // remove.
        if theirs(&w.path) {
            lines.push(format!(
                "skipped worktree {} (loop {name}): it is another repository's (its .git names a record that is not this one's: a copied or moved project); this repository's record of it goes once that path does (`git worktree prune`)",
                w.path.display()
            ));
            continue;
        }
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
            remove(project, &w.path, o.force)?;
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

/// Removes a loop's linked worktree and git's record of it (`git worktree remove`;
/// `force`: uncommitted changes and a lock too). `worktree gc` and `delete` remove
/// worktrees through here.
pub fn remove(project: &Path, worktree: &Path, force: bool) -> Result<(), GitError> {
    let p = worktree.display().to_string();
    let mut args = vec!["worktree", "remove"];
    if force {
        args.extend(["--force", "--force"]);
    }
    args.push(&p);
    ok(git(project, &args)?, &format!("worktree remove {p}"))?;
    Ok(())
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
    let Some(old) = git_dir_of(&paths.worktree) else {
        return Ok(false);
    };
    let common = common_dir(&paths.project)?;
    // A record of this repository names this worktree back: the `.git` was rewritten in
    // place (by an agent, say). Point it at that record again.
    let me = dotgit.canonicalize().ok();
    let mine = records(&paths.project)?
        .into_iter()
        .find(|rec| me.is_some() && worktree_of(rec).and_then(|g| g.canonicalize().ok()) == me);
    if let Some(rec) = mine {
        if linked(&paths.worktree).is_ok() {
            return Ok(false);
        }
        write_dotgit(&dotgit, &rec)?;
        return Ok(true);
    }
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
    let about_this_loop = worktree_of(&admin).is_some_and(|g| names_this_loop(&g, paths));
    if old == admin || old.starts_with(&common) || !about_this_loop {
        return Ok(false);
    }
    write_dotgit(&dotgit, &admin)?;
    let wt = paths.worktree.display().to_string();
    ok(
        git(&paths.project, &["worktree", "repair", &wt])?,
        "worktree repair",
    )?;
    Ok(true)
}

/// Replaces a worktree's `.git` with one naming `record`: created new next to it (O_EXCL:
/// never through a link planted under that name), then renamed over it.
fn write_dotgit(dotgit: &Path, record: &Path) -> Result<(), RestoreError> {
    let tmp = dotgit.with_file_name(".git.loopflow-relink");
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| {
            use std::io::Write;
            f.write_all(format!("gitdir: {}\n", record.display()).as_bytes())
        })
        .and_then(|()| std::fs::rename(&tmp, dotgit))
        .map_err(|source| RestoreError::Relink {
            path: dotgit.to_path_buf(),
            source,
        })
}

/// The absolute path restore records for the loop's worktree: the loop directory resolved,
/// the last component as it is — never where a link planted there since the check points.
fn recorded_path(paths: &LoopPaths) -> Result<PathBuf, RestoreError> {
    if std::fs::symlink_metadata(&paths.worktree).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(RestoreError::Symlink(paths.worktree.clone()));
    }
    Ok(paths
        .dir
        .canonicalize()
        .map_or_else(|_| paths.worktree.clone(), |d| d.join("worktree")))
}

/// The records (`<common>/worktrees/<id>`) of `project`'s repository, none when it has no
/// linked worktree.
fn records(project: &Path) -> Result<Vec<PathBuf>, GitError> {
    let dir = common_dir(project)?.join("worktrees");
    Ok(std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect())
}

/// Whether a record's worktree `.git` is at this loop's place in some project
/// (`…/.loopflow/loops/<name>/worktree/.git`): in a copied or moved project, the first
/// checkout's.
fn names_this_loop(dotgit: &Path, paths: &LoopPaths) -> bool {
    dotgit.ends_with(
        Path::new(".loopflow/loops")
            .join(&paths.name)
            .join("worktree/.git"),
    )
}

/// Points the state at the loop's worktree `path` and logs `WORKTREE restored=…`.
fn record(paths: &LoopPaths, path: &Path, branch: &str) -> Result<(), RestoreError> {
    let shown = path.display().to_string();
    paths.update(|s| s.worktree_path = Some(shown.clone()))?;
    let _ = paths.log(
        Event::Worktree,
        &[
            LogArg::Kv("restored", shown),
            LogArg::Kv("branch", branch.to_string()),
        ],
    );
    Ok(())
}

/// A copied project's records of the first checkout's worktree of this loop: `worktree
/// prune` keeps one while that path exists, and `worktree add` then refuses the branch
/// ("already used by worktree at …"). Removes, from this repository only, a record that
/// names this loop's place in another project whose worktree is there and names a record
/// of its own (the first checkout's) instead. Kept: locked records, records whose worktree
/// is not there (an unmounted disk: `prune` decides those), and any a worktree names back.
fn drop_copied_records(paths: &LoopPaths) -> Result<(), RestoreError> {
    let own = paths.worktree.join(".git").canonicalize().ok();
    for rec in records(&paths.project)? {
        if rec.join("locked").exists() {
            continue;
        }
        let Some(named) = worktree_of(&rec).and_then(|n| n.canonicalize().ok()) else {
            continue;
        };
        if !names_this_loop(&named, paths) || Some(&named) == own.as_ref() {
            continue;
        }
        let (Some(theirs), Ok(this)) = (
            named
                .parent()
                .and_then(git_dir_of)
                .and_then(|g| g.canonicalize().ok()),
            rec.canonicalize(),
        ) else {
            continue;
        };
        if theirs != this && theirs.join("HEAD").is_file() {
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
    let relinked = (!registered(&target) || linked(&target).is_err()) && relink(paths)?;
    let known = if relinked {
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
        let path = recorded_path(paths)?;
        let moved = !matches!(place(paths, &state), Place::Own(_));
        if moved || relinked {
            record(paths, &path, &branch)?;
        }
        return Ok(Restored {
            path,
            branch,
            created: moved || relinked,
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
    let path = recorded_path(paths)?;
    record(paths, &path, &branch)?;
    Ok(Restored {
        path,
        branch,
        created: true,
        branch_existed,
    })
}
