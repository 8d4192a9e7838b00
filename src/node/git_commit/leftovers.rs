//! What a tick's processes other than its implementers leave in the worktree (DESIGN §9): a
//! verifier's test scratch, an orchestrator's notes, a `command` node's build output that
//! the project does not ignore. Marks — the worktree's changed paths as `git status` lists
//! them, each `lstat`ed — are taken before and after every such process; a path whose
//! mark moved was theirs. `git-commit` leaves those out of the tick's commit and puts
//! them back as they were, unless an implementer changed them again afterwards (its
//! mark moved once more).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::baseline::Stamp;
use crate::git::{GitError, Repo};

/// A path as a mark sees it: not listed (clean), or listed with its `lstat` (`None`:
/// deleted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Clean,
    Listed(Option<Stamp>),
}

/// The changed paths of the worktree at one moment.
type Mark = HashMap<PathBuf, Option<Stamp>>;

/// One path a process other than an implementer changed.
#[derive(Debug, Clone)]
pub struct Left {
    /// How that process left it.
    pub after: Seen,
    /// Whether it was already changed (by an implementer) before that process ran: its
    /// implementer's content is then not known any more.
    pub changed_before: bool,
    /// The node whose process changed it.
    pub node: String,
}

#[derive(Debug, Default)]
struct Inner {
    /// The last mark and the spawn count it was taken at: reused while no process ran.
    last: Option<(u64, Mark)>,
    /// The mark taken before the process running now.
    before: Option<Mark>,
    left: BTreeMap<PathBuf, Left>,
}

/// The marks of one tick's worktree.
#[derive(Debug, Default)]
pub struct Leftovers {
    inner: Mutex<Inner>,
}

impl Leftovers {
    fn mark(
        &self,
        repo: &Repo,
        branch: &str,
        base: &str,
        inner: &mut Inner,
    ) -> Result<Mark, GitError> {
        let spawns = crate::process::spawn_count();
        if let Some((at, m)) = &inner.last
            && *at == spawns
        {
            return Ok(m.clone());
        }
        let work_tree = repo.top();
        // HEAD is the branch (checked when the worktree was opened), read from the files.
        let mark: Mark = if repo.rev(branch)?.as_deref() == Some(base) && repo.certainly_clean(base)
        {
            Mark::new()
        } else {
            crate::git::paths_of(&repo.status(true)?)
                .into_iter()
                .map(|p| {
                    let s = Stamp::of(&work_tree.join(&p));
                    (p, s)
                })
                .collect()
        };
        inner.last = Some((spawns, mark.clone()));
        Ok(mark)
    }

    /// Before a process that is not an implementer runs.
    pub fn before(&self, repo: &Repo, branch: &str, base: &str) -> Result<(), GitError> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let m = self.mark(repo, branch, base, &mut inner)?;
        inner.before = Some(m);
        Ok(())
    }

    /// After it: every path whose mark moved was its.
    pub fn after(&self, node: &str, repo: &Repo, branch: &str, base: &str) -> Result<(), GitError> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Some(before) = inner.before.take() else {
            return Ok(());
        };
        let after = self.mark(repo, branch, base, &mut inner)?;
        let seen = |m: &Mark, p: &Path| m.get(p).map_or(Seen::Clean, |s| Seen::Listed(*s));
        let paths: Vec<PathBuf> = before.keys().chain(after.keys()).cloned().collect();
        for p in paths {
            let (b, a) = (seen(&before, &p), seen(&after, &p));
            if b != a {
                let changed_before =
                    b != Seen::Clean || inner.left.get(&p).is_some_and(|l| l.changed_before);
                inner.left.insert(
                    p,
                    Left {
                        after: a,
                        changed_before,
                        node: node.to_string(),
                    },
                );
            }
        }
        Ok(())
    }

    /// The paths left by processes other than implementers, as they still are in
    /// `work_tree`, whose changed paths `status` now lists as `listed`: those an
    /// implementer changed again since are its work.
    pub fn take(
        &self,
        work_tree: &Path,
        listed: &std::collections::HashSet<PathBuf>,
    ) -> BTreeMap<PathBuf, Left> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut inner.left)
            .into_iter()
            .filter(|(p, l)| {
                let now = if listed.contains(p) {
                    Seen::Listed(Stamp::of(&work_tree.join(p)))
                } else {
                    Seen::Clean
                };
                now == l.after
            })
            .collect()
    }
}
