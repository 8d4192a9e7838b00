//! `run`: one tick of a loop, what a scheduler fires.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::Args;

use crate::diag::{Format, render};
use crate::exit;
use crate::out::outln;
use crate::reason::SkipReason;
use crate::tick::{RunError, RunOptions, Summary, run_tick};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// Pipeline file; default: the loop's `pipeline` key, else the built-in tick.
    pub pipeline: Option<PathBuf>,
    /// The loop to tick.
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: String,
    /// Print the tick summary as one JSON document on stdout (human lines go to stderr):
    /// `{"loop", "outcome", "reason", "iteration", "pass", "score", "nodes"}`.
    #[arg(long)]
    pub json: bool,
    /// Evaluate the gate and print each node's rendered argv; spawn and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Run independent branches of the DAG concurrently.
    #[arg(long)]
    pub parallel: bool,
    /// For a loop whose state lives in its repository ([remote]): the schedule slot this
    /// run is for; across every runner, a slot is ticked at most once. `auto`: the firing
    /// of the loop's schedule nearest to now (what generated schedulers pass).
    #[arg(long, value_name = "SLOT", env = "LOOPFLOW_SLOT")]
    pub slot: Option<String>,
}

/// SIGINT/SIGTERM set this flag; running children are stopped by the process layer.
pub(super) fn install_signals() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    #[cfg(unix)]
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&flag));
    }
    flag
}

/// Prints a run error and returns its exit code.
pub(crate) fn report(e: &RunError) -> i32 {
    match e {
        RunError::Usage(m) => {
            eprintln!("error: {m}");
            exit::USAGE
        }
        RunError::Config(d) => {
            let color = super::use_color(std::io::IsTerminal::is_terminal(&std::io::stderr()));
            eprint!("{}", render(d, Format::Human, color));
            eprintln!(
                "error: invalid configuration; nothing ran (fix the problems above; `loopflow check` lists them)"
            );
            exit::CONFIG
        }
        RunError::State(s) => {
            eprintln!("error: {s}");
            exit::STATE
        }
        RunError::Remote(r) => {
            eprintln!("error: {r}");
            exit::STATE
        }
    }
}

/// Prints how the tick went. Without `--json` the human lines are the command's output
/// (stdout); with it stdout carries exactly one JSON document and the human lines go to
/// stderr, so `run --json | jq` always parses.
fn print_summary(s: &Summary, json: bool) {
    // Task titles and reasons can come from an agent: escaped for the terminal.
    let human = |line: String| {
        let line = crate::out::printable_text(&line);
        if json {
            eprintln!("{line}");
        } else {
            outln!("{line}");
        }
    };
    if let Some(d) = &s.dry_run {
        human(format!(
            "dry run of loop {} (tick {}); nothing is spawned or written",
            s.loop_name, d.tick
        ));
        human(format!(
            "gate: {}",
            match &d.gate {
                None => "ok".to_string(),
                Some(r) => format!("not ok ({r}); a real run would end here"),
            }
        ));
        human(d.sandbox.clone());
        for n in &d.nodes {
            let when = n
                .when
                .as_ref()
                .map(|w| format!(" when {w}"))
                .unwrap_or_default();
            let sep = if n.what.is_empty() { "" } else { ": " };
            human(format!("  {} ({}){when}{sep}{}", n.id, n.kind, n.what));
        }
    }
    human(s.human());
    if json {
        outln!("{}", crate::out::json(s, false));
    }
}

pub(super) fn run(project: &Path, a: RunArgs) -> i32 {
    let cancel = install_signals();
    let opts = RunOptions {
        pipeline: a.pipeline,
        dry_run: a.dry_run,
        parallel: a.parallel,
        trace: None,
        no_telemetry: false,
        slot: a.slot.filter(|s| !s.is_empty()),
    };
    if let Err(code) = super::valid_name(project, &a.loop_name) {
        return code;
    }
    match run_tick(project, &a.loop_name, &opts, &cancel) {
        Ok(s) => {
            if s.reason == Some(SkipReason::UnknownLoop.to_string()) {
                eprintln!(
                    "warning: {} (nothing to do)",
                    super::no_loop(project, &a.loop_name)
                );
            }
            print_summary(&s, a.json);
            // A dry run spends nothing: it says, cheaply, what a real tick would miss.
            if a.dry_run
                && s.dry_run.is_some()
                && let Some(h) = super::doctor::hint(project, &a.loop_name)
            {
                let h = crate::out::printable(&h);
                if a.json {
                    eprintln!("{h}");
                } else {
                    outln!("{h}");
                }
            }
            if s.interrupted {
                exit::INTERRUPTED
            } else {
                exit::OK
            }
        }
        Err(e) => report(&e),
    }
}
