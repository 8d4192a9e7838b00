//! Git, run the way loopflow always runs it: the `git` CLI (so loopflow sees what the agent
//! sees), never through a shell, with hooks and fsmonitor disabled so a planted repository
//! config cannot make loopflow execute code.

use std::path::Path;

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

/// Lets command-line code that reports errors as text use `?` on git calls.
impl From<GitError> for String {
    fn from(e: GitError) -> String {
        e.to_string()
    }
}

/// Runs git with hooks and fsmonitor disabled, so a planted config cannot execute code.
/// A non-zero exit is not an error here: see [`ok`].
pub fn git(cwd: &Path, args: &[&str]) -> Result<std::process::Output, GitError> {
    let mut full = vec![
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.fsmonitor=false",
    ];
    full.extend_from_slice(args);
    duct::cmd("git", &full)
        .dir(cwd)
        .stdin_null()
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .run()
        .map_err(GitError::Spawn)
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

/// Every path a commit would touch (both sides of renames), from `git status -z`.
pub fn changed_paths(cwd: &Path) -> Result<Vec<String>, GitError> {
    let raw = ok(
        git(
            cwd,
            &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
        )?,
        "status",
    )?;
    let mut out = Vec::new();
    let mut fields = raw.split(|b| *b == 0).filter(|f| !f.is_empty());
    while let Some(f) = fields.next() {
        if f.len() < 4 {
            continue;
        }
        let status = &f[..2];
        out.push(String::from_utf8_lossy(&f[3..]).into_owned());
        if (status.contains(&b'R') || status.contains(&b'C'))
            && let Some(orig) = fields.next()
        {
            out.push(String::from_utf8_lossy(orig).into_owned());
        }
    }
    Ok(out)
}
