//! Native schedulers (DESIGN §9, D1): renders the unit/plist/crontab/task/workflow/CronJob
//! that fires `<exe> run --loop X --project DIR` every `[schedule] interval_seconds`,
//! installs and uninstalls it idempotently, and keeps a record (`.schedule.json` in the
//! loop dir) so a HALT can disable the schedule and `approve` can re-enable it.
//!
//! Choices a user may ask about:
//! - systemd: a `Type=oneshot` service plus a timer with `OnActiveSec`/`OnUnitActiveSec`
//!   (any interval in seconds; a oneshot service that is still running is never started
//!   twice, so ticks cannot overlap).
//! - launchd: `StartInterval`, because it expresses any `interval_seconds` exactly;
//!   `StartCalendarInterval` only knows calendar fields. A tick missed while the Mac
//!   sleeps is not made up; the next one fires on schedule (loopflow's lock still applies).
//! - cron: the entry is wrapped in `flock -n` on `.schedule.lock` so ticks never overlap;
//!   intervals cron cannot express are rounded to the nearest one it can, with a comment.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::state::{Event, LogArg, LoopPaths};

/// Where a schedule can be generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Platform {
    Auto,
    Systemd,
    Launchd,
    Cron,
    Schtasks,
    GithubActions,
    Kubernetes,
}

impl Platform {
    pub fn name(self) -> &'static str {
        match self {
            Platform::Auto => "auto",
            Platform::Systemd => "systemd",
            Platform::Launchd => "launchd",
            Platform::Cron => "cron",
            Platform::Schtasks => "schtasks",
            Platform::GithubActions => "github-actions",
            Platform::Kubernetes => "kubernetes",
        }
    }
}

/// What a generated schedule needs to know.
#[derive(Debug, Clone)]
pub struct Target {
    pub exe: PathBuf,
    pub project: PathBuf,
    pub loop_name: String,
    pub interval: u64,
    pub loop_dir: PathBuf,
    /// The PATH at install time, given to the tick: cron's and systemd's own PATH are
    /// minimal, and the agent (`opencode`, `claude`, …) usually lives elsewhere.
    pub path_env: Option<String>,
}

impl Target {
    /// `<exe> run --loop X --project DIR`, one element per argument.
    pub fn argv(&self) -> Vec<String> {
        vec![
            self.exe.display().to_string(),
            "run".into(),
            "--loop".into(),
            self.loop_name.clone(),
            "--project".into(),
            self.project.display().to_string(),
        ]
    }

    /// A machine-wide unique name: the loop name plus a short hash of the project path,
    /// so two projects with a loop of the same name never share a unit or crontab block.
    pub fn label(&self) -> String {
        format!("loopflow-{}-{:08x}", self.loop_name, fnv32(&self.project))
    }
}

fn fnv32(p: &Path) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in p.as_os_str().as_encoded_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// One generated file: its name and text.
#[derive(Debug, Clone)]
pub struct File {
    pub name: String,
    pub text: String,
}

/// Picks the scheduler native to this machine.
pub fn auto() -> Platform {
    if cfg!(target_os = "macos") {
        Platform::Launchd
    } else if cfg!(windows) {
        Platform::Schtasks
    } else if systemctl_user_works() {
        Platform::Systemd
    } else {
        Platform::Cron
    }
}

fn systemctl_user_works() -> bool {
    tool(&["systemctl", "--user", "show-environment"]).is_ok()
}

/// Runs a tool (argv, no shell) with optional stdin; `Ok(stdout)` on exit 0.
fn tool_input(argv: &[&str], input: Option<&str>) -> Result<String, String> {
    let Some((prog, args)) = argv.split_first() else {
        return Err("empty argv".into());
    };
    let mut cmd = duct::cmd(*prog, args)
        .stdout_capture()
        .stderr_capture()
        .unchecked();
    cmd = match input {
        Some(i) => cmd.stdin_bytes(i.as_bytes().to_vec()),
        None => cmd.stdin_null(),
    };
    let out = cmd.run().map_err(|e| format!("`{prog}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(format!(
            "`{}` exited with {}: {err}",
            argv.join(" "),
            out.status
                .code()
                .map_or("a signal".into(), |c| c.to_string())
        ))
    }
}

fn tool(argv: &[&str]) -> Result<String, String> {
    tool_input(argv, None)
}

/// Finds a program on PATH (for an absolute `flock` in crontab lines, whose PATH is tiny).
fn which(prog: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(prog))
            .find(|p| p.is_file())
    })
}

// ---------------------------------------------------------------- rendering

/// systemd quoting for `ExecStart=`: `%` and `$` are specifiers/variables there.
fn systemd_arg(a: &str) -> String {
    let a = a.replace('%', "%%").replace('$', "$$");
    if !a.is_empty()
        && !a
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '\'' || c == '\\' || c == ';')
    {
        a
    } else {
        format!("\"{}\"", a.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

pub fn systemd(t: &Target) -> Vec<File> {
    let label = t.label();
    let exec: Vec<String> = t.argv().iter().map(|a| systemd_arg(a)).collect();
    let service = format!(
        "[Unit]\n\
         Description=loopflow: one tick of loop {name} in {project}\n\
         \n\
         [Service]\n\
         # oneshot: a tick still running is never started twice.\n\
         Type=oneshot\n\
         WorkingDirectory={wd}\n\
         {env}ExecStart={exec}\n\
         Nice=10\n",
        env = t
            .path_env
            .as_ref()
            .map(|p| format!(
                "Environment=\"PATH={}\"\n",
                p.replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('%', "%%")
            ))
            .unwrap_or_default(),
        name = t.loop_name,
        project = t.project.display().to_string().replace('%', "%%"),
        wd = t.project.display().to_string().replace('%', "%%"),
        exec = exec.join(" "),
    );
    let timer = format!(
        "[Unit]\n\
         Description=loopflow: tick loop {name} every {i} s\n\
         \n\
         [Timer]\n\
         OnActiveSec={i}s\n\
         OnUnitActiveSec={i}s\n\
         AccuracySec=1s\n\
         Unit={label}.service\n\
         \n\
         [Install]\n\
         WantedBy=timers.target\n",
        name = t.loop_name,
        i = t.interval,
    );
    vec![
        File {
            name: format!("{label}.service"),
            text: service,
        },
        File {
            name: format!("{label}.timer"),
            text: timer,
        },
    ]
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

pub fn launchd(t: &Target) -> File {
    let label = t.label();
    let args: String = t
        .argv()
        .iter()
        .map(|a| format!("    <string>{}</string>\n", xml_escape(a)))
        .collect();
    let log = t.loop_dir.join(".schedule.log");
    let text = format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{label}</string>
  <key>ProgramArguments</key>
  <array>
{args}  </array>
  <key>WorkingDirectory</key>
  <string>{wd}</string>
{env}  <key>StartInterval</key>
  <integer>{interval}</integer>
  <key>RunAtLoad</key>
  <false/>
  <key>ProcessType</key>
  <string>Background</string>
  <key>StandardOutPath</key>
  <string>{log}</string>
  <key>StandardErrorPath</key>
  <string>{log}</string>
</dict>
</plist>
"#,
        wd = xml_escape(&t.project.display().to_string()),
        env = t
            .path_env
            .as_ref()
            .map(|p| format!(
                "  <key>EnvironmentVariables</key>\n  <dict>\n    <key>PATH</key>\n    <string>{}</string>\n  </dict>\n",
                xml_escape(p)
            ))
            .unwrap_or_default(),
        interval = t.interval,
        log = xml_escape(&log.display().to_string()),
    );
    File {
        name: format!("{label}.plist"),
        text,
    }
}

/// The 5-field cron expression nearest to `secs`, and a note when it is not exact.
pub fn cron_expr(secs: u64) -> (String, Option<String>) {
    let mins = secs.div_ceil(60).max(1);
    let exact = secs.is_multiple_of(60) && secs >= 60;
    if mins < 60 {
        // Minute steps must divide 60 to be regular.
        let step = [1u64, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30]
            .into_iter()
            .min_by_key(|s| s.abs_diff(mins))
            .unwrap_or(1);
        let expr = if step == 1 {
            "* * * * *".to_string()
        } else {
            format!("*/{step} * * * *")
        };
        let note = (!exact || step != mins)
            .then(|| format!("cron cannot fire every {secs} s; this fires every {step} min"));
        return (expr, note);
    }
    let hours = mins.div_ceil(60);
    if hours < 24 {
        let step = [1u64, 2, 3, 4, 6, 8, 12]
            .into_iter()
            .min_by_key(|s| s.abs_diff(hours))
            .unwrap_or(1);
        let expr = if step == 1 {
            "0 * * * *".to_string()
        } else {
            format!("0 */{step} * * *")
        };
        let note = (secs != step * 3600)
            .then(|| format!("cron cannot fire every {secs} s; this fires every {step} h"));
        return (expr, note);
    }
    let note =
        (secs != 86400).then(|| format!("cron cannot fire every {secs} s; this fires once a day"));
    ("0 0 * * *".to_string(), note)
}

/// POSIX sh single quoting, and `%` escaped (cron turns a bare `%` into a newline).
fn sh_quote(a: &str) -> String {
    format!("'{}'", a.replace('\'', "'\\''")).replace('%', "\\%")
}

/// The crontab line: cron's `/bin/sh` runs `flock -n LOCK <exe> run …`; a tick still
/// running makes the next one exit at once instead of piling up.
pub fn cron_line(t: &Target) -> String {
    let (expr, _) = cron_expr(t.interval);
    let lock = t.loop_dir.join(".schedule.lock");
    let argv: Vec<String> = t.argv().iter().map(|a| sh_quote(a)).collect();
    let env = t
        .path_env
        .as_ref()
        .map(|p| format!("PATH={} ", sh_quote(p)))
        .unwrap_or_default();
    match which("flock") {
        Some(flock) => format!(
            "{expr} {env}{} -n {} {} >/dev/null",
            sh_quote(&flock.display().to_string()),
            sh_quote(&lock.display().to_string()),
            argv.join(" ")
        ),
        // No flock (macOS): loopflow's own lock still keeps ticks apart (SKIP reason=locked).
        None => format!("{expr} {env}{} >/dev/null", argv.join(" ")),
    }
}

pub fn cron(t: &Target) -> File {
    let (_, note) = cron_expr(t.interval);
    let mut text = format!(
        "# loopflow: loop {} in {} every {} s\n",
        t.loop_name,
        t.project.display(),
        t.interval
    );
    if let Some(n) = note {
        text.push_str(&format!("# note: {n}\n"));
    }
    if which("flock").is_none() {
        text.push_str("# note: flock is not installed; an overlapping tick logs SKIP reason=locked and exits\n");
    }
    text.push_str(&cron_line(t));
    text.push('\n');
    File {
        name: format!("{}.crontab", t.label()),
        text,
    }
}

/// Windows argument quoting (CommandLineToArgvW rules).
fn win_arg(a: &str) -> String {
    if !a.is_empty() && !a.chars().any(|c| c == ' ' || c == '\t' || c == '"') {
        return a.to_string();
    }
    let mut out = String::from("\"");
    let mut backslashes = 0;
    for c in a.chars() {
        match c {
            '\\' => backslashes += 1,
            '"' => {
                out.push_str(&"\\".repeat(backslashes * 2 + 1));
                out.push('"');
                backslashes = 0;
            }
            _ => {
                out.push_str(&"\\".repeat(backslashes));
                out.push(c);
                backslashes = 0;
            }
        }
    }
    out.push_str(&"\\".repeat(backslashes * 2));
    out.push('"');
    out
}

pub fn schtasks(t: &Target) -> File {
    let argv = t.argv();
    let args: Vec<String> = argv[1..].iter().map(|a| win_arg(a)).collect();
    // Task Scheduler repeats at one-minute granularity at best.
    let interval = t.interval.max(60);
    let text = format!(
        r#"<?xml version="1.0" encoding="UTF-16"?>
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Description>loopflow: tick loop {name} in {project} every {interval} s</Description>
    <URI>\loopflow\{label}</URI>
  </RegistrationInfo>
  <Triggers>
    <TimeTrigger>
      <StartBoundary>2000-01-01T00:00:00</StartBoundary>
      <Enabled>true</Enabled>
      <Repetition>
        <Interval>PT{interval}S</Interval>
        <StopAtDurationEnd>false</StopAtDurationEnd>
      </Repetition>
    </TimeTrigger>
  </Triggers>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <StartWhenAvailable>true</StartWhenAvailable>
    <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>
    <Enabled>true</Enabled>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>{exe}</Command>
      <Arguments>{args}</Arguments>
      <WorkingDirectory>{project}</WorkingDirectory>
    </Exec>
  </Actions>
</Task>
"#,
        name = xml_escape(&t.loop_name),
        project = xml_escape(&t.project.display().to_string()),
        label = t.label(),
        exe = xml_escape(&argv[0]),
        args = xml_escape(&args.join(" ")),
    );
    File {
        name: format!("{}.xml", t.label()),
        text,
    }
}

/// YAML double-quoted scalar (JSON strings are valid YAML).
fn yq(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A GitHub Actions workflow. The runner is fresh every time, so the loop's state (which
/// is git-ignored) travels in the Actions cache and the loop's branch is pushed back.
pub fn github_actions(t: &Target) -> File {
    let (expr, note) = cron_expr(t.interval.max(300));
    let n = &t.loop_name;
    let dir = format!(".loopflow/loops/{n}");
    let note = match note {
        Some(n) => format!("# note: {n} (GitHub runs schedules at most every 5 min)\n"),
        None if t.interval < 300 => {
            "# note: GitHub runs schedules at most every 5 min\n".to_string()
        }
        None => String::new(),
    };
    let text = format!(
        r#"# loopflow: tick loop {n} on a schedule (generated by `loopflow schedule print --platform github-actions`).
# The loop's state is git-ignored, so it travels in the Actions cache between runs, and
# the loop's branch loopflow/{n} is pushed back after each tick. Start the loop with a
# manual run ("Run workflow") giving the task; clear a halt with a manual run and
# "approve" ticked (recorded as approved by you).
{note}name: loopflow {n}

on:
  schedule:
    - cron: "{expr}"
  workflow_dispatch:
    inputs:
      task:
        description: The task (only used on the loop's first run)
        type: string
        required: false
      approve:
        description: Clear the loop's halt before ticking (a human decision, recorded)
        type: boolean
        default: false
      note:
        description: Note recorded with the approval
        type: string
        required: false

# One tick at a time; a queued tick waits and a running one is never cancelled.
concurrency:
  group: loopflow-{n}
  cancel-in-progress: false

permissions:
  contents: write

jobs:
  tick:
    runs-on: ubuntu-latest
    timeout-minutes: 120
    steps:
      - uses: actions/checkout@v5
        with:
          fetch-depth: 0
      - name: Restore loop state
        uses: actions/cache/restore@v5
        with:
          path: |
            {dir}/.state.loop
            {dir}/.state.log
          key: loopflow-{n}-${{{{ github.run_id }}}}
          restore-keys: loopflow-{n}-
      - name: Install loopflow
        # Or however you install loopflow on a runner.
        run: cargo install --locked loopflow
      - name: Restore the loop's branch
        run: git fetch origin "loopflow/{n}:loopflow/{n}" || git branch "loopflow/{n}"
      - name: Start the loop (first run)
        if: hashFiles('{dir}/.state.loop') == ''
        env:
          TASK: ${{{{ inputs.task }}}}
        run: |
          mv "{dir}" "$RUNNER_TEMP/loop-config"
          if [ -n "$TASK" ]; then loopflow create --loop {n} --task "$TASK"; else loopflow create --loop {n}; fi
          cp -R "$RUNNER_TEMP/loop-config/." "{dir}/"
      - name: Restore the loop's worktree
        run: |
          if [ ! -e "{dir}/worktree/.git" ]; then git worktree add "{dir}/worktree" "loopflow/{n}"; fi
      - name: Approve
        if: inputs.approve
        env:
          ACTOR: ${{{{ github.actor }}}}
          NOTE: ${{{{ inputs.note }}}}
        run: loopflow approve --loop {n} --by "$ACTOR" --note "$NOTE"
      - name: Tick
        run: loopflow run --loop {n} --project "$GITHUB_WORKSPACE"
      - name: Push the loop's branch
        run: git push origin "loopflow/{n}"
      - name: Save loop state
        if: always()
        uses: actions/cache/save@v5
        with:
          path: |
            {dir}/.state.loop
            {dir}/.state.log
          key: loopflow-{n}-${{{{ github.run_id }}}}
"#
    );
    File {
        name: format!("loopflow-{n}.yml"),
        text,
    }
}

/// A DNS-1123 name of at most 52 characters (CronJob names are limited so the Job names
/// derived from them fit).
fn k8s_name(loop_name: &str) -> String {
    let mut s: String = format!("loopflow-{}", loop_name.replace('_', "-"));
    s.truncate(52);
    s.trim_end_matches('-').to_string()
}

/// A Kubernetes CronJob. The project (repository and `.loopflow/` state) lives on a
/// persistent volume claim so iterations survive pods; the image must contain loopflow
/// and the agent.
pub fn kubernetes(t: &Target) -> File {
    let (expr, note) = cron_expr(t.interval);
    let name = k8s_name(&t.loop_name);
    let note = note.map(|n| format!("# note: {n}\n")).unwrap_or_default();
    let argv = [
        "loopflow",
        "run",
        "--loop",
        t.loop_name.as_str(),
        "--project",
        "/project",
    ];
    let cmd: Vec<String> = argv.iter().map(|a| yq(a)).collect();
    let text = format!(
        r#"# loopflow: tick loop {loop_name} on a schedule (generated by `loopflow schedule print --platform kubernetes`).
# The project checkout with its .loopflow/ state lives on the PersistentVolumeClaim
# {name}-project; the image must contain loopflow and the agent it runs.
{note}apiVersion: batch/v1
kind: CronJob
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: loopflow
    app.kubernetes.io/instance: {name}
spec:
  schedule: "{expr}"
  concurrencyPolicy: Forbid
  startingDeadlineSeconds: {deadline}
  successfulJobsHistoryLimit: 3
  failedJobsHistoryLimit: 3
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        metadata:
          labels:
            app.kubernetes.io/name: loopflow
            app.kubernetes.io/instance: {name}
        spec:
          restartPolicy: Never
          containers:
            - name: tick
              image: "loopflow:{version}"
              command: [{cmd}]
              workingDir: /project
              volumeMounts:
                - name: project
                  mountPath: /project
          volumes:
            - name: project
              persistentVolumeClaim:
                claimName: {name}-project
"#,
        loop_name = t.loop_name,
        deadline = (t.interval / 2).clamp(60, 3600),
        version = env!("CARGO_PKG_VERSION"),
        cmd = cmd.join(", "),
    );
    File {
        name: format!("{name}-cronjob.yaml"),
        text,
    }
}

/// Every file of a platform, in print order.
pub fn render(p: Platform, t: &Target) -> Vec<File> {
    match p {
        Platform::Systemd => systemd(t),
        Platform::Launchd => vec![launchd(t)],
        Platform::Cron | Platform::Auto => vec![cron(t)],
        Platform::Schtasks => vec![schtasks(t)],
        Platform::GithubActions => vec![github_actions(t)],
        Platform::Kubernetes => vec![kubernetes(t)],
    }
}

/// What `print` writes: the files in order, separated by a `#` comment line.
pub fn print_text(p: Platform, t: &Target) -> String {
    let files = render(p, t);
    let mut out = String::new();
    for (i, f) in files.iter().enumerate() {
        if i > 0 {
            out.push_str(&format!("\n# ---- {}\n", f.name));
        }
        out.push_str(&f.text);
    }
    out
}

// ---------------------------------------------------------------- install

/// What `install` left on this machine, kept in the loop dir (git-ignored).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub platform: Platform,
    pub label: String,
    /// Files written (absolute paths).
    pub files: Vec<PathBuf>,
    pub interval_seconds: u64,
    pub exe: PathBuf,
    pub installed_at: String,
    /// False while a HALT has disabled it.
    pub enabled: bool,
    /// Whether the scheduler itself was told (systemctl, crontab, launchctl, schtasks);
    /// false for platforms where install only writes a file.
    pub activated: bool,
}

pub fn record_path(paths: &LoopPaths) -> PathBuf {
    paths.dir.join(".schedule.json")
}

pub fn read_record(paths: &LoopPaths) -> Option<Record> {
    let text = std::fs::read_to_string(record_path(paths)).ok()?;
    serde_json::from_str(&text).ok()
}

fn write_record(paths: &LoopPaths, r: &Record) -> Result<(), String> {
    let p = record_path(paths);
    let mut json = serde_json::to_vec_pretty(r).map_err(|e| e.to_string())?;
    json.push(b'\n');
    crate::fs_safe::write_atomic(&paths.dir, &p, &json).map_err(|e| format!("{}: {e}", p.display()))
}

/// Makes sure the loop's `.gitignore` hides what scheduling writes (loops created by an
/// older loopflow lack these lines).
fn ensure_ignored(paths: &LoopPaths) -> Result<(), String> {
    let p = paths.dir.join(".gitignore");
    let text = std::fs::read_to_string(&p).unwrap_or_default();
    let missing: Vec<&str> = [".schedule.json", ".schedule.lock", ".schedule.log"]
        .into_iter()
        .filter(|l| !text.lines().any(|x| x.trim() == *l))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut out = text;
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for l in missing {
        out.push_str(l);
        out.push('\n');
    }
    std::fs::write(&p, out).map_err(|e| format!("{}: {e}", p.display()))
}

fn home() -> Result<PathBuf, String> {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| "HOME is not set".to_string())
}

/// `$XDG_CONFIG_HOME/systemd/user` (default `~/.config/systemd/user`).
pub fn systemd_dir() -> Result<PathBuf, String> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => home()?.join(".config"),
    };
    Ok(base.join("systemd").join("user"))
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

const CRON_BEGIN: &str = "# loopflow:";

fn cron_markers(label: &str) -> (String, String) {
    (
        format!("{CRON_BEGIN}{label} begin (managed by `loopflow schedule`; edit with it)"),
        format!("{CRON_BEGIN}{label} end"),
    )
}

/// The current crontab; an absent crontab (`no crontab for user`) is empty.
fn crontab_read() -> Result<String, String> {
    let out = duct::cmd!("crontab", "-l")
        .stdin_null()
        .stdout_capture()
        .stderr_capture()
        .unchecked()
        .run()
        .map_err(|e| format!("`crontab -l`: {e} (is cron installed?)"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("no crontab") {
        Ok(String::new())
    } else {
        Err(format!("`crontab -l`: {}", err.trim()))
    }
}

/// The crontab with this label's block removed.
fn cron_without(text: &str, label: &str) -> String {
    let (b, e) = cron_markers(label);
    let begin_prefix = b.split(" begin").next().unwrap_or(&b).to_string() + " begin";
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with(&begin_prefix) {
            inside = true;
            continue;
        }
        if inside {
            if line == e {
                inside = false;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Replaces this label's block with `body` (or removes it) via `crontab -`.
fn crontab_set(label: &str, body: Option<&str>) -> Result<(), String> {
    let current = crontab_read()?;
    let mut next = cron_without(&current, label);
    if let Some(body) = body {
        let (b, e) = cron_markers(label);
        next.push_str(&format!("{b}\n{body}\n{e}\n"));
    }
    if next == current {
        return Ok(());
    }
    tool_input(&["crontab", "-"], Some(&next)).map(|_| ())
}

fn not_native(p: Platform) -> String {
    let os = if cfg!(target_os = "macos") {
        "macOS"
    } else if cfg!(windows) {
        "Windows"
    } else {
        "Linux"
    };
    let (home, hint) = match p {
        Platform::Launchd => (
            "macOS",
            "on the Mac, run `loopflow schedule install --platform launchd` (or save the output of `schedule print --platform launchd` to ~/Library/LaunchAgents/ and `launchctl bootstrap gui/$(id -u)` it)",
        ),
        _ => (
            "Windows",
            "on Windows, run `loopflow schedule install --platform schtasks` (or save the output of `schedule print --platform schtasks` and `schtasks /Create /XML FILE /TN NAME`)",
        ),
    };
    format!(
        "{} schedules are installed on {home}, and this is {os}; {hint}",
        p.name()
    )
}

/// Installs the schedule (idempotent: installing again replaces the same files/block).
/// Returns the record and human lines saying what was done.
pub fn install(
    p: Platform,
    t: &Target,
    paths: &LoopPaths,
) -> Result<(Record, Vec<String>), String> {
    let p = if p == Platform::Auto { auto() } else { p };
    // A schedule on another platform is removed first, so a loop has one schedule.
    if let Some(old) = read_record(paths)
        && old.platform != p
    {
        uninstall(paths)?;
    }
    let label = t.label();
    let mut said = Vec::new();
    let mut files = Vec::new();
    let mut activated = false;
    // An error after files were written: they are recorded first, so uninstall removes them.
    let mut pending = None;
    match p {
        Platform::Systemd => {
            let dir = systemd_dir()?;
            for f in systemd(t) {
                let path = dir.join(&f.name);
                write_file(&path, &f.text)?;
                said.push(format!("wrote {}", path.display()));
                files.push(path);
            }
            let timer = format!("{label}.timer");
            match tool(&["systemctl", "--user", "daemon-reload"])
                .and_then(|_| tool(&["systemctl", "--user", "enable", "--now", &timer]))
            {
                Ok(_) => {
                    activated = true;
                    said.push(format!("enabled and started {timer}"));
                }
                Err(e) => {
                    pending = Some(format!(
                        "the unit files are written ({}) but could not be enabled: {e}\n  run `systemctl --user daemon-reload && systemctl --user enable --now {timer}` in your login session, or use --platform cron (`schedule uninstall` removes the files)",
                        dir.display()
                    ));
                }
            }
        }
        Platform::Cron => {
            let f = cron(t);
            let body = f.text.trim_end().to_string();
            crontab_set(&label, Some(&body))?;
            activated = true;
            said.push(format!("crontab: installed the `{label}` entry"));
        }
        Platform::Launchd => {
            if !cfg!(target_os = "macos") {
                return Err(not_native(p));
            }
            let f = launchd(t);
            let path = home()?.join("Library/LaunchAgents").join(&f.name);
            write_file(&path, &f.text)?;
            said.push(format!("wrote {}", path.display()));
            files.push(path.clone());
            let domain = format!("gui/{}", uid());
            // bootout first so a re-install picks up the new plist.
            let _ = tool(&["launchctl", "bootout", &format!("{domain}/{label}")]);
            tool(&[
                "launchctl",
                "bootstrap",
                &domain,
                &path.display().to_string(),
            ])?;
            activated = true;
            said.push(format!("launchctl: bootstrapped {label}"));
        }
        Platform::Schtasks => {
            if !cfg!(windows) {
                return Err(not_native(p));
            }
            let f = schtasks(t);
            let dir = std::env::var_os("LOCALAPPDATA")
                .map(PathBuf::from)
                .unwrap_or(home()?)
                .join("loopflow");
            let path = dir.join(&f.name);
            // Task Scheduler reads UTF-16 task files.
            let mut bytes = vec![0xFF, 0xFE];
            for u in f.text.encode_utf16() {
                bytes.extend_from_slice(&u.to_le_bytes());
            }
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
            files.push(path.clone());
            let tn = format!("\\loopflow\\{label}");
            tool(&[
                "schtasks",
                "/Create",
                "/F",
                "/TN",
                &tn,
                "/XML",
                &path.display().to_string(),
            ])?;
            activated = true;
            said.push(format!("schtasks: created {tn}"));
        }
        Platform::GithubActions => {
            let f = github_actions(t);
            let path = t.project.join(".github").join("workflows").join(&f.name);
            write_file(&path, &f.text)?;
            said.push(format!(
                "wrote {} (commit and push it; GitHub runs it on its schedule)",
                path.display()
            ));
            files.push(path);
        }
        Platform::Kubernetes => {
            let f = kubernetes(t);
            let path = t.loop_dir.join(&f.name);
            write_file(&path, &f.text)?;
            said.push(format!(
                "wrote {} (apply it with `kubectl apply -f {}`; loopflow never touches a cluster itself)",
                path.display(),
                path.display()
            ));
            files.push(path);
        }
        Platform::Auto => unreachable_auto()?,
    }
    let record = Record {
        platform: p,
        label,
        files,
        interval_seconds: t.interval,
        exe: t.exe.clone(),
        installed_at: crate::state::now(),
        enabled: true,
        activated,
    };
    ensure_ignored(paths)?;
    write_record(paths, &record)?;
    match pending {
        Some(e) => Err(e),
        None => Ok((record, said)),
    }
}

fn unreachable_auto() -> Result<(), String> {
    Err("internal: `auto` was not resolved to a platform".into())
}

#[cfg(unix)]
fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

#[cfg(not(unix))]
fn uid() -> u32 {
    0
}

/// Removes what `install` did; fine to run when nothing is installed.
pub fn uninstall(paths: &LoopPaths) -> Result<Vec<String>, String> {
    let Some(r) = read_record(paths) else {
        return Ok(vec![format!(
            "no schedule installed for loop {} (nothing to do)",
            paths.name
        )]);
    };
    let mut said = Vec::new();
    match r.platform {
        Platform::Systemd => {
            let timer = format!("{}.timer", r.label);
            if r.activated {
                match tool(&["systemctl", "--user", "disable", "--now", &timer]) {
                    Ok(_) => said.push(format!("disabled and stopped {timer}")),
                    Err(e) => said.push(format!("warning: {e}")),
                }
            }
        }
        Platform::Cron => {
            crontab_set(&r.label, None)?;
            said.push(format!("crontab: removed the `{}` entry", r.label));
        }
        Platform::Launchd => {
            let _ = tool(&[
                "launchctl",
                "bootout",
                &format!("gui/{}/{}", uid(), r.label),
            ]);
        }
        Platform::Schtasks => {
            let _ = tool(&[
                "schtasks",
                "/Delete",
                "/F",
                "/TN",
                &format!("\\loopflow\\{}", r.label),
            ]);
        }
        Platform::GithubActions | Platform::Kubernetes | Platform::Auto => {}
    }
    for f in &r.files {
        match std::fs::remove_file(f) {
            Ok(()) => said.push(format!("removed {}", f.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", f.display())),
        }
    }
    if r.platform == Platform::Systemd && r.activated {
        let _ = tool(&["systemctl", "--user", "daemon-reload"]);
    }
    let rp = record_path(paths);
    std::fs::remove_file(&rp).map_err(|e| format!("{}: {e}", rp.display()))?;
    Ok(said)
}

/// Turns the installed schedule off or on without removing it.
fn set_enabled(r: &Record, on: bool) -> Result<(), String> {
    match r.platform {
        Platform::Systemd => {
            let timer = format!("{}.timer", r.label);
            let verb = if on { "enable" } else { "disable" };
            tool(&["systemctl", "--user", verb, "--now", &timer]).map(|_| ())
        }
        Platform::Cron => {
            let current = crontab_read()?;
            let (b, e) = cron_markers(&r.label);
            let mut out = String::new();
            let mut inside = false;
            let mut found = false;
            for line in current.lines() {
                if line.starts_with(&format!("{CRON_BEGIN}{} begin", r.label)) {
                    inside = true;
                    found = true;
                    out.push_str(&b);
                } else if inside && line == e {
                    inside = false;
                    out.push_str(line);
                } else if inside && !line.starts_with("# ") {
                    // The entry itself: commented out while halted.
                    let bare = line.strip_prefix("#halted# ").unwrap_or(line);
                    if on {
                        out.push_str(bare);
                    } else {
                        out.push_str("#halted# ");
                        out.push_str(bare);
                    }
                } else {
                    out.push_str(line);
                }
                out.push('\n');
            }
            if !found {
                return Err(format!("crontab has no `{}` entry any more", r.label));
            }
            if out != current {
                tool_input(&["crontab", "-"], Some(&out))?;
            }
            Ok(())
        }
        Platform::Launchd => {
            // `launchctl disable` only affects the next load: unload/load the job itself.
            let domain = format!("gui/{}", uid());
            if on {
                let plist = r
                    .files
                    .first()
                    .ok_or_else(|| "the record names no plist".to_string())?;
                tool(&[
                    "launchctl",
                    "bootstrap",
                    &domain,
                    &plist.display().to_string(),
                ])
                .map(|_| ())
            } else {
                tool(&["launchctl", "bootout", &format!("{domain}/{}", r.label)]).map(|_| ())
            }
        }
        Platform::Schtasks => {
            let flag = if on { "/ENABLE" } else { "/DISABLE" };
            tool(&[
                "schtasks",
                "/Change",
                "/TN",
                &format!("\\loopflow\\{}", r.label),
                flag,
            ])
            .map(|_| ())
        }
        Platform::GithubActions | Platform::Kubernetes | Platform::Auto => Err(format!(
            "a {} schedule runs elsewhere; its ticks skip while the loop is halted",
            r.platform.name()
        )),
    }
}

fn toggle_best_effort(paths: &LoopPaths, on: bool) {
    let Some(mut r) = read_record(paths) else {
        return;
    };
    if r.enabled == on {
        return;
    }
    let key = if on { "enabled" } else { "disabled" };
    let result = set_enabled(&r, on);
    let mut args = vec![LogArg::Kv("platform", r.platform.name().to_string())];
    match &result {
        Ok(()) => {
            args.insert(0, LogArg::Kv(key, "true".into()));
            r.enabled = on;
            let _ = write_record(paths, &r);
        }
        Err(e) => {
            args.insert(0, LogArg::Kv(key, "false".into()));
            args.push(LogArg::Kv("reason", e.clone()));
        }
    }
    let _ = paths.log(Event::Schedule, &args);
}

/// Called on every HALT: turns the installed schedule off when it can and logs
/// `SCHEDULE disabled=true|false …`. Does nothing (and logs nothing) when no schedule
/// is installed. Never fails: a halt must stand whatever the scheduler says.
pub fn disable_best_effort(paths: &LoopPaths) {
    toggle_best_effort(paths, false);
}

/// Called by `approve`: turns a schedule a HALT disabled back on (`SCHEDULE enabled=…`).
pub fn enable_best_effort(paths: &LoopPaths) {
    toggle_best_effort(paths, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cron_expressions() {
        assert_eq!(cron_expr(60).0, "* * * * *");
        assert_eq!(cron_expr(300), ("*/5 * * * *".into(), None));
        assert_eq!(cron_expr(3600), ("0 * * * *".into(), None));
        assert_eq!(cron_expr(7200), ("0 */2 * * *".into(), None));
        assert_eq!(cron_expr(86400), ("0 0 * * *".into(), None));
        assert!(cron_expr(10).1.is_some());
        assert!(cron_expr(420).1.is_some());
    }

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("a'b%c"), "'a'\\''b\\%c'");
        assert_eq!(systemd_arg("/a b/$x%"), "\"/a b/$$x%%\"");
        assert_eq!(systemd_arg("plain"), "plain");
        assert_eq!(win_arg("C:\\a b\\"), "\"C:\\a b\\\\\"");
        assert_eq!(k8s_name("x_1"), "loopflow-x-1");
    }

    #[test]
    fn cron_block_roundtrip() {
        let (b, e) = cron_markers("l");
        let text = format!("MAILTO=x\n{b}\n* * * * * a\n{e}\n0 0 * * * other\n");
        assert_eq!(cron_without(&text, "l"), "MAILTO=x\n0 0 * * * other\n");
    }
}
