//! Loop programs (issue 5): work sources, budgets, goal mode and plateau, verifier
//! discipline, verdict caching, compaction, shipped templates and `init`, driving the real
//! binary with fake agents written as scripts.

use std::path::Path;

use crate::support::{LoopToml, Project, array, bin, has, line_of_tick};

/// A loop for these tests: the harness runs `agent` with
/// `role task session model output prompt`.
fn program_toml(agent: &Path) -> LoopToml {
    LoopToml::new().harness_command(
        agent,
        &[
            "{{role}}",
            "{{current_task}}",
            "{{session_id}}",
            "{{model}}",
            "{{output}}",
            "{{prompt}}",
        ],
    )
}

/// A fake agent whose calls are recorded in `calls` (outside the project, so the working
/// tree stays as the test leaves it) as `role tick task session model`. `implement` runs
/// `implement_body`; `verify` prints the verdict line of tick N from `verdicts` (the last
/// repeats).
fn agent(tools: &Project, verdicts: &[&str], implement_body: &str) -> std::path::PathBuf {
    let v = tools.verdicts(verdicts);
    tools.script(
        "agent.sh",
        &format!(
            r#"role="$1"; task="$2"; session="$3"; model="$4"; output="$5"; prompt="$6"
echo "$role $LOOPFLOW_TICK $task $session $model" >> "{calls}"
case "$role" in
  implement) {implement_body} ;;
  verify)
    {verdict} ;;
  orchestrate) echo orchestrated ;;
esac"#,
            calls = tools.join("calls").display(),
            verdict = line_of_tick(&v),
        ),
    )
}

fn calls(tools: &Project) -> Vec<Vec<String>> {
    tools
        .read("calls")
        .lines()
        .map(|l| l.split(' ').map(str::to_string).collect())
        .collect()
}

/// Marks the topmost open item of BACKLOG.md done (what a real agent would do).
const CHECK_OFF: &str = r#"awk 'BEGIN{d=0} { if (!d && $0 ~ /^- \[ \]/) { sub(/^- \[ \]/, "- [x]"); d=1 } print }' BACKLOG.md > BACKLOG.tmp && mv BACKLOG.tmp BACKLOG.md"#;

#[test]
fn backlog_takes_topmost_item_and_advances_when_checked_off() {
    let (p, tools) = (Project::new(), Project::new());
    p.write(
        "BACKLOG.md",
        "# Backlog\n- [x] **old** done before\n- [ ] **first-thing** — do it\n- [ ] plain second\n",
    );
    let a = agent(&tools, &[r#"{"pass": false, "score": 0.5}"#], CHECK_OFF);
    p.with_loop_task(
        "b",
        None,
        &program_toml(&a).brakes("score_plateau_window = 10").table(
            "work_source",
            "kind = \"backlog\"\nfile = \"{{cwd}}/BACKLOG.md\"",
        ),
    );
    p.run_json("b", &[]);
    assert_eq!(calls(&tools)[0][2], "first-thing");
    let s = p.state("b");
    // The agent checked it off: the state already names the next task.
    assert_eq!(s["current_task"], "plain second");
    assert_eq!(s["task_source"], "backlog:BACKLOG.md");
    let ev = p.events("b");
    assert!(
        has(
            &ev,
            "TASK done=first-thing next=\"plain second\" source=backlog:BACKLOG.md"
        ),
        "{ev:?}"
    );
    let st = p.lf(&["status", "--loop", "b"]);
    assert!(
        st.stdout.contains("plain second (backlog:BACKLOG.md)"),
        "{st:?}"
    );

    p.run_json("b", &[]);
    // Items without a bold slug: the id is the whole text.
    assert_eq!(calls(&tools)[3][2..4], ["plain", "second"]);
    assert!(p.read("BACKLOG.md").contains("- [x] plain second"));
    assert!(has(
        &p.events("b"),
        "TASK done=\"plain second\" next=none source=-"
    ));
    assert_eq!(p.state("b")["current_task"], serde_json::Value::Null);

    let r = p.run_json("b", &[]);
    assert_eq!(r.json()["reason"], "no_current_task");
    assert_eq!(
        p.events("b").last().map(String::as_str),
        Some("SKIP reason=no_current_task")
    );
    assert_eq!(p.state("b")["iteration_count"], 2);
    // A backlog file that is not there: no task either, and the gate says why.
    std::fs::remove_file(p.join("BACKLOG.md")).expect("rm");
    let g = p.lf(&["gate", "--loop", "b", "--json"]);
    assert!(
        g.stdout.contains("work source unreadable: backlog"),
        "{g:?}"
    );
    assert_eq!(p.run_json("b", &[]).json()["reason"], "no_current_task");
    // ... and so does the log, where a scheduled loop's human looks: nothing left to do
    // is a plain SKIP, a file that is not there a WARN naming it first.
    let ev = p.events("b");
    let (warn, skip) = (&ev[ev.len() - 2], &ev[ev.len() - 1]);
    assert_eq!(skip, "SKIP reason=no_current_task", "{ev:?}");
    assert!(
        warn.starts_with("WARN msg=\"work source unreadable: backlog ")
            && warn.contains("BACKLOG.md"),
        "{ev:?}"
    );
    assert!(
        !ev[ev.len() - 4].starts_with("WARN"),
        "an empty backlog is not unreadable: {ev:?}"
    );
}

#[test]
fn audit_command_lines_and_json_lines_are_tasks() {
    let (p, tools) = (Project::new(), Project::new());
    // JSON lines with id/title; the agent removes the task it fixed.
    p.write(
        "findings.jsonl",
        "{\"id\": \"lint-1\", \"title\": \"unused import in a.rs\"}\n{\"id\": \"lint-2\", \"title\": \"dead code\"}\n",
    );
    let audit = tools.script(
        "audit.sh",
        &format!(
            "echo run >> \"{}\"; cat findings.jsonl",
            tools.join("audit-runs").display()
        ),
    );
    let a = agent(
        &tools,
        &[r#"{"pass": true, "score": 0.6}"#],
        "sed -i 1d findings.jsonl",
    );
    p.with_loop_task(
        "a",
        None,
        &program_toml(&a).brakes("score_plateau_window = 10").table(
            "work_source",
            &format!(
                "kind = \"audit\"\ncommand = {}",
                array(&[&audit.display().to_string(), "{{loop}}"])
            ),
        ),
    );
    let g = p.lf(&["gate", "--loop", "a", "--json"]);
    assert!(g.stdout.contains("lint-1 (from audit)"), "{g:?}");
    // A dry run spawns nothing, the audit command included.
    let d = p.lf(&["run", "--loop", "a", "--dry-run"]);
    assert_eq!(d.code, 0, "{d:?}");
    assert_eq!(tools.read("audit-runs").lines().count(), 1);
    p.run_json("a", &[]);
    assert_eq!(calls(&tools)[0][2], "lint-1");
    // Once for the gate (memoized for the gate node), once after the work (commit).
    assert_eq!(tools.read("audit-runs").lines().count(), 3);
    assert_eq!(p.state("a")["current_task"], "lint-2");
    assert_eq!(p.state("a")["task_source"], "audit");
    p.run_json("a", &[]);
    assert_eq!(calls(&tools)[3][2], "lint-2");
    assert!(has(&p.events("a"), "TASK done=lint-2 next=none source=-"));
    let r = p.run_json("a", &[]);
    assert_eq!(r.json()["reason"], "no_current_task");

    // Plain lines: each line is a task, the first one is current.
    p.write(
        "findings.jsonl",
        "# a comment\n\nfix the flaky test\nsecond\n",
    );
    p.run_json("a", &[]);
    let c = calls(&tools);
    assert_eq!(c[6][2..6], ["fix", "the", "flaky", "test"]);
}

#[test]
fn audit_failure_skips_without_a_task() {
    let (p, tools) = (Project::new(), Project::new());
    let audit = tools.script("audit.sh", "echo broken >&2; exit 2");
    let a = agent(&tools, &[r#"{"pass": true, "score": 0.6}"#], "true");
    p.with_loop_task(
        "a",
        None,
        &program_toml(&a).table(
            "work_source",
            &format!(
                "kind = \"audit\"\ncommand = {}",
                array(&[audit.display().to_string()])
            ),
        ),
    );
    let r = p.run_json("a", &[]);
    assert_eq!(r.json()["reason"], "no_current_task");
    let g = p.lf(&["gate", "--loop", "a", "--json"]);
    assert!(g.stdout.contains("work source unreadable"), "{g:?}");
    assert!(g.stdout.contains("broken"), "{g:?}");
    assert_eq!(tools.read("calls"), "");
}

/// Runs ticks until the loop halts; returns the iteration it halted at and the reason.
fn until_halt(p: &Project, name: &str, max: usize) -> (u64, String) {
    for _ in 0..max {
        let r = p.run_json(name, &[]);
        if r.json()["outcome"] == "halt" {
            let s = p.state(name);
            return (
                s["iteration_count"].as_u64().unwrap_or(0),
                s["halt"]["reason"].as_str().unwrap_or("").to_string(),
            );
        }
    }
    panic!("no halt after {max} ticks: {:?}", p.events(name));
}

#[test]
fn budget_usd_halts_within_the_tick_that_crosses_it() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5, "cost_usd": 0.4}"#],
        "true",
    );
    p.with_loop(
        "u",
        &program_toml(&a).brakes("max_budget_usd = 1.0\nscore_plateau_window = 10"),
    );
    let (iter, reason) = until_halt(&p, "u", 6);
    // 0.4, 0.8, then the third tick's verdict brings it to 1.2: spend counts as soon as
    // a node ends, so the tick stops before its next process (orchestrate), commits the
    // spend without advancing, and halts.
    assert_eq!((iter, reason.as_str()), (2, "budget_exhausted:usd"));
    assert!(
        !tools.read("calls").contains("orchestrate 3"),
        "{}",
        tools.read("calls")
    );
    assert!(
        p.events("u")
            .iter()
            .any(|e| e.starts_with("HALT budget_exhausted:usd")),
        "{:?}",
        p.events("u")
    );
    let j = p.lf(&["status", "--loop", "u", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&j.stdout).expect("status json");
    assert_eq!(v["loops"][0]["limits"]["usd"], 1.0);
    assert!((v["loops"][0]["spent"]["usd"].as_f64().unwrap() - 1.2).abs() < 1e-9);
    let t = p.lf(&["status", "--loop", "u"]);
    assert!(t.stdout.contains("$1.20/1.00"), "{t:?}");
    assert!(t.stdout.contains("HALTED budget_exhausted:usd"), "{t:?}");
}

#[test]
fn budget_tokens_halts_at_the_right_tick() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5, "tokens": 600}"#],
        "true",
    );
    p.with_loop(
        "t",
        &program_toml(&a).brakes("max_tokens = 1000\nscore_plateau_window = 10"),
    );
    let (iter, reason) = until_halt(&p, "t", 5);
    // 600, then 1,200 inside the second tick: it halts there, before orchestrate.
    assert_eq!((iter, reason.as_str()), (1, "budget_exhausted:tokens"));
    let t = p.lf(&["status", "--loop", "t"]);
    assert!(t.stdout.contains("1200/1000tok"), "{t:?}");
}

#[test]
fn budget_seconds_counts_harness_wall_time() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(&tools, &[r#"{"pass": false, "score": 0.5}"#], "sleep 1");
    p.with_loop(
        "s",
        &program_toml(&a).brakes("max_seconds = 1.0\nscore_plateau_window = 10"),
    );
    // The implement role sleeps one second: the limit is reached when it ends, whatever
    // the machine's load, and the tick halts before the verifier runs.
    let (iter, reason) = until_halt(&p, "s", 4);
    assert_eq!((iter, reason.as_str()), (0, "budget_exhausted:seconds"));
    assert!(
        !tools.read("calls").contains("verify"),
        "{}",
        tools.read("calls")
    );
    assert!(p.state("s")["spent"]["seconds"].as_f64().unwrap() >= 1.0);
    let j = p.lf(&["status", "--loop", "s", "--json"]);
    assert!(j.stdout.contains("\"seconds\": 1.0"), "{j:?}");
}

#[test]
fn usage_reported_by_an_agent_counts_toward_the_budget() {
    let (p, tools) = (Project::new(), Project::new());
    // The implement agent reports its usage in its output file (as `claude -p
    // --output-format json` would), the verifier its own in the verdict.
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5, "cost_usd": 0.1, "tokens": 50}"#],
        r#"echo '{"total_cost_usd": 0.3, "usage": {"input_tokens": 100, "output_tokens": 20}}' > "$output""#,
    );
    p.with_loop(
        "r",
        &program_toml(&a).brakes("max_tokens = 300\nscore_plateau_window = 10"),
    );
    p.run_json("r", &[]);
    let spent = &p.state("r")["spent"];
    assert!(
        (spent["usd"].as_f64().unwrap() - 0.4).abs() < 1e-9,
        "{spent}"
    );
    assert_eq!(spent["tokens"], 170);
    // The second tick reaches 340 tokens when its verdict is parsed: it halts there.
    let (iter, reason) = until_halt(&p, "r", 4);
    assert_eq!((iter, reason.as_str()), (1, "budget_exhausted:tokens"));
    assert_eq!(p.state("r")["spent"]["tokens"], 340);
}

#[test]
fn goal_met_halts_after_committing_and_shows_in_status() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(
        &tools,
        &[
            r#"{"pass": false, "score": 0.4}"#,
            r#"{"pass": true, "score": 0.95}"#,
        ],
        "true",
    );
    p.with_loop("g", &program_toml(&a).brakes("goal_score = 0.9"));
    let (iter, reason) = until_halt(&p, "g", 4);
    assert_eq!((iter, reason.as_str()), (2, "goal_met"));
    let ev = p.events("g");
    assert!(has(&ev, "TICK pass=true score=0.95 iter=2"), "{ev:?}");
    assert_eq!(ev.last().map(String::as_str), Some("HALT goal_met"));
    let t = p.lf(&["status", "--loop", "g"]);
    assert!(t.stdout.contains("HALTED goal_met"), "{t:?}");
    // A halt stands until a human approves.
    let r = p.run_json("g", &[]);
    assert_eq!(r.json()["reason"], "halted:goal_met");
}

#[test]
fn flat_scores_halt_as_plateau() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(&tools, &[r#"{"pass": false, "score": 0.5}"#], "true");
    p.with_loop(
        "f",
        &program_toml(&a).brakes("score_plateau_window = 3\nscore_plateau_epsilon = 0.0"),
    );
    let (iter, reason) = until_halt(&p, "f", 6);
    assert_eq!(
        (iter, reason.as_str()),
        (3, "verifier_failed:score_plateau")
    );
    assert!(
        p.events("f")
            .iter()
            .any(|e| e.starts_with("HALT verifier_failed:score_plateau")),
        "{:?}",
        p.events("f")
    );
    let t = p.lf(&["status", "--loop", "f"]);
    assert!(
        t.stdout.contains("HALTED verifier_failed:score_plateau"),
        "{t:?}"
    );
}

#[test]
fn sessions_are_fresh_per_role_and_tick_and_model_is_passed() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(&tools, &[r#"{"pass": false, "score": 0.5}"#], "true");
    p.with_loop(
        "d",
        &program_toml(&a)
            .brakes("score_plateau_window = 10")
            .role("implement", "model = \"model-a\"")
            .role("verify", "model = \"model-b\""),
    );
    p.run_json("d", &[]);
    p.run_json("d", &[]);
    let c = calls(&tools);
    assert_eq!(c.len(), 6);
    // The task has a space, so fields shift: the last two are session and model.
    let sessions: Vec<&str> = c.iter().map(|l| l[l.len() - 2].as_str()).collect();
    let mut uniq = sessions.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), 6, "{sessions:?}");
    let models: Vec<(&str, &str)> = c
        .iter()
        .map(|l| (l[0].as_str(), l[l.len() - 1].as_str()))
        .collect();
    assert!(models.contains(&("implement", "model-a")), "{models:?}");
    assert!(models.contains(&("verify", "model-b")), "{models:?}");
    let t = p.lf(&["status", "--loop", "d"]);
    assert!(!t.stdout.contains("not model-diverse"), "{t:?}");
}

#[test]
fn different_models_without_model_flag_are_refused_by_check_and_run() {
    let p = Project::new();
    let a = p.script("agent.sh", "echo '{\"pass\": true, \"score\": 0.5}'");
    let toml = LoopToml::new()
        .brakes("max_iterations = 3")
        .harness_agent(&a)
        .role("implement", "model = \"big-model\"")
        .role("verify", "model = \"other-model\"");
    p.with_loop("m", &toml);
    let c = p.lf(&["check", ".loopflow/loops/m/loop.toml"]);
    assert_eq!(c.code, 3, "{c:?}");
    assert!(
        c.stdout.contains("never passes `{{model}}`")
            || c.stderr.contains("never passes `{{model}}`"),
        "{c:?}"
    );
    let r = p.lf(&["run", "--loop", "m"]);
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(p.state("m")["iteration_count"], 0);

    // The same model on both sides runs, and status says verification is not diverse.
    p.loop_toml("m", &toml.role("verify", "model = \"big-model\"").render());
    let c = p.lf(&["check", ".loopflow/loops/m/loop.toml"]);
    assert_eq!(c.code, 0, "{c:?}");
    let r = p.lf(&["run", "--loop", "m"]);
    assert_eq!(r.code, 0, "{r:?}");
    let t = p.lf(&["status", "--loop", "m"]);
    assert!(
        t.stdout.contains(
            "implement and verify both use model `big-model`: verification is not model-diverse"
        ),
        "{t:?}"
    );
    let j = p.lf(&["status", "--loop", "m", "--json"]);
    assert!(j.stdout.contains("\"model_diverse\": false"), "{j:?}");
}

fn verify_ticks(tools: &Project) -> Vec<String> {
    calls(tools)
        .into_iter()
        .filter(|c| c[0] == "verify")
        .map(|c| c[1].clone())
        .collect()
}

#[test]
fn verdict_cache_reuses_the_verdict_for_the_same_task_and_output_file() {
    let (p, tools) = (Project::new(), Project::new());
    // The implement role writes its output file: the same text on ticks 1-2, then new.
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5}"#],
        r#"if [ "$LOOPFLOW_TICK" -le 2 ]; then echo same > "$output"; else echo "new $LOOPFLOW_TICK" > "$output"; fi"#,
    );
    let toml = program_toml(&a)
        .brakes("score_plateau_window = 10")
        .role("verify", "cache = true");
    p.with_loop("c", &toml);
    for _ in 0..3 {
        p.run_json("c", &[]);
    }
    assert_eq!(verify_ticks(&tools), ["1", "3"]);
    let ev = p.events("c");
    assert!(has(&ev, "TICK pass=false score=0.5 iter=1"), "{ev:?}");
    assert!(
        has(&ev, "TICK pass=false score=0.5 iter=2 cached=true"),
        "{ev:?}"
    );
    assert!(has(&ev, "TICK pass=false score=0.5 iter=3"), "{ev:?}");
    // The replayed verdict is in the verify node's stdout file as if it had run.
    let out = p.output("c", "2-verify.stdout");
    assert!(out.contains("\"score\": 0.5"), "{out}");
}

#[test]
fn verdict_cache_keys_on_the_working_tree_when_there_is_no_output_file() {
    let p = Project::git();
    let tools = Project::new();
    p.write(".gitignore", "ignored.txt\n");
    // Tick 1 changes a tracked file (uncommitted), tick 2 touches only an ignored file,
    // tick 3 adds an untracked file.
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5}"#],
        r#"case $LOOPFLOW_TICK in 1) echo changed >> README.md ;; 2) date > ignored.txt ;; 3) echo x > new.txt ;; esac"#,
    );
    let toml = program_toml(&a)
        .brakes("score_plateau_window = 10")
        .role("verify", "cache = true");
    p.with_loop("w", &toml);
    for _ in 0..3 {
        p.run_json("w", &[]);
    }
    assert_eq!(verify_ticks(&tools), ["1", "3"]);
    assert!(has(
        &p.events("w"),
        "TICK pass=false score=0.5 iter=2 cached=true"
    ));
}

#[test]
fn verdict_cache_never_replays_an_unparseable_verdict() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(&tools, &["no verdict here"], r#"echo same > "$output""#);
    let toml = program_toml(&a)
        .brakes("score_plateau_window = 10")
        .role("verify", "cache = true");
    p.with_loop("u", &toml);
    let r = p.run_json("u", &[]);
    assert_eq!(r.json()["reason"], "verifier_failed:unparseable", "{r:?}");
    assert_eq!(p.lf(&["approve", "--loop", "u", "--by", "t"]).code, 0);
    // The human fixed the verifier (here: its answers).
    tools.write("verdicts", "{\"pass\": false, \"score\": 0.5}\n");
    // Same task, same artifact: the verifier still runs, since nothing was cached.
    p.run_json("u", &[]);
    assert_eq!(verify_ticks(&tools), ["1", "1"]);
    assert!(has(&p.events("u"), "TICK pass=false score=0.5 iter=1"));
}

#[test]
fn work_source_templates_only_see_gate_variables() {
    let p = Project::new();
    let a = p.script("agent.sh", "true");
    p.with_loop(
        "v",
        &program_toml(&a).table(
            "work_source",
            "kind = \"backlog\"\nfile = \"{{current_task}}/BACKLOG.md\"",
        ),
    );
    let c = p.lf(&["check", ".loopflow/loops/v/loop.toml", "--format", "json"]);
    assert_eq!(c.code, 3, "{c:?}");
    assert!(c.stdout.contains("unknown-variable"), "{c:?}");
    assert!(c.stdout.contains("work_source.file"), "{c:?}");
}

#[test]
fn verdict_cache_is_off_by_default() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5}"#],
        r#"echo same > "$output""#,
    );
    p.with_loop("n", &program_toml(&a).brakes("score_plateau_window = 10"));
    p.run_json("n", &[]);
    p.run_json("n", &[]);
    assert_eq!(verify_ticks(&tools), ["1", "2"]);
    assert!(!p.events("n").iter().any(|e| e.contains("cached")));
}

#[test]
fn compaction_prompt_replaces_a_prompt_that_fills_the_context() {
    let (p, tools) = (Project::new(), Project::new());
    let a = agent(
        &tools,
        &[r#"{"pass": false, "score": 0.5}"#],
        r#"head -n 1 "$prompt" > "$output.first""#,
    );
    // 16000 tokens * 0.001 = 16 tokens ~ 64 bytes: the implement prompt is larger.
    let toml = program_toml(&a)
        .brakes("context_tokens = 16000\nscore_plateau_window = 10")
        .role(
            "implement",
            "compaction_prompt = \"prompts/compaction.md\"\ncompaction_share = 0.001",
        );
    p.with_loop("k", &toml);
    // A compaction prompt that does not exist is a configuration error.
    let missing = toml
        .clone()
        .role("implement", "compaction_prompt = \"prompts/nope.md\"");
    p.loop_toml("k", &missing.render());
    let c = p.lf(&["check", ".loopflow/loops/k/loop.toml", "--format", "json"]);
    assert_eq!(c.code, 3, "{c:?}");
    assert!(c.stdout.contains("compaction prompt"), "{c:?}");
    p.loop_toml("k", &toml.render());
    assert!(
        p.loop_dir("k").join("prompts/compaction.md").is_file(),
        "create ships the compaction prompt"
    );
    p.run_json("k", &[]);
    let ev = p.events("k");
    let line = ev
        .iter()
        .find(|e| e.starts_with("COMPACT "))
        .unwrap_or_else(|| panic!("no COMPACT line: {ev:?}"));
    assert!(line.contains("role=implement"), "{line}");
    assert!(line.contains("estimate=bytes/4"), "{line}");
    assert!(line.contains("context_tokens=16000"), "{line}");
    let prompt = p.output("k", "1-implement.prompt.md");
    assert!(prompt.starts_with("# Compact"), "{prompt}");

    // With room to spare the normal prompt is used and nothing is logged.
    p.loop_toml(
        "k",
        &toml.role("implement", "compaction_share = 0.9").render(),
    );
    p.run_json("k", &[]);
    let prompt = p.output("k", "2-implement.prompt.md");
    assert!(prompt.starts_with("# Implement"), "{prompt}");
    assert_eq!(
        p.events("k")
            .iter()
            .filter(|e| e.starts_with("COMPACT"))
            .count(),
        1
    );
}

// ---- shipped templates, each ticked with a fake agent until it halts as designed ----

/// Creates `name` from `template` and points its harness at `agent` (argv:
/// `role prompt output task`), with a context window so the floor check passes: what a
/// user does after `create`.
fn from_template(p: &Project, name: &str, template: &str, task: Option<&str>, agent: &Path) {
    let mut args = vec!["create", "--loop", name, "--template", template];
    if let Some(t) = task {
        args.extend(["--task", t]);
    }
    let r = p.lf(&args);
    assert_eq!(r.code, 0, "{r:?}");
    let path = p.loop_dir(name).join("loop.toml");
    let toml = std::fs::read_to_string(&path).expect("loop.toml");
    let harness = format!(
        r#"command = ["{}", "{{{{role}}}}", "{{{{prompt}}}}", "{{{{output}}}}", "{{{{current_task}}}}"]"#,
        agent.display()
    );
    // Every template runs the opencode preset; these tests swap in a fake agent's argv.
    let toml: String = toml
        .lines()
        .map(|l| {
            if l.starts_with(r#"preset = "opencode""#) {
                harness.clone()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("# context_tokens = 32000", "context_tokens = 32000")
        + "\n";
    assert!(toml.contains(&harness), "{toml}");
    // The sandbox stays on; the fake agent may also write its call record.
    assert!(!toml.contains("[sandbox]"), "{toml}");
    let toml = format!(
        "{toml}\n[sandbox]\nwrite = [\"{}\"]\n",
        agent.parent().expect("agent dir").display()
    );
    std::fs::write(&path, toml).expect("write loop.toml");
    let c = p.lf(&["check", path.to_str().expect("utf-8 path")]);
    assert_eq!(c.code, 0, "{c:?}");
}

fn template_agent(tools: &Project, verify_body: &str, implement_body: &str) -> std::path::PathBuf {
    tools.script(
        "agent.sh",
        &format!(
            r#"role="$1"; prompt="$2"; output="$3"; task="$4"
echo "$role $LOOPFLOW_TICK" >> "{calls}"
test -s "$prompt" || {{ echo "empty prompt" >&2; exit 9; }}
case "$role" in
  implement) {implement_body} ;;
  verify) {verify_body} ;;
  orchestrate) echo orchestrated ;;
esac"#,
            calls = tools.join("calls").display()
        ),
    )
}

#[test]
fn templates_are_listed_and_each_checks_clean() {
    let p = Project::git();
    let r = p.lf(&["create", "--loop", "x", "--template", "no-such"]);
    assert_eq!(r.code, 2, "{r:?}");
    for t in [
        "default",
        "ci-triage",
        "self-improvement",
        "goal",
        "design-update",
    ] {
        assert!(r.stderr.contains(t), "{t} not listed: {r:?}");
    }
    let c = p.lf(&[
        "check",
        concat!(env!("CARGO_MANIFEST_DIR"), "/templates"),
        "--deny-warnings",
    ]);
    assert_eq!(c.code, 0, "{c:?}");
}

#[test]
fn ci_triage_fixes_failing_tests_then_idles_while_green() {
    let p = Project::git();
    let tools = Project::new();
    // The project's "test command": passes once the agent created `fixed`.
    let tests = tools.script(
        "tests.sh",
        "if [ -f fixed ]; then echo ok; else echo 'FAILED: test_x' ; exit 1; fi",
    );
    let agent = template_agent(
        &tools,
        &format!(
            r#"if "{}" >/dev/null; then echo '{{"pass": true, "score": 1.0}}'; else echo '{{"pass": false, "score": 0.0}}'; fi"#,
            tests.display()
        ),
        r#"grep -q 'FAILED: test_x' "$prompt" && echo fix > fixed"#,
    );
    from_template(&p, "ci", "ci-triage", None, &agent);
    let pipe = p.loop_dir("ci").join("pipeline.toml");
    let text = std::fs::read_to_string(&pipe).expect("pipeline");
    std::fs::write(
        &pipe,
        text.replace(
            r#"argv = ["cargo", "test"]"#,
            &format!(r#"argv = ["{}"]"#, tests.display()),
        ),
    )
    .expect("write pipeline");
    let s = p.state("ci");
    assert_eq!(s["current_task"], "make the failing tests pass");
    assert_eq!(s["task_source"], "template:ci-triage");

    let r = p.run_json("ci", &[]);
    assert_eq!(r.json()["outcome"], "halt", "{r:?}");
    assert_eq!(r.json()["reason"], "goal_met");
    let ev = p.events("ci");
    assert!(has(&ev, "TICK pass=true score=1.0 iter=1"), "{ev:?}");
    assert_eq!(ev.last().map(String::as_str), Some("HALT goal_met"));
    // The fix happened in the loop's worktree, not in the project checkout.
    assert!(p.worktree("ci").join("fixed").is_file());
    assert!(!p.join("fixed").exists());

    // Approved: the tests now pass, so implement does not run and nothing is spent.
    let a = p.lf(&["approve", "--loop", "ci", "--by", "t"]);
    assert_eq!(a.code, 0, "{a:?}");
    let r = p.run_json("ci", &[]);
    assert_eq!(r.json()["reason"], "when:implement", "{r:?}");
    assert_eq!(p.state("ci")["iteration_count"], 1);
    assert_eq!(tools.read("calls"), "implement 1\nverify 1\n");
}

#[test]
fn self_improvement_drains_the_backlog_then_halts_goal_met() {
    let p = Project::git();
    p.write(
        "BACKLOG.md",
        "# Backlog\n- [ ] **speed-up** make it faster\n- [ ] **docs** write the docs\n",
    );
    p.commit_all("backlog");
    let tools = Project::new();
    let agent = template_agent(
        &tools,
        r#"if grep -q '^- \[ \]' BACKLOG.md; then echo '{"pass": true, "score": 0.5}'; else echo '{"pass": true, "score": 1.0}'; fi"#,
        &format!("grep -q \"$task\" \"$prompt\" && {CHECK_OFF}"),
    );
    from_template(&p, "si", "self-improvement", None, &agent);
    let r = p.run_json("si", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(p.state("si")["current_task"], "docs");
    assert_eq!(p.state("si")["task_source"], "backlog:BACKLOG.md");
    let r = p.run_json("si", &[]);
    assert_eq!(r.json()["reason"], "goal_met", "{r:?}");
    let ev = p.events("si");
    assert!(
        has(
            &ev,
            "TASK done=speed-up next=docs source=backlog:BACKLOG.md"
        ),
        "{ev:?}"
    );
    assert_eq!(ev.last().map(String::as_str), Some("HALT goal_met"));
    // The backlog that was worked is the worktree's; the checkout's is untouched.
    let wt = std::fs::read_to_string(p.worktree("si").join("BACKLOG.md")).expect("wt");
    assert!(
        wt.contains("- [x] **docs**") && wt.contains("- [x] **speed-up**"),
        "{wt}"
    );
    assert!(p.read("BACKLOG.md").contains("- [ ] **speed-up**"));
}

#[test]
fn goal_template_halts_goal_met_or_on_a_plateau() {
    let p = Project::git();
    let tools = Project::new();
    tools.write("scores", "0.3\n0.6\n0.95\n");
    let verify = format!(
        r#"s=$(sed -n "${{LOOPFLOW_TICK}}p" "{}"); if [ "$s" = 0.95 ]; then echo "{{\"pass\": true, \"score\": $s}}"; else echo "{{\"pass\": false, \"score\": $s}}"; fi"#,
        tools.join("scores").display()
    );
    let agent = template_agent(&tools, &verify, "echo step >> progress.txt");
    from_template(&p, "g", "goal", Some("reach the goal"), &agent);
    let (iter, reason) = until_halt(&p, "g", 5);
    assert_eq!((iter, reason.as_str()), (3, "goal_met"));
    let t = p.lf(&["status", "--loop", "g"]);
    assert!(t.stdout.contains("HALTED goal_met"), "{t:?}");

    // The same template with scores that stop moving (within epsilon 0.02).
    tools.write("scores", "0.5\n0.51\n0.5\n0.5\n");
    from_template(&p, "g2", "goal", Some("another goal"), &agent);
    let (iter, reason) = until_halt(&p, "g2", 6);
    assert_eq!(
        (iter, reason.as_str()),
        (3, "verifier_failed:score_plateau")
    );
}

#[test]
fn design_update_takes_drifting_docs_until_all_are_in_sync() {
    let p = Project::git();
    p.write("src/a.rs", "fn a() {}\n");
    p.write("src/c.rs", "fn c() {}\n");
    p.commit_all("code");
    let first = p.git_cmd(&["rev-parse", "HEAD"]).trim().to_string();
    p.write(
        "docs/a.md",
        &format!("# A\n<!-- describes: src/a.rs -->\n<!-- last-read-sha: {first} -->\nA does a.\n"),
    );
    p.write(
        "docs/c.md",
        &format!("# C\n<!-- describes: src/c.rs -->\n<!-- last-read-sha: {first} -->\n"),
    );
    p.write(
        "docs/b.md",
        &format!("# B, in sync\n<!-- describes: src/b.rs README.md -->\n<!-- last-read-sha: {first} -->\n"),
    );
    p.write("docs/plain.md", "# no markers: never a task\n");
    p.commit_all("docs");
    p.write("src/a.rs", "fn a() { changed() }\n");
    p.write("src/c.rs", "fn c() { changed() }\n");
    p.commit_all("change the code");

    let d = p.lf(&[
        "drift",
        "--repo",
        p.path().to_str().expect("utf-8"),
        "--dir",
        "docs",
    ]);
    assert_eq!(d.code, 0, "{d:?}");
    let lines: Vec<&str> = d.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{d:?}");
    let first_task: serde_json::Value = serde_json::from_str(lines[0]).expect("json line");
    assert_eq!(first_task["id"], "docs/a.md");
    assert!(
        first_task["title"]
            .as_str()
            .is_some_and(|t| t.contains("src/a.rs changed in")),
        "{first_task}"
    );

    let tools = Project::new();
    let agent = template_agent(
        &tools,
        &format!(
            r#"if [ -z "$("{bin}" drift --dir docs)" ]; then echo '{{"pass": true, "score": 1.0}}'; else echo '{{"pass": true, "score": 0.5}}'; fi"#,
            bin = bin().display()
        ),
        r#"head=$(git rev-parse HEAD); sed "s/last-read-sha: .*/last-read-sha: $head -->/" "$task" > "$task.tmp" && mv "$task.tmp" "$task""#,
    );
    from_template(&p, "du", "design-update", None, &agent);
    let r = p.run_json("du", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    // The prompt names the doc and why it drifted (`{{task_title}}`).
    let prompt = p.output("du", "1-implement.prompt.md");
    assert!(
        prompt.contains("`docs/a.md`: docs/a.md: src/a.rs changed in"),
        "{prompt}"
    );
    assert_eq!(p.state("du")["current_task"], "docs/c.md");
    assert_eq!(p.state("du")["task_source"], "audit");
    let r = p.run_json("du", &[]);
    assert_eq!(r.json()["reason"], "goal_met", "{r:?}");
    let ev = p.events("du");
    assert!(
        has(&ev, "TASK done=docs/a.md next=docs/c.md source=audit"),
        "{ev:?}"
    );
    assert!(has(&ev, "TASK done=docs/c.md next=none source=-"), "{ev:?}");
    assert_eq!(ev.last().map(String::as_str), Some("HALT goal_met"));
    let a = std::fs::read_to_string(p.worktree("du").join("docs/a.md")).expect("doc");
    assert!(!a.contains(&first), "{a}");
}

// ---- init ----

#[test]
fn init_refuses_a_repository_without_a_remote() {
    let p = Project::git();
    let r = p.lf(&["init", "--template", "default"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("no git remote"), "{r:?}");
    assert!(r.stderr.contains("nothing"), "{r:?}");
    assert!(r.stderr.contains("--no-remote-ok"), "{r:?}");
    assert!(!p.join(".loopflow").exists());
    // Not a git repository at all: refused too, with the same way out.
    let plain = Project::new();
    let r = plain.lf(&["init"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(!plain.join(".loopflow").exists());
}

#[test]
fn init_with_a_remote_sets_up_a_first_loop() {
    let p = Project::git();
    let remote = Project::new();
    p.git_cmd(&[
        "remote",
        "add",
        "origin",
        remote.path().to_str().expect("utf-8"),
    ]);
    p.write(".gitignore", "target/\n");
    let r = p.lf(&["init", "--task", "tidy up"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(p.loop_dir("default").join("loop.toml").is_file());
    assert!(p.worktree("default").join(".git").exists());
    assert_eq!(p.state("default")["current_task"], "tidy up");
    let gi = p.read(".gitignore");
    assert!(gi.starts_with("target/\n"), "{gi}");
    assert!(gi.contains(".loopflow/loops/*/outputs/"), "{gi}");
    assert!(
        r.stdout.contains("loopflow run --loop default --dry-run"),
        "{r:?}"
    );
    // Running it again changes nothing and still succeeds.
    let again = p.lf(&["init", "--task", "tidy up"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(p.read(".gitignore"), gi);
    assert!(again.stdout.contains("already exists"), "{again:?}");
    // The loop it made is ready to check.
    let c = p.lf(&["check", ".loopflow/loops/default/loop.toml"]);
    assert_eq!(c.code, 0, "{c:?}");
}

#[test]
fn init_no_remote_ok_accepts_the_risk() {
    let p = Project::git();
    let r = p.lf(&[
        "init",
        "--no-remote-ok",
        "--template",
        "self-improvement",
        "--loop",
        "si",
        "--no-worktree",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("no git remote"), "{r:?}");
    assert!(p.loop_dir("si").join("prompts/implement.md").is_file());
    assert!(p.read(".gitignore").contains(".loopflow/loops/*/.state.*"));
}

#[test]
fn init_asks_on_a_terminal_only() {
    // `script` gives loopflow a pseudo-terminal as stdin; the answers come through it.
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: util-linux `script` is not installed (needed for a pty)");
        return;
    }
    let p = Project::git();
    // An agent CLI on PATH (a stand-in: only its name matters), which init offers.
    let tools = Project::new();
    tools.script("bin/claude", "exit 0");
    let path = format!(
        "{}:{}",
        tools.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let cmd = format!(
        "{} --project {} init --no-remote-ok --no-worktree",
        bin().display(),
        p.path().display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("PATH", path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        // A misspelt agent is asked for again.
        stdin
            .write_all(b"goal\nmyloop\nship the thing\nclaud\nclaude-code\nsonnet\n")
            .expect("answers");
    }
    let out = child.wait_with_output().expect("wait");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("template [default]"), "{text}");
    assert!(text.contains("agents on PATH:"), "{text}");
    assert!(
        text.contains(&tools.join("bin/claude").display().to_string()),
        "{text}"
    );
    assert!(text.contains("did you mean `claude-code`?"), "{text}");
    let s = p.state("myloop");
    assert_eq!(s["current_task"], "ship the thing");
    let toml = p.read(".loopflow/loops/myloop/loop.toml");
    assert!(toml.contains("goal_score = 0.9"), "{toml}");
    assert!(toml.contains("preset = \"claude-code\"\n"), "{toml}");
    assert!(toml.contains("model = \"sonnet\"\n"), "{toml}");
    assert!(!toml.contains("preset = \"opencode\""), "{toml}");
    // Without a terminal nothing is asked: defaults for what the flags leave out.
    let q = Project::git();
    let r = q.lf(&["init", "--no-remote-ok", "--no-worktree"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!r.stdout.contains("template ["), "{r:?}");
    assert!(q.loop_dir("default").join("loop.toml").is_file());
}
