//! Stage 1 (#39): the model trained without clipping or noise on histories it may read
//! freely, a public reference set or a charged release of the same dataset (such as a
//! history copula job's, which keeps each column's lag-1 dynamics at cohort sizes where
//! DP-SGD from random weights learns none), before DP-SGD on the private histories. The
//! ceiling benchmark trains the same way on simulated cohorts.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::histories::Histories;
use super::model::SequenceModel;
use super::params::PlainTraining;
use super::tokens::Layout;
use crate::data::domain::Domain;
use crate::dpsgd::DpModel;
use crate::dpsgd::compute_device;
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::optimizer::{Optimizer, OptimizerSpec, Schedule};
use crate::dpsgd::params::TrainableLayers;
use crate::generators::reference::{ReferenceError, ReferenceTable};
use crate::output::Manifest;
use crate::spec::JobSpec;

/// The most rows, and values in all, of a reference set stage 1 reads (a history cut
/// there is shorter), so that the coordinator's memory is bounded before admission.
const REFERENCE_ROWS: usize = 1_000_000;
const REFERENCE_CELLS: usize = 20_000_000;
/// Bounds of stage 1's training, so that its time is bounded before admission.
pub const MAX_PRETRAIN_STEPS: u64 = 20_000;
pub const MAX_PRETRAIN_BATCH: usize = 1024;

/// Stage 1 as the spec asks for it: where the reference set is, and how to train on it.
#[derive(Clone, Debug, PartialEq)]
pub struct StageOne {
    pub reference: String,
    pub training: PlainTraining,
}

/// Trains `model` on `histories`; returns each step's loss per unit.
pub fn train_plain(model: &mut SequenceModel, histories: &Histories, training: &PlainTraining, seed: u64) -> Vec<f64> {
    let device = compute_device();
    // Batches of stage 1's reference histories (the job passes an OS-drawn seed, tests a
    // fixed one): public randomness, the reference set is public.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let adam = OptimizerSpec::Adam { lr: training.learning_rate, beta1: 0.9, beta2: 0.999, eps: 1e-8 };
    let mut optimizer = Optimizer::new(adam, Schedule::Cosine, training.steps, model.parameter_count());
    let mut parameters: Vec<f64> = model.parameters().into_iter().map(f64::from).collect();
    let mut losses = Vec::with_capacity(training.steps as usize);
    for _ in 0..training.steps {
        let units: Vec<usize> = (0..training.batch).map(|_| rng.random_range(0..histories.units.len())).collect();
        let windows_seed: [u8; 32] = rng.random();
        let tracked = model.tracked();
        let total = tracked.losses(histories, &units, &windows_seed, &device, &mut Plain).losses.sum();
        losses.push(f64::from(total.clone().into_scalar::<f32>()) / training.batch as f64);
        let gradient: Vec<f64> = tracked
            .flat_gradient(&total.backward())
            .into_iter()
            .map(|g| f64::from(g) / training.batch as f64)
            .collect();
        optimizer.step(&mut parameters, &gradient);
        let flat: Vec<f32> = parameters.iter().map(|&p| p as f32).collect();
        model.load_parameters(&flat).expect("the model's own parameter count");
    }
    losses
}

/// The histories of the reference set at `url` in `layout` (each unit's first
/// `max_rows` rows, in order), what was read, and a release's manifest with the SHA-256
/// of its bytes.
pub async fn reference_histories(
    spec: &JobSpec,
    domain: &Domain,
    url: &str,
    layout: &Layout,
) -> Result<(Histories, String, Option<(Manifest, String)>), ReferenceError> {
    let rows = REFERENCE_ROWS.min(REFERENCE_CELLS / domain.columns.len().max(1));
    let ReferenceTable { table, read, manifest } = ReferenceTable::load(spec, domain, url, rows).await?;
    let rows = (0..table.rows()).map(|r| (table.units[r].clone(), table.columns.iter().map(|c| c[r]).collect()));
    let histories = Histories::from_rows(rows, layout);
    if histories.units.is_empty() {
        return Err(ReferenceError::Invalid { url: url.to_string(), message: "it holds no rows".into() });
    }
    let read = format!("{read}: {} histories", histories.units.len());
    Ok((histories, read, manifest))
}
