//! `[generator.dp2stage]` and `[generator.harmonic]`.

use serde::{Deserialize, Serialize};

use crate::dpsgd::run::{DpSgdParams, RunParams, over_defaults};
use crate::generators::params::{DEFAULT_BINS, GeneratorParams, PublicInputs};

/// Parameters of the language-model generators: a pretrained model fine-tuned on rows as
/// text, first without privacy on public examples (stage 1), then with DP-SGD on the
/// private rows. DP-2Stage's stage 1 reads pseudo rows from the declared domain; HARMONIC
/// (`reference`, `neighbours`) prompts each row with its nearest rows of a public reference
/// set and trains stage 1 on the reference set itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LanguageModelParams {
    /// The pretrained checkpoint: a GGUF file, or a folder holding `config.json`,
    /// `model.safetensors` and `tokenizer.json` (a path or an object-store URL; never a hub).
    pub checkpoint: String,
    /// Keep the checkpoint's first blocks only (all by default): a smaller model for CPUs.
    pub blocks: Option<usize>,
    /// LoRA adapters (`lora = {}` for the defaults); absent: every parameter is fine-tuned.
    pub lora: Option<LoraParams>,
    /// λ, the loss weight of value tokens (the format's tokens get 1 − λ).
    pub value_weight: f64,
    /// A public table or a rhosynth release (e.g. a marginals job's output) in this job's
    /// schema, never private data: HARMONIC's prompts come from it (required), and stage 1
    /// trains on it (DP-2Stage: instead of pseudo rows, if named).
    pub reference: Option<String>,
    /// HARMONIC: the reference set's first rows that are read (a release's rows are in
    /// random order).
    pub reference_rows: usize,
    /// HARMONIC: k, the reference rows each example is prompted with.
    pub neighbours: usize,
    /// Stage 1: examples (DP-2Stage: pseudo rows drawn uniformly from the declared domain,
    /// or the reference set's rows; HARMONIC: reference rows, each prompted with its nearest
    /// other reference rows), rows
    /// a step, passes and Adam's learning rate (no privacy cost: it reads no private data).
    pub pseudo_rows: usize,
    pub pseudo_batch: usize,
    pub pseudo_epochs: f64,
    pub pseudo_learning_rate: f64,
    /// Rows a unit contributes (its rows share one clipped gradient).
    pub max_rows_per_unit: u32,
    /// Softmax temperature of each sampled value token (post-processing).
    pub temperature: f64,
    /// `[generator.dp2stage|harmonic.run]`: the DP-SGD run (defaults: 2 epochs of 256 units, Adam at 3·10⁻³, 32 units a backward pass).
    #[serde(deserialize_with = "over_defaults::<LanguageModelParams, _>")]
    pub run: RunParams,
}

impl Default for LanguageModelParams {
    fn default() -> Self {
        Self {
            checkpoint: String::new(),
            blocks: None,
            lora: None,
            value_weight: 0.65,
            reference: None,
            reference_rows: 10_000,
            neighbours: 3,
            pseudo_rows: 2000,
            pseudo_batch: 32,
            pseudo_epochs: 2.0,
            pseudo_learning_rate: 1e-3,
            max_rows_per_unit: 1,
            temperature: 1.0,
            run: Self::run_defaults(),
        }
    }
}

/// LoRA adapters of a pretrained model: rank, scale α (the update is scaled by α / rank)
/// and the linears they adapt (`qkv`, `output`, `up`, `down`, `head`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraParams {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<String>,
}

impl Default for LoraParams {
    fn default() -> Self {
        Self { rank: 8, alpha: 16.0, targets: vec!["qkv".into(), "output".into()] }
    }
}

impl DpSgdParams for LanguageModelParams {
    fn run_defaults() -> RunParams {
        RunParams { epochs: 2.0, micro_batch: 32, ..RunParams::default() }
    }

    fn run(&self) -> &RunParams {
        &self.run
    }
}

impl GeneratorParams for LanguageModelParams {
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
        PublicInputs { checkpoint: Some(&self.checkpoint), reference: self.reference.as_ref() }
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs { checkpoint: Some(&mut self.checkpoint), reference: self.reference.as_mut() }
    }
}
