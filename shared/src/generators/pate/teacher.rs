//! A PATE teacher: L2-regularised logistic regression (Newton's method) or a small MLP
//! (full-batch Adam) telling the partition's real rows (label 1) from generated rows
//! (label 0), fit from scratch every iteration in f64. The fit is a deterministic function
//! of its inputs (the MLP's start drawn from the teacher's keyed generator), so a teacher
//! votes the same on whichever worker it runs.
//!
//! Features are the row's encoding plus, when the target is known, the row times each of
//! the target's indicators: a linear model over one-hot columns only sees each column's
//! marginal, the products let it see class-conditional structure.

use serde::{Deserialize, Serialize};

use rand::rngs::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

use super::encoding::{Head, PateEncoding};
use crate::generators::pate::{TeacherModel, TeacherVote};

/// How teachers are fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TeacherConfig {
    pub model: TeacherModel,
    pub l2: f64,
    pub newton_steps: u32,
    pub hidden: usize,
    pub mlp_steps: u32,
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

/// A training row of a logistic regression: sparse features, label in [0, 1] (soft labels
/// allowed: the loss is the cross-entropy) and weight.
type Sample = (Vec<(usize, f64)>, f64, f64);

/// L2-regularised logistic regression by Newton's method in f64 (the last feature is the
/// intercept and is not penalised): deterministic in its inputs.
fn fit_logistic(rows: &[Sample], d: usize, l2: f64, newton_steps: u32) -> Vec<f64> {
    let mut beta = vec![0.0; d];
    let mut gradient = vec![0.0; d];
    let mut hessian = vec![0.0; d * d];
    for _ in 0..newton_steps {
        gradient.iter_mut().zip(&beta).for_each(|(g, b)| *g = l2 * b);
        hessian.iter_mut().for_each(|h| *h = 0.0);
        for i in 0..d {
            hessian[i * d + i] = l2;
        }
        // The intercept is not penalised.
        gradient[d - 1] = 0.0;
        hessian[d * d - 1] = 1e-9;
        for (row, label, weight) in rows {
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
    beta
}

/// One hidden tanh layer and a logistic output, over sparse features.
struct Mlp {
    /// Hidden weights, `hidden` rows of `d`; hidden biases; output weights and bias.
    w1: Vec<f64>,
    b1: Vec<f64>,
    w2: Vec<f64>,
    b2: f64,
}

impl Mlp {
    fn hidden(&self, row: &[(usize, f64)]) -> Vec<f64> {
        let d = self.w1.len() / self.b1.len();
        self.b1
            .iter()
            .enumerate()
            .map(|(j, b)| (b + row.iter().map(|(i, v)| self.w1[j * d + i] * v).sum::<f64>()).tanh())
            .collect()
    }

    fn score(&self, row: &[(usize, f64)]) -> f64 {
        self.b2 + self.hidden(row).iter().zip(&self.w2).map(|(h, w)| h * w).sum::<f64>()
    }

    /// Full-batch Adam on the weighted cross-entropy plus l2/2 · ‖weights‖², from a start
    /// drawn by `rng`.
    fn fit(rows: &[Sample], d: usize, config: &TeacherConfig, rng: &mut ChaCha8Rng) -> Self {
        let h = config.hidden;
        let mut normal = |scale: f64| -> f64 { scale * Distribution::<f64>::sample(&StandardNormal, &mut *rng) };
        let mut mlp = Self {
            w1: (0..h * d).map(|_| normal(0.1)).collect(),
            b1: vec![0.0; h],
            w2: (0..h).map(|_| normal(1.0 / (h as f64).sqrt())).collect(),
            b2: 0.0,
        };
        let total: f64 = rows.iter().map(|r| r.2).sum::<f64>().max(f64::MIN_POSITIVE);
        let n = h * d + 2 * h + 1;
        let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
        let (lr, beta1, beta2) = (0.01, 0.9, 0.999);
        for step in 1..=config.mlp_steps {
            // Gradient laid out as [w1, b1, w2, b2].
            let mut g = vec![0.0; n];
            for (row, label, weight) in rows {
                let hidden = mlp.hidden(row);
                let z = mlp.b2 + hidden.iter().zip(&mlp.w2).map(|(a, w)| a * w).sum::<f64>();
                let dz = weight * (1.0 / (1.0 + (-z).exp()) - label);
                for j in 0..h {
                    g[h * d + h + j] += dz * hidden[j];
                    let da = dz * mlp.w2[j] * (1.0 - hidden[j] * hidden[j]);
                    g[h * d + j] += da;
                    for &(i, x) in row {
                        g[j * d + i] += da * x;
                    }
                }
                g[n - 1] += dz;
            }
            let params = mlp.w1.iter_mut().chain(&mut mlp.b1).chain(&mut mlp.w2).chain(std::iter::once(&mut mlp.b2));
            for (k, p) in params.enumerate() {
                // Biases are not penalised.
                let penalised = k < h * d || (h * d + h..h * d + 2 * h).contains(&k);
                let gk = (g[k] + if penalised { config.l2 * *p } else { 0.0 }) / total;
                m[k] = beta1 * m[k] + (1.0 - beta1) * gk;
                v[k] = beta2 * v[k] + (1.0 - beta2) * gk * gk;
                let m_hat = m[k] / (1.0 - beta1.powi(step as i32));
                let v_hat = v[k] / (1.0 - beta2.powi(step as i32));
                *p -= lr * m_hat / (v_hat.sqrt() + 1e-8);
            }
        }
        mlp
    }
}

/// A fitted teacher's model.
enum Fitted {
    Logistic(Vec<f64>),
    Mlp(Mlp),
}

/// A fitted teacher.
pub struct Teacher {
    features: Features,
    model: Fitted,
}

impl Teacher {
    /// Fits on `real` and `fake` rows (row-major, `width` wide), each class weighted to the
    /// same total; `rng` draws the MLP's start.
    pub fn fit(
        features: Features,
        config: &TeacherConfig,
        real: &[f32],
        fake: &[f32],
        width: usize,
        rng: &mut ChaCha8Rng,
    ) -> Self {
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
        let d = features.dimension();
        let model = match config.model {
            TeacherModel::Logistic => Fitted::Logistic(fit_logistic(&rows, d, config.l2, config.newton_steps)),
            TeacherModel::Mlp => Fitted::Mlp(Mlp::fit(&rows, d, config, rng)),
        };
        Self { features, model }
    }

    /// Log-odds that row `x` is real.
    fn score(&self, x: &[f32]) -> f64 {
        let mut row = Vec::new();
        self.features.row(x, &mut row);
        match &self.model {
            Fitted::Logistic(beta) => row.iter().map(|(i, v)| beta[*i] * v).sum(),
            Fitted::Mlp(mlp) => mlp.score(&row),
        }
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

/// p(target | rest of the row): one L2-regularised logistic regression per target value
/// (one-vs-rest; a single one for a binary target) on the row's features with the target
/// left out. A teacher fits it on its partition's rows to vote class probabilities on label
/// queries; the coordinator fits it on the released (noisy) vote shares to draw the output
/// rows' target.
pub struct TargetModel {
    slot: std::ops::Range<usize>,
    width: usize,
    /// One coefficient vector per modelled class (index `width` is the intercept).
    betas: Vec<Vec<f64>>,
    classes: usize,
}

impl TargetModel {
    /// Fits on rows `x` (row-major, the encoding's width) and their class distributions
    /// `labels` (`classes` per row: one-hot for real rows, vote shares for released ones).
    pub fn fit(encoding: &PateEncoding, config: &TeacherConfig, x: &[f32], labels: &[f64]) -> Option<Self> {
        let slot = encoding.target_slot()?;
        let classes = encoding.target_classes()?;
        let width = encoding.width;
        let mut model = Self { slot, width, betas: Vec::new(), classes };
        let mut rows: Vec<Sample> = x.chunks(width).map(|row| (model.features(row), 0.0, 1.0)).collect();
        // A binary target needs one regression (of class 1); otherwise one per class.
        let modelled = if classes == 2 { 1..2 } else { 0..classes };
        for class in modelled {
            rows.iter_mut().zip(labels.chunks(classes)).for_each(|(row, l)| row.1 = l[class]);
            model.betas.push(fit_logistic(&rows, width + 1, config.l2, config.newton_steps));
        }
        Some(model)
    }

    fn features(&self, x: &[f32]) -> Vec<(usize, f64)> {
        let mut row: Vec<(usize, f64)> = x
            .iter()
            .enumerate()
            .filter(|(i, v)| **v != 0.0 && !self.slot.contains(i))
            .map(|(i, v)| (i, f64::from(*v)))
            .collect();
        row.push((self.width, 1.0));
        row
    }

    /// Draws the target of every row of `x` (hard rows of `encoding`) from the model.
    pub fn relabel(&self, encoding: &PateEncoding, x: &mut [f32], rng: &mut impl rand::Rng) {
        let p = self.probabilities(x);
        for (row, p) in x.chunks_mut(self.width).zip(p.chunks(self.classes)) {
            let mut u: f64 = rand::RngExt::random(rng);
            let class = p.iter().position(|&q| {
                u -= q;
                u < 0.0
            });
            encoding.set_target_class(row, class.unwrap_or(self.classes - 1));
        }
    }

    /// Class probabilities of each row of `x` (`classes` per row, summing to 1).
    pub fn probabilities(&self, x: &[f32]) -> Vec<f64> {
        let sigmoid =
            |beta: &[f64], f: &[(usize, f64)]| 1.0 / (1.0 + (-f.iter().map(|(i, v)| beta[*i] * v).sum::<f64>()).exp());
        let mut out = Vec::with_capacity(x.len() / self.width * self.classes);
        for row in x.chunks(self.width) {
            let f = self.features(row);
            if self.classes == 2 {
                let p = sigmoid(&self.betas[0], &f);
                out.extend([1.0 - p, p]);
            } else {
                let scores: Vec<f64> = self.betas.iter().map(|b| sigmoid(b, &f)).collect();
                let total: f64 = scores.iter().sum();
                out.extend(scores.iter().map(|s| s / total));
            }
        }
        out
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

    fn config() -> TeacherConfig {
        TeacherConfig {
            model: TeacherModel::Logistic,
            l2: 1.0,
            newton_steps: 6,
            hidden: 8,
            mlp_steps: 300,
            target_interactions: false,
            vote: TeacherVote::Probability,
        }
    }

    #[test]
    fn an_mlp_teacher_sees_a_value_that_is_real_only_mid_range() {
        use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
        use crate::spec::ColumnKind;
        // Real values sit mid-range, generated ones at both bounds: the same mean, so the
        // logistic teacher (linear in the value) cannot prefer either; the MLP can.
        let column = ColumnDomain {
            name: "v".into(),
            encoding: Encoding::Numeric {
                kind: ColumnKind::Continuous,
                min: 0.0,
                max: 1.0,
                binning: Binning::Real(vec![0.0, 1.0]),
            },
            missing: false,
        };
        let encoding = PateEncoding::new(&Domain { columns: vec![column] }, None);
        let real: Vec<f32> = [0.45, 0.5, 0.55].repeat(10);
        let fake: Vec<f32> = [0.0, 1.0, 0.05, 0.95].repeat(10);
        let queries = [0.5, 0.0, 1.0];
        let votes = |model| {
            let config = TeacherConfig { model, l2: 0.01, ..config() };
            let mut rng = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(2);
            Teacher::fit(Features::new(&encoding, &config), &config, &real, &fake, 1, &mut rng).votes(
                &queries,
                1,
                config.vote,
            )
        };
        let linear = votes(TeacherModel::Logistic);
        assert!(linear.iter().all(|p| (p - 0.5).abs() < 0.05), "{linear:?}");
        let mlp = votes(TeacherModel::Mlp);
        assert!(mlp[0] > 0.8 && mlp[1] < 0.2 && mlp[2] < 0.2, "{mlp:?}");
        // Deterministic in its inputs and seed: the same votes on any worker.
        assert_eq!(votes(TeacherModel::Mlp), mlp);
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
        let config = TeacherConfig { l2: 0.1, newton_steps: 8, target_interactions: true, ..config() };
        let mut rng = <ChaCha8Rng as rand::SeedableRng>::seed_from_u64(1);
        let teacher = Teacher::fit(Features::new(&encoding(), &config), &config, &real, &fake, 4, &mut rng);
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
    fn a_target_model_learns_the_target_given_the_rest_of_the_row() {
        // y depends on a: P(y = 1 | a) = 0.1, 0.5, 0.9, with exactly those shares among
        // 1000 rows per value of a. One-hot a plus an intercept is saturated, so the
        // (lightly penalised) fit reproduces the shares.
        let encoding = encoding();
        let truth = [0.1, 0.5, 0.9];
        let mut x = Vec::new();
        let mut labels = Vec::new();
        for (a, p) in truth.iter().enumerate() {
            for i in 0..1000 {
                let y = usize::from((i as f64) < p * 1000.0);
                let mut row = vec![0.0; 4];
                row[a] = 1.0;
                row[3] = y as f32;
                x.extend(row);
                labels.extend(if y == 1 { [0.0, 1.0] } else { [1.0, 0.0] });
            }
        }
        let config = TeacherConfig { l2: 1e-3, newton_steps: 12, ..config() };
        let model = TargetModel::fit(&encoding, &config, &x, &labels).unwrap();
        // The row's own target is not a feature: queries with either target agree.
        let queries: Vec<f32> = [[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]].concat();
        let p = model.probabilities(&queries);
        for (a, want) in truth.iter().enumerate() {
            assert!((p[2 * a + 1] - want).abs() < 0.01, "P(y=1 | a={a}) = {} vs {want}", p[2 * a + 1]);
            assert!((p[2 * a] + p[2 * a + 1] - 1.0).abs() < 1e-12);
        }
        // Soft labels (released vote shares) give the same fit as the hard labels they average.
        let soft: Vec<f64> = truth.iter().flat_map(|&p| [1.0 - p, p]).collect();
        let rows: Vec<f32> = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]].concat();
        let from_shares = TargetModel::fit(&encoding, &config, &rows, &soft).unwrap();
        let q = from_shares.probabilities(&queries);
        assert!(q.iter().zip(&p).all(|(a, b)| (a - b).abs() < 0.01), "{q:?} vs {p:?}");
        // Relabelling draws targets with those probabilities: 3000 rows of a = 2 (P = 0.9),
        // binomial sd √(3000·0.09) ≈ 16.4 rows; 5 sd.
        let mut rows: Vec<f32> = [0.0, 0.0, 1.0, 0.0].repeat(3000);
        let mut rng = <rand::rngs::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(3);
        model.relabel(&encoding, &mut rows, &mut rng);
        let ones = rows.chunks(4).filter(|r| r[3] == 1.0).count() as f64;
        let expected = 3000.0 * p[5];
        assert!((ones - expected).abs() < 5.0 * (3000.0 * p[5] * p[4]).sqrt(), "{ones} vs {expected}");
    }

    #[test]
    fn cholesky_solves_a_small_system() {
        // H = [[4, 2], [2, 3]], g = [2, 1] → s = [0.5, 0].
        let mut h = vec![4.0, 0.0, 2.0, 3.0];
        let s = solve_cholesky(&mut h, &[2.0, 1.0], 2);
        assert!((s[0] - 0.5).abs() < 1e-12 && s[1].abs() < 1e-12);
    }
}
