//! Real toolchains in a loop's worktree, under the default sandbox: the worktree is a
//! fresh clone's view, so `cargo` (which walks up looking for a workspace root), pytest
//! (its rootdir and `conftest.py`) and node (its `node_modules` search) find the loop's
//! copy and nothing of the user's checkout. Each test's verifier runs the tool and grades
//! the tick by its exit code; a tool that fails shows its output in the assertion.

use std::path::{Path, PathBuf};

use crate::support::{LoopToml, Project, git, have};

/// An agent whose implementer appends to `CHANGELOG` and whose verifier runs `cmd` (a
/// shell line) in the worktree: pass when it exits 0, its output saved beside the project.
fn verifier_running(p: &Project, cmd: &str) -> PathBuf {
    p.script(
        "agent.sh",
        &format!(
            r#"case "$1" in
  implement) echo tick >> CHANGELOG ;;
  verify)
    if ( {cmd} ) > "$TMPDIR/tool.out" 2>&1; then v='{{"pass": true, "score": 1.0}}'; else v='{{"pass": false, "score": 0.0}}'; fi
    cat "$TMPDIR/tool.out" >&2
    echo "$v" ;;
esac
exit 0"#
        ),
    )
}

/// Runs one tick of a worktree loop under the default sandbox whose verifier runs `cmd`,
/// and asserts the tool passed there.
fn tool_passes_in_the_worktree(p: &Project, cmd: &str) {
    if !git(p.path(), &["status", "--porcelain"]).is_empty() {
        p.commit_all("the project");
    }
    let agent = verifier_running(p, cmd);
    p.with_loop(
        "l",
        &LoopToml::new()
            .without("worktree")
            .without("sandbox")
            .harness_command(&agent, &["{{role}}"])
            .brakes("goal_score = 1.0"),
    );
    let r = p.lf(&["run", "--loop", "l", "--json"]);
    let stderr = std::fs::read_dir(p.loop_dir("l").join("outputs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with("verify.stderr"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        r.json()["pass"],
        true,
        "`{cmd}` failed in the worktree:\n{stderr}\n{r:?}"
    );
}

fn cargo_project(p: &Project, dir: &str, name: &str) {
    p.write(
        &format!("{dir}Cargo.toml"),
        &format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n"),
    );
    p.write(
        &format!("{dir}src/lib.rs"),
        "pub fn two() -> u32 { 2 }\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn two() { assert_eq!(super::two(), 2); }\n}\n",
    );
}

#[test]
fn cargo_builds_and_tests_a_one_crate_project_in_the_worktree() {
    let p = Project::git();
    cargo_project(&p, "", "one");
    p.write(".gitignore", "/target\n");
    tool_passes_in_the_worktree(&p, "cargo build --offline -q && cargo test --offline -q");
    // Its build output stays in the worktree, never in the user's checkout.
    assert!(!p.join("target").exists());
    assert!(p.worktree("l").join("target").is_dir());
}

#[test]
fn cargo_tests_a_workspace_member_in_the_worktree() {
    let p = Project::git();
    p.write(
        "Cargo.toml",
        "[workspace]\nmembers = [\"crates/a\", \"crates/b\"]\nresolver = \"2\"\n",
    );
    cargo_project(&p, "crates/a/", "a");
    cargo_project(&p, "crates/b/", "b");
    // No .gitignore: the build output is left out of the loop's commits all the same.
    tool_passes_in_the_worktree(&p, "cd crates/a && cargo test --offline -q");
    let files = git(p.path(), &["ls-tree", "-r", "--name-only", "loopflow/l"]);
    assert!(!files.contains("target/"), "{files}");
    assert!(files.contains("CHANGELOG"), "{files}");
}

/// pytest's rootdir is the worktree and its `conftest.py` there is the one loaded (where
/// pytest is installed); `unittest` alike. Neither's bytecode is committed.
#[test]
fn python_unittest_and_pytest_find_the_worktrees_conftest() {
    let p = Project::git();
    p.write("pkg/__init__.py", "");
    p.write("pkg/mod.py", "def two():\n    return 2\n");
    p.write(
        "conftest.py",
        "import os\n\ndef pytest_configure(config):\n    open(os.path.join(os.environ['TMPDIR'], 'rootdir'), 'w').write(str(config.rootpath))\n",
    );
    p.write("pytest.ini", "[pytest]\ntestpaths = tests\n");
    p.write(
        "tests/test_mod.py",
        "import unittest\nfrom pkg.mod import two\n\nclass T(unittest.TestCase):\n    def test_two(self):\n        self.assertEqual(two(), 2)\n",
    );
    p.write("tests/__init__.py", "");
    let pytest = std::process::Command::new("python3")
        .args(["-c", "import pytest"])
        .status()
        .is_ok_and(|s| s.success());
    let cmd = if pytest {
        "python3 -m unittest -q && python3 -m pytest -q -p no:cacheprovider && [ \"$(cat \"$TMPDIR/rootdir\")\" = \"$PWD\" ]"
    } else {
        "python3 -m unittest -q"
    };
    if !pytest && std::env::var_os("LOOPFLOW_REQUIRE_VALIDATORS").is_some() {
        panic!("pytest is not installed (.ci/run installs it)");
    }
    tool_passes_in_the_worktree(&p, cmd);
    let files = git(p.path(), &["ls-tree", "-r", "--name-only", "loopflow/l"]);
    assert!(
        !files.contains("__pycache__") && !files.contains(".pyc"),
        "{files}"
    );
}

#[test]
fn node_test_runs_a_package_in_the_worktree() {
    if !have("node") {
        assert!(
            std::env::var_os("LOOPFLOW_REQUIRE_VALIDATORS").is_none(),
            "node is missing"
        );
        return;
    }
    let p = Project::git();
    p.write(
        "package.json",
        "{\"name\": \"pkg\", \"version\": \"1.0.0\", \"type\": \"commonjs\"}\n",
    );
    p.write("lib/two.js", "module.exports = () => 2;\n");
    p.write(
        "test/two.test.js",
        "const test = require('node:test');\nconst assert = require('node:assert');\nconst two = require('../lib/two');\ntest('two', () => assert.strictEqual(two(), 2));\n",
    );
    tool_passes_in_the_worktree(&p, "node --test");
}

/// loopflow's own repository (a shallow clone, as CI checks out), as a loop on it sees it:
/// cargo finds and reads its workspace in the worktree under the sandbox — where the
/// worktree inside the checkout made every cargo command fail on the checkout's own
/// manifest.
#[test]
fn cargo_resolves_loopflows_own_checkout_in_a_loops_worktree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let p = Project::new();
    std::fs::remove_dir(p.path()).unwrap();
    let out = std::process::Command::new("git")
        .args(["clone", "-q", "--no-local", "--depth", "1"])
        .arg(format!("file://{}", root.display()))
        .arg(p.path())
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    tool_passes_in_the_worktree(
        &p,
        "cargo metadata --offline --no-deps --format-version 1 > /dev/null && [ \"$(cargo locate-project --workspace --message-format plain)\" = \"$PWD/Cargo.toml\" ] && cargo verify-project --offline",
    );
}
