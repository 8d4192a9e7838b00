//! The floor a tick is measured against (`benches/tick.rs` runs it as a process, in
//! the same interleaved run): the least any runner of the default tick must do. It
//! starts, spawns its three agents (`true`, `echo VERDICT`, `true`) with stdin from
//! `/dev/null` and stdout/stderr to new per-tick files, waits for each, and writes one
//! state file atomically (temp file, fsync, rename, fsync the directory).
//!
//! It works in the benchmarked loop's own directory (`DIR`: its files `outputs/floor-*`
//! and `.floor-state`), beside the tick's: on ext4 the cost of creating a file depends
//! on the block group its directory is in (without a journal, every new inode skips the
//! group's recently deleted ones), so two fresh directories compared a lucky group with
//! an unlucky one — floor medians of 6.9 and 9.1 ms in one run.
//!
//! `floor DIR ROUND [--sandbox]`; with `--sandbox` each agent is spawned confined like
//! loopflow confines it (Linux Landlock: writes only beneath DIR, `/dev/null`-like
//! devices, no signals outside the domain), the ruleset built once, each spawn made by a
//! short-lived thread that enters the domain. Nothing of loopflow is linked in: the
//! floor's own start-up stays that of a small Rust program.

// Test and benchmark code prints its reports, unwraps what must be there, reaches
// libc for counters, and shares helpers between its own modules: the library's lints
// (`[lints]` in Cargo.toml) are for the product.
#![allow(
    unreachable_pub,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::undocumented_unsafe_blocks
)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
    let dir = PathBuf::from(dir);
    let sandbox = args.iter().any(|a| a == "--sandbox");
    let outputs = dir.join("outputs");
    let ruleset = sandbox.then(|| confine::ruleset(&dir));
    for (i, argv) in [vec!["true"], vec!["echo", VERDICT], vec!["true"]]
        .iter()
        .enumerate()
    {
        let out = std::fs::File::create(outputs.join(format!("floor-{round}-{i}.stdout")))
            .expect("stdout file");
        let err = std::fs::File::create(outputs.join(format!("floor-{round}-{i}.stderr")))
            .expect("stderr file");
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let mut child = match &ruleset {
            None => cmd.spawn().expect("spawn"),
            Some(fd) => confine::spawn(&mut cmd, fd),
        };
        assert!(child.wait().expect("wait").success());
    }
    write_atomic(&dir, &dir.join(".floor-state"), state(round).as_bytes());
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
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::path::Path;
    use std::process::{Child, Command};

    use landlock::{
        ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, path_beneath_rules,
    };

    /// Writes beneath `dir` and to the usual devices; no signals or abstract sockets
    /// outside the domain (what loopflow's `[sandbox] mode = "auto"` asks on this kernel).
    pub fn ruleset(dir: &Path) -> OwnedFd {
        let abi = ABI::V7;
        let created = Ruleset::default()
            .handle_access(AccessFs::from_write(abi))
            .and_then(|r| r.scope(Scope::from_all(abi)))
            .and_then(|r| r.create())
            .and_then(|r| r.add_rules(path_beneath_rules([dir], AccessFs::from_write(abi))))
            .and_then(|r| {
                r.add_rules(path_beneath_rules(
                    [
                        "/dev/null",
                        "/dev/zero",
                        "/dev/full",
                        "/dev/tty",
                        "/dev/ptmx",
                    ]
                    .iter()
                    .filter(|p| Path::new(p).exists()),
                    AccessFs::from_file(abi) & AccessFs::from_write(abi),
                ))
            })
            .expect("landlock ruleset");
        Option::<OwnedFd>::from(created).expect("landlock ruleset fd")
    }

    /// Spawns from a thread that enters the domain first (std keeps its posix_spawn
    /// path; the rest of the process stays unconfined).
    pub fn spawn(cmd: &mut Command, fd: &OwnedFd) -> Child {
        let raw = fd.as_raw_fd();
        std::thread::scope(|s| {
            s.spawn(move || {
                // SAFETY: prctl and landlock_restrict_self take integer arguments; the
                // ruleset fd stays open for the call.
                unsafe {
                    assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
                    assert_eq!(
                        libc::syscall(libc::SYS_landlock_restrict_self, raw, 0u32),
                        0,
                        "landlock_restrict_self"
                    );
                }
                cmd.spawn().expect("spawn")
            })
            .join()
            .expect("spawn thread")
        })
    }
}

#[cfg(not(target_os = "linux"))]
mod confine {
    use std::path::Path;
    use std::process::{Child, Command};

    pub fn ruleset(_: &Path) {}

    pub fn spawn(cmd: &mut Command, _: &()) -> Child {
        cmd.spawn().expect("spawn")
    }
}
