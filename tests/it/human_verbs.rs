//! The human's verbs through the real binary: `task`, `close`, `delete`, what `approve`
//! says and refuses, what `halt` says about a running tick, "did you mean" for every
//! command that takes `--loop`, and `status` naming a loop whose every tick skips. Agents
//! inside a tick try each verb on their own loop (with the sandbox off, so the tick lock
//! is all that stops them).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{
    LoopToml, Project, Run, bin, has, standard_agent, wait_for_file, wait_or_kill,
};

const HALF: &str = r#"{"pass": false, "score": 0.5}"#;
const PASS: &str = r#"{"pass": true, "score": 1.0}"#;

fn lf_bin() -> String {
    bin().display().to_string()
}

/// An agent whose implement role records that it started, then waits until the file
/// `release` exists (at most a minute), so a test can act while the tick runs. It records
/// each role it runs in `calls.log`; verify prints `HALF`.
fn blocking_agent(p: &Project) -> PathBuf {
    p.script(
        "agent.sh",
        &format!(
            r#"echo "$1 $LOOPFLOW_TICK" >> "{calls}"
case "$1" in
  implement)
    touch "{started}"
    i=0; while [ ! -f "{release}" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done ;;
  verify) echo '{HALF}' ;;
esac"#,
            calls = p.join("calls.log").display(),
            started = p.join("started").display(),
            release = p.join("release").display(),
        ),
    )
}

/// Runs `during` while a tick of loop `l` (its agent [`blocking_agent`]) is inside its
/// implement node, then lets the tick finish; returns the tick's own output.
fn while_a_tick_runs(p: &Project, during: impl FnOnce()) -> Run {
    let mut child = p
        .lf_cmd(&["run", "--loop", "l", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn run");
    wait_for_file(&p.join("started"));
    during();
    p.write("release", "");
    wait_or_kill(&mut child, "the tick");
    Run::from(child.wait_with_output().expect("output"))
}

// ---- task ---------------------------------------------------------------------------------

#[test]
fn a_loop_created_without_a_task_skips_until_task_gives_it_one() {
    let p = Project::new();
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) cp "$2" "{seen}" ;;
  verify) echo '{HALF}' ;;
esac"#,
            seen = p.join("seen-prompt").display()
        ),
    );
    p.with_loop_task("l", None, &LoopToml::new().harness_agent(&agent));
    // Every tick skips, and status says so instead of `ok`.
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["reason"], "no_current_task", "{r:?}");
    let st = p.lf(&["status"]);
    assert!(st.stdout.contains("SKIPPING (no_current_task)"), "{st:?}");
    assert!(
        st.stdout.contains("loopflow task --loop l"),
        "the fix is named: {st:?}"
    );
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        j["loops"][0]["skipping"]["reason"], "no_current_task",
        "{j}"
    );

    let r = p.lf(&[
        "task",
        "--loop",
        "l",
        "--by",
        "alice",
        "Make the parser handle empty input",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("iteration 1 of 10"), "{r:?}");
    let s = p.state("l");
    assert_eq!(s["current_task"], "Make the parser handle empty input");
    assert_eq!(s["task_source"], "task by alice");
    assert!(
        has(
            &p.events("l"),
            r#"TASK by=alice task="Make the parser handle empty input""#
        ),
        "{:?}",
        p.events("l")
    );
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
    assert_eq!(j["loops"][0]["skipping"], Value::Null, "{j}");
    // The agents work on it.
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert!(
        p.read("seen-prompt")
            .contains("Make the parser handle empty input")
    );

    // Replacing it starts the plateau window afresh and says what it replaced.
    let r = p.lf(&["task", "--loop", "l", "--by", "bob", "Now trailing commas"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("was Make the parser"), "{r:?}");
    let s = p.state("l");
    assert_eq!(s["current_task"], "Now trailing commas");
    assert_eq!(s["score_history"], Value::Array(vec![]), "{s}");
    assert_eq!(s["last_verdict"], Value::Null, "{s}");
    assert!(has(
        &p.events("l"),
        r#"TASK by=bob task="Now trailing commas" was="Make the parser handle empty input""#
    ));
    // The same text again changes nothing.
    let before = p.log("l").len();
    let r = p.lf(&["task", "--loop", "l", "Now trailing commas"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("already"), "{r:?}");
    assert_eq!(p.log("l").len(), before);
    // No text is a usage error.
    assert_eq!(p.lf(&["task", "--loop", "l", "  "]).code, 2);
}

#[test]
fn task_is_refused_for_a_loop_whose_tasks_come_from_a_backlog() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    p.write("BACKLOG.md", "- [ ] **one** first\n");
    p.with_loop(
        "l",
        &LoopToml::new().harness_agent(&agent).table(
            "work_source",
            "kind = \"backlog\"\nfile = \"../../../BACKLOG.md\"",
        ),
    );
    let before = p.state("l");
    let r = p.lf(&["task", "--loop", "l", "something else"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("backlog"), "{r:?}");
    assert_eq!(p.state("l"), before);
}

#[test]
fn a_human_halted_loop_takes_a_new_task_and_works_on_it_once_approved() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    p.agent_loop("l", &agent, "");
    p.lf(&["halt", "--loop", "l", "--reason", "rethink"]);
    let r = p.lf(&["task", "--loop", "l", "the new task"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("once you `loopflow approve --loop l`"),
        "{r:?}"
    );
    assert_eq!(p.lf(&["approve", "--loop", "l"]).code, 0);
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(p.state("l")["current_task"], "the new task");
}

// ---- close --------------------------------------------------------------------------------

#[test]
fn close_ends_a_loop_and_nothing_reopens_it() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS]);
    p.agent_loop("l", &agent, "");
    p.run_json("l", &[]);
    assert_eq!(p.state("l")["halt"]["reason"], "goal_met");
    let r = p.lf(&["close", "--loop", "l", "--by", "alice", "--note", "landed"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("it was halted goal_met"), "{r:?}");
    let s = p.state("l");
    assert_eq!(s["halt"]["reason"], "closed", "{s}");
    assert_eq!(s["halt"]["detail"], "closed by alice: landed", "{s}");
    assert!(
        has(&p.events("l"), "CLOSE by=alice note=landed was=goal_met"),
        "{:?}",
        p.events("l")
    );
    // A second close changes nothing.
    let r = p.lf(&["close", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("already closed"), "{r:?}");
    // Ticks skip; status says closed, not a halt waiting for a human.
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["reason"], "halted:closed", "{r:?}");
    let st = p.lf(&["status"]);
    assert!(
        st.stdout
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains(" closed ")),
        "{st:?}"
    );
    // approve does not clear it and says what to do instead; halt and task do not get
    // around it.
    for args in [
        &["approve", "--loop", "l"][..],
        &["approve", "--loop", "l", "--extend", "3"][..],
        &["halt", "--loop", "l", "--reason", "reopen me"][..],
        &["task", "--loop", "l", "more work"][..],
    ] {
        let r = p.lf(args);
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        assert!(r.stderr.contains("closed"), "{args:?}: {r:?}");
    }
    let r = p.lf(&["approve", "--loop", "l"]);
    assert!(
        r.stderr.contains("loopflow create --loop")
            && r.stderr.contains("loopflow delete --loop l"),
        "{r:?}"
    );
    let s = p.state("l");
    assert_eq!(s["halt"]["reason"], "closed", "{s}");
    assert_eq!(s["extra_iterations"], 0, "{s}");
    assert!(!p.events("l").iter().any(|e| e.starts_with("APPROVE")));
}

/// A fake `crontab` on PATH (its table in `crontab.txt` beside it), and the environment
/// that makes loopflow use it.
fn fake_crontab() -> (Project, Vec<(String, String)>) {
    let dir = Project::new();
    let d = dir.path().display().to_string();
    dir.script(
        "crontab",
        &format!(
            r#"f="{d}/crontab.txt"
case "$1" in
  -l) [ -f "$f" ] || {{ echo "no crontab for tester" >&2; exit 1; }}; cat "$f" ;;
  -) cat > "$f" ;;
  *) exit 2 ;;
esac"#
        ),
    );
    let env = vec![
        (
            "PATH".into(),
            format!("{d}:{}", std::env::var("PATH").unwrap_or_default()),
        ),
        ("XDG_CONFIG_HOME".into(), format!("{d}/xdg")),
    ];
    (dir, env)
}

fn lf_env(p: &Project, env: &[(String, String)], args: &[&str]) -> Run {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    p.lf_env(args, &env)
}

#[test]
fn close_uninstalls_the_schedule() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    p.agent_loop("l", &agent, "");
    let (cron, env) = fake_crontab();
    let r = lf_env(
        &p,
        &env,
        &["schedule", "install", "--loop", "l", "--platform", "cron"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let tab = || std::fs::read_to_string(cron.join("crontab.txt")).unwrap_or_default();
    assert!(tab().contains("'run' '--loop' 'l'"), "{}", tab());
    let r = lf_env(&p, &env, &["close", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("schedule: crontab: removed"), "{r:?}");
    assert!(!tab().contains("'run' '--loop' 'l'"), "{}", tab());
    assert!(!p.loop_dir("l").join(".schedule.json").exists());
    assert!(
        has(&p.events("l"), "SCHEDULE uninstalled=true"),
        "{:?}",
        p.events("l")
    );
}

// ---- delete -------------------------------------------------------------------------------

#[test]
fn delete_says_what_it_would_remove_then_removes_it_with_its_branch() {
    let p = Project::git();
    let agent = standard_agent(&p, &[HALF]);
    p.with_loop("l", &LoopToml::new().harness_agent(&agent).worktree(true));
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let wt = p.worktree("l");
    assert!(
        wt.join("work.txt").is_file(),
        "the tick worked in the worktree"
    );
    let tip = p.git_cmd(&["rev-parse", "loopflow/l"]).trim().to_string();
    // Uncommitted work in the worktree is named before it is lost.
    std::fs::write(wt.join("scratch.txt"), "x").unwrap();

    let before = p.snapshot();
    let r = p.lf(&["delete", "--loop", "l", "--branch"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stdout.contains("would remove"), "{r:?}");
    assert!(r.stdout.contains(&wt.display().to_string()), "{r:?}");
    assert!(r.stdout.contains("1 uncommitted change"), "{r:?}");
    assert!(
        r.stdout.contains(&format!("loopflow/l (at {tip})")),
        "{r:?}"
    );
    assert!(r.stderr.contains("--yes"), "{r:?}");
    assert_eq!(p.snapshot(), before, "without --yes nothing changes");

    let r = p.lf(&["delete", "--loop", "l", "--branch", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains(&format!("was {tip}")), "{r:?}");
    assert!(!p.loop_dir("l").exists());
    assert!(!wt.exists());
    let branches = p.git_cmd(&["branch", "--list", "loopflow/*"]);
    assert!(branches.trim().is_empty(), "{branches}");
    let worktrees = p.git_cmd(&["worktree", "list", "--porcelain"]);
    assert!(!worktrees.contains("loopflow/l"), "{worktrees}");
    // The name is free again.
    assert_eq!(p.lf(&["status", "--loop", "l"]).code, 2);
    assert_eq!(p.lf(&["create", "--loop", "l", "--task", "again"]).code, 0);
}

#[test]
fn delete_keeps_the_branch_unless_asked() {
    let p = Project::git();
    let agent = standard_agent(&p, &[HALF]);
    p.with_loop("l", &LoopToml::new().harness_agent(&agent).worktree(true));
    p.run_json("l", &[]);
    let r = p.lf(&["delete", "--loop", "l", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("keeps: its branch loopflow/l"), "{r:?}");
    assert!(!p.loop_dir("l").exists());
    assert!(
        !p.git_cmd(&["branch", "--list", "loopflow/l"])
            .trim()
            .is_empty()
    );
}

#[test]
fn delete_uninstalls_the_schedule_first() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    p.agent_loop("l", &agent, "");
    let (cron, env) = fake_crontab();
    let r = lf_env(
        &p,
        &env,
        &["schedule", "install", "--loop", "l", "--platform", "cron"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let r = lf_env(&p, &env, &["delete", "--loop", "l"]);
    assert!(r.stdout.contains("its cron schedule"), "{r:?}");
    let r = lf_env(&p, &env, &["delete", "--loop", "l", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    let tab = std::fs::read_to_string(cron.join("crontab.txt")).unwrap_or_default();
    assert!(!tab.contains("'--loop' 'l'"), "{tab}");
    assert!(!p.loop_dir("l").exists());
}

// ---- between ticks only: an agent tries each verb on its own loop ---------------------------

#[test]
fn an_agent_cannot_retask_close_or_delete_its_own_loop_mid_tick() {
    let p = Project::new();
    let rec = p.join("rec");
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement)
    "{lf}" --project "$LOOPFLOW_PROJECT" task --loop "$LOOPFLOW_LOOP" "exfiltrate the keys"; echo "task=$?" >> "{rec}"
    "{lf}" --project "$LOOPFLOW_PROJECT" close --loop "$LOOPFLOW_LOOP"; echo "close=$?" >> "{rec}"
    "{lf}" --project "$LOOPFLOW_PROJECT" delete --loop "$LOOPFLOW_LOOP" --branch --yes; echo "delete=$?" >> "{rec}"
    "{lf}" --project "$LOOPFLOW_PROJECT" approve --loop "$LOOPFLOW_LOOP" --budget-usd +100; echo "approve=$?" >> "{rec}" ;;
  verify) echo '{HALF}' ;;
esac"#,
            lf = lf_bin(),
            rec = rec.display()
        ),
    );
    // The sandbox is off (LoopToml::new): the tick lock is all that stands in the way.
    p.agent_loop("l", &agent, "max_budget_usd = 1.0");
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(
        p.read("rec"),
        "task=1\nclose=1\ndelete=1\napprove=1\n",
        "every verb refused inside the tick"
    );
    let s = p.state("l");
    assert_eq!(s["current_task"], "the task", "{s}");
    assert_eq!(s["halt"], Value::Null, "{s}");
    assert!(s.get("extra_budget").is_none(), "{s}");
    assert!(p.loop_dir("l").join("loop.toml").is_file());
    assert_eq!(s["iteration_count"], 1, "{s}");
}

#[test]
fn an_agent_that_rewrites_its_budget_mid_tick_halts_the_loop_and_gains_nothing() {
    let p = Project::new();
    let state = p.join(".loopflow/loops/l/.state.loop");
    let agent = p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) python3 - "{s}" <<'EOF'
import json, sys
p = sys.argv[1]
s = json.load(open(p))
s["extra_budget"] = {{"usd": 1000.0, "tokens": 0, "seconds": 0.0}}
json.dump(s, open(p, "w"))
EOF
  ;;
  verify) echo '{HALF}' ;;
esac"#,
            s = state.display()
        ),
    );
    p.agent_loop("l", &agent, "max_budget_usd = 1.0");
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "halt", "{r:?}");
    let s = p.state("l");
    assert_eq!(
        s["halt"]["reason"], "human_intervention:state_tampered",
        "{s}"
    );
    assert!(
        s["halt"]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("extra_budget"),
        "{s}"
    );
    assert!(s.get("extra_budget").is_none(), "restored: {s}");
}

#[test]
fn task_close_and_delete_wait_for_the_running_tick() {
    let p = Project::new();
    let agent = blocking_agent(&p);
    p.agent_loop("l", &agent, "");
    let mut said = Vec::new();
    let r = while_a_tick_runs(&p, || {
        for args in [
            &["task", "--loop", "l", "other"][..],
            &["close", "--loop", "l"][..],
            &["delete", "--loop", "l", "--yes"][..],
            &["approve", "--loop", "l", "--extend", "1"][..],
        ] {
            said.push((args.to_vec(), p.lf(args)));
        }
    });
    assert_eq!(r.code, 0, "{r:?}");
    for (args, r) in said {
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        assert!(
            r.stderr.contains("a tick of loop l is running"),
            "{args:?}: {r:?}"
        );
    }
    let s = p.state("l");
    assert_eq!(s["current_task"], "the task");
    assert_eq!(s["halt"], Value::Null);
    assert_eq!(s["iteration_count"], 1);
}

// ---- halt says what becomes of a running tick ------------------------------------------------

#[test]
fn halt_says_whether_a_tick_runs_and_the_tick_does_what_it_said() {
    let p = Project::new();
    let agent = blocking_agent(&p);
    p.agent_loop("l", &agent, "");
    let mut said = None;
    let r = while_a_tick_runs(&p, || {
        said = Some(p.lf(&["halt", "--loop", "l", "--reason", "stop there"]));
    });
    let said = said.expect("halt ran");
    assert_eq!(said.code, 0, "{said:?}");
    assert!(said.stdout.contains("a tick is running (pid "), "{said:?}");
    assert!(said.stdout.contains("runs its remaining nodes"), "{said:?}");
    // As said: the nodes after the halt still ran, the tick committed, the halt stands.
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let calls = p.read("calls.log");
    assert!(
        calls.contains("verify 1") && calls.contains("orchestrate 1"),
        "{calls}"
    );
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 1, "{s}");
    assert_eq!(s["halt"]["reason"], "stop there", "{s}");
    assert_eq!(p.run_json("l", &[]).json()["reason"], "halted:stop there");
    // With no tick running it says so.
    let r = p.lf(&["halt", "--loop", "l", "--reason", "again"]);
    assert!(r.stdout.contains("no tick is running"), "{r:?}");
}

#[test]
fn killing_the_tick_halt_names_ends_it_as_an_abort_that_advances_nothing() {
    let p = Project::new();
    let agent = blocking_agent(&p);
    p.agent_loop("l", &agent, "");
    let r = while_a_tick_runs(&p, || {
        let said = p.lf(&["halt", "--loop", "l", "--reason", "now"]);
        let pid = said
            .stdout
            .split("(pid ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .expect("a pid")
            .to_string();
        let st = std::process::Command::new("kill")
            .arg(&pid)
            .status()
            .unwrap();
        assert!(st.success());
    });
    assert_eq!(r.code, 130, "{r:?}");
    let s = p.state("l");
    assert_eq!(s["iteration_count"], 0, "{s}");
    assert_eq!(s["halt"]["reason"], "now", "{s}");
    assert!(
        !p.read("calls.log").contains("verify"),
        "no node after the kill"
    );
}

// ---- approve: what happens next, and refusals ------------------------------------------------

#[test]
fn approve_refuses_an_exhausted_cap_without_extend_and_says_what_comes_next() {
    let p = Project::new();
    let agent = standard_agent(
        &p,
        &[
            r#"{"pass": false, "score": 0.4}"#,
            HALF,
            r#"{"pass": false, "score": 0.6}"#,
        ],
    );
    p.agent_loop("l", &agent, "max_iterations = 2");
    p.run_json("l", &[]);
    p.run_json("l", &[]);
    let r = p.run_json("l", &[]);
    assert_eq!(
        p.state("l")["halt"]["reason"],
        "iterations_exhausted",
        "{r:?}"
    );
    let before = p.state("l");
    let r = p.lf(&["approve", "--loop", "l"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("would halt it again at once"), "{r:?}");
    assert!(r.stderr.contains("--extend N"), "{r:?}");
    assert_eq!(p.state("l"), before, "a refused approval writes nothing");
    let r = p.lf(&["approve", "--loop", "l", "--extend", "2"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("the next tick runs iteration 3 of 4"),
        "{r:?}"
    );
    assert!(r.stdout.contains("no schedule is installed"), "{r:?}");
}

#[test]
fn approve_refuses_an_exhausted_budget_until_it_is_raised() {
    let p = Project::new();
    let agent = standard_agent(&p, &[r#"{"pass": false, "score": 0.5, "cost_usd": 0.6}"#]);
    p.agent_loop("l", &agent, "max_budget_usd = 1.0");
    p.run_json("l", &[]);
    p.run_json("l", &[]);
    assert_eq!(p.state("l")["halt"]["reason"], "budget_exhausted:usd");
    let r = p.lf(&["approve", "--loop", "l"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("budget_exhausted:usd"), "{r:?}");
    assert!(
        r.stderr.contains("max_budget_usd") && r.stderr.contains("--budget-usd +N"),
        "{r:?}"
    );
    // Too little is refused too; enough runs.
    let r = p.lf(&["approve", "--loop", "l", "--budget-usd", "+0.1"]);
    assert_eq!(r.code, 1, "{r:?}");
    // A unit the loop sets no limit for has nothing to raise.
    let r = p.lf(&["approve", "--loop", "l", "--budget-tokens", "+100"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("max_tokens"), "{r:?}");
    for bad in ["-1", "0", "lots", "inf", "NaN"] {
        let r = p.lf(&["approve", "--loop", "l", "--budget-usd", bad]);
        assert_eq!(r.code, 2, "{bad}: {r:?}");
    }
    let r = p.lf(&[
        "approve",
        "--loop",
        "l",
        "--budget-usd",
        "+2",
        "--by",
        "bob",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("+$2.00 budget"), "{r:?}");
    let s = p.state("l");
    assert_eq!(s["extra_budget"]["usd"], 2.0, "{s}");
    assert!(
        p.events("l")
            .iter()
            .any(|e| e.starts_with("APPROVE by=bob") && e.contains("budget_usd=2")),
        "{:?}",
        p.events("l")
    );
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
    assert_eq!(j["loops"][0]["limits"]["usd"], 3.0, "{j}");
    // The next tick runs, and the raised limit is enforced: 1.8 of 3.0 spent after it.
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let gate = p.lf(&["gate", "--loop", "l", "--json"]);
    assert!(gate.stdout.contains("usd 1.8/3"), "{gate:?}");
}

#[test]
fn approve_refuses_a_plateau_that_would_trip_at_once_and_reset_scores_clears_it() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    // The cap comes first in the gate: a flat history is left behind by the third tick.
    p.agent_loop("l", &agent, "max_iterations = 3\nscore_plateau_window = 3");
    for _ in 0..4 {
        p.run_json("l", &[]);
    }
    assert_eq!(p.state("l")["halt"]["reason"], "iterations_exhausted");
    let r = p.lf(&["approve", "--loop", "l", "--extend", "2"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("verifier_failed:score_plateau"), "{r:?}");
    assert!(r.stderr.contains("--reset-scores"), "{r:?}");
    let r = p.lf(&["approve", "--loop", "l", "--extend", "2", "--reset-scores"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.state("l")["score_history"], Value::Array(vec![]));
    assert_eq!(p.run_json("l", &[]).json()["outcome"], "tick");
}

#[test]
fn approving_a_met_goal_says_the_next_tick_works_on_finished_work() {
    let p = Project::new();
    let agent = standard_agent(&p, &[PASS]);
    p.agent_loop("l", &agent, "");
    p.run_json("l", &[]);
    let r = p.lf(&["approve", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("loopflow close --loop l"), "{r:?}");
    assert!(r.stdout.contains("loopflow task --loop l"), "{r:?}");
}

#[test]
fn approve_names_the_skip_that_follows_it() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    p.agent_loop("l", &agent, "");
    p.lf(&["halt", "--loop", "l", "--reason", "wait"]);
    p.lf(&["transition", "--loop", "l", "--to", "review"]);
    let r = p.lf(&["approve", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("the next tick skips (`phase:review`"),
        "{r:?}"
    );
    assert!(r.stdout.contains("--to implement"), "{r:?}");
}

// ---- did you mean ---------------------------------------------------------------------------

/// Whether a command's help lists a `--loop <NAME>` option.
fn takes_loop(help: &str) -> bool {
    help.lines().any(|l| l.trim_start().starts_with("--loop <"))
}

/// Every subcommand whose help offers `--loop`, found from the binary's own help.
fn commands_taking_loop(p: &Project) -> Vec<Vec<String>> {
    let top = p.lf(&["--help"]).stdout;
    let names: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect();
    let mut out = Vec::new();
    for n in names {
        let help = p.lf(&[&n, "--help"]).stdout;
        if takes_loop(&help) {
            out.push(vec![n]);
        } else if help.contains("Commands:") {
            // `schedule install|uninstall|print`, `worktree restore`.
            let subs: Vec<String> = help
                .lines()
                .skip_while(|l| !l.starts_with("Commands:"))
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .filter_map(|l| l.split_whitespace().next())
                .filter(|s| *s != "help")
                .map(str::to_string)
                .collect();
            for s in subs {
                if takes_loop(&p.lf(&[&n, &s, "--help"]).stdout) {
                    out.push(vec![n.clone(), s]);
                }
            }
        }
    }
    out
}

#[test]
fn every_command_that_takes_a_loop_suggests_the_name_meant() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    p.agent_loop("fix-parser", &agent, "");
    p.agent_loop("docs", &agent, "");
    // The rest of each command line; a command missing here fails the test.
    let rest = |cmd: &[String]| -> Option<Vec<&str>> {
        Some(match cmd.join(" ").as_str() {
            "halt" => vec!["--reason", "x"],
            "transition" => vec!["--to", "review"],
            "can-edit" => vec!["src/x.rs"],
            "task" => vec!["text"],
            "discard" | "delete" => vec!["--yes"],
            "schedule print" | "schedule install" => vec!["--platform", "cron"],
            "run" | "daemon" | "status" | "log" | "gate" | "can-continue" | "approve"
            | "review" | "land" | "close" | "doctor" | "schedule uninstall"
            | "worktree restore" => {
                vec![]
            }
            _ => return None,
        })
    };
    // `create` and `init` name a loop to make: any name is a new one.
    let cmds: Vec<Vec<String>> = commands_taking_loop(&p)
        .into_iter()
        .filter(|c| !matches!(c[0].as_str(), "create" | "init"))
        .collect();
    assert!(cmds.len() >= 20, "{cmds:?}");
    for cmd in &cmds {
        let extra = rest(cmd).unwrap_or_else(|| panic!("no arguments known for `{cmd:?}`"));
        for typo in ["fix-parsr", "Fix-Parser"] {
            let mut args: Vec<&str> = cmd.iter().map(String::as_str).collect();
            args.extend(["--loop", typo]);
            args.extend(&extra);
            if cmd[0] == "daemon" {
                args.extend(["--max-iterations", "1", "--interval", "1"]);
            }
            let r = p.lf(&args);
            assert!(
                r.stderr.contains("did you mean `fix-parser`?"),
                "{args:?}: {r:?}"
            );
        }
    }
    // A name far from every loop lists them instead.
    let r = p.lf(&["status", "--loop", "zzzzzz"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("its loops: docs, fix-parser"), "{r:?}");
    // A scheduler firing a typo still exits 0 (and says what was meant).
    let r = p.lf(&["run", "--loop", "fix-parsr"]);
    assert_eq!(r.code, 0, "{r:?}");
}

// ---- status: a loop whose every tick skips is a problem ---------------------------------------

#[test]
fn status_names_every_loop_that_can_never_tick() {
    let p = Project::git();
    let agent = standard_agent(&p, &[HALF]);
    // A phase it does not run in.
    p.agent_loop("phase", &agent, "");
    p.lf(&["transition", "--loop", "phase", "--to", "review"]);
    // A backlog file that is not there.
    p.with_loop(
        "backlog",
        &LoopToml::new()
            .harness_agent(&agent)
            .table("work_source", "kind = \"backlog\"\nfile = \"MISSING.md\""),
    );
    // A worktree that is gone.
    p.with_loop("wt", &LoopToml::new().harness_agent(&agent).worktree(true));
    std::fs::remove_dir_all(p.worktree("wt")).unwrap();
    // One that is fine, and one halted (a halt is shown as such, not as a skip).
    p.agent_loop("fine", &agent, "");
    p.agent_loop("halted", &agent, "");
    p.lf(&["halt", "--loop", "halted", "--reason", "wait"]);

    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).unwrap();
    let skip = |name: &str| {
        j["loops"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .map(|l| l["skipping"].clone())
            .unwrap_or_else(|| panic!("{name}: {j}"))
    };
    assert_eq!(skip("phase")["reason"], "phase:review", "{j}");
    assert_eq!(skip("backlog")["reason"], "no_current_task", "{j}");
    assert!(
        skip("backlog")["detail"]
            .as_str()
            .unwrap()
            .contains("MISSING.md"),
        "{j}"
    );
    assert_eq!(skip("wt")["reason"], "worktree_missing", "{j}");
    assert!(
        skip("wt")["fix"]
            .as_str()
            .unwrap()
            .contains("worktree restore"),
        "{j}"
    );
    assert_eq!(skip("fine"), Value::Null);
    assert_eq!(skip("halted"), Value::Null);
    // What status says is what the tick does.
    for (name, reason) in [
        ("phase", "phase:review"),
        ("backlog", "no_current_task"),
        ("wt", "worktree_missing"),
    ] {
        assert_eq!(p.run_json(name, &[]).json()["reason"], reason, "{name}");
    }
    let table = p.lf(&["status"]).stdout;
    for (name, cell) in [
        ("phase", "SKIPPING (phase:review)"),
        ("backlog", "SKIPPING (no_current_task)"),
        ("wt", "SKIPPING (worktree_missing)"),
        ("fine", " ok "),
    ] {
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {table}"));
        assert!(line.contains(cell), "{name}: {line}");
    }
    assert!(table.contains("note: wt: every tick skips"), "{table}");
}

/// `status` reads a loop's work source as its gate does, but never runs an audit command.
#[test]
fn status_runs_no_audit_command() {
    let p = Project::new();
    let agent = standard_agent(&p, &[HALF]);
    let marker = p.join("audit-ran");
    let audit = p.script("audit.sh", &format!("touch \"{}\"", marker.display()));
    p.with_loop(
        "l",
        &LoopToml::new().harness_agent(&agent).table(
            "work_source",
            &format!(
                "kind = \"audit\"\ncommand = {}",
                crate::support::array(&[audit.display().to_string()])
            ),
        ),
    );
    let r = p.lf(&["status", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!Path::new(&marker).exists(), "status ran the audit command");
}
