//! Shared test support: a temp project, the real `loopflow` binary, fake-agent scripts.
//! Every test drives the built executable with real child processes and real files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub mod api;

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_loopflow"))
}

/// A throw-away project directory.
pub struct Project {
    pub dir: tempfile::TempDir,
}

/// The result of one `loopflow` invocation.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
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
        }
    }

    /// A project that is a git repository with one commit (for worktrees).
    pub fn git() -> Project {
        let p = Project::new();
        p.git_cmd(&["init", "-q", "-b", "main"]);
        p.write("README.md", "# test project\n");
        p.git_cmd(&["add", "-A"]);
        p.git_cmd(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "-m",
            "init",
        ]);
        p
    }

    pub fn git_cmd(&self, args: &[&str]) -> String {
        let o = Command::new("git")
            .args(args)
            .current_dir(self.path())
            .output()
            .expect("git");
        assert!(
            o.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
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
        self.lf_env(args, &[])
    }

    pub fn lf_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut c = Command::new(bin());
        c.arg("--project")
            .arg(self.path())
            .args(args)
            .current_dir(self.path());
        c.env("NO_COLOR", "1").env_remove("LOOPFLOW_CONTEXT_TOKENS");
        for (k, v) in env {
            c.env(k, v);
        }
        Run::from(c.output().expect("spawn loopflow"))
    }

    pub fn loop_dir(&self, name: &str) -> PathBuf {
        self.join(&format!(".loopflow/loops/{name}"))
    }

    pub fn state(&self, name: &str) -> Value {
        let text =
            std::fs::read_to_string(self.loop_dir(name).join(".state.loop")).expect("state file");
        serde_json::from_str(&text).expect("state JSON")
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

    /// Creates a loop with `--no-worktree` and the given harness scripts, replacing the
    /// template's `loop.toml` with `loop_toml` when given.
    pub fn create(&self, name: &str, task: Option<&str>) -> Run {
        let mut args = vec!["create", "--loop", name, "--no-worktree"];
        if let Some(t) = task {
            args.extend(["--task", t]);
        }
        self.lf(&args)
    }

    /// Writes a loop's `loop.toml`.
    pub fn loop_toml(&self, name: &str, text: &str) {
        std::fs::write(self.loop_dir(name).join("loop.toml"), text).expect("write loop.toml");
    }

    /// A standard loop whose roles run `agent` (a script path) with the role as first
    /// argument: `agent implement|verify|orchestrate <prompt>`.
    pub fn agent_loop(&self, name: &str, agent: &Path, extra_brakes: &str) {
        self.agent_loop_with(
            name,
            agent,
            &format!("max_iterations = 10\ncontext_tokens = 32000\n{extra_brakes}"),
            "",
        );
    }

    /// Like [`Project::agent_loop`], with the whole `[brakes]` body given and `extra`
    /// TOML appended (per-role commands, say).
    pub fn agent_loop_with(&self, name: &str, agent: &Path, brakes: &str, extra: &str) {
        let r = self.create(name, Some("the task"));
        assert_eq!(r.code, 0, "{r:?}");
        self.loop_toml(name, &loop_toml_text(agent, brakes, extra));
    }

    /// `loopflow --project <dir> ARGS` as a command to spawn in the background.
    pub fn lf_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("--project")
            .arg(self.path())
            .args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            .env_remove("LOOPFLOW_CONTEXT_TOKENS");
        c
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

/// A `loop.toml` whose roles all run `agent` as `agent <role> <prompt>`.
pub fn loop_toml_text(agent: &Path, brakes: &str, extra: &str) -> String {
    format!(
        r#"[brakes]
{brakes}

[harness]
command = ["{agent}", "{{{{role}}}}", "{{{{prompt}}}}"]

[roles.implement]
prompt = "prompts/loop-implement.md"
[roles.verify]
prompt = "prompts/loop-verifier.md"
[roles.orchestrate]
prompt = "prompts/loop-orchestrate.md"

[worktree]
enabled = false
{extra}
"#,
        agent = agent.display()
    )
}

/// A fake agent: implement appends to work.txt, verify prints the verdict from the file
/// `verdicts` (one per line, by tick; the last repeats), orchestrate records its argv.
pub fn standard_agent(p: &Project, verdicts: &[&str]) -> PathBuf {
    p.write("verdicts", &(verdicts.join("\n") + "\n"));
    let vpath = p.join("verdicts");
    p.script(
        "agent.sh",
        &format!(
            r#"role="$1"
echo "$role $LOOPFLOW_TICK" >> "{calls}"
case "$role" in
  implement) echo "tick $LOOPFLOW_TICK" >> work.txt; echo implemented ;;
  verify)
    n=$(wc -l < "{v}")
    i=$LOOPFLOW_TICK; [ "$i" -gt "$n" ] && i=$n
    sed -n "${{i}}p" "{v}" ;;
  orchestrate) echo orchestrated ;;
esac"#,
            calls = p.join("calls.log").display(),
            v = vpath.display()
        ),
    )
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
    let start = std::time::Instant::now();
    loop {
        let left = live_group_members(pgid);
        if left.is_empty() || start.elapsed() > std::time::Duration::from_secs(30) {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits (up to two minutes) until `path` exists.
pub fn wait_for_file(path: &Path) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
