//! What the benchmarks share: the binary under test, a loop made by `create`, copies of
//! it, the agent loop most of them tick, and the `BENCH_ROUNDS` knob.
// Each bench links this module and uses only some of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use loopflow::testing::{CreateOptions, LoopPaths, create};

/// `cargo bench` lists targets with `--list`: nothing to measure then.
pub fn listing() -> bool {
    std::env::args().any(|a| a == "--list")
}

/// Runs `cmd` (stdin and stdout null, stderr kept) and times it: the wall time and what
/// it printed on stderr with its status; each bench asserts what success means for it.
pub fn timed_run(cmd: &mut std::process::Command) -> (Duration, std::process::Output) {
    use std::process::Stdio;
    let start = std::time::Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    (start.elapsed(), out)
}

/// `BENCH_ROUNDS`, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// The loopflow under test: `LOOPFLOW_BIN`, else the binary `scripts/bench` builds on its
/// own (`target/shipped/`: with only loopflow's own dependency features, as `cargo
/// install` builds it) unless this checkout's release build is newer, else that build.
/// The latter is what `cargo bench` builds beside the benches, with the features of the
/// dev-dependencies unified in (regex's Unicode tables among them: 19,229 relocations
/// against 10,579, 301 page faults per tick against 230), so it is not quite the program
/// users run. The choice is printed, so a stale binary does not go unnoticed.
pub fn loopflow_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LOOPFLOW_BIN") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shipped = root.join("target/shipped/release/loopflow");
    let release = root.join("target/release/loopflow");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let p = match (modified(&shipped), modified(&release)) {
        (Some(s), Some(r)) if s >= r => shipped,
        (Some(_), None) => shipped,
        (_, Some(_)) => release,
        (None, None) => panic!("build it first: scripts/bench does (or cargo build --release)"),
    };
    eprintln!("loopflow under test: {}", p.display());
    p
}

/// A loop `name` in `project` as `create` makes it from the default template, worktree
/// off.
pub fn new_loop(project: &Path, name: &str) -> LoopPaths {
    create_loop(project, name, false)
}

/// [`new_loop`] with the worktree on: `project` is made a git repository with one commit
/// first, and `create` adds the loop's worktree and branch, as a user's first `create`
/// in a repository does.
pub fn new_worktree_loop(project: &Path, name: &str) -> LoopPaths {
    let git = |args: &[&str]| {
        let st = std::process::Command::new("git")
            .args([
                "-c",
                "user.name=b",
                "-c",
                "user.email=b@b",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args)
            .current_dir(project)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("git");
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(project.join("README.md"), "bench\n").expect("README");
    git(&["add", "README.md"]);
    git(&["commit", "-qm", "first"]);
    create_loop(project, name, true)
}

fn create_loop(project: &Path, name: &str, worktree: bool) -> LoopPaths {
    let o = CreateOptions {
        name,
        template: "default",
        task: Some("benchmark".into()),
        worktree,
        harness: None,
        remote: None,
        worktree_dir: None,
    };
    create(project, &o).expect("create loop")
}

/// The default tick with `true` as implement/orchestrate and a constant verdict, so a
/// tick is loopflow's own work plus three trivial spawns. `plateau` keeps the score
/// plateau brake out of the way; `sandbox` is the `[sandbox] mode`.
pub fn agent_loop_toml(plateau: u32, sandbox: &str) -> String {
    agent_loop_toml_in(plateau, sandbox, false)
}

/// [`agent_loop_toml`], with `[worktree] enabled` as given.
pub fn agent_loop_toml_in(plateau: u32, sandbox: &str, worktree: bool) -> String {
    format!(
        r#"[brakes]
max_iterations = 1000000
context_tokens = 32000
score_plateau_window = {plateau}

[harness]
command = ["true"]

[roles.implement]
prompt = "prompts/loop-implement.md"
[roles.verify]
prompt = "prompts/loop-verifier.md"
command = ["echo", "{{\"pass\": false, \"score\": 0.5}}"]
[roles.orchestrate]
prompt = "prompts/loop-orchestrate.md"

[worktree]
enabled = {worktree}

[sandbox]
mode = "{sandbox}"
"#
    )
}

/// A copy of loop directory `from` as the loop named by `to`'s last component: its files,
/// with the state file's `name` the copy's own, as `create` writes it (a tick refuses a
/// state file that names another loop).
pub fn copy_loop(from: &Path, to: &Path) {
    copy_dir(from, to);
    let name = |d: &Path| {
        d.file_name()
            .and_then(|n| n.to_str())
            .expect("loop name")
            .to_string()
    };
    let state = to.join(".state.loop");
    let text = std::fs::read_to_string(&state).expect("state");
    let (old, new) = (
        format!("\"name\": \"{}\"", name(from)),
        format!("\"name\": \"{}\"", name(to)),
    );
    assert!(
        text.contains(&old),
        "{} names no loop {}",
        state.display(),
        name(from)
    );
    std::fs::write(&state, text.replacen(&old, &new, 1)).expect("state");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let t = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            std::fs::copy(e.path(), &t).expect("copy");
        }
    }
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}
