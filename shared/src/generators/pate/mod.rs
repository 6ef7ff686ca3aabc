//! PATE-TabTransGAN (Youssef & Woźniak): teacher ensembles on disjoint partitions judge
//! generated rows as real or fake; only a noisy aggregate of their votes leaves the
//! coordinator; a transformer student learns it and a generator learns to fool the student.
//!
//! - Teachers (`teacher`): one per partition, on the worker that holds it, refit every
//!   iteration on its real rows against as many generated rows. Each votes on every query
//!   with a number in [0, 1] (its probability that the row is real by default; the paper's
//!   hard vote is an option). A task returns, per query, the sum of its teachers' votes —
//!   never anything per teacher or per row.
//! - Aggregation (on the coordinator): one privacy unit lives in one partition, so it moves
//!   each query's real count by at most 1. Released per query: the GNMax label (N(0, σ²) on
//!   the real and on the fake count, label = the larger) or the noisy real share (N(0, σ²/2)
//!   on the real count). Both are the Gaussian mechanism on the vote margin: RDP α/σ² per
//!   answered query, charged data-independently. The paper's Eq. 2 is not a valid bound
//!   for Gaussian noise and is not used.
//! - Stopping rule: the number of iterations is the largest whose answered queries fit the
//!   job's ε under the ledger's accountant — a data-independent figure fixed before any
//!   vote, and charged in full before the first answer is released.
//! - Queries (public: drawn from the generator): some columns redrawn at random
//!   (exploration); with a target, half of them are the other half with the target changed,
//!   so the teachers say which target value fits a row better.
//! - Student and generator (`model`, `gan`) train on released answers only.

pub mod encoding;
pub mod gan;
pub mod model;
pub mod teacher;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::data::domain::Domain;
use crate::dpsgd::Examples;
use crate::privacy::accountant::{AccountingOptions, account};
use crate::privacy::mechanism::{Adjacency, Mechanism};
use crate::privacy::noise::Noise;
use crate::spec::{JobSpec, PateParams, PateRelease, TeacherVote};
use encoding::PateEncoding;
use teacher::{Features, Teacher, TeacherConfig};

/// Task kind of a vote round.
pub const TASK_KIND: &str = "pate_votes";

/// Errors building a PATE plan.
#[derive(Debug, thiserror::Error)]
#[error("pate generator: {0}")]
pub struct PlanError(String);

/// A PATE job's plan, fixed before any row is read.
#[derive(Clone, Debug)]
pub struct PatePlan {
    pub encoding: PateEncoding,
    pub params: PateParams,
    pub teachers: u32,
    pub sigma: f64,
    pub iterations: u32,
    /// Whether the unit count is released to size the output (no `[output] rows`).
    pub count: bool,
}

impl PatePlan {
    /// Validates the parameters and finds how many iterations the job's ε pays for.
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        let params = spec.generator.pate.clone();
        let teachers = spec.job.partitions;
        if teachers < 2 {
            return Err(PlanError("PATE needs at least 2 teachers ([job] partitions)".into()));
        }
        let sigma = params.sigma.unwrap_or(f64::from(teachers) / 5.0);
        let positive = [
            ("sigma", sigma),
            ("teacher_l2", params.teacher_l2),
            ("temperature", params.temperature),
            ("student_learning_rate", params.student_learning_rate),
            ("generator_learning_rate", params.generator_learning_rate),
            ("count_noise_multiplier", params.count_noise_multiplier),
        ];
        if let Some((name, v)) = positive.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
            return Err(PlanError(format!("{name} must be a positive number, got {v}")));
        }
        if !(0.0..=1.0).contains(&params.explore) {
            return Err(PlanError(format!("explore must be a probability, got {}", params.explore)));
        }
        let counts = [
            ("queries_per_iteration", params.queries_per_iteration as usize),
            ("fake_rows", params.fake_rows as usize),
            ("teacher_newton_steps", params.teacher_newton_steps as usize),
            ("teachers_per_task", params.teachers_per_task as usize),
            ("batch_size", params.batch_size),
            ("student_window", params.student_window as usize),
            ("latent", params.latent),
            ("generator_width", params.generator_width),
            ("layers", params.layers),
            ("heads", params.heads),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, v)| *v == 0) {
            return Err(PlanError(format!("{name} must be at least 1")));
        }
        if !params.d_model.is_multiple_of(params.heads) {
            return Err(PlanError(format!(
                "d_model ({}) must be a multiple of heads ({})",
                params.d_model, params.heads
            )));
        }
        if domain.columns.is_empty() {
            return Err(PlanError("the schema has no column to synthesise".into()));
        }
        let encoding = PateEncoding::new(domain, spec.schema.target.as_deref());
        let mut plan = Self { encoding, params, teachers, sigma, iterations: 0, count: spec.output.rows.is_none() };
        plan.iterations = plan.affordable_iterations(spec, options)?;
        Ok(plan)
    }

    /// Largest iteration count (≤ `max_iterations`) whose charge fits the job's (ε, δ).
    fn affordable_iterations(&self, spec: &JobSpec, options: &AccountingOptions) -> Result<u32, PlanError> {
        let fits = |t: u32| -> Result<bool, PlanError> {
            let cost = account(&self.mechanisms_for(t), spec.privacy.accountant, spec.privacy.delta, options)
                .map_err(|e| PlanError(e.to_string()))?;
            Ok(cost.epsilon <= spec.privacy.epsilon)
        };
        let cap = self.params.max_iterations.unwrap_or(1 << 20);
        if cap == 0 || !fits(1)? {
            return Err(PlanError(format!(
                "ε = {} does not pay for one iteration of {} queries at σ = {} (raise σ or ε, or lower queries_per_iteration)",
                spec.privacy.epsilon, self.params.queries_per_iteration, self.sigma
            )));
        }
        // ε grows with the number of answers: bisect on [fits, does not fit).
        let (mut lo, mut hi) = (1u32, 2u32);
        while hi <= cap && fits(hi)? {
            lo = hi;
            hi = hi.saturating_mul(2);
        }
        let mut hi = hi.min(cap.saturating_add(1));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? { lo = mid } else { hi = mid }
        }
        Ok(lo)
    }

    /// Queries answered over the whole run.
    pub fn queries(&self) -> u64 {
        u64::from(self.iterations) * u64::from(self.params.queries_per_iteration)
    }

    fn mechanisms_for(&self, iterations: u32) -> Vec<Mechanism> {
        let mut out = Vec::new();
        if self.count {
            out.push(Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: self.params.count_noise_multiplier,
                releases: 1,
                adjacency: Adjacency::AddRemove,
            });
        }
        let queries = u64::from(iterations) * u64::from(self.params.queries_per_iteration);
        out.push(match self.params.release {
            PateRelease::Label => Mechanism::GnMax { sigma: self.sigma, classes: 2, queries },
            // The real count (sensitivity 1) with N(0, σ²/2): the same cost as GNMax.
            PateRelease::VoteShare => Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: self.sigma / std::f64::consts::SQRT_2,
                releases: queries,
                adjacency: Adjacency::AddRemove,
            },
        });
        out
    }

    /// What the whole run is charged: [unit count,] GNMax × every planned query.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        self.mechanisms_for(self.iterations)
    }

    pub fn teacher_config(&self) -> TeacherConfig {
        TeacherConfig {
            l2: self.params.teacher_l2,
            newton_steps: self.params.teacher_newton_steps,
            target_interactions: self.params.target_interactions,
            vote: self.params.vote,
        }
    }
}

/// One vote round as a worker receives it; the generated rows follow as f32 features:
/// `fake_rows` rows for the teachers to train against, then `queries` rows to vote on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VoteTask {
    pub encoding: PateEncoding,
    pub teacher: TeacherConfig,
    /// Keys which generated rows each teacher trains against (not private).
    pub seed: [u8; 32],
    pub fake_rows: usize,
    pub queries: usize,
}

impl VoteTask {
    /// The teachers' real rows: a partition's rows, all of them (a unit lives in one
    /// teacher, so its row count does not change the sensitivity).
    pub async fn load_examples(&self, urls: &[String]) -> Result<Examples, crate::dpsgd::DpSgdError> {
        let encoding = &self.encoding;
        Examples::load(urls, &encoding.domain, u32::MAX, encoding.width, |batch, row, out| {
            encoding.encode_row(batch, row, out)
        })
        .await
    }

    /// The teacher of partition `url` fit on `real` and its votes on the queries, each in
    /// [0, 1]. Deterministic in (task, url, rows).
    pub fn teacher_votes(&self, url: &str, real: &Examples, generated: &[f32]) -> Result<Vec<f64>, String> {
        let w = self.encoding.width;
        if generated.len() != (self.fake_rows + self.queries) * w {
            return Err(format!(
                "expected {} generated features, got {}",
                (self.fake_rows + self.queries) * w,
                generated.len()
            ));
        }
        let (pool, queries) = generated.split_at(self.fake_rows * w);
        let n_real = real.x.len() / w;
        // As many generated rows as real ones (the pool permitting), drawn by a generator
        // keyed by the round and the partition: the same on any worker.
        let mut hasher = Sha256::new();
        hasher.update(self.seed);
        hasher.update(url.as_bytes());
        let mut rng = ChaCha8Rng::from_seed(hasher.finalize().into());
        let mut order: Vec<usize> = (0..self.fake_rows).collect();
        let m = n_real.min(self.fake_rows);
        for i in 0..m {
            let j = rng.random_range(i..self.fake_rows);
            order.swap(i, j);
        }
        let mut fake: Vec<f32> = order[..m].iter().flat_map(|&r| pool[r * w..(r + 1) * w].iter().copied()).collect();
        if let Some(slot) = self.encoding.target_slot().filter(|_| self.teacher.target_interactions) {
            // The partition's own rows with their target values shuffled among them are
            // fakes too: a steady lesson in which target value goes with which row, not
            // relative to the moving generator.
            let mut targets: Vec<usize> = (0..n_real).collect();
            for i in (1..n_real).rev() {
                targets.swap(i, rng.random_range(0..=i));
            }
            for (i, &j) in targets.iter().enumerate() {
                let mut row = real.x[i * w..(i + 1) * w].to_vec();
                row[slot.clone()].copy_from_slice(&real.x[j * w + slot.start..j * w + slot.end]);
                fake.extend(row);
            }
        }
        let features = Features::new(&self.encoding, &self.teacher);
        let teacher = Teacher::fit(features, &self.teacher, &real.x, &fake, w);
        Ok(teacher.votes(queries, w, self.teacher.vote))
    }
}

/// Checks a task's vote counts: one per query, each in [0, teachers] (a whole number
/// unless teachers vote with probabilities).
pub fn validate_votes(votes: &[f64], queries: usize, teachers: usize, rule: TeacherVote) -> Result<(), String> {
    if votes.len() != queries {
        return Err(format!("expected {queries} vote counts, got {}", votes.len()));
    }
    let whole = rule != TeacherVote::Probability;
    match votes.iter().find(|v| !((0.0..=teachers as f64).contains(*v) && (!whole || v.fract() == 0.0))) {
        Some(v) => {
            Err(format!("vote count {v} is not a {} in [0, {teachers}]", if whole { "whole number" } else { "number" }))
        }
        None => Ok(()),
    }
}

/// The release for each query's real-vote count (here and only here is the vote noise
/// drawn): the GNMax label (N(0, σ²) on each of the real and fake counts, 1 when the noisy
/// real count is larger) or the noisy real share (N(0, σ²/2) on the real count, ÷ k,
/// clamped to [0, 1]).
pub fn release(real_votes: &[f64], teachers: u32, sigma: f64, how: PateRelease, noise: &mut Noise) -> Vec<f32> {
    let k = f64::from(teachers);
    real_votes
        .iter()
        .map(|&real| match how {
            PateRelease::Label => f32::from(u8::from(real + noise.gaussian(sigma) > k - real + noise.gaussian(sigma))),
            PateRelease::VoteShare => {
                ((real + noise.gaussian(sigma / std::f64::consts::SQRT_2)) / k).clamp(0.0, 1.0) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::ChaCha20Rng;

    use super::*;
    use crate::privacy::math::normal_cdf;

    fn job(extra: &str, epsilon: f64) -> JobSpec {
        JobSpec::parse(
            &format!(
                r#"
                [job]
                dataset_id = "t"
                partitions = 100
                [input]
                urls = ["x.csv"]
                [schema]
                [[schema.columns]]
                name = "colour"
                kind = "categorical"
                categories = ["red", "green", "blue"]
                [privacy]
                epsilon = {epsilon}
                delta = 1e-5
                [generator]
                name = "pate"
                [generator.pate]
                {extra}
                [output]
                url = "out"
                rows = 10
                "#
            ),
            "test.toml",
        )
        .unwrap()
    }

    #[test]
    fn the_plan_answers_as_many_queries_as_the_budget_pays_for_and_no_more() {
        let options = AccountingOptions::default();
        let spec = job("sigma = 20.0\nqueries_per_iteration = 10\nrelease = \"label\"", 2.0);
        let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();
        let cost = |t| account(&plan.mechanisms_for(t), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!(plan.iterations > 1);
        assert!(cost(plan.iterations) <= 2.0 && cost(plan.iterations + 1) > 2.0);
        assert_eq!(plan.mechanisms(), vec![Mechanism::GnMax { sigma: 20.0, classes: 2, queries: plan.queries() }]);
        // The noisy vote share costs exactly what the label does.
        let share = job("sigma = 20.0\nqueries_per_iteration = 10\nrelease = \"vote_share\"", 2.0);
        let share = PatePlan::new(&share, &Domain::from_spec(&share), &options).unwrap();
        assert_eq!(share.iterations, plan.iterations);
        let share_cost = account(&share.mechanisms(), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!((share_cost - cost(plan.iterations)).abs() < 1e-12);
        // A budget that cannot pay one iteration is refused up front.
        let poor = job("sigma = 1.0\nqueries_per_iteration = 10", 0.1);
        let error = PatePlan::new(&poor, &Domain::from_spec(&poor), &options).unwrap_err().to_string();
        assert!(error.contains("does not pay for one iteration"), "{error}");
    }

    #[test]
    fn released_labels_and_shares_follow_their_noise_distributions() {
        let mut noise = Noise::with_rng(ChaCha20Rng::from_seed([11; 32]));
        let n = 20_000;
        // 30 of 40 teachers say real, σ = 10: P(label 1) = Φ((30 − 10) / (√2·10)).
        let labels = release(&vec![30.0; n], 40, 10.0, PateRelease::Label, &mut noise);
        let p = normal_cdf(20.0 / (std::f64::consts::SQRT_2 * 10.0));
        let observed = labels.iter().map(|&l| f64::from(l)).sum::<f64>() / n as f64;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!((observed - p).abs() < 5.0 * sd, "{observed} vs {p}");
        // 20 of 40: share 0.5 + N(0, (σ/√2/40)²), symmetric clamping keeps the mean.
        let shares = release(&vec![20.0; n], 40, 10.0, PateRelease::VoteShare, &mut noise);
        let mean = shares.iter().map(|&s| f64::from(s)).sum::<f64>() / n as f64;
        let sd = 10.0 / std::f64::consts::SQRT_2 / 40.0;
        assert!((mean - 0.5).abs() < 5.0 * sd / (n as f64).sqrt(), "{mean}");
        let var = shares.iter().map(|&s| (f64::from(s) - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((var.sqrt() - sd).abs() < 0.03 * sd, "{} vs {sd}", var.sqrt());
    }

    #[test]
    fn vote_counts_must_be_whole_and_within_the_teachers() {
        let whole = TeacherVote::Absolute;
        assert!(validate_votes(&[0.0, 3.0, 2.0], 3, 3, whole).is_ok());
        assert!(validate_votes(&[0.0, 4.0, 2.0], 3, 3, whole).is_err());
        assert!(validate_votes(&[0.5, 1.0, 2.0], 3, 3, whole).is_err());
        assert!(validate_votes(&[1.0, 2.0], 3, 3, whole).is_err());
        let graded = TeacherVote::Probability;
        assert!(validate_votes(&[0.5, 1.0, 2.9], 3, 3, graded).is_ok());
        assert!(validate_votes(&[0.5, f64::NAN, 2.0], 3, 3, graded).is_err());
        assert!(validate_votes(&[0.5, -0.1, 2.0], 3, 3, graded).is_err());
    }
}
