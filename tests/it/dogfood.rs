//! The repository runs on itself (seed D24): `.loopflow/loops/self-improvement/` works
//! through `BACKLOG.md`, loopflow's own open items, with the preset `agents.rs` drives
//! through whole loops. It checks clean, a clone starts it as committed, and the temp
//! projects of the other tests never find it (the project root is searched upward).

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{Project, Run, commit_all, loopflow};

const LOOP: &str = "self-improvement";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn loop_dir() -> PathBuf {
    root().join(".loopflow/loops").join(LOOP)
}

#[test]
fn the_repository_loop_checks_clean_with_a_preset_ci_runs() {
    let r = Run::of(loopflow(root()).args(["check", ".loopflow", "--deny-warnings"]));
    assert_eq!(r.code, 0, "{r:?}");
    let toml = std::fs::read_to_string(loop_dir().join("loop.toml")).expect("loop.toml");
    // The agent tests/it/agents.rs proves in CI, through whole loops.
    assert!(toml.contains("\npreset = \"claude-code\"\n"), "{toml}");
    let agents = std::fs::read_to_string(root().join("tests/it/agents.rs")).expect("agents.rs");
    assert!(agents.contains("preset: \"claude-code\""));
    assert!(toml.contains("kind = \"backlog\"") && toml.contains("/BACKLOG.md\""));
    // Every open item has an id of its own (the bold slug).
    let backlog = std::fs::read_to_string(root().join("BACKLOG.md")).expect("BACKLOG.md");
    let slugs: Vec<&str> = backlog
        .lines()
        .filter_map(|l| l.strip_prefix("- [ ] **"))
        .filter_map(|l| l.split_once("**").map(|(s, _)| s))
        .collect();
    assert!(slugs.len() >= 5, "{backlog}");
    let open = backlog.lines().filter(|l| l.starts_with("- [ ]")).count();
    assert_eq!(open, slugs.len(), "an open item without a **slug**");
    let mut unique = slugs.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), slugs.len(), "duplicate slugs: {slugs:?}");
}

/// A project holding a copy of the repository's loop and backlog, committed, as a fresh
/// clone has them: the loop's configuration without its state.
fn clone_of_the_loop() -> Project {
    let p = Project::git();
    for rel in ["loop.toml", ".gitignore"] {
        let text = std::fs::read_to_string(loop_dir().join(rel)).expect("loop file");
        p.write(&format!(".loopflow/loops/{LOOP}/{rel}"), &text);
    }
    for e in std::fs::read_dir(loop_dir().join("prompts"))
        .expect("prompts")
        .flatten()
    {
        let text = std::fs::read_to_string(e.path()).expect("prompt");
        let name = e.file_name().to_string_lossy().into_owned();
        p.write(&format!(".loopflow/loops/{LOOP}/prompts/{name}"), &text);
    }
    let backlog = std::fs::read_to_string(root().join("BACKLOG.md")).expect("BACKLOG.md");
    p.write("BACKLOG.md", &backlog);
    commit_all(p.path(), "loopflow's own loop");
    p
}

#[test]
fn a_clone_starts_the_committed_loop_as_it_is() {
    let p = clone_of_the_loop();
    let before = p.read(&format!(".loopflow/loops/{LOOP}/loop.toml"));
    // Before it starts, status names it and says how to start it.
    let s = p.lf(&["status"]);
    assert_eq!(s.code, 0, "{s:?}");
    assert!(
        s.stdout.contains(&format!(
            "not started: {LOOP} has a loop.toml but no state yet (`loopflow create --loop {LOOP}` starts it as committed)"
        )),
        "{s:?}"
    );
    assert!(!s.stdout.contains("no loops in"), "{s:?}");
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).expect("JSON");
    assert_eq!(j["unstarted"], serde_json::json!([LOOP]), "{j}");
    assert_eq!(j["loops"], serde_json::json!([]), "{j}");
    // Its agent is its loop.toml's: flags that would rewrite it are refused.
    let r = p.lf(&["create", "--loop", LOOP, "--agent", "codex"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("edit that file"), "{r:?}");
    assert!(!p.loop_dir(LOOP).join(".state.loop").exists());

    let r = p.lf(&["create", "--loop", LOOP]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains("started loop `self-improvement` from the loop.toml already in"),
        "{r:?}"
    );
    assert_eq!(p.read(&format!(".loopflow/loops/{LOOP}/loop.toml")), before);
    assert_eq!(p.state(LOOP)["iteration_count"], 0);
    assert!(p.worktree(LOOP).join("BACKLOG.md").is_file());
    assert_eq!(p.events(LOOP), ["CREATE adopted=loop.toml worktree=true"]);
    let j: Value = serde_json::from_str(&p.lf(&["status", "--json"]).stdout).expect("JSON");
    assert_eq!(j["unstarted"], serde_json::json!([]), "{j}");
    assert_eq!(j["loops"][0]["name"], LOOP, "{j}");
    // Its state stays out of the checkout's commits.
    assert_eq!(
        p.git_cmd(&["status", "--porcelain", "--untracked-files=all"]),
        ""
    );

    let d = p.lf(&["run", "--loop", LOOP, "--dry-run"]);
    assert_eq!(d.code, 0, "{d:?}");
    assert!(d.stdout.contains("gate: ok"), "{d:?}");
    assert!(
        d.stdout
            .contains("implement (harness): claude -p --output-format json --model sonnet"),
        "{d:?}"
    );
    let g = p.lf(&["gate", "--loop", LOOP, "--json"]);
    let gate: Value = serde_json::from_str(&g.stdout).expect("gate JSON");
    assert_eq!(gate["ok"], true, "{gate}");

    // Started once: a second create refuses.
    let r = p.lf(&["create", "--loop", LOOP]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("already exists"), "{r:?}");
}

#[test]
fn temp_projects_do_not_see_the_repository_loop() {
    // Project-root search goes upward from the current directory: a temp project inside
    // this repository would find its `.loopflow/` and act on loopflow's own loop.
    let repo = root().canonicalize().expect("repo");
    let tmp = std::env::temp_dir().canonicalize().expect("temp dir");
    assert!(
        !tmp.starts_with(&repo),
        "TMPDIR ({}) is inside the repository: the tests' temp projects would find its .loopflow/; point TMPDIR elsewhere",
        tmp.display()
    );
    // A git project with no loops, asked without --project, lists none.
    let p = Project::git();
    let mut c = loopflow(p.path());
    c.env_remove("LOOPFLOW_PROJECT").args(["status", "--json"]);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    let v: Value = serde_json::from_str(&r.stdout).expect("status JSON");
    assert_eq!(v["loops"], serde_json::json!([]), "{v}");
    assert!(!r.stdout.contains(LOOP));
}
