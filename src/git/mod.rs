//! Git, run the way loopflow always runs it: the `git` CLI (so loopflow sees what the agent
//! sees), never through a shell, with hooks and fsmonitor disabled so a planted repository
//! config cannot make loopflow execute code. The questions every tick asks — where the
//! common directory is, what a branch points at — are answered from the files in
//! [`local`] where they settle it, and by git where they do not.

#[cfg(unix)]
mod clean;
pub mod credentials;
mod local;
pub mod remote;

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

#[cfg(unix)]
use std::os::unix::ffi::OsStringExt;

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

/// Why a loop's worktree is not (any more) the linked worktree it was made as: each is a
/// reason `git-commit` refuses to commit there.
#[derive(Debug, thiserror::Error)]
pub enum WorktreeError {
    #[error(
        "the worktree is a symlink; refusing to commit where it points (remove the symlink, run `git worktree prune`, then `loopflow worktree restore --loop {loop_name}`)"
    )]
    Symlink { loop_name: String },
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no linked worktrees ({source})", common.display())]
    NoWorktrees {
        common: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{} is not a worktree of the repository at {} (`loopflow worktree restore --loop {loop_name}` relinks a copied or moved one; not `git worktree repair`, which in a copied project rewrites the original's records)",
        work_tree.display(),
        common.display()
    )]
    NotLinked {
        work_tree: PathBuf,
        common: PathBuf,
        loop_name: String,
    },
    #[error(
        "{}/.git no longer points at {} (`loopflow worktree restore --loop {loop_name}` points it back where it is a copied or moved one; an agent's rewrite of `.git` is undone by `git worktree repair {0}` run in this project)",
        work_tree.display(),
        admin.display()
    )]
    Repointed {
        work_tree: PathBuf,
        admin: PathBuf,
        loop_name: String,
    },
    #[error(
        "HEAD is {head}, not {branch} (switch back with `git -C {} switch {}`, after looking at what is there)",
        work_tree.display(),
        branch.strip_prefix("refs/heads/").unwrap_or(branch)
    )]
    WrongBranch {
        work_tree: PathBuf,
        head: String,
        branch: String,
    },
}

/// Lets command-line code that reports errors as text use `?` on git calls.
impl From<GitError> for String {
    fn from(e: GitError) -> String {
        e.to_string()
    }
}

/// Variables that would point git somewhere else than the directory loopflow names (a
/// hook's environment, or one an agent's wrapper exported): never passed on.
const REDIRECTS: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
];

/// Runs git with hooks and fsmonitor disabled, so a planted config cannot execute code.
/// A non-zero exit is not an error here: see [`ok`].
pub fn git(cwd: &Path, args: &[&str]) -> Result<std::process::Output, GitError> {
    run(cwd, &[], args)
}

fn run(cwd: &Path, pre: &[&OsStr], args: &[&str]) -> Result<std::process::Output, GitError> {
    run_with(cwd, pre, args, None)
}

fn run_with(
    cwd: &Path,
    pre: &[&OsStr],
    args: &[&str],
    stdin: Option<Vec<u8>>,
) -> Result<std::process::Output, GitError> {
    run_opts(
        cwd,
        pre,
        args,
        Opts {
            stdin,
            ..Opts::default()
        },
    )
}

/// What one git process gets beyond the usual: its stdin, and (for the commands that talk
/// to a remote, [`remote`]) variables set in its environment alone — the credential.
#[derive(Default)]
struct Opts {
    stdin: Option<Vec<u8>>,
    /// Set in this process's environment only: never on its command line or in a file.
    env: Vec<(OsString, OsString)>,
    /// Variables of loopflow's environment this process does not inherit.
    remove: Vec<&'static str>,
}

fn run_opts(
    cwd: &Path,
    pre: &[&OsStr],
    args: &[&str],
    o: Opts,
) -> Result<std::process::Output, GitError> {
    let mut full: Vec<&OsStr> = vec![
        OsStr::new("-c"),
        OsStr::new("core.hooksPath=/dev/null"),
        OsStr::new("-c"),
        OsStr::new("core.fsmonitor=false"),
    ];
    full.extend_from_slice(pre);
    full.extend(args.iter().map(OsStr::new));
    let cmd = duct::cmd("git", &full).dir(cwd);
    let cmd = match o.stdin {
        Some(bytes) => cmd.stdin_bytes(bytes),
        None => cmd.stdin_null(),
    };
    let mut cmd = cmd.stdout_capture().stderr_capture().unchecked();
    for v in REDIRECTS.iter().chain(&o.remove) {
        cmd = cmd.env_remove(v);
    }
    for (k, v) in o.env {
        cmd = cmd.env(k, v);
    }
    cmd.run().map_err(GitError::Spawn)
}

/// The stdout of a finished git command, or its stderr as the error.
pub fn ok(out: std::process::Output, what: &str) -> Result<Vec<u8>, GitError> {
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(GitError::Failed {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// The object `spec` names (`git rev-parse --verify --quiet`), `None` when it names
/// none (an unborn HEAD, a missing branch).
pub fn rev(cwd: &Path, spec: &str) -> Result<Option<String>, GitError> {
    if spec.starts_with("refs/heads/")
        && let Some(found) = local::common_dir(cwd).and_then(|c| local::read_ref(&c, spec))
    {
        return Ok(found);
    }
    let out = git(cwd, &["rev-parse", "--verify", "--quiet", spec])?;
    let text = String::from_utf8_lossy(trim_newline(&out.stdout)).into_owned();
    Ok((out.status.success() && !text.is_empty()).then_some(text))
}

/// The top of the working tree `dir` is in (`git rev-parse --show-toplevel`), `None`
/// outside any (or without git).
pub fn toplevel(dir: &Path) -> Option<PathBuf> {
    let out = git(dir, &["rev-parse", "--show-toplevel"]).ok()?;
    out.status
        .success()
        .then(|| path_of(trim_newline(&out.stdout)))
        .filter(|t| t.is_dir())
}

/// The absolute common directory of `project`'s repository (the main checkout's `.git`,
/// which holds `worktrees/`), from git itself: the project may be a subdirectory, a
/// submodule or a linked worktree.
pub fn common_dir(project: &Path) -> Result<PathBuf, GitError> {
    if let Some(common) = local::common_dir(project) {
        return Ok(common);
    }
    let out = ok(
        git(
            project,
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )?,
        "rev-parse",
    )?;
    Ok(path_of(trim_newline(&out)))
}

/// The paths that differ between commits `from` and `to` of the repository at `top`
/// (`diff --name-only --no-renames`: both sides of a rename).
pub fn changed_between(top: &Path, from: &str, to: &str) -> Result<Vec<PathBuf>, GitError> {
    let raw = ok(
        git(
            top,
            &["diff", "--name-only", "-z", "--no-renames", from, to],
        )?,
        "diff",
    )?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|f| !f.is_empty())
        .map(path_of)
        .collect())
}

/// The absolute top level of the working tree `cwd` is in, as git decides it
/// (`rev-parse --show-toplevel`), `None` outside any.
pub fn show_toplevel(cwd: &Path) -> Option<PathBuf> {
    let o = git(
        cwd,
        &["rev-parse", "--path-format=absolute", "--show-toplevel"],
    )
    .ok()?;
    if !o.status.success() {
        return None;
    }
    Some(path_of(trim_newline(&o.stdout)))
}

/// A path as git prints it with `-z`: bytes, not necessarily UTF-8.
#[cfg(unix)]
pub fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(OsString::from_vec(b.to_vec()))
}

#[cfg(not(unix))]
pub fn path_of(b: &[u8]) -> PathBuf {
    PathBuf::from(String::from_utf8_lossy(b).into_owned())
}

/// Every path a commit would touch (both sides of renames), from `git status -z`, as bytes.
pub fn changed_paths(cwd: &Path) -> Result<Vec<PathBuf>, GitError> {
    let raw = ok(
        git(
            cwd,
            &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
        )?,
        "status",
    )?;
    Ok(parse_status(&raw))
}

fn parse_status(raw: &[u8]) -> Vec<PathBuf> {
    parse_entries(raw)
        .into_iter()
        .flat_map(|e| std::iter::once(e.path).chain(e.orig))
        .collect()
}

/// One entry of `git status --porcelain=v1 -z`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusEntry {
    pub path: PathBuf,
    /// A rename's or copy's source.
    pub orig: Option<PathBuf>,
    /// The worktree differs from the index here (`Y` is not a space: modified, deleted,
    /// untracked, unmerged): `add` has something to stage. A change already staged (`M `,
    /// a staged rename's `R `) has nothing left to stage.
    pub unstaged: bool,
}

fn parse_entries(raw: &[u8]) -> Vec<StatusEntry> {
    let mut out = Vec::new();
    let mut fields = raw.split(|b| *b == 0).filter(|f| !f.is_empty());
    while let Some(f) = fields.next() {
        if f.len() < 4 {
            continue;
        }
        let status = &f[..2];
        let orig = if status.contains(&b'R') || status.contains(&b'C') {
            fields.next().map(path_of)
        } else {
            None
        };
        out.push(StatusEntry {
            path: path_of(&f[3..]),
            orig,
            unstaged: status[1] != b' ',
        });
    }
    out
}

/// One entry of `git diff-tree -r -z --raw --no-renames`: a path whose blob, mode or
/// existence differs between two trees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    /// The mode after (`0` when deleted): `120000` a symlink, `160000` a gitlink (a
    /// nested repository), `100644`/`100755` a file.
    pub mode: u32,
    /// The object after (all zeros when deleted).
    pub object: String,
}

pub const MODE_SYMLINK: u32 = 0o120000;
pub const MODE_GITLINK: u32 = 0o160000;

fn parse_raw(raw: &[u8]) -> Result<Vec<Change>, GitError> {
    let bad = || GitError::Unexpected {
        what: "diff-tree".into(),
        output: String::from_utf8_lossy(&raw[..raw.len().min(200)]).into_owned(),
    };
    let mut out = Vec::new();
    let mut fields = raw.split(|b| *b == 0);
    while let Some(meta) = fields.next() {
        if meta.is_empty() {
            continue;
        }
        // `:100644 100644 <old> <new> M`, then the path.
        let meta = std::str::from_utf8(meta).map_err(|_| bad())?;
        let parts: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        let [_, dst_mode, _, dst, _] = parts[..] else {
            return Err(bad());
        };
        let mode = u32::from_str_radix(dst_mode, 8).map_err(|_| bad())?;
        let path = fields.next().ok_or_else(bad)?;
        out.push(Change {
            path: path_of(path),
            mode,
            object: dst.to_string(),
        });
    }
    Ok(out)
}

/// A loop's linked worktree, verified to be what `git worktree add` made for it: git runs
/// with its administrative directory (`<repo>/.git/worktrees/<id>`, which agents cannot
/// write) named explicitly, so an agent that rewrote the worktree's `.git` file, or
/// pointed it at a repository of its own, cannot make loopflow commit anywhere else.
#[derive(Debug, Clone)]
pub struct Linked {
    pub git_dir: PathBuf,
    /// The repository's common directory (refs, objects, `worktrees/`).
    pub common: PathBuf,
    pub work_tree: PathBuf,
    /// `refs/heads/loopflow/<name>`.
    pub branch: String,
}

/// The loop a `refs/heads/loopflow/<name>` branch belongs to (for the commands an error
/// suggests); the branch itself when it is not a loop's.
fn loop_of(branch: &str) -> String {
    branch
        .strip_prefix("refs/heads/loopflow/")
        .unwrap_or(branch)
        .to_string()
}

impl Linked {
    /// Finds `work_tree`'s administrative directory in `project`'s repository and checks
    /// that the worktree still is what it was made: a real directory whose `.git` file
    /// names that directory, on `branch`.
    pub fn open(project: &Path, work_tree: &Path, branch: &str) -> Result<Linked, WorktreeError> {
        let io = |path: PathBuf| move |source| WorktreeError::Io { path, source };
        if std::fs::symlink_metadata(work_tree).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(WorktreeError::Symlink {
                loop_name: loop_of(branch),
            });
        }
        let common = common_dir(project)?;
        let me = std::fs::canonicalize(work_tree.join(".git"))
            .or_else(|_| std::fs::canonicalize(work_tree).map(|w| w.join(".git")))
            .map_err(io(work_tree.to_path_buf()))?;
        // A record (`<admin>/gitdir`, which agents cannot write) that names this worktree.
        // git ≥ 2.48 with `worktree.useRelativePaths` writes it relative to `<admin>`.
        let names_me = |d: &Path| {
            crate::fs_safe::head(&d.join("gitdir"), 4096)
                .ok()
                .map(|b| local::relative_to(d, &b))
                .and_then(|p| std::fs::canonicalize(p).ok())
                .is_some_and(|p| p == me)
        };
        // The `.git` file in the worktree is the agent's to write: it must still point at
        // the record that names this worktree. (A relative `gitdir:` is relative to the
        // worktree, as git reads it.)
        let dotgit = crate::fs_safe::head(&work_tree.join(".git"), 4096)
            .map_err(io(work_tree.join(".git")))?;
        let named = trim_newline(&dotgit)
            .strip_prefix(b"gitdir: ")
            .map(|p| local::relative_to(work_tree, p))
            .and_then(|p| std::fs::canonicalize(p).ok());
        let records = common.join("worktrees");
        let records_dir = std::fs::canonicalize(&records).ok();
        // The record `.git` names, when it is one of this repository's and names this
        // worktree back: then no other record needs reading (one per loop in the repo).
        let direct = named.as_ref().filter(|n| {
            records_dir.is_some() && n.parent() == records_dir.as_deref() && names_me(n)
        });
        let admin = match direct {
            Some(n) => n.clone(),
            None => std::fs::read_dir(&records)
                .map_err(|source| WorktreeError::NoWorktrees {
                    common: common.clone(),
                    source,
                })?
                .flatten()
                .map(|e| e.path())
                .find(|d| names_me(d))
                .ok_or_else(|| WorktreeError::NotLinked {
                    work_tree: work_tree.to_path_buf(),
                    common: common.clone(),
                    loop_name: loop_of(branch),
                })?,
        };
        if direct.is_none() && named != std::fs::canonicalize(&admin).ok() {
            return Err(WorktreeError::Repointed {
                work_tree: work_tree.to_path_buf(),
                admin,
                loop_name: loop_of(branch),
            });
        }
        let head =
            crate::fs_safe::head(&admin.join("HEAD"), 4096).map_err(io(admin.join("HEAD")))?;
        let want = format!("ref: {branch}");
        if trim_newline(&head) != want.as_bytes() {
            return Err(WorktreeError::WrongBranch {
                work_tree: work_tree.to_path_buf(),
                head: String::from_utf8_lossy(trim_newline(&head)).into_owned(),
                branch: branch.to_string(),
            });
        }
        Ok(Linked {
            git_dir: admin,
            common,
            work_tree: work_tree.to_path_buf(),
            branch: branch.to_string(),
        })
    }

    /// Runs git on this worktree with its directories given explicitly.
    pub fn git(&self, args: &[&str]) -> Result<std::process::Output, GitError> {
        let dir = flag("--git-dir=", &self.git_dir);
        let tree = flag("--work-tree=", &self.work_tree);
        run(&self.work_tree, &[&dir, &tree], args)
    }

    /// Stages exactly `paths` (relative to the worktree, each one `status` says has
    /// something unstaged: deleted ones too) as `git add -A` would, taken literally (no
    /// glob or magic in a name means anything) and read from stdin, so any number of
    /// them fits. Staging only what
    /// `status` listed, instead of `add -A .`, keeps git from scanning the whole tree a
    /// second time: in a 50,000-file repository that scan is as long as `status` itself.
    pub fn stage(&self, paths: &[PathBuf]) -> Result<(), GitError> {
        if paths.is_empty() {
            return Ok(());
        }
        let mut list = Vec::new();
        for p in paths {
            list.extend_from_slice(p.as_os_str().as_encoded_bytes());
            list.push(0);
        }
        let dir = flag("--git-dir=", &self.git_dir);
        let tree = flag("--work-tree=", &self.work_tree);
        let literal = OsStr::new("--literal-pathspecs");
        let out = run_with(
            &self.work_tree,
            &[&dir, &tree, literal],
            &["add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"],
            Some(list),
        )?;
        ok(out, "add").map(|_| ())
    }

    /// Whether this worktree is certainly clean with HEAD at `head`, told from the index
    /// and the files without starting git (see `clean.rs`); `false` means "ask git".
    pub fn certainly_clean(&self, head: &str) -> bool {
        #[cfg(unix)]
        {
            clean::certainly_clean(&self.git_dir, &self.common, &self.work_tree, head)
        }
        #[cfg(not(unix))]
        {
            let _ = head;
            false
        }
    }

    /// Writes the index as a tree (`write-tree`); its id.
    pub fn write_tree(&self) -> Result<String, GitError> {
        let t = self.out(&["write-tree"], "write-tree")?;
        Ok(String::from_utf8_lossy(&t).trim().to_string())
    }

    /// Puts the branch and the index back on `commit`, the worktree's files left as they
    /// are (`reset --mixed`).
    pub fn reset_to(&self, commit: &str) -> Result<(), GitError> {
        self.out(&["reset", "-q", "--mixed", commit, "--"], "reset")
            .map(|_| ())
    }

    /// The subjects of the commits in `from..to`, newest first, at most `max`, each as
    /// `- <subject>`.
    pub fn subjects(&self, from: &str, to: &str, max: usize) -> Result<String, GitError> {
        let range = format!("{from}..{to}");
        let n = max.to_string();
        let log = self.out(&["log", "--format=- %s", "-n", &n, &range], "log")?;
        Ok(String::from_utf8_lossy(&log).trim_end().to_string())
    }

    /// A commit of `tree` on `parent` with `message`, by loopflow (`commit-tree`: no
    /// hooks, no branch moved); its id.
    pub fn commit_tree(&self, tree: &str, parent: &str, message: &str) -> Result<String, GitError> {
        let c = self.out(
            &[
                "-c",
                "user.name=loopflow",
                "-c",
                "user.email=loopflow@localhost",
                "commit-tree",
                tree,
                "-p",
                parent,
                "-m",
                message,
            ],
            "commit-tree",
        )?;
        Ok(String::from_utf8_lossy(&c).trim().to_string())
    }

    /// Moves the loop's branch to `new` only if it is still at `old` (`update-ref`'s
    /// compare-and-swap), with a reflog entry.
    pub fn move_branch(&self, new: &str, old: &str) -> Result<(), GitError> {
        self.out(
            &[
                "update-ref",
                "-m",
                "loopflow git-commit",
                &self.branch,
                new,
                old,
            ],
            "update-ref",
        )
        .map(|_| ())
    }

    /// [`Linked::git`], its stdout on success.
    pub fn out(&self, args: &[&str], what: &str) -> Result<Vec<u8>, GitError> {
        ok(self.git(args)?, what)
    }

    /// The object `rev` names (`rev-parse --verify`), `None` when it names nothing.
    pub fn rev(&self, rev: &str) -> Option<String> {
        if let Some(found) = local::read_ref(&self.common, rev) {
            return found;
        }
        let o = self
            .out(&["rev-parse", "--verify", "-q", rev], "rev-parse")
            .ok()?;
        let s = String::from_utf8(trim_newline(&o).to_vec()).ok()?;
        (!s.is_empty()).then_some(s)
    }

    /// What `status` reports (uncommitted, untracked), entry by entry.
    pub fn status(&self) -> Result<Vec<StatusEntry>, GitError> {
        let raw = self.out(
            &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
            "status",
        )?;
        Ok(parse_entries(&raw))
    }

    /// What differs between two trees (or commits), path by path.
    pub fn diff(&self, from: &str, to: &str) -> Result<Vec<Change>, GitError> {
        let raw = self.out(
            &[
                "diff-tree",
                "-r",
                "-z",
                "--raw",
                "--no-renames",
                "--no-abbrev",
                from,
                to,
            ],
            "diff-tree",
        )?;
        parse_raw(&raw)
    }

    /// A blob's bytes (a symlink's target), at most `cap` of them.
    pub fn blob(&self, object: &str, cap: usize) -> Result<Vec<u8>, GitError> {
        let mut b = self.out(&["cat-file", "blob", object], "cat-file")?;
        b.truncate(cap);
        Ok(b)
    }
}

fn flag(name: &str, p: &Path) -> OsString {
    let mut f = OsString::from(name);
    f.push(p.as_os_str());
    f
}

fn trim_newline(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn raw_diff_keeps_non_utf8_paths_and_modes() {
        let mut raw = b":000000 120000 0000 abcd A\0l\xffnk\0".to_vec();
        raw.extend_from_slice(b":100644 000000 1234 0000 D\0gone\0");
        let c = parse_raw(&raw).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].mode, MODE_SYMLINK);
        assert_eq!(c[0].path.as_os_str().as_bytes(), b"l\xffnk");
        assert_eq!(c[1].mode, 0);
        assert!(parse_raw(b":bad\0").is_err());
    }

    #[test]
    fn status_paths_are_bytes_and_renames_give_both_sides() {
        let p = parse_status(b"R  new\xfe\0old\0?? u\0");
        let b: Vec<&[u8]> = p.iter().map(|p| p.as_os_str().as_bytes()).collect();
        assert_eq!(b, [&b"new\xfe"[..], b"old", b"u"]);
    }
}
