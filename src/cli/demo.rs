//! `loopflow demo`: a real loop in a throw-away git repository (`D/project`), driven by a
//! built-in fake agent (this same binary) in the loop's own worktree, ticked until it halts
//! on its own brakes; then the human's half as a human runs it: `review`, `approve`, `land`.
//! Offline, nothing to install but git (without git, the loop runs in the project itself).

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
pub(crate) struct DemoArgs {
    /// A throw-away directory for the demo (default: a new temporary one, kept so you can
    /// look around); its project, a git repository, is D/project.
    #[arg(long, value_name = "D")]
    pub dir: Option<PathBuf>,
    /// Print one JSON document at the end, `{"project", "ticks": [tick summaries],
    /// "status"}`; the story goes to stderr.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct FakeAgentArgs {
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
pub(super) fn fake_agent(a: FakeAgentArgs) -> i32 {
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

/// Whether git runs here (the demo's loop works in a worktree when it does).
fn have_git() -> bool {
    crate::git::version().is_some()
}

/// The demo's project repository (made by [`project_files`]).
fn repo(project: &Path) -> Result<crate::git::Repo, String> {
    crate::git::Repo::checkout(project)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is not a git repository", project.display()))
}

/// The demo's project: `NOTES.md`, and with git a repository with one commit (its own
/// identity, no signing: a user's global settings must not stop a throw-away repo).
fn project_files(project: &Path, with_git: bool) -> Result<(), String> {
    std::fs::create_dir_all(project).map_err(|e| format!("{}: {e}", project.display()))?;
    let notes = project.join("NOTES.md");
    std::fs::write(&notes, "# Parser notes\n").map_err(|e| format!("{}: {e}", notes.display()))?;
    if !with_git {
        return Ok(());
    }
    crate::git::init_scratch(project, "main", ("loopflow demo", "demo@loopflow.invalid"))
        .and_then(|r| r.commit_paths(&["NOTES.md"], "Parser notes"))
        .map_err(|e| e.to_string())
}

/// Runs `loopflow --project P ARGS` (this binary), as a human would, and tells it: the
/// command line, then what it printed. `Err` when it failed.
fn as_a_human(
    exe: &Path,
    project: &Path,
    args: &[&str],
    say: &dyn Fn(String),
) -> Result<(), String> {
    let shown: Vec<String> = args.iter().map(|a| crate::human::shell_word(a)).collect();
    say(format!(
        "\n$ loopflow --project {} {}",
        crate::human::shell_word(&project.display().to_string()),
        shown.join(" ")
    ));
    let out = std::process::Command::new(exe)
        .arg("--project")
        .arg(project)
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("LOOPFLOW_PROJECT")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    for text in [&out.stdout, &out.stderr] {
        for line in String::from_utf8_lossy(text).lines() {
            say(format!("  {}", out::printable(line)).trim_end().to_string());
        }
    }
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`loopflow {}` failed ({})",
            args.join(" "),
            out.status
        ))
    }
}

pub(super) fn demo(a: DemoArgs) -> i32 {
    // The story is the output; with --json it goes to stderr and stdout carries one
    // JSON document at the end.
    let say = |line: String| {
        if a.json {
            eprintln!("{line}");
        } else {
            outln!("{line}");
        }
    };
    // The throw-away directory holds the project, and room beside it.
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
    if let Err(e) = crate::state::text_path(&dir) {
        eprintln!("error: {e}");
        return exit::STATE;
    }
    let project = dir.join("project");
    if std::fs::read_dir(&project).is_ok_and(|mut d| d.next().is_some()) {
        eprintln!(
            "error: {} is not empty: the demo builds its project from nothing; pass --dir with a new directory",
            project.display()
        );
        return exit::USAGE;
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: cannot find the loopflow binary: {e}");
            return exit::STATE;
        }
    };
    let with_git = have_git();
    say("loopflow demo: a real loop, a fake agent, no network\n".into());
    say(format!("project: {}", project.display()));
    let o = CreateOptions {
        name: "demo",
        template: "default",
        task: Some("Make the parser handle empty input".into()),
        worktree: with_git,
        harness: Some(Harness {
            agent: Some(AgentChoice::Command(vec![
                exe.display().to_string(),
                "fake-agent".into(),
                "--role".into(),
                "{{role}}".into(),
                "--prompt".into(),
                "{{prompt}}".into(),
            ])),
            ..Harness::default()
        }),
        remote: None,
        // Beside the project, in the demo's own throw-away directory.
        worktree_dir: with_git.then(|| dir.join("worktrees")),
    };
    // The project the fake agent works on. With worktrees off the sandbox lets agents
    // write the project's existing top-level entries (not create new ones at its root).
    if let Err(e) = project_files(&project, with_git) {
        eprintln!("error: {e}");
        return exit::STATE;
    }
    let paths = match create(&project, &o) {
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
    // A loop's configuration is meant to be committed; on main, the branch the loop's
    // work lands on.
    if with_git
        && let Err(e) = repo(&project).and_then(|r| {
            r.commit_paths(&[".loopflow"], "The demo loop")
                .map_err(|e| e.to_string())
        })
    {
        eprintln!("error: {e}");
        return exit::STATE;
    }
    say(
        "loop:    demo (task: \"Make the parser handle empty input\", max 10 iterations, plateau window 3)"
            .into(),
    );
    say(format!(
        "agent:   {} fake-agent --role {{{{role}}}} --prompt {{{{prompt}}}}",
        exe.display()
    ));
    match paths.load().ok().and_then(|s| s.worktree_path) {
        Some(wt) => say(format!(
            "worktree: {wt} (branch loopflow/demo; each tick commits the agent's work there)\n"
        )),
        None => {
            say("worktree: none (git was not found: the loop works in the project itself)\n".into())
        }
    }
    let cancel = AtomicBool::new(false);
    // Offline whatever the environment says: no trace leaves the machine from a demo.
    let opts = RunOptions {
        no_telemetry: true,
        ..RunOptions::default()
    };
    let mut ticks = Vec::new();
    for _ in 0..20 {
        match run_tick(&project, "demo", &opts, &cancel) {
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
    let row = crate::row::status_row(&crate::state::LoopPaths::new(&project, "demo")).ok();
    for line in super::status::status_table(row.as_slice(), &[]).lines() {
        say(format!("  {line}"));
    }
    let mut landed = false;
    let json = |code, landed: bool| {
        if a.json {
            let doc = serde_json::json!({"project": project, "ticks": ticks, "status": row, "landed": landed});
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
        return json(exit::STATE, landed);
    };
    let notes = |p: &Path| {
        std::fs::read_to_string(p.join("NOTES.md"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("- iteration"))
            .count()
    };
    // Where the agent worked: the worktree, or the project itself without git.
    let worked_in = paths
        .load()
        .ok()
        .and_then(|s| s.worktree_path)
        .map_or_else(|| project.clone(), PathBuf::from);
    say(format!(
        "\nwhat happened: the fake agent edited NOTES.md ({} lines, one per iteration); the verifier",
        notes(&worked_in)
    ));
    say("graded each iteration, and its reasons and next_hint were rendered into the next".into());
    say("implement prompt (see outputs/<N>-implement.prompt.md in the loop directory).".into());
    say(format!("why it stopped: {why}."));
    let d = crate::human::shell_word(&project.display().to_string());
    if with_git {
        say(
            "\nThe loop halted on its own brakes and waits for a human. The human's half, run here"
                .into(),
        );
        say(
            "as you would run it: see what the loop did, approve it, merge its branch into yours."
                .into(),
        );
        for args in [
            &["review", "--loop", "demo"][..],
            &["approve", "--loop", "demo", "--note", "looked good"][..],
            &["land", "--loop", "demo"][..],
        ] {
            if let Err(e) = as_a_human(&exe, &project, args, &say) {
                eprintln!("error: {e}");
                return json(exit::STATE, landed);
            }
        }
        landed = true;
        say(format!(
            "\nmain now holds the loop's work: {} has {} iteration lines, merged from loopflow/demo.",
            project.join("NOTES.md").display(),
            notes(&project)
        ));
        say(
            "\nNext steps: where it stands, one more tick (the approval allows it), and accepting"
                .into(),
        );
        say("the work, which ends the loop:".into());
        say(format!("  loopflow --project {d} status"));
        say(format!("  loopflow --project {d} run --loop demo --json"));
        say(format!(
            "  loopflow --project {d} close --loop demo --note \"landed\""
        ));
    } else {
        say("\ngit was not found, so the loop ran without a worktree and there is no branch to review".into());
        say("and land; with git installed the demo walks review -> approve -> land too.".into());
        say("\nThe loop halted on its own brakes and waits for a human. Next steps:".into());
        say(format!("  loopflow --project {d} status"));
        say(format!(
            "  loopflow --project {d} approve --loop demo --note \"looked good\" --extend 3"
        ));
        say(format!("  loopflow --project {d} run --loop demo --json"));
    }
    json(exit::OK, landed)
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
