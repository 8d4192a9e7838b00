//! What a tick commits is the implementer's work (DESIGN §9): what the verifier, the
//! orchestrator and `command` nodes leave in the worktree is put back and never committed,
//! nor is build output a fresh project of its language would ignore — unless the blast
//! radius allows it by name — and the commit carries the repository's own identity.

use crate::support::{LoopToml, PipelineToml, Project, git};

/// The files of `rev`'s tree in `dir`, sorted.
fn tree(dir: &std::path::Path, rev: &str) -> Vec<String> {
    let mut v: Vec<String> = git(dir, &["ls-tree", "-r", "--name-only", rev])
        .lines()
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// An agent whose implementer writes a feature and build output, whose verifier and
/// orchestrator leave files of their own and change tracked ones.
fn busy_agent(p: &Project) -> std::path::PathBuf {
    p.script(
        "agent.sh",
        r#"case "$1" in
  implement)
    mkdir -p src __pycache__ target/debug dist
    echo 'def f(): return 1' > src/feature.py
    echo bytecode > __pycache__/feature.cpython-311.pyc
    echo bytecode > src/feature.pyc
    echo binary > target/debug/app
    echo wheel > dist/pkg.whl
    [ -f junit.xml ] && cp junit.xml seen-by-implementer.xml
    ;;
  verify)
    echo notes > verify-notes.txt
    echo changed-by-verifier >> keep.txt
    rm README.md
    echo '{"pass": false, "score": 0.4}'
    ;;
  orchestrate)
    echo plan > plan.md
    ;;
esac
exit 0"#,
    )
}

fn busy_project() -> Project {
    let p = Project::git();
    p.write("keep.txt", "kept\n");
    p.commit_all("a tracked file");
    p
}

#[test]
fn only_the_implementers_work_is_committed_and_the_rest_is_put_back() {
    let p = busy_project();
    let agent = busy_agent(&p);
    p.with_loop(
        "l",
        &LoopToml::new()
            .without("worktree")
            .harness_command(&agent, &["{{role}}"]),
    );
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let files = tree(p.path(), "loopflow/l");
    assert_eq!(files, ["README.md", "keep.txt", "src/feature.py"], "{r:?}");
    assert_eq!(
        git(p.path(), &["show", "loopflow/l:keep.txt"]),
        "kept\n",
        "the verifier's change was committed"
    );
    let wt = p.worktree("l");
    // Put back: the worktree holds the implementer's work and what git ignores.
    assert_eq!(
        std::fs::read_to_string(wt.join("keep.txt")).unwrap(),
        "kept\n"
    );
    assert!(wt.join("README.md").is_file());
    assert!(!wt.join("verify-notes.txt").exists());
    assert!(!wt.join("plan.md").exists());
    assert!(wt.join("target/debug/app").is_file());
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    let warn = p
        .events("l")
        .into_iter()
        .find(|e| e.contains("left out of the commit"))
        .unwrap_or_default();
    for f in [
        "verify-notes.txt (verify)",
        "keep.txt (verify)",
        "README.md (verify)",
        "plan.md (orchestrate)",
    ] {
        assert!(warn.contains(f), "{f}: {warn}");
    }

    // A second tick: nothing the first one put back shows up as work.
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    assert_eq!(tree(p.path(), "loopflow/l"), files);
}

#[test]
fn build_output_lands_only_where_the_radius_allows_it_by_name() {
    let p = busy_project();
    let agent = busy_agent(&p);
    p.with_loop(
        "l",
        &LoopToml::new()
            .without("worktree")
            .harness_command(&agent, &["{{role}}"])
            .blast_radius(&["src/**", "dist/**", "**/*.pyc"], &[]),
    );
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let files = tree(p.path(), "loopflow/l");
    for f in ["dist/pkg.whl", "src/feature.pyc", "src/feature.py"] {
        assert!(files.contains(&f.to_string()), "{f}: {files:?}");
    }
    for f in ["target/debug/app", "__pycache__/feature.cpython-311.pyc"] {
        assert!(!files.contains(&f.to_string()), "{f}: {files:?}");
    }
}

/// A `command` node before the implementer (ci-triage's tests): the implementer can read
/// what it wrote, the commit never holds it.
#[test]
fn a_command_nodes_output_is_read_by_the_implementer_and_never_committed() {
    let p = busy_project();
    let agent = busy_agent(&p);
    let tests = p.script("tests.sh", "echo '<testsuite failures=\"1\"/>' > junit.xml");
    let pipeline = p.write(
        "tick.toml",
        &PipelineToml::named("t")
            .script("tests", &tests, &[], &[])
            .harness("implement", "implement", &["tests"])
            .git_commit("land", &["implement"])
            .commit("commit", &["land"])
            .render(),
    );
    p.with_loop(
        "l",
        &LoopToml::new()
            .without("worktree")
            .pipeline(&pipeline)
            .harness_command(&agent, &["{{role}}"])
            .roles_only(&["implement"]),
    );
    let r = p.run_json("l", &[]);
    assert_eq!(r.json()["outcome"], "tick", "{r:?}");
    let files = tree(p.path(), "loopflow/l");
    assert!(
        files.contains(&"seen-by-implementer.xml".to_string()),
        "{files:?}"
    );
    assert!(!files.contains(&"junit.xml".to_string()), "{files:?}");
    assert!(!p.worktree("l").join("junit.xml").exists());
}

/// Loop commits carry the repository's own identity (its `user.name`/`user.email`, as git
/// resolves them in the checkout); loopflow's only where none is set.
#[test]
fn loop_commits_carry_the_repositorys_identity() {
    let p = Project::git();
    p.git_cmd(&["config", "user.name", "Ada Lovelace"]);
    p.git_cmd(&["config", "user.email", "ada@example.org"]);
    let agent = p.script(
        "agent.sh",
        "[ \"$1\" = implement ] && echo x >> work.txt; echo '{\"pass\": false, \"score\": 0.1}'",
    );
    p.with_loop(
        "l",
        &LoopToml::new()
            .without("worktree")
            .harness_command(&agent, &["{{role}}"]),
    );
    p.run_json("l", &[]);
    let who = git(
        p.path(),
        &["log", "-1", "--format=%an <%ae>|%cn <%ce>", "loopflow/l"],
    );
    assert_eq!(
        who.trim(),
        "Ada Lovelace <ada@example.org>|Ada Lovelace <ada@example.org>"
    );
}
