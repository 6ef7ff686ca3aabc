//! The post-processing half of PATE-TabTransGAN: the student learns the teachers' released
//! labels, the generator learns to fool the student (non-saturating loss). Nothing here
//! sees a private row; the randomness (latents, Gumbel noise, batches) is not private.

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::activation::softplus;
use burn::tensor::{Device, Tensor, TensorData};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal};

use super::encoding::{Head, PateEncoding};
use super::model::{Generator, GeneratorConfig, Student, StudentConfig, hard_features, soft_features};
use crate::generators::pate::PateParams;

/// The student, the generator and their optimizers.
pub struct PateGan {
    encoding: PateEncoding,
    params: PateParams,
    device: Device,
    student: Student,
    generator: Generator,
    student_optimizer: ModuleOptimizer,
    generator_optimizer: ModuleOptimizer,
    rng: ChaCha8Rng,
}

impl PateGan {
    /// `device` must be an autodiff device; `seed` keys the non-private randomness
    /// (latents, Gumbel noise, exploration, batches).
    pub fn new(encoding: PateEncoding, params: PateParams, device: Device, seed: [u8; 32]) -> Self {
        let widths = encoding.groups.iter().map(|g| g.width).collect();
        let student = StudentConfig::new(widths, params.d_model, params.layers, params.heads).init(&device);
        let generator =
            GeneratorConfig::new(encoding.width, params.latent, params.generator_width, params.generator_blocks)
                .init(&device);
        let adam = || AdamConfig::new().with_beta_1(0.5).with_beta_2(0.9).init();
        Self {
            encoding,
            params,
            device,
            student,
            generator,
            student_optimizer: adam(),
            generator_optimizer: adam(),
            rng: ChaCha8Rng::from_seed(seed),
        }
    }

    fn latent(&mut self, n: usize) -> Tensor<2> {
        let z: Vec<f32> = (0..n * self.params.latent).map(|_| StandardNormal.sample(&mut self.rng)).collect();
        Tensor::from_data(TensorData::new(z, [n, self.params.latent]), &self.device)
    }

    /// Gumbel noise for one-of heads, logistic noise for binary heads, 0 for unit heads.
    fn head_noise(&mut self, n: usize) -> Vec<f32> {
        let width = self.encoding.width;
        let mut g = vec![0.0f32; n * width];
        for row in g.chunks_mut(width) {
            for group in &self.encoding.groups {
                let mut offset = group.offset;
                for head in &group.heads {
                    let uniform = |rng: &mut ChaCha8Rng| rng.random_range(1e-6..1.0 - 1e-6f64);
                    match head {
                        Head::Unit => offset += 1,
                        Head::Binary => {
                            let u = uniform(&mut self.rng);
                            row[offset] = (u.ln() - (1.0 - u).ln()) as f32;
                            offset += 1;
                        }
                        Head::OneOf(k) => {
                            for v in &mut row[offset..offset + k] {
                                *v = -(-uniform(&mut self.rng).ln()).ln() as f32;
                            }
                            offset += k;
                        }
                    }
                }
            }
        }
        g
    }

    /// `n` generated rows as hard features (row-major), with the generator in inference mode.
    pub fn sample(&mut self, n: usize) -> Vec<f32> {
        let generator = self.generator.valid();
        let z = self.latent(n).inner();
        let raw = values(generator.forward(z));
        let g = self.head_noise(n);
        hard_features(&raw, &g, &self.encoding.groups, self.encoding.width)
    }

    /// `n` output rows: with `reweight_pool` = m > 0, m·n generated rows of which n are
    /// kept by weighted sampling without replacement, weights the student's odds s / (1 − s)
    /// (its estimate of p_real / p_generator; capped at 20× the median) — discriminator-
    /// driven resampling, which corrects what the generator still gets wrong where the
    /// student has learned it. With 0, plain generator samples.
    pub fn sample_output(&mut self, n: usize) -> Vec<f32> {
        let m = self.params.reweight_pool as usize;
        if m == 0 || n == 0 {
            return self.sample(n);
        }
        let w = self.encoding.width;
        let pool = self.sample(m * n);
        let student = self.student.valid();
        let mut odds = Vec::with_capacity(m * n);
        for chunk in pool.chunks(4096 * w) {
            let rows = chunk.len() / w;
            let x = Tensor::from_data(TensorData::new(chunk.to_vec(), [rows, w]), &self.device.clone().inner());
            // log odds = the student's logit.
            odds.extend(values(student.forward(x)).into_iter().map(f64::from));
        }
        let mut sorted = odds.clone();
        sorted.sort_by(f64::total_cmp);
        let cap = sorted[sorted.len() / 2] + 20f64.ln();
        // Efraimidis–Spirakis: keep the n largest u^(1/w), i.e. ln(u)/w.
        let mut keys: Vec<(f64, usize)> = odds
            .iter()
            .enumerate()
            .map(|(i, &logit)| {
                let u: f64 = self.rng.random_range(f64::MIN_POSITIVE..1.0);
                (u.ln() / logit.min(cap).exp(), i)
            })
            .collect();
        keys.sort_by(|a, b| b.0.total_cmp(&a.0));
        keys.iter().take(n).flat_map(|&(_, i)| pool[i * w..(i + 1) * w].iter().copied()).collect()
    }

    /// One student step on labelled rows (`y` = 1 for "real"): mean binary cross-entropy.
    /// Returns the loss.
    fn student_step(&mut self, x: Vec<f32>, y: Vec<f32>) -> f64 {
        let n = y.len();
        let x = Tensor::from_data(TensorData::new(x, [n, self.encoding.width]), &self.device);
        let y = Tensor::<1>::from_data(TensorData::new(y, [n]), &self.device);
        let logits = self.student.forward(x);
        // −[y log σ(l) + (1 − y) log(1 − σ(l))] = softplus(l) − y·l.
        let loss = (softplus(logits.clone(), 1.0) - logits * y).mean();
        let value = scalar(&loss);
        let grads = GradientsParams::from_grads(loss.backward(), &self.student);
        self.student = self.student_optimizer.step(self.params.student_learning_rate, self.student.clone(), grads);
        value
    }

    /// One generator step: relaxed samples scored by the student, loss −log σ(logit).
    /// Returns the loss.
    fn generator_step(&mut self) -> f64 {
        let n = self.params.batch_size;
        let z = self.latent(n);
        let g = self.head_noise(n);
        let g = Tensor::from_data(TensorData::new(g, [n, self.encoding.width]), &self.device);
        let x = soft_features(self.generator.forward(z), g, &self.encoding.groups, self.params.temperature);
        let loss = softplus(-self.student.forward(x), 1.0).mean();
        let value = scalar(&loss);
        // Only the generator's parameters step; the student's gradients are dropped.
        let grads = GradientsParams::from_grads(loss.backward(), &self.generator);
        self.generator =
            self.generator_optimizer.step(self.params.generator_learning_rate, self.generator.clone(), grads);
        value
    }

    /// `n` query rows for the teachers: generated rows, each column redrawn uniformly with
    /// probability `explore`; with a target, half of them are the other half with another
    /// target value.
    pub fn queries(&mut self, n: usize) -> Vec<f32> {
        let w = self.encoding.width;
        let fresh = if self.encoding.target.is_some() { n.div_ceil(2) } else { n };
        let mut rows = self.sample(fresh);
        for x in rows.chunks_mut(w) {
            self.encoding.explore(x, self.params.explore, &mut self.rng);
        }
        let others: Vec<f32> =
            rows.chunks(w).filter_map(|x| self.encoding.with_other_target(x)).flatten().take((n - fresh) * w).collect();
        rows.extend(others);
        rows
    }

    /// One iteration's post-processing: `student_steps` on minibatches of the released
    /// (row, label) pairs `x`, `y`, then `generator_steps`. Returns the last losses.
    pub fn fit_round(&mut self, x: &[f32], y: &[f32]) -> (f64, f64) {
        let w = self.encoding.width;
        let batch = self.params.batch_size.min(y.len());
        let mut losses = (f64::NAN, f64::NAN);
        for _ in 0..self.params.student_steps {
            let picks: Vec<usize> = (0..batch).map(|_| self.rng.random_range(0..y.len())).collect();
            let bx = picks.iter().flat_map(|&i| x[i * w..(i + 1) * w].iter().copied()).collect();
            let by = picks.iter().map(|&i| y[i]).collect();
            losses.0 = self.student_step(bx, by);
        }
        for _ in 0..self.params.generator_steps {
            losses.1 = self.generator_step();
        }
        losses
    }
}

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 data")
}

fn scalar(t: &Tensor<1>) -> f64 {
    f64::from(values(t.clone())[0])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::domain::{ColumnDomain, Domain, Encoding};

    #[test]
    fn the_generator_moves_to_what_the_answers_call_real() {
        let colour = ColumnDomain {
            name: "colour".into(),
            encoding: Encoding::Categorical {
                categories: vec!["red".into(), "green".into(), "blue".into()],
                other: false,
            },
            missing: false,
        };
        let encoding = PateEncoding::new(&Domain { columns: vec![colour] }, None);
        let params = PateParams {
            student_steps: 20,
            generator_steps: 20,
            generator_learning_rate: 1e-3,
            batch_size: 64,
            latent: 8,
            generator_width: 32,
            generator_blocks: 1,
            d_model: 16,
            layers: 1,
            heads: 2,
            ..PateParams::default()
        };
        let device = crate::dpsgd::compute_device().autodiff();
        // The backend's generator draws the initial weights: seeded, so the test is repeatable.
        device.seed(7);
        let mut gan = PateGan::new(encoding, params, device, [1; 32]);
        let red = |x: &[f32]| x.chunks(3).filter(|r| r[0] == 1.0).count() as f64 / (x.len() / 3) as f64;
        let before = red(&gan.sample(2000));
        // Answers (as a perfect, noiseless aggregate would give them): only red is real.
        for _ in 0..20 {
            let queries = gan.queries(128);
            let answers: Vec<f32> = queries.chunks(3).map(|r| r[0]).collect();
            gan.fit_round(&queries, &answers);
        }
        let after = red(&gan.sample(2000));
        assert!(before < 0.6 && after > 0.9, "share of red before {before}, after {after}");
        // Resampling by the student's odds keeps (here: sharpens) what it learned.
        let resampled = red(&gan.sample_output(2000));
        assert!(resampled >= after - 0.02, "resampled {resampled} vs {after}");
    }
}
