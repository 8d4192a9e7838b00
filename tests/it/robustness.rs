//! Crash safety and hostile input: `kill -9` at random points of a tick never leaves a
//! state file that does not parse, never moves the iteration backwards, never leaves a
//! stale lock; odd loop names, verdicts, prompts and binary pipelines are diagnosed, not
//! panicked on.

use std::time::Duration;

use crate::support::{
    LoopToml, Project, Rng, live_group_members, standard_agent, wait_group_gone, wait_until,
};
use serde_json::Value;

fn ticks(p: &Project, name: &str) -> usize {
    p.events(name)
        .iter()
        .filter(|e| e.starts_with("TICK "))
        .count()
}

/// Kills (SIGKILL) every process group an agent recorded in `pgids`: the agents of a
/// killed `loopflow run` are orphans in groups of their own. Only groups whose members are
/// still this project's: a recorded id may since have been reused by another test's process.
fn kill_recorded_groups(p: &Project) {
    let mark = format!("LOOPFLOW_PROJECT={}", p.path().display()).into_bytes();
    let ours = |pid: i32| {
        std::fs::read(format!("/proc/{pid}/environ"))
            .unwrap_or_default()
            .split(|b| *b == 0)
            .any(|v| v == mark.as_slice())
    };
    for line in p.read("pgids").lines() {
        if let Ok(pgid) = line.trim().parse::<i32>()
            && let members = live_group_members(pgid)
            && !members.is_empty()
            && members.iter().all(|m| ours(*m))
        {
            // SAFETY: these groups were started by this test's own agents.
            unsafe { libc::killpg(pgid, libc::SIGKILL) };
        }
    }
}

#[test]
fn kill_9_at_random_points_never_corrupts_state_or_leaves_a_lock() {
    let p = Project::new();
    let d = p.path().display().to_string();
    // Each role sleeps the time in `delay` (set per round), then does its work; the
    // verifier's score follows the tick number so scores never plateau.
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"echo $$ >> "{d}/pgids"
: > "{d}/started-$1"
sleep "$(cat "{d}/delay" 2>/dev/null || echo 0)"
case "$1" in
  implement) echo "tick $LOOPFLOW_TICK" >> "{d}/work.txt" ;;
  verify) echo "{{\"pass\": false, \"score\": 0.$(( LOOPFLOW_TICK % 9 + 1 ))}}" ;;
esac
exit 0"#
        ),
    );
    p.with_loop_task(
        "l",
        Some("t"),
        &LoopToml::new()
            .harness_agent(&agent)
            .brakes("max_iterations = 1000"),
    );
    let state_path = p.loop_dir("l").join(".state.loop");
    let mut rng = Rng::new();
    let (mut iter, mut tick_lines) = (0u64, 0usize);
    let mut window_hits = 0;
    let mut killed_mid_tick = 0;
    for round in 0..20 {
        let delay_ms = rng.below(150);
        p.write(
            "delay",
            &format!("{}.{:03}", delay_ms / 1000, delay_ms % 1000),
        );
        for role in ["implement", "verify", "orchestrate"] {
            let _ = std::fs::remove_file(p.join(&format!("started-{role}")));
        }
        let mut child = p.lf_spawn(&["run", "--loop", "l"]);
        // Either a random moment after the start, or a random moment after a given
        // role started (so every stage of the tick gets hit, whatever the load).
        let stage = rng.below(4);
        if stage > 0 {
            let role = ["implement", "verify", "orchestrate"][stage as usize - 1];
            let marker = p.join(&format!("started-{role}"));
            let start = std::time::Instant::now();
            while !marker.exists()
                && child.try_wait().unwrap().is_none()
                && start.elapsed() < Duration::from_secs(60)
            {
                std::thread::sleep(Duration::from_millis(2));
            }
            std::thread::sleep(Duration::from_millis(rng.below(delay_ms + 30)));
        } else {
            std::thread::sleep(Duration::from_millis(rng.below(600)));
        }
        if child.try_wait().unwrap().is_none() {
            killed_mid_tick += 1;
        }
        let _ = child.kill(); // SIGKILL; it may already have finished
        let _ = child.wait();
        kill_recorded_groups(&p);

        // The state always parses, as a State (not just as JSON).
        let text = std::fs::read_to_string(&state_path).unwrap();
        let s: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("round {round}: state does not parse ({e}):\n{text}"));
        let r = p.lf(&["status", "--loop", "l", "--json"]);
        assert_eq!(r.code, 0, "round {round}: {r:?}");
        let now = s["iteration_count"].as_u64().unwrap();
        let now_ticks = ticks(&p, "l");
        assert!(
            now >= iter,
            "round {round}: iteration went back {iter} → {now}"
        );
        assert!(now - iter <= 1, "round {round}: one run advanced twice");
        assert!(now_ticks - tick_lines <= 1, "round {round}: two TICK lines");
        // The state is written before the TICK line: a TICK line never shows an
        // iteration that did not happen. (A kill between the two leaves the advance
        // without its line; counted below.)
        assert!(
            now_ticks - tick_lines <= (now - iter) as usize,
            "round {round}: TICK line without an advance"
        );
        if now > iter && now_ticks == tick_lines {
            window_hits += 1;
        }
        iter = now;
        tick_lines = now_ticks;

        // No stale lock: a clean run ticks.
        p.write("delay", "0");
        let r = p.lf(&["run", "--loop", "l", "--json"]);
        assert_eq!(r.code, 0, "round {round}: {r:?}");
        assert_eq!(r.json()["outcome"], "tick", "round {round}: {r:?}");
        let s = p.state("l");
        assert_eq!(s["iteration_count"].as_u64().unwrap(), iter + 1);
        let lost = (iter - tick_lines as u64) as usize;
        assert_eq!(ticks(&p, "l"), tick_lines + lost + 1, "round {round}");
        iter += 1;
        tick_lines += lost + 1;
        assert!(s["halt"].is_null(), "round {round}: {s}");
        // Every iteration has exactly one TICK line: a line lost to a kill between the
        // state write and the log was recovered by this run.
        assert_eq!(
            tick_lines as u64,
            iter,
            "round {round}: {:?}",
            p.events("l")
        );
    }
    eprintln!(
        "{killed_mid_tick} of 20 runs killed before they finished; \
         kills between the state write and its TICK line: {window_hits}"
    );
    kill_recorded_groups(&p);
    // The lock file a killed run left behind does not make approve think a tick runs.
    assert_eq!(p.lf(&["halt", "--loop", "l", "--reason", "check"]).code, 0);
    let r = p.lf(&["approve", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
}

#[test]
fn a_tick_line_lost_in_a_crash_is_recovered_by_the_next_run() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[
            r#"{"pass": false, "score": 0.1}"#,
            r#"{"pass": false, "score": 0.2}"#,
            r#"{"pass": false, "score": 0.3}"#,
        ],
    );
    p.agent_loop("l", &agent, "");
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    // What a kill between the commit's state write and its log line leaves behind.
    let log_path = p.loop_dir("l").join(".state.log");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let kept: Vec<&str> = log.lines().filter(|l| !l.contains(" TICK ")).collect();
    std::fs::write(&log_path, kept.join("\n") + "\n").unwrap();
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let ticks: Vec<String> = p
        .events("l")
        .into_iter()
        .filter(|e| e.starts_with("TICK"))
        .collect();
    assert_eq!(
        ticks,
        [
            "TICK iter=1 recovered=true",
            "TICK pass=false score=0.2 iter=2",
            "TICK pass=false score=0.3 iter=3"
        ]
    );
    // A dry run never writes the recovered line.
    std::fs::write(&log_path, "").unwrap();
    p.lf(&["run", "--loop", "l", "--dry-run"]);
    assert_eq!(std::fs::read_to_string(&log_path).unwrap(), "");
    // A log that was rotated away (no TICK, state far ahead) is left alone.
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    assert_eq!(p.events("l"), ["TICK pass=false score=0.3 iter=4"]);
}

// ---- hostile input ----------------------------------------------------------------------

#[test]
fn hostile_loop_names_are_refused_and_create_nothing() {
    let p = Project::new();
    // The project's parent is the shared temp dir: other processes may own a `x` there.
    let stray = p.path().parent().unwrap().join("x");
    let stray_before = std::fs::symlink_metadata(&stray)
        .ok()
        .map(|m| m.modified().ok());
    let long = "a".repeat(65);
    for name in [
        "../x",
        "../../etc",
        "/abs",
        "a/b",
        "a\\b",
        "a\nb",
        "a\0b",
        "ü",
        "A",
        " a",
        "a ",
        ".hidden",
        "a..b",
        "-rf",
        "_x",
        long.as_str(),
        "$(touch pwned)",
        "*",
    ] {
        if name.contains('\0') {
            continue; // argv cannot carry NUL
        }
        // `--loop=NAME`, so names that look like flags reach loopflow as names.
        let flag = format!("--loop={name}");
        for args in [
            vec!["run", flag.as_str()],
            vec!["create", flag.as_str(), "--no-worktree", "--task", "t"],
            vec!["halt", flag.as_str(), "--reason", "r"],
        ] {
            let r = p.lf(&args);
            assert_eq!(r.code, 2, "{args:?}: {r:?}");
            assert!(r.stderr.contains("invalid loop name"), "{args:?}: {r:?}");
        }
    }
    assert!(p.snapshot().is_empty(), "{:?}", p.snapshot().keys());
    assert_eq!(
        std::fs::symlink_metadata(&stray)
            .ok()
            .map(|m| m.modified().ok()),
        stray_before
    );
    // The longest valid name works.
    let ok = "a".repeat(64);
    let r = p.lf(&["create", "--loop", &ok, "--no-worktree"]);
    assert_eq!(r.code, 0, "{r:?}");
}

/// A loop whose verifier prints the file `verdict.out` (bytes, verbatim).
fn verdict_loop(p: &Project, verdict: &[u8]) {
    std::fs::write(p.join("verdict.out"), verdict).unwrap();
    let agent = p.script(
        "agent.sh",
        &format!(
            "[ \"$1\" = verify ] && cat \"{}\"\nexit 0",
            p.join("verdict.out").display()
        ),
    );
    p.agent_loop("l", &agent, "");
}

fn run_ok(p: &Project) -> Value {
    let r = p.run_json("l", &[]);
    assert!(!r.stderr.contains("panicked"), "{r:?}");
    r.json()
}

#[test]
fn huge_verdict_is_committed_and_reaches_the_next_prompt() {
    let p = Project::new();
    // Half a megabyte of hint: the verdict must lie in the last MiB of the verifier's
    // output (loopflow reads no more, so endless output cannot exhaust memory).
    let hint = "x".repeat(512 * 1024) + "END";
    let reasons: Vec<String> = (0..20_000).map(|i| format!("reason {i}")).collect();
    let noise = "log line\n".repeat(100_000);
    let v = serde_json::json!({"pass": false, "score": 0.5, "next_hint": hint, "reasons": reasons});
    verdict_loop(&p, format!("{noise}{v}\n").as_bytes());
    let j = run_ok(&p);
    assert_eq!(j["outcome"], "tick", "{j}");
    let s = p.state("l");
    assert_eq!(s["last_verdict"]["next_hint"], hint.as_str());
    assert_eq!(
        s["last_verdict"]["reasons"].as_array().unwrap().len(),
        20_000
    );
    // Tick 2's implement prompt carries the hint in full.
    std::fs::write(p.join("verdict.out"), r#"{"pass": false, "score": 0.4}"#).unwrap();
    assert_eq!(run_ok(&p)["outcome"], "tick");
    let prompt = p.output("l", "2-implement.prompt.md");
    assert!(prompt.contains(&hint), "the hint was cut");
    assert!(prompt.contains("- reason 19999"));
}

#[test]
fn odd_verdicts_halt_unparseable_without_panicking() {
    let deep = format!(
        r#"{{"pass": true, "score": 0.5, "reasons": {}{}}}"#,
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let cases: Vec<Vec<u8>> = vec![
        deep.into_bytes(),
        br#"{"pass": true, "score": 1e400}"#.to_vec(),
        br#"{"pass": true, "score": NaN}"#.to_vec(),
        br#"{"pass": true, "score": 0.5, "tokens": -3}"#.to_vec(),
        br#"{"pass": true, "score": 0.5, "cost_usd": -1}"#.to_vec(),
        br#"{"pass": true, "score": 0.5, "next_hint": 7}"#.to_vec(),
        br#"["pass", true]"#.to_vec(),
        b"\xff\xfe{\"pass\": true, \"score\": 0.5\x00}".to_vec(),
        b"```json\n{\"pass\": true, \"score\": 0.5\n```\n".to_vec(),
        b"{".repeat(1_000_000),
    ];
    for (i, bytes) in cases.iter().enumerate() {
        let p = Project::new();
        verdict_loop(&p, bytes);
        let j = run_ok(&p);
        assert_eq!(j["outcome"], "halt", "case {i}: {j}");
        assert_eq!(j["reason"], "verifier_failed:unparseable", "case {i}");
        let s = p.state("l");
        assert_eq!(s["iteration_count"], 0, "case {i}");
        assert!(s["last_verdict"].is_null(), "case {i}");
        // The HALT line stays one line however odd the verdict was.
        let log = std::fs::read_to_string(p.loop_dir("l").join(".state.log")).unwrap();
        assert_eq!(
            log.lines().filter(|l| l.contains(" HALT ")).count(),
            1,
            "case {i}: {log}"
        );
        assert!(
            log.lines().all(|l| l.len() < 4096),
            "case {i}: huge log line"
        );
    }
}

#[test]
fn escaped_mustaches_in_prompts_render_literally() {
    let p = Project::new();
    verdict_loop(&p, br#"{"pass": false, "score": 0.5}"#);
    p.write(
        ".loopflow/loops/l/prompts/loop-implement.md",
        "Escaped: \\{{not_a_var}} and {{!-- a {{comment}} --}}done\nLoop {{loop}}, task {{{current_task}}}\n",
    );
    assert_eq!(run_ok(&p)["outcome"], "tick");
    let prompt = p.output("l", "1-implement.prompt.md");
    assert_eq!(
        prompt,
        "Escaped: {{not_a_var}} and done\nLoop l, task the task\n"
    );
}

#[test]
fn raw_blocks_in_prompts_render_literally() {
    let p = Project::new();
    verdict_loop(&p, br#"{"pass": false, "score": 0.5}"#);
    p.write(
        ".loopflow/loops/l/prompts/loop-implement.md",
        "Raw: {{{{raw}}}}{{not_a_var}} {{#each x}}{{/each}} {{{triple}}}{{{{/raw}}}}\nLoop {{loop}}\n",
    );
    let r = p.lf(&["check", ".loopflow/loops/l/loop.toml"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(run_ok(&p)["outcome"], "tick");
    let prompt = p.output("l", "1-implement.prompt.md");
    assert_eq!(
        prompt,
        "Raw: {{not_a_var}} {{#each x}}{{/each}} {{{triple}}}\nLoop l\n"
    );
}

#[test]
fn binary_garbage_configuration_is_diagnosed_with_exit_3() {
    let p = Project::new();
    verdict_loop(&p, br#"{"pass": false, "score": 0.5}"#);
    // Deterministic junk: every byte value, escape sequences and invalid UTF-8 included.
    let mut junk: Vec<u8> = b"name = \"x\"\n\x1b[2J\x1b[31m".to_vec();
    junk.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let pipe = p.join("garbage.toml");
    std::fs::write(&pipe, &junk).unwrap();
    let state_before = std::fs::read(p.loop_dir("l").join(".state.loop")).unwrap();
    for args in [
        vec!["run", "garbage.toml", "--loop", "l"],
        vec!["check", "garbage.toml"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 3, "{args:?}: {r:?}");
        assert!(
            r.stderr.contains("garbage.toml:") || r.stdout.contains("garbage.toml:"),
            "{r:?}"
        );
        assert!(!r.stderr.contains("panicked"), "{r:?}");
        assert!(
            !r.stderr.contains('\x1b') && !r.stdout.contains('\x1b'),
            "escape sequences echoed: {r:?}"
        );
    }
    // Valid UTF-8 that is not TOML, and a loop.toml overwritten with junk.
    p.write(
        "text-junk.toml",
        "\u{feff}[[[nodes\n= = =\n\u{202e}kind = 'gate'\n",
    );
    let r = p.lf(&["run", "text-junk.toml", "--loop", "l"]);
    assert_eq!(r.code, 3, "{r:?}");
    std::fs::write(p.loop_dir("l").join("loop.toml"), &junk).unwrap();
    for args in [
        vec!["run", "--loop", "l"],
        vec!["gate", "--loop", "l"],
        vec!["can-continue", "--loop", "l"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 3, "{args:?}: {r:?}");
        assert!(r.stderr.contains("loop.toml:"), "{args:?}: {r:?}");
    }
    assert_eq!(
        std::fs::read(p.loop_dir("l").join(".state.loop")).unwrap(),
        state_before
    );
    assert!(!p.join("calls.log").exists());
}

/// `kill -9` of `loopflow run` cannot stop its agent, whose group then runs on with no
/// tick around it. The next tick finds the group in the lock file and stops it before
/// anything else runs in the loop's directory.
#[test]
fn the_next_tick_stops_agents_left_by_a_killed_tick() {
    let p = Project::new();
    let d = p.path().display().to_string();
    let agent = p.script(
        "orphaning-agent.sh",
        &format!(
            r#"role="$1"
if [ "$role" = implement ] && [ ! -e "{d}/release" ]; then
  echo $$ > "{d}/agent.pid"
  sleep 300 &
  exec sleep 301
fi
[ "$role" = verify ] && echo '{{"pass": false, "score": 0.5}}'
exit 0"#
        ),
    );
    p.agent_loop("l", &agent, "");
    let mut run = p.lf_spawn(&["run", "--loop", "l"]);
    // The shell creates the file before it writes the pid into it.
    let pid = || -> Option<i32> {
        std::fs::read_to_string(p.join("agent.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    wait_until("the agent's pid", || pid().is_some());
    let pgid = pid().unwrap();
    // The agent can write its pid before loopflow has recorded its group (loopflow
    // records it once the spawn returns): this test is about a recorded group, so the
    // kill waits for the record. (Processes killed before it are found by the loop's
    // marks instead: tests/it/sandbox.rs, `kill_9`.)
    let lock = p.loop_dir("l").join(".lock");
    wait_until("the agent's group recorded in .lock", || {
        std::fs::read_to_string(&lock).is_ok_and(|t| t.contains(&format!("pgid {pgid}\n")))
    });
    // SAFETY: kills our own child, the way an OOM killer or `kill -9` would.
    unsafe { libc::kill(run.id() as i32, libc::SIGKILL) };
    run.wait().unwrap();
    assert!(
        !live_group_members(pgid).is_empty(),
        "the agent's group should outlive the killed tick"
    );
    p.write("release", "");
    let r = p.lf(&["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let left = wait_group_gone(pgid);
    assert!(left.is_empty(), "left running: {left:?}");
    let events = p.events("l");
    assert!(
        events
            .iter()
            .any(|e| e.starts_with(&format!("WARN pgid={pgid} killed=2"))),
        "{events:?}"
    );
    assert_eq!(p.state("l")["iteration_count"], 1, "{events:?}");
}

/// Agents get paths as text (`{{cwd}}`, `{{prompt}}`): in a project whose path is not
/// UTF-8 they would get a changed path naming no file, and every agent would fail on its
/// own prompt. `create` and the demo refuse such a project up front, and a tick of a loop
/// whose project was moved there refuses before any agent runs.
#[test]
fn a_project_path_that_is_not_utf8_is_refused_up_front() {
    use std::os::unix::ffi::OsStrExt;
    let odd = |p: &Project| {
        p.path()
            .with_file_name(std::ffi::OsStr::from_bytes(b"loopflow-\xff-project"))
    };
    let p = Project::new();
    let dir = odd(&p);
    std::fs::create_dir(&dir).unwrap();
    let run = |args: &[&str]| {
        let mut c = crate::support::loopflow(&dir);
        c.arg("--project").arg(&dir).args(args);
        crate::support::Run::of(&mut c)
    };
    let r = run(&["create", "--loop", "l", "--no-worktree", "--task", "t"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("is not valid UTF-8"), "{r:?}");
    assert!(!dir.join(".loopflow/loops/l").exists());
    let mut c = crate::support::loopflow(&dir);
    c.arg("demo").arg("--dir").arg(&dir);
    let r = crate::support::Run::of(&mut c);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("is not valid UTF-8"), "{r:?}");
    // Through a link whose own name is UTF-8: the path the loop would record is not.
    let link = p.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let mut c = crate::support::loopflow(p.path());
    c.arg("--project")
        .arg(&link)
        .args(["create", "--loop", "l", "--task", "t"]);
    let r = crate::support::Run::of(&mut c);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("is not valid UTF-8"), "{r:?}");
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    // A loop made where the path was UTF-8, its project then moved.
    let a = standard_agent(&p, &[r#"{"pass": false, "score": 0.5}"#]);
    p.agent_loop("l", &a, "");
    std::fs::rename(p.path(), &dir).unwrap();
    let r = run(&["run", "--loop", "l"]);
    let log = std::fs::read_to_string(dir.join(".loopflow/loops/l/.state.log")).unwrap();
    let called = dir.join("calls.log").exists();
    std::fs::rename(&dir, p.path()).unwrap();
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("is not valid UTF-8"), "{r:?}");
    assert!(
        log.lines()
            .last()
            .is_some_and(|l| l.ends_with("ERROR reason=path_not_utf8")),
        "{log}"
    );
    assert!(!called, "an agent ran");
    assert!(!p.join("calls.log").exists(), "an agent ran");
}
