//! Pretrained weights into a [`Decoder`]: Hugging Face's layout (`config.json` +
//! `model.safetensors`, GPT-2 and Llama names) or one GGUF file (llama.cpp's names, its
//! rotary row order undone). Each format's names and quirks stay here; the decoder sees
//! PyTorch-layout tensors by part, checked against the configuration's shapes. `fetch`
//! reads a checkpoint and its tokenizer from a path or an object-store URL.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData};
use bytes::Bytes;
use half::{bf16, f16};
use object_store::ObjectStoreExt;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::gguf::Gguf;
use super::model::{Decoder, DecoderConfig, Family, Projection};
use super::tokenizer::TextTokenizer;
use crate::dpsgd::layers::Norm;

/// A tensor as f32 in PyTorch layout (a linear's rows are its outputs).
#[derive(Clone, Debug, PartialEq)]
pub struct Weights {
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{0}")]
    Format(String),
    #[error("reading the checkpoint {url}: {message}")]
    Read { url: String, message: String },
    #[error("the checkpoint has no tensor {0}")]
    Missing(String),
    #[error("tensor {name} has shape {got:?}; the configuration needs {want:?}")]
    Shape { name: String, got: Vec<usize>, want: Vec<usize> },
}

/// A part of the decoder a checkpoint names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Tokens,
    Positions,
    FinalNorm,
    Head,
    AttentionNorm(usize),
    /// GPT-2's fused queries, keys and values.
    Qkv(usize),
    Query(usize),
    Key(usize),
    Value(usize),
    Output(usize),
    MlpNorm(usize),
    Gate(usize),
    Up(usize),
    Down(usize),
}

/// A weight or a bias of a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Weight,
    Bias,
}

impl Field {
    fn suffix(self) -> &'static str {
        match self {
            Field::Weight => "weight",
            Field::Bias => "bias",
        }
    }
}

/// Where a checkpoint's tensors come from.
pub enum Checkpoint {
    /// Hugging Face: `config.json` and `model.safetensors` (GPT-2's names may carry a
    /// `transformer.` prefix).
    SafeTensors {
        config: DecoderConfig,
        tensors: Bytes,
        prefix: String,
    },
    Gguf {
        config: DecoderConfig,
        file: Gguf,
    },
}

fn format(message: impl Into<String>) -> CheckpointError {
    CheckpointError::Format(message.into())
}

/// A field of Hugging Face's `config.json`.
fn json_usize(config: &Json, keys: &[&str]) -> Result<usize, CheckpointError> {
    keys.iter()
        .find_map(|k| config.get(*k).and_then(Json::as_u64))
        .map(|v| v as usize)
        .ok_or_else(|| format(format!("config.json has no {}", keys.join(" or "))))
}

/// The decoder a Hugging Face `config.json` describes (model types `gpt2` and `llama`).
fn hf_config(json: &[u8]) -> Result<DecoderConfig, CheckpointError> {
    let config: Json = serde_json::from_slice(json).map_err(|e| format(format!("config.json: {e}")))?;
    let text = |k: &str| config.get(k).and_then(Json::as_str).unwrap_or_default().to_string();
    let number = |k: &str, default: f64| config.get(k).and_then(Json::as_f64).unwrap_or(default);
    let flag = |k: &str, default: bool| config.get(k).and_then(Json::as_bool).unwrap_or(default);
    match text("model_type").as_str() {
        "gpt2" => {
            let width = json_usize(&config, &["n_embd"])?;
            let activation = text("activation_function");
            if !activation.is_empty() && activation != "gelu_new" {
                return Err(format(format!("GPT-2 activation {activation} (gelu_new is supported)")));
            }
            Ok(DecoderConfig::new(
                json_usize(&config, &["vocab_size"])?,
                json_usize(&config, &["n_positions", "n_ctx"])?,
                width,
                json_usize(&config, &["n_head"])?,
                json_usize(&config, &["n_layer"])?,
                json_usize(&config, &["n_inner"]).unwrap_or(4 * width),
            )
            .with_norm_epsilon(number("layer_norm_epsilon", 1e-5))
            .with_tied_head(flag("tie_word_embeddings", true)))
        }
        "llama" => {
            for unsupported in ["rope_scaling", "attention_bias", "mlp_bias"] {
                if config.get(unsupported).is_some_and(|v| !v.is_null() && v != &Json::Bool(false)) {
                    return Err(format(format!("Llama config sets {unsupported}, which rhosynth does not implement")));
                }
            }
            let activation = text("hidden_act");
            if !activation.is_empty() && activation != "silu" {
                return Err(format(format!("Llama activation {activation} (silu is supported)")));
            }
            let heads = json_usize(&config, &["num_attention_heads"])?;
            Ok(DecoderConfig::new(
                json_usize(&config, &["vocab_size"])?,
                json_usize(&config, &["max_position_embeddings"])?,
                json_usize(&config, &["hidden_size"])?,
                heads,
                json_usize(&config, &["num_hidden_layers"])?,
                json_usize(&config, &["intermediate_size"])?,
            )
            .with_family(Family::Llama)
            .with_kv_heads(Some(json_usize(&config, &["num_key_value_heads"]).unwrap_or(heads)))
            .with_rope_base(number("rope_theta", 10000.0))
            .with_norm_epsilon(number("rms_norm_eps", 1e-6))
            .with_tied_head(flag("tie_word_embeddings", false)))
        }
        other => Err(format(format!("model type {other:?}: rhosynth loads gpt2 and llama checkpoints"))),
    }
}

/// The decoder a GGUF file's metadata describes (architectures `gpt2` and `llama`).
fn gguf_config(file: &Gguf) -> Result<DecoderConfig, CheckpointError> {
    let arch = file.require("general.architecture")?.as_str().unwrap_or_default().to_string();
    let family = match arch.as_str() {
        "gpt2" => Family::Gpt,
        "llama" => Family::Llama,
        other => return Err(format(format!("GGUF architecture {other:?}: rhosynth loads gpt2 and llama"))),
    };
    let size = |key: &str| -> Result<usize, CheckpointError> {
        let key = format!("{arch}.{key}");
        file.require(&key)?.as_u64().map(|v| v as usize).ok_or_else(|| format(format!("GGUF: {key} is not a count")))
    };
    let real = |key: &str, default: f64| file.get(&format!("{arch}.{key}")).and_then(|v| v.as_f64()).unwrap_or(default);
    let vocabulary = match file.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        Some(tokens) => tokens.len(),
        None => {
            file.tensor_shape("token_embd.weight").map(|s| s[0]).ok_or_else(|| format("GGUF: no token embedding"))?
        }
    };
    let heads = size("attention.head_count")?;
    let width = size("embedding_length")?;
    let scaled = file.get(&format!("{arch}.rope.scaling.type")).and_then(|v| v.as_str()).is_some_and(|t| t != "none");
    let partial = size("rope.dimension_count").ok().is_some_and(|d| heads == 0 || d != width / heads);
    if scaled || partial || file.has_tensor("rope_freqs.weight") {
        return Err(format(
            "GGUF sets rope scaling, per-frequency factors or partial rotary dimensions, which rhosynth does not implement",
        ));
    }
    let epsilon = match family {
        Family::Gpt => real("attention.layer_norm_epsilon", 1e-5),
        Family::Llama => real("attention.layer_norm_rms_epsilon", 1e-5),
    };
    Ok(DecoderConfig::new(
        vocabulary,
        size("context_length")?,
        width,
        heads,
        size("block_count")?,
        size("feed_forward_length")?,
    )
    .with_family(family)
    .with_kv_heads(Some(size("attention.head_count_kv").unwrap_or(heads)))
    .with_rope_base(real("rope.freq_base", 10000.0))
    .with_norm_epsilon(epsilon)
    .with_tied_head(!file.has_tensor("output.weight")))
}

/// A safetensors tensor as f32.
fn safetensor(tensors: &SafeTensors<'_>, name: &str) -> Result<Option<Weights>, CheckpointError> {
    let Ok(view) = tensors.tensor(name) else { return Ok(None) };
    let data = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => data.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => data.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => return Err(format(format!("tensor {name} is {other:?}; rhosynth reads F32, F16 and BF16"))),
    };
    Ok(Some(Weights { shape: view.shape().to_vec(), values }))
}

/// A matrix transposed (rows × cols → cols × rows).
fn transpose(w: Weights) -> Weights {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let mut values = vec![0f32; w.values.len()];
    for r in 0..rows {
        for c in 0..cols {
            values[c * rows + r] = w.values[r * cols + c];
        }
    }
    Weights { shape: vec![cols, rows], values }
}

/// Undoes llama.cpp's query/key row order: it stores each head's rotary pairs
/// interleaved (row 2i + s), Hugging Face as halves (row s·dim/2 + i).
fn unpermute(w: Weights, heads: usize) -> Weights {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let half = rows / heads / 2;
    let mut values = vec![0f32; w.values.len()];
    for head in 0..heads {
        for s in 0..2 {
            for i in 0..half {
                let from = head * 2 * half + 2 * i + s;
                let to = head * 2 * half + s * half + i;
                values[to * cols..(to + 1) * cols].copy_from_slice(&w.values[from * cols..(from + 1) * cols]);
            }
        }
    }
    Weights { shape: w.shape, values }
}

/// One object's bytes, from a path or an object-store URL.
async fn read(url: &str) -> Result<Bytes, CheckpointError> {
    let error = |message: String| CheckpointError::Read { url: url.to_string(), message };
    let (location, path) = crate::storage::open_file(url).map_err(|e| error(e.to_string()))?;
    let object = location.store.get(&path).await.map_err(|e| error(e.to_string()))?;
    object.bytes().await.map_err(|e| error(e.to_string()))
}

/// A checkpoint as read: the model, its tokenizer and the SHA-256 of every file read (each
/// its length then its bytes, in order), which pins what a job planned with.
pub struct Fetched {
    pub checkpoint: Checkpoint,
    pub tokenizer: TextTokenizer,
    pub sha256: String,
}

/// A pretrained model and its tokenizer from a path or object-store URL: a `.gguf` file,
/// or a folder holding `config.json`, `model.safetensors` and `tokenizer.json` (the
/// end-of-text id from `config.json`'s `eos_token_id`, the first of a list).
pub async fn fetch(url: &str) -> Result<Fetched, CheckpointError> {
    let files = if url.ends_with(".gguf") {
        CheckpointFiles::Gguf(read(url).await?)
    } else {
        let folder = url.trim_end_matches('/');
        CheckpointFiles::HuggingFace {
            config: read(&format!("{folder}/config.json")).await?,
            tensors: read(&format!("{folder}/model.safetensors")).await?,
            tokenizer: read(&format!("{folder}/tokenizer.json")).await?,
        }
    };
    // Hashing and parsing hundreds of megabytes holds a thread for seconds: off the
    // runtime, whose heartbeats must keep going (a worker silent past the coordinator's
    // timeout is declared lost and its round redone).
    let stopped = || CheckpointError::Read { url: url.to_string(), message: "reading the checkpoint stopped".into() };
    tokio::task::spawn_blocking(move || files.parse()).await.map_err(|_| stopped())?
}

/// A checkpoint's files as read.
enum CheckpointFiles {
    Gguf(Bytes),
    HuggingFace { config: Bytes, tensors: Bytes, tokenizer: Bytes },
}

impl CheckpointFiles {
    /// What the files hold, and their SHA-256 (each file's length, then its bytes, in the
    /// order read).
    fn parse(self) -> Result<Fetched, CheckpointError> {
        let mut digest = Sha256::new();
        let files = match &self {
            CheckpointFiles::Gguf(bytes) => vec![bytes],
            CheckpointFiles::HuggingFace { config, tensors, tokenizer } => vec![config, tensors, tokenizer],
        };
        for bytes in files {
            digest.update((bytes.len() as u64).to_le_bytes());
            digest.update(bytes);
        }
        let sha256 = hex(digest);
        let (checkpoint, tokenizer) = match self {
            CheckpointFiles::Gguf(bytes) => {
                let checkpoint = Checkpoint::gguf(bytes)?;
                let tokenizer = TextTokenizer::from_gguf(checkpoint.gguf_file().expect("a GGUF checkpoint"))?;
                (checkpoint, tokenizer)
            }
            CheckpointFiles::HuggingFace { config, tensors, tokenizer } => {
                let checkpoint = Checkpoint::safetensors(&config, tensors)?;
                let eos = serde_json::from_slice::<Json>(&config).ok().and_then(|c| {
                    let id = c.get("eos_token_id")?;
                    id.as_u64().or_else(|| id.as_array()?.first()?.as_u64()).and_then(|id| u32::try_from(id).ok())
                });
                (checkpoint, TextTokenizer::from_json(&tokenizer, eos)?)
            }
        };
        Ok(Fetched { checkpoint, tokenizer, sha256 })
    }
}

fn hex(digest: Sha256) -> String {
    digest.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

impl Checkpoint {
    /// Hugging Face's layout from the bytes of `config.json` and `model.safetensors`.
    pub fn safetensors(config_json: &[u8], tensors: Bytes) -> Result<Self, CheckpointError> {
        let config = hf_config(config_json)?;
        let parsed = SafeTensors::deserialize(&tensors).map_err(|e| format(format!("safetensors: {e}")))?;
        let prefix = if parsed.names().iter().any(|n| n.starts_with("transformer.")) { "transformer." } else { "" };
        let prefix = prefix.to_string();
        Ok(Checkpoint::SafeTensors { config, tensors, prefix })
    }

    pub fn gguf(bytes: Bytes) -> Result<Self, CheckpointError> {
        let file = Gguf::parse(bytes)?;
        let config = gguf_config(&file)?;
        Ok(Checkpoint::Gguf { config, file })
    }

    pub fn config(&self) -> &DecoderConfig {
        match self {
            Checkpoint::SafeTensors { config, .. } | Checkpoint::Gguf { config, .. } => config,
        }
    }

    /// The GGUF file, whose metadata also holds the tokenizer.
    pub fn gguf_file(&self) -> Option<&Gguf> {
        match self {
            Checkpoint::Gguf { file, .. } => Some(file),
            Checkpoint::SafeTensors { .. } => None,
        }
    }

    /// The format's own name of a part's field.
    fn name(&self, part: Part, field: Field) -> String {
        match self {
            Checkpoint::SafeTensors { config, prefix, .. } => hf_name(config.family, prefix, part, field),
            Checkpoint::Gguf { .. } => gguf_name(part, field),
        }
    }

    /// A part's tensor in PyTorch layout, of the shape the configuration needs (checked
    /// before any reordering).
    fn require(&self, part: Part, field: Field, shape: &[usize]) -> Result<Vec<f32>, CheckpointError> {
        let config = self.config();
        let name = self.name(part, field);
        // GPT-2's Conv1D stores linears as inputs × outputs.
        let conv = matches!(self, Checkpoint::SafeTensors { .. })
            && config.family == Family::Gpt
            && field == Field::Weight
            && matches!(part, Part::Qkv(_) | Part::Output(_) | Part::Up(_) | Part::Down(_));
        let stored: Vec<usize> = if conv { shape.iter().rev().copied().collect() } else { shape.to_vec() };
        let w = match self {
            Checkpoint::SafeTensors { tensors, .. } => {
                let parsed = SafeTensors::deserialize(tensors).map_err(|e| format(format!("safetensors: {e}")))?;
                safetensor(&parsed, &name)?
            }
            Checkpoint::Gguf { file, .. } => file.tensor(&name)?,
        };
        let w = w.ok_or_else(|| CheckpointError::Missing(name.clone()))?;
        if w.shape != stored || w.values.len() != stored.iter().product::<usize>() {
            return Err(CheckpointError::Shape { name, got: w.shape, want: stored });
        }
        let gguf_llama = matches!(self, Checkpoint::Gguf { .. }) && config.family == Family::Llama;
        Ok(match part {
            _ if conv => transpose(w).values,
            Part::Query(_) if gguf_llama => unpermute(w, config.heads).values,
            Part::Key(_) if gguf_llama => unpermute(w, config.kv_heads()).values,
            _ => w.values,
        })
    }

    /// Rows of several parts stacked (a fused linear from separate ones), as torch layout.
    fn stacked(&self, parts: &[Part], rows: &[usize], inputs: usize) -> Result<Vec<f32>, CheckpointError> {
        let mut out = Vec::with_capacity(rows.iter().sum::<usize>() * inputs);
        for (&part, &r) in parts.iter().zip(rows) {
            out.extend(self.require(part, Field::Weight, &[r, inputs])?);
        }
        Ok(out)
    }

    /// The decoder with the checkpoint's weights.
    pub fn load(&self, device: &Device) -> Result<Decoder, CheckpointError> {
        let config = self.config();
        config.check().map_err(|e| format(format!("checkpoint configuration: {e}")))?;
        // No format stores a parameter in less than half a byte: a configuration larger
        // than its file could hold is refused before anything is allocated.
        let bytes = match self {
            Checkpoint::SafeTensors { tensors, .. } => tensors.len(),
            Checkpoint::Gguf { file, .. } => file.file_size(),
        };
        match config.parameter_count() {
            Some(n) if n / 2 <= bytes => {}
            n => {
                return Err(format(format!(
                    "the configuration declares {} parameters, more than its {bytes}-byte file holds",
                    n.map_or("too many".to_string(), |n| n.to_string())
                )));
            }
        }
        let mut decoder = config.init(device);
        let w = config.width;
        let kv = config.kv_heads() * (w / config.heads);
        let gpt = config.family == Family::Gpt;
        decoder.tokens.weight =
            matrix(self.require(Part::Tokens, Field::Weight, &[config.vocabulary, w])?, [config.vocabulary, w], device);
        if let Some(positions) = &mut decoder.positions {
            positions.weight = matrix(
                self.require(Part::Positions, Field::Weight, &[config.positions, w])?,
                [config.positions, w],
                device,
            );
        }
        for (i, block) in decoder.blocks.iter_mut().enumerate() {
            self.norm(&mut block.attention_norm, Part::AttentionNorm(i), device)?;
            self.norm(&mut block.mlp_norm, Part::MlpNorm(i), device)?;
            let qkv = if gpt {
                self.require(Part::Qkv(i), Field::Weight, &[w + 2 * kv, w])?
            } else {
                self.stacked(&[Part::Query(i), Part::Key(i), Part::Value(i)], &[w, kv, kv], w)?
            };
            self.linear(&mut block.qkv, qkv, Part::Qkv(i), device)?;
            let output = self.require(Part::Output(i), Field::Weight, &[w, w])?;
            self.linear(&mut block.output, output, Part::Output(i), device)?;
            let up = if gpt {
                self.require(Part::Up(i), Field::Weight, &[config.mlp, w])?
            } else {
                self.stacked(&[Part::Gate(i), Part::Up(i)], &[config.mlp, config.mlp], w)?
            };
            self.linear(&mut block.up, up, Part::Up(i), device)?;
            let down = self.require(Part::Down(i), Field::Weight, &[w, config.mlp])?;
            self.linear(&mut block.down, down, Part::Down(i), device)?;
        }
        self.norm(&mut decoder.final_norm, Part::FinalNorm, device)?;
        if let Some(head) = &mut decoder.head {
            let weight = self.require(Part::Head, Field::Weight, &[config.vocabulary, w])?;
            self.linear(head, weight, Part::Head, device)?;
        }
        Ok(decoder)
    }

    /// A linear's weight (torch layout, outputs × inputs) and, where it has one, its bias.
    fn linear(
        &self,
        projection: &mut Projection,
        torch: Vec<f32>,
        part: Part,
        device: &Device,
    ) -> Result<(), CheckpointError> {
        let linear: &mut Linear = &mut projection.base;
        let [inputs, outputs] = linear.weight.dims();
        let burn_layout = transpose(Weights { shape: vec![outputs, inputs], values: torch });
        linear.weight = matrix(burn_layout.values, [inputs, outputs], device);
        if let Some(bias) = &mut linear.bias {
            *bias = vector(self.require(part, Field::Bias, &[outputs])?, device);
        }
        Ok(())
    }

    fn norm(&self, norm: &mut Norm, part: Part, device: &Device) -> Result<(), CheckpointError> {
        let width = norm.gamma.dims()[0];
        norm.gamma = vector(self.require(part, Field::Weight, &[width])?, device);
        if let Some(beta) = &mut norm.beta {
            *beta = vector(self.require(part, Field::Bias, &[width])?, device);
        }
        Ok(())
    }
}

fn matrix(values: Vec<f32>, shape: [usize; 2], device: &Device) -> Param<Tensor<2>> {
    Param::from_tensor(Tensor::from_data(TensorData::new(values, shape), device))
}

fn vector(values: Vec<f32>, device: &Device) -> Param<Tensor<1>> {
    let n = values.len();
    Param::from_tensor(Tensor::from_data(TensorData::new(values, [n]), device))
}

/// Hugging Face's name of a part.
fn hf_name(family: Family, prefix: &str, part: Part, field: Field) -> String {
    let f = field.suffix();
    match family {
        Family::Gpt => match part {
            Part::Tokens => format!("{prefix}wte.weight"),
            Part::Positions => format!("{prefix}wpe.weight"),
            Part::FinalNorm => format!("{prefix}ln_f.{f}"),
            Part::Head => "lm_head.weight".to_string(),
            Part::AttentionNorm(i) => format!("{prefix}h.{i}.ln_1.{f}"),
            Part::Qkv(i) | Part::Query(i) | Part::Key(i) | Part::Value(i) => format!("{prefix}h.{i}.attn.c_attn.{f}"),
            Part::Output(i) => format!("{prefix}h.{i}.attn.c_proj.{f}"),
            Part::MlpNorm(i) => format!("{prefix}h.{i}.ln_2.{f}"),
            Part::Gate(i) | Part::Up(i) => format!("{prefix}h.{i}.mlp.c_fc.{f}"),
            Part::Down(i) => format!("{prefix}h.{i}.mlp.c_proj.{f}"),
        },
        Family::Llama => match part {
            Part::Tokens => "model.embed_tokens.weight".to_string(),
            Part::Positions => "model.embed_positions.weight".to_string(),
            Part::FinalNorm => format!("model.norm.{f}"),
            Part::Head => "lm_head.weight".to_string(),
            Part::AttentionNorm(i) => format!("model.layers.{i}.input_layernorm.{f}"),
            Part::Qkv(i) | Part::Query(i) => format!("model.layers.{i}.self_attn.q_proj.{f}"),
            Part::Key(i) => format!("model.layers.{i}.self_attn.k_proj.{f}"),
            Part::Value(i) => format!("model.layers.{i}.self_attn.v_proj.{f}"),
            Part::Output(i) => format!("model.layers.{i}.self_attn.o_proj.{f}"),
            Part::MlpNorm(i) => format!("model.layers.{i}.post_attention_layernorm.{f}"),
            Part::Gate(i) => format!("model.layers.{i}.mlp.gate_proj.{f}"),
            Part::Up(i) => format!("model.layers.{i}.mlp.up_proj.{f}"),
            Part::Down(i) => format!("model.layers.{i}.mlp.down_proj.{f}"),
        },
    }
}

/// llama.cpp's name of a part (both architectures).
fn gguf_name(part: Part, field: Field) -> String {
    let f = field.suffix();
    match part {
        Part::Tokens => "token_embd.weight".to_string(),
        Part::Positions => "position_embd.weight".to_string(),
        Part::FinalNorm => format!("output_norm.{f}"),
        Part::Head => "output.weight".to_string(),
        Part::AttentionNorm(i) => format!("blk.{i}.attn_norm.{f}"),
        Part::Qkv(i) => format!("blk.{i}.attn_qkv.{f}"),
        Part::Query(i) => format!("blk.{i}.attn_q.{f}"),
        Part::Key(i) => format!("blk.{i}.attn_k.{f}"),
        Part::Value(i) => format!("blk.{i}.attn_v.{f}"),
        Part::Output(i) => format!("blk.{i}.attn_output.{f}"),
        Part::MlpNorm(i) => format!("blk.{i}.ffn_norm.{f}"),
        Part::Gate(i) => format!("blk.{i}.ffn_gate.{f}"),
        Part::Up(i) => format!("blk.{i}.ffn_up.{f}"),
        Part::Down(i) => format!("blk.{i}.ffn_down.{f}"),
    }
}
