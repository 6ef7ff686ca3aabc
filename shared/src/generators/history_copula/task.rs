//! The worker's side: one unit's statistics, each block bounded whatever its history, and
//! their sum over a worker's units. Two rounds: the margins (each column's distribution
//! over its bins, the order column's first bin and gaps), then, from the released
//! margins, the moments of the rows in normal scores (same-row and lag-1 products).

use serde::{Deserialize, Serialize};

use super::sampler::Curve;
use super::shape;
use crate::data::domain::{Binning, Domain};
use crate::data::histories::{ValueHistory, ValueLayout};

/// What the copula models, from the declared schema alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopulaLayout {
    pub domain: Domain,
    /// The columns the copula joins: every synthesised column but the order column, its
    /// bins in declared order (a category's code is its rank).
    pub columns: Vec<usize>,
    /// The order column and the bins of the gap between consecutive values.
    pub order: Option<(usize, Binning)>,
    /// Columns written once per history (its first row's value on every row).
    #[serde(default)]
    pub statics: Vec<usize>,
    /// Rows of a history read (its first ones in order), and the most a drawn one has.
    pub max_rows: usize,
}

impl CopulaLayout {
    /// How a worker holds its histories: values, ordered, the first `max_rows` rows.
    pub fn value_layout(&self) -> ValueLayout {
        ValueLayout {
            width: self.domain.columns.len(),
            order: self.order.as_ref().map(|(o, _)| *o),
            max_rows: self.max_rows,
        }
    }

    /// Cells of column `c`'s margin: its value bins, then missing.
    pub fn margin_cells(&self, c: usize) -> usize {
        self.domain.columns[c].value_bins() + 1
    }

    /// Blocks of the margins vector, each one unit's share summing to at most 1: one per
    /// copula column, and the order column's first bin and gaps.
    pub fn margin_blocks(&self) -> Vec<usize> {
        let mut blocks: Vec<usize> = self.columns.iter().map(|&c| self.margin_cells(c)).collect();
        if let Some((o, gaps)) = &self.order {
            blocks.push(self.margin_cells(*o));
            blocks.push(gaps.len());
        }
        blocks
    }

    /// Entries of the moments vector: k means, the k(k+1)/2 same-row products (upper
    /// triangle, row by row), the k² lag-1 products (row: this row's column, column: the
    /// previous row's), then per column its ramps' moments (`shape`).
    pub fn moment_len(&self) -> usize {
        let k = self.columns.len();
        k + k * (k + 1) / 2 + k * k + k * shape::MOMENTS_PER_COLUMN
    }
}

/// Which statistics a round sums.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Stage {
    /// Each block a unit's rows' shares (L1 ≤ 1 per block).
    Margins,
    /// Each unit's mean products of normal scores (`scores[i][b]`: copula column i's score
    /// of value bin b, from the released margins), the unit's vector clipped to L2 `clip`.
    /// The ramps' moments read a numeric value's own score, Φ⁻¹ of the sampler's quantile
    /// curve through `cumulative[i]` (the released margin's cumulative shares) at the
    /// value: the bins' steps would otherwise look like a shape the latent does not have.
    Moments { scores: Vec<Vec<f64>>, cumulative: Vec<Vec<f64>>, clip: f64 },
}

/// One round's work over a worker's histories.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryStatisticsTask {
    pub layout: CopulaLayout,
    pub stage: Stage,
}

impl HistoryStatisticsTask {
    pub fn len(&self) -> usize {
        match &self.stage {
            Stage::Margins => self.layout.margin_blocks().iter().sum(),
            Stage::Moments { .. } => self.layout.moment_len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The L2 sensitivity of the sum under adding or removing one unit.
    pub fn sensitivity(&self) -> f64 {
        match &self.stage {
            Stage::Margins => (self.layout.margin_blocks().len() as f64).sqrt(),
            Stage::Moments { clip, .. } => *clip,
        }
    }

    /// The sum over `histories` (each unit's rows in order, at most `max_rows`) of each
    /// unit's statistics, and the number of units.
    pub fn sum(&self, histories: &[ValueHistory]) -> (Vec<f64>, u64) {
        let mut total = vec![0.0; self.len()];
        let curves: Vec<Option<Curve>> = match &self.stage {
            Stage::Margins => Vec::new(),
            Stage::Moments { cumulative, .. } => {
                let columns = &self.layout.domain.columns;
                self.layout.columns.iter().zip(cumulative).map(|(&c, f)| Curve::new(&columns[c], f)).collect()
            }
        };
        for history in histories {
            let rows = history.rows();
            let rows = &rows[..rows.len().min(self.layout.max_rows)];
            let unit = match &self.stage {
                Stage::Margins => self.margins(rows),
                Stage::Moments { scores, clip, .. } => self.moments(rows, scores, &curves, *clip),
            };
            total.iter_mut().zip(unit).for_each(|(t, u)| *t += u);
        }
        (total, histories.len() as u64)
    }

    /// One unit's margins: each block's cells its rows' shares.
    fn margins(&self, rows: &[Vec<Option<f64>>]) -> Vec<f64> {
        let layout = &self.layout;
        let mut out = Vec::with_capacity(self.len());
        if rows.is_empty() {
            out.resize(self.len(), 0.0);
            return out;
        }
        let share = 1.0 / rows.len() as f64;
        for &c in &layout.columns {
            let start = out.len();
            out.resize(start + layout.margin_cells(c), 0.0);
            rows.iter().for_each(|r| out[start + cell(layout, c, r[c])] += share);
        }
        if let Some((o, gaps)) = &layout.order {
            let start = out.len();
            out.resize(start + layout.margin_cells(*o), 0.0);
            out[start + cell(layout, *o, rows[0][*o])] = 1.0;
            let start = out.len();
            out.resize(start + gaps.len(), 0.0);
            let steps: Vec<f64> = rows.windows(2).filter_map(|w| Some(w[1][*o]? - w[0][*o]?)).collect();
            steps.iter().for_each(|g| out[start + gaps.bin(g.max(0.0))] += 1.0 / steps.len() as f64);
        }
        out
    }

    /// One unit's moments: mean scores, mean same-row products and mean lag-1 products,
    /// each over the rows (pairs of rows) where both values are present, then its ramps'
    /// moments (`shape`) on each numeric value's own score; the whole vector clipped to `clip`.
    fn moments(&self, rows: &[Vec<Option<f64>>], scores: &[Vec<f64>], curves: &[Option<Curve>], clip: f64) -> Vec<f64> {
        let layout = &self.layout;
        let k = layout.columns.len();
        let z: Vec<Vec<Option<f64>>> = rows
            .iter()
            .map(|r| {
                layout
                    .columns
                    .iter()
                    .zip(scores)
                    .map(|(&c, s)| r[c].map(|v| s.get(cell(layout, c, Some(v))).copied().unwrap_or(0.0)))
                    .collect()
            })
            .collect();
        let mean = |values: &mut dyn Iterator<Item = f64>| {
            let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
            if n == 0 { 0.0 } else { sum / n as f64 }
        };
        let mut out = Vec::with_capacity(layout.moment_len());
        for i in 0..k {
            out.push(mean(&mut z.iter().filter_map(|r| r[i])));
        }
        for i in 0..k {
            for j in i..k {
                out.push(mean(&mut z.iter().filter_map(|r| Some(r[i]? * r[j]?))));
            }
        }
        for i in 0..k {
            for j in 0..k {
                out.push(mean(&mut z.windows(2).filter_map(|w| Some(w[1][i]? * w[0][j]?))));
            }
        }
        let fine: Vec<Vec<Option<f64>>> = rows
            .iter()
            .zip(&z)
            .map(|(r, scored)| {
                layout
                    .columns
                    .iter()
                    .zip(curves)
                    .zip(scored)
                    .map(|((&c, curve), s)| match curve {
                        Some(curve) => r[c].map(|v| curve.score(v)),
                        None => *s,
                    })
                    .collect()
            })
            .collect();
        out.extend(shape::unit_moments(&fine, mean));
        let norm = out.iter().map(|v| v * v).sum::<f64>().sqrt();
        if !norm.is_finite() {
            out.iter_mut().for_each(|v| *v = 0.0);
        } else if norm > clip {
            out.iter_mut().for_each(|v| *v *= clip / norm);
        }
        out
    }

    /// The coordinator's check of a worker's sum over `units` units: of this round's
    /// length, finite, and inside what `units` bounded contributions can add up to.
    pub fn check(&self, values: &[f64], units: u64) -> Result<(), String> {
        if values.len() != self.len() {
            return Err(format!("{} statistics where the round has {}", values.len(), self.len()));
        }
        if values.iter().any(|v| !v.is_finite()) {
            return Err("a statistic is not finite".into());
        }
        let units = units as f64;
        match &self.stage {
            Stage::Margins => {
                let mut start = 0;
                for block in self.layout.margin_blocks() {
                    let cells = &values[start..start + block];
                    if cells.iter().any(|v| *v < -1e-9) || cells.iter().sum::<f64>() > units * (1.0 + 1e-9) + 1e-9 {
                        return Err(format!("a margin holds more than the {units} units' shares"));
                    }
                    start += block;
                }
            }
            Stage::Moments { clip, .. } => {
                let norm = values.iter().map(|v| v * v).sum::<f64>().sqrt();
                if norm > units * clip * (1.0 + 1e-9) + 1e-9 {
                    return Err(format!("moments of norm {norm:.3} from {units} units clipped to {clip}"));
                }
            }
        }
        Ok(())
    }
}

/// The margin cell of an encoded value (missing: the last).
fn cell(layout: &CopulaLayout, c: usize, value: Option<f64>) -> usize {
    let column = &layout.domain.columns[c];
    match value {
        None => column.value_bins(),
        Some(v) => column.bin(Some(v)).min(column.value_bins() - 1),
    }
}

/// The task as `HistoryStatistics` (`rhosynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::HistoryStatistics;

    use super::HistoryStatisticsTask;
    use crate::wire::{WireError, from_json, to_json};

    impl From<&HistoryStatisticsTask> for HistoryStatistics {
        fn from(task: &HistoryStatisticsTask) -> Self {
            Self { task_json: to_json(task) }
        }
    }

    impl TryFrom<&HistoryStatistics> for HistoryStatisticsTask {
        type Error = WireError;

        fn try_from(wire: &HistoryStatistics) -> Result<Self, WireError> {
            from_json("history statistics", &wire.task_json)
        }
    }
}
