//! Isolation and scheduling commands: `schedule print|install|uninstall` and
//! `worktree gc|restore`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::config::LoopConfig;
use crate::diag::Diagnostics;
use crate::exit;
use crate::schedule::{self, Platform, Target};
use crate::state::{Event, LoopPaths, check_loop_name};
use crate::tick::RunError;

use super::run::report;

#[derive(Args, Debug)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    pub action: ScheduleAction,
}

#[derive(Subcommand, Debug)]
pub enum ScheduleAction {
    /// Print the scheduler files to stdout; change nothing.
    Print(ScheduleTarget),
    /// Install the schedule (idempotent; replaces an earlier one).
    Install(ScheduleTarget),
    /// Remove what `install` did.
    Uninstall(ScheduleLoop),
}

#[derive(Args, Debug)]
pub struct ScheduleTarget {
    /// The loop whose ticks the schedule fires.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// The scheduler; `auto` picks this machine's native one.
    #[arg(long, value_enum, default_value = "auto")]
    pub platform: Platform,
}

#[derive(Args, Debug)]
pub struct ScheduleLoop {
    /// The loop whose schedule to remove.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub struct WorktreeArgs {
    #[command(subcommand)]
    pub action: WorktreeAction,
}

#[derive(Subcommand, Debug)]
pub enum WorktreeAction {
    /// Prune worktrees and loopflow/* branches of deleted loops (and, with
    /// --include-idle, of live loops idle longer than --max-age).
    Gc(GcArgs),
    /// Re-create a loop's removed worktree on its branch loopflow/<loop> (or a new branch
    /// from HEAD) and point the loop's state at it.
    Restore(RestoreArgs),
}

#[derive(Args, Debug)]
pub struct RestoreArgs {
    /// The loop whose worktree to bring back.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
}

#[derive(Args, Debug)]
pub struct GcArgs {
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

/// The loop's paths and the target its schedule fires.
fn target(project: &Path, name: &str) -> Result<(LoopPaths, Target), i32> {
    if let Err(e) = check_loop_name(name) {
        eprintln!("error: {e}");
        return Err(exit::USAGE);
    }
    let project = match project.canonicalize() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {}: {e}", project.display());
            return Err(exit::USAGE);
        }
    };
    let paths = LoopPaths::new(&project, name);
    if !paths.state.exists() {
        eprintln!(
            "error: no loop `{name}` in {} (create it with `loopflow create --loop {name}`)",
            project.display()
        );
        return Err(exit::USAGE);
    }
    let mut d = Diagnostics::default();
    let base = std::env::current_dir().unwrap_or_else(|_| project.clone());
    let cfg = match LoopConfig::read(&paths.config(), &base, &mut d) {
        Ok(Some(c)) if !d.has_errors() => c,
        Ok(_) => return Err(report(&RunError::Config(d))),
        Err(e) => {
            eprintln!("error: {}: {e}", paths.config().display());
            return Err(exit::STATE);
        }
    };
    let exe = match std::env::current_exe().and_then(|p| p.canonicalize()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot find the path of the running loopflow binary: {e}");
            return Err(exit::STATE);
        }
    };
    let t = Target {
        exe,
        project: project.clone(),
        loop_name: name.to_string(),
        interval: cfg.interval_seconds,
        loop_dir: paths.dir.clone(),
        path_env: std::env::var("PATH").ok().filter(|p| !p.is_empty()),
    };
    Ok((paths, t))
}

pub fn schedule(project: &Path, a: ScheduleArgs) -> i32 {
    match a.action {
        ScheduleAction::Print(t) => {
            let (_, target) = match target(project, &t.loop_name) {
                Ok(x) => x,
                Err(c) => return c,
            };
            let p = if t.platform == Platform::Auto {
                schedule::auto()
            } else {
                t.platform
            };
            print!("{}", schedule::print_text(p, &target));
            exit::OK
        }
        ScheduleAction::Install(t) => {
            let (paths, target) = match target(project, &t.loop_name) {
                Ok(x) => x,
                Err(c) => return c,
            };
            match schedule::install(t.platform, &target, &paths) {
                Ok((r, said)) => {
                    for l in said {
                        println!("{l}");
                    }
                    let _ = paths.log(
                        Event::Schedule,
                        &[
                            crate::state::LogArg::Kv("installed", r.platform.name().into()),
                            crate::state::LogArg::Kv("every", format!("{}s", r.interval_seconds)),
                        ],
                    );
                    let exe = r.exe.display().to_string();
                    if exe.contains("/target/debug/") || exe.contains("/target/release/") {
                        println!(
                            "note: the schedule runs {exe}, a cargo build output; `cargo clean` or a rebuild changes it. Install loopflow (cargo install --path .) and run install again from there"
                        );
                    }
                    println!(
                        "installed a {} schedule for loop {} (every {} s); undo with `loopflow schedule uninstall --loop {}`",
                        r.platform.name(),
                        t.loop_name,
                        r.interval_seconds,
                        t.loop_name
                    );
                    exit::OK
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    exit::STATE
                }
            }
        }
        ScheduleAction::Uninstall(l) => {
            if let Err(e) = check_loop_name(&l.loop_name) {
                eprintln!("error: {e}");
                return exit::USAGE;
            }
            let project: PathBuf = project.canonicalize().unwrap_or(project.to_path_buf());
            let paths = LoopPaths::new(&project, &l.loop_name);
            match schedule::uninstall(&paths) {
                Ok(said) => {
                    for s in said {
                        println!("{s}");
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

pub fn worktree(project: &Path, a: WorktreeArgs) -> i32 {
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
            match crate::worktree::gc(project, &o) {
                Ok(r) => {
                    for l in &r.lines {
                        println!("{l}");
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
            }
        }
        WorktreeAction::Restore(r) => restore(project, &r.loop_name),
    }
}

fn restore(project: &Path, name: &str) -> i32 {
    if let Err(e) = check_loop_name(name) {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    let project = project.canonicalize().unwrap_or(project.to_path_buf());
    let paths = LoopPaths::new(&project, name);
    if !paths.state.exists() {
        eprintln!(
            "error: no loop `{name}` in {} (create it with `loopflow create --loop {name}`)",
            project.display()
        );
        return exit::USAGE;
    }
    let base = std::env::current_dir().unwrap_or_else(|_| project.clone());
    match crate::load::config(&paths, &base) {
        Ok(c) if !c.worktree => {
            eprintln!(
                "error: loop {name} runs without a worktree (`[worktree] enabled = false` in its loop.toml); there is nothing to restore"
            );
            return exit::USAGE;
        }
        // A config that does not read does not stop the repair; the tick reports it.
        _ => {}
    }
    match crate::worktree::restore(&paths) {
        Ok(r) if !r.created => {
            println!(
                "loop {name}'s worktree is at {} (nothing to do)",
                r.path.display()
            );
            exit::OK
        }
        Ok(r) => {
            let from = if r.branch_existed {
                "its existing branch"
            } else {
                "a new branch from HEAD"
            };
            println!(
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
