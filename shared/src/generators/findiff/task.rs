//! The worker's side: the model a DP-SGD round trains (its configuration and this round's
//! timestep exponent) and its wire form; the round itself is the engine's (`crate::dpsgd`).

use serde::{Deserialize, Serialize};

use super::diffusion::Schedule;
use super::encoding::TabularEncoding;
use super::model::DenoiserConfig;
use crate::data::domain::Domain;
use crate::data::examples::Examples;

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
    pub async fn load_examples(&self, urls: &[String]) -> Result<Examples, crate::data::DataError> {
        Examples::load(urls, &self.domain, self.max_rows_per_unit, self.encoding.width, |batch, row, out| {
            self.encoding.encode_row(batch, row, out)
        })
        .await
    }
}

/// The model of one DP-SGD round of a DP-FinDiff job, as a worker receives it (the
/// round's settings and weights travel beside it).
#[derive(Clone, Debug)]
pub struct FinDiffRound {
    pub model: FinDiffModelSpec,
    /// α_k of the adaptive timestep sampler for this round's epoch.
    pub timestep_exponent: f64,
}

/// The round's model as `FinDiffModel` (`rhosynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::FinDiffModel;

    use super::FinDiffRound;
    use crate::wire::{WireError, from_json, to_json};

    impl From<&FinDiffRound> for FinDiffModel {
        fn from(round: &FinDiffRound) -> Self {
            Self { spec_json: to_json(&round.model), timestep_exponent: round.timestep_exponent }
        }
    }

    impl TryFrom<&FinDiffModel> for FinDiffRound {
        type Error = WireError;

        fn try_from(wire: &FinDiffModel) -> Result<Self, WireError> {
            Ok(Self {
                model: from_json("DP-FinDiff model", &wire.spec_json)?,
                timestep_exponent: wire.timestep_exponent,
            })
        }
    }
}
