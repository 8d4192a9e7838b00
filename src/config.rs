//! `loop.toml`: read with spans, every problem collected, then cross-checked against the
//! loop's pipeline (roles with no config, prompt files, templates, model divergence).

use std::path::{Path, PathBuf};
use std::time::Duration;

use indexmap::IndexMap;

use crate::diag::{Code, Diagnostic, Diagnostics, Source, SourceRef, list, suggest};
use crate::pipeline::{Pipeline, TemplatePlace, duration_key};
use crate::preset::{Preset, UsageRule};
use crate::template::Tmpl;
use crate::toml_read::{self, Str, Table};

/// The hard context floor (D13): no loop runs an agent with less context than this.
pub const HARD_CONTEXT_FLOOR: u64 = 16_000;

pub const DEFAULT_HARNESS: &[&str] = &[
    "opencode",
    "run",
    "--prompt-file",
    "{{prompt}}",
    "--cwd",
    "{{cwd}}",
];

#[derive(Debug, Clone)]
pub enum WorkSource {
    Single,
    Backlog { file: PathBuf },
    Audit { command: Vec<Tmpl> },
}

#[derive(Debug, Clone)]
pub struct Brakes {
    pub max_iterations: u64,
    pub max_budget_usd: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_seconds: Option<f64>,
    pub score_plateau_window: usize,
    pub score_plateau_epsilon: f64,
    pub min_context_tokens: u64,
    pub context_tokens: Option<u64>,
    pub run_phases: Vec<String>,
    pub goal_score: f64,
    pub max_consecutive_aborts: u32,
}

#[derive(Debug, Clone)]
pub struct Role {
    pub name: String,
    /// The span of `<name>` in its `[roles.<name>]` header, for diagnostics.
    pub name_span: std::ops::Range<usize>,
    pub prompt: Option<(PathBuf, Str)>,
    pub command: Option<Vec<Tmpl>>,
    pub model: Option<String>,
    pub timeout: Option<Duration>,
    pub cache: bool,
    /// Rendered instead of `prompt` when the prompt would fill too much of the context.
    pub compaction_prompt: Option<(PathBuf, Str)>,
    /// The share of `brakes.context_tokens` past which the compaction prompt is used.
    pub compaction_share: f64,
    /// The role's own agent keys (`preset`, `model_args`, `usage`); `command` above.
    pub agent: AgentKeys,
}

/// The agent keys of a `[harness]` or `[roles.<role>]` table. A key left out falls back
/// to the table's `preset`, then to `[harness]`, then to its preset, then to the default.
#[derive(Debug, Clone, Default)]
pub struct AgentKeys {
    pub preset: Option<Preset>,
    pub command: Option<Vec<Tmpl>>,
    pub model_args: Option<Vec<Tmpl>>,
    pub usage: UsageRule,
}

/// A role's agent once presets and overrides are resolved.
#[derive(Debug, Clone)]
pub struct Agent {
    pub preset: Option<&'static str>,
    pub command: Vec<Tmpl>,
    /// Appended to `command` when the role names a `model`.
    pub model_args: Vec<Tmpl>,
    pub usage: UsageRule,
}

/// Reads `preset`, `command`, `model_args` and `usage` from a harness or role table.
fn agent_keys(t: &Table<'_, '_>, diags: &mut Diagnostics) -> AgentKeys {
    let preset = t.str("preset", diags).and_then(|s| {
        let found = crate::preset::load(&s.value, diags);
        if found.is_none() {
            let names = crate::preset::names();
            let mut d = Diagnostic::error(
                Code::InvalidValue,
                t.source,
                s.span.clone(),
                format!("unknown agent preset `{}`", s.value),
            )
            .label("not a preset");
            let near = suggest(&s.value, names.iter().copied()).or_else(|| {
                names
                    .iter()
                    .copied()
                    .find(|n| s.value.len() >= 3 && n.starts_with(s.value.as_str()))
            });
            d = match near {
                Some(n) => d.help(format!("did you mean `{n}`? Presets: {}", names.join(", "))),
                None => d.help(format!(
                    "use one of the presets ({}), or set `command` yourself",
                    names.join(", ")
                )),
            };
            diags.push(d);
        }
        found
    });
    let command = argv(t, "command", diags);
    let model_args = t.str_list("model_args", diags).map(|(v, _)| {
        v.iter()
            .map(|s| Tmpl::literal(t.source, &s.value, s.span.clone()))
            .collect()
    });
    let usage = t
        .table("usage", diags)
        .map(|u| UsageRule::read(&u, diags))
        .unwrap_or_default();
    AgentKeys {
        preset,
        command,
        model_args,
        usage,
    }
}

#[derive(Debug, Clone)]
pub struct LoopConfig {
    pub source: SourceRef,
    pub dir: PathBuf,
    pub pipeline: Option<(PathBuf, Str)>,
    pub work_source: WorkSource,
    pub brakes: Brakes,
    pub interval_seconds: u64,
    /// `[harness] command`, else its preset's, else [`DEFAULT_HARNESS`].
    pub harness_command: Vec<Tmpl>,
    pub harness_timeout: Option<Duration>,
    /// `[harness]`'s agent keys, for roles that set none of their own.
    pub harness: AgentKeys,
    pub roles: IndexMap<String, Role>,
    pub roles_span: Option<std::ops::Range<usize>>,
    pub allow: Vec<Str>,
    pub deny: Vec<Str>,
    pub worktree: bool,
}

impl LoopConfig {
    /// Reads `loop.toml` (or a predecessor `loop.json`, converted) and checks its own keys.
    pub fn read(
        path: &Path,
        base: &Path,
        diags: &mut Diagnostics,
    ) -> std::io::Result<Option<LoopConfig>> {
        let text = crate::fs_safe::read_to_string(path)?;
        let name = crate::diag::display_name(path, base);
        let source = if path.extension().is_some_and(|e| e == "json") {
            match json_to_toml(&text) {
                Ok(t) => Source::new(format!("{name} (as TOML)"), path, t),
                Err(e) => {
                    let src = Source::new(name, path, text);
                    diags.push(
                        Diagnostic::error(
                            Code::TomlSyntax,
                            &src,
                            0..0,
                            format!("invalid JSON: {e}"),
                        )
                        .label("here")
                        .help("fix the JSON, or convert the file to loop.toml"),
                    );
                    return Ok(None);
                }
            }
        } else {
            Source::new(name, path, text)
        };
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Ok(Self::parse(&source, &dir, diags))
    }

    pub fn parse(source: &SourceRef, dir: &Path, diags: &mut Diagnostics) -> Option<LoopConfig> {
        let doc = toml_read::parse(source, diags)?;
        let root = Table::new(source, doc.get_ref(), 0..0, "");
        root.deny_unknown(
            &[
                "pipeline",
                "work_source",
                "brakes",
                "schedule",
                "harness",
                "roles",
                "blast_radius",
                "worktree",
            ],
            diags,
        );
        let resolve = |s: &str| -> PathBuf {
            let p = Path::new(s);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                dir.join(p)
            }
        };
        let pipeline = root.str("pipeline", diags).map(|s| (resolve(&s.value), s));

        let work_source = match root.table("work_source", diags) {
            None => WorkSource::Single,
            Some(t) => {
                t.deny_unknown(&["kind", "file", "command"], diags);
                match t.str("kind", diags) {
                    None => WorkSource::Single,
                    Some(k) => match k.value.as_str() {
                        "single" => WorkSource::Single,
                        "backlog" => {
                            let file_str = t.str("file", diags);
                            if let Some(f) = &file_str {
                                check_source_template(
                                    &Tmpl::literal(source, &f.value, f.span.clone()),
                                    "work_source.file",
                                    diags,
                                );
                            }
                            let file = file_str.map_or("BACKLOG.md".to_string(), |s| s.value);
                            // `{{cwd}}/BACKLOG.md` is rendered per tick (the loop's worktree).
                            WorkSource::Backlog {
                                file: if file.contains("{{") {
                                    PathBuf::from(file)
                                } else {
                                    resolve(&file)
                                },
                            }
                        }
                        "audit" => match t.str_list("command", diags) {
                            Some((argv, _)) if !argv.is_empty() => {
                                let command: Vec<Tmpl> = argv
                                    .iter()
                                    .map(|s| Tmpl::literal(source, &s.value, s.span.clone()))
                                    .collect();
                                for c in &command {
                                    check_source_template(c, "work_source.command", diags);
                                }
                                WorkSource::Audit { command }
                            }
                            Some((_, span)) => {
                                diags.push(empty_argv(source, span, "work_source.command"));
                                WorkSource::Single
                            }
                            None => {
                                if t.get("command").is_none() {
                                    t.missing("command", "command = [\"./audit.sh\"]", diags);
                                }
                                WorkSource::Single
                            }
                        },
                        other => {
                            diags.push(
                                Diagnostic::error(Code::InvalidValue, source, k.span, format!("unknown work source `{other}`"))
                                    .label("not a work source")
                                    .help("use \"single\" (the state's current task), \"backlog\" (a markdown checklist) or \"audit\" (a command's output lines)"),
                            );
                            WorkSource::Single
                        }
                    },
                }
            }
        };

        let brakes = read_brakes(&root, source, diags);
        let interval_seconds = match root.table("schedule", diags) {
            None => 3600,
            Some(t) => {
                t.deny_unknown(&["interval_seconds"], diags);
                match t.uint("interval_seconds", diags) {
                    Some((0, span)) => {
                        diags.push(
                            Diagnostic::error(
                                Code::InvalidValue,
                                source,
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
        };

        let mut harness_command: Vec<Tmpl> = DEFAULT_HARNESS
            .iter()
            .map(|s| Tmpl {
                text: s.to_string(),
                source: source.clone(),
                origin: crate::template::Origin::Literal(0..0),
            })
            .collect();
        let mut harness_timeout = None;
        let mut harness = AgentKeys::default();
        if let Some(t) = root.table("harness", diags) {
            t.deny_unknown(
                &["preset", "command", "model_args", "usage", "timeout"],
                diags,
            );
            harness = agent_keys(&t, diags);
            if let Some(cmd) = harness
                .command
                .clone()
                .or_else(|| harness.preset.as_ref().map(|p| p.command.clone()))
            {
                harness_command = cmd;
            }
            harness_timeout = duration_key(&t, "timeout", diags);
        }

        let mut roles = IndexMap::new();
        let mut roles_span = None;
        if let Some(rt) = root.table("roles", diags) {
            roles_span = Some(rt.span.clone());
            for (name, t) in rt.subtables(diags) {
                t.deny_unknown(
                    &[
                        "prompt",
                        "preset",
                        "command",
                        "model_args",
                        "usage",
                        "model",
                        "timeout",
                        "cache",
                        "compaction_prompt",
                        "compaction_share",
                    ],
                    diags,
                );
                let prompt = t.str("prompt", diags).map(|s| (resolve(&s.value), s));
                let agent = agent_keys(&t, diags);
                let command = agent.command.clone();
                let model = t
                    .str("model", diags)
                    .map(|s| s.value)
                    .filter(|m| !m.is_empty());
                let timeout = duration_key(&t, "timeout", diags);
                let cache = t.bool("cache", diags).unwrap_or(false);
                let compaction_prompt = t
                    .str("compaction_prompt", diags)
                    .map(|s| (resolve(&s.value), s));
                let compaction_share = match t.number("compaction_share", diags) {
                    Some((n, span)) if !(n > 0.0 && n <= 1.0) => {
                        diags.push(
                            Diagnostic::error(
                                Code::InvalidValue,
                                source,
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
                roles.insert(
                    name.value.clone(),
                    Role {
                        name_span: name.span.clone(),
                        name: name.value,
                        prompt,
                        command,
                        model,
                        timeout,
                        cache,
                        compaction_prompt,
                        compaction_share,
                        agent,
                    },
                );
            }
        }

        let (mut allow, mut deny) = (Vec::new(), Vec::new());
        if let Some(t) = root.table("blast_radius", diags) {
            t.deny_unknown(&["allow", "deny"], diags);
            for (key, out) in [("allow", &mut allow), ("deny", &mut deny)] {
                if let Some((globs, _)) = t.str_list(key, diags) {
                    for g in globs {
                        if let Err(e) = globset::Glob::new(&g.value) {
                            diags.push(
                                Diagnostic::error(
                                    Code::InvalidValue,
                                    source,
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
            }
        }
        let worktree = match root.table("worktree", diags) {
            None => true,
            Some(t) => {
                t.deny_unknown(&["enabled"], diags);
                t.bool("enabled", diags).unwrap_or(true)
            }
        };
        Some(LoopConfig {
            source: source.clone(),
            dir: dir.to_path_buf(),
            pipeline,
            work_source,
            brakes: brakes?,
            interval_seconds,
            harness_command,
            harness_timeout,
            harness,
            roles,
            roles_span,
            allow,
            deny,
            worktree,
        })
    }

    /// A role's agent: each key from the role's table, else the role's preset, else
    /// `[harness]`, else its preset, else the default command. A role that names its
    /// own `preset` or `command` runs another agent: nothing of `[harness]` is mixed in.
    pub fn agent(&self, role: &str) -> Agent {
        let own = self.roles.get(role).map(|r| &r.agent);
        let standalone = own.is_some_and(|k| k.preset.is_some() || k.command.is_some());
        let mut layers: Vec<&AgentKeys> = own.into_iter().collect();
        if !standalone {
            layers.push(&self.harness);
        }
        let pick = |f: &dyn Fn(&AgentKeys) -> Option<Vec<Tmpl>>| {
            layers
                .iter()
                .find_map(|k| f(k).or_else(|| k.preset.as_ref().and_then(|p| f(&preset_keys(p)))))
        };
        let command = pick(&|k| k.command.clone()).unwrap_or_else(|| self.harness_command.clone());
        let model_args = pick(&|k| k.model_args.clone()).unwrap_or_default();
        let mut usage = UsageRule::default();
        for k in &layers {
            usage = usage.over(&k.usage);
            if let Some(p) = &k.preset {
                usage = usage.over(&p.usage);
            }
        }
        Agent {
            preset: layers
                .iter()
                .find_map(|k| k.preset.as_ref().map(|p| p.name)),
            command,
            model_args,
            usage,
        }
    }

    /// The argv templates a role runs: its agent's command, plus the agent's model flags
    /// when the role names a `model`.
    pub fn command_for(&self, role: &str) -> Vec<Tmpl> {
        let agent = self.agent(role);
        let mut argv = agent.command;
        if self.roles.get(role).is_some_and(|r| r.model.is_some()) {
            argv.extend(agent.model_args);
        }
        argv
    }

    /// `check --explain`: each role's expanded argv (templates unrendered) and where its
    /// usage is read from.
    pub fn explain(&self, pipeline: &Pipeline) -> String {
        let mut out = format!("{}:\n", self.source.name);
        let mut seen = Vec::new();
        for node in &pipeline.nodes {
            let Some(role) = node.spec.role() else {
                continue;
            };
            if seen.contains(&role.value) {
                continue;
            }
            seen.push(role.value.clone());
            let agent = self.agent(&role.value);
            let argv: Vec<String> = self
                .command_for(&role.value)
                .iter()
                .map(|t| t.text.clone())
                .collect();
            let from = agent
                .preset
                .map_or(String::new(), |p| format!(" (preset {p})"));
            out.push_str(&format!(
                "  role {}{from}: {}\n",
                role.value,
                crate::node::show_argv(&argv)
            ));
            let u = &agent.usage;
            if !u.is_empty() {
                let mut parts = vec![match u.format {
                    Some(crate::preset::OutputFormat::Jsonl) => "stdout as JSON lines".to_string(),
                    _ => "stdout as JSON".to_string(),
                }];
                if let Some(t) = &u.text {
                    parts.push(format!("answer at {t}"));
                }
                if let Some(c) = &u.cost_usd {
                    parts.push(format!("cost_usd = {}", c.join(" + ")));
                }
                if let Some(t) = &u.tokens {
                    parts.push(format!("tokens = {}", t.join(" + ")));
                }
                out.push_str(&format!("    usage: {}\n", parts.join("; ")));
            }
        }
        out
    }

    pub fn effective_max_iterations(&self, extra: u64) -> u64 {
        self.brakes.max_iterations.saturating_add(extra)
    }

    /// Cross-checks the config against the pipeline it runs: every harness role has a
    /// `[roles.<role>]` table and an existing prompt, every argv and prompt template only
    /// uses what exists at its node, and model divergence is real (D12).
    pub fn check_against(&self, pipeline: &Pipeline, base: &Path, diags: &mut Diagnostics) {
        let mut prompt_sources: IndexMap<PathBuf, Option<SourceRef>> = IndexMap::new();
        for (v, node) in pipeline.nodes.iter().enumerate() {
            let Some(role) = node.spec.role() else {
                continue;
            };
            let Some(cfg) = self.roles.get(&role.value) else {
                let known: Vec<&str> = self.roles.keys().map(String::as_str).collect();
                let near = suggest(&role.value, known.iter().copied()).or_else(|| {
                    // `verify` vs `verifier`: a long shared prefix is a near miss too.
                    let shared = |k: &str| {
                        k.chars()
                            .zip(role.value.chars())
                            .take_while(|(a, b)| a == b)
                            .count()
                    };
                    known
                        .iter()
                        .copied()
                        .find(|k| shared(k) >= 4 && 2 * shared(k) >= role.value.len())
                });
                // Point at the near-miss table when there is one, else at `[roles]`.
                let (span, label) = match near.and_then(|n| self.roles.get(n)) {
                    Some(r) => (
                        r.name_span.clone(),
                        format!("`{}` is configured, not `{}`", r.name, role.value),
                    ),
                    None => match &self.roles_span {
                        Some(s) => (
                            s.clone(),
                            format!("no `[roles.{}]` among these", role.value),
                        ),
                        None => (
                            0..self.source.text.find('\n').unwrap_or(0),
                            "this file has no `[roles.<name>]` tables".to_string(),
                        ),
                    },
                };
                let mut d = Diagnostic::error(
                    Code::MissingRole,
                    &self.source,
                    span,
                    format!(
                        "role `{}` has no `[roles.{}]` table, but node `{}` of {} runs it",
                        role.value, role.value, node.id.value, pipeline.source.name
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
            for t in &self.command_for(&role.value) {
                if matches!(t.origin, crate::template::Origin::Literal(ref r) if *r == (0..0)) {
                    continue; // the built-in default harness
                }
                pipeline.check_template(t, v, TemplatePlace::Node, diags);
            }
            match &cfg.prompt {
                None => diags.push(
                    Diagnostic::error(
                        Code::MissingKey,
                        &self.source,
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
                        None => diags.push(
                            Diagnostic::error(
                                Code::MissingPrompt,
                                &self.source,
                                lit.span.clone(),
                                format!("prompt file `{}` does not exist", crate::diag::display_name(path, base)),
                            )
                            .label("no such file")
                            .help(format!(
                                "relative prompt paths resolve against {}; create the file or fix the path",
                                crate::diag::display_name(&self.dir, base)
                            )),
                        ),
                        Some(src) => pipeline.check_template(&Tmpl::file(&src), v, TemplatePlace::Prompt, diags),
                    }
                }
            }
            if let Some((path, lit)) = &cfg.compaction_prompt {
                match Source::read(path, base) {
                    Err(_) => diags.push(
                        Diagnostic::error(
                            Code::MissingPrompt,
                            &self.source,
                            lit.span.clone(),
                            format!(
                                "compaction prompt `{}` does not exist",
                                crate::diag::display_name(path, base)
                            ),
                        )
                        .label("no such file")
                        .help("create the file (see prompts/compaction.md) or remove `compaction_prompt`"),
                    ),
                    Ok(src) => pipeline.check_template(&Tmpl::file(&src), v, TemplatePlace::Prompt, diags),
                }
            }
        }
        self.check_model_divergence(pipeline, diags);
    }

    /// D12: when implement and verify name different models, the command each runs must
    /// pass `{{model}}`, or both would silently use the agent's default model.
    fn check_model_divergence(&self, pipeline: &Pipeline, diags: &mut Diagnostics) {
        let model = |r: &str| self.roles.get(r).and_then(|r| r.model.clone());
        let (Some(mi), Some(mv)) = (model("implement"), model("verify")) else {
            return;
        };
        if mi == mv {
            return;
        }
        let roles_used: Vec<&str> = pipeline
            .nodes
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
            let cmd = self.command_for(role);
            if cmd.iter().any(|t| t.text.contains("model")) || reported.contains(&key(&cmd)) {
                continue;
            }
            reported.push(key(&cmd));
            let shared = ["implement", "verify"]
                .iter()
                .all(|r| key(&self.command_for(r)) == key(&cmd));
            let whose = if shared {
                "the command both roles run".to_string()
            } else {
                format!("the `{role}` command")
            };
            let span = match (cmd.first(), cmd.last()) {
                (Some(a), Some(b)) if a.whole_span() != (0..0) => {
                    a.whole_span().start..b.whole_span().end
                }
                _ => self.roles.get(role).map_or(0..0, |r| r.name_span.clone()),
            };
            diags.push(
                Diagnostic::error(
                    Code::ModelNotPassed,
                    &self.source,
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
}

/// Work-source templates are rendered by the gate, before any node runs: only these
/// variables exist there.
pub const SOURCE_VARS: &[&str] = &["loop", "project", "cwd"];

fn check_source_template(t: &Tmpl, key: &str, diags: &mut Diagnostics) {
    match crate::template::scan(&t.text) {
        Err(e) => diags.push(
            Diagnostic::error(
                Code::TemplateSyntax,
                &t.source,
                t.span_of(e.range),
                format!("`{key}` is not a valid template: {}", e.message),
            )
            .label("here")
            .help("templates use handlebars: `{{cwd}}/BACKLOG.md`"),
        ),
        Ok(usages) => {
            for u in usages {
                if u.path.len() == 1 && SOURCE_VARS.contains(&u.path[0].as_str()) {
                    continue;
                }
                diags.push(
                    Diagnostic::error(
                        Code::UnknownVariable,
                        &t.source,
                        t.span_of(u.range),
                        format!(
                            "`{key}` uses `{}`, which does not exist when the work source is read",
                            u.path.join(".")
                        ),
                    )
                    .label("not available here")
                    .help(format!(
                        "the work source is read by the gate, before any node runs; use {}",
                        list(SOURCE_VARS)
                    )),
                );
            }
        }
    }
}

/// A preset's keys as the lowest layer of a table.
fn preset_keys(p: &Preset) -> AgentKeys {
    AgentKeys {
        preset: None,
        command: Some(p.command.clone()),
        model_args: Some(p.model_args.clone()),
        usage: p.usage.clone(),
    }
}

fn empty_argv(source: &SourceRef, span: std::ops::Range<usize>, key: &str) -> Diagnostic {
    Diagnostic::error(Code::EmptyArgv, source, span, format!("`{key}` is empty"))
        .label("nothing to run")
        .help("give the program and its arguments, e.g. [\"cargo\", \"test\"]")
}

/// A command: a non-empty list of templates, one argv element each.
pub fn argv(t: &Table<'_, '_>, key: &str, diags: &mut Diagnostics) -> Option<Vec<Tmpl>> {
    let (items, span) = t.str_list(key, diags)?;
    if items.is_empty() {
        diags.push(empty_argv(
            t.source,
            span,
            format!("{}.{key}", t.path).trim_start_matches('.'),
        ));
        return None;
    }
    Some(
        items
            .iter()
            .map(|s| Tmpl::literal(t.source, &s.value, s.span.clone()))
            .collect(),
    )
}

fn read_brakes(
    root: &Table<'_, '_>,
    source: &SourceRef,
    diags: &mut Diagnostics,
) -> Option<Brakes> {
    let Some(t) = root.table("brakes", diags) else {
        if root.get("brakes").is_none() {
            diags.push(
                Diagnostic::error(
                    Code::MissingKey,
                    source,
                    0..source.text.find('\n').unwrap_or(0),
                    "missing required key `brakes.max_iterations`",
                )
                .label("this loop has no `[brakes]` table")
                .help(
                    "add `[brakes]` with `max_iterations = 10`: every loop needs an iteration cap",
                ),
            );
        }
        return None;
    };
    t.deny_unknown(
        &[
            "max_iterations",
            "max_budget_usd",
            "max_tokens",
            "max_seconds",
            "score_plateau_window",
            "score_plateau_epsilon",
            "min_context_tokens",
            "context_tokens",
            "run_phases",
            "goal_score",
            "max_consecutive_aborts",
        ],
        diags,
    );
    let max_iterations = t.uint("max_iterations", diags);
    if max_iterations.is_none() && t.get("max_iterations").is_none() {
        t.missing("max_iterations", "max_iterations = 10", diags);
    }
    let positive = |key: &str, diags: &mut Diagnostics| -> Option<f64> {
        let (n, span) = t.number(key, diags)?;
        if n <= 0.0 {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    format!("`brakes.{key}` must be greater than zero"),
                )
                .label("not positive")
                .help(format!(
                    "remove `{key}` for no limit, or give a positive number"
                )),
            );
            return None;
        }
        Some(n)
    };
    let max_budget_usd = positive("max_budget_usd", diags);
    let max_seconds = positive("max_seconds", diags);
    let max_tokens = t.uint("max_tokens", diags).map(|x| x.0);
    let score_plateau_window = match t.uint("score_plateau_window", diags) {
        Some((0, span)) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.score_plateau_window` must be at least 1",
                )
                .label("zero")
                .help("the number of recent scores compared for a plateau; the default is 3"),
            );
            3
        }
        Some((n, _)) => n as usize,
        None => 3,
    };
    let score_plateau_epsilon = match t.number("score_plateau_epsilon", diags) {
        Some((n, span)) if n < 0.0 => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.score_plateau_epsilon` cannot be negative",
                )
                .label("negative")
                .help("the largest score spread counted as flat; the default is 0.0"),
            );
            0.0
        }
        Some((n, _)) => n,
        None => 0.0,
    };
    let min_context_tokens = match t.uint("min_context_tokens", diags) {
        Some((n, span)) if n < HARD_CONTEXT_FLOOR => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    format!("`brakes.min_context_tokens` cannot be below the hard floor of {HARD_CONTEXT_FLOOR}"),
                )
                .label(format!("{n} < {HARD_CONTEXT_FLOOR}"))
                .help(format!("remove it (the default is {HARD_CONTEXT_FLOOR}) or raise it")),
            );
            HARD_CONTEXT_FLOOR
        }
        Some((n, _)) => n,
        None => HARD_CONTEXT_FLOOR,
    };
    let context_tokens = t.uint("context_tokens", diags).map(|x| x.0);
    let run_phases = t
        .str_list("run_phases", diags)
        .map(|(v, _)| v.into_iter().map(|s| s.value).collect())
        .unwrap_or_else(|| vec!["implement".to_string()]);
    let goal_score = match t.number("goal_score", diags) {
        Some((n, span)) if !(0.0..=1.0).contains(&n) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.goal_score` must be between 0.0 and 1.0",
                )
                .label("out of range")
                .help("verdict scores run from 0.0 to 1.0; the default goal is 1.0"),
            );
            1.0
        }
        Some((n, _)) => n,
        None => 1.0,
    };
    let max_consecutive_aborts = match t.uint("max_consecutive_aborts", diags) {
        Some((0, span)) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    "`brakes.max_consecutive_aborts` must be at least 1",
                )
                .label("zero")
                .help("the number of aborted ticks in a row that halts the loop; the default is 3"),
            );
            3
        }
        Some((n, _)) => n.min(u64::from(u32::MAX)) as u32,
        None => 3,
    };
    Some(Brakes {
        max_iterations: max_iterations?.0,
        max_budget_usd,
        max_tokens,
        max_seconds,
        score_plateau_window,
        score_plateau_epsilon,
        min_context_tokens,
        context_tokens,
        run_phases,
        goal_score,
        max_consecutive_aborts,
    })
}

/// A predecessor `loop.json`, rewritten as TOML so one reader checks both.
fn json_to_toml(text: &str) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let t: toml::Table = serde_json::from_value(v).map_err(|e| e.to_string())?;
    toml::to_string(&t).map_err(|e| e.to_string())
}
