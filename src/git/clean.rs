//! Whether a loop's worktree is certainly clean — what `git status` would print nothing
//! for — told from the files, so a tick whose agents changed nothing starts no `git`
//! process at all. `true` only when every check settles it; anything unusual says
//! `false` ("ask git"), never "dirty": the caller then runs `git status` as before.
//!
//! Clean means: every index entry's file is there with exactly the `lstat` data the index
//! recorded (ctime, mtime, device, inode, mode, owner, size — stricter than git, which may
//! be told to trust less), none of them racily clean (changed within the index file's
//! own timestamp); the index's cached root tree is the branch tip's tree (nothing staged);
//! and no file outside the index exists but in loopflow's self-ignoring `.loopflow-out/`.
//! Versions other than 2 and 3, split or sparse indexes, conflicts, gitlinks,
//! skip-worktree or intent-to-add entries, SHA-256 repositories, packed commits and big
//! worktrees (git is faster there) are git's to judge.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Past this many entries git's own (parallel, cached) status is the better tool.
const MAX_ENTRIES: usize = 5_000;
/// The most of an index read.
const INDEX_MAX: u64 = 16 << 20;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether the worktree at `work_tree` (administrative directory `admin`, repository
/// `common`) is certainly clean with HEAD at commit `head`.
pub(super) fn certainly_clean(admin: &Path, common: &Path, work_tree: &Path, head: &str) -> bool {
    check(admin, common, work_tree, head).unwrap_or(false)
}

fn check(admin: &Path, common: &Path, work_tree: &Path, head: &str) -> Option<bool> {
    if head.len() != 40 || !head.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Some(false);
    }
    let index_path = admin.join("index");
    let index_meta = std::fs::symlink_metadata(&index_path).ok()?;
    if !index_meta.is_file() || index_meta.len() > INDEX_MAX {
        return Some(false);
    }
    let index = crate::fs_safe::head(&index_path, INDEX_MAX).ok()?;
    // The file read must be the one stat'ed (its mtime is the racy-git line).
    if index.len() as u64 != index_meta.len() || index.get(..4)? != b"DIRC" {
        return Some(false);
    }
    let version = u32_at(&index, 4)?;
    let count = u32_at(&index, 8)? as usize;
    if !(version == 2 || version == 3) || count > MAX_ENTRIES {
        return Some(false);
    }
    let index_mtime = (index_meta.mtime(), index_meta.mtime_nsec());
    let mut names: HashSet<&[u8]> = HashSet::with_capacity(count);
    let mut at = 12;
    for _ in 0..count {
        let field = |i: usize| u32_at(&index, at + 4 * i);
        let (ctime, ctime_ns, mtime, mtime_ns) = (field(0)?, field(1)?, field(2)?, field(3)?);
        let (dev, ino, mode, uid, gid, size) = (
            field(4)?,
            field(5)?,
            field(6)?,
            field(7)?,
            field(8)?,
            field(9)?,
        );
        let flags = u16_at(&index, at + 60)?;
        let mut name_at = at + 62;
        if flags & 0x4000 != 0 {
            // An extended entry (v3): skip-worktree or intent-to-add.
            return Some(false);
        }
        if flags & 0x3000 != 0 || mode == 0o160000 {
            return Some(false); // a conflict stage or a gitlink
        }
        let len = usize::from(flags & 0x0fff);
        if len == 0x0fff {
            return Some(false); // a name too long for the length field
        }
        let name = index.get(name_at..name_at + len)?;
        name_at += len;
        // NUL-padded to a multiple of 8 from the entry's start, at least one NUL.
        let entry_len = (name_at - at + 8) & !7;
        at += entry_len;
        if name.is_empty() || name.contains(&0) {
            return Some(false);
        }
        let Ok(m) = std::fs::symlink_metadata(work_tree.join(OsStr::from_bytes(name))) else {
            return Some(false); // deleted
        };
        let same = m.ctime() as u32 == ctime
            && m.ctime_nsec() as u32 == ctime_ns
            && m.mtime() as u32 == mtime
            && m.mtime_nsec() as u32 == mtime_ns
            && m.dev() as u32 == dev
            && m.ino() as u32 == ino
            && m.uid() == uid
            && m.gid() == gid
            && m.size() as u32 == size
            && index_mode(m.mode()) == Some(mode);
        // Racily clean: written in the same instant as the index (or after it).
        let racy = (i64::from(mtime), i64::from(mtime_ns)) >= index_mtime;
        if !same || racy {
            return Some(false);
        }
        names.insert(name);
    }
    if !root_tree_is(index.get(at..)?, count, common, head)? {
        return Some(false);
    }
    Some(no_untracked(work_tree, &names))
}

/// The mode git records for a file of this `st_mode`: 100644, 100755, 120000.
fn index_mode(st_mode: u32) -> Option<u32> {
    match st_mode & 0o170000 {
        0o100000 if st_mode & 0o100 != 0 => Some(0o100755),
        0o100000 => Some(0o100644),
        0o120000 => Some(0o120000),
        _ => None,
    }
}

/// Whether the index's extensions (`ext`, up to the trailing checksum) hold a valid cached
/// root tree covering all `count` entries that is `head`'s tree.
fn root_tree_is(ext: &[u8], count: usize, common: &Path, head: &str) -> Option<bool> {
    let body = ext.get(..ext.len().checked_sub(20)?)?;
    let mut at = 0;
    let mut root = None;
    while at + 8 <= body.len() {
        let sig = &body[at..at + 4];
        let size = u32_at(body, at + 4)? as usize;
        let data = body.get(at + 8..at + 8 + size)?;
        match sig {
            b"TREE" => root = tree_root(data, count),
            // A split or sparse index: its entries are not all here.
            b"link" | b"sdir" => return Some(false),
            _ => {}
        }
        at += 8 + size;
    }
    let Some(root) = root else {
        return Some(false);
    };
    Some(commit_tree(common, head).is_some_and(|t| t == root))
}

/// The root entry of a `TREE` extension: `"" NUL <entries> SP <subtrees> LF <oid>`, its
/// tree id when valid (entries not -1) and covering every index entry.
fn tree_root(data: &[u8], count: usize) -> Option<String> {
    let rest = data.strip_prefix(b"\0")?;
    let sp = rest.iter().position(|b| *b == b' ')?;
    let entries: i64 = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
    let lf = rest.iter().position(|b| *b == b'\n')?;
    if entries < 0 || entries as usize != count {
        return None;
    }
    Some(hex(rest.get(lf + 1..lf + 21)?))
}

/// The tree of commit `oid`, from its loose object (a packed one: `None`, git's to say).
fn commit_tree(common: &Path, oid: &str) -> Option<String> {
    let path = common.join("objects").join(&oid[..2]).join(&oid[2..]);
    let raw = crate::fs_safe::head(&path, 1 << 20).ok()?;
    let data = miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(&raw, 1 << 20).ok()?;
    let nul = data.iter().position(|b| *b == 0)?;
    if !data.starts_with(b"commit ") {
        return None;
    }
    let tree = data[nul + 1..].strip_prefix(b"tree ")?.get(..40)?;
    let tree = std::str::from_utf8(tree).ok()?;
    tree.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        .then(|| tree.to_string())
}

/// Whether every file under `work_tree` is in `names`, but the top `.git` file and
/// `.loopflow-out/` when it ignores itself (`.gitignore` = `*`, as loopflow writes it).
fn no_untracked(work_tree: &Path, names: &HashSet<&[u8]>) -> bool {
    let mut stack: Vec<(std::path::PathBuf, Vec<u8>)> = vec![(work_tree.to_path_buf(), Vec::new())];
    let mut seen = 0usize;
    while let Some((dir, rel)) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return false;
        };
        for e in rd {
            let Ok(e) = e else { return false };
            let file = e.file_name();
            let mut path = rel.clone();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(file.as_bytes());
            if rel.is_empty() && file == ".git" {
                continue;
            }
            let Ok(t) = e.file_type() else { return false };
            if t.is_dir() {
                if rel.is_empty() && file.as_bytes() == crate::blast::OUTPUT_DIR.as_bytes() {
                    let ignores_all = crate::fs_safe::head(&e.path().join(".gitignore"), 64)
                        .is_ok_and(|b| b == b"*\n");
                    if ignores_all {
                        continue;
                    }
                }
                stack.push((e.path(), path));
                continue;
            }
            seen += 1;
            if seen > MAX_ENTRIES || !names.contains(path.as_slice()) {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_root_tree_counts_only_when_valid_and_whole() {
        let mut data = b"\x002 1\n".to_vec();
        data.extend_from_slice(&[0xab; 20]);
        assert_eq!(tree_root(&data, 2), Some("ab".repeat(20)));
        assert_eq!(
            tree_root(&data, 3),
            None,
            "covers fewer entries than the index"
        );
        let invalid = b"\x00-1 0\n".to_vec();
        assert_eq!(tree_root(&invalid, 2), None);
        assert_eq!(tree_root(b"src\x001 0\n", 1), None, "not the root");
    }

    #[test]
    fn a_malformed_index_is_never_clean_and_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let (admin, common, wt) = (
            dir.path().join("a"),
            dir.path().join("c"),
            dir.path().join("w"),
        );
        for d in [&admin, &common, &wt] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(wt.join("f"), "x").unwrap();
        let head = "ab".repeat(20);
        let mut entry = vec![0u8; 62];
        entry[60..62].copy_from_slice(&1u16.to_be_bytes()); // a one-byte name
        entry.push(b'f');
        let mut cases: Vec<Vec<u8>> = vec![
            Vec::new(),
            b"DIRC".to_vec(),
            b"DIRC\0\0\0\x02\0\0\0\x01".to_vec(),
            b"DIRC\0\0\0\x04\0\0\0\0".to_vec(),
        ];
        // An entry whose padding runs past the end, and one followed by a torn TREE.
        let mut past_end = b"DIRC\0\0\0\x02\0\0\0\x01".to_vec();
        past_end.extend_from_slice(&entry);
        cases.push(past_end.clone());
        let mut torn = past_end;
        torn.extend_from_slice(&[0; 7]);
        torn.extend_from_slice(b"TREE\xff\xff\xff\xff\x00");
        cases.push(torn);
        for (i, bytes) in cases.iter().enumerate() {
            std::fs::write(admin.join("index"), bytes).unwrap();
            assert!(!certainly_clean(&admin, &common, &wt, &head), "case {i}");
            for cut in 0..bytes.len() {
                std::fs::write(admin.join("index"), &bytes[..cut]).unwrap();
                assert!(
                    !certainly_clean(&admin, &common, &wt, &head),
                    "case {i} cut {cut}"
                );
            }
        }
        assert!(!certainly_clean(&admin, &common, &wt, "not hex"));
    }

    #[test]
    fn modes_are_what_git_records() {
        assert_eq!(index_mode(0o100644), Some(0o100644));
        assert_eq!(index_mode(0o100755), Some(0o100755));
        assert_eq!(index_mode(0o100744), Some(0o100755));
        assert_eq!(index_mode(0o120777), Some(0o120000));
        assert_eq!(index_mode(0o040755), None);
    }
}
