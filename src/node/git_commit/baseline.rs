//! What the loop's tree looked like when the tick began, so `git-commit` can tell which
//! paths the tick changed: the branch tip in a worktree; with worktrees off, HEAD and a
//! stamp of every path that already differed from it (a git project), or of every file (a
//! project without git). Stamps are `lstat` fields that any write changes (the inode
//! change time cannot be set back from user space), so nothing is hashed or read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::git::{CopyError, GitError, Repo, paths_of};
use crate::worktree::Copy;

/// The most files stamped in a project without git; past it the tick says so and checks
/// nothing rather than walk a huge tree twice per tick.
pub(super) const FILES_CAP: usize = 100_000;

/// Entries never walked or reported: loopflow's own, git's, and the agents' output dir.
const SKIPPED: &[&str] = &[".git", ".loopflow", crate::blast::OUTPUT_DIR];

/// `lstat` fields that change on any write, rename, chmod or re-link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    mode: u32,
}

impl Stamp {
    pub fn of(p: &Path) -> Option<Stamp> {
        let m = std::fs::symlink_metadata(p).ok()?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(Stamp {
                ino: m.ino(),
                len: m.len(),
                mtime: (m.mtime(), m.mtime_nsec()),
                ctime: (m.ctime(), m.ctime_nsec()),
                mode: m.mode(),
            })
        }
        #[cfg(not(unix))]
        {
            let t = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .unwrap_or_default();
            Some(Stamp {
                ino: 0,
                len: m.len(),
                mtime: (t.as_secs() as i64, i64::from(t.subsec_nanos())),
                ctime: (0, 0),
                mode: 0,
            })
        }
    }
}

#[derive(Debug)]
pub enum Baseline {
    /// Worktree: the loop branch's tip; everything since it is the tick's.
    Branch {
        repo: Repo,
        copy: Copy,
        base: String,
        /// What processes other than implementers changed during the tick.
        leftovers: super::leftovers::Leftovers,
    },
    /// Worktrees off, a git project: HEAD, and how each path that already differed from
    /// it looked (`None`: deleted).
    Checkout {
        repo: Repo,
        top: PathBuf,
        head: Option<String>,
        dirty: HashMap<PathBuf, Option<Stamp>>,
    },
    /// Worktrees off, no git: every file.
    Files(HashMap<PathBuf, Stamp>),
    /// More than [`FILES_CAP`] files: nothing to compare against.
    TooLarge,
}

/// Why the tick's changes cannot be told apart from what was there before it.
#[derive(Debug, thiserror::Error)]
pub enum BaselineError {
    #[error(transparent)]
    Worktree(#[from] CopyError),
    #[error("the loop's worktree is not there")]
    NoWorktree,
    #[error("{0} names no commit")]
    NoBase(String),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("more than {FILES_CAP} files under {}: the tick's changes were not checked", .0.display())]
    TooMany(PathBuf),
}

impl Baseline {
    /// Taken before the first node. `Err` says why the tick's changes cannot be told
    /// apart (a worktree that is not the loop's own any more, say): `git-commit` halts.
    pub fn take(
        worktree: Option<Option<&Repo>>,
        copy: Option<&Copy>,
        cwd: &Path,
    ) -> Result<Baseline, BaselineError> {
        if let Some(repo) = worktree {
            let (Some(repo), Some(copy)) = (repo, copy) else {
                return Err(BaselineError::NoWorktree);
            };
            let base = repo
                .rev(&copy.branch)?
                .ok_or_else(|| BaselineError::NoBase(copy.branch.clone()))?;
            return Ok(Baseline::Branch {
                repo: repo.clone(),
                copy: copy.clone(),
                base,
                leftovers: Default::default(),
            });
        }
        match checkout(cwd)? {
            Some(repo) => {
                let top = repo.top().to_path_buf();
                let head = repo.rev("HEAD")?;
                let dirty = paths_of(&repo.status(true)?)
                    .into_iter()
                    .map(|p| {
                        let s = Stamp::of(&top.join(&p));
                        (p, s)
                    })
                    .collect();
                Ok(Baseline::Checkout {
                    repo,
                    top,
                    head,
                    dirty,
                })
            }
            None => Ok(walk(cwd).map_or(Baseline::TooLarge, Baseline::Files)),
        }
    }

    /// With worktrees off: every path (absolute) the tick changed, created or deleted.
    pub fn changed_since(&self, cwd: &Path) -> Result<Vec<PathBuf>, BaselineError> {
        match self {
            Baseline::Branch { .. } | Baseline::TooLarge => Ok(Vec::new()),
            Baseline::Checkout {
                repo,
                top,
                head,
                dirty,
            } => {
                let now = paths_of(&repo.status(true)?);
                let mut out: Vec<PathBuf> = Vec::new();
                for p in &now {
                    let full = top.join(p);
                    match dirty.get(p) {
                        Some(before) if *before == Stamp::of(&full) => {}
                        _ => out.push(full),
                    }
                }
                // Dirty before, clean now: reverted or committed during the tick.
                for p in dirty.keys() {
                    if !now.contains(p) {
                        out.push(top.join(p));
                    }
                }
                // Commits made during the tick.
                if let Some(h) = head
                    && repo.rev("HEAD")?.as_deref() != Some(h.as_str())
                {
                    let changed = repo.changed_between(h, "HEAD")?;
                    out.extend(changed.into_iter().map(|p| top.join(p)));
                }
                out.sort();
                out.dedup();
                Ok(out)
            }
            Baseline::Files(before) => {
                let Some(now) = walk(cwd) else {
                    return Err(BaselineError::TooMany(cwd.to_path_buf()));
                };
                let mut out: Vec<PathBuf> = now
                    .iter()
                    .filter(|(p, s)| before.get(*p) != Some(*s))
                    .map(|(p, _)| p.clone())
                    .chain(before.keys().filter(|p| !now.contains_key(*p)).cloned())
                    .collect();
                out.sort();
                Ok(out)
            }
        }
    }
}

/// The repository `cwd` is in, if any. Without a `.git` anywhere above it git would find
/// none either, so that case costs a few `lstat`s instead of a git process every tick.
fn checkout(cwd: &Path) -> Result<Option<Repo>, GitError> {
    let abs = std::path::absolute(cwd).map_err(GitError::Spawn)?;
    if !abs
        .ancestors()
        .any(|d| std::fs::symlink_metadata(d.join(".git")).is_ok())
    {
        return Ok(None);
    }
    Repo::checkout(cwd)
}

/// Every entry under `root` but [`SKIPPED`] ones at its top, stamped; `None` past
/// [`FILES_CAP`]. Symlinks are stamped, not followed.
fn walk(root: &Path) -> Option<HashMap<PathBuf, Stamp>> {
    let mut out = HashMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            if dir == root && SKIPPED.iter().any(|s| e.file_name() == *s) {
                continue;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(path);
                continue;
            }
            if let Some(s) = Stamp::of(&path) {
                out.insert(path, s);
            }
            if out.len() > FILES_CAP {
                return None;
            }
        }
    }
    Some(out)
}
