//! Landlock backend.
//!
//! Ruleset building uses the `landlock` crate (0.4.8). Two things are done
//! with raw syscalls, because the crate cannot do them:
//!
//! 1. **Applying the ruleset in `pre_exec`.** `RulesetCreated::restrict_self`
//!    consumes the ruleset, returns its `RestrictionStatus` *in the child*
//!    (where nobody can read it), and is not documented as async-signal-safe.
//!    So the parent extracts the ruleset fd through the crate's public
//!    `From<RulesetCreated> for Option<OwnedFd>` and the child only calls
//!    `prctl(PR_SET_NO_NEW_PRIVS)` + `landlock_restrict_self(fd, 0)`.
//! 2. **Querying the kernel ABI.** The crate deliberately keeps
//!    `LandlockStatus::current()` private (it only surfaces it after
//!    `restrict_self`), but loopflow must know what will be enforced *before*
//!    spawning. One `landlock_create_ruleset(NULL, 0, VERSION)` call gives it;
//!    the enforced set is then computed with the crate's own per-ABI tables
//!    (`AccessFs::from_write(abi)`, `Scope::from_all(abi)`,
//!    `AccessNet::from_all(abi)`), i.e. exactly what the crate's best-effort
//!    logic hands to the kernel.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use landlock::{
    ABI, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath,
    PathFd, PathFdError, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
};

use super::seccomp::{self, Filter};
use super::{
    DEFAULT_DEVICES, Enforced, Hook, Net, Policy, Prepared, SYSTEM_READS, Sandbox, SandboxError,
    Shortfall,
};

/// Reading: files and directory listings (execution stays unhandled, so whatever may
/// be read may be run).
fn read_access() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir
}

/// What a spawned child does to itself before `exec` (see [`super::launch`]): drop every
/// capability, enter the Landlock domain (when the kernel has Landlock) and install the
/// seccomp filter (when it has seccomp). Built once per tick and shared by its spawns.
pub(crate) struct Confiner {
    ruleset: Option<OwnedFd>,
    filter: Option<Filter>,
    /// Reads are confined: the child is given its own `/proc/<pid>` (Bun, JavaScriptCore
    /// read `/proc/self/maps` or abort), which no rule made before it exists can name.
    proc_self: bool,
    /// This process holds `CAP_SETPCAP`: the child can empty its bounding set and lock the
    /// securebits (root). Without it there is nothing a child could regain at `exec`
    /// beyond what no_new_privs already stops.
    bounding: bool,
    /// `/proc/sys/kernel/cap_last_cap`.
    last_cap: libc::c_ulong,
    /// The securebits the child sets: this process's own (a locked one cannot be
    /// cleared) and those that keep uid 0 from regaining anything.
    securebits: libc::c_ulong,
}

impl std::fmt::Debug for Confiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confiner")
            .field("ruleset", &self.ruleset)
            .field("filter", &self.filter.is_some())
            .field("bounding", &self.bounding)
            .finish()
    }
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_V3: u32 = 0x2008_0522;
const CAP_SETPCAP: u32 = 8;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Whether this process may empty a child's bounding set (`CAP_SETPCAP` effective).
fn holds_setpcap() -> bool {
    let mut h = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut d = [CapData::default(); 2];
    // SAFETY: capget writes one header and two data words.
    let r = unsafe { libc::syscall(libc::SYS_capget, &raw mut h, d.as_mut_ptr()) };
    r == 0 && d[0].effective & (1 << CAP_SETPCAP) != 0
}

/// This process's securebits and those that keep uid 0 from regaining capabilities at
/// exec, each locked.
fn securebits() -> libc::c_ulong {
    // SAFETY: PR_GET_SECUREBITS takes no pointer and returns the bits (or -1).
    let own = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) }.max(0);
    let ours = libc::SECBIT_NOROOT
        | libc::SECBIT_NOROOT_LOCKED
        | libc::SECBIT_NO_SETUID_FIXUP
        | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
        | libc::SECBIT_KEEP_CAPS_LOCKED
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE
        | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    (own | ours) as libc::c_ulong
}

fn last_cap() -> libc::c_ulong {
    static LAST: OnceLock<libc::c_ulong> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63)
    })
}

impl Confiner {
    /// Whether the filter hands its connects to a supervisor (a listener comes back).
    pub(super) fn listens(&self) -> bool {
        self.filter.as_ref().is_some_and(Filter::has_listener)
    }

    /// In the child: no capability left, none to regain at `exec`, root included —
    /// securebits locked (`SECBIT_NOROOT`: uid 0 gets none at exec), the bounding set
    /// emptied, the ambient set cleared, and the effective, permitted and inheritable
    /// sets emptied. Syscalls only.
    pub(super) fn drop_privileges(&self) -> bool {
        // SAFETY: (the whole block) prctl and capset with integer arguments or our own structs.
        unsafe {
            if self.bounding {
                if libc::prctl(libc::PR_SET_SECUREBITS, self.securebits, 0, 0, 0) != 0 {
                    return false;
                }
                for cap in 0..=self.last_cap {
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                        if *libc::__errno_location() == libc::EINVAL {
                            break;
                        }
                        return false;
                    }
                }
            }
            // EINVAL before Linux 4.3, which has no ambient set to clear.
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            );
            let mut h = CapHeader {
                version: CAP_V3,
                pid: 0,
            };
            let d = [CapData::default(); 2];
            libc::syscall(libc::SYS_capset, &raw mut h, d.as_ptr()) == 0
        }
    }

    /// In the child (no_new_privs set): a rule for its own `/proc/<pid>` when reads are
    /// confined, then into the domain. Syscalls only.
    pub(super) fn enter_domain(&self) -> bool {
        let Some(fd) = &self.ruleset else {
            return true;
        };
        let raw = fd.as_raw_fd();
        if self.proc_self && !allow_own_proc(raw) {
            return false;
        }
        // SAFETY: landlock_restrict_self(int ruleset_fd, u32 flags) on a live fd.
        unsafe { libc::syscall(libc::SYS_landlock_restrict_self, raw, 0u32) == 0 }
    }

    /// In the child: the filter (its listener's fd, `-1` for none), or the errno.
    pub(super) fn install_filter(&self) -> Result<RawFd, libc::c_int> {
        match &self.filter {
            None => Ok(-1),
            Some(f) => seccomp::install(f),
        }
    }
}

/// Filesystem rights are requested up to this (tested) ABI. V5..V8 share the
/// same write set; V9 would add `ResolveUnix` (connecting to pathname UNIX
/// sockets), which we deliberately do not handle yet (see NOTES.md).
const FS_TARGET: ABI = ABI::V7;
/// Network rights requested under `network_deny`: TCP (ABI 4) and, where the
/// kernel has it, UDP (ABI 10; untested here, the test kernel is ABI 7).
const NET_TARGET: ABI = ABI::V10;

const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

/// Linux Landlock backend. Stateless: the kernel is probed on every
/// `prepare` (one cheap syscall), so it is always accurate.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LandlockSandbox;

impl LandlockSandbox {
    pub(crate) fn new() -> Self {
        LandlockSandbox
    }

    /// Landlock ABI version of the running kernel, 0 if unsupported/disabled.
    pub(crate) fn kernel_abi() -> u32 {
        // SAFETY: documented probe form of the syscall: NULL attr, size 0.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<libc::c_void>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        u32::try_from(v).unwrap_or(0)
    }
}

impl Sandbox for LandlockSandbox {
    fn prepare(&self, policy: &Policy) -> Result<Prepared, SandboxError> {
        let kabi = Self::kernel_abi();
        let mut enforced = Enforced {
            backend: "landlock",
            abi: kabi,
            ..Enforced::default()
        };
        let ruleset = match kabi {
            0 => None,
            _ => ruleset(policy, kabi, &mut enforced)?,
        };
        let filter = filter(policy, &mut enforced);
        let confiner = Confiner {
            ruleset,
            filter,
            proc_self: enforced.reads,
            bounding: holds_setpcap(),
            last_cap: last_cap(),
            securebits: securebits(),
        };
        Prepared::finish(policy, enforced, Hook::Confine(Arc::new(confiner)))
    }

    /// What [`Sandbox::prepare`] would give, without building anything: the kernel's ABI,
    /// the requested sets, and which paths exist.
    fn assess(&self, policy: &Policy) -> Result<Vec<Shortfall>, SandboxError> {
        let kabi = Self::kernel_abi();
        let mut e = Enforced {
            backend: "landlock",
            abi: kabi,
            ..Enforced::default()
        };
        if kabi > 0 {
            let abi = ABI::from(i32::try_from(kabi).unwrap_or(i32::MAX));
            let (write_req, _, scope_req, net_req) = requested(policy);
            apply_effective(&mut e, abi, write_req, scope_req, net_req);
            e.reads = policy.confine_reads && e.files;
            let reads = policy.read_dirs.iter().filter(|_| policy.confine_reads);
            let paths = policy
                .write_dirs
                .iter()
                .chain(&policy.write_files)
                .chain(&policy.devices)
                .chain(reads);
            e.skipped = paths.filter(|p| !p.exists()).cloned().collect();
        }
        let _ = filter(policy, &mut e);
        super::check_enforce(policy, &e)
    }
}

/// The seccomp filter for `policy` on this kernel, and what it enforces, in `enforced`;
/// with it what every child does anyway (its own session, no privilege, no_new_privs).
fn filter(policy: &Policy, enforced: &mut Enforced) -> Option<Filter> {
    let net = match policy.net {
        Net::Open => None,
        Net::Deny => Some(seccomp::Net::Deny),
        Net::Proxy(a) => Some(seccomp::Net::Proxy(a)),
    };
    let notify = matches!(net, Some(seccomp::Net::Proxy(_)));
    let filter = match net {
        Some(n) if seccomp::available(notify) => {
            enforced.socket_filter = true;
            Some(Filter::new(Some(&n)))
        }
        // No user notification: the process rules at least.
        _ if seccomp::available(false) => Some(Filter::new(None)),
        _ => None,
    };
    enforced.process_filter = filter.is_some();
    enforced.privileges = true;
    enforced.session = true;
    enforced.no_new_privs = true;
    filter
}

/// The access rights `policy` asks Landlock for: (writes, all file rights, scopes, network).
fn requested(
    policy: &Policy,
) -> (
    BitFlags<AccessFs>,
    BitFlags<AccessFs>,
    BitFlags<Scope>,
    BitFlags<AccessNet>,
) {
    let write_req = AccessFs::from_write(FS_TARGET);
    let fs_req = if policy.confine_reads {
        write_req | read_access()
    } else {
        write_req
    };
    let mut scope_req: BitFlags<Scope> = Scope::Signal.into();
    if policy.scope_abstract_unix {
        scope_req |= Scope::AbstractUnixSocket;
    }
    let net_req = if policy.net == Net::Open {
        BitFlags::EMPTY
    } else {
        AccessNet::from_all(NET_TARGET)
    };
    (write_req, fs_req, scope_req, net_req)
}

/// The Landlock ruleset of `policy` (`None`: the crate found Landlock unusable), and what
/// the kernel at `kabi` enforces of it, in `enforced`.
fn ruleset(
    policy: &Policy,
    kabi: u32,
    enforced: &mut Enforced,
) -> Result<Option<OwnedFd>, SandboxError> {
    let abi = ABI::from(i32::try_from(kabi).unwrap_or(i32::MAX));
    let (write_req, fs_req, scope_req, net_req) = requested(policy);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(fs_req)?
        .scope(scope_req)?;
    if !net_req.is_empty() {
        // Denied but for one NetPort rule under `Net::Proxy`.
        ruleset = ruleset.handle_access(net_req)?;
    }
    let mut created = ruleset.create()?;
    if let Net::Proxy(addr) = policy.net {
        // Landlock rules are ports, not addresses: the seccomp supervisor sees to it
        // that the connection goes to the proxy itself.
        (&mut created).add_rule(NetPort::new(addr.port(), AccessNet::ConnectTcp))?;
    }
    let read = fs_req & read_access();
    if policy.confine_reads {
        for fd in system_reads() {
            (&mut created).add_rule(PathBeneath::new(fd, read))?;
        }
        for path in &policy.read_dirs {
            let Some(fd) = open_path(path, &mut enforced.skipped)? else {
                continue;
            };
            (&mut created).add_rule(PathBeneath::new(&fd, read))?;
        }
    }

    // Directory rules get the full write set. For a non-directory the crate (best
    // effort) drops the directory-only rights itself after its own fstat, leaving
    // WriteFile|Truncate|IoctlDev: no extra stat needed here.
    let dev_access = fs_req
        & (AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev | AccessFs::ReadFile);
    let entries = policy
        .write_dirs
        .iter()
        .chain(&policy.write_files)
        .map(|p| (p, fs_req))
        .chain(policy.devices.iter().map(|p| (p, dev_access)));
    for (path, access) in entries {
        // The default device nodes are opened once per process and reused.
        if let Some(cached) = cached_default_device(path) {
            match cached {
                Some(fd) => {
                    (&mut created).add_rule(PathBeneath::new(fd, access))?;
                }
                None => enforced.skipped.push(path.clone()),
            };
            continue;
        }
        let Some(fd) = open_path(path, &mut enforced.skipped)? else {
            continue;
        };
        (&mut created).add_rule(PathBeneath::new(&fd, access))?;
    }

    let fd: Option<OwnedFd> = created.into();
    if fd.is_some() {
        apply_effective(enforced, abi, write_req, scope_req, net_req);
        enforced.reads = policy.confine_reads && enforced.files;
    }
    Ok(fd)
}

/// Fill in what the kernel at `abi` enforces of the requested sets, using the
/// crate's per-ABI tables (the same intersection its best-effort logic
/// hands to `landlock_create_ruleset`).
fn apply_effective(
    e: &mut Enforced,
    abi: ABI,
    fs_req: BitFlags<AccessFs>,
    scope_req: BitFlags<Scope>,
    net_req: BitFlags<AccessNet>,
) {
    let fs_eff = fs_req & AccessFs::from_write(abi);
    let scope_eff = scope_req & Scope::from_all(abi);
    let net_eff = net_req & AccessNet::from_all(abi);
    e.files = !fs_eff.is_empty();
    e.refer = fs_eff.contains(AccessFs::Refer);
    e.truncate = fs_eff.contains(AccessFs::Truncate);
    e.ioctl_dev = fs_eff.contains(AccessFs::IoctlDev);
    e.signals = scope_eff.contains(Scope::Signal);
    e.abstract_unix = scope_eff.contains(Scope::AbstractUnixSocket);
    e.network_tcp =
        !net_eff.is_empty() && net_eff.contains(AccessNet::BindTcp | AccessNet::ConnectTcp);
    e.network_udp =
        !net_eff.is_empty() && net_eff.contains(AccessNet::BindUdp | AccessNet::ConnectSendUdp);
    e.no_new_privs = e.files || e.signals || e.network_tcp;
}

/// Entries of `/proc` no confined process reads: the user's keys, other processes' SysV
/// objects, the kernel's memory and log.
const PROC_WITHHELD: &[&str] = &[
    "keys",
    "key-users",
    "sysvipc",
    "kcore",
    "kmsg",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
];

/// `O_PATH` fds of [`SYSTEM_READS`] and of every entry of `/proc` that is no process
/// (`cpuinfo`, `meminfo`, `sys`, …: what runtimes read) but [`PROC_WITHHELD`], opened on
/// first use and kept. No rule covers `/proc` itself, a `/proc/<pid>` or the `self`
/// links: a confined process reads no process's `environ`, `cmdline` or memory, its own
/// included (but for the rule each child adds for its own `/proc/<pid>`).
fn system_reads() -> &'static [PathFd] {
    static CACHE: OnceLock<Vec<PathFd>> = OnceLock::new();
    CACHE.get_or_init(|| {
        let mut fds: Vec<PathFd> = SYSTEM_READS
            .iter()
            .filter_map(|p| PathFd::new(p).ok())
            .collect();
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                let is_link = e.file_type().is_ok_and(|t| t.is_symlink());
                if is_link
                    || name.bytes().all(|b| b.is_ascii_digit())
                    || PROC_WITHHELD.contains(&name.as_ref())
                {
                    continue;
                }
                if let Ok(fd) = PathFd::new(e.path()) {
                    fds.push(fd);
                }
            }
        }
        fds
    })
}

/// `O_PATH` fds of [`DEFAULT_DEVICES`], opened on first use and kept for the
/// life of the process (device nodes do not move). `None` = not a default
/// device; `Some(None)` = default device absent on this host.
fn cached_default_device(path: &Path) -> Option<Option<&'static PathFd>> {
    static CACHE: OnceLock<Vec<(&'static str, Option<PathFd>)>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| {
        DEFAULT_DEVICES
            .iter()
            .map(|d| (*d, PathFd::new(d).ok()))
            .collect()
    });
    cache
        .iter()
        .find(|(d, _)| Path::new(d) == path)
        .map(|(_, fd)| fd.as_ref())
}

/// `O_PATH` fd for a rule; `Ok(None)` (and the path recorded) if it does not
/// exist.
fn open_path(path: &Path, skipped: &mut Vec<PathBuf>) -> Result<Option<PathFd>, SandboxError> {
    match PathFd::new(path) {
        Ok(fd) => Ok(Some(fd)),
        Err(PathFdError::OpenCall { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            skipped.push(path.to_path_buf());
            Ok(None)
        }
        Err(e) => Err(SandboxError::Path {
            path: path.to_path_buf(),
            source: io::Error::other(e),
        }),
    }
}

/// `struct landlock_path_beneath_attr` (packed, as the kernel declares it).
#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// In the child before exec: a read rule for its own `/proc/<pid>` in the ruleset.
/// Async-signal-safe: open, one syscall, close. The rule is added to the shared ruleset
/// object; it names this process's directory only (a later process with the same pid has
/// another), so rules left by earlier children grant nothing.
fn allow_own_proc(ruleset_fd: RawFd) -> bool {
    const READ_FILE: u64 = 1 << 2;
    const READ_DIR: u64 = 1 << 3;
    const RULE_PATH_BENEATH: libc::c_int = 1;
    // SAFETY: a NUL-terminated literal; the fd is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self".as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | libc::O_DIRECTORY,
        )
    };
    if fd < 0 {
        return false;
    }
    let attr = PathBeneathAttr {
        allowed_access: READ_FILE | READ_DIR,
        parent_fd: fd,
    };
    // SAFETY: landlock_add_rule(ruleset, PATH_BENEATH, &attr, 0) reads the attribute only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset_fd,
            RULE_PATH_BENEATH,
            &raw const attr,
            0u32,
        )
    };
    // SAFETY: our own fd, closed once (after the call: errno of a failure stays).
    unsafe { libc::close(fd) };
    r == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use landlock::{RestrictionStatus, RulesetStatus};

    /// What each ABI level gives (the table in NOTES.md), computed offline.
    #[test]
    fn degradation_table() {
        let all_scopes = Scope::Signal | Scope::AbstractUnixSocket;
        let row = |abi: i32| {
            let mut e = Enforced::default();
            apply_effective(
                &mut e,
                ABI::from(abi),
                AccessFs::from_write(FS_TARGET),
                all_scopes,
                AccessNet::from_all(NET_TARGET),
            );
            (
                e.files,
                e.refer,
                e.truncate,
                e.network_tcp,
                e.ioctl_dev,
                e.signals,
                e.network_udp,
            )
        };
        assert_eq!(row(0), (false, false, false, false, false, false, false));
        assert_eq!(row(1), (true, false, false, false, false, false, false));
        assert_eq!(row(2), (true, true, false, false, false, false, false));
        assert_eq!(row(3), (true, true, true, false, false, false, false));
        assert_eq!(row(4), (true, true, true, true, false, false, false));
        assert_eq!(row(5), (true, true, true, true, true, false, false));
        assert_eq!(row(6), (true, true, true, true, true, true, false));
        assert_eq!(row(7), row(6));
        assert_eq!(row(9), row(6));
        assert_eq!(row(10), (true, true, true, true, true, true, true));
        assert_eq!(row(42), row(10));
        // And the shortfalls loopflow would WARN about on an ABI 3 kernel (with seccomp
        // errno but no user notification):
        let mut e = Enforced {
            abi: 3,
            process_filter: true,
            ..Enforced::default()
        };
        apply_effective(
            &mut e,
            ABI::V3,
            AccessFs::from_write(FS_TARGET),
            all_scopes,
            AccessNet::from_all(NET_TARGET),
        );
        let policy = Policy::new().network_deny(true);
        let s = crate::sandbox::compute_shortfalls(&policy, &e);
        use crate::sandbox::Shortfall::*;
        assert_eq!(
            s,
            vec![
                IoctlDev,
                Signals,
                AbstractUnix,
                NetworkTcp,
                NetworkUdp,
                SocketFilter
            ]
        );
        let required: Vec<_> = s.iter().filter(|x| x.is_required()).collect();
        assert_eq!(required, vec![&Signals, &NetworkTcp, &SocketFilter]);
    }

    /// Cross-check our computed `Enforced` against the crate's own verdict:
    /// build the same ruleset with the crate and let the crate restrict a
    /// throwaway thread, then compare "fully enforced" with our shortfalls.
    #[test]
    fn enforced_matches_crate_status() {
        let kabi = LandlockSandbox::kernel_abi();
        for deny in [false, true] {
            let policy = Policy::new().network_deny(deny);
            let prepared = LandlockSandbox.prepare(&policy).unwrap();
            let status: RestrictionStatus = std::thread::spawn(move || {
                let mut r = Ruleset::default()
                    .handle_access(AccessFs::from_write(FS_TARGET))
                    .unwrap()
                    .scope(Scope::Signal | Scope::AbstractUnixSocket)
                    .unwrap();
                if deny {
                    r = r.handle_access(AccessNet::from_all(NET_TARGET)).unwrap();
                }
                r.create().unwrap().restrict_self().unwrap()
            })
            .join()
            .unwrap();
            let ours_full = prepared
                .shortfalls()
                .iter()
                .all(|s| matches!(s, crate::sandbox::Shortfall::SkippedPath(_)))
                // The crate knows only Landlock: below ABI 10 it calls UDP missing, which
                // the socket filter covers for loopflow.
                && (!deny || prepared.enforced().network_udp);
            let crate_full = status.ruleset == RulesetStatus::FullyEnforced;
            assert_eq!(
                ours_full, crate_full,
                "abi {kabi}, deny {deny}: {status:?} vs {prepared:?}"
            );
            if kabi == 0 {
                assert_eq!(status.ruleset, RulesetStatus::NotEnforced);
            }
        }
    }
}
