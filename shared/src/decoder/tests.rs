//! Checkpoints load to the logits of an independent reference forward pass (f64 loops over
//! the checkpoint's own tensors, in Hugging Face's conventions) from both formats; cached
//! decoding equals the full pass with rotary positions and grouped-query heads; GGUF
//! tokenizers and `tokenizer.json` agree; ghost clipping of LoRA adapters, and of every
//! parameter under full fine-tuning, equals a per-unit backward loop.

use std::collections::BTreeMap;

use burn::module::Module;
use bytes::Bytes;
use half::f16;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use super::checkpoint::{Checkpoint, Weights};
use super::gguf::Gguf;
use super::lora::LoraConfig;
use super::model::{Decoder, DecoderConfig, Family, TokenBatch};
use super::tokenizer::TextTokenizer;
use super::{KvCache, next_token_losses};
use crate::dpsgd::compute_device;
use crate::dpsgd::ghost::{GhostTape, Plain, clipped_sum};
use crate::dpsgd::layers::Layer;
use crate::dpsgd::params::{TrainableLayers, values};

/// Weights are multiples of 2⁻⁶ below 1 in size: exact in f32, f16 and Q8_0 alike, so
/// every format must give the same logits.
const STEP: f32 = 1.0 / 64.0;

fn random(rng: &mut ChaCha8Rng, shape: &[usize], around: f32) -> Weights {
    let n = shape.iter().product();
    Weights {
        shape: shape.to_vec(),
        values: (0..n).map(|_| around + STEP * rng.random_range(-40i32..=40) as f32).collect(),
    }
}

/// A tiny Llama (grouped-query, rotary, untied or tied head) in Hugging Face's names.
fn llama(tied: bool) -> (DecoderConfig, BTreeMap<String, Weights>) {
    let config = DecoderConfig::new(40, 32, 16, 4, 2, 24)
        .with_family(Family::Llama)
        .with_kv_heads(Some(2))
        .with_rope_base(10000.0)
        .with_norm_epsilon(1e-5)
        .with_tied_head(tied);
    let mut rng = ChaCha8Rng::from_seed([3; 32]);
    let (w, kv, m) = (16, 8, 24);
    let mut t = BTreeMap::new();
    t.insert("model.embed_tokens.weight".into(), random(&mut rng, &[40, w], 0.0));
    for i in 0..2 {
        let p = format!("model.layers.{i}.");
        for (name, shape, around) in [
            ("input_layernorm.weight", vec![w], 1.0),
            ("self_attn.q_proj.weight", vec![w, w], 0.0),
            ("self_attn.k_proj.weight", vec![kv, w], 0.0),
            ("self_attn.v_proj.weight", vec![kv, w], 0.0),
            ("self_attn.o_proj.weight", vec![w, w], 0.0),
            ("post_attention_layernorm.weight", vec![w], 1.0),
            ("mlp.gate_proj.weight", vec![m, w], 0.0),
            ("mlp.up_proj.weight", vec![m, w], 0.0),
            ("mlp.down_proj.weight", vec![w, m], 0.0),
        ] {
            t.insert(format!("{p}{name}"), random(&mut rng, &shape, around));
        }
    }
    t.insert("model.norm.weight".into(), random(&mut rng, &[w], 1.0));
    if !tied {
        t.insert("lm_head.weight".into(), random(&mut rng, &[40, w], 0.0));
    }
    (config, t)
}

/// A tiny GPT-2 (tied head, Conv1D layout, `transformer.` prefix) in Hugging Face's names.
fn gpt2() -> (DecoderConfig, BTreeMap<String, Weights>) {
    let config = DecoderConfig::new(40, 12, 16, 2, 2, 32).with_tied_head(true);
    let mut rng = ChaCha8Rng::from_seed([4; 32]);
    let (w, m) = (16, 32);
    let mut t = BTreeMap::new();
    t.insert("transformer.wte.weight".into(), random(&mut rng, &[40, w], 0.0));
    t.insert("transformer.wpe.weight".into(), random(&mut rng, &[12, w], 0.0));
    for i in 0..2 {
        let p = format!("transformer.h.{i}.");
        for (name, shape, around) in [
            ("ln_1.weight", vec![w], 1.0),
            ("ln_1.bias", vec![w], 0.0),
            ("attn.c_attn.weight", vec![w, 3 * w], 0.0),
            ("attn.c_attn.bias", vec![3 * w], 0.0),
            ("attn.c_proj.weight", vec![w, w], 0.0),
            ("attn.c_proj.bias", vec![w], 0.0),
            ("ln_2.weight", vec![w], 1.0),
            ("ln_2.bias", vec![w], 0.0),
            ("mlp.c_fc.weight", vec![w, m], 0.0),
            ("mlp.c_fc.bias", vec![m], 0.0),
            ("mlp.c_proj.weight", vec![m, w], 0.0),
            ("mlp.c_proj.bias", vec![w], 0.0),
        ] {
            t.insert(format!("{p}{name}"), random(&mut rng, &shape, around));
        }
    }
    t.insert("transformer.ln_f.weight".into(), random(&mut rng, &[w], 1.0));
    t.insert("transformer.ln_f.bias".into(), random(&mut rng, &[w], 0.0));
    (config, t)
}

// --- the reference: plain f64 loops in Hugging Face's conventions --------------------------

type Rows = Vec<Vec<f64>>;

fn get<'a>(t: &'a BTreeMap<String, Weights>, name: &str) -> &'a Weights {
    t.get(name).unwrap_or_else(|| panic!("no {name}"))
}

/// x·Wᵀ for torch-layout W (outputs × inputs), or x·W for Conv1D layout (inputs × outputs).
fn matmul(x: &Rows, w: &Weights, conv1d: bool, bias: Option<&Weights>) -> Rows {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let (inputs, outputs) = if conv1d { (rows, cols) } else { (cols, rows) };
    x.iter()
        .map(|row| {
            assert_eq!(row.len(), inputs);
            (0..outputs)
                .map(|o| {
                    let dot: f64 = (0..inputs)
                        .map(|i| {
                            row[i] * f64::from(if conv1d { w.values[i * cols + o] } else { w.values[o * cols + i] })
                        })
                        .sum();
                    dot + bias.map_or(0.0, |b| f64::from(b.values[o]))
                })
                .collect()
        })
        .collect()
}

fn norm(x: &Rows, gamma: &Weights, beta: Option<&Weights>, epsilon: f64) -> Rows {
    x.iter()
        .map(|row| {
            let n = row.len() as f64;
            let mean = if beta.is_some() { row.iter().sum::<f64>() / n } else { 0.0 };
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
            row.iter()
                .enumerate()
                .map(|(j, v)| {
                    (v - mean) / (var + epsilon).sqrt() * f64::from(gamma.values[j])
                        + beta.map_or(0.0, |b| f64::from(b.values[j]))
                })
                .collect()
        })
        .collect()
}

fn add(x: &mut Rows, y: &Rows) {
    x.iter_mut().zip(y).for_each(|(a, b)| a.iter_mut().zip(b).for_each(|(p, q)| *p += q));
}

/// Causal attention of one sequence: q (t × heads·d), k and v (t × kv·d).
fn attention(q: &Rows, k: &Rows, v: &Rows, heads: usize, kv: usize, d: usize) -> Rows {
    let t = q.len();
    let mut out = vec![vec![0.0; heads * d]; t];
    for h in 0..heads {
        let g = h / (heads / kv);
        for i in 0..t {
            let scores: Vec<f64> = (0..=i)
                .map(|j| (0..d).map(|c| q[i][h * d + c] * k[j][g * d + c]).sum::<f64>() / (d as f64).sqrt())
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = e.iter().sum();
            for (j, w) in e.iter().enumerate() {
                for c in 0..d {
                    out[i][h * d + c] += w / total * v[j][g * d + c];
                }
            }
        }
    }
    out
}

/// Hugging Face's rotary embedding: pairs (i, i + d/2) of each head.
fn rope(x: &mut Rows, d: usize, base: f64) {
    for (position, row) in x.iter_mut().enumerate() {
        for head in row.chunks_mut(d) {
            for i in 0..d / 2 {
                let angle = position as f64 / base.powf(2.0 * i as f64 / d as f64);
                let (a, b) = (head[i], head[i + d / 2]);
                head[i] = a * angle.cos() - b * angle.sin();
                head[i + d / 2] = b * angle.cos() + a * angle.sin();
            }
        }
    }
}

fn reference_llama(config: &DecoderConfig, t: &BTreeMap<String, Weights>, tokens: &[u32]) -> Rows {
    let (heads, kv, d) = (config.heads, config.kv_heads(), config.width / config.heads);
    let e = get(t, "model.embed_tokens.weight");
    let mut x: Rows = tokens
        .iter()
        .map(|&id| {
            e.values[id as usize * config.width..(id as usize + 1) * config.width]
                .iter()
                .map(|&v| f64::from(v))
                .collect()
        })
        .collect();
    for i in 0..config.layers {
        let w = |n: &str| get(t, &format!("model.layers.{i}.{n}.weight"));
        let h = norm(&x, w("input_layernorm"), None, config.norm_epsilon);
        let (mut q, mut k, v) = (
            matmul(&h, w("self_attn.q_proj"), false, None),
            matmul(&h, w("self_attn.k_proj"), false, None),
            matmul(&h, w("self_attn.v_proj"), false, None),
        );
        rope(&mut q, d, config.rope_base);
        rope(&mut k, d, config.rope_base);
        add(&mut x, &matmul(&attention(&q, &k, &v, heads, kv, d), w("self_attn.o_proj"), false, None));
        let h = norm(&x, w("post_attention_layernorm"), None, config.norm_epsilon);
        let (gate, up) = (matmul(&h, w("mlp.gate_proj"), false, None), matmul(&h, w("mlp.up_proj"), false, None));
        let inner: Rows = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| g.iter().zip(u).map(|(a, b)| a / (1.0 + (-a).exp()) * b).collect())
            .collect();
        add(&mut x, &matmul(&inner, w("mlp.down_proj"), false, None));
    }
    let h = norm(&x, get(t, "model.norm.weight"), None, config.norm_epsilon);
    matmul(&h, t.get("lm_head.weight").unwrap_or(e), false, None)
}

fn reference_gpt2(config: &DecoderConfig, t: &BTreeMap<String, Weights>, tokens: &[u32]) -> Rows {
    let w = config.width;
    let (e, p) = (get(t, "transformer.wte.weight"), get(t, "transformer.wpe.weight"));
    let mut x: Rows = tokens
        .iter()
        .enumerate()
        .map(|(pos, &id)| {
            (0..w).map(|c| f64::from(e.values[id as usize * w + c]) + f64::from(p.values[pos * w + c])).collect()
        })
        .collect();
    let gelu = |v: f64| 0.5 * v * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v.powi(3))).tanh());
    for i in 0..config.layers {
        let g = |n: &str| get(t, &format!("transformer.h.{i}.{n}"));
        let h = norm(&x, g("ln_1.weight"), Some(g("ln_1.bias")), config.norm_epsilon);
        let qkv = matmul(&h, g("attn.c_attn.weight"), true, Some(g("attn.c_attn.bias")));
        let part = |k: usize| -> Rows { qkv.iter().map(|r| r[k * w..(k + 1) * w].to_vec()).collect() };
        let attended = attention(&part(0), &part(1), &part(2), config.heads, config.heads, w / config.heads);
        add(&mut x, &matmul(&attended, g("attn.c_proj.weight"), true, Some(g("attn.c_proj.bias"))));
        let h = norm(&x, g("ln_2.weight"), Some(g("ln_2.bias")), config.norm_epsilon);
        let inner: Rows = matmul(&h, g("mlp.c_fc.weight"), true, Some(g("mlp.c_fc.bias")))
            .into_iter()
            .map(|r| r.into_iter().map(gelu).collect())
            .collect();
        add(&mut x, &matmul(&inner, g("mlp.c_proj.weight"), true, Some(g("mlp.c_proj.bias"))));
    }
    let h = norm(&x, get(t, "transformer.ln_f.weight"), Some(get(t, "transformer.ln_f.bias")), config.norm_epsilon);
    matmul(&h, e, false, None)
}

// --- writing the two formats --------------------------------------------------------------

fn hf_config_json(config: &DecoderConfig) -> String {
    match config.family {
        Family::Llama => format!(
            r#"{{"model_type": "llama", "vocab_size": {}, "max_position_embeddings": {}, "hidden_size": {}, "num_attention_heads": {}, "num_key_value_heads": {}, "num_hidden_layers": {}, "intermediate_size": {}, "rope_theta": {}, "rms_norm_eps": {}, "tie_word_embeddings": {}, "hidden_act": "silu", "rope_scaling": null}}"#,
            config.vocabulary,
            config.positions,
            config.width,
            config.heads,
            config.kv_heads(),
            config.layers,
            config.mlp,
            config.rope_base,
            config.norm_epsilon,
            config.tied_head
        ),
        Family::Gpt => format!(
            r#"{{"model_type": "gpt2", "vocab_size": {}, "n_positions": {}, "n_embd": {}, "n_head": {}, "n_layer": {}, "n_inner": {}, "layer_norm_epsilon": {}, "activation_function": "gelu_new"}}"#,
            config.vocabulary,
            config.positions,
            config.width,
            config.heads,
            config.layers,
            config.mlp,
            config.norm_epsilon
        ),
    }
}

fn safetensors_bytes(t: &BTreeMap<String, Weights>) -> Bytes {
    let raw: Vec<(String, Vec<u8>, Vec<usize>)> = t
        .iter()
        .map(|(n, w)| (n.clone(), w.values.iter().flat_map(|v| v.to_le_bytes()).collect(), w.shape.clone()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = raw
        .iter()
        .map(|(n, data, shape)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap())
        })
        .collect();
    Bytes::from(safetensors::serialize(views, None).unwrap())
}

/// A GGUF metadata value.
enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
    Strings(Vec<String>),
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Q8_0 blocks of values that are multiples of 2⁻⁶ (exact: d = 2⁻⁶).
fn q8_0(values: &[f32]) -> Vec<u8> {
    values
        .chunks(32)
        .flat_map(|block| {
            let mut out = f16::from_f32(STEP).to_le_bytes().to_vec();
            out.extend(block.iter().map(|v| ((v / STEP).round() as i8) as u8));
            out
        })
        .collect()
}

/// A GGUF v3 file: tensors in torch layout, stored as F32 (code 0), F16 (1) or Q8_0 (8).
fn gguf_bytes(metadata: &[(&str, Meta)], tensors: &[(String, Weights, u32)]) -> Bytes {
    let mut out = Vec::new();
    out.extend(0x4655_4747u32.to_le_bytes());
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_string(&mut out, s);
            }
            Meta::Strings(list) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((list.len() as u64).to_le_bytes());
                list.iter().for_each(|s| put_string(&mut out, s));
            }
        }
    }
    let mut data = Vec::new();
    for (name, w, code) in tensors {
        put_string(&mut out, name);
        out.extend((w.shape.len() as u32).to_le_bytes());
        w.shape.iter().rev().for_each(|d| out.extend((*d as u64).to_le_bytes()));
        out.extend(code.to_le_bytes());
        out.extend((data.len() as u64).to_le_bytes());
        match code {
            0 => data.extend(w.values.iter().flat_map(|v| v.to_le_bytes())),
            1 => data.extend(w.values.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes())),
            8 => data.extend(q8_0(&w.values)),
            _ => unreachable!(),
        }
        data.resize(data.len().div_ceil(32) * 32, 0);
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    out.extend(data);
    Bytes::from(out)
}

/// llama.cpp's query/key row order: each head's rotary halves interleaved.
fn permute(w: &Weights, heads: usize) -> Weights {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let half = rows / heads / 2;
    let mut values = vec![0f32; w.values.len()];
    for h in 0..heads {
        for s in 0..2 {
            for i in 0..half {
                let (hf, cpp) = (h * 2 * half + s * half + i, h * 2 * half + 2 * i + s);
                values[cpp * cols..(cpp + 1) * cols].copy_from_slice(&w.values[hf * cols..(hf + 1) * cols]);
            }
        }
    }
    Weights { shape: w.shape.clone(), values }
}

fn transposed(w: &Weights) -> Weights {
    let (rows, cols) = (w.shape[0], w.shape[1]);
    let values = (0..rows * cols).map(|k| w.values[(k % rows) * cols + k / rows]).collect();
    Weights { shape: vec![cols, rows], values }
}

/// The Llama's tensors under llama.cpp's names and row order, linears in Q8_0 and F16.
fn llama_gguf(config: &DecoderConfig, t: &BTreeMap<String, Weights>) -> Bytes {
    let mut tensors = Vec::new();
    for (name, w) in t {
        let (gguf, weights) = match name.as_str() {
            "model.embed_tokens.weight" => ("token_embd.weight".to_string(), w.clone()),
            "model.norm.weight" => ("output_norm.weight".to_string(), w.clone()),
            "lm_head.weight" => ("output.weight".to_string(), w.clone()),
            _ => {
                let rest = name.strip_prefix("model.layers.").unwrap();
                let (i, field) = rest.split_once('.').unwrap();
                let (short, weights) = match field {
                    "input_layernorm.weight" => ("attn_norm", w.clone()),
                    "self_attn.q_proj.weight" => ("attn_q", permute(w, config.heads)),
                    "self_attn.k_proj.weight" => ("attn_k", permute(w, config.kv_heads())),
                    "self_attn.v_proj.weight" => ("attn_v", w.clone()),
                    "self_attn.o_proj.weight" => ("attn_output", w.clone()),
                    "post_attention_layernorm.weight" => ("ffn_norm", w.clone()),
                    "mlp.gate_proj.weight" => ("ffn_gate", w.clone()),
                    "mlp.up_proj.weight" => ("ffn_up", w.clone()),
                    "mlp.down_proj.weight" => ("ffn_down", w.clone()),
                    other => panic!("{other}"),
                };
                (format!("blk.{i}.{short}.weight"), weights)
            }
        };
        let code = if weights.shape.len() == 1 {
            0
        } else if gguf.contains("attn_v") || gguf.contains("ffn_up") {
            1
        } else {
            8
        };
        tensors.push((gguf, weights, code));
    }
    let metadata = [
        ("general.architecture", Meta::Str("llama")),
        ("llama.context_length", Meta::U32(config.positions as u32)),
        ("llama.embedding_length", Meta::U32(config.width as u32)),
        ("llama.block_count", Meta::U32(config.layers as u32)),
        ("llama.feed_forward_length", Meta::U32(config.mlp as u32)),
        ("llama.attention.head_count", Meta::U32(config.heads as u32)),
        ("llama.attention.head_count_kv", Meta::U32(config.kv_heads() as u32)),
        ("llama.rope.freq_base", Meta::F32(config.rope_base as f32)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(config.norm_epsilon as f32)),
    ];
    gguf_bytes(&metadata, &tensors)
}

/// The GPT-2's tensors under llama.cpp's names, linears in torch layout.
fn gpt2_gguf(config: &DecoderConfig, t: &BTreeMap<String, Weights>) -> Bytes {
    let mut tensors = Vec::new();
    for (name, w) in t {
        let name = name.strip_prefix("transformer.").unwrap();
        let gguf = match name {
            "wte.weight" => "token_embd.weight".to_string(),
            "wpe.weight" => "position_embd.weight".to_string(),
            _ if name.starts_with("ln_f.") => name.replace("ln_f.", "output_norm."),
            _ => {
                let rest = name.strip_prefix("h.").unwrap();
                let (i, field) = rest.split_once('.').unwrap();
                let (part, f) = field.rsplit_once('.').unwrap();
                let short = match part {
                    "ln_1" => "attn_norm",
                    "attn.c_attn" => "attn_qkv",
                    "attn.c_proj" => "attn_output",
                    "ln_2" => "ffn_norm",
                    "mlp.c_fc" => "ffn_up",
                    "mlp.c_proj" => "ffn_down",
                    other => panic!("{other}"),
                };
                format!("blk.{i}.{short}.{f}")
            }
        };
        let weights = if w.shape.len() == 2 && gguf.starts_with("blk.") { transposed(w) } else { w.clone() };
        let code = if weights.shape.len() == 1 { 0 } else { 8 };
        tensors.push((gguf, weights, code));
    }
    let metadata = [
        ("general.architecture", Meta::Str("gpt2")),
        ("gpt2.context_length", Meta::U32(config.positions as u32)),
        ("gpt2.embedding_length", Meta::U32(config.width as u32)),
        ("gpt2.block_count", Meta::U32(config.layers as u32)),
        ("gpt2.feed_forward_length", Meta::U32(config.mlp as u32)),
        ("gpt2.attention.head_count", Meta::U32(config.heads as u32)),
        ("gpt2.attention.layer_norm_epsilon", Meta::F32(config.norm_epsilon as f32)),
    ];
    gguf_bytes(&metadata, &tensors)
}

fn logits(decoder: &Decoder, tokens: &[u32]) -> Vec<f32> {
    let batch = TokenBatch { tokens, sequences: 1, length: tokens.len(), lagged: &[] };
    values(decoder.forward(&batch, &mut Plain).into_data())
}

fn assert_close(got: &[f32], want: &Rows, what: &str) {
    let want: Vec<f64> = want.iter().flatten().copied().collect();
    assert_eq!(got.len(), want.len(), "{what}: sizes");
    let scale = want.iter().map(|v| v.abs()).fold(0.0, f64::max);
    let err = got.iter().zip(&want).map(|(a, b)| (f64::from(*a) - b).abs()).fold(0.0, f64::max);
    assert!(scale > 0.1, "{what}: logits too small to tell ({scale})");
    assert!(err < 2e-5 * scale.max(1.0), "{what}: max |Δ| {err:e} (logits up to {scale})");
}

#[test]
fn both_formats_load_to_the_reference_logits() {
    let device = compute_device();
    let tokens = [3u32, 17, 0, 39, 8, 8, 21, 5, 30, 11];
    for tied in [false, true] {
        let (config, t) = llama(tied);
        let want = reference_llama(&config, &t, &tokens);
        let hf = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t)).unwrap();
        assert_eq!(hf.config(), &config);
        assert_close(&logits(&hf.load(&device).unwrap(), &tokens), &want, &format!("llama safetensors, tied {tied}"));
        let gguf = Checkpoint::gguf(llama_gguf(&config, &t)).unwrap();
        assert_eq!(gguf.config().tied_head, tied);
        assert_close(&logits(&gguf.load(&device).unwrap(), &tokens), &want, &format!("llama GGUF, tied {tied}"));
    }
    let (config, t) = gpt2();
    let want = reference_gpt2(&config, &t, &tokens);
    let hf = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t)).unwrap();
    assert_eq!(hf.config(), &config);
    assert_close(&logits(&hf.load(&device).unwrap(), &tokens), &want, "gpt2 safetensors");
    let gguf = Checkpoint::gguf(gpt2_gguf(&config, &t)).unwrap();
    assert_close(&logits(&gguf.load(&device).unwrap(), &tokens), &want, "gpt2 GGUF");
}

#[test]
fn a_checkpoint_that_does_not_match_its_configuration_is_refused() {
    let device = compute_device();
    let (config, mut t) = llama(false);
    t.remove("model.layers.1.mlp.up_proj.weight");
    let missing = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t)).unwrap();
    let err = missing.load(&device).unwrap_err().to_string();
    assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");
    let (config, mut t) = llama(false);
    t.insert("model.norm.weight".into(), Weights { shape: vec![15], values: vec![1.0; 15] });
    let wrong = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t)).unwrap();
    let err = wrong.load(&device).unwrap_err().to_string();
    assert!(err.contains("model.norm.weight") && err.contains("[15]"), "{err}");
    let json = hf_config_json(&config).replace("\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\"}");
    assert!(Checkpoint::safetensors(json.as_bytes(), safetensors_bytes(&t)).is_err());
    // A configuration larger than its file could hold is refused before allocating it.
    let json = hf_config_json(&config).replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 2000000000");
    let huge = Checkpoint::safetensors(json.as_bytes(), safetensors_bytes(&t)).unwrap();
    let err = huge.load(&device).unwrap_err().to_string();
    assert!(err.contains("more than its"), "{err}");
    // A tensor of the wrong rank is refused by shape before it is reordered.
    let (config, mut t) = llama(false);
    t.insert("model.layers.0.self_attn.q_proj.weight".into(), Weights { shape: vec![256], values: vec![0.0; 256] });
    let flat = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t)).unwrap();
    assert!(flat.load(&device).unwrap_err().to_string().contains("q_proj"));
    // A truncated GGUF file is an error, not a panic.
    let (config, t) = llama(false);
    let bytes = llama_gguf(&config, &t);
    for cut in [3, 40, bytes.len() / 2, bytes.len() - 1] {
        let result = Checkpoint::gguf(bytes.slice(..cut)).and_then(|c| c.load(&device));
        assert!(result.is_err(), "a file cut at {cut} bytes loaded");
    }
}

/// Q4_0 and Q4_1 blocks dequantize as llama.cpp defines them.
#[test]
fn four_bit_blocks_dequantize_as_defined() {
    let nibbles: Vec<u8> = (0..16).map(|j| (j as u8) | (((15 - j) as u8) << 4)).collect();
    let block = |header: Vec<u8>| -> Vec<u8> { header.into_iter().chain(nibbles.iter().copied()).collect() };
    let d = f16::from_f32(0.5).to_le_bytes().to_vec();
    let m = f16::from_f32(-2.0).to_le_bytes().to_vec();
    let mut file = Vec::new();
    file.extend(0x4655_4747u32.to_le_bytes());
    file.extend(3u32.to_le_bytes());
    file.extend(2u64.to_le_bytes());
    file.extend(0u64.to_le_bytes());
    for (name, code, offset) in [("q4_0", 2u32, 0u64), ("q4_1", 3, 32)] {
        put_string(&mut file, name);
        file.extend(1u32.to_le_bytes());
        file.extend(32u64.to_le_bytes());
        file.extend(code.to_le_bytes());
        file.extend(offset.to_le_bytes());
    }
    file.resize(file.len().div_ceil(32) * 32, 0);
    let mut q4_0 = block(d.clone());
    q4_0.resize(32, 0);
    file.extend(q4_0);
    file.extend(block([d, m].concat()));
    let gguf = Gguf::parse(Bytes::from(file)).unwrap();
    let low: Vec<f32> = (0..16).map(|j| j as f32).collect();
    let high: Vec<f32> = (0..16).map(|j| (15 - j) as f32).collect();
    let q = [low.clone(), high.clone()].concat();
    let want_0: Vec<f32> = q.iter().map(|v| 0.5 * (v - 8.0)).collect();
    let want_1: Vec<f32> = q.iter().map(|v| 0.5 * v - 2.0).collect();
    assert_eq!(gguf.tensor("q4_0").unwrap().unwrap().values, want_0);
    assert_eq!(gguf.tensor("q4_1").unwrap().unwrap().values, want_1);
}

/// Decoding a token at a time (rotary positions, grouped-query heads, tied head) gives the
/// full pass's logits at every position.
#[test]
fn cached_decoding_equals_the_full_pass_with_rotary_grouped_heads() {
    let device = compute_device();
    let (config, t) = llama(true);
    let decoder = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
        .unwrap()
        .load(&device)
        .unwrap();
    let tokens = [3u32, 17, 0, 39, 8, 8, 21, 5];
    let full = logits(&decoder, &tokens);
    let mut cache = [KvCache::default()];
    for (i, &token) in tokens.iter().enumerate() {
        let step = decoder.step(&[token], &[], &mut cache);
        let want = &full[i * 40..(i + 1) * 40];
        let err = step.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-4, "position {i}: max |Δ| {err}");
    }
}

/// A decoder over a sub-vocabulary gives the full decoder's logits at the kept tokens, for
/// a tied and an untied head; a truncated one equals a checkpoint of its first blocks.
#[test]
fn restricted_and_truncated_decoders_compute_what_the_full_one_does() {
    let device = compute_device();
    let kept = [0u32, 3, 5, 8, 11, 17, 21, 30, 39];
    let tokens = [3u32, 17, 0, 39, 8, 8, 21, 5];
    let local: Vec<u32> = tokens.iter().map(|t| kept.iter().position(|k| k == t).unwrap() as u32).collect();
    for tied in [true, false] {
        let (config, t) = llama(tied);
        let full = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
            .unwrap()
            .load(&device)
            .unwrap();
        let want = logits(&full, &tokens);
        let restricted = full.restricted(&kept);
        assert_eq!(restricted.vocabulary(), kept.len());
        let got = logits(&restricted, &local);
        for p in 0..tokens.len() {
            for (k, &id) in kept.iter().enumerate() {
                let (a, b) = (got[p * kept.len() + k], want[p * 40 + id as usize]);
                assert!((a - b).abs() < 1e-5, "tied {tied}, position {p}, token {id}: {a} vs {b}");
            }
        }
    }
    let (config, mut t) = llama(false);
    let full = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
        .unwrap()
        .load(&device)
        .unwrap();
    let got = logits(&full.truncated(1), &tokens);
    t.retain(|name, _| !name.starts_with("model.layers.1."));
    let one = DecoderConfig { layers: 1, ..config };
    let want = reference_llama(&one, &t, &tokens);
    assert_close(&got, &want, "the first block");
}

/// A byte-level BPE over the printable bytes plus a few merges, as GGUF metadata and as
/// `tokenizer.json`: both tokenizers give the same ids, digits split one by one (SmolLM2's
/// pre-tokenizer), and decoding gives the text back.
#[test]
fn gguf_metadata_and_tokenizer_json_tokenize_alike() {
    // GPT-2's byte ↦ character map for the printable ASCII bytes, ' ' as 'Ġ'.
    let mut tokens: Vec<String> = (b'!'..=b'~').map(|b| (b as char).to_string()).collect();
    tokens.push("Ġ".into());
    let merges = ["a g", "ag e", "Ġ ag", "Ġag e", "i s", "1 2"];
    tokens.extend(["ag", "age", "Ġag", "Ġage", "is", "12"].map(String::from));
    let metadata = [
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.pre", Meta::Str("smollm")),
        ("tokenizer.ggml.tokens", Meta::Strings(tokens.clone())),
        ("tokenizer.ggml.merges", Meta::Strings(merges.iter().map(|m| m.to_string()).collect())),
    ];
    let gguf = Gguf::parse(gguf_bytes(&metadata, &[])).unwrap();
    let from_gguf = TextTokenizer::from_gguf(&gguf).unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.clone(), i.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges}
    });
    let from_json = TextTokenizer::from_json(json.to_string().as_bytes(), None).unwrap();
    let text = "age is 12 age";
    let ids = from_gguf.encode(text).unwrap();
    assert_eq!(ids, from_json.encode(text).unwrap());
    let id = |s: &str| tokens.iter().position(|t| t == s).unwrap() as u32;
    // "12" is a merge, but digits are pre-split one by one; merges apply by rank, so " age"
    // becomes "Ġ" + "age" ("a g" and "ag e" rank before "Ġ ag").
    assert_eq!(ids, vec![id("age"), id("Ġ"), id("is"), id("Ġ"), id("1"), id("2"), id("Ġ"), id("age")]);
    assert_eq!(from_gguf.decode(&ids).unwrap(), text);
}

// --- ghost clipping of adapters and of every parameter --------------------------------------

fn norm2(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Next-token loss of each unit's sequence (units of equal length), through a hook.
fn unit_losses(
    decoder: &Decoder,
    sequences: &[Vec<u32>],
    hook: &mut impl crate::dpsgd::ghost::Hook,
) -> burn::tensor::Tensor<1> {
    let length = sequences[0].len() - 1;
    let inputs: Vec<u32> = sequences.iter().flat_map(|s| s[..length].to_vec()).collect();
    let targets: Vec<u32> = sequences.iter().flat_map(|s| s[1..].to_vec()).collect();
    let batch = TokenBatch { tokens: &inputs, sequences: sequences.len(), length, lagged: &[] };
    let logits = decoder.forward(&batch, hook);
    let rows = inputs.len();
    let vocabulary = decoder.vocabulary();
    next_token_losses(logits, &targets, vec![0.0; rows * vocabulary], vec![1.0; rows], sequences.len())
}

/// Every trainable layer's per-unit norm and the clipped sum against one backward pass per
/// unit.
fn check_ghost_against_naive(decoder: &Decoder, what: &str) {
    let mut rng = ChaCha8Rng::from_seed([8; 32]);
    let sequences: Vec<Vec<u32>> = (0..6).map(|_| (0..7).map(|_| rng.random_range(0..40u32)).collect()).collect();
    let tracked = decoder.clone().train();
    let naive: Vec<Vec<f64>> = sequences
        .iter()
        .map(|s| {
            let grads = unit_losses(&tracked, std::slice::from_ref(s), &mut Plain).sum().backward();
            tracked.flat_gradient(&grads).into_iter().map(f64::from).collect()
        })
        .collect();
    let norms: Vec<f64> = naive.iter().map(|g| norm2(g)).collect();
    let mut sorted = norms.clone();
    sorted.sort_by(f64::total_cmp);
    let clip = sorted[sorted.len() / 2];
    assert!(sorted[0] > 0.0, "{what}: every unit has a gradient");
    let mut tape = GhostTape::default();
    let losses = unit_losses(decoder, &sequences, &mut tape);
    let units: Vec<usize> = (0..sequences.len()).flat_map(|u| std::iter::repeat_n(u, 6)).collect();
    let ghost = clipped_sum(decoder, tape, losses, &units, sequences.len(), clip).unwrap();
    let mut offset = 0;
    for (layer, norms) in ghost.layer_norms.iter().enumerate() {
        let size = sizes(decoder)[layer];
        assert!(norms.iter().any(|&n| n > 0.0), "{what}: layer {layer} has no gradient");
        for (u, g) in naive.iter().enumerate() {
            let want = norm2(&g[offset..offset + size]);
            assert!(
                (norms[u] - want).abs() <= 1e-4 * want + 1e-7,
                "{what}: layer {layer}, unit {u}: ghost {} vs naive {want}",
                norms[u]
            );
        }
        offset += size;
    }
    assert_eq!(offset, decoder.parameter_count());
    let mut expected = vec![0.0; decoder.parameter_count()];
    for (g, n) in naive.iter().zip(&norms) {
        let c = (clip / n).min(1.0);
        expected.iter_mut().zip(g).for_each(|(e, v)| *e += c * v);
    }
    let diff: Vec<f64> = ghost.sum.iter().zip(&expected).map(|(a, b)| f64::from(*a) - b).collect();
    let err = norm2(&diff) / norm2(&expected);
    assert!(err < 1e-4, "{what}: clipped sum differs from the per-unit loop: relative error {err:e}");
}

fn sizes(decoder: &Decoder) -> Vec<usize> {
    decoder.layers().iter().map(Layer::parameter_count).collect()
}

#[test]
fn lora_ghost_clipping_equals_a_per_unit_loop() {
    let device = compute_device();
    let (config, t) = llama(false);
    let base = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
        .unwrap()
        .load(&device)
        .unwrap();
    let lora = LoraConfig::new(4, 8.0, ["qkv", "output", "up", "down", "head"].map(String::from).to_vec());
    let refused = |targets: &[&str], rank: usize, tied: bool| {
        let (config, t) = llama(tied);
        let model = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
            .unwrap()
            .load(&device)
            .unwrap();
        model
            .with_adapters(&LoraConfig::new(rank, 8.0, targets.iter().map(|t| t.to_string()).collect()), &device)
            .is_err()
    };
    assert!(refused(&["q_proj"], 4, false), "an unknown target");
    assert!(refused(&["head"], 4, true), "a tied head");
    assert!(refused(&["qkv"], 0, false), "rank 0");
    assert!(!refused(&["qkv"], 4, true));
    let mut adapted = base.with_adapters(&lora, &device).unwrap();
    // B starts at zero, which leaves A without a gradient: start both away from zero.
    let start: Vec<f32> = {
        let mut rng = ChaCha8Rng::from_seed([5; 32]);
        (0..adapted.parameter_count()).map(|_| rng.random_range(-0.3f32..0.3)).collect()
    };
    adapted.load_parameters(&start).unwrap();
    // Only adapters are trainable: rank × (in + out) per target.
    let per_block = 4 * ((16 + 32) + (16 + 16) + (16 + 48) + (24 + 16));
    assert_eq!(adapted.parameter_count(), 2 * per_block + 4 * (16 + 40));
    check_ghost_against_naive(&adapted, "LoRA");
}

#[test]
fn full_fine_tuning_ghost_clipping_covers_rms_norms_and_the_untied_head() {
    let device = compute_device();
    let (config, t) = llama(true);
    let decoder = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
        .unwrap()
        .load(&device)
        .unwrap()
        .untied();
    let count: usize = sizes(&decoder).iter().sum();
    // Embedding, 2 × (norm, qkv, output, norm, up, down), final norm, head: no biases, no β.
    assert_eq!(count, 40 * 16 + 2 * (16 + 16 * 32 + 16 * 16 + 16 + 16 * 48 + 24 * 16) + 16 + 16 * 40);
    check_ghost_against_naive(&decoder, "full fine-tuning");
    // Tied, the head is the embedding's second use: the ghost tape refuses it rather than
    // leave its gradient out.
    let tied = Checkpoint::safetensors(hf_config_json(&config).as_bytes(), safetensors_bytes(&t))
        .unwrap()
        .load(&device)
        .unwrap();
    let mut tape = GhostTape::default();
    let losses = unit_losses(&tied, &[vec![1, 2, 3], vec![4, 5, 6]], &mut tape);
    let err = clipped_sum(&tied, tape, losses, &[0, 0, 1, 1], 2, 1.0).unwrap_err().to_string();
    assert!(err.contains("applied twice"), "{err}");
}

// --- a real pretrained model -----------------------------------------------------------------

/// SmolLM2-135M-Instruct as GGUF (Q4_1 linears, Q8_0 embedding), which `.ci/run` takes from
/// a registry package; `RHOSYNTH_SMOLLM2_GGUF` names the file.
fn smollm2() -> Option<Bytes> {
    let Ok(path) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: set RHOSYNTH_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (.ci/run fetches it)");
        return None;
    };
    Some(Bytes::from(std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))))
}

/// The real model loads with its own tokenizer, and its next-token predictions on fixed
/// prompts are the obvious continuations.
#[test]
fn smollm2_loads_and_predicts_sensible_next_tokens() {
    let Some(bytes) = smollm2() else { return };
    let device = compute_device();
    let started = std::time::Instant::now();
    let checkpoint = Checkpoint::gguf(bytes).unwrap();
    let config = checkpoint.config().clone();
    assert_eq!(
        (config.family, config.layers, config.width, config.heads, config.kv_heads(), config.vocabulary),
        (Family::Llama, 30, 576, 9, 3, 49152)
    );
    let tokenizer = TextTokenizer::from_gguf(checkpoint.gguf_file().unwrap()).unwrap();
    let decoder = checkpoint.load(&device).unwrap();
    eprintln!("SmolLM2-135M loaded in {:.1} s", started.elapsed().as_secs_f64());
    for (prompt, expected) in [("The capital of France is", " Paris"), ("one, two, three, four,", " five")] {
        let ids = tokenizer.encode(prompt).unwrap();
        assert_eq!(tokenizer.decode(&ids).unwrap(), prompt);
        let started = std::time::Instant::now();
        let all = logits(&decoder, &ids);
        let last = &all[(ids.len() - 1) * config.vocabulary..];
        let mut ranked: Vec<u32> = (0..config.vocabulary as u32).collect();
        ranked.sort_by(|a, b| last[*b as usize].total_cmp(&last[*a as usize]));
        let top: Vec<String> = ranked[..5].iter().map(|&t| tokenizer.decode(&[t]).unwrap()).collect();
        eprintln!("{prompt:?} → {top:?} ({} tokens in {:.2} s)", ids.len(), started.elapsed().as_secs_f64());
        assert_eq!(top[0], expected, "{prompt:?}: top five {top:?}");
    }
}

/// Tables of further inputs add their parameters to the decoder's, as trainable layers
/// (so ghost clipping covers them), and nothing else changes.
#[test]
fn further_input_tables_are_trainable_layers_of_their_size() {
    use crate::dpsgd::params::TrainableLayers;
    let device = crate::dpsgd::compute_device();
    let config = DecoderConfig::new(40, 12, 16, 2, 1, 32);
    let plain = config.init(&device);
    let with = config.init(&device).with_lagged(&[43, 41], &device);
    assert_eq!(with.parameter_count(), plain.parameter_count() + (43 + 41) * 16);
    assert_eq!(with.layers().len(), plain.layers().len() + 2);
}
