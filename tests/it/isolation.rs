//! Isolation with real git: per-loop worktrees (create, run there, missing → SKIP, gc),
//! loop state never in the main checkout's `git status`, the blast radius (`can-edit`)
//! and `git-commit` refusing anything outside it.

use std::path::{Path, PathBuf};

use crate::support::{LoopToml, PipelineToml, Project, Run, commit_all, cp_a, git, loopflow};

/// An agent that records its role, `{{cwd}}` and real working directory; implement runs
/// `IMPLEMENT` (a shell snippet) in the worktree, verify prints a verdict.
pub(crate) fn agent(p: &Project, implement: &str) -> PathBuf {
    p.script(
        "agent.sh",
        &format!(
            r#"role="$1"
echo "$role $2 $(pwd -P)" >> "{calls}"
case "$role" in
  implement) {implement} ;;
  verify) echo '{{"pass": false, "score": 0.5}}' ;;
esac"#,
            calls = p.join("calls.log").display()
        ),
    )
}

/// The loop.toml of a loop in a worktree of its own whose roles run `agent {{role}} {{cwd}}`.
pub(crate) fn worktree_toml(agent: &Path) -> LoopToml {
    LoopToml::new()
        .brakes("score_plateau_window = 50")
        .harness_command(agent, &["{{role}}", "{{cwd}}"])
        .without("worktree")
}

/// `cp -a` of `from`'s whole directory into a new project (what a user does to try
/// something on a second checkout).
fn copy_project(from: &Project) -> Project {
    let to = Project::new();
    cp_a(&from.path().join("."), to.path());
    to
}

/// A project copied (or moved) with its loops: a loop's worktree lives outside the
/// project, at a place derived from the project's path, so the copy has none until
/// `worktree restore` makes it one from the copy's own branch. Until then its ticks skip
/// `worktree_missing` and nothing of the copy reaches the first checkout's worktree;
/// after, both tick, each in its own.
#[test]
fn a_copied_or_moved_project_gets_worktrees_of_its_own() {
    let p = Project::git();
    let a = agent(&p, "echo change >> file.txt");
    p.with_loop_task("w", Some("t"), &worktree_toml(&a));
    assert_eq!(p.lf(&["run", "--loop", "w"]).code, 0);
    let w = p.worktree("w").canonicalize().unwrap();
    let original = |p: &Project| {
        (
            std::fs::read_to_string(w.join("file.txt")).unwrap(),
            git(&w, &["rev-parse", "HEAD"]),
            git(p.path(), &["rev-parse", "loopflow/w"]),
        )
    };
    let before = original(&p);

    let q = copy_project(&p);
    let calls = p.read("calls.log");
    let r = q.lf(&["run", "--loop", "w", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["reason"], "worktree_missing", "{r:?}");
    assert_eq!(p.read("calls.log"), calls, "an agent ran");
    let g = q.lf(&["gate", "--loop", "w"]);
    assert_eq!(g.code, 1, "{g:?}");
    assert!(g.stdout.contains("not ok (worktree_missing)"), "{g:?}");
    assert!(
        g.stdout.contains("loopflow worktree restore --loop w"),
        "{g:?}"
    );
    // The copy's human verbs work on the copy's own branch, never the first checkout's.
    let r = q.lf(&["discard", "--loop", "w", "--yes"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(original(&p), before, "the copy touched the first checkout");

    let r = q.lf(&["worktree", "restore", "--loop", "w"]);
    assert_eq!(r.code, 0, "{r:?}");
    let qw = q.worktree("w").canonicalize().unwrap();
    assert_ne!(qw, w);
    assert!(
        !qw.starts_with(q.path()) && !qw.starts_with(p.path()),
        "{}",
        qw.display()
    );
    let r = q.lf(&["run", "--loop", "w", "--json"]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let ran_in: Vec<String> = p.read("calls.log")[calls.len()..]
        .lines()
        .map(|l| l.rsplit(' ').next().unwrap().to_string())
        .collect();
    assert!(
        !ran_in.is_empty() && ran_in.iter().all(|d| Path::new(d) == qw),
        "the copy's agents ran in {ran_in:?}, not in {}",
        qw.display()
    );
    assert_eq!(
        original(&p),
        before,
        "the copy's tick touched the first checkout"
    );
    let r = p.lf(&["run", "--loop", "w", "--json"]);
    assert_eq!(
        r.json()["outcome"],
        "tick",
        "the original still ticks: {r:?}"
    );
    assert_eq!(p.state("w")["iteration_count"], 2);

    // Moved (here: the copy, renamed): the same skip, the same way out.
    let moved = Project::new();
    std::fs::remove_dir(moved.path()).unwrap();
    std::fs::rename(q.path(), moved.path()).unwrap();
    std::fs::create_dir(q.path()).unwrap();
    let r = moved.lf(&["run", "--loop", "w", "--json"]);
    assert_eq!(r.json()["reason"], "worktree_missing", "{r:?}");
    assert_eq!(moved.lf(&["worktree", "restore", "--loop", "w"]).code, 0);
    let r = moved.lf(&["run", "--loop", "w", "--json"]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
}

/// A worktree loop's directory copied to start a second loop: the copy's state and its
/// `worktree/` (whose `.git` names the first loop's record) are the first loop's. Its
/// ticks are refused, and the fresh start the refusal describes gives the copy a
/// worktree and branch of its own, the first loop's untouched.
#[test]
fn a_copied_worktree_loop_starts_fresh_in_a_worktree_of_its_own() {
    let p = Project::git();
    let a = agent(&p, "echo change >> file.txt");
    p.with_loop_task("w", Some("t"), &worktree_toml(&a));
    cp_a(&p.loop_dir("w"), &p.loop_dir("c"));
    let before = git(&p.worktree("w"), &["rev-parse", "HEAD"]);
    let r = p.lf(&["run", "--loop", "c"]);
    assert_eq!(r.code, 4, "{r:?}");
    assert!(r.stderr.contains("start `c` fresh"), "{r:?}");
    assert!(!p.join("calls.log").exists(), "an agent ran");

    for f in [".state.loop", ".state.log"] {
        std::fs::remove_file(p.loop_dir("c").join(f)).unwrap();
    }
    let r = p.lf(&["create", "--loop", "c", "--task", "its own"]);
    assert_eq!(r.code, 0, "{r:?}");
    let r = p.lf(&["run", "--loop", "c", "--json"]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let c = p.worktree("c").canonicalize().unwrap();
    let calls = p.read("calls.log");
    assert!(
        !calls.is_empty() && calls.lines().all(|l| l.ends_with(&c.display().to_string())),
        "{calls}"
    );
    assert_eq!(
        git(&c, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "loopflow/c"
    );
    assert_eq!(git(&p.worktree("w"), &["rev-parse", "HEAD"]), before);
    assert_ne!(c, p.worktree("w").canonicalize().unwrap());
    assert_eq!(
        p.lf(&["run", "--loop", "w", "--json"]).json()["outcome"],
        "tick"
    );
}

#[test]
fn create_makes_a_worktree_the_agent_runs_there_and_a_missing_one_skips() {
    let p = Project::git();
    let a = agent(&p, "echo change >> file.txt");
    p.with_loop_task("w", Some("t"), &worktree_toml(&a));
    let w = p.worktree("w");
    assert_eq!(
        git(&w, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "loopflow/w"
    );
    // Outside the project, so nothing that searches parent directories finds it; a
    // repository of its own, not one of the checkout's linked worktrees.
    assert!(
        !w.canonicalize()
            .unwrap()
            .starts_with(p.path().canonicalize().unwrap())
    );
    let list = p.git_cmd(&["worktree", "list", "--porcelain"]);
    assert!(!list.contains("loopflow/w"), "{list}");
    assert!(
        p.git_cmd(&["branch", "--list", "loopflow/w"])
            .contains("loopflow/w")
    );

    let r = p.lf(&["run", "--loop", "w"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(p.state("w")["iteration_count"], 1);
    let real = w.canonicalize().unwrap();
    let calls = p.read("calls.log");
    for line in calls.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(
            Path::new(parts[2]),
            real,
            "agent ran outside its worktree: {calls}"
        );
        assert_eq!(
            Path::new(parts[1]).canonicalize().unwrap(),
            real,
            "{{{{cwd}}}}: {calls}"
        );
    }
    assert!(w.join("file.txt").is_file());
    assert!(
        !p.join("file.txt").exists(),
        "the main checkout was touched"
    );

    // Loop state and the worktree never show in the main checkout's git status; only
    // the loop's configuration (loop.toml, prompts, .gitignore) and the editor schemas
    // do.
    let status = p.git_cmd(&["status", "--porcelain", "--untracked-files=all"]);
    for line in status.lines() {
        let path = &line[3..];
        assert!(
            path.ends_with("loop.toml")
                || path.ends_with(".md")
                || path.ends_with(".gitignore")
                || path.starts_with(".loopflow/schemas/")
                || path == "agent.sh"
                || path == "calls.log",
            "loop state in git status: {status}"
        );
    }
    assert!(status.contains(".loopflow/loops/w/loop.toml"), "{status}");

    // The worktree disappears: the next tick skips with a warning and never runs in the
    // main checkout.
    std::fs::remove_dir_all(&w).unwrap();
    let before = p.read("calls.log");
    let r = p.lf(&["run", "--loop", "w", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "skip");
    assert_eq!(r.json()["reason"], "worktree_missing");
    let ev = p.events("w");
    assert_eq!(ev.last().unwrap(), "SKIP reason=worktree_missing", "{ev:?}");
    assert!(
        ev[ev.len() - 2].starts_with("WARN ") && ev[ev.len() - 2].contains("worktree missing"),
        "{ev:?}"
    );
    assert_eq!(p.read("calls.log"), before, "the agent ran");
    assert!(!p.join("file.txt").exists());
    assert_eq!(p.state("w")["iteration_count"], 1);
}

#[test]
fn worktree_gc_prunes_deleted_and_idle_loops_but_never_uncommitted_work() {
    let p = Project::git();
    for n in ["gone", "idle", "fresh", "dirty"] {
        let r = p.lf(&["create", "--loop", n, "--task", "t"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    // `gone`: the whole loop dir (and so its worktree dir) deleted by hand.
    std::fs::remove_dir_all(p.loop_dir("gone")).unwrap();
    // `idle`: last ticked long ago, with a commit on its branch (not merged).
    let st = p.loop_dir("idle").join(".state.loop");
    let mut s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&st).unwrap()).unwrap();
    s["last_tick_at"] = "2020-01-01T00:00:00Z".into();
    std::fs::write(&st, serde_json::to_string_pretty(&s).unwrap()).unwrap();
    // (committed in the loop's repository, which a tick publishes to the project's)
    std::fs::write(p.worktree("idle").join("new.txt"), "x").unwrap();
    commit_all(&p.worktree("idle"), "work");
    let tip = git(&p.worktree("idle"), &["rev-parse", "HEAD"]);
    p.git_cmd(&[
        "fetch",
        "-q",
        &p.loop_git_dir("idle").display().to_string(),
        "loopflow/idle:loopflow/idle",
    ]);
    assert_eq!(p.git_cmd(&["rev-parse", "loopflow/idle"]), tip);
    // `dirty`: loop deleted (no state), but its worktree has uncommitted changes.
    std::fs::remove_file(p.loop_dir("dirty").join(".state.loop")).unwrap();
    std::fs::write(p.worktree("dirty").join("wip.txt"), "unsaved").unwrap();

    // A live idle loop keeps its worktree unless asked: without it, it would only skip.
    let r = p.lf(&["worktree", "gc", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("kept worktree") && r.stdout.contains("pass --include-idle"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("would delete branch loopflow/gone"),
        "{r:?}"
    );
    assert!(p.worktree("idle").exists());

    let r = p.lf(&["worktree", "gc", "--include-idle", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("would remove worktree") && r.stdout.contains("loop idle, idle"),
        "{r:?}"
    );
    assert!(p.worktree("idle").exists(), "dry run changed something");

    let r = p.lf(&["worktree", "gc", "--include-idle", "--max-age", "14d"]);
    assert_eq!(r.code, 0, "{r:?}");
    let out = &r.stdout;
    assert!(out.contains("deleted branch loopflow/gone"), "{out}");
    assert!(
        out.contains("kept worktree") && out.contains("loop dirty") && out.contains("uncommitted"),
        "{out}"
    );
    assert!(out.contains("kept branch loopflow/idle"), "{out}");
    assert!(!p.worktree("idle").exists());
    assert!(p.worktree("fresh").exists() && p.worktree("dirty").join("wip.txt").exists());
    let branches = p.git_cmd(&[
        "for-each-ref",
        "--format=%(refname:short)",
        "refs/heads/loopflow/",
    ]);
    assert!(
        !branches.contains("loopflow/gone") && branches.contains("loopflow/idle"),
        "{branches}"
    );
    assert!(
        p.events("idle")
            .iter()
            .any(|e| e.starts_with("WORKTREE removed="))
    );
    // The idle loop's next tick skips instead of running in the main checkout.
    let r = p.lf(&["run", "--loop", "idle", "--json"]);
    assert_eq!(r.json()["reason"], "worktree_missing", "{r:?}");

    let r = p.lf(&["worktree", "gc", "--max-age", "two weeks"]);
    assert_eq!(r.code, 2, "{r:?}");
    assert!(r.stderr.contains("use e.g. 14d"), "{r:?}");

    let r = p.lf(&["worktree", "gc", "--include-idle", "--force"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!p.worktree("dirty").exists(), "{r:?}");
    let branches = p.git_cmd(&[
        "for-each-ref",
        "--format=%(refname:short)",
        "refs/heads/loopflow/",
    ]);
    assert_eq!(branches.trim(), "loopflow/fresh", "{r:?}");
    assert!(p.worktree("fresh").exists());
}

/// `loopflow can-edit` run from `cwd`.
fn can_edit(p: &Project, cwd: &Path, paths: &[&str]) -> Run {
    Run::of(
        p.lf_cmd(&["can-edit", "--loop", "r"])
            .args(paths)
            .current_dir(cwd),
    )
}

#[test]
fn can_edit_resolves_dotdot_absolute_and_symlinks_and_deny_beats_allow() {
    let p = Project::git();
    let a = agent(&p, "true");
    p.with_loop_task(
        "r",
        Some("t"),
        &worktree_toml(&a).blast_radius(
            &["src/**", "tests/**", ".git/**", ".loopflow/**"],
            &["src/secret/**"],
        ),
    );
    let w = p.worktree("r");
    std::fs::create_dir_all(w.join("src")).unwrap();
    std::os::unix::fs::symlink("/etc", w.join("src/etc")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", w.join("src/passwd")).unwrap();
    std::os::unix::fs::symlink("lib.rs", w.join("src/inside")).unwrap();

    let ok = |paths: &[&str]| {
        let r = can_edit(&p, &w, paths);
        assert_eq!(r.code, 0, "{paths:?}: {r:?}");
    };
    ok(&["src/lib.rs", "tests/t.rs", "src/new/dir/x.rs"]);
    ok(&["src/../src/lib.rs", "./tests/../src/a.rs"]);
    ok(&[&w.join("src/lib.rs").display().to_string()]);
    ok(&["src/inside"]);
    // Relative paths resolve against the current directory.
    let r = can_edit(&p, &w.join("src"), &["lib.rs", "../tests/x.rs"]);
    assert_eq!(r.code, 0, "{r:?}");

    let refused = |paths: &[&str], why: &str| {
        let r = can_edit(&p, &w, paths);
        assert_eq!(r.code, 1, "{paths:?}: {r:?}");
        for path in paths {
            assert!(
                r.stdout.contains(&format!("refused: {path}: ")),
                "{path} not named: {r:?}"
            );
        }
        assert!(r.stdout.contains(why), "{paths:?}: want {why:?}: {r:?}");
    };
    refused(&["src/../../../../README.md"], "outside the loop's root");
    refused(&["/etc/passwd"], "outside the loop's root");
    refused(&["src/etc/passwd"], "resolves to /etc/passwd");
    refused(&["src/passwd"], "resolves to /etc/passwd");
    // `..` after a symlink climbs from the link's target, as the OS does.
    refused(&["src/etc/../tmp/x"], "resolves to /tmp/x");
    // Writing through a dangling symlink creates its target outside.
    std::os::unix::fs::symlink("/nonexistent-dir/new", w.join("src/dangling")).unwrap();
    refused(&["src/dangling"], "resolves to /nonexistent-dir/new");
    refused(&["README.md"], "matches no allow glob");
    refused(&["src/secret/key.rs"], "matches a deny glob");
    refused(
        &["src/../src/secret/key.rs"],
        "`src/secret/key.rs` matches a deny glob",
    );
    // Always refused, even when an allow glob names them.
    refused(&[".git"], "deny");
    refused(&[".git/config"], "deny");
    refused(&[".loopflow/loops/x/.state.loop"], "deny");
    refused(&["src/sub/.git/config"], "deny");
    refused(&[".GIT/config"], "deny");
    // The main checkout is outside the loop's worktree.
    refused(
        &[&p.join("src/lib.rs").display().to_string()],
        "outside the loop's root",
    );

    // One bad path among good ones: exit 1, only the bad one named.
    let r = can_edit(&p, &w, &["src/ok.rs", "README.md", "tests/ok.rs"]);
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(r.stdout.lines().count(), 1, "{r:?}");
    assert!(r.stdout.starts_with("refused: README.md: "), "{r:?}");
}

pub(crate) fn commits(dir: &Path, rev: &str) -> usize {
    git(dir, &["rev-list", "--count", rev])
        .trim()
        .parse()
        .unwrap()
}

pub(crate) fn git_commit_project(implement: &str) -> (Project, PathBuf) {
    let p = Project::git();
    let pipe = p.write(
        "pipelines/git.toml",
        &PipelineToml::tick_with_git().render(),
    );
    let a = agent(&p, implement);
    p.with_loop_task(
        "g",
        Some("t"),
        &worktree_toml(&a)
            .blast_radius(&["src/**", "**/*.md"], &["src/secret/**"])
            .pipeline(&pipe),
    );
    let check = p.lf(&["check", &pipe.display().to_string()]);
    assert_eq!(check.code, 0, "{check:?}");
    let w = p.worktree("g");
    (p, w)
}

#[test]
fn git_commit_commits_a_good_change_on_the_loop_branch() {
    let (p, w) = git_commit_project("mkdir -p src && echo 'fn main() {}' > src/main.rs");
    let r = p.lf(&["run", "--loop", "g", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(commits(p.path(), "loopflow/g"), 2);
    assert_eq!(commits(p.path(), "main"), 1, "the main branch moved");
    // A repository without an identity of its own: loopflow's.
    let log = git(&w, &["log", "-1", "--format=%s%n%an", "--name-only"]);
    assert!(
        log.starts_with("loopflow g: iteration 1\nloopflow\n"),
        "{log}"
    );
    // The same commit, by the same id, on the loop's branch of the user's repository.
    assert_eq!(
        git(&w, &["rev-parse", "HEAD"]),
        git(p.path(), &["rev-parse", "loopflow/g"])
    );
    assert!(log.contains("src/main.rs"), "{log}");
    assert!(git(&w, &["status", "--porcelain"]).is_empty());
}

fn assert_refused(implement: &str, named: &str) {
    let (p, w) = git_commit_project(implement);
    let r = p.lf(&["run", "--loop", "g", "--json"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.json()["outcome"], "halt", "{r:?}");
    assert_eq!(
        r.json()["reason"],
        "human_intervention:blast_radius",
        "{r:?}"
    );
    let s = p.state("g");
    assert_eq!(s["halt"]["reason"], "human_intervention:blast_radius");
    // git-commit runs after `commit`: the iteration was spent, the change is held back.
    assert_eq!(s["iteration_count"], 1);
    let detail = s["halt"]["detail"].as_str().unwrap();
    assert!(detail.contains(named), "{detail}");
    assert!(
        p.events("g")
            .iter()
            .any(|e| e.starts_with("HALT human_intervention:blast_radius")),
        "{:?}",
        p.events("g")
    );
    // Nothing committed, nothing staged: the change waits for a human.
    assert_eq!(commits(p.path(), "loopflow/g"), 1);
    assert!(!git(&w, &["status", "--porcelain"]).is_empty());
    assert!(git(&w, &["diff", "--cached", "--name-only"]).is_empty());
    // The halt stands: the next tick skips.
    let r = p.lf(&["run", "--loop", "g", "--json"]);
    assert_eq!(
        r.json()["reason"],
        "halted:human_intervention:blast_radius",
        "{r:?}"
    );
}

#[test]
fn git_commit_refuses_a_denied_path() {
    assert_refused(
        "mkdir -p src/secret && echo ok > src/ok.rs && echo k > src/secret/key.rs",
        "src/secret/key.rs",
    );
}

#[test]
fn git_commit_refuses_a_path_outside_the_allow_globs() {
    assert_refused("echo x > build.sh", "build.sh");
}

#[test]
fn git_commit_refuses_a_symlink_pointing_outside() {
    assert_refused(
        "mkdir -p src && ln -s /etc/passwd src/passwd",
        "src/passwd: ",
    );
    let (p, _) = git_commit_project("mkdir -p src && ln -s /etc/passwd src/passwd");
    p.lf(&["run", "--loop", "g"]);
    let detail = p.state("g")["halt"]["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("/etc/passwd"), "{detail}");
}

#[test]
fn git_commit_refuses_a_nested_repository() {
    assert_refused(
        "mkdir -p src/sub && git -C src/sub init -q && echo x > src/sub/f",
        "is a nested git repository",
    );
}

#[test]
fn git_commit_refuses_a_rename_out_of_the_radius() {
    // A tracked allowed file moved (and staged) to a denied place.
    let (p, w) = git_commit_project("true");
    std::fs::create_dir_all(w.join("src")).unwrap();
    std::fs::write(w.join("src/a.rs"), "a").unwrap();
    commit_all(&w, "a");
    std::fs::create_dir_all(w.join("src/secret")).unwrap();
    git(&w, &["mv", "src/a.rs", "src/secret/a.rs"]);
    let r = p.lf(&["run", "--loop", "g", "--json"]);
    assert_eq!(
        r.json()["reason"],
        "human_intervention:blast_radius",
        "{r:?}"
    );
    assert!(
        p.state("g")["halt"]["detail"]
            .as_str()
            .unwrap()
            .contains("src/secret/a.rs")
    );
    assert_eq!(commits(p.path(), "loopflow/g"), 2);
}

#[test]
fn a_loop_created_with_a_relative_project_ticks_from_any_directory() {
    // Schedulers start ticks elsewhere (cron in $HOME): the worktree must still be found.
    let p = Project::git();
    let r = Run::of(
        loopflow(p.path())
            .args(["create", "--loop", "rel", "--task", "t"])
            .env("XDG_STATE_HOME", p.state_home.path()),
    );
    assert_eq!(r.code, 0, "{r:?}");
    let stored = p.state("rel")["worktree_path"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(Path::new(&stored).is_absolute(), "{stored}");
    let gate_from_root = || {
        let r = Run::of(
            p.lf_cmd(&["gate", "--loop", "rel", "--json"])
                .current_dir("/"),
        );
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let wt = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "worktree")
            .unwrap()
            .clone();
        assert_eq!(wt["ok"], true, "{v}");
    };
    gate_from_root();
    // The state's path is where the worktree was made, for people: the tick finds it
    // from the project, whatever the state says.
    let st = p.loop_dir("rel").join(".state.loop");
    let text = std::fs::read_to_string(&st).unwrap();
    std::fs::write(&st, text.replace(&stored, "./elsewhere")).unwrap();
    gate_from_root();
}
