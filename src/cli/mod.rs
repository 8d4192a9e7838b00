//! The command line: one file per group of subcommands, each returning an exit code.
//! Which project a command works in is decided once, by [`project_root`].

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::exit;
use crate::state::{LoopPaths, State};
use crate::tick::RunError;

mod check;
mod control;
mod create;
mod daemon;
mod demo;
mod drift;
mod init;
mod report;
mod run;
mod schedule;
mod status;

pub use run::report;

const EXAMPLES: &str = "\
Examples:
  loopflow demo                                   see a loop run with a fake agent, offline
  loopflow create --loop fix-parser --task \"Make the parser handle empty input\"
  loopflow run --loop fix-parser --dry-run        the gate and each node's argv; runs nothing
  loopflow schedule install --loop fix-parser     tick it from systemd, launchd or cron
  loopflow status                                 where every loop stands
  loopflow approve --loop fix-parser --note \"looked good\" --extend 3

The project is the nearest directory at or above the current one holding .loopflow/
(else the git top level, else the current directory), unless --project or
LOOPFLOW_PROJECT names it.

Exit codes: 0 ok (a tick that ran, skipped or halted cleanly), 1 no (can-continue, can-edit, \
refused approve), 2 usage error, 3 invalid configuration, 4 state or I/O error, 130 interrupted.";

#[derive(Parser, Debug)]
#[command(
    name = "loopflow",
    version,
    about = "Runs AI coding-agent work unattended, in capped iterations, with a human approval at every halt.",
    long_about = "Runs AI coding-agent work unattended, in capped iterations (\"loops\"), with a mandatory human \
approval at every halt. A loop's unit of work is a tick: a DAG of nodes described in a TOML pipeline.\n\n\
Start with `loopflow demo`, then `loopflow create --loop NAME --task \"...\"` in your repository.",
    after_help = EXAMPLES
)]
pub struct Cli {
    /// The project directory (holds .loopflow/); default: found upward from the current
    /// directory.
    #[arg(long, global = true, env = "LOOPFLOW_PROJECT", value_name = "DIR")]
    pub project: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one tick of a loop (what a scheduler fires).
    Run(run::RunArgs),
    /// Run ticks on an interval until stopped (opt-in fallback to a native scheduler).
    Daemon(daemon::DaemonArgs),
    /// Lint pipeline and loop files; exits 3 when any error is found.
    Check(check::CheckArgs),
    /// Draw a pipeline's DAG.
    Graph(check::GraphArgs),
    /// Create a loop from a template.
    Create(create::CreateArgs),
    /// Show loops: iteration, halt, task, phase, last score, spend.
    Status(status::StatusArgs),
    /// Print a loop's event log.
    Log(status::LogArgs),
    /// Evaluate a loop's brakes.
    Gate(control::GateArgs),
    /// Exit 0 when the loop may tick, 1 when not.
    CanContinue(control::LoopArg),
    /// Halt a loop with a reason; only `approve` clears it.
    Halt(control::HaltArgs),
    /// Clear a loop's halt (a human's decision, recorded).
    Approve(control::ApproveArgs),
    /// Move the loop's task to another phase.
    Transition(control::TransitionArgs),
    /// Exit 0 when every path is inside the loop's blast radius, 1 otherwise.
    CanEdit(control::CanEditArgs),
    /// Print the JSON Schema of a file format.
    Schema(check::SchemaArgs),
    /// Install, remove or print a loop's native schedule (systemd, launchd, cron, …).
    Schedule(schedule::ScheduleArgs),
    /// Manage loop worktrees (`gc` prunes stale ones).
    Worktree(schedule::WorktreeArgs),
    /// Run a real loop with a built-in fake agent in a throw-away project.
    Demo(demo::DemoArgs),
    /// Set a project up: .loopflow/, a first loop from a template, .gitignore lines.
    Init(init::InitArgs),
    /// List docs whose last-read-sha is older than the code they describe (JSON lines).
    Drift(drift::DriftArgs),
    /// Write an HTML page with every loop's state, spend, last verdict and recent log.
    Report(report::ReportArgs),
    /// The demo's fake agent (used by `demo`; also handy in tests).
    #[command(hide = true)]
    FakeAgent(demo::FakeAgentArgs),
}

/// Colour for human output, decided once, the way cargo and ripgrep decide it (through
/// `anstyle-query`): `NO_COLOR` off, `CLICOLOR_FORCE` on, `CLICOLOR=0` off, else only on a
/// terminal whose `TERM` supports colour (not `dumb`).
pub fn use_color(stream_is_tty: bool) -> bool {
    if anstyle_query::no_color() {
        return false;
    }
    if anstyle_query::clicolor_force() {
        return true;
    }
    if anstyle_query::clicolor() == Some(false) {
        return false;
    }
    stream_is_tty && anstyle_query::term_supports_color()
}

/// The command line as clap sees it, with what derive cannot say: `demo` builds a
/// project of its own, so its help does not offer the global `--project` — it gets a
/// hidden one of its own (clap propagates a global only where the id is free), which
/// [`dispatch`] refuses.
pub(crate) fn command() -> clap::Command {
    Cli::command().mut_subcommand("demo", |d| {
        d.arg(
            clap::Arg::new("project")
                .long("project")
                .value_name("DIR")
                .value_parser(clap::value_parser!(PathBuf))
                .hide(true),
        )
    })
}

/// The project directory a command works in, decided in one place for every command:
/// `--project` / `LOOPFLOW_PROJECT` when given; else the nearest directory at or above
/// the current one that holds `.loopflow/` (as git finds `.git/` and cargo
/// `Cargo.toml`); else the git top level (where `create` and `init` start a project);
/// else the current directory.
pub(crate) fn project_root(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    let Ok(cwd) = std::env::current_dir() else {
        return PathBuf::from(".");
    };
    if let Some(found) = cwd.ancestors().find(|d| d.join(".loopflow").is_dir()) {
        return found.to_path_buf();
    }
    crate::git::git(&cwd, &["rev-parse", "--show-toplevel"])
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|t| PathBuf::from(t.trim_end_matches(['\n', '\r'])))
        .filter(|t| t.is_dir())
        .unwrap_or(cwd)
}

pub fn main() -> i32 {
    crate::out::install_pipe_net();
    let code = dispatch();
    crate::out::finish(code)
}

fn dispatch() -> i32 {
    let parsed = command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|c| (c, m)));
    let (cli, matches) = match parsed {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return code;
        }
    };
    // Before or after `demo`, the flag is refused; LOOPFLOW_PROJECT (set inside every
    // tick, say) is ignored: the demo never writes into a real project.
    if let Command::Demo(_) = cli.command {
        let given =
            |m: &clap::ArgMatches| m.value_source("project") == Some(ValueSource::CommandLine);
        if given(&matches) || matches.subcommand_matches("demo").is_some_and(given) {
            eprintln!(
                "error: demo builds a throw-away project of its own and takes no --project; pass --dir D to say where"
            );
            return exit::USAGE;
        }
    }
    let project = project_root(cli.project.as_deref());
    if !matches!(
        cli.command,
        Command::Demo(_)
            | Command::FakeAgent(_)
            | Command::Check(_)
            | Command::Graph(_)
            | Command::Schema(_)
            | Command::Drift(_)
    ) && !project.is_dir()
    {
        eprintln!(
            "error: project directory {} does not exist",
            project.display()
        );
        return exit::USAGE;
    }
    match cli.command {
        Command::Run(a) => run::run(&project, a),
        Command::Daemon(a) => daemon::daemon(&project, a),
        Command::Check(a) => check::check(&project, a),
        Command::Graph(a) => check::graph(a),
        Command::Create(a) => create::create(&project, a),
        Command::Status(a) => status::status(&project, a),
        Command::Log(a) => status::log(&project, a),
        Command::Gate(a) => control::gate(&project, a),
        Command::CanContinue(a) => control::can_continue(&project, a),
        Command::Halt(a) => control::halt(&project, a),
        Command::Approve(a) => control::approve(&project, a),
        Command::Transition(a) => control::transition(&project, a),
        Command::CanEdit(a) => control::can_edit(&project, a),
        Command::Schema(a) => check::schema(a),
        Command::Schedule(a) => schedule::schedule(&project, a),
        Command::Worktree(a) => schedule::worktree(&project, a),
        Command::Demo(a) => demo::demo(a),
        Command::FakeAgent(a) => demo::fake_agent(a),
        Command::Init(a) => init::init(&project, a),
        Command::Drift(a) => drift::drift(a),
        Command::Report(a) => report::report(&project, a),
    }
}

/// Validates the name and requires the loop's state; prints why not.
pub(crate) fn open(project: &std::path::Path, name: &str) -> Result<(LoopPaths, State), i32> {
    if let Err(e) = crate::state::check_loop_name(name) {
        eprintln!("error: {e}");
        return Err(exit::USAGE);
    }
    let paths = LoopPaths::new(project, name);
    if !paths.state.exists() {
        eprintln!(
            "error: no loop `{name}` in {} (create it with `loopflow create --loop {name}`)",
            project.display()
        );
        return Err(exit::USAGE);
    }
    match paths.load() {
        Ok(s) => Ok((paths, s)),
        Err(e) => Err(report(&RunError::State(e))),
    }
}

/// The loop's `loop.toml`, checked; prints the problems and gives the exit code if not.
pub(crate) fn config(
    paths: &LoopPaths,
    project: &std::path::Path,
) -> Result<crate::config::LoopConfig, i32> {
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    crate::load::config(paths, &base).map_err(|e| report(&e.into()))
}
