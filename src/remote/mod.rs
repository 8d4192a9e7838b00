//! A loop whose state of record lives in its repository (DESIGN §16): the state ref
//! `refs/loopflow/<loop>/state`, a chain of commits whose tree holds `state.json`, `log`,
//! `slots` and, while a tick holds the loop, `lease.json`; every change to it a
//! compare-and-swap push. This file reads and writes that record and keeps the local
//! `.state.loop`/`.state.log` as its cache; [`tick`] is a runner's protocol (lease, slot,
//! fencing, checkpoints, settle), [`human`] the read-modify-write every human verb uses.

use crate::config::RemoteConfig;
use crate::git::GitError;
use crate::git::remote::{Auth, Expect, FetchError, Pushed, Update};
use crate::state::{LoopPaths, State, StateError};

pub(crate) mod human;
mod lease;
pub(crate) mod tick;

pub(crate) use lease::{Lease, duration as lease_duration, tick_limit};

/// How many slots the record remembers (a slot older than all of them is not recognised).
const SLOTS_KEPT: usize = 256;

/// Why a remote loop's record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("remote {remote}: {source}")]
    Git {
        remote: String,
        #[source]
        source: GitError,
    },
    #[error("{0}")]
    State(#[from] StateError),
    #[error(
        "loop {name}'s state ref {state_ref} is not on remote {remote}: the loop was never started there (`loopflow create --loop {name} --remote {remote}` starts it)"
    )]
    Untracked {
        name: String,
        remote: String,
        state_ref: String,
    },
    #[error(
        "refused: a tick of loop {name} holds its lease (run {run} on {holder}, until {until}); approvals are made by a human between ticks"
    )]
    LeaseHeld {
        name: String,
        run: String,
        holder: String,
        until: String,
    },
    #[error(
        "remote {0}: the state ref kept changing under this command; nothing was written (try again)"
    )]
    Contended(String),
    #[error("{0}")]
    Refused(String),
    #[error(
        "remote {remote} did not take the tick's result ({why}); nothing of it was recorded, and once its lease ends the next tick records it as aborted, with the spend it checkpointed"
    )]
    Unsettled { remote: String, why: String },
}

/// The record the state ref's commit holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub state: State,
    /// The event log (DESIGN §8), whole.
    pub log: Vec<u8>,
    pub lease: Option<Lease>,
    /// The slots ticked so far, oldest first (the last [`SLOTS_KEPT`]).
    pub slots: Vec<String>,
}

impl Record {
    /// The files of the state ref's tree, in tree order.
    fn files(&self) -> Result<Vec<(&'static str, Vec<u8>)>, StateError> {
        let mut files = Vec::new();
        if let Some(l) = &self.lease {
            files.push(("lease.json", to_json(l)?));
        }
        files.push(("log", self.log.clone()));
        if !self.slots.is_empty() {
            let mut s = self.slots.join("\n");
            s.push('\n');
            files.push(("slots", s.into_bytes()));
        }
        files.push(("state.json", to_json(&portable(&self.state))?));
        Ok(files)
    }

    /// Appends one event line (DESIGN §8's format) to the record's log.
    pub(crate) fn log(&mut self, event: crate::state::Event, args: &[crate::state::LogArg<'_>]) {
        self.log
            .extend_from_slice(crate::state::log::line(event, args).as_bytes());
    }

    /// Remembers `slot` as ticked.
    fn take_slot(&mut self, slot: &str) {
        self.slots.push(slot.to_string());
        if self.slots.len() > SLOTS_KEPT {
            let drop = self.slots.len() - SLOTS_KEPT;
            self.slots.drain(..drop);
        }
    }
}

/// Pretty JSON with a final newline, for the record's files.
fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, StateError> {
    let mut b = serde_json::to_vec_pretty(v).map_err(|e| StateError::Io {
        path: "state.json".into(),
        source: std::io::Error::other(e),
    })?;
    b.push(b'\n');
    Ok(b)
}

/// The state as the record keeps it: nothing that names a path of one machine (the
/// worktree is found or made from the branch wherever a tick runs).
fn portable(s: &State) -> State {
    State {
        worktree_path: None,
        ..s.clone()
    }
}

/// The state ref's commit and what it holds, and where the loop's branch is, as fetched.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub commit: String,
    pub record: Record,
    /// The tip of `loopflow/<loop>` on the remote (`None`: no such branch).
    pub branch: Option<String>,
}

/// One loop whose `loop.toml` has `[remote]`, with what its git needs to reach it.
pub(crate) struct RemoteLoop<'a> {
    pub paths: &'a LoopPaths,
    pub cfg: RemoteConfig,
    pub auth: Auth,
}

/// The loop's `[remote]`, when its `loop.toml` has one. Only a file that mentions
/// `remote` at all is parsed for it: a local loop's tick pays one small read.
pub(crate) fn configured(
    paths: &LoopPaths,
) -> Result<Option<RemoteConfig>, crate::load::LoadError> {
    let Ok((_, text)) = paths.read_config() else {
        return Ok(None);
    };
    if memchr::memmem::find(text.as_bytes(), b"remote").is_none() {
        return Ok(None);
    }
    let base = std::env::current_dir().unwrap_or_else(|_| paths.project.clone());
    crate::load::config(paths, &base).map(|c| c.remote)
}

impl<'a> RemoteLoop<'a> {
    /// The loop at `paths` when it is a remote one; the credential from the environment.
    pub(crate) fn open(paths: &'a LoopPaths) -> Result<Option<RemoteLoop<'a>>, OpenError> {
        let Some(cfg) = configured(paths).map_err(OpenError::Config)? else {
            return Ok(None);
        };
        let auth = Auth::from_env().map_err(|e| OpenError::Remote(git_err(&cfg.name, e)))?;
        Ok(Some(RemoteLoop { paths, cfg, auth }))
    }

    /// `refs/loopflow/<loop>/state` on the remote.
    pub(crate) fn state_ref(&self) -> String {
        format!("refs/loopflow/{}/state", self.paths.name)
    }

    /// `refs/heads/loopflow/<loop>` on the remote (and, as a local branch, where ticks
    /// commit).
    pub(crate) fn branch_ref(&self) -> String {
        format!("refs/heads/loopflow/{}", self.paths.name)
    }

    /// `refs/loopflow/<loop>/orphans/<run>`: a fenced runner's commits, for `review`.
    pub(crate) fn orphans_ref(&self, run: &str) -> String {
        format!("refs/loopflow/{}/orphans/{run}", self.paths.name)
    }

    /// The local copies of the remote's refs (a namespace of their own: never a branch).
    fn copy(&self, what: &str) -> String {
        format!(
            "refs/loopflow-remote/{}/{}/{what}",
            self.cfg.name, self.paths.name
        )
    }

    fn git(&self) -> crate::git::remote::Remote<'_> {
        crate::git::remote::Remote {
            repo: &self.paths.project,
            name: &self.cfg.name,
            auth: &self.auth,
        }
    }

    fn err(&self, e: GitError) -> RemoteError {
        git_err(&self.cfg.name, e)
    }

    /// Fetches the state ref and the branch (one round trip when both exist) and reads
    /// the record. `None`: the loop has no state ref there (never started).
    pub(crate) fn fetch(&self) -> Result<Option<Snapshot>, RemoteError> {
        let (state_ref, branch_ref) = (self.state_ref(), self.branch_ref());
        let (state_copy, branch_copy) = (self.copy("state"), self.copy("branch"));
        let repo = &self.paths.project;
        let both = [
            (state_ref.as_str(), state_copy.as_str()),
            (branch_ref.as_str(), branch_copy.as_str()),
        ];
        let mut branch = true;
        match self.git().fetch(&both) {
            Ok(()) => {}
            Err(FetchError::Git(e)) => return Err(self.err(e)),
            Err(FetchError::Missing) => {
                let there = self
                    .git()
                    .list(&[&state_ref, &branch_ref])
                    .map_err(|e| self.err(e))?;
                let has = |r: &str| there.iter().any(|(n, _)| n == r);
                if !has(&state_ref) {
                    let _ = crate::git::remote::delete_ref(repo, &state_copy);
                    return Ok(None);
                }
                branch = has(&branch_ref);
                let pairs: Vec<(&str, &str)> = both[..if branch { 2 } else { 1 }].to_vec();
                match self.git().fetch(&pairs) {
                    Ok(()) => {}
                    // Deleted between the two looks: as good as never there.
                    Err(FetchError::Missing) => return Ok(None),
                    Err(FetchError::Git(e)) => return Err(self.err(e)),
                }
            }
        }
        if !branch {
            let _ = crate::git::remote::delete_ref(repo, &branch_copy);
        }
        let commit = crate::git::rev(repo, &state_copy)
            .map_err(|e| self.err(e))?
            .ok_or_else(|| {
                self.err(GitError::Unexpected {
                    what: "fetch".into(),
                    output: format!("{state_copy} missing after the fetch"),
                })
            })?;
        let branch = if branch {
            crate::git::rev(repo, &branch_copy).map_err(|e| self.err(e))?
        } else {
            None
        };
        let record = self.read(&commit)?;
        Ok(Some(Snapshot {
            commit,
            record,
            branch,
        }))
    }

    /// The record in state ref commit `commit` (local objects).
    fn read(&self, commit: &str) -> Result<Record, RemoteError> {
        let files = crate::git::remote::read_files(
            &self.paths.project,
            commit,
            &["state.json", "log", "lease.json", "slots"],
        )
        .map_err(|e| self.err(e))?;
        let [state, log, lease, slots] = <[Option<Vec<u8>>; 4]>::try_from(files)
            .map_err(|_| RemoteError::Refused("cat-file gave the wrong count".into()))?;
        let place = |f: &str| {
            std::path::PathBuf::from(format!("{}:{}:{f}", self.cfg.name, self.state_ref()))
        };
        let corrupt = |f: &str, message: String| {
            RemoteError::State(StateError::Corrupt {
                path: place(f),
                line: 0,
                column: 0,
                message,
            })
        };
        let state = state.ok_or_else(|| corrupt("state.json", "missing".into()))?;
        let state =
            crate::state::from_text(&place("state.json"), &String::from_utf8_lossy(&state))?;
        let lease = match lease {
            Some(b) => {
                Some(serde_json::from_slice(&b).map_err(|e| corrupt("lease.json", e.to_string()))?)
            }
            None => None,
        };
        let slots = slots
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Record {
            state,
            log: log.unwrap_or_default(),
            lease,
            slots,
        })
    }

    /// Replaces the local cache (`.state.loop`, `.state.log`) with the record's.
    pub(crate) fn write_cache(&self, rec: &Record) -> Result<(), RemoteError> {
        let mut state = portable(&rec.state);
        // Locally the worktree is wherever this clone keeps it.
        state.worktree_path = None;
        self.paths.replace_all(&state, &rec.log)?;
        Ok(())
    }

    /// Writes `rec` as a commit on `parent` and pushes it to the state ref, expecting the
    /// ref at `parent` — with `branch` in the same atomic push when given. Returns how it
    /// went and the commit pushed.
    pub(crate) fn push(
        &self,
        parent: Option<&str>,
        rec: &Record,
        branch: Option<Update>,
        message: &str,
    ) -> Result<(Pushed, String), RemoteError> {
        let files = rec.files()?;
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let commit = crate::git::remote::write_commit(&self.paths.project, &refs, parent, message)
            .map_err(|e| self.err(e))?;
        let mut updates = vec![Update {
            src: commit.clone(),
            dst: self.state_ref(),
            expect: parent.map_or(Expect::Absent, |p| Expect::At(p.to_string())),
        }];
        updates.extend(branch);
        let pushed = self.git().push(&updates).map_err(|e| self.err(e))?;
        if pushed == Pushed::Accepted {
            // The local copies follow, so the next look starts from here.
            let _ = crate::git::remote::set_ref(&self.paths.project, &self.copy("state"), &commit);
            if let Some(u) = updates.get(1) {
                let _ =
                    crate::git::remote::set_ref(&self.paths.project, &self.copy("branch"), &u.src);
            }
        }
        Ok((pushed, commit))
    }

    /// The local branch `loopflow/<loop>`'s tip (`None`: none).
    pub(crate) fn local_branch(&self) -> Option<String> {
        crate::git::rev(&self.paths.project, &self.branch_ref())
            .ok()
            .flatten()
    }

    /// An update of the remote branch to the local branch's tip, when it moved from
    /// `fetched` (the remote tip the work started from).
    pub(crate) fn branch_update(&self, fetched: Option<&str>) -> Option<Update> {
        let tip = self.local_branch()?;
        if Some(tip.as_str()) == fetched {
            return None;
        }
        Some(Update {
            src: tip,
            dst: self.branch_ref(),
            expect: fetched.map_or(Expect::Absent, |f| Expect::At(f.to_string())),
        })
    }
}

/// Why a loop's remote could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("invalid configuration")]
    Config(crate::load::LoadError),
    #[error(transparent)]
    Remote(RemoteError),
}

fn git_err(remote: &str, source: GitError) -> RemoteError {
    RemoteError::Git {
        remote: remote.to_string(),
        source,
    }
}
