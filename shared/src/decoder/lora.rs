//! LoRA (Hu et al. 2021): a frozen linear W gains a trainable low-rank update, y = x·W +
//! (α/r)·x·A·B with A: in × r, B: r × out. A and B are ordinary linears, so the engine's
//! ghost clipping covers them unchanged, and only they cross the wire each round.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

use crate::dpsgd::ghost::Hook;

/// Rank, scale and which linears get adapters (`qkv`, `output`, `up`, `down`, `head`).
#[derive(Config, Debug, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    /// The update is scaled by alpha / rank.
    pub alpha: f64,
    pub targets: Vec<String>,
}

/// The trainable update of one linear.
#[derive(Module, Debug)]
pub struct Adapter {
    /// A: in × r, burn's default (Kaiming-uniform) start.
    pub down: Linear,
    /// B: r × out, zero at the start, so an adapted model first computes what its base does.
    pub up: Linear,
    pub scale: f64,
}

impl LoraConfig {
    /// An adapter for `base`.
    pub fn init(&self, base: &Linear, device: &Device) -> Adapter {
        let [input, output] = base.weight.dims();
        let down = LinearConfig::new(input, self.rank).with_bias(false).init(device);
        let mut up = LinearConfig::new(self.rank, output).with_bias(false).init(device);
        up.weight = Param::from_tensor(Tensor::zeros([self.rank, output], device));
        Adapter { down, up, scale: self.alpha / self.rank as f64 }
    }
}

impl Adapter {
    /// (α/r)·x·A·B, both factors through the hook.
    pub fn forward(&self, x: Tensor<2>, hook: &mut impl Hook) -> Tensor<2> {
        let inner = hook.linear(&self.down, x);
        hook.linear(&self.up, inner) * self.scale
    }
}
