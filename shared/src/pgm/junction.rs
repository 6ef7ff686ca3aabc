//! A junction tree over the measured variable sets and exact inference on it.
//!
//! The sets' interaction graph is triangulated by greedy elimination (fewest fill edges,
//! then fewest cells), its maximal cliques joined by a maximum-weight spanning tree on
//! separator sizes (which has the running-intersection property for a triangulated
//! graph). Sum-product on that tree gives every clique's exact marginal of the model
//! `p(x) ∝ exp Σ_C θ_C(x_C)`.

use super::factor::Factor;

/// Cliques and the tree joining them, in breadth-first order from clique 0.
#[derive(Clone, Debug, PartialEq)]
pub struct JunctionTree {
    /// Each clique's variables, ascending.
    pub cliques: Vec<Vec<usize>>,
    /// (parent, child) pairs, parents first; every clique but 0 is a child once.
    pub edges: Vec<(usize, usize)>,
    /// Per edge: its separator and, for the parent's and the child's cells, the
    /// separator cell each falls in — made at the first message passing and reused at
    /// every fit step (a tree built only to be sized never makes them).
    links: std::sync::OnceLock<Vec<Link>>,
}

#[derive(Clone, Debug, PartialEq)]
struct Link {
    separator: Vec<usize>,
    parent_cells: Vec<usize>,
    child_cells: Vec<usize>,
}

impl JunctionTree {
    /// The tree of the model over `domain.len()` variables in which every set of `sets`
    /// lies inside one clique (a variable in no set gets a clique of its own).
    pub fn new(domain: &[usize], sets: &[Vec<usize>]) -> Self {
        let cliques = maximal_cliques(domain, sets);
        // Prim's algorithm on separator sizes (0 joins separate components): per clique
        // outside the tree, its best link into it (most shared variables, then the
        // latest clique joined).
        let k = cliques.len();
        let members: Vec<Bits> = cliques.iter().map(|c| Bits::of(domain.len(), c)).collect();
        let mut best: Vec<Option<(u32, usize)>> = vec![None; k];
        let mut in_tree = vec![false; k];
        let mut edges = Vec::with_capacity(k.saturating_sub(1));
        let mut joined = 0;
        in_tree[0] = true;
        for _ in 1..k {
            for c in (0..k).filter(|&c| !in_tree[c]) {
                let shared = members[joined].shared(&members[c]);
                if best[c].is_none_or(|(s, _)| shared >= s) {
                    best[c] = Some((shared, joined));
                }
            }
            let c = (0..k)
                .filter(|&c| !in_tree[c])
                .max_by_key(|&c| (best[c].map(|b| b.0), std::cmp::Reverse(c)))
                .expect("a clique is left");
            in_tree[c] = true;
            edges.push((best[c].expect("linked").1, c));
            joined = c;
        }
        Self { cliques, edges, links: std::sync::OnceLock::new() }
    }

    fn links(&self, theta: &[Factor]) -> &[Link] {
        self.links.get_or_init(|| {
            self.edges
                .iter()
                .map(|&(p, c)| {
                    let separator = self.separator(p, c);
                    Link {
                        parent_cells: theta[p].cells_in(&separator),
                        child_cells: theta[c].cells_in(&separator),
                        separator,
                    }
                })
                .collect()
        })
    }

    /// Cells of all cliques together, over variables with `domain[v]` values.
    pub fn cells(&self, domain: &[usize]) -> f64 {
        cells(domain, &self.cliques)
    }

    /// The cells a tree over `sets` would hold, without building it (its cliques only).
    pub fn cells_for(domain: &[usize], sets: &[Vec<usize>]) -> f64 {
        cells(domain, &maximal_cliques(domain, sets))
    }

    /// The variables two joined cliques share.
    pub fn separator(&self, a: usize, b: usize) -> Vec<usize> {
        self.cliques[a].iter().copied().filter(|v| self.cliques[b].contains(v)).collect()
    }

    /// A clique holding every variable of `set`.
    pub fn clique_of(&self, set: &[usize]) -> Option<usize> {
        self.cliques.iter().position(|c| set.iter().all(|v| c.contains(v)))
    }

    /// Every clique's marginal, scaled to sum to `total`, of the model whose log
    /// potentials are `theta` (one per clique, over its variables).
    pub fn marginals(&self, theta: &[Factor], total: f64) -> Vec<Factor> {
        let k = self.cliques.len();
        // Messages child → parent, then parent → child, each over the separator.
        let mut up: Vec<Option<Factor>> = vec![None; k];
        let mut down: Vec<Option<Factor>> = vec![None; k];
        let links = self.links(theta);
        // The edges to each clique's children, and to its parent.
        let children = |c: usize| self.edges.iter().enumerate().filter(move |(_, e)| e.0 == c).map(|(i, e)| (i, e.1));
        let mut to_parent = vec![usize::MAX; k];
        for (i, &(_, c)) in self.edges.iter().enumerate() {
            to_parent[c] = i;
        }
        for (i, &(_, c)) in self.edges.iter().enumerate().rev() {
            let mut belief = theta[c].clone();
            for (j, g) in children(c) {
                belief.add_mapped(up[g].as_ref().expect("children first"), &links[j].parent_cells, 1.0);
            }
            let link = &links[i];
            up[c] = Some(belief.logsumexp_mapped(&link.separator, &link.child_cells));
        }
        // Downward, each clique's belief is exponentiated once (shifted by its largest
        // cell): a child's message is the belief summed to the separator, in log space,
        // less the child's own message up (a function of the separator alone, so it
        // divides out of the sum).
        let mut beliefs: Vec<Option<Factor>> = vec![None; k];
        let mut order = vec![0];
        order.extend(self.edges.iter().map(|e| e.1));
        for &c in &order {
            let mut belief = theta[c].clone();
            for (j, g) in children(c) {
                belief.add_mapped(up[g].as_ref().expect("computed"), &links[j].parent_cells, 1.0);
            }
            if let Some(message) = &down[c] {
                belief.add_mapped(message, &links[to_parent[c]].child_cells, 1.0);
            }
            let top = belief.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            belief.values.iter_mut().for_each(|v| *v = if top.is_finite() { (*v - top).exp() } else { 0.0 });
            for (j, g) in children(c) {
                let link = &links[j];
                let mut message = belief.sum_mapped(&link.separator, &link.parent_cells);
                let own = up[g].as_ref().expect("computed");
                for (m, u) in message.values.iter_mut().zip(&own.values) {
                    *m = top + m.ln() - u;
                }
                down[g] = Some(message);
            }
            let sum: f64 = belief.values.iter().sum();
            belief.values.iter_mut().for_each(|v| *v *= if sum > 0.0 { total / sum } else { 0.0 });
            beliefs[c] = Some(belief);
        }
        beliefs.into_iter().map(|b| b.expect("every clique is reached")).collect()
    }
}

fn cells(domain: &[usize], cliques: &[Vec<usize>]) -> f64 {
    cliques.iter().map(|c| c.iter().map(|&v| domain[v] as f64).product::<f64>()).sum()
}

/// The maximal cliques, larger first, of the sets' interaction graph triangulated by
/// greedy elimination: each step eliminates the variable adding the fewest fill edges,
/// then the one with the fewest cells around it, then the lowest.
fn maximal_cliques(domain: &[usize], sets: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = domain.len();
    let mut neighbours = vec![Bits::empty(n); n];
    for set in sets {
        for &a in set {
            for &b in set.iter().filter(|&&b| b != a) {
                neighbours[a].insert(b);
            }
        }
    }
    let mut left = Bits::of(n, &(0..n).collect::<Vec<_>>());
    let mut cliques: Vec<Vec<usize>> = Vec::with_capacity(n);
    for _ in 0..n {
        let cost = |v: usize| {
            let around = &neighbours[v];
            // Pairs of neighbours not yet joined, each counted from both ends.
            let missing: u32 = around.iter().map(|a| around.count_outside(&neighbours[a]) - 1).sum();
            let cells: f64 = around.iter().chain([v]).map(|u| domain[u] as f64).product();
            (missing / 2, cells)
        };
        let v = left
            .iter()
            .map(|v| (cost(v), v))
            .min_by(|(a, _), (b, _)| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)))
            .expect("a variable is left")
            .1;
        let around: Vec<usize> = neighbours[v].iter().collect();
        for &a in &around {
            neighbours[a].remove(v);
            for &b in around.iter().filter(|&&b| b != a) {
                neighbours[a].insert(b);
            }
        }
        left.remove(v);
        let mut clique = around;
        clique.push(v);
        clique.sort_unstable();
        cliques.push(clique);
    }
    // Maximal cliques only, larger first (so clique 0, the root, is a large one).
    cliques.sort_by_key(|c| std::cmp::Reverse(c.len()));
    let mut maximal: Vec<(Vec<usize>, Bits)> = Vec::new();
    for c in cliques {
        let bits = Bits::of(n, &c);
        if !maximal.iter().any(|(_, m)| bits.count_outside(m) == 0) {
            maximal.push((c, bits));
        }
    }
    maximal.into_iter().map(|(c, _)| c).collect()
}

/// A set of variables as a bitset: the triangulation runs once per candidate per round.
#[derive(Clone, Debug)]
struct Bits(Vec<u64>);

impl Bits {
    fn empty(n: usize) -> Self {
        Bits(vec![0; n.div_ceil(64)])
    }

    fn of(n: usize, members: &[usize]) -> Self {
        let mut bits = Self::empty(n);
        members.iter().for_each(|&v| bits.insert(v));
        bits
    }

    fn insert(&mut self, v: usize) {
        self.0[v / 64] |= 1 << (v % 64);
    }

    fn remove(&mut self, v: usize) {
        self.0[v / 64] &= !(1 << (v % 64));
    }

    fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let bit = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    w * 64 + bit
                })
            })
        })
    }

    /// Members of `self` that `other` lacks.
    fn count_outside(&self, other: &Bits) -> u32 {
        self.0.iter().zip(&other.0).map(|(a, b)| (a & !b).count_ones()).sum()
    }

    fn shared(&self, other: &Bits) -> u32 {
        self.0.iter().zip(&other.0).map(|(a, b)| (a & b).count_ones()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The brute-force marginal over `set` of p(x) ∝ exp Σ θ_C(x_C).
    fn brute_force(domain: &[usize], theta: &[Factor], set: &[usize]) -> Factor {
        let all: Vec<usize> = (0..domain.len()).collect();
        let mut joint = Factor::filled(&all, domain, 0.0);
        for t in theta {
            joint.add_broadcast(t, 1.0);
        }
        let log_z = joint.logsumexp_to(&[]).values[0];
        joint.values.iter_mut().for_each(|v| *v = (*v - log_z).exp());
        joint.sum_to(set)
    }

    #[test]
    fn marginals_match_the_joint_on_a_graph_with_a_cycle() {
        // A 4-cycle 0-1-2-3-0 plus a triple {3, 4, 5}: triangulation must add a chord.
        let domain = [2, 3, 2, 4, 2, 3];
        let sets = vec![vec![0, 1], vec![1, 2], vec![2, 3], vec![0, 3], vec![3, 4, 5]];
        let tree = JunctionTree::new(&domain, &sets);
        assert!(sets.iter().all(|s| tree.clique_of(s).is_some()));
        let theta: Vec<Factor> = tree
            .cliques
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut f = Factor::filled(c, &domain, 0.0);
                f.values.iter_mut().enumerate().for_each(|(j, v)| *v = ((i * 7 + j * 13) % 11) as f64 / 5.0);
                f
            })
            .collect();
        let marginals = tree.marginals(&theta, 1.0);
        for (c, m) in tree.cliques.iter().zip(&marginals) {
            let expected = brute_force(&domain, &theta, c);
            for (a, b) in m.values.iter().zip(&expected.values) {
                assert!((a - b).abs() < 1e-12, "{c:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn unmeasured_variables_get_cliques_of_their_own() {
        let tree = JunctionTree::new(&[2, 2, 2], &[vec![0, 2]]);
        assert_eq!(tree.cliques, vec![vec![0, 2], vec![1]]);
        assert_eq!(tree.edges, vec![(0, 1)]);
    }
}
