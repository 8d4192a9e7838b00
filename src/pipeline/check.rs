//! The checks that read a pipeline's nodes together: verdict sources, commit
//! reachability, and every template (a node's `when` and argv, a loop's argv and prompts)
//! against what exists at its node of the DAG ([`crate::template::vars`] says what that is).
//! Without a DAG (a cycle) the checks that need one are skipped and the rest still run.
//!
//! Cost, for n nodes, e `needs` entries and t template usages: O(n + e + t) for a valid
//! pipeline. "Is X upstream of v" for `nodes.X.*` is a binary search when X is a direct
//! need, else a bounded search back from v ([`Dag::is_ancestor`]); "is any verdict
//! (implement) node upstream of v" is one lookup in a set made by one O(n + e) pass; the
//! commit reachability of every node is two such passes. Only diagnostics cost more: a
//! help line listing what is available at a node walks that node's upstream, O(n + e),
//! once per node with an error.

use std::sync::{Arc, OnceLock};

use indexmap::IndexMap;

use super::graph::{Dag, FixedBitSet};
use super::{Draft, Node, Pipeline};
use crate::diag::{Code, Diagnostic, Diagnostics, SourceRef, list, suggest};
use crate::template::vars::{self, Scope};
use crate::template::{self, Tmpl};

/// Where a template is used: a node key or argv, or a role's prompt file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplatePlace {
    Node,
    Prompt,
}

/// A pipeline's nodes as the checks see them: with its DAG once it is known to have one.
pub struct View<'a> {
    source: &'a SourceRef,
    nodes: &'a [Node],
    index: &'a IndexMap<String, usize>,
    dag: Option<&'a Dag>,
    /// The nodes downstream of a node producing `verdict` / running role `implement`,
    /// made once (one pass each), so "is one upstream?" is a lookup.
    after_verdict: OnceLock<FixedBitSet>,
    after_implement: OnceLock<FixedBitSet>,
    /// What [`View::available`] said per (node, place): several usages at one node share it.
    available: std::sync::Mutex<std::collections::HashMap<(usize, bool), Vec<String>>>,
}

impl Pipeline {
    pub fn view(&self) -> View<'_> {
        View::new(&self.source, &self.nodes, &self.index, Some(&self.dag))
    }
}

impl Draft {
    pub(crate) fn view(&self) -> View<'_> {
        View::new(&self.source, &self.nodes, &self.index, None)
    }
}

/// Every check of a pipeline whose DAG exists.
pub(super) fn pipeline(p: &Pipeline, diags: &mut Diagnostics) {
    let view = p.view();
    view.check_verdict_sources(diags);
    view.check_node_templates(diags);
    view.check_commit(diags);
}

/// What can be checked without a DAG: names (verdict sources, template variables).
pub(super) fn names_only(d: &Draft, diags: &mut Diagnostics) {
    let view = d.view();
    view.check_verdict_sources(diags);
    view.check_node_templates(diags);
}

impl<'a> View<'a> {
    fn new(
        source: &'a SourceRef,
        nodes: &'a [Node],
        index: &'a IndexMap<String, usize>,
        dag: Option<&'a Dag>,
    ) -> Self {
        View {
            source,
            nodes,
            index,
            dag,
            after_verdict: OnceLock::new(),
            after_implement: OnceLock::new(),
            available: Default::default(),
        }
    }

    pub fn nodes(&self) -> &'a [Node] {
        self.nodes
    }

    pub fn source(&self) -> &'a SourceRef {
        self.source
    }

    fn check_verdict_sources(&self, diags: &mut Diagnostics) {
        for (v, node) in self.nodes.iter().enumerate() {
            let Some(from) = node.spec.reads() else {
                continue;
            };
            match self.index.get(&from.value) {
                None => diags.push(
                    Diagnostic::error(
                        Code::UnknownNeed,
                        self.source,
                        from.span.clone(),
                        format!("verdict node `{}` reads `{}`, which is not a node", node.id.value, from.value),
                    )
                    .label("no node has this id")
                    .help("set `from` to the harness node that runs the verifier (e.g. \"verify\")"),
                ),
                Some(&u) if self.dag.is_some_and(|dag| !dag.is_ancestor(u, v)) => diags.push(
                    Diagnostic::error(
                        Code::VerdictNotUpstream,
                        self.source,
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
        let Some(dag) = self.dag else { return };
        let commits: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| self.nodes[i].spec.commits())
            .collect();
        // A node whose kind did not parse might have been the commit: say nothing then.
        let broken_kind = self.nodes.iter().any(|n| n.kind == "?");
        if commits.is_empty() && !self.nodes.is_empty() && !broken_kind {
            // The first `[nodes…` that begins a line: not one in a comment before it.
            let text = &self.source.text;
            let header = text
                .match_indices("[nodes")
                .map(|(s, _)| s)
                .find(|&s| {
                    text[..s]
                        .rsplit('\n')
                        .next()
                        .is_some_and(|l| l.trim().is_empty())
                })
                .map(|s| s..s + text[s..].find(']').map_or(6, |e| e + 1))
                .unwrap_or(0..0);
            let last = dag
                .order
                .last()
                .map_or("…", |&i| self.nodes[i].id.value.as_str());
            diags.push(
                Diagnostic::error(Code::NoCommit, self.source, header, "the pipeline has no `commit` node, so a tick could never advance the loop")
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
            .any(|d| d.is_error() && Arc::ptr_eq(&d.source, self.source))
        {
            return;
        }
        // Upstream of a commit, or downstream of one: two passes over the DAG.
        let mut commit_set = FixedBitSet::with_capacity(self.nodes.len());
        for &c in &commits {
            commit_set.insert(c);
        }
        let before = dag.upstream_of_any(&commit_set);
        let after = dag.downstream_of_any(&commit_set);
        for (v, node) in self.nodes.iter().enumerate() {
            let connected = commit_set.contains(v) || before.contains(v) || after.contains(v);
            if !connected {
                diags.push(
                    Diagnostic::warning(
                        Code::UnreachableNode,
                        self.source,
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
            let known = vars::is_leaf(&name);
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
        for u in usages.iter() {
            if let Some(d) = self.check_usage(u, v, place, t) {
                diags.push(d);
            }
        }
    }

    /// The variables a template at node `v` can use, for `help:` lines.
    pub fn available(&self, v: usize, place: TemplatePlace) -> Vec<String> {
        let key = (v, place == TemplatePlace::Prompt);
        if let Some(a) = self
            .available
            .lock()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return a;
        }
        let a = self.compute_available(v, place);
        if let Ok(mut m) = self.available.lock() {
            m.insert(key, a.clone());
        }
        a
    }

    /// [`View::available`], computed: O(n + e) for the walk upstream of `v`.
    fn compute_available(&self, v: usize, place: TemplatePlace) -> Vec<String> {
        // A node deep in a big pipeline has thousands of upstream nodes: name the nearest
        // ones and count the rest.
        const SHOWN_NODES: usize = 12;
        let node = &self.nodes[v];
        let mut out: Vec<String> = vars::ALWAYS.iter().map(|s| s.to_string()).collect();
        if node.spec.spawns() || place == TemplatePlace::Prompt {
            out.extend(vars::ROLE.iter().map(|s| s.to_string()));
        }
        if let Some(dag) = self.dag {
            if self.implement_upstream(v) {
                out.push("artifact".into());
            }
            if self.verdict_upstream(v) {
                out.push("verdict".into());
            }
            // The upstream nodes nearest to `v` in topological order.
            let mut up: Vec<usize> = dag.ancestors(v).ones().collect();
            let total = up.len();
            up.sort_unstable_by_key(|&u| std::cmp::Reverse(dag.position(u)));
            up.truncate(SHOWN_NODES);
            up.reverse();
            let near = up;
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

    /// The nodes downstream of any node matching `pred` (one pass over the DAG).
    fn after(&self, dag: &Dag, pred: impl Fn(&Node) -> bool) -> FixedBitSet {
        let mut set = FixedBitSet::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            set.set(i, pred(n));
        }
        dag.downstream_of_any(&set)
    }

    /// Whether a verdict node runs before node `v`.
    fn verdict_upstream(&self, v: usize) -> bool {
        self.dag.is_some_and(|dag| {
            self.after_verdict
                .get_or_init(|| self.after(dag, |n| n.spec.produces_verdict()))
                .contains(v)
        })
    }

    /// Whether a harness node with role `implement` runs before node `v`.
    fn implement_upstream(&self, v: usize) -> bool {
        self.dag.is_some_and(|dag| {
            self.after_implement
                .get_or_init(|| {
                    self.after(dag, |n| {
                        n.spec.role().is_some_and(|r| r.value == "implement")
                    })
                })
                .contains(v)
        })
    }

    fn check_usage(
        &self,
        u: &template::Usage,
        v: usize,
        place: TemplatePlace,
        t: &Tmpl,
    ) -> Option<Diagnostic> {
        let node = &self.nodes[v];
        let span = t.span_of(u.range.clone());
        let path = u.path(&t.text);
        let root = path.root();
        // Only error messages need the dotted name; most usages are fine.
        let full = path;
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
        let scalar = vars::is_leaf(root);
        // Checked once the variable is known to exist at this node.
        let field_err = || -> Option<Diagnostic> {
            if !scalar || path.len() < 2 {
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
        let scope = vars::scope(root);
        if scope == Some(Scope::Always) {
            return field_err();
        }
        if scope == Some(Scope::RoleArgv) && place == TemplatePlace::Prompt {
            return not_yet(
                "a prompt cannot include its own text".into(),
                "use `prompt_text` in the role's command (argv), not in the prompt file".into(),
            );
        }
        if matches!(scope, Some(Scope::Role | Scope::RoleArgv)) {
            if node.spec.spawns() || place == TemplatePlace::Prompt {
                return field_err();
            }
            return not_yet(
                format!("`{root}` is only set for nodes that run a process"),
                avail(),
            );
        }
        match root {
            "artifact" => {
                // Without a DAG (a cycle) where it is available cannot be known.
                if self.dag.is_none() || self.implement_upstream(v) {
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
                let Some(dag) = self.dag else {
                    return field_err();
                };
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
                let (Some(id), Some(field)) = (path.get(1), path.get(2)) else {
                    return Some(
                        Diagnostic::error(
                            Code::UnknownVariable,
                            &t.source,
                            span.clone(),
                            format!("`{full}` is incomplete"),
                        )
                        .label("expected nodes.<id>.<field>")
                        .help(format!(
                            "write `nodes.<id>.{{{}}}`",
                            vars::NODE_FIELDS.join(",")
                        )),
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
                if !vars::NODE_FIELDS.contains(&field) || path.len() > 3 {
                    return Some(
                        Diagnostic::error(
                            Code::UnknownVariable,
                            &t.source,
                            span.clone(),
                            format!("`{full}` is not a node variable"),
                        )
                        .label("unknown field")
                        .help(format!("a node exposes {}", list(vars::NODE_FIELDS))),
                    );
                }
                let dag = self.dag?;
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
                let known: Vec<&str> = vars::names().collect();
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
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
