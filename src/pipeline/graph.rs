//! The DAG of a pipeline: cycle detection naming every node on a cycle, a stable
//! topological order (file order among ready nodes) and ancestor sets as bitsets, so a
//! 10,000-node pipeline stays cheap to check.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use petgraph::algo::kosaraju_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

pub use fixedbitset::FixedBitSet;

/// Edges point from a dependency to its dependent (`needs` reversed).
#[derive(Debug, Clone)]
pub struct Dag {
    pub graph: DiGraph<usize, ()>,
    /// Topological order, preferring file order among nodes that are ready together.
    pub order: Vec<usize>,
    /// `ancestors[v]` holds every node that finishes before `v` starts.
    pub ancestors: Vec<FixedBitSet>,
}

/// Builds the graph from `needs[v]` = the nodes `v` waits for. On cycles, returns each
/// cycle as the list of its nodes in dependency order.
pub fn build(needs: &[Vec<usize>]) -> Result<Dag, Vec<Vec<usize>>> {
    let n = needs.len();
    let mut graph = DiGraph::<usize, ()>::with_capacity(n, needs.iter().map(Vec::len).sum());
    for v in 0..n {
        graph.add_node(v);
    }
    for (v, deps) in needs.iter().enumerate() {
        for &u in deps {
            graph.add_edge(NodeIndex::new(u), NodeIndex::new(v), ());
        }
    }
    let cycles = cycles(&graph);
    if !cycles.is_empty() {
        return Err(cycles);
    }
    let order = stable_toposort(&graph);
    let mut ancestors = vec![FixedBitSet::with_capacity(n); n];
    for &v in &order {
        let mut set = FixedBitSet::with_capacity(n);
        for &u in &needs[v] {
            set.union_with(&ancestors[u]);
            set.insert(u);
        }
        ancestors[v] = set;
    }
    Ok(Dag {
        graph,
        order,
        ancestors,
    })
}

fn cycles(graph: &DiGraph<usize, ()>) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    for scc in kosaraju_scc(graph) {
        let self_loop = scc.len() == 1 && graph.find_edge(scc[0], scc[0]).is_some();
        if scc.len() < 2 && !self_loop {
            continue;
        }
        out.push(cycle_path(graph, &scc));
    }
    out.sort();
    out
}

/// One cycle through the component, starting at its first node in file order.
fn cycle_path(graph: &DiGraph<usize, ()>, scc: &[NodeIndex]) -> Vec<usize> {
    let members: std::collections::HashSet<NodeIndex> = scc.iter().copied().collect();
    let Some(&start) = scc.iter().min_by_key(|i| i.index()) else {
        return Vec::new();
    };
    // Walk forward inside the component, preferring unvisited nodes, until back at start.
    let mut path = vec![start];
    let mut seen = std::collections::HashSet::from([start]);
    let mut cur = start;
    loop {
        let mut next: Vec<NodeIndex> = graph
            .edges(cur)
            .map(|e| e.target())
            .filter(|t| members.contains(t))
            .collect();
        next.sort_by_key(|t| t.index());
        if next.contains(&start)
            && (path.len() == scc.len() || next.iter().all(|t| seen.contains(t)))
        {
            break;
        }
        match next.iter().find(|t| !seen.contains(t)) {
            Some(&t) => {
                seen.insert(t);
                path.push(t);
                cur = t;
            }
            None => break,
        }
    }
    path.into_iter().map(|i| graph[i]).collect()
}

fn stable_toposort(graph: &DiGraph<usize, ()>) -> Vec<usize> {
    let n = graph.node_count();
    let mut indegree = vec![0usize; n];
    for e in graph.edge_references() {
        indegree[e.target().index()] += 1;
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&v| indegree[v] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(v)) = ready.pop() {
        order.push(v);
        for e in graph.edges(NodeIndex::new(v)) {
            let t = e.target().index();
            indegree[t] -= 1;
            if indegree[t] == 0 {
                ready.push(Reverse(t));
            }
        }
    }
    order
}

impl Dag {
    pub fn is_ancestor(&self, ancestor: usize, of: usize) -> bool {
        self.ancestors[of].contains(ancestor)
    }

    /// Every node downstream of `v` (not including `v`).
    pub fn descendants(&self, v: usize) -> Vec<usize> {
        (0..self.ancestors.len())
            .filter(|&d| self.ancestors[d].contains(v))
            .collect()
    }

    /// Nodes with no dependencies.
    pub fn roots(&self) -> Vec<usize> {
        (0..self.ancestors.len())
            .filter(|&v| self.ancestors[v].is_clear())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_and_ancestors() {
        // 0 <- 1 <- 2, 0 <- 3
        let dag = build(&[vec![], vec![0], vec![1], vec![0]]).unwrap();
        assert_eq!(dag.order, vec![0, 1, 2, 3]);
        assert!(dag.is_ancestor(0, 2));
        assert!(!dag.is_ancestor(3, 2));
        assert_eq!(dag.descendants(1), vec![2]);
    }

    #[test]
    fn names_every_node_on_a_cycle() {
        // 0 needs 2, 1 needs 0, 2 needs 1
        let err = build(&[vec![2], vec![0], vec![1], vec![]]).unwrap_err();
        assert_eq!(err, vec![vec![0, 1, 2]]);
        let err = build(&[vec![0]]).unwrap_err();
        assert_eq!(err, vec![vec![0]]);
    }
}
