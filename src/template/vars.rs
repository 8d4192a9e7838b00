//! The template-variable contract (DESIGN §5), in one place: every name a template may
//! use, where in the DAG it exists, and how its value is built. The tick renders with the
//! maps built here and `check` decides what exists at a node from the same tables, so what
//! `check` accepts is what a tick sets (a unit test holds the two together).

use serde_json::{Map, Value, json};

/// Where a variable exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// At every node, in every template.
    Always,
    /// Where a process runs for a role (harness nodes), and in role prompts.
    Role,
    /// In a harness node's argv only (a prompt cannot contain its own text).
    RoleArgv,
    /// Downstream of a harness node whose role is `implement`.
    AfterImplement,
    /// Downstream of a `verdict` node.
    AfterVerdict,
    /// `nodes.<id>.<field>`, for nodes upstream of this one.
    Nodes,
}

/// Variables set at every node. `reasons` is a list (empty on the first tick); the
/// others are single values.
pub const ALWAYS: &[&str] = &[
    "loop",
    "project",
    "iteration",
    "cwd",
    "current_task",
    "task_title",
    "current_phase",
    "node",
    "output",
    "reasons",
    "next_hint",
];

/// Variables set where a process runs for a role. `prompt_text` is argv-only.
pub(crate) const ROLE: &[&str] = &[
    "role",
    "prompt",
    "prompt_text",
    "prompt_source",
    "session_id",
    "model",
];

/// `nodes.<id>.<field>`.
pub const NODE_FIELDS: &[&str] = &["stdout_path", "stderr_path", "exit_code", "output"];

/// What a work source's templates (backlog path, audit argv) may use: the gate renders
/// them before any node runs.
pub const SOURCE: &[&str] = &["loop", "project", "cwd"];

/// Where `name` (the first segment of a variable path) exists; `None` for an unknown name.
pub(crate) fn scope(name: &str) -> Option<Scope> {
    if ALWAYS.contains(&name) {
        Some(Scope::Always)
    } else if name == "prompt_text" {
        Some(Scope::RoleArgv)
    } else if ROLE.contains(&name) {
        Some(Scope::Role)
    } else {
        match name {
            "artifact" => Some(Scope::AfterImplement),
            "verdict" => Some(Scope::AfterVerdict),
            "nodes" => Some(Scope::Nodes),
            _ => None,
        }
    }
}

/// Every top-level name, for suggestions.
pub fn names() -> impl Iterator<Item = &'static str> {
    ALWAYS
        .iter()
        .chain(ROLE)
        .copied()
        .chain(["artifact", "verdict", "nodes"])
}

/// Whether `name` is a single value (or, for `reasons`, a list): no `.field` below it.
pub(crate) fn is_leaf(name: &str) -> bool {
    !matches!(scope(name), None | Some(Scope::Nodes))
}

/// The values every node of a tick shares.
#[derive(Debug, Clone)]
pub(crate) struct Tick<'a> {
    pub loop_name: &'a str,
    pub project: &'a str,
    pub iteration: u64,
    pub cwd: &'a str,
    pub current_task: &'a str,
    pub task_title: &'a str,
    pub current_phase: &'a str,
    /// The last verdict's reasons and next hint (empty on the first tick).
    pub reasons: &'a [String],
    pub next_hint: &'a str,
}

/// The [`Scope::Always`] variables but `node` and `output`, which [`at_node`] adds.
pub(crate) fn tick(t: &Tick<'_>) -> Map<String, Value> {
    let mut m = Map::with_capacity(ALWAYS.len() + 4);
    m.insert("loop".into(), json!(t.loop_name));
    m.insert("project".into(), json!(t.project));
    m.insert("iteration".into(), json!(t.iteration));
    m.insert("cwd".into(), json!(t.cwd));
    m.insert("current_task".into(), json!(t.current_task));
    m.insert("task_title".into(), json!(t.task_title));
    m.insert("current_phase".into(), json!(t.current_phase));
    m.insert("reasons".into(), json!(t.reasons));
    m.insert("next_hint".into(), json!(t.next_hint));
    m
}

/// One upstream node's outputs, as `nodes.<id>.*`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Upstream<'a> {
    pub stdout_path: &'a str,
    pub stderr_path: &'a str,
    pub exit_code: Option<i32>,
    pub output: &'a str,
}

/// Adds what is specific to one node: its id, its `{{output}}` path, the outputs of the
/// nodes upstream of it, and `artifact` / `verdict` when their producers ran before it.
pub(crate) fn at_node(
    vars: &mut Map<String, Value>,
    node: &str,
    output: &str,
    upstream: &[(&str, Upstream<'_>)],
    artifact: Option<&str>,
    verdict: Option<&str>,
) {
    vars.insert("node".into(), json!(node));
    vars.insert("output".into(), json!(output));
    let nodes: Map<String, Value> = upstream
        .iter()
        .map(|(id, u)| {
            (
                (*id).to_string(),
                json!({
                    "stdout_path": u.stdout_path,
                    "stderr_path": u.stderr_path,
                    "exit_code": u.exit_code,
                    "output": u.output,
                }),
            )
        })
        .collect();
    vars.insert("nodes".into(), Value::Object(nodes));
    if let Some(a) = artifact {
        vars.insert("artifact".into(), json!(a));
    }
    if let Some(v) = verdict {
        vars.insert("verdict".into(), json!(v));
    }
}

/// The role's variables, for a harness node's prompt and argv.
#[derive(Debug, Clone)]
pub(crate) struct Role<'a> {
    pub role: &'a str,
    pub model: &'a str,
    pub session_id: &'a str,
    /// The rendered prompt file.
    pub prompt: &'a str,
    /// The prompt template it was rendered from.
    pub prompt_source: &'a str,
}

/// Adds the [`Scope::Role`] variables (but `prompt_text`: see [`prompt_text`]).
pub(crate) fn role(vars: &mut Map<String, Value>, r: &Role<'_>) {
    vars.insert("role".into(), json!(r.role));
    vars.insert("model".into(), json!(r.model));
    vars.insert("session_id".into(), json!(r.session_id));
    vars.insert("prompt".into(), json!(r.prompt));
    vars.insert("prompt_source".into(), json!(r.prompt_source));
}

/// Adds `prompt_text`, once the prompt is rendered (for the argv only).
pub(crate) fn prompt_text(vars: &mut Map<String, Value>, text: &str) {
    vars.insert("prompt_text".into(), json!(text));
}

/// The variables of a work source's templates.
pub(crate) fn source(loop_name: &str, project: &str, cwd: &str) -> Value {
    json!({ "loop": loop_name, "project": project, "cwd": cwd })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the builders set is exactly what the tables name: `check` and the tick agree.
    #[test]
    fn builders_set_exactly_the_names_the_contract_lists() {
        let reasons = vec!["r".to_string()];
        let mut m = tick(&Tick {
            loop_name: "l",
            project: "/p",
            iteration: 1,
            cwd: "/w",
            current_task: "t",
            task_title: "t",
            current_phase: "implement",
            reasons: &reasons,
            next_hint: "",
        });
        let up = Upstream {
            exit_code: Some(0),
            ..Default::default()
        };
        at_node(&mut m, "n", "/o", &[("u", up)], Some("/a"), Some("{}"));
        role(
            &mut m,
            &Role {
                role: "verify",
                model: "",
                session_id: "s",
                prompt: "/p.md",
                prompt_source: "/src.md",
            },
        );
        prompt_text(&mut m, "text");
        let mut set: Vec<&str> = m.keys().map(String::as_str).collect();
        let mut listed: Vec<&str> = names().collect();
        set.sort_unstable();
        listed.sort_unstable();
        assert_eq!(set, listed);
        let fields: Vec<&str> = m["nodes"]["u"]
            .as_object()
            .expect("node")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(fields, NODE_FIELDS);
        let src = source("l", "/p", "/w");
        let keys: Vec<&str> = src
            .as_object()
            .expect("obj")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, SOURCE);
        for n in names() {
            assert!(scope(n).is_some(), "{n}");
        }
    }
}
