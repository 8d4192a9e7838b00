//! The supervisor of one tick: serves the `connect` notifications of every confined process
//! the tick starts (one listener per spawn, each tagged with its spawn) on one thread.
//! A connect that names the proxy is made by the supervisor itself on the process's socket
//! (`pidfd_getfd`) — to the proxy's address held here, never the bytes the process passed,
//! so no race can redirect it — and the socket's local address is told to the proxy with
//! the spawn's tag before the process's connect returns, so the proxy knows whose request
//! it serves. Every other connect is refused and remembered for its spawn.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use libc::{c_int, c_uint};

/// `PIDFD_THREAD` (= `O_EXCL`, Linux 6.9): notifications carry a thread id.
const PIDFD_THREAD: c_uint = libc::O_EXCL as c_uint;
/// `sizeof(struct sockaddr_storage)`: the kernel rejects longer addresses.
const MAX_ADDR: usize = 128;
/// Bound on distinct refused addresses kept per spawn, so a hostile agent can't grow us.
const MAX_SEEN: usize = 4096;

/// Told the local address of each socket connected to the proxy, and its spawn's tag.
pub(crate) type Connected = Box<dyn Fn(SocketAddr, u64) + Send + Sync>;

#[derive(Default)]
struct Refused {
    seen: HashSet<String>,
    pending: Vec<String>,
}

struct Shared {
    proxy: SocketAddr,
    connected: Connected,
    stop: AtomicBool,
    /// An eventfd: written when a listener arrives or the supervisor stops.
    wake: OwnedFd,
    incoming: Mutex<Vec<(OwnedFd, u64)>>,
    refused: Mutex<HashMap<u64, Refused>>,
}

/// Serves the connect notifications of a tick's confined processes until dropped (drop
/// wakes and joins the thread at once, closing every listener, after which a connect a
/// leftover tries fails with `ENOSYS`).
pub(crate) struct Supervisor {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Supervisor {
    /// Starts the serving thread; `proxy` is the only address connects reach, `connected`
    /// hears of each one before the process's connect returns.
    pub(crate) fn start(proxy: SocketAddr, connected: Connected) -> io::Result<Supervisor> {
        // SAFETY: eventfd takes integers and returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let shared = Arc::new(Shared {
            proxy,
            connected,
            stop: AtomicBool::new(false),
            // SAFETY: a fresh fd of ours.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            incoming: Mutex::new(Vec::new()),
            refused: Mutex::new(HashMap::new()),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("seccomp-notify".into())
            .spawn(move || serve(&s))?;
        Ok(Supervisor {
            shared,
            thread: Some(thread),
        })
    }

    /// Serves `listener` (one spawn's filter) from now on, its connects tagged `tag`.
    pub(crate) fn watch(&self, listener: OwnedFd, tag: u64) {
        lock(&self.shared.incoming).push((listener, tag));
        wake(&self.shared.wake);
    }

    /// Addresses whose connect was refused for spawn `tag` so far, each once, in first-seen
    /// order; drains.
    pub(crate) fn take_refused(&self, tag: u64) -> Vec<String> {
        lock(&self.shared.refused)
            .get_mut(&tag)
            .map(|r| std::mem::take(&mut r.pending))
            .unwrap_or_default()
    }

    /// Forgets what spawn `tag` was refused (it ended).
    pub(crate) fn forget(&self, tag: u64) {
        lock(&self.shared.refused).remove(&tag);
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        wake(&self.shared.wake);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn wake(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to our eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
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

fn serve(shared: &Shared) {
    let (nw, rw) = notif_words();
    let (mut req, mut resp) = (vec![0u64; nw], vec![0u64; rw]);
    let mut listeners: Vec<(OwnedFd, u64)> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        listeners.append(&mut lock(&shared.incoming));
        fds.clear();
        fds.push(libc::pollfd {
            fd: shared.wake.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        fds.extend(listeners.iter().map(|(l, _)| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }));
        // SAFETY: `fds` holds `fds.len()` valid pollfds; no timeout: `wake` ends the wait.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n <= 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            let mut v = 0u64;
            // SAFETY: reads 8 bytes into a live u64 (resets the eventfd).
            unsafe { libc::read(shared.wake.as_raw_fd(), (&raw mut v).cast(), 8) };
        }
        let mut gone = Vec::new();
        for (i, p) in fds.iter().enumerate().skip(1) {
            let (listener, tag) = &listeners[i - 1];
            if p.revents & libc::POLLIN != 0 {
                answer(shared, listener.as_raw_fd(), *tag, &mut req, &mut resp);
            } else if p.revents != 0 {
                // POLLHUP: every task under this filter is gone, and no new one can
                // appear (the filter lives only in their tree).
                gone.push(i - 1);
            }
        }
        for i in gone.into_iter().rev() {
            listeners.swap_remove(i);
        }
    }
}

/// Receives one notification on `fd` and answers it.
fn answer(shared: &Shared, fd: RawFd, tag: u64, req: &mut [u64], resp: &mut [u64]) {
    req.fill(0);
    // SAFETY: `req` is zeroed (as RECV requires), 8-aligned and at least the kernel's
    // seccomp_notif size.
    if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, req.as_mut_ptr()) } < 0 {
        return; // ENOENT: the task died before we received it
    }
    // SAFETY: the kernel filled a seccomp_notif at the start of `req`.
    let notif: libc::seccomp_notif = unsafe { std::ptr::read(req.as_ptr().cast()) };
    let err = decide(shared, fd, &notif, tag);
    resp.fill(0);
    let answer = libc::seccomp_notif_resp {
        id: notif.id,
        val: 0,
        error: -err,
        flags: 0,
    };
    // SAFETY: `resp` is 8-aligned and at least seccomp_notif_resp long.
    unsafe { std::ptr::write(resp.as_mut_ptr().cast(), answer) };
    // SAFETY: `resp` holds a valid response. ENOENT (task died or was interrupted
    // meanwhile) needs no handling.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, resp.as_mut_ptr()) };
}

/// True while the notification's task is still blocked in that syscall, which proves that
/// `pid` was not recycled before this point.
fn id_valid(fd: RawFd, id: u64) -> bool {
    let mut id = id;
    // SAFETY: ID_VALID reads one u64.
    unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id as *mut u64) == 0 }
}

/// Handles one connect(); returns 0 or the errno the process will see.
fn decide(shared: &Shared, fd: RawFd, n: &libc::seccomp_notif, tag: u64) -> c_int {
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
    let target = parse_inet(addr).and_then(|a| proxy_target(a, shared.proxy));
    let pidfd = target.and_then(|_| pidfd_open(pid));
    // After the read and pidfd_open: both saw the task that is still waiting.
    if !id_valid(fd, n.id) {
        return libc::ENOENT;
    }
    let Some(target) = target else {
        record(&shared.refused, tag, describe(addr));
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
    // The source port is known (and told to the proxy) before the connection exists: the
    // proxy may accept it the moment connect() starts.
    match bound(dup.as_raw_fd(), target) {
        Some(local) => (shared.connected)(local, tag),
        None => return libc::ECONNREFUSED,
    }
    connect_to(dup.as_raw_fd(), target)
}

/// The local address of `fd`, bound to a port of the kernel's choosing first when the
/// process did not bind it (as `connect` would have).
fn bound(fd: RawFd, to: SocketAddr) -> Option<SocketAddr> {
    if let Some(a) = local_addr(fd).filter(|a| a.port() != 0) {
        return Some(a);
    }
    let any: SocketAddr = match to {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    (with_sockaddr(any, |ptr, len| {
        // SAFETY: `ptr` points at a live sockaddr of `len` bytes.
        unsafe { libc::bind(fd, ptr, len) }
    }) == 0)
        .then(|| local_addr(fd))
        .flatten()
}

/// The local address a connected (or connecting) socket is bound to.
fn local_addr(fd: RawFd) -> Option<SocketAddr> {
    let mut buf = [0u8; MAX_ADDR];
    let mut len = MAX_ADDR as libc::socklen_t;
    // SAFETY: `buf` has room for `len` bytes; the kernel writes at most that.
    let r = unsafe { libc::getsockname(fd, buf.as_mut_ptr().cast(), &mut len) };
    if r != 0 {
        return None;
    }
    parse_inet(buf.get(..len as usize)?)
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
    // SAFETY: `local` covers exactly `buf`; the remote side is only read, in another
    // address space, and the kernel validates it.
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

pub(super) fn bytes<const N: usize>(a: &[u8], at: usize) -> Option<[u8; N]> {
    a.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn family(a: &[u8]) -> Option<c_int> {
    bytes::<2>(a, 0).map(|f| c_int::from(u16::from_ne_bytes(f)))
}

/// Decodes AF_INET/AF_INET6 with the minimum lengths the kernel demands.
pub(super) fn parse_inet(a: &[u8]) -> Option<SocketAddr> {
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

/// Where to connect the process's socket if `req` names the proxy. The result is built
/// from `proxy` only, so later changes to the process's memory are moot.
pub(super) fn proxy_target(req: SocketAddr, proxy: SocketAddr) -> Option<SocketAddr> {
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

/// Connects `fd` (the process's socket, duplicated) and returns 0 or errno; EINPROGRESS
/// etc. pass through because the socket's flags are the process's.
fn connect_to(fd: RawFd, to: SocketAddr) -> c_int {
    let r = with_sockaddr(to, |ptr, len| {
        // SAFETY: `ptr` points at a live sockaddr of `len` bytes.
        unsafe { libc::connect(fd, ptr, len) }
    });
    if r == 0 { 0 } else { last_errno() }
}

/// Calls `f` with `to` as a `sockaddr` and its length.
fn with_sockaddr(
    to: SocketAddr,
    f: impl FnOnce(*const libc::sockaddr, libc::socklen_t) -> c_int,
) -> c_int {
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
    f(ptr, len as libc::socklen_t)
}

/// Human-readable form of a refused sockaddr, for loopflow's report.
pub(super) fn describe(a: &[u8]) -> String {
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

fn record(refused: &Mutex<HashMap<u64, Refused>>, tag: u64, what: String) {
    let mut all = lock(refused);
    let r = all.entry(tag).or_default();
    if r.seen.len() < MAX_SEEN && r.seen.insert(what.clone()) {
        r.pending.push(what);
    }
}
