//! `loopflow demo`: a real loop in a throw-away project, driven by a built-in fake agent
//! (this same binary), ticked until it halts on its own brakes. Offline, nothing to install.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use clap::Args;

use crate::create::{AgentChoice, CreateOptions, Harness, create};
use crate::exit;
use crate::out::{self, outln};
use crate::reason::{HaltReason, VerifierFailure};
use crate::tick::{Outcome, RunOptions, run_tick};

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Where to build the demo project (default: a new temporary directory, kept so you can look around).
    #[arg(long, value_name = "D")]
    pub dir: Option<PathBuf>,
    /// Print one JSON document at the end, `{"project", "ticks": [tick summaries],
    /// "status"}`; the story goes to stderr.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct FakeAgentArgs {
    /// implement | verify | orchestrate
    #[arg(long)]
    pub role: String,
    /// The rendered prompt file (read, to prove it exists).
    #[arg(long)]
    pub prompt: Option<PathBuf>,
    /// Scores to report, one per tick (verify); the last one repeats.
    #[arg(long, value_delimiter = ',', default_value = "0.35,0.6,0.75,0.8")]
    pub scores: Vec<f64>,
}

/// The fake agent: implement edits a file, verify grades with a score that rises then
/// plateaus, orchestrate summarises. Behaves like an agent: reads its prompt, edits files
/// in its working directory, prints a verdict.
pub fn fake_agent(a: FakeAgentArgs) -> i32 {
    let tick: usize = std::env::var("LOOPFLOW_TICK")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    if let Some(p) = &a.prompt
        && std::fs::read_to_string(p).is_err()
    {
        eprintln!("fake-agent: cannot read prompt {}", p.display());
        return 1;
    }
    match a.role.as_str() {
        "implement" => {
            let line = format!("- iteration {tick}: tightened the parser and added a test\n");
            let r = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open("NOTES.md")
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = r {
                eprintln!("fake-agent: {e}");
                return 1;
            }
            outln!("edited NOTES.md");
            0
        }
        "verify" => {
            let score = a
                .scores
                .get(tick - 1)
                .or(a.scores.last())
                .copied()
                .unwrap_or(0.5);
            let v = serde_json::json!({
                "pass": score >= 0.8,
                "score": score,
                "reasons": [format!("iteration {tick}: {} of the checklist is done", (score * 100.0).round() / 100.0)],
                "next_hint": "cover the error paths next",
                "cost_usd": 0.02,
                "tokens": 1500,
            });
            outln!("Reviewed the change in a fresh session.\n\n```json\n{v}\n```");
            0
        }
        "orchestrate" => {
            outln!("orchestrator: iteration {tick} reviewed; keep going");
            0
        }
        other => {
            eprintln!("fake-agent: unknown role {other}");
            2
        }
    }
}

/// A path as a shell word: as it is when it needs no quoting, else in single quotes, so
/// the commands the demo prints work when pasted.
fn shell_word(p: &Path) -> String {
    let s = p.display().to_string();
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:,@%=".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

pub fn demo(a: DemoArgs) -> i32 {
    // The story is the output; with --json it goes to stderr and stdout carries one
    // JSON document at the end.
    let say = |line: String| {
        if a.json {
            eprintln!("{line}");
        } else {
            outln!("{line}");
        }
    };
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => match tempfile::Builder::new().prefix("loopflow-demo-").tempdir() {
            Ok(t) => t.keep(),
            Err(e) => {
                eprintln!("error: cannot create a temporary directory: {e}");
                return exit::STATE;
            }
        },
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("error: {}: {e}", dir.display());
        return exit::STATE;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e.display().to_string(),
        Err(e) => {
            eprintln!("error: cannot find the loopflow binary: {e}");
            return exit::STATE;
        }
    };
    say("loopflow demo: a real loop, a fake agent, no network\n".into());
    say(format!("project: {}", dir.display()));
    let o = CreateOptions {
        name: "demo",
        template: "default",
        task: Some("Make the parser handle empty input".into()),
        worktree: false,
        harness: Some(Harness {
            agent: Some(AgentChoice::Command(vec![
                exe.clone(),
                "fake-agent".into(),
                "--role".into(),
                "{{role}}".into(),
                "--prompt".into(),
                "{{prompt}}".into(),
            ])),
            ..Harness::default()
        }),
        remote: None,
    };
    // The project the fake agent works on. With worktrees off the sandbox lets agents
    // write the project's existing top-level entries (not create new ones at its root).
    if let Err(e) = std::fs::write(dir.join("NOTES.md"), "# Parser notes\n") {
        eprintln!("error: {}: {e}", dir.join("NOTES.md").display());
        return exit::STATE;
    }
    let paths = match create(&dir, &o) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::STATE;
        }
    };
    // The fake agent reports its own context size; the demo says so explicitly.
    let cfg_path = paths.dir.join("loop.toml");
    if let Ok(t) = std::fs::read_to_string(&cfg_path) {
        let _ = std::fs::write(
            &cfg_path,
            t.replace("# context_tokens = 32000", "context_tokens = 32000"),
        );
    }
    say(
        "loop:    demo (task: \"Make the parser handle empty input\", max 10 iterations, plateau window 3)"
            .into(),
    );
    say(format!(
        "agent:   {exe} fake-agent --role {{{{role}}}} --prompt {{{{prompt}}}}\n"
    ));
    let cancel = AtomicBool::new(false);
    // Offline whatever the environment says: no trace leaves the machine from a demo.
    let opts = RunOptions {
        no_telemetry: true,
        ..RunOptions::default()
    };
    let mut ticks = Vec::new();
    for _ in 0..20 {
        match run_tick(&dir, "demo", &opts, &cancel) {
            Ok(s) => {
                say(format!("  {}", s.human()));
                let end = matches!(s.outcome, Outcome::Halt | Outcome::Abort)
                    || s.reason.as_deref().is_some_and(|r| r.starts_with("halted"));
                ticks.push(s);
                if end {
                    break;
                }
            }
            Err(e) => return super::report(&e),
        }
    }
    say("\n.state.log:".into());
    if let Ok(text) = std::fs::read_to_string(&paths.log) {
        for line in text.lines() {
            say(format!("  {}", out::printable(line)));
        }
    }
    say("\nstatus:".into());
    let row = super::status::status_row(&crate::state::LoopPaths::new(&dir, "demo")).ok();
    for line in super::status::status_table(row.as_slice(), &[]).lines() {
        say(format!("  {line}"));
    }
    let json = |code| {
        if a.json {
            let doc = serde_json::json!({"project": dir, "ticks": ticks, "status": row});
            outln!("{}", out::json(&doc, true));
        }
        code
    };
    // Only the brakes the demo is built to reach: a halt for a broken verdict, a refused
    // sandbox or anything else a human must look into is the demo failing too.
    let Some(why) = paths
        .load()
        .ok()
        .and_then(|s| s.halt)
        .and_then(|h| demo_brake(&h.reason))
    else {
        // The demo is the first thing a newcomer runs: a loop that aborted (its agent
        // failed) is the demo failing, said as such, never dressed up as a halt.
        let last = ticks
            .last()
            .map_or_else(|| "no tick ran".to_string(), |s| s.human());
        eprintln!(
            "error: the demo's loop did not stop on one of its brakes ({last}); what its agent said is in {}",
            paths.outputs.display()
        );
        return json(exit::STATE);
    };
    let notes = std::fs::read_to_string(dir.join("NOTES.md")).unwrap_or_default();
    say(format!(
        "\nwhat happened: the fake agent edited NOTES.md ({} lines, one per iteration); the verifier",
        notes
            .lines()
            .filter(|l| l.starts_with("- iteration"))
            .count()
    ));
    say("graded each iteration, and its reasons and next_hint were rendered into the next".into());
    say("implement prompt (see outputs/<N>-implement.prompt.md in the loop directory).".into());
    say(format!("why it stopped: {why}."));
    let d = shell_word(&dir);
    say("\nThe loop halted on its own brakes and waits for a human. Next steps:".into());
    say(format!("  loopflow --project {d} status"));
    say(format!(
        "  loopflow --project {d} approve --loop demo --note \"looked good\" --extend 3"
    ));
    say(format!("  loopflow --project {d} run --loop demo --json"));
    json(exit::OK)
}

/// Why the demo's loop stopped, for the brakes it is built to reach; `None` for any other
/// halt (the demo failed).
fn demo_brake(reason: &HaltReason) -> Option<&'static str> {
    Some(match reason {
        HaltReason::VerifierFailed(VerifierFailure::ScorePlateau) => {
            "the last 3 scores were equal (score_plateau_window = 3): passing is not the goal \
             (goal_score = 1.0), and a loop that stops improving halts for a human"
        }
        HaltReason::GoalMet => "the verifier reported pass with a score at the goal",
        HaltReason::IterationsExhausted => "it used all of brakes.max_iterations",
        _ => return None,
    })
}
