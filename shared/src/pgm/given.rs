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
use super::model::{GraphicalModel, cumulative, draw};

/// The plan of one clique: where its free cells lie in its potential.
struct CliquePlan {
    /// Each given variable of the clique, as (index in the plan's given values, stride).
    fixed: Vec<(usize, usize)>,
    /// The clique's free variables (ascending) and their sizes.
    free: Vec<usize>,
    sizes: Vec<usize>,
    /// Each free cell's offset in the potential, past the given values' offset.
    offsets: Vec<u32>,
}

/// The plan of one edge of the tree: its separator's free variables.
struct EdgePlan {
    parent: usize,
    child: usize,
    /// The separator's free variables (ascending) and their sizes.
    free: Vec<usize>,
    sizes: Vec<usize>,
    /// Each free cell of the child's and of the parent's: its cell of the separator's.
    child_cells: Vec<u32>,
    parent_cells: Vec<u32>,
    /// The child's free cells grouped by separator cell (`starts[s]..starts[s + 1]` of
    /// `grouped`): those agreeing with a drawn separator value.
    starts: Vec<usize>,
    grouped: Vec<u32>,
}

/// A model's rows given values of `vars`, planned ([`GraphicalModel::given`]): the plan
/// holds no value and no potential, so it serves the model as tilted later (the same tree,
/// other potentials) and is shared by threads.
pub struct Given {
    domain: Vec<usize>,
    vars: Vec<usize>,
    cliques: Vec<CliquePlan>,
    edges: Vec<EdgePlan>,
}

/// A count of cells as the plans hold it (half a `usize`: plans are as large as the free
/// variables' cells).
fn cell(at: usize) -> u32 {
    u32::try_from(at).expect("a model's cells fit in 32 bits (max_model_cells)")
}

impl Given {
    pub(super) fn plan(tree: &JunctionTree, potentials: &[Factor], domain: &[usize], vars: &[usize]) -> Self {
        debug_assert!(
            vars.iter().enumerate().all(|(i, v)| !vars[..i].contains(v)),
            "each variable given once: {vars:?}"
        );
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
                let offsets = offsets(&sizes, &free_strides, 0).map(cell).collect();
                CliquePlan { fixed, free, sizes, offsets }
            })
            .collect();
        // Drawn down the tree, a clique agrees with what was drawn above it on its
        // separator alone: the tree's edges come parents first, and a variable shared with
        // a clique drawn earlier lies in every clique between them (running intersection).
        debug_assert!(
            tree.edges.iter().enumerate().all(|(i, &(p, _))| p == 0 || tree.edges[..i].iter().any(|e| e.1 == p))
        );
        let edges = tree
            .edges
            .iter()
            .map(|&(parent, child)| {
                let free: Vec<usize> =
                    tree.separator(parent, child).into_iter().filter(|&v| slot(v).is_none()).collect();
                let sizes: Vec<usize> = free.iter().map(|&v| domain[v]).collect();
                let cells_of = |c: &CliquePlan| {
                    let table = Factor { vars: c.free.clone(), sizes: c.sizes.clone(), values: vec![] };
                    table.cells_in(&free).into_iter().map(cell).collect::<Vec<u32>>()
                };
                let child_cells = cells_of(&cliques[child]);
                let parent_cells = cells_of(&cliques[parent]);
                let groups: usize = sizes.iter().product();
                let mut starts = vec![0; groups + 1];
                child_cells.iter().for_each(|&s| starts[s as usize + 1] += 1);
                (0..groups).for_each(|s| starts[s + 1] += starts[s]);
                let mut grouped = vec![0; child_cells.len()];
                let mut next = starts.clone();
                for (at, &s) in child_cells.iter().enumerate() {
                    grouped[next[s as usize]] = cell(at);
                    next[s as usize] += 1;
                }
                EdgePlan { parent, child, free, sizes, child_cells, parent_cells, starts, grouped }
            })
            .collect();
        Self { domain: domain.to_vec(), vars: vars.to_vec(), cliques, edges }
    }

    /// The variables given, in the order [`Self::draw`] takes their values.
    pub fn vars(&self) -> &[usize] {
        &self.vars
    }

    /// One row (a value index per variable) drawn from `model` (the one planned, or a
    /// tilt of it) conditioned on `values[i]` of each given variable `vars()[i]`: the law
    /// of conditioning the model on them and drawing one row.
    pub fn draw(&self, model: &GraphicalModel, values: &[usize], rng: &mut impl Rng) -> Vec<usize> {
        assert_eq!(values.len(), self.vars.len(), "a value for each given variable");
        for (&v, &value) in self.vars.iter().zip(values) {
            assert!(value < self.domain[v], "variable {v} has {} values, not {value}", self.domain[v]);
        }
        let potentials = model.potentials();
        assert_eq!(potentials.len(), self.cliques.len(), "the model planned (or a tilt of it)");
        let mut beliefs: Vec<Vec<f64>> = self
            .cliques
            .iter()
            .zip(potentials)
            .map(|(plan, potential)| {
                let base: usize = plan.fixed.iter().map(|&(s, stride)| values[s] * stride).sum();
                plan.offsets.iter().map(|&at| potential.values[base + at as usize]).collect()
            })
            .collect();
        // Children first: each clique's message to its parent, over the separator's free
        // variables, joins the parent's belief (a separator with none free sends a constant).
        for edge in self.edges.iter().rev().filter(|e| !e.free.is_empty()) {
            let cells = edge.starts.len() - 1;
            let mut top = vec![f64::NEG_INFINITY; cells];
            for (&b, &s) in beliefs[edge.child].iter().zip(&edge.child_cells) {
                top[s as usize] = top[s as usize].max(b);
            }
            let mut sum = vec![0.0; cells];
            for (&b, &s) in beliefs[edge.child].iter().zip(&edge.child_cells) {
                if top[s as usize].is_finite() {
                    sum[s as usize] += (b - top[s as usize]).exp();
                }
            }
            let message: Vec<f64> = top
                .iter()
                .zip(&sum)
                .map(|(&t, &s)| if t.is_finite() { t + s.ln() } else { f64::NEG_INFINITY })
                .collect();
            for (b, &s) in beliefs[edge.parent].iter_mut().zip(&edge.parent_cells) {
                *b += message[s as usize];
            }
        }
        let mut row = vec![0; self.domain.len()];
        for (&v, &value) in self.vars.iter().zip(values) {
            row[v] = value;
        }
        // Down the tree: the root clique's free cells, then each clique's agreeing with
        // its separator's values drawn above it.
        let root: Vec<u32> = (0..beliefs[0].len()).map(cell).collect();
        self.draw_clique(0, &beliefs[0], &root, &mut row, rng);
        for edge in &self.edges {
            let s = edge.free.iter().zip(&edge.sizes).fold(0, |acc, (&v, &size)| acc * size + row[v]);
            let agreeing = &edge.grouped[edge.starts[s]..edge.starts[s + 1]];
            self.draw_clique(edge.child, &beliefs[edge.child], agreeing, &mut row, rng);
        }
        row
    }

    /// One of `cells` (free cells of clique `c`) drawn by its belief, written into `row`.
    fn draw_clique(&self, c: usize, belief: &[f64], cells: &[u32], row: &mut [usize], rng: &mut impl Rng) {
        let plan = &self.cliques[c];
        if plan.free.is_empty() {
            return;
        }
        // Shifted by the largest agreeing cell, so that the cells drawn from never all
        // underflow when the cells that disagree are far likelier.
        let top = cells.iter().map(|&at| belief[at as usize]).fold(f64::NEG_INFINITY, f64::max);
        let weight = |at: usize| if top.is_finite() { (belief[at] - top).exp() } else { 0.0 };
        let weights = cells.iter().map(|&at| (at as usize, weight(at as usize)));
        let mut rest = draw(&cumulative(weights), rng);
        for (&v, &size) in plan.free.iter().zip(&plan.sizes).rev() {
            row[v] = rest % size;
            rest /= size;
        }
    }
}
