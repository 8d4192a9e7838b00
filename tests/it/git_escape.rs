//! No way out through git (DESIGN §12, "Nothing planted for later", "Only the work's
//! history"): an agent that plants git configuration — a nested repository with a filter,
//! a `.git` file naming a repository of its own — gets none of it run by loopflow's git,
//! in the tick or at the human's `review`, nor by the human's own `git status` in the
//! worktree; and of the repository's objects it reads only its branch's history (never a
//! stash, never the checkout's configuration). Each attack fails the test if it works.

use std::path::{Path, PathBuf};

use crate::sandbox::landlock;
use crate::support::{LoopToml, Project, git};

/// A script that, run by git as a filter, leaves `marker` (outside every worktree)
/// behind: the proof that git ran the attacker's code unconfined.
fn payload(tools: &Project, marker: &Path) -> PathBuf {
    tools.script("payload.sh", &format!("touch '{}'\ncat", marker.display()))
}

/// A worktree loop whose implementer runs `attack` (a shell body) and whose verifier says
/// 0.5; sandbox as given (`"off"` tests the git layer alone).
fn attacked_loop(p: &Project, tools: &Project, attack: &str, sandbox: &str) {
    let agent = tools.script(
        "agent.sh",
        &format!(
            "case \"$1\" in\n  implement) {attack}\n  ;;\n  verify) echo '{{\"pass\": false, \"score\": 0.5}}' ;;\nesac\nexit 0"
        ),
    );
    p.with_loop(
        "x",
        &LoopToml::new()
            .without("worktree")
            .harness_command(&agent, &["{{role}}"])
            .table("sandbox", &format!("mode = \"{sandbox}\"")),
    );
}

/// The nested-repository attack: a submodule's empty directory made a repository whose
/// `.git/config` declares a clean filter for every file in it. `git status` with
/// submodule recursion would run it from loopflow, unconfined, during the tick.
#[test]
fn a_filter_planted_in_a_submodule_is_never_run_by_the_ticks_git() {
    let p = Project::git();
    let tools = Project::new();
    let marker = tools.join("PWNED");
    let other = Project::git();
    git(
        p.path(),
        &[
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            &other.path().display().to_string(),
            "sub",
        ],
    );
    p.commit_all("a submodule");
    let filter = payload(&tools, &marker);
    // Its index made first (no filter yet, so its own git runs none), then the filter
    // declared and the file changed: a `git status` that enters the submodule must clean
    // the file to compare it.
    let attack = format!(
        r#"rm -rf sub; mkdir -p sub; cd sub; git init -q .; echo data > file.txt; git add -A; git config filter.evil.clean '{f}'; git config filter.evil.smudge '{f}'; git config filter.evil.required true; echo '* filter=evil' > .gitattributes; sleep 1; touch file.txt; cd ..; echo '* filter=evil' >> .gitattributes; echo x > top.txt"#,
        f = filter.display()
    );
    for sandbox in ["off", "auto"] {
        attacked_loop(&p, &tools, &attack, sandbox);
        let r = p.lf(&["run", "--loop", "x", "--json"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(
            !marker.exists(),
            "the tick's git ran the planted filter ({sandbox})"
        );
        // Not at the human's review either.
        let r = p.lf(&["review", "--loop", "x"]);
        assert_eq!(r.code, 0, "{r:?}");
        assert!(
            !marker.exists(),
            "review ran the planted filter ({sandbox})"
        );
        // Nor the human's own git status in the worktree.
        let out = std::process::Command::new("git")
            .args(["status", "--porcelain"])
            .current_dir(p.worktree("x"))
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(
            !marker.exists(),
            "the human's git status ran it ({sandbox})"
        );
        std::fs::remove_dir_all(p.loop_dir("x")).unwrap();
        std::fs::remove_dir_all(p.worktree("x")).ok();
        std::fs::remove_dir_all(p.worktrees_dir()).ok();
    }
}

/// The `.git` redirect: the worktree's `.git` file pointed at a repository the agent
/// built (with a filter in its config and a hook). The tick commits nothing and halts;
/// the human's `review` and `discard` and their own `git status` in the worktree run
/// none of it, because `.git` names the loop's repository again.
#[test]
fn a_git_file_pointed_at_a_planted_repository_is_put_back_before_anyone_reads_it() {
    let p = Project::git();
    let tools = Project::new();
    let marker = tools.join("PWNED");
    let filter = payload(&tools, &marker);
    // Its repository inside the worktree, where it may write (a preset's state
    // directory is the other place it could build one).
    let attack = format!(
        r#"git init -q --bare .evil; git --git-dir=.evil config core.bare false; git --git-dir=.evil config filter.evil.clean '{f}'; git --git-dir=.evil config filter.evil.smudge '{f}'; git --git-dir=.evil config core.hooksPath "$PWD/.evil/hooks"; mkdir -p .evil/hooks; printf '#!/bin/sh\ntouch {m}\n' > .evil/hooks/post-checkout; chmod +x .evil/hooks/post-checkout; echo '* filter=evil' > .gitattributes; echo "gitdir: $PWD/.evil" > .git; echo x > a.txt"#,
        f = filter.display(),
        m = marker.display()
    );
    attacked_loop(&p, &tools, &attack, "off");
    let r = p.lf(&["run", "--loop", "x", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.json()["reason"],
        "human_intervention:blast_radius",
        "{r:?}"
    );
    assert!(!marker.exists(), "the tick ran the planted filter");
    let wt = p.worktree("x");
    let dotgit = std::fs::read_to_string(wt.join(".git")).unwrap();
    assert!(!dotgit.contains(".evil"), "{dotgit}");
    // The agent's last word (a process that outlived it could do it again): rewritten
    // once more after the tick, the human's review still runs nothing of it.
    std::fs::write(
        wt.join(".git"),
        format!("gitdir: {}\n", wt.join(".evil").display()),
    )
    .unwrap();
    let r = p.lf(&["review", "--loop", "x", "--patch"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!marker.exists(), "review ran the planted filter");
    let out = std::process::Command::new("git")
        .args(["status", "--porcelain"])
        .current_dir(&wt)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!marker.exists(), "the human's git status ran it");
    std::fs::write(
        wt.join(".git"),
        format!("gitdir: {}\n", wt.join(".evil").display()),
    )
    .unwrap();
    let r = p.lf(&["discard", "--loop", "x", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!marker.exists(), "discard ran the planted filter or hook");
}

/// Of the repository's objects, an agent reads only its branch's history: an `.env` the
/// user stashed (`git stash -u`), a secret staged and unstaged (a dangling blob), and the
/// checkout's `.git/config` (a CI token) are out of its reach.
#[test]
fn an_agent_reads_only_its_branchs_history() {
    if !landlock() {
        return;
    }
    let p = Project::git();
    let tools = Project::new();
    let secret = "SECRET-7f3e9a";
    p.write(".env", &format!("TOKEN={secret}-stashed\n"));
    git(p.path(), &["stash", "push", "-u", "-q"]);
    p.write("staged.txt", &format!("{secret}-dangling\n"));
    git(p.path(), &["add", "staged.txt"]);
    git(p.path(), &["reset", "-q"]);
    std::fs::remove_file(p.join("staged.txt")).unwrap();
    git(
        p.path(),
        &[
            "config",
            "http.https://github.com/.extraheader",
            &format!("AUTHORIZATION: basic {secret}-config"),
        ],
    );
    let loot = tools.join("loot");
    let attack = format!(
        r#"{{ git log --all -p; git stash list; git fsck --lost-found --unreachable; git cat-file --batch-all-objects --batch; cat .git; cat "$(sed 's/^gitdir: //' .git)/config"; git -C "$LOOPFLOW_PROJECT" stash show -p; cat "$LOOPFLOW_PROJECT/.git/config"; cat "$LOOPFLOW_PROJECT"/.git/objects/*/* ; for d in "$LOOPFLOW_PROJECT"/.git/objects/pack/*; do cat "$d"; done; }} > loot.txt 2>&1; cp loot.txt '{l}' 2>/dev/null; true"#,
        l = loot.display()
    );
    // `auto`: `enforce` would refuse to run beside the configured token at all (a loop
    // with worktrees off would read it); the kernel confines reads all the same.
    attacked_loop(&p, &tools, &attack, "auto");
    let r = p.lf(&["run", "--loop", "x", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    let seen = String::from_utf8_lossy(
        &std::fs::read(p.worktree("x").join("loot.txt")).unwrap_or_default(),
    )
    .into_owned();
    assert!(!seen.is_empty(), "the agent did not run: {r:?}");
    assert!(!seen.contains(secret), "the agent read: {seen}");
    assert!(!loot.exists(), "the agent wrote outside its worktree");
    // What it could read (its branch) it did: the attack ran.
    assert!(seen.contains("init"), "{seen}");
    // The token is named for the human, and said to be out of the tick's reach here.
    assert!(
        p.events("x").iter().any(|e| e.contains("credential: ")
            && e.contains("out of the tick's reach")
            && !e.contains(secret)),
        "{:?}",
        p.events("x")
    );
}
