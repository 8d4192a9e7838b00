//! Pipeline files: TOML with spans → a validated DAG of nodes. Every problem is collected
//! (syntax, keys, kinds, needs, cycles, verdict sources, templates, commit reachability)
//! so `check` reports all of them at once.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;

use crate::diag::{Code, Diagnostic, Diagnostics, SourceRef, list, suggest};
use crate::graph::{self, Dag};
use crate::node::{self, Broken, NodeSpec};
use crate::template::{self, Tmpl};
use crate::toml_read::{self, Str, Table};

/// The default tick, embedded so a copied binary works on its own.
pub const DEFAULT_TICK: &str = include_str!("../pipelines/tick.toml");
pub const DEFAULT_TICK_NAME: &str = "pipelines/tick.toml (built in)";

/// The most nodes a pipeline may have (far beyond any real tick; bounds the DAG's memory).
pub const MAX_NODES: usize = 20_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    Abort,
    Halt,
    Continue,
}

#[derive(Debug)]
pub struct Node {
    pub id: Str,
    pub kind: &'static str,
    pub kind_span: Range<usize>,
    pub needs: Vec<Str>,
    pub timeout: Option<Duration>,
    pub retries: u32,
    pub on_failure: OnFailure,
    pub when: Option<Tmpl>,
    pub spec: Box<dyn NodeSpec>,
}

#[derive(Debug)]
pub struct Pipeline {
    pub source: SourceRef,
    pub name: String,
    pub description: Option<String>,
    pub nodes: Vec<Node>,
    pub index: IndexMap<String, usize>,
    /// `None` when the graph has cycles (the pipeline is then invalid).
    pub dag: Option<Dag>,
    /// Nodes producing `verdict` / running role `implement`, as sets, so "is one
    /// upstream?" is a bitset intersection even in a 10,000-node pipeline.
    verdict_nodes: std::sync::OnceLock<crate::graph::FixedBitSet>,
    implement_nodes: std::sync::OnceLock<crate::graph::FixedBitSet>,
}

/// Parses a duration like `"90s"`, `"30m"`, `"1h30m"` or `"500ms"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let mut total = 0f64;
    let mut rest = t;
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("`{t}` is not a duration"));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("`{t}` is not a duration"))?;
        rest = rest[num_len..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let factor = match unit {
            "ms" => 0.001,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hr" | "hrs" => 3600.0,
            "d" => 86400.0,
            "" => return Err(format!("`{t}` needs a unit (ms, s, m, h or d)")),
            other => return Err(format!("unknown unit `{other}` (use ms, s, m, h or d)")),
        };
        total += n * factor;
        rest = rest[unit_len..].trim_start();
    }
    Ok(Duration::from_secs_f64(total))
}

/// Reads a `timeout`-like key as a duration, reporting a bad one.
pub fn duration_key(t: &Table<'_, '_>, key: &str, diags: &mut Diagnostics) -> Option<Duration> {
    let s = t.str(key, diags)?;
    match parse_duration(&s.value) {
        Ok(d) if !d.is_zero() => Some(d),
        Ok(_) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    s.span,
                    format!("`{key}` must be longer than zero"),
                )
                .label("zero")
                .help("use a duration such as \"90s\", \"30m\" or \"1h30m\""),
            );
            None
        }
        Err(e) => {
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    t.source,
                    s.span,
                    format!("invalid duration for `{key}`: {e}"),
                )
                .label("not a duration")
                .help("use a duration such as \"90s\", \"30m\" or \"1h30m\""),
            );
            None
        }
    }
}

impl Pipeline {
    /// Parses and validates a pipeline. The pipeline is returned whenever the TOML parsed,
    /// even with errors, so callers can keep checking what depends on it.
    pub fn load(source: &SourceRef, diags: &mut Diagnostics) -> Option<Pipeline> {
        let doc = toml_read::parse(source, diags)?;
        let root = Table::new(source, doc.get_ref(), 0..0, "");
        root.deny_unknown(&["name", "description", "nodes"], diags);
        let name = root
            .str("name", diags)
            .map(|s| s.value)
            .unwrap_or_else(|| "pipeline".into());
        let description = root.str("description", diags).map(|s| s.value);
        let mut nodes = Vec::new();
        let mut index = IndexMap::new();
        match root.table("nodes", diags) {
            Some(nt) => {
                for (id, t) in nt.subtables(diags) {
                    let node = parse_node(id, &t, diags);
                    index.insert(node.id.value.clone(), nodes.len());
                    nodes.push(node);
                }
            }
            None if root.get("nodes").is_none() => diags.push(
                Diagnostic::error(Code::MissingKey, source, 0..source.text.find('\n').unwrap_or(0), "the pipeline has no nodes")
                    .label("no `[nodes.<id>]` tables in this file")
                    .help("add nodes such as `[nodes.gate]` with `kind = \"gate\"`, ending in a `commit` node"),
            ),
            None => {}
        }
        let too_many = nodes.len() > MAX_NODES;
        if too_many {
            // The DAG keeps an ancestor bitset per node (n² bits): a hostile 100 000-node
            // file would need over a gigabyte before any other check could run.
            let span = root.key_span("nodes").unwrap_or(0..0);
            diags.push(
                Diagnostic::error(
                    Code::InvalidValue,
                    source,
                    span,
                    format!(
                        "the pipeline has {} nodes; loopflow accepts at most {MAX_NODES}",
                        nodes.len()
                    ),
                )
                .label("too many nodes")
                .help("split the work into several loops, or generate fewer nodes"),
            );
        }
        let mut p = Pipeline {
            source: source.clone(),
            name,
            description,
            nodes,
            index,
            dag: None,
            verdict_nodes: std::sync::OnceLock::new(),
            implement_nodes: std::sync::OnceLock::new(),
        };
        if !too_many {
            p.check_graph(diags);
        }
        Some(p)
    }

    /// Parses a pipeline whose source is trusted to be valid (the embedded default).
    pub fn builtin() -> Pipeline {
        let source = crate::diag::Source::new(DEFAULT_TICK_NAME, DEFAULT_TICK_NAME, DEFAULT_TICK);
        let mut diags = Diagnostics::default();
        match Pipeline::load(&source, &mut diags) {
            Some(p) if !diags.has_errors() => p,
            _ => panic!("the built-in tick pipeline is invalid: {diags:?}"),
        }
    }

    fn check_graph(&mut self, diags: &mut Diagnostics) {
        let src = self.source.clone();
        let mut needs: Vec<Vec<usize>> = Vec::with_capacity(self.nodes.len());
        let ids: Vec<&str> = self.nodes.iter().map(|n| n.id.value.as_str()).collect();
        for node in &self.nodes {
            let mut deps = Vec::new();
            for need in &node.needs {
                match self.index.get(&need.value) {
                    Some(&i) => {
                        if !deps.contains(&i) {
                            deps.push(i);
                        }
                    }
                    None => {
                        let mut d = Diagnostic::error(
                            Code::UnknownNeed,
                            &src,
                            need.span.clone(),
                            format!(
                                "node `{}` needs `{}`, which is not a node of this pipeline",
                                node.id.value, need.value
                            ),
                        )
                        .label("no node has this id");
                        d = match suggest(&need.value, ids.iter().copied()) {
                            Some(s) => {
                                d.help(format!("did you mean `{s}`? Nodes: {}", ids.join(", ")))
                            }
                            None => d.help(format!("name one of the nodes: {}", ids.join(", "))),
                        };
                        diags.push(d);
                    }
                }
            }
            needs.push(deps);
        }
        match graph::build(&needs) {
            Ok(dag) => self.dag = Some(dag),
            Err(cycles) => {
                for cycle in cycles {
                    let names: Vec<&str> = cycle.iter().map(|&i| ids[i]).collect();
                    let first = cycle[0];
                    let closing = cycle[cycle.len() - 1];
                    // Point at the `needs` entry of the first node that names the previous one.
                    let node = &self.nodes[first];
                    let span = node
                        .needs
                        .iter()
                        .find(|n| n.value == ids[closing])
                        .map(|n| n.span.clone())
                        .unwrap_or_else(|| node.id.span.clone());
                    let mut path: Vec<&str> = names.clone();
                    path.push(names[0]);
                    // A long cycle is shown by its ends: the first and last few nodes.
                    let shown = if path.len() > 12 {
                        format!(
                            "{} → … → {} ({} nodes)",
                            path[..6].join(" → "),
                            path[path.len() - 6..].join(" → "),
                            names.len()
                        )
                    } else {
                        path.join(" → ")
                    };
                    let among = if names.len() > 12 {
                        format!("the {} nodes of the cycle", names.len())
                    } else {
                        list(&names)
                    };
                    diags.push(
                        Diagnostic::error(
                            Code::DependencyCycle,
                            &src,
                            span,
                            format!("dependency cycle: {shown}"),
                        )
                        .label(format!(
                            "`{}` waits for `{}`, which waits for it",
                            names[0], ids[closing]
                        ))
                        .help(format!(
                            "a node cannot wait for itself; remove one `needs` entry among {among}"
                        )),
                    );
                }
                return;
            }
        }
        self.check_verdict_sources(diags);
        self.check_node_templates(diags);
        self.check_commit(diags);
    }

    fn check_verdict_sources(&self, diags: &mut Diagnostics) {
        let Some(dag) = &self.dag else { return };
        for (v, node) in self.nodes.iter().enumerate() {
            let Some(from) = node.spec.reads() else {
                continue;
            };
            match self.index.get(&from.value) {
                None => diags.push(
                    Diagnostic::error(
                        Code::UnknownNeed,
                        &self.source,
                        from.span.clone(),
                        format!("verdict node `{}` reads `{}`, which is not a node", node.id.value, from.value),
                    )
                    .label("no node has this id")
                    .help("set `from` to the harness node that runs the verifier (e.g. \"verify\")"),
                ),
                Some(&u) if !dag.is_ancestor(u, v) => diags.push(
                    Diagnostic::error(
                        Code::VerdictNotUpstream,
                        &self.source,
                        from.span.clone(),
                        format!(
                            "verdict node `{}` reads `{}`, which does not run before it",
                            node.id.value, from.value
                        ),
                    )
                    .label("not upstream of this verdict node")
                    .help(format!(
                        "add `needs = [\"{}\"]` to `[nodes.{}]` so the verifier's output exists when it is parsed",
                        from.value, node.id.value
                    )),
                ),
                Some(_) => {}
            }
        }
    }

    fn check_node_templates(&self, diags: &mut Diagnostics) {
        for (v, node) in self.nodes.iter().enumerate() {
            if let Some(when) = &node.when {
                self.check_template(when, v, TemplatePlace::Node, diags);
            }
            for t in node.spec.templates() {
                self.check_template(t, v, TemplatePlace::Node, diags);
            }
        }
    }

    fn check_commit(&self, diags: &mut Diagnostics) {
        let Some(dag) = &self.dag else { return };
        let commits: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].spec.commits())
            .collect();
        // A node whose kind did not parse might have been the commit: say nothing then.
        let broken_kind = self.nodes.iter().any(|n| n.kind == "?");
        if commits.is_empty() && !self.nodes.is_empty() && !broken_kind {
            let header = self
                .source
                .text
                .find("[nodes")
                .map(|s| s..s + self.source.text[s..].find(']').map_or(6, |e| e + 1))
                .unwrap_or(0..0);
            let last = self
                .dag
                .as_ref()
                .and_then(|d| d.order.last())
                .map_or("…", |&i| self.nodes[i].id.value.as_str());
            diags.push(
                Diagnostic::error(Code::NoCommit, &self.source, header, "the pipeline has no `commit` node, so a tick could never advance the loop")
                    .label("none of the nodes from here on has `kind = \"commit\"`")
                    .help(format!("add `[nodes.commit]` with `kind = \"commit\"` and `needs = [\"{last}\"]` as the pipeline's last node")),
            );
            return;
        }
        // Unreachable warnings after an error (a mistyped `needs`, say) are only echoes
        // of that error: fix it first.
        if diags
            .items
            .iter()
            .any(|d| d.is_error() && Arc::ptr_eq(&d.source, &self.source))
        {
            return;
        }
        for (v, node) in self.nodes.iter().enumerate() {
            let connected = commits
                .iter()
                .any(|&c| c == v || dag.is_ancestor(v, c) || dag.is_ancestor(c, v));
            if !connected {
                diags.push(
                    Diagnostic::warning(
                        Code::UnreachableNode,
                        &self.source,
                        node.id.span.clone(),
                        format!("node `{}` is not connected to any `commit` node", node.id.value),
                    )
                    .label("no path leads from here to a commit, or from a commit to here")
                    .help(format!(
                        "add `needs = [\"{}\"]` to a node on the way to `commit`, or remove the node",
                        node.id.value
                    )),
                );
            }
        }
    }

    /// Checks one template used at node `v`: syntax, helpers, and every variable against
    /// what exists at that point of the DAG.
    pub fn check_template(
        &self,
        t: &Tmpl,
        v: usize,
        place: TemplatePlace,
        diags: &mut Diagnostics,
    ) {
        for (name, range) in template::legacy_placeholders(&t.text) {
            // Prose and code samples in a prompt use braces too: there, only a known
            // variable name in single braces is the old syntax.
            let known = ALWAYS.contains(&name.as_str())
                || HARNESS_ONLY.contains(&name.as_str())
                || matches!(name.as_str(), "artifact" | "verdict");
            if place == TemplatePlace::Prompt && !known {
                continue;
            }
            diags.push(
                Diagnostic::warning(
                    Code::LegacyPlaceholder,
                    &t.source,
                    t.span_of(range),
                    format!("`{{{name}}}` is the predecessor's placeholder syntax and is passed through literally"),
                )
                .label("single braces")
                .help(format!("write `{{{{{name}}}}}` to substitute the variable")),
            );
        }
        let usages = match template::scan(&t.text) {
            Ok(u) => u,
            Err(e) => {
                diags.push(
                    Diagnostic::error(Code::TemplateSyntax, &t.source, t.span_of(e.range), format!("invalid template: {}", e.message))
                        .label("here")
                        .help(format!(
                            "templates are handlebars: `{{{{name}}}}`, `{{{{#if x}}}}…{{{{/if}}}}`; helpers: {}",
                            template::HELPERS.join(", ")
                        )),
                );
                return;
            }
        };
        for u in usages {
            if let Some(d) = self.check_usage(&u, v, place, t) {
                diags.push(d);
            }
        }
    }

    /// The variables a template at node `v` can use, for `help:` lines.
    pub fn available(&self, v: usize, place: TemplatePlace) -> Vec<String> {
        // A node deep in a big pipeline has thousands of upstream nodes: name the nearest
        // ones and count the rest.
        const SHOWN_NODES: usize = 12;
        let node = &self.nodes[v];
        let mut out: Vec<String> = ALWAYS.iter().map(|s| s.to_string()).collect();
        if node.spec.spawns() || place == TemplatePlace::Prompt {
            out.extend(HARNESS_ONLY.iter().map(|s| s.to_string()));
        }
        if let Some(dag) = &self.dag {
            if self.implement_upstream(v) {
                out.push("artifact".into());
            }
            if self.verdict_upstream(v) {
                out.push("verdict".into());
            }
            let total = dag.ancestors[v].count_ones(..);
            // Ancestors come before `v` in topological order: walk back from it.
            let pos = dag.order.iter().position(|&u| u == v).unwrap_or(0);
            let mut near: Vec<usize> = dag.order[..pos]
                .iter()
                .rev()
                .copied()
                .filter(|&u| dag.is_ancestor(u, v))
                .take(SHOWN_NODES)
                .collect();
            near.reverse();
            if total > near.len() {
                out.push(format!("… {} more upstream nodes", total - near.len()));
            }
            out.extend(
                near.iter()
                    .map(|&u| format!("nodes.{}.*", self.nodes[u].id.value)),
            );
        }
        out
    }

    fn node_set(&self, pred: impl Fn(&Node) -> bool) -> crate::graph::FixedBitSet {
        let mut set = crate::graph::FixedBitSet::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            set.set(i, pred(n));
        }
        set
    }

    /// Whether a verdict node runs before node `v`.
    fn verdict_upstream(&self, v: usize) -> bool {
        let set = self
            .verdict_nodes
            .get_or_init(|| self.node_set(|n| n.spec.produces_verdict()));
        self.dag
            .as_ref()
            .is_some_and(|dag| !dag.ancestors[v].is_disjoint(set))
    }

    /// Whether a harness node with role `implement` runs before node `v`.
    fn implement_upstream(&self, v: usize) -> bool {
        let set = self.implement_nodes.get_or_init(|| {
            self.node_set(|n| n.spec.role().is_some_and(|r| r.value == "implement"))
        });
        self.dag
            .as_ref()
            .is_some_and(|dag| !dag.ancestors[v].is_disjoint(set))
    }

    fn check_usage(
        &self,
        u: &crate::template::Usage,
        v: usize,
        place: TemplatePlace,
        t: &Tmpl,
    ) -> Option<Diagnostic> {
        let node = &self.nodes[v];
        let span = t.span_of(u.range.clone());
        let root = u.path.first().map(String::as_str).unwrap_or("");
        // Only error messages need the dotted name; most usages are fine.
        let full = FullPath(&u.path);
        let avail = || {
            let a = self.available(v, place);
            format!("available at node `{}`: {}", node.id.value, a.join(", "))
        };
        let not_yet = |why: String, help: String| {
            Some(
                Diagnostic::error(
                    Code::VariableNotAvailable,
                    &t.source,
                    span.clone(),
                    format!(
                        "`{full}` is not available at node `{}`: {why}",
                        node.id.value
                    ),
                )
                .label("not produced yet here")
                .help(help),
            )
        };
        // Every variable but `nodes` is a plain string or number, or (`reasons`) a list
        // that may be empty: `{{verdict.pass}}` would fail when rendered in strict mode.
        let scalar = ALWAYS.contains(&root)
            || HARNESS_ONLY.contains(&root)
            || matches!(root, "artifact" | "verdict");
        // Checked once the variable is known to exist at this node.
        let field_err = || -> Option<Diagnostic> {
            if !scalar || u.path.len() < 2 {
                return None;
            }
            if root == "reasons" {
                return Some(
                    Diagnostic::error(
                        Code::UnknownVariable,
                        &t.source,
                        span.clone(),
                        format!("`{full}`: `reasons` is a list, empty on the first tick, so an element of it may not exist"),
                    )
                    .label("may not exist")
                    .help("loop over it: `{{#each reasons}}- {{this}}\n{{/each}}`"),
                );
            }
            let what = if root == "verdict" {
                "the verdict as JSON text"
            } else {
                "a single value"
            };
            Some(
                Diagnostic::error(
                    Code::UnknownVariable,
                    &t.source,
                    span.clone(),
                    format!("`{full}`: `{root}` is {what}, with no fields"),
                )
                .label("no such field")
                .help(format!("write `{{{{{root}}}}}`")),
            )
        };
        if ALWAYS.contains(&root) {
            return field_err();
        }
        if root == "prompt_text" && place == TemplatePlace::Prompt {
            return not_yet(
                "a prompt cannot include its own text".into(),
                "use `prompt_text` in the role's command (argv), not in the prompt file".into(),
            );
        }
        if HARNESS_ONLY.contains(&root) {
            if node.spec.spawns() || place == TemplatePlace::Prompt {
                return field_err();
            }
            return not_yet(
                format!("`{root}` is only set for nodes that run a process"),
                avail(),
            );
        }
        let dag = self.dag.as_ref()?;
        match root {
            "artifact" => {
                if self.implement_upstream(v) {
                    return field_err();
                }
                not_yet(
                    "no harness node with role `implement` runs before it".into(),
                    format!(
                        "add the implement node to `needs` (directly or through another node); {}",
                        avail()
                    ),
                )
            }
            "verdict" => {
                if self.verdict_upstream(v) {
                    return field_err();
                }
                let verdict_nodes: Vec<&str> = self
                    .nodes
                    .iter()
                    .filter(|n| n.spec.produces_verdict())
                    .map(|n| n.id.value.as_str())
                    .collect();
                // A verdict node that runs after this one: `needs` would make a cycle.
                let downstream = self
                    .nodes
                    .iter()
                    .enumerate()
                    .find(|(x, n)| n.spec.produces_verdict() && dag.is_ancestor(v, *x));
                if let Some((_, vn)) = downstream {
                    return not_yet(
                        format!("the verdict node `{}` runs after it", vn.id.value),
                        format!(
                            "this tick's verdict does not exist yet at `{}`; the last tick's verdict is in `reasons` and `next_hint`",
                            node.id.value
                        ),
                    );
                }
                let how = match verdict_nodes.first() {
                    Some(vn) => format!(
                        "add `needs = [\"{vn}\"]` (or a node after it) to `[nodes.{}]`",
                        node.id.value
                    ),
                    None => "add a `kind = \"verdict\"` node upstream of this one".to_string(),
                };
                not_yet(
                    "it is set only downstream of a `verdict` node".into(),
                    format!("{how}; {}", avail()),
                )
            }
            "nodes" => {
                let (Some(id), Some(field)) = (u.path.get(1), u.path.get(2)) else {
                    return Some(
                        Diagnostic::error(
                            Code::UnknownVariable,
                            &t.source,
                            span.clone(),
                            format!("`{full}` is incomplete"),
                        )
                        .label("expected nodes.<id>.<field>")
                        .help(format!("write `nodes.<id>.{{{}}}`", NODE_FIELDS.join(","))),
                    );
                };
                let Some(&x) = self.index.get(id) else {
                    let ids: Vec<&str> = self.nodes.iter().map(|n| n.id.value.as_str()).collect();
                    let mut d = Diagnostic::error(
                        Code::UnknownVariable,
                        &t.source,
                        span.clone(),
                        format!("`{full}` names node `{id}`, which does not exist"),
                    )
                    .label("no such node");
                    d = match suggest(id, ids.iter().copied()) {
                        Some(s) => d.help(format!("did you mean `nodes.{s}.{field}`? {}", avail())),
                        None => d.help(avail()),
                    };
                    return Some(d);
                };
                if !NODE_FIELDS.contains(&field.as_str()) || u.path.len() > 3 {
                    return Some(
                        Diagnostic::error(
                            Code::UnknownVariable,
                            &t.source,
                            span.clone(),
                            format!("`{full}` is not a node variable"),
                        )
                        .label("unknown field")
                        .help(format!("a node exposes {}", list(NODE_FIELDS))),
                    );
                }
                if dag.is_ancestor(x, v) {
                    return None;
                }
                if x == v || dag.is_ancestor(v, x) {
                    return not_yet(
                        if x == v {
                            "a node cannot read its own outputs".to_string()
                        } else {
                            format!(
                                "node `{id}` runs after it (it depends on `{}`)",
                                node.id.value
                            )
                        },
                        format!(
                            "use a node that runs before `{}`; {}",
                            node.id.value,
                            avail()
                        ),
                    );
                }
                not_yet(
                    format!("node `{id}` does not run before it"),
                    format!(
                        "add `needs = [\"{id}\"]` to `[nodes.{}]`; {}",
                        node.id.value,
                        avail()
                    ),
                )
            }
            _ => {
                let mut known: Vec<&str> = ALWAYS.to_vec();
                known.extend(HARNESS_ONLY);
                known.extend(["artifact", "verdict", "nodes"]);
                let mut d = Diagnostic::error(
                    Code::UnknownVariable,
                    &t.source,
                    span.clone(),
                    format!("unknown template variable `{full}`"),
                )
                .label("no such variable");
                d = match suggest(root, known.iter().copied()) {
                    Some(s) => d.help(format!("did you mean `{s}`? {}", avail())),
                    None => d.help(avail()),
                };
                Some(d)
            }
        }
    }

    pub fn node(&self, id: &str) -> Option<&Node> {
        self.index.get(id).map(|&i| &self.nodes[i])
    }
}

/// Displays a variable path as `a.b.c` without allocating until a message needs it.
struct FullPath<'a>(&'a [String]);

impl std::fmt::Display for FullPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(seg)?;
        }
        Ok(())
    }
}

/// Where a template is used: a node key or argv, or a role's prompt file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplatePlace {
    Node,
    Prompt,
}

/// Variables set at every node.
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
/// Variables set only where a process runs for a role.
pub const HARNESS_ONLY: &[&str] = &[
    "role",
    "prompt",
    "prompt_text",
    "prompt_source",
    "session_id",
    "model",
];
/// `nodes.<id>.<field>`
pub const NODE_FIELDS: &[&str] = &["stdout_path", "stderr_path", "exit_code", "output"];

fn parse_node(id: Str, t: &Table<'_, '_>, diags: &mut Diagnostics) -> Node {
    let src = t.source;
    let kind = t.str("kind", diags);
    let registered = kind.as_ref().and_then(|k| node::kind(&k.value));
    let mut spec: Option<Box<dyn NodeSpec>> = None;
    match (&kind, registered) {
        (None, _) => {
            if t.get("kind").is_none() {
                // Guess the kind from the keys that are there.
                let example = if t.get("argv").is_some() {
                    "kind = \"command\""
                } else if t.get("from").is_some() {
                    "kind = \"verdict\""
                } else if t.get("message").is_some() {
                    "kind = \"git-commit\""
                } else {
                    "kind = \"harness\""
                };
                t.missing("kind", example, diags);
            }
        }
        (Some(k), None) => {
            let names = node::kind_names();
            let mut d = Diagnostic::error(
                Code::UnknownNodeKind,
                src,
                k.span.clone(),
                format!("node `{}` has unknown kind `{}`", id.value, k.value),
            )
            .label("not a node kind");
            d = match suggest(&k.value, names.iter().copied()) {
                Some(s) => d.help(format!(
                    "did you mean `{s}`? Node kinds: {}",
                    names.join(", ")
                )),
                None => d.help(format!("use one of the node kinds: {}", names.join(", "))),
            };
            diags.push(d);
        }
        (Some(_), Some(k)) => {
            let mut known: Vec<&str> = node::COMMON_KEYS.to_vec();
            known.extend(k.keys());
            t.deny_unknown(&known, diags);
            spec = k.parse(t, diags);
        }
    }
    let needs = t
        .str_list("needs", diags)
        .map(|(v, _)| v)
        .unwrap_or_default();
    let timeout = duration_key(t, "timeout", diags);
    let retries = t
        .uint("retries", diags)
        .map(|(n, span)| {
            if n > 100 {
                diags.push(
                    Diagnostic::error(Code::InvalidValue, src, span, "`retries` is at most 100")
                        .label("too many")
                        .help(
                            "a node that fails 100 times will not succeed on the 101st; lower it",
                        ),
                );
            }
            n.min(100) as u32
        })
        .unwrap_or(0);
    let on_failure = match t.str("on_failure", diags) {
        None => OnFailure::Abort,
        Some(s) => match s.value.as_str() {
            "abort" => OnFailure::Abort,
            "halt" => OnFailure::Halt,
            "continue" => OnFailure::Continue,
            other => {
                diags.push(
                    Diagnostic::error(Code::InvalidValue, src, s.span, format!("`on_failure` cannot be `{other}`"))
                        .label("not a failure policy")
                        .help("use \"abort\" (the default: the tick advances nothing), \"halt\" or \"continue\""),
                );
                OnFailure::Abort
            }
        },
    };
    let when = t
        .str("when", diags)
        .map(|s| Tmpl::literal(src, &s.value, s.span));
    Node {
        kind: registered.map_or("?", |k| k.name()),
        kind_span: kind.map(|k| k.span).unwrap_or_else(|| id.span.clone()),
        id,
        needs,
        timeout,
        retries,
        on_failure,
        when,
        spec: spec.unwrap_or_else(|| Box::new(Broken)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Source;

    fn check(text: &str) -> Diagnostics {
        let src = Source::new("p.toml", "p.toml", text);
        let mut d = Diagnostics::default();
        Pipeline::load(&src, &mut d);
        d
    }

    fn codes(text: &str) -> Vec<&'static str> {
        check(text).items.iter().map(|d| d.code.as_str()).collect()
    }

    #[test]
    fn default_tick_is_clean() {
        let d = check(DEFAULT_TICK);
        assert!(d.items.is_empty(), "{d:?}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("30").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn unknown_need_points_at_the_entry() {
        let text = "[nodes.a]\nkind = \"commit\"\nneeds = [\"nope\"]\n";
        let d = check(text);
        assert_eq!(d.items.len(), 1);
        assert_eq!(d.items[0].code, Code::UnknownNeed);
        assert_eq!(&text[d.items[0].span.clone()], "\"nope\"");
    }

    #[test]
    fn cycle_names_all_nodes() {
        let text = "[nodes.a]\nkind=\"gate\"\nneeds=[\"c\"]\n[nodes.b]\nkind=\"gate\"\nneeds=[\"a\"]\n[nodes.c]\nkind=\"commit\"\nneeds=[\"b\"]\n";
        let d = check(text);
        assert_eq!(d.items.len(), 1);
        assert!(
            d.items[0].message.contains("a → b → c → a"),
            "{}",
            d.items[0].message
        );
    }

    #[test]
    fn verdict_variable_needs_a_verdict_upstream() {
        let text = "[nodes.t]\nkind=\"command\"\nargv=[\"echo\", \"{{verdict}}\"]\n[nodes.c]\nkind=\"commit\"\nneeds=[\"t\"]\n";
        let d = check(text);
        assert_eq!(codes(text), ["variable-not-available"]);
        assert_eq!(&text[d.items[0].span.clone()], "verdict");
    }

    /// The one diagnostic a pipeline yields, with the exact text its span covers.
    fn only(text: &str) -> (Diagnostic, &str) {
        let d = check(text);
        assert_eq!(d.items.len(), 1, "{:#?}", d.items);
        let d = d.items.into_iter().next().expect("one");
        let at = &text[d.span.clone()];
        (d, at)
    }

    const HEAD: &str = "[nodes.t]\nkind=\"command\"\nargv=[\"a\"]\n";

    #[test]
    fn verdict_outside_a_verdict_downstream_points_inside_the_string() {
        let text = format!(
            "{HEAD}[nodes.v]\nkind=\"verdict\"\nfrom=\"t\"\nneeds=[\"t\"]\n\
             [nodes.x]\nkind=\"command\"\nargv=[\"echo\", \"pass={{{{ verdict.pass }}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"v\", \"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::VariableNotAvailable);
        assert_eq!(at, "verdict.pass");
        let start = text.find("verdict.pass").expect("in text");
        assert_eq!(d.span, start..start + "verdict.pass".len());
        let help = d.help.expect("help");
        assert!(help.contains("add `needs = [\"v\"]`"), "{help}");
        assert!(help.contains("available at node `x`"), "{help}");
        assert!(
            help.contains("nodes.t.*") && !help.contains("verdict,"),
            "{help}"
        );
    }

    #[test]
    fn node_outputs_only_from_upstream_nodes() {
        let text = format!(
            "{HEAD}[nodes.y]\nkind=\"command\"\nargv=[\"a\"]\n\
             [nodes.x]\nkind=\"command\"\nargv=[\"show\", \"--code={{{{nodes.y.exit_code}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\", \"y\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::VariableNotAvailable);
        assert_eq!(at, "nodes.y.exit_code");
        assert!(
            d.message.contains("node `y` does not run before it"),
            "{}",
            d.message
        );
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .starts_with("add `needs = [\"y\"]` to `[nodes.x]`")
        );
        // Upstream is fine, through any number of nodes.
        let ok = text.replace("needs=[\"t\"]", "needs=[\"t\", \"y\"]");
        assert!(check(&ok).items.is_empty(), "{:?}", check(&ok).items);
    }

    #[test]
    fn node_outputs_from_downstream_say_so() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"{{{{nodes.c2.output}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c2]\nkind=\"command\"\nargv=[\"a\"]\nneeds=[\"x\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"c2\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(at, "nodes.c2.output");
        assert!(d.message.contains("runs after it"), "{}", d.message);
    }

    #[test]
    fn unknown_variable_suggests_the_nearest() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"--task\", \"{{{{curent_task}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::UnknownVariable);
        assert_eq!(at, "curent_task");
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .starts_with("did you mean `current_task`?"),
            "{:?}",
            d.help
        );
        // A typo in a node id gets the same treatment.
        let text = text.replace("curent_task", "nodes.tt.output");
        let (d, at) = only(&text);
        assert_eq!(at, "nodes.tt.output");
        assert!(
            d.message.contains("names node `tt`, which does not exist"),
            "{}",
            d.message
        );
        // And an unknown field of a real node.
        let text = text.replace("nodes.tt.output", "nodes.t.exitcode");
        let (d, _) = only(&text);
        assert!(
            d.help.as_deref().unwrap_or("").contains("`exit_code`"),
            "{:?}",
            d.help
        );
    }

    #[test]
    fn harness_only_variables_are_not_set_for_commands() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"cat\", \"{{{{prompt}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::VariableNotAvailable, "prompt"));
    }

    #[test]
    fn single_brace_tokens_warn_with_the_fix() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"run\", \"--prompt-file={{prompt}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!(d.code, Code::LegacyPlaceholder);
        assert_eq!(d.severity, crate::diag::Severity::Warning);
        assert_eq!(at, "{prompt}");
        assert_eq!(
            d.help.as_deref(),
            Some("write `{{prompt}}` to substitute the variable")
        );
    }

    #[test]
    fn when_templates_are_checked_with_exact_spans() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"fix\"]\nwhen = \"{{{{not (eq nodes.z.exit_code 0)}}}}\"\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::UnknownVariable, "nodes.z.exit_code"));
        let (line, col) = d.source.line_col(d.span.start);
        assert_eq!((line, col), (7, 19));
    }

    #[test]
    fn escaped_literals_still_point_at_the_variable() {
        // A basic string with an escape: the span is found in the raw literal.
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"say \\\"hi\\\" {{{{nope}}}}\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::UnknownVariable, "nope"));
    }

    #[test]
    fn unclosed_blocks_point_at_the_opening_tag() {
        let text = format!(
            "{HEAD}[nodes.x]\nkind=\"command\"\nargv=[\"a {{{{#if iteration}}}}b\"]\nneeds=[\"t\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::TemplateSyntax, "{{#if iteration}}"));
        assert!(d.message.contains("never closed"), "{}", d.message);
    }

    #[test]
    fn unreachable_warnings_wait_for_errors_to_be_fixed() {
        // `nede` is an unknown key; the echo (`t` unreachable) is not reported.
        let text = format!("{HEAD}[nodes.c]\nkind=\"commit\"\nnede=[\"t\"]\n");
        assert_eq!(codes(&text), ["unknown-key"]);
        let text = format!("{HEAD}[nodes.c]\nkind=\"commit\"\n");
        assert_eq!(codes(&text), ["unreachable-node"]);
    }

    #[test]
    fn prompts_warn_on_single_braces_only_for_known_variables() {
        let p = Pipeline::builtin();
        let v = p.index["implement"];
        let src = Source::new(
            "p.md",
            "p.md",
            "Fix {task} in `fn f() {x}`; then read {prompt}.\n",
        );
        let mut d = Diagnostics::default();
        p.check_template(&Tmpl::file(&src), v, TemplatePlace::Prompt, &mut d);
        assert_eq!(d.items.len(), 1, "{:?}", d.items);
        assert_eq!(&src.text[d.items[0].span.clone()], "{prompt}");
    }

    #[test]
    fn plain_variables_have_no_fields() {
        let text = format!(
            "{HEAD}[nodes.v]\nkind=\"verdict\"\nfrom=\"t\"\nneeds=[\"t\"]\n\
             [nodes.x]\nkind=\"command\"\nargv=[\"a\"]\nwhen=\"{{{{verdict.pass}}}}\"\nneeds=[\"v\"]\n\
             [nodes.c]\nkind=\"commit\"\nneeds=[\"x\"]\n"
        );
        let (d, at) = only(&text);
        assert_eq!((d.code, at), (Code::UnknownVariable, "verdict.pass"));
        assert_eq!(d.help.as_deref(), Some("write `{{verdict}}`"));
        // `reasons` is a list that is empty on the first tick.
        let text = text.replace("verdict.pass", "reasons.0");
        let (d, _) = only(&text);
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .contains("{{#each reasons}}")
        );
    }

    #[test]
    fn missing_commit() {
        assert_eq!(codes("[nodes.g]\nkind=\"gate\"\n"), ["no-commit"]);
    }
}
