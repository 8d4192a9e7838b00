//! The command line's side of remote loops (DESIGN §16): each verb on a loop whose
//! `loop.toml` has `[remote]` reads its record fresh ([`refresh`]) and changes it by one
//! compare-and-swap read-modify-write ([`write`]); `create --remote` publishes the first
//! state ([`publish`]). A loop without `[remote]` goes through untouched.

use crate::exit;
use crate::out::outln;
use crate::remote::human::{self, Guard, Published};
use crate::remote::{OpenError, RemoteError, RemoteLoop};
use crate::state::LoopPaths;

/// Prints a remote failure and gives its exit code: refused (a live lease) 1, a loop the
/// remote never had 2, anything else 4.
pub(crate) fn report(e: &RemoteError) -> i32 {
    eprintln!("error: {e}");
    match e {
        RemoteError::LeaseHeld { .. } | RemoteError::Refused(_) => exit::NO,
        RemoteError::Untracked { .. } => exit::USAGE,
        _ => exit::STATE,
    }
}

fn open<'a>(paths: &'a LoopPaths) -> Result<Option<RemoteLoop<'a>>, i32> {
    RemoteLoop::open(paths).map_err(|e| match e {
        OpenError::Config(e) => super::report(&e.into()),
        OpenError::Remote(e) => report(&e),
    })
}

/// For a remote loop, fetches its record into the local cache (with `sync`, the loop's
/// local branch too) before a verb reads it; nothing for a local loop.
pub(crate) fn refresh(paths: &LoopPaths, sync: bool) -> Result<(), i32> {
    // Inside a tick of this clone (its agents run verbs too) the cache is the tick's.
    if paths.tick_seen_running() {
        return Ok(());
    }
    let Some(l) = open(paths)? else {
        return Ok(());
    };
    human::refresh(&l, sync).map(|_| ()).map_err(|e| report(&e))
}

/// Runs a verb's local function `f` on the loop: for a remote loop, as one
/// read-modify-write of its record, pushed by compare-and-swap and redone on a lost race
/// (see [`human::transact`]). The outer `Err` is an exit code already reported.
pub(crate) fn write<R, E>(
    paths: &LoopPaths,
    guard: Guard,
    sync: bool,
    mut f: impl FnMut() -> Result<R, E>,
) -> Result<Result<R, E>, i32> {
    // A verb run inside a tick of this clone (an orchestrator's `transition`) changes the
    // tick's cache: the tick's settle carries it into the record.
    if paths.tick_seen_running() {
        return Ok(f());
    }
    match open(paths)? {
        None => Ok(f()),
        Some(l) => human::transact(&l, guard, sync, f).map_err(|e| report(&e)),
    }
}

/// Whether `--remote R` can start loop `name` here: R is a remote of the repository, and
/// the loop is not already on it. Checked before `create` writes anything.
pub(crate) fn check_new(paths: &LoopPaths, remote: &str) -> Result<(), i32> {
    if !crate::config::remote::valid_name(remote) {
        eprintln!(
            "error: --remote {remote:?} is not a git remote name (`git remote -v` lists them)"
        );
        return Err(exit::USAGE);
    }
    if crate::git::remote::url(&paths.project, remote).is_none() {
        eprintln!(
            "error: the repository at {} has no remote `{remote}` (`git remote -v` lists them; `git remote add {remote} URL` adds one)",
            paths.project.display()
        );
        return Err(exit::USAGE);
    }
    let l = RemoteLoop {
        paths,
        cfg: crate::config::RemoteConfig {
            name: remote.to_string(),
            lease_margin: crate::config::remote::DEFAULT_LEASE_MARGIN,
        },
        auth: crate::git::remote::Auth::from_env().map_err(|e| {
            eprintln!("error: {e}");
            exit::USAGE
        })?,
    };
    match human::exists(&l) {
        Ok(None) => Ok(()),
        Ok(Some(n)) => {
            eprintln!(
                "error: loop `{}` already lives on remote {remote} (iteration {n}); nothing was created. Every verb works on it from this clone as it is: `loopflow status --loop {}`",
                paths.name, paths.name
            );
            Err(exit::USAGE)
        }
        Err(e) => Err(report(&e)),
    }
}

/// After `create` wrote a loop whose `loop.toml` has `[remote]`: pushes its first state
/// (and branch) to the remote, where none exists.
pub(crate) fn publish(paths: &LoopPaths) -> Result<(), i32> {
    let Some(l) = open(paths)? else {
        return Ok(());
    };
    match human::publish(&l) {
        Ok(Published::Started) => {
            outln!(
                "  state: {} on remote {} (any runner ticks it, any clone approves it)",
                l.state_ref(),
                l.cfg.name
            );
            Ok(())
        }
        Ok(Published::Exists { iteration }) => {
            eprintln!(
                "error: loop `{}` already lives on remote {} (iteration {iteration}): the first state was not pushed, the remote's stands",
                paths.name, l.cfg.name
            );
            Err(exit::USAGE)
        }
        Err(e) => Err(report(&e)),
    }
}

/// Before `status` lists loop `paths`: a remote loop's cache refreshed from its record; a
/// remote that cannot be reached is said, and the last record fetched is shown.
pub(crate) fn refresh_listed(paths: &LoopPaths, shown_as: &str) {
    if let Err(e) = human::refresh_cache(paths) {
        eprintln!(
            "warning: {shown_as}: its record could not be fetched ({e}); showing the last one fetched"
        );
    }
}
