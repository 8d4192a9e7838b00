//! The filter program, checked offline (the attacks run in tests/it/secrets.rs).

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
    let proxy = Filter::new(&Net::Proxy("127.0.0.1:1".parse().unwrap()));
    let deny = Filter::new(&Net::Deny);
    assert!(proxy.listener && !deny.listener);
    assert!(proxy.prog.len() < 64 && deny.prog.len() < 64);
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
