//! The worker's side: the model a DP-SGD round trains (its configuration and this round's
//! timestep exponent) and its wire form; the round itself is the engine's (`crate::dpsgd`).

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::diffusion::Schedule;
use super::encoding::TabularEncoding;
use super::model::{DenoiserConfig, FinDiffModel};
use super::params::FinDiffParams;
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::examples::Examples;
use crate::dpsgd::trainable::{Trainable, Trains};

/// Everything a worker needs to rebuild the model of a job (no weights).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FinDiffModelSpec {
    pub domain: Domain,
    pub encoding: TabularEncoding,
    pub denoiser: DenoiserConfig,
    pub diffusion_steps: u32,
    pub beta_start: f64,
    pub beta_end: f64,
    pub max_rows_per_unit: u32,
}

impl FinDiffModelSpec {
    pub fn schedule(&self) -> Schedule {
        Schedule::linear(self.diffusion_steps, self.beta_start, self.beta_end)
    }

    /// The worker's examples: its partitions encoded into the feature space.
    pub async fn load_examples(&self, urls: &[String]) -> Result<Examples, DataError> {
        Examples::load(urls, &self.domain, self.max_rows_per_unit, self.encoding.width, |batch, row, out| {
            self.encoding.encode_row(batch, row, out)
        })
        .await
    }
}

/// The model of one DP-SGD round of a DP-FinDiff job, as a worker receives it (the
/// round's settings and weights travel beside it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FinDiffRound {
    pub model: FinDiffModelSpec,
    /// α_k of the adaptive timestep sampler for this round's epoch.
    pub timestep_exponent: f64,
}

impl Trains for FinDiffParams {
    type Model = FinDiffRound;
}

impl Trainable for FinDiffRound {
    type Model = FinDiffModel;
    type Error = std::convert::Infallible;

    async fn build(&self, device: &Device) -> Result<FinDiffModel, Self::Error> {
        Ok(FinDiffModel::new(&self.model, device))
    }

    async fn load(&self, urls: &[String]) -> Result<Examples, DataError> {
        self.model.load_examples(urls).await
    }

    fn prepare(&self, model: &mut FinDiffModel) {
        model.set_timestep_exponent(self.timestep_exponent);
    }
}
