//! The sandbox and the blast radius, attacked (DESIGN §12, issue "Agents cannot reach what
//! they must not"): hostile fake agents running under the real Landlock sandbox try to
//! forge the loop's state, write outside their worktree, signal loopflow, leave processes
//! behind to approve the loop, reach the network, and land work outside the radius by
//! committing it themselves. Each test fails if the attack works, and checks that
//! well-behaved work still lands on `loopflow/<name>`.

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{LoopToml, Project, Run, git};

const HALF: &str = r#"{"pass": false, "score": 0.5}"#;

/// Whether this kernel gives Landlock's file rules; the sandbox tests run for real where it
/// does and fail (not skip) when `LOOPFLOW_REQUIRE_SANDBOX` is set and it does not.
pub fn landlock() -> bool {
    // SAFETY: the documented probe: a null attribute with the VERSION flag only asks.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if abi >= 6 {
        return true;
    }
    assert!(
        std::env::var_os("LOOPFLOW_REQUIRE_SANDBOX").is_none(),
        "Landlock ABI {abi} (< 6) and LOOPFLOW_REQUIRE_SANDBOX is set"
    );
    eprintln!("skipped: this kernel has Landlock ABI {abi}, the sandbox tests need 6");
    false
}

/// A worktree loop under `[sandbox] mode = "enforce"` whose implement role runs `body`
/// (in the worktree) and whose verifier prints `verdict`.
fn boxed(p: &Project, body: &str, verdict: &str, extra: &str) -> PathBuf {
    p.write("verdict.json", &format!("{verdict}\n"));
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) {body}
  ;;
  verify) cat "{v}" ;;
  *) echo ok ;;
esac
exit 0"#,
            v = p.join("verdict.json").display()
        ),
    );
    let mut toml = LoopToml::new()
        .without("worktree")
        .table(
            "sandbox",
            &format!(
                "mode = \"enforce\"\nread = [{}]",
                crate::support::toml::string(&p.join("verdict.json").display().to_string())
            ),
        )
        .harness_command(&agent, &["{{role}}"]);
    if !extra.is_empty() {
        toml = toml.table("sandbox", extra);
    }
    p.with_loop("l", &toml);
    agent
}

fn tick(p: &Project) -> Run {
    p.lf(&["run", "--loop", "l", "--json"])
}

fn branch_file(p: &Project, path: &str) -> Option<String> {
    let o = std::process::Command::new("git")
        .args(["show", &format!("loopflow/l:{path}")])
        .current_dir(p.path())
        .output()
        .expect("git");
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Every process whose environment says it belongs to loop `l` of `p`.
fn loop_processes(p: &Project) -> Vec<i32> {
    let want_loop = b"LOOPFLOW_LOOP=l".to_vec();
    let want_project = format!("LOOPFLOW_PROJECT={}", p.path().display()).into_bytes();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('Z')))
            .unwrap_or(true);
        if !zombie && vars.contains(&&want_loop[..]) && vars.contains(&&want_project[..]) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn an_agent_writes_its_worktree_and_tmpdir_only_and_its_work_lands() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let outside = Project::new();
    let state = p.loop_dir("l").join(".state.loop");
    let log = p.loop_dir("l").join(".state.log");
    let config = p.loop_dir("l").join("loop.toml");
    let body = format!(
        r#"mkdir -p src && echo 'pub fn f() {{}}' > src/lib.rs
echo scratch > "$TMPDIR/t" && cp "$TMPDIR/t" src/from-tmpdir
echo x > "{outside}/escape" 2>/dev/null && echo escaped >> src/breaches
echo pwned > "{checkout}/README.md" 2>/dev/null && echo checkout >> src/breaches
echo '{{"iteration_count": 0}}' > "{state}" 2>/dev/null && echo state >> src/breaches
echo "2026-01-01T00:00:00Z APPROVE by=agent" >> "{log}" 2>/dev/null && echo log >> src/breaches
echo "[brakes]" >> "{config}" 2>/dev/null && echo config >> src/breaches
rm -f "{lock}" 2>/dev/null && echo lock >> src/breaches
echo evil > "$(git rev-parse --git-common-dir)/hooks/post-commit" 2>/dev/null && echo hooks >> src/breaches
true"#,
        outside = outside.path().display(),
        checkout = p.path().display(),
        state = state.display(),
        log = log.display(),
        config = config.display(),
        lock = p.loop_dir("l").join(".lock").display(),
    );
    boxed(&p, &body, HALF, "");
    let config_before = std::fs::read(&config).unwrap();
    let r = tick(&p);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    // Nothing outside the worktree was written...
    assert_eq!(branch_file(&p, "src/breaches"), None, "{r:?}");
    assert!(!outside.join("escape").exists());
    assert_eq!(p.read("README.md"), "# test project\n");
    assert_eq!(std::fs::read(&config).unwrap(), config_before);
    assert_eq!(p.state("l")["iteration_count"], 1);
    assert_eq!(
        p.events_after_create("l"),
        ["TICK pass=false score=0.5 iter=1"]
    );
    // ... and the allowed work, including what went through TMPDIR, is on the branch.
    assert_eq!(
        branch_file(&p, "src/lib.rs").as_deref(),
        Some("pub fn f() {}\n")
    );
    assert_eq!(
        branch_file(&p, "src/from-tmpdir").as_deref(),
        Some("scratch\n")
    );
    assert_eq!(git(p.path(), &["rev-list", "--count", "main"]).trim(), "1");
}

#[test]
fn an_agent_cannot_kill_or_signal_loopflow() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    boxed(
        &p,
        r#"mkdir -p src
kill -9 $PPID; echo "kill=$?" > src/signals
kill -STOP $PPID; echo "stop=$?" >> src/signals"#,
        HALF,
        "",
    );
    let r = tick(&p);
    assert_eq!(r.code, 0, "loopflow was killed: {r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let signals = branch_file(&p, "src/signals").expect("committed");
    assert!(
        !signals.contains("=0"),
        "a signal reached loopflow: {signals}"
    );
}

#[test]
fn a_process_left_behind_cannot_approve_the_loop_after_a_human_halt() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let lf = crate::support::bin().display().to_string();
    let project = p.path().display().to_string();
    // Two leftovers: one keeps the loop's environment, one clears it (env -i) so it
    // carries no mark loopflow could find it by; both wait for the tick to end.
    let approve =
        format!("sleep 2; {lf} approve --loop l --by agent --extend 100 --project {project}");
    boxed(
        &p,
        &format!(
            r#"setsid sh -c '{approve}' >/dev/null 2>&1 < /dev/null &
setsid env -i PATH="$PATH" sh -c '{approve}' >/dev/null 2>&1 < /dev/null &
true"#
        ),
        HALF,
        "",
    );
    let r = tick(&p);
    assert_eq!(r.code, 0, "{r:?}");
    let h = p.lf(&["halt", "--loop", "l", "--reason", "a human looks"]);
    assert_eq!(h.code, 0, "{h:?}");
    let halted = p.state("l");
    assert!(!halted["halt"].is_null(), "{halted}");
    std::thread::sleep(Duration::from_secs(3));
    let s = p.state("l");
    assert_eq!(s, halted, "the state changed after the human's halt");
    assert_eq!(s["extra_iterations"], 0, "{s}");
    assert!(
        !p.events("l").iter().any(|e| e.starts_with("APPROVE")),
        "{:?}",
        p.events("l")
    );
    assert_eq!(loop_processes(&p), Vec::<i32>::new());
}

#[test]
fn network_deny_refuses_a_loopback_connection_and_allow_lets_it_through() {
    if !landlock() {
        return;
    }
    for (network, want) in [("deny", "refused"), ("allow", "connected")] {
        let p = Project::git();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        boxed(
            &p,
            &format!(
                r#"mkdir -p src
if python3 -c 'import socket; socket.create_connection(("127.0.0.1", {port}), 2)' 2>/dev/null; then echo connected > src/net; else echo refused > src/net; fi"#
            ),
            HALF,
            &format!("network = \"{network}\""),
        );
        let r = tick(&p);
        assert_eq!(r.code, 0, "{r:?}");
        assert_eq!(
            branch_file(&p, "src/net").as_deref(),
            Some(format!("{want}\n").as_str()),
            "network = {network}: {r:?}"
        );
        let accepted = listener.accept().is_ok();
        assert_eq!(accepted, network == "allow", "network = {network}");
    }
}

#[test]
fn an_agent_cannot_commit_or_move_refs_in_the_shared_repository() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let main = git(p.path(), &["rev-parse", "main"]);
    boxed(
        &p,
        r#"mkdir -p src && echo ok > src/ok.rs
git add -A 2>/dev/null && echo add >> src/breaches
git -c user.name=a -c user.email=a@a commit -qm mine 2>/dev/null && echo commit >> src/breaches
git update-ref refs/heads/main HEAD 2>/dev/null && echo update-ref >> src/breaches
git config core.hooksPath /tmp 2>/dev/null && echo config >> src/breaches
true"#,
        HALF,
        "",
    );
    let r = tick(&p);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(branch_file(&p, "src/breaches"), None);
    assert_eq!(git(p.path(), &["rev-parse", "main"]), main);
    let hooks = std::process::Command::new("git")
        .args(["config", "--get", "core.hooksPath"])
        .current_dir(p.path())
        .output()
        .unwrap();
    assert_eq!(hooks.status.code(), Some(1), "core.hooksPath was set");
    // The work still lands, committed by loopflow.
    assert_eq!(branch_file(&p, "src/ok.rs").as_deref(), Some("ok\n"));
    let author = git(p.path(), &["log", "-1", "--format=%an", "loopflow/l"]);
    assert_eq!(author.trim(), "loopflow");
}

#[test]
fn a_fifo_in_place_of_a_prompt_stops_the_tick_before_any_agent_runs() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    boxed(&p, "echo ran > ran", HALF, "");
    let prompt = p.loop_dir("l").join("prompts/loop-verifier.md");
    std::fs::remove_file(&prompt).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&prompt)
        .status()
        .unwrap();
    assert!(made.success());
    let mut child = p.lf_spawn(&["run", "--loop", "l", "--json"]);
    let status = crate::support::wait_or_kill(&mut child, "a tick reading a FIFO prompt");
    eprintln!("{status:?} {:?}", p.events("l"));
    assert_eq!(p.state("l")["iteration_count"], 0);
    assert!(!p.worktree("l").join("ran").exists(), "an agent ran");
}

/// Commits the agent makes itself, with the sandbox off (an old kernel, `mode = "off"`):
/// `git-commit` still checks every path since the tick began and puts the branch back.
#[test]
fn an_agents_own_commits_outside_the_radius_are_caught_without_the_sandbox() {
    let commit = "git -c user.name=a -c user.email=a@a commit -q --no-verify";
    for attack in [
        format!("echo x >> README.md && git add -A && {commit} -m readme"),
        format!(
            "mkdir -p .github/workflows && echo 'on: push' > .github/workflows/ci.yml && git add -A && {commit} -m ci"
        ),
        format!("echo x >> README.md && git add -A && {commit} --amend -m amended"),
        format!(
            "echo x >> README.md && git add -A && {commit} -m r && git reset -q --soft HEAD~1 && git reset -q"
        ),
        "mkdir -p src && ln -s /etc/passwd \"src/$(printf 'l\\377nk')\"".to_string(),
        "mkdir -p src && ln -s \"$LOOPFLOW_PROJECT\" \"src/$(printf 'd\\376')\"".to_string(),
    ] {
        let p = Project::git();
        p.write("verdict.json", &format!("{HALF}\n"));
        let agent = p.script(
            "agent.sh",
            &format!(
                "case \"$1\" in\n  implement) mkdir -p src && echo ok > src/ok.rs; {attack}\n  ;;\n  verify) cat \"{}\" ;;\nesac\nexit 0",
                p.join("verdict.json").display()
            ),
        );
        p.with_loop(
            "l",
            &LoopToml::new()
                .without("worktree")
                .harness_command(&agent, &["{{role}}"])
                .blast_radius(&["src/**"], &[]),
        );
        let base = git(p.path(), &["rev-parse", "loopflow/l"]);
        let r = tick(&p);
        assert_eq!(r.code, 0, "{attack}: {r:?}");
        assert_eq!(
            r.json()["reason"],
            "human_intervention:blast_radius",
            "{attack}: {r:?}"
        );
        assert_eq!(
            git(p.path(), &["rev-parse", "loopflow/l"]),
            base,
            "{attack}: the branch moved"
        );
        assert_eq!(
            branch_file(&p, "README.md").as_deref(),
            Some("# test project\n")
        );
    }
}

/// `kill -9` of loopflow at random instants, agents that leave processes behind: the next
/// tick always runs (no stale lock, no descriptor held by a child), stops whatever the
/// killed one spawned, and leaves no temp files.
#[test]
fn kill_9_at_random_instants_leaves_nothing_running_after_the_next_tick() {
    if !landlock() {
        return;
    }
    let p = Project::new();
    let d = p.path().display().to_string();
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"sleep 30 </dev/null >/dev/null 2>&1 &
setsid sleep 30 </dev/null >/dev/null 2>&1 &
sleep "$(cat "{d}/delay")"
case "$1" in
  verify) echo "{{\"pass\": false, \"score\": 0.$(( LOOPFLOW_TICK % 9 + 1 ))}}" ;;
esac
exit 0"#
        ),
    );
    p.with_loop_task(
        "l",
        Some("t"),
        &LoopToml::new()
            .table("sandbox", "mode = \"enforce\"")
            .harness_agent(&agent)
            .brakes("max_iterations = 100000"),
    );
    let mut rng = crate::support::Rng::new();
    // LOOPFLOW_TEST_KILL_ROUNDS=2000 for the issue's long measurement; 120 in every run.
    let rounds: u64 = std::env::var("LOOPFLOW_TEST_KILL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(120);
    let mut killed = 0;
    for round in 0..rounds {
        p.write("delay", &format!("0.0{}", rng.below(6)));
        let mut child = p.lf_spawn(&["run", "--loop", "l"]);
        std::thread::sleep(Duration::from_millis(rng.below(60)));
        if child.try_wait().unwrap().is_none() {
            killed += 1;
        }
        let _ = child.kill();
        let _ = child.wait();
        p.write("delay", "0");
        let r = p.lf(&["run", "--loop", "l", "--json"]);
        assert_eq!(r.code, 0, "round {round}: {r:?}");
        assert_eq!(r.json()["outcome"], "tick", "round {round}: {r:?}");
        assert_eq!(loop_processes(&p), Vec::<i32>::new(), "round {round}");
        let temps: Vec<String> = std::fs::read_dir(p.loop_dir("l"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(temps.is_empty(), "round {round}: {temps:?}");
    }
    eprintln!("{killed} of {rounds} runs killed mid-tick");
    assert!(
        killed > rounds / 4,
        "too few kills landed mid-tick: {killed}"
    );
}

#[test]
fn status_dry_run_and_explain_say_what_the_sandbox_allows() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    boxed(
        &p,
        "true",
        HALF,
        "network = \"deny\"\nwrite = [\"/var/tmp\"]",
    );
    let dry = p.lf(&["run", "--loop", "l", "--dry-run"]);
    assert_eq!(dry.code, 0, "{dry:?}");
    let line = dry
        .stdout
        .lines()
        .find(|l| l.starts_with("sandbox "))
        .unwrap_or_else(|| panic!("no sandbox line: {dry:?}"));
    assert!(
        line.contains("confining writes, reads, signals, TCP, sockets"),
        "{line}"
    );
    assert!(
        line.contains(&p.worktree("l").display().to_string()),
        "{line}"
    );
    assert!(
        line.contains("/var/tmp") && line.ends_with("no network"),
        "{line}"
    );
    let status = p.lf(&["status"]);
    assert!(
        status.stdout.contains("sandbox: Landlock ABI"),
        "{status:?}"
    );
    let explain = p.lf(&[
        "check",
        "--explain",
        &p.loop_dir("l").join("loop.toml").display().to_string(),
    ]);
    assert!(
        explain.stdout.contains("sandbox: enforce (Landlock ABI")
            && explain
                .stdout
                .contains("write: their working directory, a private TMPDIR, /var/tmp, each preset's state dirs\n")
            && explain.stdout.contains("network: deny (no network)")
            && explain.stdout.contains("nothing else of ~, the main checkout or other processes"),
        "{explain:?}"
    );
    // The dry run names what the processes see, and values never.
    assert!(dry.stdout.contains("env: "), "{dry:?}");
}

/// Brakes fail closed: an agent (sandbox off) that bricks the lock files leaves a loop that
/// halts before any agent runs again, never one that keeps running agents and exits 4.
#[test]
fn bricked_lock_files_halt_the_loop_before_any_agent_runs() {
    for file in [".state.lock", ".lock"] {
        let p = Project::new();
        let calls = p.join("calls");
        let target = p.loop_dir("l").join(file);
        p.write("verdict.json", &format!("{HALF}\n"));
        let agent = p.script(
            "agent.sh",
            &format!(
                "echo \"$1\" >> \"{calls}\"\ncase \"$1\" in\n  implement) rm -f \"{t}\"; mkdir -p \"{t}\" ;;\n  verify) cat \"{v}\" ;;\nesac\nexit 0",
                calls = calls.display(),
                t = target.display(),
                v = p.join("verdict.json").display()
            ),
        );
        p.with_loop("l", &LoopToml::new().harness_command(&agent, &["{{role}}"]));
        let _ = tick(&p);
        let after_first = std::fs::read_to_string(&calls).unwrap_or_default();
        for _ in 0..3 {
            let r = tick(&p);
            assert!(r.code == 0 || r.code == 4, "{file}: {r:?}");
        }
        assert_eq!(
            std::fs::read_to_string(&calls).unwrap_or_default(),
            after_first,
            "{file}: agents ran after the lock was bricked"
        );
        let s = p.state("l");
        assert!(!s["halt"].is_null(), "{file}: not halted: {s}");
    }
}

/// A preset's state is the loop's own, whatever the XDG variables say: with
/// `XDG_CACHE_HOME` set to a directory that holds the project (once aider's `~/.cache`
/// followed it and granted the project), nothing of it is granted, and the agent's write
/// into the loop directory is refused.
#[test]
fn an_xdg_state_dir_that_holds_the_project_is_not_granted() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let home = tempfile::tempdir().unwrap();
    let bin = tempfile::tempdir().unwrap();
    // A fake `aider` (the preset's program): implement tries to write into the loop's
    // directory; verify answers with a verdict.
    let fake = bin.path().join("aider");
    std::fs::write(
        &fake,
        format!(
            r#"#!/bin/sh
case "$LOOPFLOW_NODE" in
  implement) echo forged > "$LOOPFLOW_PROJECT/.loopflow/loops/l/pwned" ; echo done ;;
  verify) echo '{HALF}' ;;
  *) echo ok ;;
esac
exit 0
"#
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    p.with_loop(
        "l",
        &LoopToml::new()
            .without("worktree")
            .table("sandbox", "mode = \"enforce\"")
            .harness("preset = \"aider\""),
    );
    // The project's parent: XDG_CACHE_HOME there puts the project inside aider's cache.
    let parent = p.path().parent().unwrap().display().to_string();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap()
    );
    let r = p.lf_env(
        &["run", "--loop", "l", "--json"],
        &[
            ("PATH", path.as_str()),
            ("HOME", home.path().to_str().unwrap()),
            ("XDG_CACHE_HOME", parent.as_str()),
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        !p.loop_dir("l").join("pwned").exists(),
        "the agent wrote into the loop's directory: {:?}",
        p.events("l")
    );
    // aider keeps no state of its own: nothing of the home is granted or made.
    assert!(!home.path().join(".aider").exists());
    assert!(!home.path().join(".cache").exists());
}
