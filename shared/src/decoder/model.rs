//! The decoder: token embeddings, pre-norm blocks (causal self-attention, an MLP), a final
//! norm and a head. Two families share it: GPT-2's block, which the sequence generator
//! trains from scratch, and Llama's, which pretrained checkpoints bring. Every layer goes
//! through the engine's hook, so ghost clipping covers every trainable parameter; once
//! LoRA adapters are attached only they are trainable and the base is applied as a constant.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::attention::{Heads, causal_attention};
use super::lora::{Adapter, LoraConfig};
use crate::dpsgd::ghost::{Hook, Plain};
use crate::dpsgd::layers::{Layer, LayerMut, Norm};
use crate::dpsgd::params::TrainableLayers;

/// Which block a decoder is built from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// GPT-2: layer norms, learned positions, a GELU (tanh) MLP, biases everywhere.
    #[default]
    Gpt,
    /// Llama (SmolLM2, Mistral-style): RMS norms, rotary positions, a SiLU-gated MLP, no
    /// biases, grouped-query attention.
    Llama,
}

/// Sizes of a decoder; a checkpoint's own configuration or the spec's defaults.
#[derive(Config, Debug, PartialEq)]
pub struct DecoderConfig {
    pub vocabulary: usize,
    /// Longest sequence: the learned position table's size, or a rotary model's context.
    pub positions: usize,
    pub width: usize,
    pub heads: usize,
    pub layers: usize,
    /// Hidden width of each block's MLP.
    pub mlp: usize,
    #[config(default = "Family::Gpt")]
    pub family: Family,
    /// Key/value heads (grouped-query attention); `None`: one per query head.
    #[config(default = "None")]
    pub kv_heads: Option<usize>,
    /// Base of the rotary frequencies (Llama).
    #[config(default = 10000.0)]
    pub rope_base: f64,
    #[config(default = 1e-5)]
    pub norm_epsilon: f64,
    /// The head is the token embedding, transposed (GPT-2, SmolLM2).
    #[config(default = false)]
    pub tied_head: bool,
}

/// A linear of a block, with its LoRA adapter once one is attached.
#[derive(Module, Debug)]
pub struct Projection {
    pub base: Linear,
    pub adapter: Option<Adapter>,
}

#[derive(Module, Debug)]
pub struct Block {
    pub attention_norm: Norm,
    /// Queries, keys and values in one output: [q (heads) | k (kv heads) | v (kv heads)].
    pub qkv: Projection,
    pub output: Projection,
    pub mlp_norm: Norm,
    /// GPT: the MLP's hidden layer; Llama: [gate | up], twice as wide.
    pub up: Projection,
    pub down: Projection,
}

#[derive(Module, Debug)]
pub struct Decoder {
    pub tokens: Embedding,
    /// Learned positions (GPT); rotary models have none.
    pub positions: Option<Embedding>,
    /// Further inputs per position, each embedded by a table of its own and added to the
    /// token's: the sequence generator's lag-1 tokens (`Decoder::with_lagged`).
    pub lagged: Vec<Embedding>,
    pub blocks: Vec<Block>,
    pub final_norm: Norm,
    /// `None`: tied to the token embedding.
    pub head: Option<Projection>,
    pub heads: usize,
    pub kv_heads: usize,
    pub rope_base: f64,
    pub context: usize,
}

impl DecoderConfig {
    pub fn kv_heads(&self) -> usize {
        self.kv_heads.unwrap_or(self.heads)
    }

    /// Checks what a checkpoint or spec declares before anything is allocated.
    pub fn check(&self) -> Result<(), String> {
        let kv = self.kv_heads();
        if self.heads == 0 || !self.width.is_multiple_of(self.heads) {
            return Err(format!("width {} is not a multiple of {} heads", self.width, self.heads));
        }
        if kv == 0 || !self.heads.is_multiple_of(kv) {
            return Err(format!("{} heads do not split into {kv} key/value groups", self.heads));
        }
        if self.family == Family::Llama && (self.width / self.heads) % 2 == 1 {
            return Err("rotary positions need an even head width".to_string());
        }
        if [self.vocabulary, self.positions, self.layers, self.mlp].contains(&0) {
            return Err("vocabulary, positions, layers and MLP width must be positive".to_string());
        }
        Ok(())
    }

    /// Parameters of the decoder this configuration describes; `None` if it overflows.
    pub fn parameter_count(&self) -> Option<usize> {
        let (w, mlp) = (self.width, self.mlp);
        let kv = self.kv_heads().checked_mul(w / self.heads.max(1))?;
        let gpt = self.family == Family::Gpt;
        let mlp_out = if gpt { mlp } else { mlp.checked_mul(2)? };
        let linear = |i: usize, o: usize| i.checked_mul(o)?.checked_add(if gpt { o } else { 0 });
        let norm = if gpt { 2 * w } else { w };
        let block = [
            linear(w, w.checked_add(kv.checked_mul(2)?)?)?,
            linear(w, w)?,
            linear(w, mlp_out)?,
            linear(mlp, w)?,
            2 * norm,
        ]
        .into_iter()
        .try_fold(0usize, usize::checked_add)?;
        let embeddings = self.vocabulary.checked_mul(w)?.checked_mul(if self.tied_head { 1 } else { 2 })?;
        let positions = if gpt { self.positions.checked_mul(w)? } else { 0 };
        block.checked_mul(self.layers)?.checked_add(embeddings)?.checked_add(positions)?.checked_add(norm)
    }

    /// A decoder with fresh weights (small normal embeddings, burn's default linears).
    pub fn init(&self, device: &Device) -> Decoder {
        let gpt = self.family == Family::Gpt;
        let w = self.width;
        let kv_width = self.kv_heads() * (w / self.heads);
        let linear = |i, o| Projection { base: LinearConfig::new(i, o).with_bias(gpt).init(device), adapter: None };
        let norm =
            || if gpt { Norm::layer(w, self.norm_epsilon, device) } else { Norm::rms(w, self.norm_epsilon, device) };
        let small = Initializer::Normal { mean: 0.0, std: 0.02 };
        let embedding = |n| EmbeddingConfig::new(n, w).with_initializer(small.clone()).init(device);
        let mlp_out = if gpt { self.mlp } else { 2 * self.mlp };
        Decoder {
            tokens: embedding(self.vocabulary),
            positions: gpt.then(|| embedding(self.positions)),
            lagged: Vec::new(),
            blocks: (0..self.layers)
                .map(|_| Block {
                    attention_norm: norm(),
                    qkv: linear(w, w + 2 * kv_width),
                    output: linear(w, w),
                    mlp_norm: norm(),
                    up: linear(w, mlp_out),
                    down: linear(self.mlp, w),
                })
                .collect(),
            final_norm: norm(),
            head: (!self.tied_head).then(|| linear(w, self.vocabulary)),
            heads: self.heads,
            kv_heads: self.kv_heads(),
            rope_base: self.rope_base,
            context: self.positions,
        }
    }
}

/// A batch of equal-length token sequences (padded), row-major.
pub struct TokenBatch<'a> {
    pub tokens: &'a [u32],
    pub sequences: usize,
    pub length: usize,
    /// The further inputs, one slice (sequences × length) per table of the decoder's.
    pub lagged: &'a [&'a [u32]],
}

/// Applies a decoder's layers: trainable ones through the hook, frozen ones (the base
/// under LoRA adapters) plainly, as constants of the backward pass.
pub(super) struct Layers<'h, H: Hook> {
    pub hook: &'h mut H,
    pub frozen: bool,
}

impl<H: Hook> Layers<'_, H> {
    pub fn norm(&mut self, norm: &Norm, x: Tensor<2>) -> Tensor<2> {
        if self.frozen { Plain.norm(norm, x) } else { self.hook.norm(norm, x) }
    }

    pub fn embedding(&mut self, table: &Embedding, ids: &[u32]) -> Tensor<2> {
        if self.frozen { Plain.embedding(table, ids) } else { self.hook.embedding(table, ids) }
    }

    pub fn project(&mut self, projection: &Projection, x: Tensor<2>) -> Tensor<2> {
        let base = if self.frozen {
            Plain.linear(&projection.base, x.clone())
        } else {
            self.hook.linear(&projection.base, x.clone())
        };
        match &projection.adapter {
            Some(adapter) => base + adapter.forward(x, self.hook),
            None => base,
        }
    }
}

/// GELU with the tanh approximation, as GPT-2 defines it.
fn gelu_tanh(x: Tensor<2>) -> Tensor<2> {
    let inner = (x.clone() + x.clone().powi_scalar(3) * 0.044715) * (2.0 / std::f64::consts::PI).sqrt();
    x * (inner.tanh() + 1.0) * 0.5
}

impl Decoder {
    pub fn width(&self) -> usize {
        self.tokens.weight.dims()[1]
    }

    pub fn vocabulary(&self) -> usize {
        self.tokens.weight.dims()[0]
    }

    /// Longest sequence the decoder takes.
    pub fn context(&self) -> usize {
        self.context
    }

    pub fn heads(&self) -> Heads {
        Heads { heads: self.heads, kv_heads: self.kv_heads, dim: self.width() / self.heads }
    }

    /// Whether LoRA adapters are attached, which freezes everything else.
    pub fn adapted(&self) -> bool {
        self.blocks.iter().flat_map(Block::projections).chain(&self.head).any(|p| p.adapter.is_some())
    }

    fn gated(&self) -> bool {
        self.positions.is_none()
    }

    /// The token embeddings plus learned positions (rotary models add theirs in attention)
    /// plus the further inputs' embeddings.
    pub(super) fn embed<H: Hook>(
        &self,
        layers: &mut Layers<'_, H>,
        tokens: &[u32],
        positions: &[u32],
        lagged: &[&[u32]],
    ) -> Tensor<2> {
        assert_eq!(lagged.len(), self.lagged.len(), "one input per table of further inputs");
        let mut x = layers.embedding(&self.tokens, tokens);
        if let Some(table) = &self.positions {
            x = x + layers.embedding(table, positions);
        }
        for (table, ids) in self.lagged.iter().zip(lagged) {
            x = x + layers.embedding(table, ids);
        }
        x
    }

    /// A block's MLP on its normalised input.
    pub(super) fn mlp<H: Hook>(&self, layers: &mut Layers<'_, H>, block: &Block, h: Tensor<2>) -> Tensor<2> {
        let up = layers.project(&block.up, h);
        let inner = if self.gated() {
            let half = up.dims()[1] / 2;
            silu(up.clone().narrow(1, 0, half)) * up.narrow(1, half, half)
        } else {
            gelu_tanh(up)
        };
        layers.project(&block.down, inner)
    }

    /// Logits of the final hidden states.
    pub(super) fn logits<H: Hook>(&self, layers: &mut Layers<'_, H>, x: Tensor<2>) -> Tensor<2> {
        let h = layers.norm(&self.final_norm, x);
        match &self.head {
            Some(head) => layers.project(head, h),
            None if layers.frozen => h.matmul(self.tokens.weight.val().transpose()),
            // A trainable tied head is the embedding's second use: through the hook under
            // the embedding's own id, so the ghost tape refuses it (untie it to train it)
            // rather than leave its gradient out.
            None => {
                let weight = Param::initialized(self.tokens.weight.id, self.tokens.weight.val().transpose());
                layers.hook.linear(&Linear { weight, bias: None }, h)
            }
        }
    }

    /// Logits for every position, (sequences·length) × vocabulary.
    pub fn forward(&self, batch: &TokenBatch<'_>, hook: &mut impl Hook) -> Tensor<2> {
        let (b, t) = (batch.sequences, batch.length);
        let positions: Vec<u32> = (0..b).flat_map(|_| 0..t as u32).collect();
        let mut layers = Layers { hook, frozen: self.adapted() };
        let mut x = self.embed(&mut layers, batch.tokens, &positions, batch.lagged);
        let rotary = self.gated().then_some(self.rope_base);
        for block in &self.blocks {
            let h = layers.norm(&block.attention_norm, x.clone());
            let qkv = layers.project(&block.qkv, h);
            let attended = causal_attention(qkv, b, t, self.heads(), rotary);
            x = x + layers.project(&block.output, attended);
            let h = layers.norm(&block.mlp_norm, x.clone());
            x = x + self.mlp(&mut layers, block, h);
        }
        self.logits(&mut layers, x)
    }

    /// Adds tables for further inputs per position, of `sizes` ids each (small normal
    /// embeddings, as the token table's).
    pub fn with_lagged(mut self, sizes: &[usize], device: &Device) -> Self {
        let width = self.width();
        let small = Initializer::Normal { mean: 0.0, std: 0.02 };
        self.lagged = sizes
            .iter()
            .map(|&n| EmbeddingConfig::new(n, width).with_initializer(small.clone()).init(device))
            .collect();
        self
    }

    /// Attaches fresh LoRA adapters to the configured targets; the rest becomes frozen.
    pub fn with_adapters(mut self, lora: &LoraConfig, device: &Device) -> Result<Self, String> {
        if lora.rank == 0 || lora.targets.is_empty() {
            return Err("LoRA needs a rank of at least 1 and at least one target".to_string());
        }
        if let Some(unknown) = lora.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
            return Err(format!("LoRA target {unknown:?} is none of {TARGETS:?}"));
        }
        if self.head.is_none() && lora.targets.iter().any(|t| t == "head") {
            return Err("LoRA target \"head\": the head is tied to the token embedding".to_string());
        }
        for block in &mut self.blocks {
            for (name, projection) in block.projections_mut() {
                if lora.targets.iter().any(|t| t == name) {
                    projection.adapter = Some(lora.init(&projection.base, device));
                }
            }
        }
        if let Some(head) = &mut self.head
            && lora.targets.iter().any(|t| t == "head")
        {
            head.adapter = Some(lora.init(&head.base, device));
        }
        Ok(self)
    }

    /// The first `layers` blocks only: a smaller model that keeps the pretrained lower
    /// layers (and the final norm and head), for CPUs.
    pub fn truncated(mut self, layers: usize) -> Self {
        self.blocks.truncate(layers);
        self
    }

    /// The decoder over a sub-vocabulary: token k is the old token `ids[k]`, its embedding
    /// row and head column kept, the rest dropped. The logits of a sequence of kept tokens
    /// are the old logits at the kept columns; a head over a few hundred tokens instead of
    /// tens of thousands.
    pub fn restricted(mut self, ids: &[u32]) -> Self {
        let device = self.tokens.weight.device();
        let index = Tensor::<1, Int>::from_data(
            TensorData::new(ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(), [ids.len()]),
            &device,
        );
        self.tokens.weight = Param::from_tensor(self.tokens.weight.val().select(0, index.clone()));
        if let Some(head) = &mut self.head {
            head.base.weight = Param::from_tensor(head.base.weight.val().select(1, index.clone()));
            if let Some(bias) = &mut head.base.bias {
                *bias = Param::from_tensor(bias.val().select(0, index.clone()));
            }
            if let Some(adapter) = &mut head.adapter {
                adapter.up.weight = Param::from_tensor(adapter.up.weight.val().select(1, index));
            }
        }
        self
    }

    /// A separate head initialised from the token embedding, so that every parameter has
    /// one use (ghost clipping records each layer once) for full fine-tuning.
    pub fn untied(mut self) -> Self {
        if self.head.is_none() {
            let weight = self.tokens.weight.val().transpose();
            let [input, output] = weight.dims();
            let device = weight.device();
            let mut base = LinearConfig::new(input, output).with_bias(false).init(&device);
            base.weight = Param::from_tensor(weight);
            self.head = Some(Projection { base, adapter: None });
        }
        self
    }
}

/// Names of a block's linears, as a LoRA target list names them.
pub const TARGETS: [&str; 5] = ["qkv", "output", "up", "down", "head"];

impl Block {
    fn projections(&self) -> [&Projection; 4] {
        [&self.qkv, &self.output, &self.up, &self.down]
    }

    fn projections_mut(&mut self) -> [(&'static str, &mut Projection); 4] {
        [("qkv", &mut self.qkv), ("output", &mut self.output), ("up", &mut self.up), ("down", &mut self.down)]
    }
}

impl Projection {
    fn layers<'a>(&'a self, out: &mut Vec<Layer<'a>>, frozen: bool) {
        match &self.adapter {
            Some(adapter) => out.extend([Layer::Linear(&adapter.down), Layer::Linear(&adapter.up)]),
            None if !frozen => out.push(Layer::Linear(&self.base)),
            None => {}
        }
    }

    fn layers_mut<'a>(&'a mut self, out: &mut Vec<LayerMut<'a>>, frozen: bool) {
        match &mut self.adapter {
            Some(adapter) => out.extend([LayerMut::Linear(&mut adapter.down), LayerMut::Linear(&mut adapter.up)]),
            None if !frozen => out.push(LayerMut::Linear(&mut self.base)),
            None => {}
        }
    }
}

/// The trainable layers in forward order: every layer, or only the adapters once attached.
impl TrainableLayers for Decoder {
    fn layers(&self) -> Vec<Layer<'_>> {
        let frozen = self.adapted();
        let mut out = Vec::new();
        if !frozen {
            out.push(Layer::Embedding(&self.tokens));
            out.extend(self.positions.as_ref().map(Layer::Embedding));
            out.extend(self.lagged.iter().map(Layer::Embedding));
        }
        for b in &self.blocks {
            if !frozen {
                out.push(Layer::Norm(&b.attention_norm));
            }
            b.qkv.layers(&mut out, frozen);
            b.output.layers(&mut out, frozen);
            if !frozen {
                out.push(Layer::Norm(&b.mlp_norm));
            }
            b.up.layers(&mut out, frozen);
            b.down.layers(&mut out, frozen);
        }
        if !frozen {
            out.push(Layer::Norm(&self.final_norm));
        }
        if let Some(head) = &self.head {
            head.layers(&mut out, frozen);
        }
        out
    }

    fn layers_mut(&mut self) -> Vec<LayerMut<'_>> {
        let frozen = self.adapted();
        let mut out = Vec::new();
        if !frozen {
            out.push(LayerMut::Embedding(&mut self.tokens));
            out.extend(self.positions.as_mut().map(LayerMut::Embedding));
            out.extend(self.lagged.iter_mut().map(LayerMut::Embedding));
        }
        for b in &mut self.blocks {
            if !frozen {
                out.push(LayerMut::Norm(&mut b.attention_norm));
            }
            b.qkv.layers_mut(&mut out, frozen);
            b.output.layers_mut(&mut out, frozen);
            if !frozen {
                out.push(LayerMut::Norm(&mut b.mlp_norm));
            }
            b.up.layers_mut(&mut out, frozen);
            b.down.layers_mut(&mut out, frozen);
        }
        if !frozen {
            out.push(LayerMut::Norm(&mut self.final_norm));
        }
        if let Some(head) = &mut self.head {
            head.layers_mut(&mut out, frozen);
        }
        out
    }
}
