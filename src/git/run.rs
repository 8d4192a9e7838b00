//! The one place a `git` process is started. Every command line names the repository
//! itself (`--git-dir`, and `--work-tree` where there is one: a worktree's `.git` file is
//! an agent's to rewrite, so git never discovers a repository loopflow runs it in) and
//! turns off everything a planted file could make git run or wait on: hooks, the
//! fsmonitor, pagers, submodule recursion, credential helpers and prompts, automatic
//! maintenance; external diff programs and textconv are off on every diff loopflow asks
//! for (`--no-ext-diff --no-textconv`: an empty `diff.external` would make git fail). Filter, textconv and merge drivers are turned off per repository (see
//! [`Repo`](super::Repo)): by `info/attributes` in a loop's own repository, by `-c`
//! overrides of the configured drivers in the user's checkout. The environment loses
//! every variable that would point git elsewhere or add configuration.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use super::GitError;

/// Configuration every git process gets on its command line, whatever its repository's
/// files or the environment say.
const HARDENED: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.pager=cat",
    "submodule.recurse=false",
    "status.submoduleSummary=false",
    "fetch.recurseSubmodules=false",
    "push.recurseSubmodules=no",
    "protocol.ext.allow=never",
    "gc.auto=0",
    "maintenance.auto=false",
];

/// Added unless a command may use the user's credentials: an empty value clears the
/// list of helpers git would run.
const NO_CREDENTIALS: &str = "credential.helper=";

/// Variables that would point git somewhere else than the directories loopflow names,
/// feed it configuration, or make it run a program: never passed on.
const SCRUBBED: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_DISCOVERY_ACROSS_FILESYSTEM",
    "GIT_CONFIG",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_EXTERNAL_DIFF",
    "GIT_DIFF_OPTS",
    "GIT_PAGER",
    "GIT_EDITOR",
    "GIT_SEQUENCE_EDITOR",
    "GIT_ASKPASS",
    "SSH_ASKPASS",
    "GIT_ATTR_SOURCE",
    "GIT_REPLACE_REF_BASE",
    "GIT_QUARANTINE_PATH",
];

/// One git command, built up and then run once.
#[must_use]
pub(super) struct Git {
    cwd: PathBuf,
    pre: Vec<OsString>,
    args: Vec<OsString>,
    stdin: Option<Vec<u8>>,
    env: Vec<(OsString, OsString)>,
    credentials: bool,
}

impl Git {
    /// A command run in `cwd` with no repository named: for commands that make one or
    /// need none (`init`, `--version`). Everything else goes through [`Git::repo`].
    pub(super) fn bare(cwd: &Path) -> Git {
        Git {
            cwd: cwd.to_path_buf(),
            pre: Vec::new(),
            args: Vec::new(),
            stdin: None,
            env: Vec::new(),
            credentials: false,
        }
    }

    /// A command on the repository whose git directory is `git_dir` (and work tree
    /// `work_tree`, when the command needs one), run from the work tree (else the git
    /// directory).
    pub(super) fn repo(git_dir: &Path, work_tree: Option<&Path>) -> Git {
        let mut g = Git::bare(work_tree.unwrap_or(git_dir));
        g.pre.push(flag("--git-dir=", git_dir));
        if let Some(w) = work_tree {
            g.pre.push(flag("--work-tree=", w));
        }
        g
    }

    /// Runs from `cwd` instead (pathspecs and `--show-prefix` are relative to it).
    pub(super) fn cwd(mut self, cwd: &Path) -> Git {
        self.cwd = cwd.to_path_buf();
        self
    }

    /// More `-c key=value` settings for this command (driver overrides).
    pub(super) fn configs<I, S>(mut self, settings: I) -> Git
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for s in settings {
            self.pre.push("-c".into());
            self.pre.push(s.as_ref().to_os_string());
        }
        self
    }

    /// An option that goes before the subcommand (`--literal-pathspecs`).
    pub(super) fn global(mut self, opt: &str) -> Git {
        self.pre.push(opt.into());
        self
    }

    pub(super) fn args<I, S>(mut self, args: I) -> Git
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    pub(super) fn arg(mut self, arg: impl AsRef<OsStr>) -> Git {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub(super) fn stdin(mut self, bytes: Vec<u8>) -> Git {
        self.stdin = Some(bytes);
        self
    }

    /// A variable for this git process alone (a credential for the remote).
    pub(super) fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Git {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// Lets this command use the user's own credential helpers (a fetch or push to the
    /// loop's remote, with the user's git setup as its credential). Never for a command
    /// on a tree an agent wrote.
    pub(super) fn with_credentials(mut self) -> Git {
        self.credentials = true;
        self
    }

    /// The full argument list after `git` (for tests and error messages).
    pub(super) fn argv(&self) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec!["--no-pager".into()];
        v.extend(self.pre.iter().cloned());
        for c in HARDENED {
            v.push("-c".into());
            v.push((*c).into());
        }
        if !self.credentials {
            v.push("-c".into());
            v.push(NO_CREDENTIALS.into());
        }
        v.extend(self.args.iter().cloned());
        v
    }

    /// Runs it to the end; a non-zero exit is an `Output`, not an error (see [`Git::ok`]).
    pub(super) fn output(self) -> Result<Output, GitError> {
        let mut cmd = Command::new("git");
        cmd.args(self.argv()).current_dir(&self.cwd);
        for v in SCRUBBED {
            cmd.env_remove(v);
        }
        cmd.env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_PAGER", "cat")
            .env("PAGER", "cat");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group: a terminal's Ctrl-C reaches loopflow, which decides.
            cmd.process_group(0);
        }
        let Some(input) = self.stdin else {
            cmd.stdin(Stdio::null());
            return cmd.output().map_err(GitError::Spawn);
        };
        cmd.stdin(Stdio::piped());
        let mut child = cmd.spawn().map_err(GitError::Spawn)?;
        let writer = child.stdin.take().map(|mut w| {
            std::thread::spawn(move || {
                use std::io::Write;
                let _ = w.write_all(&input);
            })
        });
        let out = child.wait_with_output().map_err(GitError::Spawn);
        if let Some(w) = writer {
            let _ = w.join();
        }
        out
    }

    /// Runs it; its stdout when it succeeds, else what it said as the error.
    pub(super) fn ok(self, what: &str) -> Result<Vec<u8>, GitError> {
        super::ok(self.output()?, what)
    }

    /// Runs it; whether it exited 0 (for questions git answers with its exit code).
    pub(super) fn succeeds(self) -> Result<bool, GitError> {
        Ok(self.output()?.status.success())
    }
}

pub(super) fn flag(name: &str, p: &Path) -> OsString {
    let mut f = OsString::from(name);
    f.push(p.as_os_str());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_names_its_repository_and_turns_everything_off() {
        let g = Git::repo(Path::new("/r/.git"), Some(Path::new("/w"))).args(["status", "-z"]);
        let argv: Vec<String> = g
            .argv()
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(argv[0], "--no-pager");
        assert_eq!(argv[1], "--git-dir=/r/.git");
        assert_eq!(argv[2], "--work-tree=/w");
        for c in HARDENED.iter().chain([&NO_CREDENTIALS]) {
            let at = argv.iter().position(|a| a == c).expect(c);
            assert_eq!(argv[at - 1], "-c", "{c}");
        }
        assert_eq!(&argv[argv.len() - 2..], ["status", "-z"]);
        let with = Git::repo(Path::new("/r"), None)
            .with_credentials()
            .arg("fetch");
        assert!(!with.argv().iter().any(|a| a == NO_CREDENTIALS));
    }
}
