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

use super::diffusion::{self, Draw, Schedule, draw, timestep_cdf};
use super::task::FinDiffModelSpec;
use crate::data::examples::Examples;
use crate::dpsgd::ghost::Hook;
use crate::dpsgd::layers::{Layer, LayerMut};
use crate::dpsgd::params::TrainableLayers;
use crate::dpsgd::{Batch, DpModel, UnitExamples, keyed_rng};

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
    pub fn forward(&self, x: Tensor<2>, timesteps: &[u32], hook: &mut impl Hook) -> Tensor<2> {
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

impl TrainableLayers for Denoiser {
    fn layers(&self) -> Vec<Layer<'_>> {
        let mut out = vec![&self.time_in, &self.time_out, &self.input];
        for block in &self.blocks {
            out.extend([&block.first, &block.second]);
        }
        out.push(&self.output);
        out.into_iter().map(Layer::Linear).collect()
    }

    fn layers_mut(&mut self) -> Vec<LayerMut<'_>> {
        let mut out = vec![&mut self.time_in, &mut self.time_out, &mut self.input];
        for block in &mut self.blocks {
            out.extend([&mut block.first, &mut block.second]);
        }
        out.push(&mut self.output);
        out.into_iter().map(LayerMut::Linear).collect()
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

/// A row's timestep and noise, keyed by its unit and its position in the unit.
fn keyed_draw(seed: &[u8; 32], unit: &str, position: usize, cdf: &[f64], width: usize) -> Draw {
    draw(cdf, width, &mut keyed_rng(seed, unit, position))
}

impl TrainableLayers for FinDiffModel {
    fn layers(&self) -> Vec<Layer<'_>> {
        self.denoiser.layers()
    }

    fn layers_mut(&mut self) -> Vec<LayerMut<'_>> {
        self.denoiser.layers_mut()
    }
}

impl UnitExamples for Examples {
    fn unit_count(&self) -> usize {
        self.units.len()
    }
}

impl DpModel for FinDiffModel {
    type Examples = Examples;

    /// One loss per row; a unit's rows are summed before clipping.
    fn losses(
        &self,
        examples: &Examples,
        units: &[usize],
        seed: &[u8; 32],
        device: &Device,
        hook: &mut impl Hook,
    ) -> Batch {
        let width = examples.width;
        let mut x0 = Vec::new();
        let mut draws = Vec::new();
        let mut unit_of_row = Vec::new();
        for (u, &unit) in units.iter().enumerate() {
            let (id, range) = &examples.units[unit];
            for (position, row) in range.clone().enumerate() {
                x0.extend_from_slice(&examples.x[row * width..(row + 1) * width]);
                draws.push(keyed_draw(seed, id, position, &self.timestep_cdf, width));
                unit_of_row.push(u);
            }
        }
        let losses = diffusion::losses(&self.denoiser, &self.schedule, &x0, &draws, width, device, hook);
        Batch { losses, units: unit_of_row }
    }
}
