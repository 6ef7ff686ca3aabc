//! The histogram a numeric column's bins are drafted from: [`GRID_CELLS`] cells over its
//! released range, and the bins read off it. An integer column's first cell holds its lower
//! bound alone: counts, amounts and durations pile up at zero (or at a bound that clamps
//! them), and a bin of that value alone keeps them there. Any cell that holds a bin's share
//! of the rows or more (a value many rows share, such as 40 hours a week) becomes a bin of
//! its own, since a release draws values uniformly within their bin.

/// Cells of the histogram.
pub const GRID_CELLS: usize = 256;

/// The cells over `[lo, hi]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grid {
    lo: f64,
    hi: f64,
    integer: bool,
}

impl Grid {
    pub fn new(lo: f64, hi: f64, integer: bool) -> Self {
        Self { lo, hi, integer }
    }

    /// Whether the first cell is the lower bound alone: an integer column with values
    /// beyond the next one.
    fn pinned(&self) -> bool {
        self.integer && self.hi - self.lo >= 2.0
    }

    /// The equal cells: the first of them, and where they start.
    fn equal_cells(&self) -> (usize, f64) {
        if self.pinned() { (1, self.lo + 1.0) } else { (0, self.lo) }
    }

    /// Where cell `i` starts: it holds `[start(i), start(i + 1))`, and `start(GRID_CELLS)`
    /// is `hi` (which the last cell holds too).
    pub fn start(&self, i: usize) -> f64 {
        let (first, from) = self.equal_cells();
        if i < first {
            return self.lo;
        }
        from + (self.hi - from) * (i - first) as f64 / (GRID_CELLS - first) as f64
    }

    /// The cell of `x` (clamped to the range).
    pub fn cell(&self, x: f64) -> usize {
        let (first, from) = self.equal_cells();
        if x < from {
            return 0;
        }
        let at = ((x - from) / (self.hi - from) * (GRID_CELLS - first) as f64).floor();
        (first + at as usize).min(GRID_CELLS - 1)
    }

    /// Bin edges at `bins` quantiles of `counts` (this grid's; negative noisy counts read
    /// as 0), with each cell of a bin's share or more a bin of its own — and above
    /// `noise_floor`, which noise alone rarely reaches: strictly increasing from `lo` to
    /// `hi`, whole numbers for an integer column (so more than `bins` bins where cells
    /// stand alone).
    pub fn bin_edges(&self, counts: &[f64], bins: u32, noise_floor: f64) -> Vec<f64> {
        let counts: Vec<f64> = counts.iter().map(|c| c.max(0.0)).collect();
        let total: f64 = counts.iter().sum();
        let mut edges = vec![self.lo];
        // The last cell's edge is hi only up to rounding (above it, far from zero): hi
        // itself closes the edges.
        let mut push = |edge: f64| {
            if edge < self.hi {
                edges.push(edge);
            }
        };
        if total > 0.0 {
            let alone = (total / f64::from(bins)).max(noise_floor);
            let mut cumulative = 0.0;
            let mut next = 1;
            for (i, c) in counts.iter().enumerate() {
                if *c >= alone {
                    // The whole numbers a cell holds are those from ⌈start⌉ below ⌈end⌉.
                    let (start, end) = (self.start(i), self.start(i + 1));
                    if self.integer { [start.ceil(), end.ceil()] } else { [start, end] }
                        .into_iter()
                        .for_each(&mut push);
                }
                cumulative += c;
                while next < bins && cumulative >= total * f64::from(next) / f64::from(bins) {
                    let edge = self.start(i + 1);
                    push(if self.integer { edge.round() } else { edge });
                    next += 1;
                }
            }
        }
        edges.push(self.hi);
        // Every edge lies in [lo, hi]: dropping those not above the last kept leaves lo first
        // and hi last.
        edges.dedup_by(|b, a| *b <= *a);
        edges
    }
}
