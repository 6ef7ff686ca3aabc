//! The public domain of each synthesised column, built from the job spec alone: how a
//! value is encoded in a partition file and which bin it falls in. No bound, category or
//! bin edge here ever comes from the private rows.

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::output::SyntheticValue;
use crate::spec::{Bins, ColumnKind, ColumnSpec, JobSpec, MissingPolicy, OTHER_CATEGORY, UnknownPolicy};

/// How a numeric column is cut into bins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Binning {
    /// Inclusive integer ranges, in order, covering [min, max].
    Integer(Vec<(i64, i64)>),
    /// Real edges e₀ < … < eₙ: bins [eᵢ, eᵢ₊₁), the last one closed.
    Real(Vec<f64>),
}

impl Binning {
    pub fn len(&self) -> usize {
        match self {
            Binning::Integer(r) => r.len(),
            Binning::Real(e) => e.len() - 1,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Geometric gap bins between 0 and `range`: edges 0, range·2^(i−n) for i = 1..n; integer
    /// columns get the integer ranges those edges start.
    pub fn gaps(range: f64, bins: u32, integer: bool) -> Binning {
        let n = bins.max(1) as i32;
        let mut edges = vec![0.0];
        edges.extend((1..=n).map(|i| range * 2f64.powi(i - n)));
        if !integer {
            return Binning::Real(edges);
        }
        let top = range.floor() as i64;
        let mut starts: Vec<i64> = edges[..edges.len() - 1].iter().map(|e| e.ceil() as i64).collect();
        starts.dedup();
        let ranges = starts
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, starts.get(i + 1).map_or(top, |next| next - 1)))
            .filter(|(s, e)| e >= s)
            .collect();
        Binning::Integer(ranges)
    }

    /// Geometric bins of a distance between 0 and `range`, finer than [`Self::gaps`]: edges
    /// 0, range·2^((i−n)/2) for i = 1..n, each edge √2 times the one before (a value drawn
    /// uniformly inside a bin is off by a sixth at most), the first 2^((1−n)/2) of the range
    /// (32 bins: 1/46,341 of it).
    pub fn distances(range: f64, bins: u32) -> Binning {
        let n = bins.max(1) as i32;
        let mut edges = vec![0.0];
        edges.extend((1..=n).map(|i| range * 2f64.powf(f64::from(i - n) / 2.0)));
        Binning::Real(edges)
    }

    /// The values bin `bin` holds, from its lower end to its upper (an integer range
    /// with the halves its rounding takes in).
    pub fn interval(&self, bin: usize) -> (f64, f64) {
        match self {
            Binning::Integer(ranges) => (ranges[bin].0 as f64 - 0.5, ranges[bin].1 as f64 + 0.5),
            Binning::Real(edges) => (edges[bin], edges[bin + 1]),
        }
    }

    /// Bin of a value already clamped to the bounds.
    pub fn bin(&self, v: f64) -> usize {
        match self {
            Binning::Integer(ranges) => {
                let v = v.round() as i64;
                ranges.partition_point(|(lo, _)| *lo <= v).saturating_sub(1)
            }
            Binning::Real(edges) => edges.partition_point(|e| *e <= v).saturating_sub(1).min(edges.len() - 2),
        }
    }
}

/// How one column is encoded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Encoding {
    /// Code = index into `categories`; `categories.len()` is the `__other__` bucket when
    /// `other` is set.
    Categorical { categories: Vec<String>, other: bool },
    /// Value clamped to `[min, max]` (datetimes in epoch seconds).
    Numeric { kind: ColumnKind, min: f64, max: f64, binning: Binning },
}

/// One synthesised column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ColumnDomain {
    pub name: String,
    pub encoding: Encoding,
    /// Whether a missing value is a value of its own (the last bin).
    pub missing: bool,
}

impl ColumnDomain {
    /// Number of value bins (the missing bin excluded).
    pub fn value_bins(&self) -> usize {
        match &self.encoding {
            Encoding::Categorical { categories, other } => categories.len() + usize::from(*other),
            Encoding::Numeric { binning, .. } => binning.len(),
        }
    }

    /// Number of bins, the missing bin included.
    pub fn bins(&self) -> usize {
        self.value_bins() + usize::from(self.missing)
    }

    /// Bin of an encoded value (`None` = missing). Numeric values must be clamped already.
    pub fn bin(&self, value: Option<f64>) -> usize {
        match (value, &self.encoding) {
            (None, _) => self.value_bins(),
            (Some(code), Encoding::Categorical { .. }) => code as usize,
            (Some(v), Encoding::Numeric { binning, .. }) => binning.bin(v),
        }
    }

    /// The synthetic value of an encoded one (`None` = missing; a category by its code).
    pub fn synthetic(&self, value: Option<f64>) -> SyntheticValue {
        match (value, &self.encoding) {
            (None, _) => SyntheticValue::Missing,
            (Some(code), Encoding::Categorical { categories, .. }) => SyntheticValue::Category(
                categories.get(code as usize).cloned().unwrap_or_else(|| OTHER_CATEGORY.to_string()),
            ),
            (Some(v), Encoding::Numeric { kind, .. }) => SyntheticValue::numeric(*kind, v),
        }
    }

    /// The encoded value of a synthetic one (the inverse of [`Self::synthetic`] on the
    /// values the column holds): a category by its code, a number as itself; `None` for
    /// missing or a value the column cannot hold.
    pub fn encoded(&self, value: &SyntheticValue) -> Option<f64> {
        match (value, &self.encoding) {
            (SyntheticValue::Category(name), Encoding::Categorical { categories, .. }) => {
                categories.iter().position(|c| c == name).map(|i| i as f64)
            }
            (SyntheticValue::Integer(v) | SyntheticValue::Datetime(v), Encoding::Numeric { .. }) => Some(*v as f64),
            (SyntheticValue::Real(v), Encoding::Numeric { .. }) => Some(*v),
            _ => None,
        }
    }

    /// Bin of a synthetic value, as a worker would bin it once encoded: numbers clamped to
    /// the bounds, an undeclared category in `__other__`. `None`: a value this column
    /// cannot hold (missing where missing values are dropped, an unknown category without
    /// `__other__`, another kind).
    pub fn bin_of(&self, value: &SyntheticValue) -> Option<usize> {
        match (value, &self.encoding) {
            (SyntheticValue::Missing, _) => self.missing.then(|| self.value_bins()),
            (SyntheticValue::Category(name), Encoding::Categorical { categories, other }) => {
                categories.iter().position(|c| c == name).or_else(|| other.then_some(categories.len()))
            }
            (SyntheticValue::Integer(v) | SyntheticValue::Datetime(v), Encoding::Numeric { min, max, binning, .. }) => {
                Some(binning.bin((*v as f64).clamp(*min, *max)))
            }
            (SyntheticValue::Real(v), Encoding::Numeric { min, max, binning, .. }) if !v.is_nan() => {
                Some(binning.bin(v.clamp(*min, *max)))
            }
            _ => None,
        }
    }

    /// A value drawn inside a bin: a category, a uniform integer of the range, a uniform
    /// real between the edges (post-processing of a drawn bin).
    pub fn draw(&self, bin: usize, rng: &mut impl Rng) -> SyntheticValue {
        if bin == self.value_bins() {
            return SyntheticValue::Missing;
        }
        match &self.encoding {
            Encoding::Categorical { categories, .. } => {
                SyntheticValue::Category(categories.get(bin).cloned().unwrap_or_else(|| OTHER_CATEGORY.to_string()))
            }
            Encoding::Numeric { binning: Binning::Integer(ranges), .. } => {
                let (lo, hi) = ranges[bin];
                SyntheticValue::Integer(rng.random_range(lo..=hi))
            }
            Encoding::Numeric { binning: Binning::Real(edges), kind, .. } => {
                let v = edges[bin] + rng.random::<f64>() * (edges[bin + 1] - edges[bin]);
                if *kind == ColumnKind::Datetime {
                    SyntheticValue::Datetime(v.floor() as i64)
                } else {
                    SyntheticValue::Real(v)
                }
            }
        }
    }

    /// Display label of a bin (reports and tests).
    pub fn bin_label(&self, bin: usize) -> String {
        if bin == self.value_bins() {
            return "<missing>".into();
        }
        match &self.encoding {
            Encoding::Categorical { categories, .. } => {
                categories.get(bin).cloned().unwrap_or_else(|| OTHER_CATEGORY.to_string())
            }
            Encoding::Numeric { binning: Binning::Integer(r), .. } => format!("[{}, {}]", r[bin].0, r[bin].1),
            Encoding::Numeric { binning: Binning::Real(e), .. } => format!("[{}, {})", e[bin], e[bin + 1]),
        }
    }
}

/// The synthesised columns of a job (identifiers excluded), in spec order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Domain {
    pub columns: Vec<ColumnDomain>,
}

fn integer_binning(lo: i64, hi: i64, bins: &Option<Bins>, default_bins: u32) -> Binning {
    match bins {
        Some(Bins::Edges(edges)) => {
            let starts: Vec<i64> = edges[..edges.len() - 1].iter().map(|e| e.ceil() as i64).collect();
            let mut ranges = Vec::with_capacity(starts.len());
            for (i, s) in starts.iter().enumerate() {
                let end = starts.get(i + 1).map_or(hi, |next| next - 1);
                if end >= *s {
                    ranges.push((*s, end));
                }
            }
            Binning::Integer(ranges)
        }
        _ => {
            let count = match bins {
                Some(Bins::Count(n)) => *n,
                _ => default_bins,
            } as i64;
            let values = hi - lo + 1;
            if values <= count {
                return Binning::Integer((lo..=hi).map(|v| (v, v)).collect());
            }
            let ranges = (0..count).map(|k| (lo + k * values / count, lo + (k + 1) * values / count - 1)).collect();
            Binning::Integer(ranges)
        }
    }
}

fn real_binning(lo: f64, hi: f64, bins: &Option<Bins>, default_bins: u32) -> Binning {
    match bins {
        Some(Bins::Edges(edges)) => Binning::Real(edges.clone()),
        _ => {
            let count = match bins {
                Some(Bins::Count(n)) => *n,
                _ => default_bins,
            };
            let width = (hi - lo) / f64::from(count);
            let mut edges: Vec<f64> = (0..count).map(|k| lo + f64::from(k) * width).collect();
            edges.push(hi);
            Binning::Real(edges)
        }
    }
}

impl Domain {
    pub fn from_spec(spec: &JobSpec) -> Domain {
        Self::of_columns(&spec.schema.columns, spec.generator.default_bins())
    }

    /// The domain of declared columns (a table's), numeric ones cut into `default_bins`
    /// unless they declare their own.
    pub fn of_columns(columns: &[ColumnSpec], default_bins: u32) -> Domain {
        let columns = columns
            .iter()
            .filter(|c| c.kind != ColumnKind::Identifier)
            .map(|c: &ColumnSpec| {
                let encoding = match c.kind {
                    ColumnKind::Categorical => Encoding::Categorical {
                        categories: c.categories.clone().unwrap_or_default(),
                        other: c.unknown == UnknownPolicy::Other,
                    },
                    kind => {
                        let (min, max) = c.bounds().expect("validated bounds");
                        let binning = if kind == ColumnKind::Integer {
                            integer_binning(min.ceil() as i64, max.floor() as i64, &c.bins, default_bins)
                        } else {
                            real_binning(min, max, &c.bins, default_bins)
                        };
                        Encoding::Numeric { kind, min, max, binning }
                    }
                };
                ColumnDomain { name: c.name.clone(), encoding, missing: c.missing == MissingPolicy::Keep }
            })
            .collect();
        Domain { columns }
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_bins_cover_the_range() {
        let b = integer_binning(17, 90, &None, 100);
        assert_eq!(b.len(), 74);
        assert_eq!(b.bin(17.0), 0);
        assert_eq!(b.bin(90.0), 73);
        let b = integer_binning(0, 99_999, &Some(Bins::Edges(vec![0.0, 1.0, 5000.0, 99_999.0])), 10);
        assert_eq!(b, Binning::Integer(vec![(0, 0), (1, 4999), (5000, 99_999)]));
        assert_eq!((b.bin(0.0), b.bin(1.0), b.bin(4999.0), b.bin(99_999.0)), (0, 1, 1, 2));
        let b = integer_binning(0, 9, &Some(Bins::Count(3)), 10);
        assert_eq!(b, Binning::Integer(vec![(0, 2), (3, 5), (6, 9)]));
    }

    #[test]
    fn real_bins_close_the_last_one() {
        let b = real_binning(0.0, 1.0, &Some(Bins::Count(4)), 10);
        assert_eq!((b.bin(0.0), b.bin(0.25), b.bin(0.99), b.bin(1.0)), (0, 1, 3, 3));
    }

    /// A synthetic value falls in the bin its encoded form would: numbers clamped, an
    /// undeclared category in `__other__` (or nowhere without it), missing in its own bin
    /// (or nowhere where missing values are refused).
    #[test]
    fn synthetic_values_bin_as_encoded_ones() {
        let numeric = ColumnDomain {
            name: "age".into(),
            encoding: Encoding::Numeric {
                kind: ColumnKind::Integer,
                min: 0.0,
                max: 9.0,
                binning: integer_binning(0, 9, &Some(Bins::Count(3)), 10),
            },
            missing: true,
        };
        let bin = |v: SyntheticValue| numeric.bin_of(&v);
        assert_eq!(bin(SyntheticValue::Integer(-5)), Some(0));
        assert_eq!(bin(SyntheticValue::Integer(4)), Some(1));
        assert_eq!(bin(SyntheticValue::Real(99.5)), Some(2));
        assert_eq!(bin(SyntheticValue::Real(f64::NAN)), None);
        assert_eq!(bin(SyntheticValue::Missing), Some(3));
        assert_eq!(bin(SyntheticValue::Category("x".into())), None);
        let colours = |other| ColumnDomain {
            name: "colour".into(),
            encoding: Encoding::Categorical { categories: vec!["red".into(), "blue".into()], other },
            missing: false,
        };
        let blue = SyntheticValue::Category("blue".into());
        let green = SyntheticValue::Category("green".into());
        assert_eq!(colours(false).bin_of(&blue), Some(1));
        assert_eq!(colours(true).bin_of(&green), Some(2));
        assert_eq!(colours(false).bin_of(&green), None);
        assert_eq!(colours(false).bin_of(&SyntheticValue::Missing), None);
        // Encoded back: a declared category's code, a number itself, nothing else.
        for code in [Some(0.0), Some(1.0), None] {
            assert_eq!(colours(true).encoded(&colours(true).synthetic(code)), code);
        }
        assert_eq!(numeric.encoded(&numeric.synthetic(Some(7.0))), Some(7.0));
        assert_eq!(colours(true).encoded(&green), None);
        assert_eq!(numeric.encoded(&blue), None);
    }
}
