//! What loopflow reads from a repository without starting git: where its common directory
//! is and what a branch points at. These are the questions every tick asks (twice, in a
//! worktree loop), and each `git` process costs more than the rest of a tick's own work.
//!
//! Each answer is given only where the files on disk settle it the way git would read
//! them; anything else — a repository owned by someone else (git's `safe.directory`), a
//! search that would cross a filesystem, reftable refs, a symbolic or malformed ref — is
//! `None`, and the caller asks the `git` CLI instead. So this never disagrees with git: it
//! answers less often.

use std::path::{Path, PathBuf};

use super::{path_of, trim_newline};

/// The most bytes read of a `.git` file, a `commondir` file or a loose ref.
const SMALL: u64 = 4096;
/// The most bytes of `packed-refs` read; a larger one is left to git.
const PACKED_MAX: u64 = 64 << 20;

/// A repository as git would find it from a directory: its git directory (the
/// worktree's own, which holds HEAD and the index), its common directory (refs,
/// objects) and the top of its work tree, all canonical.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    pub git_dir: PathBuf,
    pub common: PathBuf,
    pub top: PathBuf,
}

/// The repository `dir` is in, found as git finds it (`.git` in `dir` or the nearest
/// ancestor: a directory, or a file naming one, whose `commondir` names the main `.git`
/// for a linked worktree).
pub(super) fn discover(dir: &Path) -> Option<Found> {
    let start = std::path::absolute(dir).ok()?;
    let dev = device(&start)?;
    for d in start.ancestors() {
        // git stops at a filesystem boundary (unless told otherwise): let it decide there.
        if device(d)? != dev {
            return None;
        }
        let dotgit = d.join(".git");
        let Ok(meta) = std::fs::metadata(&dotgit) else {
            continue;
        };
        let git_dir = if meta.is_dir() {
            dotgit
        } else {
            gitdir_file(&dotgit)?
        };
        let git_dir = std::fs::canonicalize(git_dir).ok()?;
        if !ours(&git_dir) || !git_dir.join("HEAD").is_file() {
            return None;
        }
        let common = match crate::fs_safe::head(&git_dir.join("commondir"), SMALL) {
            Ok(b) => std::fs::canonicalize(relative_to(&git_dir, &b)).ok()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => git_dir.clone(),
            Err(_) => return None,
        };
        let top = std::fs::canonicalize(d).ok()?;
        return ours(&common).then_some(Found {
            git_dir,
            common,
            top,
        });
    }
    None
}

/// The directory a `.git` file (`gitdir: <path>`) names, a relative path taken from the
/// file's own directory as git takes it.
pub(super) fn gitdir_file(file: &Path) -> Option<PathBuf> {
    let b = crate::fs_safe::head(file, SMALL).ok()?;
    let target = trim_newline(&b).strip_prefix(b"gitdir: ")?;
    Some(relative_to(file.parent()?, target))
}

/// `path` (bytes from a git file, its trailing newline already cut or not) as an absolute
/// path, a relative one joined onto `base`.
pub(super) fn relative_to(base: &Path, path: &[u8]) -> PathBuf {
    let p = path_of(trim_newline(path));
    if p.is_absolute() { p } else { base.join(p) }
}

/// The object id branch `refname` (`refs/heads/...`, which every worktree shares) points
/// at in the repository whose common directory is `common`: `Some(None)` when git would
/// find no such ref, `None` when only git can say.
pub(super) fn read_ref(common: &Path, refname: &str) -> Option<Option<String>> {
    let short = refname.strip_prefix("refs/heads/")?;
    if short
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == ".." || c.starts_with('.'))
        || common.join("reftable").exists()
    {
        return None;
    }
    if let Some(oid) = loose(common, refname)? {
        return Some(Some(oid));
    }
    let packed = match crate::fs_safe::head(&common.join("packed-refs"), PACKED_MAX + 1) {
        Ok(b) if b.len() as u64 <= PACKED_MAX => b,
        Ok(_) => return None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(_) => return None,
    };
    // Where the full name names nothing, `rev-parse` goes on to try it as a short name
    // (`refs/refs/heads/x`, `refs/tags/refs/heads/x`, ...): any of those existing is git's
    // to resolve.
    let dwim: Vec<String> = ["refs/", "refs/tags/", "refs/heads/", "refs/remotes/"]
        .iter()
        .map(|p| format!("{p}{refname}"))
        .chain([format!("refs/remotes/{refname}/HEAD")])
        .collect();
    let mut found = None;
    for line in packed.split(|b| *b == b'\n') {
        if line.first().is_none_or(|c| *c == b'#' || *c == b'^') {
            continue;
        }
        let mut parts = line.splitn(2, |b| *b == b' ');
        let (Some(oid), Some(name)) = (parts.next(), parts.next()) else {
            return None;
        };
        if name == refname.as_bytes() {
            found = Some(object_id(oid)?);
        } else if dwim.iter().any(|d| d.as_bytes() == name) {
            return None;
        }
    }
    if found.is_none() {
        for d in &dwim {
            if std::fs::symlink_metadata(common.join(d)).is_ok() {
                return None;
            }
        }
    }
    Some(found)
}

/// A loose ref's object id: `Some(None)` when there is no such file.
fn loose(common: &Path, refname: &str) -> Option<Option<String>> {
    match crate::fs_safe::head(&common.join(refname), SMALL) {
        Ok(b) => object_id(trim_newline(&b)).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(None),
        // A directory where the ref would be (`refs/heads/a` when `a/b` exists), or a
        // component that is a file: git's to say.
        Err(_) => None,
    }
}

/// A full hexadecimal object id (SHA-1 or SHA-256), lowercase as git writes it.
fn object_id(b: &[u8]) -> Option<String> {
    let hex = |c: &u8| c.is_ascii_digit() || (b'a'..=b'f').contains(c);
    ((b.len() == 40 || b.len() == 64) && b.iter().all(hex))
        .then(|| String::from_utf8_lossy(b).into_owned())
}

#[cfg(unix)]
fn device(p: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(p).ok().map(|m| m.dev())
}

#[cfg(not(unix))]
fn device(p: &Path) -> Option<u64> {
    std::fs::metadata(p).ok().map(|_| 0)
}

/// Whether this process's user owns `dir`, which is when git trusts a repository without
/// a `safe.directory` entry; for any other owner git's configuration decides.
#[cfg(unix)]
fn ours(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    std::fs::metadata(dir).is_ok_and(|m| m.uid() == me)
}

#[cfg(not(unix))]
fn ours(_: &Path) -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_are_read_loose_then_packed_and_odd_ones_left_to_git() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path();
        let a = "a".repeat(40);
        let b = "b".repeat(40);
        std::fs::create_dir_all(c.join("refs/heads/loopflow")).unwrap();
        std::fs::write(c.join("refs/heads/loopflow/x"), format!("{a}\n")).unwrap();
        std::fs::write(
            c.join("packed-refs"),
            format!(
                "# pack-refs with: peeled fully-peeled sorted\n{b} refs/heads/loopflow/y\n^{a}\n"
            ),
        )
        .unwrap();
        assert_eq!(read_ref(c, "refs/heads/loopflow/x"), Some(Some(a.clone())));
        assert_eq!(read_ref(c, "refs/heads/loopflow/y"), Some(Some(b)));
        assert_eq!(read_ref(c, "refs/heads/loopflow/z"), Some(None));
        assert_eq!(read_ref(c, "refs/heads/../../HEAD"), None);
        assert_eq!(read_ref(c, "HEAD"), None);
        assert_eq!(read_ref(c, "refs/tags/v1"), None);
        std::fs::create_dir_all(c.join("refs/tags/refs/heads/loopflow")).unwrap();
        std::fs::write(c.join("refs/tags/refs/heads/loopflow/z"), format!("{a}\n")).unwrap();
        assert_eq!(
            read_ref(c, "refs/heads/loopflow/z"),
            None,
            "git's short-name rules"
        );
        std::fs::write(c.join("refs/heads/sym"), "ref: refs/heads/main\n").unwrap();
        assert_eq!(read_ref(c, "refs/heads/sym"), None);
        std::fs::create_dir(c.join("reftable")).unwrap();
        assert_eq!(read_ref(c, "refs/heads/loopflow/x"), None);
    }
}
