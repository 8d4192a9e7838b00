//! Real agent CLIs through whole loops: Claude Code, Codex, OpenCode and Gemini CLI, at the
//! versions `tests/agents/package-lock.json` pins, each driven the way a user and a
//! scheduler would: `init --agent` or `create --agent`, `check`, `run --dry-run`, then
//! ticks started from another directory with `--project`, the sandbox on (the default
//! `auto`), until the loop halts `goal_met`. The model is `tests/agents/fake_model_server.py`
//! on 127.0.0.1 (Anthropic Messages, OpenAI Responses, chat completions, Gemini; scripted
//! by `LOOPFLOW-*` markers in the prompts), each agent pointed at it from a throw-away
//! `HOME`.
//!
//! What each run proves: the work is committed on `loopflow/<name>` and nowhere else; the
//! verdict was read from the agent's own output format; usage, cache tokens included,
//! reached `status --json`; the rendered prompts (front matter and over 128 KiB included)
//! reached the model; the verifier could run a program, and could not write outside its
//! worktree.
//!
//! The CLIs come from `npm ci` in `tests/agents` (or the directory `LOOPFLOW_AGENTS_DIR`
//! names, which `.ci/run` fills from its cache). Without them the tests say so and pass,
//! unless `LOOPFLOW_REQUIRE_AGENTS` is set, as CI sets it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support::{Project, Run, commit_all, git, loopflow, wait_until};

/// What the fake model server reports for every model call: Anthropic's uncached input
/// 11, cache writes 222, cache reads 3333, output 44 (OpenAI and Gemini report the same
/// as 3566 input of which 3333 cached, 44 output). A total that leaves out the cache shows.
const TOKENS_PER_CALL: u64 = 11 + 222 + 3333 + 44;

/// Each tick runs implement (the project's test, a file write, then an answer), verify
/// (the test, then the verdict) and orchestrate (one answer): six model calls.
const CALLS_PER_TICK: u64 = 6;

/// The implement prompt is padded past this: the kernel's limit on one argv element
/// (MAX_ARG_STRLEN), which a prompt passed as an argument could not get past.
const ARG_MAX_ONE: usize = 128 * 1024;

/// The directory holding the agents' `node_modules/.bin`, or `None` (after saying why)
/// when they are not installed and CI does not require them.
pub(crate) fn agents_bin() -> Option<PathBuf> {
    let dir = std::env::var_os("LOOPFLOW_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents"));
    let bin = dir.join("node_modules/.bin");
    let missing: Vec<&str> = ["claude", "codex", "opencode", "gemini"]
        .into_iter()
        .filter(|b| !bin.join(b).is_file())
        .collect();
    if missing.is_empty() {
        return Some(bin);
    }
    let why = format!(
        "the agent CLIs {missing:?} are not installed in {} (run `npm ci` in tests/agents)",
        bin.display()
    );
    if std::env::var_os("LOOPFLOW_REQUIRE_AGENTS").is_some() {
        panic!("{why}, and LOOPFLOW_REQUIRE_AGENTS is set");
    }
    println!("NOTICE: skipped: {why}; CI installs them");
    None
}

/// The fake model server on 127.0.0.1 (its own port per test), stopped on drop.
pub(crate) struct ModelServer {
    child: Child,
    pub(crate) url: String,
    log: PathBuf,
}

impl ModelServer {
    pub(crate) fn start(dir: &Path) -> ModelServer {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/fake_model_server.py");
        let port_file = dir.join("port");
        let log = dir.join("requests.jsonl");
        let child = Command::new("python3")
            .arg(&script)
            .args(["--port", "0", "--log"])
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs the fake model server");
        let mut server = ModelServer {
            child,
            url: String::new(),
            log,
        };
        wait_until("the fake model server's port", || {
            std::fs::read_to_string(&port_file).is_ok_and(|p| !p.trim().is_empty())
        });
        let port = std::fs::read_to_string(&port_file).expect("port");
        server.url = format!("http://127.0.0.1:{}", port.trim());
        server
    }

    /// Every request the server answered, in order.
    pub(crate) fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One agent CLI as the test drives it.
pub(crate) struct Agent {
    pub(crate) preset: &'static str,
    /// `--model` (and `--verify-model`) as `create`/`init` take them.
    pub(crate) model: &'static str,
    verify_model: Option<&'static str>,
    /// How the loop is made: `init --agent` (true) or `create --agent`.
    via_init: bool,
    /// Points the CLI at the server from `home`; returns the environment it needs.
    pub(crate) setup: fn(home: &Path, tools: &Path, url: &str) -> Vec<(String, String)>,
    /// Text only the agent's own output format has (the verdict is inside it).
    output_format: &'static str,
    /// The agent reports its spend in USD.
    reports_cost: bool,
    /// Ticks to goal_met: with 2 the first verdict fails (its note is not the goal yet)
    /// and the loop goes on. The slow starters (OpenCode, Gemini CLI: seconds per run)
    /// take 1, to keep CI short.
    ticks: u64,
}

impl Agent {
    /// The CLI as `agent_state.rs` drives it: one tick at a time, made by `create`.
    pub(crate) fn for_state_tests(
        preset: &'static str,
        model: &'static str,
        setup: fn(&Path, &Path, &str) -> Vec<(String, String)>,
    ) -> Agent {
        Agent {
            preset,
            model,
            verify_model: None,
            via_init: false,
            setup,
            output_format: "",
            reports_cost: false,
            ticks: 1,
        }
    }
}

pub(crate) fn claude(_home: &Path, _tools: &Path, url: &str) -> Vec<(String, String)> {
    vec![
        ("ANTHROPIC_BASE_URL".into(), url.into()),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-fake".into()),
    ]
}

pub(crate) fn codex(home: &Path, _tools: &Path, url: &str) -> Vec<(String, String)> {
    let dir = home.join(".codex");
    std::fs::create_dir_all(&dir).expect("codex home");
    std::fs::write(
        dir.join("config.toml"),
        format!(
            r#"model_provider = "fake"
[model_providers.fake]
name = "fake"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"
"#
        ),
    )
    .expect("codex config");
    vec![("FAKE_API_KEY".into(), "fake".into())]
}

/// OpenCode's provider config lives outside HOME (OPENCODE_CONFIG), and its XDG base
/// directories are set elsewhere too (as on a desktop that moves them): OpenCode creates
/// its config, data, state and cache directories there at start, which the sandbox must
/// allow — the preset's `~/.local/share/opencode` &c. follow `XDG_*_HOME`.
pub(crate) fn opencode(_home: &Path, tools: &Path, url: &str) -> Vec<(String, String)> {
    let config = tools.join("opencode.json");
    let json = serde_json::json!({
        "provider": {"fake": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "Fake",
            "options": {"baseURL": format!("{url}/v1"), "apiKey": "fake-key"},
            "models": {"fake-model": {"name": "Fake model", "tool_call": true,
                "cost": {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}}}
        }},
        "small_model": "fake/fake-model"
    });
    std::fs::write(&config, json.to_string()).expect("opencode config");
    let xdg = |kind: &str| tools.join("xdg").join(kind).display().to_string();
    vec![
        ("OPENCODE_CONFIG".into(), config.display().to_string()),
        ("XDG_CONFIG_HOME".into(), xdg("config")),
        ("XDG_DATA_HOME".into(), xdg("data")),
        ("XDG_STATE_HOME".into(), xdg("state")),
        ("XDG_CACHE_HOME".into(), xdg("cache")),
    ]
}

pub(crate) fn gemini(home: &Path, _tools: &Path, url: &str) -> Vec<(String, String)> {
    let dir = home.join(".gemini");
    std::fs::create_dir_all(&dir).expect("gemini home");
    std::fs::write(
        dir.join("settings.json"),
        // Its usage statistics go to play.googleapis.com, which `network = "hosts"`
        // refuses (a WARN per node): a user turns them off as the preset says.
        r#"{"security":{"auth":{"selectedType":"gemini-api-key"}},"privacy":{"usageStatisticsEnabled":false}}"#,
    )
    .expect("gemini settings");
    vec![
        ("GEMINI_API_KEY".into(), "fake".into()),
        ("GOOGLE_GEMINI_BASE_URL".into(), url.into()),
    ]
}

/// The variables of the machine running the tests that would point an agent elsewhere
/// (real keys, other config or state directories): never passed on.
pub(crate) const SCRUBBED: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "CLAUDE_CONFIG_DIR",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "CODEX_HOME",
    "OPENCODE_CONFIG",
    "OPENCODE_CONFIG_DIR",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
    "GOOGLE_CLOUD_PROJECT",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "LOOPFLOW_PROJECT",
];

/// The project the agent works on: committed before the loop exists, so its worktree has
/// it. `check.py` is the verifier's test: it lists the notes the implementer wrote, tries
/// to write into the project checkout (which the sandbox must refuse), and prints the
/// word the verdict waits for only when the last tick's note exists (`GOAL`) and the
/// write was refused.
pub(crate) const CHECK_PY: &str = r#"import os
notes = sorted(os.listdir("notes")) if os.path.isdir("notes") else []
try:
    with open(os.path.join(os.environ["LOOPFLOW_PROJECT"], "escaped.txt"), "w") as f:
        f.write("the sandbox let me out")
    escaped = True
except OSError:
    escaped = False
print("notes:", notes, "escaped:", escaped, "pwd:", os.environ.get("PWD"))
if "GOAL" in notes and not escaped and os.environ.get("PWD") == os.getcwd():
    print("CHECK-" + "PASSED")
"#;

/// Appends the fake model's script to the loop's prompts: what implement runs and writes,
/// what verify runs and expects (a refused command would show as a WARN). The implement prompt also starts with YAML front matter
/// (`---`, which an argv-passed prompt would turn into an option) and is padded past
/// [`ARG_MAX_ONE`]; its last line is returned, to find it in the server's log.
fn script_prompts(dir: &Path) -> String {
    let add = |rel: &str, head: &str, tail: &str| {
        let p = dir.join(rel);
        let text = std::fs::read_to_string(&p).expect("template prompt");
        std::fs::write(&p, format!("{head}{text}{tail}")).expect("prompt");
    };
    let filler: String = (0..3000)
        .map(|i| format!("context line {i:05}: the quick brown fox jumps over the lazy dog\n"))
        .collect();
    assert!(filler.len() > ARG_MAX_ONE);
    let last = "the end of the padding {{loop}}";
    add(
        "prompts/loop-implement.md",
        "---\nloop: {{loop}}\nrole: implement\n---\n",
        &format!(
            "\n{filler}{last}\n\nLOOPFLOW-ROLE: implement\nLOOPFLOW-RUN: python3 check.py\nLOOPFLOW-WRITE: notes/tick-{{{{iteration}}}}.txt\nLOOPFLOW-CONTENT: written by {{{{loop}}}} in tick {{{{iteration}}}}\n"
        ),
    );
    add(
        "prompts/loop-verifier.md",
        "",
        "\nLOOPFLOW-ROLE: verify\nLOOPFLOW-SCORE: 1.0\nLOOPFLOW-RUN: python3 check.py\nLOOPFLOW-EXPECT: CHECK-PASSED\n",
    );
    add(
        "prompts/loop-orchestrate.md",
        "",
        "\nLOOPFLOW-ROLE: orchestrate\n",
    );
    last.to_string()
}

/// Every file the loop's nodes left in `outputs/` (prompts excepted), for a failure's
/// message: what each agent printed.
pub(crate) fn outputs(dir: &Path) -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("outputs"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    let mut out = String::new();
    for f in files
        .iter()
        .filter(|f| !f.to_string_lossy().ends_with(".prompt.md"))
    {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let tail: String = text
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        out.push_str(&format!("--- {}\n{tail}\n", f.display()));
    }
    out
}

fn drive(agent: &Agent) {
    let Some(bin) = agents_bin() else { return };
    let started = std::time::Instant::now();
    let name = format!("agent-{}", agent.preset);
    let tools = Project::new();
    let home = tools.join("home");
    std::fs::create_dir_all(&home).expect("home");
    let server = ModelServer::start(tools.path());
    let mut env = (agent.setup)(&home, tools.path(), &server.url);
    env.push(("HOME".into(), home.display().to_string()));
    env.push((
        "PATH".into(),
        format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        ),
    ));
    let with_env = |c: &mut Command| {
        for k in SCRUBBED {
            c.env_remove(k);
        }
        c.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    };

    // The project, with a remote (init wants one) and the verifier's test.
    let p = Project::git();
    let remote = Project::new();
    git(remote.path(), &["init", "-q", "--bare"]);
    p.git_cmd(&[
        "remote",
        "add",
        "origin",
        &remote.path().display().to_string(),
    ]);
    p.write(
        "check.py",
        &CHECK_PY.replace("GOAL", &format!("tick-{}.txt", agent.ticks)),
    );
    commit_all(p.path(), "the verifier's test");
    let task = format!("Write one note per tick into notes/ ({name})");

    // The loop, as a user makes it.
    let mut args: Vec<String> = if agent.via_init {
        [
            "init",
            "--no-remote-ok",
            "--yes",
            "--template",
            "default",
            "--loop",
        ]
        .map(String::from)
        .to_vec()
    } else {
        ["create", "--loop"].map(String::from).to_vec()
    };
    args.extend([name.clone(), "--task".into(), task.clone()]);
    args.extend(["--agent".into(), agent.preset.into()]);
    args.extend(["--model".into(), agent.model.into()]);
    if let Some(v) = agent.verify_model {
        args.extend(["--verify-model".into(), v.into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = p.lf_cmd(&args);
    with_env(&mut c);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout
            .contains(&format!("agent: {} ({}/", agent.preset, bin.display())),
        "the agent's program is found on PATH: {r:?}"
    );
    let dir = p.loop_dir(&name);
    let toml = std::fs::read_to_string(dir.join("loop.toml")).expect("loop.toml");
    assert!(
        toml.contains(&format!("preset = \"{}\"\n", agent.preset)),
        "{toml}"
    );
    let toml = toml
        .replace("# context_tokens = 32000", "context_tokens = 200000")
        .replace(
            "timeout = \"45m\"",
            "timeout = \"5m\"\nidle_timeout = \"2m\"",
        );
    // The server is the model API a user would name in `hosts`: the agent reaches it
    // through the tick's proxy, with reads, the environment and the network confined as
    // shipped (`network = "hosts"`, the default).
    let port = server.url.rsplit(':').next().expect("port");
    // What a user's own configuration adds, declared as they would: Codex's provider key
    // is a variable of their choosing, OpenCode's config a file outside HOME.
    let extra = match agent.preset {
        "codex" => "env = [\"FAKE_API_KEY\"]\n".to_string(),
        "opencode" => format!(
            "read = [{:?}]\n",
            tools.join("opencode.json").display().to_string()
        ),
        _ => String::new(),
    };
    let toml = format!("{toml}\n[sandbox]\nhosts = [\"127.0.0.1:{port}\"]\n{extra}");
    std::fs::write(dir.join("loop.toml"), toml).expect("loop.toml");
    let padding_end = script_prompts(&dir).replace("{{loop}}", &name);

    let mut c = p.lf_cmd(&["check", "--deny-warnings"]);
    with_env(&mut c);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    // The loop's configuration is committed, as a user would (its state is git-ignored).
    commit_all(p.path(), "loop config");
    let main_head = p.git_cmd(&["rev-parse", "HEAD"]);

    // A dry run renders every argv and runs nothing: the model hears nothing.
    let mut c = p.lf_cmd(&["run", "--loop", &name, "--dry-run"]);
    with_env(&mut c);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    let program = match agent.preset {
        "claude-code" => "claude",
        other => other,
    };
    assert!(
        r.stdout
            .contains(&format!("implement (harness): {program} ")),
        "{r:?}"
    );
    assert!(r.stdout.contains(agent.model), "{r:?}");
    // The default tick, which commits the agent's work, under the kernel's sandbox.
    assert!(
        r.stdout.contains("land (git-commit): would commit"),
        "{r:?}"
    );
    assert!(r.stdout.contains("sandbox landlock ABI"), "{r:?}");
    assert!(server.requests().is_empty(), "a dry run reached the model");
    assert_eq!(p.state(&name)["iteration_count"], 0);

    // Ticks as a scheduler starts them: from elsewhere, naming the project.
    let elsewhere = Project::new();
    let mut outcomes = Vec::new();
    for _ in 0..agent.ticks + 1 {
        let mut c = loopflow(elsewhere.path());
        c.args(["run", "--loop", &name, "--json", "--project"])
            .arg(p.path());
        with_env(&mut c);
        let r = Run::of(&mut c);
        assert_eq!(r.code, 0, "{r:?}");
        let s = r.json();
        outcomes.push(format!("{} {}", s["outcome"], s["reason"]));
        if s["outcome"] == "halt" {
            break;
        }
    }
    let events = p.events_after_create(&name);
    let mut want_outcomes = vec!["\"tick\" null".to_string(); agent.ticks as usize - 1];
    want_outcomes.push("\"halt\" \"goal_met\"".into());
    let mut want: Vec<String> = (1..agent.ticks)
        .map(|i| format!("TICK pass=false score=0.0 iter={i}"))
        .collect();
    want.push(format!("TICK pass=true score=1.0 iter={}", agent.ticks));
    want.push("HALT goal_met".into());
    // No WARN (a weaker sandbox, refused tools), no ABORT.
    if outcomes != want_outcomes || events != want {
        panic!(
            "{} ran {outcomes:?}, logged {events:#?}\n{}",
            agent.preset,
            outputs(&dir)
        );
    }
    assert!(
        elsewhere.snapshot().is_empty(),
        "nothing lands where the tick was started"
    );

    // The work is on the loop's branch, one commit per tick, and nowhere else.
    let branch = format!("loopflow/{name}");
    let files = p.git_cmd(&[
        "log",
        "--format=%s",
        "--name-only",
        &format!("{}..{branch}", main_head.trim()),
    ]);
    let files: Vec<&str> = files.lines().filter(|l| !l.is_empty()).collect();
    let want: Vec<String> = (1..=agent.ticks)
        .rev()
        .flat_map(|i| {
            [
                format!("loopflow {name}: iteration {i}"),
                format!("notes/tick-{i}.txt"),
            ]
        })
        .collect();
    assert_eq!(files, want);
    let last = agent.ticks;
    let note = p.git_cmd(&["show", &format!("{branch}:notes/tick-{last}.txt")]);
    assert_eq!(note.trim(), format!("written by {name} in tick {last}"));
    assert_eq!(p.git_cmd(&["rev-parse", "main"]), main_head, "main moved");
    assert!(!p.join("notes").exists() && !p.join("escaped.txt").exists());
    let status = p.git_cmd(&["status", "--porcelain", "--untracked-files=all"]);
    assert_eq!(status, "", "the checkout changed");

    // The verdict came out of the agent's own output format.
    let state = p.state(&name);
    assert_eq!(state["last_verdict"]["pass"], true, "{state}");
    assert_eq!(
        state["last_verdict"]["reasons"][0], "fake model server: scripted verdict",
        "{state}"
    );
    let raw = p.output(&name, &format!("{}-verify.stdout", agent.ticks));
    assert!(raw.contains(agent.output_format), "{raw}");

    // Usage reached status, cache tokens included.
    let mut c = p.lf_cmd(&["status", "--loop", &name, "--json"]);
    with_env(&mut c);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    let status: Value = serde_json::from_str(&r.stdout).expect("status JSON");
    let spent = &status["loops"][0]["spent"];
    let requests = server.requests();
    let role_calls = requests
        .iter()
        .filter(|q| q["reply"]["role"].is_string())
        .count() as u64;
    assert_eq!(role_calls, CALLS_PER_TICK * agent.ticks, "{requests:#?}");
    assert_eq!(
        spent["tokens"].as_u64(),
        Some(CALLS_PER_TICK * agent.ticks * TOKENS_PER_CALL),
        "{spent}"
    );
    let usd = spent["usd"].as_f64().expect("usd");
    if agent.reports_cost {
        assert!(usd > 0.0, "{spent}");
    } else {
        assert_eq!(usd, 0.0, "{spent}");
    }

    // The prompts reached the model as loopflow rendered them.
    let bodies: Vec<String> = requests.iter().map(|q| q["body"].to_string()).collect();
    let heard = |text: &str| bodies.iter().any(|b| b.contains(text));
    for tick in 1..=agent.ticks {
        for heading in ["Implement", "Verify"] {
            let h = format!("# {heading} \u{2014} loop {name}, iteration {tick}");
            assert!(heard(&h), "{h:?} never reached the model");
        }
    }
    assert!(heard(&task), "the task never reached the model");
    assert!(heard(&format!(
        "---\\nloop: {name}\\nrole: implement\\n---\\n"
    )));
    assert!(heard(&padding_end), "the padded prompt was cut short");
    if let Some(v) = agent.verify_model {
        let models: Vec<&str> = requests
            .iter()
            .filter(|q| q["reply"]["role"] == "verify")
            .filter_map(|q| q["body"]["model"].as_str())
            .collect();
        assert!(
            !models.is_empty() && models.iter().all(|m| m.contains(v)),
            "the verifier ran {models:?}, not {v}"
        );
    }
    println!(
        "{}: {} ticks to goal_met in {:.1} s",
        agent.preset,
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn claude_code_runs_a_loop_to_goal_met() {
    drive(&Agent {
        preset: "claude-code",
        model: "sonnet",
        verify_model: Some("opus"),
        via_init: true,
        setup: claude,
        output_format: "\"type\":\"result\"",
        reports_cost: true,
        ticks: 2,
    });
}

#[test]
fn codex_runs_a_loop_to_goal_met() {
    drive(&Agent {
        preset: "codex",
        model: "gpt-5.5",
        verify_model: None,
        via_init: false,
        setup: codex,
        output_format: "\"type\":\"turn.completed\"",
        reports_cost: false,
        ticks: 2,
    });
}

#[test]
fn opencode_runs_a_loop_to_goal_met() {
    drive(&Agent {
        preset: "opencode",
        model: "fake/fake-model",
        verify_model: None,
        via_init: true,
        setup: opencode,
        output_format: "\"type\":\"step_finish\"",
        reports_cost: true,
        ticks: 1,
    });
}

#[test]
fn gemini_runs_a_loop_to_goal_met() {
    drive(&Agent {
        preset: "gemini",
        model: "gemini-2.5-pro",
        verify_model: None,
        via_init: false,
        setup: gemini,
        output_format: "\"stats\"",
        reports_cost: false,
        ticks: 1,
    });
}

/// The fake model server's own test of every endpoint (no agent needed), so a change to
/// the server that breaks one API shows even where the agents are not installed.
#[test]
fn the_fake_model_server_passes_its_self_test() {
    let test = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/test_fake_server.py");
    let out = match Command::new("python3").arg(&test).output() {
        Ok(o) => o,
        Err(e) if std::env::var_os("LOOPFLOW_REQUIRE_AGENTS").is_none() => {
            println!("NOTICE: skipped: python3 does not run ({e})");
            return;
        }
        Err(e) => panic!("python3: {e}"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(" passed, 0 failed"), "{text}");
}
