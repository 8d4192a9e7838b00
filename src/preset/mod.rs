//! Agent presets: `preset = "claude-code"` in `[harness]` or `[roles.<role>]` expands to
//! what that agent's CLI needs for a headless run — its argv (per role), how the prompt
//! reaches it (stdin, never an argv element a leading `-` or ARG_MAX could break), the
//! environment that keeps it from updating or phoning home, the state directories the
//! sandbox must let it write, and where its output reports its answer, spend, errors
//! and refusals. Each preset is a data file under `presets/`, embedded in the binary and
//! checked against the real CLI in `tests/it/agents.rs`.

pub(crate) mod home;
pub(crate) mod limit;
mod usage;

use indexmap::IndexMap;

pub(crate) use home::StateSpec;
pub(crate) use limit::LimitRule;
pub(crate) use usage::{OutputFormat, UsageRule, extract};

use crate::diag::{Diagnostics, Source, SourceRef};
use crate::template::Tmpl;
use crate::toml_read::{self, Table};

/// Every preset: (name, file text).
pub(crate) const PRESETS: &[(&str, &str)] = &[
    (
        "claude-code",
        include_str!("../../presets/claude-code.toml"),
    ),
    ("opencode", include_str!("../../presets/opencode.toml")),
    ("codex", include_str!("../../presets/codex.toml")),
    ("aider", include_str!("../../presets/aider.toml")),
    ("gemini", include_str!("../../presets/gemini.toml")),
    ("goose", include_str!("../../presets/goose.toml")),
];

pub(crate) fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _)| *n).collect()
}

/// The preset `word` most likely means: a near miss (`claud-code`) or the start of a
/// name (`claude`). For "did you mean" hints.
pub(crate) fn closest(word: &str) -> Option<&'static str> {
    let names = names();
    crate::diag::suggest(word, names.iter().copied()).or_else(|| {
        names
            .iter()
            .copied()
            .find(|n| word.len() >= 3 && n.starts_with(word))
    })
}

/// Where `program` is on `PATH`, if anywhere (a file; a bare name only).
pub(crate) fn find_on_path(program: &str) -> Option<std::path::PathBuf> {
    if program.is_empty() || program.contains('/') {
        return None;
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A preset, parsed from its embedded file.
#[derive(Debug, Clone)]
pub struct Preset {
    pub name: &'static str,
    pub source: SourceRef,
    pub command: Vec<Tmpl>,
    /// Appended to the command when the role names a `model`.
    pub model_args: Vec<Tmpl>,
    /// Appended last, per role (`[roles.verify] args`): permissions differ by role.
    pub role_args: IndexMap<String, Vec<Tmpl>>,
    /// The rendered prompt goes to the agent's stdin.
    pub stdin_prompt: bool,
    /// Environment set for the agent (templates, like the argv): `set_env`.
    pub set_env: Vec<(String, Tmpl)>,
    /// Variables of loopflow's environment the agent sees (its keys and endpoints; a
    /// trailing `*` is a prefix): `env`.
    pub env: Vec<String>,
    /// What it may reach under `network = "hosts"` (its model API).
    pub hosts: Vec<String>,
    /// Where it sends its requests: `$VAR` (its base-URL variable, when set) or a URL,
    /// first that applies (what `doctor` connects to).
    pub endpoint: Vec<String>,
    /// Paths (`~/` is the home directory) it reads but never writes.
    pub sandbox_read: Vec<String>,
    /// Its CLI's state and config directories, the loop's own (`[state]`).
    pub state: StateSpec,
    /// How its CLI reports a provider's usage or rate limit (`[limit]`).
    pub limit: Option<LimitRule>,
    /// How to install the agent (`npm:@anthropic-ai/claude-code@2.1.197`, `pip:…`).
    pub install: Option<String>,
    /// Environment variables holding the agent's credentials (for CI secrets).
    pub secrets: Vec<String>,
    pub usage: UsageRule,
}

impl Preset {
    /// The program the preset runs (`claude`, `codex`, …).
    pub fn program(&self) -> &str {
        self.command.first().map_or("", |t| t.text.as_str())
    }

    /// The command that installs the agent at the version the preset was checked
    /// against (`npm install -g @openai/codex@0.171.0`), when a registry carries it.
    pub fn install_command(&self) -> Option<String> {
        Some(match self.registry()? {
            Registry::Npm(pkg) => format!("npm install -g {pkg}"),
            Registry::Pip(pkg) => format!("pipx install {pkg}"),
        })
    }

    /// Where the preset's `install = "npm:…" | "pip:…"` says the agent is published.
    pub fn registry(&self) -> Option<Registry<'_>> {
        match self.install.as_deref()?.split_once(':')? {
            ("npm", pkg) => Some(Registry::Npm(pkg)),
            ("pip", pkg) => Some(Registry::Pip(pkg)),
            _ => None,
        }
    }
}

/// A package registry that carries an agent, with the pinned package spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry<'a> {
    Npm(&'a str),
    Pip(&'a str),
}

/// Loads a preset by name. The embedded files are tested to be valid; problems in them
/// would be reported against `presets/<name>.toml`. Each is parsed once per process: a
/// `status` of many loops naming one preset read its TOML again for every loop (a third
/// of the command's CPU).
pub(crate) fn load(name: &str, diags: &mut Diagnostics) -> Option<Preset> {
    load_shared(name, diags).map(|p| (*p).clone())
}

/// [`load`], shared rather than copied (a loop's config holds one per agent table).
pub(crate) fn load_shared(name: &str, diags: &mut Diagnostics) -> Option<std::sync::Arc<Preset>> {
    type Cache = std::sync::Mutex<Vec<std::sync::Arc<Preset>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(p) = cache
        .lock()
        .ok()
        .and_then(|c| c.iter().find(|p| p.name == name).cloned())
    {
        return Some(p);
    }
    let mut own = Diagnostics::default();
    let p = parse(name, &mut own).map(std::sync::Arc::new);
    // Only a clean parse is kept: one with problems reports them every time. (Presets
    // carry no `# loopflow: ignore` comments, so a cached one loses none.)
    if own.is_empty()
        && let (Some(p), Ok(mut c)) = (&p, cache.lock())
    {
        c.push(p.clone());
    }
    diags.extend(own);
    p
}

fn parse(name: &str, diags: &mut Diagnostics) -> Option<Preset> {
    let (name, text) = PRESETS.iter().find(|(n, _)| *n == name)?;
    let file = format!("presets/{name}.toml (built in)");
    let source = Source::new(file.clone(), file, *text);
    let doc = toml_read::parse(&source, diags)?;
    let root = Table::new(&source, doc.get_ref(), 0..0, "");
    root.deny_unknown(
        &[
            "command",
            "model_args",
            "stdin",
            "set_env",
            "env",
            "hosts",
            "endpoint",
            "sandbox_read",
            "state",
            "limit",
            "install",
            "secrets",
            "roles",
            "usage",
        ],
        diags,
    );
    let command = root.argv("command", diags)?;
    let model_args = root.templates("model_args", diags).unwrap_or_default();
    let stdin_prompt = root
        .str("stdin", diags)
        .is_some_and(|s| s.value == "prompt");
    let set_env = root
        .table("set_env", diags)
        .map(|t| {
            t.scalars(diags)
                .into_iter()
                .filter_map(|(k, v)| {
                    let text = v.as_str()?.to_string();
                    Some((k.value, Tmpl::builtin(&source, &text)))
                })
                .collect()
        })
        .unwrap_or_default();
    let strings = |key: &str, diags: &mut Diagnostics| -> Vec<String> {
        root.str_list(key, diags)
            .map(|(v, _)| v.into_iter().map(|s| s.value).collect())
            .unwrap_or_default()
    };
    let sandbox_read = strings("sandbox_read", diags);
    let env = strings("env", diags);
    let hosts = strings("hosts", diags);
    let endpoint = strings("endpoint", diags);
    let secrets = strings("secrets", diags);
    let install = root.str("install", diags).map(|s| s.value);
    let mut role_args = IndexMap::new();
    if let Some(rt) = root.table("roles", diags) {
        for (role, t) in rt.subtables(diags) {
            t.deny_unknown(&["args"], diags);
            role_args.insert(role.value, t.templates("args", diags).unwrap_or_default());
        }
    }
    let usage = root
        .table("usage", diags)
        .map(|t| UsageRule::read(&t, diags))
        .unwrap_or_default();
    let state = root
        .table("state", diags)
        .map(|t| StateSpec::read(&t, diags))
        .unwrap_or_default();
    let limit = root
        .table("limit", diags)
        .and_then(|t| LimitRule::read(&t, diags));
    Some(Preset {
        name,
        source: source.clone(),
        command,
        model_args,
        role_args,
        stdin_prompt,
        set_env,
        env,
        hosts,
        endpoint,
        sandbox_read,
        state,
        limit,
        install,
        secrets,
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::usage::resolve;
    use super::*;
    use serde_json::Value;

    #[test]
    fn every_preset_loads_cleanly() {
        for name in names() {
            let mut d = Diagnostics::default();
            let p = load(name, &mut d).unwrap_or_else(|| panic!("{name}: {d:?}"));
            assert!(d.is_empty(), "{name}: {d:?}");
            assert!(!p.command.is_empty(), "{name}");
            // Every preset hands the agent its prompt, one way or the other.
            assert!(
                p.stdin_prompt || p.command.iter().any(|t| t.text.contains("{{prompt")),
                "{name} never passes the prompt"
            );
            assert!(
                p.model_args.iter().any(|t| t.text.contains("{{model}}")),
                "{name} cannot select a model"
            );
            // Its secrets are among what it sees, and it can reach some API host.
            for k in &p.secrets {
                assert!(p.env.contains(k), "{name}: secret {k} is not in its env");
            }
            assert!(!p.hosts.is_empty(), "{name} reaches no host");
            for v in &p.env {
                assert!(crate::config::sandbox::valid_env_name(v), "{name}: env {v}");
            }
            crate::sandbox::proxy::Allow::parse(&p.hosts).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }

    /// What an agent writes is the loop's own: no preset names a directory of the user's
    /// for it, every preset that keeps state moves it, and every seed reads the user's
    /// files only.
    #[test]
    fn agent_state_is_the_loops_own() {
        for name in names() {
            let p = load(name, &mut Diagnostics::default()).expect("preset");
            if name == "aider" {
                assert!(
                    p.state.is_empty(),
                    "aider has no variable that moves its state"
                );
                continue;
            }
            assert!(
                !p.state.dirs.is_empty(),
                "{name} keeps its state in the user's dirs"
            );
            for s in &p.state.seeds {
                assert!(
                    s.text.is_some()
                        || s.to.ends_with('/')
                        || (!s.from.is_empty()
                            && s.from
                                .iter()
                                .all(|f| f.starts_with('$') || f.starts_with("~/"))),
                    "{name}: seed {}",
                    s.to
                );
                let under = p
                    .state
                    .dirs
                    .iter()
                    .any(|(_, d)| s.to.starts_with(&format!("{d}/")));
                assert!(under, "{name}: seed {} is outside its state dirs", s.to);
            }
            // The variables that move its state are set by loopflow, never passed.
            for (var, _) in &p.state.dirs {
                assert!(!p.env.contains(var), "{name} passes {var} from the user");
            }
        }
        for name in ["claude-code", "codex", "opencode", "gemini"] {
            let p = load(name, &mut Diagnostics::default()).expect("preset");
            assert!(
                p.limit.is_some(),
                "{name} does not know its CLI's usage limit"
            );
        }
    }

    #[test]
    fn each_cli_reports_a_limit_its_own_way() {
        let rule = |n: &str| {
            load(n, &mut Diagnostics::default())
                .and_then(|p| p.limit)
                .expect(n)
        };
        let claude = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"API Error: Request rejected (429) · rate limit"}"#;
        assert_eq!(
            rule("claude-code").detect(claude).as_deref(),
            Some("API Error: Request rejected (429) · rate limit")
        );
        assert_eq!(
            rule("claude-code").detect(&claude.replace("429", "500")),
            None
        );
        let codex = concat!(
            r#"{"type":"turn.started"}"#,
            "\n",
            r#"{"type":"error","message":"Reconnecting... 1/5 (exceeded retry limit, last status: 429 Too Many Requests)"}"#,
            "\n"
        );
        assert!(rule("codex").detect(codex).is_some());
        let codex5xx = codex.replace("429 Too Many Requests", "500 Internal Server Error");
        assert_eq!(rule("codex").detect(&codex5xx), None);
        let gemini = concat!(
            "YOLO mode\nError: x\n  at y {\n}\n",
            r#"{"error": {"type": "Error", "message": "Suggested retry after 3600s.", "code": 429}}"#
        );
        assert_eq!(
            rule("gemini").detect(gemini).as_deref(),
            Some("Suggested retry after 3600s.")
        );
        let oc = r#"timestamp=x level=ERROR message="stream error" providerID=fake error.error="AI_APICallError: Rate limit reached. Please try again in 3600s."
"#;
        assert_eq!(
            rule("opencode").detect(oc).as_deref(),
            Some("AI_APICallError: Rate limit reached. Please try again in 3600s.")
        );
    }

    #[test]
    fn claude_code_json_result() {
        let mut d = Diagnostics::default();
        let p = load("claude-code", &mut d).expect("preset");
        let out = r#"{"type":"result","subtype":"success","is_error":false,
            "result":"done\n```json\n{\"pass\":true,\"score\":0.9}\n```",
            "total_cost_usd":0.0123,"usage":{"input_tokens":1000,"output_tokens":234}}"#;
        let u = extract(&p.usage, out);
        assert_eq!(u.cost_usd, Some(0.0123));
        assert_eq!(u.tokens, Some(1234));
        assert!(u.text.expect("text").contains("\"pass\":true"));
    }

    #[test]
    fn event_streams_add_up_and_keep_the_last_answer() {
        let mut d = Diagnostics::default();
        let p = load("opencode", &mut d).expect("preset");
        let out = concat!(
            "{\"type\":\"text\",\"part\":{\"type\":\"text\",\"text\":\"thinking\"}}\n",
            "{\"type\":\"step_finish\",\"part\":{\"cost\":0.01,\"tokens\":{\"input\":100,\"output\":10}}}\n",
            "not json at all\n",
            "{\"type\":\"text\",\"part\":{\"type\":\"text\",\"text\":\"final answer\"}}\n",
            "{\"type\":\"step_finish\",\"part\":{\"cost\":0.02,\"tokens\":{\"input\":200,\"output\":20}}}\n",
        );
        let u = extract(&p.usage, out);
        assert_eq!(u.text.as_deref(), Some("final answer"));
        assert_eq!(u.tokens, Some(330));
        assert!((u.cost_usd.expect("cost") - 0.03).abs() < 1e-9);
    }

    #[test]
    fn wildcards_sum_over_models() {
        let mut d = Diagnostics::default();
        let p = load("gemini", &mut d).expect("preset");
        let out = r#"{"response":"ok","stats":{"models":{
            "gemini-2.5-pro":{"tokens":{"total":300}},
            "gemini-2.5-flash":{"tokens":{"total":45}}}}}"#;
        let u = extract(&p.usage, out);
        assert_eq!(
            (u.text.as_deref(), u.tokens, u.cost_usd),
            (Some("ok"), Some(345), None)
        );
    }

    #[test]
    fn pointers_follow_rfc_6901_and_fan_out_on_star() {
        let v: Value = serde_json::json!({
            "a/b": {"~k": 1},
            "m": {"x": {"n": 2}, "y": {"n": 3}},
            "l": [{"n": 4}, {"n": 5}],
            "s*t": 6
        });
        let nums =
            |p: &str| -> Vec<i64> { resolve(&v, p).iter().filter_map(|x| x.as_i64()).collect() };
        assert_eq!(nums("/a~1b/~0k"), [1]);
        assert_eq!(nums("/m/*/n"), [2, 3]);
        assert_eq!(nums("/l/*/n"), [4, 5]);
        assert_eq!(nums("/l/1/n"), [5]);
        assert_eq!(nums("/s*t"), [6]);
        assert_eq!(nums("/*/n"), Vec::<i64>::new());
        assert!(nums("/missing/*").is_empty());
    }

    #[test]
    fn plain_text_output_yields_nothing() {
        let mut d = Diagnostics::default();
        let p = load("claude-code", &mut d).expect("preset");
        assert_eq!(extract(&p.usage, "just words\n"), usage::Usage::default());
        let p = load("aider", &mut d).expect("preset");
        assert!(p.usage.is_empty());
    }

    #[test]
    fn overrides_are_key_by_key() {
        let base = UsageRule {
            format: Some(OutputFormat::Json),
            text: Some("/result".into()),
            cost_usd: Some(vec!["/cost".into()]),
            tokens: Some(vec!["/t".into()]),
            ..Default::default()
        };
        let over = UsageRule {
            cost_usd: Some(vec!["/my/cost".into()]),
            ..Default::default()
        };
        let merged = over.over(&base);
        assert_eq!(merged.cost_usd, Some(vec!["/my/cost".to_string()]));
        assert_eq!(merged.text.as_deref(), Some("/result"));
        assert_eq!(merged.format, Some(OutputFormat::Json));
    }
}

#[cfg(test)]
mod schema_tests {
    /// `schemas/loop.schema.json` offers exactly the presets that exist, for completion.
    #[test]
    fn the_loop_schema_lists_every_preset() {
        let schema: serde_json::Value =
            serde_json::from_str(crate::schema::get("loop").expect("schema")).expect("JSON");
        let listed: Vec<&str> = schema["definitions"]["PresetName"]["enum"]
            .as_array()
            .expect("PresetName enum")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        let mut names = super::names();
        let mut listed = listed;
        names.sort_unstable();
        listed.sort_unstable();
        assert_eq!(listed, names);
    }
}
