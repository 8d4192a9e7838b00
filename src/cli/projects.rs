//! `loopflow projects add|remove|list`: the registry `--all` reads (DESIGN §15), and
//! [`many`], which decides whether `status`, `report` or `dashboard` shows one project or
//! several.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::json;

use crate::exit;
use crate::out::{self, outln, printable};
use crate::projects::{Source, canonical, labelled, load, problem, registry_path, save};

#[derive(Args, Debug)]
#[command(after_help = "\
The registry is $XDG_CONFIG_HOME/loopflow/projects.toml (else ~/.config/loopflow/projects.toml):
`projects = [\"~/src/api\", \"~/src/web\"]`. `status --all`, `report --all` and `dashboard --all`
show every project it lists; `--project DIR` more than once shows those.

Examples:
  loopflow projects add                           the current project
  loopflow projects add ~/src/api ~/src/web
  loopflow projects list --json
  loopflow projects remove api                    by label or directory
  loopflow status --all                           every loop of every project, halted first")]
pub(crate) struct ProjectsArgs {
    #[command(subcommand)]
    pub action: ProjectsAction,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ProjectsAction {
    /// Add projects to the registry (default: the current project).
    Add(AddArgs),
    /// Remove projects from the registry, by directory or by label.
    Remove(RemoveArgs),
    /// List the registered projects: label, loops, directory, and why one is broken.
    List(ListArgs),
}

#[derive(Args, Debug)]
pub(crate) struct AddArgs {
    /// Project directories (default: the current project).
    #[arg(value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct RemoveArgs {
    /// Project directories or labels (as `projects list` shows them).
    #[arg(value_name = "DIR|LABEL", required = true)]
    pub which: Vec<String>,
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    /// One JSON document: `{"registry", "projects": [{"label", "dir", "loops", "error"}]}`.
    #[arg(long)]
    pub json: bool,
}

fn registry() -> Result<(PathBuf, Vec<PathBuf>), i32> {
    let path = registry_path().map_err(|e| {
        eprintln!("error: {e}");
        exit::USAGE
    })?;
    let dirs = load(&path).map_err(|e| {
        eprintln!("error: {e}");
        exit::CONFIG
    })?;
    Ok((path, dirs))
}

pub(super) fn projects(project: &std::path::Path, a: ProjectsArgs) -> i32 {
    let (path, mut dirs) = match registry() {
        Ok(r) => r,
        Err(code) => return code,
    };
    match a.action {
        ProjectsAction::Add(add) => {
            let given = if add.dirs.is_empty() {
                vec![project.to_path_buf()]
            } else {
                add.dirs
            };
            let mut added = Vec::new();
            for d in given {
                if !d.is_dir() {
                    eprintln!("error: {} is not a directory", d.display());
                    return exit::USAGE;
                }
                let d = canonical(&d);
                if !crate::state::loops_dir(&d).is_dir() {
                    eprintln!(
                        "warning: {} has no loops yet (`loopflow create --loop NAME` there makes one)",
                        d.display()
                    );
                }
                if !dirs.contains(&d) {
                    dirs.push(d.clone());
                    added.push(d);
                }
            }
            if let Err(e) = save(&path, &dirs) {
                eprintln!("error: {e}");
                return exit::STATE;
            }
            for d in &added {
                outln!("added {}", printable(&d.display().to_string()));
            }
            if added.is_empty() {
                outln!("nothing to add: already in {}", path.display());
            }
            exit::OK
        }
        ProjectsAction::Remove(rm) => {
            let sources = labelled(&dirs);
            let mut gone = Vec::new();
            for w in &rm.which {
                let as_dir = canonical(std::path::Path::new(w));
                let hit = sources
                    .iter()
                    .find(|s| s.label == *w || s.dir == as_dir || s.dir.as_os_str() == w.as_str());
                match hit {
                    Some(s) => gone.push(s.dir.clone()),
                    None => {
                        eprintln!(
                            "error: no project `{w}` in {} (`loopflow projects list` shows them)",
                            path.display()
                        );
                        return exit::USAGE;
                    }
                }
            }
            dirs.retain(|d| !gone.contains(d));
            if let Err(e) = save(&path, &dirs) {
                eprintln!("error: {e}");
                return exit::STATE;
            }
            for d in &gone {
                outln!("removed {}", printable(&d.display().to_string()));
            }
            exit::OK
        }
        ProjectsAction::List(l) => {
            let listed: Vec<(Source, usize, Option<String>)> = labelled(&dirs)
                .into_iter()
                .map(|s| {
                    let p = problem(&s.dir);
                    let n = crate::state::list_loops(&s.dir).len();
                    (s, n, p)
                })
                .collect();
            if l.json {
                let projects: Vec<_> = listed
                    .iter()
                    .map(
                        |(s, n, p)| json!({"label": s.label, "dir": s.dir, "loops": n, "error": p}),
                    )
                    .collect();
                outln!(
                    "{}",
                    out::json(&json!({"registry": path, "projects": projects}), true)
                );
                return exit::OK;
            }
            if listed.is_empty() {
                outln!(
                    "no projects in {} (`loopflow projects add DIR` adds one)",
                    path.display()
                );
                return exit::OK;
            }
            let mut t = comfy_table::Table::new();
            t.load_preset(comfy_table::presets::NOTHING)
                .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
                .set_header(["PROJECT", "LOOPS", "DIR"]);
            for (s, n, p) in &listed {
                let dir = printable(&s.dir.display().to_string()).into_owned();
                t.add_row([
                    printable(&s.label).into_owned(),
                    if p.is_some() {
                        "broken".to_string()
                    } else {
                        n.to_string()
                    },
                    dir,
                ]);
            }
            for c in t.column_iter_mut() {
                c.set_padding((0, 2));
            }
            for line in t.lines() {
                outln!("{}", line.trim_end());
            }
            for (s, _, p) in &listed {
                if let Some(p) = p {
                    outln!("broken: {}: {}", printable(&s.label), printable(p));
                }
            }
            exit::OK
        }
    }
}

/// The projects `status`, `report` or `dashboard` shows when that is more than one:
/// `--all` (the registry, and any `--project` given too) or `--project` more than once.
/// `Ok(None)`: the one project, as always.
pub(super) fn many(given: &[PathBuf], all: bool) -> Result<Option<Vec<Source>>, i32> {
    if !all && given.len() <= 1 {
        return Ok(None);
    }
    let mut dirs: Vec<PathBuf> = given.iter().map(|d| canonical(d)).collect();
    if all {
        let (path, registered) = registry()?;
        if registered.is_empty() && dirs.is_empty() {
            eprintln!(
                "error: --all: no projects in {} (add them with `loopflow projects add DIR`)",
                path.display()
            );
            return Err(exit::USAGE);
        }
        dirs.extend(registered);
    }
    Ok(Some(labelled(&dirs)))
}

/// After `create`: a project not in the registry (and a registry that reads) is offered
/// a place in `--all`, in one line.
pub(super) fn offer(project: &std::path::Path) {
    let Ok(path) = registry_path() else { return };
    let Ok(dirs) = load(&path) else { return };
    if !dirs.contains(&canonical(project)) {
        outln!(
            "  every project in one view: `loopflow projects add` lists this one for `status --all` and `dashboard --all`"
        );
    }
}
