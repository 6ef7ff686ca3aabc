//! The worker's side: the model a DP-SGD round trains (its configuration; the round's
//! settings and weights travel beside it), and where its histories come from.

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::histories::Histories;
use super::model::SequenceModel;
use super::params::SequenceParams;
use super::tokens::Layout;
use super::window::WindowSpec;
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::decoder::DecoderConfig;
use crate::dpsgd::trainable::{Trainable, Trains};

/// Everything a worker needs to rebuild the model of a job (no weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SequenceModelSpec {
    pub domain: Domain,
    pub layout: Layout,
    pub transformer: DecoderConfig,
    pub window: WindowSpec,
    /// Sizes of the decoder's lag-1 input tables (`Layout::lag_inputs`); empty in a model
    /// charged before they existed (a checkpoint resumed across the upgrade).
    #[serde(default)]
    pub lagged: Vec<usize>,
}

impl SequenceModelSpec {
    /// The worker's histories from its partitions (a unit's rows are in one partition),
    /// grouped as they are read.
    pub async fn load_histories(&self, urls: &[String]) -> Result<Histories, DataError> {
        Histories::load(urls, &self.domain, &self.layout).await
    }
}

impl Trains for SequenceParams {
    type Model = SequenceModelSpec;
}

impl Trainable for SequenceModelSpec {
    type Model = SequenceModel;
    type Error = std::convert::Infallible;

    async fn build(&self, device: &Device) -> Result<SequenceModel, Self::Error> {
        Ok(SequenceModel::new(self, device))
    }

    async fn load(&self, urls: &[String]) -> Result<Histories, DataError> {
        self.load_histories(urls).await
    }
}
