//! What a harness role may not do unnoticed: go silent past `idle_timeout`, or have tool
//! calls refused without the log saying so.

use crate::support::*;

/// A verifier that passes, and an implement role run by `implement_body`.
fn agent_with_implement(p: &Project, implement_body: &str) -> std::path::PathBuf {
    p.script(
        "agent.sh",
        &format!(
            r#"role="$1"
case "$role" in
  implement)
{implement_body} ;;
  verify) echo '{{"pass": true, "score": 1.0}}' ;;
  *) echo ok ;;
esac"#
        ),
    )
}

fn alive(pid: i32) -> bool {
    // Alive: /proc has it and it is not a zombie waiting for its reaper.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

/// An agent that prints one line and then sleeps (an unreachable API, a permission
/// prompt nobody answers) is stopped once it has been silent for `idle_timeout`, long
/// before its 10-minute `timeout`, and what it started goes with it.
#[test]
fn a_silent_agent_is_stopped_at_its_idle_timeout() {
    let p = Project::new();
    let pidfile = p.join("sleeper.pid");
    let agent = agent_with_implement(
        &p,
        &format!(
            "    echo thinking; sleep 300 & echo $! > \"{}\"; wait",
            pidfile.display()
        ),
    );
    p.with_loop_task(
        "quiet",
        Some("t"),
        &LoopToml::new()
            .harness_agent(&agent)
            .harness("timeout = \"10m\"\nidle_timeout = \"1s\""),
    );
    let run = p.lf(&["run", "--loop", "quiet", "--json"]);
    let events = p.events("quiet");
    let abort = events
        .iter()
        .find(|l| l.contains("ABORT"))
        .unwrap_or_else(|| panic!("no ABORT in {events:#?}\n{run:?}"));
    assert!(abort.contains("reason=idle:1s"), "{abort}");
    assert!(abort.contains("implement"), "{abort}");
    // The verifier never ran on an aborted implement, and the sleeping grandchild is gone.
    assert_eq!(p.state("quiet")["iteration_count"], 0);
    let pid: i32 = p.read("sleeper.pid").trim().parse().unwrap();
    wait_until("the idle agent's child is gone", || !alive(pid));
}

/// Idle means silent, not slow: an agent that keeps printing for longer than the idle
/// timeout in all, never pausing that long, runs to the end.
#[test]
fn an_agent_that_keeps_talking_outlives_its_idle_timeout() {
    let p = Project::new();
    let agent = agent_with_implement(
        &p,
        "    for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo \"step $i\"; sleep 0.25; done",
    );
    p.with_loop_task(
        "chatty",
        Some("t"),
        &LoopToml::new()
            .harness_agent(&agent)
            .harness("timeout = \"10m\"\nidle_timeout = \"2s\""),
    );
    let run = p.lf(&["run", "--loop", "chatty", "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = p.events("chatty");
    assert!(!events.iter().any(|l| l.contains("ABORT")), "{events:#?}");
    assert!(
        p.output("chatty", "1-implement.stdout").contains("step 12"),
        "{}",
        p.output("chatty", "1-implement.stdout")
    );
}

/// Tool calls the CLI refused (Claude Code's `permission_denials`) are named in a WARN:
/// a verifier that could not run the tests its prompt asks for is visible in the log,
/// not a silent pass.
#[test]
fn refused_tool_calls_are_logged_by_name() {
    let p = Project::new();
    let bin = p.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    p.script(
        "bin/claude",
        r#"cat > /dev/null
case "$*" in
  *"Bash Read Glob Grep"*)
    printf '%s\n' '{"type":"result","is_error":false,"result":"{\"pass\": false, \"score\": 0.4}","total_cost_usd":0.01,"usage":{"input_tokens":1,"output_tokens":1},"permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"cargo test --workspace"}},{"tool_name":"Write","tool_use_id":"t2","tool_input":{"file_path":"/etc/hosts"}}]}' ;;
  *)
    printf '%s\n' '{"type":"result","is_error":false,"result":"done","total_cost_usd":0.01,"usage":{"input_tokens":1,"output_tokens":1},"permission_denials":[]}' ;;
esac"#,
    );
    p.with_loop_task(
        "denied",
        Some("t"),
        &LoopToml::new().harness("preset = \"claude-code\""),
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let run = p.lf_env(&["run", "--loop", "denied"], &[("PATH", &path)]);
    assert_eq!(run.code, 0, "{run:?}");
    let warns: Vec<String> = p
        .events("denied")
        .into_iter()
        .filter(|l| l.contains("WARN") && l.contains("refused"))
        .collect();
    assert_eq!(
        warns.len(),
        1,
        "one WARN, from the verifier only: {warns:#?}"
    );
    let w = &warns[0];
    assert!(w.contains("2 tool call(s)"), "{w}");
    assert!(
        w.contains("Bash") && w.contains("cargo test --workspace"),
        "{w}"
    );
    assert!(w.contains("Write") && w.contains("/etc/hosts"), "{w}");
}
