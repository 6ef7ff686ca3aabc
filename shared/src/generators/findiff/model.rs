//! DP-FinDiff's denoiser: predicts the noise ε in x_t from x_t and the timestep.
//! Sinusoidal time embedding → two linears; input projection; residual blocks
//! h + W₂·SiLU(W₁·SiLU(h)); output projection of SiLU(h). Every trainable layer is
//! linear, so ghost clipping covers the whole model. [`FinDiffModel`] is the denoiser
//! with its diffusion schedule and timestep sampler, as DP-SGD trains it.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::{Device, Tensor, TensorData};

use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use sha2::{Digest, Sha256};

use super::diffusion::{self, Draw, Schedule, draw, timestep_cdf};
use super::task::FinDiffModelSpec;
use crate::data::examples::Examples;
use crate::dpsgd::ghost::LinearHook;
use crate::dpsgd::params::LinearStack;
use crate::dpsgd::{DpModel, RowRef};

/// Sizes of the denoiser; defaults live in one place, the spec's `[generator.findiff]`.
#[derive(Config, Debug)]
pub struct DenoiserConfig {
    /// Width of the feature vector.
    pub features: usize,
    pub hidden: usize,
    pub blocks: usize,
    pub time_embedding: usize,
}

#[derive(Module, Debug)]
pub struct ResidualBlock {
    first: Linear,
    second: Linear,
}

#[derive(Module, Debug)]
pub struct Denoiser {
    time_in: Linear,
    time_out: Linear,
    input: Linear,
    blocks: Vec<ResidualBlock>,
    output: Linear,
}

impl DenoiserConfig {
    pub fn init(&self, device: &Device) -> Denoiser {
        let linear = |i, o| LinearConfig::new(i, o).init(device);
        Denoiser {
            time_in: linear(self.time_embedding, self.hidden),
            time_out: linear(self.hidden, self.hidden),
            input: linear(self.features, self.hidden),
            blocks: (0..self.blocks)
                .map(|_| ResidualBlock {
                    first: linear(self.hidden, self.hidden),
                    second: linear(self.hidden, self.hidden),
                })
                .collect(),
            output: linear(self.hidden, self.features),
        }
    }
}

/// Sinusoidal embedding of integer timesteps: [sin(t·f_i), cos(t·f_i)], f_i = 10000^(-i/h).
pub fn time_embedding(timesteps: &[u32], width: usize, device: &Device) -> Tensor<2> {
    let half = width / 2;
    let mut out = vec![0f32; timesteps.len() * width];
    for (r, &t) in timesteps.iter().enumerate() {
        for i in 0..half {
            let f = (-(10000f64.ln()) * i as f64 / half as f64).exp();
            let angle = f64::from(t) * f;
            out[r * width + i] = angle.sin() as f32;
            out[r * width + half + i] = angle.cos() as f32;
        }
    }
    Tensor::from_data(TensorData::new(out, [timesteps.len(), width]), device)
}

impl Denoiser {
    /// ε̂(x_t, t), every linear layer applied through `hook`.
    pub fn forward(&self, x: Tensor<2>, timesteps: &[u32], hook: &mut impl LinearHook) -> Tensor<2> {
        let device = x.device();
        let t = time_embedding(timesteps, self.time_in.weight.dims()[0], &device);
        let t = silu(hook.linear(&self.time_in, t));
        let t = hook.linear(&self.time_out, t);
        let mut h = hook.linear(&self.input, x) + t;
        for block in &self.blocks {
            let inner = silu(hook.linear(&block.first, silu(h.clone())));
            h = h + hook.linear(&block.second, inner);
        }
        hook.linear(&self.output, silu(h))
    }
}

impl LinearStack for Denoiser {
    fn linears(&self) -> Vec<&Linear> {
        let mut out = vec![&self.time_in, &self.time_out, &self.input];
        for block in &self.blocks {
            out.extend([&block.first, &block.second]);
        }
        out.push(&self.output);
        out
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut out = vec![&mut self.time_in, &mut self.time_out, &mut self.input];
        for block in &mut self.blocks {
            out.extend([&mut block.first, &mut block.second]);
        }
        out.push(&mut self.output);
        out
    }
}

/// The denoiser with its diffusion schedule and this round's timestep distribution.
pub struct FinDiffModel {
    pub denoiser: Denoiser,
    pub schedule: Schedule,
    timestep_cdf: Vec<f64>,
}

impl FinDiffModel {
    pub fn new(spec: &FinDiffModelSpec, device: &Device) -> Self {
        let schedule = spec.schedule();
        let timestep_cdf = timestep_cdf(schedule.steps(), 0.0);
        Self { denoiser: spec.denoiser.init(device), schedule, timestep_cdf }
    }

    /// A copy whose parameters track gradients: the ordinary (non-private) backward pass,
    /// for baselines and for checking the ghost norms against a per-example loop.
    pub fn tracked(&self) -> Self {
        use burn::module::Module;
        Self {
            denoiser: self.denoiser.clone().train(),
            schedule: self.schedule.clone(),
            timestep_cdf: self.timestep_cdf.clone(),
        }
    }

    /// Sets the adaptive sampler's exponent α_k for the coming round.
    pub fn set_timestep_exponent(&mut self, exponent: f64) {
        self.timestep_cdf = timestep_cdf(self.schedule.steps(), exponent);
    }
}

/// A row's timestep and noise, keyed by the round seed, its unit and its position in the
/// unit: independent of which worker or micro-batch the row lands in.
fn keyed_draw(seed: &[u8; 32], row: &RowRef<'_>, cdf: &[f64], width: usize) -> Draw {
    let mut hasher = Sha256::new();
    hasher.update(seed);
    hasher.update((row.unit.len() as u64).to_le_bytes());
    hasher.update(row.unit.as_bytes());
    hasher.update((row.position as u64).to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(hasher.finalize().into());
    draw(cdf, width, &mut rng)
}

impl LinearStack for FinDiffModel {
    fn linears(&self) -> Vec<&Linear> {
        self.denoiser.linears()
    }

    fn linears_mut(&mut self) -> Vec<&mut Linear> {
        self.denoiser.linears_mut()
    }
}

impl DpModel for FinDiffModel {
    fn losses(
        &self,
        examples: &Examples,
        rows: &[RowRef<'_>],
        seed: &[u8; 32],
        device: &Device,
        hook: &mut impl LinearHook,
    ) -> Tensor<1> {
        let width = examples.width;
        let mut x0 = Vec::with_capacity(rows.len() * width);
        let mut draws = Vec::with_capacity(rows.len());
        for row in rows {
            x0.extend_from_slice(&examples.x[row.row * width..(row.row + 1) * width]);
            draws.push(keyed_draw(seed, row, &self.timestep_cdf, width));
        }
        diffusion::losses(&self.denoiser, &self.schedule, &x0, &draws, width, device, hook)
    }
}
