//! A loop's own repository: a git directory that loopflow owns (agents may read it, never
//! write it) holding only the history of the loop's branch, and a work tree beside it,
//! outside the user's checkout. It is made from the user's repository by fetching that
//! one branch (so stashes, reflogs and unreachable objects never come along), and the
//! loop's commits go back the same way. Its configuration and `info/attributes` are
//! loopflow's: no hooks, no fsmonitor, no submodule recursion, no filter, diff or merge
//! driver for any path — for loopflow's git and for the user's own `git status` in the
//! work tree alike.

use std::path::{Path, PathBuf};

use super::GitError;
use super::repo::Repo;
use super::run::Git;

/// Attributes of highest precedence in a loop's repository: every path's filter, diff
/// and merge driver unset, whatever a `.gitattributes` an agent wrote says.
const ATTRIBUTES: &str = "# written by loopflow: no filter, diff or merge driver runs on a loop's files\n* !filter !diff !merge\n";

/// What a loop's repository is made with.
pub struct CopySettings<'a> {
    /// `user.name` and `user.email` its commits carry (the user's repository's own).
    pub identity: (&'a str, &'a str),
    /// `info/exclude`: what git never lists as untracked there.
    pub exclude: &'a str,
}

/// The identity loopflow commits with where a repository has none.
pub(crate) const LOOPFLOW_IDENTITY: (&str, &str) = ("loopflow", "loopflow@localhost");

impl Repo {
    /// The identity this repository's commits carry (`user.name`, `user.email` as git
    /// resolves them here), `None` where either is unset.
    pub fn identity(&self) -> Option<(String, String)> {
        let out = self
            .git()
            .args(["config", "--get-regexp", r"^user\.(name|email)$"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut name = None;
        let mut email = None;
        for line in text.lines() {
            match line.split_once(' ') {
                Some(("user.name", v)) => name = Some(v.to_string()),
                Some(("user.email", v)) => email = Some(v.to_string()),
                _ => {}
            }
        }
        Some((name?, email?))
    }

    /// Makes a loop's own repository at `git_dir`, with its work tree at `work_tree`
    /// (both must not exist, or be empty), holding `branch` (`refs/heads/…`) as fetched
    /// from `source`, checked out.
    pub fn make_copy(
        source: &Repo,
        branch: &str,
        git_dir: &Path,
        work_tree: &Path,
        settings: &CopySettings<'_>,
    ) -> Result<Repo, GitError> {
        let parent = work_tree.parent().unwrap_or(work_tree);
        std::fs::create_dir_all(parent).map_err(GitError::Spawn)?;
        // No template: nothing of the user's `init.templateDir` (hooks) comes along.
        Git::bare(parent)
            .args(["init", "--quiet", "--template="])
            .arg(super::run::flag("--separate-git-dir=", git_dir))
            .arg(work_tree)
            .ok("init")?;
        let copy = Repo::copy(git_dir, work_tree);
        copy.write_settings(settings)?;
        copy.fetch_branch(&source.common, branch, true)?;
        copy.set_head(branch)?;
        copy.checkout_head()?;
        Ok(copy)
    }

    /// Writes loopflow's configuration, `info/attributes` and `info/exclude` into this
    /// (loop's) repository.
    pub fn write_settings(&self, settings: &CopySettings<'_>) -> Result<(), GitError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |e: std::io::Error| GitError::Failed {
                what: format!("write {}", p.display()),
                stderr: e.to_string(),
            }
        };
        let info = self.git_dir.join("info");
        std::fs::create_dir_all(&info).map_err(io(&info))?;
        let attributes = info.join("attributes");
        crate::fs_safe::write_atomic(&info, &attributes, ATTRIBUTES.as_bytes())
            .map_err(io(&attributes))?;
        self.write_exclude(settings.exclude)?;
        let config = self.git_dir.join("config");
        let mut text = std::fs::read_to_string(&config).map_err(io(&config))?;
        if !text.contains("\n# loopflow\n") {
            let (name, email) = settings.identity;
            text.push_str(&format!(
                "\n# loopflow\n[core]\n\thooksPath = /dev/null\n\tfsmonitor = false\n[submodule]\n\trecurse = false\n[diff]\n\tignoreSubmodules = all\n[status]\n\tsubmoduleSummary = false\n[gc]\n\tauto = 0\n[maintenance]\n\tauto = false\n[user]\n\tname = {}\n\temail = {}\n",
                quoted(name),
                quoted(email)
            ));
            crate::fs_safe::write_atomic(&self.git_dir, &config, text.as_bytes())
                .map_err(io(&config))?;
        }
        Ok(())
    }

    /// Rewrites `info/exclude` when it differs from `text` (one read when it does not).
    pub fn write_exclude(&self, text: &str) -> Result<(), GitError> {
        let info = self.git_dir.join("info");
        let path = info.join("exclude");
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text) {
            return Ok(());
        }
        crate::fs_safe::write_atomic(&info, &path, text.as_bytes()).map_err(|e| GitError::Failed {
            what: format!("write {}", path.display()),
            stderr: e.to_string(),
        })
    }

    /// Fetches branch `branch` (`refs/heads/…`) of the repository whose common directory
    /// is `from` into the same branch here: a fast-forward only, unless `force`.
    pub fn fetch_branch(&self, from: &Path, branch: &str, force: bool) -> Result<(), GitError> {
        let spec = format!("{}{branch}:{branch}", if force { "+" } else { "" });
        self.git()
            .args([
                "fetch",
                "--quiet",
                "--no-tags",
                "--no-write-fetch-head",
                "--no-recurse-submodules",
                // The branch may be checked out here (a loop's own repository): its files
                // are put right by the caller.
                "--update-head-ok",
                // A shallow source (a CI checkout's `fetch-depth: 1`) makes this one
                // shallow too, instead of refusing the ref.
                "--update-shallow",
            ])
            .arg(from)
            .arg(spec)
            .ok("fetch")
            .map(|_| ())
    }

    /// Fetches commit `sha` (and its history) from the repository whose common directory
    /// is `from`, no ref moved: for a `reset` onto it next.
    pub fn fetch_object(&self, from: &Path, sha: &str) -> Result<(), GitError> {
        if self.rev(&format!("{sha}^{{commit}}"))?.is_some() {
            return Ok(());
        }
        self.git()
            .args([
                "fetch",
                "--quiet",
                "--no-tags",
                "--no-write-fetch-head",
                "--no-recurse-submodules",
                "--update-shallow",
            ])
            .arg(from)
            .arg(sha)
            .ok("fetch")
            .map(|_| ())
    }

    /// Moves the index and the files from commit `from` to commit `to` (`read-tree -u -m`,
    /// a two-tree merge: uncommitted changes are kept where they do not collide); what
    /// git said when it refused.
    pub fn switch_files(&self, from: &str, to: &str) -> Result<(), String> {
        let out = self
            .git_files()
            .map_err(|e| e.to_string())?
            .args(["read-tree", "-u", "-m", from, to])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    /// Index and files as HEAD has them, untracked files left alone (`read-tree -u
    /// --reset`).
    pub fn checkout_head(&self) -> Result<(), GitError> {
        self.git_files()?
            .args(["read-tree", "-u", "--reset", "HEAD"])
            .ok("read-tree")
            .map(|_| ())
    }
}

/// A configuration value in double quotes, with git's escapes (`\\`, `\"`; a line break
/// would end the value, so it becomes a space).
fn quoted(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' | '\r' => s.push(' '),
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// The `.git` file a loop's work tree holds: it names the loop's git directory.
pub(super) fn dotgit_text(git_dir: &Path) -> String {
    format!("gitdir: {}\n", git_dir.display())
}

impl Repo {
    /// A loop's own repository, checked to be what loopflow made: the work tree a real
    /// directory, the git directory one too, HEAD on `branch`. Its work tree's `.git`,
    /// which an agent can rewrite, is put back when it names anything else; the second
    /// value says whether it had to be.
    pub fn open_copy(
        git_dir: &Path,
        work_tree: &Path,
        branch: &str,
        loop_name: &str,
    ) -> Result<(Repo, bool), super::CopyError> {
        use super::CopyError;
        let is_link =
            |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
        if is_link(work_tree) {
            return Err(CopyError::Symlink {
                loop_name: loop_name.to_string(),
            });
        }
        let head = match crate::fs_safe::head(&git_dir.join("HEAD"), 4096) {
            Ok(h) if !is_link(git_dir) => h,
            _ => {
                return Err(CopyError::Missing {
                    git_dir: git_dir.to_path_buf(),
                    loop_name: loop_name.to_string(),
                });
            }
        };
        let want = format!("ref: {branch}");
        if super::trim_newline(&head) != want.as_bytes() {
            return Err(CopyError::WrongBranch {
                head: String::from_utf8_lossy(super::trim_newline(&head)).into_owned(),
                branch: branch.to_string(),
                loop_name: loop_name.to_string(),
            });
        }
        let repaired = restore_dotgit(git_dir, work_tree).map_err(|source| CopyError::Io {
            path: work_tree.join(".git"),
            source,
        })?;
        Ok((Repo::copy(git_dir, work_tree), repaired))
    }
}

/// Makes `<work_tree>/.git` the file naming `git_dir` again when it is anything else (a
/// file naming another repository, a directory, a link); whether it had to. The new file
/// is created beside it and renamed over it: never written through a link.
pub(super) fn restore_dotgit(git_dir: &Path, work_tree: &Path) -> std::io::Result<bool> {
    let dotgit = work_tree.join(".git");
    let want = dotgit_text(git_dir);
    let meta = std::fs::symlink_metadata(&dotgit);
    if meta.as_ref().is_ok_and(|m| m.is_file())
        && crate::fs_safe::head(&dotgit, 4096).ok().as_deref() == Some(want.as_bytes())
    {
        return Ok(false);
    }
    if !work_tree.is_dir() {
        return Ok(false);
    }
    if meta.is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir_all(&dotgit)?;
    }
    let tmp = work_tree.join(".git.loopflow-restore");
    let _ = std::fs::remove_file(&tmp);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(want.as_bytes())?;
    }
    std::fs::rename(&tmp, &dotgit)?;
    Ok(true)
}

/// The linked worktrees of a repository, as `git worktree list --porcelain` gives them:
/// (path, branch), for the loops that still live in the old layout.
pub(crate) fn linked_worktrees(repo: &Repo) -> Result<Vec<(PathBuf, Option<String>)>, GitError> {
    let out = repo
        .git()
        .args(["worktree", "list", "--porcelain", "-z"])
        .ok("worktree list")?;
    let mut all = Vec::new();
    let mut cur: Option<(PathBuf, Option<String>)> = None;
    for field in out.split(|b| *b == 0) {
        if let Some(p) = field.strip_prefix(b"worktree ") {
            all.extend(cur.take());
            cur = Some((super::path_of(p), None));
        } else if let Some(b) = field.strip_prefix(b"branch ")
            && let Some(w) = cur.as_mut()
        {
            let b = String::from_utf8_lossy(b);
            w.1 = Some(b.trim_start_matches("refs/heads/").to_string());
        }
    }
    all.extend(cur);
    Ok(all)
}

impl Repo {
    /// A linked worktree of this repository in the old layout, named by its
    /// administrative directory (`<common>/worktrees/<id>`) and its path.
    pub fn linked(&self, admin: &Path, work_tree: &Path) -> Repo {
        let mut r = self.clone();
        r.git_dir = admin.to_path_buf();
        r.work_tree = Some(work_tree.to_path_buf());
        r
    }

    /// Removes a linked worktree and its record (`worktree remove --force --force`).
    pub fn remove_linked(&self, work_tree: &Path) -> Result<(), GitError> {
        self.git()
            .args(["worktree", "remove", "--force", "--force"])
            .arg(work_tree)
            .ok("worktree remove")
            .map(|_| ())
    }

    /// Drops the records of linked worktrees whose directory is gone.
    pub fn prune_linked(&self) -> Result<(), GitError> {
        self.git()
            .args(["worktree", "prune"])
            .ok("worktree prune")
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_quoted_as_git_reads_them() {
        assert_eq!(quoted("Ada Lovelace"), "\"Ada Lovelace\"");
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(quoted("x\ny"), "\"x y\"");
    }
}
