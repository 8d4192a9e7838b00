//! Isolation and scheduling commands: `schedule print|install|uninstall` and
//! `worktree gc|restore`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::exit;
use crate::schedule::{self, Platform, Target};
use crate::state::{Event, LoopPaths};
use crate::tick::RunError;

use super::run::report;
use crate::out::outln;

#[derive(Args, Debug)]
pub(crate) struct ScheduleArgs {
    #[command(subcommand)]
    pub action: ScheduleAction,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ScheduleAction {
    /// Print the scheduler files to stdout; change nothing.
    Print(ScheduleTarget),
    /// Install the schedule (idempotent; replaces an earlier one).
    Install(ScheduleTarget),
    /// Remove what `install` did.
    Uninstall(ScheduleLoop),
}

#[derive(Args, Debug)]
pub(crate) struct ScheduleTarget {
    /// The loop whose ticks the schedule fires.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// The scheduler; `auto` picks this machine's native one.
    #[arg(long, value_enum, default_value = "auto")]
    pub platform: Platform,
    /// github-actions: the git repository the workflow installs this loopflow from, at
    /// the running version's tag: a GitHub repository through its Action (`uses:
    /// OWNER/REPO@vX.Y.Z`), another with `cargo install --locked --git URL --tag vX.Y.Z`.
    /// Default: loopflow's own repository (Cargo.toml's `repository`).
    #[arg(long, value_name = "URL", env = "LOOPFLOW_REPO")]
    pub repo: Option<String>,
    /// github-actions: a released loopflow binary (a file, or a .tar.gz holding
    /// `loopflow`) the workflow downloads instead of building from --repo.
    #[arg(long, value_name = "URL", env = "LOOPFLOW_BINARY_URL")]
    pub binary_url: Option<String>,
    /// github-actions: the SHA-256 of the --binary-url download, checked before use.
    #[arg(long, value_name = "HEX", requires = "binary_url")]
    pub binary_sha256: Option<String>,
    /// kubernetes (required there): the container image that runs the tick; it must hold
    /// loopflow, git and the agent (the repository's Containerfile builds one).
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// github-actions, kubernetes: one more environment variable for the agent, taken
    /// from a secret of the same name (repeatable). The agents' own API-key variables
    /// are added without it.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
}

/// The repository loopflow's Cargo.toml names, when it names one.
fn own_repository() -> Option<String> {
    option_env!("CARGO_PKG_REPOSITORY")
        .filter(|r| !r.is_empty())
        .map(str::to_string)
}

/// `OWNER/REPO` of a repository on github.com, whose root holds loopflow's Action
/// (action.yml): `https://github.com/OWNER/REPO`, with or without `.git` or a trailing `/`.
/// Anything else (another host, a path, odd characters) is not used as an Action.
fn github_action(url: &str) -> Option<String> {
    let rest = url.strip_prefix("https://github.com/")?;
    let rest = rest.trim_end_matches('/');
    let rest = rest.strip_suffix(".git").unwrap_or(rest);
    let (owner, repo) = rest.split_once('/')?;
    let plain = |s: &str| {
        !s.is_empty()
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    };
    (plain(owner) && plain(repo)).then(|| format!("{owner}/{repo}"))
}

/// What GitHub Actions and Kubernetes need beyond the tick's argv, from the flags and the
/// loop's config and pipeline. Usage errors (exit 2) say which flag is missing.
fn remote(
    t: &ScheduleTarget,
    p: Platform,
    loaded: &crate::load::Loaded,
) -> Result<schedule::Remote, String> {
    let github = p == Platform::GithubActions;
    let kube = p == Platform::Kubernetes;
    let only = |flag: &str, set: bool, applies: bool, to: &str| {
        if set && !applies {
            Err(format!("{flag} applies to --platform {to} only"))
        } else {
            Ok(())
        }
    };
    // --repo and --binary-url may come from the environment, set for every platform:
    // the others ignore them.
    only("--image", t.image.is_some(), kube, "kubernetes")?;
    only(
        "--secret",
        !t.secrets.is_empty(),
        github || kube,
        "github-actions or kubernetes",
    )?;
    let version = env!("CARGO_PKG_VERSION");
    let install = if !github {
        None
    } else if let Some(url) = &t.binary_url {
        Some(schedule::LoopflowInstall::Binary {
            url: url.clone(),
            sha256: t.binary_sha256.clone(),
        })
    } else if let Some(repo) = t
        .repo
        .clone()
        .filter(|r| !r.is_empty())
        .or_else(own_repository)
    {
        Some(match github_action(&repo) {
            Some(owner_repo) => schedule::LoopflowInstall::Action {
                uses: format!("{owner_repo}@v{version}"),
            },
            None => schedule::LoopflowInstall::Git { repo },
        })
    } else {
        return Err(format!(
            "the workflow must install this loopflow on the runner, and this build does not know where it comes from: pass --repo URL (a git repository with the tag v{version}; the workflow runs `cargo install --locked --git URL --tag v{version}`) or --binary-url URL (a released binary), or set LOOPFLOW_REPO. (`cargo install loopflow` would install an unrelated crate of the same name.)"
        ));
    };
    if kube && t.image.as_deref().is_none_or(str::is_empty) {
        return Err(
            "--platform kubernetes needs --image IMAGE: the container image that runs the tick (build one with loopflow, git and the agent from the repository's Containerfile, e.g. `podman build -t registry.example/loopflow:VERSION .`, and push it where the cluster pulls from)".to_string(),
        );
    }
    for name in &t.secrets {
        let ok = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !ok {
            return Err(format!(
                "--secret {name:?}: a secret name is an environment variable name (letters, digits and `_`)"
            ));
        }
    }
    let cfg = &loaded.config;
    let mut agents = Vec::new();
    for role in loaded.pipeline.nodes.iter().filter_map(|n| n.spec.role()) {
        let agent = cfg.agent(&role.value);
        let program = agent
            .command
            .first()
            .map(|t| t.text.clone())
            .unwrap_or_default();
        let a = schedule::AgentUse::of(agent.preset, &program);
        if !agents.contains(&a) {
            agents.push(a);
        }
    }
    Ok(schedule::Remote {
        install,
        image: t.image.clone(),
        agents,
        extra_secrets: t.secrets.clone(),
        tick_limit: crate::remote::tick_limit(loaded),
    })
}

#[derive(Args, Debug)]
pub(crate) struct ScheduleLoop {
    /// The loop whose schedule to remove.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub(crate) struct WorktreeArgs {
    #[command(subcommand)]
    pub action: WorktreeAction,
}

#[derive(Subcommand, Debug)]
pub(crate) enum WorktreeAction {
    /// Prune worktrees and loopflow/* branches of deleted loops (and, with
    /// --include-idle, of live loops idle longer than --max-age), and remove the
    /// schedules (systemd timers, crontab blocks, launch agents) of deleted loops.
    Gc(GcArgs),
    /// Re-create a loop's removed worktree on its branch loopflow/<loop> (or a new branch
    /// from HEAD) and point the loop's state at it.
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
pub(crate) struct RestoreArgs {
    /// The loop whose worktree to bring back.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub(crate) struct GcArgs {
    /// With --include-idle, a loop idle (no tick) for longer than this is pruned: 14d,
    /// 12h, 30m, 90s.
    #[arg(long, default_value = "14d", value_name = "AGE")]
    pub max_age: String,
    /// Also prune live loops idle longer than --max-age. Their ticks then skip
    /// (`worktree_missing`) until `loopflow worktree restore --loop NAME`.
    #[arg(long)]
    pub include_idle: bool,
    /// Also remove worktrees with uncommitted changes and unmerged branches.
    #[arg(long)]
    pub force: bool,
    /// Say what would be pruned; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// The loop's paths and the target its schedule fires on platform `p`.
fn target(project: &Path, st: &ScheduleTarget, p: Platform) -> Result<(LoopPaths, Target), i32> {
    let name = st.loop_name.as_str();
    super::valid_name(project, name)?;
    let project = match project.canonicalize() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {}: {e}", project.display());
            return Err(exit::USAGE);
        }
    };
    let paths = LoopPaths::new(&project, name);
    // A remote loop's state is its record's: a clone without the cache still schedules it.
    let remote_loop = crate::remote::configured(&paths).ok().flatten();
    if !paths.state.exists() && remote_loop.is_none() {
        eprintln!("error: {}", super::no_loop(&project, name));
        return Err(exit::USAGE);
    }
    let base = std::env::current_dir().unwrap_or_else(|_| project.clone());
    // The pipeline too: a schedule of a loop whose ticks cannot run helps nobody, and
    // the runners elsewhere need to know which agents its roles run.
    let loaded = match crate::load::load(&paths, None, &base) {
        Ok(l) => l,
        Err(e) => return Err(report(&RunError::from(e))),
    };
    let remote = match remote(st, p, &loaded) {
        Ok(r) => r,
        Err(m) => {
            eprintln!("error: {m}");
            return Err(exit::USAGE);
        }
    };
    let exe = match std::env::current_exe().and_then(|p| p.canonicalize()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot find the path of the running loopflow binary: {e}");
            return Err(exit::STATE);
        }
    };
    let record = loaded.config.remote.as_ref().map(|r| schedule::Record {
        remote: r.name.clone(),
        url: crate::git::remote::url(&project, &r.name)
            .map(|u| crate::git::credentials::without_userinfo(&u)),
        tick: crate::remote::tick_limit(&loaded),
        lease: crate::remote::lease_duration(&loaded, r.lease_margin),
    });
    let t = Target {
        exe,
        project: project.clone(),
        loop_name: name.to_string(),
        interval: loaded.config.interval_seconds,
        loop_dir: paths.dir.clone(),
        env: crate::schedule::CARRIED
            .iter()
            .filter_map(|k| {
                let v = std::env::var(k).ok().filter(|v| !v.is_empty())?;
                Some((k.to_string(), v))
            })
            .collect(),
        remote,
        record,
    };
    Ok((paths, t))
}

pub(super) fn schedule(project: &Path, a: ScheduleArgs) -> i32 {
    match a.action {
        ScheduleAction::Print(t) => {
            let p = if t.platform == Platform::Auto {
                schedule::auto()
            } else {
                t.platform
            };
            let (_, target) = match target(project, &t, p) {
                Ok(x) => x,
                Err(c) => return c,
            };
            crate::out::write(schedule::print_text(p, &target).as_bytes());
            exit::OK
        }
        ScheduleAction::Install(t) => {
            let p = if t.platform == Platform::Auto {
                schedule::auto()
            } else {
                t.platform
            };
            let (paths, target) = match target(project, &t, p) {
                Ok(x) => x,
                Err(c) => return c,
            };
            match schedule::install(p, &target, &paths) {
                Ok((r, said)) => {
                    for l in said {
                        outln!("{l}");
                    }
                    // What the platform really does: GitHub fires at most every 5 min,
                    // cron only at intervals it can express.
                    let (every, cadence) = schedule::cadence(r.platform, &target);
                    let _ = paths.log(
                        Event::Schedule,
                        &[
                            crate::state::LogArg::Kv("installed", r.platform.name().into()),
                            crate::state::LogArg::Kv("every", format!("{every}s")),
                        ],
                    );
                    let exe = r.exe.display().to_string();
                    if exe.contains("/target/debug/") || exe.contains("/target/release/") {
                        outln!(
                            "note: the schedule runs {exe}, a cargo build output; `cargo clean` or a rebuild changes it. Install loopflow (cargo install --path .) and run install again from there"
                        );
                    }
                    outln!(
                        "installed a {} schedule for loop {} ({cadence}); undo with `loopflow schedule uninstall --loop {}`",
                        r.platform.name(),
                        t.loop_name,
                        t.loop_name
                    );
                    // cron, systemd and launchd never carry the shell's exported keys.
                    if let Ok(cfg) = crate::load::config(&paths, project) {
                        for l in super::doctor::key_lines(r.platform, &cfg) {
                            outln!("{}", crate::out::printable(&l));
                        }
                    }
                    if let Some(h) = super::doctor::hint(project, &t.loop_name) {
                        outln!("{}", crate::out::printable(&h));
                    }
                    exit::OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::STATE
                }
            }
        }
        ScheduleAction::Uninstall(l) => {
            if let Err(code) = super::valid_name(project, &l.loop_name) {
                return code;
            }
            let project: PathBuf = project.canonicalize().unwrap_or(project.to_path_buf());
            let paths = LoopPaths::new(&project, &l.loop_name);
            if !paths.dir.is_dir() {
                eprintln!("error: {}", super::no_loop(&project, &l.loop_name));
                return exit::USAGE;
            }
            match schedule::uninstall(&paths) {
                Ok(said) => {
                    for s in said {
                        outln!("{s}");
                    }
                    if paths.dir.is_dir() {
                        let _ = paths.log(
                            Event::Schedule,
                            &[crate::state::LogArg::Kv("uninstalled", "true".into())],
                        );
                    }
                    exit::OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::STATE
                }
            }
        }
    }
}

pub(super) fn worktree(project: &Path, a: WorktreeArgs) -> i32 {
    match a.action {
        WorktreeAction::Gc(g) => {
            let max_age = match crate::duration::parse_age(&g.max_age) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!(
                        "error: --max-age: invalid age `{}` ({e}): use e.g. 14d, 12h, 30m or 90s",
                        g.max_age
                    );
                    return exit::USAGE;
                }
            };
            let o = crate::worktree::GcOptions {
                max_age,
                force: g.force,
                dry_run: g.dry_run,
                include_idle: g.include_idle,
            };
            let mut code = match crate::worktree::gc(project, &o) {
                Ok(r) => {
                    for l in &r.lines {
                        outln!("{l}");
                    }
                    if r.kept > 0 {
                        eprintln!(
                            "note: kept {} worktree(s) or branch(es) that hold work (see above)",
                            r.kept
                        );
                    }
                    exit::OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::STATE
                }
            };
            // Schedules whose loop directory was deleted (and with it the record
            // `schedule uninstall` reads) would fire `loopflow run` every interval.
            let canonical = project.canonicalize().unwrap_or(project.to_path_buf());
            for orphan in crate::schedule::orphans(&canonical) {
                let what = crate::schedule::describe_orphan(&orphan);
                if g.dry_run {
                    outln!("would remove {what}");
                    continue;
                }
                match crate::schedule::remove_orphan(&orphan) {
                    Ok(said) => {
                        outln!("removed {what}");
                        for l in said {
                            eprintln!("{l}");
                        }
                    }
                    Err(e) => {
                        eprintln!("error: cannot remove {what}: {e}");
                        code = exit::STATE;
                    }
                }
            }
            code
        }
        WorktreeAction::Restore(r) => restore(project, &r.loop_name),
    }
}

fn restore(project: &Path, name: &str) -> i32 {
    if let Err(code) = super::valid_name(project, name) {
        return code;
    }
    let project = project.canonicalize().unwrap_or(project.to_path_buf());
    let paths = LoopPaths::new(&project, name);
    if !paths.state.exists() {
        eprintln!("error: {}", super::no_loop(&project, name));
        return exit::USAGE;
    }
    let base = std::env::current_dir().unwrap_or_else(|_| project.clone());
    let (dir, allow) = match crate::load::config(&paths, &base) {
        Ok(c) if !c.worktree => {
            eprintln!(
                "error: loop {name} runs without a worktree (`[worktree] enabled = false` in its loop.toml); there is nothing to restore"
            );
            return exit::USAGE;
        }
        Ok(c) => (
            c.worktree_dir.clone(),
            c.allow.iter().map(|a| a.value.clone()).collect(),
        ),
        // A config that does not read does not stop the repair; the tick reports it.
        Err(_) => (crate::worktree::configured_dir(&paths), Vec::new()),
    };
    match crate::worktree::restore(&paths, dir.as_deref(), &allow) {
        Ok(r) if !r.created => {
            outln!(
                "loop {name}'s worktree is at {} (nothing to do)",
                r.path.display()
            );
            exit::OK
        }
        Ok(r) if r.moved.is_some() => {
            let m = r
                .moved
                .as_ref()
                .map(|m| (m.from.display().to_string(), m.carried, m.left.clone()));
            if let Some((from, carried, left)) = m {
                outln!(
                    "moved loop {name}'s worktree from {from} to {} on {} ({carried} uncommitted file(s) carried over)",
                    r.path.display(),
                    r.branch
                );
                if let Some(l) = left {
                    eprintln!("warning: the old worktree could not be removed: {l}");
                }
            }
            exit::OK
        }
        Ok(r) => {
            let from = if r.branch_existed {
                "its existing branch"
            } else {
                "a new branch from HEAD"
            };
            outln!(
                "restored loop {name}'s worktree at {} on {} ({from})",
                r.path.display(),
                r.branch
            );
            exit::OK
        }
        Err(e @ crate::worktree::RestoreError::Busy(_)) => {
            eprintln!("error: {e}");
            exit::NO
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::STATE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::github_action;

    #[test]
    fn only_a_plain_github_repository_is_used_as_an_action() {
        for url in [
            "https://github.com/loopflow-dev/loopflow",
            "https://github.com/loopflow-dev/loopflow/",
            "https://github.com/loopflow-dev/loopflow.git",
        ] {
            assert_eq!(
                github_action(url).as_deref(),
                Some("loopflow-dev/loopflow"),
                "{url}"
            );
        }
        for url in [
            "https://git.example.org/loopflow.git",
            "https://github.com/loopflow-dev",
            "https://github.com/loopflow-dev/loopflow/tree/main",
            "https://github.com/a b/c",
            "https://github.com/../c",
            "http://github.com/a/b",
        ] {
            assert_eq!(github_action(url), None, "{url}");
        }
    }
}
