//! Raking: weights on a pool of drawn units that make the pool's tables match released
//! shares, then the output drawn from the pool by those weights. Post-processing only.
//!
//! For units of one row this is iterative proportional fitting: table by table, every
//! unit's weight is multiplied by target / current share of its cell. A unit of several
//! rows (a history) adds to several cells of a table; its factor is the geometric mean of
//! its cells' ratios, weighted by its rows, so that it moves as far as its rows ask on
//! average. Each unit counts as the worker's reservoir counts it: min(rows, m) rows, spread
//! over its rows' cells.

use rand::RngExt;
use rand::rngs::ChaCha20Rng;
use rand::seq::SliceRandom;

use crate::data::domain::Domain;
use crate::generators::Sampler;
use crate::generators::marginals::MarginalsTask;
use crate::output::SyntheticUnits;

/// Sweeps over the tables at most.
const MAX_SWEEPS: usize = 100;

/// A sweep after which no cell's share is further than this from its target (among the
/// cells the pool reaches) ends the fit.
const TOLERANCE: f64 = 1e-6;

/// The released tables as target shares of each cell.
#[derive(Clone, Debug)]
pub struct Targets {
    /// Per table: its columns and its shares, or `None` when every noisy cell came out ≤ 0
    /// (nothing usable to match).
    tables: Vec<(Vec<usize>, Option<Vec<f64>>)>,
    sizes: Vec<usize>,
}

impl Targets {
    /// Each noisy table (the concatenation `task` lays out) clamped at zero and normalised.
    pub fn new(task: &MarginalsTask, noisy: &[f64]) -> Self {
        let offsets = task.offsets();
        let tables = task
            .tables
            .iter()
            .enumerate()
            .map(|(t, columns)| {
                let clamped: Vec<f64> = noisy[offsets[t]..offsets[t + 1]].iter().map(|v| v.max(0.0)).collect();
                let total: f64 = clamped.iter().sum();
                let shares = (total > 0.0).then(|| clamped.iter().map(|v| v / total).collect());
                (columns.clone(), shares)
            })
            .collect();
        Self { tables, sizes: task.domain.columns.iter().map(|c| c.bins()).collect() }
    }
}

/// What each drawn unit adds to one table: per unit, (cell, rows' share) pairs.
struct TableContributions {
    /// Unit u's pairs are `cells[starts[u]..starts[u + 1]]`.
    starts: Vec<usize>,
    cells: Vec<(usize, f64)>,
    /// Rows each unit counts for (min(rows, m)), among those this table can bin.
    counted: Vec<f64>,
}

impl TableContributions {
    fn new(units: &SyntheticUnits, bins: &[Vec<Option<usize>>], columns: &[usize], sizes: &[usize], m: f64) -> Self {
        let mut starts = vec![0];
        let mut cells: Vec<(usize, f64)> = Vec::new();
        let mut counted = Vec::with_capacity(units.units());
        let mut begin = 0;
        for &end in &units.ends {
            let first = cells.len();
            let rows = (end - begin) as f64;
            let kept = rows.min(m) / rows.max(1.0);
            for row in &bins[begin..end] {
                let cell = columns.iter().try_fold(0, |acc, &c| row[c].map(|b| acc * sizes[c] + b));
                let Some(cell) = cell else { continue };
                match cells[first..].iter_mut().find(|(c, _)| *c == cell) {
                    Some((_, share)) => *share += kept,
                    None => cells.push((cell, kept)),
                }
            }
            counted.push(cells[first..].iter().map(|(_, s)| s).sum());
            starts.push(cells.len());
            begin = end;
        }
        Self { starts, cells, counted }
    }

    fn unit(&self, u: usize) -> &[(usize, f64)] {
        &self.cells[self.starts[u]..self.starts[u + 1]]
    }

    /// The table's cells under `weights`, and their total.
    fn table(&self, weights: &[f64], size: usize) -> (Vec<f64>, f64) {
        let mut table = vec![0.0; size];
        for (u, w) in weights.iter().enumerate() {
            for &(cell, share) in self.unit(u) {
                table[cell] += w * share;
            }
        }
        let total = table.iter().sum();
        (table, total)
    }
}

/// Weights on `units` (one each) under which their tables match `targets` as closely as
/// the pool allows; uniform when the targets leave no unit any weight. Rows are binned as
/// a worker bins them (`ColumnDomain::bin_of`); `m` is the rows a unit counts for.
pub fn rake(units: &SyntheticUnits, domain: &Domain, targets: &Targets, m: u32) -> Vec<f64> {
    let bins: Vec<Vec<Option<usize>>> =
        units.rows.iter().map(|row| domain.columns.iter().zip(row).map(|(c, v)| c.bin_of(v)).collect()).collect();
    let tables: Vec<(TableContributions, &[f64], usize)> = targets
        .tables
        .iter()
        .filter_map(|(columns, shares)| {
            let shares = shares.as_deref()?;
            let contributions = TableContributions::new(units, &bins, columns, &targets.sizes, f64::from(m));
            Some((contributions, shares, shares.len()))
        })
        .collect();
    let n = units.units();
    let mut weights = vec![1.0; n];
    for _ in 0..MAX_SWEEPS {
        let mut furthest: f64 = 0.0;
        for (contributions, shares, size) in &tables {
            let (table, total) = contributions.table(&weights, *size);
            if !(total > 0.0) {
                continue;
            }
            // Cells the pool does not reach cannot be matched: left as they are.
            let ratios: Vec<f64> = table
                .iter()
                .zip(shares.iter())
                .map(|(&t, &s)| {
                    if t > 0.0 {
                        furthest = furthest.max((t / total - s).abs());
                        s * total / t
                    } else {
                        1.0
                    }
                })
                .collect();
            let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
            for (u, w) in weights.iter_mut().enumerate() {
                match (contributions.unit(u), contributions.counted[u]) {
                    // One cell (a unit of one row, or all its rows in one cell): its ratio.
                    ([(cell, _)], _) => *w *= ratios[*cell],
                    (_, counted) if counted > 0.0 => {
                        let log_factor: f64 =
                            contributions.unit(u).iter().map(|&(cell, share)| share * logs[cell]).sum();
                        *w *= (log_factor / counted).exp();
                    }
                    _ => {}
                }
            }
            let mean = weights.iter().sum::<f64>() / n as f64;
            if !(mean > 0.0 && mean.is_finite()) {
                return vec![1.0; n];
            }
            weights.iter_mut().for_each(|w| *w /= mean);
        }
        if furthest < TOLERANCE {
            break;
        }
    }
    weights
}

/// `n` indices drawn by `weights` (systematic resampling: each unit drawn ⌊n·wᵢ/W⌋ or one
/// more times), in random order.
pub fn resample(weights: &[f64], n: usize, rng: &mut ChaCha20Rng) -> Vec<usize> {
    if weights.is_empty() {
        return Vec::new();
    }
    let total: f64 = weights.iter().sum();
    let step = total / n as f64;
    let mut next = rng.random::<f64>() * step;
    let (mut acc, mut picks) = (0.0, Vec::with_capacity(n));
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        while next < acc && picks.len() < n {
            picks.push(i);
            next += step;
        }
    }
    // Rounding may leave the last draw past the end.
    while picks.len() < n {
        picks.push(weights.len() - 1);
    }
    picks.shuffle(rng);
    picks
}

/// A generator's sampler with calibration: each part is drawn `pool` times over, raked to
/// the released targets and resampled to the part's size.
pub struct CalibratedSampler {
    pub inner: Box<dyn Sampler>,
    pub domain: Domain,
    pub targets: Targets,
    pub pool: u32,
    pub max_rows_per_unit: u32,
}

impl Sampler for CalibratedSampler {
    /// A unit written is `pool` drawn: parts shrink so that a part's pool stays within
    /// `rows_per_part` rows.
    fn rows_per_draw(&self) -> usize {
        self.inner.rows_per_draw() * self.pool as usize
    }

    fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let drawn = self.inner.sample(units * self.pool as usize, rng);
        let weights = rake(&drawn, &self.domain, &self.targets, self.max_rows_per_unit);
        let mut out = SyntheticUnits::default();
        for u in resample(&weights, units, rng) {
            let begin = if u == 0 { 0 } else { drawn.ends[u - 1] };
            out.push(drawn.rows[begin..drawn.ends[u]].iter().cloned());
        }
        out
    }
}
