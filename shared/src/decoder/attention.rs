//! Causal self-attention: a whole batch at once (training), or one new position against a
//! sequence's cached keys and values (decoding). Grouped-query attention shares each
//! key/value head among `heads / kv_heads` query heads; rotary positions (Llama) rotate
//! each query and key pair (i, i + dim/2) by position · base^(−2i/dim), as Hugging Face's
//! `rotate_half` does, so checkpoints in that layout load unchanged.

use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};

/// The attention's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    /// Width of one head.
    pub dim: usize,
}

impl Heads {
    /// Width of the keys (and of the values).
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.dim
    }

    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }
}

/// The rotary angle of frequency i at a position.
fn angle(position: usize, i: usize, dim: usize, base: f64) -> f64 {
    position as f64 * base.powf(-2.0 * i as f64 / dim as f64)
}

/// cos and sin of positions 0..t, each t × dim (the half-width angles twice).
fn rotary_tables(t: usize, dim: usize, base: f64, device: &Device) -> (Tensor<4>, Tensor<4>) {
    let half = dim / 2;
    let table = |f: fn(f64) -> f64| {
        let data: Vec<f32> = (0..t * dim).map(|k| f(angle(k / dim, k % dim % half, dim, base)) as f32).collect();
        Tensor::<2>::from_data(TensorData::new(data, [t, dim]), device).unsqueeze::<4>()
    };
    (table(f64::cos), table(f64::sin))
}

/// x·cos + rotate_half(x)·sin over the last dimension of b × heads × t × dim.
fn rotate(x: Tensor<4>, cos: &Tensor<4>, sin: &Tensor<4>) -> Tensor<4> {
    let half = x.dims()[3] / 2;
    let rotated = Tensor::cat(vec![-x.clone().narrow(3, half, half), x.clone().narrow(3, 0, half)], 3);
    x * cos.clone() + rotated * sin.clone()
}

/// Causal attention of packed rows [q | k | v], (b·t) × (heads + 2·kv_heads)·dim, to
/// (b·t) × heads·dim; `rotary`: the base of rotary positions, if the model has them.
pub fn causal_attention(qkv: Tensor<2>, b: usize, t: usize, heads: Heads, rotary: Option<f64>) -> Tensor<2> {
    let Heads { heads: h, kv_heads: kv, dim } = heads;
    let device = qkv.device();
    let split = |start: usize, count: usize| {
        qkv.clone().narrow(1, start * dim, count * dim).reshape([b, t, count, dim]).swap_dims(1, 2)
    };
    let (mut q, mut k, v) = (split(0, h), split(h, kv), split(h + kv, kv));
    if let Some(base) = rotary {
        let (cos, sin) = rotary_tables(t, dim, base, &device);
        q = rotate(q, &cos, &sin);
        k = rotate(k, &cos, &sin);
    }
    let share = |x: Tensor<4>| {
        if kv == h { x } else { x.reshape([b, kv, 1, t, dim]).repeat_dim(2, h / kv).reshape([b, h, t, dim]) }
    };
    let scores = q.matmul(share(k).swap_dims(2, 3)) / (dim as f64).sqrt() + causal_mask(t, &device);
    softmax(scores, 3).matmul(share(v)).swap_dims(1, 2).reshape([b * t, h * dim])
}

/// 0 on and below the diagonal, a large negative number above it: 1 × 1 × t × t.
fn causal_mask(t: usize, device: &Device) -> Tensor<4> {
    let data: Vec<f32> = (0..t * t).map(|i| if i % t > i / t { -1e9 } else { 0.0 }).collect();
    Tensor::<2>::from_data(TensorData::new(data, [t, t]), device).unsqueeze::<4>()
}

/// Rotates each head of one position's queries or keys in place.
pub fn rotate_position(x: &mut [f32], position: usize, dim: usize, base: f64) {
    let half = dim / 2;
    for head in x.chunks_mut(dim) {
        for i in 0..half {
            let (sin, cos) = angle(position, i, dim, base).sin_cos();
            let (a, b) = (f64::from(head[i]), f64::from(head[i + half]));
            head[i] = (a * cos - b * sin) as f32;
            head[i + half] = (b * cos + a * sin) as f32;
        }
    }
}

/// One position's attention over a sequence's keys and values (position-major, kv_width
/// each), every query head reading its group's key/value head.
pub fn attend(query: &[f32], keys: &[f32], vals: &[f32], heads: Heads) -> Vec<f32> {
    let (dim, kv_width) = (heads.dim, heads.kv_width());
    let scale = 1.0 / (dim as f32).sqrt();
    let mut out = vec![0f32; heads.heads * dim];
    for head in 0..heads.heads {
        let q = &query[head * dim..(head + 1) * dim];
        let part = (head / heads.group()) * dim..(head / heads.group() + 1) * dim;
        let scores: Vec<f32> = keys
            .chunks(kv_width)
            .map(|k| k[part.clone()].iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = weights.iter().sum();
        for (w, v) in weights.iter().zip(vals.chunks(kv_width)) {
            for (o, x) in out[head * dim..(head + 1) * dim].iter_mut().zip(&v[part.clone()]) {
                *o += w / total * x;
            }
        }
    }
    out
}
