//! The locks of a loop. The tick lock (`.lock` and the loop directory, both flocked) is
//! held for a whole tick; `approve` and a second tick take it without waiting and back
//! off. The state lock (`.state.lock`) is held around every read-modify-write of
//! `.state.loop`, so a `transition` made from inside a tick is never lost.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

use super::{LoopPaths, StateError, io_err};
use crate::fs_safe::{nofollow, regular};

/// Held for the whole of a tick: the `.lock` file and the loop directory, both flocked.
/// The lock file also lists the process groups the tick spawned (`pgid N` lines), so
/// the next tick can stop what a tick killed with `kill -9` left running.
pub struct TickLock {
    _dir: Option<File>,
    file: File,
}

impl TickLock {
    /// Records a spawned process group (one small write to the already open file).
    pub fn record_group(&self, pgid: u32) {
        let _ = (&self.file).write_all(format!("pgid {pgid}\n").as_bytes());
    }

    /// What an earlier tick left in the lock file: the groups it recorded, and whether it
    /// was running (its `tick` mark is only cleared by a tick that ended). Clears the file
    /// and marks this tick as running, before anything is spawned, so a tick killed at any
    /// instant from here on is known to the next one.
    pub fn take_previous(&self) -> Previous {
        let mut f = &self.file;
        let mut text = String::new();
        let _ = f.seek(SeekFrom::Start(0));
        let _ = f.take(64 * 1024).read_to_string(&mut text);
        self.clear();
        let _ = (&self.file).write_all(format!("tick {}\n", std::process::id()).as_bytes());
        Previous {
            groups: text
                .lines()
                .filter_map(|l| l.strip_prefix("pgid ")?.trim().parse().ok())
                .filter(|&g: &u32| g > 1)
                .collect(),
            died: text.lines().any(|l| l.starts_with("tick ")),
        }
    }

    /// Empties the lock file: this tick ended and stopped everything it spawned.
    pub fn clear(&self) {
        let _ = self.file.set_len(0);
        let _ = (&self.file).seek(SeekFrom::Start(0));
    }
}

/// What the lock file said about the tick before this one.
#[derive(Debug, Default)]
pub struct Previous {
    /// Process groups it spawned and did not see end.
    pub groups: Vec<u32>,
    /// It was killed (or crashed) while running.
    pub died: bool,
}

impl LoopPaths {
    /// Takes the state lock (blocking: it is only ever held for one read-modify-write).
    pub(super) fn lock_state(&self) -> Result<File, StateError> {
        let f = nofollow(OpenOptions::new().create(true).truncate(false).write(true))
            .open(&self.state_lock)
            .map_err(io_err(&self.state_lock))?;
        regular(&f).map_err(io_err(&self.state_lock))?;
        f.lock().map_err(io_err(&self.state_lock))?;
        Ok(f)
    }

    /// Takes the tick lock without waiting. `None` when another tick holds it.
    pub fn try_lock_tick(&self) -> Result<Option<TickLock>, StateError> {
        let Some(dir) = self.try_lock_dir()? else {
            return Ok(None);
        };
        let f = nofollow(
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true),
        )
        .open(&self.lock)
        .map_err(io_err(&self.lock))?;
        regular(&f).map_err(io_err(&self.lock))?;
        match f.try_lock() {
            Ok(()) => Ok(Some(TickLock { _dir: dir, file: f })),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(io_err(&self.lock)(e)),
        }
    }

    /// The loop directory's own lock, taken with `.lock`: an agent that deletes `.lock`
    /// during its tick must not let `approve` or a second tick in. `Some(None)` where
    /// directories cannot be locked.
    fn try_lock_dir(&self) -> Result<Option<Option<File>>, StateError> {
        #[cfg(unix)]
        {
            let d = File::open(&self.dir).map_err(io_err(&self.dir))?;
            match d.try_lock() {
                Ok(()) => Ok(Some(Some(d))),
                Err(std::fs::TryLockError::WouldBlock) => Ok(None),
                Err(std::fs::TryLockError::Error(e)) => Err(io_err(&self.dir)(e)),
            }
        }
        #[cfg(not(unix))]
        Ok(Some(None))
    }

    /// Whether a tick holds the loop right now.
    pub fn tick_running(&self) -> Result<bool, StateError> {
        if !self.dir.is_dir() {
            return Ok(false);
        }
        if !self.lock.exists() {
            return Ok(self.try_lock_dir()?.is_none());
        }
        Ok(self.try_lock_tick()?.is_none())
    }

    /// Whether a tick is running, found without taking any lock, so a tick starting at
    /// this very instant is never turned away as `locked` (what [`Self::tick_running`]
    /// risks): for `status` and the dashboard, which only report it. A tick marks the
    /// lock file `tick <pid>` right after taking the lock and clears it when it ends; the
    /// mark counts while that process lives. A tick killed with `kill -9` leaves its
    /// mark: its dead pid says it is not running (were the pid reused before the next
    /// tick, `status` would say running until that tick clears the mark). Guards that
    /// must be sure (`approve`) keep taking the lock.
    pub fn tick_seen_running(&self) -> bool {
        self.running_tick_pid().is_some()
    }

    /// The process of the tick [`Self::tick_seen_running`] sees, if any.
    pub fn running_tick_pid(&self) -> Option<i32> {
        let text = crate::fs_safe::head(&self.lock, 4096).ok()?;
        let pid = text.split(|b| *b == b'\n').find_map(|l| {
            std::str::from_utf8(l.strip_prefix(b"tick ")?)
                .ok()?
                .trim()
                .parse()
                .ok()
        });
        pid.filter(|&p| alive(p))
    }
}

/// Whether process `pid` exists (signal 0 checks without sending; `EPERM`: it exists
/// but is not ours). Where that cannot be asked, every pid counts as alive.
pub(super) fn alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    #[cfg(unix)]
    {
        // SAFETY: signal 0 sends nothing; it only asks whether the process exists.
        let r = unsafe { libc::kill(pid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    true
}
