//! The decoder-only transformer over history tokens: learned token and position
//! embeddings, pre-norm blocks (causal multi-head self-attention, GELU MLP), a final norm
//! and a linear head. Every layer goes through the engine's hook, so ghost clipping
//! covers every parameter, embeddings and norms included.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig};
use burn::tensor::activation::{gelu, log_softmax, softmax};
use burn::tensor::{Device, Int, Tensor, TensorData};

use super::task::{Histories, SequenceModelSpec};
use super::window::{Window, pad, window};
use crate::dpsgd::ghost::{Hook, Plain};
use crate::dpsgd::layers::{Layer, LayerMut, LayerNorm};
use crate::dpsgd::params::{TrainableLayers, values};
use crate::dpsgd::{Batch, DpModel};

/// Sizes of the transformer; defaults live in one place, the spec's `[generator.sequence]`.
#[derive(Config, Debug, PartialEq)]
pub struct TransformerConfig {
    pub vocabulary: usize,
    /// Longest sequence (positions learned).
    pub positions: usize,
    pub width: usize,
    pub heads: usize,
    pub layers: usize,
    /// Hidden width of each block's MLP.
    pub mlp: usize,
}

#[derive(Module, Debug)]
pub struct Block {
    attention_norm: LayerNorm,
    qkv: Linear,
    projection: Linear,
    mlp_norm: LayerNorm,
    up: Linear,
    down: Linear,
}

#[derive(Module, Debug)]
pub struct Transformer {
    tokens: Embedding,
    positions: Embedding,
    blocks: Vec<Block>,
    final_norm: LayerNorm,
    head: Linear,
    heads: usize,
}

impl TransformerConfig {
    pub fn init(&self, device: &Device) -> Transformer {
        let linear = |i, o| LinearConfig::new(i, o).init(device);
        let small = Initializer::Normal { mean: 0.0, std: 0.02 };
        let embedding = |n| EmbeddingConfig::new(n, self.width).with_initializer(small.clone()).init(device);
        let w = self.width;
        Transformer {
            tokens: embedding(self.vocabulary),
            positions: embedding(self.positions),
            blocks: (0..self.layers)
                .map(|_| Block {
                    attention_norm: LayerNorm::new(w, device),
                    qkv: linear(w, 3 * w),
                    projection: linear(w, w),
                    mlp_norm: LayerNorm::new(w, device),
                    up: linear(w, self.mlp),
                    down: linear(self.mlp, w),
                })
                .collect(),
            final_norm: LayerNorm::new(w, device),
            head: linear(w, self.vocabulary),
            heads: self.heads,
        }
    }
}

/// A batch of equal-length token sequences (padded), row-major.
pub struct TokenBatch<'a> {
    pub tokens: &'a [u32],
    pub sequences: usize,
    pub length: usize,
}

impl Transformer {
    pub fn positions(&self) -> usize {
        self.positions.weight.dims()[0]
    }

    /// Logits for every position, (sequences·length) × vocabulary.
    pub fn forward(&self, batch: &TokenBatch<'_>, hook: &mut impl Hook) -> Tensor<2> {
        let (b, t) = (batch.sequences, batch.length);
        let positions: Vec<u32> = (0..b).flat_map(|_| 0..t as u32).collect();
        let tokens = hook.embedding(&self.tokens, batch.tokens);
        let mut x = tokens + hook.embedding(&self.positions, &positions);
        let device = x.device();
        let [_, width] = x.dims();
        let causal = causal_mask(t, &device);
        for block in &self.blocks {
            let h = hook.norm(&block.attention_norm, x.clone());
            let qkv = hook.linear(&block.qkv, h);
            let attended = self.attention(qkv, b, t, width, causal.clone());
            x = x + hook.linear(&block.projection, attended);
            let h = hook.norm(&block.mlp_norm, x.clone());
            let inner = gelu(hook.linear(&block.up, h));
            x = x + hook.linear(&block.down, inner);
        }
        let h = hook.norm(&self.final_norm, x);
        hook.linear(&self.head, h)
    }

    /// Causal multi-head self-attention of packed q, k, v rows: (b·t) × width.
    fn attention(&self, qkv: Tensor<2>, b: usize, t: usize, width: usize, causal: Tensor<4>) -> Tensor<2> {
        let (h, dh) = (self.heads, width / self.heads);
        let qkv = qkv.reshape([b, t, 3, h, dh]);
        let part = |i: usize| qkv.clone().narrow(2, i, 1).reshape([b, t, h, dh]).swap_dims(1, 2);
        let (q, k, v) = (part(0), part(1), part(2));
        let scores = q.matmul(k.swap_dims(2, 3)) / (dh as f64).sqrt() + causal;
        let weights = softmax(scores, 3);
        weights.matmul(v).swap_dims(1, 2).reshape([b * t, width])
    }
}

/// One sequence's keys and values in every block, for decoding a token at a time.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    /// Per block: keys and values of the positions fed so far, position-major.
    blocks: Vec<(Vec<f32>, Vec<f32>)>,
}

impl KvCache {
    /// Positions fed so far.
    pub fn len(&self, width: usize) -> usize {
        self.blocks.first().map_or(0, |(keys, _)| keys.len() / width)
    }
}

impl Transformer {
    pub fn width(&self) -> usize {
        self.tokens.weight.dims()[1]
    }

    /// Feeds sequence s its next token `tokens[s]` (at position `caches[s]`'s length) and
    /// returns the logits of the token after it, sequences × vocabulary. Each new position
    /// attends to its own sequence's cache, which it extends: the same logits `forward`
    /// gives at that position, without recomputing the positions before it.
    pub fn step(&self, tokens: &[u32], caches: &mut [KvCache]) -> Vec<f32> {
        let width = self.width();
        let positions: Vec<u32> = caches.iter().map(|c| c.len(width) as u32).collect();
        let mut plain = Plain;
        let mut x = plain.embedding(&self.tokens, tokens) + plain.embedding(&self.positions, &positions);
        let device = x.device();
        for (i, block) in self.blocks.iter().enumerate() {
            let h = plain.norm(&block.attention_norm, x.clone());
            let qkv = values(plain.linear(&block.qkv, h).into_data());
            let attended: Vec<f32> = qkv
                .chunks(3 * width)
                .zip(caches.iter_mut())
                .flat_map(|(row, cache)| {
                    if cache.blocks.len() <= i {
                        cache.blocks.push(Default::default());
                    }
                    let (keys, vals) = &mut cache.blocks[i];
                    keys.extend_from_slice(&row[width..2 * width]);
                    vals.extend_from_slice(&row[2 * width..]);
                    self.attend(&row[..width], keys, vals)
                })
                .collect();
            let attended = Tensor::<2>::from_data(TensorData::new(attended, [tokens.len(), width]), &device);
            x = x + plain.linear(&block.projection, attended);
            let h = plain.norm(&block.mlp_norm, x.clone());
            let inner = gelu(plain.linear(&block.up, h));
            x = x + plain.linear(&block.down, inner);
        }
        let h = plain.norm(&self.final_norm, x);
        values(plain.linear(&self.head, h).into_data())
    }

    /// One position's multi-head attention over a sequence's keys and values.
    fn attend(&self, query: &[f32], keys: &[f32], vals: &[f32]) -> Vec<f32> {
        let width = query.len();
        let dh = width / self.heads;
        let scale = 1.0 / (dh as f32).sqrt();
        let mut out = vec![0f32; width];
        for head in 0..self.heads {
            let part = head * dh..(head + 1) * dh;
            let q = &query[part.clone()];
            let scores: Vec<f32> = keys
                .chunks(width)
                .map(|k| k[part.clone()].iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = weights.iter().sum();
            for (w, v) in weights.iter().zip(vals.chunks(width)) {
                for (o, x) in out[part.clone()].iter_mut().zip(&v[part.clone()]) {
                    *o += w / total * x;
                }
            }
        }
        out
    }
}

/// 0 on and below the diagonal, a large negative number above it: 1 × 1 × t × t.
fn causal_mask(t: usize, device: &Device) -> Tensor<4> {
    let data: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { -1e9 } else { 0.0 }).collect();
    Tensor::<2>::from_data(TensorData::new(data, [t, t]), device).unsqueeze::<4>()
}

/// Mean next-token loss of each sequence over its weighted positions, with each position's
/// logits restricted to the tokens its grammar allows (`allowed`: additive 0 / −10⁹ mask,
/// rows × vocabulary; `weights`: 1 where the position's next token counts, else 0).
pub fn sequence_losses(
    logits: Tensor<2>,
    targets: &[u32],
    allowed: Vec<f32>,
    weights: Vec<f32>,
    sequences: usize,
) -> Tensor<1> {
    let device = logits.device();
    let [rows, vocabulary] = logits.dims();
    let plain = device.clone().without_autodiff();
    let mask = Tensor::<2>::from_data(TensorData::new(allowed, [rows, vocabulary]), &plain);
    let logp = log_softmax(logits + mask, 1);
    let targets: Vec<i64> = targets.iter().map(|&t| i64::from(t)).collect();
    let index = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows, 1]), &logp.device());
    let picked = logp.gather(1, index);
    let counts: Vec<f32> = weights.chunks(rows / sequences).map(|w| w.iter().sum::<f32>().max(1.0)).collect();
    let scaled: Vec<f32> =
        weights.chunks(rows / sequences).zip(&counts).flat_map(|(w, c)| w.iter().map(move |v| v / c)).collect();
    let scale = Tensor::<2>::from_data(TensorData::new(scaled, [rows, 1]), &plain);
    -(picked * scale).reshape([sequences, rows / sequences]).sum_dim(1).reshape([sequences])
}

impl TrainableLayers for Transformer {
    fn layers(&self) -> Vec<Layer<'_>> {
        let mut out = vec![Layer::Embedding(&self.tokens), Layer::Embedding(&self.positions)];
        for b in &self.blocks {
            out.extend([
                Layer::Norm(&b.attention_norm),
                Layer::Linear(&b.qkv),
                Layer::Linear(&b.projection),
                Layer::Norm(&b.mlp_norm),
                Layer::Linear(&b.up),
                Layer::Linear(&b.down),
            ]);
        }
        out.extend([Layer::Norm(&self.final_norm), Layer::Linear(&self.head)]);
        out
    }

    fn layers_mut(&mut self) -> Vec<LayerMut<'_>> {
        let mut out = vec![LayerMut::Embedding(&mut self.tokens), LayerMut::Embedding(&mut self.positions)];
        for b in &mut self.blocks {
            out.extend([
                LayerMut::Norm(&mut b.attention_norm),
                LayerMut::Linear(&mut b.qkv),
                LayerMut::Linear(&mut b.projection),
                LayerMut::Norm(&mut b.mlp_norm),
                LayerMut::Linear(&mut b.up),
                LayerMut::Linear(&mut b.down),
            ]);
        }
        out.extend([LayerMut::Norm(&mut self.final_norm), LayerMut::Linear(&mut self.head)]);
        out
    }
}

/// The transformer with its job's token layout and window, as DP-SGD trains it.
pub struct SequenceModel {
    pub transformer: Transformer,
    pub spec: SequenceModelSpec,
}

impl SequenceModel {
    pub fn new(spec: &SequenceModelSpec, device: &Device) -> Self {
        Self { transformer: spec.transformer.init(device), spec: spec.clone() }
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
        let windows: Vec<Window> = units
            .iter()
            .map(|&u| {
                let (id, rows) = &examples.units[u];
                window(layout, &self.spec.window, rows, seed, id)
            })
            .collect();
        let padded = pad(layout, &windows);
        let batch = TokenBatch { tokens: &padded.inputs, sequences: units.len(), length: padded.length };
        let logits = self.transformer.forward(&batch, hook);
        let losses = sequence_losses(logits, &padded.targets, padded.allowed, padded.weights, units.len());
        Batch { losses, units: (0..units.len() * padded.length).map(|r| r / padded.length).collect() }
    }
}
