//! PATE-TabTransGAN's representation of a row, from the public domain only: one *group*
//! of features per column, which is also one token of the student.
//!
//! - numeric: the value scaled to [0, 1] by the declared bounds (the generator's sigmoid
//!   head), plus a missing indicator when the column keeps missing values;
//! - categorical with two bins: one 0/1 feature (binary; second bin = 1);
//! - categorical otherwise: a one-hot block over its bins (missing and `__other__` included).

use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

use crate::data::EncodedBatch;
use crate::data::domain::{Domain, Encoding};
use crate::output::SyntheticValue;

/// How a column's group is produced by the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Head {
    /// Sigmoid in [0, 1].
    Unit,
    /// Two-way choice as a 0/1 feature (relaxed Bernoulli in training, a draw at sampling).
    Binary,
    /// Choice among `n` (Gumbel-softmax in training, one-hot at sampling).
    OneOf(usize),
}

/// One column's features: `heads` laid out from `offset`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub offset: usize,
    pub width: usize,
    pub heads: Vec<Head>,
}

/// The feature layout of a PATE job: one group per domain column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PateEncoding {
    pub domain: Domain,
    pub groups: Vec<Group>,
    pub width: usize,
    /// The target column's group, when the spec declares a target.
    pub target: Option<usize>,
}

impl PateEncoding {
    pub fn new(domain: &Domain, target: Option<&str>) -> Self {
        let mut width = 0;
        let groups = domain
            .columns
            .iter()
            .map(|column| {
                let heads = match &column.encoding {
                    Encoding::Numeric { .. } if column.missing => vec![Head::Unit, Head::Binary],
                    Encoding::Numeric { .. } => vec![Head::Unit],
                    Encoding::Categorical { .. } if column.bins() == 2 => vec![Head::Binary],
                    Encoding::Categorical { .. } => vec![Head::OneOf(column.bins())],
                };
                let w = heads.iter().map(|h| if let Head::OneOf(n) = h { *n } else { 1 }).sum();
                let group = Group { offset: width, width: w, heads };
                width += w;
                group
            })
            .collect();
        let target = target.and_then(|t| domain.index_of(t));
        Self { domain: domain.clone(), groups, width, target }
    }

    /// Row `row` of `batch` into `out` (length `width`, zeroed by the caller).
    pub fn encode_row(&self, batch: &EncodedBatch, row: usize, out: &mut [f32]) {
        for ((group, column), values) in self.groups.iter().zip(&self.domain.columns).zip(&batch.values) {
            let value = values[row];
            let slot = &mut out[group.offset..group.offset + group.width];
            match &column.encoding {
                Encoding::Numeric { min, max, .. } => {
                    slot[0] = value.map_or(0.0, |v| ((v - min) / (max - min)).clamp(0.0, 1.0) as f32);
                    if column.missing {
                        slot[1] = f32::from(u8::from(value.is_none()));
                    }
                }
                Encoding::Categorical { .. } => {
                    let bin = column.bin(value);
                    match group.heads[0] {
                        Head::Binary => slot[0] = bin as f32,
                        _ => slot[bin] = 1.0,
                    }
                }
            }
        }
    }

    /// Where the target's features are, when the spec declares a target.
    pub fn target_slot(&self) -> Option<std::ops::Range<usize>> {
        let group = &self.groups[self.target?];
        Some(group.offset..group.offset + group.width)
    }

    /// How many values a categorical target takes (`None` without one).
    pub fn target_classes(&self) -> Option<usize> {
        match self.groups[self.target?].heads[0] {
            Head::OneOf(n) => Some(n),
            Head::Binary => Some(2),
            Head::Unit => None,
        }
    }

    /// The target value (bin) of hard row `x`, for a categorical target.
    pub fn target_class(&self, x: &[f32]) -> Option<usize> {
        let slot = &x[self.target_slot()?];
        match self.groups[self.target?].heads[0] {
            Head::OneOf(_) => Some((0..slot.len()).fold(0, |best, i| if slot[i] > slot[best] { i } else { best })),
            Head::Binary => Some(usize::from(slot[0] > 0.5)),
            Head::Unit => None,
        }
    }

    /// Sets the categorical target of row `x` to bin `class` (no-op without one).
    pub fn set_target_class(&self, x: &mut [f32], class: usize) {
        let Some(t) = self.target else { return };
        let group = &self.groups[t];
        let slot = &mut x[group.offset..group.offset + group.width];
        match group.heads[0] {
            Head::OneOf(_) => {
                slot.iter_mut().for_each(|v| *v = 0.0);
                slot[class] = 1.0;
            }
            Head::Binary => slot[0] = class as f32,
            Head::Unit => {}
        }
    }

    /// A copy of hard row `x` with another target value (binary: flipped; one-hot: the
    /// next bin), or `None` without a target. Queried beside the original, it lets the
    /// teachers' relative votes say which target value fits the rest of the row better.
    pub fn with_other_target(&self, x: &[f32]) -> Option<Vec<f32>> {
        let mut out = x.to_vec();
        match (self.target_class(x), self.target_classes()) {
            (Some(class), Some(classes)) => self.set_target_class(&mut out, (class + 1) % classes),
            // A numeric target: mirrored in its range.
            _ => out[self.target_slot()?.start] = 1.0 - x[self.target_slot()?.start],
        }
        Some(out)
    }

    /// Redraws each column of hard row `x` with probability `p`, uniformly over its domain
    /// (a present value for numeric columns). Queries explored this way reach regions the
    /// generator has left, so the teachers can say when real rows live there.
    pub fn explore(&self, x: &mut [f32], p: f64, rng: &mut impl Rng) {
        for group in &self.groups {
            if !rng.random_bool(p) {
                continue;
            }
            let slot = &mut x[group.offset..group.offset + group.width];
            match group.heads[0] {
                Head::Unit => {
                    slot[0] = rng.random::<f32>();
                    if let Some(indicator) = slot.get_mut(1) {
                        *indicator = 0.0;
                    }
                }
                Head::Binary => slot[0] = f32::from(u8::from(rng.random_bool(0.5))),
                Head::OneOf(n) => {
                    slot.iter_mut().for_each(|v| *v = 0.0);
                    slot[rng.random_range(0..n)] = 1.0;
                }
            }
        }
    }

    /// A generated (hard) feature vector back into values.
    pub fn decode_row(&self, x: &[f32]) -> Vec<SyntheticValue> {
        self.groups
            .iter()
            .zip(&self.domain.columns)
            .map(|(group, column)| {
                let slot = &x[group.offset..group.offset + group.width];
                let bin = match (&column.encoding, group.heads[0]) {
                    (Encoding::Numeric { kind, min, max, .. }, _) => {
                        if column.missing && slot[1] > 0.5 {
                            return SyntheticValue::Missing;
                        }
                        let v = min + f64::from(slot[0]).clamp(0.0, 1.0) * (max - min);
                        return SyntheticValue::numeric(*kind, v);
                    }
                    (_, Head::Binary) => usize::from(slot[0] > 0.5),
                    _ => (0..slot.len()).fold(0, |best, i| if slot[i] > slot[best] { i } else { best }),
                };
                if column.missing && bin == column.bins() - 1 {
                    SyntheticValue::Missing
                } else {
                    SyntheticValue::Category(column.bin_label(bin))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoding() -> PateEncoding {
        let schema = r#"
            target = "sick"
            [[schema.columns]]
            name = "age"
            kind = "integer"
            min = 0
            max = 100
            missing = "keep"
            [[schema.columns]]
            name = "colour"
            kind = "categorical"
            categories = ["red", "green", "blue"]
            missing = "reject"
            [[schema.columns]]
            name = "sick"
            kind = "categorical"
            categories = ["no", "yes"]
            missing = "reject"
            "#;
        let domain = crate::testing::schema_domain(schema);
        PateEncoding::new(&domain, Some("sick"))
    }

    #[test]
    fn rows_round_trip_through_the_groups() {
        let encoding = encoding();
        // age + missing indicator, colour one-hot (3), sick binary.
        assert_eq!(encoding.width, 6);
        assert_eq!(encoding.target, Some(2));
        assert_eq!(encoding.groups[2].heads, vec![Head::Binary]);
        let batch = EncodedBatch {
            units: vec!["a".into(), "b".into()],
            values: vec![vec![Some(25.0), None], vec![Some(2.0), Some(0.0)], vec![Some(1.0), Some(0.0)]],
        };
        let mut x = vec![0.0; 6];
        encoding.encode_row(&batch, 0, &mut x);
        assert_eq!(x, vec![0.25, 0.0, 0.0, 0.0, 1.0, 1.0]);
        assert_eq!(
            encoding.decode_row(&x),
            vec![
                SyntheticValue::Integer(25),
                SyntheticValue::Category("blue".into()),
                SyntheticValue::Category("yes".into())
            ]
        );
        let flipped = encoding.with_other_target(&x).unwrap();
        assert_eq!(flipped, vec![0.25, 0.0, 0.0, 0.0, 1.0, 0.0]);
        let mut x = vec![0.0; 6];
        encoding.encode_row(&batch, 1, &mut x);
        assert_eq!(
            encoding.decode_row(&x),
            vec![
                SyntheticValue::Missing,
                SyntheticValue::Category("red".into()),
                SyntheticValue::Category("no".into())
            ]
        );
    }
}
