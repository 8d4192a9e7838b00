//! Git, run the way loopflow always runs it: the `git` CLI (so loopflow sees what the
//! agent sees), never through a shell, every command through one runner ([`run`]) that
//! names the repository itself and turns off everything a planted file could make git
//! run. Repositories are [`Repo`]s: the user's checkout, or a loop's own repository
//! ([`copy`]). The questions every tick asks — what a branch points at, whether a
//! worktree is clean — are answered from the files in [`local`] and [`clean`] where they
//! settle it, and by git where they do not. No other module builds a git command line.

#[cfg(unix)]
mod clean;
mod copy;
pub(crate) mod credentials;
mod local;
mod parse;
pub(crate) mod remote;
mod repo;
mod run;

use std::path::{Path, PathBuf};

#[cfg(unix)]
use std::ffi::OsString;
#[cfg(unix)]
use std::os::unix::ffi::OsStringExt;

pub(crate) use copy::{CopySettings, LOOPFLOW_IDENTITY, linked_worktrees};
pub(crate) use parse::{Change, MODE_GITLINK, MODE_SYMLINK, StatusEntry, paths_of};
pub(crate) use repo::{Repo, init_scratch, version};

/// A git command that could not run, or said no.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git: {0}")]
    Spawn(#[source] std::io::Error),
    /// `git <what>` exited non-zero; `stderr` is what it said.
    #[error("git {what}: {stderr}")]
    Failed { what: String, stderr: String },
    #[error("unexpected `git {what}` output: {output:?}")]
    Unexpected { what: String, output: String },
}

/// Why a loop's own repository is not (any more) what loopflow made: each is a reason
/// `git-commit` refuses to commit there.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error(
        "the worktree is a symlink; refusing to commit where it points (remove the symlink, then `loopflow worktree restore --loop {loop_name}`)"
    )]
    Symlink { loop_name: String },
    #[error(
        "{} is not the loop's repository any more (`loopflow worktree restore --loop {loop_name}` makes it again from the branch)",
        git_dir.display()
    )]
    Missing { git_dir: PathBuf, loop_name: String },
    #[error(
        "HEAD is {head}, not {branch} (loopflow moves the loop's branch itself; `loopflow worktree restore --loop {loop_name}` puts HEAD back)",
        branch = branch.strip_prefix("refs/heads/").unwrap_or(branch)
    )]
    WrongBranch {
        head: String,
        branch: String,
        loop_name: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Git(#[from] GitError),
}

/// The stdout of a finished git command, or its stderr as the error.
pub(crate) fn ok(out: std::process::Output, what: &str) -> Result<Vec<u8>, GitError> {
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(GitError::Failed {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The top of the work tree `dir` is in (the user's checkout), `None` outside any.
pub(crate) fn toplevel(dir: &Path) -> Option<PathBuf> {
    Repo::checkout(dir)
        .ok()
        .flatten()
        .and_then(|r| r.work_tree)
        .filter(|t| t.is_dir())
}

/// The object `spec` names in the user's repository `dir` is in (`rev-parse --verify`),
/// `None` when it names none; an error outside any repository.
pub(crate) fn rev(dir: &Path, spec: &str) -> Result<Option<String>, GitError> {
    match Repo::checkout(dir)? {
        Some(r) => r.rev(spec),
        None => Err(GitError::Failed {
            what: "rev-parse".into(),
            stderr: format!("{} is not in a git repository", dir.display()),
        }),
    }
}

/// A path as git prints it with `-z`: bytes, not necessarily UTF-8.
#[cfg(unix)]
pub(crate) fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(b.to_vec()))
}

#[cfg(not(unix))]
pub fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(b).into_owned())
}

impl Repo {
    /// Whether this work tree is certainly clean with HEAD at `head`, told from the index
    /// and the files without starting git (see `clean.rs`); `false` means "ask git".
    pub fn certainly_clean(&self, head: &str) -> bool {
        #[cfg(unix)]
        {
            match &self.work_tree {
                Some(w) => clean::certainly_clean(&self.git_dir, &self.common, w, head),
                None => false,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = head;
            false
        }
    }
}

fn trim_newline(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}
