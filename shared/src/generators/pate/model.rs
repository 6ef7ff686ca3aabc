//! PATE-TabTransGAN's two networks. Both train on the coordinator on released labels only
//! (post-processing), so neither needs DP-SGD.
//!
//! - `Student`: a transformer discriminator with one token per column (a linear map of the
//!   column's features), a learnable per-column position, an encoder, mean pooling,
//!   LayerNorm and a two-layer head giving the "real" logit.
//! - `Generator`: z ~ N(0, I) → linear → residual blocks (FC → BN → ReLU → FC → BN, the
//!   block's input concatenated to its output) → linear to one raw value per feature; the
//!   heads (`shape`) turn raw values into features.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::transformer::{TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput};
use burn::nn::{BatchNorm, BatchNormConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::tensor::activation::{relu, sigmoid, softmax};
use burn::tensor::{Device, Distribution, Tensor};

use super::encoding::{Group, Head};

/// Sizes of the student; defaults live in one place, the spec's `[generator.pate]`.
#[derive(Config, Debug)]
pub struct StudentConfig {
    /// Each column's feature count, in order.
    pub group_widths: Vec<usize>,
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
}

#[derive(Module, Debug)]
pub struct Student {
    tokens: Vec<Linear>,
    offsets: Vec<usize>,
    position: Param<Tensor<2>>,
    encoder: TransformerEncoder,
    norm: LayerNorm,
    hidden: Linear,
    logit: Linear,
}

impl StudentConfig {
    pub fn init(&self, device: &Device) -> Student {
        let d = self.d_model;
        let mut offsets = Vec::with_capacity(self.group_widths.len());
        let mut offset = 0;
        for w in &self.group_widths {
            offsets.push(offset);
            offset += w;
        }
        let columns = self.group_widths.len();
        Student {
            tokens: self.group_widths.iter().map(|&w| LinearConfig::new(w, d).init(device)).collect(),
            offsets,
            position: Param::from_tensor(Tensor::random([columns, d], Distribution::Normal(0.0, 0.02), device)),
            encoder: TransformerEncoderConfig::new(d, 2 * d, self.heads, self.layers)
                .with_norm_first(true)
                .init(device),
            norm: LayerNormConfig::new(d).init(device),
            hidden: LinearConfig::new(d, d).init(device),
            logit: LinearConfig::new(d, 1).init(device),
        }
    }
}

impl Student {
    /// "Real" logits of feature rows `x` ([batch, width]) → [batch].
    pub fn forward(&self, x: Tensor<2>) -> Tensor<1> {
        let [batch, _] = x.dims();
        let tokens: Vec<Tensor<2>> = self
            .tokens
            .iter()
            .zip(&self.offsets)
            .map(|(linear, &offset)| {
                let [w, _] = linear.weight.dims();
                linear.forward(x.clone().narrow(1, offset, w))
            })
            .collect();
        let tokens: Tensor<3> = Tensor::stack(tokens, 1);
        let tokens = tokens + self.position.val().unsqueeze::<3>().repeat_dim(0, batch);
        let encoded = self.encoder.forward(TransformerEncoderInput::new(tokens));
        let pooled: Tensor<2> = encoded.mean_dim(1).squeeze_dim(1);
        let h = relu(self.hidden.forward(self.norm.forward(pooled)));
        self.logit.forward(h).squeeze_dim(1)
    }
}

/// Sizes of the generator; defaults live in one place, the spec's `[generator.pate]`.
#[derive(Config, Debug)]
pub struct GeneratorConfig {
    /// Width of the feature vector.
    pub features: usize,
    pub latent: usize,
    pub width: usize,
    pub blocks: usize,
}

#[derive(Module, Debug)]
pub struct ResidualBlock {
    first: Linear,
    first_norm: BatchNorm,
    second: Linear,
    second_norm: BatchNorm,
}

#[derive(Module, Debug)]
pub struct Generator {
    input: Linear,
    blocks: Vec<ResidualBlock>,
    output: Linear,
}

impl GeneratorConfig {
    pub fn init(&self, device: &Device) -> Generator {
        let w = self.width;
        Generator {
            input: LinearConfig::new(self.latent, w).init(device),
            blocks: (0..self.blocks)
                .map(|k| ResidualBlock {
                    first: LinearConfig::new(w * (k + 1), w).init(device),
                    first_norm: BatchNormConfig::new(w).init(device),
                    second: LinearConfig::new(w, w).init(device),
                    second_norm: BatchNormConfig::new(w).init(device),
                })
                .collect(),
            output: LinearConfig::new(w * (self.blocks + 1), self.features).init(device),
        }
    }
}

impl Generator {
    /// Raw head inputs for latent rows `z` ([batch, latent]) → [batch, features].
    pub fn forward(&self, z: Tensor<2>) -> Tensor<2> {
        let mut h = self.input.forward(z);
        for block in &self.blocks {
            let y = relu(block.first_norm.forward(block.first.forward(h.clone())));
            let y = block.second_norm.forward(block.second.forward(y));
            h = Tensor::cat(vec![h, y], 1);
        }
        self.output.forward(h)
    }
}

/// Relaxed features from raw values plus their noise `g` (Gumbel for one-of heads,
/// logistic for binary ones, unused for unit heads) at temperature `tau`: what the
/// student sees while the generator trains.
pub fn soft_features(raw: Tensor<2>, g: Tensor<2>, groups: &[Group], tau: f64) -> Tensor<2> {
    let mut parts = Vec::new();
    for group in groups {
        let mut offset = group.offset;
        for head in &group.heads {
            let n = if let Head::OneOf(n) = head { *n } else { 1 };
            let r = raw.clone().narrow(1, offset, n);
            parts.push(match head {
                Head::Unit => sigmoid(r),
                Head::Binary => sigmoid((r + g.clone().narrow(1, offset, 1)) / tau),
                Head::OneOf(_) => softmax((r + g.clone().narrow(1, offset, n)) / tau, 1),
            });
            offset += n;
        }
    }
    Tensor::cat(parts, 1)
}

/// Hard features from raw values `raw` and noise `g` (row-major, `width` wide): one-hot
/// argmax, 0/1 by sign, sigmoid. The same noise gives the relaxed features' limit as τ → 0.
pub fn hard_features(raw: &[f32], g: &[f32], groups: &[Group], width: usize) -> Vec<f32> {
    let mut out = vec![0.0; raw.len()];
    for ((r, g), x) in raw.chunks(width).zip(g.chunks(width)).zip(out.chunks_mut(width)) {
        for group in groups {
            let mut offset = group.offset;
            for head in &group.heads {
                match head {
                    Head::Unit => x[offset] = 1.0 / (1.0 + (-r[offset]).exp()),
                    Head::Binary => x[offset] = f32::from(u8::from(r[offset] + g[offset] > 0.0)),
                    Head::OneOf(n) => {
                        let best = (offset..offset + n)
                            .max_by(|&a, &b| (r[a] + g[a]).total_cmp(&(r[b] + g[b])))
                            .expect("a head has at least one value");
                        x[best] = 1.0;
                    }
                }
                offset += if let Head::OneOf(n) = head { *n } else { 1 };
            }
        }
    }
    out
}
