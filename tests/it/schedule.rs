//! Native schedulers: generated files judged by the real validators (systemd-analyze,
//! actionlint, kubernetes-validate, python3 plistlib) when they are installed (CI installs
//! them; a missing one prints a notice), install/uninstall idempotence through fake
//! `crontab`/`systemctl` programs on PATH, HALT disabling and `approve` re-enabling the
//! schedule, and (behind LOOPFLOW_TEST_REAL_CRON=1) a line fired by a real cron daemon.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::{Project, Run, bin, git, git_commit, have, loopflow, standard_agent};

/// A git project with loop `l` (a worktree of its own) and the given interval.
fn project(interval: u64) -> Project {
    let p = Project::git();
    let r = p.lf(&["create", "--loop", "l", "--task", "t"]);
    assert_eq!(r.code, 0, "{r:?}");
    let cfg = p.read(".loopflow/loops/l/loop.toml").replace(
        "interval_seconds = 3600",
        &format!("interval_seconds = {interval}"),
    );
    p.write(".loopflow/loops/l/loop.toml", &cfg);
    p
}

/// Points loop `l`'s roles at the standard fake agent with these verdicts.
fn use_agent(p: &Project, verdicts: &[&str]) {
    use_agent_in(p, ".loopflow/loops/l/loop.toml", verdicts);
}

/// [`use_agent`] for the loop.toml at `cfg_path` (relative to `p`).
fn use_agent_in(p: &Project, cfg_path: &str, verdicts: &[&str]) {
    let agent = standard_agent(p, verdicts);
    let cfg = p.read(cfg_path);
    let cfg = cfg
        .lines()
        .map(|l| {
            // The template's agent line (`preset = "opencode"`).
            if l.starts_with("preset = ") || l.starts_with("command = ") {
                format!(
                    "command = [\"{}\", \"{{{{role}}}}\", \"{{{{prompt}}}}\"]",
                    agent.display()
                )
            } else if l.starts_with("max_iterations") {
                format!("{l}\ncontext_tokens = 32000")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    // The fake agent reads its verdicts from the main checkout, which the sandbox hides.
    let cfg = format!(
        "{cfg}\n\n[sandbox]\nread = [{}]\n",
        crate::support::toml::string(&p.join("verdicts").display().to_string())
    );
    p.write(cfg_path, &cfg);
}

/// The flags a platform needs: where a workflow installs loopflow from, the image a
/// CronJob runs. The URL is never fetched here.
pub const REPO: &str = "https://git.example.org/loopflow.git";

fn platform_args(platform: &str) -> Vec<&'static str> {
    match platform {
        "github-actions" => vec!["--repo", REPO],
        "kubernetes" => vec!["--image", "registry.example.org/loopflow:0.1.0"],
        _ => vec![],
    }
}

fn print(p: &Project, platform: &str) -> String {
    let mut args = vec!["schedule", "print", "--loop", "l", "--platform", platform];
    args.extend(platform_args(platform));
    let r = p.lf(&args);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stderr.is_empty(), "print writes to stdout only: {r:?}");
    r.stdout
}

fn exe() -> String {
    bin().canonicalize().unwrap().display().to_string()
}

/// Splits systemd print output into (service, timer, timer file name).
fn split_systemd(text: &str) -> (String, String, String) {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "[Unit]", "{text}");
    let second = lines
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, l)| **l == "[Unit]")
        .map(|(i, _)| i)
        .expect("a second [Unit] (the timer)");
    // Between the two files only `#` comments (and blank lines).
    let mut sep = second;
    while sep > 0 && (lines[sep - 1].starts_with('#') || lines[sep - 1].is_empty()) {
        sep -= 1;
    }
    for l in &lines[sep..second] {
        assert!(l.is_empty() || l.starts_with('#'), "{l:?}");
    }
    let name = lines[sep..second]
        .iter()
        .find_map(|l| l.strip_prefix("# ---- "))
        .expect("separator comment names the timer")
        .to_string();
    (
        lines[..sep].join("\n") + "\n",
        lines[second..].join("\n") + "\n",
        name,
    )
}

#[test]
fn systemd_units_pass_systemd_analyze() {
    let p = project(900);
    let text = print(&p, "systemd");
    let (service, timer, timer_name) = split_systemd(&text);
    assert!(timer_name.ends_with(".timer"), "{timer_name}");
    let exec = format!(
        "ExecStart={} run --loop l --project {}",
        exe(),
        p.path().canonicalize().unwrap().display()
    );
    assert!(service.contains(&exec), "{service}");
    assert!(service.contains("Type=oneshot"), "{service}");
    // The tick gets the installer's PATH, so the agent is found as in their shell.
    assert!(service.contains("\nEnvironment=\"PATH=/"), "{service}");
    assert!(timer.contains("OnUnitActiveSec=900s"), "{timer}");
    assert!(timer.contains("WantedBy=timers.target"), "{timer}");
    if !have("systemd-analyze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let base = timer_name.trim_end_matches(".timer");
    let svc = dir.path().join(format!("{base}.service"));
    let tmr = dir.path().join(&timer_name);
    std::fs::write(&svc, &service).unwrap();
    std::fs::write(&tmr, &timer).unwrap();
    let rt = tempfile::tempdir().unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--user"])
        .arg(&svc)
        .arg(&tmr)
        .env("XDG_RUNTIME_DIR", rt.path())
        .current_dir(dir.path())
        .output()
        .unwrap();
    // It may exit 0 on problems: its output must be empty too.
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );

    // The validator really judges: a unit with a relative ExecStart is reported.
    std::fs::write(&svc, service.replace(&exe(), "loopflow-relative")).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--user"])
        .arg(&svc)
        .env("XDG_RUNTIME_DIR", rt.path())
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!said.trim().is_empty(), "a broken unit must be reported");
}

#[test]
fn cron_line_is_first_and_wrapped_in_flock() {
    let p = project(300);
    let text = print(&p, "cron");
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .unwrap();
    assert!(line.starts_with("*/5 * * * * "), "{line}");
    assert!(line.contains("flock' -n '"), "{line}");
    assert!(
        line.contains(&format!("'{}' 'run' '--loop' 'l' '--project' ", exe())),
        "{line}"
    );
    // An interval cron cannot express is rounded, and says so.
    let p = project(420);
    let text = print(&p, "cron");
    assert!(
        text.contains("# note: cron cannot fire every 420 s"),
        "{text}"
    );
}

#[test]
fn github_workflow_passes_actionlint() {
    let p = project(3600);
    let text = print(&p, "github-actions");
    assert!(text.contains("cron: \"0 * * * *\""), "{text}");
    assert!(text.contains("cancel-in-progress: false"), "{text}");
    assert!(text.contains("actions/checkout@v5"), "{text}");
    if !have("actionlint") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("loopflow-l.yml");
    std::fs::write(&f, &text).unwrap();
    let out = Command::new("actionlint").arg(&f).output().unwrap();
    assert!(
        out.status.success(),
        "actionlint: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `schedule install` of a project in a subdirectory writes the workflow where GitHub
/// reads workflows, the repository's top, named for the project's place so two projects'
/// loops `l` do not collide; actionlint accepts it; `uninstall` removes it.
#[test]
fn github_install_of_a_subdirectory_project_writes_at_the_repository_top() {
    let p = Project::git();
    let proj = p.join("services/api");
    std::fs::create_dir_all(&proj).unwrap();
    let lf = |args: &[&str]| {
        let r = Run::of(loopflow(p.path()).arg("--project").arg(&proj).args(args));
        assert_eq!(r.code, 0, "{args:?}: {r:?}");
        r.stdout
    };
    lf(&["create", "--loop", "l", "--task", "t"]);
    let mut args = vec![
        "schedule",
        "install",
        "--loop",
        "l",
        "--platform",
        "github-actions",
    ];
    args.extend(platform_args("github-actions"));
    lf(&args);
    let wf = p.join(".github/workflows/loopflow-services-api-l.yml");
    let text = std::fs::read_to_string(&wf).unwrap_or_else(|e| panic!("{}: {e}", wf.display()));
    assert!(!proj.join(".github").exists(), "written inside the project");
    for want in [
        "group: loopflow-services-api-l",
        "key: loopflow-services-api-l-",
        "--project \"$GITHUB_WORKSPACE/services/api\"",
        "services/api/.loopflow/loops/l/.state.loop",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    if have("actionlint") {
        let out = Command::new("actionlint").arg(&wf).output().unwrap();
        assert!(
            out.status.success(),
            "actionlint: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    lf(&["schedule", "uninstall", "--loop", "l"]);
    assert!(!wf.exists(), "uninstall left the workflow");
}

#[test]
fn kubernetes_cronjob_passes_kubernetes_validate() {
    let p = project(600);
    let text = print(&p, "kubernetes");
    assert!(text.contains("concurrencyPolicy: Forbid"), "{text}");
    assert!(text.contains("startingDeadlineSeconds: 300"), "{text}");
    assert!(text.contains("schedule: \"*/10 * * * *\""), "{text}");
    if !have("kubernetes-validate") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let validate = |text: &str| {
        let f = dir.path().join("manifests.yaml");
        std::fs::write(&f, text).unwrap();
        let out = Command::new("kubernetes-validate")
            .arg("--strict")
            .arg(&f)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), said)
    };
    let (ok, said) = validate(&text);
    assert!(ok, "kubernetes-validate: {said}");
    // Both documents were checked, the claim the CronJob mounts among them.
    assert!(
        said.contains("persistentvolumeclaim/loopflow-l-project passed")
            || said.contains("passed for resource persistentvolumeclaim/loopflow-l-project"),
        "{said}"
    );
    assert!(said.contains("cronjob/loopflow-l"), "{said}");
    // The control: strict mode rejects a field the schema does not have.
    let (ok, said) = validate(&text.replace(
        "concurrencyPolicy: Forbid",
        "concurrencyPolicy: Forbid\n  concurency: 1",
    ));
    assert!(!ok, "kubernetes-validate accepted an unknown field: {said}");
}

/// Runs a python3 snippet on `input`; `None` when python3 is missing.
fn python(code: &str, input: &[u8]) -> Option<String> {
    if !have("python3") {
        return None;
    }
    use std::io::Write;
    let mut c = Command::new("python3")
        .args(["-c", code])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(input).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "python3: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn launchd_plist_parses_with_plistlib() {
    let p = project(1800);
    let text = print(&p, "launchd");
    let Some(json) = python(
        "import plistlib,sys,json; print(json.dumps(plistlib.loads(sys.stdin.buffer.read())))",
        text.as_bytes(),
    ) else {
        return;
    };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["StartInterval"], 1800);
    assert!(
        v["EnvironmentVariables"]["PATH"]
            .as_str()
            .unwrap()
            .contains('/')
    );
    assert_eq!(v["ProgramArguments"][0], exe());
    assert_eq!(v["ProgramArguments"][1], "run");
    assert_eq!(v["ProgramArguments"][3], "l");
    assert!(v["Label"].as_str().unwrap().starts_with("loopflow-l-"));
}

#[test]
fn schtasks_xml_is_well_formed() {
    let p = project(3600);
    let text = print(&p, "schtasks");
    // Printed as UTF-8 text, the file says so (the installed one is UTF-16 and says that;
    // a unit test of schtasks.rs checks its bytes).
    assert!(
        text.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"),
        "{text}"
    );
    let Some(out) = python(
        "import sys,xml.etree.ElementTree as E; r=E.fromstring(sys.stdin.buffer.read()); ns={'t':'http://schemas.microsoft.com/windows/2004/02/mit/task'}; print(r.find('.//t:Interval',ns).text, r.find('.//t:MultipleInstancesPolicy',ns).text, r.find('.//t:Command',ns).text)",
        text.as_bytes(),
    ) else {
        return;
    };
    assert_eq!(out.trim(), format!("PT3600S IgnoreNew {}", exe()));
}

/// A directory with fake `crontab` and `systemctl` programs that keep their state in
/// files, so install/uninstall can be tested without touching the machine's scheduler.
struct Fakes {
    dir: Project,
}

impl Fakes {
    fn new(systemctl_ok: bool) -> Fakes {
        let dir = Project::new();
        let d = dir.path().display().to_string();
        dir.script(
            "crontab",
            &format!(
                r#"f="{d}/crontab.txt"
case "$1" in
  -l) [ -f "$f" ] || {{ echo "no crontab for tester" >&2; exit 1; }}; cat "$f" ;;
  -) cat > "$f" ;;
  *) exit 2 ;;
esac"#
            ),
        );
        dir.script(
            "systemctl",
            &format!(
                "echo \"$*\" >> \"{d}/systemctl.log\"\nexit {}",
                if systemctl_ok { 0 } else { 1 }
            ),
        );
        Fakes { dir }
    }

    fn env(&self, xdg: &Path) -> Vec<(String, String)> {
        let path = format!(
            "{}:{}",
            self.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        vec![
            ("PATH".into(), path),
            ("XDG_CONFIG_HOME".into(), xdg.display().to_string()),
        ]
    }

    fn crontab(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("crontab.txt")).unwrap_or_default()
    }

    fn systemctl_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("systemctl.log")).unwrap_or_default()
    }
}

fn lf(p: &Project, env: &[(String, String)], args: &[&str]) -> Run {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    p.lf_env(args, &env)
}

#[test]
fn auto_picks_systemd_when_the_user_manager_answers_else_cron() {
    let p = project(3600);
    let xdg = tempfile::tempdir().unwrap();
    let yes = Fakes::new(true);
    let r = lf(
        &p,
        &yes.env(xdg.path()),
        &["schedule", "print", "--loop", "l"],
    );
    assert!(r.stdout.starts_with("[Unit]"), "{r:?}");
    let no = Fakes::new(false);
    let r = lf(
        &p,
        &no.env(xdg.path()),
        &["schedule", "print", "--loop", "l"],
    );
    assert!(r.stdout.lines().any(|l| l.contains("flock")), "{r:?}");
}

#[test]
fn cron_install_is_idempotent_halt_disables_approve_reenables_uninstall_reverts() {
    let p = project(60);
    let xdg = tempfile::tempdir().unwrap();
    let f = Fakes::new(false);
    std::fs::write(
        f.dir.path().join("crontab.txt"),
        "MAILTO=someone\n0 0 * * * /bin/true\n",
    )
    .unwrap();
    let env = f.env(xdg.path());
    for _ in 0..2 {
        let r = lf(
            &p,
            &env,
            &["schedule", "install", "--loop", "l", "--platform", "cron"],
        );
        assert_eq!(r.code, 0, "{r:?}");
    }
    let tab = f.crontab();
    assert!(
        tab.starts_with("MAILTO=someone\n0 0 * * * /bin/true\n"),
        "{tab}"
    );
    assert_eq!(
        tab.matches("'run' '--loop' 'l'").count(),
        1,
        "installed once: {tab}"
    );
    let rec: serde_json::Value =
        serde_json::from_str(&p.read(".loopflow/loops/l/.schedule.json")).unwrap();
    assert_eq!(rec["platform"], "cron");
    assert_eq!(rec["enabled"], true);

    // A HALT comments the entry out and says so in the log.
    let r = lf(&p, &env, &["halt", "--loop", "l", "--reason", "stop"]);
    assert_eq!(r.code, 0, "{r:?}");
    let tab = f.crontab();
    assert!(tab.contains("#halted# * * * * *"), "{tab}");
    assert!(
        p.events("l")
            .iter()
            .any(|e| e == "SCHEDULE disabled=true platform=cron"),
        "{:?}",
        p.events("l")
    );
    // approve turns it back on.
    let r = lf(&p, &env, &["approve", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let tab = f.crontab();
    assert!(
        !tab.contains("#halted#") && tab.contains("\n* * * * * "),
        "{tab}"
    );
    assert!(
        p.events("l")
            .iter()
            .any(|e| e == "SCHEDULE enabled=true platform=cron")
    );

    for _ in 0..2 {
        let r = lf(&p, &env, &["schedule", "uninstall", "--loop", "l"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    assert_eq!(f.crontab(), "MAILTO=someone\n0 0 * * * /bin/true\n");
    assert!(!p.loop_dir("l").join(".schedule.json").exists());
    // Nothing scheduling wrote shows in the main checkout's git status.
    let status = p.git_cmd(&["status", "--porcelain", "--untracked-files=all"]);
    assert!(!status.contains(".schedule"), "{status}");
}

#[test]
fn systemd_install_writes_units_enables_timer_and_uninstall_removes_them() {
    let p = project(120);
    let xdg = tempfile::tempdir().unwrap();
    let f = Fakes::new(true);
    let env = f.env(xdg.path());
    for _ in 0..2 {
        let r = lf(
            &p,
            &env,
            &[
                "schedule",
                "install",
                "--loop",
                "l",
                "--platform",
                "systemd",
            ],
        );
        assert_eq!(r.code, 0, "{r:?}");
    }
    // A user without lingering is told that the timer stops at logout.
    let mut nobody = env.clone();
    nobody.push(("USER".into(), "loopflow-test-no-linger".into()));
    let r = lf(
        &p,
        &nobody,
        &[
            "schedule",
            "install",
            "--loop",
            "l",
            "--platform",
            "systemd",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("loginctl enable-linger $USER"), "{r:?}");
    let units: Vec<PathBuf> = std::fs::read_dir(xdg.path().join("systemd/user"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(units.len(), 2, "{units:?}");
    let log = f.systemctl_log();
    assert!(log.contains("--user daemon-reload"), "{log}");
    assert!(
        log.lines()
            .any(|l| l.starts_with("--user enable --now loopflow-l-") && l.ends_with(".timer")),
        "{log}"
    );
    // A HALT from a tick (an unparseable verdict) disables the timer.
    use_agent(&p, &["no verdict here"]);
    let r = lf(&p, &env, &["run", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    let ev = p.events("l");
    assert!(
        ev.iter()
            .any(|e| e.starts_with("HALT verifier_failed:unparseable")),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| e == "SCHEDULE disabled=true platform=systemd"),
        "{ev:?}"
    );
    assert!(
        f.systemctl_log()
            .lines()
            .any(|l| l.starts_with("--user disable --now"))
    );
    let r = lf(&p, &env, &["schedule", "uninstall", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        std::fs::read_dir(xdg.path().join("systemd/user"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn systemd_install_without_a_user_manager_fails_clearly() {
    let p = project(120);
    let xdg = tempfile::tempdir().unwrap();
    let f = Fakes::new(false);
    let r = lf(
        &p,
        &f.env(xdg.path()),
        &[
            "schedule",
            "install",
            "--loop",
            "l",
            "--platform",
            "systemd",
        ],
    );
    assert_ne!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains("could not be enabled") && r.stderr.contains("--platform cron"),
        "{r:?}"
    );
    // What was written is recorded, so uninstall takes it away again.
    assert_eq!(
        std::fs::read_dir(xdg.path().join("systemd/user"))
            .unwrap()
            .count(),
        2
    );
    let r = lf(
        &p,
        &f.env(xdg.path()),
        &["schedule", "uninstall", "--loop", "l"],
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert_eq!(
        std::fs::read_dir(xdg.path().join("systemd/user"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn foreign_platforms_are_refused_or_written_to_documented_places() {
    let p = project(3600);
    if cfg!(target_os = "linux") {
        for platform in ["launchd", "schtasks"] {
            let r = p.lf(&["schedule", "install", "--loop", "l", "--platform", platform]);
            assert_eq!(r.code, 4, "{r:?}");
            assert!(r.stderr.contains("this is Linux"), "{r:?}");
        }
    }
    let install = |platform: &str| {
        let mut args = vec!["schedule", "install", "--loop", "l", "--platform", platform];
        args.extend(platform_args(platform));
        p.lf(&args)
    };
    let r = install("github-actions");
    assert_eq!(r.code, 0, "{r:?}");
    assert!(p.join(".github/workflows/loopflow-l.yml").is_file());
    // Switching platform replaces the earlier schedule.
    let r = install("kubernetes");
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!p.join(".github/workflows/loopflow-l.yml").exists());
    assert!(p.loop_dir("l").join("loopflow-l.yaml").is_file());
    // A HALT cannot reach a cluster: the log says so.
    let r = p.lf(&["halt", "--loop", "l", "--reason", "x"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        p.events("l")
            .iter()
            .any(|e| e.starts_with("SCHEDULE disabled=false platform=kubernetes reason=")),
        "{:?}",
        p.events("l")
    );
    let r = p.lf(&["schedule", "uninstall", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(!p.loop_dir("l").join("loopflow-l.yaml").exists());
}

#[test]
fn unknown_loop_and_bad_platform_are_usage_errors() {
    let p = project(3600);
    assert_eq!(p.lf(&["schedule", "print", "--loop", "nope"]).code, 2);
    assert_eq!(p.lf(&["schedule", "print", "--loop", "../x"]).code, 2);
    assert_eq!(
        p.lf(&["schedule", "print", "--loop", "l", "--platform", "at"])
            .code,
        2
    );
}

/// Installs a one-minute crontab entry in the real crontab, runs a real cron daemon and
/// waits (up to 150 s) for the loop's log to show a tick fired by it. Opt-in:
/// LOOPFLOW_TEST_REAL_CRON=1 (it edits the user's real crontab, restoring it after).
#[test]
fn real_cron_fires_the_line() {
    if std::env::var("LOOPFLOW_TEST_REAL_CRON").as_deref() != Ok("1") {
        println!("NOTICE: set LOOPFLOW_TEST_REAL_CRON=1 to run the real-cron test");
        return;
    }
    assert!(have("crontab") && (Path::new("/usr/sbin/cron").exists() || have("cron")));
    let p = project(60);
    // A full tick in cron's bare environment (cwd $HOME, tiny PATH), fake agent included.
    use_agent(&p, &[r#"{"pass": true, "score": 0.5}"#]);
    let before = Command::new("crontab").arg("-l").output().unwrap();
    let r = p.lf(&["schedule", "install", "--loop", "l", "--platform", "cron"]);
    assert_eq!(r.code, 0, "{r:?}");
    let cron = if Path::new("/usr/sbin/cron").exists() {
        "/usr/sbin/cron"
    } else {
        "cron"
    };
    // `-f` keeps it in the foreground as our child; if one already runs, it exits at once
    // and the running one fires the line.
    let mut daemon = Command::new(cron).arg("-f").spawn().unwrap();
    let start = std::time::Instant::now();
    let mut fired = false;
    while start.elapsed() < std::time::Duration::from_secs(150) {
        if p.events("l").iter().any(|e| e.starts_with("TICK ")) {
            fired = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
    let r = p.lf(&["schedule", "uninstall", "--loop", "l"]);
    assert_eq!(r.code, 0, "{r:?}");
    if before.status.success() {
        use std::io::Write;
        let mut c = Command::new("crontab")
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(&before.stdout).unwrap();
        c.wait().unwrap();
    }
    assert!(
        fired,
        "cron did not fire the line within 150 s: {:?}",
        p.events("l")
    );
}

/// The workflow's own `run:` steps, executed in order with bash (as GitHub does) in a
/// fresh clone, twice: the first manual run starts the loop with its task and ticks; the
/// second, with the state "restored from the cache", ticks again. `uses:` steps (checkout,
/// cache) are done by the test; `Install loopflow` is replaced by this build on PATH.
#[test]
fn github_workflow_steps_tick_in_a_fresh_clone() {
    workflow_steps_tick_in_a_fresh_clone("");
}

/// The same workflow for a project in a subdirectory of its repository (a monorepo):
/// its paths are the checkout's, loopflow is pointed at the project.
#[test]
fn github_workflow_steps_tick_for_a_project_in_a_subdirectory() {
    workflow_steps_tick_in_a_fresh_clone("services/api");
}

fn workflow_steps_tick_in_a_fresh_clone(sub: &str) {
    if !have("python3") {
        return;
    }
    let yaml_ok = Command::new("python3")
        .args(["-c", "import yaml"])
        .status()
        .is_ok_and(|s| s.success());
    if !yaml_ok {
        assert!(
            std::env::var("LOOPFLOW_REQUIRE_VALIDATORS").as_deref() != Ok("1"),
            "PyYAML is required (it comes with kubernetes-validate)"
        );
        println!("NOTICE: PyYAML missing; skipping the workflow run");
        return;
    }
    let p = Project::git();
    // The loopflow project: the repository's root, or a directory inside it.
    let proj = p.join(sub);
    std::fs::create_dir_all(&proj).unwrap();
    let at = |rel: &str| {
        if sub.is_empty() {
            rel.to_string()
        } else {
            format!("{sub}/{rel}")
        }
    };
    let lf = |args: &[&str]| {
        let r = Run::of(loopflow(p.path()).arg("--project").arg(&proj).args(args));
        assert_eq!(r.code, 0, "{args:?}: {r:?}");
        r.stdout
    };
    lf(&["create", "--loop", "l", "--task", "t"]);
    use_agent_in(
        &p,
        &at(".loopflow/loops/l/loop.toml"),
        &[r#"{"pass": false, "score": 0.5}"#],
    );
    let mut args = vec![
        "schedule",
        "print",
        "--loop",
        "l",
        "--platform",
        "github-actions",
    ];
    args.extend(platform_args("github-actions"));
    let wf = lf(&args);
    // The agent lives outside the repository; the loop's config is committed.
    let tools = tempfile::tempdir().unwrap();
    let agent = tools.path().join("agent.sh");
    std::fs::rename(p.join("agent.sh"), &agent).unwrap();
    let cfg = p.read(&at(".loopflow/loops/l/loop.toml")).replace(
        &p.join("agent.sh").display().to_string(),
        &agent.display().to_string(),
    );
    p.write(&at(".loopflow/loops/l/loop.toml"), &cfg);
    p.git_cmd(&["add", &at(".loopflow"), "verdicts"]);
    git_commit(p.path(), "loop config");
    let status = p.git_cmd(&["status", "--porcelain"]);
    assert!(!status.contains(".state"), "{status}");
    let remote = tools.path().join("remote.git");
    git(
        tools.path(),
        &[
            "clone",
            "-q",
            "--bare",
            &p.path().display().to_string(),
            &remote.display().to_string(),
        ],
    );
    std::os::unix::fs::symlink(bin(), tools.path().join("loopflow")).unwrap();

    let steps_json = python(
        "import yaml,sys,json; w=yaml.safe_load(sys.stdin); print(json.dumps(w['jobs']['tick']['steps']))",
        wf.as_bytes(),
    )
    .unwrap();
    let steps: Vec<serde_json::Value> = serde_json::from_str(&steps_json).unwrap();
    let work = tempfile::tempdir().unwrap();
    let ws = work.path().join("repo");
    let cache = tools.path().join("cache");
    let run_workflow = |task: &str| {
        let _ = std::fs::remove_dir_all(&ws);
        git(
            work.path(),
            &[
                "clone",
                "-q",
                &remote.display().to_string(),
                &ws.display().to_string(),
            ],
        );
        let dir = ws.join(at(".loopflow/loops/l"));
        for f in [".state.loop", ".state.log"] {
            if cache.join(f).exists() {
                std::fs::copy(cache.join(f), dir.join(f)).unwrap();
            }
        }
        let rt = tempfile::tempdir().unwrap();
        for step in &steps {
            let Some(script) = step["run"].as_str() else {
                continue; // `uses:` steps
            };
            let name = step["name"].as_str().unwrap_or("");
            // This build is on PATH; the agent is the fake one.
            if name.starts_with("Install ") {
                continue;
            }
            match step["if"].as_str() {
                Some(c) if c.starts_with("hashFiles(") && dir.join(".state.loop").exists() => {
                    continue;
                }
                Some(c) if c.starts_with("hashFiles(") => {}
                Some("inputs.approve") => continue,
                Some(other) => panic!("unexpected condition {other}"),
                None => {}
            }
            let o = Command::new("bash")
                .args(["--noprofile", "--norc", "-eo", "pipefail", "-c", script])
                .current_dir(&ws)
                .env(
                    "PATH",
                    format!(
                        "{}:{}",
                        tools.path().display(),
                        std::env::var("PATH").unwrap()
                    ),
                )
                .env("GITHUB_WORKSPACE", &ws)
                .env("RUNNER_TEMP", rt.path())
                .env("TASK", task)
                .env_remove("LOOPFLOW_PROJECT")
                .output()
                .unwrap();
            assert!(
                o.status.success(),
                "step {name:?} failed:\n{script}\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::fs::create_dir_all(&cache).unwrap();
        for f in [".state.loop", ".state.log"] {
            std::fs::copy(dir.join(f), cache.join(f)).unwrap();
        }
        let state: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(".state.loop")).unwrap())
                .unwrap();
        state
    };
    let s = run_workflow("the task from the manual run");
    assert_eq!(s["iteration_count"], 1, "{s}");
    assert_eq!(s["current_task"], "the task from the manual run");
    // The first run started the committed loop as it is.
    let log = std::fs::read_to_string(ws.join(at(".loopflow/loops/l/.state.log"))).unwrap();
    assert!(log.contains("CREATE adopted=loop.toml"), "{log}");
    assert_eq!(
        std::fs::read_to_string(ws.join(at(".loopflow/loops/l/loop.toml"))).unwrap(),
        cfg
    );
    let s = run_workflow("");
    assert_eq!(s["iteration_count"], 2, "{s}");
    let o = Command::new("git")
        .args(["rev-parse", "--verify", "loopflow/l"])
        .current_dir(&remote)
        .output()
        .unwrap();
    assert!(o.status.success(), "the loop's branch was not pushed");
}

/// The crontab line's command, run the way cron does (`%` unescaped, then `/bin/sh -c`),
/// for a project whose path has a space, a quote, `%` and `$`: the tick reaches the
/// right loop with every argument intact.
#[test]
fn cron_line_quoting_survives_a_hostile_project_path() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("it's 100% a $HOME dir");
    std::fs::create_dir_all(&dir).unwrap();
    let lf = |args: &[&str]| {
        let r = Run::of(loopflow(base.path()).arg("--project").arg(&dir).args(args));
        assert_eq!(r.code, 0, "{args:?}: {r:?}");
        r.stdout
    };
    lf(&["create", "--loop", "q", "--no-worktree"]);
    let text = lf(&["schedule", "print", "--loop", "q", "--platform", "cron"]);
    let line = text.lines().find(|l| !l.starts_with('#')).unwrap();
    let command: String = line.splitn(6, ' ').nth(5).unwrap().replace("\\%", "%");
    let o = Command::new("/bin/sh")
        .args(["-c", &command])
        .current_dir(base.path())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // No task: the tick skips, and says so in that loop's own log.
    let log = std::fs::read_to_string(dir.join(".loopflow/loops/q/.state.log")).unwrap();
    assert!(log.contains("SKIP reason=no_current_task"), "{log}");
}

/// `worktree gc` removes the schedules of loops whose directory was deleted (their record
/// went with the directory, so `schedule uninstall` no longer finds them): a crontab block
/// and systemd units; it keeps the schedules of live loops and of another project's loop
/// of the same name. `--dry-run` only says what it would remove.
#[test]
fn worktree_gc_removes_the_schedules_of_deleted_loops_only() {
    let p = project(60);
    for name in ["m", "k", "s"] {
        let r = p.lf(&["create", "--loop", name, "--task", "t"]);
        assert_eq!(r.code, 0, "{r:?}");
    }
    let other = project(60);
    let xdg = tempfile::tempdir().unwrap();
    let f = Fakes::new(true);
    let env = f.env(xdg.path());
    for (proj, name, platform) in [
        (&p, "l", "cron"),
        (&p, "k", "cron"),
        (&p, "m", "systemd"),
        (&p, "s", "cron"),
        (&other, "l", "cron"),
    ] {
        let r = lf(
            proj,
            &env,
            &[
                "schedule",
                "install",
                "--loop",
                name,
                "--platform",
                platform,
            ],
        );
        assert_eq!(r.code, 0, "{r:?}");
    }
    let units = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(xdg.path().join("systemd/user"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    assert_eq!(units().len(), 2, "{:?}", units());
    for name in ["l", "m", "s"] {
        std::fs::remove_dir_all(p.path().join(".loopflow/loops").join(name)).unwrap();
    }
    // A loop directory that cannot be looked at (here a link to a disk not mounted) is not
    // a deleted loop: its schedule stays.
    std::os::unix::fs::symlink(
        "/nonexistent/loopflow-test/s",
        p.path().join(".loopflow/loops/s"),
    )
    .unwrap();
    let blocks = |tab: &str, proj: &Project, name: &str| {
        let quoted = format!("'--loop' '{name}'");
        let project = proj.path().canonicalize().unwrap().display().to_string();
        tab.lines()
            .filter(|l| l.contains(&quoted) && l.contains(&project))
            .count()
    };
    let before = f.crontab();
    assert_eq!(blocks(&before, &p, "l"), 1, "{before}");

    let r = lf(&p, &env, &["worktree", "gc", "--dry-run"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        r.stdout.contains("would remove schedule loopflow-l-")
            && r.stdout.contains("(cron, the crontab) of deleted loop l"),
        "{r:?}"
    );
    assert!(
        r.stdout.contains("would remove schedule loopflow-m-")
            && r.stdout.contains("of deleted loop m"),
        "{r:?}"
    );
    assert!(!r.stdout.contains("loop k"), "{r:?}");
    assert_eq!(f.crontab(), before, "a dry run changes nothing");
    assert_eq!(units().len(), 2);

    let r = lf(&p, &env, &["worktree", "gc"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("removed schedule loopflow-l-"), "{r:?}");
    assert!(
        r.stdout.contains("removed schedule loopflow-m-") && r.stdout.contains("(systemd, "),
        "{r:?}"
    );
    let after = f.crontab();
    assert_eq!(blocks(&after, &p, "l"), 0, "{after}");
    assert_eq!(
        blocks(&after, &p, "k"),
        1,
        "a live loop keeps its schedule: {after}"
    );
    assert_eq!(
        blocks(&after, &p, "s"),
        1,
        "a loop directory that cannot be looked at keeps its schedule: {after}"
    );
    assert_eq!(
        blocks(&after, &other, "l"),
        1,
        "another project's loop of the same name keeps its schedule: {after}"
    );
    assert_eq!(
        units(),
        Vec::<String>::new(),
        "the deleted loop's units are gone"
    );
    assert!(
        f.systemctl_log()
            .contains("--user disable --now loopflow-m-"),
        "{}",
        f.systemctl_log()
    );

    let r = lf(&p, &env, &["worktree", "gc"]);
    assert_eq!(r.code, 0, "{r:?}");
    assert!(
        !r.stdout.contains("schedule"),
        "nothing left to remove: {r:?}"
    );
}
