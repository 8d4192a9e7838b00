//! `create --agent/--model/--verify-model` and `init --agent`: a new loop names a shipped
//! preset instead of an argv, every template × preset checks clean, a misspelt preset is
//! refused before anything is written, and a loop that names no agent runs the templates'
//! default (the opencode preset).

use crate::support::{Project, has};

const PRESETS: &[&str] = &[
    "claude-code",
    "opencode",
    "codex",
    "gemini",
    "aider",
    "goose",
];
const TEMPLATES: &[&str] = &[
    "default",
    "ci-triage",
    "self-improvement",
    "goal",
    "design-update",
];

/// The `[harness]` table of a loop.toml: its lines up to the next table.
fn harness_table(toml: &str) -> Vec<&str> {
    toml.lines()
        .skip_while(|l| l.trim() != "[harness]")
        .skip(1)
        .take_while(|l| !l.starts_with('['))
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect()
}

#[test]
fn agent_and_models_are_written_and_reach_the_argv() {
    let p = Project::git();
    let r = p.lf(&[
        "create",
        "--loop",
        "l",
        "--task",
        "t",
        "--agent",
        "claude-code",
        "--model",
        "sonnet",
        "--verify-model",
        "opus",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("agent: claude-code"), "{r:?}");
    let toml = p.read(".loopflow/loops/l/loop.toml");
    assert_eq!(
        harness_table(&toml),
        ["preset = \"claude-code\"", "timeout = \"45m\""],
        "{toml}"
    );
    let model_of = |role: &str| -> Vec<&str> {
        toml.lines()
            .skip_while(|l| l.trim() != format!("[roles.{role}]"))
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .filter(|l| l.starts_with("model"))
            .collect()
    };
    assert_eq!(model_of("implement"), ["model = \"sonnet\""]);
    assert_eq!(model_of("verify"), ["model = \"opus\""]);
    assert_eq!(model_of("orchestrate"), ["model = \"sonnet\""]);
    let c = p.lf(&["check", "--deny-warnings"]);
    assert_eq!(c.code, 0, "{c:?}");
    let d = p.lf(&["run", "--loop", "l", "--dry-run"]);
    assert_eq!(d.code, 0, "{d:?}");
    assert!(
        d.stdout.contains(
            "implement (harness): claude -p --output-format json --model sonnet --permission-mode acceptEdits"
        ),
        "{d:?}"
    );
    assert!(
        d.stdout
            .contains("verify (harness): claude -p --output-format json --model opus"),
        "{d:?}"
    );
    // The preset's agent reads its prompt on stdin: the dry run says from where.
    let prompt = p
        .loop_dir("l")
        .join("outputs/1-implement.prompt.md")
        .display()
        .to_string();
    assert!(
        d.stdout
            .lines()
            .any(|l| l.starts_with("  implement (harness): claude -p")
                && l.ends_with(&format!(" < {prompt}"))),
        "{d:?}"
    );
    // And --json carries the same account, node by node.
    let j = p.lf(&["run", "--loop", "l", "--dry-run", "--json"]);
    assert_eq!(j.code, 0, "{j:?}");
    let doc = j.json();
    let nodes = doc["dry_run"]["nodes"].as_array().expect("dry_run.nodes");
    let implement = nodes
        .iter()
        .find(|n| n["id"] == "implement")
        .expect("implement");
    assert_eq!(implement["kind"], "harness");
    assert!(
        implement["what"]
            .as_str()
            .unwrap()
            .ends_with(&format!(" < {prompt}")),
        "{implement}"
    );
    assert_eq!(doc["dry_run"]["gate"], serde_json::Value::Null, "{doc}");
    assert_eq!(doc["dry_run"]["tick"], 1, "{doc}");
}

#[test]
fn an_unknown_preset_is_refused_before_anything_is_written() {
    let p = Project::git();
    let before = p.snapshot();
    for cmd in [
        vec!["create", "--loop", "l", "--agent", "claud"],
        vec!["init", "--no-remote-ok", "--agent", "claud", "--yes"],
    ] {
        let r = p.lf(&cmd);
        assert_eq!(r.code, 2, "{r:?}");
        assert!(
            r.stderr
                .contains("unknown agent preset `claud`; did you mean `claude-code`?"),
            "{r:?}"
        );
        for name in PRESETS {
            assert!(r.stderr.contains(name), "{name} not listed: {r:?}");
        }
    }
    assert_eq!(p.snapshot(), before, "nothing may be written");
    assert!(!p.git_cmd(&["branch", "--list"]).contains("loopflow/l"));
    // No near miss: the list alone.
    let r = p.lf(&["create", "--loop", "l", "--agent", "vim"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(!r.stderr.contains("did you mean"), "{r:?}");
    assert!(r.stderr.contains("the presets are: claude-code, "), "{r:?}");
}

#[test]
fn every_template_with_every_preset_checks_clean() {
    let p = Project::git();
    for t in TEMPLATES {
        for a in PRESETS {
            let name = format!("{t}-{a}");
            let r = p.lf(&[
                "create",
                "--loop",
                &name,
                "--template",
                t,
                "--agent",
                a,
                "--model",
                "m1",
                "--verify-model",
                "m2",
                "--task",
                "t",
                "--no-worktree",
            ]);
            assert_eq!(r.code, 0, "{t} {a}: {r:?}");
            let toml = p.read(&format!(".loopflow/loops/{name}/loop.toml"));
            let h = harness_table(&toml);
            assert_eq!(h[0], format!("preset = \"{a}\""), "{t} {a}: {toml}");
            assert!(!h.iter().any(|l| l.starts_with("command")), "{toml}");
            let c = p.lf(&[
                "check",
                &format!(".loopflow/loops/{name}/loop.toml"),
                "--deny-warnings",
            ]);
            assert_eq!(c.code, 0, "{t} {a}: {c:?}");
        }
    }
}

#[test]
fn templates_default_to_the_opencode_preset() {
    let p = Project::git();
    let r = p.lf(&["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    let toml = p.read(".loopflow/loops/l/loop.toml");
    assert!(
        harness_table(&toml)[0].starts_with("preset = \"opencode\" "),
        "{toml}"
    );
    let d = p.lf(&["run", "--loop", "l", "--dry-run"]);
    let wt = p.worktree("l").canonicalize().expect("worktree");
    assert!(
        d.stdout.contains(&format!(
            "implement (harness): opencode run --format json --dir {}",
            wt.display()
        )),
        "{d:?}"
    );
    // A loop.toml that names no agent at all runs the same preset, not an argv of flags
    // opencode does not have.
    let bare = toml
        .lines()
        .filter(|l| !l.starts_with("preset ="))
        .collect::<Vec<_>>()
        .join("\n");
    p.loop_toml("l", &bare);
    let d = p.lf(&["run", "--loop", "l", "--dry-run"]);
    assert_eq!(d.code, 0, "{d:?}");
    assert!(
        d.stdout
            .contains("implement (harness): opencode run --format json --dir "),
        "{d:?}"
    );
    assert!(!d.stdout.contains("--prompt-file"), "{d:?}");
}

#[test]
fn init_takes_the_agent_without_asking() {
    let p = Project::git();
    let r = p.lf(&[
        "init",
        "--no-remote-ok",
        "--no-worktree",
        "--task",
        "t",
        "--agent",
        "codex",
        "--model",
        "gpt-5.5",
    ]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("agent: codex"), "{r:?}");
    let toml = p.read(".loopflow/loops/default/loop.toml");
    assert_eq!(harness_table(&toml)[0], "preset = \"codex\"", "{toml}");
    assert!(toml.contains("model = \"gpt-5.5\"\n"), "{toml}");
    assert!(has(
        &p.events("default"),
        "CREATE template=default worktree=false"
    ));
}

#[test]
fn a_committed_loop_toml_is_started_as_it_is_only_when_valid() {
    let p = Project::git();
    // A loop directory as a clone has it: configuration, no state. An unknown key first.
    p.write(
        ".loopflow/loops/l/loop.toml",
        "[brakes]\nmax_iterations = 3\nbogus = 1\n[harness]\npreset = \"codex\"\n[roles.implement]\n[worktree]\nenabled = false\n",
    );
    let r = p.lf(&["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("has errors; `loopflow check"), "{r:?}");
    assert!(!p.loop_dir("l").join(".state.loop").exists());
    // Fixed, it starts, with no worktree since its loop.toml wants none.
    let fixed = p
        .read(".loopflow/loops/l/loop.toml")
        .replace("bogus = 1\n", "");
    p.write(".loopflow/loops/l/loop.toml", &fixed);
    let r = p.lf(&["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("agent: codex"), "{r:?}");
    assert_eq!(p.read(".loopflow/loops/l/loop.toml"), fixed);
    assert_eq!(p.state("l")["current_task"], "t");
    assert!(!p.worktree("l").exists());
    assert!(
        p.read(".loopflow/loops/l/.gitignore")
            .contains(".state.loop")
    );
    assert_eq!(p.events("l"), ["CREATE adopted=loop.toml worktree=false"]);
}
