//! DP-FinDiff's denoiser: predicts the noise ε in x_t from x_t and the timestep.
//! Sinusoidal time embedding → two linears; input projection; residual blocks
//! h + W₂·SiLU(W₁·SiLU(h)); output projection of SiLU(h). Every trainable layer is
//! linear, so ghost clipping covers the whole model.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::silu;
use burn::tensor::{Device, Tensor, TensorData};

use crate::dpsgd::ghost::LinearHook;
use crate::dpsgd::params::LinearStack;

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
