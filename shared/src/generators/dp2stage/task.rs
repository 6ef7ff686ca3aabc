//! The worker's side: the model a DP-SGD round trains (the checkpoint's URL, how it is cut
//! down and adapted, how rows read) and its wire form, and the worker's rows as text,
//! grouped by unit; the round itself is the engine's (`crate::dpsgd`).

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::model::{TextModel, TextModelSpec, TextRows};
use super::params::LanguageModelParams;
use super::pretrain::PseudoTraining;
use super::row_text::RowTokens;
use crate::data::DataError;
use crate::data::examples::Examples;
use crate::decoder::CheckpointError;
use crate::decoder::checkpoint::fetch;
use crate::dpsgd::trainable::{Trainable, Trains};
use crate::eval::par_map;

/// Everything a worker needs to rebuild a DP-2Stage job's model (weights travel apart).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dp2StageModelSpec {
    /// Where the public pretrained weights are, and the SHA-256 of what the plan read
    /// there: every later read must find the same bytes.
    pub checkpoint: String,
    pub checkpoint_sha256: String,
    pub model: TextModelSpec,
    pub max_rows_per_unit: u32,
    /// Stage 1, which the coordinator runs before the charge.
    pub pseudo: PseudoTraining,
}

impl Dp2StageModelSpec {
    /// The pretrained checkpoint (the bytes the job was planned with), cut down and adapted
    /// as the spec says; built on a blocking thread.
    pub async fn load_model(&self, device: &Device) -> Result<TextModel, CheckpointError> {
        let fetched = fetch(&self.checkpoint).await?;
        if fetched.sha256 != self.checkpoint_sha256 {
            return Err(CheckpointError::Read {
                url: self.checkpoint.clone(),
                message: "the checkpoint changed since the job was planned".into(),
            });
        }
        let (spec, device) = (self.model.clone(), device.clone());
        tokio::task::spawn_blocking(move || {
            let decoder = fetched.checkpoint.load(&device)?;
            TextModel::new(&spec, decoder, &device).map_err(CheckpointError::Format)
        })
        .await
        .map_err(|_| CheckpointError::Read {
            url: self.checkpoint.clone(),
            message: "building the model stopped".into(),
        })?
    }

    /// The worker's rows as examples, at most `max_rows_per_unit` of each unit (a uniform
    /// subset drawn with a CSPRNG); prompted by public reference rows only.
    pub async fn load_rows(&self, urls: &[String]) -> Result<TextRows, DataError> {
        let domain = &self.model.domain;
        let columns = domain.columns.len();
        let examples = Examples::load(urls, domain, self.max_rows_per_unit, columns, |batch, row, out| {
            for (c, column) in domain.columns.iter().enumerate() {
                out[c] = column.bin(batch.values[c][row]) as f32;
            }
        })
        .await?;
        // Each row as an example (HARMONIC's nearest-row searches on every core), off the
        // runtime: its heartbeats must keep going meanwhile.
        let model = self.model.clone();
        let encode = move || {
            let rows: Vec<(usize, usize)> = examples
                .units
                .iter()
                .enumerate()
                .flat_map(|(u, (_, rows))| rows.clone().map(move |r| (u, r)))
                .collect();
            let encoded = par_map(&rows, |&(_, r)| {
                let bins: Vec<usize> = examples.x[r * columns..(r + 1) * columns].iter().map(|&b| b as usize).collect();
                model.example(&bins, None)
            });
            let mut units: Vec<Vec<RowTokens>> = vec![Vec::new(); examples.units.len()];
            for ((u, _), example) in rows.into_iter().zip(encoded) {
                units[u].push(example);
            }
            TextRows { units }
        };
        tokio::task::spawn_blocking(encode).await.map_err(|_| DataError::Internal("encoding the rows stopped".into()))
    }
}

impl Trains for LanguageModelParams {
    type Model = Dp2StageModelSpec;
}

impl Trainable for Dp2StageModelSpec {
    type Model = TextModel;
    type Error = CheckpointError;

    async fn build(&self, device: &Device) -> Result<TextModel, CheckpointError> {
        self.load_model(device).await
    }

    /// A language model's loss has no randomness.
    const RANDOM_LOSS: bool = false;

    async fn load(&self, urls: &[String]) -> Result<TextRows, DataError> {
        self.load_rows(urls).await
    }
}
