//! The DAG of a pipeline: cycle detection naming every node on a cycle, a stable
//! topological order (file order among ready nodes), and reachability asked as it is
//! needed, in memory linear in the pipeline.
//!
//! Cost, for n nodes and e `needs` entries: building is O(e + n log n) (the order is a
//! heap-driven Kahn walk; cycles are looked for only when that walk cannot finish, with
//! one O(n + e) strongly-connected-components pass). Memory is O(n + e): `needs` and their
//! reverse as flat arrays, a position per node. An earlier version kept every node's
//! ancestors as an n-bit set, n² bits in all (50 MB at 20,000 nodes, most of `check`'s
//! time at 10,000).
//!
//! Reachability: [`Dag::is_ancestor`] answers a direct need, or a node that comes later
//! in the order, in O(log k) / O(1); otherwise it searches back from the later node,
//! only through nodes placed after the earlier one, and keeps the full descendant set of
//! a node asked about repeatedly (a bounded number of n-bit sets), so many questions about
//! one node cost O(n + e) once. Sets of nodes downstream of a whole set
//! ([`Dag::downstream_of_any`]) and the cones of one node ([`Dag::descendants`],
//! [`Dag::ancestors`]) are single walks, O(n + e).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Mutex;

pub(crate) use fixedbitset::FixedBitSet;

/// How many nodes a backward search may visit before the asked-about node's full
/// descendant set is computed and kept instead.
const SEARCH_BEFORE_CACHING: usize = 256;
/// How many descendant sets are kept (n bits each).
const CACHED_SETS: usize = 32;

/// A pipeline's dependency graph; node `v` waits for every node in `needs(v)`.
#[derive(Debug)]
pub struct Dag {
    /// Topological order, preferring file order among nodes that are ready together.
    pub order: Vec<usize>,
    /// Each node's index in `order`.
    pos: Vec<u32>,
    /// `needs(v)` = `needs[needs_at[v]..needs_at[v + 1]]`, sorted, without duplicates.
    needs_at: Vec<u32>,
    needs: Vec<u32>,
    /// The reverse: the nodes that wait for `u`.
    dependents_at: Vec<u32>,
    dependents: Vec<u32>,
    /// Scratch space and kept descendant sets of [`Dag::is_ancestor`].
    memo: Mutex<Memo>,
}

#[derive(Debug, Default)]
struct Memo {
    /// `seen[w] == epoch` marks a node visited by the current search.
    seen: Vec<u32>,
    epoch: u32,
    stack: Vec<u32>,
    /// Nodes asked about whose search ran long, and how often.
    long: Vec<(u32, u32)>,
    /// Full descendant sets of nodes asked about repeatedly.
    kept: Vec<(u32, FixedBitSet)>,
}

impl Clone for Dag {
    fn clone(&self) -> Dag {
        Dag {
            order: self.order.clone(),
            pos: self.pos.clone(),
            needs_at: self.needs_at.clone(),
            needs: self.needs.clone(),
            dependents_at: self.dependents_at.clone(),
            dependents: self.dependents.clone(),
            memo: Mutex::default(),
        }
    }
}

/// A list of lists as one flat array and the offsets into it.
fn flatten(
    lists: impl Iterator<Item = impl Iterator<Item = u32>>,
    n: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut at = Vec::with_capacity(n + 1);
    let mut flat = Vec::new();
    at.push(0);
    for l in lists {
        flat.extend(l);
        at.push(u32::try_from(flat.len()).unwrap_or(u32::MAX));
    }
    (at, flat)
}

/// Builds the graph from `needs[v]` = the nodes `v` waits for (sorted, deduplicated). On
/// cycles, returns each cycle as the list of its nodes in dependency order.
pub(crate) fn build(needs: &[Vec<usize>]) -> Result<Dag, Vec<Vec<usize>>> {
    let n = needs.len();
    let (needs_at, flat_needs) = flatten(needs.iter().map(|d| d.iter().map(|&u| u as u32)), n);
    // The reverse lists, by counting: O(n + e).
    let mut count = vec![0u32; n + 1];
    for &u in &flat_needs {
        count[u as usize + 1] += 1;
    }
    for i in 0..n {
        count[i + 1] += count[i];
    }
    let dependents_at = count.clone();
    let mut fill = count;
    let mut dependents = vec![0u32; flat_needs.len()];
    for (v, d) in needs.iter().enumerate() {
        for &u in d {
            let slot = &mut fill[u];
            dependents[*slot as usize] = v as u32;
            *slot += 1;
        }
    }
    let dag = Dag {
        order: Vec::new(),
        pos: Vec::new(),
        needs_at,
        needs: flat_needs,
        dependents_at,
        dependents,
        memo: Mutex::default(),
    };
    let order = dag.stable_toposort();
    if order.len() < n {
        return Err(dag.cycles());
    }
    let mut pos = vec![0u32; n];
    for (i, &v) in order.iter().enumerate() {
        pos[v] = i as u32;
    }
    Ok(Dag { order, pos, ..dag })
}

impl Dag {
    pub fn len(&self) -> usize {
        self.needs_at.len().saturating_sub(1)
    }

    /// The nodes `v` waits for, sorted.
    pub fn needs(&self, v: usize) -> &[u32] {
        &self.needs[self.needs_at[v] as usize..self.needs_at[v + 1] as usize]
    }

    /// The nodes that wait for `u`.
    pub fn dependents(&self, u: usize) -> &[u32] {
        &self.dependents[self.dependents_at[u] as usize..self.dependents_at[u + 1] as usize]
    }

    /// `v`'s place in [`Dag::order`].
    pub fn position(&self, v: usize) -> usize {
        self.pos[v] as usize
    }

    /// Kahn's walk, the smallest-numbered ready node first: O(e + n log n). Shorter than
    /// the pipeline when there are cycles.
    fn stable_toposort(&self) -> Vec<usize> {
        let n = self.len();
        let mut waiting: Vec<u32> = (0..n).map(|v| self.needs(v).len() as u32).collect();
        let mut ready: BinaryHeap<Reverse<usize>> =
            (0..n).filter(|&v| waiting[v] == 0).map(Reverse).collect();
        let mut order = Vec::with_capacity(n);
        while let Some(Reverse(v)) = ready.pop() {
            order.push(v);
            for &t in self.dependents(v) {
                let t = t as usize;
                waiting[t] -= 1;
                if waiting[t] == 0 {
                    ready.push(Reverse(t));
                }
            }
        }
        order
    }

    /// Every cycle (strongly connected component of more than one node, or a node that
    /// needs itself), each as a path through it from its first node in file order.
    fn cycles(&self) -> Vec<Vec<usize>> {
        use petgraph::graph::{DiGraph, NodeIndex};
        let n = self.len();
        let mut graph = DiGraph::<usize, ()>::with_capacity(n, self.needs.len());
        for v in 0..n {
            graph.add_node(v);
        }
        for v in 0..n {
            for &u in self.needs(v) {
                graph.add_edge(NodeIndex::new(u as usize), NodeIndex::new(v), ());
            }
        }
        let mut out = Vec::new();
        for scc in petgraph::algo::kosaraju_scc(&graph) {
            let self_loop = scc.len() == 1 && graph.find_edge(scc[0], scc[0]).is_some();
            if scc.len() < 2 && !self_loop {
                continue;
            }
            let members: Vec<usize> = scc.iter().map(|i| i.index()).collect();
            out.push(self.cycle_path(&members));
        }
        out.sort();
        out
    }

    /// One cycle through a component, starting at its first node in file order: walk
    /// forward inside it, preferring unvisited nodes, until back at the start.
    fn cycle_path(&self, scc: &[usize]) -> Vec<usize> {
        let members: std::collections::HashSet<usize> = scc.iter().copied().collect();
        let Some(&start) = scc.iter().min() else {
            return Vec::new();
        };
        let mut path = vec![start];
        let mut seen = std::collections::HashSet::from([start]);
        let mut cur = start;
        loop {
            let mut next: Vec<usize> = self
                .dependents(cur)
                .iter()
                .map(|&t| t as usize)
                .filter(|t| members.contains(t))
                .collect();
            next.sort_unstable();
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
        path
    }

    /// Whether `ancestor` finishes before `of` starts (is upstream of it, through any
    /// number of nodes).
    pub fn is_ancestor(&self, ancestor: usize, of: usize) -> bool {
        let (u, v) = (ancestor, of);
        if u == v || self.pos[u] >= self.pos[v] {
            return false;
        }
        if self.needs(v).binary_search(&(u as u32)).is_ok() {
            return true;
        }
        let mut memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, set)) = memo.kept.iter().find(|(k, _)| *k as usize == u) {
            return set.contains(v);
        }
        let (found, visited) = self.search_back(&mut memo, u, v);
        if visited > SEARCH_BEFORE_CACHING && memo.kept.len() < CACHED_SETS {
            // Asked about twice with long searches: keep u's whole downstream.
            let asked = match memo.long.iter_mut().find(|(k, _)| *k as usize == u) {
                Some(e) => {
                    e.1 += 1;
                    e.1
                }
                None => {
                    memo.long.push((u as u32, 1));
                    1
                }
            };
            if asked >= 2 {
                let set = self.descendant_set(u);
                memo.kept.push((u as u32, set));
            }
        }
        found
    }

    /// Searches from `v` towards its needs for `u`, through nodes after `u` in the order
    /// only (nothing before it can lead to it). Returns whether it was found and how many
    /// nodes were visited.
    fn search_back(&self, memo: &mut Memo, u: usize, v: usize) -> (bool, usize) {
        let n = self.len();
        if memo.seen.len() != n {
            memo.seen = vec![0; n];
            memo.epoch = 0;
        }
        memo.epoch = memo.epoch.wrapping_add(1);
        if memo.epoch == 0 {
            memo.seen.iter_mut().for_each(|s| *s = 0);
            memo.epoch = 1;
        }
        let epoch = memo.epoch;
        let floor = self.pos[u];
        let mut stack = std::mem::take(&mut memo.stack);
        stack.clear();
        stack.push(v as u32);
        memo.seen[v] = epoch;
        let mut visited = 0;
        let mut found = false;
        while let Some(w) = stack.pop() {
            visited += 1;
            for &x in self.needs(w as usize) {
                if x as usize == u {
                    found = true;
                    break;
                }
                let xi = x as usize;
                if self.pos[xi] > floor && memo.seen[xi] != epoch {
                    memo.seen[xi] = epoch;
                    stack.push(x);
                }
            }
            if found {
                break;
            }
        }
        memo.stack = stack;
        (found, visited)
    }

    /// Every node downstream of `v`, as a set (not including `v`): O(n + e).
    fn descendant_set(&self, v: usize) -> FixedBitSet {
        let mut set = FixedBitSet::with_capacity(self.len());
        let mut stack = vec![v as u32];
        while let Some(w) = stack.pop() {
            for &d in self.dependents(w as usize) {
                if !set.put(d as usize) {
                    stack.push(d);
                }
            }
        }
        set
    }

    /// Every node upstream of `v` (not including `v`), as a set: O(n + e).
    pub fn ancestors(&self, v: usize) -> FixedBitSet {
        let mut set = FixedBitSet::with_capacity(self.len());
        let mut stack = vec![v as u32];
        while let Some(w) = stack.pop() {
            for &u in self.needs(w as usize) {
                if !set.put(u as usize) {
                    stack.push(u);
                }
            }
        }
        set
    }

    /// The nodes that have at least one member of `set` upstream of them, as a set: one
    /// pass in topological order, O(n + e).
    pub fn downstream_of_any(&self, set: &FixedBitSet) -> FixedBitSet {
        let mut out = FixedBitSet::with_capacity(self.len());
        for &v in &self.order {
            if self
                .needs(v)
                .iter()
                .any(|&u| set.contains(u as usize) || out.contains(u as usize))
            {
                out.insert(v);
            }
        }
        out
    }

    /// The nodes upstream of at least one member of `set`, as a set: one pass in reverse
    /// topological order, O(n + e).
    pub fn upstream_of_any(&self, set: &FixedBitSet) -> FixedBitSet {
        let mut out = FixedBitSet::with_capacity(self.len());
        for &u in self.order.iter().rev() {
            if self
                .dependents(u)
                .iter()
                .any(|&v| set.contains(v as usize) || out.contains(v as usize))
            {
                out.insert(u);
            }
        }
        out
    }
}

impl crate::node::Upstream for Dag {
    /// O(n + e) for the walk, and the cone's sort into topological order.
    fn upstream_of(&self, v: usize) -> Vec<usize> {
        let mut up: Vec<usize> = self.ancestors(v).ones().collect();
        up.sort_unstable_by_key(|&u| self.pos[u]);
        up
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
        assert!(!dag.is_ancestor(2, 0));
        assert_eq!(dag.descendant_set(1).ones().collect::<Vec<_>>(), vec![2]);
        assert_eq!(dag.ancestors(2).ones().collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn names_every_node_on_a_cycle() {
        // 0 needs 2, 1 needs 0, 2 needs 1
        let err = build(&[vec![2], vec![0], vec![1], vec![]]).unwrap_err();
        assert_eq!(err, vec![vec![0, 1, 2]]);
        let err = build(&[vec![0]]).unwrap_err();
        assert_eq!(err, vec![vec![0]]);
    }

    /// Every reachability answer agrees with the full transitive closure, on random
    /// DAGs, far and near pairs and repeated questions (the kept sets) alike.
    #[test]
    fn reachability_matches_the_transitive_closure() {
        let mut seed = 5u64;
        let mut next = |m: usize| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as usize % m.max(1)
        };
        for round in 0..40 {
            let big = round >= 30;
            let n = 2 + next(if big { 400 } else { 60 });
            // Random edges from earlier to later nodes, through a shuffled numbering.
            let mut label: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                label.swap(i, next(i + 1));
            }
            let mut needs = vec![Vec::new(); n];
            for v in 1..n {
                for _ in 0..next(4) {
                    needs[label[v]].push(label[next(v)]);
                }
            }
            for d in &mut needs {
                d.sort_unstable();
                d.dedup();
            }
            let dag = build(&needs).unwrap();
            let closure: Vec<FixedBitSet> = (0..n).map(|v| dag.ancestors(v)).collect();
            let pairs: Vec<(usize, usize)> = if big {
                (0..20_000).map(|_| (next(n), next(n))).collect()
            } else {
                (0..n).flat_map(|v| (0..n).map(move |u| (u, v))).collect()
            };
            for _ in 0..3 {
                for &(u, v) in &pairs {
                    assert_eq!(
                        dag.is_ancestor(u, v),
                        closure[v].contains(u),
                        "{u} upstream of {v}? needs {needs:?}"
                    );
                }
            }
            for u in 0..n {
                let down = dag.descendant_set(u);
                for (v, up) in closure.iter().enumerate() {
                    assert_eq!(down.contains(v), up.contains(u));
                }
            }
        }
    }
}
