//! Kernel sandboxing for the processes nodes spawn (DESIGN §12).
//!
//! The model: loopflow builds a [`Policy`] per tick, asks a [`Sandbox`] backend to
//! [`prepare`](Sandbox::prepare) it — all the expensive, allocating, fallible work happens
//! here, in the parent, once — and gets a [`Prepared`] back. `Prepared` says exactly what
//! the kernel will enforce ([`Enforced`], [`Prepared::shortfalls`]) and starts confined
//! processes ([`Prepared::launch`]): each child confines itself before `exec`
//! ([`launch`]).
//!
//! Backends:
//! * [`LandlockSandbox`] (Linux): a session of its own for every child, no capability,
//!   Landlock read and write confinement, signal and abstract-unix-socket scoping, TCP only
//!   to the tick's proxy (or none), and a seccomp filter for what Landlock does not cover
//!   ([`seccomp`]: other processes, shared kernel objects, privilege, the terminal, the
//!   sockets). Execution stays open wherever reading is.
//! * [`NoSandbox`]: enforces nothing and says so (other OSes, or opt-out).
//!   A macOS Seatbelt backend would slot in next to these: its `Prepared` would
//!   spawn `sandbox-exec -p <profile> -- program`.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

#[cfg(target_os = "linux")]
pub(crate) mod launch;
#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub(crate) use linux::LandlockSandbox;
pub(crate) mod net;
pub(crate) mod proxy;
#[cfg(target_os = "linux")]
pub(crate) mod seccomp;

/// What a confined process may do with the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Net {
    /// Unconfined.
    #[default]
    Open,
    /// No socket beyond local pipes.
    Deny,
    /// TCP to this address (the tick's proxy) and nothing else.
    Proxy(std::net::SocketAddr),
}

/// The devices a sandboxed process may open (read, write, `ioctl`) by default: the only
/// part of `/dev` it reaches. Not `/dev/pts` (other terminals: the user's shell), not
/// `/dev/shm` or `/dev/mqueue` (what other processes share). `/dev/tty` answers `ENXIO`
/// (no controlling terminal); `/dev/ptmx` makes a new pty nobody else reads.
/// Paths that do not exist on the host are skipped like any other path.
pub(crate) const DEFAULT_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
];

/// What every confined process may read of the system (with `confine_reads`): the
/// programs, libraries and configuration; `/run/systemd/resolve` because
/// `/etc/resolv.conf` links there. Plus the non-process entries of `/proc` (Linux) but the
/// user's keys, and [`DEFAULT_DEVICES`] of `/dev`.
pub(crate) const SYSTEM_READS: &[&str] = &[
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/bin",
    "/sbin",
    "/etc",
    "/opt",
    "/sys",
    "/nix/store",
    "/snap",
    "/run/systemd/resolve",
];

/// What to do when the kernel cannot enforce part of the policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Enforce what the kernel supports, report the rest ([`Prepared::shortfalls`]).
    #[default]
    BestEffort,
    /// [`Sandbox::prepare`] fails with [`SandboxError::NotEnforced`] if any
    /// *required* guarantee ([`Shortfall::is_required`]) is missing.
    Enforce,
}

/// What a sandboxed process may do. Everything not listed as writable is
/// read-only; with `confine_reads`, everything not listed as readable (or
/// writable) cannot be opened at all.
///
/// Paths are resolved (and symlinks followed) when the policy is prepared,
/// relative to the parent's current directory. A path that does not exist at
/// that time is *skipped* (never created) and reported in
/// [`Enforced::skipped`]: create the directories you own before preparing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Directory trees where everything is allowed (create, remove, write,
    /// truncate, rename, mkdir, symlink, mkfifo, mknod, ...).
    pub write_dirs: Vec<PathBuf>,
    /// Single existing files that may be opened for writing and truncated.
    /// This does NOT allow creating, deleting or renaming over the file (see
    /// NOTES.md, "file rules"). A directory given here is treated like a
    /// `write_dirs` entry.
    pub write_files: Vec<PathBuf>,
    /// Device nodes (or device directories such as `/dev/pts`) that may be
    /// opened for writing and `ioctl`ed. Defaults to [`DEFAULT_DEVICES`].
    pub devices: Vec<PathBuf>,
    /// Trees (or single files) that may be read, listed and executed.
    pub read_dirs: Vec<PathBuf>,
    /// Reads are an allowlist: `read_dirs`, the writable paths and the devices.
    pub confine_reads: bool,
    pub net: Net,
    /// Forbid connecting to abstract UNIX sockets created outside the sandbox
    /// (X11, some D-Bus setups, ...). Default: true.
    pub scope_abstract_unix: bool,
    pub mode: Mode,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            write_dirs: Vec::new(),
            write_files: Vec::new(),
            devices: DEFAULT_DEVICES.iter().map(PathBuf::from).collect(),
            read_dirs: Vec::new(),
            confine_reads: false,
            net: Net::Open,
            scope_abstract_unix: true,
            mode: Mode::BestEffort,
        }
    }
}

impl Policy {
    pub(crate) fn new() -> Self {
        Self::default()
    }
    pub(crate) fn write_dir(mut self, p: impl Into<PathBuf>) -> Self {
        self.write_dirs.push(p.into());
        self
    }
    pub(crate) fn write_file(mut self, p: impl Into<PathBuf>) -> Self {
        self.write_files.push(p.into());
        self
    }
    pub(crate) fn read_dir(mut self, p: impl Into<PathBuf>) -> Self {
        self.read_dirs.push(p.into());
        self
    }
    pub(crate) fn net(mut self, net: Net) -> Self {
        self.net = net;
        self
    }
    /// `net(Net::Deny)` when `deny`, else open.
    #[cfg(test)]
    pub(crate) fn network_deny(self, deny: bool) -> Self {
        self.net(if deny { Net::Deny } else { Net::Open })
    }
    fn network_limited(&self) -> bool {
        self.net != Net::Open
    }
    pub(crate) fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }
}

/// What the kernel actually gave, for this policy. All `false` for
/// [`NoSandbox`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Enforced {
    /// Backend name ("landlock", "none").
    pub backend: &'static str,
    /// Landlock ABI reported by the kernel (0 = no Landlock).
    pub abi: u32,
    /// Writes are confined to the policy's paths (Landlock ABI >= 1).
    pub files: bool,
    /// Reads are confined to the policy's paths (Landlock ABI >= 1, if asked).
    pub reads: bool,
    /// Cross-directory rename/link is governed by the rules (ABI >= 2). When
    /// `files && !refer`, such renames/links are *always* denied (EXDEV),
    /// even between allowed dirs: more restrictive, not less.
    pub refer: bool,
    /// `truncate(2)`/`O_TRUNC` outside the allowed paths is denied (ABI >= 3).
    /// When `files && !truncate`, files outside CAN be truncated.
    pub truncate: bool,
    /// `ioctl` on devices opened inside the sandbox is limited to the
    /// device rules (ABI >= 5).
    pub ioctl_dev: bool,
    /// Cannot signal processes outside its domain (ABI >= 6).
    pub signals: bool,
    /// Cannot connect to abstract UNIX sockets outside its domain (ABI >= 6,
    /// and only if requested).
    pub abstract_unix: bool,
    /// TCP connect and bind are denied (ABI >= 4, and only if requested).
    pub network_tcp: bool,
    /// UDP bind/connect/send are denied (ABI >= 10, only if requested).
    pub network_udp: bool,
    /// The seccomp socket filter (no UDP, raw, packet or unix sockets; connect
    /// decided by loopflow) is installed (only if the network is limited).
    pub socket_filter: bool,
    /// `PR_SET_NO_NEW_PRIVS` is set in the child (setuid bits are ignored).
    pub no_new_privs: bool,
    /// The seccomp filter's process rules are installed: no reaching other processes by
    /// other means than signals, no shared kernel objects, no `TIOCSTI`, no namespaces.
    pub process_filter: bool,
    /// Every capability is dropped in the child, root included, none to regain at exec.
    pub privileges: bool,
    /// The child runs in a session of its own, without a controlling terminal.
    pub session: bool,
    /// Policy paths that did not exist at prepare time and got no rule.
    pub skipped: Vec<PathBuf>,
}

impl fmt::Display for Enforced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} abi={}", self.backend, self.abi)?;
        let flags = [
            ("files", self.files),
            ("reads", self.reads),
            ("refer", self.refer),
            ("truncate", self.truncate),
            ("ioctl-dev", self.ioctl_dev),
            ("signals", self.signals),
            ("abstract-unix", self.abstract_unix),
            ("net-tcp", self.network_tcp),
            ("net-udp", self.network_udp),
            ("socket-filter", self.socket_filter),
            ("no-new-privs", self.no_new_privs),
            ("process-filter", self.process_filter),
            ("no-privileges", self.privileges),
            ("own-session", self.session),
        ];
        for (name, on) in flags {
            if on {
                write!(f, " +{name}")?;
            }
        }
        if !self.skipped.is_empty() {
            write!(f, " skipped={:?}", self.skipped)?;
        }
        Ok(())
    }
}

/// One thing the policy asked for that the kernel will not enforce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shortfall {
    /// No write confinement at all.
    Files,
    /// Reads are not confined (no Landlock).
    Reads,
    /// No seccomp user notification on this kernel: UDP, raw and unix sockets,
    /// and TCP to any address on the proxy's port, stay possible.
    SocketFilter,
    /// No seccomp filter at all: other processes stay reachable through `prlimit`,
    /// `setpriority` and the like, and the user's keyring and SysV IPC through theirs.
    ProcessFilter,
    /// Truncation outside the allowed paths is not blocked (ABI < 3).
    Truncate,
    /// Cross-directory renames are always denied (ABI < 2); functional, not a hole.
    Refer,
    /// Device ioctls are not restricted (ABI < 5).
    IoctlDev,
    /// The process can signal (e.g. kill) loopflow and siblings (ABI < 6).
    Signals,
    /// Abstract UNIX sockets outside the sandbox are reachable (ABI < 6).
    AbstractUnix,
    /// `network = "deny"` but TCP is not blocked (ABI < 4).
    NetworkTcp,
    /// `network = "deny"` but UDP is not blocked (ABI < 10).
    NetworkUdp,
    /// A policy path did not exist and got no rule.
    SkippedPath(PathBuf),
}

impl Shortfall {
    /// Required guarantees make [`Mode::Enforce`] refuse to run. The others
    /// are only worth a WARN.
    pub fn is_required(&self) -> bool {
        matches!(
            self,
            Shortfall::Files
                | Shortfall::Reads
                | Shortfall::Truncate
                | Shortfall::Signals
                | Shortfall::NetworkTcp
                | Shortfall::SocketFilter
                | Shortfall::ProcessFilter
        )
    }
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shortfall::Files => f.write_str("writes are not confined (no Landlock)"),
            Shortfall::Reads => f.write_str("reads are not confined (no Landlock)"),
            Shortfall::SocketFilter => f.write_str(
                "no seccomp socket filter (UDP, raw and unix sockets stay open; needs seccomp user notification, Linux >= 5.6)",
            ),
            Shortfall::ProcessFilter => f.write_str(
                "no seccomp filter (other processes reachable through prlimit, setpriority and the like; the keyring and SysV IPC shared)",
            ),
            Shortfall::Truncate => {
                f.write_str("truncate outside allowed paths is not blocked (Landlock ABI < 3)")
            }
            Shortfall::Refer => {
                f.write_str("cross-directory rename/link always denied (Landlock ABI < 2)")
            }
            Shortfall::IoctlDev => f.write_str("device ioctls not restricted (Landlock ABI < 5)"),
            Shortfall::Signals => {
                f.write_str("can signal processes outside the sandbox (Landlock ABI < 6)")
            }
            Shortfall::AbstractUnix => f.write_str(
                "abstract unix sockets outside the sandbox reachable (Landlock ABI < 6)",
            ),
            Shortfall::NetworkTcp => f.write_str("TCP is not confined (Landlock ABI < 4)"),
            Shortfall::NetworkUdp => {
                f.write_str("UDP is not confined by Landlock (ABI < 10; the socket filter covers it)")
            }
            Shortfall::SkippedPath(p) => write!(f, "path {} does not exist, no rule", p.display()),
        }
    }
}

fn shortfall_list(v: &[Shortfall]) -> String {
    v.iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("; ")
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SandboxError {
    #[cfg(target_os = "linux")]
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("cannot use sandbox path {}: {source}", path.display())]
    Path { path: PathBuf, source: io::Error },
    #[error("sandbox mode is enforce but: {}", shortfall_list(missing))]
    NotEnforced { missing: Vec<Shortfall> },
    #[error("the network proxy: {0}")]
    Proxy(io::Error),
}

/// A sandbox backend. Object safe, so loopflow can hold a `Box<dyn Sandbox>`
/// chosen at startup ([`platform_default`]).
pub(crate) trait Sandbox: Send + Sync {
    /// Build everything needed to sandbox processes under `policy`. Fails in
    /// [`Mode::Enforce`] if a required guarantee is missing.
    fn prepare(&self, policy: &Policy) -> Result<Prepared, SandboxError>;

    /// What [`Sandbox::prepare`] would leave out ([`Prepared::shortfalls`]), or its
    /// [`SandboxError::NotEnforced`], without building what it would build (the verdict a
    /// tick says once before its agents run).
    fn assess(&self, policy: &Policy) -> Result<Vec<Shortfall>, SandboxError> {
        self.prepare(policy).map(|p| p.shortfalls().to_vec())
    }
}

/// What this machine's kernel can confine, in one line for `status` and `check --explain`.
pub(crate) fn kernel_summary() -> String {
    #[cfg(target_os = "linux")]
    {
        let filter = match seccomp::available(false) {
            true => "; a seccomp filter keeps them from other processes and shared kernel objects",
            false => "; no seccomp: other processes stay reachable",
        };
        match LandlockSandbox::kernel_abi() {
            0 => format!(
                "this kernel has no Landlock: agents' files, network and signals are unconfined (mode \"auto\" warns each tick, \"enforce\" runs none){filter}"
            ),
            abi => {
                let mut what = vec!["reads", "writes"];
                if abi >= 4 {
                    what.push("TCP");
                }
                if abi >= 6 {
                    what.push("signals");
                }
                format!("Landlock ABI {abi} confines {}{filter}", what.join(", "))
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        "no sandbox backend for this OS yet: agents run unconfined (mode \"auto\" warns each tick, \"enforce\" runs none)".into()
    }
}

/// The best backend for this OS.
pub(crate) fn platform_default() -> Box<dyn Sandbox> {
    #[cfg(target_os = "linux")]
    {
        Box::new(LandlockSandbox::new())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Box::new(NoSandbox)
    }
}

/// Enforces nothing; [`Enforced`] is all `false`, so every requested
/// guarantee shows up as a [`Shortfall`].
#[cfg(any(not(target_os = "linux"), test))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct NoSandbox;

#[cfg(any(not(target_os = "linux"), test))]
impl Sandbox for NoSandbox {
    fn prepare(&self, policy: &Policy) -> Result<Prepared, SandboxError> {
        let enforced = Enforced {
            backend: "none",
            ..Enforced::default()
        };
        Prepared::finish(policy, enforced, Hook::None)
    }
}

/// How the child gets confined.
#[derive(Clone, Debug)]
pub(crate) enum Hook {
    #[cfg(any(not(target_os = "linux"), test))]
    None,
    /// What each child does to itself before `exec` (the Landlock ruleset fd, the seccomp
    /// filter, the privileges to drop), shared by every spawn of the tick. Each spawn gets
    /// its own Landlock domain.
    #[cfg(target_os = "linux")]
    Confine(Arc<linux::Confiner>),
}

/// A prepared sandbox: cheap to clone, reusable for any number of spawns (each child
/// confines itself with the same ruleset and filter); [`Prepared::with_client`] gives one
/// spawn its network.
#[derive(Clone, Debug)]
pub struct Prepared {
    enforced: Arc<Enforced>,
    shortfalls: Arc<Vec<Shortfall>>,
    hook: Hook,
    net: Option<Arc<net::Client>>,
}

impl Prepared {
    pub(crate) fn finish(
        policy: &Policy,
        enforced: Enforced,
        hook: Hook,
    ) -> Result<Prepared, SandboxError> {
        let shortfalls = check_enforce(policy, &enforced)?;
        Ok(Prepared {
            enforced: Arc::new(enforced),
            shortfalls: Arc::new(shortfalls),
            hook,
            net: None,
        })
    }

    /// What the kernel will enforce for processes built from this.
    pub fn enforced(&self) -> &Enforced {
        &self.enforced
    }

    /// What the policy asked for and will not get (WARN these once per tick).
    pub fn shortfalls(&self) -> &[Shortfall] {
        &self.shortfalls
    }

    /// This sandbox for one spawn whose connections are `client`'s (its hosts, its
    /// refusals).
    pub fn with_client(&self, client: net::Client) -> Prepared {
        Prepared {
            net: Some(Arc::new(client)),
            ..self.clone()
        }
    }

    /// Starts `program` confined, `stdio` as its fds 0–2 (see [`launch::launch`]); under
    /// a proxy, its connects go to this spawn's client from now on.
    #[cfg(target_os = "linux")]
    pub fn launch(
        &self,
        program: &launch::Program,
        stdio: [std::os::fd::RawFd; 3],
    ) -> io::Result<launch::Child> {
        let confine = match &self.hook {
            #[cfg(test)]
            Hook::None => None,
            Hook::Confine(c) => Some(&**c),
        };
        let (child, listener) = launch::launch(program, stdio, confine)?;
        match (listener, &self.net) {
            (Some(l), Some(client)) => client.watch(l),
            // No client, no supervisor: its connects fail (ENOSYS) once this closes.
            (Some(l), None) => drop(l),
            (None, _) => {}
        }
        Ok(child)
    }

    /// The connections refused to this spawn so far (`host:port`), each once; drains.
    pub fn take_refused(&self) -> Vec<String> {
        self.net
            .as_ref()
            .map(|c| c.take_refused())
            .unwrap_or_default()
    }
}

/// What `policy` asked for and `e` does not give; under [`Mode::Enforce`] an error when
/// a required part is missing.
pub(crate) fn check_enforce(policy: &Policy, e: &Enforced) -> Result<Vec<Shortfall>, SandboxError> {
    let shortfalls = compute_shortfalls(policy, e);
    if policy.mode == Mode::Enforce {
        let missing: Vec<Shortfall> = shortfalls
            .iter()
            .filter(|s| s.is_required())
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(SandboxError::NotEnforced { missing });
        }
    }
    Ok(shortfalls)
}

pub(crate) fn compute_shortfalls(policy: &Policy, e: &Enforced) -> Vec<Shortfall> {
    let mut v = Vec::new();
    if !e.files {
        v.push(Shortfall::Files);
        if policy.confine_reads {
            v.push(Shortfall::Reads);
        }
    } else {
        if !e.truncate {
            v.push(Shortfall::Truncate);
        }
        if !e.refer {
            v.push(Shortfall::Refer);
        }
        if !e.ioctl_dev {
            v.push(Shortfall::IoctlDev);
        }
    }
    if !e.signals {
        v.push(Shortfall::Signals);
    }
    if !e.process_filter {
        v.push(Shortfall::ProcessFilter);
    }
    if policy.scope_abstract_unix && !e.abstract_unix {
        v.push(Shortfall::AbstractUnix);
    }
    if policy.network_limited() {
        if !e.network_tcp {
            v.push(Shortfall::NetworkTcp);
        }
        if !e.network_udp && !e.socket_filter {
            v.push(Shortfall::NetworkUdp);
        }
        if !e.socket_filter {
            v.push(Shortfall::SocketFilter);
        }
    }
    v.extend(e.skipped.iter().cloned().map(Shortfall::SkippedPath));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_backend_reports_everything_missing() {
        let p = Policy::new().network_deny(true);
        let prepared = NoSandbox.prepare(&p).unwrap();
        assert!(!prepared.enforced().files);
        let s = prepared.shortfalls();
        assert!(s.contains(&Shortfall::Files));
        assert!(s.contains(&Shortfall::Signals));
        assert!(s.contains(&Shortfall::NetworkTcp));
        let err = NoSandbox.prepare(&p.mode(Mode::Enforce)).unwrap_err();
        assert!(matches!(err, SandboxError::NotEnforced { .. }), "{err}");
        assert!(err.to_string().contains("not confined"), "{err}");
    }
}
