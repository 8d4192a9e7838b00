//! Starting a process cheaply and confined before it runs a single instruction of its own
//! (Linux): a `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)` child on a stack of its own —
//! no copy of loopflow's address space, no thread — that puts itself in a session of its
//! own (no controlling terminal; unconfined, a process group of its own), sets its
//! stdin/stdout/stderr, drops every capability,
//! enters the tick's Landlock domain (with a rule for its own `/proc/<pid>`), installs the
//! seccomp filter (handing the notification listener back over a socket) and `execve`s
//! the program the parent resolved. Everything the child touches was built by the parent;
//! the child only makes syscalls (async-signal-safe, no allocation, no lock).
//!
//! Signals: the parent blocks all of them around `clone`, so no handler of loopflow's can
//! run in the child (it shares loopflow's memory until `exec`); the child resets every
//! handled signal to its default, and `SIGPIPE` (which Rust ignores), then restores the
//! mask just before `exec`.

use std::cell::RefCell;
use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use libc::{c_char, c_int, c_void};

use super::linux::Confiner;

/// What the child runs: built (and the program resolved) in the parent.
pub struct Program {
    path: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwd: CString,
}

/// Why a program could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ProgramError {
    #[error("`{0}` not found")]
    NotFound(String),
    #[error("an argument or variable holds a NUL byte")]
    Nul,
}

impl Program {
    /// `program` (a name looked up in `env`'s `PATH`, else a path, relative to `cwd`),
    /// its arguments, its whole environment (later entries win) and working directory.
    pub fn new(
        program: &str,
        args: &[String],
        env: &[(OsString, OsString)],
        cwd: &Path,
    ) -> Result<Program, ProgramError> {
        let c = |b: &[u8]| CString::new(b).map_err(|_| ProgramError::Nul);
        let path = if program.contains('/') {
            c(program.as_bytes())?
        } else {
            // The child's PATH, else loopflow's (where std's spawn looks), else the default.
            let path_var = env
                .iter()
                .rev()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var_os("PATH"))
                .unwrap_or_else(|| "/bin:/usr/bin".into());
            match resolve(program, &path_var) {
                Some(f) => c(f.as_os_str().as_bytes())?,
                None => return Err(ProgramError::NotFound(program.to_string())),
            }
        };
        let mut argv = Vec::with_capacity(args.len() + 1);
        argv.push(c(program.as_bytes())?);
        for a in args {
            argv.push(c(a.as_bytes())?);
        }
        // Later entries win, each name once.
        let mut seen: std::collections::HashSet<&OsString> =
            std::collections::HashSet::with_capacity(env.len());
        let mut envp = Vec::with_capacity(env.len());
        for (k, v) in env.iter().rev() {
            if !seen.insert(k) {
                continue;
            }
            let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(c(&kv)?);
        }
        Ok(Program {
            path,
            argv,
            env: envp,
            cwd: c(cwd.as_os_str().as_bytes())?,
        })
    }
}

/// Where `program` is on `path` (as `execvp` would look, but in the parent: the child then
/// makes exactly one `execve`). Remembered while it is there: a tick runs the same few
/// programs.
pub(crate) fn resolve(program: &str, path: &OsString) -> Option<std::path::PathBuf> {
    type Found = Vec<((String, OsString), std::path::PathBuf)>;
    static FOUND: std::sync::Mutex<Found> = std::sync::Mutex::new(Vec::new());
    let key = (program.to_string(), path.clone());
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    // Still there (one stat, against one per PATH entry before it).
    if let Some((_, f)) = found.iter().find(|(k, _)| *k == key)
        && executable(f)
    {
        return Some(f.clone());
    }
    found.retain(|(k, _)| *k != key);
    let f = std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|f| executable(f))?;
    if found.len() >= 32 {
        found.remove(0);
    }
    found.push((key, f.clone()));
    Some(f)
}

/// A regular file this process may execute.
fn executable(f: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(f).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A started child: its pid and, where the kernel gives one (5.2+), a pidfd.
pub struct Child {
    pub pid: u32,
    pub pidfd: Option<OwnedFd>,
}

/// Where the child failed before `exec` (its errno is reported with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
enum Stage {
    None = 0,
    Session,
    Stdio,
    Chdir,
    Privileges,
    Landlock,
    Filter,
    Listener,
    Exec,
}

impl Stage {
    fn what(self) -> &'static str {
        match self {
            Stage::None => "start",
            Stage::Session => "start a session (or process group) of its own",
            Stage::Stdio => "set up stdin/stdout/stderr",
            Stage::Chdir => "enter the working directory",
            Stage::Privileges => "drop privileges",
            Stage::Landlock => "enter the Landlock domain",
            Stage::Filter => "install the seccomp filter",
            Stage::Listener => "hand over the filter's listener",
            Stage::Exec => "exec",
        }
    }
}

/// The kernel's `struct sigaction` (x86_64 and aarch64 both have `sa_restorer`).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// What the child reads (all pointers into the parent's memory, alive while it is
/// suspended) and writes back (`stage`, `errno`).
#[repr(C)]
struct Args {
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    cwd: *const c_char,
    stdio: [c_int; 3],
    mask: u64,
    confine: *const Confiner,
    /// Where the filter's listener goes (`-1`: nowhere).
    sock: c_int,
    stage: c_int,
    errno: c_int,
}

const STACK: usize = 256 * 1024;

/// The child's stack, one per spawning thread, made on first use and kept: the child
/// runs on it only while this thread is suspended in `clone`.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `Stack::new`, unmapped once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

impl Stack {
    fn new() -> io::Result<Stack> {
        let page = 4096;
        let len = STACK + page;
        // SAFETY: a fresh anonymous mapping; the lowest page is left inaccessible (a
        // guard: the stack grows down).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: within the mapping just made.
        let r = unsafe {
            libc::mprotect(
                base.cast::<u8>().add(page).cast(),
                STACK,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top (the initial stack pointer), 16-byte aligned.
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping, which the stack grows down from.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

thread_local! {
    static STACKS: RefCell<Option<Stack>> = const { RefCell::new(None) };
}

/// Starts `p` with `stdio` as its fds 0, 1 and 2 (each at least 3, close-on-exec: they
/// are duplicated), confined by `confine` when given. Returns the child and, when the
/// filter has a listener, the listener.
pub(crate) fn launch(
    p: &Program,
    stdio: [RawFd; 3],
    confine: Option<&Confiner>,
) -> io::Result<(Child, Option<OwnedFd>)> {
    let argv: Vec<*const c_char> = p
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const c_char> = p
        .env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let listens = confine.is_some_and(Confiner::listens);
    let pair = if listens { Some(socket_pair()?) } else { None };
    let mut args = Args {
        path: p.path.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: p.cwd.as_ptr(),
        stdio,
        mask: 0,
        confine: confine.map_or(std::ptr::null(), |c| c as *const Confiner),
        sock: pair.as_ref().map_or(-1, |(_, tx)| tx.as_raw_fd()),
        stage: Stage::None as c_int,
        errno: 0,
    };
    let (pid, pidfd) = STACKS.with(|cell| -> io::Result<(c_int, c_int)> {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Stack::new()?);
        }
        let top = slot.as_ref().map_or(std::ptr::null_mut(), Stack::top);
        Ok(clone_child(top, &mut args))
    })?;
    if pid < 0 {
        return Err(io::Error::from_raw_os_error(-pid));
    }
    let pidfd = (pidfd >= 0).then(|| {
        // SAFETY: CLONE_PIDFD stored a new fd of ours there.
        unsafe { OwnedFd::from_raw_fd(pidfd) }
    });
    if args.stage != Stage::None as c_int {
        // The child ran `_exit` (which ended the vfork wait): reap it.
        // SAFETY: waits for our own child, which has exited.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        return Err(failure(args.stage, args.errno));
    }
    let listener = match pair.map(|(rx, _tx)| receive_fd(&rx)) {
        Some(Ok(l)) => Some(l),
        Some(Err(e)) => {
            // Never: the child sends before it execs. Without its listener nobody would
            // answer its connects: it goes.
            // SAFETY: our own child, killed and reaped.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return Err(e);
        }
        None => None,
    };
    Ok((
        Child {
            pid: pid as u32,
            pidfd,
        },
        listener,
    ))
}

/// The error a failed child reported.
fn failure(stage: c_int, errno: c_int) -> io::Error {
    let e = io::Error::from_raw_os_error(errno);
    if stage == Stage::Exec as c_int {
        return e;
    }
    let what = [
        Stage::Session,
        Stage::Stdio,
        Stage::Chdir,
        Stage::Privileges,
        Stage::Landlock,
        Stage::Filter,
        Stage::Listener,
    ]
    .into_iter()
    .find(|s| *s as c_int == stage)
    .unwrap_or(Stage::None);
    io::Error::new(e.kind(), format!("cannot {}: {e}", what.what()))
}

/// Blocks every signal (glibc's own included: none of loopflow's handlers may run in the
/// child), clones, and restores the mask. Returns (pid or -errno, pidfd or -1).
fn clone_child(top: *mut c_void, args: &mut Args) -> (c_int, c_int) {
    let all: u64 = !0;
    let mut old: u64 = 0;
    // SAFETY: rt_sigprocmask with 8-byte kernel sigsets we own.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            &raw const all,
            &raw mut old,
            8usize,
        )
    };
    args.mask = old;
    let mut pidfd: c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: `top` is the top of a stack only this child uses, while this thread is
    // suspended (CLONE_VFORK); `args` outlives the call; CLONE_PIDFD writes `pidfd`.
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            flags,
            (args as *mut Args).cast(),
            &raw mut pidfd,
        )
    };
    let pid = if pid < 0 {
        -io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    } else {
        pid
    };
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &raw const old,
            std::ptr::null_mut::<u64>(),
            8usize,
        )
    };
    (pid, pidfd)
}

/// A pair of connected unix sockets (close-on-exec): the child sends the listener on
/// the second, the parent receives it on the first.
fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: socketpair writes two fds into `fds`.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh fds of ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one fd in a control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct FdMsg([u8; 32]);

fn receive_fd(rx: &OwnedFd) -> io::Result<OwnedFd> {
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&raw mut byte).cast(),
        iov_len: 1,
    };
    let mut ctl = FdMsg([0; 32]);
    // SAFETY: all-zero is a valid msghdr.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.0.as_mut_ptr().cast();
    // SAFETY: pure size arithmetic.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<c_int>() as u32) } as _;
    // SAFETY: `msg` points at live buffers of the sizes it states.
    let n = unsafe {
        libc::recvmsg(
            rx.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled `msg`; CMSG_FIRSTHDR reads its control fields.
    let cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if cmsg.is_null()
        // SAFETY: a non-null header lies within `ctl`.
        || unsafe {
            (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        }
    {
        return Err(io::Error::other("no listener from the child"));
    }
    // SAFETY: an SCM_RIGHTS message carrying one int.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>()) };
    // SAFETY: the kernel installed this fd in our table for us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Args`, alive and untouched while the parent is
    // suspended in `clone`.
    let a = unsafe { &mut *arg.cast::<Args>() };
    // SAFETY: only syscalls on what the parent prepared (see `start`).
    let stage = unsafe { start(a) };
    a.stage = stage as c_int;
    // SAFETY: errno of this thread, right after the failed call.
    a.errno = unsafe { *libc::__errno_location() };
    // SAFETY: ends the child without running anything of the parent's (atexit, buffers).
    unsafe { libc::_exit(127) }
}

/// The child's way to `exec`; returns only where it failed.
///
/// # Safety
/// Called only in the cloned child, with `a` pointing at live data of the parent's.
unsafe fn start(a: &Args) -> Stage {
    // SAFETY: (the whole block) syscalls with arguments the parent prepared; no allocation.
    unsafe {
        default_signals();
        // Confined: a session of its own, without a controlling terminal. Unconfined
        // (`mode = "off"`): a process group of its own, as any job of a shell (a new
        // session costs a new scheduler autogroup, which waits for the CPU on a busy
        // machine).
        let own = if a.confine.is_null() {
            libc::setpgid(0, 0)
        } else {
            libc::setsid()
        };
        if own < 0 {
            return Stage::Session;
        }
        for (to, &from) in a.stdio.iter().enumerate() {
            if libc::dup2(from, to as c_int) < 0 {
                return Stage::Stdio;
            }
        }
        if libc::chdir(a.cwd) != 0 {
            return Stage::Chdir;
        }
        if let Some(c) = a.confine.as_ref() {
            if !c.drop_privileges() {
                return Stage::Privileges;
            }
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Stage::Landlock;
            }
            if !c.enter_domain() {
                return Stage::Landlock;
            }
            match c.install_filter() {
                Err(e) => {
                    *libc::__errno_location() = e;
                    return Stage::Filter;
                }
                Ok(listener) if listener >= 0 => {
                    let sent = send_fd(a.sock, listener);
                    libc::close(listener);
                    if !sent {
                        return Stage::Listener;
                    }
                }
                Ok(_) => {}
            }
        }
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &raw const a.mask,
            std::ptr::null_mut::<u64>(),
            8usize,
        );
        libc::execve(a.path, a.argv, a.envp);
        Stage::Exec
    }
}

/// Every signal with a handler (loopflow's, which would run in the child's shared memory)
/// and `SIGPIPE` back to the default; ignored ones stay ignored, as `exec` keeps them.
///
/// # Safety
/// Only in the child, before `exec`.
unsafe fn default_signals() {
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        let mut old = KernelSigaction {
            handler: 0,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        // SAFETY: rt_sigaction reads nothing and writes one kernel sigaction.
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<KernelSigaction>(),
                &raw mut old,
                8usize,
            )
        };
        let ignored = old.handler == libc::SIG_IGN;
        if r != 0 || old.handler == libc::SIG_DFL || (ignored && sig != libc::SIGPIPE) {
            continue;
        }
        let dfl = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        // SAFETY: as above, setting the default disposition.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &raw const dfl,
                std::ptr::null_mut::<KernelSigaction>(),
                8usize,
            )
        };
    }
}

/// Sends `fd` over the unix socket `sock` (one byte and an `SCM_RIGHTS` message).
///
/// # Safety
/// Only in the child, before `exec`: buffers on this stack, syscalls only.
unsafe fn send_fd(sock: c_int, fd: c_int) -> bool {
    let mut byte = 0u8;
    let mut iov = libc::iovec {
        iov_base: (&raw mut byte).cast(),
        iov_len: 1,
    };
    let mut ctl = FdMsg([0; 32]);
    // SAFETY: (the whole block) all-zero is a valid msghdr; every pointer is to this frame.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.0.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(size_of::<c_int>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return false;
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<c_int>(), fd);
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn the_program_is_resolved_and_later_variables_win() {
        let p = Program::new(
            "true",
            &["x".into()],
            &env(&[
                ("PATH", "/nonexistent:/usr/bin:/bin"),
                ("A", "1"),
                ("A", "2"),
            ]),
            Path::new("/"),
        )
        .unwrap();
        assert!(p.path.to_bytes().ends_with(b"/true"), "{:?}", p.path);
        assert_eq!(p.argv, [c"true".to_owned(), c"x".to_owned()]);
        let a: Vec<&CString> = p
            .env
            .iter()
            .filter(|e| e.to_bytes().starts_with(b"A="))
            .collect();
        assert_eq!(a, [&c"A=2".to_owned()]);
        let missing = Program::new(
            "no-such-program-here",
            &[],
            &env(&[("PATH", "/usr/bin")]),
            Path::new("/"),
        );
        assert!(matches!(missing, Err(ProgramError::NotFound(_))));
        let nul = Program::new(
            "true",
            &["a\0b".into()],
            &env(&[("PATH", "/usr/bin")]),
            Path::new("/"),
        );
        assert!(matches!(nul, Err(ProgramError::Nul)));
    }

    #[test]
    fn an_unconfined_child_runs_in_a_group_of_its_own_with_its_stdio() {
        let dir = tempfile::tempdir().unwrap();
        let out = std::fs::File::create(dir.path().join("out")).unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let p = Program::new(
            "sh",
            &[
                "-c".into(),
                "echo $$ $(ps -o pgid= -p $$ 2>/dev/null | tr -d ' ')".into(),
            ],
            &env(&[("PATH", "/usr/bin:/bin")]),
            dir.path(),
        )
        .unwrap();
        let (child, listener) = launch(
            &p,
            [null.as_raw_fd(), out.as_raw_fd(), out.as_raw_fd()],
            None,
        )
        .unwrap();
        assert!(listener.is_none());
        let mut status = 0;
        // SAFETY: our own child.
        unsafe { libc::waitpid(child.pid as i32, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        let text = std::fs::read_to_string(dir.path().join("out")).unwrap();
        let f: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(f[0], child.pid.to_string(), "{text}");
        if let Some(pgid) = f.get(1) {
            assert_eq!(*pgid, f[0], "its own process group: {text}");
        }
    }

    #[test]
    fn a_missing_directory_is_reported_as_where_the_child_failed() {
        let p = Program::new(
            "true",
            &[],
            &env(&[("PATH", "/usr/bin:/bin")]),
            Path::new("/no/such/dir"),
        )
        .unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = null.as_raw_fd();
        let e = launch(&p, [fd, fd, fd], None).err().expect("fails");
        assert!(e.to_string().contains("working directory"), "{e}");
    }
}
