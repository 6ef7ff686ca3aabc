//! Stage 1: the model learns the rows' format without privacy from public examples
//! (`TextModelSpec::public_examples`: DP-2Stage's pseudo rows drawn uniformly from the
//! declared domain, HARMONIC's public reference rows). Nothing here takes private data:
//! its inputs are the spec's domain, the public reference set, the rows' text layout and a
//! non-private seed.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

use super::model::{TextModel, row_losses};
use super::row_text::RowTokens;
use crate::data::domain::Domain;
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::optimizer::{Optimizer, OptimizerSpec, Schedule};
use crate::dpsgd::params::TrainableLayers;

/// How long stage 1 trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PseudoTraining {
    /// Pseudo rows drawn.
    pub rows: usize,
    /// Rows per step.
    pub batch: usize,
    /// Passes over the pseudo rows.
    pub epochs: f64,
    pub learning_rate: f64,
}

/// `count` rows of bins, each column's bin uniform over its bins.
pub fn pseudo_rows(domain: &Domain, count: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<usize>> {
    (0..count).map(|_| domain.columns.iter().map(|c| rng.random_range(0..c.bins())).collect()).collect()
}

/// Trains `model` on pseudo rows (Adam, cosine schedule) and returns the mean loss of each
/// step (per row, λ-weighted).
pub fn pretrain(model: &mut TextModel, training: &PseudoTraining, seed: u64) -> Result<Vec<f64>, String> {
    if training.rows == 0 || training.batch == 0 || !(training.epochs > 0.0 && training.learning_rate > 0.0) {
        return Err("stage 1 needs rows, batch, epochs and learning_rate above 0".to_string());
    }
    // Pseudo rows uniform over the declared domain (the job passes an OS-drawn seed, tests
    // a fixed one): public randomness, no private row is read.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rows = model.spec.public_examples(training.rows, &mut rng);
    let steps = ((training.epochs * training.rows as f64) / training.batch as f64).ceil().max(1.0) as u64;
    let adam = OptimizerSpec::Adam { lr: training.learning_rate, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let mut optimizer = Optimizer::new(adam, Schedule::Cosine, steps, model.parameter_count());
    let mut parameters: Vec<f64> = model.parameters().into_iter().map(f64::from).collect();
    let mut losses = Vec::with_capacity(steps as usize);
    let started = std::time::Instant::now();
    for step in 0..steps {
        let batch: Vec<(usize, &RowTokens)> =
            (0..training.batch).map(|i| (i, &rows[rng.random_range(0..rows.len())])).collect();
        let tracked = model.tracked();
        let out = row_losses(&tracked, &batch, 0, model.spec.value_weight, model.spec.text.end, &mut Plain);
        let total = out.losses.sum();
        losses.push(f64::from(total.clone().into_scalar::<f32>()) / training.batch as f64);
        let grads = total.backward();
        let gradient: Vec<f64> =
            tracked.flat_gradient(&grads).into_iter().map(|g| f64::from(g) / training.batch as f64).collect();
        optimizer.step(&mut parameters, &gradient);
        let flat: Vec<f32> = parameters.iter().map(|&p| p as f32).collect();
        model.load_parameters(&flat).map_err(|e| e.to_string())?;
        if (step + 1) % (steps / 10).max(1) == 0 {
            let eta = started.elapsed().as_secs_f64() * (steps - step - 1) as f64 / (step + 1) as f64;
            tracing::info!(
                step = step + 1,
                steps,
                loss = losses[step as usize],
                eta_s = eta.round(),
                "stage 1 progress"
            );
        }
    }
    Ok(losses)
}
