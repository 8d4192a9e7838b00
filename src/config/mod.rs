//! `loop.toml` (DESIGN §4): read with spans, every problem collected. This module knows
//! only the loop's own file; checking it against the pipeline it runs is `load`'s job.

use std::path::{Path, PathBuf};
use std::time::Duration;

use indexmap::IndexMap;

use crate::diag::{Code, Diagnostic, Diagnostics, Source, SourceRef};
use crate::template::Tmpl;
use crate::toml_read::{self, Str, Table};

mod agent;
mod brakes;
mod json_origin;
pub(crate) mod notify;
mod project;
pub(crate) mod remote;
pub(crate) mod sandbox;
pub(crate) mod telemetry;
mod work_source;

pub(crate) use agent::{Agent, AgentKeys, DEFAULT_PRESET};
pub(crate) use brakes::{Brakes, HARD_CONTEXT_FLOOR};
pub(crate) use notify::Notify;
pub(crate) use project::{ProjectConfig, is_project_config, path as project_config_path};
pub(crate) use remote::RemoteConfig;
pub(crate) use sandbox::{Network, SandboxConfig, SandboxMode};
pub(crate) use work_source::WorkSource;

#[derive(Debug, Clone)]
pub struct Role {
    pub name: String,
    /// The span of `<name>` in its `[roles.<name>]` header, for diagnostics.
    pub name_span: std::ops::Range<usize>,
    pub prompt: Option<(PathBuf, Str)>,
    pub model: Option<String>,
    pub timeout: Option<Duration>,
    /// No output on stdout or stderr for this long stops the role like a timeout.
    pub idle_timeout: Option<Duration>,
    pub cache: bool,
    /// Rendered instead of `prompt` when the prompt would fill too much of the context.
    pub compaction_prompt: Option<(PathBuf, Str)>,
    /// The share of `brakes.context_tokens` past which the compaction prompt is used.
    pub compaction_share: f64,
    /// The role's own agent keys (`preset`, `command`, `model_args`, `usage`).
    pub agent: AgentKeys,
}

#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub source: SourceRef,
    pub dir: PathBuf,
    pub pipeline: Option<(PathBuf, Str)>,
    pub work_source: WorkSource,
    pub brakes: Brakes,
    pub interval_seconds: u64,
    pub harness_timeout: Option<Duration>,
    pub harness_idle_timeout: Option<Duration>,
    /// `[harness] grace`: how long a stopped node's processes have between TERM and KILL.
    pub harness_grace: Option<Duration>,
    /// `[harness]`'s agent keys, for roles that set none of their own.
    pub harness: AgentKeys,
    pub roles: IndexMap<String, Role>,
    pub roles_span: Option<std::ops::Range<usize>>,
    pub allow: Vec<Str>,
    pub deny: Vec<Str>,
    pub worktree: bool,
    /// `[worktree] dir`: where the loop's worktree lives instead of the default, `~/`
    /// expanded (never inside the checkout).
    pub worktree_dir: Option<PathBuf>,
    pub sandbox: SandboxConfig,
    pub notify: Option<Notify>,
    /// `[remote]`: the state of record lives in the repository (DESIGN §16).
    pub remote: Option<RemoteConfig>,
}

/// The keys a loop.toml may have at its top level (`check -` tells a loop config from a
/// pipeline by them).
pub(crate) const TOP_LEVEL_KEYS: &[&str] = &[
    "pipeline",
    "work_source",
    "brakes",
    "schedule",
    "harness",
    "roles",
    "blast_radius",
    "worktree",
    "sandbox",
    "notify",
    "remote",
];

/// `p` as written, or under `dir` when relative.
fn resolve(dir: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// The agent of a loop that names none: the [`DEFAULT_PRESET`], loaded once.
fn default_agent() -> &'static AgentKeys {
    static DEFAULT: std::sync::OnceLock<AgentKeys> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| AgentKeys {
        preset: crate::preset::load_shared(DEFAULT_PRESET, &mut Diagnostics::default()),
        ..AgentKeys::default()
    })
}

/// A `loop.toml` read as far as it goes. `complete` is false when the file has a syntax
/// error or no valid `[brakes]`: the loop cannot run, but the rest of the config is there
/// (with a placeholder iteration cap) so `check` can still cross-check roles, prompts and
/// templates in the same run.
#[derive(Debug, Clone)]
pub struct Partial {
    pub config: LoopConfig,
    pub complete: bool,
}

impl LoopConfig {
    /// Reads `loop.toml` (or a predecessor `loop.json`, converted) and checks its own keys.
    /// `None` when the loop cannot run as written (the diagnostics say why).
    pub fn read(
        path: &Path,
        base: &Path,
        diags: &mut Diagnostics,
    ) -> std::io::Result<Option<LoopConfig>> {
        Ok(Self::read_partial(path, base, diags)?.and_then(|p| p.complete.then_some(p.config)))
    }

    /// [`LoopConfig::read`], keeping what could be read of a config that cannot run.
    /// `None` only for a `loop.json` that is not JSON.
    pub fn read_partial(
        path: &Path,
        base: &Path,
        diags: &mut Diagnostics,
    ) -> std::io::Result<Option<Partial>> {
        let text = crate::fs_safe::read_to_string(path)?;
        let name = crate::diag::display_name(path, base);
        Ok(Self::from_text(text, path, name, diags))
    }

    /// A config given as text (`check -` reads it from stdin): `path` is where it would
    /// live (relative paths in it resolve against its directory), `name` what
    /// diagnostics call it.
    pub fn from_text(
        text: String,
        path: &Path,
        name: String,
        diags: &mut Diagnostics,
    ) -> Option<Partial> {
        let source = if path.extension().is_some_and(|e| e == "json") {
            match json_to_toml(&text) {
                Ok(t) => {
                    // Read as TOML, reported in the JSON: every key and value by path.
                    let json = Source::new(name, path, text);
                    let origin = crate::diag::Origin::new(json, json_origin::spans);
                    Source::converted(t, origin)
                }
                Err(e) => {
                    // At the line and column serde_json names, when it names one.
                    let at = serde_json::from_str::<serde_json::Value>(&text)
                        .err()
                        .filter(|e| e.line() > 0)
                        .map(|e| crate::diag::offset_of(&text, e.line(), e.column()))
                        .unwrap_or(0);
                    let src = Source::new(name, path, text);
                    diags.push(
                        Diagnostic::error(
                            Code::TomlSyntax,
                            &src,
                            at..at,
                            format!("invalid JSON: {e}"),
                        )
                        .label("here")
                        .help("fix the JSON, or convert the file to loop.toml"),
                    );
                    return None;
                }
            }
        } else {
            Source::new(name, path, text)
        };
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Some(Self::parse_partial(&source, &dir, diags))
    }

    pub fn parse(source: &SourceRef, dir: &Path, diags: &mut Diagnostics) -> Option<LoopConfig> {
        let p = Self::parse_partial(source, dir, diags);
        p.complete.then_some(p.config)
    }

    pub fn parse_partial(source: &SourceRef, dir: &Path, diags: &mut Diagnostics) -> Partial {
        let (doc, syntax_errors) = toml_read::parse_partial(source, diags);
        let root = Table::new(source, doc.get_ref(), 0..0, "");
        root.deny_unknown(TOP_LEVEL_KEYS, diags);
        let pipeline = root
            .str("pipeline", diags)
            .map(|s| (resolve(dir, &s.value), s));
        let work_source = work_source::read(root.table("work_source", diags), dir, diags);
        let brakes = brakes::read(&root, source, diags);
        let interval_seconds = read_interval(&root, diags);

        let mut harness_timeout = None;
        let mut harness_idle_timeout = None;
        let mut harness_grace = None;
        let mut harness = AgentKeys::default();
        if let Some(t) = root.table("harness", diags) {
            t.deny_unknown(
                &[
                    "preset",
                    "command",
                    "model_args",
                    "usage",
                    "timeout",
                    "idle_timeout",
                    "grace",
                ],
                diags,
            );
            harness = AgentKeys::read(&t, diags);
            harness_timeout = t.duration("timeout", diags);
            harness_idle_timeout = t.duration("idle_timeout", diags);
            harness_grace = t.duration("grace", diags);
        }

        let mut roles = IndexMap::new();
        let mut roles_span = None;
        if let Some(rt) = root.table("roles", diags) {
            roles_span = Some(rt.span.clone());
            for (name, t) in rt.subtables(diags) {
                let role = read_role(name, &t, dir, diags);
                roles.insert(role.name.clone(), role);
            }
        }

        let (allow, deny) = read_blast_radius(&root, diags);
        let (worktree, worktree_dir) = match root.table("worktree", diags) {
            None => (true, None),
            Some(t) => {
                t.deny_unknown(&["enabled", "dir"], diags);
                let enabled = t.bool("enabled", diags).unwrap_or(true);
                (enabled, read_worktree_dir(&t, source, dir, diags))
            }
        };
        let sandbox = sandbox::read(root.table("sandbox", diags), diags);
        let notify = notify::read(root.table("notify", diags), diags);
        let remote = remote::read(root.table("remote", diags), diags);
        let (brakes, brakes_ok) = brakes;
        let config = LoopConfig {
            source: source.clone(),
            dir: dir.to_path_buf(),
            pipeline,
            work_source,
            brakes,
            interval_seconds,
            harness_timeout,
            harness_idle_timeout,
            harness_grace,
            harness,
            roles,
            roles_span,
            allow,
            deny,
            worktree,
            worktree_dir,
            sandbox,
            notify,
            remote,
        };
        Partial {
            config,
            complete: brakes_ok && !syntax_errors,
        }
    }

    /// A role's agent: each key from the role's table, else the role's preset, else
    /// `[harness]`, else its preset, else the default command. A role that names its
    /// own `preset` or `command` runs another agent: nothing of `[harness]` is mixed in.
    pub fn agent(&self, role: &str) -> Agent {
        agent::resolve(
            role,
            self.roles.get(role).map(|r| &r.agent),
            &self.harness,
            default_agent,
        )
    }

    /// The argv templates a role runs: its agent's command, the agent's model flags when
    /// the role names a `model`, then the preset's arguments for the role.
    pub fn command_for(&self, role: &str) -> Vec<Tmpl> {
        self.command_refs(role).into_iter().cloned().collect()
    }

    /// [`LoopConfig::command_for`], borrowed from the configuration (the checks read it;
    /// copying each role's argv for them was a copy per loop in `report`).
    pub fn command_refs(&self, role: &str) -> Vec<&Tmpl> {
        let own = self.roles.get(role);
        agent::command(
            role,
            own.map(|r| &r.agent),
            &self.harness,
            default_agent,
            own.is_some_and(|r| r.model.is_some()),
        )
    }

    pub fn effective_max_iterations(&self, extra: u64) -> u64 {
        self.brakes.max_iterations.saturating_add(extra)
    }

    /// The files that steer this loop besides `loop.toml` and its pipeline: every role's
    /// prompt and compaction prompt.
    pub fn prompt_files(&self) -> impl Iterator<Item = &Path> {
        self.roles.values().flat_map(|r| {
            r.prompt
                .iter()
                .chain(&r.compaction_prompt)
                .map(|(p, _)| p.as_path())
        })
    }
}

/// `[worktree] dir`: absolute or `~/…` (a relative path would resolve inside the
/// checkout), and never inside the project whose loop this is.
fn read_worktree_dir(
    t: &Table<'_, '_>,
    source: &SourceRef,
    dir: &Path,
    diags: &mut Diagnostics,
) -> Option<PathBuf> {
    let s = t.str("dir", diags)?;
    let p = sandbox::expand_home(&s.value);
    let bad = |why: &str, help: &str, diags: &mut Diagnostics| {
        diags.push(
            Diagnostic::error(
                Code::InvalidValue,
                source,
                s.span.clone(),
                format!("`[worktree] dir` {why}"),
            )
            .label("here")
            .help(help.to_string()),
        );
    };
    if !p.is_absolute() {
        bad(
            "must be an absolute path or begin with `~/`",
            "a loop's worktree lives outside the checkout, so tools that search parent directories (cargo, npm, pytest) find the loop's copy and not yours: write e.g. `dir = \"~/work/loops\"`",
            diags,
        );
        return None;
    }
    // `.loopflow/loops/<name>/loop.toml`: the project is three directories up.
    let project = dir.ancestors().nth(3).filter(|_| {
        dir.parent()
            .and_then(Path::file_name)
            .is_some_and(|n| n == "loops")
    });
    if let Some(project) = project {
        let real = |p: &Path| {
            p.canonicalize()
                .unwrap_or_else(|_| crate::fs_safe::normalize(p))
        };
        let (w, top) = (real(&p), real(project));
        if w.starts_with(&top) {
            bad(
                "is inside the project",
                "a worktree inside the checkout makes every tool that searches parent directories (cargo's workspace root, uv and npm workspaces, pytest's rootdir) find your checkout instead of the loop's copy: choose a directory outside it, or remove `dir` for the default under ~/.local/state/loopflow/worktrees",
                diags,
            );
            return None;
        }
    }
    Some(p)
}

fn read_interval(root: &Table<'_, '_>, diags: &mut Diagnostics) -> u64 {
    let Some(t) = root.table("schedule", diags) else {
        return 3600;
    };
    t.deny_unknown(&["interval_seconds"], diags);
    match t.uint("interval_seconds", diags) {
        Some((0, span)) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    span,
                    "`schedule.interval_seconds` must be at least 1",
                )
                .label("zero")
                .help("use the number of seconds between ticks, e.g. 3600"),
            );
            3600
        }
        Some((n, _)) => n,
        None => 3600,
    }
}

fn read_role(name: Str, t: &Table<'_, '_>, dir: &Path, diags: &mut Diagnostics) -> Role {
    t.deny_unknown(
        &[
            "prompt",
            "preset",
            "command",
            "model_args",
            "usage",
            "model",
            "timeout",
            "idle_timeout",
            "cache",
            "compaction_prompt",
            "compaction_share",
        ],
        diags,
    );
    let prompt = t.str("prompt", diags).map(|s| (resolve(dir, &s.value), s));
    let agent = AgentKeys::read(t, diags);
    let model = t
        .str("model", diags)
        .map(|s| s.value)
        .filter(|m| !m.is_empty());
    let timeout = t.duration("timeout", diags);
    let idle_timeout = t.duration("idle_timeout", diags);
    let cache = t.bool("cache", diags).unwrap_or(false);
    let compaction_prompt = t
        .str("compaction_prompt", diags)
        .map(|s| (resolve(dir, &s.value), s));
    let compaction_share = match t.number("compaction_share", diags) {
        Some((n, span)) if !(n > 0.0 && n <= 1.0) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    span,
                    "`compaction_share` must be greater than 0.0 and at most 1.0",
                )
                .label("out of range")
                .help("the share of `brakes.context_tokens` a prompt may fill before the compaction prompt is used; the default is 0.8"),
            );
            0.8
        }
        Some((n, _)) => n,
        None => 0.8,
    };
    Role {
        name_span: name.span.clone(),
        name: name.value,
        prompt,
        model,
        timeout,
        idle_timeout,
        cache,
        compaction_prompt,
        compaction_share,
        agent,
    }
}

fn read_blast_radius(root: &Table<'_, '_>, diags: &mut Diagnostics) -> (Vec<Str>, Vec<Str>) {
    let (mut allow, mut deny) = (Vec::new(), Vec::new());
    let Some(t) = root.table("blast_radius", diags) else {
        return (allow, deny);
    };
    t.deny_unknown(&["allow", "deny"], diags);
    for (key, out) in [("allow", &mut allow), ("deny", &mut deny)] {
        let Some((globs, _)) = t.str_list(key, diags) else {
            continue;
        };
        for g in globs {
            if let Err(e) = crate::blast::validate_glob(&g.value) {
                diags.push(
                    Diagnostic::error(
                        Code::InvalidValue,
                        t.source,
                        g.span.clone(),
                        format!("invalid glob: {e}"),
                    )
                    .label("not a glob")
                    .help("use globs such as \"src/**\" or \"docs/*.md\""),
                );
            }
            out.push(g);
        }
    }
    (allow, deny)
}

/// A predecessor `loop.json`, rewritten as TOML so one reader checks both.
fn json_to_toml(text: &str) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let t: toml::Table = serde_json::from_value(v).map_err(|e| e.to_string())?;
    // A first line that is no key or value: a finding about the whole file (which points
    // at the first line) then maps to no piece of the JSON but to its start.
    toml::to_string(&t)
        .map(|toml| format!("# the loop.json, read as TOML\n{toml}"))
        .map_err(|e| e.to_string())
}
