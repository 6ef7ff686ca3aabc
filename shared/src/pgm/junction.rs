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
        let n = domain.len();
        let mut neighbours = vec![std::collections::BTreeSet::new(); n];
        for set in sets {
            for &a in set {
                neighbours[a].extend(set.iter().copied().filter(|&b| b != a));
            }
        }
        let mut eliminated = vec![false; n];
        let mut cliques: Vec<Vec<usize>> = Vec::new();
        for _ in 0..n {
            let cost = |v: usize| {
                let around: Vec<usize> = neighbours[v].iter().copied().collect();
                let fill = around
                    .iter()
                    .enumerate()
                    .flat_map(|(i, &a)| around[i + 1..].iter().map(move |&b| (a, b)))
                    .filter(|&(a, b)| !neighbours[a].contains(&b))
                    .count();
                let cells: f64 = around.iter().chain([&v]).map(|&u| domain[u] as f64).product();
                (fill, cells)
            };
            let v = (0..n)
                .filter(|&v| !eliminated[v])
                .map(|v| (cost(v), v))
                .min_by(|(a, _), (b, _)| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)))
                .expect("a variable is left")
                .1;
            let mut clique: Vec<usize> = neighbours[v].iter().copied().chain([v]).collect();
            clique.sort_unstable();
            let around: Vec<usize> = neighbours[v].iter().copied().collect();
            for &a in &around {
                neighbours[a].remove(&v);
                neighbours[a].extend(around.iter().copied().filter(|&b| b != a));
            }
            eliminated[v] = true;
            cliques.push(clique);
        }
        // Maximal cliques only, larger first (so clique 0, the root, is a large one).
        cliques.sort_by_key(|c| std::cmp::Reverse(c.len()));
        let mut maximal: Vec<Vec<usize>> = Vec::new();
        for c in cliques {
            if !maximal.iter().any(|m| c.iter().all(|v| m.contains(v))) {
                maximal.push(c);
            }
        }
        // Prim's algorithm on separator sizes (0 joins separate components).
        let k = maximal.len();
        let shared = |a: usize, b: usize| maximal[a].iter().filter(|v| maximal[b].contains(v)).count();
        let mut in_tree = vec![false; k];
        in_tree[0] = true;
        let mut edges = Vec::new();
        for _ in 1..k {
            let (p, c) = (0..k)
                .filter(|&p| in_tree[p])
                .flat_map(|p| (0..k).filter(|&c| !in_tree[c]).map(move |c| (p, c)))
                .max_by_key(|&(p, c)| (shared(p, c), std::cmp::Reverse(c)))
                .expect("a clique is left");
            in_tree[c] = true;
            edges.push((p, c));
        }
        Self { cliques: maximal, edges, links: std::sync::OnceLock::new() }
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
        self.cliques.iter().map(|c| c.iter().map(|&v| domain[v] as f64).product::<f64>()).sum()
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
            for (j, g) in children(c) {
                let link = &links[j];
                let mut without = belief.clone();
                without.add_mapped(up[g].as_ref().expect("computed"), &link.parent_cells, -1.0);
                down[g] = Some(without.logsumexp_mapped(&link.separator, &link.parent_cells));
            }
            beliefs[c] = Some(belief);
        }
        beliefs
            .into_iter()
            .map(|b| {
                let mut b = b.expect("every clique is reached");
                let log_z = b.logsumexp_to(&[]).values[0];
                b.values.iter_mut().for_each(|v| *v = total * (*v - log_z).exp());
                b
            })
            .collect()
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
