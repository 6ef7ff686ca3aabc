//! `[generator.findiff]`.

use serde::{Deserialize, Serialize};

use crate::dpsgd::optimizer::OptimizerSpec;
use crate::dpsgd::run::{DpSgdParams, RunParams, over_defaults};
use crate::generators::params::{DEFAULT_BINS, GeneratorParams, PublicInputs};

/// Parameters of the DP-FinDiff generator (defaults: the paper's, except as noted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinDiffParams {
    /// Rows a unit contributes (the unit's rows are summed before clipping).
    pub max_rows_per_unit: u32,
    /// Denoiser width (paper: 512; 256 trains about 3× faster on a CPU at similar utility).
    pub hidden: usize,
    pub blocks: usize,
    pub time_embedding: usize,
    /// Width of each categorical value's frozen embedding.
    pub embedding_width: usize,
    pub diffusion_steps: u32,
    pub beta_start: f64,
    pub beta_end: f64,
    /// Adaptive timestep sampler P_k(t) ∝ t^α_k, α from `alpha_start` to `alpha_end`.
    pub alpha_start: f64,
    pub alpha_end: f64,
    /// Respaced ancestral sampling steps (≤ diffusion_steps).
    pub sampling_steps: u32,
    /// `[generator.findiff.run]`: the DP-SGD run (defaults: 20 epochs of 128 units, Adam at 10⁻³, 256 units a backward pass, a checkpoint every 100 rounds).
    #[serde(deserialize_with = "over_defaults::<FinDiffParams, _>")]
    pub run: RunParams,
}

impl Default for FinDiffParams {
    fn default() -> Self {
        Self {
            max_rows_per_unit: 1,
            hidden: 256,
            blocks: 2,
            time_embedding: 64,
            embedding_width: 2,
            diffusion_steps: 500,
            beta_start: 1e-4,
            beta_end: 0.02,
            alpha_start: 3.0,
            alpha_end: -1.0,
            sampling_steps: 100,
            run: Self::run_defaults(),
        }
    }
}

impl DpSgdParams for FinDiffParams {
    fn run_defaults() -> RunParams {
        RunParams {
            epochs: 20.0,
            batch_size: 128.0,
            optimizer: OptimizerSpec::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            micro_batch: 256,
            checkpoint_every: 100,
            ..RunParams::default()
        }
    }

    fn run(&self) -> &RunParams {
        &self.run
    }
}

impl GeneratorParams for FinDiffParams {
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    fn default_bins(&self) -> u32 {
        DEFAULT_BINS
    }

    fn draws_histories(&self) -> bool {
        false
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs::none()
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs::none()
    }
}
