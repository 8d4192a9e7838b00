//! Shared test support: a temp project, the real `loopflow` binary, fake-agent scripts,
//! builders for the TOML they read ([`LoopToml`], [`PipelineToml`]), and waiting on
//! processes and files. Every test drives the built executable with real child processes
//! and real files.

pub mod api;
pub mod remote;
pub mod runas;
pub mod toml;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use self::toml::{LoopToml, PipelineToml, array};

/// Generous: the machine may be loaded. Never a timing assertion, only a give-up point.
pub const PATIENCE: Duration = Duration::from_secs(120);

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_loopflow"))
}

/// Where loop worktrees go for a `loopflow` run outside any [`Project`] (one directory
/// for this test binary, outside every project).
fn shared_state_home() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("loopflow-it-state.")
            .tempdir()
            .expect("state home")
            .keep()
    })
}

/// Whether a variable of the developer's shell would change what loopflow does: its own
/// settings, telemetry, trace context, and the XDG directories (where worktrees, the
/// projects registry and usage limits live).
fn scrubbed(key: &std::ffi::OsStr) -> bool {
    let k = key.to_string_lossy();
    ["LOOPFLOW_", "OTEL_", "XDG_"]
        .iter()
        .any(|p| k.starts_with(p))
        || k == "TRACEPARENT"
        || k == "TRACESTATE"
        || k == "CLICOLOR_FORCE"
}

/// The `loopflow` binary as a command run from `cwd`, without colour and with none of the
/// developer's environment that would steer it ([`scrubbed`]): worktrees go to a
/// directory of the test binary's own.
pub fn loopflow(cwd: &Path) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(cwd).env("NO_COLOR", "1");
    for (k, _) in std::env::vars_os() {
        if scrubbed(&k) {
            c.env_remove(k);
        }
    }
    c.env("XDG_STATE_HOME", shared_state_home());
    hermetic_git(&mut c);
    c
}

/// Git as a fresh machine has it: no configuration of the developer's (their identity,
/// aliases, hooks path, `init.defaultBranch`) reaches a test's git or loopflow's.
pub fn hermetic_git(c: &mut Command) -> &mut Command {
    c.env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
}

/// A throw-away project directory, and beside it (never inside) the directory its loop
/// worktrees go to (`XDG_STATE_HOME` of every `loopflow` it runs).
pub struct Project {
    pub dir: tempfile::TempDir,
    pub state_home: tempfile::TempDir,
}

/// The result of one `loopflow` invocation.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    /// Runs `c` to the end.
    pub fn of(c: &mut Command) -> Run {
        Run::from(c.output().expect("spawn loopflow"))
    }

    /// The last stdout line parsed as JSON (`--json` summaries).
    pub fn json(&self) -> Value {
        let line = self.stdout.lines().last().unwrap_or("");
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {}", self.stdout))
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

impl Default for Project {
    fn default() -> Self {
        Self::new()
    }
}

impl Project {
    pub fn new() -> Project {
        Project {
            dir: tempfile::tempdir().expect("tempdir"),
            state_home: tempfile::tempdir().expect("tempdir"),
        }
    }

    /// A project that is a git repository with one commit (for worktrees).
    pub fn git() -> Project {
        let p = Project::new();
        p.git_cmd(&["init", "-q", "-b", "main"]);
        p.write("README.md", "# test project\n");
        p.commit_all("init");
        p
    }

    /// `git ARGS` in the project; panics unless it succeeds.
    pub fn git_cmd(&self, args: &[&str]) -> String {
        git(self.path(), args)
    }

    /// Stages everything in the project and commits it.
    pub fn commit_all(&self, msg: &str) {
        commit_all(self.path(), msg);
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.path().join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
        p
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.join(rel)).unwrap_or_default()
    }

    /// Writes an executable script (a fake agent). `body` is a POSIX sh script body.
    pub fn script(&self, rel: &str, body: &str) -> PathBuf {
        let p = self.write(rel, &format!("#!/bin/sh\n{body}\n"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        p
    }

    /// Runs `loopflow --project <dir> ARGS` from the project directory.
    pub fn lf(&self, args: &[&str]) -> Run {
        Run::of(&mut self.lf_cmd(args))
    }

    pub fn lf_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        Run::of(self.lf_cmd(args).envs(env.iter().copied()))
    }

    /// `loopflow --project <dir> ARGS` as a command to spawn in the background.
    pub fn lf_cmd(&self, args: &[&str]) -> Command {
        let mut c = loopflow(self.path());
        c.env("XDG_STATE_HOME", self.state_home.path())
            .arg("--project")
            .arg(self.path())
            .args(args);
        c
    }

    /// `loopflow --project <dir> ARGS` started in the background, its output discarded.
    pub fn lf_spawn(&self, args: &[&str]) -> Child {
        self.lf_cmd(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn loopflow")
    }

    /// `WRAPPER… loopflow --project <dir> ARGS`: the binary run under `timeout`,
    /// `prlimit`, …, with the environment of [`Project::lf_cmd`].
    pub fn lf_cmd_via(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let inner = self.lf_cmd(args);
        let mut c = Command::new(wrapper[0]);
        c.args(&wrapper[1..])
            .arg(inner.get_program())
            .args(inner.get_args())
            .current_dir(self.path());
        for (k, v) in inner.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    /// `loopflow run --loop NAME --json EXTRA…`, which must exit 0.
    pub fn run_json(&self, name: &str, extra: &[&str]) -> Run {
        let mut args = vec!["run", "--loop", name, "--json"];
        args.extend(extra);
        let r = self.lf(&args);
        assert_eq!(r.code, 0, "{r:?}");
        r
    }

    pub fn loop_dir(&self, name: &str) -> PathBuf {
        self.join(&format!(".loopflow/loops/{name}"))
    }

    /// The worktree a loop works in: where its state says loopflow made it (outside the
    /// project, under [`Project::state_home`]).
    pub fn worktree(&self, name: &str) -> PathBuf {
        let recorded = std::fs::read_to_string(self.loop_dir(name).join(".state.loop"))
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .and_then(|s| s["worktree_path"].as_str().map(PathBuf::from));
        recorded.unwrap_or_else(|| self.worktrees_dir().join(name))
    }

    /// The directory this project's loop worktrees are in (`<state home>/loopflow/worktrees/
    /// <label>-<hash>`).
    pub fn worktrees_dir(&self) -> PathBuf {
        let root = self.state_home.path().join("loopflow/worktrees");
        std::fs::read_dir(&root)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.path())
            .unwrap_or(root)
    }

    /// The git directory of a loop's own repository, beside its worktree.
    pub fn loop_git_dir(&self, name: &str) -> PathBuf {
        let wt = self.worktree(name);
        wt.with_file_name(format!("{name}.git"))
    }

    /// The file `file` of a loop's `outputs/` (`1-implement.prompt.md`, …); it must exist.
    pub fn output(&self, name: &str, file: &str) -> String {
        let path = self.loop_dir(name).join("outputs").join(file);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    pub fn state(&self, name: &str) -> Value {
        let text =
            std::fs::read_to_string(self.loop_dir(name).join(".state.loop")).expect("state file");
        serde_json::from_str(&text).expect("state JSON")
    }

    /// Rewrites a loop's state file through `edit` (what a hand, an older loopflow or a
    /// copy left there).
    pub fn edit_state(&self, name: &str, edit: impl FnOnce(&mut Value)) {
        edit_json(&self.loop_dir(name).join(".state.loop"), edit);
    }

    pub fn log(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.loop_dir(name).join(".state.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Log lines without their timestamp: `TICK pass=true score=0.9 iter=1`.
    pub fn events(&self, name: &str) -> Vec<String> {
        self.log(name)
            .iter()
            .map(|l| {
                l.split_once(' ')
                    .map_or(l.clone(), |(_, rest)| rest.to_string())
            })
            .collect()
    }

    /// [`Project::events`] without the `CREATE` line `create` writes.
    pub fn events_after_create(&self, name: &str) -> Vec<String> {
        self.events(name)
            .into_iter()
            .filter(|e| !e.starts_with("CREATE "))
            .collect()
    }

    /// `loopflow create --loop NAME --no-worktree [--task TASK]`.
    pub fn create(&self, name: &str, task: Option<&str>) -> Run {
        let mut args = vec!["create", "--loop", name, "--no-worktree"];
        if let Some(t) = task {
            args.extend(["--task", t]);
        }
        self.lf(&args)
    }

    /// Writes a loop's `loop.toml` (`&LoopToml::render()`, or text).
    pub fn loop_toml(&self, name: &str, text: &str) {
        std::fs::write(self.loop_dir(name).join("loop.toml"), text).expect("write loop.toml");
    }

    /// Creates loop `name` with the task "the task" and gives it `toml` as its loop.toml.
    /// It gets a git worktree of its own only when `toml` enables one.
    pub fn with_loop(&self, name: &str, toml: &LoopToml) {
        self.with_loop_task(name, Some("the task"), toml);
    }

    /// [`Project::with_loop`] with the task given (`None`: no task).
    pub fn with_loop_task(&self, name: &str, task: Option<&str>, toml: &LoopToml) {
        let mut args = vec!["create", "--loop", name];
        if !toml.worktree_enabled() {
            args.push("--no-worktree");
        }
        if let Some(t) = task {
            args.extend(["--task", t]);
        }
        let r = self.lf(&args);
        assert_eq!(r.code, 0, "{r:?}");
        self.loop_toml(name, &toml.render());
    }

    /// A loop whose roles run `agent` as `agent <role> <prompt>`, with `brakes` (lines,
    /// maybe none) set on top of the usual ones: `LoopToml::new().harness_agent(agent)`.
    pub fn agent_loop(&self, name: &str, agent: &Path, brakes: &str) {
        self.with_loop(name, &LoopToml::new().harness_agent(agent).brakes(brakes));
    }

    /// Writes `verdicts` (one a line) to the file `verdicts`; returns its path.
    pub fn verdicts(&self, verdicts: &[&str]) -> PathBuf {
        self.write("verdicts", &(verdicts.join("\n") + "\n"))
    }

    /// Every file and directory under the project (relative path → bytes; directories
    /// map to `None`), to prove a command wrote nothing.
    pub fn snapshot(&self) -> std::collections::BTreeMap<PathBuf, Option<Vec<u8>>> {
        fn walk(
            root: &Path,
            dir: &Path,
            out: &mut std::collections::BTreeMap<PathBuf, Option<Vec<u8>>>,
        ) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let p = e.path();
                let rel = p.strip_prefix(root).expect("under root").to_path_buf();
                if p.is_dir() {
                    out.insert(rel, None);
                    walk(root, &p, out);
                } else {
                    out.insert(rel, Some(std::fs::read(&p).unwrap_or_default()));
                }
            }
        }
        let mut out = std::collections::BTreeMap::new();
        walk(self.path(), self.path(), &mut out);
        out
    }
}

/// How many events are exactly `line`.
pub fn count(events: &[String], line: &str) -> usize {
    events.iter().filter(|e| e.as_str() == line).count()
}

/// Whether some event is exactly `line`.
pub fn has(events: &[String], line: &str) -> bool {
    count(events, line) > 0
}

/// Asserts that a log line is `<RFC 3339 UTC time> <EVENT> …`.
pub fn assert_log_line(line: &str) {
    let (time, rest) = line.split_once(' ').expect("time");
    assert!(
        time.len() == 20 && time.ends_with('Z') && time.as_bytes()[10] == b'T',
        "{line}"
    );
    assert!(
        rest.split(' ')
            .next()
            .is_some_and(|e| e.chars().all(|c| c.is_ascii_uppercase() || c == '_')),
        "{line}"
    );
}

/// A shell snippet that prints line N of `file` on tick N (the last line once the ticks
/// outnumber the lines): how fake verifiers answer from a `verdicts` file.
pub fn line_of_tick(file: &Path) -> String {
    format!(
        r#"n=$(wc -l < "{v}")
    i=$LOOPFLOW_TICK; [ "$i" -gt "$n" ] && i=$n
    sed -n "${{i}}p" "{v}""#,
        v = file.display()
    )
}

/// A fake agent: implement appends to work.txt, verify prints the verdict from the file
/// `verdicts` (one per line, by tick; the last repeats), orchestrate prints a line. Every
/// call is recorded in `calls.log` as `role tick`.
pub fn standard_agent(p: &Project, verdicts: &[&str]) -> PathBuf {
    let v = p.verdicts(verdicts);
    p.script(
        "agent.sh",
        &format!(
            r#"role="$1"
echo "$role $LOOPFLOW_TICK" >> "{calls}"
case "$role" in
  implement) echo "tick $LOOPFLOW_TICK" >> work.txt; echo implemented ;;
  verify)
    {verdict} ;;
  orchestrate) echo orchestrated ;;
esac"#,
            calls = p.join("calls.log").display(),
            verdict = line_of_tick(&v)
        ),
    )
}

/// Rewrites the JSON file at `path` through `edit`.
pub fn edit_json(path: &Path, edit: impl FnOnce(&mut Value)) {
    let text = std::fs::read_to_string(path).expect("JSON file");
    let mut v: Value = serde_json::from_str(&text).expect("JSON");
    edit(&mut v);
    std::fs::write(path, v.to_string()).expect("JSON file");
}

/// `cp -a FROM TO` (FROM's contents into TO when FROM ends in `/.`): a copy as a user makes
/// one, modes, times and links kept.
pub fn cp_a(from: &Path, to: &Path) {
    let ok = Command::new("cp").arg("-a").arg(from).arg(to).status();
    assert!(
        ok.is_ok_and(|s| s.success()),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

/// Whether `tool` is on PATH. With LOOPFLOW_REQUIRE_VALIDATORS=1 (CI sets it) a missing
/// tool fails the test instead of skipping its check.
pub fn have(tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if !found && std::env::var("LOOPFLOW_REQUIRE_VALIDATORS").as_deref() == Ok("1") {
        panic!("`{tool}` is required (LOOPFLOW_REQUIRE_VALIDATORS=1) but not installed");
    }
    if !found {
        println!("NOTICE: `{tool}` is not installed; skipping its check (CI installs it)");
    }
    found
}

/// A small xorshift generator; the seed is printed so a failure can be replayed with
/// `LOOPFLOW_TEST_SEED=<seed>`.
pub struct Rng(u64);

impl Rng {
    pub fn new() -> Rng {
        let seed = std::env::var("LOOPFLOW_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    | 1
            });
        eprintln!("LOOPFLOW_TEST_SEED={seed}");
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// ---- git -------------------------------------------------------------------------------

/// `git ARGS` in `dir`; panics unless it succeeds. Returns its stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let o = hermetic_git(&mut Command::new("git"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        o.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Commits what is staged in `dir`, as a throw-away identity.
pub fn git_commit(dir: &Path, msg: &str) {
    git(
        dir,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            msg,
        ],
    );
}

/// Stages everything in `dir` and commits it.
pub fn commit_all(dir: &Path, msg: &str) {
    git(dir, &["add", "-A"]);
    git_commit(dir, msg);
}

// ---- waiting -----------------------------------------------------------------------------

/// Polls `done` until it holds; fails the test after [`PATIENCE`].
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (up to [`PATIENCE`]) until `path` exists.
pub fn wait_for_file(path: &Path) {
    wait_until(&format!("{} to appear", path.display()), || path.exists());
}

/// Waits for `path` to hold a whole line: a file is created before it is written, so a
/// pid an agent writes with `echo $$ > f` is there only once its newline is.
pub fn wait_for_line(path: &Path) {
    wait_until(&format!("a line in {}", path.display()), || {
        std::fs::read_to_string(path).is_ok_and(|t| t.ends_with('\n'))
    });
}

/// Waits (up to [`PATIENCE`]) for `child` to exit; kills it and fails after that.
pub fn wait_or_kill(child: &mut Child, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Live (non-zombie) processes in process group `pgid`, from `/proc` (Linux).
pub fn live_group_members(pgid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 2 && f[2].parse::<i32>() == Ok(pgid) && f[0] != "Z" && f[0] != "X" {
            out.push(pid);
        }
    }
    out
}

/// Waits (up to 30 s, polling) until process group `pgid` has no live member;
/// returns the members still alive at the end.
pub fn wait_group_gone(pgid: i32) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let left = live_group_members(pgid);
        if left.is_empty() || start.elapsed() > Duration::from_secs(30) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
