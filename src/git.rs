//! Git, run the way loopflow always runs it: the `git` CLI (so loopflow sees what the agent
//! sees), never through a shell, with hooks and fsmonitor disabled so a planted repository
//! config cannot make loopflow execute code.

use std::path::Path;

/// Runs git with hooks and fsmonitor disabled, so a planted config cannot execute code.
pub fn git(cwd: &Path, args: &[&str]) -> Result<std::process::Output, String> {
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
        .map_err(|e| format!("git: {e}"))
}

pub fn ok(out: std::process::Output, what: &str) -> Result<Vec<u8>, String> {
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "git {what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Every path a commit would touch (both sides of renames), from `git status -z`.
pub fn changed_paths(cwd: &Path) -> Result<Vec<String>, String> {
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
