//! Loading a loop: `loop.toml`, the pipeline it runs, and the cross-checks between them
//! (roles with no config, prompt files, templates against the DAG, model divergence).
//! `run`, `check`, `status` and the daemon all load through here, so one file has one
//! verdict and one exit code everywhere.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;

use crate::config::{LoopConfig, Partial};
use crate::diag::{Code, Diagnostic, Diagnostics, Source, SourceRef, list, suggest};
use crate::pipeline::{Draft, Pipeline, TemplatePlace, View};
use crate::state::LoopPaths;
use crate::template::Tmpl;

/// A loop whose files read and check clean.
pub(crate) struct Loaded {
    pub config: LoopConfig,
    /// Shared: the built-in tick is parsed once per process.
    pub pipeline: std::sync::Arc<Pipeline>,
    /// The pipeline file, when it is not the built-in tick.
    pub pipeline_path: Option<PathBuf>,
    /// The loop.toml (or predecessor's loop.json) this load read; its text as read is the
    /// config's source (a loop.json's, the source's origin); see [`Loaded::digests`].
    config_path: PathBuf,
    /// The prompt files as this load read and checked them: the tick renders these
    /// texts, not a second read of the files.
    pub prompts: Vec<(PathBuf, crate::diag::SourceRef)>,
}

impl Loaded {
    /// A digest of each file as this load read it (loop.toml, the pipeline file, the
    /// prompts it checked), so the tick's tamper check starts from exactly what it runs
    /// without reading them all again. Computed when asked, from the texts the load
    /// kept: `status`, `report` and the dashboard load every loop and never ask.
    pub(crate) fn digests(&self) -> Vec<(PathBuf, u64)> {
        let src = &self.config.source;
        // A loop.json is kept converted: the bytes read are its origin's text.
        let read = src.origin.as_ref().map_or(&src.text, |o| &o.source.text);
        let mut d = vec![(self.config_path.clone(), digest(read.as_bytes()))];
        if let Some(path) = &self.pipeline_path {
            d.push((path.clone(), digest(self.pipeline.source.text.as_bytes())));
        }
        d.extend(
            self.prompts
                .iter()
                .map(|(p, src)| (p.clone(), digest(src.text.as_bytes()))),
        );
        d
    }
}

/// Why a loop could not be loaded. `Config` is exit 3, `Io` exit 4.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("invalid configuration")]
    Config(Diagnostics),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What a `loop.toml` names as its pipeline, read and validated: the pipeline when it
/// has a DAG, else the draft (so its roles can still be checked), else nothing (the file
/// cannot be read).
enum PipelineRead {
    Valid(std::sync::Arc<Pipeline>),
    Invalid(Box<Draft>),
    Unreadable,
}

/// Reads the pipeline a loop runs: `pipeline` (a file given on the command line, or the
/// loop's `pipeline` key), else the built-in tick. An unreadable file named in loop.toml
/// is a `missing-file` diagnostic on that key.
fn read_pipeline(
    cfg: &LoopConfig,
    arg: Option<&Path>,
    base: &Path,
    diags: &mut Diagnostics,
) -> PipelineRead {
    let (path, key) = match (arg, &cfg.pipeline) {
        (Some(p), _) => (p.to_path_buf(), None),
        (None, Some((p, lit))) => (p.clone(), Some(lit)),
        (None, None) => {
            return match Pipeline::builtin_shared(diags) {
                Some(p) => PipelineRead::Valid(p),
                None => PipelineRead::Unreadable,
            };
        }
    };
    let src = match Source::read(&path, base) {
        Ok(s) => s,
        Err(e) => {
            let d = match key {
                Some(lit) => Diagnostic::error(
                    Code::MissingFile,
                    &cfg.source,
                    lit.span.clone(),
                    format!(
                        "cannot read pipeline `{}`: {}",
                        crate::diag::display_name(&path, base),
                        io_reason(&e)
                    ),
                )
                .label("this pipeline")
                .help(format!(
                    "relative paths resolve against {} (the directory of loop.toml); fix the path, or remove `pipeline` to run the built-in tick",
                    crate::diag::display_name(&cfg.dir, base)
                )),
                None => io_diag(&path, base, &e),
            };
            diags.push(d);
            return PipelineRead::Unreadable;
        }
    };
    match Draft::parse(&src, diags).validate(diags) {
        Ok(p) => PipelineRead::Valid(std::sync::Arc::new(p)),
        Err(d) => PipelineRead::Invalid(d),
    }
}

/// THE loader: `loop.toml` and its pipeline, cross-checked, every problem collected.
/// `pipeline_arg` (`run PIPELINE`) replaces the loop's own pipeline.
pub(crate) fn load(
    paths: &LoopPaths,
    pipeline_arg: Option<&Path>,
    base: &Path,
) -> Result<Loaded, LoadError> {
    let mut diags = Diagnostics::default();
    let (cfg_path, text) = paths
        .read_config()
        .map_err(|(path, e)| read_error(&path, base, e))?;
    let name = crate::diag::display_name(&cfg_path, base);
    let partial = LoopConfig::from_text(text, &cfg_path, name, &mut diags);
    let Some(Partial { config, complete }) = partial else {
        diags.finish();
        return Err(LoadError::Config(diags));
    };
    let pipeline = read_pipeline(&config, pipeline_arg, base, &mut diags);
    let pipeline_path = pipeline_arg
        .map(Path::to_path_buf)
        .or_else(|| config.pipeline.as_ref().map(|p| p.0.clone()));
    let mut prompts = Vec::new();
    let pipeline = match pipeline {
        PipelineRead::Valid(p) => {
            cross_check_reading(
                &config,
                &p.view(),
                &p.source.name,
                base,
                &mut diags,
                &mut prompts,
            );
            if pipeline_arg.is_none() {
                check_unused_roles(&config, &p.view(), &p.source.name, &mut diags);
            }
            Some(p)
        }
        PipelineRead::Invalid(d) => {
            cross_check(&config, &d.view(), &d.source.name, base, &mut diags);
            None
        }
        PipelineRead::Unreadable => {
            check_prompt_files(&config, base, &mut diags);
            None
        }
    };
    diags.finish();
    match pipeline {
        Some(pipeline) if complete && !diags.has_errors() => Ok(Loaded {
            config,
            pipeline,
            pipeline_path,
            config_path: cfg_path,
            prompts,
        }),
        _ => Err(LoadError::Config(diags)),
    }
}

fn digest(bytes: &[u8]) -> u64 {
    crate::state::tamper::digest_bytes(bytes)
}

/// A loop's `loop.toml` alone, checked (for commands that need no pipeline: `gate`,
/// `approve`, `can-edit`).
pub(crate) fn config(paths: &LoopPaths, base: &Path) -> Result<LoopConfig, LoadError> {
    let mut diags = Diagnostics::default();
    let path = paths.config();
    let partial = LoopConfig::read_partial(&path, base, &mut diags)
        .map_err(|e| read_error(&path, base, e))?;
    diags.finish();
    match partial {
        Some(p) if p.complete && !diags.has_errors() => Ok(p.config),
        _ => Err(LoadError::Config(diags)),
    }
}

/// `check` of one file: a `loop.toml` (with its pipeline and prompts) or a pipeline.
/// Pushes every problem into `diags`; for a loop.toml, adds its roles' expanded argv to
/// `explained`.
pub(crate) fn check_file(
    path: &Path,
    base: &Path,
    diags: &mut Diagnostics,
    explained: &mut Vec<String>,
) {
    if crate::config::is_project_config(path) {
        if let Err(e) = crate::config::ProjectConfig::read(path, base, diags) {
            diags.push(io_diag(path, base, &e));
        }
        return;
    }
    if !is_loop_config(path) {
        match Source::read(path, base) {
            Ok(src) => check_pipeline(&src, diags),
            Err(e) => diags.push(io_diag(path, base, &e)),
        }
        return;
    }
    match LoopConfig::read_partial(path, base, diags) {
        Err(e) => diags.push(io_diag(path, base, &e)),
        Ok(None) => {}
        Ok(Some(p)) => check_config(&p, base, diags, explained),
    }
}

/// `check` of a file given as text (`check -`): a loop config when its name says so
/// (`loop.toml`, `loop.json`), else when its top-level keys are a loop config's (and it
/// has no `nodes`), else a pipeline. `path` is where it would live, `name` what
/// diagnostics call it.
pub(crate) fn check_text(
    text: String,
    path: &Path,
    name: String,
    base: &Path,
    diags: &mut Diagnostics,
    explained: &mut Vec<String>,
) {
    if is_loop_config(path) || (!is_toml_named(path) && looks_like_loop_config(&text)) {
        if let Some(p) = LoopConfig::from_text(text, path, name, diags) {
            check_config(&p, base, diags, explained);
        }
    } else {
        check_pipeline(&Source::new(name, path, text), diags);
    }
}

/// A `*.toml` name other than loop.toml: a pipeline, as on disk.
fn is_toml_named(p: &Path) -> bool {
    p.extension().is_some_and(|e| e == "toml") && !is_loop_config(p)
}

/// Whether a document's top-level keys are those of a loop config: any of them, and no
/// `nodes` (which only a pipeline has). Read as far as it parses.
fn looks_like_loop_config(text: &str) -> bool {
    let (doc, _) = toml::de::DeTable::parse_recoverable(text);
    let doc = doc.get_ref();
    doc.get("nodes").is_none()
        && crate::config::TOP_LEVEL_KEYS
            .iter()
            .any(|k| doc.get(*k).is_some())
}

/// A file given to `check` (stdin) that could not be read.
pub(crate) fn check_unreadable(
    path: &Path,
    name: String,
    e: &std::io::Error,
    diags: &mut Diagnostics,
) {
    let mut d = io_diag(path, path.parent().unwrap_or(path), e);
    d.source = Source::new(name.clone(), path, "");
    d.message = format!("cannot read {name}: {}", io_reason(e));
    diags.push(d);
}

/// `check` of a pipeline's text.
pub(crate) fn check_pipeline(src: &SourceRef, diags: &mut Diagnostics) {
    let _ = Draft::parse(src, diags).validate(diags);
}

/// `check` of a loop config read as far as it goes: its pipeline, and the cross-checks
/// against it, run even when the config itself is broken (a typo in `[brakes]` must not
/// hide a missing prompt).
pub(crate) fn check_config(
    p: &Partial,
    base: &Path,
    diags: &mut Diagnostics,
    explained: &mut Vec<String>,
) {
    let cfg = &p.config;
    match read_pipeline(cfg, None, base, diags) {
        PipelineRead::Valid(pl) => {
            cross_check(cfg, &pl.view(), &pl.source.name, base, diags);
            check_unused_roles(cfg, &pl.view(), &pl.source.name, diags);
            if p.complete {
                explained.push(crate::explain::explain(cfg, &pl));
            }
        }
        PipelineRead::Invalid(d) => {
            cross_check(cfg, &d.view(), &d.source.name, base, diags);
            // A draft with syntax errors may lack nodes that run a role.
            let whole = !diags.items.iter().any(|x| {
                x.code == Code::TomlSyntax && std::sync::Arc::ptr_eq(&x.source, &d.source)
            });
            if whole {
                check_unused_roles(cfg, &d.view(), &d.source.name, diags);
            }
        }
        PipelineRead::Unreadable => check_prompt_files(cfg, base, diags),
    }
}

/// Without a pipeline to say which roles run, every configured role's prompt files must
/// at least exist.
fn check_prompt_files(lc: &LoopConfig, base: &Path, diags: &mut Diagnostics) {
    for role in lc.roles.values() {
        for (what, file) in [
            ("prompt file", &role.prompt),
            ("compaction prompt", &role.compaction_prompt),
        ] {
            if let Some((path, lit)) = file
                && !path.is_file()
            {
                diags.push(missing_prompt(lc, what, path, lit, base));
            }
        }
    }
}

/// A prompt file that does not exist, with the nearest file of its directory as a
/// suggestion.
fn missing_prompt(
    lc: &LoopConfig,
    what: &str,
    path: &Path,
    lit: &crate::toml_read::Str,
    base: &Path,
) -> Diagnostic {
    let d = Diagnostic::error(
        Code::MissingPrompt,
        &lc.source,
        lit.span.clone(),
        format!(
            "{what} `{}` does not exist",
            crate::diag::display_name(path, base)
        ),
    )
    .label("no such file");
    if let Some(near) = nearest_file(path) {
        let written = Path::new(&lit.value).with_file_name(&near);
        return d.help(format!(
            "did you mean `{}`? (relative prompt paths resolve against {})",
            written.display(),
            crate::diag::display_name(&lc.dir, base)
        ));
    }
    let hint = if what == "compaction prompt" {
        "create the file (see prompts/compaction.md) or remove `compaction_prompt`".to_string()
    } else {
        "create the file or fix the path".to_string()
    };
    match path.parent().filter(|d| !d.is_dir()) {
        Some(dir) => d.help(format!(
            "{hint}; the directory {} does not exist either (relative prompt paths resolve against {})",
            crate::diag::display_name(dir, base),
            crate::diag::display_name(&lc.dir, base)
        )),
        None => d.help(format!(
            "{hint}; relative prompt paths resolve against {}",
            crate::diag::display_name(&lc.dir, base)
        )),
    }
}

/// The file in `path`'s directory whose name is nearest to `path`'s, if one is close.
fn nearest_file(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let names: Vec<String> = std::fs::read_dir(path.parent()?)
        .ok()?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    suggest(name, names.iter().map(String::as_str)).map(str::to_string)
}

/// Whether `p` names a loop config (`loop.toml`, or a predecessor `loop.json`).
pub(crate) fn is_loop_config(p: &Path) -> bool {
    matches!(
        p.file_name().and_then(|f| f.to_str()),
        Some("loop.toml" | "loop.json")
    )
}

/// `std::io::Error` without its "(os error 2)" suffix.
fn io_reason(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_lowercase(),
        None => s,
    }
}

/// A file given to `check` that cannot be read.
fn io_diag(path: &Path, base: &Path, e: &std::io::Error) -> Diagnostic {
    let src = Source::new(crate::diag::display_name(path, base), path, "");
    let help = if e.kind() == std::io::ErrorKind::InvalidData {
        "loopflow files are UTF-8 text; is this a TOML file?"
    } else {
        "check the path and the file's permissions"
    };
    Diagnostic::error(
        Code::MissingFile,
        &src,
        0..0,
        format!("cannot read {}: {}", src.name, io_reason(e)),
    )
    .label("unreadable")
    .help(help)
}

fn read_error(path: &Path, base: &Path, e: std::io::Error) -> LoadError {
    if e.kind() != std::io::ErrorKind::InvalidData {
        return LoadError::Io {
            path: path.to_path_buf(),
            source: e,
        };
    }
    let bytes = std::fs::read(path).unwrap_or_default();
    let good = std::str::from_utf8(&bytes)
        .err()
        .map_or(0, |u| u.valid_up_to());
    // Only the valid prefix is shown, with control characters blanked (same byte
    // length, so offsets hold) so binary junk never reaches the terminal.
    let prefix: String = String::from_utf8_lossy(&bytes[..good])
        .chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                " ".repeat(c.len_utf8())
            } else {
                c.to_string()
            }
        })
        .collect();
    let src = Source::new(crate::diag::display_name(path, base), path, prefix);
    let mut d = Diagnostics::default();
    d.push(
        crate::diag::Diagnostic::error(
            crate::diag::Code::TomlSyntax,
            &src,
            good..good,
            "the file is not UTF-8 text, so it cannot be TOML",
        )
        .label("first byte that is not UTF-8")
        .help("a TOML file must be UTF-8 text; is this the right file, or was it overwritten by a binary?"),
    );
    LoadError::Config(d)
}

/// Cross-checks the config against the pipeline it runs: every harness role has a
/// `[roles.<role>]` table and an existing prompt, every argv and prompt template only
/// uses what exists at its node, and model divergence is real (D12).
pub(crate) fn cross_check(
    lc: &LoopConfig,
    view: &View<'_>,
    pipeline_name: &str,
    base: &Path,
    diags: &mut Diagnostics,
) {
    cross_check_reading(lc, view, pipeline_name, base, diags, &mut Vec::new());
}

/// [`cross_check`], handing back every prompt file it read (path and text).
fn cross_check_reading(
    lc: &LoopConfig,
    view: &View<'_>,
    pipeline_name: &str,
    base: &Path,
    diags: &mut Diagnostics,
    read: &mut Vec<(PathBuf, SourceRef)>,
) {
    // Keyed by path with foldhash: std's SipHash of a long path cost more than the lookup.
    let mut prompt_sources: IndexMap<PathBuf, Option<SourceRef>, foldhash::fast::RandomState> =
        IndexMap::default();
    for (v, node) in view.nodes().iter().enumerate() {
        let Some(role) = node.spec.role() else {
            continue;
        };
        let Some(cfg) = lc.roles.get(&role.value) else {
            let known: Vec<&str> = lc.roles.keys().map(String::as_str).collect();
            let near = near_role(&role.value, &known);
            // Point at the near-miss table when there is one, else at `[roles]`.
            let (span, label) = match near.and_then(|n| lc.roles.get(n)) {
                Some(r) => (
                    r.name_span.clone(),
                    format!("`{}` is configured, not `{}`", r.name, role.value),
                ),
                None => match &lc.roles_span {
                    Some(s) => (
                        s.clone(),
                        format!("no `[roles.{}]` among these", role.value),
                    ),
                    None => (
                        0..lc.source.text.find('\n').unwrap_or(0),
                        "this file has no `[roles.<name>]` tables".to_string(),
                    ),
                },
            };
            let mut d = Diagnostic::error(
                Code::MissingRole,
                &lc.source,
                span,
                format!(
                    "role `{}` has no `[roles.{}]` table, but node `{}` of {} runs it",
                    role.value, role.value, node.id.value, pipeline_name
                ),
            )
            .label(label);
            d = match near {
                Some(s) => d.help(format!(
                    "rename `[roles.{s}]` to `[roles.{}]`, or change the node's `role`",
                    role.value
                )),
                None => d.help(format!(
                    "add `[roles.{}]` with `prompt = \"prompts/loop-{}.md\"`; roles configured: {}",
                    role.value,
                    role.value,
                    list(&known)
                )),
            };
            diags.push(d);
            continue;
        };
        for t in lc.command_refs(&role.value) {
            if t.is_builtin() {
                continue; // the built-in default harness
            }
            view.check_template(t, v, TemplatePlace::Node, diags);
        }
        match &cfg.prompt {
            None => diags.push(
                Diagnostic::error(
                    Code::MissingKey,
                    &lc.source,
                    cfg.name_span.clone(),
                    format!("`[roles.{}]` has no `prompt`", role.value),
                )
                .label(format!(
                    "node `{}` runs this role, which needs a prompt",
                    node.id.value
                ))
                .help(format!(
                    "add `prompt = \"prompts/loop-{}.md\"` to `[roles.{}]`",
                    role.value, role.value
                )),
            ),
            Some((path, lit)) => {
                let src = prompt_sources
                    .entry(path.clone())
                    .or_insert_with(|| Source::read(path, base).ok())
                    .clone();
                match src {
                    None => diags.push(missing_prompt(lc, "prompt file", path, lit, base)),
                    Some(src) => {
                        view.check_template(&Tmpl::file(&src), v, TemplatePlace::Prompt, diags)
                    }
                }
            }
        }
        if let Some((path, lit)) = &cfg.compaction_prompt {
            match Source::read(path, base) {
                Err(_) => diags.push(missing_prompt(lc, "compaction prompt", path, lit, base)),
                Ok(src) => {
                    view.check_template(&Tmpl::file(&src), v, TemplatePlace::Prompt, diags);
                    read.push((path.clone(), src));
                }
            }
        }
    }
    read.extend(
        prompt_sources
            .into_iter()
            .filter_map(|(p, src)| Some((p, src?))),
    );
    check_model_divergence(lc, view, diags);
}

/// The configured role `role` most likely means (`verfy` → `verify`, `verifier` →
/// `verify`), if one is close.
fn near_role<'a>(role: &str, known: &[&'a str]) -> Option<&'a str> {
    suggest(role, known.iter().copied()).or_else(|| {
        // `verify` vs `verifier`: a long shared prefix is a near miss too.
        let shared = |k: &str| {
            k.chars()
                .zip(role.chars())
                .take_while(|(a, b)| a == b)
                .count()
        };
        known
            .iter()
            .copied()
            .find(|k| shared(k) >= 4 && 2 * shared(k) >= role.len())
    })
}

/// `[roles.<name>]` tables no node of the pipeline runs: their settings would silently do
/// nothing. One whose name is a near miss of a role the pipeline runs is a typo
/// (`[roles.verfy] model = "opus"` leaves the verifier on its default model): an error,
/// as an unknown key is (and, like one, ignorable). Any other is a warning: a table kept
/// for a pipeline run by hand (`run PIPELINE`), or the role tables `create` writes under
/// a pipeline of command nodes. A table that `missing-role` already names as the near
/// miss of a role the pipeline runs is not reported twice. Only against the loop's own
/// pipeline, read whole (a pipeline given to `run`, or one whose syntax errors hide
/// nodes, says nothing about what the loop runs).
fn check_unused_roles(
    lc: &LoopConfig,
    view: &View<'_>,
    pipeline_name: &str,
    diags: &mut Diagnostics,
) {
    let run: Vec<&str> = view
        .nodes()
        .iter()
        .filter_map(|n| n.spec.role().map(|r| r.value.as_str()))
        .collect();
    let configured: Vec<&str> = lc.roles.keys().map(String::as_str).collect();
    let mut distinct = run.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let named_by_missing: Vec<&str> = distinct
        .iter()
        .filter(|r| !lc.roles.contains_key(**r))
        .filter_map(|r| near_role(r, &configured))
        .collect();
    for role in lc.roles.values() {
        let name = role.name.as_str();
        if run.contains(&name) || named_by_missing.contains(&name) {
            continue;
        }
        let message = format!(
            "no node of {pipeline_name} runs role `{name}`: nothing in `[roles.{name}]` takes effect"
        );
        let span = role.name_span.clone();
        let d = match near_role(name, &distinct) {
            Some(meant) => Diagnostic::error(Code::UnusedRole, &lc.source, span, message)
                .label(format!("`{meant}` runs, not `{name}`"))
                .help(if lc.roles.contains_key(meant) {
                    format!(
                        "did you mean `{meant}`? `[roles.{meant}]` exists too: move these keys into it, and remove this table"
                    )
                } else {
                    format!("did you mean `{meant}`? rename the table to `[roles.{meant}]`")
                }),
            None => Diagnostic::warning(Code::UnusedRole, &lc.source, span, message)
                .label("no node runs this role")
                .help(format!(
                    "the pipeline runs {}; remove the table, or add a harness node with `role = \"{name}\"` (a table kept for a pipeline you run by hand can be silenced with `# loopflow: ignore[unused-role]`)",
                    match distinct.as_slice() {
                        [] => "no roles".to_string(),
                        [one] => format!("role `{one}`"),
                        r => format!("roles {}", list(r)),
                    }
                )),
        };
        diags.push(d);
    }
}

/// D12: when implement and verify name different models, the command each runs must
/// pass `{{model}}`, or both would silently use the agent's default model.
fn check_model_divergence(lc: &LoopConfig, view: &View<'_>, diags: &mut Diagnostics) {
    let model = |r: &str| lc.roles.get(r).and_then(|r| r.model.clone());
    let (Some(mi), Some(mv)) = (model("implement"), model("verify")) else {
        return;
    };
    if mi == mv {
        return;
    }
    let roles_used: Vec<&str> = view
        .nodes()
        .iter()
        .filter_map(|n| n.spec.role().map(|r| r.value.as_str()))
        .collect();
    // Roles sharing one command (usually `[harness] command`) get one report.
    let key = |cmd: &[Tmpl]| -> Vec<(String, std::ops::Range<usize>)> {
        cmd.iter()
            .map(|t| (t.text.clone(), t.whole_span()))
            .collect()
    };
    let mut reported = Vec::new();
    for role in ["implement", "verify"] {
        if !roles_used.contains(&role) {
            continue;
        }
        let cmd = lc.command_for(role);
        if cmd.iter().any(|t| t.text.contains("model")) || reported.contains(&key(&cmd)) {
            continue;
        }
        reported.push(key(&cmd));
        let shared = ["implement", "verify"]
            .iter()
            .all(|r| key(&lc.command_for(r)) == key(&cmd));
        let whose = if shared {
            "the command both roles run".to_string()
        } else {
            format!("the `{role}` command")
        };
        let span = match (cmd.first(), cmd.last()) {
            (Some(a), Some(b)) if a.whole_span() != (0..0) => {
                a.whole_span().start..b.whole_span().end
            }
            _ => lc.roles.get(role).map_or(0..0, |r| r.name_span.clone()),
        };
        diags.push(
            Diagnostic::error(
                Code::ModelNotPassed,
                &lc.source,
                span,
                format!(
                    "implement uses model `{mi}` and verify `{mv}`, but {whose} never passes `{{{{model}}}}`"
                ),
            )
            .label("this command runs the agent's default model for every role")
            .help("add the agent's model flag with `{{model}}`, e.g. `\"--model\", \"{{model}}\"`, so verification is really done by a different model"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check` of a loop.toml given as text, its prompt files present beside it.
    fn check(text: &str) -> Diagnostics {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("a.md"), "do it\n").expect("prompt");
        let path = dir.path().join("loop.toml");
        let mut diags = Diagnostics::default();
        if let Some(p) = LoopConfig::from_text(text.into(), &path, "loop.toml".into(), &mut diags) {
            check_config(&p, dir.path(), &mut diags, &mut Vec::new());
        }
        diags.finish();
        diags
    }

    const ROLES: &str = "[brakes]\nmax_iterations = 3\n[roles.implement]\nprompt = \"a.md\"\n[roles.verify]\nprompt = \"a.md\"\n[roles.orchestrate]\nprompt = \"a.md\"\n";

    #[test]
    fn a_role_table_no_node_runs_is_reported_on_its_name() {
        let text = format!("{ROLES}[roles.verfy]\nmodel = \"opus\"\n");
        let d = check(&text);
        assert_eq!(d.items.len(), 1, "{d:?}");
        let u = &d.items[0];
        assert_eq!(
            (u.code, u.is_error()),
            (Code::UnusedRole, true),
            "a typo is an error"
        );
        assert_eq!(&text[u.span.clone()], "verfy");
        assert_eq!(u.start(), (9, 8));
        assert!(
            u.help
                .as_deref()
                .is_some_and(|h| h.starts_with("did you mean `verify`? `[roles.verify]` exists")),
            "{u:?}"
        );
        // Far from every role run: the roles are listed instead.
        let text = format!("{ROLES}[roles.deploy]\nprompt = \"a.md\"\n");
        let d = check(&text);
        assert_eq!(d.items.len(), 1, "{d:?}");
        assert_eq!(&text[d.items[0].span.clone()], "deploy");
        assert!(!d.items[0].is_error(), "not a near miss: a warning");
        assert!(
            d.items[0]
                .help
                .as_deref()
                .is_some_and(|h| h.contains("roles `implement`, `orchestrate` and `verify`")),
            "{d:?}"
        );
        // Ignored on purpose; and a dotted key names the role too.
        let text =
            format!("{ROLES}# loopflow: ignore[unused-role]\n[roles.deploy]\nprompt = \"a.md\"\n");
        assert!(check(&text).items.is_empty());
        let text = format!("roles.extra.model = \"m\"\n{ROLES}");
        let d = check(&text);
        assert_eq!(d.items.len(), 1, "{d:?}");
        assert_eq!(&text[d.items[0].span.clone()], "extra");
    }

    #[test]
    fn a_misnamed_role_is_one_missing_role_not_also_an_unused_one() {
        let text = ROLES.replace("[roles.verify]", "[roles.verfy]");
        let d = check(&text);
        let codes: Vec<Code> = d.items.iter().map(|x| x.code).collect();
        assert_eq!(codes, [Code::MissingRole], "{d:?}");
        assert_eq!(&text[d.items[0].span.clone()], "verfy");
    }

    #[test]
    fn one_syntax_error_in_a_loop_toml_is_one_diagnostic() {
        let text = format!(
            "{ROLES}[blast_radius]\nallow = [\"**\",\ndeny = [\".git/**\"]\n\n[worktree]\nenabled = false\n"
        );
        let d = check(&text);
        assert_eq!(d.items.len(), 1, "{d:?}");
        assert_eq!(d.items[0].code, Code::TomlSyntax);
        // Just after the comma that leaves `allow` open.
        assert_eq!(d.items[0].start(), (10, 15));
        assert!(d.items[0].message.contains("unclosed array"), "{d:?}");
    }
}
