//! The command line: one file per group of subcommands, each returning an exit code.
//! Which project a command works in is decided once, by [`project_root`].

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::exit;
use crate::state::{LoopPaths, State};
use crate::tick::RunError;

mod check;
mod close;
mod control;
mod create;
mod daemon;
mod dashboard;
mod delete;
mod demo;
mod docs;
pub(crate) mod doctor;
mod drift;
mod fast;
mod init;
mod projects;
mod remote;
mod report;
mod review;
mod run;
mod schedule;
mod status;
mod task;

pub(crate) use run::report;

const EXAMPLES: &str = "\
Examples:
  loopflow demo                                   see a loop run with a fake agent, offline
  loopflow create --loop fix-parser --task \"Make the parser handle empty input\"
  loopflow run --loop fix-parser --dry-run        the gate and each node's argv; runs nothing
  loopflow schedule install --loop fix-parser     tick it from systemd, launchd or cron
  loopflow status                                 where every loop stands
  loopflow approve --loop fix-parser --note \"looked good\" --extend 3
  loopflow close --loop fix-parser                accept its work and end it

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
pub(crate) struct Cli {
    /// The project directory (holds .loopflow/); default: found upward from the current
    /// directory.
    /// `status`, `report` and `dashboard` take it more than once (each project's loops
    /// named `project:loop`).
    #[arg(
        long,
        global = true,
        env = "LOOPFLOW_PROJECT",
        value_name = "DIR",
        action = clap::ArgAction::Append
    )]
    pub project: Vec<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run one tick of a loop (what a scheduler fires).
    #[command(after_help = "\
Examples:
  loopflow run --loop fix-parser                  one tick, as a scheduler fires it
  loopflow run --loop fix-parser --dry-run        the gate and each node's argv; nothing runs
  loopflow run --loop fix-parser --json | jq .outcome
  loopflow run pipelines/review.toml --loop fix-parser --parallel
  loopflow run --loop fix-parser --slot auto      a [remote] loop: this firing, ticked once

Exit codes: 0 when the tick ran, skipped or halted cleanly (a scheduler keeps firing),
2 usage error, 3 invalid configuration, 4 state or I/O error, 130 interrupted.")]
    Run(run::RunArgs),
    /// Run ticks on an interval until stopped (opt-in fallback to a native scheduler).
    #[command(after_help = "\
Examples:
  loopflow daemon --loop fix-parser --interval 600
  loopflow daemon --all --max-concurrent 2        every loop, each on its own interval")]
    Daemon(daemon::DaemonArgs),
    /// Lint pipeline and loop files; exits 3 when any error is found.
    #[command(after_help = "\
Examples:
  loopflow check                                  the project's pipelines and loop.toml files
  loopflow check pipelines/tick.toml --deny-warnings
  loopflow check --format github                  annotations for a GitHub Actions step
  loopflow check --format sarif > loopflow.sarif  for GitHub code scanning")]
    Check(check::CheckArgs),
    /// Draw a pipeline's DAG.
    #[command(after_help = "\
Examples:
  loopflow graph pipelines/tick.toml | dot -Tsvg > tick.svg
  loopflow graph pipelines/tick.toml --format mermaid")]
    Graph(check::GraphArgs),
    /// Create a loop from a template.
    #[command(after_help = "\
Examples:
  loopflow create --loop fix-parser --task \"Make the parser handle empty input\"
  loopflow create --loop fix-parser --task \"...\" --agent claude-code --model sonnet
  loopflow create --loop review --agent codex --model gpt-5.5 --verify-model o3
  loopflow create --loop triage --template ci-triage --agent opencode
  loopflow create --loop notes --task \"Tidy the docs\" --no-worktree
  loopflow create --loop fix-parser --task \"...\" --remote origin   state in the repository:
                                                  any runner ticks it, any clone approves it

An unknown --template lists the built-in ones with what each does; an unknown --agent
lists the presets. Without --agent the template's agent runs (opencode).")]
    Create(create::CreateArgs),
    /// Show loops: iteration, halt, task, phase, last score, spend.
    #[command(after_help = "\
Examples:
  loopflow status
  loopflow status --loop fix-parser --json | jq '.loops[0].halt'

Exit codes: 0, also when a loop's loop.toml is invalid (shown as INVALID CONFIG);
4 when a loop's state cannot be read (the other loops are still listed).")]
    Status(status::StatusArgs),
    /// Print a loop's event log.
    #[command(after_help = "\
Examples:
  loopflow log --loop fix-parser
  loopflow log --loop fix-parser --follow
  loopflow log --loop fix-parser --json | jq -c 'select(.event == \"HALT\")'

With --json each line is one event: {\"at\", \"event\", \"args\": {KEY: VALUE}, \"words\": [..]}
(values are strings, quoted values unescaped); a line that is not an event has
\"at\" and \"event\" null and the text in \"unparsed\".")]
    Log(status::LogArgs),
    /// Evaluate a loop's brakes.
    #[command(after_help = "\
Examples:
  loopflow gate --loop fix-parser
  loopflow gate --loop fix-parser --json")]
    Gate(control::GateArgs),
    /// Exit 0 when the loop may tick, 1 when not.
    #[command(after_help = "\
Examples:
  loopflow can-continue --loop fix-parser && echo \"it may tick\"")]
    CanContinue(control::LoopArg),
    /// Halt a loop with a reason; only `approve` clears it.
    #[command(after_help = "\
Examples:
  loopflow halt --loop fix-parser --reason \"waiting for the API freeze\"

A tick running meanwhile is not stopped: it runs its remaining nodes and commits, and the
halt stands after it (the command says so, with the tick's pid for `kill`).")]
    Halt(control::HaltArgs),
    /// Clear a loop's halt (a human's decision, recorded); says what the next tick does.
    #[command(after_help = "\
Examples:
  loopflow approve --loop fix-parser --note \"looked good\"
  loopflow approve --loop fix-parser --extend 5   five more iterations past the cap
  loopflow approve --loop fix-parser --budget-usd +5
  loopflow approve --loop fix-parser --reset-scores

An approval that would halt the loop again at once is refused (exit 1), naming what
would let it run: --extend for an exhausted iteration cap, --budget-usd/--budget-tokens/
--budget-seconds for an exhausted budget (or a higher limit in loop.toml), --reset-scores
for a flat score history. A closed loop (`loopflow close`) is never reopened. Refused
while a tick runs.")]
    Approve(control::ApproveArgs),
    /// Set or replace a loop's current task.
    #[command(after_help = "\
Examples:
  loopflow task --loop fix-parser \"Make the parser handle empty input\"
  loopflow task --loop fix-parser \"Now handle trailing commas\" && loopflow approve --loop fix-parser

A new task starts the plateau window afresh. Refused while a tick runs (exit 1), and for a
loop whose tasks come from a backlog or an audit command (exit 2).")]
    Task(task::TaskArgs),
    /// Accept a loop's work and end it: a `closed` halt that `approve` does not clear.
    #[command(after_help = "\
Examples:
  loopflow close --loop fix-parser --note \"landed in main\"
  loopflow review --loop fix-parser && loopflow land --loop fix-parser && loopflow close --loop fix-parser

Its installed schedule is uninstalled; its branch, state and log stay (`delete` removes
them). Refused while a tick runs.")]
    Close(close::CloseArgs),
    /// Remove a loop: its schedule, worktree and directory (and branch with --branch).
    #[command(after_help = "\
Examples:
  loopflow delete --loop fix-parser               what it would remove; removes nothing
  loopflow delete --loop fix-parser --yes
  loopflow delete --loop fix-parser --branch --yes   its branch loopflow/fix-parser too

Without --yes it prints what it would remove and exits 2. Refused while a tick runs.")]
    Delete(delete::DeleteArgs),
    /// Move the loop's task to another phase.
    #[command(after_help = "\
Examples:
  loopflow transition --loop fix-parser --to review")]
    Transition(control::TransitionArgs),
    /// Exit 0 when every path is inside the loop's blast radius, 1 otherwise.
    #[command(after_help = "\
Examples:
  loopflow can-edit --loop fix-parser src/parser.rs tests/parser.rs")]
    CanEdit(control::CanEditArgs),
    /// Print the JSON Schema of a file format.
    #[command(after_help = "\
Examples:
  loopflow schema pipeline > pipeline.schema.json")]
    Schema(check::SchemaArgs),
    /// Install, remove or print a loop's native schedule (systemd, launchd, cron, …).
    #[command(after_help = "\
Examples:
  loopflow schedule install --loop fix-parser
  loopflow schedule print --loop fix-parser --platform cron
  loopflow schedule uninstall --loop fix-parser")]
    Schedule(schedule::ScheduleArgs),
    /// Manage loop worktrees (`gc` prunes stale ones).
    Worktree(schedule::WorktreeArgs),
    /// Run a real loop with a built-in fake agent in a throw-away project, then review,
    /// approve and land its work.
    #[command(after_help = "\
Examples:
  loopflow demo
  loopflow demo --dir /tmp/loopflow-demo          the project is /tmp/loopflow-demo/project

demo builds a git repository of its own (D/project; without git on PATH, a plain
directory and no branch to land): it takes no --project (and ignores LOOPFLOW_PROJECT);
--dir says where. Offline; well under a second once built.")]
    Demo(demo::DemoArgs),
    /// Set a project up: .loopflow/, a first loop from a template, .gitignore lines.
    #[command(after_help = "\
Examples:
  loopflow init                                   asks on a terminal (offers the agents on PATH)
  loopflow init --template default --loop fix-parser --task \"...\" --yes
  loopflow init --agent claude-code --model sonnet --verify-model opus --yes")]
    Init(init::InitArgs),
    /// List docs whose last-read-sha is older than the code they describe (JSON lines).
    Drift(drift::DriftArgs),
    /// Write an HTML page with every loop's state, spend, last verdict and recent log.
    Report(report::ReportArgs),
    /// Print a shell completion script on stdout.
    #[command(after_help = docs::COMPLETIONS_HELP)]
    Completions(docs::CompletionsArgs),
    /// Print the man page (roff) on stdout.
    #[command(after_help = "\
Examples:
  loopflow man | man -l -
  loopflow man run | man -l -                     the page of one command
  loopflow man > ~/.local/share/man/man1/loopflow.1")]
    Man(docs::ManArgs),
    /// Serve a live, read-only page of every loop on 127.0.0.1.
    Dashboard(dashboard::DashboardArgs),
    /// Check what a loop's ticks need, spending nothing: agents, keys, model host, sandbox, git, schedule.
    #[command(after_help = "\
Examples:
  loopflow doctor                                 every loop of the project
  loopflow doctor --loop fix-parser
  loopflow doctor --loop fix-parser --json | jq '.checks[] | select(.ok | not)'

It connects to each agent's model host through the tick's proxy (a TCP connection, no API
call) and reads the installed schedule: cron, systemd and launchd never carry your shell's
exported keys. Exit codes: 0 nothing missing, 1 something is (each named with its fix),
2 usage error.")]
    Doctor(doctor::DoctorArgs),
    /// Show what a loop did since the last approval: commits, files, verdicts, spend.
    Review(review::ReviewArgs),
    /// Merge a loop's branch into the checkout's current branch.
    Land(review::LandArgs),
    /// Reset a loop's branch and worktree to the checkout's HEAD.
    Discard(review::DiscardArgs),
    /// Keep the list of projects `status --all`, `report --all` and `dashboard --all` show.
    Projects(projects::ProjectsArgs),
    /// The demo's fake agent (used by `demo`; also handy in tests).
    #[command(hide = true)]
    FakeAgent(demo::FakeAgentArgs),
}

/// Colour for human output, decided once, the way cargo and ripgrep decide it (through
/// `anstyle-query`): `NO_COLOR` off, `CLICOLOR_FORCE` on, `CLICOLOR=0` off, else only on a
/// terminal whose `TERM` supports colour (not `dumb`).
pub(crate) fn use_color(stream_is_tty: bool) -> bool {
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
/// `--project` / `LOOPFLOW_PROJECT` when given; else, inside a loop's worktree, that
/// loop's project; else the nearest directory at or above the current one that holds
/// `.loopflow/` (as git finds `.git/` and cargo `Cargo.toml`); else the git top level
/// (where `create` and `init` start a project); else the current directory.
pub(crate) fn project_root(given: Option<&Path>) -> PathBuf {
    if let Some(p) = given {
        return p.to_path_buf();
    }
    let Ok(cwd) = std::env::current_dir() else {
        return PathBuf::from(".");
    };
    if let Some(project) = crate::worktree::project_of(&cwd) {
        return project;
    }
    if let Some(found) = cwd.ancestors().find(|d| d.join(".loopflow").is_dir()) {
        return found.to_path_buf();
    }
    crate::git::toplevel(&cwd).unwrap_or(cwd)
}

pub fn main() -> i32 {
    crate::process::seal_inherited_fds();
    crate::out::install_pipe_net();
    let code = dispatch();
    crate::out::finish(code)
}

fn dispatch() -> i32 {
    // What a scheduler fires (`run --loop X --project DIR`) skips building clap's
    // command tree; anything else goes through clap.
    if let Some(cli) = fast::parse(std::env::args_os().skip(1)) {
        return execute(cli);
    }
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
    execute(cli)
}

/// Runs a parsed command line.
fn execute(cli: Cli) -> i32 {
    // Over many projects: a missing one is listed as broken, never a usage error.
    let all = match &cli.command {
        Command::Status(a) => Some(a.all),
        Command::Report(a) => Some(a.all),
        Command::Dashboard(a) => Some(a.all),
        _ => None,
    };
    match all.map(|all| projects::many(&cli.project, all)) {
        Some(Err(code)) => return code,
        Some(Ok(Some(sources))) => {
            return match cli.command {
                Command::Status(a) => status::status_many(&sources, a),
                Command::Report(a) => report::report_many(&sources, a),
                Command::Dashboard(a) => dashboard::dashboard_many(&sources, a),
                _ => unreachable!("only these three take many projects"),
            };
        }
        Some(Ok(None)) => {}
        None if cli.project.len() > 1 => {
            eprintln!(
                "error: only `status`, `report` and `dashboard` take --project more than once"
            );
            return exit::USAGE;
        }
        None => {}
    }
    let project = project_root(cli.project.first().map(PathBuf::as_path));
    if !matches!(
        cli.command,
        Command::Demo(_)
            | Command::FakeAgent(_)
            | Command::Check(_)
            | Command::Graph(_)
            | Command::Schema(_)
            | Command::Drift(_)
            | Command::Completions(_)
            | Command::Man(_)
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
        Command::Task(a) => task::task(&project, a),
        Command::Close(a) => close::close(&project, a),
        Command::Delete(a) => delete::delete(&project, a),
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
        Command::Completions(a) => docs::completions(a),
        Command::Man(a) => docs::man(a),
        Command::Dashboard(a) => dashboard::dashboard(&project, a),
        Command::Review(a) => review::review(&project, a),
        Command::Doctor(a) => doctor::doctor(&project, a),
        Command::Land(a) => review::land(&project, a),
        Command::Discard(a) => review::discard(&project, a),
        Command::Projects(a) => projects::projects(&project, a),
    }
}

/// "no loop `x` in DIR", with the nearest loop's name when one is close ("did you mean
/// `fix-parser`?") or the loops there are, and how to make it. Every command that takes
/// `--loop` says it this way.
pub(crate) fn no_loop(project: &Path, name: &str) -> String {
    let loops = crate::state::list_loops(project);
    let lower = name.to_lowercase();
    let near = crate::diag::suggest(&lower, loops.iter().map(String::as_str))
        .or_else(|| loops.iter().find(|l| **l == lower).map(String::as_str));
    let create = format!("create it with `loopflow create --loop {name}`");
    match near {
        Some(n) => format!(
            "no loop `{name}` in {}; did you mean `{n}`?",
            project.display()
        ),
        None if loops.is_empty() => {
            format!("no loop `{name}` in {} ({create})", project.display())
        }
        None => {
            const SHOWN: usize = 12;
            let some: Vec<&str> = loops.iter().take(SHOWN).map(String::as_str).collect();
            let more = loops.len().saturating_sub(SHOWN);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!(
                "no loop `{name}` in {} (its loops: {}{more}; {create})",
                project.display(),
                some.join(", ")
            )
        }
    }
}

/// Checks that `name` can be a loop's; prints why not (with the nearest loop's name:
/// `Fix-Parser` is most likely `fix-parser`).
pub(crate) fn valid_name(project: &Path, name: &str) -> Result<(), i32> {
    let Err(e) = crate::state::check_loop_name(name) else {
        return Ok(());
    };
    let loops = crate::state::list_loops(project);
    match crate::diag::suggest(&name.to_lowercase(), loops.iter().map(String::as_str)) {
        Some(n) => eprintln!("error: {e}; did you mean `{n}`?"),
        None => eprintln!("error: {e}"),
    }
    Err(exit::USAGE)
}

/// Validates the name (a name that is not a loop's, with the nearest loop's) and
/// requires the loop's state file; prints why not.
pub(crate) fn loop_paths(project: &Path, name: &str) -> Result<LoopPaths, i32> {
    valid_name(project, name)?;
    let paths = LoopPaths::new(project, name);
    // A remote loop's record is read fresh: any clone, any path (DESIGN §16).
    if paths.dir.is_dir() {
        remote::refresh(&paths, false)?;
    }
    if !paths.state.exists() {
        eprintln!("error: {}", no_loop(project, name));
        return Err(exit::USAGE);
    }
    Ok(paths)
}

/// Validates the name and requires the loop's state; prints why not.
pub(crate) fn open(project: &std::path::Path, name: &str) -> Result<(LoopPaths, State), i32> {
    let paths = loop_paths(project, name)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand has an about, every argument (flag or positional) a help text,
    /// and every subcommand that takes `--loop` says what it names.
    #[test]
    fn every_command_and_argument_is_documented() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            if cmd.get_about().is_none() && !path.is_empty() {
                missing.push(format!("{path}: no about"));
            }
            for a in cmd.get_arguments() {
                let id = a.get_id().as_str();
                if a.is_hide_set() || matches!(id, "help" | "version") {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} {id}: no help"));
                }
            }
            for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut cmd = command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "undocumented:\n{}", missing.join("\n"));
    }

    #[test]
    fn the_main_commands_show_examples() {
        let mut cmd = command();
        cmd.build();
        let help = |c: &clap::Command| c.clone().render_long_help().to_string();
        assert!(help(&cmd).contains("Examples:"));
        for name in ["run", "check", "create", "status", "log", "approve", "demo"] {
            let sub = cmd.find_subcommand(name).expect(name);
            assert!(help(sub).contains("Examples:"), "{name}");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        command().debug_assert();
    }
}
