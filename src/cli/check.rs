//! `check`, `graph` and `schema`: the authoring tools.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::diag::{Diagnostics, Format, Source, render};
use crate::exit;
use crate::pipeline::Pipeline;

#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    /// Pipeline files, loop.toml files, or directories to search for them; `-` reads one
    /// file from stdin. Default: the project's pipelines/, .loopflow/config.toml and every
    /// loop's loop.toml.
    pub paths: Vec<PathBuf>,
    /// The name of the file read from stdin (`check -`), used in diagnostics; relative
    /// paths in it (prompts, pipeline) resolve against its directory. A name ending in
    /// loop.toml makes it a loop config; otherwise its top-level keys decide.
    #[arg(long, value_name = "PATH")]
    pub stdin_name: Option<PathBuf>,
    /// Output format: human (source snippets), json, github (workflow annotations), sarif.
    #[arg(long, value_enum, default_value = "human")]
    pub format: Format,
    /// Exit 3 on warnings too.
    #[arg(long)]
    pub deny_warnings: bool,
    /// Also print each role's expanded argv (after presets and overrides) for every
    /// loop.toml checked.
    #[arg(long)]
    pub explain: bool,
}

#[derive(Args, Debug)]
pub(crate) struct GraphArgs {
    /// The pipeline file to draw.
    pub pipeline: PathBuf,
    /// Output format: dot (Graphviz) or mermaid (renders in GitHub markdown).
    #[arg(long, value_enum, default_value = "dot")]
    pub format: GraphFormat,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum GraphFormat {
    Dot,
    Mermaid,
}

#[derive(Args, Debug)]
pub(crate) struct SchemaArgs {
    /// One of: pipeline, loop, state, verdict, config (.loopflow/config.toml).
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(crate::schema::NAMES))]
    pub name: String,
}

/// Files to check under a directory: every *.toml (and loop.json), skipping worktrees,
/// outputs and hidden build directories.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if p.is_dir() {
            if matches!(
                name,
                "worktree" | "outputs" | "target" | ".git" | "node_modules"
            ) {
                continue;
            }
            collect(&p, out);
        } else if name.ends_with(".toml") || name == "loop.json" {
            if name == "Cargo.toml" || name.starts_with('.') {
                continue;
            }
            out.push(p);
        }
    }
}

/// Writes to stdout through [`crate::out::write`]: a closed pipe (`loopflow check |
/// head`) is not an error, a full disk is.
fn out(text: &str) {
    crate::out::write(text.as_bytes());
}

/// Expands a path with glob characters (`*`, `?`, `[`, `{`): the files and directories
/// under its literal leading directory that match it. `None` when it is not a glob.
fn glob(pattern: &Path) -> Option<Vec<PathBuf>> {
    let text = pattern.to_str()?;
    if !text.contains(['*', '?', '[', '{']) {
        return None;
    }
    let matcher = globset::GlobBuilder::new(text)
        .literal_separator(true)
        .build()
        .ok()?
        .compile_matcher();
    // The longest leading run of components without glob characters.
    let mut base = PathBuf::new();
    for c in pattern.components() {
        if c.as_os_str()
            .to_str()
            .is_some_and(|s| s.contains(['*', '?', '[', '{']))
        {
            break;
        }
        base.push(c);
    }
    let start = if base.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base
    };
    let mut out = Vec::new();
    let mut stack = vec![start];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let mut p = e.path();
            if let Ok(rel) = p.strip_prefix("./") {
                p = rel.to_path_buf();
            }
            let name = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
            if matches!(
                name,
                "target" | ".git" | "node_modules" | "worktree" | "outputs"
            ) {
                continue;
            }
            if matcher.is_match(&p) {
                out.push(p.clone());
            } else if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    Some(out)
}

pub(super) fn check(project: &Path, a: CheckArgs) -> i32 {
    let base = std::env::current_dir().unwrap_or_else(|_| project.to_path_buf());
    let mut files = Vec::new();
    let roots: Vec<PathBuf> = if a.paths.is_empty() {
        let mut r = vec![
            project.join("pipelines"),
            project.join(".loopflow").join("config.toml"),
        ];
        for n in crate::state::list_loops(project) {
            r.push(crate::state::LoopPaths::new(project, &n).config());
        }
        r.into_iter().filter(|p| p.exists()).collect()
    } else {
        a.paths.clone()
    };
    let mut stdin = false;
    for p in &roots {
        if p.as_os_str() == "-" {
            if stdin {
                eprintln!("error: `-` (stdin) given twice");
                return exit::USAGE;
            }
            stdin = true;
        } else if p.is_dir() {
            collect(p, &mut files);
        } else if p.exists() {
            files.push(p.clone());
        } else if let Some(matched) = glob(p) {
            // A quoted glob (CI configs often pass one): expanded here.
            if matched.is_empty() {
                eprintln!("error: no file matches {}", p.display());
                return exit::USAGE;
            }
            for m in matched {
                if m.is_dir() {
                    collect(&m, &mut files);
                } else {
                    files.push(m);
                }
            }
        } else {
            eprintln!("error: {} does not exist", p.display());
            return exit::USAGE;
        }
    }
    if a.stdin_name.is_some() && !stdin {
        eprintln!("error: --stdin-name names the file read from stdin; give `-` as a path too");
        return exit::USAGE;
    }
    files.dedup();
    let mut diags = Diagnostics::default();
    let mut explained = Vec::new();
    if stdin {
        check_stdin(a.stdin_name.as_deref(), &base, &mut diags, &mut explained);
    }
    for f in &files {
        crate::load::check_file(f, &base, &mut diags, &mut explained);
    }
    let checked = files.len() + usize::from(stdin);
    if a.explain {
        // On stdout for people; on stderr when stdout is a machine format.
        let text = explained.concat();
        if a.format == Format::Human {
            out(&text);
            if !text.is_empty() {
                out("\n");
            }
        } else {
            eprint!("{text}");
        }
    }
    diags.finish();
    let color = super::use_color(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    let rendered = match a.format {
        // Code scanning resolves result paths against the repository: the project root.
        Format::Sarif => crate::diag::render_sarif(&diags, project),
        f => render(&diags, f, color),
    };
    if a.format == Format::Human {
        if diags.is_empty() {
            out(&format!("checked {checked} file(s): no problems found\n"));
        } else {
            out(&rendered);
        }
    } else {
        out(&rendered);
    }
    if diags.has_errors() || (a.deny_warnings && !diags.is_empty()) {
        exit::CONFIG
    } else {
        exit::OK
    }
}

/// `check -`: one file from stdin, named by `--stdin-name` (default `<stdin>`).
fn check_stdin(
    name: Option<&Path>,
    base: &Path,
    diags: &mut Diagnostics,
    explained: &mut Vec<String>,
) {
    use std::io::Read;
    let shown = name.map_or("<stdin>".to_string(), |n| n.display().to_string());
    // Where the file would live: relative paths in it resolve against its directory.
    let path = name.map_or_else(|| base.join("<stdin>"), |n| base.join(n));
    let max = crate::fs_safe::TEXT_MAX;
    let mut bytes = Vec::new();
    let read = std::io::stdin()
        .lock()
        .take(max + 1)
        .read_to_end(&mut bytes)
        .and_then(|n| {
            if n as u64 > max {
                return Err(std::io::Error::other(format!(
                    "larger than {} MiB; loopflow does not read files that large",
                    max >> 20
                )));
            }
            String::from_utf8(bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        });
    match read {
        Ok(text) => crate::load::check_text(text, &path, shown, base, diags, explained),
        Err(e) => crate::load::check_unreadable(&path, shown, &e, diags),
    }
}

pub(super) fn graph(a: GraphArgs) -> i32 {
    let base = std::env::current_dir().unwrap_or_default();
    let src = match Source::read(&a.pipeline, &base) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {}: {e}", a.pipeline.display());
            return exit::USAGE;
        }
    };
    let mut diags = Diagnostics::default();
    let p = Pipeline::load(&src, &mut diags);
    diags.finish();
    let Some(p) = p.filter(|_| !diags.has_errors()) else {
        eprint!("{}", render(&diags, Format::Human, false));
        return exit::CONFIG;
    };
    out(&draw(&p, a.format));
    exit::OK
}

/// The DAG as Graphviz dot or a Mermaid flowchart, with kinds and roles on the nodes.
pub(super) fn draw(p: &Pipeline, format: GraphFormat) -> String {
    // `id\nkind (role)`; a node named after its kind (`gate`, `commit`) shows it once.
    let label = |n: &crate::pipeline::Node| {
        let kind = match n.spec.role() {
            Some(r) => format!("{} ({})", n.kind, r.value),
            None => n.kind.to_string(),
        };
        let text = if n.id.value == kind {
            kind
        } else {
            format!("{}\\n{kind}", n.id.value)
        };
        match format {
            GraphFormat::Dot => text.replace('"', "\\\""),
            GraphFormat::Mermaid => text.replace('"', "#quot;"),
        }
    };
    let mut s = String::new();
    match format {
        GraphFormat::Dot => {
            let q = |id: &str| id.replace('"', "\\\"");
            s.push_str(&format!(
                "digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, style=rounded];\n",
                q(&p.name)
            ));
            for n in &p.nodes {
                let shape = match n.kind {
                    "gate" | "floor-check" => ", shape=diamond",
                    "commit" | "git-commit" => ", shape=box, style=\"rounded,bold\"",
                    "verdict" => ", shape=parallelogram",
                    _ => "",
                };
                s.push_str(&format!(
                    "  \"{}\" [label=\"{}\"{shape}];\n",
                    q(&n.id.value),
                    label(n)
                ));
            }
            for n in &p.nodes {
                for need in &n.needs {
                    let style = if n.when.is_some() {
                        " [style=dashed, label=\"when\"]"
                    } else {
                        ""
                    };
                    s.push_str(&format!(
                        "  \"{}\" -> \"{}\"{style};\n",
                        q(&need.value),
                        q(&n.id.value)
                    ));
                }
            }
            s.push_str("}\n");
        }
        GraphFormat::Mermaid => {
            s.push_str("flowchart TD\n");
            let mid = |id: &str| id.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
            for n in &p.nodes {
                let text = label(n).replace("\\n", "<br/>");
                let (o, c) = match n.kind {
                    "gate" | "floor-check" => ("{", "}"),
                    "verdict" => ("[/", "/]"),
                    "commit" | "git-commit" => ("[[", "]]"),
                    _ => ("(", ")"),
                };
                s.push_str(&format!("    {}{o}\"{text}\"{c}\n", mid(&n.id.value)));
            }
            for n in &p.nodes {
                for need in &n.needs {
                    let arrow = if n.when.is_some() {
                        "-.->|when|"
                    } else {
                        "-->"
                    };
                    s.push_str(&format!(
                        "    {} {arrow} {}\n",
                        mid(&need.value),
                        mid(&n.id.value)
                    ));
                }
            }
        }
    }
    s
}

pub(super) fn schema(a: SchemaArgs) -> i32 {
    match crate::schema::get(&a.name) {
        Some(s) => {
            out(s);
            exit::OK
        }
        None => exit::USAGE,
    }
}
