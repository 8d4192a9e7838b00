//! Seccomp-BPF network confinement for agent processes.
//!
//! Landlock (as of the ABIs loopflow relies on) cannot restrict which hosts a
//! process connects to, nor forbid UDP, raw or unix sockets. This module fills
//! that gap with a classic-BPF seccomp filter that is *allow by default* (so it
//! composes with whatever the agent runs) and only intercepts the handful of
//! syscalls that can move bytes off the machine:
//!
//! * `socket`: only TCP over IPv4/IPv6 (and only under [`Net::Proxy`]) and
//!   `NETLINK_ROUTE` (glibc's `getaddrinfo`/`getifaddrs` need it; it only talks
//!   to the kernel). Everything else — unix, UDP, raw, packet, SCTP, vsock… —
//!   fails with `EACCES`, the errno LSMs use, so error messages read
//!   "Permission denied" and point at the sandbox rather than a missing kernel
//!   feature (`EAFNOSUPPORT` would also be a lie for UDP, whose family exists).
//! * `socketpair`: only `AF_UNIX` stream/seqpacket pairs. Datagram pairs are
//!   refused because `sendto`/`sendmsg` on a *connected* unix datagram socket
//!   still honours a destination path, which would reach any unix socket.
//! * `connect`: refused (`EACCES`) under [`Net::Deny`]; under [`Net::Proxy`]
//!   handed to the [`Supervisor`] via `SECCOMP_RET_USER_NOTIF`.
//! * `sendto`/`sendmsg`/`sendmmsg` with `MSG_FASTOPEN`: `EPERM`, since TCP Fast
//!   Open connects without ever calling `connect`.
//! * `io_uring_*`: `ENOSYS`, since io_uring performs socket/connect without
//!   entering those syscalls (and `ENOSYS` makes runtimes fall back quietly).
//! * Foreign audit arch: kill; on x86_64 x32-ABI syscall numbers: `EPERM`.
//!   Checking the arch also removes `socketcall`, which only exists in the
//!   32-bit ABIs. `bind`/`listen`/`accept` stay allowed: they are not egress.

use std::collections::HashSet;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use libc::{c_int, c_uint, sock_filter};

/// `AUDIT_ARCH_*` of the native ABI; `None` where this module is unsupported.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: Option<u32> = None;

/// Set in `nr` by x32 processes, which share `AUDIT_ARCH_X86_64`.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `SOCK_TYPE_MASK`: the low bits of `type`; the rest are NONBLOCK/CLOEXEC.
const SOCK_TYPE_MASK: u32 = 0xf;
const NETLINK_ROUTE: u32 = 0;
/// `PIDFD_THREAD` (= `O_EXCL`, Linux 6.9): notifications carry a thread id.
const PIDFD_THREAD: c_uint = libc::O_EXCL as c_uint;
/// `sizeof(struct sockaddr_storage)`: the kernel rejects longer addresses.
const MAX_ADDR: usize = 128;
/// Poll timeout, bounding how long `Drop` waits for the thread.
const POLL_MS: c_int = 50;
/// Bound on distinct refused addresses kept, so a hostile agent can't grow us.
const MAX_SEEN: usize = 4096;

// Classic BPF opcodes (libc's are `u32`, `sock_filter::code` is `u16`).
const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JSET: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const RET: u16 = 0x06; // BPF_RET | BPF_K

/// Offsets into `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// Offset of the low 32 bits of syscall argument `i`: every argument we test
/// is an `int`/`unsigned`, which the kernel truncates the register to.
const fn arg(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 4 } else { 0 }
}

const fn errno(e: c_int) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// What confined processes may do with the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    /// No network sockets at all.
    Deny,
    /// TCP only through `proxy`: every connect() is decided by the Supervisor.
    Proxy(SocketAddr),
}

/// The BPF program, built once in the parent so `install` never allocates.
pub struct Filter {
    prog: Vec<sock_filter>,
    listener: bool,
}

/// Assembler item: a statement, a jump to labels, or a label definition.
#[derive(Clone, Copy)]
enum Op {
    S(u16, u32),
    J(u16, u32, u8, u8),
    L(u8),
}

// Jump labels. NEXT (0) means "fall through".
const NEXT: u8 = 0;
const ALLOW: u8 = 1;
const EACCES: u8 = 2;
const EPERM: u8 = 3;
const ENOSYS: u8 = 4;
const KILL: u8 = 5;
const CONNECT: u8 = 6;
const SOCKET: u8 = 7;
const PAIR: u8 = 8;
const NETLINK: u8 = 9;
const INET: u8 = 10;
const FLAGS2: u8 = 11;
const FLAGS3: u8 = 12;
const LABELS: usize = 13;

/// Resolves labels to forward offsets; labels keep the program readable and
/// the unit tests execute it, so a bad offset cannot go unnoticed.
fn assemble(ops: &[Op]) -> Vec<sock_filter> {
    let mut at = [0usize; LABELS];
    let mut n = 0;
    for op in ops {
        match *op {
            Op::L(l) => {
                if let Some(p) = at.get_mut(usize::from(l)) {
                    *p = n;
                }
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for op in ops {
        let here = out.len() + 1;
        let off = |l: u8| match at.get(usize::from(l)) {
            Some(&p) if l != NEXT => u8::try_from(p.saturating_sub(here)).unwrap_or(0),
            _ => 0,
        };
        let (code, jt, jf, k) = match *op {
            Op::L(_) => continue,
            Op::S(code, k) => (code, 0, 0, k),
            Op::J(code, k, t, f) => (code, off(t), off(f), k),
        };
        out.push(sock_filter { code, jt, jf, k });
    }
    out
}

impl Filter {
    /// Builds the program for `net` (see the module docs for the rules).
    pub fn new(net: &Net) -> Filter {
        use Op::{J, L, S};
        let proxy = matches!(net, Net::Proxy(_));
        let mut ops = vec![
            S(LD_ABS, ARCH),
            J(JEQ, AUDIT_ARCH.unwrap_or(0), NEXT, KILL),
            S(LD_ABS, NR),
        ];
        #[cfg(target_arch = "x86_64")]
        ops.push(J(JSET, X32_SYSCALL_BIT, EPERM, NEXT));
        for (nr, to) in [
            (libc::SYS_socket, SOCKET),
            (libc::SYS_socketpair, PAIR),
            (libc::SYS_connect, CONNECT),
            (libc::SYS_sendto, FLAGS3),
            (libc::SYS_sendmmsg, FLAGS3),
            (libc::SYS_sendmsg, FLAGS2),
            (libc::SYS_io_uring_setup, ENOSYS),
            (libc::SYS_io_uring_enter, ENOSYS),
            (libc::SYS_io_uring_register, ENOSYS),
        ] {
            ops.push(J(JEQ, nr as u32, to, NEXT));
        }
        let fastopen = libc::MSG_FASTOPEN as u32;
        ops.extend([
            S(RET, libc::SECCOMP_RET_ALLOW),
            L(FLAGS3),
            S(LD_ABS, arg(3)),
            J(JSET, fastopen, EPERM, ALLOW),
            L(FLAGS2),
            S(LD_ABS, arg(2)),
            J(JSET, fastopen, EPERM, ALLOW),
            L(PAIR),
            S(LD_ABS, arg(0)),
            J(JEQ, libc::AF_UNIX as u32, NEXT, EACCES),
            S(LD_ABS, arg(1)),
            S(AND_K, SOCK_TYPE_MASK),
            J(JEQ, libc::SOCK_STREAM as u32, ALLOW, NEXT),
            J(JEQ, libc::SOCK_SEQPACKET as u32, ALLOW, EACCES),
            L(SOCKET),
            S(LD_ABS, arg(0)),
            J(JEQ, libc::AF_NETLINK as u32, NETLINK, NEXT),
        ]);
        if proxy {
            // Protocol must be 0 or TCP: SCTP and MPTCP are SOCK_STREAM too,
            // and SCTP can connect through setsockopt(SCTP_SOCKOPT_CONNECTX).
            ops.extend([
                J(JEQ, libc::AF_INET as u32, INET, NEXT),
                J(JEQ, libc::AF_INET6 as u32, INET, EACCES),
                L(INET),
                S(LD_ABS, arg(1)),
                S(AND_K, SOCK_TYPE_MASK),
                J(JEQ, libc::SOCK_STREAM as u32, NEXT, EACCES),
                S(LD_ABS, arg(2)),
                J(JEQ, 0, ALLOW, NEXT),
                J(JEQ, libc::IPPROTO_TCP as u32, ALLOW, EACCES),
            ]);
        } else {
            ops.push(S(RET, errno(libc::EACCES)));
        }
        let on_connect = if proxy {
            libc::SECCOMP_RET_USER_NOTIF
        } else {
            errno(libc::EACCES)
        };
        ops.extend([
            L(NETLINK),
            S(LD_ABS, arg(2)),
            J(JEQ, NETLINK_ROUTE, ALLOW, EACCES),
            L(CONNECT),
            S(RET, on_connect),
            L(ALLOW),
            S(RET, libc::SECCOMP_RET_ALLOW),
            L(EACCES),
            S(RET, errno(libc::EACCES)),
            L(EPERM),
            S(RET, errno(libc::EPERM)),
            L(ENOSYS),
            S(RET, errno(libc::ENOSYS)),
            L(KILL),
            S(RET, libc::SECCOMP_RET_KILL_PROCESS),
        ]);
        Filter {
            prog: assemble(&ops),
            listener: proxy,
        }
    }
}

/// Installs `filter` on the calling thread (caller has set no_new_privs). For
/// Net::Proxy, returns the notification listener fd
/// (SECCOMP_FILTER_FLAG_NEW_LISTENER; the kernel makes it close-on-exec, so
/// the agent never holds it and cannot answer its own notifications).
///
/// Only makes syscalls: safe to call between fork and exec-like points.
/// `WAIT_KILLABLE_RECV` (Linux 5.19) is requested so that a signal arriving
/// while we connect on the agent's behalf (Go's SIGURG preemption, say) cannot
/// restart the agent's connect() behind our back; older kernels reject the
/// flag with `EINVAL` and we retry without it.
pub fn install(filter: &Filter) -> io::Result<Option<OwnedFd>> {
    if AUDIT_ARCH.is_none() {
        return Err(io::ErrorKind::Unsupported.into());
    }
    let len = u16::try_from(filter.prog.len()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let prog = libc::sock_fprog {
        len,
        filter: filter.prog.as_ptr().cast_mut(),
    };
    let base = if filter.listener {
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
    } else {
        0
    };
    let mut flags = base;
    if filter.listener {
        flags |= libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
    }
    loop {
        // SAFETY: `prog` points at `len` valid instructions that outlive the
        // call; the kernel copies them and keeps no pointer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &prog as *const libc::sock_fprog,
            )
        };
        if r >= 0 {
            if !filter.listener {
                return Ok(None);
            }
            // SAFETY: with NEW_LISTENER the return value is a new fd we own.
            return Ok(Some(unsafe { OwnedFd::from_raw_fd(r as RawFd) }));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EINVAL) && flags != base {
            flags = base;
            continue;
        }
        return Err(e);
    }
}

#[derive(Default)]
struct Refused {
    seen: HashSet<String>,
    pending: Vec<String>,
}

/// Serves connect() notifications for every process under one listener, on
/// its own thread, until dropped (drop stops it within ~100 ms and closes the
/// listener, after which confined processes' connect() fails with ENOSYS).
pub struct Supervisor {
    stop: Arc<AtomicBool>,
    refused: Arc<Mutex<Refused>>,
    thread: Option<JoinHandle<()>>,
}

fn lock(m: &Mutex<Refused>) -> MutexGuard<'_, Refused> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Supervisor {
    /// Starts the serving thread; `proxy` is the only address connects reach.
    pub fn start(listener: OwnedFd, proxy: SocketAddr) -> io::Result<Supervisor> {
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(Mutex::new(Refused::default()));
        let (s, r) = (Arc::clone(&stop), Arc::clone(&refused));
        let thread = std::thread::Builder::new()
            .name("seccomp-notify".into())
            .spawn(move || serve(&listener, proxy, &s, &r))?;
        Ok(Supervisor {
            stop,
            refused,
            thread: Some(thread),
        })
    }

    /// Addresses whose connect was refused so far, each once, in first-seen
    /// order; drains.
    pub fn take_refused(&self) -> Vec<String> {
        std::mem::take(&mut lock(&self.refused).pending)
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn last_errno() -> c_int {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Buffer sizes in u64 words: the kernel's structs may be larger than ours.
fn notif_words() -> (usize, usize) {
    let mut sz = libc::seccomp_notif_sizes {
        seccomp_notif: 0,
        seccomp_notif_resp: 0,
        seccomp_data: 0,
    };
    // SAFETY: GET_NOTIF_SIZES writes exactly one seccomp_notif_sizes.
    unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_NOTIF_SIZES,
            0,
            &mut sz as *mut libc::seccomp_notif_sizes,
        )
    };
    let n = usize::from(sz.seccomp_notif).max(size_of::<libc::seccomp_notif>());
    let r = usize::from(sz.seccomp_notif_resp).max(size_of::<libc::seccomp_notif_resp>());
    (n.div_ceil(8), r.div_ceil(8))
}

fn serve(listener: &OwnedFd, proxy: SocketAddr, stop: &AtomicBool, refused: &Mutex<Refused>) {
    let fd = listener.as_raw_fd();
    let (nw, rw) = notif_words();
    let (mut req, mut resp) = (vec![0u64; nw], vec![0u64; rw]);
    while !stop.load(Ordering::Relaxed) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, POLL_MS) };
        if n <= 0 {
            continue; // timeout or EINTR: re-check `stop`
        }
        if pfd.revents & libc::POLLIN == 0 {
            // POLLHUP: every filtered task is gone, and no new one can appear
            // (the filter lives only in their tree), so we are done.
            return;
        }
        req.fill(0);
        // SAFETY: `req` is zeroed (as RECV requires), 8-aligned and at least
        // the kernel's seccomp_notif size.
        if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, req.as_mut_ptr()) } < 0 {
            continue; // ENOENT: the task died before we received it
        }
        // SAFETY: the kernel filled a seccomp_notif at the start of `req`.
        let notif: libc::seccomp_notif = unsafe { std::ptr::read(req.as_ptr().cast()) };
        let err = decide(fd, &notif, proxy, refused);
        resp.fill(0);
        let answer = libc::seccomp_notif_resp {
            id: notif.id,
            val: 0,
            error: -err,
            flags: 0,
        };
        // SAFETY: `resp` is 8-aligned and at least seccomp_notif_resp long.
        unsafe { std::ptr::write(resp.as_mut_ptr().cast(), answer) };
        // SAFETY: `resp` holds a valid response. ENOENT (task died or was
        // interrupted meanwhile) needs no handling.
        unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, resp.as_mut_ptr()) };
    }
}

/// True while the notification's task is still blocked in that syscall, which
/// proves that `pid` was not recycled before this point.
fn id_valid(fd: RawFd, id: u64) -> bool {
    let mut id = id;
    // SAFETY: ID_VALID reads one u64.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id as *mut u64) == 0 }
}

/// Handles one connect(); returns 0 or the errno the agent will see.
fn decide(
    fd: RawFd,
    n: &libc::seccomp_notif,
    proxy: SocketAddr,
    refused: &Mutex<Refused>,
) -> c_int {
    let pid = n.pid as libc::pid_t;
    let sockfd = n.data.args[0] as c_int;
    let len = n.data.args[2] as c_int; // socklen_t; kernel: negative → EINVAL
    let Some(len) = usize::try_from(len).ok().filter(|&l| l <= MAX_ADDR) else {
        return libc::EINVAL;
    };
    let mut buf = [0u8; MAX_ADDR];
    let addr = &mut buf[..len];
    if let Err(e) = read_mem(pid, n.data.args[1], addr) {
        return if e == libc::EFAULT {
            e
        } else {
            libc::ECONNREFUSED
        };
    }
    let target = parse_inet(addr).and_then(|a| proxy_target(a, proxy));
    let pidfd = target.and_then(|_| pidfd_open(pid));
    // After the read and pidfd_open: both saw the task that is still waiting.
    if !id_valid(fd, n.id) {
        return libc::ENOENT;
    }
    let Some(target) = target else {
        record(refused, describe(addr));
        return libc::ECONNREFUSED;
    };
    let Some(pidfd) = pidfd else {
        return libc::ECONNREFUSED;
    };
    // SAFETY: plain syscall on a pidfd we own; returns a new fd or -1.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), sockfd, 0) };
    if dup < 0 {
        return last_errno(); // EBADF for a bogus fd, as connect() would say
    }
    // SAFETY: pidfd_getfd returned a fresh (close-on-exec) fd that we own.
    let dup = unsafe { OwnedFd::from_raw_fd(dup as RawFd) };
    connect_to(dup.as_raw_fd(), target)
}

fn read_mem(pid: libc::pid_t, remote: u64, buf: &mut [u8]) -> Result<(), c_int> {
    if buf.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: remote as usize as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` covers exactly `buf`; the remote side is only read, in
    // another address space, and the kernel validates it.
    let got = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    match usize::try_from(got) {
        Ok(g) if g == buf.len() => Ok(()),
        Ok(_) => Err(libc::EFAULT),
        Err(_) => Err(last_errno()),
    }
}

fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    for flags in [PIDFD_THREAD, 0] {
        // SAFETY: plain syscall; returns a new fd or -1.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, flags) };
        if r >= 0 {
            // SAFETY: a fresh fd that we own.
            return Some(unsafe { OwnedFd::from_raw_fd(r as RawFd) });
        }
    }
    None
}

fn bytes<const N: usize>(a: &[u8], at: usize) -> Option<[u8; N]> {
    a.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn family(a: &[u8]) -> Option<c_int> {
    bytes::<2>(a, 0).map(|f| c_int::from(u16::from_ne_bytes(f)))
}

/// Decodes AF_INET/AF_INET6 with the minimum lengths the kernel demands.
fn parse_inet(a: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_be_bytes(bytes(a, 2)?);
    match family(a)? {
        libc::AF_INET if a.len() >= 16 => {
            Some(SocketAddrV4::new(Ipv4Addr::from(bytes::<4>(a, 4)?), port).into())
        }
        libc::AF_INET6 if a.len() >= 24 => {
            let ip = Ipv6Addr::from(bytes::<16>(a, 8)?);
            let scope = bytes(a, 24).map_or(0, u32::from_ne_bytes);
            Some(SocketAddrV6::new(ip, port, 0, scope).into())
        }
        _ => None,
    }
}

/// Where to connect the agent's socket if `req` names the proxy. The result
/// is built from `proxy` only, so later changes to the agent's memory are moot.
fn proxy_target(req: SocketAddr, proxy: SocketAddr) -> Option<SocketAddr> {
    match (req, proxy) {
        (SocketAddr::V4(r), SocketAddr::V4(_)) if SocketAddr::V4(r) == proxy => Some(proxy),
        (SocketAddr::V6(r), SocketAddr::V6(p)) if r.ip() == p.ip() && r.port() == p.port() => {
            Some(proxy)
        }
        (SocketAddr::V6(r), SocketAddr::V4(p))
            if r.ip().to_ipv4_mapped() == Some(*p.ip()) && r.port() == p.port() =>
        {
            Some(SocketAddrV6::new(p.ip().to_ipv6_mapped(), p.port(), 0, 0).into())
        }
        _ => None,
    }
}

/// Connects `fd` (the agent's socket, duplicated) and returns 0 or errno;
/// EINPROGRESS etc. pass through because the socket's flags are the agent's.
fn connect_to(fd: RawFd, to: SocketAddr) -> c_int {
    // SAFETY: all-zero is a valid sockaddr_in/sockaddr_in6.
    let (mut v4, mut v6): (libc::sockaddr_in, libc::sockaddr_in6) = unsafe { std::mem::zeroed() };
    let (ptr, len) = match to {
        SocketAddr::V4(a) => {
            v4.sin_family = libc::AF_INET as libc::sa_family_t;
            v4.sin_port = a.port().to_be();
            v4.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            (
                (&raw const v4).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_in>(),
            )
        }
        SocketAddr::V6(a) => {
            v6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            v6.sin6_port = a.port().to_be();
            v6.sin6_addr.s6_addr = a.ip().octets();
            v6.sin6_scope_id = a.scope_id();
            (
                (&raw const v6).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_in6>(),
            )
        }
    };
    // SAFETY: `ptr` points at a live, initialised sockaddr of `len` bytes.
    if unsafe { libc::connect(fd, ptr, len as libc::socklen_t) } == 0 {
        0
    } else {
        last_errno()
    }
}

/// Human-readable form of a refused sockaddr, for loopflow's report.
fn describe(a: &[u8]) -> String {
    if let Some(sa) = parse_inet(a) {
        return sa.to_string();
    }
    match family(a) {
        None => "invalid sockaddr".into(),
        Some(libc::AF_UNIX) => {
            let path = a.get(2..).unwrap_or_default();
            match path.split_first() {
                Some((0, name)) => format!("unix:@{}", String::from_utf8_lossy(name)),
                _ => {
                    let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
                    format!("unix:{}", String::from_utf8_lossy(&path[..end]))
                }
            }
        }
        Some(f) => format!("family {f}"),
    }
}

fn record(refused: &Mutex<Refused>, what: String) {
    let mut r = lock(refused);
    if r.seen.len() < MAX_SEEN && r.seen.insert(what.clone()) {
        r.pending.push(what);
    }
}

#[cfg(test)]
mod tests;
