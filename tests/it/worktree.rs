//! `loopflow worktree restore`: a loop whose worktree was removed (by `gc --include-idle`
//! or by hand) gets it back on its own branch, with its commits, and ticks again instead
//! of skipping `worktree_missing` forever.

use crate::support::{LoopToml, Project, commit_all, cp_a, git};

fn set_idle(p: &Project, name: &str) {
    let st = p.loop_dir(name).join(".state.loop");
    let mut s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    s["last_tick_at"] = "2020-01-01T00:00:00Z".into();
    std::fs::write(&st, serde_json::to_string_pretty(&s).unwrap()).unwrap();
}

#[test]
fn a_worktree_removed_by_gc_is_restored_on_its_branch() {
    let p = Project::git();
    assert_eq!(p.lf(&["create", "--loop", "l", "--task", "t"]).code, 0);
    std::fs::write(p.worktree("l").join("work.txt"), "done\n").unwrap();
    commit_all(&p.worktree("l"), "the loop's work");
    set_idle(&p, "l");
    let r = p.lf(&["worktree", "gc", "--include-idle", "--force"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!p.worktree("l").exists(), "{r:?}");
    // The next tick skips and says how to get out of it.
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    assert_eq!(r.json()["reason"], "worktree_missing", "{r:?}");
    let ev = p.events("l");
    assert!(
        ev.iter()
            .any(|e| e.contains("loopflow worktree restore --loop l")),
        "{ev:?}"
    );

    let r = p.lf(&["worktree", "restore", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("on loopflow/l"), "{r:?}");
    let wt = p.worktree("l");
    // `--force` deleted the unmerged branch too: restored from HEAD, a new branch.
    assert!(r.stdout.contains("a new branch from HEAD"), "{r:?}");
    assert!(wt.join(".git").exists());
    let s = p.state("l");
    assert_eq!(
        s["worktree_path"].as_str(),
        Some(wt.canonicalize().unwrap().to_str().unwrap()),
        "{s}"
    );
    assert!(
        p.events("l")
            .iter()
            .any(|e| e.starts_with("WORKTREE restored=")),
        "{:?}",
        p.events("l")
    );
    // The gate passes the worktree check again.
    let g = p.lf(&["gate", "--loop", "l", "--json"]);
    let checks = g.stdout.clone();
    assert!(checks.contains("worktree at "), "{g:?}");
    // Again: nothing to do.
    let r = p.lf(&["worktree", "restore", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("nothing to do"), "{r:?}");
}

/// The loop's worktree and its repository, removed by hand.
fn remove_worktree(p: &Project, name: &str) {
    std::fs::remove_dir_all(p.worktree(name)).unwrap();
    std::fs::remove_dir_all(p.loop_git_dir(name)).unwrap();
}

#[test]
fn restore_keeps_the_branch_and_its_commits() {
    let p = Project::git();
    let agent = p.script(
        "agent.sh",
        "[ \"$1\" = implement ] && echo done > work.txt; echo '{\"pass\": false, \"score\": 0.1}'",
    );
    p.with_loop_task(
        "l",
        Some("t"),
        &LoopToml::new()
            .harness_command(&agent, &["{{role}}"])
            .without("worktree"),
    );
    assert_eq!(p.lf(&["run", "--loop", "l"]).code, 0);
    let tip = p.git_cmd(&["rev-parse", "loopflow/l"]);
    remove_worktree(&p, "l");
    // The state's path made stale: the worktree's place is the project's, not the state's.
    p.edit_state("l", |s| s["worktree_path"] = "somewhere/else".into());

    let r = p.lf(&["worktree", "restore", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("its existing branch"), "{r:?}");
    let wt = p.worktrees_dir().join("l");
    assert_eq!(
        std::fs::read_to_string(wt.join("work.txt")).unwrap(),
        "done\n"
    );
    assert_eq!(git(&wt, &["rev-parse", "HEAD"]), tip);
    assert_eq!(p.state("l")["worktree_path"].as_str(), wt.to_str());
}

#[test]
fn restore_refuses_what_it_cannot_do() {
    let p = Project::git();
    assert_eq!(p.lf(&["create", "--loop", "l", "--task", "t"]).code, 0);
    assert_eq!(p.lf(&["worktree", "restore", "--loop", "nope"]).code, 2);
    assert_eq!(p.lf(&["worktree", "restore", "--loop", "../x"]).code, 2);
    // Something else where the worktree goes: left alone.
    let wt = p.worktree("l");
    remove_worktree(&p, "l");
    std::fs::create_dir_all(&wt).unwrap();
    std::fs::write(wt.join("keep.txt"), "mine").unwrap();
    let r = p.lf(&["worktree", "restore", "--loop", "l"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("is not a loop's worktree"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(wt.join("keep.txt")).unwrap(),
        "mine"
    );
    // A link planted where the worktree goes: restore neither writes where it points nor
    // records that place as the loop's worktree.
    std::fs::remove_dir_all(&wt).unwrap();
    let outside = p.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join(".git"), "gitdir: /nowhere/worktree\n").unwrap();
    std::os::unix::fs::symlink(&outside, &wt).unwrap();
    let before = p.state("l")["worktree_path"].clone();
    let r = p.lf(&["worktree", "restore", "--loop", "l"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("is a symlink"), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(outside.join(".git")).unwrap(),
        "gitdir: /nowhere/worktree\n"
    );
    assert_eq!(p.state("l")["worktree_path"], before);
    // A loop without a worktree has nothing to restore.
    assert_eq!(p.lf(&["create", "--loop", "flat", "--no-worktree"]).code, 0);
    let r = p.lf(&["worktree", "restore", "--loop", "flat"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("without a worktree"), "{r:?}");
}

/// `worktree gc` in a copied project: the first checkout's worktrees are at the first
/// checkout's place, which the copy never looks at; a loop deleted in the copy costs the
/// original nothing.
#[test]
fn gc_in_a_copied_project_leaves_the_originals_worktrees_alone() {
    let p = Project::git();
    assert_eq!(p.lf(&["create", "--loop", "l", "--task", "t"]).code, 0);
    std::fs::write(p.worktree("l").join("work.txt"), "uncommitted\n").unwrap();
    let q = Project::new();
    cp_a(&p.path().join("."), q.path());
    std::fs::remove_dir_all(q.loop_dir("l")).unwrap();
    let index = std::fs::read(p.loop_git_dir("l").join("index")).ok();
    for args in [
        &["worktree", "gc", "--dry-run"][..],
        &["worktree", "gc", "--force"],
    ] {
        let r = q.lf(args);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(!r.stdout.contains("remove"), "{r:?}");
    }
    assert_eq!(
        std::fs::read_to_string(p.worktree("l").join("work.txt")).unwrap(),
        "uncommitted\n"
    );
    assert_eq!(std::fs::read(p.loop_git_dir("l").join("index")).ok(), index);
}
