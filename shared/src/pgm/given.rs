//! Rows drawn from a model given values of a fixed set of its variables, planned once for
//! that set and drawn row after row with other values.
//!
//! A database's child rows are each drawn given their ancestors' bins, place and previous
//! row: the same variables every row, other values. Conditioning is exact evidence
//! propagation on the junction tree: each clique's log potential sliced at the given
//! values, messages up over what is free of each separator, then a row drawn down the
//! tree. Everything but the values (which cells of a potential a slice reads, which cell
//! of a message each belief cell sums into, which cells agree with a drawn separator) is
//! a function of the set alone, so it is worked out once: a row then costs one pass over
//! the cells of the free variables, whatever the cohort or the number of distinct
//! ancestors drawn (no conditioned model kept per ancestor configuration).

use rand::Rng;

use super::factor::{Factor, offsets};
use super::junction::JunctionTree;
use super::model::{cumulative, draw};

/// The plan of one clique: where its free cells lie in its potential.
struct CliquePlan {
    /// Each given variable of the clique, as (index in the plan's given values, stride).
    fixed: Vec<(usize, usize)>,
    /// The clique's free variables (ascending) and their sizes.
    free: Vec<usize>,
    sizes: Vec<usize>,
    /// Each free cell's offset in the potential, past the given values' offset.
    offsets: Vec<usize>,
}

/// The plan of one edge of the tree: its separator's free variables.
struct EdgePlan {
    parent: usize,
    child: usize,
    /// The separator's free variables (ascending) and their sizes.
    free: Vec<usize>,
    sizes: Vec<usize>,
    /// Each free cell of the child's and of the parent's: its cell of the separator's.
    child_cells: Vec<usize>,
    parent_cells: Vec<usize>,
    /// The child's free cells grouped by separator cell (`starts[s]..starts[s + 1]` of
    /// `grouped`): those agreeing with a drawn separator value.
    starts: Vec<usize>,
    grouped: Vec<usize>,
}

/// A model's rows given values of `vars`, planned ([`super::GraphicalModel::given`]).
pub struct Given<'m> {
    potentials: &'m [Factor],
    domain: &'m [usize],
    vars: Vec<usize>,
    cliques: Vec<CliquePlan>,
    edges: Vec<EdgePlan>,
}

impl<'m> Given<'m> {
    pub(super) fn plan(tree: &JunctionTree, potentials: &'m [Factor], domain: &'m [usize], vars: &[usize]) -> Self {
        let slot = |v: usize| vars.iter().position(|&g| g == v);
        let cliques: Vec<CliquePlan> = potentials
            .iter()
            .map(|potential| {
                let strides = potential.strides();
                let (mut fixed, mut free, mut sizes, mut free_strides) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for (i, &v) in potential.vars.iter().enumerate() {
                    match slot(v) {
                        Some(s) => fixed.push((s, strides[i])),
                        None => {
                            free.push(v);
                            sizes.push(potential.sizes[i]);
                            free_strides.push(strides[i]);
                        }
                    }
                }
                let offsets = offsets(&sizes, &free_strides, 0).collect();
                CliquePlan { fixed, free, sizes, offsets }
            })
            .collect();
        let edges = tree
            .edges
            .iter()
            .map(|&(parent, child)| {
                let free: Vec<usize> =
                    tree.separator(parent, child).into_iter().filter(|&v| slot(v).is_none()).collect();
                let sizes: Vec<usize> = free.iter().map(|&v| domain[v]).collect();
                let cells_of = |c: &CliquePlan| Factor { vars: c.free.clone(), sizes: c.sizes.clone(), values: vec![] };
                let child_cells = cells_of(&cliques[child]).cells_in(&free);
                let parent_cells = cells_of(&cliques[parent]).cells_in(&free);
                let groups: usize = sizes.iter().product();
                let mut starts = vec![0; groups + 1];
                child_cells.iter().for_each(|&s| starts[s + 1] += 1);
                (0..groups).for_each(|s| starts[s + 1] += starts[s]);
                let mut grouped = vec![0; child_cells.len()];
                let mut next = starts.clone();
                for (cell, &s) in child_cells.iter().enumerate() {
                    grouped[next[s]] = cell;
                    next[s] += 1;
                }
                EdgePlan { parent, child, free, sizes, child_cells, parent_cells, starts, grouped }
            })
            .collect();
        Self { potentials, domain, vars: vars.to_vec(), cliques, edges }
    }

    /// The variables given, in the order [`Self::draw`] takes their values.
    pub fn vars(&self) -> &[usize] {
        &self.vars
    }

    /// One row (a value index per variable) drawn from the model conditioned on
    /// `values[i]` of each given variable `vars()[i]`: the law of conditioning the model
    /// on them and drawing one row.
    pub fn draw(&self, values: &[usize], rng: &mut impl Rng) -> Vec<usize> {
        assert_eq!(values.len(), self.vars.len(), "a value for each given variable");
        for (&v, &value) in self.vars.iter().zip(values) {
            assert!(value < self.domain[v], "variable {v} has {} values, not {value}", self.domain[v]);
        }
        let mut beliefs: Vec<Vec<f64>> = self
            .cliques
            .iter()
            .zip(self.potentials)
            .map(|(plan, potential)| {
                let base: usize = plan.fixed.iter().map(|&(s, stride)| values[s] * stride).sum();
                plan.offsets.iter().map(|&at| potential.values[base + at]).collect()
            })
            .collect();
        // Children first: each clique's message to its parent, over the separator's free
        // variables, joins the parent's belief (a separator with none free sends a constant).
        for edge in self.edges.iter().rev().filter(|e| !e.free.is_empty()) {
            let cells = edge.starts.len() - 1;
            let mut top = vec![f64::NEG_INFINITY; cells];
            for (&b, &s) in beliefs[edge.child].iter().zip(&edge.child_cells) {
                top[s] = top[s].max(b);
            }
            let mut sum = vec![0.0; cells];
            for (&b, &s) in beliefs[edge.child].iter().zip(&edge.child_cells) {
                if top[s].is_finite() {
                    sum[s] += (b - top[s]).exp();
                }
            }
            let message: Vec<f64> = top
                .iter()
                .zip(&sum)
                .map(|(&t, &s)| if t.is_finite() { t + s.ln() } else { f64::NEG_INFINITY })
                .collect();
            for (b, &s) in beliefs[edge.parent].iter_mut().zip(&edge.parent_cells) {
                *b += message[s];
            }
        }
        let mut row = vec![0; self.domain.len()];
        for (&v, &value) in self.vars.iter().zip(values) {
            row[v] = value;
        }
        // Down the tree: the root clique's free cells, then each clique's agreeing with
        // its separator's values drawn above it.
        let root: Vec<usize> = (0..beliefs[0].len()).collect();
        self.draw_clique(0, &beliefs[0], &root, &mut row, rng);
        for edge in &self.edges {
            let s = edge.free.iter().zip(&edge.sizes).fold(0, |acc, (&v, &size)| acc * size + row[v]);
            let agreeing = &edge.grouped[edge.starts[s]..edge.starts[s + 1]];
            self.draw_clique(edge.child, &beliefs[edge.child], agreeing, &mut row, rng);
        }
        row
    }

    /// One of `cells` (free cells of clique `c`) drawn by its belief, written into `row`.
    fn draw_clique(&self, c: usize, belief: &[f64], cells: &[usize], row: &mut [usize], rng: &mut impl Rng) {
        let plan = &self.cliques[c];
        if plan.free.is_empty() {
            return;
        }
        // Shifted by the largest agreeing cell, so that the cells drawn from never all
        // underflow when the cells that disagree are far likelier.
        let top = cells.iter().map(|&cell| belief[cell]).fold(f64::NEG_INFINITY, f64::max);
        let weights = cells.iter().map(|&cell| (cell, if top.is_finite() { (belief[cell] - top).exp() } else { 0.0 }));
        let mut rest = draw(&cumulative(weights), rng);
        for (&v, &size) in plan.free.iter().zip(&plan.sizes).rev() {
            row[v] = rest % size;
            rest /= size;
        }
    }
}
