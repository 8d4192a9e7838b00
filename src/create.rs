//! A project's loops: name rules, discovery, and creating a loop from a template.

use std::path::{Path, PathBuf};

use crate::state::{Event, LoopPaths, State, check_loop_name};

/// A built-in loop template: its `loop.toml` and the files next to it (relative path,
/// text): prompts, and a pipeline when the template has its own.
pub(crate) struct Template {
    pub name: &'static str,
    pub about: &'static str,
    pub loop_toml: &'static str,
    pub files: &'static [(&'static str, &'static str)],
    /// The task a new loop starts with when `--task` is not given (templates whose task
    /// is fixed by design, like ci-triage).
    pub default_task: Option<&'static str>,
}

/// Embeds `templates/loops/<dir>/<file>` under its path relative to the template.
macro_rules! tfile {
    ($dir:literal, $file:literal) => {
        (
            $file,
            include_str!(concat!("../templates/loops/", $dir, "/", $file)),
        )
    };
}

pub(crate) const TEMPLATES: &[Template] = &[
    Template {
        name: "default",
        about: "implement → verify → orchestrate on one task, with every brake",
        loop_toml: include_str!("../templates/loops/default/loop.toml"),
        files: &[
            tfile!("default", "prompts/loop-implement.md"),
            tfile!("default", "prompts/loop-verifier.md"),
            tfile!("default", "prompts/loop-orchestrate.md"),
            tfile!("default", "prompts/compaction.md"),
        ],
        default_task: None,
    },
    Template {
        name: "ci-triage",
        about: "runs the test command each tick; implements a fix only while tests fail",
        loop_toml: include_str!("../templates/loops/ci-triage/loop.toml"),
        files: &[
            tfile!("ci-triage", "pipeline.toml"),
            tfile!("ci-triage", "prompts/implement.md"),
            tfile!("ci-triage", "prompts/verify.md"),
        ],
        default_task: Some("make the failing tests pass"),
    },
    Template {
        name: "self-improvement",
        about: "works through BACKLOG.md, topmost open item first",
        loop_toml: include_str!("../templates/loops/self-improvement/loop.toml"),
        files: &[
            tfile!("self-improvement", "prompts/implement.md"),
            tfile!("self-improvement", "prompts/verify.md"),
            tfile!("self-improvement", "prompts/loop-orchestrate.md"),
        ],
        default_task: None,
    },
    Template {
        name: "goal",
        about: "iterates on one goal until the verifier grades it met (goal mode)",
        loop_toml: include_str!("../templates/loops/goal/loop.toml"),
        files: &[
            tfile!("goal", "prompts/implement.md"),
            tfile!("goal", "prompts/verify.md"),
            tfile!("goal", "prompts/loop-orchestrate.md"),
        ],
        default_task: None,
    },
    Template {
        name: "design-update",
        about: "updates docs whose last-read-sha is older than the code they describe",
        loop_toml: include_str!("../templates/loops/design-update/loop.toml"),
        files: &[
            tfile!("design-update", "prompts/implement.md"),
            tfile!("design-update", "prompts/verify.md"),
            tfile!("design-update", "prompts/loop-orchestrate.md"),
        ],
        default_task: None,
    },
];

/// `name  about` for every built-in template, one per line.
pub(crate) fn template_list() -> String {
    let w = TEMPLATES.iter().map(|t| t.name.len()).max().unwrap_or(0);
    TEMPLATES
        .iter()
        .map(|t| format!("  {:<w$}  {}\n", t.name, t.about))
        .collect()
}

pub(crate) fn template(name: &str) -> Option<&'static Template> {
    TEMPLATES.iter().find(|t| t.name == name)
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(String),
}

pub struct CreateOptions<'a> {
    pub name: &'a str,
    pub template: &'a str,
    pub task: Option<String>,
    pub worktree: bool,
    /// What the roles run, in place of the template's (`None`: as the template says).
    pub harness: Option<Harness>,
    /// `[remote] name`: the loop's state of record lives on this git remote (DESIGN §16).
    pub remote: Option<String>,
    /// `[worktree] dir`: where its worktree lives instead of under
    /// `~/.local/state/loopflow/worktrees` (absolute; never inside the project).
    pub worktree_dir: Option<std::path::PathBuf>,
}

/// A new loop's agent and models (`--agent`, `--model`, `--verify-model`; the demo's
/// fake agent).
#[derive(Debug, Clone, Default)]
pub struct Harness {
    /// Replaces the template's agent in `[harness]`.
    pub agent: Option<AgentChoice>,
    /// `model` of every role the template has.
    pub model: Option<String>,
    /// `model` of the verify role, over `model`: another model grades the work.
    pub verify_model: Option<String>,
}

/// The agent a new loop runs, in place of the template's.
#[derive(Debug, Clone)]
pub enum AgentChoice {
    /// `preset = "…"` (`--agent`): checked to be a shipped preset.
    Preset(String),
    /// `command = [...]`, your own argv (the demo's fake agent).
    Command(Vec<String>),
}

/// Refuses a preset name that is not shipped, naming the presets (and the one meant).
pub(crate) fn check_preset(name: &str) -> Result<(), CreateError> {
    let names = crate::preset::names();
    if names.contains(&name) {
        return Ok(());
    }
    let near = crate::preset::closest(name)
        .map(|n| format!("; did you mean `{n}`?"))
        .unwrap_or_default();
    Err(CreateError::Usage(format!(
        "unknown agent preset `{name}`{near}\n  the presets are: {}",
        names.join(", ")
    )))
}

/// A TOML basic string holding `s` (JSON's escapes are TOML's).
fn toml_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Sets `line` (a `key = value` line) at the top of table `[table]` of a template's
/// `loop.toml`, dropping that table's lines for any of `keys` first. A line editor is
/// enough: the shipped templates put every table header and every key on a line of its
/// own, and their comments survive. Returns `None` when the template has no such table.
fn set_in_table(toml: &str, table: &str, keys: &[&str], line: &str) -> Option<String> {
    let mut out = String::with_capacity(toml.len() + line.len() + 1);
    let mut inside = false;
    let mut found = false;
    for l in toml.lines() {
        let t = l.trim_start();
        if t.starts_with('[') {
            inside = t
                .trim_end()
                .strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                == Some(table);
            if inside {
                found = true;
                out.push_str(l);
                out.push('\n');
                out.push_str(line);
                out.push('\n');
                continue;
            }
        }
        let key = (!t.starts_with('#'))
            .then(|| t.split_once('=').map(|(k, _)| k.trim()))
            .flatten();
        if inside && key.is_some_and(|k| keys.contains(&k)) {
            continue;
        }
        out.push_str(l);
        out.push('\n');
    }
    found.then_some(out)
}

/// The template's `loop.toml` with the agent and models `h` asks for.
fn with_agent(toml: &str, h: &Harness) -> String {
    let mut toml = toml.to_string();
    if let Some(a) = &h.agent {
        let line = match a {
            AgentChoice::Preset(p) => format!("preset = {}", toml_string(p)),
            AgentChoice::Command(argv) => {
                format!(
                    "command = {}",
                    serde_json::to_string(argv).unwrap_or_default()
                )
            }
        };
        if let Some(t) = set_in_table(&toml, "harness", &["preset", "command"], &line) {
            toml = t;
        }
    }
    for role in ["implement", "verify", "orchestrate"] {
        let model = match role {
            "verify" => h.verify_model.as_ref().or(h.model.as_ref()),
            _ => h.model.as_ref(),
        };
        let Some(m) = model else { continue };
        let line = format!("model = {}", toml_string(m));
        if let Some(t) = set_in_table(&toml, &format!("roles.{role}"), &["model"], &line) {
            toml = t;
        }
    }
    toml
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CreateError + '_ {
    move |e| CreateError::Io(format!("{}: {e}", path.display()))
}

/// Writes `loop.toml`, the prompts, `.gitignore` and a fresh `.state.loop`; creates the
/// worktree unless disabled. Refuses to touch an existing loop.
pub fn create(project: &Path, o: &CreateOptions<'_>) -> Result<LoopPaths, CreateError> {
    check_loop_name(o.name).map_err(|e| CreateError::Usage(e.to_string()))?;
    if let Some(AgentChoice::Preset(p)) = o.harness.as_ref().and_then(|h| h.agent.as_ref()) {
        check_preset(p)?;
    }
    let t = template(o.template).ok_or_else(|| {
        CreateError::Usage(format!(
            "unknown template `{}`; the built-in templates are:\n{}",
            o.template,
            template_list().trim_end()
        ))
    })?;
    let paths = LoopPaths::new(project, o.name);
    // The path as the loop records it too (resolved: a UTF-8 link to an odd directory).
    crate::state::text_path(&paths.dir)
        .and_then(|()| {
            project
                .canonicalize()
                .map_or(Ok(()), |p| crate::state::text_path(&p))
        })
        .map_err(|e| CreateError::Io(e.to_string()))?;
    if adoptable(&paths) {
        return adopt(project, o, paths);
    }
    if paths.dir.exists() {
        return Err(CreateError::Usage(format!(
            "loop `{}` already exists at {}",
            o.name,
            paths.dir.display()
        )));
    }
    // The worktree first: a project it cannot be made for gets no loop directory either.
    // (Its `info/exclude` follows the loop's blast radius from the first tick on.)
    let worktree_path = if o.worktree {
        Some(create_worktree(&paths, o.worktree_dir.as_deref(), &[])?)
    } else {
        None
    };
    std::fs::create_dir_all(&paths.dir).map_err(io(&paths.dir))?;
    let mut toml = match &o.harness {
        Some(h) => with_agent(t.loop_toml, h),
        None => t.loop_toml.to_string(),
    };
    if !o.worktree {
        toml = toml.replace("[worktree]\nenabled = true", "[worktree]\nenabled = false");
    }
    if let Some(d) = &o.worktree_dir {
        let line = format!("dir = {}", toml_string(&d.display().to_string()));
        if let Some(t) = set_in_table(&toml, "worktree", &["dir"], &line) {
            toml = t;
        }
    }
    if let Some(r) = &o.remote {
        toml.push_str(&format!(
            "\n# The loop's state of record lives in the repository on this remote: any runner\n# ticks it, any clone approves it (`refs/loopflow/{}/state`).\n[remote]\nname = {}\n",
            o.name,
            toml_string(r)
        ));
    }
    write_schemas(project)?;
    let toml = retarget_schema(&toml, "../../schemas/loop.schema.json");
    std::fs::write(paths.dir.join("loop.toml"), toml).map_err(io(&paths.dir))?;
    for (rel, text) in t.files {
        let p = paths.dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let text = if rel.ends_with(".toml") {
            let depth = std::path::Path::new(rel).components().count() - 1;
            retarget_schema(
                text,
                &format!("{}schemas/pipeline.schema.json", "../".repeat(2 + depth)),
            )
        } else {
            text.to_string()
        };
        std::fs::write(&p, text).map_err(io(&p))?;
    }
    write_gitignore(&paths, true)?;
    let task = o
        .task
        .clone()
        .or_else(|| t.default_task.map(str::to_string));
    let mut state = State::new(o.name, task, worktree_path.map(|p| p.display().to_string()));
    if o.task.is_none() && t.default_task.is_some() {
        state.task_source = Some(format!("template:{}", t.name));
    }
    start(
        &paths,
        &state,
        ("template", o.template.to_string()),
        o.worktree,
    )?;
    Ok(paths)
}

/// The loop's own `.gitignore`: what loopflow writes there never lands in commits. An
/// adopted loop keeps the one it has.
fn write_gitignore(paths: &LoopPaths, replace: bool) -> Result<(), CreateError> {
    let ignore = paths.dir.join(".gitignore");
    if !replace && ignore.exists() {
        return Ok(());
    }
    std::fs::write(
        &ignore,
        "# written by loopflow: loop state never lands in your commits\n.state.loop\n.state.log\n.state.lock\n.lock\n.state.tmp*\noutputs/\nworktree/\ncache/\n.schedule.json\n.schedule.lock\n.schedule.log\n",
    )
    .map_err(io(&ignore))
}

/// Writes the new loop's first state and its CREATE line.
fn start(
    paths: &LoopPaths,
    state: &State,
    what: (&'static str, String),
    worktree: bool,
) -> Result<(), CreateError> {
    crate::state::save(&paths.state, state).map_err(|e| CreateError::Io(e.to_string()))?;
    paths
        .log(
            Event::Create,
            &[
                crate::state::LogArg::Kv(what.0, what.1),
                crate::state::LogArg::Kv("worktree", worktree.to_string()),
            ],
        )
        .map_err(|e| CreateError::Io(e.to_string()))
}

/// A loop directory that holds configuration but was never started: a `loop.toml` (and
/// prompts) committed to the repository, in a fresh clone or checkout.
pub(crate) fn adoptable(paths: &LoopPaths) -> bool {
    paths.config().is_file() && !paths.state.exists()
}

/// Starts a loop whose configuration is already there (see [`adoptable`]): its
/// `loop.toml` and prompts are used as they are; the worktree (when its loop.toml wants
/// one), `.gitignore` (when missing) and first state are made as `create` makes them.
fn adopt(
    project: &Path,
    o: &CreateOptions<'_>,
    paths: LoopPaths,
) -> Result<LoopPaths, CreateError> {
    if o.harness.is_some() || o.remote.is_some() {
        return Err(CreateError::Usage(format!(
            "loop `{}` already has its configuration ({}); create starts it as it is, so edit that file instead of passing --agent, --model, --verify-model or --remote",
            o.name,
            paths.config().display()
        )));
    }
    let mut diags = crate::diag::Diagnostics::default();
    let config = crate::config::LoopConfig::read(&paths.config(), project, &mut diags)
        .map_err(io(&paths.config()))?
        .filter(|_| !diags.has_errors())
        .ok_or_else(|| {
            CreateError::Usage(format!(
                "{} has errors; `loopflow check {}` shows them",
                paths.config().display(),
                paths.config().display()
            ))
        })?;
    if config.worktree && !o.worktree {
        return Err(CreateError::Usage(format!(
            "{} enables a worktree; set `[worktree] enabled = false` there instead of passing --no-worktree",
            paths.config().display()
        )));
    }
    let worktree_path = if config.worktree {
        let allow: Vec<String> = config.allow.iter().map(|a| a.value.clone()).collect();
        Some(create_worktree(
            &paths,
            config.worktree_dir.as_deref(),
            &allow,
        )?)
    } else {
        None
    };
    write_gitignore(&paths, false)?;
    let state = State::new(
        o.name,
        o.task.clone(),
        worktree_path.map(|p| p.display().to_string()),
    );
    start(
        &paths,
        &state,
        ("adopted", "loop.toml".into()),
        config.worktree,
    )?;
    Ok(paths)
}

/// The JSON Schemas, next to the loops, so the `#:schema` line of a created `loop.toml`
/// leads editors (taplo, Even Better TOML) to a file that exists.
fn write_schemas(project: &Path) -> Result<(), CreateError> {
    let dir = project.join(".loopflow").join("schemas");
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    for name in ["loop", "pipeline"] {
        let p = dir.join(format!("{name}.schema.json"));
        let text = crate::schema::get(name).unwrap_or_default();
        if std::fs::read_to_string(&p).ok().as_deref() != Some(text) {
            std::fs::write(&p, text).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// Points a template's `#:schema` first line at `target` (relative to the written file).
fn retarget_schema(text: &str, target: &str) -> String {
    match text.split_once('\n') {
        Some((first, rest)) if first.starts_with("#:schema ") => {
            format!("#:schema {target}\n{rest}")
        }
        _ => text.to_string(),
    }
}

fn create_worktree(
    paths: &LoopPaths,
    dir: Option<&Path>,
    allow: &[String],
) -> Result<PathBuf, CreateError> {
    crate::worktree::create(paths, dir, allow).map_err(|e| {
        CreateError::Io(format!(
            "{e}\n  a loop works in its own worktree by default; run inside a git repository with at least one commit, or pass --no-worktree"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_prompts_match_the_default_template() {
        // prompts/ holds the role prompts (DESIGN §1); the templates embed copies so
        // `check templates` finds them next to each loop.toml. They must not drift.
        let shipped = [
            (
                "prompts/loop-implement.md",
                include_str!("../prompts/loop-implement.md"),
            ),
            (
                "prompts/loop-verifier.md",
                include_str!("../prompts/loop-verifier.md"),
            ),
            (
                "prompts/loop-orchestrate.md",
                include_str!("../prompts/loop-orchestrate.md"),
            ),
            (
                "prompts/compaction.md",
                include_str!("../prompts/compaction.md"),
            ),
        ];
        for t in TEMPLATES {
            for (rel, text) in t.files {
                if let Some((_, original)) = shipped.iter().find(|(r, _)| r == rel) {
                    assert_eq!(
                        text, original,
                        "templates/loops/{}/{rel} differs from {rel}",
                        t.name
                    );
                }
            }
        }
        let default = template("default").expect("default template");
        assert_eq!(default.files.len(), shipped.len());
    }

    #[test]
    fn names() {
        for ok in ["a", "demo", "ci-triage", "x_1", "9lives"] {
            assert!(check_loop_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../x",
            "A",
            "-x",
            "a/b",
            "a b",
            &"a".repeat(65),
            ".hidden",
        ] {
            assert!(check_loop_name(bad).is_err(), "{bad}");
        }
    }
}
