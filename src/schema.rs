//! JSON Schemas for every file format, generated from the Rust types and checked in under
//! `schemas/`; `loopflow schema NAME` prints exactly the checked-in text.

pub(crate) const NAMES: &[&str] = &["pipeline", "loop", "state", "verdict", "config"];

/// The checked-in schema text, embedded at build time.
pub fn get(name: &str) -> Option<&'static str> {
    Some(match name {
        "pipeline" => include_str!("../schemas/pipeline.schema.json"),
        "loop" => include_str!("../schemas/loop.schema.json"),
        "state" => include_str!("../schemas/state.schema.json"),
        "verdict" => include_str!("../schemas/verdict.schema.json"),
        "config" => include_str!("../schemas/config.schema.json"),
        _ => return None,
    })
}

/// Generates a schema from the types (the drift test compares this to `get`).
#[cfg(test)]
fn generate(name: &str) -> Option<String> {
    let settings = schemars::generate::SchemaSettings::draft07();
    let generator = settings.into_generator();
    let schema = match name {
        "state" => generator.into_root_schema_for::<crate::state::State>(),
        "verdict" => generator.into_root_schema_for::<crate::verdict::Verdict>(),
        "pipeline" => {
            let mut v =
                serde_json::to_value(generator.into_root_schema_for::<files::PipelineFile>())
                    .ok()?;
            add_node_kinds(&mut v);
            let mut s = serde_json::to_string_pretty(&v).ok()?;
            s.push('\n');
            return Some(s);
        }
        "loop" => generator.into_root_schema_for::<files::LoopFile>(),
        "config" => generator.into_root_schema_for::<files::ConfigFile>(),
        _ => return None,
    };
    let mut s = serde_json::to_string_pretty(&schema).ok()?;
    s.push('\n');
    Some(s)
}

/// The node kinds and their own keys come from the registry ([`crate::node::REGISTRY`]),
/// so a new kind needs no second, hand-kept list here.
#[cfg(test)]
fn add_node_kinds(schema: &mut serde_json::Value) {
    use serde_json::{Value, json};
    let defs = &mut schema["definitions"];
    defs["Kind"] = json!({
        "type": "string",
        "enum": crate::node::kind_names(),
    });
    let Some(props) = defs["NodeFile"]["properties"].as_object_mut() else {
        return;
    };
    props.insert("kind".into(), json!({ "$ref": "#/definitions/Kind" }));
    for kind in crate::node::REGISTRY {
        for key in kind.keys() {
            let ty: Value = match key.ty {
                crate::node::KeyType::String => json!({
                    "description": key.about,
                    "type": ["string", "null"],
                }),
                crate::node::KeyType::StringList => json!({
                    "description": key.about,
                    "type": ["array", "null"],
                    "items": { "type": "string" },
                }),
            };
            props.insert(key.name.into(), ty);
        }
    }
}

/// Descriptions of the TOML file formats for schema generation. The checker in
/// `pipeline.rs` / `config.rs` reads the files with spans; these types document them for
/// editors (taplo, Even Better TOML) and must agree with the checker (tested).
pub(crate) mod files {
    use std::collections::BTreeMap;

    use schemars::JsonSchema;
    use serde::Deserialize;

    /// A loopflow pipeline: a DAG of nodes; `needs` lists the nodes that finish first.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct PipelineFile {
        pub name: Option<String>,
        pub description: Option<String>,
        /// Nodes by id.
        pub nodes: BTreeMap<String, NodeFile>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum OnFailure {
        Abort,
        Halt,
        Continue,
    }

    // `kind` and the kinds' own keys are added from the node registry.
    /// One node. Which keys apply depends on `kind`.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct NodeFile {
        pub kind: String,
        pub description: Option<String>,
        /// Nodes that must finish before this one starts.
        pub needs: Option<Vec<String>>,
        /// e.g. "90s", "30m", "1h30m"; on expiry the node's process group gets TERM, then KILL.
        pub timeout: Option<String>,
        /// Re-run a failed node up to this many more times.
        pub retries: Option<u32>,
        pub on_failure: Option<OnFailure>,
        /// A template; the node runs only when it renders to something other than empty, `false` or `0`.
        pub when: Option<String>,
    }

    /// A loop's configuration (`.loopflow/loops/<name>/loop.toml`).
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct LoopFile {
        /// Pipeline file, relative to this file's directory; the built-in tick when absent.
        pub pipeline: Option<String>,
        pub work_source: Option<WorkSourceFile>,
        pub brakes: BrakesFile,
        pub schedule: Option<ScheduleFile>,
        pub harness: Option<HarnessFile>,
        pub roles: Option<BTreeMap<String, RoleFile>>,
        pub blast_radius: Option<BlastRadiusFile>,
        pub worktree: Option<WorktreeFile>,
        pub sandbox: Option<SandboxFile>,
        pub notify: Option<NotifyFile>,
        pub remote: Option<RemoteFile>,
    }

    /// The loop's state of record lives in its repository, on this remote: any runner
    /// ticks it, any clone approves it.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct RemoteFile {
        /// The git remote the loop's state ref and branch live on (default "origin").
        pub name: Option<String>,
        /// How long a runner's lease outlives the tick's longest possible run, e.g. "5m"
        /// (the default).
        pub lease_margin: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum SandboxMode {
        Auto,
        Enforce,
        Off,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum NetworkPolicy {
        Hosts,
        Deny,
        Open,
        /// The old name of `open`.
        Allow,
    }

    /// How spawned processes are confined: what they may read, write, reach and see.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct SandboxFile {
        /// auto: confine where the kernel can (default); enforce: halt rather than run
        /// unconfined; off: no confinement.
        pub mode: Option<SandboxMode>,
        /// Extra paths spawned processes may write (absolute, or under `~/`).
        pub write: Option<Vec<String>>,
        /// Extra paths spawned processes may read (absolute, or under `~/`).
        pub read: Option<Vec<String>>,
        /// More variables of loopflow's environment passed to spawned processes (`NAME`,
        /// `PREFIX*`; `"*"` passes everything).
        pub env: Option<Vec<String>>,
        /// hosts: only the agents' API hosts and `hosts`, through the tick's proxy
        /// (default); deny: no network; open: unconfined.
        pub network: Option<NetworkPolicy>,
        /// More hosts reachable under `network = "hosts"`: `host`, `*.suffix`,
        /// `host:port`.
        pub hosts: Option<Vec<String>>,
    }

    /// Defaults for every loop of a project (`.loopflow/config.toml`); a loop's own
    /// tables win.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct ConfigFile {
        pub notify: Option<NotifyFile>,
        pub telemetry: Option<TelemetryFile>,
    }

    /// Where each tick's OpenTelemetry trace goes when the standard
    /// `OTEL_EXPORTER_OTLP_*` variables do not say; they win where both are set.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct TelemetryFile {
        /// The collector's OTLP/HTTP base URL, e.g. "http://localhost:4318" (traces go to
        /// `<it>/v1/traces`).
        pub otlp_endpoint: Option<String>,
        /// The encoding (default "http/protobuf").
        pub protocol: Option<TelemetryProtocol>,
        /// `service.name` of the traces (default "loopflow"; `OTEL_SERVICE_NAME` wins).
        pub service_name: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    pub(crate) enum TelemetryProtocol {
        #[serde(rename = "http/protobuf")]
        Protobuf,
        #[serde(rename = "http/json")]
        Json,
    }

    /// A command run at every halt, with the event as one JSON object on stdin.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct NotifyFile {
        /// Argv templates (no shell), e.g. ["notify-send", "loopflow: {{loop}} halted"].
        pub command: Vec<String>,
        /// How long the notifier may run (default "30s").
        pub timeout: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum WorkSourceKind {
        Single,
        Backlog,
        Audit,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct WorkSourceFile {
        pub kind: Option<WorkSourceKind>,
        /// backlog: the markdown checklist (default BACKLOG.md, relative to loop.toml); a
        /// template may use `{{cwd}}` (the loop's worktree), `{{project}}`, `{{loop}}`.
        pub file: Option<String>,
        /// audit: argv templates (`{{cwd}}`, `{{project}}`, `{{loop}}`; no shell) whose
        /// output lines, or JSON lines with `id`/`title`, are tasks.
        pub command: Option<Vec<String>>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct BrakesFile {
        /// Required: the loop halts as iterations_exhausted after this many iterations.
        pub max_iterations: u64,
        pub max_budget_usd: Option<f64>,
        pub max_tokens: Option<u64>,
        pub max_seconds: Option<f64>,
        pub score_plateau_window: Option<u64>,
        pub score_plateau_epsilon: Option<f64>,
        /// Never below the hard floor of 16000.
        #[schemars(range(min = 16000))]
        pub min_context_tokens: Option<u64>,
        /// The agent's context window; authoritative over detection.
        pub context_tokens: Option<u64>,
        pub run_phases: Option<Vec<String>>,
        #[schemars(range(min = 0.0, max = 1.0))]
        pub goal_score: Option<f64>,
        pub max_consecutive_aborts: Option<u32>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct ScheduleFile {
        pub interval_seconds: Option<u64>,
    }

    /// An agent preset (`presets/<name>.toml`): the argv that agent's CLI accepts for a
    /// headless run, and where it reports its answer, cost and tokens.
    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "kebab-case")]
    pub(crate) enum PresetName {
        ClaudeCode,
        Opencode,
        Codex,
        Aider,
        Gemini,
        Goose,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(rename_all = "lowercase")]
    pub(crate) enum UsageFormat {
        Json,
        Jsonl,
    }

    /// Where the agent's JSON output holds its answer, cost and tokens (JSON pointers;
    /// `*` matches every key). Overrides the preset's rule key by key.
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct UsageFile {
        /// json: stdout is one JSON document; jsonl: one per line (numbers are summed).
        pub format: Option<UsageFormat>,
        /// The agent's answer text, which verdict parsing reads.
        pub text: Option<String>,
        pub cost_usd: Option<Vec<String>>,
        pub tokens: Option<Vec<String>>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct HarnessFile {
        /// An agent preset; `model_args` and `usage` set next to it override its own. Not with
        /// `command` (that is your own agent: write it without `preset`).
        pub preset: Option<PresetName>,
        /// The agent's argv; each element is a handlebars template, never run through a shell.
        pub command: Option<Vec<String>>,
        /// Appended to the command when a role names a `model`, e.g. ["--model", "{{model}}"].
        pub model_args: Option<Vec<String>>,
        pub usage: Option<UsageFile>,
        pub timeout: Option<String>,
        /// Stop an agent that writes nothing to stdout or stderr for this long, e.g. "5m".
        pub idle_timeout: Option<String>,
        /// How long a node's processes have between TERM and KILL when it times out or
        /// the tick is interrupted, e.g. "10s" (default 5s).
        pub grace: Option<String>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct RoleFile {
        /// The role's prompt template, relative to this file's directory.
        pub prompt: Option<String>,
        /// This role's own agent preset; nothing of `[harness]` applies then.
        pub preset: Option<PresetName>,
        pub command: Option<Vec<String>>,
        pub model_args: Option<Vec<String>>,
        pub usage: Option<UsageFile>,
        pub model: Option<String>,
        pub timeout: Option<String>,
        pub idle_timeout: Option<String>,
        /// Reuse the verdict when task and artifact match an earlier tick (off by default).
        pub cache: Option<bool>,
        /// Rendered instead of `prompt` when prompt plus carried context (bytes/4 tokens)
        /// exceeds `compaction_share` of `brakes.context_tokens`.
        pub compaction_prompt: Option<String>,
        /// Share of `brakes.context_tokens` (0.0 < share <= 1.0; default 0.8).
        pub compaction_share: Option<f64>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct BlastRadiusFile {
        pub allow: Option<Vec<String>>,
        pub deny: Option<Vec<String>>,
    }

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    pub(crate) struct WorktreeFile {
        pub enabled: Option<bool>,
        /// Where the loop's worktree lives (absolute or `~/…`, never inside the
        /// checkout); default `$XDG_STATE_HOME/loopflow/worktrees`.
        pub dir: Option<String>,
    }
}

#[cfg(test)]
mod tests {
    /// The checked-in schemas must match the types. Regenerate with
    /// `LOOPFLOW_BLESS=1 cargo test schema`.
    #[test]
    fn checked_in_schemas_match_the_types() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        let bless = std::env::var_os("LOOPFLOW_BLESS").is_some();
        for name in super::NAMES {
            let generated = super::generate(name).expect("known schema");
            let path = dir.join(format!("{name}.schema.json"));
            if bless {
                std::fs::write(&path, &generated).expect("write schema");
                continue;
            }
            let on_disk = std::fs::read_to_string(&path).expect("read schema");
            assert!(
                on_disk == generated,
                "schemas/{name}.schema.json drifted from the Rust types; run `LOOPFLOW_BLESS=1 cargo test schema` and commit"
            );
        }
    }
}
