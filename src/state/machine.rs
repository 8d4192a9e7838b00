//! What loopflow keeps on this machine rather than in a project: under
//! `$XDG_STATE_HOME/loopflow` (an absolute value only), else `~/.local/state/loopflow` —
//! loops' worktrees, their agents' own state, usage limits — each project's under a key
//! a person can read and no two checkouts share.

use std::path::{Path, PathBuf};

/// `$XDG_STATE_HOME/loopflow`, else `~/.local/state/loopflow`; `None` when neither
/// variable is set (absolute).
pub(crate) fn base() -> Option<PathBuf> {
    let abs = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    std::env::var_os("XDG_STATE_HOME")
        .and_then(abs)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(abs)
                .map(|h| h.join(".local").join("state"))
        })
        .map(|b| b.join("loopflow"))
}

/// `project`, links and `..` resolved (as written where it does not exist).
pub(crate) fn real(project: &Path) -> PathBuf {
    project
        .canonicalize()
        .unwrap_or_else(|_| crate::fs_safe::normalize(project))
}

/// `<project directory's name>-<12 hex of its resolved path's hash>`: a person can tell
/// projects apart, and no two checkouts share one.
pub(crate) fn project_key(project: &Path) -> String {
    let project = real(project);
    let label: String = project
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .take(40)
        .collect();
    let label = label.trim_start_matches('.');
    let label = if label.is_empty() { "project" } else { label };
    let hash = blake3::hash(project.as_os_str().as_encoded_bytes()).to_hex();
    format!("{label}-{}", &hash.as_str()[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_readable_and_differ_by_path() {
        let a = project_key(Path::new("/x/my proj"));
        assert!(a.starts_with("my_proj-"), "{a}");
        assert_eq!(a.len(), "my_proj-".len() + 12);
        assert_ne!(a, project_key(Path::new("/y/my proj")));
        assert!(project_key(Path::new("/x/.hidden")).starts_with("hidden-"));
        assert!(project_key(Path::new("/")).starts_with("project-"));
    }
}
