//! `loopflow doctor`: against a project with each thing a tick needs missing in turn — the
//! agent's program, its key, a model host that answers (or not) through the tick's proxy,
//! a key a scheduled tick would not see — exact output asserted, and the one-line hints
//! of `create`, `run --dry-run` and `schedule install` that point at it.

use std::path::PathBuf;

use serde_json::Value;

use crate::support::{LoopToml, Project, Run};

/// A project with a claude-code loop `l` whose sandbox is on (`network = "hosts"`),
/// `hosts` as given; a HOME of its own; and a PATH without `claude` unless `with_claude`.
struct Doc {
    p: Project,
    home: Project,
    bin: PathBuf,
}

impl Doc {
    fn new(hosts: &[String]) -> Doc {
        let p = Project::git();
        let home = Project::new();
        let bin = p.join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let hosts: Vec<String> = hosts.iter().map(|h| format!("{h:?}")).collect();
        p.with_loop(
            "l",
            &LoopToml::new()
                .table("harness", "preset = \"claude-code\"")
                .table(
                    "sandbox",
                    &format!("mode = \"auto\"\nhosts = [{}]", hosts.join(", ")),
                ),
        );
        Doc { p, home, bin }
    }

    fn with_claude(&self) {
        self.p.script("bin/claude", "exit 0");
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let path = format!("{}:/usr/bin:/bin", self.bin.display());
        let mut c = self.p.lf_cmd(args);
        for k in [
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_BASE_URL",
            "CLAUDE_CONFIG_DIR",
            "XDG_CONFIG_HOME",
            "XDG_STATE_HOME",
        ] {
            c.env_remove(k);
        }
        c.env("PATH", path).env("HOME", self.home.path());
        c.envs(env.iter().copied());
        Run::of(&mut c)
    }

    /// `doctor --json`'s checks of the agent and the schedule (the sandbox and git lines
    /// say what this machine has), as `check: ok/FAIL detail | fix`.
    fn checks(&self, env: &[(&str, &str)]) -> (i32, Vec<String>) {
        let r = self.run(&["doctor", "--loop", "l", "--json"], env);
        let v: Value = serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"));
        let lines = v["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .filter(|c| !matches!(c["check"].as_str(), Some("sandbox" | "git")))
            .map(|c| {
                format!(
                    "{}: {} {}{}",
                    c["check"].as_str().unwrap_or(""),
                    if c["ok"] == true { "ok" } else { "FAIL" },
                    c["detail"].as_str().unwrap_or(""),
                    c["fix"]
                        .as_str()
                        .map(|f| format!(" | {f}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(v["ok"] == true, r.code == 0, "{r:?}");
        (r.code, lines)
    }
}

/// A port on 127.0.0.1 where something answers (kept open while the value lives).
fn listener() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let a = l.local_addr().expect("addr").to_string();
    (l, a)
}

/// A port on 127.0.0.1 where nothing answers.
fn closed_port() -> String {
    let (l, a) = listener();
    drop(l);
    a
}

#[test]
fn doctor_names_each_missing_thing_and_its_fix() {
    let (_server, up) = listener();
    let down = closed_port();
    let d = Doc::new(&[up.clone(), down.clone()]);
    let base_up = format!("http://{up}");

    // Nothing: no program, no key.
    let (code, got) = d.checks(&[("ANTHROPIC_BASE_URL", &base_up)]);
    assert_eq!(code, 1);
    assert_eq!(
        got,
        [
            "program: FAIL claude is not on PATH | install it: `npm install -g @anthropic-ai/claude-code@2.1.197` (the version its preset was checked against), or put `claude` on PATH".to_string(),
            "credential: FAIL no ANTHROPIC_API_KEY is set and claude has no login here | export ANTHROPIC_API_KEY, or log in with `claude` once (it keeps its login in ~/.claude/.credentials.json); a scheduled tick needs it too (`loopflow doctor` checks the schedule)".to_string(),
            format!("model_host: ok {up} answers through the tick's proxy"),
        ]
    );

    // The program, no key.
    d.with_claude();
    let (code, got) = d.checks(&[("ANTHROPIC_BASE_URL", &base_up)]);
    assert_eq!(code, 1);
    assert_eq!(
        got[0],
        format!("program: ok claude ({}/claude)", d.bin.display())
    );
    assert!(got[1].starts_with("credential: FAIL"), "{got:?}");

    // The key: nothing missing.
    let key = [
        ("ANTHROPIC_BASE_URL", base_up.as_str()),
        ("ANTHROPIC_API_KEY", "sk-test"),
    ];
    let (code, got) = d.checks(&key);
    assert_eq!(code, 0, "{got:?}");
    assert_eq!(got[1], "credential: ok ANTHROPIC_API_KEY (set here)");

    // A login instead of a key counts too.
    let login = d.home.write(".claude/.credentials.json", "{}");
    let (code, got) = d.checks(&[("ANTHROPIC_BASE_URL", &base_up)]);
    assert_eq!(code, 0, "{got:?}");
    assert_eq!(
        got[1],
        "credential: ok the CLI's own login, ~/.claude/.credentials.json"
    );
    std::fs::remove_file(login).expect("rm");

    // A model host that does not answer, through the tick's proxy.
    let base_down = format!("http://{down}");
    let (code, got) = d.checks(&[
        ("ANTHROPIC_BASE_URL", &base_down),
        ("ANTHROPIC_API_KEY", "sk-test"),
    ]);
    assert_eq!(code, 1);
    assert_eq!(
        got[2],
        format!(
            "model_host: FAIL {down} does not answer through the tick's proxy: the proxy answered `HTTP/1.1 502 Bad Gateway` | check the address (its base-URL variable), the network and any firewall or corporate proxy"
        )
    );

    // One the proxy would refuse: not among the hosts.
    let (_other, elsewhere) = listener();
    let base_else = format!("http://{elsewhere}");
    let (code, got) = d.checks(&[
        ("ANTHROPIC_BASE_URL", &base_else),
        ("ANTHROPIC_API_KEY", "sk-test"),
    ]);
    assert_eq!(code, 1);
    assert_eq!(
        got[2],
        format!(
            "model_host: FAIL {elsewhere} is not among the hosts the tick's proxy lets the agent reach | add \"{elsewhere}\" to `[sandbox] hosts` in loop.toml"
        )
    );

    // The human form: each check a line, each problem its fix.
    let r = d.run(
        &["doctor", "--loop", "l"],
        &[("ANTHROPIC_BASE_URL", &base_up)],
    );
    assert_eq!(r.code, 1);
    let lines: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| !l.contains(" sandbox ") && !l.contains(" git "))
        .collect();
    assert_eq!(
        lines,
        [
            "loop l",
            &format!(
                "  ok   program    implement, verify, orchestrate: claude ({}/claude)",
                d.bin.display()
            ),
            "  FAIL credential implement, verify, orchestrate: no ANTHROPIC_API_KEY is set and claude has no login here",
            "       fix: export ANTHROPIC_API_KEY, or log in with `claude` once (it keeps its login in ~/.claude/.credentials.json); a scheduled tick needs it too (`loopflow doctor` checks the schedule)",
            &format!(
                "  ok   model_host implement, verify, orchestrate: {up} answers through the tick's proxy"
            ),
            "1 problem(s): a tick would fail or wait on each until it is fixed",
        ],
        "{r:?}"
    );
}

/// An installed systemd schedule (its record, as `schedule install` writes it).
fn installed(p: &Project, platform: &str) {
    let rec = serde_json::json!({
        "platform": platform, "label": "loopflow-l", "files": [], "interval_seconds": 3600,
        "exe": "/usr/bin/loopflow", "installed_at": "2026-12-07T00:00:00Z", "enabled": true,
        "activated": true
    });
    p.write(".loopflow/loops/l/.schedule.json", &rec.to_string());
}

#[test]
fn doctor_says_where_a_scheduled_tick_takes_its_key_from() {
    let (_server, up) = listener();
    let d = Doc::new(std::slice::from_ref(&up));
    d.with_claude();
    installed(&d.p, "systemd");
    let env = [
        ("ANTHROPIC_BASE_URL", format!("http://{up}")),
        ("ANTHROPIC_API_KEY", "sk-test".into()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // Exported in the shell: a systemd tick would not see it.
    let (code, got) = d.checks(&env);
    assert_eq!(code, 1);
    assert_eq!(
        got.last().map(String::as_str),
        Some(
            "schedule: FAIL systemd schedule: a scheduled tick will not see ANTHROPIC_API_KEY (the shell's exported variables never reach it) and claude has no login here | put `ANTHROPIC_API_KEY=…` in ~/.config/loopflow/env and `chmod 600` it (the service reads it: EnvironmentFile=), or log in with `claude` once (its own login works in every schedule)"
        )
    );
    // In the service's environment file: seen.
    d.home.write(
        ".config/loopflow/env",
        "# keys\nANTHROPIC_API_KEY=sk-test\n",
    );
    let (code, got) = d.checks(&env);
    assert_eq!(code, 0, "{got:?}");
    assert_eq!(
        got.last().map(String::as_str),
        Some(format!("schedule: ok systemd schedule: ANTHROPIC_API_KEY comes from {} (the service's EnvironmentFile=)", d.home.join(".config/loopflow/env").display()).as_str())
    );
}

#[test]
fn create_dry_run_and_a_doctor_hint_cost_no_network() {
    let p = Project::git();
    let home = Project::new();
    let path = "/usr/bin:/bin";
    let env = |c: &mut std::process::Command| {
        c.env("PATH", path)
            .env("HOME", home.path())
            .env_remove("ANTHROPIC_API_KEY");
    };
    let mut c = p.lf_cmd(&[
        "create",
        "--loop",
        "l",
        "--task",
        "t",
        "--agent",
        "claude-code",
    ]);
    env(&mut c);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    let hint = "hint: claude is not on PATH; no ANTHROPIC_API_KEY is set and claude has no login here; `loopflow doctor --loop l` checks what a tick needs and says how to fix it";
    assert!(r.stdout.lines().any(|l| l == hint), "{r:?}");
    let mut c = p.lf_cmd(&["run", "--loop", "l", "--dry-run"]);
    env(&mut c);
    let r = Run::of(&mut c);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(r.stdout.lines().last(), Some(hint), "{r:?}");
}

/// Fake `crontab` and `systemctl` on PATH, keeping their state in files (the machine's
/// scheduler is never touched).
fn fake_schedulers(d: &Doc) {
    let dir = d.bin.display().to_string();
    d.p.script(
        "bin/crontab",
        &format!(
            r#"f="{dir}/crontab.txt"
case "$1" in
  -l) [ -f "$f" ] || {{ echo "no crontab for tester" >&2; exit 1; }}; cat "$f" ;;
  -) cat > "$f" ;;
  *) exit 2 ;;
esac"#
        ),
    );
    d.p.script("bin/systemctl", "exit 0");
}

#[test]
fn schedule_install_says_how_the_key_reaches_the_tick() {
    let (_server, up) = listener();
    let d = Doc::new(std::slice::from_ref(&up));
    d.with_claude();
    fake_schedulers(&d);
    let xdg = Project::new();
    let base = format!("http://{up}");
    let env = [
        ("ANTHROPIC_BASE_URL", base.as_str()),
        ("ANTHROPIC_API_KEY", "sk-test"),
        ("XDG_CONFIG_HOME", xdg.path().to_str().expect("utf-8")),
    ];
    // cron: the exported key would not reach the tick; install says so and how.
    let r = d.run(
        &["schedule", "install", "--loop", "l", "--platform", "cron"],
        &env,
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.lines().any(|l| l == "key: a scheduled tick does not see your shell's ANTHROPIC_API_KEY: add a line `ANTHROPIC_API_KEY=…` above loopflow's entry with `crontab -e` (your crontab is readable only by you), or log in with `claude` once (its own login works in every schedule)"),
        "{r:?}"
    );
    let (code, got) = d.checks(&env);
    assert_eq!(code, 1, "{got:?}");
    assert!(
        got.last()
            .is_some_and(|l| l.starts_with("schedule: FAIL cron schedule")),
        "{got:?}"
    );
    // The key in the crontab: seen.
    let tab = d.bin.join("crontab.txt");
    let text = std::fs::read_to_string(&tab).expect("crontab");
    std::fs::write(&tab, format!("ANTHROPIC_API_KEY=sk-test\n{text}")).expect("crontab");
    let (code, got) = d.checks(&env);
    assert_eq!(code, 0, "{got:?}");
    assert_eq!(
        got.last().map(String::as_str),
        Some("schedule: ok cron schedule: ANTHROPIC_API_KEY comes from a line of your crontab")
    );

    // systemd: the service reads ~/.config/loopflow/env; with the CLI's login instead,
    // install says the login is what the tick uses.
    d.home.write(".claude/.credentials.json", "{}");
    let r = d.run(
        &[
            "schedule",
            "install",
            "--loop",
            "l",
            "--platform",
            "systemd",
        ],
        &env,
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.lines().any(|l| l
            == "key: claude logs in from its own login file, which a scheduled tick reads as you"),
        "{r:?}"
    );
    let service = std::fs::read_dir(xdg.join("systemd/user"))
        .expect("units")
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(".service"))
        .map(|e| std::fs::read_to_string(e.path()).expect("service"))
        .expect("a service");
    assert!(
        service.contains("\nEnvironmentFile=-%h/.config/loopflow/env\n"),
        "{service}"
    );
}
