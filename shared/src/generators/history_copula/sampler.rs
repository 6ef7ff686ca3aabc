//! Histories drawn from the fitted copula (post-processing): a length from the released
//! histogram, the latent normals' VAR(1) path, each value its margin's quantile of Φ(z), a
//! missing value at the column's released rate, and times from a first value and gaps.
//! Inside a bin the quantile follows a monotone cubic through the margin's cumulative
//! shares at the bin edges: a density that slopes as its neighbours do, not flat within
//! each public bin (flat, a real quantile inside a bin lands elsewhere, and transitions
//! between the real data's quantile bins drift even when every correlation is right).

use rand::rngs::ChaCha20Rng;
use rand::{Rng, RngExt};
use rand_distr::{Distribution, StandardNormal};

use super::model::{CopulaModel, MAX_SCORE, apply};
use super::shape::BURN_IN;
use crate::accounting::math::normal_isf;
use crate::data::domain::{Binning, ColumnDomain, Encoding};
use crate::generators::Sampler;
use crate::output::SyntheticUnits;

/// Draws whole histories from a [`CopulaModel`].
pub struct CopulaSampler {
    model: CopulaModel,
    cumulative: Vec<Vec<f64>>,
    /// Each copula column's quantile curve (`None`: a categorical column).
    curves: Vec<Option<Curve>>,
}

impl CopulaSampler {
    pub fn new(model: CopulaModel) -> Self {
        let cumulative: Vec<Vec<f64>> = model.margins.iter().map(|m| m.cumulative()).collect();
        let columns = &model.layout.domain.columns;
        let curves = model.layout.columns.iter().zip(&cumulative).map(|(&c, f)| Curve::new(&columns[c], f)).collect();
        Self { model, cumulative, curves }
    }

    /// `count` histories, each row's values in domain order (encoded; `None` missing).
    pub fn histories(&self, count: usize, rng: &mut impl Rng) -> Vec<Vec<Vec<Option<f64>>>> {
        (0..count).map(|_| self.history(rng)).collect()
    }

    fn history(&self, rng: &mut impl Rng) -> Vec<Vec<Option<f64>>> {
        let model = &self.model;
        let layout = &model.layout;
        let columns = &layout.domain.columns;
        let k = layout.columns.len();
        let rows = pick(&model.lengths, rng).map_or(1, |i| i + 1);
        let normal =
            |rng: &mut dyn rand::Rng| -> Vec<f64> { (0..k).map(|_| StandardNormal.sample(&mut *rng)).collect() };
        let mut z = apply(&model.stationary, &normal(rng));
        let step = |z: &[f64], rng: &mut dyn rand::Rng| -> Vec<f64> {
            let e = apply(&model.innovation, &normal(rng));
            let drift = model.shape.as_ref().map(|s| s.drift(z));
            let linear = apply(&model.transition, z);
            (0..k).map(|i| linear[i] + e[i] + drift.as_ref().map_or(0.0, |d| d[i])).collect()
        };
        if model.shape.is_some() {
            // A chain with a shape starts from its own stationary distribution.
            (0..BURN_IN).for_each(|_| z = step(&z, rng));
        }
        let mut time = model.first_order.as_ref().and_then(|first| {
            let (o, _) = layout.order.as_ref()?;
            let bin = pick(&first.bins, rng)?;
            (rng.random::<f64>() >= first.missing).then(|| value_in(&columns[*o], bin, rng.random()))
        });
        let mut out = Vec::with_capacity(rows);
        for r in 0..rows {
            if r > 0 {
                z = step(&z, rng);
                if let (Some(t), Some((o, gaps))) = (time, &layout.order) {
                    let gap = pick(&model.gaps, rng).map_or(0.0, |b| gap_in(gaps, b, rng.random()));
                    time = Some(clamp(&columns[*o], t + gap));
                }
            }
            let mut row = vec![None; columns.len()];
            for (i, &c) in layout.columns.iter().enumerate() {
                if r > 0 && layout.statics.contains(&c) {
                    row[c] = out.first().and_then(|first: &Vec<Option<f64>>| first[c]);
                    continue;
                }
                if rng.random::<f64>() < model.margins[i].missing {
                    continue;
                }
                let (bin, fraction) = CopulaModel::bin_and_fraction(&self.cumulative[i], model.uniform(i, z[i]));
                row[c] = Some(match &self.curves[i] {
                    Some(curve) => curve.value(bin, fraction),
                    None => bin as f64,
                });
            }
            if let Some((o, _)) = &layout.order {
                row[*o] = time;
            }
            out.push(row);
        }
        out
    }
}

impl Sampler for CopulaSampler {
    fn rows_per_draw(&self) -> usize {
        self.model.layout.max_rows
    }

    fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let columns = &self.model.layout.domain.columns;
        let mut out = SyntheticUnits::default();
        for history in self.histories(units, rng) {
            out.push(history.iter().map(|row| row.iter().zip(columns).map(|(v, c)| c.synthetic(*v)).collect()));
        }
        out
    }
}

/// An index drawn by non-negative weights (negative ones as 0); `None` when none is left.
fn pick(weights: &[f64], rng: &mut impl Rng) -> Option<usize> {
    let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    if !(total > 0.0) {
        return None;
    }
    let mut x = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        x -= w.max(0.0);
        if x < 0.0 {
            return Some(i);
        }
    }
    weights.iter().rposition(|w| *w > 0.0)
}

/// The encoded value at `fraction` (0..1) of value bin `bin`: a category's code, the
/// integer at that point of the range, a real between the edges.
fn value_in(column: &ColumnDomain, bin: usize, fraction: f64) -> f64 {
    match &column.encoding {
        Encoding::Categorical { .. } => bin as f64,
        Encoding::Numeric { binning: Binning::Integer(ranges), .. } => {
            let (lo, hi) = ranges[bin];
            (lo + ((fraction * (hi - lo + 1) as f64).floor() as i64).min(hi - lo)) as f64
        }
        Encoding::Numeric { binning: Binning::Real(edges), kind, .. } => {
            let v = edges[bin] + fraction * (edges[bin + 1] - edges[bin]);
            if *kind == crate::spec::ColumnKind::Datetime { v.floor() } else { v }
        }
    }
}

/// A numeric column's quantile function: a monotone cubic (Fritsch–Butland slopes)
/// through (edge, cumulative share) at its bins' edges (an integer range [lo, hi] spans
/// lo − ½ to hi + ½, and values round back into it).
pub(super) struct Curve {
    x: Vec<f64>,
    f: Vec<f64>,
    slope: Vec<f64>,
    integer: bool,
    datetime: bool,
}

impl Curve {
    pub(super) fn new(column: &ColumnDomain, cumulative: &[f64]) -> Option<Self> {
        let Encoding::Numeric { binning, kind, .. } = &column.encoding else { return None };
        let x: Vec<f64> = match binning {
            Binning::Integer(ranges) => {
                let mut x: Vec<f64> = ranges.iter().map(|(lo, _)| *lo as f64 - 0.5).collect();
                x.push(ranges.last().map_or(0.0, |(_, hi)| *hi as f64 + 0.5));
                x
            }
            Binning::Real(edges) => edges.clone(),
        };
        let mut f = vec![0.0];
        f.extend(cumulative.iter().copied());
        let n = x.len();
        let h: Vec<f64> = x.windows(2).map(|w| w[1] - w[0]).collect();
        let d: Vec<f64> = (0..n - 1).map(|i| (f[i + 1] - f[i]) / h[i]).collect();
        let slope = (0..n)
            .map(|i| match i {
                0 => d[0],
                i if i == n - 1 => d[n - 2],
                i if d[i - 1] > 0.0 && d[i] > 0.0 => {
                    3.0 * (h[i - 1] + h[i]) / ((2.0 * h[i] + h[i - 1]) / d[i - 1] + (h[i] + 2.0 * h[i - 1]) / d[i])
                }
                _ => 0.0,
            })
            .collect();
        let integer = matches!(binning, Binning::Integer(_));
        Some(Self { x, f, slope, integer, datetime: *kind == crate::spec::ColumnKind::Datetime })
    }

    /// The cumulative share at `x` (within the edges).
    fn probability(&self, x: f64) -> f64 {
        let x = x.clamp(self.x[0], self.x[self.x.len() - 1]);
        let bin = self.x.partition_point(|&e| e <= x).saturating_sub(1).min(self.x.len() - 2);
        let h = self.x[bin + 1] - self.x[bin];
        self.at(bin, if h > 0.0 { (x - self.x[bin]) / h } else { 0.0 })
    }

    /// The cubic's cumulative share at `t` (0..1) of the way through bin `bin`.
    fn at(&self, bin: usize, t: f64) -> f64 {
        let (f0, f1, h) = (self.f[bin], self.f[bin + 1], self.x[bin + 1] - self.x[bin]);
        let (m0, m1) = (self.slope[bin], self.slope[bin + 1]);
        let (t2, t3) = (t * t, t * t * t);
        (2.0 * t3 - 3.0 * t2 + 1.0) * f0
            + (t3 - 2.0 * t2 + t) * h * m0
            + (3.0 * t2 - 2.0 * t3) * f1
            + (t3 - t2) * h * m1
    }

    /// An encoded value's normal score along the curve: Φ⁻¹ of its cumulative share (an
    /// integer's, the middle of its unit span), what the sampler maps back to the value.
    pub(super) fn score(&self, x: f64) -> f64 {
        let p = if self.integer {
            0.5 * (self.probability(x.round() - 0.5) + self.probability(x.round() + 0.5))
        } else {
            self.probability(x)
        };
        // A bin of no width (edges that collapse in floating point) has no share to read.
        let p = if p.is_finite() { p.clamp(1e-12, 1.0 - 1e-12) } else { 0.5 };
        normal_isf(1.0 - p).clamp(-MAX_SCORE, MAX_SCORE)
    }

    /// The value of bin `bin` whose cumulative share is `fraction` of the way through it.
    fn value(&self, bin: usize, fraction: f64) -> f64 {
        let (x0, x1, f0, f1) = (self.x[bin], self.x[bin + 1], self.f[bin], self.f[bin + 1]);
        let (h, target) = (x1 - x0, f0 + fraction * (f1 - f0));
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..40 {
            let mid = 0.5 * (lo + hi);
            if self.at(bin, mid) < target { lo = mid } else { hi = mid }
        }
        let v = x0 + 0.5 * (lo + hi) * h;
        if self.integer {
            v.round().clamp((x0 + 0.5).ceil(), (x1 - 0.5).floor())
        } else if self.datetime {
            v.floor()
        } else {
            v
        }
    }
}

/// A gap drawn at `fraction` of gap bin `bin`.
fn gap_in(gaps: &Binning, bin: usize, fraction: f64) -> f64 {
    match gaps {
        Binning::Integer(ranges) => {
            let (lo, hi) = ranges[bin];
            (lo + ((fraction * (hi - lo + 1) as f64).floor() as i64).min(hi - lo)) as f64
        }
        Binning::Real(edges) => edges[bin] + fraction * (edges[bin + 1] - edges[bin]),
    }
}

/// A value held inside a numeric column's bounds (a datetime in whole seconds).
fn clamp(column: &ColumnDomain, v: f64) -> f64 {
    match &column.encoding {
        Encoding::Numeric { min, max, kind, .. } if *kind == crate::spec::ColumnKind::Datetime => {
            v.clamp(*min, *max).floor()
        }
        Encoding::Numeric { min, max, .. } => v.clamp(*min, *max),
        Encoding::Categorical { .. } => v,
    }
}
