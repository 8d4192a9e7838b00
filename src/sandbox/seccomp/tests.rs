//! The filter program, checked offline (the attacks run in tests/it/secrets.rs and
//! tests/it/no_way_out.rs).

use std::net::{Ipv6Addr, SocketAddr};

use libc::c_int;

use super::filter::{AND_K, AUDIT_ARCH, Filter, JEQ, JSET, LD_ABS, RET, errno};
use super::supervisor::{bytes, describe, proxy_target};
use super::*;

/// Runs the program like the kernel would, on one synthetic syscall.
fn run(f: &Filter, arch: u32, nr: i64, args: [u64; 6]) -> u32 {
    let mut d = [0u8; 64];
    d[0..4].copy_from_slice(&(nr as u32).to_ne_bytes());
    d[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    let (mut acc, mut pc) = (0u32, 0usize);
    while let Some(i) = f.prog.get(pc) {
        pc += 1;
        let jump = |c: bool| usize::from(if c { i.jt } else { i.jf });
        match i.code {
            LD_ABS => acc = u32::from_ne_bytes(bytes(&d, i.k as usize).unwrap()),
            AND_K => acc &= i.k,
            JEQ => pc += jump(acc == i.k),
            JSET => pc += jump(acc & i.k != 0),
            RET => return i.k,
            c => panic!("opcode {c:#x}"),
        }
    }
    panic!("fell off the end")
}

fn sys(f: &Filter, nr: i64, args: [u64; 6]) -> u32 {
    run(f, AUDIT_ARCH.unwrap(), nr, args)
}

const OK: u32 = libc::SECCOMP_RET_ALLOW;

#[test]
fn program_rules() {
    let proxy = Filter::new(Some(&Net::Proxy("127.0.0.1:1".parse().unwrap())));
    let deny = Filter::new(Some(&Net::Deny));
    assert!(proxy.listener && !deny.listener);
    assert!(proxy.prog.len() < 160 && deny.prog.len() < 160);
    let (inet, inet6, unix) = (
        libc::AF_INET as u64,
        libc::AF_INET6 as u64,
        libc::AF_UNIX as u64,
    );
    let (stream, dgram) = (libc::SOCK_STREAM as u64, libc::SOCK_DGRAM as u64);
    let nb = stream | libc::SOCK_NONBLOCK as u64 | libc::SOCK_CLOEXEC as u64;
    let s = |f: &Filter, d: u64, t: u64, p: u64| sys(f, libc::SYS_socket, [d, t, p, 0, 0, 0]);
    let eacces = errno(libc::EACCES);
    assert_eq!(s(&proxy, inet, stream, 0), OK);
    assert_eq!(s(&proxy, inet6, nb, 6), OK);
    assert_eq!(
        s(&proxy, inet | 1 << 32, stream, 0),
        s(&proxy, inet, stream, 0)
    );
    assert_eq!(s(&proxy, inet, stream, libc::IPPROTO_SCTP as u64), eacces);
    assert_eq!(s(&proxy, inet, stream, libc::IPPROTO_MPTCP as u64), eacces);
    assert_eq!(s(&proxy, inet, dgram, 0), eacces);
    assert_eq!(s(&proxy, inet, libc::SOCK_RAW as u64, 1), eacces);
    assert_eq!(s(&proxy, unix, stream, 0), eacces);
    assert_eq!(s(&proxy, libc::AF_PACKET as u64, 3, 0), eacces);
    assert_eq!(s(&deny, inet, stream, 0), eacces);
    assert_eq!(s(&deny, inet6, stream, 0), eacces);
    for f in [&proxy, &deny] {
        let nl = libc::AF_NETLINK as u64;
        assert_eq!(s(f, nl, 3, 0), OK);
        assert_eq!(s(f, nl, 3, 9), eacces);
        let pair = |d: u64, t: u64| sys(f, libc::SYS_socketpair, [d, t, 0, 0, 0, 0]);
        assert_eq!(pair(unix, nb), OK);
        assert_eq!(pair(unix, libc::SOCK_SEQPACKET as u64), OK);
        assert_eq!(pair(unix, dgram), eacces);
        assert_eq!(pair(inet, stream), eacces);
        let tfo = libc::MSG_FASTOPEN as u64;
        let eperm = errno(libc::EPERM);
        assert_eq!(sys(f, libc::SYS_sendto, [3, 0, 1, tfo, 0, 0]), eperm);
        assert_eq!(sys(f, libc::SYS_sendto, [3, 0, 1, 0, 0, 0]), OK);
        assert_eq!(sys(f, libc::SYS_sendmsg, [3, 0, tfo, 0, 0, 0]), eperm);
        assert_eq!(sys(f, libc::SYS_sendmsg, [3, 0, 0, tfo, 0, 0]), OK);
        assert_eq!(sys(f, libc::SYS_sendmmsg, [3, 0, 1, tfo, 0, 0]), eperm);
        assert_eq!(
            sys(f, libc::SYS_io_uring_setup, [8, 0, 0, 0, 0, 0]),
            errno(libc::ENOSYS)
        );
        assert_eq!(sys(f, libc::SYS_getpid, [0; 6]), OK);
        assert_eq!(sys(f, libc::SYS_bind, [0; 6]), OK);
        assert_eq!(
            run(f, 0x4000_0003, libc::SYS_getpid, [0; 6]),
            libc::SECCOMP_RET_KILL_PROCESS
        );
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            sys(
                f,
                libc::SYS_socket | 0x4000_0000,
                [inet, stream, 0, 0, 0, 0]
            ),
            eperm
        );
    }
    assert_eq!(
        sys(&proxy, libc::SYS_connect, [0; 6]),
        libc::SECCOMP_RET_USER_NOTIF
    );
    assert_eq!(sys(&deny, libc::SYS_connect, [0; 6]), eacces);
}

fn sa(family: c_int, rest: &[u8]) -> Vec<u8> {
    let mut v = (family as u16).to_ne_bytes().to_vec();
    v.extend_from_slice(rest);
    v
}

#[test]
fn addresses() {
    let v4 = sa(libc::AF_INET, &[0, 80, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(describe(&v4), "1.2.3.4:80");
    assert_eq!(describe(&v4[..15]), "family 2"); // too short for the kernel
    let mut v6 = sa(libc::AF_INET6, &[0, 22, 0, 0, 0, 0]);
    v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
    assert_eq!(describe(&v6), "[::1]:22");
    assert_eq!(describe(&sa(libc::AF_UNIX, b"/tmp/x\0junk")), "unix:/tmp/x");
    assert_eq!(describe(&sa(libc::AF_UNIX, b"\0abs")), "unix:@abs");
    assert_eq!(describe(&sa(libc::AF_VSOCK, &[0; 14])), "family 40");
    assert_eq!(describe(&[1]), "invalid sockaddr");
    let p: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    let q = |s: &str| proxy_target(s.parse().unwrap(), p);
    assert_eq!(q("127.0.0.1:8080"), Some(p));
    assert_eq!(
        q("[::ffff:127.0.0.1]:8080"),
        "[::ffff:127.0.0.1]:8080".parse().ok()
    );
    assert_eq!(q("127.0.0.1:8081"), None);
    assert_eq!(q("127.0.0.2:8080"), None);
    assert_eq!(q("[::1]:8080"), None);
    let p6: SocketAddr = "[::1]:9".parse().unwrap();
    assert_eq!(proxy_target("[::1]:9".parse().unwrap(), p6), Some(p6));
    assert_eq!(proxy_target("127.0.0.1:9".parse().unwrap(), p6), None);
}

/// The rules every confined process runs under, whatever its network: other processes
/// reached by other means than signals, shared kernel objects, privilege, the terminal.
#[test]
#[allow(clippy::unnecessary_cast)] // the libc constants' types differ between libcs
fn process_rules() {
    let open = Filter::new(None);
    let deny = Filter::new(Some(&Net::Deny));
    let proxy = Filter::new(Some(&Net::Proxy("127.0.0.1:1".parse().unwrap())));
    assert!(!open.listener);
    let (eperm, enosys) = (errno(libc::EPERM), errno(libc::ENOSYS));
    let other = 4242u64;
    for f in [&open, &deny, &proxy] {
        assert!(!f.prog.is_empty(), "a jump did not fit");
        let one = |nr: i64, a0: u64| sys(f, nr, [a0, 0, 0, 0, 0, 0]);
        // Only the caller itself (pid 0) for what names a process.
        for nr in [
            libc::SYS_prlimit64,
            libc::SYS_sched_setaffinity,
            libc::SYS_sched_setscheduler,
            libc::SYS_sched_setparam,
            libc::SYS_sched_setattr,
            libc::SYS_migrate_pages,
            libc::SYS_move_pages,
        ] {
            assert_eq!(one(nr, 0), OK, "{nr} on itself");
            assert_eq!(one(nr, other), eperm, "{nr} on another");
            // A pid is an int: the high half of the register does not count.
            assert_eq!(one(nr, 1 << 32), OK, "{nr}");
        }
        let prio = |which: u64, who: u64| sys(f, libc::SYS_setpriority, [which, who, 5, 0, 0, 0]);
        assert_eq!(prio(libc::PRIO_PROCESS as u64, 0), OK);
        assert_eq!(prio(libc::PRIO_PGRP as u64, 0), OK);
        assert_eq!(prio(libc::PRIO_PROCESS as u64, other), eperm);
        assert_eq!(prio(libc::PRIO_USER as u64, 0), eperm);
        let io = |which: u64, who: u64| sys(f, libc::SYS_ioprio_set, [which, who, 0, 0, 0, 0]);
        assert_eq!(io(1, 0), OK);
        assert_eq!(io(2, 0), OK);
        assert_eq!(io(1, other), eperm);
        assert_eq!(io(3, 0), eperm, "a whole user");
        let perf = |pid: u64, flags: u64| {
            sys(
                f,
                libc::SYS_perf_event_open,
                [0, pid, u64::MAX, u64::MAX, flags, 0],
            )
        };
        assert_eq!(perf(0, 0), OK);
        assert_eq!(perf(other, 0), eperm);
        assert_eq!(perf(u32::MAX as u64, 0), eperm, "every process on a CPU");
        assert_eq!(perf(0, 4), eperm, "a cgroup");
        for nr in [
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
            libc::SYS_kcmp,
            libc::SYS_pidfd_getfd,
            libc::SYS_setns,
            libc::SYS_bpf,
            libc::SYS_mount,
            libc::SYS_reboot,
            libc::SYS_sethostname,
            libc::SYS_init_module,
        ] {
            assert_eq!(one(nr, 0), eperm, "{nr}");
        }
        for nr in [
            libc::SYS_keyctl,
            libc::SYS_add_key,
            libc::SYS_request_key,
            libc::SYS_shmget,
            libc::SYS_semget,
            libc::SYS_msgget,
            libc::SYS_mq_open,
            libc::SYS_userfaultfd,
            libc::SYS_clone3,
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
        ] {
            assert_eq!(one(nr, 0), enosys, "{nr}");
        }
        let ioctl = |req: u64| sys(f, libc::SYS_ioctl, [0, req, 0, 0, 0, 0]);
        assert_eq!(ioctl(libc::TIOCSTI as u64), eperm);
        assert_eq!(ioctl(libc::TIOCLINUX as u64), eperm);
        assert_eq!(ioctl(libc::TIOCGWINSZ as u64), OK);
        assert_eq!(ioctl(libc::FIONREAD as u64), OK);
        let fork = (libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID | libc::SIGCHLD) as u64;
        assert_eq!(one(libc::SYS_clone, fork), OK);
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_THREAD
            | libc::CLONE_SIGHAND) as u64;
        assert_eq!(one(libc::SYS_clone, thread), OK);
        for ns in [libc::CLONE_NEWUSER, libc::CLONE_NEWNET, libc::CLONE_NEWNS] {
            assert_eq!(one(libc::SYS_clone, fork | ns as u64), eperm);
            assert_eq!(one(libc::SYS_unshare, ns as u64), eperm);
        }
        assert_eq!(one(libc::SYS_unshare, libc::CLONE_NEWTIME as u64), eperm);
        assert_eq!(one(libc::SYS_unshare, libc::CLONE_FILES as u64), OK);
        for nr in [
            libc::SYS_getpid,
            libc::SYS_read,
            libc::SYS_kill,
            libc::SYS_ptrace,
        ] {
            assert_eq!(one(nr, 1), OK, "{nr}");
        }
    }
    // With the network open, sockets are not the filter's business.
    let inet = libc::AF_INET as u64;
    assert_eq!(
        sys(
            &open,
            libc::SYS_socket,
            [inet, libc::SOCK_DGRAM as u64, 0, 0, 0, 0]
        ),
        OK
    );
    assert_eq!(sys(&open, libc::SYS_connect, [3, 0, 16, 0, 0, 0]), OK);
}
