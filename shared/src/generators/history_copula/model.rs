//! The copula fitted to released statistics (post-processing only): each column's
//! distribution over its bins and missing rate, the normal scores of its bins, and a
//! stationary VAR(1) of the latent normals, z_t = A z_{t−1} + e_t, whose same-row and
//! lag-1 correlations are the released ones, corrected for the bins' coarseness.

use serde::{Deserialize, Serialize};

use super::shape::{self, LagShape, ShapeInput};
use super::task::CopulaLayout;
use crate::accounting::math::{normal_cdf, normal_isf};
use crate::data::domain::Encoding;

/// The largest latent correlation kept (a noisy one beyond it is cut).
const MAX_CORRELATION: f64 = 0.995;

/// The largest score magnitude: cumulative shares are held within 1e-12 of 0 and 1.
pub const MAX_SCORE: f64 = 7.1;

/// One column's released distribution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Margin {
    /// Probability of each value bin: the released block less a constant (negative cells
    /// as empty), then without the cells under `floor` that touch no cell over it —
    /// noise far from the values units have, which would draw outliers there; uniform
    /// when none is left.
    pub bins: Vec<f64>,
    /// Share of missing values.
    pub missing: f64,
}

impl Margin {
    /// From one released block (value bins then missing) whose noise has standard
    /// deviation `noise`; `floor` = 2·noise.
    pub fn from_cells(cells: &[f64], noise: f64) -> Self {
        let cells = subtract_to_total(cells);
        let (values, missing) = cells.split_at(cells.len() - 1);
        let floor = 2.0 * noise;
        let high = |i: usize| values.get(i).is_some_and(|v| *v >= floor);
        let any_high = (0..values.len()).any(high);
        let mut bins: Vec<f64> = (0..values.len())
            .map(|i| {
                let isolated = !(high(i) || high(i + 1) || i > 0 && high(i - 1));
                if any_high && isolated { 0.0 } else { values[i] }
            })
            .collect();
        let present: f64 = bins.iter().sum();
        if present > 0.0 {
            bins.iter_mut().for_each(|b| *b /= present);
        } else {
            bins.iter_mut().for_each(|b| *b = 1.0 / values.len() as f64);
        }
        let missing = missing[0].max(0.0);
        let missing = if present + missing > 0.0 { missing / (present + missing) } else { 0.0 };
        Self { bins, missing }
    }

    /// The cumulative probabilities F(b) at each bin's upper end.
    pub fn cumulative(&self) -> Vec<f64> {
        self.bins
            .iter()
            .scan(0.0, |acc, p| {
                *acc += p;
                Some(*acc)
            })
            .collect()
    }

    /// Each value bin's normal score: E[Z | Φ(Z) in the bin] = (φ(a) − φ(b)) / (F(b) − F(a)),
    /// the bin's own midpoint quantile for an (almost) empty bin.
    pub fn scores(&self) -> Vec<f64> {
        let quantile = |p: f64| normal_isf(1.0 - p.clamp(1e-12, 1.0 - 1e-12));
        let density = |z: f64| (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
        let mut lower = 0.0;
        self.cumulative()
            .iter()
            .map(|&upper| {
                let width = upper - lower;
                let (a, b) = (quantile(lower), quantile(upper));
                let score = if width > 1e-9 {
                    let pa = if lower <= 0.0 { 0.0 } else { density(a) };
                    let pb = if upper >= 1.0 - 1e-12 { 0.0 } else { density(b) };
                    (pa - pb) / width
                } else {
                    quantile(lower)
                };
                lower = upper;
                score
            })
            .collect()
    }

    /// The standard deviation of the scores: how much of a latent correlation the bins
    /// keep (1 for fine bins).
    pub fn reliability(&self) -> f64 {
        let scores = self.scores();
        let mean: f64 = self.bins.iter().zip(&scores).map(|(p, s)| p * s).sum();
        let second: f64 = self.bins.iter().zip(&scores).map(|(p, s)| p * s * s).sum();
        (second - mean * mean).max(1e-6).sqrt()
    }
}

/// Noisy counts made a histogram of the same total: max(cell − c, 0) with the c at which
/// they sum to the released total (Norm-Sub; post-processing). Cells of zero where the
/// total is not positive.
pub fn subtract_to_total(cells: &[f64]) -> Vec<f64> {
    let total: f64 = cells.iter().sum();
    if !(total > 0.0) {
        return vec![0.0; cells.len()];
    }
    let kept = |c: f64| cells.iter().map(|v| (v - c).max(0.0)).sum::<f64>();
    let (mut lo, mut hi) = (cells.iter().copied().fold(f64::INFINITY, f64::min) - total, total);
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if kept(mid) > total { lo = mid } else { hi = mid }
    }
    cells.iter().map(|v| (v - hi).max(0.0)).collect()
}

/// The released margins and moments, each with its noise's standard deviation.
#[derive(Clone, Debug)]
pub struct Released {
    pub margins: Vec<f64>,
    pub margin_noise: f64,
    pub moments: Vec<f64>,
    pub moment_noise: f64,
}

/// The fitted copula: what the sampler draws from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopulaModel {
    pub layout: CopulaLayout,
    /// Each copula column's margin.
    pub margins: Vec<Margin>,
    /// The order column's first value's margin and the gaps' weights.
    pub first_order: Option<Margin>,
    pub gaps: Vec<f64>,
    /// Weights of histories of 1..=max_rows rows.
    pub lengths: Vec<f64>,
    /// Row-major k×k: the VAR(1) matrix, and Cholesky factors of the stationary
    /// correlation and of the innovations' covariance.
    pub transition: Vec<f64>,
    pub stationary: Vec<f64>,
    pub innovation: Vec<f64>,
    /// The columns' steps beyond a straight line, when the released moments show any.
    pub shape: Option<LagShape>,
}

impl CopulaModel {
    /// The margins from the released margins vector (the layout's blocks, each cell's
    /// noise of standard deviation `noise`).
    pub fn margins(layout: &CopulaLayout, released: &[f64], noise: f64) -> (Vec<Margin>, Option<Margin>, Vec<f64>) {
        let mut blocks = Vec::new();
        let mut start = 0;
        for len in layout.margin_blocks() {
            blocks.push(&released[start..start + len]);
            start += len;
        }
        let k = layout.columns.len();
        let margins = blocks[..k].iter().map(|b| Margin::from_cells(b, noise)).collect();
        let (first, gaps) = match layout.order {
            Some(_) => (Some(Margin::from_cells(blocks[k], noise)), subtract_to_total(blocks[k + 1])),
            None => (None, Vec::new()),
        };
        (margins, first, gaps)
    }

    /// Fits the VAR(1) from the released moments (sums over units, each drawn with noise
    /// of standard deviation `moment_noise`) and lengths (less a constant to their total,
    /// as the margins). Each latent correlation is weighed against its own noise (se): a
    /// column's own lag-1 shrunk to r·max(0, 1 − se²/r²), a correlation between two
    /// columns kept only beyond 2·se — with many columns, the noise of k² small entries
    /// would otherwise add up to a VAR that is not stationary, and keeping it so would
    /// shrink every lag. A column with few distinct values keeps little of any
    /// correlation, and correcting for that multiplies its noise.
    pub fn fit(layout: CopulaLayout, released: Released, lengths: Vec<f64>) -> Self {
        let Released { margins: released_margins, margin_noise, moments: released_moments, moment_noise } = released;
        let (margins, first_order, gaps) = Self::margins(&layout, &released_margins, margin_noise);
        let lengths = subtract_to_total(&lengths);
        let k = layout.columns.len();
        // Units, and units with at least one pair of rows (the lag products' count).
        let units = lengths.iter().sum::<f64>().max(1.0);
        let paired = lengths.iter().skip(1).sum::<f64>().max(1.0);
        let (means, rest) = released_moments.split_at(k);
        let (same, rest) = rest.split_at(k * (k + 1) / 2);
        let (lagged, ramps) = rest.split_at(k * k);
        let mean: Vec<f64> = means.iter().map(|m| m / units).collect();
        let mut c0 = vec![0.0; k * k];
        let mut t = 0;
        for i in 0..k {
            for j in i..k {
                let v = same[t] / units - mean[i] * mean[j];
                (c0[i * k + j], c0[j * k + i]) = (v, v);
                t += 1;
            }
        }
        let sd: Vec<f64> = (0..k).map(|i| c0[i * k + i].max(1e-3).sqrt()).collect();
        let reliability: Vec<f64> = margins.iter().map(Margin::reliability).collect();
        let latent = |v: f64, count: f64, i: usize, j: usize| {
            let scale = sd[i] * sd[j] * reliability[i] * reliability[j];
            let (r, se) = (v / scale, moment_noise / count / scale);
            let kept = match (r == 0.0, i == j) {
                (true, _) => 0.0,
                (false, true) => (1.0 - (se / r).powi(2)).max(0.0),
                (false, false) => f64::from(r.abs() > 2.0 * se),
            };
            // A non-finite value (noise beyond any scale) carries nothing.
            if (r * kept).is_finite() { (r * kept).clamp(-MAX_CORRELATION, MAX_CORRELATION) } else { 0.0 }
        };
        let mut r0 = vec![0.0; k * k];
        let mut r1 = vec![0.0; k * k];
        for i in 0..k {
            for j in 0..k {
                r0[i * k + j] = if i == j { 1.0 } else { latent(c0[i * k + j], units, i, j) };
                r1[i * k + j] = latent(lagged[i * k + j] / paired - mean[i] * mean[j], paired, i, j);
            }
        }
        // The nearest positive definite correlation on the way to the identity (reached
        // at the last step, which always is).
        let (stationary, blended) = (0..=20)
            .find_map(|step| {
                let keep = 1.0 - step as f64 / 20.0;
                let r: Vec<f64> = (0..k * k).map(|x| if x / k == x % k { 1.0 } else { keep * r0[x] }).collect();
                cholesky(&r, k).map(|l| (l, r))
            })
            .expect("the identity is positive definite");
        r0 = blended;
        // The VAR over the columns that change; a static column's latent stays as drawn
        // in the first row (A's row the unit vector, no innovation).
        let dynamic: Vec<usize> = (0..k).filter(|&i| !layout.statics.contains(&layout.columns[i])).collect();
        let sub = |m: &[f64]| -> Vec<f64> {
            dynamic.iter().flat_map(|&i| dynamic.iter().map(move |&j| m[i * k + j])).collect()
        };
        let (r0_dynamic, r1_dynamic) = (sub(&r0), sub(&r1));
        let (a, l) = var1(&r0_dynamic, &r1_dynamic, dynamic.len());
        // The ramps' moments read a numeric value's own score (near N(0, 1)), a category's
        // its bin's.
        let scale: Vec<f64> = (0..k)
            .map(|i| match layout.domain.columns[layout.columns[i]].encoding {
                Encoding::Numeric { .. } => 1.0,
                Encoding::Categorical { .. } => sd[i] * reliability[i],
            })
            .collect();
        let input = ShapeInput {
            released: ramps,
            units,
            paired,
            mean: &mean,
            scale: &scale,
            noise: moment_noise,
            dynamic: &dynamic,
            r0: &r0_dynamic,
            r1: &r1_dynamic,
            transition: &a,
            innovation: &l,
        };
        let (shape, a, l) = match shape::fit(&input, k) {
            Some((shape, a, l)) => (Some(shape), a, l),
            None => (None, a, l),
        };
        let mut transition = vec![0.0; k * k];
        let mut innovation = vec![0.0; k * k];
        (0..k).filter(|i| !dynamic.contains(i)).for_each(|s| transition[s * k + s] = 1.0);
        let d = dynamic.len();
        for (x, &i) in dynamic.iter().enumerate() {
            for (y, &j) in dynamic.iter().enumerate() {
                transition[i * k + j] = a[x * d + y];
                innovation[i * k + j] = l[x * d + y];
            }
        }
        Self { layout, margins, first_order, gaps, lengths, transition, stationary, innovation, shape }
    }

    /// Copula column `i`'s latent `z` as a probability: Φ(z), or its place in the
    /// stationary distribution of a chain with a shape.
    pub fn uniform(&self, i: usize, z: f64) -> f64 {
        self.shape.as_ref().map_or_else(|| normal_cdf(z), |s| s.uniform(i, z))
    }

    /// The value bin at probability `u` of a margin's cumulative, and how far into it.
    pub fn bin_and_fraction(cumulative: &[f64], u: f64) -> (usize, f64) {
        let b = cumulative.partition_point(|&f| f < u).min(cumulative.len() - 1);
        let lower = if b == 0 { 0.0 } else { cumulative[b - 1] };
        let width = cumulative[b] - lower;
        let fraction = if width > 0.0 { ((u - lower) / width).clamp(0.0, 1.0) } else { 0.5 };
        (b, fraction)
    }
}

/// The stationary VAR(1) with same-row correlation `r0` (positive definite) and lag-1
/// correlation `r1`: A = R1 R0⁻¹ and the Cholesky factor of the innovations' covariance
/// R0 − A R0 Aᵀ. When that is not positive (noise in many entries, which R0⁻¹ amplifies
/// where columns are correlated), each column its own AR(1) instead: A = diag(ρ) with ρᵢ
/// the column's lag-1, innovations √(1 − ρᵢ²)·e with e's correlation
/// Cᵢⱼ = R0ᵢⱼ(1 − ρᵢρⱼ)/√((1 − ρᵢ²)(1 − ρⱼ²)) (so the same-row correlation stays R0),
/// its cross terms shrunk until positive: every column keeps its own lag-1 exactly.
fn var1(r0: &[f64], r1: &[f64], k: usize) -> (Vec<f64>, Vec<f64>) {
    let identity = |scale: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..k * k).map(|x| if x / k == x % k { scale(x / k) } else { 0.0 }).collect()
    };
    let Some(l0) = cholesky(r0, k) else { return (identity(&|_| 0.0), identity(&|_| 1.0)) };
    let full = multiply(r1, &inverse_from_cholesky(&l0, k), k);
    let ara = multiply(&multiply(&full, r0, k), &transpose(&full, k), k);
    let sigma: Vec<f64> = (0..k * k).map(|x| r0[x] - ara[x]).collect();
    if let Some(l) = cholesky(&sigma, k) {
        return (full, l);
    }
    let rho: Vec<f64> = (0..k).map(|i| r1[i * k + i].clamp(-MAX_CORRELATION, MAX_CORRELATION)).collect();
    let spread: Vec<f64> = rho.iter().map(|r| (1.0 - r * r).sqrt()).collect();
    let correlation = |keep: f64| -> Vec<f64> {
        (0..k * k)
            .map(|x| {
                let (i, j) = (x / k, x % k);
                if i == j { 1.0 } else { keep * r0[x] * (1.0 - rho[i] * rho[j]) / (spread[i] * spread[j]) }
            })
            .collect()
    };
    let e = (0..=20)
        .find_map(|step| cholesky(&correlation(1.0 - step as f64 / 20.0), k))
        .expect("the identity is positive definite");
    let innovation = (0..k * k).map(|x| spread[x / k] * e[x]).collect();
    (identity(&|i| rho[i]), innovation)
}

/// Lower Cholesky factor of a k×k row-major matrix, `None` unless positive definite.
pub fn cholesky(m: &[f64], k: usize) -> Option<Vec<f64>> {
    let mut l = vec![0.0; k * k];
    for i in 0..k {
        for j in 0..=i {
            let s: f64 = (0..j).map(|p| l[i * k + p] * l[j * k + p]).sum();
            if i == j {
                let d = m[i * k + i] - s;
                if !(d > 0.0) {
                    return None;
                }
                l[i * k + i] = d.sqrt();
            } else {
                l[i * k + j] = (m[i * k + j] - s) / l[j * k + j];
            }
        }
    }
    Some(l)
}

/// M⁻¹ from M's lower Cholesky factor.
pub(super) fn inverse_from_cholesky(l: &[f64], k: usize) -> Vec<f64> {
    // L⁻¹ by forward substitution, then M⁻¹ = L⁻ᵀ L⁻¹.
    let mut li = vec![0.0; k * k];
    for c in 0..k {
        for i in c..k {
            let s: f64 = (c..i).map(|p| l[i * k + p] * li[p * k + c]).sum();
            li[i * k + c] = ((if i == c { 1.0 } else { 0.0 }) - s) / l[i * k + i];
        }
    }
    multiply(&transpose(&li, k), &li, k)
}

pub(super) fn multiply(a: &[f64], b: &[f64], k: usize) -> Vec<f64> {
    let mut out = vec![0.0; k * k];
    for i in 0..k {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..k {
                out[i * k + j] += x * b[p * k + j];
            }
        }
    }
    out
}

fn transpose(a: &[f64], k: usize) -> Vec<f64> {
    (0..k * k).map(|x| a[(x % k) * k + x / k]).collect()
}

/// `l · v` for a row-major k×k matrix.
pub fn apply(l: &[f64], v: &[f64]) -> Vec<f64> {
    let k = v.len();
    (0..k).map(|i| (0..k).map(|j| l[i * k + j] * v[j]).sum()).collect()
}
