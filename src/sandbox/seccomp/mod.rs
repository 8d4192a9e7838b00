//! Seccomp-BPF confinement for what Landlock does not cover: the syscalls that reach other
//! processes or kernel objects shared with the user's other processes, privilege, the
//! terminal and — when the network is limited — every socket but TCP to the tick's proxy.
//! [`Filter`] is the program ([`filter`] says what it refuses and why), [`install`] puts it
//! on the calling thread (async-signal-safe: the spawned child does it before `exec`), and
//! a [`Supervisor`] decides the `connect` calls of every confined process of a tick.

use std::net::SocketAddr;
use std::os::fd::RawFd;

mod filter;
mod supervisor;

pub(crate) use filter::Filter;
pub(crate) use supervisor::{Connected, Supervisor};

/// What confined processes may do with the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Net {
    /// No network sockets at all.
    Deny,
    /// TCP only through `proxy`: every connect() is decided by the Supervisor.
    Proxy(SocketAddr),
}

/// Installs `filter` on the calling thread (the caller has set no_new_privs): the
/// notification listener's fd for a filter with one (`SECCOMP_FILTER_FLAG_NEW_LISTENER`;
/// the kernel makes it close-on-exec, so the confined program never holds it and cannot
/// answer its own notifications), else `-1`; or the errno.
///
/// Only makes syscalls and allocates nothing: safe between `clone` and `exec`.
/// `WAIT_KILLABLE_RECV` (Linux 5.19) is requested so that a signal arriving while loopflow
/// connects on the process's behalf (Go's SIGURG preemption, say) cannot restart its
/// connect() behind loopflow's back; older kernels reject the flag with `EINVAL` and the
/// install is retried without it.
pub(crate) fn install(filter: &Filter) -> Result<RawFd, libc::c_int> {
    if filter::AUDIT_ARCH.is_none() {
        return Err(libc::ENOSYS);
    }
    let len = u16::try_from(filter.prog.len()).map_err(|_| libc::EINVAL)?;
    if len == 0 {
        return Err(libc::EINVAL);
    }
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
        // SAFETY: `prog` points at `len` valid instructions that outlive the call; the
        // kernel copies them and keeps no pointer.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &prog as *const libc::sock_fprog,
            )
        };
        if r >= 0 {
            return Ok(if filter.listener { r as RawFd } else { -1 });
        }
        // SAFETY: errno of this thread, read right after the failed call.
        let e = unsafe { *libc::__errno_location() };
        if e == libc::EINVAL && flags != base {
            flags = base;
            continue;
        }
        return Err(e);
    }
}

/// Whether this kernel runs the filter: seccomp filters with `errno`, and for a proxy the
/// user notification its supervisor needs (what `/proc/sys/kernel/seccomp/actions_avail`
/// lists), read once.
pub(crate) fn available(notify: bool) -> bool {
    static AVAIL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let a = AVAIL.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/seccomp/actions_avail").unwrap_or_default()
    });
    let has = |w: &str| a.split_whitespace().any(|x| x == w);
    filter::AUDIT_ARCH.is_some() && has("errno") && (!notify || has("user_notif"))
}

#[cfg(test)]
mod tests;
