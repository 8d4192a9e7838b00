//! Reading a pipeline file into a [`Draft`] (every node parsed, every key checked), and
//! validating the draft into a [`Pipeline`]: `needs` resolved, cycles reported, the DAG
//! built, then the checks that need it.

use indexmap::IndexMap;

use super::graph::{self, Dag};
use super::{MAX_NODES, Node, OnFailure, Pipeline};
use crate::diag::{Code, Diagnostic, Diagnostics, SourceRef, list, suggest};
use crate::node::{self, Broken, NodeSpec};
use crate::template::Tmpl;
use crate::toml_read::{self, Str, Table};

/// A pipeline as written: its nodes, not yet known to form a DAG.
#[derive(Debug)]
pub(crate) struct Draft {
    pub source: SourceRef,
    pub name: String,
    pub description: Option<String>,
    pub nodes: Vec<Node>,
    pub index: IndexMap<String, usize>,
    /// The file has more than [`MAX_NODES`] nodes: none of them was read.
    pub too_many: bool,
}

impl Draft {
    /// Parses a pipeline file, pushing every problem into `diags`. A file with syntax
    /// errors is read as far as it parses (what it holds is still checked); callers look
    /// at the diagnostics before running anything.
    pub(crate) fn parse(source: &SourceRef, diags: &mut Diagnostics) -> Draft {
        let (doc, _) = toml_read::parse_partial(source, diags);
        let root = Table::new(source, doc.get_ref(), 0..0, "");
        root.deny_unknown(&["name", "description", "nodes"], diags);
        let name = root
            .str("name", diags)
            .map(|s| s.value)
            .unwrap_or_else(|| "pipeline".into());
        let description = root.str("description", diags).map(|s| s.value);
        let mut nodes = Vec::new();
        let mut index = IndexMap::new();
        let mut too_many = false;
        match root.table("nodes", diags) {
            Some(nt) if nt.table.len() > MAX_NODES => {
                // Every step of `check` and of a tick is linear in nodes, but a file must
                // still end somewhere: nothing of a bigger one is read further (a tick of
                // it would not run anyway), so a hostile file costs its parse and no more.
                too_many = true;
                let span = root.key_span("nodes").unwrap_or(0..0);
                diags.push(
                    Diagnostic::error(
                        Code::TooManyNodes,
                        source,
                        span,
                        format!(
                            "the pipeline has {} nodes; loopflow accepts at most {MAX_NODES}",
                            nt.table.len()
                        ),
                    )
                    .label("too many nodes")
                    .help("split the work into several pipelines or loops, or generate fewer nodes"),
                );
            }
            Some(nt) => {
                let tables = nt.subtables(diags);
                for (id, t) in tables {
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
        Draft {
            source: source.clone(),
            name,
            description,
            nodes,
            index,
            too_many,
        }
    }

    /// Builds the DAG and runs every check that needs it. `Err` gives the draft back when
    /// there is no DAG (a cycle, too many nodes), so what depends on the nodes alone (a
    /// loop's roles and prompts) can still be checked.
    pub(crate) fn validate(self, diags: &mut Diagnostics) -> Result<Pipeline, Box<Draft>> {
        if self.too_many {
            return Err(Box::new(self));
        }
        let Some(dag) = self.graph(diags) else {
            super::check::names_only(&self, diags);
            return Err(Box::new(self));
        };
        let p = Pipeline {
            source: self.source,
            name: self.name,
            description: self.description,
            nodes: self.nodes,
            index: self.index,
            dag,
        };
        super::check::pipeline(&p, diags);
        Ok(p)
    }

    /// Resolves `needs` and builds the DAG; `None` when the graph has cycles.
    fn graph(&self, diags: &mut Diagnostics) -> Option<Dag> {
        let src = self.source.clone();
        let mut needs: Vec<Vec<usize>> = Vec::with_capacity(self.nodes.len());
        let ids: Vec<&str> = self.nodes.iter().map(|n| n.id.value.as_str()).collect();
        for node in &self.nodes {
            let mut deps = Vec::new();
            for need in &node.needs {
                match self.index.get(&need.value) {
                    Some(&i) => deps.push(i),
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
            // O(k log k) per node: a fan-in of 10,000 needs stays linear-ish.
            deps.sort_unstable();
            deps.dedup();
            needs.push(deps);
        }
        match graph::build(&needs) {
            Ok(dag) => Some(dag),
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
                None
            }
        }
    }
}

fn parse_node(id: Str, t: &Table<'_, '_>, diags: &mut Diagnostics) -> Node {
    let src = t.source;
    let kind = t.str("kind", diags);
    let registered = kind.as_ref().and_then(|k| node::kind(&k.value));
    let mut spec: Option<Box<dyn NodeSpec>> = None;
    match (&kind, registered) {
        (None, _) => {
            // `knd = "gate"`: say that, rather than that `kind` is missing.
            let misspelt = t
                .table
                .iter()
                .find(|(k, _)| suggest(k.get_ref(), ["kind"]).is_some());
            if let Some((k, _)) = misspelt.filter(|_| t.get("kind").is_none()) {
                diags.push(
                    Diagnostic::error(
                        Code::UnknownKey,
                        src,
                        k.span(),
                        format!("unknown key `{}.{}`", t.path, k.get_ref()),
                    )
                    .label("not a key loopflow knows here")
                    .help("did you mean `kind`? Every node needs one"),
                );
            } else if t.get("kind").is_none() {
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
            known.extend(k.keys().iter().map(|k| k.name));
            t.deny_unknown(&known, diags);
            spec = k.parse(t, diags);
        }
    }
    let needs = t
        .str_list("needs", diags)
        .map(|(v, _)| v)
        .unwrap_or_default();
    let timeout = t.duration("timeout", diags);
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
