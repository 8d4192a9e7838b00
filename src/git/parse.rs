//! What git prints, read back: `status --porcelain=v1 -z` entries and `diff-tree --raw -z`
//! changes, paths kept as bytes (a name need not be UTF-8).

use std::path::PathBuf;

use super::{GitError, path_of};

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
    /// The two status letters (`XY`: `??` untracked, ` M` modified, `D ` staged deletion, …).
    pub code: [u8; 2],
}

impl StatusEntry {
    /// The path as `status --porcelain` prints it for people: `XY path` (a rename as
    /// `orig -> path`), lossily decoded.
    pub fn line(&self) -> String {
        let code = String::from_utf8_lossy(&self.code);
        match &self.orig {
            Some(o) => format!("{code} {} -> {}", o.display(), self.path.display()),
            None => format!("{code} {}", self.path.display()),
        }
    }
}

pub(super) fn parse_entries(raw: &[u8]) -> Vec<StatusEntry> {
    let mut out = Vec::new();
    let mut fields = raw.split(|b| *b == 0).filter(|f| !f.is_empty());
    while let Some(f) = fields.next() {
        if f.len() < 4 {
            continue;
        }
        let code = [f[0], f[1]];
        let orig = if code.contains(&b'R') || code.contains(&b'C') {
            fields.next().map(path_of)
        } else {
            None
        };
        out.push(StatusEntry {
            path: path_of(&f[3..]),
            orig,
            unstaged: code[1] != b' ',
            code,
        });
    }
    out
}

/// Every path of a status listing, both sides of renames.
pub(crate) fn paths_of(entries: &[StatusEntry]) -> Vec<PathBuf> {
    entries
        .iter()
        .flat_map(|e| std::iter::once(e.path.clone()).chain(e.orig.clone()))
        .collect()
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

pub(crate) const MODE_SYMLINK: u32 = 0o120000;
pub(crate) const MODE_GITLINK: u32 = 0o160000;

pub(super) fn parse_raw(raw: &[u8]) -> Result<Vec<Change>, GitError> {
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
        let e = parse_entries(b"R  new\xfe\0old\0?? u\0");
        let p = paths_of(&e);
        let b: Vec<&[u8]> = p.iter().map(|p| p.as_os_str().as_bytes()).collect();
        assert_eq!(b, [&b"new\xfe"[..], b"old", b"u"]);
        assert_eq!(e[0].line(), "R  old -> new\u{fffd}");
        assert!(!e[0].unstaged);
        assert!(e[1].unstaged);
    }
}
