//! How people get loopflow (issue 25): the crates.io package, the release archives
//! (scripts/release-archive, .github/workflows/release.yml), the GitHub Action
//! (action.yml with scripts/action-install and scripts/action-run) and the pre-commit
//! hook (.pre-commit-hooks.yaml). Each file is judged by the tool its users' platform
//! judges it with (actionlint with shellcheck, SchemaStore's schema through
//! check-jsonschema, pre-commit), and the scripts run for real on this machine.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{Project, bin, have};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const REPOSITORY: &str = env!("CARGO_PKG_REPOSITORY");

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(cmd: &mut Command) -> Output {
    let o = cmd.output().expect("spawn");
    assert!(o.status.success(), "{cmd:?}: {}", text(&o));
    o
}

/// The repository's own workflows, release.yml among them, as GitHub would run them.
#[test]
fn the_repository_workflows_pass_actionlint_with_shellcheck() {
    if !have("actionlint") || !have("shellcheck") {
        return;
    }
    let dir = root().join(".github/workflows");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("workflows")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("release.yml")),
        "{files:?}"
    );
    ok(Command::new("actionlint").args(&files));
    // The control: actionlint runs shellcheck on run: scripts here.
    let bad = tempfile::tempdir().unwrap();
    let f = bad.path().join("bad.yml");
    std::fs::write(
        &f,
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo $1\n",
    )
    .unwrap();
    let o = Command::new("actionlint").arg(&f).output().unwrap();
    assert!(
        !o.status.success() && text(&o).contains("shellcheck"),
        "{}",
        text(&o)
    );
}

/// release.yml builds exactly the targets binstall and the Action fetch, through the
/// script that names the archives.
#[test]
fn the_release_builds_the_targets_binstall_and_the_action_fetch() {
    let wf = std::fs::read_to_string(root().join(".github/workflows/release.yml")).unwrap();
    let action = std::fs::read_to_string(root().join("scripts/action-install")).unwrap();
    for t in [
        "x86_64-unknown-linux-musl",
        "aarch64-unknown-linux-musl",
        "x86_64-apple-darwin",
        "aarch64-apple-darwin",
    ] {
        assert!(wf.contains(&format!("- target: {t}\n")), "{t}");
        assert!(action.contains(&format!(") target={t} ;;")), "{t}");
    }
    assert!(wf.contains("run: scripts/release-archive \"$TARGET\" dist"));
    let cargo = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(cargo.contains(
        "pkg-url = \"{ repo }/releases/download/v{ version }/loopflow-{ version }-{ target }.tar.gz\""
    ));
    assert!(cargo.contains("bin-dir = \"loopflow-{ version }-{ target }/{ bin }{ binary-ext }\""));
}

/// action.yml is a valid Action (SchemaStore's schema, as GitHub's editor checks it), names
/// this version and repository, and its scripts are shellcheck-clean.
#[test]
fn the_action_validates_and_names_this_version() {
    let action = std::fs::read_to_string(root().join("action.yml")).unwrap();
    assert!(
        action.contains(&format!(
            "  version:\n    description: The loopflow version to install; by default this Action's own.\n    required: false\n    default: \"{VERSION}\"\n"
        )),
        "action.yml's default version is not Cargo.toml's {VERSION}"
    );
    assert!(
        action.contains(&format!("LOOPFLOW_REPOSITORY: {REPOSITORY}\n")),
        "action.yml's repository is not Cargo.toml's {REPOSITORY}"
    );
    if have("check-jsonschema") {
        ok(Command::new("check-jsonschema")
            .args(["--builtin-schema", "vendor.github-actions"])
            .arg(root().join("action.yml")));
        // The control: a misspelt key is refused.
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("action.yml");
        std::fs::write(&bad, action.replace("runs:\n", "run:\n")).unwrap();
        let o = Command::new("check-jsonschema")
            .args(["--builtin-schema", "vendor.github-actions"])
            .arg(&bad)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{}", text(&o));
    }
    if have("shellcheck") {
        ok(Command::new("shellcheck").current_dir(root()).args([
            "scripts/action-install",
            "scripts/action-run",
            "scripts/release-archive",
        ]));
    }
}

/// The runner's `RUNNER_ARCH` for this machine.
fn runner_arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "ARM64",
        _ => "X64",
    }
}

/// scripts/release-archive archives a binary as the release does, and the Action's install
/// step takes it from a release directory, checks its SHA-256, puts it on the job's PATH,
/// and refuses a tampered archive.
#[test]
fn the_action_installs_a_release_archive_and_refuses_a_tampered_one() {
    if std::env::consts::OS != "linux" {
        return;
    }
    let target = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let release = tempfile::tempdir().unwrap();
    // The test's own build under the release's name: what is tested is the naming,
    // the checksum file and the unpacking, not a musl build (.ci/run builds the host's).
    let o = ok(Command::new(root().join("scripts/release-archive"))
        .arg(&target)
        .arg(release.path())
        .env("LOOPFLOW_BIN", bin()));
    let name = format!("loopflow-{VERSION}-{target}");
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("{name}.tar.gz")));
    let sum =
        std::fs::read_to_string(release.path().join(format!("{name}.tar.gz.sha256"))).unwrap();
    assert_eq!(
        sum.len(),
        64 + 2 + name.len() + ".tar.gz\n".len(),
        "{sum:?}"
    );

    let install = |runner: &Path| {
        let github_path = runner.join("github_path");
        let github_output = runner.join("github_output");
        let o = Command::new(root().join("scripts/action-install"))
            .env("LOOPFLOW_VERSION", VERSION)
            .env("LOOPFLOW_REPOSITORY", REPOSITORY)
            .env(
                "LOOPFLOW_RELEASE_BASE",
                format!("file://{}", release.path().display()),
            )
            .env("RUNNER_OS", "Linux")
            .env("RUNNER_ARCH", runner_arch())
            .env("RUNNER_TEMP", runner)
            .env("GITHUB_PATH", &github_path)
            .env("GITHUB_OUTPUT", &github_output)
            // No source build: a failed download must not fall back silently here.
            .env("GITHUB_ACTION_PATH", runner.join("no-source"))
            .output()
            .unwrap();
        (o, github_path, github_output)
    };
    let runner = tempfile::tempdir().unwrap();
    let (o, github_path, github_output) = install(runner.path());
    assert!(o.status.success(), "{}", text(&o));
    let dir = std::fs::read_to_string(&github_path).unwrap();
    let dir = Path::new(dir.trim());
    assert_eq!(
        std::fs::read_to_string(&github_output).unwrap(),
        format!("path={}\n", dir.display())
    );
    let v = ok(Command::new(dir.join("loopflow")).arg("--version"));
    assert_eq!(
        String::from_utf8_lossy(&v.stdout),
        format!("loopflow {VERSION}\n")
    );

    // One byte changed in the published archive: the step fails and installs nothing.
    let archive = release.path().join(format!("{name}.tar.gz"));
    let mut bytes = std::fs::read(&archive).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&archive, bytes).unwrap();
    let runner = tempfile::tempdir().unwrap();
    let (o, github_path, _) = install(runner.path());
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("does not match its published SHA-256"),
        "{}",
        text(&o)
    );
    assert!(!github_path.exists());
    assert!(
        !runner
            .path()
            .join(format!("loopflow-{VERSION}/bin/loopflow"))
            .exists()
    );
}

/// The Action's run step: `check` annotates (exit 3 on a broken loop), `run` needs a loop.
#[test]
fn the_action_runs_check_with_annotations_and_refuses_run_without_a_loop() {
    let p = Project::git();
    p.write(
        ".loopflow/loops/x/loop.toml",
        "[brakes]\nmax_iteration = 10\n",
    );
    let tools = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(bin(), tools.path().join("loopflow")).unwrap();
    let path = format!(
        "{}:{}",
        tools.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = |vars: &[(&str, &str)]| {
        let mut c = Command::new(root().join("scripts/action-run"));
        c.current_dir(p.path())
            .env("PATH", &path)
            .env_remove("LOOPFLOW_PROJECT");
        for (k, v) in vars {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let o = run(&[
        ("INPUT_COMMAND", "check"),
        ("INPUT_LOOP", "x"),
        ("INPUT_SARIF", "out/check.sarif"),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    // The SARIF file for code scanning, beside the annotations.
    std::fs::create_dir_all(p.join("out")).unwrap();
    let o2 = run(&[
        ("INPUT_COMMAND", "check"),
        ("INPUT_LOOP", "x"),
        ("INPUT_SARIF", "out/check.sarif"),
    ]);
    assert_eq!(o2.status.code(), Some(3), "{}", text(&o2));
    let sarif: serde_json::Value =
        serde_json::from_str(&p.read("out/check.sarif")).expect("SARIF is JSON");
    let rules: Vec<&str> = sarif["runs"][0]["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter_map(|r| r["ruleId"].as_str())
        .collect();
    assert!(rules.contains(&"unknown-key"), "{sarif}");
    assert!(
        text(&o).contains("::error file=.loopflow/loops/x/loop.toml,line=2")
            && text(&o).contains("max_iteration"),
        "{}",
        text(&o)
    );
    // Extra arguments, one per line, replace the default format.
    let o = run(&[
        ("INPUT_COMMAND", "check"),
        ("INPUT_ARGS", "--format\njson\n"),
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert!(
        doc["diagnostics"]
            .as_array()
            .expect("diagnostics")
            .iter()
            .any(|d| d["code"] == "unknown-key"),
        "{doc}"
    );
    let o = run(&[("INPUT_COMMAND", "run")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("needs the input 'loop'"), "{}", text(&o));
    let o = run(&[("INPUT_COMMAND", "land")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn the_pre_commit_manifest_validates() {
    if !have("pre-commit") {
        return;
    }
    ok(Command::new("pre-commit")
        .current_dir(root())
        .args(["validate-manifest", ".pre-commit-hooks.yaml"]));
}

/// The hook for real: pre-commit builds this checkout with cargo (`language: rust`) and
/// runs it on a project whose loop config is broken; the commit is refused with the
/// diagnostic. A release build takes minutes, so `cargo test` leaves it out and .ci/run
/// runs it on its own (`cargo test --test it -- --ignored distribution::`).
#[test]
#[ignore = "builds loopflow with cargo install (minutes); .ci/run runs it"]
fn pre_commit_try_repo_fails_on_a_broken_loop_config() {
    if !have("pre-commit") || !have("git") {
        return;
    }
    let p = Project::git();
    let r = p.lf(&["create", "--loop", "x", "--task", "t", "--no-worktree"]);
    assert_eq!(r.code, 0, "{r:?}");
    let good = p.read(".loopflow/loops/x/loop.toml");
    assert!(good.contains("max_iterations = "), "{good}");
    p.write(
        ".loopflow/loops/x/loop.toml",
        &good.replace("max_iterations = ", "max_iteration = "),
    );
    p.commit_all("broken loop");
    // pre-commit reads the hook from this checkout's committed tree plus what is staged
    // or changed in tracked files. Its `cargo install` builds in target/ci-release for
    // the host triple, where .ci/run's scripts/release-archive built the same crates.
    let host = String::from_utf8(ok(Command::new("rustc").arg("-vV")).stdout)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc host");
    let try_repo = || {
        Command::new("pre-commit")
            .current_dir(p.path())
            .args(["try-repo"])
            .arg(root())
            .args(["loopflow-check", "--all-files", "--color", "never"])
            .env("CARGO_TARGET_DIR", root().join("target/ci-release"))
            .env("CARGO_BUILD_TARGET", &host)
            .env_remove("LOOPFLOW_PROJECT")
            .output()
            .unwrap()
    };
    let o = try_repo();
    let out = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("loopflow check") && out.contains("Failed"),
        "{out}"
    );
    assert!(
        out.contains("error[unknown-key]") && out.contains("max_iteration"),
        "{out}"
    );
    // Fixed, the same hook passes.
    p.write(".loopflow/loops/x/loop.toml", &good);
    p.commit_all("fixed");
    let o = try_repo();
    assert!(o.status.success(), "{}", text(&o));
}
