//! The graphical model that best explains noisy marginals, and rows drawn from it.
//!
//! Private-PGM's estimator (McKenna, Sheldon & Miklau 2019): among distributions of the
//! junction tree's form, scaled to an estimated total, the one minimising
//! Σᵢ ‖μ(rᵢ) − yᵢ‖² / σᵢ² over the measurements yᵢ of sets rᵢ with noise σᵢ; found by
//! entropic mirror descent on the cliques' log potentials with a backtracking step.
//! Everything here is post-processing of released measurements.

use rand::seq::SliceRandom;
use rand::{Rng, RngExt};

use super::conditioning;
use super::factor::Factor;
use super::given::Given;
use super::junction::JunctionTree;

/// A released noisy marginal: counts over `vars` (ascending), drawn with noise σ.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    pub vars: Vec<usize>,
    pub counts: Vec<f64>,
    pub sigma: f64,
}

/// A fitted model: the tree, each clique's marginal (in counts) and the total.
pub struct GraphicalModel {
    domain: Vec<usize>,
    tree: JunctionTree,
    /// Log potentials per clique (where a refit starts).
    potentials: Vec<Factor>,
    marginals: Vec<Factor>,
    pub total: f64,
    /// The last accepted step size (where a refit's search starts).
    step: f64,
    /// The sets of the measurements it was fitted to (ascending, each once).
    measured: Vec<Vec<usize>>,
}

/// A measurement, the clique that holds its set, and the cell of the measurement each of
/// that clique's cells falls in.
struct Measured<'a> {
    clique: usize,
    measurement: &'a Measurement,
    cells: Vec<usize>,
}

/// The measurements' squared error (weighted) and its gradient on every clique marginal.
fn loss(tree: &JunctionTree, measured: &[Measured<'_>], marginals: &[Factor]) -> (f64, Vec<Factor>) {
    let mut gradient: Vec<Factor> =
        marginals.iter().map(|m| Factor { values: vec![0.0; m.values.len()], ..m.clone() }).collect();
    let mut total = 0.0;
    for Measured { clique: c, measurement: m, cells } in measured {
        let c = *c;
        let mut residual = marginals[c].sum_mapped(&m.vars, cells);
        let weight = 1.0 / (m.sigma * m.sigma);
        for (r, y) in residual.values.iter_mut().zip(&m.counts) {
            *r -= y;
            total += weight * *r * *r;
        }
        gradient[c].add_mapped(&residual, cells, 2.0 * weight);
    }
    debug_assert_eq!(gradient.len(), tree.cliques.len());
    (total, gradient)
}

fn dot(a: &[Factor], b: &[Factor], c: &[Factor]) -> f64 {
    a.iter()
        .zip(b.iter().zip(c))
        .map(|(a, (b, c))| {
            a.values.iter().zip(b.values.iter().zip(&c.values)).map(|(x, (y, z))| x * (y - z)).sum::<f64>()
        })
        .sum()
}

impl GraphicalModel {
    /// Fits the model over variables with `domain[v]` values to the measurements, with at
    /// most `iterations` mirror-descent steps.
    pub fn fit(domain: &[usize], measurements: &[Measurement], iterations: usize) -> Self {
        Self::fit_from(domain, measurements, iterations, None)
    }

    /// Fits to `measurements` (this model's and more) starting from this model: its
    /// cliques stay inside the new tree's, so its distribution is the starting point.
    pub fn refit(&self, measurements: &[Measurement], iterations: usize) -> Self {
        Self::fit_from(&self.domain, measurements, iterations, Some(self))
    }

    fn fit_from(domain: &[usize], measurements: &[Measurement], iterations: usize, start: Option<&Self>) -> Self {
        let mut sets: Vec<Vec<usize>> = measurements.iter().map(|m| m.vars.clone()).collect();
        sets.extend(start.iter().flat_map(|s| s.tree.cliques.iter().cloned()));
        let tree = JunctionTree::new(domain, &sets);
        let measured: Vec<Measured<'_>> = measurements
            .iter()
            .map(|measurement| {
                let clique = tree.clique_of(&measurement.vars).expect("every set is in a clique");
                let cells = Factor::filled(&tree.cliques[clique], domain, 0.0).cells_in(&measurement.vars);
                Measured { clique, measurement, cells }
            })
            .collect();
        let total = estimated_total(measurements);
        let mut theta: Vec<Factor> = tree.cliques.iter().map(|c| Factor::filled(c, domain, 0.0)).collect();
        if let Some(start) = start {
            for (clique, potential) in start.tree.cliques.iter().zip(&start.potentials) {
                theta[tree.clique_of(clique).expect("old cliques are covered")].add_broadcast(potential, 1.0);
            }
        }
        let mut marginals = tree.marginals(&theta, total);
        let (mut current, mut gradient) = loss(&tree, &measured, &marginals);
        // The step in log-potential units per unit of gradient (the gradient scales as
        // 1/σ², the marginals as the total); doubled before each iteration, halved until
        // the loss falls enough (Armijo).
        let sigma = measurements.iter().map(|m| m.sigma).fold(f64::INFINITY, f64::min);
        let mut step = match start {
            Some(s) => s.step,
            None if sigma.is_finite() => sigma * sigma / (total * total),
            None => 1.0,
        };
        for _ in 0..iterations {
            step *= 2.0;
            let mut accepted = false;
            for _ in 0..30 {
                let trial: Vec<Factor> = theta
                    .iter()
                    .zip(&gradient)
                    .map(|(t, g)| {
                        let mut t = t.clone();
                        t.add_broadcast(g, -step);
                        t
                    })
                    .collect();
                let trial_marginals = tree.marginals(&trial, total);
                let (trial_loss, trial_gradient) = loss(&tree, &measured, &trial_marginals);
                if current - trial_loss >= 0.5 * dot(&gradient, &marginals, &trial_marginals) {
                    (theta, marginals, current, gradient) = (trial, trial_marginals, trial_loss, trial_gradient);
                    accepted = true;
                    break;
                }
                step *= 0.5;
            }
            if !accepted {
                // No step lowers the loss: at the optimum up to rounding, or stuck.
                tracing::debug!(loss = current, "graphical model fit stopped early");
                break;
            }
        }
        let mut measured: Vec<Vec<usize>> = measurements.iter().map(|m| m.vars.clone()).collect();
        measured.sort_unstable();
        measured.dedup();
        Self { domain: domain.to_vec(), tree, potentials: theta, marginals, total, step, measured }
    }

    /// Cells of the model's cliques together.
    pub fn cells(&self) -> f64 {
        self.tree.cells(&self.domain)
    }

    /// Cells of the cliques a model would need to hold these sets and this model's.
    pub fn cells_with(&self, set: &[usize]) -> f64 {
        if self.tree.clique_of(set).is_some() {
            return self.cells();
        }
        let mut sets = self.tree.cliques.clone();
        sets.push(set.to_vec());
        JunctionTree::cells_for(&self.domain, &sets)
    }

    /// Whether [`Self::marginals_of`] reaches `set`: it lies in one clique but for at most
    /// one variable.
    pub fn reaches(&self, set: &[usize]) -> bool {
        conditioning::reach(&self.tree, &self.domain, set).is_some()
    }

    /// The model's marginals (in counts) of many sets at once, each exact, at a cost
    /// bounded by the model's cells times the values of the variables joined, plus one
    /// sum per set; `None` for a set it does not [reach](Self::reaches).
    pub fn marginals_of(&self, sets: &[Vec<usize>]) -> Vec<Option<Factor>> {
        conditioning::marginals_of(&self.tree, &self.marginals, &self.domain, sets)
    }

    /// The model's marginal (in counts) of any set of variables (ascending). Inside a
    /// clique it is that clique's marginal summed down; across cliques, the tree's
    /// factorisation p = Π p_C / Π p_S over the smallest subtree covering the set, with
    /// every other variable summed out leaf by leaf (a variable left in a subtree reaches
    /// the rest only through the separator, by the running-intersection property).
    pub fn marginal(&self, vars: &[usize]) -> Factor {
        if let Some(c) = self.tree.clique_of(vars) {
            return self.marginals[c].sum_to(vars);
        }
        let k = self.tree.cliques.len();
        let mut parent = vec![usize::MAX; k];
        for &(p, c) in &self.tree.edges {
            parent[c] = p;
        }
        // The subtree: from each variable's first clique up to the root, then pruned of
        // leaves that hold no needed clique.
        let needed: Vec<usize> = vars
            .iter()
            .map(|v| self.tree.cliques.iter().position(|c| c.contains(v)).expect("every variable"))
            .collect();
        let mut inside = vec![false; k];
        for &c in &needed {
            let mut at = c;
            while at != usize::MAX && !inside[at] {
                inside[at] = true;
                at = parent[at];
            }
        }
        // The top of the subtree: the root's chain down to where needed paths branch.
        let mut top = 0;
        loop {
            let children: Vec<usize> =
                self.tree.edges.iter().filter(|e| e.0 == top && inside[e.1]).map(|e| e.1).collect();
            if children.len() != 1 || needed.contains(&top) {
                break;
            }
            inside[top] = false;
            top = children[0];
        }
        let ln_total = self.total.ln();
        let mut messages: Vec<Option<Factor>> = vec![None; k];
        for &(p, c) in self.tree.edges.iter().rev() {
            if !inside[c] || !inside[p] {
                continue;
            }
            let separator = self.tree.separator(p, c);
            let belief = self.subtree_belief(c, &messages, vars, &separator);
            let mut sep = self.marginals[c].sum_to(&separator);
            sep.values.iter_mut().for_each(|v| *v = v.ln() - ln_total);
            let mut target: Vec<usize> =
                separator.iter().chain(belief.vars.iter().filter(|v| vars.contains(v))).copied().collect();
            target.sort_unstable();
            target.dedup();
            let mut belief = belief;
            belief.add_broadcast(&sep, -1.0);
            messages[c] = Some(belief.logsumexp_to(&target));
        }
        let mut root = self.subtree_belief(top, &messages, vars, &[]).logsumexp_to(vars);
        root.values.iter_mut().for_each(|v| *v = self.total * v.exp());
        root
    }

    /// A clique's log-probability table times its children's messages. The clique's own
    /// variables that are neither kept, nor in the separator to its parent, nor in a
    /// message are summed out first (nothing else involves them), so the product is over
    /// no more than what the message up needs.
    fn subtree_belief(&self, c: usize, messages: &[Option<Factor>], keep: &[usize], parent: &[usize]) -> Factor {
        let incoming: Vec<&Factor> =
            self.tree.edges.iter().filter(|e| e.0 == c).filter_map(|e| messages[e.1].as_ref()).collect();
        let needed: Vec<usize> = self.tree.cliques[c]
            .iter()
            .copied()
            .filter(|v| keep.contains(v) || parent.contains(v) || incoming.iter().any(|m| m.vars.contains(v)))
            .collect();
        let mut vars = needed.clone();
        vars.extend(incoming.iter().flat_map(|m| m.vars.iter().copied().filter(|v| keep.contains(v))));
        vars.sort_unstable();
        vars.dedup();
        let mut belief = Factor::filled(&vars, &self.domain, 0.0);
        let mut clique = self.marginals[c].sum_to(&needed);
        let ln_total = self.total.ln();
        clique.values.iter_mut().for_each(|v| *v = v.ln() - ln_total);
        belief.add_broadcast(&clique, 1.0);
        for m in incoming {
            belief.add_broadcast(m, 1.0);
        }
        belief
    }

    /// The model given that each listed variable takes one of its allowed values (mask
    /// by value): the excluded values' potentials set to (effectively) −∞ and the marginals
    /// recomputed, so rows drawn from it are draws from the model conditioned on the event.
    pub fn conditioned(&self, allowed: &[(usize, Vec<bool>)]) -> Self {
        /// A log potential whose exponential is zero beside any finite one.
        const EXCLUDED: f64 = -1e30;
        let mut potentials = self.potentials.clone();
        for (v, mask) in allowed {
            let c = self.tree.clique_of(&[*v]).expect("a variable of the model");
            let values = potentials[c].cells_in(&[*v]);
            for (p, &value) in potentials[c].values.iter_mut().zip(&values) {
                if !mask[value] {
                    *p = EXCLUDED;
                }
            }
        }
        self.with_potentials(potentials)
    }

    /// The model with each of `tilts` (log weights over a set inside one of its cliques)
    /// added to its clique's log potential: its distribution reweighted by their product.
    pub fn tilted(&self, tilts: &[Factor]) -> Self {
        let mut potentials = self.potentials.clone();
        for tilt in tilts {
            let c = self.tree.clique_of(&tilt.vars).expect("a tilt inside a clique");
            potentials[c].add_broadcast(tilt, 1.0);
        }
        self.with_potentials(potentials)
    }

    /// This model's tree and total with other log potentials.
    fn with_potentials(&self, potentials: Vec<Factor>) -> Self {
        let marginals = self.tree.marginals(&potentials, self.total);
        let (domain, tree, measured) = (self.domain.clone(), self.tree.clone(), self.measured.clone());
        Self { domain, tree, potentials, marginals, measured, ..*self }
    }

    /// The sets of the measurements it was fitted to.
    pub fn measured(&self) -> &[Vec<usize>] {
        &self.measured
    }

    /// Rows drawn given values of `vars`, planned once for that set of variables
    /// ([`Given::draw`], from this model or a tilt of it): each row the law of conditioning
    /// the model on its values and drawing one row, at the cost of the free variables'
    /// cells only.
    pub fn given(&self, vars: &[usize]) -> Given {
        Given::plan(&self.tree, &self.potentials, &self.domain, vars)
    }

    /// Its cliques' log potentials (what a plan of [`Self::given`] draws from).
    pub(super) fn potentials(&self) -> &[Factor] {
        &self.potentials
    }

    /// Draws `rows` rows (a value index per variable) from the model, clique by clique
    /// down the tree: the root clique's cells first, then each clique's cells given its
    /// separator with its parent. Within each group of rows sharing a separator value, a
    /// cell's count is n·p rounded up or down at random (like Private-PGM's
    /// `synthetic_data`, but systematic, hence unbiased; far less variable than n
    /// independent draws), the cells then shuffled over the group's rows.
    pub fn sample(&self, rows: usize, rng: &mut impl Rng) -> Vec<Vec<usize>> {
        let mut out = vec![vec![0; self.domain.len()]; rows];
        let root = &self.marginals[0];
        let all: Vec<usize> = (0..rows).collect();
        assign(root, &all, &rounded_cells(root.values.iter().copied().enumerate(), rows, rng), &mut out);
        for &(p, c) in &self.tree.edges {
            let separator = self.tree.separator(p, c);
            let clique = &self.marginals[c];
            let cells = clique.cells_in(&separator);
            // Each separator variable with its size in the clique, as `cells_in` orders them.
            let sizes: Vec<(usize, usize)> = separator
                .iter()
                .map(|&v| (v, clique.sizes[clique.vars.iter().position(|&w| w == v).expect("in the clique")]))
                .collect();
            let groups = sizes.iter().map(|&(_, size)| size).product();
            let mut by_separator: Vec<Vec<(usize, f64)>> = vec![Vec::new(); groups];
            for (i, (&value, &s)) in clique.values.iter().zip(&cells).enumerate() {
                by_separator[s].push((i, value));
            }
            let mut members: Vec<Vec<usize>> = vec![Vec::new(); groups];
            for (r, row) in out.iter().enumerate() {
                members[sizes.iter().fold(0, |acc, &(v, size)| acc * size + row[v])].push(r);
            }
            for (group, rows) in members.iter().enumerate().filter(|(_, rows)| !rows.is_empty()) {
                let drawn = rounded_cells(by_separator[group].iter().copied(), rows.len(), rng);
                assign(clique, rows, &drawn, &mut out);
            }
        }
        out
    }
}

/// Writes each row's drawn cell of `clique` into its variables (last fastest).
fn assign(clique: &Factor, rows: &[usize], cells: &[usize], out: &mut [Vec<usize>]) {
    for (&r, &cell) in rows.iter().zip(cells) {
        let mut rest = cell;
        for (i, &v) in clique.vars.iter().enumerate().rev() {
            out[r][v] = rest % clique.sizes[i];
            rest /= clique.sizes[i];
        }
    }
}

/// `n` cells, in random order, from weighted cells (uniform if none has mass): each cell
/// n·p times rounded down, the remainder's cells chosen by systematic sampling on the
/// fractional parts, so each cell's count is ⌊n·p⌋ or ⌈n·p⌉ and n·p on average.
pub(crate) fn rounded_cells(cells: impl Iterator<Item = (usize, f64)>, n: usize, rng: &mut impl Rng) -> Vec<usize> {
    let mut cells: Vec<(usize, f64)> = cells.map(|(i, w)| (i, w.max(0.0))).collect();
    let mut total: f64 = cells.iter().map(|(_, w)| w).sum();
    if !(total > 0.0) {
        cells.iter_mut().for_each(|c| c.1 = 1.0);
        total = cells.len() as f64;
    }
    let mut out = Vec::with_capacity(n);
    let mut fractions = Vec::with_capacity(cells.len());
    for &(i, w) in &cells {
        let expected = n as f64 * w / total;
        let whole = expected.floor();
        out.extend(std::iter::repeat_n(i, whole as usize));
        fractions.push(expected - whole);
    }
    // The fractions sum to the rows still missing (up to rounding): one uniform offset
    // below 1, then each unit step of their running sum picks the cell it lands in.
    let mut next = rng.random::<f64>();
    let mut running = 0.0;
    let mut picked = vec![false; cells.len()];
    for (k, (&(i, _), f)) in cells.iter().zip(&fractions).enumerate() {
        running += f;
        if next < running && out.len() < n {
            out.push(i);
            picked[k] = true;
            next += 1.0;
        }
    }
    // Floating-point rounding can leave a row unpicked: the largest fraction not yet
    // picked takes it, so no count goes past ⌈n·p⌉.
    while out.len() < n {
        let k = (0..cells.len())
            .filter(|&k| !picked[k])
            .max_by(|&a, &b| fractions[a].total_cmp(&fractions[b]))
            .expect("fewer rows missing than cells unpicked");
        out.push(cells[k].0);
        picked[k] = true;
    }
    out.shuffle(rng);
    out
}

/// The total the measurements imply: each one's sum, weighted by the inverse of its
/// variance (σ² per cell).
fn estimated_total(measurements: &[Measurement]) -> f64 {
    let (weighted, weights) = measurements.iter().fold((0.0, 0.0), |(s, w), m| {
        let weight = 1.0 / (m.sigma * m.sigma * m.counts.len() as f64);
        (s + weight * m.counts.iter().sum::<f64>(), w + weight)
    });
    if weights > 0.0 { (weighted / weights).max(1.0) } else { 1.0 }
}

/// The cells' cumulative probabilities (uniform if no cell has mass: a separator value
/// whose probability underflowed).
pub(crate) fn cumulative(cells: impl Iterator<Item = (usize, f64)>) -> Vec<(f64, usize)> {
    let mut cells: Vec<(usize, f64)> = cells.map(|(i, w)| (i, w.max(0.0))).collect();
    let mut total: f64 = cells.iter().map(|(_, w)| w).sum();
    if !(total > 0.0) {
        cells.iter_mut().for_each(|c| c.1 = 1.0);
        total = cells.len() as f64;
    }
    let mut acc = 0.0;
    cells
        .into_iter()
        .map(|(i, w)| {
            acc += w / total;
            (acc, i)
        })
        .collect()
}

/// A cell drawn from its cumulative probabilities.
pub(crate) fn draw(table: &[(f64, usize)], rng: &mut impl Rng) -> usize {
    let u: f64 = rng.random();
    let at = table.partition_point(|&(c, _)| c <= u).min(table.len().saturating_sub(1));
    table.get(at).map_or(0, |&(_, i)| i)
}
