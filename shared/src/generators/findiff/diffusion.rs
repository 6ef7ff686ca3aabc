//! Gaussian diffusion in the feature space: the linear β schedule, DP-FinDiff's adaptive
//! timestep sampler, the feature-aggregated ε-prediction loss and ancestral sampling.

use burn::tensor::{Device, Tensor, TensorData};
use rand::{Rng, RngExt};
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use super::model::Denoiser;
use crate::dpsgd::ghost::{Hook, Plain};
use crate::dpsgd::params::values;

/// β_t linear from `beta_start` to `beta_end` over `steps`; ᾱ_t = Π(1 − β).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub alpha_bar: Vec<f64>,
}

impl Schedule {
    pub fn linear(steps: u32, beta_start: f64, beta_end: f64) -> Self {
        let n = steps.max(1) as usize;
        let mut alpha_bar = Vec::with_capacity(n);
        let mut acc = 1.0;
        for i in 0..n {
            let beta =
                if n == 1 { beta_start } else { beta_start + (beta_end - beta_start) * i as f64 / (n - 1) as f64 };
            acc *= 1.0 - beta;
            alpha_bar.push(acc);
        }
        Self { alpha_bar }
    }

    /// Number of diffusion steps T; timesteps are 1..=T.
    pub fn steps(&self) -> u32 {
        self.alpha_bar.len() as u32
    }

    fn alpha_bar(&self, t: u32) -> f64 {
        if t == 0 { 1.0 } else { self.alpha_bar[t as usize - 1] }
    }
}

/// DP-FinDiff's adaptive timestep sampler: P_k(t) ∝ t^{α_k} on 1..=T, with α_k moving
/// linearly from `start` (epoch 0) to `end` (last epoch). Data-independent.
pub fn timestep_exponent(start: f64, end: f64, epoch: f64, epochs: f64) -> f64 {
    start + (epoch / epochs.max(1.0)).min(1.0) * (end - start)
}

/// The cumulative distribution of P(t) ∝ t^α over 1..=T.
pub fn timestep_cdf(steps: u32, exponent: f64) -> Vec<f64> {
    let weights: Vec<f64> = (1..=steps).map(|t| f64::from(t).powf(exponent)).collect();
    let total: f64 = weights.iter().sum();
    let mut acc = 0.0;
    weights
        .iter()
        .map(|w| {
            acc += w / total;
            acc
        })
        .collect()
}

/// One training example's randomness: timestep and noise.
pub struct Draw {
    pub t: u32,
    pub noise: Vec<f32>,
}

pub fn draw(cdf: &[f64], width: usize, rng: &mut impl Rng) -> Draw {
    let u: f64 = rng.random();
    let t = cdf.partition_point(|c| *c < u).min(cdf.len() - 1) as u32 + 1;
    let noise = (0..width).map(|_| StandardNormal.sample(rng)).collect();
    Draw { t, noise }
}

/// Per-row losses Σ_features (ε̂ − ε)² for clean rows `x0` (rows × width) and draws.
pub fn losses(
    model: &Denoiser,
    schedule: &Schedule,
    x0: &[f32],
    draws: &[Draw],
    width: usize,
    device: &Device,
    hook: &mut impl Hook,
) -> Tensor<1> {
    let rows = draws.len();
    let mut xt = vec![0f32; rows * width];
    let mut noise = vec![0f32; rows * width];
    for (r, d) in draws.iter().enumerate() {
        let ab = schedule.alpha_bar(d.t);
        let (a, b) = (ab.sqrt() as f32, (1.0 - ab).sqrt() as f32);
        for j in 0..width {
            xt[r * width + j] = a * x0[r * width + j] + b * d.noise[j];
            noise[r * width + j] = d.noise[j];
        }
    }
    let timesteps: Vec<u32> = draws.iter().map(|d| d.t).collect();
    let xt = Tensor::<2>::from_data(TensorData::new(xt, [rows, width]), device);
    let noise = Tensor::<2>::from_data(TensorData::new(noise, [rows, width]), device);
    let predicted = model.forward(xt, &timesteps, hook);
    (predicted - noise).square().sum_dim(1).squeeze_dim::<1>(1)
}

/// Ancestral DDPM sampling on `sampling_steps` evenly spaced timesteps of the schedule
/// (respaced β, as in Nichol & Dhariwal 2021; `sampling_steps = T` is the plain DDPM chain).
pub fn sample(
    model: &Denoiser,
    schedule: &Schedule,
    rows: usize,
    width: usize,
    sampling_steps: u32,
    device: &Device,
    rng: &mut impl Rng,
) -> Vec<f32> {
    let total = schedule.steps();
    let k = sampling_steps.clamp(1, total);
    // Timesteps τ_1 < … < τ_k = T.
    let taus: Vec<u32> =
        (1..=k).map(|i| ((f64::from(i) * f64::from(total) / f64::from(k)).round() as u32).max(1)).collect();
    let mut x: Vec<f32> = (0..rows * width).map(|_| StandardNormal.sample(rng)).collect();
    for i in (0..taus.len()).rev() {
        let t = taus[i];
        let prev = if i == 0 { 0 } else { taus[i - 1] };
        let (ab_t, ab_prev) = (schedule.alpha_bar(t), schedule.alpha_bar(prev));
        let beta = 1.0 - ab_t / ab_prev;
        let input = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, width]), device);
        let eps = model.forward(input, &vec![t; rows], &mut Plain);
        let eps = values(eps.into_data());
        let coef = beta / (1.0 - ab_t).sqrt();
        let scale = 1.0 / (1.0 - beta).sqrt();
        let sd = if i == 0 { 0.0 } else { ((1.0 - ab_prev) / (1.0 - ab_t) * beta).sqrt() };
        for (v, e) in x.iter_mut().zip(&eps) {
            let mean = scale * (f64::from(*v) - coef * f64::from(*e));
            let z: f64 = if sd > 0.0 { StandardNormal.sample(rng) } else { 0.0 };
            *v = (mean + sd * z) as f32;
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_schedule_matches_its_definition() {
        let s = Schedule::linear(500, 1e-4, 0.02);
        assert_eq!(s.steps(), 500);
        assert!((s.alpha_bar(1) - (1.0 - 1e-4)).abs() < 1e-15);
        let expected: f64 = (0..500).map(|i| 1.0 - (1e-4 + (0.02 - 1e-4) * i as f64 / 499.0)).product();
        assert!((s.alpha_bar(500) - expected).abs() < 1e-15);
        // The DDPM schedule ends near pure noise.
        assert!(s.alpha_bar(500) < 1e-2);
    }

    #[test]
    fn timestep_distribution_follows_the_power_law() {
        // α = 1: P(t) = t / (T(T+1)/2).
        let cdf = timestep_cdf(10, 1.0);
        assert!((cdf[0] - 1.0 / 55.0).abs() < 1e-12);
        assert!((cdf[9] - 1.0).abs() < 1e-12);
        assert_eq!(timestep_exponent(3.0, -1.0, 0.0, 10.0), 3.0);
        assert_eq!(timestep_exponent(3.0, -1.0, 5.0, 10.0), 1.0);
        assert_eq!(timestep_exponent(3.0, -1.0, 12.0, 10.0), -1.0);
    }
}
