//! The seccomp-BPF program every confined process runs under: allow by default, and
//! refuse what reaches beyond the process tree or off the machine.
//!
//! Always (every mode but `off`):
//! * other processes by other means than signals (which Landlock scopes):
//!   `prlimit64`, `sched_set*`, `migrate_pages`, `move_pages` on any pid but the caller's
//!   own (`0`); `setpriority`/`ioprio_set` but on the caller or its own group (`who = 0`,
//!   never a whole user); `perf_event_open` but on itself; `process_vm_readv/writev`,
//!   `kcmp`, `process_madvise`, `process_mrelease`, `pidfd_getfd`: `EPERM`;
//! * kernel objects shared with the user's other processes: the keyrings (`keyctl`,
//!   `add_key`, `request_key`), SysV IPC and POSIX message queues: `ENOSYS`, as on a kernel
//!   built without them, so programs fall back quietly;
//! * what only privilege or a new namespace gives (capabilities are dropped too; this is
//!   the second wall): namespaces (`unshare`, `setns`, `clone` with `CLONE_NEW*`), mounts,
//!   `bpf`, modules, `kexec`, `reboot`, swap, the clock, host and domain names, `syslog`,
//!   `open_by_handle_at`, `quotactl`; `userfaultfd` (a way to stall whoever reads the
//!   process's memory, loopflow reading its environment included) and `clone3` (its flags
//!   live in memory a filter cannot read): `ENOSYS`, so libc falls back to `clone`;
//! * the terminal: `ioctl(TIOCSTI)` and `ioctl(TIOCLINUX)` (typing into a terminal);
//! * `io_uring_*`: `ENOSYS` (a ring performs socket and file operations without entering
//!   the syscalls above; `ENOSYS` makes runtimes fall back quietly);
//! * a foreign audit arch: kill; on x86_64 the x32-ABI numbers: `EPERM` (checking the arch
//!   also removes `socketcall` and `ipc`, which only the 32-bit ABIs have).
//!
//! When the network is limited ([`Net`]):
//! * `socket`: only TCP over IPv4/IPv6 (and only under [`Net::Proxy`]) and `NETLINK_ROUTE`
//!   (glibc's `getaddrinfo`/`getifaddrs` need it; it only talks to the kernel). Everything
//!   else — unix, UDP, raw, packet, SCTP, vsock… — fails with `EACCES`, the errno LSMs use,
//!   so messages read "Permission denied" and point at the sandbox.
//! * `socketpair`: only `AF_UNIX` stream/seqpacket pairs. Datagram pairs are refused because
//!   `sendto`/`sendmsg` on a *connected* unix datagram socket still honours a destination
//!   path, which would reach any unix socket.
//! * `connect`: refused (`EACCES`) under [`Net::Deny`]; under [`Net::Proxy`] handed to the
//!   supervisor via `SECCOMP_RET_USER_NOTIF`.
//! * `sendto`/`sendmsg`/`sendmmsg` with `MSG_FASTOPEN`: `EPERM`, since TCP Fast Open
//!   connects without ever calling `connect`.
//!   `bind`/`listen`/`accept` stay allowed: they are not egress.
//!
//! Syscalls whose answer depends on no argument are looked up in the kernel's per-filter
//! cache (Linux 5.11+): the common ones cost the process nothing.

use libc::{c_int, sock_filter};

use super::Net;

/// `AUDIT_ARCH_*` of the native ABI; `None` where this module is unsupported.
#[cfg(target_arch = "x86_64")]
pub(super) const AUDIT_ARCH: Option<u32> = Some(0xC000_003E);
#[cfg(target_arch = "aarch64")]
pub(super) const AUDIT_ARCH: Option<u32> = Some(0xC000_00B7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) const AUDIT_ARCH: Option<u32> = None;

/// Set in `nr` by x32 processes, which share `AUDIT_ARCH_X86_64`.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// `SOCK_TYPE_MASK`: the low bits of `type`; the rest are NONBLOCK/CLOEXEC.
const SOCK_TYPE_MASK: u32 = 0xf;
const NETLINK_ROUTE: u32 = 0;
/// `PERF_FLAG_PID_CGROUP`: the pid argument is a cgroup's fd.
const PERF_FLAG_PID_CGROUP: u32 = 1 << 2;
/// `IOPRIO_WHO_PROCESS` and `IOPRIO_WHO_PGRP` (`IOPRIO_WHO_USER` is refused).
const IOPRIO_WHO_PROCESS: u32 = 1;
const IOPRIO_WHO_PGRP: u32 = 2;
/// Every `CLONE_NEW*` flag `clone` takes (`CLONE_NEWTIME` only exists for `unshare` and
/// `clone3`: in `clone`'s flags its bit is part of the exit signal).
const CLONE_NEW: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u32;
const UNSHARE_NEW: u32 = CLONE_NEW | libc::CLONE_NEWTIME as u32;

// Classic BPF opcodes (libc's are `u32`, `sock_filter::code` is `u16`).
pub(super) const LD_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
pub(super) const AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
pub(super) const JEQ: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
pub(super) const JSET: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
pub(super) const RET: u16 = 0x06; // BPF_RET | BPF_K

/// Offsets into `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
/// Offset of the low 32 bits of syscall argument `i`: every argument tested is an
/// `int`/`unsigned`/`pid_t`, which the kernel truncates the register to.
const fn arg(i: u32) -> u32 {
    16 + 8 * i + if cfg!(target_endian = "big") { 4 } else { 0 }
}

pub(super) const fn errno(e: c_int) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// The BPF program, built once per tick in the parent so installing it never allocates.
pub(crate) struct Filter {
    pub(super) prog: Vec<sock_filter>,
    /// Connects go to a supervisor: installing it yields a notification listener.
    pub(super) listener: bool,
}

/// Assembler item: a statement, a jump to labels, or a label definition.
#[derive(Clone, Copy)]
enum Op {
    S(u16, u32),
    J(u16, u32, Label, Label),
    L(Label),
}

/// Jump targets. `Next` means "fall through".
#[derive(Clone, Copy, PartialEq, Eq)]
enum Label {
    Next,
    Allow,
    Eacces,
    Eperm,
    Enosys,
    Kill,
    Connect,
    Socket,
    Pair,
    Netlink,
    Inet,
    Flags2,
    Flags3,
    /// Argument 0 must be the caller itself (pid 0).
    SelfPid,
    /// `setpriority`: `which` a process or group, `who` the caller's own.
    Prio,
    Ioprio,
    /// Argument 1 (`who`) must be 0.
    Who0,
    Perf,
    Ioctl,
    Clone,
    Unshare,
}

/// Syscalls refused with `EPERM` whatever their arguments.
const EPERM_ALWAYS: &[libc::c_long] = &[
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_process_madvise,
    libc::SYS_process_mrelease,
    libc::SYS_pidfd_getfd,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_reboot,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_syslog,
    libc::SYS_open_by_handle_at,
    libc::SYS_quotactl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// Syscalls that answer `ENOSYS` whatever their arguments: what a kernel without them says.
const ENOSYS_ALWAYS: &[libc::c_long] = &[
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_shmget,
    libc::SYS_shmat,
    libc::SYS_shmctl,
    libc::SYS_shmdt,
    libc::SYS_semget,
    libc::SYS_semop,
    libc::SYS_semtimedop,
    libc::SYS_semctl,
    libc::SYS_msgget,
    libc::SYS_msgsnd,
    libc::SYS_msgrcv,
    libc::SYS_msgctl,
    libc::SYS_mq_open,
    libc::SYS_mq_unlink,
    libc::SYS_mq_timedsend,
    libc::SYS_mq_timedreceive,
    libc::SYS_mq_notify,
    libc::SYS_mq_getsetattr,
    libc::SYS_userfaultfd,
    libc::SYS_clone3,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
];

/// Syscalls whose first argument names the process acted on: only the caller's own.
const SELF_ONLY: &[libc::c_long] = &[
    libc::SYS_prlimit64,
    libc::SYS_sched_setaffinity,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setattr,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
];

/// Resolves labels to forward offsets. Labels keep the program readable and the unit tests
/// execute it; an offset that does not fit a jump (never, for these programs: the tests
/// run every branch) yields an empty program, which `install` refuses.
fn assemble(ops: &[Op]) -> Vec<sock_filter> {
    let mut at: Vec<(Label, usize)> = Vec::new();
    let mut n = 0;
    for op in ops {
        match *op {
            Op::L(l) => at.push((l, n)),
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for op in ops {
        let here = out.len() + 1;
        let off = |l: Label| -> Option<u8> {
            if l == Label::Next {
                return Some(0);
            }
            let p = at.iter().find(|(x, _)| *x == l)?.1;
            u8::try_from(p.checked_sub(here)?).ok()
        };
        let (code, jt, jf, k) = match *op {
            Op::L(_) => continue,
            Op::S(code, k) => (code, 0, 0, k),
            Op::J(code, k, t, f) => match (off(t), off(f)) {
                (Some(t), Some(f)) => (code, t, f, k),
                _ => return Vec::new(),
            },
        };
        out.push(sock_filter { code, jt, jf, k });
    }
    out
}

impl Filter {
    /// Builds the program: the process rules always, the network rules for `net` (`None`:
    /// the network is open).
    // The libc constants' types differ between libcs (`as` is the portable spelling).
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn new(net: Option<&Net>) -> Filter {
        use Label::*;
        use Op::{J, L, S};
        let proxy = matches!(net, Some(Net::Proxy(_)));
        let mut ops = vec![
            S(LD_ABS, ARCH),
            J(JEQ, AUDIT_ARCH.unwrap_or(0), Next, Kill),
            S(LD_ABS, NR),
        ];
        #[cfg(target_arch = "x86_64")]
        ops.push(J(JSET, X32_SYSCALL_BIT, Eperm, Next));
        let nr = |n: libc::c_long| n as u32;
        for &n in EPERM_ALWAYS {
            ops.push(J(JEQ, nr(n), Eperm, Next));
        }
        for &n in ENOSYS_ALWAYS {
            ops.push(J(JEQ, nr(n), Enosys, Next));
        }
        for &n in SELF_ONLY {
            ops.push(J(JEQ, nr(n), SelfPid, Next));
        }
        ops.extend([
            J(JEQ, nr(libc::SYS_setpriority), Prio, Next),
            J(JEQ, nr(libc::SYS_ioprio_set), Ioprio, Next),
            J(JEQ, nr(libc::SYS_perf_event_open), Perf, Next),
            J(JEQ, nr(libc::SYS_ioctl), Ioctl, Next),
            J(JEQ, nr(libc::SYS_clone), Clone, Next),
            J(JEQ, nr(libc::SYS_unshare), Unshare, Next),
        ]);
        if net.is_some() {
            ops.extend([
                J(JEQ, nr(libc::SYS_socket), Socket, Next),
                J(JEQ, nr(libc::SYS_socketpair), Pair, Next),
                J(JEQ, nr(libc::SYS_connect), Connect, Next),
                J(JEQ, nr(libc::SYS_sendto), Flags3, Next),
                J(JEQ, nr(libc::SYS_sendmmsg), Flags3, Next),
                J(JEQ, nr(libc::SYS_sendmsg), Flags2, Next),
            ]);
        }
        ops.extend([
            S(RET, libc::SECCOMP_RET_ALLOW),
            L(SelfPid),
            S(LD_ABS, arg(0)),
            J(JEQ, 0, Allow, Eperm),
            L(Prio),
            S(LD_ABS, arg(0)),
            J(JEQ, libc::PRIO_PROCESS as u32, Who0, Next),
            J(JEQ, libc::PRIO_PGRP as u32, Who0, Eperm),
            L(Ioprio),
            S(LD_ABS, arg(0)),
            J(JEQ, IOPRIO_WHO_PROCESS, Who0, Next),
            J(JEQ, IOPRIO_WHO_PGRP, Who0, Eperm),
            L(Who0),
            S(LD_ABS, arg(1)),
            J(JEQ, 0, Allow, Eperm),
            L(Perf),
            S(LD_ABS, arg(1)),
            J(JEQ, 0, Next, Eperm),
            S(LD_ABS, arg(4)),
            J(JSET, PERF_FLAG_PID_CGROUP, Eperm, Allow),
            L(Ioctl),
            S(LD_ABS, arg(1)),
            J(JEQ, libc::TIOCSTI as u32, Eperm, Next),
            J(JEQ, libc::TIOCLINUX as u32, Eperm, Allow),
            L(Clone),
            S(LD_ABS, arg(0)),
            J(JSET, CLONE_NEW, Eperm, Allow),
            L(Unshare),
            S(LD_ABS, arg(0)),
            J(JSET, UNSHARE_NEW, Eperm, Allow),
        ]);
        if net.is_some() {
            network_rules(&mut ops, proxy);
        }
        ops.extend([
            L(Allow),
            S(RET, libc::SECCOMP_RET_ALLOW),
            L(Eacces),
            S(RET, errno(libc::EACCES)),
            L(Eperm),
            S(RET, errno(libc::EPERM)),
            L(Enosys),
            S(RET, errno(libc::ENOSYS)),
            L(Kill),
            S(RET, libc::SECCOMP_RET_KILL_PROCESS),
        ]);
        Filter {
            prog: assemble(&ops),
            listener: proxy,
        }
    }

    /// Whether connects are decided by a supervisor (installing yields a listener).
    pub(crate) fn has_listener(&self) -> bool {
        self.listener
    }
}

/// The `socket`, `socketpair`, `connect` and `send*` branches (see the module docs).
fn network_rules(ops: &mut Vec<Op>, proxy: bool) {
    use Label::*;
    use Op::{J, L, S};
    let fastopen = libc::MSG_FASTOPEN as u32;
    ops.extend([
        L(Flags3),
        S(LD_ABS, arg(3)),
        J(JSET, fastopen, Eperm, Allow),
        L(Flags2),
        S(LD_ABS, arg(2)),
        J(JSET, fastopen, Eperm, Allow),
        L(Pair),
        S(LD_ABS, arg(0)),
        J(JEQ, libc::AF_UNIX as u32, Next, Eacces),
        S(LD_ABS, arg(1)),
        S(AND_K, SOCK_TYPE_MASK),
        J(JEQ, libc::SOCK_STREAM as u32, Allow, Next),
        J(JEQ, libc::SOCK_SEQPACKET as u32, Allow, Eacces),
        L(Socket),
        S(LD_ABS, arg(0)),
        J(JEQ, libc::AF_NETLINK as u32, Netlink, Next),
    ]);
    if proxy {
        // Protocol must be 0 or TCP: SCTP and MPTCP are SOCK_STREAM too, and SCTP can
        // connect through setsockopt(SCTP_SOCKOPT_CONNECTX).
        ops.extend([
            J(JEQ, libc::AF_INET as u32, Inet, Next),
            J(JEQ, libc::AF_INET6 as u32, Inet, Eacces),
            L(Inet),
            S(LD_ABS, arg(1)),
            S(AND_K, SOCK_TYPE_MASK),
            J(JEQ, libc::SOCK_STREAM as u32, Next, Eacces),
            S(LD_ABS, arg(2)),
            J(JEQ, 0, Allow, Next),
            J(JEQ, libc::IPPROTO_TCP as u32, Allow, Eacces),
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
        L(Netlink),
        S(LD_ABS, arg(2)),
        J(JEQ, NETLINK_ROUTE, Allow, Eacces),
        L(Connect),
        S(RET, on_connect),
    ]);
}
