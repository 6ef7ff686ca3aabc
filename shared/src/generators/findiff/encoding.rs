//! DP-FinDiff's representation of a row, from public information only.
//!
//! Numeric columns are scaled to [-1, 1] with their *declared* bounds (never statistics of
//! the rows); a numeric column that allows missing values gets an indicator feature
//! (+1 missing, -1 present) and its value feature is 0 when missing. A categorical column
//! (its missing bin included) maps each value to a frozen random embedding of width `d_e`
//! and norm 1 (public seed); decoding picks the nearest embedding of that column.

use rand::rngs::ChaCha8Rng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::data::EncodedBatch;
use crate::data::domain::{Domain, Encoding};
use crate::output::SyntheticValue;
use crate::spec::{ColumnKind, OTHER_CATEGORY};

/// Frozen random embeddings of a column's `values`, all of norm 1 so that no value sits
/// at the centre, where a noisy model's samples collect (nearest-embedding decoding would
/// over-produce it). Width 2: evenly spaced on the unit circle, randomly rotated and
/// permuted; wider: Gaussian directions.
fn frozen_embeddings(values: usize, width: usize, rng: &mut ChaCha8Rng) -> Vec<Vec<f32>> {
    if width == 2 {
        let offset = rng.random::<f64>() * std::f64::consts::TAU;
        let mut order: Vec<usize> = (0..values).collect();
        order.shuffle(rng);
        return order
            .into_iter()
            .map(|k| {
                let angle = offset + std::f64::consts::TAU * k as f64 / values as f64;
                vec![angle.cos() as f32, angle.sin() as f32]
            })
            .collect();
    }
    (0..values)
        .map(|_| {
            let v: Vec<f64> = (0..width).map(|_| StandardNormal.sample(rng)).collect();
            let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt().max(1e-12);
            v.iter().map(|x| (x / norm) as f32).collect()
        })
        .collect()
}

/// How one domain column is laid out in the feature vector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Feature {
    Numeric {
        offset: usize,
        min: f64,
        max: f64,
        kind: ColumnKind,
        missing_indicator: Option<usize>,
    },
    /// `embeddings[code]` for each code of the column (its missing bin included).
    Categorical {
        offset: usize,
        embeddings: Vec<Vec<f32>>,
        categories: Vec<String>,
        missing: bool,
    },
}

/// The feature layout of a job: one entry per domain column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TabularEncoding {
    pub features: Vec<Feature>,
    pub width: usize,
}

impl TabularEncoding {
    /// Layout for `domain`; `seed` (public) draws the frozen embeddings.
    pub fn new(domain: &Domain, embedding_width: usize, seed: [u8; 32]) -> Self {
        let mut rng = ChaCha8Rng::from_seed(seed);
        let mut width = 0;
        let features = domain
            .columns
            .iter()
            .map(|column| match &column.encoding {
                Encoding::Numeric { kind, min, max, .. } => {
                    let offset = width;
                    width += 1;
                    let missing_indicator = column.missing.then(|| {
                        width += 1;
                        width - 1
                    });
                    Feature::Numeric { offset, min: *min, max: *max, kind: *kind, missing_indicator }
                }
                Encoding::Categorical { categories, .. } => {
                    let offset = width;
                    width += embedding_width;
                    let embeddings = frozen_embeddings(column.bins(), embedding_width, &mut rng);
                    Feature::Categorical { offset, embeddings, categories: categories.clone(), missing: column.missing }
                }
            })
            .collect();
        Self { features, width }
    }

    /// Row `row` of `batch` into `out` (length `width`).
    pub fn encode_row(&self, batch: &EncodedBatch, row: usize, out: &mut [f32]) {
        for (feature, values) in self.features.iter().zip(&batch.values) {
            let value = values[row];
            match feature {
                Feature::Numeric { offset, min, max, missing_indicator, .. } => {
                    out[*offset] = match value {
                        Some(v) if max > min => (2.0 * (v - min) / (max - min) - 1.0) as f32,
                        _ => 0.0,
                    };
                    if let Some(i) = missing_indicator {
                        out[*i] = if value.is_none() { 1.0 } else { -1.0 };
                    }
                }
                Feature::Categorical { offset, embeddings, .. } => {
                    // Codes index the column's bins; a missing value is the last one.
                    let code = value.map_or(embeddings.len() - 1, |c| c as usize);
                    out[*offset..*offset + embeddings[code].len()].copy_from_slice(&embeddings[code]);
                }
            }
        }
    }

    /// A feature vector back into values: nearest embedding, inverse scaling, clamping.
    pub fn decode_row(&self, x: &[f32]) -> Vec<SyntheticValue> {
        self.features
            .iter()
            .map(|feature| match feature {
                Feature::Numeric { offset, min, max, kind, missing_indicator } => {
                    if missing_indicator.is_some_and(|i| x[i] > 0.0) {
                        return SyntheticValue::Missing;
                    }
                    let scaled = f64::from(x[*offset]).clamp(-1.0, 1.0);
                    let v = min + (scaled + 1.0) / 2.0 * (max - min);
                    SyntheticValue::numeric(*kind, v)
                }
                Feature::Categorical { offset, embeddings, categories, missing } => {
                    let point = &x[*offset..*offset + embeddings[0].len()];
                    let distance = |e: &Vec<f32>| e.iter().zip(point).map(|(a, b)| (a - b) * (a - b)).sum::<f32>();
                    let code = (0..embeddings.len())
                        .min_by(|&a, &b| distance(&embeddings[a]).total_cmp(&distance(&embeddings[b])))
                        .expect("a column has at least one value");
                    if *missing && code == embeddings.len() - 1 {
                        SyntheticValue::Missing
                    } else {
                        SyntheticValue::Category(
                            categories.get(code).cloned().unwrap_or_else(|| OTHER_CATEGORY.to_string()),
                        )
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn domain() -> Domain {
        crate::testing::schema_domain(
            r#"
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
            missing = "keep"
            "#,
        )
    }

    #[test]
    fn rows_round_trip_through_the_feature_space() {
        let domain = domain();
        let encoding = TabularEncoding::new(&domain, 2, [7; 32]);
        // age + indicator, colour's 2-d embedding.
        assert_eq!(encoding.width, 4);
        let batch = EncodedBatch {
            units: vec!["a".into(), "b".into(), "c".into()],
            values: vec![vec![Some(25.0), None, Some(100.0)], vec![Some(2.0), Some(0.0), None]],
        };
        let decoded: Vec<Vec<SyntheticValue>> = (0..3)
            .map(|r| {
                let mut x = vec![0.0; encoding.width];
                encoding.encode_row(&batch, r, &mut x);
                encoding.decode_row(&x)
            })
            .collect();
        assert_eq!(decoded[0], vec![SyntheticValue::Integer(25), SyntheticValue::Category("blue".into())]);
        assert_eq!(decoded[1], vec![SyntheticValue::Missing, SyntheticValue::Category("red".into())]);
        assert_eq!(decoded[2], vec![SyntheticValue::Integer(100), SyntheticValue::Missing]);
    }

    #[test]
    fn categorical_embeddings_have_unit_norm_and_are_evenly_spaced_in_two_dimensions() {
        let mut rng = ChaCha8Rng::from_seed([5; 32]);
        let e = frozen_embeddings(8, 2, &mut rng);
        let mut angles: Vec<f64> = e.iter().map(|v| f64::from(v[1]).atan2(f64::from(v[0]))).collect();
        angles.sort_by(f64::total_cmp);
        for w in angles.windows(2) {
            assert!((w[1] - w[0] - std::f64::consts::TAU / 8.0).abs() < 1e-5);
        }
        for v in frozen_embeddings(5, 4, &mut rng).iter().chain(&e) {
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn numeric_values_are_clamped_to_the_declared_bounds_on_decoding() {
        let encoding = TabularEncoding::new(&domain(), 2, [7; 32]);
        let x = [3.5, -1.0, 0.0, 0.0];
        assert_eq!(encoding.decode_row(&x)[0], SyntheticValue::Integer(100));
    }
}
