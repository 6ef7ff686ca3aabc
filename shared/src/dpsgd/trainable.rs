//! A DP-SGD model as a round carries it to the workers: one wire form for every model (the
//! generator's name and this configuration as JSON, `GradientSum`), so a new model needs no
//! new message. A worker builds the model from it once per job and reads its partitions
//! through it.

use std::future::Future;

use burn::tensor::Device;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::DpModel;
use super::run::DpSgdParams;
use crate::data::DataError;

/// A model's configuration for one round (its weights travel beside it).
pub trait Trainable: Serialize + DeserializeOwned + Send + Sync + 'static {
    type Model: DpModel<Examples: Send + Sync + 'static> + Send + 'static;
    type Error: std::error::Error + Send + Sync + 'static;

    /// The model, built on a worker's first round of the job.
    fn build(&self, device: &Device) -> impl Future<Output = Result<Self::Model, Self::Error>> + Send;

    /// Whether the model's loss draws non-private randomness (a diffusion timestep, a
    /// history's window), so that a loss is averaged over draws.
    const RANDOM_LOSS: bool = true;

    /// The examples of partitions (a worker's own, or an audit's canaries).
    fn load(
        &self,
        urls: &[String],
    ) -> impl Future<Output = Result<<Self::Model as DpModel>::Examples, DataError>> + Send;

    /// Sets what this round changes in the built model (DP-FinDiff's timestep exponent).
    fn prepare(&self, _model: &mut Self::Model) {}
}

/// The parameters of a DP-SGD generator, and the model its rounds train (implemented
/// beside that model, in the generator's `task`).
pub trait Trains: DpSgdParams {
    type Model: Trainable;
}

/// Work done with the model of a DP-SGD generator's rounds, whichever model it is
/// (`GeneratorName::with_trainable` picks it from the generator list).
pub trait WithTrainable {
    type Output;

    fn with<T: Trainable>(self) -> Self::Output;
}
