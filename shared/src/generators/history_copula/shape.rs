//! The shape of each column's lag-1 dependence beyond a straight line. Where a hidden
//! state persists (a patient stable, then deteriorating), the next value depends on the
//! previous one as a step, not a slope: below the middle, a lower value says nothing more.
//! A linear VAR draws those transitions as a smooth gradient. Each column's next latent
//! therefore also follows two ramps of its own previous latent (above +KNEE, below −KNEE,
//! each flat beyond RISE), fitted from released moments (post-processing). The ramps are
//! bounded, so the chain stays as stable as its linear part, which is checked.
//!
//! The stationary latent of such a chain is no longer N(0, 1): each column's values map
//! to the margin through the chain's own stationary quantiles, estimated once from a long
//! run of the fitted chain (no private value is drawn there).

use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use super::model::{apply, cholesky, inverse_from_cholesky, multiply};
use crate::accounting::math::normal_cdf;

/// Where the ramps start, in latent standard deviations from the middle.
const KNEE: f64 = 0.5;
/// How far a ramp rises before it is flat.
const RISE: f64 = 2.0;
/// Quantiles kept of each column's stationary latent.
const QUANTILES: usize = 1000;
/// Steps of the calibration run, and steps a drawn history runs before its first row.
const CALIBRATION_STEPS: usize = 50_000;
pub const BURN_IN: usize = 20;
/// The spectral radius the linear part must stay under (checked by Gelfand's formula).
const STABLE: f64 = 0.98;

/// A latent value's two ramps: how far it lies above +KNEE and below −KNEE, each at most RISE.
pub fn ramps(z: f64) -> [f64; 2] {
    [(z - KNEE).clamp(0.0, RISE), (-z - KNEE).clamp(0.0, RISE)]
}

/// Entries of the moments vector per copula column, after the linear ones: its ramps'
/// means and mean squares, its own mean product with each ramp (same row), and its next
/// value's mean product with each ramp of the previous row. Another column's product with
/// a ramp is not released: for jointly normal latents it is R₀ᵢⱼ times the column's own
/// (Stein's lemma), and 2k² more entries would cost the linear moments their precision.
pub const MOMENTS_PER_COLUMN: usize = 8;

/// The ramps' part of one unit's moments: `z` its rows' scores (copula column order).
pub fn unit_moments(z: &[Vec<Option<f64>>], mean: impl Fn(&mut dyn Iterator<Item = f64>) -> f64) -> Vec<f64> {
    let k = z.first().map_or(0, Vec::len);
    let mut out = Vec::with_capacity(k * MOMENTS_PER_COLUMN);
    let ramp = |v: f64, side: usize| ramps(v)[side];
    for i in 0..k {
        for side in 0..2 {
            out.push(mean(&mut z.iter().filter_map(|r| Some(ramp(r[i]?, side)))));
        }
        for side in 0..2 {
            out.push(mean(&mut z.iter().filter_map(|r| Some(ramp(r[i]?, side).powi(2)))));
        }
        for side in 0..2 {
            out.push(mean(&mut z.iter().filter_map(|r| Some(r[i]? * ramp(r[i]?, side)))));
        }
        for side in 0..2 {
            out.push(mean(&mut z.windows(2).filter_map(|w| Some(w[1][i]? * ramp(w[0][i]?, side)))));
        }
    }
    out
}

/// The fitted shape: what the sampler adds to the linear step, and the stationary map.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LagShape {
    /// Per copula column, its next latent's slopes on its own previous ramps, and the
    /// offset that keeps its mean.
    pub slopes: Vec<[f64; 2]>,
    pub offsets: Vec<f64>,
    /// Per copula column, its stationary latent's quantiles at (q + ½)/QUANTILES (empty
    /// for a static column, whose latent stays N(0, 1)).
    pub quantiles: Vec<Vec<f64>>,
}

impl LagShape {
    /// What the ramps add to the linear step from latent `z`.
    pub fn drift(&self, z: &[f64]) -> Vec<f64> {
        z.iter()
            .zip(&self.slopes)
            .zip(&self.offsets)
            .map(|((&v, s), o)| {
                let [u, d] = ramps(v);
                s[0] * u + s[1] * d + o
            })
            .collect()
    }

    /// Column `i`'s latent `z` as a probability of its stationary distribution.
    pub fn uniform(&self, i: usize, z: f64) -> f64 {
        let q = &self.quantiles[i];
        if q.is_empty() {
            return normal_cdf(z);
        }
        let above = q.partition_point(|&x| x < z);
        let position = match above {
            0 => 0.0,
            a if a == q.len() => (q.len() - 1) as f64,
            a => {
                let (lo, hi) = (q[a - 1], q[a]);
                (a - 1) as f64 + if hi > lo { (z - lo) / (hi - lo) } else { 0.5 }
            }
        };
        (position + 0.5) / q.len() as f64
    }
}

/// What the shape is fitted from: the released ramps' moments (sums over units), and the
/// linear fit's terms in the latent scale.
pub struct ShapeInput<'a> {
    pub released: &'a [f64],
    pub units: f64,
    pub paired: f64,
    /// Per copula column: mean score, what a covariance with its score is divided by to be
    /// the latent's (1 for a numeric column's own score), and one released entry's noise.
    pub mean: &'a [f64],
    pub scale: &'a [f64],
    pub noise: f64,
    /// The copula columns that change, and over them (row-major) the same-row and lag-1
    /// latent correlations, the VAR matrix and the innovations' Cholesky factor.
    pub dynamic: &'a [usize],
    pub r0: &'a [f64],
    pub r1: &'a [f64],
    pub transition: &'a [f64],
    pub innovation: &'a [f64],
}

/// The ramps' slopes fitted column by column (the next latent on every previous latent
/// and the column's own two ramps, least squares from the released moments; each slope
/// shrunk against its noise), the linear part less what the ramps now carry, the
/// innovations less the variance they explain. `None` when no slope survives the noise
/// or no halving of the slopes keeps the chain stable. Returns the shape over all `k`
/// copula columns, the VAR matrix and the innovations' factor over the dynamic ones.
pub fn fit(input: &ShapeInput, k: usize) -> Option<(LagShape, Vec<f64>, Vec<f64>)> {
    let d = input.dynamic.len();
    let l0 = cholesky(input.r0, d)?;
    let r0_inverse = inverse_from_cholesky(&l0, d);
    let per = MOMENTS_PER_COLUMN;
    // Per dynamic column: slopes, what they take from the linear row (γβ), the offset and
    // the innovation's scale.
    let mut fitted = Vec::with_capacity(d);
    for (x, &i) in input.dynamic.iter().enumerate() {
        let m = &input.released[i * per..(i + 1) * per];
        let (units, paired) = (input.units, input.paired);
        let ramp_mean = [m[0] / units, m[1] / units];
        let mut v = [
            [m[2] / units - ramp_mean[0].powi(2), -ramp_mean[0] * ramp_mean[1]],
            [-ramp_mean[0] * ramp_mean[1], m[3] / units - ramp_mean[1].powi(2)],
        ];
        // Covariance of the column's latent with each ramp; each other latent's, R₀ times
        // it; the next latent's with each ramp of the previous row.
        let own: [f64; 2] =
            std::array::from_fn(|side| (m[4 + side] / units - input.mean[i] * ramp_mean[side]) / input.scale[i]);
        let with_ramp: Vec<[f64; 2]> =
            (0..d).map(|y| [input.r0[y * d + x] * own[0], input.r0[y * d + x] * own[1]]).collect();
        let next = |side: usize| (m[6 + side] / paired - input.mean[i] * ramp_mean[side]) / input.scale[i];
        let row = &input.transition[x * d..(x + 1) * d];
        // The ramps less their projection on the latents: γ = R0⁻¹ C, V − Cᵀγ.
        let gamma: Vec<[f64; 2]> = (0..d)
            .map(|y| std::array::from_fn(|side| (0..d).map(|w| r0_inverse[y * d + w] * with_ramp[w][side]).sum()))
            .collect();
        // The linear step's residual's covariance with those ramps (its covariance with
        // the latents is 0 for A = R₁R₀⁻¹, not for the per-column fallback).
        let with_latent: Vec<f64> =
            (0..d).map(|w| input.r1[x * d + w] - (0..d).map(|y| row[y] * input.r0[y * d + w]).sum::<f64>()).collect();
        let residual: [f64; 2] = std::array::from_fn(|side| {
            next(side)
                - (0..d).map(|y| row[y] * with_ramp[y][side]).sum::<f64>()
                - (0..d).map(|w| with_latent[w] * gamma[w][side]).sum::<f64>()
        });
        for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            v[a][b] -= (0..d).map(|y| with_ramp[y][a] * gamma[y][b]).sum::<f64>();
        }
        // Each released mean carries noise of noise/units; the partialled ramp variances
        // and the residual's covariances sum several. A slope divides by those variances, so
        // a column whose variances the noise could move by half gets none.
        let entry = input.noise / units;
        let variance_noise: [f64; 2] =
            std::array::from_fn(|a| entry * (1.0 + gamma.iter().map(|g| g[a].abs()).sum::<f64>()));
        let spread_of_residual = (1.0
            + row.iter().map(|a| a * a).sum::<f64>()
            + gamma.iter().map(|g| g[0] * g[0] + g[1] * g[1]).sum::<f64>())
        .sqrt();
        let se = entry / input.scale[i] * spread_of_residual;
        let floor = (2.0 * variance_noise[0].max(variance_noise[1])).max(1e-3);
        // The two ramps less the latent are close to collinear (their odd part is mostly
        // the latent itself), so their slopes are fitted along V's eigenvectors: a
        // direction the noise could move by half is dropped, a coefficient kept beyond
        // 2·se and shrunk, c·(1 − se²/c²).
        let (half_sum, half_gap) = ((v[0][0] + v[1][1]) / 2.0, (v[0][0] - v[1][1]) / 2.0);
        let root = (half_gap * half_gap + v[0][1] * v[0][1]).sqrt();
        let angle = 0.5 * (2.0 * v[0][1]).atan2(v[0][0] - v[1][1]);
        let directions =
            [(half_sum + root, [angle.cos(), angle.sin()]), (half_sum - root, [-angle.sin(), angle.cos()])];
        let mut slopes = [0.0; 2];
        for (lambda, e) in directions {
            if !(lambda > floor) {
                continue;
            }
            let c = (e[0] * residual[0] + e[1] * residual[1]) / lambda;
            let spread = se / lambda;
            if c.abs() > 2.0 * spread && c.is_finite() {
                let kept = c * (1.0 - (spread / c).powi(2));
                slopes[0] += kept * e[0];
                slopes[1] += kept * e[1];
            }
        }
        if slopes == [0.0; 2] {
            fitted.push(None);
            continue;
        }
        let explained: f64 = (0..2).map(|a| (0..2).map(|b| slopes[a] * v[a][b] * slopes[b]).sum::<f64>()).sum();
        let variance: f64 = (0..d).map(|y| input.innovation[x * d + y].powi(2)).sum();
        let scale = (1.0 - explained / variance).max(0.05).sqrt();
        let taken: Vec<f64> = gamma.iter().map(|g| g[0] * slopes[0] + g[1] * slopes[1]).collect();
        let offset = -(slopes[0] * ramp_mean[0] + slopes[1] * ramp_mean[1]);
        fitted.push(Some((slopes, taken, offset, scale)));
    }
    if fitted.iter().flatten().all(|(s, ..)| s[0] == 0.0 && s[1] == 0.0) {
        return None;
    }
    // Halve every slope until the linear part is stable (the ramps are bounded, so then
    // is the chain).
    for halving in 0..6 {
        let share = 0.5f64.powi(halving);
        let mut transition = input.transition.to_vec();
        let mut innovation = input.innovation.to_vec();
        let mut slopes = vec![[0.0; 2]; k];
        let mut offsets = vec![0.0; k];
        for (x, f) in fitted.iter().enumerate() {
            let Some((s, taken, offset, scale)) = f else { continue };
            let i = input.dynamic[x];
            slopes[i] = [s[0] * share, s[1] * share];
            offsets[i] = offset * share;
            (0..d).for_each(|y| transition[x * d + y] -= share * taken[y]);
            let scale = 1.0 - share * (1.0 - scale);
            (0..d).for_each(|y| innovation[x * d + y] *= scale);
        }
        if spectral_radius_bound(&transition, d) < STABLE {
            let mut shape = LagShape { slopes, offsets, quantiles: vec![Vec::new(); k] };
            shape.quantiles = stationary_quantiles(&shape, input.dynamic, &transition, &innovation, k);
            // Noise beyond any scale (an offset that overflows) leaves the straight line.
            let finite = shape.offsets.iter().chain(shape.quantiles.iter().flatten()).all(|v| v.is_finite());
            return finite.then_some((shape, transition, innovation));
        }
    }
    None
}

/// ‖A³²‖_F^(1/32): at least the spectral radius, and close to it (Gelfand's formula).
fn spectral_radius_bound(a: &[f64], d: usize) -> f64 {
    let mut power = a.to_vec();
    for _ in 0..5 {
        power = multiply(&power, &power, d);
    }
    power.iter().map(|v| v * v).sum::<f64>().sqrt().powf(1.0 / 32.0)
}

/// Each dynamic column's stationary quantiles, from one long run of the fitted chain. The
/// run's randomness is not privacy noise (it draws from released values only), so it is
/// seeded: the same released model maps the same way.
fn stationary_quantiles(
    shape: &LagShape,
    dynamic: &[usize],
    transition: &[f64],
    innovation: &[f64],
    k: usize,
) -> Vec<Vec<f64>> {
    let d = dynamic.len();
    // public randomness: a run of the released chain (post-processing, above).
    let mut rng = ChaCha8Rng::seed_from_u64(0x5ade);
    let mut z = vec![0.0; d];
    let mut full = vec![0.0; k];
    let mut runs = vec![Vec::with_capacity(CALIBRATION_STEPS); d];
    for step in 0..CALIBRATION_STEPS + 100 * BURN_IN {
        dynamic.iter().zip(&z).for_each(|(&i, &v)| full[i] = v);
        let drift = shape.drift(&full);
        let e: Vec<f64> = (0..d).map(|_| StandardNormal.sample(&mut rng)).collect();
        let e = apply(innovation, &e);
        z = apply(transition, &z).iter().zip(dynamic).zip(e).map(|((a, &i), e)| a + drift[i] + e).collect();
        if step >= 100 * BURN_IN {
            runs.iter_mut().zip(&z).for_each(|(r, &v)| r.push(v));
        }
    }
    let mut quantiles = vec![Vec::new(); k];
    for (&i, mut run) in dynamic.iter().zip(runs) {
        run.sort_by(f64::total_cmp);
        let n = run.len();
        quantiles[i] = (0..QUANTILES).map(|q| run[((q as f64 + 0.5) / QUANTILES as f64 * n as f64) as usize]).collect();
    }
    quantiles
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-column chain of `steps` latents (seeded: simulated data) and the shape fitted
    /// to its exact moments after the linear fit A = R₁/R₀ (its latent standardised), with
    /// the one-step squared errors of the linear fit and of the fitted chain.
    type Fitted = (Option<(LagShape, Vec<f64>, Vec<f64>)>, f64, f64, Vec<f64>);

    fn fitted(steps: usize, noise: f64, next: impl Fn(f64, &mut ChaCha8Rng) -> f64) -> Fitted {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut z = vec![0.0];
        for _ in 0..steps {
            let last = *z.last().unwrap();
            z.push(next(last, &mut rng));
        }
        let mean = z.iter().sum::<f64>() / z.len() as f64;
        let sd = (z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / z.len() as f64).sqrt();
        let z: Vec<f64> = z.iter().map(|v| (v - mean) / sd).collect();
        let rows: Vec<Vec<Option<f64>>> = z.iter().map(|v| vec![Some(*v)]).collect();
        let average = |values: &mut dyn Iterator<Item = f64>| {
            let (s, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
            s / n as f64
        };
        let mut released = unit_moments(&rows, average);
        released.iter_mut().for_each(|v| *v += noise * Distribution::<f64>::sample(&StandardNormal, &mut rng));
        let rho = z.windows(2).map(|w| w[0] * w[1]).sum::<f64>() / (z.len() - 1) as f64;
        let innovation = [(1.0 - rho * rho).sqrt()];
        let input = ShapeInput {
            released: &released,
            units: 1.0,
            paired: 1.0,
            mean: &[0.0],
            scale: &[1.0],
            noise,
            dynamic: &[0],
            r0: &[1.0],
            r1: &[rho],
            transition: &[rho],
            innovation: &innovation,
        };
        let fit = fit(&input, 1);
        let linear = z.windows(2).map(|w| (w[1] - rho * w[0]).powi(2)).sum::<f64>() / (z.len() - 1) as f64;
        let shaped = fit.as_ref().map_or(linear, |(shape, a, _)| {
            z.windows(2).map(|w| (w[1] - a[0] * w[0] - shape.drift(&[w[0]])[0]).powi(2)).sum::<f64>()
                / (z.len() - 1) as f64
        });
        (fit, linear, shaped, z)
    }

    /// A Gaussian AR(1) has no shape: over 200,000 steps each slope's standard error is
    /// about 1/√(200,000 · 0.05) ≈ 0.01, so both stay within 0.04 of 0.
    #[test]
    fn a_gaussian_chain_keeps_its_straight_line() {
        let (shape, ..) =
            fitted(200_000, 0.0, |z, rng| 0.6 * z + 0.8 * Distribution::<f64>::sample(&StandardNormal, rng));
        let slopes = shape.map_or([0.0; 2], |(s, ..)| s.slopes[0]);
        assert!(slopes.iter().all(|s| s.abs() < 0.04), "{slopes:?}");
    }

    /// A hidden two-state chain (a state that stays with probability 0.9, values ±0.9 plus
    /// noise of 0.45) moves as a step: its next value's conditional mean is
    /// 0.9·0.8·tanh(0.9z/0.45²), flat beyond the middle. The ramps (two pieces, not a
    /// tanh) must take at least a third of what that exact conditional mean gains over the
    /// straight line in one-step error (they take about 40%),
    /// and the fitted chain's own latents, mapped through its stationary quantiles, must be
    /// uniform (Kolmogorov distance under 0.03 over 20,000 steps of a chain whose steps are
    /// correlated: about 3× the 0.0096 of independent draws).
    #[test]
    fn a_hidden_state_keeps_its_step_and_its_margin() {
        let state = std::cell::Cell::new(1.0);
        let (shape, linear, shaped, z) = fitted(200_000, 0.0, |_, rng| {
            if rand::RngExt::random::<f64>(rng) > 0.9 {
                state.set(-state.get());
            }
            0.9 * state.get() + 0.45 * Distribution::<f64>::sample(&StandardNormal, rng)
        });
        let sd = (0.81f64 + 0.45 * 0.45).sqrt();
        let exact = z
            .windows(2)
            .map(|w| {
                let previous = w[0] * sd;
                let mean = 0.9 * 0.8 * (0.9 * previous / (0.45 * 0.45)).tanh();
                (w[1] - mean / sd).powi(2)
            })
            .sum::<f64>()
            / (z.len() - 1) as f64;
        assert!(exact < linear - 0.02, "the step is not worth fitting: {exact} against {linear}");
        assert!(linear - shaped >= (linear - exact) / 3.0, "linear {linear}, ramps {shaped}, exact {exact}");
        let (shape, a, l) = shape.expect("a shape");
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let mut latent = 0.0;
        let mut u: Vec<f64> = (0..20_000)
            .map(|_| {
                let e: f64 = StandardNormal.sample(&mut rng);
                latent = a[0] * latent + shape.drift(&[latent])[0] + l[0] * e;
                shape.uniform(0, latent)
            })
            .collect();
        u.sort_by(f64::total_cmp);
        let distance =
            u.iter().enumerate().map(|(i, v)| (v - (i as f64 + 0.5) / u.len() as f64).abs()).fold(0.0, f64::max);
        assert!(distance < 0.03, "Kolmogorov distance {distance}");
    }

    /// An asymmetric hidden state (a stable level that leaves with probability 0.05, a
    /// high one, +1.8, left with 0.2) moves as a step whose ramps rise on both sides (the
    /// ramps' even part, which the latent does not explain). Released with noise of 0.01
    /// per moment (about a 3,000-unit cohort's at ε = 2), that direction's coefficient
    /// (≈ 0.7) stands about 5 of its standard errors (≈ 0.15) clear, so the ramps must keep
    /// at least two thirds of what they gain in one-step error without noise. Fitted slope
    /// by slope, the near-collinear pair's noise dropped both (no gain at all).
    #[test]
    fn a_noisy_release_keeps_the_step_it_can_see() {
        let chain = |noise: f64| {
            let state = std::cell::Cell::new(0usize);
            let (_, linear, shaped, _) = fitted(100_000, noise, |_, rng| {
                let leave = [0.05, 0.2][state.get()];
                if rand::RngExt::random::<f64>(rng) < leave {
                    state.set(1 - state.get());
                }
                [0.0, 1.8][state.get()] + 0.5 * Distribution::<f64>::sample(&StandardNormal, rng)
            });
            linear - shaped
        };
        let (exact, noisy) = (chain(0.0), chain(0.01));
        assert!(exact > 0.02, "the step is not worth fitting: {exact}");
        assert!(noisy >= 2.0 * exact / 3.0, "gain without noise {exact}, with {noisy}");
    }
}
