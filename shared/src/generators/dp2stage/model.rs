//! The stage-2 model: the checkpoint's decoder cut down to the rows' vocabulary (and its
//! first blocks, if asked), with LoRA adapters or every parameter trainable, and its loss
//! over a unit's rows as text.

use burn::module::{Module, ParamGroup};
use burn::tensor::Device;
use rand::rngs::ChaCha8Rng;
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use super::prompting::Prompting;
use super::row_text::{RowText, RowTokens};
use crate::data::domain::Domain;
use crate::decoder::{Decoder, LoraConfig, TokenBatch, next_token_losses};
use crate::dpsgd::ghost::Hook;
use crate::dpsgd::layers::{Layer, LayerMut};
use crate::dpsgd::params::TrainableLayers;
use crate::dpsgd::{Batch, DpModel, UnitExamples};

use super::pretrain::pseudo_rows;

/// What a worker rebuilds the model from, beside the checkpoint: how it is cut down and
/// adapted, and how rows read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TextModelSpec {
    pub domain: Domain,
    pub text: RowText,
    /// Keep the checkpoint's first blocks only.
    pub blocks: Option<usize>,
    /// LoRA adapters; `None`: full fine-tuning.
    pub lora: Option<LoraConfig>,
    /// λ, the loss weight of value tokens (the format's tokens get 1 − λ).
    pub value_weight: f64,
    /// The public reference set: HARMONIC writes each row after its k nearest reference
    /// rows; DP-2Stage's stage 1 trains on its rows (k = 0).
    pub prompting: Option<Prompting>,
}

impl TextModelSpec {
    /// Most tokens an example takes (its prompt included).
    pub fn longest(&self) -> usize {
        self.text.longest() * (1 + self.prompting.as_ref().map_or(0, |p| p.neighbours))
    }

    /// A row of bins as an example: its tokens, after its nearest reference rows
    /// (`exclude` left out) when prompted.
    pub fn example(&self, bins: &[usize], exclude: Option<usize>) -> RowTokens {
        let row = self.text.encode(bins);
        match &self.prompting {
            None => row,
            Some(p) => {
                let context: Vec<RowTokens> =
                    p.nearest(&self.domain, bins, exclude).into_iter().map(|n| self.text.encode(&p.row(n))).collect();
                row.prompted(&context)
            }
        }
    }

    /// Stage 1's examples, from public information only: pseudo rows drawn uniformly
    /// from the declared domain, or reference rows (uniformly drawn), each after its
    /// nearest other reference rows (none for DP-2Stage: k = 0).
    pub fn public_examples(&self, count: usize, rng: &mut ChaCha8Rng) -> Vec<RowTokens> {
        match &self.prompting {
            None => pseudo_rows(&self.domain, count, rng).iter().map(|bins| self.text.encode(bins)).collect(),
            Some(p) => (0..count)
                .map(|_| {
                    let i = rng.random_range(0..p.reference.len());
                    self.example(&p.row(i), Some(i))
                })
                .collect(),
        }
    }

    /// The tokens a sampled row is written after: none, or (HARMONIC) the nearest other
    /// reference rows of a uniformly drawn reference row.
    pub fn sampling_prompt(&self, rng: &mut impl Rng) -> Vec<u32> {
        let Some(p) = &self.prompting else { return Vec::new() };
        let anchor = rng.random_range(0..p.reference.len());
        p.nearest(&self.domain, &p.row(anchor), Some(anchor))
            .into_iter()
            .flat_map(|n| self.text.encode(&p.row(n)).tokens)
            .collect()
    }
}

/// The decoder as DP-SGD trains it.
pub struct TextModel {
    pub decoder: Decoder,
    pub spec: TextModelSpec,
}

impl TextModel {
    /// A checkpoint's decoder cut down and adapted as the spec says.
    pub fn new(spec: &TextModelSpec, decoder: Decoder, device: &Device) -> Result<Self, String> {
        if spec.text.vocabulary().last().is_some_and(|&t| t as usize >= decoder.vocabulary()) {
            return Err("the tokenizer's ids go beyond the model's vocabulary: they do not belong together".into());
        }
        let longest = spec.longest();
        if decoder.context() < longest {
            return Err(format!("an example is up to {longest} tokens; the model's context is {}", decoder.context()));
        }
        let mut decoder = match spec.blocks {
            Some(k) if k == 0 || k > decoder.blocks.len() => {
                return Err(format!("blocks = {k}: the checkpoint has {}", decoder.blocks.len()));
            }
            Some(k) => decoder.truncated(k),
            None => decoder,
        };
        decoder = decoder.restricted(spec.text.vocabulary());
        decoder = match &spec.lora {
            Some(lora) => decoder.with_adapters(lora, device)?,
            None => decoder.untied(),
        };
        Ok(Self { decoder, spec: spec.clone() })
    }

    /// A copy whose trainable parameters track gradients (the non-private path: stage 1).
    pub fn tracked(&self) -> Decoder {
        if self.decoder.adapted() {
            self.decoder.clone().freeze().unfreeze_group(ParamGroup::from_predicate("adapter")).train()
        } else {
            self.decoder.clone().train()
        }
    }
}

/// Rows as tokens, grouped by privacy unit.
pub struct TextRows {
    pub units: Vec<Vec<RowTokens>>,
}

impl UnitExamples for TextRows {
    fn unit_count(&self) -> usize {
        self.units.len()
    }
}

impl TrainableLayers for TextModel {
    fn layers(&self) -> Vec<Layer<'_>> {
        self.decoder.layers()
    }

    fn layers_mut(&mut self) -> Vec<LayerMut<'_>> {
        self.decoder.layers_mut()
    }
}

/// The losses of rows (each its own sequence, padded with zero weight to the longest, or
/// to `pad_to` tokens if more): next-token log-loss over the whole vocabulary, value tokens
/// weighted λ and the rest 1 − λ (a prompt's tokens 0: context only), and each position's
/// unit.
pub fn row_losses(
    decoder: &Decoder,
    rows: &[(usize, &RowTokens)],
    pad_to: usize,
    value_weight: f64,
    end: u32,
    hook: &mut impl Hook,
) -> Batch {
    let length = rows.iter().map(|(_, r)| r.tokens.len()).max().unwrap_or(1).max(pad_to).max(2) - 1;
    let (mut inputs, mut targets, mut weights, mut units) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (unit, row) in rows {
        let t = &row.tokens;
        for p in 0..length {
            inputs.push(t.get(p).copied().unwrap_or(end));
            targets.push(t.get(p + 1).copied().unwrap_or(end));
            let weight = match row.value.get(p + 1) {
                _ if p + 1 < row.prompt => 0.0,
                Some(true) => value_weight,
                Some(false) => 1.0 - value_weight,
                None => 0.0,
            };
            weights.push(weight as f32);
            units.push(*unit);
        }
    }
    let batch = TokenBatch { tokens: &inputs, sequences: rows.len(), length, lagged: &[] };
    let logits = decoder.forward(&batch, hook);
    let vocabulary = decoder.vocabulary();
    let losses = next_token_losses(logits, &targets, vec![0.0; inputs.len() * vocabulary], weights, rows.len());
    Batch { losses, units }
}

impl DpModel for TextModel {
    type Examples = TextRows;

    /// Every row of the sampled units, each its own sequence; a unit's rows share its
    /// gradient (one clipped sum per unit whatever its number of rows). Rows are padded to
    /// the spec's longest row, so a step's work does not follow which labels the rows hold.
    fn losses(&self, examples: &TextRows, units: &[usize], _: &[u8; 32], _: &Device, hook: &mut impl Hook) -> Batch {
        let rows: Vec<(usize, &RowTokens)> =
            units.iter().enumerate().flat_map(|(i, &u)| examples.units[u].iter().map(move |r| (i, r))).collect();
        row_losses(&self.decoder, &rows, self.spec.longest(), self.spec.value_weight, self.spec.text.end, hook)
    }
}
