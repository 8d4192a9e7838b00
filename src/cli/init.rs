//! `loopflow init`: sets a project up for loops: `.loopflow/`, a first loop from a
//! template, `.gitignore` lines. Asks only when stdin is a terminal; every answer has a
//! flag, so scripts and CI never block. Refuses a repository with no git remote (D11): a
//! loop commits unattended, and without a remote there is nothing to recover from.

use std::io::{BufRead, IsTerminal};
use std::path::Path;

use clap::Args;

use super::create::AgentArgs;
use crate::create::{CreateError, CreateOptions, TEMPLATES, check_preset, template, template_list};
use crate::exit;
use crate::out::{self, outln};

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// The first loop's template (see `loopflow create --template`).
    #[arg(long, value_name = "T")]
    pub template: Option<String>,
    /// The first loop's name (default: the template's name).
    #[arg(long = "loop", value_name = "NAME")]
    pub loop_name: Option<String>,
    /// The first loop's task (templates with a single task).
    #[arg(long)]
    pub task: Option<String>,
    /// Work in the project checkout instead of a git worktree of the loop's own.
    #[arg(long)]
    pub no_worktree: bool,
    /// Set up even though the repository has no git remote (nothing to recover from).
    #[arg(long)]
    pub no_remote_ok: bool,
    /// Never ask, even on a terminal: take the defaults for anything not given.
    #[arg(long, short = 'y')]
    pub yes: bool,
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// The lines `init` adds to the project's `.gitignore`: what loopflow writes at run time.
/// (Each loop directory also carries its own `.gitignore`; these cover loops copied in
/// by hand.) `loop.toml` and prompts stay tracked: they are configuration.
const GITIGNORE: &[&str] = &[
    "# loopflow: run-time state, never committed",
    ".loopflow/loops/*/.state.*",
    ".loopflow/loops/*/.lock",
    ".loopflow/loops/*/outputs/",
    ".loopflow/loops/*/worktree/",
    ".loopflow/loops/*/cache/",
];

fn has_remote(project: &Path) -> Result<bool, String> {
    let repo = crate::git::Repo::checkout(project)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} is not a git repository", project.display()))?;
    repo.has_remote().map_err(|e| e.to_string())
}

/// Asks on the terminal; an empty answer (or no terminal) takes `default`.
fn ask(interactive: bool, question: &str, default: &str) -> String {
    if !interactive {
        return default.to_string();
    }
    out::write(format!("{question} [{default}]: ").as_bytes());
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return default.to_string();
    }
    let answer = line.trim();
    if answer.is_empty() {
        default.to_string()
    } else {
        answer.to_string()
    }
}

/// Appends the lines the project's `.gitignore` lacks; returns how many were added.
fn gitignore(project: &Path) -> std::io::Result<usize> {
    let path = project.join(".gitignore");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let have: Vec<&str> = text.lines().map(str::trim).collect();
    let missing: Vec<&str> = GITIGNORE
        .iter()
        .copied()
        .filter(|l| !have.contains(l))
        .collect();
    let added = missing.iter().filter(|l| !l.starts_with('#')).count();
    if added == 0 {
        return Ok(0);
    }
    let mut out = text.clone();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for l in missing {
        out.push_str(l);
        out.push('\n');
    }
    std::fs::write(&path, out)?;
    Ok(added)
}

/// The presets whose programs are on PATH, each with where it was found.
fn presets_on_path() -> Vec<(&'static str, std::path::PathBuf)> {
    crate::preset::names()
        .into_iter()
        .filter_map(|name| {
            let p = crate::preset::load(name, &mut crate::diag::Diagnostics::default())?;
            Some((name, crate::preset::find_on_path(p.program())?))
        })
        .collect()
}

/// Asks which agent to run, offering those on PATH; the default is the templates'
/// (opencode) when it is installed, else the first one found. Asks again after a name
/// that is no preset.
fn ask_agent() -> String {
    let found = presets_on_path();
    let default = match found
        .iter()
        .find(|(n, _)| *n == crate::config::DEFAULT_PRESET)
    {
        Some((n, _)) => *n,
        None => found
            .first()
            .map_or(crate::config::DEFAULT_PRESET, |(n, _)| *n),
    };
    if found.is_empty() {
        outln!(
            "agents: none of the presets' programs is on PATH ({}); the loop's `check` passes, but its ticks need one installed",
            crate::preset::names().join(", ")
        );
    } else {
        outln!("agents on PATH:");
        for (n, path) in &found {
            outln!("  {n:<12}  {}", path.display());
        }
    }
    loop {
        let answer = ask(true, "agent", default);
        match check_preset(&answer) {
            Ok(()) => return answer,
            Err(e) => outln!("{e}"),
        }
    }
}

pub(super) fn init(project: &Path, a: InitArgs) -> i32 {
    let interactive = !a.yes && std::io::stdin().is_terminal();
    if let Some(p) = &a.agent.agent
        && let Err(e) = check_preset(p)
    {
        eprintln!("error: {e}");
        return exit::USAGE;
    }
    let remote = match has_remote(project) {
        Ok(r) => r,
        Err(e) if a.no_remote_ok => {
            eprintln!("warning: {e}; continuing because of --no-remote-ok");
            false
        }
        Err(e) => {
            eprintln!(
                "error: {e}\n  loopflow init sets up loops in a git repository with a remote: run `git init`, commit, and `git remote add origin <url>` first (or pass --no-remote-ok)"
            );
            return exit::USAGE;
        }
    };
    if !remote && !a.no_remote_ok {
        eprintln!(
            "error: refusing to set up loops in {}: the repository has no git remote.\n  \
             A loop edits and commits code unattended. Without a remote there is nothing\n  \
             to recover from if a tick goes wrong (a bad rewrite, a deleted file, a broken\n  \
             worktree): the damage would be irreversible.\n  \
             help: add one (`git remote add origin <url>` and push), or pass --no-remote-ok\n  \
             to accept that risk.",
            project.display()
        );
        return exit::USAGE;
    }
    let names: Vec<&str> = TEMPLATES.iter().map(|t| t.name).collect();
    let tname = match &a.template {
        Some(t) => t.clone(),
        None => {
            if interactive {
                outln!("templates:\n{}", template_list().trim_end());
            }
            ask(interactive, "template", "default")
        }
    };
    let Some(t) = template(&tname) else {
        eprintln!(
            "error: unknown template `{tname}`; the built-in templates are: {}",
            names.join(", ")
        );
        return exit::USAGE;
    };
    let name = match &a.loop_name {
        Some(n) => n.clone(),
        None => ask(interactive, "loop name", t.name),
    };
    let task = match &a.task {
        Some(x) => Some(x.clone()),
        // Only single-task templates without a built-in task need one; others find
        // their own (backlog, audit).
        None if t.default_task.is_none() && t.loop_toml.contains("kind = \"single\"") => {
            let x = ask(interactive, "the loop's task (empty: set later)", "");
            (!x.is_empty()).then_some(x)
        }
        None => None,
    };
    let mut agent = a.agent;
    // A committed loop directory brings its own agent (its loop.toml).
    let adopting = crate::create::adoptable(&crate::state::LoopPaths::new(project, &name));
    if interactive && !adopting && agent.agent.is_none() {
        agent.agent = Some(ask_agent());
    }
    if interactive && !adopting && agent.model.is_none() {
        let m = ask(
            true,
            "model for every role (empty: the agent's default)",
            "",
        );
        agent.model = (!m.is_empty()).then_some(m);
    }
    let dir = project.join(".loopflow");
    if let Err(e) = std::fs::create_dir_all(dir.join("loops")) {
        eprintln!("error: {}: {e}", dir.display());
        return exit::STATE;
    }
    match gitignore(project) {
        Ok(0) => {}
        Ok(n) => outln!("added {n} loopflow lines to .gitignore"),
        Err(e) => {
            eprintln!("error: {}: {e}", project.join(".gitignore").display());
            return exit::STATE;
        }
    }
    // A loop directory without state (committed, never started) is started as it is.
    let existed = crate::state::LoopPaths::new(project, &name).dir.exists() && !adopting;
    if existed {
        outln!("loop `{name}` already exists; left as it is");
    } else {
        let o = CreateOptions {
            name: &name,
            template: t.name,
            task: task.clone(),
            worktree: !a.no_worktree,
            harness: agent.harness(),
            remote: None,
            worktree_dir: None,
        };
        match crate::create::create(project, &o) {
            Ok(paths) if adopting => outln!(
                "started loop `{name}` from the loop.toml already in {}",
                paths.dir.display()
            ),
            Ok(paths) => {
                outln!(
                    "created loop `{name}` from template `{}` in {}",
                    t.name,
                    paths.dir.display()
                );
                if let Ok(c) = crate::load::config(&paths, project) {
                    super::create::agent_note(&c);
                }
            }
            Err(CreateError::Usage(m)) => {
                eprintln!("error: {m}");
                return exit::USAGE;
            }
            Err(CreateError::Io(m)) => {
                eprintln!("error: {m}");
                return exit::STATE;
            }
        }
    }
    if !remote {
        outln!("warning: no git remote: nothing to recover from if a tick goes wrong");
    }
    outln!();
    // Plain substitution, not handlebars: the text shows `{{prompt}}` and friends literally.
    out::write(
        include_str!("../../prompts/onboarding.md")
            .replace("{{template}}", t.name)
            .replace("{{loop}}", &name)
            .as_bytes(),
    );
    exit::OK
}
