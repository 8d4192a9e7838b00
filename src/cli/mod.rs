//! The command line: one file per group of subcommands, each returning an exit code.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::exit;
use crate::state::{LoopPaths, State};
use crate::tick::RunError;

mod check;
mod control;
mod create;
mod daemon;
mod dashboard;
mod demo;
mod drift;
mod init;
mod report;
mod review;
mod run;
mod schedule;
mod status;

pub use run::report;

#[derive(Parser, Debug)]
#[command(
    name = "loopflow",
    version,
    about = "Runs AI coding-agent work unattended, in capped iterations, with a human approval at every halt.",
    long_about = "Runs AI coding-agent work unattended, in capped iterations (\"loops\"), with a mandatory human \
approval at every halt. A loop's unit of work is a tick: a DAG of nodes described in a TOML pipeline.\n\n\
Start with `loopflow demo`, then `loopflow create --loop NAME --task \"...\"` in your repository.",
    after_help = "Exit codes: 0 ok (a tick that ran, skipped or halted cleanly), 1 no (can-continue, can-edit, refused approve), \
2 usage error, 3 invalid configuration, 4 state or I/O error, 130 interrupted."
)]
pub struct Cli {
    /// The project directory (holds .loopflow/).
    #[arg(
        long,
        global = true,
        default_value = ".",
        env = "LOOPFLOW_PROJECT",
        value_name = "DIR"
    )]
    pub project: PathBuf,
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
    /// Serve a live, read-only page of every loop on 127.0.0.1.
    Dashboard(dashboard::DashboardArgs),
    /// Show what a loop did since the last approval: commits, files, verdicts, spend.
    Review(review::ReviewArgs),
    /// Merge a loop's branch into the checkout's current branch.
    Land(review::LandArgs),
    /// Reset a loop's branch and worktree to the checkout's HEAD.
    Discard(review::DiscardArgs),
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

pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
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
    let project = cli.project.clone();
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
        Command::Dashboard(a) => dashboard::dashboard(&project, a),
        Command::Review(a) => review::review(&project, a),
        Command::Land(a) => review::land(&project, a),
        Command::Discard(a) => review::discard(&project, a),
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
