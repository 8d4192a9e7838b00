//! The agent a role runs: `[harness]` and `[roles.<role>]` keys (`preset`, `command`,
//! `model_args`, `usage`), layered over the shipped presets.

use crate::diag::{Code, Diagnostic, Diagnostics};
use crate::preset::{Preset, UsageRule};
use crate::template::Tmpl;
use crate::toml_read::Table;

/// The agent a loop runs when it names none (no `preset`, no `command`): the shipped
/// templates' default, OpenCode, the seed's primary harness.
pub const DEFAULT_PRESET: &str = "opencode";

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
    pub env: Vec<(String, Tmpl)>,
    /// The agent's state directories (`~/` expanded), writable in the sandbox.
    pub sandbox_write: Vec<std::path::PathBuf>,
    pub usage: UsageRule,
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
    let names_agent = |k: &AgentKeys| k.preset.is_some() || k.command.is_some();
    let standalone = own.is_some_and(names_agent);
    let mut layers: Vec<&AgentKeys> = own.into_iter().collect();
    if !standalone {
        layers.push(harness);
    }
    if !layers.iter().any(|k| names_agent(k)) {
        // Parsed on first use only: a loop that names its agent never pays for it.
        layers.push(default());
    }
    // A layer's own key, else its preset's (read in place: copying the whole preset to
    // read one key was a sixth of `report`'s CPU).
    let pick = |own: &dyn Fn(&AgentKeys) -> Option<Vec<Tmpl>>,
                preset: &dyn Fn(&Preset) -> Vec<Tmpl>| {
        layers
            .iter()
            .find_map(|k| own(k).or_else(|| k.preset.as_deref().map(preset)))
    };
    let command = pick(&|k| k.command.clone(), &|p| p.command.clone()).unwrap_or_default();
    let model_args = pick(&|k| k.model_args.clone(), &|p| p.model_args.clone()).unwrap_or_default();
    let mut usage = UsageRule::default();
    for k in &layers {
        usage = usage.over(&k.usage);
        if let Some(p) = &k.preset {
            usage = usage.over(&p.usage);
        }
    }
    // The preset that supplies the command also supplies how it is run; a command of the
    // loop's own takes nothing from any preset.
    let runs = layers.iter().find_map(|k| {
        if k.command.is_some() {
            Some(None)
        } else {
            k.preset.as_ref().map(Some)
        }
    });
    let preset = runs.flatten();
    Agent {
        preset: preset.map(|p| p.name),
        command,
        model_args,
        role_args: preset
            .and_then(|p| p.role_args.get(role).cloned())
            .unwrap_or_default(),
        stdin_prompt: preset.is_some_and(|p| p.stdin_prompt),
        env: preset.map(|p| p.env.clone()).unwrap_or_default(),
        sandbox_write: preset
            .map(|p| {
                p.sandbox_write
                    .iter()
                    .map(|s| super::sandbox::expand_home(s))
                    .collect()
            })
            .unwrap_or_default(),
        usage,
    }
}
