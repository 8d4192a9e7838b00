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

mod agents;
mod cron;
mod ephemeral;
mod github;
mod install;
mod keys;
mod kubernetes;
mod launchd;
mod orphans;
mod schtasks;
mod systemd;

pub(crate) use agents::AgentUse;
pub(crate) use cron::scattered;
pub(crate) use install::{
    disable_best_effort, enable_best_effort, install, read_record, uninstall,
};
pub(crate) use keys::{carried_env, env_source, how_keys_reach, key_fix};
pub(crate) use orphans::{describe as describe_orphan, orphans, remove as remove_orphan};

/// Why a schedule could not be installed, removed or toggled.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// A scheduler's own tool (`crontab`, `systemctl`, `launchctl`, `schtasks`) could not
    /// run or said no.
    #[error("{0}")]
    Tool(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The platform cannot do this here (not native, runs elsewhere, entry gone).
    #[error("{0}")]
    Unsupported(String),
}

/// Lets command-line code that reports errors as text use `?`.
impl From<ScheduleError> for String {
    fn from(e: ScheduleError) -> String {
        e.to_string()
    }
}

/// Maps an I/O error on `path`.
pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ScheduleError + '_ {
    move |source| ScheduleError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Where a schedule can be generated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Platform {
    Auto,
    Systemd,
    Launchd,
    Cron,
    Schtasks,
    GithubActions,
    Kubernetes,
}

impl Platform {
    pub(crate) fn name(self) -> &'static str {
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

/// The variables of the installing shell an installed schedule carries to its ticks.
pub(crate) const CARRIED: [&str; 2] = ["PATH", "XDG_STATE_HOME"];

/// What a generated schedule needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub exe: PathBuf,
    pub project: PathBuf,
    pub loop_name: String,
    pub interval: u64,
    pub loop_dir: PathBuf,
    /// Variables of the installing shell given to the tick: `PATH` (cron's and systemd's
    /// own are minimal, and the agent — `opencode`, `claude`, … — usually lives elsewhere)
    /// and `XDG_STATE_HOME` when set (where the loop's worktree lives: a tick that looked
    /// elsewhere would find it missing).
    pub env: Vec<(String, String)>,
    /// What a runner elsewhere needs (GitHub Actions, Kubernetes).
    pub remote: Remote,
    /// The loop's state of record lives in its repository (`[remote]`, DESIGN §16).
    pub record: Option<Record>,
}

/// Where a remote loop's state of record lives, and how long a runner holds it.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The git remote's name (`origin`).
    pub remote: String,
    /// Its URL, without any credential (Kubernetes clones it), when the project knows it.
    pub url: Option<String>,
    /// The longest one tick can take (`None`: a node without a timeout).
    pub tick: Option<std::time::Duration>,
    /// How long a lease lasts: the tick's limit (or six hours) plus the margin.
    pub lease: std::time::Duration,
}

/// How a workflow installs this loopflow on a fresh runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LoopflowInstall {
    /// loopflow's GitHub Action (`uses: owner/repo@v<version>`, action.yml): the released
    /// binary for the runner, checked against its SHA-256.
    Action { uses: String },
    /// `cargo install --locked --git <repo> --tag v<version> loopflow-cli`.
    Git { repo: String },
    /// A released binary (a file, or a `.tar.gz`/`.tgz` holding `loopflow`), checked
    /// against its SHA-256 when one is given.
    Binary { url: String, sha256: Option<String> },
}

/// What GitHub Actions and Kubernetes need to know beyond the tick's argv: both run the
/// loop on a fresh machine.
#[derive(Debug, Clone, Default)]
pub(crate) struct Remote {
    pub install: Option<LoopflowInstall>,
    /// The container image (Kubernetes).
    pub image: Option<String>,
    /// The agents the loop's roles run, each once.
    pub agents: Vec<AgentUse>,
    /// Environment variables taken from secrets beyond the agents' own (`--secret`).
    pub extra_secrets: Vec<String>,
    /// The longest one tick can take: every node's timeout times its tries, added up.
    /// `None` when a node that runs a process has no timeout.
    pub tick_limit: Option<std::time::Duration>,
}

impl Remote {
    /// The API-key variables the runner takes from secrets.
    pub(crate) fn secrets(&self) -> Vec<String> {
        agents::secrets(&self.agents, &self.extra_secrets)
    }
}

impl Target {
    /// `<exe> run --loop X --project DIR` (and `--slot auto` for a remote loop: every
    /// machine that fires it ticks each firing at most once), one element per argument.
    pub(crate) fn argv(&self) -> Vec<String> {
        let mut argv = vec![
            self.exe.display().to_string(),
            "run".into(),
            "--loop".into(),
            self.loop_name.clone(),
            "--project".into(),
            self.project.display().to_string(),
        ];
        if self.record.is_some() {
            argv.extend(["--slot".into(), "auto".into()]);
        }
        argv
    }

    /// A machine-wide unique name: the loop name plus a short hash of the project path,
    /// so two projects with a loop of the same name never share a unit or crontab block.
    pub(crate) fn label(&self) -> String {
        format!("loopflow-{}-{:08x}", self.loop_name, fnv32(&self.project))
    }
}

pub(super) fn fnv32(p: &Path) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in p.as_os_str().as_encoded_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// One generated file: its name and text.
#[derive(Debug, Clone)]
pub(crate) struct File {
    pub name: String,
    pub text: String,
}

/// Picks the scheduler native to this machine.
pub(crate) fn auto() -> Platform {
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

pub(super) fn systemctl_user_works() -> bool {
    tool(&["systemctl", "--user", "show-environment"]).is_ok()
}

/// Runs a tool (argv, no shell) with optional stdin; `Ok(stdout)` on exit 0.
pub(super) fn tool_input(argv: &[&str], input: Option<&str>) -> Result<String, ScheduleError> {
    let Some(prog) = argv.first() else {
        return Err(ScheduleError::Tool("empty argv".into()));
    };
    let out = crate::process::tool::run(
        argv,
        input.map(str::as_bytes),
        crate::process::tool::TOOL_TIMEOUT,
    )
    .map_err(|e| ScheduleError::Tool(format!("`{prog}`: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(ScheduleError::Tool(format!(
            "`{}` exited with {}: {err}",
            argv.join(" "),
            out.status
                .code()
                .map_or("a signal".into(), |c| c.to_string())
        )))
    }
}

pub(super) fn tool(argv: &[&str]) -> Result<String, ScheduleError> {
    tool_input(argv, None)
}

/// Finds a program on PATH (for an absolute `flock` in crontab lines, whose PATH is tiny).
pub(super) fn which(prog: &str) -> Option<PathBuf> {
    crate::preset::find_on_path(prog)
}

/// How often the installed schedule really fires, in words: cron-based platforms can only
/// approximate some intervals, GitHub runs schedules at most every 5 minutes and Task
/// Scheduler every minute.
pub(crate) fn cadence(p: Platform, t: &Target) -> (u64, String) {
    let cron = |secs: u64| {
        let c = cron::cron_schedule(secs);
        (c.every_secs, format!("on cron `{}` ({})", c.expr, c.every))
    };
    match p {
        Platform::Cron | Platform::Kubernetes => cron(t.interval),
        Platform::GithubActions => cron(t.interval.max(300)),
        Platform::Schtasks => {
            let i = t.interval.max(60);
            (i, format!("every {i} s"))
        }
        _ => (t.interval, format!("every {} s", t.interval)),
    }
}

/// Every file of a platform, in print order.
pub(crate) fn render(p: Platform, t: &Target) -> Vec<File> {
    match p {
        Platform::Systemd => systemd::systemd(t),
        Platform::Launchd => vec![launchd::launchd(t)],
        Platform::Cron | Platform::Auto => vec![cron::cron(t)],
        // Printed text is UTF-8 and says so; `install` writes the UTF-16 file.
        Platform::Schtasks => vec![schtasks::schtasks(t, schtasks::Encoding::Utf8)],
        Platform::GithubActions if t.record.is_some() => vec![ephemeral::github_actions(t)],
        Platform::Kubernetes if t.record.is_some() => vec![ephemeral::kubernetes(t)],
        Platform::GithubActions => vec![github::github_actions(t)],
        Platform::Kubernetes => vec![kubernetes::kubernetes(t)],
    }
}

/// What `print` writes: the files in order, separated by a `#` comment line.
pub(crate) fn print_text(p: Platform, t: &Target) -> String {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A target for unit tests of the renderers.
    pub(crate) fn target() -> Target {
        Target {
            exe: PathBuf::from("/usr/local/bin/loopflow"),
            project: PathBuf::from("/srv/project"),
            loop_name: "l".into(),
            interval: 3600,
            loop_dir: PathBuf::from("/srv/project/.loopflow/loops/l"),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            remote: Remote::default(),
            record: None,
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(super::cron::sh_quote("a'b%c"), "'a'\\''b\\%c'");
        assert_eq!(super::systemd::systemd_arg("/a b/$x%"), "\"/a b/$$x%%\"");
        assert_eq!(super::systemd::systemd_arg("plain"), "plain");
        assert_eq!(super::schtasks::win_arg("C:\\a b\\"), "\"C:\\a b\\\\\"");
        assert_eq!(super::kubernetes::k8s_name("x_1"), "loopflow-x-1");
    }
}
