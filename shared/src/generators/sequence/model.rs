//! The sequence generator's model: the engine's decoder (GPT block, learned positions)
//! over history tokens, its loss restricted to what the history grammar allows.

use burn::module::Module;
use burn::tensor::Device;

use super::histories::Histories;
use super::task::SequenceModelSpec;
use super::window::{Window, pad, window};
use crate::decoder::{Decoder, TokenBatch, next_token_losses};
use crate::dpsgd::ghost::Hook;
use crate::dpsgd::layers::{Layer, LayerMut};
use crate::dpsgd::params::TrainableLayers;
use crate::dpsgd::{Batch, DpModel};

/// The decoder with its job's token layout and window, as DP-SGD trains it.
pub struct SequenceModel {
    pub transformer: Decoder,
    pub spec: SequenceModelSpec,
}

impl SequenceModel {
    pub fn new(spec: &SequenceModelSpec, device: &Device) -> Self {
        Self { transformer: spec.transformer.init(device).with_lagged(&spec.lagged, device), spec: spec.clone() }
    }

    /// A copy whose parameters track gradients: the ordinary (non-private) backward pass,
    /// for baselines and for checking the ghost norms against a per-unit loop.
    pub fn tracked(&self) -> Self {
        Self { transformer: self.transformer.clone().train(), spec: self.spec.clone() }
    }
}

impl TrainableLayers for SequenceModel {
    fn layers(&self) -> Vec<Layer<'_>> {
        self.transformer.layers()
    }

    fn layers_mut(&mut self) -> Vec<LayerMut<'_>> {
        self.transformer.layers_mut()
    }
}

impl DpModel for SequenceModel {
    type Examples = Histories;

    /// One window per unit, its rows the positions of one sequence.
    fn losses(
        &self,
        examples: &Histories,
        units: &[usize],
        seed: &[u8; 32],
        _: &Device,
        hook: &mut impl Hook,
    ) -> Batch {
        let layout = &self.spec.layout;
        let windows: Vec<Window> =
            units.iter().map(|&u| window(layout, &self.spec.window, &examples.units[u], seed)).collect();
        let padded = pad(layout, &windows);
        // A model charged before lag-1 inputs existed (a resumed checkpoint) has no tables.
        let lagged = [&padded.lagged[0][..], &padded.lagged[1][..]];
        let batch = TokenBatch {
            tokens: &padded.inputs,
            sequences: units.len(),
            length: padded.length,
            lagged: &lagged[..self.transformer.lagged.len()],
        };
        let logits = self.transformer.forward(&batch, hook);
        let losses = next_token_losses(logits, &padded.targets, padded.allowed, padded.weights, units.len());
        Batch { losses, units: (0..units.len() * padded.length).map(|r| r / padded.length).collect() }
    }
}
