//! `review`, `land` and `discard` on real git: what a loop did since the last approval,
//! a clean merge, and every refusal leaving the checkout exactly as it was.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use crate::support::{LoopToml, PipelineToml, Project, commit_all, git, line_of_tick, wait_until};

/// An agent whose implement role runs `IMPLEMENT` (sh) in the worktree, and whose verifier
/// answers from the `verdicts` file (line N on tick N).
fn agent(p: &Project, implement: &str, verdicts: &[&str]) -> PathBuf {
    let v = p.verdicts(verdicts);
    p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) {implement} ;;
  verify) {verdict} ;;
esac"#,
            verdict = line_of_tick(&v)
        ),
    )
}

/// A git project with loop `w` in a worktree of its own.
fn project(implement: &str, verdicts: &[&str]) -> Project {
    let p = Project::git();
    let a = agent(&p, implement, verdicts);
    let pipe = p.write(
        "pipelines/git.toml",
        &PipelineToml::tick_with_git().render(),
    );
    p.with_loop(
        "w",
        &LoopToml::new()
            .brakes("score_plateau_window = 50")
            .harness_command(&a, &["{{role}}"])
            .pipeline(&pipe)
            .without("worktree"),
    );
    p
}

const FAIL: &str =
    r#"{"pass": false, "score": 0.5, "reasons": ["tests fail"], "next_hint": "fix foo"}"#;

fn review_json(p: &Project) -> Value {
    let r = p.lf(&["review", "--loop", "w", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

/// The checkout's files (not `.git`, whose index `git status` may refresh), HEAD, and
/// what git says about the working tree: equal before and after a refusal.
fn checkout(p: &Project) -> (BTreeMap<PathBuf, Option<Vec<u8>>>, String, String) {
    let mut files = p.snapshot();
    files.retain(|k, _| !k.starts_with(".git"));
    (
        files,
        p.git_cmd(&["rev-parse", "HEAD"]),
        p.git_cmd(&["status", "--porcelain", "--untracked-files=all"]),
    )
}

#[test]
fn review_shows_commits_files_verdicts_and_what_to_run_next() {
    let p = project(
        "echo \"line $LOOPFLOW_TICK\" >> notes.txt",
        &[
            FAIL,
            r#"{"pass": false, "score": 0.6, "reasons": ["closer"]}"#,
        ],
    );
    p.run_json("w", &[]);
    p.run_json("w", &[]);
    let j = review_json(&p);
    assert_eq!(j["loop"], "w");
    assert_eq!(j["branch"], "loopflow/w");
    assert_eq!(j["checkout_branch"], "main");
    assert_eq!(j["base"]["kind"], "merge-base");
    assert_eq!(
        j["base"]["commit"],
        p.git_cmd(&["rev-parse", "main"]).trim()
    );
    assert_eq!(j["commit_count"], 2);
    assert_eq!(j["unlanded"], 2);
    assert_eq!(j["commits"][0]["subject"], "loopflow w: iteration 2");
    assert_eq!(j["files"][0]["path"], "notes.txt");
    assert_eq!(j["files"][0]["status"], "A");
    assert_eq!(j["files"][0]["added"], 2);
    assert!(j["diffstat"].as_str().unwrap().contains("notes.txt"), "{j}");
    assert_eq!(j["verdicts"].as_array().unwrap().len(), 2, "{j}");
    assert_eq!(j["verdicts"][0]["reasons"][0], "tests fail");
    assert_eq!(j["verdicts"][0]["next_hint"], "fix foo");
    assert_eq!(j["verdicts"][1]["score"], 0.6);
    assert_eq!(j["verdicts"][1]["reasons"][0], "closer");
    assert!(j["patch"].is_null());
    let next: Vec<&str> = j["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let proj = p.path().display().to_string();
    assert!(
        next.contains(&format!("loopflow land --loop w --project {proj}").as_str()),
        "{next:?}"
    );
    assert!(
        next.contains(&format!("loopflow discard --loop w --project {proj} --yes").as_str()),
        "{next:?}"
    );

    let text = p.lf(&["review", "--loop", "w"]);
    assert_eq!(text.code, 0, "{text:?}");
    // `running` is what `status` says while a tick runs; review says what the state says.
    assert!(
        text.stdout.starts_with("loop w: not halted, iteration 2\n"),
        "{}",
        text.stdout
    );
    for want in [
        "branch   loopflow/w (lands into main)",
        "commits  2",
        "loopflow w: iteration 1",
        "A  notes.txt  +2 -0",
        "      - tests fail",
        "      next: fix foo",
        "next\n",
    ] {
        assert!(text.stdout.contains(want), "{want:?} in\n{}", text.stdout);
    }
    let patch = p.lf(&["review", "--loop", "w", "--patch"]);
    assert!(patch.stdout.contains("+line 2"), "{patch:?}");
}

#[test]
fn review_starts_at_the_last_approval_and_land_merges_it() {
    let p = project(
        "echo \"line $LOOPFLOW_TICK\" >> notes.txt",
        &[r#"{"pass": true, "score": 1.0}"#, FAIL],
    );
    assert_eq!(p.run_json("w", &[]).json()["outcome"], "halt");
    let tip1 = git(&p.worktree("w"), &["rev-parse", "HEAD"]);
    let r = p.lf(&["approve", "--loop", "w", "--note", "go on"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.state("w")["approvals"][0]["head"], tip1.trim());
    p.run_json("w", &[]);
    let j = review_json(&p);
    assert_eq!(j["base"]["kind"], "approval");
    assert_eq!(j["base"]["commit"], tip1.trim());
    assert_eq!(j["commit_count"], 1, "{j}");
    assert_eq!(j["unlanded"], 2);
    assert_eq!(j["verdicts"].as_array().unwrap().len(), 1, "{j}");

    let main_before = p.git_cmd(&["rev-parse", "HEAD"]);
    let r = p.lf(&["land", "--loop", "w"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("landed 2 commit(s) of loopflow/w into main"),
        "{r:?}"
    );
    let head = p.git_cmd(&["rev-parse", "HEAD"]);
    assert_eq!(r.stdout, head);
    assert_ne!(head, main_before);
    assert_eq!(p.read("notes.txt"), "line 1\nline 2\n");
    let parents = p.git_cmd(&["log", "-1", "--format=%P"]);
    assert_eq!(parents.split_whitespace().count(), 2, "a merge commit");
    let land = p.events("w").into_iter().find(|e| e.starts_with("LAND "));
    assert_eq!(
        land,
        Some(format!(
            "LAND into=main commits=2 squash=false head={}",
            head.trim()
        ))
    );
    // Landed: nothing is left to review or land.
    let j = review_json(&p);
    assert_eq!(j["commit_count"], 0, "{j}");
    assert_eq!(j["unlanded"], 0);
    let again = p.lf(&["land", "--loop", "w"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(again.stderr.contains("nothing to land"), "{again:?}");
}

#[test]
fn land_squash_makes_one_commit_and_moves_the_loop_branch_onto_it() {
    let p = project("echo \"line $LOOPFLOW_TICK\" >> notes.txt", &[FAIL]);
    p.run_json("w", &[]);
    p.run_json("w", &[]);
    let r = p.lf(&["land", "--loop", "w", "--squash"]);
    assert_eq!(r.code, 0, "{r:?}");
    let parents = p.git_cmd(&["log", "-1", "--format=%P"]);
    assert_eq!(parents.split_whitespace().count(), 1, "one plain commit");
    let body = p.git_cmd(&["log", "-1", "--format=%B"]);
    assert!(
        body.starts_with("loopflow: land loop w (2 commits)"),
        "{body}"
    );
    assert!(body.contains("- loopflow w: iteration 1"), "{body}");
    assert_eq!(
        p.git_cmd(&["rev-parse", "loopflow/w"]),
        p.git_cmd(&["rev-parse", "HEAD"])
    );
    assert_eq!(review_json(&p)["unlanded"], 0);
    // The loop goes on from what landed.
    p.run_json("w", &[]);
    assert_eq!(review_json(&p)["commit_count"], 1);
}

#[test]
fn land_refuses_a_dirty_checkout_and_a_conflict_leaving_it_as_it_was() {
    let p = project("echo \"loop $LOOPFLOW_TICK\" >> README.md", &[FAIL]);
    p.run_json("w", &[]);
    // Uncommitted changes to a tracked file.
    p.write("README.md", "# edited by hand\n");
    p.write("scratch.txt", "untracked is fine\n");
    let before = checkout(&p);
    let r = p.lf(&["land", "--loop", "w"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr.contains("uncommitted changes to tracked files"),
        "{r:?}"
    );
    assert!(r.stderr.contains("README.md"), "{r:?}");
    assert!(r.stderr.contains("git stash"), "{r:?}");
    assert_eq!(checkout(&p), before);

    // Committed, the same edit conflicts with the loop's.
    commit_all(p.path(), "edit README");
    let before = checkout(&p);
    let r = p.lf(&["land", "--loop", "w"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("conflicts in:\n    README.md"), "{r:?}");
    assert!(r.stderr.contains("nothing was changed"), "{r:?}");
    assert!(
        r.stderr.contains("loopflow discard --loop w --yes"),
        "{r:?}"
    );
    assert_eq!(checkout(&p), before);
    assert!(!p.join(".git/MERGE_HEAD").exists());
    let r = p.lf(&["land", "--loop", "w", "--squash"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(checkout(&p), before);
    assert!(!p.events("w").iter().any(|e| e.starts_with("LAND")));
}

#[test]
fn a_merge_git_refuses_is_aborted_and_the_checkout_kept() {
    let p = project("echo \"line $LOOPFLOW_TICK\" >> notes.txt", &[FAIL]);
    p.run_json("w", &[]);
    // An untracked file of the same name: no conflict in the trees, but git will not
    // overwrite it.
    p.write("notes.txt", "my own notes\n");
    let before = checkout(&p);
    let r = p.lf(&["land", "--loop", "w"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(r.stderr.contains("notes.txt"), "{r:?}");
    assert!(r.stderr.contains("the checkout is as it was"), "{r:?}");
    assert_eq!(checkout(&p), before);
    assert_eq!(p.read("notes.txt"), "my own notes\n");
    assert!(!p.events("w").iter().any(|e| e.starts_with("LAND")));
}

#[test]
fn land_and_discard_are_refused_while_a_tick_runs() {
    let p = project("while [ ! -f release ]; do sleep 0.05; done", &[FAIL]);
    // The implement step waits for a file `release` in the worktree.
    let flag = p.worktree("w").join("release");
    let mut tick = p.lf_spawn(&["run", "--loop", "w"]);
    wait_until("the tick to hold the lock", || {
        let r = p.lf(&["status", "--loop", "w", "--json"]);
        serde_json::from_str::<Value>(&r.stdout).is_ok_and(|j| j["loops"][0]["running"] == true)
    });
    // The tick writes its outputs meanwhile: compare what git says.
    let refs = || {
        (
            p.git_cmd(&["rev-parse", "HEAD", "loopflow/w"]),
            p.git_cmd(&["status", "--porcelain"]),
        )
    };
    let before = refs();
    for args in [
        vec!["land", "--loop", "w"],
        vec!["discard", "--loop", "w", "--yes"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 1, "{args:?}: {r:?}");
        assert!(r.stderr.contains("a tick of loop w is running"), "{r:?}");
    }
    assert_eq!(refs(), before);
    assert!(
        !p.events("w")
            .iter()
            .any(|e| e.starts_with("LAND") || e.starts_with("DISCARD"))
    );
    std::fs::write(&flag, "").unwrap();
    assert!(tick.wait().unwrap().success());
}

#[test]
fn discard_says_what_it_would_do_then_resets_branch_and_worktree() {
    let p = project(
        "echo \"line $LOOPFLOW_TICK\" >> notes.txt; echo wip > wip.txt",
        &[FAIL],
    );
    p.run_json("w", &[]);
    let w = p.worktree("w");
    std::fs::write(w.join("half-done.txt"), "agent left this\n").unwrap();
    let main = p.git_cmd(&["rev-parse", "HEAD"]);
    let before = checkout(&p);
    let r = p.lf(&["discard", "--loop", "w"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains("would discard 1 commit(s) on loopflow/w and 1 uncommitted file(s)"),
        "{r:?}"
    );
    assert!(r.stderr.contains("half-done.txt"), "{r:?}");
    assert!(r.stderr.contains("--yes"), "{r:?}");
    assert_eq!(checkout(&p), before);
    assert!(w.join("notes.txt").exists());

    let r = p.lf(&["discard", "--loop", "w", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.git_cmd(&["rev-parse", "loopflow/w"]), main);
    assert_eq!(git(&w, &["rev-parse", "HEAD"]), main);
    assert!(!w.join("notes.txt").exists());
    assert!(!w.join("half-done.txt").exists());
    assert_eq!(git(&w, &["status", "--porcelain"]), "");
    let d = p
        .events("w")
        .into_iter()
        .find(|e| e.starts_with("DISCARD "));
    assert_eq!(
        d,
        Some(format!(
            "DISCARD branch=loopflow/w commits=1 uncommitted=1 to={}",
            main.trim()
        ))
    );
    assert_eq!(review_json(&p)["commit_count"], 0);
}

#[test]
fn a_loop_without_a_worktree_is_reviewed_in_the_checkout_and_has_nothing_to_land() {
    let p = Project::git();
    let a = agent(&p, "echo more >> README.md", &[FAIL]);
    let pipe = p.write(
        "pipelines/git.toml",
        &PipelineToml::tick_with_git().render(),
    );
    p.with_loop(
        "w",
        &LoopToml::new()
            .harness_command(&a, &["{{role}}"])
            .pipeline(&pipe),
    );
    p.commit_all("the loop's files");
    let head = p.git_cmd(&["rev-parse", "HEAD"]);
    p.run_json("w", &[]);
    // Worktrees off: git-commit checks the radius but commits nothing in the checkout.
    assert_eq!(p.git_cmd(&["rev-parse", "HEAD"]), head);
    let j = review_json(&p);
    assert!(j["branch"].is_null(), "{j}");
    assert_eq!(j["commit_count"], 0, "{j}");
    assert_eq!(j["uncommitted"][0], " M README.md", "{j}");
    let text = p.lf(&["review", "--loop", "w"]);
    assert!(
        text.stdout.contains(
            "branch   none: the loop works in the checkout on main and commits nothing (worktrees off)"
        ),
        "{text:?}"
    );
    for args in [
        vec!["land", "--loop", "w"],
        vec!["discard", "--loop", "w", "--yes"],
    ] {
        let r = p.lf(&args);
        assert_eq!(r.code, 2, "{r:?}");
        assert!(r.stderr.contains("has no branch of its own"), "{r:?}");
    }

    // Outside git there is nothing to diff, and review says so.
    let q = Project::new();
    let a = agent(&q, "true", &[FAIL]);
    q.with_loop("w", &LoopToml::new().harness_command(&a, &["{{role}}"]));
    q.run_json("w", &[]);
    let j = review_json(&q);
    assert!(
        j["notes"][0]
            .as_str()
            .unwrap()
            .contains("not a git repository"),
        "{j}"
    );
    assert_eq!(j["verdicts"][0]["reasons"][0], "tests fail");
}

#[test]
fn review_text_is_safe_for_a_terminal() {
    let p = project(
        "printf 'x\\n' >> notes.txt",
        &[r#"{"pass": false, "score": 0.1, "reasons": ["\u001b[2Jgotcha"]}"#],
    );
    p.run_json("w", &[]);
    let r = p.lf(&["review", "--loop", "w"]);
    assert!(!r.stdout.contains('\u{1b}'), "{r:?}");
    assert!(r.stdout.contains("\\u{1b}[2Jgotcha"), "{r:?}");
}
