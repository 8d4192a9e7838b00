//! Humans from any clone, at any path (DESIGN §16): every verb that reads a remote loop
//! fetches its record first ([`refresh`]); every verb that changes it is one
//! read-modify-write ([`transact`]): fetch, apply the verb to the local cache exactly as
//! for a local loop, push the result by compare-and-swap, and on a lost race do it all
//! again from the new record. A verb of any engineer plugs in by handing its local
//! function to [`transact`]. `create --remote` publishes a new loop's first state
//! ([`publish`]) only where the remote has none.

use super::{Record, RemoteError, RemoteLoop, Snapshot};
use crate::git::remote::{Expect, Pushed, Update};

/// How often a verb is redone after losing a race.
const ATTEMPTS: usize = 8;

/// Whether a verb may change the record while a tick holds the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// Refused while a live lease is held (`approve`, `task`, `land`, `discard`): an
    /// agent inside a tick never approves its own loop, and no tick's branch moves under it.
    RefuseLease,
    /// Allowed (`halt`: a human may always stop a loop; the tick's settle keeps the halt).
    AllowLease,
}

/// Fetches the record into the local cache (and, with `sync`, the local branch — and the
/// worktree, where this clone has one — onto the remote's branch). `Untracked` when the
/// loop was never started on the remote.
pub(crate) fn refresh(l: &RemoteLoop<'_>, sync: bool) -> Result<Snapshot, RemoteError> {
    let snap = l.fetch()?.ok_or_else(|| untracked(l))?;
    l.write_cache(&snap.record)?;
    if sync {
        sync_branch(l, snap.branch.as_deref())?;
    }
    Ok(snap)
}

/// Whether the loop's state of record lives in its repository (`[remote]`).
pub(crate) fn is_remote(paths: &crate::state::LoopPaths) -> bool {
    matches!(RemoteLoop::open(paths), Ok(Some(_)))
}

/// For the commands that only read (`status`, the dashboard): refreshes the cache of the
/// loop at `paths` from its record when it is a remote loop whose tick is not running in
/// this clone right now. `Ok(false)`: nothing to refresh (a local loop, a running tick,
/// a loop the remote does not have).
pub(crate) fn refresh_cache(paths: &crate::state::LoopPaths) -> Result<bool, String> {
    if paths.tick_seen_running() {
        return Ok(false);
    }
    let l = match RemoteLoop::open(paths) {
        Ok(Some(l)) => l,
        Ok(None) | Err(super::OpenError::Config(_)) => return Ok(false),
        Err(super::OpenError::Remote(e)) => return Err(e.to_string()),
    };
    match refresh(&l, false) {
        Ok(_) => Ok(true),
        Err(RemoteError::Untracked { .. }) => Ok(false),
        Err(e) => Err(e.to_string()),
    }
}

fn untracked(l: &RemoteLoop<'_>) -> RemoteError {
    RemoteError::Untracked {
        name: l.paths.name.clone(),
        remote: l.cfg.name.clone(),
        state_ref: l.state_ref(),
    }
}

/// Points the local branch `loopflow/<loop>` at the remote's tip: through the worktree
/// (`reset --hard`) when this clone has one, else the ref alone. A remote without the
/// branch leaves the local one as it is.
fn sync_branch(l: &RemoteLoop<'_>, tip: Option<&str>) -> Result<(), RemoteError> {
    let Some(tip) = tip else { return Ok(()) };
    if l.local_branch().as_deref() == Some(tip) {
        return Ok(());
    }
    let paths = l.paths;
    let dir = crate::worktree::configured_dir(paths);
    let copy = crate::worktree::location(&paths.project, &paths.name, dir.as_deref())
        .map_err(|e| RemoteError::Refused(format!("loop {}'s worktree: {e}", paths.name)))?;
    crate::git::remote::set_ref(&paths.project, &l.branch_ref(), tip).map_err(|e| l.err(e))?;
    if !copy.exists() {
        return Ok(());
    }
    let refused = |e: String| {
        RemoteError::Refused(format!(
            "loop {}'s worktree {} cannot follow the remote's branch without losing what is uncommitted there ({e}); commit, stash or remove it, then run this again",
            paths.name,
            copy.work_tree.display()
        ))
    };
    let (r, _) = copy
        .open()
        .map_err(|e| RemoteError::Refused(format!("loop {}'s worktree: {e}", paths.name)))?;
    let checkout = crate::git::Repo::checkout(&paths.project)
        .map_err(|e| l.err(e))?
        .ok_or_else(|| {
            RemoteError::Refused(format!(
                "{} is not a git repository",
                paths.project.display()
            ))
        })?;
    r.fetch_object(&checkout.common, tip)
        .map_err(|e| l.err(e))?;
    // A human's clone: its worktree's uncommitted changes are never thrown away.
    match r.reset_keep(tip) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(why)) => Err(refused(why)),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// One read-modify-write of a remote loop's record: `f` changes the local cache as the
/// local verb does (state, log lines; with `sync`, the local branch too), and what it
/// changed is pushed by compare-and-swap — the branch in the same atomic push when `f`
/// moved it. `Ok(Err(e))`: `f` refused, nothing was pushed.
pub(crate) fn transact<R, E>(
    l: &RemoteLoop<'_>,
    guard: Guard,
    sync: bool,
    mut f: impl FnMut() -> Result<R, E>,
) -> Result<Result<R, E>, RemoteError> {
    for _ in 0..ATTEMPTS {
        let snap = l.fetch()?.ok_or_else(|| untracked(l))?;
        if guard == Guard::RefuseLease
            && let Some(lease) = &snap.record.lease
            && !lease.expired(jiff::Timestamp::now())
        {
            l.write_cache(&snap.record)?;
            return Err(RemoteError::LeaseHeld {
                name: l.paths.name.clone(),
                run: lease.run.clone(),
                holder: lease.holder.clone(),
                until: lease.expires_at.clone(),
            });
        }
        l.write_cache(&snap.record)?;
        if sync {
            sync_branch(l, snap.branch.as_deref())?;
        }
        let r = match f() {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let rec = Record {
            state: l.paths.load()?,
            log: l.paths.log_bytes()?,
            lease: snap.record.lease.clone(),
            slots: snap.record.slots.clone(),
        };
        let branch = if sync {
            l.branch_update(snap.branch.as_deref())
        } else {
            None
        };
        if same(&rec, &snap.record) && branch.is_none() {
            return Ok(Ok(r));
        }
        let (pushed, commit) = l.push(Some(&snap.commit), &rec, branch, "loopflow: human")?;
        let took = match pushed {
            Pushed::Accepted => true,
            Pushed::Rejected(_) => false,
            Pushed::Unknown(_) => l.fetch()?.is_some_and(|s| s.commit == commit),
        };
        if took {
            l.write_cache(&rec)?;
            return Ok(Ok(r));
        }
    }
    Err(RemoteError::Contended(l.cfg.name.clone()))
}

/// Whether two records say the same (the state compared as the record keeps it).
fn same(a: &Record, b: &Record) -> bool {
    super::portable(&a.state) == super::portable(&b.state)
        && a.log == b.log
        && a.lease == b.lease
        && a.slots == b.slots
}

/// What `create --remote` found on the remote.
pub(crate) enum Published {
    /// The loop's first state (and its branch, where the remote had none) went up.
    Started,
    /// The remote has the loop already: nothing was pushed.
    Exists { iteration: u64 },
}

/// Whether the remote already has the loop (`create --remote` refuses before writing).
pub(crate) fn exists(l: &RemoteLoop<'_>) -> Result<Option<u64>, RemoteError> {
    let there = l.git().list(&[&l.state_ref()]).map_err(|e| l.err(e))?;
    if there.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        l.fetch()?.map_or(0, |s| s.record.state.iteration_count),
    ))
}

/// Pushes a new loop's first state (the local cache `create` just wrote) to the state
/// ref, only if the ref does not exist, with the loop's branch where the remote has none.
pub(crate) fn publish(l: &RemoteLoop<'_>) -> Result<Published, RemoteError> {
    let rec = Record {
        state: l.paths.load()?,
        log: l.paths.log_bytes()?,
        lease: None,
        slots: Vec::new(),
    };
    let there = l.git().list(&[&l.branch_ref()]).map_err(|e| l.err(e))?;
    let branch = match (there.is_empty(), l.local_branch()) {
        (true, Some(tip)) => Some(Update {
            src: tip,
            dst: l.branch_ref(),
            expect: Expect::Absent,
        }),
        _ => None,
    };
    match l.push(None, &rec, branch, "loopflow: create")? {
        (Pushed::Accepted, _) => Ok(Published::Started),
        (Pushed::Rejected(_), _) | (Pushed::Unknown(_), _) => match l.fetch()? {
            Some(s)
                if super::portable(&s.record.state) == super::portable(&rec.state)
                    && s.record.log == rec.log =>
            {
                Ok(Published::Started)
            }
            Some(s) => Ok(Published::Exists {
                iteration: s.record.state.iteration_count,
            }),
            None => Err(RemoteError::Refused(format!(
                "remote {} did not take loop {}'s first state; nothing was started there (check that you may push to it, then run create again)",
                l.cfg.name, l.paths.name
            ))),
        },
    }
}
