//! What a tick's processes may write (DESIGN §12): the loop's working directory (its
//! worktree; with worktrees off, each existing top-level entry of the project but `.git`
//! and `.loopflow`), the tick's private `TMPDIR`, `/dev/null`-like devices, the paths in
//! `[sandbox] write` and the agent's own state directories. Nothing else — not the loop's
//! state, log, lock or config, not the repository's `.git`.

use std::path::{Path, PathBuf};

use crate::config::{LoopConfig, SandboxMode};
use crate::sandbox::{Mode, Policy, Prepared, Sandbox, SandboxError, Shortfall};

/// The sandbox of one tick: the backend, the policy every spawn starts from, and what
/// the kernel gives for it.
pub struct Confinement {
    backend: Option<Box<dyn Sandbox>>,
    base: Policy,
    /// The project and its `.loopflow`, resolved: no agent state directory may be or hold
    /// the one, or lie inside the other.
    own: Option<(PathBuf, PathBuf)>,
    /// The last policy prepared (the extra paths it added, what the kernel got for it,
    /// and the identity of every path it names), reused while those paths are the same
    /// files: building a ruleset opens and adds a rule for each path (~40 syscalls), and
    /// a tick prepared one for the verdict, the audit command and every agent.
    last: std::sync::Mutex<Option<Reused>>,
}

struct Reused {
    extra: Vec<PathBuf>,
    prepared: Prepared,
    ids: Vec<Option<(u64, u64)>>,
}

/// (device, inode) of each path a policy's rules are bound to: a rule holds the file it
/// was made for, so a path deleted and made again since needs a new ruleset.
fn identities(p: &Policy) -> Vec<Option<(u64, u64)>> {
    p.write_dirs
        .iter()
        .chain(&p.write_files)
        .chain(&p.devices)
        .map(|f| {
            let m = std::fs::metadata(f).ok()?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::MetadataExt;
                Some((m.dev(), m.ino()))
            }
            #[cfg(not(unix))]
            {
                let _ = m;
                None
            }
        })
        .collect()
}

/// Whether the tick may run its agents, and what to say about it.
pub enum Verdict {
    /// Confined as asked (or `mode = "off"`).
    Ok,
    /// `mode = "auto"`: running with less than asked; the text says what is missing.
    Weaker(String),
    /// `mode = "enforce"` and the kernel cannot: no agent may run.
    Refused(String),
}

impl Confinement {
    /// The tick's confinement. `cwd` is where agents work, `tmp` the tick's `TMPDIR`.
    pub fn new(config: &LoopConfig, project: &Path, cwd: &Path, tmp: &Path) -> Confinement {
        let mode = config.sandbox.mode;
        if mode == SandboxMode::Off {
            return Confinement {
                backend: None,
                base: Policy::new(),
                own: None,
                last: Default::default(),
            };
        }
        let mut base = Policy::new()
            .network_deny(config.sandbox.deny_network)
            .mode(if mode == SandboxMode::Enforce {
                Mode::Enforce
            } else {
                Mode::BestEffort
            })
            .write_dir(tmp);
        if config.worktree {
            base = base.write_dir(cwd);
        } else {
            for (p, is_dir) in top_level_entries(project) {
                base = if is_dir {
                    base.write_dir(p)
                } else {
                    base.write_file(p)
                };
            }
        }
        for (p, _) in &config.sandbox.write {
            base = base.write_dir(p.clone());
        }
        let real = |p: &Path| {
            p.canonicalize()
                .unwrap_or_else(|_| crate::fs_safe::normalize(p))
        };
        Confinement {
            backend: Some(crate::sandbox::platform_default()),
            base,
            own: Some((real(project), real(&project.join(".loopflow")))),
            last: Default::default(),
        }
    }

    /// An agent's state directories (its preset's `sandbox_write`, expanded) split into
    /// those it may write and those it may not: one that is the project or holds it — a
    /// bare `~/.cache` with `XDG_CACHE_HOME=/tmp` and the project under `/tmp` — or lies
    /// inside its `.loopflow` would let the agent rewrite the loop's state and log.
    /// Compared once links and `..` are resolved (each is created first, as the agent
    /// would; a rule needs it to exist).
    fn split_state_dirs(&self, dirs: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
        let Some((project, own)) = &self.own else {
            return (dirs.to_vec(), Vec::new());
        };
        dirs.iter().cloned().partition(|d| {
            let _ = std::fs::create_dir_all(d);
            let real = d
                .canonicalize()
                .unwrap_or_else(|_| crate::fs_safe::normalize(d));
            !(project.starts_with(&real) || real.starts_with(own))
        })
    }

    /// What the kernel gives for the tick's policy, said once before any agent runs.
    pub fn verdict(&self) -> Verdict {
        if self.backend.is_none() {
            return Verdict::Ok;
        }
        match self.prepare(&[]) {
            Ok(None) => Verdict::Ok,
            Ok(Some(p)) => {
                let missing: Vec<String> = p
                    .shortfalls()
                    .iter()
                    .filter(|s| s.is_required() || matches!(s, Shortfall::SkippedPath(_)))
                    .map(ToString::to_string)
                    .collect();
                if missing.is_empty() {
                    Verdict::Ok
                } else {
                    Verdict::Weaker(missing.join("; "))
                }
            }
            Err(e) => Verdict::Refused(e.to_string()),
        }
    }

    /// A one-line account for `status`, `--dry-run` and `check --explain`.
    pub fn describe(&self) -> String {
        let Some(b) = &self.backend else {
            return "sandbox off: spawned processes may write anywhere the user can".into();
        };
        let writes: Vec<String> = self
            .base
            .write_dirs
            .iter()
            .chain(&self.base.write_files)
            .map(|p| p.display().to_string())
            .collect();
        let net = if self.base.network_deny {
            "no TCP"
        } else {
            "network open"
        };
        let enforced = match b.prepare(&self.base) {
            Ok(p) => {
                let e = p.enforced();
                let on: Vec<&str> = [
                    ("writes", e.files),
                    ("signals", e.signals),
                    ("TCP", e.network_tcp),
                ]
                .iter()
                .filter(|(_, on)| *on)
                .map(|(n, _)| *n)
                .collect();
                if on.is_empty() {
                    format!("{} (nothing enforced)", e.backend)
                } else {
                    format!("{} ABI {} confining {}", e.backend, e.abi, on.join(", "))
                }
            }
            Err(e) => format!("unavailable ({e})"),
        };
        format!(
            "sandbox {enforced}: processes write only {} (+ the agent's state dirs); {net}",
            writes.join(", ")
        )
    }

    /// The sandbox of one agent's spawn: the tick's policy plus the agent's state
    /// directories, less those [`Confinement::split_state_dirs`] refuses (returned, for
    /// the tick to say so).
    pub fn prepare_agent(
        &self,
        state_dirs: &[PathBuf],
    ) -> (Result<Option<Prepared>, SandboxError>, Vec<PathBuf>) {
        let (granted, refused) = self.split_state_dirs(state_dirs);
        (self.prepare(&granted), refused)
    }

    /// The sandbox of one spawn: the tick's policy plus `extra` directories, which exist
    /// ([`Confinement::split_state_dirs`] made them: a rule needs the directory). `None`
    /// when the sandbox is off.
    ///
    /// The ruleset of the previous call is reused when it was made for the same extra
    /// paths and every path of the policy is still the file it was then (one `stat` each).
    pub fn prepare(&self, extra: &[PathBuf]) -> Result<Option<Prepared>, SandboxError> {
        let Some(b) = &self.backend else {
            return Ok(None);
        };
        let mut policy = self.base.clone();
        for d in extra {
            policy = policy.write_dir(d.clone());
        }
        let ids = identities(&policy);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = last.as_ref()
            && r.extra == extra
            && r.ids == ids
        {
            return Ok(Some(r.prepared.clone()));
        }
        let prepared = b.prepare(&policy)?;
        *last = Some(Reused {
            extra: extra.to_vec(),
            prepared: prepared.clone(),
            ids,
        });
        Ok(Some(prepared))
    }
}

/// With worktrees off, what agents may write: every existing top-level entry of the
/// project but `.git` and `.loopflow` (directories whole, files as files: a new
/// top-level file cannot be created).
fn top_level_entries(project: &Path) -> Vec<(PathBuf, bool)> {
    let Ok(rd) = std::fs::read_dir(project) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, bool)> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy().to_lowercase();
            n != ".git" && n != ".loopflow"
        })
        .filter_map(|e| {
            let t = e.file_type().ok()?;
            // A symlink is followed by the rule: one pointing outside the project would
            // widen the sandbox, so only real entries count.
            if t.is_symlink() {
                return None;
            }
            Some((e.path(), t.is_dir()))
        })
        .collect();
    out.sort();
    out
}
