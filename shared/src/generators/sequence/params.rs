//! `[generator.sequence]`.

use serde::{Deserialize, Serialize};

use crate::dpsgd::run::{DpSgdParams, RunParams, over_defaults};
use crate::generators::params::{DEFAULT_BINS, DEFAULT_GAP_BINS, GeneratorParams, PublicInputs};

/// Parameters of the sequence generator: whole unit histories as token sequences, a
/// decoder-only transformer trained with user-level DP-SGD (defaults train the demo's
/// 10,000 ICU patients in minutes on 2 CPU cores).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequenceParams {
    /// Columns that hold one value per unit, written once per history (from its first row).
    pub static_columns: Vec<String>,
    /// Rows of a history the model sees (its first ones in order) and the most a synthetic
    /// history has.
    pub max_rows: usize,
    /// Rows of a training window that carry the loss, and rows of context before them.
    pub window_rows: usize,
    pub context_rows: usize,
    /// Probability that a training window starts at the history's beginning.
    pub p_start: f64,
    /// Refinement tokens within a numeric bin.
    pub fine: u32,
    /// Geometric bins of the gap between consecutive order values.
    pub gap_bins: u32,
    /// Transformer: width, attention heads, blocks, MLP hidden width.
    pub width: usize,
    pub heads: usize,
    pub layers: usize,
    pub mlp: usize,
    /// Softmax temperature of sampling (post-processing; below 1 draws nearer the model's
    /// modes, trading diversity for typicality).
    pub temperature: f64,
    /// ε of the private selection among over-generated histories, part of the job's ε
    /// (its noise is calibrated to it alone; the run's σ to what is left); absent: none.
    pub select_epsilon: Option<f64>,
    /// Candidates drawn per output unit for the selection.
    pub select_candidates: f64,
    /// Votes a unit casts, for its nearest candidates (L2 sensitivity √k).
    pub select_neighbours: usize,
    /// Share of the job's budget (in zCDP terms, where Gaussian releases add up) spent on
    /// the released histogram of history lengths (one cell per length up to `max_rows`,
    /// sensitivity 1 under add/remove) that synthetic histories take their lengths from;
    /// the run's σ is calibrated to the rest. 0: the model draws lengths (it learns them
    /// only from windows that start a history).
    pub length_share: f64,
    /// Stage 1: a public table or a rhosynth release in this job's schema (such as a
    /// history copula job's output on the same dataset, charged in its ledger), never
    /// private data. The model is trained on its histories without noise before DP-SGD
    /// (post-processing of what its charge paid for). Absent: DP-SGD from random weights.
    pub reference: Option<String>,
    /// Stage 1's Adam steps (cosine schedule), units a step and learning rate.
    pub pretrain_steps: u64,
    pub pretrain_batch: usize,
    pub pretrain_learning_rate: f64,
    /// `[generator.sequence.run]`: the DP-SGD run (defaults: 8 epochs of 256 units, Adam at 3·10⁻³, 64 units a backward pass).
    #[serde(deserialize_with = "over_defaults::<SequenceParams, _>")]
    pub run: RunParams,
}

impl Default for SequenceParams {
    fn default() -> Self {
        Self {
            static_columns: Vec::new(),
            max_rows: 50,
            window_rows: 8,
            context_rows: 2,
            p_start: 0.25,
            fine: 8,
            gap_bins: DEFAULT_GAP_BINS,
            width: 64,
            heads: 4,
            layers: 2,
            mlp: 128,
            temperature: 1.0,
            select_epsilon: None,
            select_candidates: 4.0,
            select_neighbours: 4,
            length_share: 0.05,
            reference: None,
            pretrain_steps: 1500,
            pretrain_batch: 16,
            pretrain_learning_rate: 0.01,
            run: Self::run_defaults(),
        }
    }
}

/// Ordinary minibatch training: `steps` Adam steps (cosine schedule) over `batch` units
/// drawn uniformly, each a training window as DP-SGD draws it.
#[derive(Clone, Debug, PartialEq)]
pub struct PlainTraining {
    pub steps: u64,
    pub batch: usize,
    pub learning_rate: f64,
}

impl SequenceParams {
    /// Stage 1's training, as the spec sets it.
    pub fn pretraining(&self) -> PlainTraining {
        PlainTraining {
            steps: self.pretrain_steps,
            batch: self.pretrain_batch,
            learning_rate: self.pretrain_learning_rate,
        }
    }
}

impl DpSgdParams for SequenceParams {
    fn run_defaults() -> RunParams {
        RunParams::default()
    }

    fn run(&self) -> &RunParams {
        &self.run
    }
}

impl GeneratorParams for SequenceParams {
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    fn default_bins(&self) -> u32 {
        DEFAULT_BINS
    }

    fn draws_histories(&self) -> bool {
        true
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs { checkpoint: None, reference: self.reference.as_ref() }
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs { checkpoint: None, reference: self.reference.as_mut() }
    }
}
