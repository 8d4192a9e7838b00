//! A runner's tick of a remote loop (DESIGN §16), at the three seams the tick calls:
//! [`begin`] (fetch, the gate the record alone decides, the lease), [`Session::checkpoint`]
//! (after each spawning node: the spend so far) and [`Session::settle`] (one atomic push of
//! the state, its log and the branch). The remote's own ref update decides every race: a
//! lost one re-fetches and decides again; a runner whose lease was taken over (fenced)
//! pushes nothing to the state or the branch, its commits going to an orphans ref.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::lease::{self, Lease};
use super::{Record, RemoteError, RemoteLoop, Snapshot};
use crate::git::remote::{Expect, Pushed, Update};
use crate::reason::{HaltReason, Intervention, SkipReason};
use crate::state::{Event, LogArg, Spent, State, TickLock};

/// How often a runner decides again after losing a race or a push's answer.
const ATTEMPTS: usize = 8;

/// What the record alone decides before a runner takes the loop.
pub(crate) enum Begun<'a> {
    /// The tick ends here; nothing of it reaches the record.
    Skip { reason: SkipReason, iteration: u64 },
    /// A dry run: the cache holds the record as fetched; nothing is leased.
    Look,
    /// The lease is this runner's; the cache holds the record as leased.
    Go(Box<Session<'a>>),
}

/// Why a remote tick could not begin.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BeginError {
    #[error("invalid configuration")]
    Load(crate::load::LoadError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
}

/// What `run` says about the tick beyond the loop: its slot, whether it is a dry run, the
/// pipeline it runs.
pub(crate) struct Options<'a> {
    pub slot: Option<&'a str>,
    pub dry_run: bool,
    pub pipeline: Option<&'a std::path::Path>,
}

/// Fetches the loop's record and decides: skip (untracked, locked, halted, slot taken, no
/// task), or take the lease. An expired lease is a dead tick: it is recorded (`ABORT
/// reason=lease_expired`, its checkpointed spend counted, the abort counted) in the same
/// push that takes the lease.
pub(crate) fn begin<'a>(
    l: RemoteLoop<'a>,
    lock: Option<&TickLock>,
    o: &Options<'_>,
) -> Result<Begun<'a>, BeginError> {
    let paths = l.paths;
    let base = std::env::current_dir().unwrap_or_else(|_| paths.project.clone());
    let loaded = crate::load::load(paths, o.pipeline, &base).map_err(BeginError::Load)?;
    if !loaded.config.worktree {
        return Err(RemoteError::Refused(format!(
            "loop {} keeps its state in the repository ([remote]) but works without a worktree: a remote loop commits on a branch of its own; set `[worktree] enabled = true`",
            paths.name
        ))
        .into());
    }
    let slot = o.slot.map(|given| {
        let (every, offset) =
            crate::schedule::scattered(loaded.config.interval_seconds, &paths.name);
        lease::resolve_slot(given, every.every_secs, offset, jiff::Timestamp::now())
    });
    let run = lease::run_id();
    let lasts = lease::duration(&loaded, l.cfg.lease_margin);
    let max_aborts = loaded.config.brakes.max_consecutive_aborts;
    let single = matches!(loaded.config.work_source, crate::config::WorkSource::Single);
    for _ in 0..ATTEMPTS {
        let Some(snap) = l.fetch()? else {
            return Ok(Begun::Skip {
                reason: SkipReason::Untracked,
                iteration: 0,
            });
        };
        l.write_cache(&snap.record)?;
        if o.dry_run {
            return Ok(Begun::Look);
        }
        let now = jiff::Timestamp::now();
        let mut rec = snap.record.clone();
        let skip = |reason| {
            Ok(Begun::Skip {
                reason,
                iteration: snap.record.state.iteration_count,
            })
        };
        if rec.lease.as_ref().is_some_and(|h| !h.expired(now)) {
            return skip(SkipReason::Locked);
        }
        let dead = rec.lease.take();
        if let Some(d) = &dead {
            record_dead(&mut rec, d, max_aborts);
        }
        let why = if let Some(h) = &rec.state.halt {
            Some(SkipReason::Halted(h.reason.clone()))
        } else if slot
            .as_ref()
            .is_some_and(|s| rec.slots.iter().any(|t| t == s))
        {
            Some(SkipReason::SlotTaken)
        } else if single && rec.state.current_task.is_none() {
            Some(SkipReason::NoCurrentTask)
        } else {
            None
        };
        if let Some(why) = why {
            if dead.is_none() {
                return skip(why);
            }
            // The dead tick is recorded even when nothing runs after it.
            match l.push(Some(&snap.commit), &rec, None, "loopflow: lease expired")? {
                (Pushed::Accepted, _) => {
                    l.write_cache(&rec)?;
                    return Ok(Begun::Skip {
                        reason: why,
                        iteration: rec.state.iteration_count,
                    });
                }
                _ => continue,
            }
        }
        // The worktree is made from the branch as fetched before the lease is taken: a
        // tick that then loses the race has only reset a disposable copy.
        prepare_worktree(&l, lock, snap.branch.as_deref())?;
        if let Some(s) = &slot {
            rec.take_slot(s);
        }
        let mine = Lease::new(&run, slot.as_deref(), now, lasts);
        rec.log(
            Event::Lease,
            &[
                LogArg::Kv("holder", mine.holder.clone()),
                LogArg::Kv("run", mine.run.clone()),
                LogArg::Kv("slot", mine.slot.clone().unwrap_or_else(|| "-".into())),
                LogArg::Kv("until", mine.expires_at.clone()),
            ],
        );
        rec.lease = Some(mine);
        let message = format!("loopflow: lease run={run}");
        let (pushed, commit) = l.push(Some(&snap.commit), &rec, None, &message)?;
        let took = match pushed {
            Pushed::Accepted => true,
            Pushed::Rejected(_) => false,
            // The answer was lost: the remote says whether it took it.
            Pushed::Unknown(_) => l.fetch()?.is_some_and(|now| now.commit == commit),
        };
        if !took {
            continue;
        }
        l.write_cache(&rec)?;
        let base_log = rec.log.len();
        return Ok(Begun::Go(Box::new(Session {
            held: Mutex::new(Held {
                commit,
                record: rec.clone(),
            }),
            base: rec,
            base_log,
            fetched_branch: snap.branch,
            run,
            fenced: AtomicBool::new(false),
            spawns: AtomicU64::new(crate::process::spawn_count()),
            l,
        })));
    }
    Err(RemoteError::Contended(l.cfg.name.clone()).into())
}

/// Records a dead tick found by its expired lease: `ABORT reason=lease_expired`, its
/// checkpointed spend, the abort counted (and the halt when that makes too many).
fn record_dead(rec: &mut Record, dead: &Lease, max_aborts: u32) {
    rec.log(
        Event::Abort,
        &[
            LogArg::Kv("reason", "lease_expired".into()),
            LogArg::Kv("holder", dead.holder.clone()),
            LogArg::Kv("run", dead.run.clone()),
            LogArg::Kv("slot", dead.slot.clone().unwrap_or_else(|| "-".into())),
        ],
    );
    let s = &mut rec.state;
    s.spent.usd = (s.spent.usd + dead.spent.usd).min(f64::MAX);
    s.spent.tokens = s.spent.tokens.saturating_add(dead.spent.tokens);
    s.spent.seconds += dead.spent.seconds;
    s.consecutive_aborts = s.consecutive_aborts.saturating_add(1);
    if s.consecutive_aborts >= max_aborts {
        let why = HaltReason::HumanIntervention(Intervention::HarnessFailing);
        let detail = format!(
            "{} ticks aborted in a row; last: run {} on {} died holding the lease",
            s.consecutive_aborts, dead.run, dead.holder
        );
        if crate::lifecycle::set_halt(s, why.clone(), Some(detail.clone())).is_some() {
            let text = why.to_string();
            rec.log(
                Event::Halt,
                &[LogArg::Word(&text), LogArg::Kv("detail", detail)],
            );
        }
    }
}

/// Makes the loop's worktree hold exactly the branch as fetched: reset (and emptied of
/// untracked files) where it exists, made where it does not. A branch the remote does not
/// have starts from this checkout's HEAD.
fn prepare_worktree(
    l: &RemoteLoop<'_>,
    lock: Option<&TickLock>,
    tip: Option<&str>,
) -> Result<(), RemoteError> {
    let paths = l.paths;
    let repo = &paths.project;
    let branch = l.branch_ref();
    let refused = |what: String| RemoteError::Refused(what);
    let target = match tip {
        Some(t) => t.to_string(),
        None => crate::git::remote::head(repo).ok_or_else(|| {
            refused(format!(
                "{} has no commit to start loop {}'s branch from",
                repo.display(),
                paths.name
            ))
        })?,
    };
    let dir = crate::worktree::configured_dir(paths);
    let copy = crate::worktree::location(&paths.project, &paths.name, dir.as_deref())
        .map_err(|e| refused(format!("loop {}'s worktree: {e}", paths.name)))?;
    crate::git::remote::set_ref(repo, &branch, &target).map_err(|e| l.err(e))?;
    if copy.exists() {
        // The runner's own worktree: exactly the branch as fetched.
        let (r, _) = copy
            .open()
            .map_err(|e| refused(format!("loop {}'s worktree: {e}", paths.name)))?;
        let checkout = crate::git::Repo::checkout(repo)
            .map_err(|e| l.err(e))?
            .ok_or_else(|| refused(format!("{} is not a git repository", repo.display())))?;
        r.fetch_branch(&checkout.common, &branch, true)
            .and_then(|()| r.reset_hard(&target))
            .and_then(|()| r.clean_untracked())
            .map_err(|e| l.err(e))?;
        return Ok(());
    }
    let Some(lock) = lock else {
        return Ok(());
    };
    crate::worktree::restore_held(paths, lock, dir.as_deref(), &[])
        .map(|_| ())
        .map_err(|e| refused(format!("loop {}'s worktree: {e}", paths.name)))
}

/// What a runner last pushed to the state ref.
struct Held {
    commit: String,
    record: Record,
}

/// A runner's hold on a remote loop, from its lease to its settle.
pub(crate) struct Session<'a> {
    l: RemoteLoop<'a>,
    run: String,
    held: Mutex<Held>,
    /// The record as leased: what humans changed since is told from what the tick did.
    base: Record,
    /// The cache log's length when the nodes started: lines after it are the tick's.
    base_log: usize,
    fetched_branch: Option<String>,
    /// Another runner took the lease over: nothing more of this tick reaches the record.
    fenced: AtomicBool,
    /// [`crate::process::spawn_count`] at the last checkpoint.
    spawns: AtomicU64,
}

/// How a remote tick ended at its settle, beyond what the local tick said.
pub(crate) enum Settled {
    /// The state, its log and the branch are the record now.
    Recorded,
    /// The lease was taken over: the tick's commits went to this orphans ref (if any).
    Fenced { orphans: Option<String> },
}

impl Session<'_> {
    /// Whether the lease was taken over (the tick should stop: nothing of it counts).
    pub(crate) fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// After a node: when it spawned anything, pushes the tick's spend so far into the
    /// lease, so a runner killed mid-tick loses at most one node's spend (and the seconds
    /// of nodes that reported nothing else and ran under a second each). Best effort: a
    /// failed push only means the next checkpoint (or the settle) carries it.
    pub(crate) fn checkpoint(&self, spent: &Spent) {
        let spawns = crate::process::spawn_count();
        if self.spawns.swap(spawns, Ordering::SeqCst) == spawns || self.fenced() {
            return;
        }
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        // A push costs a round trip or two: a node that reported no money or tokens and
        // took under a second is carried by the next checkpoint (or the settle) instead.
        let last = held
            .record
            .lease
            .as_ref()
            .map(|l| l.spent.clone())
            .unwrap_or_default();
        if spent.usd == last.usd
            && spent.tokens == last.tokens
            && spent.seconds - last.seconds < 1.0
        {
            return;
        }
        for _ in 0..3 {
            let mut rec = held.record.clone();
            if let Some(lease) = rec.lease.as_mut() {
                lease.spent = spent.clone();
            }
            let Ok((pushed, commit)) =
                self.l
                    .push(Some(&held.commit), &rec, None, "loopflow: checkpoint")
            else {
                return;
            };
            let took = match pushed {
                Pushed::Accepted => true,
                _ => match self.l.fetch() {
                    Ok(Some(now)) if now.commit == commit => true,
                    Ok(Some(now)) if self.ours(&now) => {
                        // A human wrote meanwhile (a halt): keep what they wrote.
                        *held = Held {
                            commit: now.commit,
                            record: now.record,
                        };
                        continue;
                    }
                    Ok(_) => {
                        self.fenced.store(true, Ordering::SeqCst);
                        return;
                    }
                    Err(_) => return,
                },
            };
            if took {
                *held = Held {
                    commit,
                    record: rec,
                };
            }
            return;
        }
    }

    /// Whether the record in `snap` still has this runner's lease.
    fn ours(&self, snap: &Snapshot) -> bool {
        snap.record
            .lease
            .as_ref()
            .is_some_and(|l| l.run == self.run)
    }

    /// Pushes what the tick did — the cache's state, the log lines the tick appended and
    /// the branch, in one atomic compare-and-swap — and lets the lease go. A human's
    /// halt (or phase, or task) written during the lease is kept. A runner that lost its
    /// lease pushes nothing of it: its commits go to `refs/loopflow/<loop>/orphans/<run>`.
    pub(crate) fn settle(self) -> Result<Settled, RemoteError> {
        let paths = self.l.paths;
        let (mut commit, mut at) = {
            let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            (held.commit.clone(), held.record.clone())
        };
        let mine = paths.load()?;
        let log = paths.log_bytes()?;
        let lines = log.get(self.base_log..).unwrap_or_default().to_vec();
        let branch = self.l.branch_update(self.fetched_branch.as_deref());
        let mut fenced = self.fenced.load(Ordering::SeqCst);
        let mut why = String::new();
        for _ in 0..ATTEMPTS {
            if fenced {
                break;
            }
            let mut rec = at.clone();
            rec.state = merged(&mine, &self.base.state, &at.state);
            rec.log.extend_from_slice(&lines);
            rec.lease = None;
            let (pushed, ours) =
                self.l
                    .push(Some(&commit), &rec, branch.clone(), "loopflow: settle")?;
            if pushed == Pushed::Accepted {
                self.l.write_cache(&rec)?;
                return Ok(Settled::Recorded);
            }
            let now = match self.l.fetch()? {
                Some(now) if now.commit == ours => {
                    self.l.write_cache(&rec)?;
                    return Ok(Settled::Recorded);
                }
                Some(now) => now,
                None => break,
            };
            if !self.ours(&now) {
                fenced = true;
                break;
            }
            if let Pushed::Unknown(e) = &pushed {
                // The remote did not answer: give it a moment before the next try.
                why = e.lines().last().unwrap_or_default().to_string();
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
            commit = now.commit;
            at = now.record;
        }
        if !fenced && why.is_empty() {
            return Err(RemoteError::Contended(self.l.cfg.name.clone()));
        }
        if !fenced {
            return Err(RemoteError::Unsettled {
                remote: self.l.cfg.name.clone(),
                why,
            });
        }
        let orphans = match branch {
            None => None,
            Some(b) => {
                let name = self.l.orphans_ref(&self.run);
                let keep = Update {
                    src: b.src,
                    dst: name.clone(),
                    expect: Expect::Absent,
                };
                let _ = self.l.git().push(&[keep]);
                Some(name)
            }
        };
        Ok(Settled::Fenced { orphans })
    }

    /// The run id this session leased under.
    pub(crate) fn run(&self) -> &str {
        &self.run
    }
}

/// The tick's state, with what a human changed in the record during the lease (`now`
/// differs from `leased` there) taken from the record: a human's halt stands.
fn merged(tick: &State, leased: &State, now: &State) -> State {
    let mut s = tick.clone();
    if now.halt != leased.halt && now.halt.is_some() {
        s.halt = now.halt.clone();
    }
    if now.current_phase != leased.current_phase {
        s.current_phase = now.current_phase.clone();
    }
    if now.current_task != leased.current_task {
        s.current_task = now.current_task.clone();
        s.task_source = now.task_source.clone();
    }
    if now.approvals != leased.approvals {
        s.approvals = now.approvals.clone();
        s.extra_iterations = now.extra_iterations;
    }
    s
}
