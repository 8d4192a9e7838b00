//! [`Repo`]: a repository loopflow runs git in, named by its directories, and the
//! questions and changes loopflow asks of it, one typed method each.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::parse::{Change, StatusEntry, parse_entries, parse_raw};
use super::run::Git;
use super::{GitError, local, path_of, trim_newline};

/// Whose repository it is, which decides how its drivers are turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The user's own checkout (the project): its configuration is the user's, so the
    /// filter and merge drivers it configures are overridden on the command line.
    Checkout,
    /// A loop's own repository: loopflow wrote its configuration and its
    /// `info/attributes`, which unsets every driver for every path.
    Copy,
}

/// A repository, its directories named on every git command line.
#[derive(Debug, Clone)]
pub struct Repo {
    /// The git directory of this work tree (HEAD, index).
    pub git_dir: PathBuf,
    /// The common directory (refs, objects): the git directory itself but in a linked
    /// worktree.
    pub common: PathBuf,
    pub work_tree: Option<PathBuf>,
    kind: Kind,
    /// `-c` settings that turn off the drivers the user's configuration defines (read
    /// once, at the first command that could run one).
    drivers: OnceLock<Vec<OsString>>,
}

/// A commit as `log` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub sha: String,
    pub author: String,
    pub at: String,
    pub subject: String,
}

impl Repo {
    /// The repository `dir` is in (the user's checkout), found from the files where they
    /// settle it and by git where they do not; `None` outside any repository or where
    /// there is no work tree.
    pub fn checkout(dir: &Path) -> Result<Option<Repo>, GitError> {
        if let Some(f) = local::discover(dir) {
            return Ok(Some(Repo::of_checkout(f.git_dir, f.common, f.top)));
        }
        // The one command that lets git find a repository: in the user's own checkout,
        // which no agent writes to (loops work in repositories of their own).
        let out = Git::bare(dir)
            .args([
                "rev-parse",
                "--path-format=absolute",
                "--absolute-git-dir",
                "--git-common-dir",
                "--show-toplevel",
            ])
            .output()?;
        if !out.status.success() {
            return Ok(None);
        }
        let lines: Vec<PathBuf> = out
            .stdout
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(path_of)
            .collect();
        match &lines[..] {
            [git_dir, common, top] => Ok(Some(Repo::of_checkout(
                git_dir.clone(),
                common.clone(),
                top.clone(),
            ))),
            _ => Ok(None),
        }
    }

    fn of_checkout(git_dir: PathBuf, common: PathBuf, top: PathBuf) -> Repo {
        Repo {
            git_dir,
            common,
            work_tree: Some(top),
            kind: Kind::Checkout,
            drivers: OnceLock::new(),
        }
    }

    /// A loop's own repository: its git directory and work tree, as loopflow made them.
    pub fn copy(git_dir: &Path, work_tree: &Path) -> Repo {
        Repo {
            git_dir: git_dir.to_path_buf(),
            common: git_dir.to_path_buf(),
            work_tree: Some(work_tree.to_path_buf()),
            kind: Kind::Copy,
            drivers: OnceLock::new(),
        }
    }

    /// The top of the work tree (the git directory when there is none).
    pub fn top(&self) -> &Path {
        self.work_tree.as_deref().unwrap_or(&self.git_dir)
    }

    /// A command on this repository for which no driver can run (refs, objects, plumbing
    /// on trees).
    pub(super) fn git(&self) -> Git {
        Git::repo(&self.git_dir, self.work_tree.as_deref())
    }

    /// A command that reads or writes files of the work tree, where a filter, merge or
    /// diff driver could run: in the user's checkout, every driver its configuration
    /// defines is turned off first.
    pub(super) fn git_files(&self) -> Result<Git, GitError> {
        let g = self.git();
        if self.kind == Kind::Copy {
            return Ok(g);
        }
        if self.drivers.get().is_none() {
            let _ = self.drivers.set(self.configured_drivers()?);
        }
        Ok(g.configs(self.drivers.get().into_iter().flatten()))
    }

    /// `-c` overrides for every filter and merge driver the configuration defines.
    fn configured_drivers(&self) -> Result<Vec<OsString>, GitError> {
        let out = self
            .git()
            .args([
                "config",
                "--name-only",
                "--get-regexp",
                r"^(filter|merge)\..+\.(clean|smudge|process|driver|required)$",
            ])
            .output()?;
        // Exit 1: none configured.
        let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        Ok(names
            .into_iter()
            .map(|n| match n.strip_suffix(".required") {
                Some(base) => format!("{base}.required=false").into(),
                None => format!("{n}=").into(),
            })
            .collect())
    }

    /// The object `spec` names (`rev-parse --verify --quiet`), `None` when it names none
    /// (an unborn HEAD, a missing branch). A branch is read from the files where they
    /// settle it.
    pub fn rev(&self, spec: &str) -> Result<Option<String>, GitError> {
        if let Some(found) = local::read_ref(&self.common, spec) {
            return Ok(found);
        }
        let out = self
            .git()
            .args(["rev-parse", "--verify", "--quiet", spec])
            .output()?;
        let text = String::from_utf8_lossy(trim_newline(&out.stdout)).into_owned();
        Ok((out.status.success() && !text.is_empty()).then_some(text))
    }

    /// The branch HEAD is on (`main`), `None` when detached.
    pub fn current_branch(&self) -> Option<String> {
        let out = self
            .git()
            .args(["symbolic-ref", "--quiet", "--short", "HEAD"])
            .ok("symbolic-ref")
            .ok()?;
        let b = String::from_utf8_lossy(&out).trim().to_string();
        (!b.is_empty()).then_some(b)
    }

    /// What `status` reports (uncommitted, untracked; submodules never entered), entry
    /// by entry.
    pub fn status(&self, untracked: bool) -> Result<Vec<StatusEntry>, GitError> {
        let raw = self
            .git_files()?
            .args([
                "status",
                "--porcelain=v1",
                "-z",
                "--ignore-submodules=all",
                if untracked {
                    "--untracked-files=all"
                } else {
                    "--untracked-files=no"
                },
            ])
            .ok("status")?;
        Ok(parse_entries(&raw))
    }

    /// Stages exactly `paths` (relative to the work tree, each one `status` says has
    /// something unstaged: deleted ones too) as `git add -A` would, taken literally (no
    /// glob or magic in a name means anything) and read from stdin, so any number of
    /// them fits. Staging only what `status` listed, instead of `add -A .`, keeps git
    /// from scanning the whole tree a second time.
    pub fn stage(&self, paths: &[PathBuf]) -> Result<(), GitError> {
        if paths.is_empty() {
            return Ok(());
        }
        let list = nul_list(paths);
        self.git_files()?
            .global("--literal-pathspecs")
            .args(["add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"])
            .stdin(list)
            .ok("add")
            .map(|_| ())
    }

    /// Puts `paths` (relative to the work tree) back as HEAD has them, in the index and
    /// the files (`checkout HEAD --`, taken literally).
    pub fn restore_from_head(&self, paths: &[PathBuf]) -> Result<(), GitError> {
        if paths.is_empty() {
            return Ok(());
        }
        let list = nul_list(paths);
        self.git_files()?
            .global("--literal-pathspecs")
            .args([
                "checkout",
                "-q",
                "HEAD",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
            ])
            .stdin(list)
            .ok("checkout")
            .map(|_| ())
    }

    /// Writes the index as a tree (`write-tree`); its id.
    pub fn write_tree(&self) -> Result<String, GitError> {
        let t = self.git().arg("write-tree").ok("write-tree")?;
        Ok(String::from_utf8_lossy(&t).trim().to_string())
    }

    /// Puts HEAD's branch and the index on `commit`, the files left as they are
    /// (`reset --mixed`).
    pub fn reset_mixed(&self, commit: &str) -> Result<(), GitError> {
        self.git_files()?
            .args(["reset", "-q", "--mixed", commit, "--"])
            .ok("reset")
            .map(|_| ())
    }

    /// Puts HEAD's branch, the index and the files on `commit` (`reset --hard`).
    pub fn reset_hard(&self, commit: &str) -> Result<(), GitError> {
        self.git_files()?
            .args(["reset", "--quiet", "--hard", commit])
            .ok("reset --hard")
            .map(|_| ())
    }

    /// Moves HEAD's branch to `commit`, keeping uncommitted changes (`reset --keep`
    /// refuses rather than lose one); what git said when it refused.
    pub fn reset_keep(&self, commit: &str) -> Result<Result<(), String>, GitError> {
        let out = self
            .git_files()?
            .args(["reset", "--quiet", "--keep", commit])
            .output()?;
        Ok(if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        })
    }

    /// Removes untracked files and directories (`clean -d --force`; ignored ones stay).
    pub fn clean_untracked(&self) -> Result<(), GitError> {
        self.git()
            .args(["clean", "--quiet", "-d", "--force"])
            .ok("clean")
            .map(|_| ())
    }

    /// The subjects of the commits in `range`, each as `- <subject>`, oldest first when
    /// `reverse`, at most `max`.
    pub fn subjects(&self, range: &str, max: usize, reverse: bool) -> Result<String, GitError> {
        let n = max.to_string();
        let mut g = self.git().args(["log", "--format=- %s", "-n", &n]);
        if reverse {
            g = g.arg("--reverse");
        }
        let log = g.arg(range).ok("log")?;
        Ok(String::from_utf8_lossy(&log).trim_end().to_string())
    }

    /// A commit of `tree` on `parent` with `message` (`commit-tree`: no hooks, no branch
    /// moved), by this repository's configured identity; its id.
    pub fn commit_tree(&self, tree: &str, parent: &str, message: &str) -> Result<String, GitError> {
        let c = self
            .git()
            .args(["commit-tree", tree, "-p", parent, "-m", message])
            .ok("commit-tree")?;
        Ok(String::from_utf8_lossy(&c).trim().to_string())
    }

    /// Moves `refname` to `new` only if it is still at `old` (`update-ref`'s
    /// compare-and-swap; an empty `old` means "must not exist"), with a reflog entry.
    pub fn move_ref(&self, refname: &str, new: &str, old: &str, why: &str) -> Result<(), GitError> {
        self.git()
            .args(["update-ref", "-m", why, refname, new, old])
            .ok("update-ref")
            .map(|_| ())
    }

    /// Points HEAD at branch `refname` (`symbolic-ref`), without touching the files.
    pub fn set_head(&self, refname: &str) -> Result<(), GitError> {
        self.git()
            .args(["symbolic-ref", "HEAD", refname])
            .ok("symbolic-ref")
            .map(|_| ())
    }

    /// What differs between two trees (or commits), path by path.
    pub fn diff_tree(&self, from: &str, to: &str) -> Result<Vec<Change>, GitError> {
        let raw = self
            .git()
            .args([
                "diff-tree",
                "-r",
                "-z",
                "--raw",
                "--no-renames",
                "--no-abbrev",
                from,
                to,
            ])
            .ok("diff-tree")?;
        parse_raw(&raw)
    }

    /// The paths that differ between commits `from` and `to` (both sides of a rename).
    pub fn changed_between(&self, from: &str, to: &str) -> Result<Vec<PathBuf>, GitError> {
        let raw = self
            .git()
            .args([
                "diff",
                "--no-ext-diff",
                "--no-textconv",
                "--name-only",
                "-z",
            ])
            .args(["--no-renames", from, to])
            .ok("diff")?;
        Ok(raw
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .map(path_of)
            .collect())
    }

    /// A blob's bytes (a symlink's target), at most `cap` of them.
    pub fn blob(&self, object: &str, cap: usize) -> Result<Vec<u8>, GitError> {
        let mut b = self
            .git()
            .args(["cat-file", "blob", object])
            .ok("cat-file")?;
        b.truncate(cap);
        Ok(b)
    }

    /// Whether commit `a` is an ancestor of (or is) `b`.
    pub fn is_ancestor(&self, a: &str, b: &str) -> bool {
        self.git()
            .args(["merge-base", "--is-ancestor", a, b])
            .succeeds()
            .unwrap_or(false)
    }

    /// The best common ancestor of `a` and `b`.
    pub fn merge_base(&self, a: &str, b: &str) -> Option<String> {
        let out = self
            .git()
            .args(["merge-base", a, b])
            .ok("merge-base")
            .ok()?;
        let s = String::from_utf8_lossy(&out).trim().to_string();
        (!s.is_empty()).then_some(s)
    }

    /// How many commits `range` holds (`rev-list --count`).
    pub fn count(&self, range: &str) -> Option<usize> {
        let out = self
            .git()
            .args(["rev-list", "--count", range])
            .ok("rev-list")
            .ok()?;
        String::from_utf8_lossy(&out).trim().parse().ok()
    }

    /// The commits `revs` selects (newest first), at most `max`, with `log`'s own
    /// options before them (`--author=…`, `--since=…`).
    pub fn log(&self, opts: &[&str], revs: &[&str], max: usize) -> Result<Vec<LogEntry>, GitError> {
        let n = max.to_string();
        let out = self
            .git()
            .args(["log", "-z", "--format=%H%x1f%an%x1f%aI%x1f%s", "-n", &n])
            .args(opts)
            .args(revs)
            .arg("--")
            .ok("log")?;
        Ok(out
            .split(|b| *b == 0)
            .filter(|r| !r.is_empty())
            .filter_map(|r| {
                let r = String::from_utf8_lossy(r);
                let mut f = r.trim_start_matches('\n').split('\x1f');
                Some(LogEntry {
                    sha: f.next()?.to_string(),
                    author: f.next()?.to_string(),
                    at: f.next()?.to_string(),
                    subject: f.next().unwrap_or("").to_string(),
                })
            })
            .collect())
    }

    /// The last commit of HEAD's history that touched any of `paths`.
    pub fn last_change(&self, paths: &[&str]) -> Result<Option<String>, GitError> {
        let out = self
            .git()
            .args(["log", "-1", "--format=%H", "--"])
            .args(paths)
            .output()?;
        let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok((out.status.success() && !s.is_empty()).then_some(s))
    }

    /// A diff between two commits as text, with `extra` options (`--stat=100`,
    /// `--numstat`); never through an external diff program or a textconv driver.
    pub fn diff_text(
        &self,
        extra: &[&str],
        from: &str,
        to: Option<&str>,
    ) -> Result<String, GitError> {
        let mut g = self
            .git()
            .args(["diff", "--no-color", "--no-ext-diff", "--no-textconv", "-M"])
            .args(extra)
            .arg(from);
        if let Some(t) = to {
            g = g.arg(t);
        }
        let out = g.arg("--").ok("diff")?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Files a merge of `theirs` into HEAD would conflict in, computed without touching
    /// the work tree (`merge-tree --write-tree`, git ≥ 2.38): `Some([])` for a clean
    /// merge, `None` when git cannot tell.
    pub fn merge_conflicts(&self, theirs: &str) -> Option<Vec<String>> {
        let out = self
            .git_files()
            .ok()?
            .args([
                "merge-tree",
                "--write-tree",
                "--name-only",
                "-z",
                "HEAD",
                theirs,
            ])
            .output()
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

    /// `git merge` of `theirs` into HEAD (`--no-ff` with `message`, or `--squash`), by
    /// `identity` when the repository has none of its own; git's complaint when it fails.
    pub fn merge(
        &self,
        theirs: &str,
        squash: bool,
        message: &str,
        identity: &[&str],
    ) -> Result<Result<(), String>, GitError> {
        let mut g = self
            .git_files()?
            .configs(identity)
            .args(["merge", "--quiet"]);
        g = if squash {
            g.arg("--squash")
        } else {
            g.args(["--no-ff", "--no-edit", "-m", message])
        };
        let out = g.arg(theirs).output()?;
        Ok(out
            .status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }

    /// Commits the index with `message` (no hooks, `--no-verify`); git's complaint when
    /// it fails.
    pub fn commit_index(
        &self,
        message: &str,
        identity: &[&str],
    ) -> Result<Result<(), String>, GitError> {
        let out = self
            .git_files()?
            .configs(identity)
            .args(["commit", "--quiet", "--no-verify", "-m", message])
            .output()?;
        Ok(out
            .status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string()))
    }

    /// Abandons a merge in progress (best effort).
    pub fn merge_abort(&self) {
        if let Ok(g) = self.git_files() {
            let _ = g.args(["merge", "--abort"]).output();
        }
    }

    /// A configuration value as git resolves it for this repository (`config --get`).
    pub fn config(&self, key: &str) -> Option<String> {
        let out = self
            .git()
            .args(["config", "--get", key])
            .ok("config")
            .ok()?;
        let s = String::from_utf8_lossy(trim_newline(&out)).into_owned();
        (!s.is_empty()).then_some(s)
    }

    /// The files git sees in the work tree, tracked and untracked but not ignored
    /// (`ls-files -co --exclude-standard`).
    pub fn files(&self) -> Result<Vec<PathBuf>, GitError> {
        let out = self
            .git()
            .args(["ls-files", "-co", "--exclude-standard", "-z"])
            .ok("ls-files")?;
        Ok(out
            .split(|b| *b == 0)
            .filter(|f| !f.is_empty())
            .map(path_of)
            .collect())
    }

    /// Where `dir` sits below the top of the work tree (`rev-parse --show-prefix`: `""`
    /// at the top, else `"sub/dir/"`).
    pub fn prefix_of(&self, dir: &Path) -> Option<String> {
        let out = self
            .git()
            .cwd(dir)
            .args(["rev-parse", "--show-prefix"])
            .ok("rev-parse")
            .ok()?;
        Some(String::from_utf8_lossy(&out).trim().to_string())
    }

    /// Whether the repository has any remote.
    pub fn has_remote(&self) -> Result<bool, GitError> {
        let out = self.git().arg("remote").ok("remote")?;
        Ok(!String::from_utf8_lossy(&out).trim().is_empty())
    }

    /// Branches under `refs/heads/<prefix>`, short names.
    pub fn branches(&self, prefix: &str) -> Result<Vec<String>, GitError> {
        let out = self
            .git()
            .args(["for-each-ref", "--format=%(refname:short)"])
            .arg(format!("refs/heads/{prefix}"))
            .ok("for-each-ref")?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Deletes branch `name` (`-d`: only when merged into HEAD, unless `force`); git's
    /// refusal when it does not.
    pub fn delete_branch(&self, name: &str, force: bool) -> Result<Result<(), String>, GitError> {
        let flag = if force { "-D" } else { "-d" };
        let out = self.git().args(["branch", flag, name]).output()?;
        Ok(if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr)
                .trim()
                .lines()
                .next()
                .unwrap_or("git refused")
                .to_string())
        })
    }
}

/// A new repository at `dir` on `branch`, with an identity of its own and no commit
/// signing: a throw-away project's (the demo's), which a user's global settings must not
/// stop.
pub(crate) fn init_scratch(
    dir: &Path,
    branch: &str,
    identity: (&str, &str),
) -> Result<Repo, GitError> {
    Git::bare(dir)
        .args(["init", "-q", "-b", branch])
        .ok("init")?;
    let repo = Repo::checkout(dir)?.ok_or_else(|| GitError::Failed {
        what: "init".into(),
        stderr: format!("no repository at {} after init", dir.display()),
    })?;
    for (k, v) in [
        ("user.name", identity.0),
        ("user.email", identity.1),
        ("commit.gpgsign", "false"),
    ] {
        repo.git().args(["config", k, v]).ok("config")?;
    }
    Ok(repo)
}

impl Repo {
    /// Stages `paths` and commits them with `message` (no hooks).
    pub fn commit_paths(&self, paths: &[&str], message: &str) -> Result<(), GitError> {
        self.git_files()?
            .arg("add")
            .arg("--")
            .args(paths)
            .ok("add")?;
        self.git_files()?
            .args(["commit", "-q", "--no-verify", "-m", message])
            .ok("commit")
            .map(|_| ())
    }
}

/// What `git --version` says (`git version 2.47.3`), and its major and minor numbers;
/// `None` without a git that runs.
pub(crate) fn version() -> Option<(String, (u32, u32))> {
    let out = Git::bare(Path::new("/"))
        .arg("--version")
        .ok("--version")
        .ok()?;
    let text = String::from_utf8_lossy(&out).trim().to_string();
    let v = text.strip_prefix("git version ")?;
    let mut n = v.split(['.', ' ']).map(|p| p.parse::<u32>().ok());
    let numbers = (n.next()??, n.next()??);
    Some((text, numbers))
}

/// `paths` as `--pathspec-from-file=- --pathspec-file-nul` reads them: each followed by NUL.
fn nul_list(paths: &[PathBuf]) -> Vec<u8> {
    let mut list = Vec::new();
    for p in paths {
        list.extend_from_slice(p.as_os_str().as_encoded_bytes());
        list.push(0);
    }
    list
}
