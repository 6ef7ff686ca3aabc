//! A PATE teacher: L2-regularised logistic regression telling the partition's real rows
//! (label 1) from generated rows (label 0), fit from scratch every iteration by Newton's
//! method in f64. The fit is a deterministic function of its inputs, so a teacher votes
//! the same on whichever worker it runs.
//!
//! Features are the row's encoding plus, when the target is known, the row times each of
//! the target's indicators: a linear model over one-hot columns only sees each column's
//! marginal, the products let it see class-conditional structure.

use serde::{Deserialize, Serialize};

use super::encoding::{Head, PateEncoding};
use crate::spec::TeacherVote;

/// How teachers are fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TeacherConfig {
    pub l2: f64,
    pub newton_steps: u32,
    pub target_interactions: bool,
    pub vote: TeacherVote,
}

/// A teacher's feature map: the row, its products with the target's indicators, and an
/// intercept (last), as sparse (index, value) pairs.
pub struct Features {
    dimension: usize,
    /// (indicator feature, offset of its product block).
    target: Vec<(usize, usize)>,
}

impl Features {
    pub fn new(encoding: &PateEncoding, config: &TeacherConfig) -> Self {
        // The target's indicator features (all but one bin of a one-hot target).
        let indicators: Vec<usize> = match encoding.target.filter(|_| config.target_interactions) {
            Some(t) => {
                let g = &encoding.groups[t];
                match g.heads[0] {
                    Head::OneOf(n) => (g.offset..g.offset + n - 1).collect(),
                    _ => vec![g.offset],
                }
            }
            None => Vec::new(),
        };
        let w = encoding.width;
        // Each indicator's products live in their own block of `w` after the row itself.
        let target: Vec<(usize, usize)> = indicators.into_iter().enumerate().map(|(k, i)| (i, w * (k + 1))).collect();
        Self { dimension: w * (target.len() + 1) + 1, target }
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    fn row(&self, x: &[f32], out: &mut Vec<(usize, f64)>) {
        out.clear();
        out.extend(x.iter().enumerate().filter(|(_, v)| **v != 0.0).map(|(i, v)| (i, f64::from(*v))));
        let base = out.len();
        for &(indicator, offset) in &self.target {
            let t = f64::from(x[indicator]);
            if t != 0.0 {
                for k in 0..base {
                    let (i, v) = out[k];
                    out.push((offset + i, v * t));
                }
            }
        }
        out.push((self.dimension - 1, 1.0));
    }
}

/// A training row: its sparse features, label (1 = real) and weight.
type Sample = (Vec<(usize, f64)>, f64, f64);

/// A fitted teacher.
pub struct Teacher {
    features: Features,
    beta: Vec<f64>,
}

impl Teacher {
    /// Fits on `real` and `fake` rows (row-major, `width` wide), each class weighted to the
    /// same total.
    pub fn fit(features: Features, config: &TeacherConfig, real: &[f32], fake: &[f32], width: usize) -> Self {
        let d = features.dimension();
        let (n_real, n_fake) = (real.len() / width, fake.len() / width);
        let fake_weight = if n_fake == 0 { 0.0 } else { n_real as f64 / n_fake as f64 };
        let mut rows: Vec<Sample> = Vec::with_capacity(n_real + n_fake);
        for (data, label, weight) in [(real, 1.0, 1.0), (fake, 0.0, fake_weight)] {
            for x in data.chunks(width) {
                let mut row = Vec::new();
                features.row(x, &mut row);
                rows.push((row, label, weight));
            }
        }
        let mut beta = vec![0.0; d];
        let mut gradient = vec![0.0; d];
        let mut hessian = vec![0.0; d * d];
        for _ in 0..config.newton_steps {
            gradient.iter_mut().zip(&beta).for_each(|(g, b)| *g = config.l2 * b);
            hessian.iter_mut().for_each(|h| *h = 0.0);
            for i in 0..d {
                hessian[i * d + i] = config.l2;
            }
            // The intercept is not penalised.
            gradient[d - 1] = 0.0;
            hessian[d * d - 1] = 1e-9;
            for (row, label, weight) in &rows {
                let z: f64 = row.iter().map(|(i, v)| beta[*i] * v).sum();
                let p = 1.0 / (1.0 + (-z).exp());
                let r = weight * (p - label);
                let s = weight * p * (1.0 - p);
                for &(i, vi) in row {
                    gradient[i] += r * vi;
                    for &(j, vj) in row {
                        if j <= i {
                            hessian[i * d + j] += s * vi * vj;
                        }
                    }
                }
            }
            let step = solve_cholesky(&mut hessian, &gradient, d);
            beta.iter_mut().zip(&step).for_each(|(b, s)| *b -= s);
        }
        Self { features, beta }
    }

    /// Log-odds that row `x` is real.
    fn score(&self, x: &[f32]) -> f64 {
        let mut row = Vec::new();
        self.features.row(x, &mut row);
        row.iter().map(|(i, v)| self.beta[*i] * v).sum()
    }

    /// The teacher's votes on `queries` (row-major, `width` wide), each in [0, 1]: how
    /// much it takes the row for real.
    pub fn votes(&self, queries: &[f32], width: usize, rule: TeacherVote) -> Vec<f64> {
        let scores: Vec<f64> = queries.chunks(width).map(|q| self.score(q)).collect();
        match rule {
            TeacherVote::Probability => scores.iter().map(|&s| 1.0 / (1.0 + (-s).exp())).collect(),
            TeacherVote::Absolute => scores.iter().map(|&s| f64::from(u8::from(s > 0.0))).collect(),
            TeacherVote::Relative => {
                // The top ⌊B/2⌋ by score, ties broken by position: deterministic.
                let mut order: Vec<usize> = (0..scores.len()).collect();
                order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
                let mut votes = vec![0.0; scores.len()];
                order.iter().take(scores.len() / 2).for_each(|&i| votes[i] = 1.0);
                votes
            }
        }
    }
}

/// Solves H·s = g for symmetric positive definite H given by its lower triangle
/// (overwritten by its Cholesky factor).
fn solve_cholesky(h: &mut [f64], g: &[f64], d: usize) -> Vec<f64> {
    for j in 0..d {
        let mut diag = h[j * d + j];
        for k in 0..j {
            diag -= h[j * d + k] * h[j * d + k];
        }
        let l = diag.max(1e-12).sqrt();
        h[j * d + j] = l;
        for i in j + 1..d {
            let mut v = h[i * d + j];
            for k in 0..j {
                v -= h[i * d + k] * h[j * d + k];
            }
            h[i * d + j] = v / l;
        }
    }
    let mut y = g.to_vec();
    for i in 0..d {
        for k in 0..i {
            y[i] -= h[i * d + k] * y[k];
        }
        y[i] /= h[i * d + i];
    }
    for i in (0..d).rev() {
        for k in i + 1..d {
            y[i] -= h[k * d + i] * y[k];
        }
        y[i] /= h[i * d + i];
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoding() -> PateEncoding {
        use crate::data::domain::{ColumnDomain, Domain, Encoding};
        let categorical = |name: &str, n: usize| ColumnDomain {
            name: name.into(),
            encoding: Encoding::Categorical { categories: (0..n).map(|k| k.to_string()).collect(), other: false },
            missing: false,
        };
        PateEncoding::new(&Domain { columns: vec![categorical("a", 3), categorical("y", 2)] }, Some("y"))
    }

    #[test]
    fn products_with_the_target_let_a_teacher_see_class_conditional_structure() {
        // Real rows: a = 0 when y = 1 and a = 1 when y = 0; fake rows pair them the other
        // way round. Both have the same marginals, so only the products tell them apart.
        let row = |a: usize, y: f32| {
            let mut x = vec![0.0; 4];
            x[a] = 1.0;
            x[3] = y;
            x
        };
        let real: Vec<f32> = (0..20).flat_map(|i| if i % 2 == 0 { row(0, 1.0) } else { row(1, 0.0) }).collect();
        let fake: Vec<f32> = (0..20).flat_map(|i| if i % 2 == 0 { row(1, 1.0) } else { row(0, 0.0) }).collect();
        let config = TeacherConfig { l2: 0.1, newton_steps: 8, target_interactions: true, vote: TeacherVote::Absolute };
        let teacher = Teacher::fit(Features::new(&encoding(), &config), &config, &real, &fake, 4);
        let queries: Vec<f32> = [row(0, 1.0), row(1, 0.0), row(1, 1.0), row(0, 0.0)].concat();
        assert_eq!(teacher.votes(&queries, 4, TeacherVote::Absolute), vec![1.0, 1.0, 0.0, 0.0]);
        let p = teacher.votes(&queries, 4, TeacherVote::Probability);
        assert!(p[0] > 0.5 && p[1] > 0.5 && p[2] < 0.5 && p[3] < 0.5 && p.iter().all(|v| (0.0..=1.0).contains(v)));
        // Relative votes: the more real-looking half, whatever the threshold.
        let queries: Vec<f32> = [row(1, 1.0), row(0, 1.0), row(0, 0.0), row(1, 0.0)].concat();
        assert_eq!(teacher.votes(&queries, 4, TeacherVote::Relative), vec![0.0, 1.0, 0.0, 1.0]);
        // Without the products the classes are indistinguishable.
        let plain = TeacherConfig { target_interactions: false, ..config };
        assert_eq!(Features::new(&encoding(), &plain).dimension(), 5);
        assert_eq!(Features::new(&encoding(), &config).dimension(), 9);
    }

    #[test]
    fn cholesky_solves_a_small_system() {
        // H = [[4, 2], [2, 3]], g = [2, 1] → s = [0.5, 0].
        let mut h = vec![4.0, 0.0, 2.0, 3.0];
        let s = solve_cholesky(&mut h, &[2.0, 1.0], 2);
        assert!((s[0] - 0.5).abs() < 1e-12 && s[1].abs() < 1e-12);
    }
}
