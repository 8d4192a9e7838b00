//! Safe file access. Agents write the files loopflow reads back (their stdout, output
//! files, the backlog, even a config they should not touch) and may swap one for a
//! gigabyte file, a symlink to `/dev/zero` or a hard link to something else: no read may
//! exhaust memory or hang, and no write may land outside the file loopflow meant.
//! Bounded reads, `O_NOFOLLOW` opens, exclusive creation, and atomic replace live here.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The most of a node's stdout the verdict parser reads: its last 1 MiB (the verdict is
/// usually the last thing a verifier prints).
pub(crate) const VERDICT_TAIL: u64 = 1 << 20;

/// The largest text file (a config, prompt, backlog, state, agent output file) loopflow
/// reads whole.
pub(crate) const TEXT_MAX: u64 = 16 << 20;

/// Opens `path` for reading without ever blocking, and only if it is a regular file: a
/// FIFO an agent put in place of a prompt or the state would hang a plain `open`, and a
/// device could be endless.
pub(crate) fn open_regular(path: &Path) -> io::Result<File> {
    open_regular_len(path).map(|(f, _)| f)
}

/// [`open_regular`], with the file's length (from the same `fstat`).
pub(crate) fn open_regular_len(path: &Path) -> io::Result<(File, u64)> {
    let mut o = OpenOptions::new();
    o.read(true);
    nonblocking(&mut o);
    let f = o.open(path)?;
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(not_regular());
    }
    Ok((f, m.len()))
}

fn not_regular() -> io::Error {
    io::Error::other("is not a regular file; loopflow reads and writes only regular files here")
}

/// Appends at most `cap` bytes read from `f`'s position to `out`, for a file that had
/// `len` bytes from there when it was `fstat`ed: reads into a buffer of `len + 1` bytes
/// until it holds the `len` bytes counted (the end the `fstat` saw: no second, empty read
/// to confirm it), the reader ends sooner (the file shrank), or the buffer fills (the
/// file grew: then on to the end or `cap`, as `read_to_end` would). A short read is never
/// taken for the end, which some filesystems (FUSE direct I/O) return mid-file, and a
/// file whose size says 0 (procfs) is still read to its end.
pub(crate) fn read_capped(
    f: &mut impl Read,
    len: u64,
    cap: u64,
    out: &mut Vec<u8>,
) -> io::Result<()> {
    let fit = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let want = fit(len.min(cap)).saturating_add(1).min(fit(cap));
    let start = out.len();
    out.resize(start + want, 0);
    let mut got = 0;
    while got < want {
        match f.read(&mut out[start + got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        }
        if got as u64 == len {
            break;
        }
    }
    out.truncate(start + got);
    if got < want || got as u64 >= cap {
        return Ok(());
    }
    f.take(cap - got as u64).read_to_end(out).map(|_| ())
}

/// Refuses anything but a regular file.
pub(crate) fn regular(f: &File) -> io::Result<()> {
    regular_meta(&f.metadata()?)
}

/// [`regular`], from metadata already at hand.
pub(crate) fn regular_meta(m: &std::fs::Metadata) -> io::Result<()> {
    if m.is_file() {
        Ok(())
    } else {
        Err(not_regular())
    }
}

/// Adds `O_NONBLOCK`: opening a FIFO never waits for its other end.
pub(crate) fn nonblocking(o: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK);
    }
    o
}

/// At most the first `cap` bytes of `path`.
pub(crate) fn head(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let (mut f, len) = open_regular_len(path)?;
    let mut out = Vec::new();
    read_capped(&mut f, len, cap, &mut out)?;
    Ok(out)
}

/// At most the last `cap` bytes of `path`.
pub(crate) fn tail(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let (mut f, len) = open_regular_len(path)?;
    if len > cap {
        f.seek(SeekFrom::Start(len - cap))?;
    }
    let mut out = Vec::new();
    read_capped(&mut f, len.min(cap), cap, &mut out)?;
    Ok(out)
}

/// A whole text file, refused when it is larger than [`TEXT_MAX`] (or endless).
pub(crate) fn read_to_string(path: &Path) -> io::Result<String> {
    let bytes = head(path, TEXT_MAX + 1)?;
    if bytes.len() as u64 > TEXT_MAX {
        return Err(io::Error::other(format!(
            "larger than {} MiB; loopflow does not read files that large",
            TEXT_MAX >> 20
        )));
    }
    String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Adds `O_NOFOLLOW` and `O_NONBLOCK`: opening a path whose last component is a
/// symlink fails (`ELOOP`), and opening a FIFO never waits. Callers then check that what
/// they opened is a regular file ([`regular`]).
pub(crate) fn nofollow(o: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    o
}

/// A file with a second name elsewhere (a hard link an agent planted) is not loopflow's
/// to append to.
pub(crate) fn refuse_hard_link_meta(m: &std::fs::Metadata) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if m.nlink() > 1 {
            return Err(io::Error::other(
                "has more than one hard link; loopflow never writes through one (remove it)",
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = m;
    Ok(())
}

/// Creates a file loopflow owns (a node's stdout, stderr, prompt) afresh: whatever sits at
/// `path` (a planted symlink or hard link included) is unlinked first, then the file is
/// created exclusively, so nothing outside the loop directory is ever truncated or written.
pub(crate) fn create_owned(path: &Path) -> io::Result<File> {
    let create = || nofollow(OpenOptions::new().write(true).create_new(true)).open(path);
    // Nearly always nothing is there: the exclusive create alone, and the unlink only
    // when it finds something.
    match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        other => return other,
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    create()
}

/// [`create_owned`], then writes `bytes`.
pub(crate) fn write_owned(path: &Path, bytes: &[u8]) -> io::Result<()> {
    create_owned(path)?.write_all(bytes)
}

/// The temp files of [`write_atomic`] begin with this, then the writer's pid and a dot:
/// a tick can tell the leftovers of a killed writer from a write in progress.
pub(crate) const TEMP_PREFIX: &str = ".state.tmp";

/// Replaces `path` (in `dir`) with `bytes` atomically: a reader sees the old file or the
/// new one, never part of it, and after a crash the file is one or the other (the data
/// and the directory entry are synced). The temp file is private (0600) and so is the
/// result; loopflow's own state files are.
pub fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_atomic_as(
        dir,
        path,
        bytes,
        &format!("{TEMP_PREFIX}.{}.", std::process::id()),
        false,
    )
}

/// The one atomic writer ([`write_atomic`]), its temp file named `prefix…` and, when
/// `shared`, the result readable by everyone (0644: a page the user publishes).
pub(crate) fn write_atomic_as(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    prefix: &str,
    shared: bool,
) -> io::Result<()> {
    let mut tmp = tempfile::Builder::new().prefix(prefix).tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    #[cfg(unix)]
    if shared {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    #[cfg(not(unix))]
    let _ = shared;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// `a/./b/../c` → `a/c`: `.` removed and `..` resolved lexically, without touching the
/// file system (for a path, or the part of one, that may not exist).
pub(crate) fn normalize(p: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_and_tails() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, "0123456789").unwrap();
        assert_eq!(head(&p, 4).unwrap(), b"0123");
        assert_eq!(tail(&p, 4).unwrap(), b"6789");
        assert_eq!(tail(&p, 40).unwrap(), b"0123456789");
        assert_eq!(read_to_string(&p).unwrap(), "0123456789");
        #[cfg(unix)]
        {
            // Devices and FIFOs are refused, never read (or waited on).
            assert!(tail(Path::new("/dev/zero"), 8).is_err());
            assert!(read_to_string(Path::new("/dev/zero")).is_err());
            let fifo = dir.path().join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: a NUL-terminated path that lives through the call.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            let e = read_to_string(&fifo).unwrap_err();
            assert!(e.to_string().contains("not a regular file"), "{e}");
        }
    }

    /// Hands out at most `step` bytes per read, as FUSE direct I/O may mid-file.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
        reads: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.reads += 1;
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    fn capped(data: &[u8], step: usize, len: u64, cap: u64) -> (Vec<u8>, usize) {
        let mut r = Trickle {
            data,
            step,
            reads: 0,
        };
        let mut out = b"kept:".to_vec();
        read_capped(&mut r, len, cap, &mut out).unwrap();
        (out[5..].to_vec(), r.reads)
    }

    #[test]
    fn short_reads_are_never_the_end() {
        let data = b"0123456789";
        // The size fstat counted, in one read: no second read to confirm the end.
        assert_eq!(capped(data, 64, 10, 100), (data.to_vec(), 1));
        // Short reads mid-file go on to the counted size.
        assert_eq!(capped(data, 3, 10, 100), (data.to_vec(), 4));
        // The file grew after its fstat: read on to its end.
        assert_eq!(capped(data, 3, 4, 100).0, data);
        assert_eq!(capped(data, 64, 4, 100).0, data);
        // It shrank: the end comes sooner.
        assert_eq!(capped(data, 64, 40, 100).0, data);
        // A size of 0 (procfs) is still read to the end.
        assert_eq!(capped(data, 3, 0, 100).0, data);
        // The cap holds whatever the size said.
        assert_eq!(capped(data, 3, 0, 4).0, b"0123");
        assert_eq!(capped(data, 64, 10, 4).0, b"0123");
        assert_eq!(capped(data, 64, 2, 6).0, b"012345");
    }
}
