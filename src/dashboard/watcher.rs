//! Which loops changed, learnt from the kernel (inotify on Linux, FSEvents on macOS,
//! ReadDirectoryChangesW on Windows, through the `notify` crate) instead of by polling:
//! one watch on each project's `.loopflow/loops` (loops created, deleted, renamed) and one
//! on each loop's directory, not recursive (its state, log, lock and `loop.toml`; never
//! what agents write in `worktree/` or `outputs/`). A project whose loops directory does
//! not exist yet is watched through its nearest existing ancestor until it appears. A
//! project on a network file system is left to polling (changes made on another machine
//! are not reported there), as is everything when the platform, the kernel's watch limit
//! or the watcher itself fails: [`Unwatched`] says why.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use notify::{Event, EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc::UnboundedSender;

use super::Changes;

/// Set (non-empty) in the environment of `loopflow dashboard`, it polls the loops' files
/// as where the kernel cannot notify: tests use it to exercise that path, and it is a way
/// out should the watcher misbehave somewhere.
pub(super) const POLL_ENV: &str = "LOOPFLOW_DASHBOARD_POLL";

/// The files a loop's view is built from (`data::view`); other names in its directory
/// (`.state.lock`, a state file's temporary twin, `outputs/`, `tmp/`, `worktree/`) change
/// nothing on the page.
const LOOP_FILES: [&str; 5] = [
    ".state.loop",
    ".state.log",
    ".lock",
    "loop.toml",
    "loop.json",
];

/// What the watcher hands the server's task: what the kernel reported, or stop.
pub(super) enum Msg {
    Fs(notify::Result<Event>),
    Stop,
}

/// Why loops are polled instead of watched: said once on stderr.
#[derive(Debug, thiserror::Error)]
pub(super) enum Unwatched {
    #[error("{POLL_ENV} is set")]
    Asked,
    #[error("this platform has no file-system notification loopflow can use")]
    Unsupported,
    #[error(
        "{} is on a network file system ({fs}), where changes made on other machines are not reported",
        dir.display()
    )]
    Network { dir: PathBuf, fs: &'static str },
    #[error(
        "the kernel's limit on watched directories is reached ({}; the dashboard watches one directory per loop)",
        watch_limit()
    )]
    Limit,
    #[error("the file-system watcher failed: {0}")]
    Failed(notify::Error),
}

impl From<notify::Error> for Unwatched {
    fn from(e: notify::Error) -> Unwatched {
        match e.kind {
            notify::ErrorKind::MaxFilesWatch => Unwatched::Limit,
            _ => Unwatched::Failed(e),
        }
    }
}

/// Where the watch limit is set, with its value where it can be read.
fn watch_limit() -> String {
    let file = "/proc/sys/fs/inotify/max_user_watches";
    match std::fs::read_to_string(file) {
        Ok(n) => format!("{file} is {}; raise it with sysctl", n.trim()),
        Err(_) => "raise the per-user limit on watched files".to_string(),
    }
}

/// One project as watched.
struct Src {
    project: PathBuf,
    /// `.loopflow/loops` of the project.
    loops_dir: PathBuf,
    /// The directory watched for it: itself, or while it does not exist its nearest
    /// existing ancestor (to see it appear).
    base: Option<PathBuf>,
    /// Left to polling: nothing of it is watched.
    polled: bool,
    /// The loops whose directories are watched.
    names: BTreeSet<String>,
}

/// The watches on every watched project.
pub(super) struct Watcher {
    inner: notify::RecommendedWatcher,
    srcs: Vec<Src>,
    /// Loop directory → (project, loop name), for each loop watched.
    loops: HashMap<PathBuf, (usize, String)>,
}

impl Watcher {
    /// Watches the projects `dirs` (the model's sources, in order), sending what the
    /// kernel reports to `tx`; returns the projects it leaves to polling, with why.
    pub(super) fn start(
        dirs: &[PathBuf],
        tx: UnboundedSender<Msg>,
    ) -> Result<(Watcher, Vec<(usize, Unwatched)>), Unwatched> {
        if std::env::var_os(POLL_ENV).is_some_and(|v| !v.is_empty()) {
            return Err(Unwatched::Asked);
        }
        // Where notify has no native backend it polls on its own, less well than we do.
        if std::any::TypeId::of::<notify::RecommendedWatcher>()
            == std::any::TypeId::of::<notify::PollWatcher>()
        {
            return Err(Unwatched::Unsupported);
        }
        let handler = move |ev: notify::Result<Event>| {
            // Opening and reading a file changes nothing (and the dashboard's own reads
            // would otherwise wake it again).
            if matches!(&ev, Ok(e) if matches!(e.kind, EventKind::Access(_))) {
                return;
            }
            let _ = tx.send(Msg::Fs(ev));
        };
        let inner = notify::RecommendedWatcher::new(handler, notify::Config::default())?;
        let mut w = Watcher {
            inner,
            srcs: Vec::new(),
            loops: HashMap::new(),
        };
        let mut polled = Vec::new();
        for (i, dir) in dirs.iter().enumerate() {
            // Absolute, as the watcher reports paths: events are matched against these.
            let project = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            let loops_dir = crate::state::loops_dir(&project);
            let network = network_fs(&nearest_dir(&loops_dir));
            if let Some(fs) = network {
                polled.push((
                    i,
                    Unwatched::Network {
                        dir: project.clone(),
                        fs,
                    },
                ));
            }
            w.srcs.push(Src {
                project,
                loops_dir,
                base: None,
                polled: network.is_some(),
                names: BTreeSet::new(),
            });
            if network.is_none() {
                w.sync(i, &mut Changes::default())?;
            }
        }
        Ok((w, polled))
    }

    /// The projects left to polling.
    pub(super) fn polled(&self) -> BTreeSet<usize> {
        (0..self.srcs.len())
            .filter(|&i| self.srcs[i].polled)
            .collect()
    }

    /// What a burst of events changed; the watches follow (new loops watched, deleted
    /// ones dropped, a loops directory that appeared watched itself).
    pub(super) fn digest(
        &mut self,
        events: Vec<notify::Result<Event>>,
    ) -> Result<Changes, Unwatched> {
        let mut c = Changes::default();
        for ev in events {
            let ev = ev?;
            if ev.need_rescan() {
                // The kernel dropped events: every watched project is looked at again.
                c.relist
                    .extend((0..self.srcs.len()).filter(|&i| !self.srcs[i].polled));
                continue;
            }
            for p in &ev.paths {
                self.classify(p, &mut c);
            }
        }
        for i in c.relist.clone() {
            self.sync(i, &mut c)?;
        }
        Ok(c)
    }

    /// What an event on `path` means: a loop's file changed, or a project's list of loops
    /// may have.
    fn classify(&self, path: &Path, c: &mut Changes) {
        if let Some((i, name)) = path.parent().and_then(|d| self.loops.get(d)) {
            let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
            if LOOP_FILES.contains(&file) {
                c.loops.insert((*i, name.clone()));
            }
            return;
        }
        for (i, s) in self.srcs.iter().enumerate() {
            let Some(base) = &s.base else { continue };
            let relist = if *base == s.loops_dir {
                // The directory itself, or an entry of it (a loop created, removed, moved).
                path == s.loops_dir || path.parent() == Some(&s.loops_dir)
            } else {
                // On the way to a loops directory that does not exist yet.
                path == base || s.loops_dir.starts_with(path)
            };
            if relist {
                c.relist.insert(i);
            }
        }
    }

    /// Brings project `i`'s watches in line with the disk: its loops directory (or the
    /// ancestor that stands for it) and one watch per loop. Loops newly watched are marked
    /// changed in `c`, so they are read after their watch is in place.
    fn sync(&mut self, i: usize, c: &mut Changes) -> Result<(), Unwatched> {
        let s = &self.srcs[i];
        let base = nearest_dir(&s.loops_dir);
        if s.base.as_ref() != Some(&base) {
            // The new watch first, so nothing falls between the two.
            self.inner.watch(&base, RecursiveMode::NonRecursive)?;
            if let Some(old) = self.srcs[i].base.replace(base.clone()) {
                let _ = self.inner.unwatch(&old);
            }
        }
        let s = &self.srcs[i];
        let names: BTreeSet<String> = if base == s.loops_dir {
            crate::state::list_loops(&s.project).into_iter().collect()
        } else {
            BTreeSet::new()
        };
        let gone: Vec<String> = s.names.difference(&names).cloned().collect();
        let new: Vec<String> = names.difference(&s.names).cloned().collect();
        let loops_dir = s.loops_dir.clone();
        for name in gone {
            let dir = loops_dir.join(&name);
            // Already gone with its directory, often: the kernel dropped the watch then.
            let _ = self.inner.unwatch(&dir);
            self.loops.remove(&dir);
            self.srcs[i].names.remove(&name);
        }
        for name in new {
            let dir = loops_dir.join(&name);
            match self.inner.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {}
                // Removed since it was listed: its project's next relisting drops it.
                Err(_) if !dir.is_dir() => continue,
                Err(e) => return Err(e.into()),
            }
            self.loops.insert(dir, (i, name.clone()));
            c.loops.insert((i, name.clone()));
            self.srcs[i].names.insert(name);
        }
        Ok(())
    }
}

/// `dir`, or its nearest ancestor that is a directory.
fn nearest_dir(dir: &Path) -> PathBuf {
    dir.ancestors()
        .find(|d| d.is_dir())
        .unwrap_or(dir)
        .to_path_buf()
}

/// The network file system `dir` is on, if it is one (Linux: by `statfs`'s magic number;
/// FUSE counts, as sshfs and its kind are FUSE). Elsewhere none is recognised.
#[cfg(target_os = "linux")]
fn network_fs(dir: &Path) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: all-zero is a valid statfs.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs fills the struct we pass, from a NUL-terminated path.
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // The magic numbers of linux/magic.h (and the file systems' own headers).
    Some(match st.f_type as u32 {
        0x6969 => "nfs",
        0x517B => "smb",
        0xFF53_4D42 => "cifs",
        0xFE53_4D42 => "smb2",
        0x564C => "ncp",
        0x7375_7245 => "coda",
        0x5346_414F | 0x6B41_4653 => "afs",
        0x00C3_6400 => "ceph",
        0x0102_1997 => "9p",
        0x6573_5546 => "fuse",
        0x0BD0_0BD0 => "lustre",
        0x0116_1970 => "gfs2",
        0x7461_636F => "ocfs2",
        0x2003_0528 => "orangefs",
        _ => return None,
    })
}

#[cfg(not(target_os = "linux"))]
fn network_fs(_dir: &Path) -> Option<&'static str> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{CreateKind, DataChange, ModifyKind, RenameMode};

    fn ev(kind: EventKind, path: &Path) -> notify::Result<Event> {
        Ok(Event::new(kind).add_path(path.to_path_buf()))
    }

    fn changes(relist: &[usize], loops: &[(usize, &str)]) -> Changes {
        Changes {
            relist: relist.iter().copied().collect(),
            loops: loops.iter().map(|(i, n)| (*i, n.to_string())).collect(),
        }
    }

    #[test]
    fn events_name_the_loops_whose_files_changed_and_the_projects_to_relist() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        let loops = crate::state::loops_dir(one.path());
        std::fs::create_dir_all(loops.join("a")).unwrap();
        std::fs::create_dir_all(loops.join("b")).unwrap();
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let dirs = [one.path().to_path_buf(), two.path().to_path_buf()];
        let (mut w, polled) = Watcher::start(&dirs, tx).unwrap();
        assert!(polled.is_empty() && w.polled().is_empty());
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        let write = EventKind::Modify(ModifyKind::Data(DataChange::Any));
        let a = loops.join("a");
        let c = w
            .digest(vec![
                ev(rename, &a.join(".state.loop")),
                ev(write, &a.join(".state.log")),
                ev(write, &loops.join("b").join("loop.toml")),
                // Nothing the page shows: the state lock, a temporary file, the worktree.
                ev(write, &loops.join("b").join(".state.lock")),
                ev(rename, &loops.join("b").join(".state.loop.tmp1")),
                ev(write, &loops.join("b").join("worktree")),
            ])
            .unwrap();
        assert_eq!(c, changes(&[], &[(0, "a"), (0, "b")]));

        // A loop created: its project relisted, the loop watched and read.
        std::fs::create_dir(loops.join("c")).unwrap();
        let folder = EventKind::Create(CreateKind::Folder);
        let c = w.digest(vec![ev(folder, &loops.join("c"))]).unwrap();
        assert_eq!(c, changes(&[0], &[(0, "c")]));
        assert!(w.loops.contains_key(&loops.join("c")));

        // The second project has no loops directory: its own directory stands for it
        // until `.loopflow/loops` appears, which is then watched with its loops.
        let loops2 = crate::state::loops_dir(two.path());
        assert_eq!(w.srcs[1].base.as_deref(), Some(two.path()));
        let unrelated = w
            .digest(vec![ev(write, &two.path().join("README.md"))])
            .unwrap();
        assert_eq!(unrelated, Changes::default());
        std::fs::create_dir_all(loops2.join("x")).unwrap();
        let c = w
            .digest(vec![ev(folder, &two.path().join(".loopflow"))])
            .unwrap();
        assert_eq!(c, changes(&[1], &[(1, "x")]));
        assert_eq!(w.srcs[1].base.as_deref(), Some(loops2.as_path()));

        // A loop deleted: relisted, and no longer watched.
        std::fs::remove_dir_all(loops.join("a")).unwrap();
        let remove = EventKind::Remove(notify::event::RemoveKind::Folder);
        let c = w.digest(vec![ev(remove, &a)]).unwrap();
        assert_eq!(c, changes(&[0], &[]));
        assert!(!w.loops.contains_key(&a));

        // Events dropped by the kernel: every project looked at again.
        let rescan = Ok(Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan));
        assert_eq!(w.digest(vec![rescan]).unwrap(), changes(&[0, 1], &[]));
    }
}
