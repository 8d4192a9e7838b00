//! The real agent CLIs (as `agents.rs` installs and drives them) with state of their own,
//! and with their provider refusing them for a usage or rate limit.
//!
//! Own state: a prompt-injected agent plants what its CLI would load and run — a Claude
//! Code hook, a Codex MCP server, an OpenCode plugin, a Gemini CLI MCP server — in the
//! user's global CLI directory and in its own. The user's directory stays as it was, and
//! the user's CLI, started afterwards as the user would, runs nothing planted; the same
//! plant put in the user's directory by hand does run (so the test would see it).
//!
//! Limits: the fake model server answers every request with HTTP 429 in the provider's
//! own shape (`retry-after: 3600`). The tick ends `SKIP reason=usage_limit until=…` within
//! seconds — OpenCode and Codex would otherwise wait out the hour — with no iteration
//! used and no abort counted, and a loop of another project with the same preset and
//! credential skips at its gate without the model hearing from it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::agents::{self, Agent, ModelServer};
use crate::support::{Project, Run, commit_all, loopflow};

/// How a test points a CLI at the fake server from a HOME.
type Setup = fn(&Path, &Path, &str) -> Vec<(String, String)>;

/// The four CLIs, as `agents.rs` points them at the fake server.
fn agent(preset: &'static str) -> Agent {
    let (model, setup): (&'static str, Setup) = match preset {
        "claude-code" => ("sonnet", agents::claude),
        "codex" => ("gpt-5.5", agents::codex),
        "opencode" => ("fake/fake-model", agents::opencode),
        _ => ("gemini-2.5-pro", agents::gemini),
    };
    Agent::for_state_tests(preset, model, setup)
}

/// One CLI, its fake model and the user's machine: HOME, the user's own config, PATH.
struct Rig {
    preset: &'static str,
    model: &'static str,
    bin: PathBuf,
    tools: Project,
    home: PathBuf,
    server: ModelServer,
    env: Vec<(String, String)>,
}

impl Rig {
    fn new(preset: &'static str) -> Option<Rig> {
        let bin = agents::agents_bin()?;
        let a = agent(preset);
        let tools = Project::new();
        let home = tools.join("home");
        std::fs::create_dir_all(&home).expect("home");
        let server = ModelServer::start(tools.path());
        let mut env = (a.setup)(&home, tools.path(), &server.url);
        env.push(("HOME".into(), home.display().to_string()));
        env.push((
            "PATH".into(),
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        ));
        Some(Rig {
            preset,
            model: a.model,
            bin,
            tools,
            home,
            server,
            env,
        })
    }

    fn with_env(&self, c: &mut Command) {
        for k in agents::SCRUBBED {
            c.env_remove(k);
        }
        c.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    }

    fn var(&self, k: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }

    /// A git project with a loop `name` of this CLI, made as a user makes one, whose
    /// prompts end with `implement`, `verify` and `orchestrate` (fake-model markers).
    fn project(&self, name: &str, implement: &str, files: &[(&str, &str)]) -> Project {
        let p = Project::git();
        for (f, text) in files {
            p.write(f, text);
        }
        if !files.is_empty() {
            commit_all(p.path(), "the project");
        }
        let mut c = p.lf_cmd(&[
            "create",
            "--loop",
            name,
            "--task",
            "the task",
            "--agent",
            self.preset,
            "--model",
            self.model,
        ]);
        self.with_env(&mut c);
        let r = Run::of(&mut c);
        assert_eq!(r.code, 0, "{r:?}");
        let dir = p.loop_dir(name);
        let toml = std::fs::read_to_string(dir.join("loop.toml")).expect("loop.toml");
        let port = self.server.url.rsplit(':').next().expect("port");
        let extra = match self.preset {
            "codex" => "env = [\"FAKE_API_KEY\"]\n".to_string(),
            "opencode" => format!(
                "read = [{:?}]\n",
                self.tools.join("opencode.json").display().to_string()
            ),
            _ => String::new(),
        };
        let toml = toml
            .replace("# context_tokens = 32000", "context_tokens = 200000")
            .replace(
                "timeout = \"45m\"",
                "timeout = \"5m\"\nidle_timeout = \"3m\"",
            );
        let toml = format!("{toml}\n[sandbox]\nhosts = [\"127.0.0.1:{port}\"]\n{extra}");
        std::fs::write(dir.join("loop.toml"), toml).expect("loop.toml");
        let add = |rel: &str, tail: &str| {
            let f = dir.join(rel);
            let text = std::fs::read_to_string(&f).expect("prompt");
            std::fs::write(&f, format!("{text}\n{tail}")).expect("prompt");
        };
        add("prompts/loop-implement.md", implement);
        add(
            "prompts/loop-verifier.md",
            "LOOPFLOW-ROLE: verify\nLOOPFLOW-SCORE: 1.0\n",
        );
        add(
            "prompts/loop-orchestrate.md",
            "LOOPFLOW-ROLE: orchestrate\n",
        );
        commit_all(p.path(), "loop config");
        p
    }

    /// One tick, as a scheduler starts it (from elsewhere, naming the project).
    fn tick(&self, p: &Project, name: &str) -> Run {
        let elsewhere = Project::new();
        let mut c = loopflow(elsewhere.path());
        c.args(["run", "--loop", name, "--json", "--project"])
            .arg(p.path());
        self.with_env(&mut c);
        Run::of(&mut c)
    }

    /// The user's own CLI, started as the user would (no loopflow, no sandbox), with a
    /// prompt the fake model answers without tools.
    fn user_cli(&self, cwd: &Path) -> std::process::Output {
        let argv: Vec<&str> = match self.preset {
            "claude-code" => vec!["claude", "-p", "--output-format", "json"],
            "codex" => vec!["codex", "exec", "--json", "--skip-git-repo-check", "-"],
            "opencode" => vec![
                "opencode",
                "run",
                "--format",
                "json",
                "--model",
                "fake/fake-model",
            ],
            _ => vec!["gemini", "--output-format", "json", "--skip-trust"],
        };
        let prompt = self
            .tools
            .write("user-prompt.md", "LOOPFLOW-ROLE: orchestrate\nhello\n");
        let mut c = Command::new("timeout");
        c.arg("120")
            .arg(self.bin.join(argv[0]))
            .args(&argv[1..])
            .current_dir(cwd);
        self.with_env(&mut c);
        c.stdin(std::fs::File::open(prompt).expect("prompt"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.output().expect("the user's CLI runs")
    }
}

/// What the CLI would load from its config directory and run: (file in that directory,
/// how it is written — `json` merged in, `append`ed, or `write`n — and its content).
/// `{MARKER}` is the file the planted command creates.
fn plant(preset: &str) -> (&'static str, &'static str, &'static str) {
    match preset {
        "claude-code" => (
            "settings.json",
            "json",
            r#"{"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch {MARKER}"}]}], "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "touch {MARKER}"}]}]}}"#,
        ),
        "codex" => (
            "config.toml",
            "append",
            "\n[mcp_servers.planted]\ncommand = \"sh\"\nargs = [\"-c\", \"touch {MARKER}; sleep 1\"]\n",
        ),
        "opencode" => (
            "plugin/planted.js",
            "write",
            "import { writeFileSync } from \"fs\";\nexport const Planted = async () => { writeFileSync(\"{MARKER}\", \"x\"); return {}; };\n",
        ),
        _ => (
            "settings.json",
            "json",
            r#"{"mcpServers": {"planted": {"command": "sh", "args": ["-c", "touch {MARKER}; sleep 1"]}}}"#,
        ),
    }
}

/// Plants `content` in `dir/file` the way `how` says (what an agent's script would do).
fn put(dir: &Path, file: &str, how: &str, content: &str) -> std::io::Result<()> {
    let p = dir.join(file);
    std::fs::create_dir_all(p.parent().expect("parent"))?;
    match how {
        "json" => {
            let mut v: Value = std::fs::read_to_string(&p)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_else(|| serde_json::json!({}));
            let add: Value = serde_json::from_str(content).expect("plant JSON");
            for (k, x) in add.as_object().expect("object") {
                v[k] = x.clone();
            }
            std::fs::write(&p, v.to_string())
        }
        "append" => {
            use std::io::Write;
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)?
                .write_all(content.as_bytes())
        }
        _ => std::fs::write(&p, content),
    }
}

/// The agent's script: plants in each directory (a path, or `$VAR[/rest]` from its own
/// environment) and says what it managed.
fn plant_py(targets: &[String], file: &str, how: &str, content: &str) -> String {
    format!(
        r#"import json, os, sys
targets = {targets}
file, how, content = {file:?}, {how:?}, {content:?}
for t in targets:
    if t.startswith("$"):
        var, _, rest = t[1:].partition("/")
        if var not in os.environ:
            print("PLANT no-var", t); continue
        t = os.path.join(os.environ[var], rest) if rest else os.environ[var]
    p = os.path.join(t, file)
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if how == "json":
            v = {{}}
            if os.path.exists(p):
                with open(p) as f: v = json.load(f)
            v.update(json.loads(content))
            with open(p, "w") as f: json.dump(v, f)
        else:
            with open(p, "a" if how == "append" else "w") as f: f.write(content)
        print("PLANT ok", p)
    except OSError as e:
        print("PLANT refused", p, e)
"#,
        targets = serde_json::to_string(targets).expect("json"),
    )
}

/// Every file under `dir` with its bytes, leaving out loopflow's own state (the loop's
/// agent state lives under `$XDG_STATE_HOME/loopflow`).
fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).expect("under").to_path_buf();
            if rel.components().any(|c| c.as_os_str() == "loopflow") {
                continue;
            }
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                walk(root, &p, out);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The user's own config directory of this CLI, and the variable that moves the
/// agent's (with the sub-path its CLI reads under it).
fn dirs(r: &Rig) -> (PathBuf, String) {
    match r.preset {
        "claude-code" => (r.home.join(".claude"), "$CLAUDE_CONFIG_DIR".into()),
        "codex" => (r.home.join(".codex"), "$CODEX_HOME".into()),
        "opencode" => (
            PathBuf::from(r.var("XDG_CONFIG_HOME").expect("xdg")).join("opencode"),
            "$XDG_CONFIG_HOME/opencode".into(),
        ),
        _ => (r.home.join(".gemini"), "$GEMINI_CLI_HOME/.gemini".into()),
    }
}

fn plants_nothing_the_users_cli_loads(preset: &'static str) {
    let Some(r) = Rig::new(preset) else { return };
    let marker = r.tools.join("PLANTED-CODE-RAN");
    let (file, how, content) = plant(preset);
    let content = content.replace("{MARKER}", &marker.display().to_string());
    let (user_dir, own) = dirs(&r);
    // The user's CLI has run before: its directory has what a first run leaves.
    let first = r.user_cli(r.tools.path());
    assert!(
        first.status.success(),
        "{preset}: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(!marker.exists());
    let script = plant_py(
        &[user_dir.display().to_string(), own.clone()],
        file,
        how,
        &content,
    );
    let name = format!("plant-{preset}");
    let p = r.project(
        &name,
        "LOOPFLOW-ROLE: implement\nLOOPFLOW-RUN: python3 plant.py\nLOOPFLOW-WRITE: notes/planted.txt\n",
        &[("plant.py", &script)],
    );
    let roots = [r.home.clone(), r.tools.join("xdg")];
    let before: Vec<_> = roots.iter().map(|d| files_under(d)).collect();

    let t = r.tick(&p, &name);
    assert_eq!(t.code, 0, "{t:?}");
    let out = p.output(&name, "1-implement.stdout");
    let all = agents::outputs(&p.loop_dir(&name));
    // The agent ran the script: refused in the user's directory, allowed in its own.
    let requests = r.server.requests();
    // What the script printed, as the model heard it (its tool result).
    let mut plants: Vec<String> = requests
        .iter()
        .flat_map(|q| {
            let body = q["body"].to_string().replace("\\n", "\n");
            body.lines()
                .filter_map(|l| l.find("PLANT ").map(|i| l[i..].to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    plants.sort();
    plants.dedup();
    let said = plants.join("\n");
    assert!(
        said.contains("PLANT refused"),
        "{preset}: {said}\n{out}\n{all}"
    );
    assert!(
        said.contains("PLANT ok"),
        "{preset}: its own state is writable: {said}\n{all}"
    );
    // The user's global directories are as they were (loopflow's own state aside).
    let after: Vec<_> = roots.iter().map(|d| files_under(d)).collect();
    assert_eq!(before, after, "{preset}: the user's CLI state changed");
    // Where it could plant: the loop's own state, under loopflow's directory.
    let state_base = match r.var("XDG_STATE_HOME") {
        Some(x) => PathBuf::from(x).join("loopflow"),
        None => r.home.join(".local/state/loopflow"),
    };
    let oks: Vec<PathBuf> = said
        .split("PLANT ok ")
        .skip(1)
        .map(|t| {
            PathBuf::from(
                t.split(|c: char| c == '\\' || c.is_whitespace())
                    .next()
                    .unwrap_or(""),
            )
        })
        .collect();
    assert!(
        !oks.is_empty() && oks.iter().all(|o| o.starts_with(state_base.join("agents"))),
        "{preset}: planted at {oks:?}, not only under {}",
        state_base.display()
    );

    // The user's CLI, started afterwards as the user would, runs nothing planted.
    let again = r.user_cli(r.tools.path());
    assert!(
        again.status.success(),
        "{preset}: {}",
        String::from_utf8_lossy(&again.stderr)
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        !marker.exists(),
        "{preset}: the user's CLI ran what the agent planted"
    );

    // The same plant in the user's own directory does run: the test would have seen it.
    put(&user_dir, file, how, &content).expect("plant by hand");
    let control = r.user_cli(r.tools.path());
    let seen = || marker.exists();
    for _ in 0..30 {
        if seen() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        seen(),
        "{preset}: the control plant did not run either: {}\n{}",
        String::from_utf8_lossy(&control.stdout),
        String::from_utf8_lossy(&control.stderr)
    );
}

#[test]
fn claude_code_plants_nothing_the_users_claude_loads() {
    plants_nothing_the_users_cli_loads("claude-code");
}

#[test]
fn codex_plants_nothing_the_users_codex_loads() {
    plants_nothing_the_users_cli_loads("codex");
}

#[test]
fn opencode_plants_nothing_the_users_opencode_loads() {
    plants_nothing_the_users_cli_loads("opencode");
}

#[test]
fn gemini_plants_nothing_the_users_gemini_loads() {
    plants_nothing_the_users_cli_loads("gemini");
}

/// `kind`: the OpenAI error type the server answers with (Codex: a rate limit it would
/// wait out; others ignore it).
fn usage_limit_pauses_every_loop_of_the_credential(preset: &'static str, until_secs: i64) {
    let Some(r) = Rig::new(preset) else { return };
    let implement = "LOOPFLOW-ROLE: implement\nLOOPFLOW-RATE-LIMIT: 3600\n";
    let p = r.project("limited", implement, &[]);
    let started = std::time::Instant::now();
    let t = r.tick(&p, "limited");
    let took = started.elapsed();
    assert_eq!(t.code, 0, "{t:?}");
    let s = t.json();
    let all = agents::outputs(&p.loop_dir("limited"));
    assert_eq!(
        (s["outcome"].as_str(), s["reason"].as_str()),
        (Some("skip"), Some("usage_limit")),
        "{t:?}\n{all}"
    );
    // Well before the node's timeout, or the CLI's own hour of waiting.
    assert!(took.as_secs() < 90, "{preset}: {took:?}");
    println!(
        "{preset}: the limited tick ended as a skip in {:.1} s",
        took.as_secs_f64()
    );
    let until: jiff::Timestamp = s["until"]
        .as_str()
        .expect("until")
        .parse()
        .expect("RFC 3339");
    let secs = until.as_second() - jiff::Timestamp::now().as_second();
    assert!(
        (until_secs - 120..=until_secs + 5).contains(&secs),
        "{preset}: until {until} is {secs} s away, not ~{until_secs}"
    );
    let events = p.events_after_create("limited");
    let skip = format!(
        "SKIP reason=usage_limit until={}",
        s["until"].as_str().expect("until")
    );
    assert_eq!(events.last(), Some(&skip), "{events:#?}");
    assert!(
        !events
            .iter()
            .any(|e| e.starts_with("ABORT") || e.starts_with("HALT")),
        "{events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("WARN node=implement") && e.contains("usage or rate limit")),
        "{events:#?}"
    );
    let state = p.state("limited");
    assert_eq!(
        (
            state["iteration_count"].as_u64(),
            state["consecutive_aborts"].as_u64()
        ),
        (Some(0), Some(0))
    );
    assert!(state["halt"].is_null());

    // Another project's loop with the same preset and credential waits too: its gate
    // says so, and no agent of it reaches the model.
    let heard = r.server.requests().len();
    let q = r.project("other", "LOOPFLOW-ROLE: implement\n", &[]);
    let t = r.tick(&q, "other");
    assert_eq!(t.code, 0, "{t:?}");
    let s2 = t.json();
    assert_eq!(
        (s2["outcome"].as_str(), s2["reason"].as_str()),
        (Some("skip"), Some("usage_limit")),
        "{t:?}"
    );
    assert_eq!(s2["until"], s["until"]);
    assert_eq!(
        r.server.requests().len(),
        heard,
        "the second loop reached the model"
    );
    let mut c = q.lf_cmd(&["gate", "--loop", "other", "--json"]);
    r.with_env(&mut c);
    let g = Run::of(&mut c).json();
    let check = g["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "usage_limit")
        .cloned()
        .expect("a usage_limit check");
    assert_eq!(check["ok"], false, "{g}");
    assert!(
        check["detail"].as_str().expect("detail").contains(preset),
        "{g}"
    );
}

#[test]
fn claude_code_usage_limit_pauses_the_loops_of_its_credential() {
    // Claude Code names no reset time: the default wait (15 minutes).
    usage_limit_pauses_every_loop_of_the_credential("claude-code", 900);
}

#[test]
fn codex_rate_limit_pauses_the_loops_of_its_credential() {
    // Codex would wait out the hour reconnecting; its JSON line says why at once.
    usage_limit_pauses_every_loop_of_the_credential("codex", 900);
}

#[test]
fn opencode_rate_limit_pauses_the_loops_of_its_credential() {
    // OpenCode waits in silence; its log says "Please try again in 3600s".
    usage_limit_pauses_every_loop_of_the_credential("opencode", 3600);
}

#[test]
fn gemini_quota_pauses_the_loops_of_its_credential() {
    usage_limit_pauses_every_loop_of_the_credential("gemini", 3600);
}
