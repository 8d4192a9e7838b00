//! The floor a sandboxed tick is measured against (`benches/tick.rs` runs it as a
//! process, in the same interleaved run): the least any crash-safe runner of the default
//! tick must do with its agents confined. It takes the loop's lock, reads the state,
//! writes three prompts, builds one Landlock ruleset of the size loopflow's is (the
//! system, `/proc`'s non-process entries, the devices, the loop's directories and the
//! toolchains on `PATH`; a TCP port rule) and one seccomp filter of the size loopflow's
//! is, once; then spawns its three agents (`true`, `echo VERDICT`, `true`), each a
//! `clone(CLONE_VM|CLONE_VFORK)` child of its own stack that enters the domain (with a
//! rule for its own `/proc/<pid>`), installs the filter and `execve`s the program the
//! parent resolved, stdin from `/dev/null`, stdout/stderr to new per-tick files; waits
//! for each; writes the state atomically (temp file, fsync, rename, fsync the directory)
//! and appends a log line.
//!
//! Like `benches/floor.rs` it works in the benchmarked loop's own directory (`DIR`): its
//! files are `outputs/floor-*`, `.floor-state`, `.floor-lock` and `.floor-log`. Nothing
//! of loopflow is linked in: its start-up stays that of a small Rust program.
//!
//! `floor_confined DIR ROUND [--rules] [--session]` (`--rules` prints the ruleset's rule
//! count; `--session` puts each child in a session of its own, as loopflow does, which
//! costs a new scheduler autogroup: on a busy machine the child then waits for the CPU).

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

const VERDICT: &str = r#"{"pass": false, "score": 0.5}"#;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` runs every bench target with `--bench`: nothing to do on its own.
    let (Some(dir), Some(round)) = (args.get(1), args.get(2)) else {
        return;
    };
    if dir.starts_with("--") {
        return;
    }
    let flag = |f: &str| args.iter().any(|a| a == f);
    run(Path::new(dir), round, flag("--rules"), flag("--session"));
}

#[cfg(not(target_os = "linux"))]
fn run(_: &Path, _: &str, _: bool, _: bool) {}

#[cfg(target_os = "linux")]
fn run(dir: &Path, round: &str, print_rules: bool, session: bool) {
    let outputs = dir.join("outputs");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".floor-lock"))
        .expect("lock file");
    lock.try_lock().expect("lock");
    let _state = std::fs::read(dir.join(".floor-state")).unwrap_or_default();
    let prompt = "You are the implementer. Read the task and change the code.\n".repeat(32);
    for role in ["implement", "verify", "orchestrate"] {
        std::fs::write(
            outputs.join(format!("floor-{round}-{role}.prompt.md")),
            &prompt,
        )
        .expect("prompt");
    }
    let (ruleset, rules) = confine::ruleset(dir);
    if print_rules {
        println!("{rules} rules");
    }
    let filter = confine::filter();
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    let path = std::env::var_os("PATH").unwrap_or_default();
    for (i, argv) in [vec!["true"], vec!["echo", VERDICT], vec!["true"]]
        .iter()
        .enumerate()
    {
        let out = std::fs::File::create(outputs.join(format!("floor-{round}-{i}.stdout")))
            .expect("stdout file");
        let err = std::fs::File::create(outputs.join(format!("floor-{round}-{i}.stderr")))
            .expect("stderr file");
        let program = std::env::split_paths(&path)
            .map(|d| d.join(argv[0]))
            .find(|f| f.is_file())
            .expect("program on PATH");
        let program = CString::new(program.as_os_str().as_bytes()).expect("path");
        let argv: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(*a).expect("arg"))
            .collect();
        let pid = confine::spawn(
            &program,
            &argv,
            dir,
            [null.as_raw_fd(), out.as_raw_fd(), err.as_raw_fd()],
            &ruleset,
            &filter,
            session,
        );
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
    write_atomic(dir, &dir.join(".floor-state"), state(round).as_bytes());
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(".floor-log"))
        .expect("log");
    log.write_all(b"2026-12-01T00:00:00Z TICK pass=false score=0.5 iter=1\n")
        .expect("log line");
}

/// A state file of the size loopflow writes.
fn state(round: &str) -> String {
    format!(
        "{{\n  \"schema_version\": 1,\n  \"name\": \"bench\",\n  \"iteration_count\": {round},\n  \"current_task\": \"benchmark\",\n  \"current_phase\": \"implement\",\n  \"score_history\": [0.5],\n  \"last_verdict\": {{\"pass\": false, \"score\": 0.5, \"reasons\": []}},\n  \"last_tick_at\": \"2026-12-01T00:00:00Z\",\n  \"halt\": null,\n  \"spent\": {{\"usd\": 0.0, \"tokens\": 0, \"seconds\": 0.004}},\n  \"worktree_path\": null,\n  \"approvals\": []\n}}\n"
    )
}

/// Temp file in the same directory, fsync, rename, fsync the directory.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) {
    let tmp = dir.join(format!(".floor-state.tmp{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .expect("temp file");
    f.write_all(bytes).expect("write");
    f.sync_all().expect("fsync");
    drop(f);
    std::fs::rename(&tmp, path).expect("rename");
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .expect("fsync dir");
}

#[cfg(target_os = "linux")]
mod confine {
    use super::*;
    use landlock::{
        ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd,
        Ruleset, RulesetAttr, RulesetCreatedAttr, Scope,
    };

    const SYSTEM: &[&str] = &[
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
    const DEVICES: &[&str] = &[
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/dev/ptmx",
    ];

    /// The tick's ruleset, built once: reads of the system, `/proc`'s non-process entries,
    /// the loop's outputs and the toolchains on `PATH`; writes beneath `dir` and to the
    /// devices; TCP only to one port; signals and abstract sockets scoped.
    pub fn ruleset(dir: &Path) -> (OwnedFd, usize) {
        let abi = ABI::V7;
        let read = AccessFs::ReadFile | AccessFs::ReadDir;
        let all = AccessFs::from_write(abi) | read;
        let mut created = Ruleset::default()
            .set_compatibility(CompatLevel::BestEffort)
            .handle_access(all)
            .and_then(|r| r.scope(Scope::from_all(abi)))
            .and_then(|r| r.handle_access(AccessNet::from_all(ABI::V10)))
            .and_then(|r| r.create())
            .expect("landlock ruleset");
        let mut n = 0;
        let mut add = |p: &Path, access| {
            if let Ok(fd) = PathFd::new(p) {
                (&mut created)
                    .add_rule(PathBeneath::new(fd, access))
                    .expect("rule");
                n += 1;
            }
        };
        let mut reads: Vec<PathBuf> = SYSTEM.iter().map(PathBuf::from).collect();
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let name = e.file_name();
            let digits = name.as_bytes().iter().all(u8::is_ascii_digit);
            if !digits && !e.file_type().is_ok_and(|t| t.is_symlink()) {
                reads.push(e.path());
            }
        }
        reads.push(dir.join("outputs"));
        if let Some(path) = std::env::var_os("PATH") {
            for d in std::env::split_paths(&path) {
                if let Some(prefix) = d.parent().filter(|_| d.ends_with("bin")) {
                    reads.push(prefix.to_path_buf());
                }
                reads.push(d);
            }
        }
        for p in &reads {
            add(p, read);
        }
        add(dir, all);
        add(&std::env::temp_dir(), all);
        let dev =
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
        for d in DEVICES {
            add(Path::new(d), dev);
        }
        (&mut created)
            .add_rule(NetPort::new(8080, AccessNet::ConnectTcp))
            .expect("port rule");
        let fd: Option<OwnedFd> = created.into();
        (fd.expect("landlock ruleset fd"), n + 1)
    }

    /// A seccomp program of the size loopflow's is: the arch, ~70 syscalls compared,
    /// a few argument checks, the answers. Built once.
    pub fn filter() -> Vec<libc::sock_filter> {
        let s = |code: u16, k: u32| libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        };
        let j = |k: u32, jt: u8, jf: u8| libc::sock_filter {
            code: 0x15,
            jt,
            jf,
            k,
        };
        let mut nrs: Vec<u32> = (0..60u32).map(|i| 400 + i).collect();
        nrs.extend(
            [
                libc::SYS_socket,
                libc::SYS_connect,
                libc::SYS_sendto,
                libc::SYS_sendmsg,
                libc::SYS_sendmmsg,
                libc::SYS_socketpair,
                libc::SYS_prlimit64,
                libc::SYS_ioctl,
                libc::SYS_clone,
                libc::SYS_unshare,
            ]
            .map(|n| n as u32 + 1000),
        );
        let mut prog = vec![s(0x20, 4), j(0xC000_003E, 1, 0), s(0x06, 0), s(0x20, 0)];
        let total = nrs.len();
        for (i, nr) in nrs.iter().enumerate() {
            // Each match jumps to the EPERM return after the last comparison.
            let to_eperm = u8::try_from(total - i).expect("jump");
            prog.push(j(*nr, to_eperm, 0));
        }
        prog.push(s(0x06, libc::SECCOMP_RET_ALLOW));
        prog.push(s(0x06, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32));
        for _ in 0..20 {
            // The argument checks' instructions, never reached: the program's size.
            prog.push(s(0x06, libc::SECCOMP_RET_ALLOW));
        }
        prog
    }

    struct Args<'a> {
        path: *const libc::c_char,
        argv: *const *const libc::c_char,
        envp: *const *const libc::c_char,
        cwd: *const libc::c_char,
        stdio: [RawFd; 3],
        ruleset: RawFd,
        filter: &'a [libc::sock_filter],
        session: bool,
    }

    extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: the parent's Args, alive while it is suspended; syscalls only.
        unsafe {
            let a = &*arg.cast::<Args>();
            if a.session {
                libc::setsid();
            } else {
                libc::setpgid(0, 0);
            }
            for (to, from) in a.stdio.iter().enumerate() {
                libc::dup2(*from, to as i32);
            }
            libc::chdir(a.cwd);
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            // A rule for its own /proc/<pid>, then into the domain.
            let fd = libc::open(c"/proc/self".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            #[repr(C, packed)]
            struct Beneath {
                access: u64,
                fd: i32,
            }
            let attr = Beneath {
                access: 1 << 2 | 1 << 3,
                fd,
            };
            libc::syscall(
                libc::SYS_landlock_add_rule,
                a.ruleset,
                1,
                &raw const attr,
                0,
            );
            libc::close(fd);
            libc::syscall(libc::SYS_landlock_restrict_self, a.ruleset, 0);
            let prog = libc::sock_fprog {
                len: a.filter.len() as u16,
                filter: a.filter.as_ptr().cast_mut(),
            };
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                0,
                &raw const prog,
            );
            libc::execve(a.path, a.argv, a.envp);
            libc::_exit(127)
        }
    }

    /// A `clone(CLONE_VM|CLONE_VFORK)` child that confines itself and execs `program`.
    pub fn spawn(
        program: &CString,
        argv: &[CString],
        cwd: &Path,
        stdio: [RawFd; 3],
        ruleset: &OwnedFd,
        filter: &[libc::sock_filter],
        session: bool,
    ) -> i32 {
        let argv_p: Vec<*const libc::c_char> = argv
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let env: Vec<CString> = std::env::vars_os()
            .map(|(k, v)| {
                let mut kv = k.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                CString::new(kv).expect("env")
            })
            .collect();
        let envp: Vec<*const libc::c_char> = env
            .iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let cwd = CString::new(cwd.as_os_str().as_bytes()).expect("cwd");
        let mut args = Args {
            path: program.as_ptr(),
            argv: argv_p.as_ptr(),
            envp: envp.as_ptr(),
            cwd: cwd.as_ptr(),
            stdio,
            ruleset: ruleset.as_raw_fd(),
            filter,
            session,
        };
        let mut stack = vec![0u8; 256 * 1024];
        // SAFETY: the child runs on `stack` while this thread is suspended (CLONE_VFORK).
        let pid = unsafe {
            let top = stack.as_mut_ptr().add(stack.len()).cast();
            libc::clone(
                child,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (&raw mut args).cast(),
            )
        };
        assert!(pid > 0, "clone");
        pid
    }
}
