//! The pieces of an AIM round that are not releases: the budget schedule, which
//! candidates are eligible, and their quality scores (computed on the exact tables, so
//! private until the exponential mechanism picks one).

use super::plan::AimPlan;
use crate::pgm::GraphicalModel;

/// σ (noise multiplier of a measurement) and ε (of a selection) for the coming round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub sigma: f64,
    pub epsilon: f64,
    selection_share: f64,
}

impl Schedule {
    /// AIM's start: the budget spread evenly over `rounds` rounds, a `selection_share` of
    /// each on the selection.
    pub fn new(plan: &AimPlan) -> Self {
        let (rho, t, a) = (plan.rho, f64::from(plan.rounds), plan.selection_share);
        Self { sigma: (t / (2.0 * (1.0 - a) * rho)).sqrt(), epsilon: (8.0 * a * rho / t).sqrt(), selection_share: a }
    }

    /// ρ of one round: a measurement and a selection.
    pub fn round_cost(&self) -> f64 {
        1.0 / (2.0 * self.sigma * self.sigma) + self.epsilon * self.epsilon / 8.0
    }

    /// With `left` of the budget: when less than two rounds' worth remains, this round
    /// spends all of it (returns true: the last round).
    pub fn fit_to(&mut self, left: f64) -> bool {
        if left > 2.0 * self.round_cost() {
            return false;
        }
        self.sigma = (1.0 / (2.0 * (1.0 - self.selection_share) * left)).sqrt();
        self.epsilon = (8.0 * self.selection_share * left).sqrt();
        true
    }

    /// The last measurement moved the model by less than its noise: spend more per round.
    pub fn anneal(&mut self) {
        self.sigma /= 2.0;
        self.epsilon *= 2.0;
    }
}

/// The candidates (table indices) the model can take on within `limit` cells and can
/// score at a bounded cost: each within one variable of a clique (every pair always; a
/// triple once one of its pairs shares a clique — measuring a triple with none would
/// join three cliques, the model's largest growth). This depends on the model alone.
/// Sizing every candidate's model is the round's second cost: one share per core.
pub fn eligible(plan: &AimPlan, model: &GraphicalModel, limit: f64) -> Vec<usize> {
    let candidates: Vec<usize> = (0..plan.task.tables.len()).filter(|&r| plan.measures(r)).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        let parts: Vec<_> = candidates
            .chunks(candidates.len().div_ceil(threads).max(1))
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .copied()
                        .filter(|&r| {
                            let set = &plan.task.tables[r];
                            model.reaches(set) && model.cells_with(set) <= limit
                        })
                        .collect::<Vec<usize>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().expect("a sizing thread panicked")).collect()
    })
}

/// AIM's quality of each eligible candidate: w_r·(‖M_r(D) − M_r(p̂)‖₁ − √(2/π)·noise·n_r),
/// the model's error on it less the error its measurement would bring (noise: the
/// measurement's standard deviation). `exact` are the private tables: so are the scores.
pub fn qualities(
    plan: &AimPlan,
    offsets: &[usize],
    exact: &[f64],
    model: &GraphicalModel,
    eligible: &[usize],
    noise: f64,
) -> Vec<f64> {
    let expected_noise = (2.0 / std::f64::consts::PI).sqrt() * noise;
    let sets: Vec<Vec<usize>> = eligible.iter().map(|&r| plan.task.tables[r].clone()).collect();
    let estimates = model.marginals_of(&sets);
    eligible
        .iter()
        .zip(estimates)
        .map(|(&r, estimate)| {
            let estimate = estimate.expect("an eligible candidate is reached");
            let truth = &exact[offsets[r]..offsets[r + 1]];
            let error: f64 = truth.iter().zip(&estimate.values).map(|(a, b)| (a - b).abs()).sum();
            plan.weights[r] * (error - expected_noise * truth.len() as f64)
        })
        .collect()
}

/// The quality scores' sensitivity: a unit moves a table by at most m in L1, a score by
/// at most m·w_r (at least m, so that a zero-weight set is still a valid choice).
pub fn quality_sensitivity(plan: &AimPlan, eligible: &[usize]) -> f64 {
    let weight = eligible.iter().map(|&r| plan.weights[r]).fold(1.0, f64::max);
    plan.sensitivity() * weight
}
