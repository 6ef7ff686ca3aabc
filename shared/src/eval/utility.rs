//! Utility, train-on-synthetic / test-on-real (TSTR): logistic regression (linfa) and
//! gradient-boosted trees (forust) trained on the synthetic table predict the target of
//! the real held-out table; the same models trained on the real training table are the
//! reference row. ROC-AUC, PR-AUC (average precision), F1 and accuracy at probability
//! 0.5, for a binary target whose positive class is stated.
//!
//! Encoding: numeric columns scaled to [0, 1] by their declared bounds (missing → 0 plus
//! a missing indicator), categorical columns one-hot with a slot for missing.
//!
//! Cost: each model is fitted on at most `EvalLimits::utility_fit_rows` rows of its table
//! and scored on at most `utility_test_rows` held-out rows (uniform samples beyond that).

use forust_ml::objective::ObjectiveType;
use forust_ml::{GradientBooster, Matrix};
use linfa::traits::Fit;
use linfa_logistic::LogisticRegression;
use ndarray::{Array1, Array2};
use serde::{Deserialize, Serialize};

use super::privacy::auc;
use super::{EvalLimits, Sampling};
use crate::data::domain::{Domain, Encoding};
use crate::data::table::Table;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ModelScores {
    pub model: String,
    pub trained_on: String,
    pub roc_auc: f64,
    pub pr_auc: f64,
    pub f1: f64,
    pub accuracy: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Utility {
    pub target: String,
    pub positive_class: String,
    pub scores: Vec<ModelScores>,
}

/// A design matrix (row major) and binary labels; rows with a missing target are left out.
pub struct Design {
    pub rows: usize,
    pub cols: usize,
    pub x: Vec<f64>,
    pub y: Vec<bool>,
}

/// Encodes `table` for predicting column `target` (positive class code `positive`).
pub fn design(domain: &Domain, table: &Table, target: usize, positive: f64) -> Design {
    let mut x = Vec::new();
    let mut y = Vec::new();
    let mut cols = 0;
    for r in 0..table.rows() {
        let Some(label) = table.columns[target][r] else { continue };
        let before = x.len();
        for (d, c) in domain.columns.iter().enumerate() {
            if d == target {
                continue;
            }
            let v = table.columns[d][r];
            match &c.encoding {
                Encoding::Numeric { min, max, .. } => {
                    x.push(v.map_or(0.0, |v| (v - min) / (max - min)));
                    if c.missing {
                        x.push(f64::from(u8::from(v.is_none())));
                    }
                }
                Encoding::Categorical { categories, other } => {
                    let slots = categories.len() + usize::from(*other) + 1;
                    let hot = v.map_or(slots - 1, |code| code as usize);
                    x.extend((0..slots).map(|k| f64::from(u8::from(k == hot))));
                }
            }
        }
        cols = x.len() - before;
        y.push(label == positive);
    }
    Design { rows: y.len(), cols, x, y }
}

fn logistic(z: f64) -> f64 {
    1.0 / (1.0 + (-z).exp())
}

/// Average precision: Σ_k (R_k − R_{k−1})·P_k over thresholds at distinct scores.
pub fn average_precision(scores: &[f64], labels: &[bool]) -> f64 {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    let positives = labels.iter().filter(|l| **l).count() as f64;
    if positives == 0.0 {
        return f64::NAN;
    }
    let (mut tp, mut seen, mut ap, mut last_recall) = (0.0, 0.0, 0.0, 0.0);
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j < order.len() && scores[order[j]] == scores[order[i]] {
            tp += f64::from(u8::from(labels[order[j]]));
            seen += 1.0;
            j += 1;
        }
        let recall = tp / positives;
        ap += (recall - last_recall) * (tp / seen);
        last_recall = recall;
        i = j;
    }
    ap
}

/// ROC-AUC of scores for binary labels.
pub fn roc_auc(scores: &[f64], labels: &[bool]) -> f64 {
    let pick = |want: bool| scores.iter().zip(labels).filter(|(_, l)| **l == want).map(|(s, _)| *s).collect::<Vec<_>>();
    auc(&pick(true), &pick(false))
}

fn scores(model: &str, trained_on: &str, probabilities: &[f64], labels: &[bool]) -> ModelScores {
    let predicted: Vec<bool> = probabilities.iter().map(|p| *p >= 0.5).collect();
    let tp = predicted.iter().zip(labels).filter(|(p, l)| **p && **l).count() as f64;
    let fp = predicted.iter().zip(labels).filter(|(p, l)| **p && !**l).count() as f64;
    let fn_ = predicted.iter().zip(labels).filter(|(p, l)| !**p && **l).count() as f64;
    let correct = predicted.iter().zip(labels).filter(|(p, l)| p == l).count() as f64;
    ModelScores {
        model: model.to_string(),
        trained_on: trained_on.to_string(),
        roc_auc: roc_auc(probabilities, labels),
        pr_auc: average_precision(probabilities, labels),
        f1: if tp == 0.0 { 0.0 } else { 2.0 * tp / (2.0 * tp + fp + fn_) },
        accuracy: correct / labels.len().max(1) as f64,
    }
}

/// Logistic regression: probabilities of the positive class on `test`.
pub fn logistic_regression(train: &Design, test: &Design) -> Option<Vec<f64>> {
    let x = Array2::from_shape_vec((train.rows, train.cols), train.x.clone()).ok()?;
    let dataset = linfa::Dataset::new(x, Array1::from(train.y.clone()));
    let model = LogisticRegression::default().max_iterations(200).fit(&dataset).ok()?;
    let t = Array2::from_shape_vec((test.rows, test.cols), test.x.clone()).ok()?;
    // linfa reports the probability of the *majority* class.
    let majority_is_positive = model.labels().pos.class;
    Some(model.predict_probabilities(&t).iter().map(|p| if majority_is_positive { *p } else { 1.0 - p }).collect())
}

fn column_major(d: &Design) -> Vec<f64> {
    let mut out = vec![0.0; d.x.len()];
    for r in 0..d.rows {
        for c in 0..d.cols {
            out[c * d.rows + r] = d.x[r * d.cols + c];
        }
    }
    out
}

/// Gradient-boosted trees (log loss, 100 trees of depth 5, learning rate 0.3).
pub fn boosted_trees(train: &Design, test: &Design) -> Option<Vec<f64>> {
    let (xtr, xte) = (column_major(train), column_major(test));
    let y: Vec<f64> = train.y.iter().map(|l| f64::from(u8::from(*l))).collect();
    let mut model = GradientBooster::default()
        .set_objective_type(ObjectiveType::LogLoss)
        .set_iterations(100)
        .set_max_depth(5)
        .set_learning_rate(0.3);
    model.fit_unweighted(&Matrix::new(&xtr, train.rows, train.cols), &y, None).ok()?;
    Some(model.predict(&Matrix::new(&xte, test.rows, test.cols), true).into_iter().map(logistic).collect())
}

/// A table models are trained on: what the scores call it, the name its sample is
/// logged under, and its rows.
pub type Trained<'t> = (&'t str, &'t str, &'t Table);

/// TSTR scores for a categorical target of each of the `trained` tables (the synthetic
/// one, then the real-train reference, then any baseline), on the held-out `test`.
pub fn evaluate(
    domain: &Domain,
    (target, positive): (usize, &str),
    test: &Table,
    trained: &[Trained<'_>],
    limits: &EvalLimits,
    sampling: &mut Sampling,
) -> Option<Utility> {
    let Encoding::Categorical { categories, .. } = &domain.columns[target].encoding else { return None };
    let code = categories.iter().position(|c| c == positive)? as f64;
    let rows = sampling.sample("utility: scored", "test", test.rows(), limits.utility_test_rows);
    let held_out = design(domain, &test.subset(&rows), target, code);
    let mut out = Vec::new();
    for &(trained_on, name, table) in trained {
        let rows = sampling.sample("utility: fitted", name, table.rows(), limits.utility_fit_rows);
        let d = design(domain, &table.subset(&rows), target, code);
        let single_class = d.y.iter().all(|l| *l) || d.y.iter().all(|l| !*l);
        for (name, fit) in [
            ("logistic regression", logistic_regression as fn(&Design, &Design) -> Option<Vec<f64>>),
            ("gradient-boosted trees", boosted_trees),
        ] {
            let probabilities = if single_class { None } else { fit(&d, &held_out) };
            out.push(match probabilities {
                Some(p) => scores(name, trained_on, &p, &held_out.y),
                None => ModelScores {
                    model: name.into(),
                    trained_on: trained_on.into(),
                    roc_auc: f64::NAN,
                    pr_auc: f64::NAN,
                    f1: f64::NAN,
                    accuracy: f64::NAN,
                },
            });
        }
    }
    Some(Utility { target: domain.columns[target].name.clone(), positive_class: positive.to_string(), scores: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_precision_examples() {
        assert_eq!(average_precision(&[0.9, 0.8, 0.1], &[true, true, false]), 1.0);
        // sklearn: average_precision_score([1,0,1,0],[0.9,0.8,0.7,0.1]) = 0.8333…
        assert!((average_precision(&[0.9, 0.8, 0.7, 0.1], &[true, false, true, false]) - 5.0 / 6.0).abs() < 1e-12);
    }
}
