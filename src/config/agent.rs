//! The agent a role runs: `[harness]` and `[roles.<role>]` keys (`preset`, `command`,
//! `model_args`, `usage`), layered over the shipped presets.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::preset::{Preset, UsageRule};
use crate::template::Tmpl;
use crate::toml_read::Table;

/// The agent a loop runs when it names none (no `preset`, no `command`): the shipped
/// templates' default, OpenCode, the seed's primary harness.
pub(crate) const DEFAULT_PRESET: &str = "opencode";

/// The agent keys of a `[harness]` or `[roles.<role>]` table. A key left out falls back
/// to the table's `preset`, then to `[harness]`, then to its preset, then to the default.
#[derive(Debug, Clone, Default)]
pub struct AgentKeys {
    pub preset: Option<std::sync::Arc<Preset>>,
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
    /// The preset's own arguments for this role, appended last.
    pub role_args: Vec<Tmpl>,
    /// The rendered prompt goes to the agent's stdin.
    pub stdin_prompt: bool,
    /// Set for the agent (the preset's `set_env`).
    pub set_env: Vec<(String, Tmpl)>,
    /// Passed from loopflow's environment (the preset's `env`; `*` ends a prefix).
    pub pass_env: Vec<String>,
    /// Reachable under `network = "hosts"` (the preset's `hosts`).
    pub hosts: Vec<String>,
    /// Readable (the preset's `sandbox_read`, `~/` expanded).
    pub sandbox_read: Vec<std::path::PathBuf>,
    pub usage: UsageRule,
    /// The preset itself (its `[state]`, `[limit]` and key variables), when one runs the
    /// role.
    pub def: Option<std::sync::Arc<Preset>>,
}

impl AgentKeys {
    /// Reads `preset`, `command`, `model_args` and `usage` from a harness or role table.
    pub fn read(t: &Table<'_, '_>, diags: &mut Diagnostics) -> AgentKeys {
        let preset = t.str("preset", diags).and_then(|s| {
            let found = crate::preset::load_shared(&s.value, diags);
            if found.is_none() {
                let names = crate::preset::names();
                let near = crate::preset::closest(&s.value);
                let mut d = Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    s.span.clone(),
                    format!("unknown agent preset `{}`", s.value),
                )
                .label("not a preset");
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
        let command = t.argv("command", diags);
        if let (Some(p), Some(cmd)) = (&preset, &command) {
            let span = t.key_span("command").unwrap_or_else(|| cmd[0].whole_span());
            diags.push(
                Diagnostic::error(
                    Code::PresetWithCommand,
                    t.source,
                    span,
                    format!(
                        "`{}` sets both `preset = \"{}\"` and `command`; the command would silently replace the preset's",
                        if t.path.is_empty() { "this table" } else { t.path.as_str() },
                        p.name
                    ),
                )
                .label("remove this, or remove `preset`")
                .help("keep `preset` to run that agent as shipped (its argv, prompt on stdin, sandbox paths, usage), or write your own `command` without `preset`"),
            );
        }
        let model_args = t.templates("model_args", diags);
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
}

/// Resolves a role's agent from its own keys and (unless the role names its own `preset`
/// or `command`, and so runs another agent) `[harness]`'s, each over its preset, with
/// `default()` (the [`DEFAULT_PRESET`]) as the last resort when neither names an agent.
pub(super) fn resolve(
    role: &str,
    own: Option<&AgentKeys>,
    harness: &AgentKeys,
    default: fn() -> &'static AgentKeys,
) -> Agent {
    let layers = layers(own, harness, default);
    let command = pick(&layers, |k| &k.command, |p| &p.command).to_vec();
    let model_args = pick(&layers, |k| &k.model_args, |p| &p.model_args).to_vec();
    let mut usage = UsageRule::default();
    for k in &layers {
        usage = usage.over(&k.usage);
        if let Some(p) = &k.preset {
            usage = usage.over(&p.usage);
        }
    }
    let preset = runner(&layers);
    Agent {
        preset: preset.map(|p| p.name),
        command,
        model_args,
        role_args: preset
            .and_then(|p| p.role_args.get(role).cloned())
            .unwrap_or_default(),
        stdin_prompt: preset.is_some_and(|p| p.stdin_prompt),
        set_env: preset.map(|p| p.set_env.clone()).unwrap_or_default(),
        pass_env: preset.map(|p| p.env.clone()).unwrap_or_default(),
        hosts: preset.map(|p| p.hosts.clone()).unwrap_or_default(),
        sandbox_read: preset
            .map(|p| {
                p.sandbox_read
                    .iter()
                    .map(|s| super::sandbox::expand_home(s))
                    .collect()
            })
            .unwrap_or_default(),
        usage,
        def: runner_arc(&layers).cloned(),
    }
}

/// The argv templates of [`resolve`]'s agent only — its command, `model_args` when
/// `with_model`, the preset's arguments for `role` — without the environment, sandbox
/// paths and usage rules, which `check` and `status` never need.
pub(super) fn command<'a>(
    role: &str,
    own: Option<&'a AgentKeys>,
    harness: &'a AgentKeys,
    default: fn() -> &'static AgentKeys,
    with_model: bool,
) -> Vec<&'a Tmpl> {
    let layers = layers(own, harness, default);
    let mut argv: Vec<&Tmpl> = pick(&layers, |k| &k.command, |p| &p.command)
        .iter()
        .collect();
    if with_model {
        argv.extend(pick(&layers, |k| &k.model_args, |p| &p.model_args));
    }
    if let Some(args) = runner(&layers).and_then(|p| p.role_args.get(role)) {
        argv.extend(args);
    }
    argv
}

/// The keys a role's agent is read from, nearest first: its own; `[harness]`'s unless
/// the role names its own `preset` or `command`; the default preset when neither names
/// an agent (parsed on first use only: a loop that names its agent never pays for it).
fn layers<'a>(
    own: Option<&'a AgentKeys>,
    harness: &'a AgentKeys,
    default: fn() -> &'static AgentKeys,
) -> Vec<&'a AgentKeys> {
    let names_agent = |k: &AgentKeys| k.preset.is_some() || k.command.is_some();
    let standalone = own.is_some_and(names_agent);
    let mut layers: Vec<&AgentKeys> = own.into_iter().collect();
    if !standalone {
        layers.push(harness);
    }
    if !layers.iter().any(|k| names_agent(k)) {
        layers.push(default());
    }
    layers
}

/// A layer's own key, else its preset's, nearest layer first (read in place: copying
/// the whole preset to read one key was a sixth of `report`'s CPU).
fn pick<'a>(
    layers: &[&'a AgentKeys],
    own: impl Fn(&'a AgentKeys) -> &'a Option<Vec<Tmpl>>,
    preset: impl Fn(&'a Preset) -> &'a Vec<Tmpl>,
) -> &'a [Tmpl] {
    layers
        .iter()
        .find_map(|k| {
            own(k)
                .as_deref()
                .or_else(|| k.preset.as_deref().map(|p| preset(p).as_slice()))
        })
        .unwrap_or_default()
}

/// The preset that supplies the command also supplies how it is run; a command of the
/// loop's own takes nothing from any preset.
fn runner<'a>(layers: &[&'a AgentKeys]) -> Option<&'a Preset> {
    runner_arc(layers).map(|p| &**p)
}

fn runner_arc<'a>(layers: &[&'a AgentKeys]) -> Option<&'a std::sync::Arc<Preset>> {
    layers
        .iter()
        .find_map(|k| {
            if k.command.is_some() {
                Some(None)
            } else {
                k.preset.as_ref().map(Some)
            }
        })
        .flatten()
}
