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
//! - Confident GNMax (optional `threshold`): a query is answered only when its largest
//!   count plus N(0, σ₁²) reaches the threshold. The check is the Gaussian mechanism on the
//!   largest count (sensitivity 1) and is charged for every query, as is an answer (it may
//!   pass): under the data-independent charge it filters answers but saves nothing.
//! - Stopping rule: the number of iterations is the largest whose answered queries fit the
//!   job's ε under the ledger's accountant — a data-independent figure fixed before any
//!   vote, and charged in full before the first answer is released.
//! - Queries (public: drawn from the generator): some columns redrawn at random
//!   (exploration); with a target, half of them are the other half with the target changed,
//!   so the teachers say which target value fits a row better.
//! - Student and generator (`model`, `gan`) train on released answers only.
//! - Labels (a departure, `label_share` of the answers; on by default with a target): after
//!   the last iteration, the teachers fit a classifier of the target on their rows and
//!   vote its class probabilities on rows drawn as the output is drawn (classic PATE
//!   labelling). One unit moves one teacher's probability vector, by at most √2 in L2: the
//!   noisy histogram (N(0, σ²) per class) is GNMax's, at the same data-independent cost
//!   per answer. A label model fit to the released shares draws the output rows' target.

pub mod encoding;
pub mod gan;
pub mod model;
pub mod teacher;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{PlanError, require_columns, require_positive};
use crate::accounting::accountant::{AccountingOptions, account};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::Domain;
use crate::data::examples::Examples;
use crate::spec::{JobSpec, PateParams, PateRelease, TeacherVote};
use encoding::PateEncoding;
use teacher::{Features, TargetModel, Teacher, TeacherConfig};

/// This generator's name in plan errors.
const GENERATOR: &str = "pate";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// Task kind of a vote round.
pub const TASK_KIND: &str = "pate_votes";

/// What the teachers are asked about the query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Question {
    /// Is the row real or generated (one vote in [0, 1] per query)?
    Realness,
    /// Which target value goes with the rest of the row (a probability per target value)?
    Target,
}

/// A PATE job's plan, fixed before any row is read.
#[derive(Clone, Debug)]
pub struct PatePlan {
    pub encoding: PateEncoding,
    pub params: PateParams,
    pub teachers: u32,
    pub sigma: f64,
    /// Confident GNMax's check, when the spec asks for one.
    pub threshold: Option<Threshold>,
    pub iterations: u32,
    /// Target-label queries answered after the last iteration.
    pub label_queries: u64,
    /// Whether the unit count is released to size the output (no `[output] rows`).
    pub count: bool,
}

impl PatePlan {
    /// Validates the parameters and finds how many iterations the job's ε pays for.
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        let crate::spec::GeneratorSpec::Pate(params) = spec.generator.clone() else {
            return Err(invalid("the job's generator is another"));
        };
        let teachers = spec.job.partitions;
        if teachers < 2 {
            return Err(invalid("PATE needs at least 2 teachers ([job] partitions)"));
        }
        let sigma = params.sigma.unwrap_or(f64::from(teachers) / 5.0);
        let threshold =
            params.threshold.map(|count| Threshold { count, sigma: params.threshold_sigma.unwrap_or(sigma) });
        let positive = [
            ("sigma", sigma),
            ("threshold_sigma", threshold.map_or(1.0, |t| t.sigma)),
            ("teacher_l2", params.teacher_l2),
            ("temperature", params.temperature),
            ("student_learning_rate", params.student_learning_rate),
            ("generator_learning_rate", params.generator_learning_rate),
            ("count_noise_multiplier", params.count_noise_multiplier),
        ];
        require_positive(GENERATOR, &positive)?;
        if !(0.0..=1.0).contains(&params.explore) {
            return Err(invalid(format!("explore must be a probability, got {}", params.explore)));
        }
        if let Some(t) = params.threshold.filter(|t| !(t.is_finite() && *t > 0.0 && *t <= f64::from(teachers))) {
            return Err(invalid(format!("threshold must be a count of teachers in (0, {teachers}], got {t}")));
        }
        if !(0.0..1.0).contains(&params.label_share) {
            return Err(invalid(format!("label_share must be in [0, 1), got {}", params.label_share)));
        }
        let counts = [
            ("queries_per_iteration", params.queries_per_iteration as usize),
            ("fake_rows", params.fake_rows as usize),
            ("teacher_newton_steps", params.teacher_newton_steps as usize),
            ("teacher_hidden", params.teacher_hidden),
            ("teacher_mlp_steps", params.teacher_mlp_steps as usize),
            ("teachers_per_task", params.teachers_per_task as usize),
            ("batch_size", params.batch_size),
            ("student_window", params.student_window as usize),
            ("latent", params.latent),
            ("generator_width", params.generator_width),
            ("layers", params.layers),
            ("heads", params.heads),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(format!("{name} must be at least 1")));
        }
        if !params.d_model.is_multiple_of(params.heads) {
            return Err(invalid(format!(
                "d_model ({}) must be a multiple of heads ({})",
                params.d_model, params.heads
            )));
        }
        require_columns(GENERATOR, domain)?;
        let encoding = PateEncoding::new(domain, spec.schema.target.as_deref());
        let mut plan = Self {
            encoding,
            params,
            teachers,
            sigma,
            threshold,
            iterations: 0,
            label_queries: 0,
            count: spec.output.rows.is_none(),
        };
        plan.iterations = plan.affordable_iterations(spec, options)?;
        plan.label_queries = plan.label_queries_for(plan.iterations);
        Ok(plan)
    }

    /// Largest iteration count (≤ `max_iterations`) whose charge fits the job's (ε, δ).
    fn affordable_iterations(&self, spec: &JobSpec, options: &AccountingOptions) -> Result<u32, PlanError> {
        let fits = |t: u32| -> Result<bool, PlanError> {
            let cost = account(&self.mechanisms_for(t), spec.privacy.accountant, spec.privacy.delta, options)
                .map_err(|e| invalid(e.to_string()))?;
            Ok(cost.epsilon <= spec.privacy.epsilon)
        };
        let cap = self.params.max_iterations.unwrap_or(1 << 20);
        if cap == 0 || !fits(1)? {
            return Err(invalid(format!(
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

    /// Queries answered over the whole run (real-or-generated and target labels).
    pub fn queries(&self) -> u64 {
        u64::from(self.iterations) * u64::from(self.params.queries_per_iteration) + self.label_queries
    }

    /// Label queries beside `iterations` iterations: `label_share` of all answers (none
    /// without a categorical target).
    fn label_queries_for(&self, iterations: u32) -> u64 {
        if self.encoding.target_classes().is_none() {
            return 0;
        }
        let share = self.params.label_share;
        let realness = f64::from(iterations) * f64::from(self.params.queries_per_iteration);
        (realness * share / (1.0 - share)).round() as u64
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
        let labels = self.label_queries_for(iterations);
        if let Some(threshold) = self.threshold {
            // Every query's check, on its largest vote count (sensitivity 1).
            out.push(Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: threshold.sigma,
                releases: queries + labels,
                adjacency: Adjacency::AddRemove,
            });
        }
        if let (Some(classes), true) = (self.encoding.target_classes(), labels > 0) {
            out.push(Mechanism::GnMax { sigma: self.sigma, classes: classes as u32, queries: labels });
        }
        out.push(match self.params.release {
            PateRelease::Label => Mechanism::GnMax { sigma: self.sigma, classes: 2, queries },
            // The real count (sensitivity 1) with N(0, σ²/2): the same cost as GNMax.
            PateRelease::VoteShare => Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: self.share_noise(),
                releases: queries,
                adjacency: Adjacency::AddRemove,
            },
        });
        out
    }

    /// Noise multiplier of a vote-share release (σ/√2 on the real count: GNMax's cost).
    pub fn share_noise(&self) -> f64 {
        self.sigma / std::f64::consts::SQRT_2
    }

    /// What the whole run is charged: [unit count,] [confidence checks,] [target labels,]
    /// real-or-generated answers.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        self.mechanisms_for(self.iterations)
    }

    pub fn teacher_config(&self) -> TeacherConfig {
        TeacherConfig {
            model: self.params.teacher,
            l2: self.params.teacher_l2,
            newton_steps: self.params.teacher_newton_steps,
            hidden: self.params.teacher_hidden,
            mlp_steps: self.params.teacher_mlp_steps,
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
    pub question: Question,
    /// Generated rows to train against (0 for target questions).
    pub fake_rows: usize,
    pub queries: usize,
}

impl VoteTask {
    /// The teachers' real rows: a partition's rows, all of them (a unit lives in one
    /// teacher, so its row count does not change the sensitivity).
    pub async fn load_examples(&self, urls: &[String]) -> Result<Examples, crate::data::DataError> {
        let encoding = &self.encoding;
        Examples::load(urls, &encoding.domain, u32::MAX, encoding.width, |batch, row, out| {
            encoding.encode_row(batch, row, out)
        })
        .await
    }

    /// Numbers a teacher returns per query: 1 for realness, one per target value.
    pub fn votes_per_query(&self) -> usize {
        match self.question {
            Question::Realness => 1,
            Question::Target => self.encoding.target_classes().unwrap_or(0),
        }
    }

    /// Whether each teacher's votes are whole numbers (hard realness votes).
    pub fn whole_votes(&self) -> bool {
        self.question == Question::Realness && self.teacher.vote != TeacherVote::Probability
    }

    /// The teacher of partition `url` fit on `real` and its votes on the queries
    /// (`votes_per_query` each, each in [0, 1]). Deterministic in (task, url, rows).
    pub fn teacher_votes(&self, url: &str, real: &Examples, generated: &[f32]) -> Result<Vec<f64>, String> {
        match self.question {
            Question::Realness => self.realness_votes(url, real, generated),
            Question::Target => self.target_votes(real, generated),
        }
    }

    /// A target classifier fit on the partition's rows; its class probabilities per query.
    fn target_votes(&self, real: &Examples, queries: &[f32]) -> Result<Vec<f64>, String> {
        let w = self.encoding.width;
        let classes = self.encoding.target_classes().ok_or("a target question needs a categorical target")?;
        if queries.len() != self.queries * w {
            return Err(format!("expected {} query features, got {}", self.queries * w, queries.len()));
        }
        let mut labels = vec![0.0; real.x.len() / w * classes];
        for (x, l) in real.x.chunks(w).zip(labels.chunks_mut(classes)) {
            l[self.encoding.target_class(x).unwrap_or_default()] = 1.0;
        }
        let model = TargetModel::fit(&self.encoding, &self.teacher, &real.x, &labels)
            .ok_or("a target question needs a categorical target")?;
        Ok(model.probabilities(queries))
    }

    fn realness_votes(&self, url: &str, real: &Examples, generated: &[f32]) -> Result<Vec<f64>, String> {
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
        let teacher = Teacher::fit(features, &self.teacher, &real.x, &fake, w, &mut rng);
        Ok(teacher.votes(queries, w, self.teacher.vote))
    }
}

/// Checks a task's vote counts: `expected` of them, each in [0, teachers] (a whole number
/// when `whole`).
pub fn validate_votes(votes: &[f64], expected: usize, teachers: usize, whole: bool) -> Result<(), String> {
    if votes.len() != expected {
        return Err(format!("expected {expected} vote counts, got {}", votes.len()));
    }
    match votes.iter().find(|v| !((0.0..=teachers as f64).contains(*v) && (!whole || v.fract() == 0.0))) {
        Some(v) => {
            Err(format!("vote count {v} is not a {} in [0, {teachers}]", if whole { "whole number" } else { "number" }))
        }
        None => Ok(()),
    }
}

/// What a realness release is drawn on: under `Label`, each query's [real, generated]
/// vote histogram (GNMax over two classes); under `VoteShare`, each real count.
pub fn realness_votes(real_votes: &[f64], teachers: u32, how: PateRelease) -> Vec<f64> {
    let k = f64::from(teachers);
    match how {
        PateRelease::Label => real_votes.iter().flat_map(|&real| [real, k - real]).collect(),
        PateRelease::VoteShare => real_votes.to_vec(),
    }
}

/// The answers, from the released [`realness_votes`] (post-processing): the GNMax label (1
/// when the noisy real count is the larger) or the noisy real share (÷ k, clamped to [0, 1]).
pub fn realness_answers(noisy: &[f64], teachers: u32, how: PateRelease) -> Vec<f32> {
    match how {
        PateRelease::Label => noisy.chunks(2).map(|h| f32::from(u8::from(h[0] > h[1]))).collect(),
        PateRelease::VoteShare => noisy.iter().map(|&v| (v / f64::from(teachers)).clamp(0.0, 1.0) as f32).collect(),
    }
}

/// Each query's largest vote count: what confident GNMax's check is drawn on.
pub fn largest_votes(votes: &[f64], per_query: usize, teachers: u32) -> Vec<f64> {
    let k = f64::from(teachers);
    match per_query {
        // One realness count r stands for the histogram [r, k − r].
        1 => votes.iter().map(|&r| r.max(k - r)).collect(),
        n => votes.chunks(n).map(|c| c.iter().copied().fold(0.0, f64::max)).collect(),
    }
}

/// Confident GNMax's check: a query is answered when its largest vote count plus
/// N(0, `sigma`²) reaches `count` (teachers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub count: f64,
    pub sigma: f64,
}

impl Threshold {
    /// Which queries clear the threshold, given their released noisy largest counts.
    pub fn clears(&self, noisy_largest: &[f64]) -> Vec<bool> {
        noisy_largest.iter().map(|&c| c >= self.count).collect()
    }
}

/// Label shares from released class histograms (post-processing): negative counts as 0,
/// normalised; uniform if all are 0.
pub fn label_shares(noisy: &[f64], classes: usize) -> Vec<f64> {
    noisy
        .chunks(classes)
        .flat_map(|query| {
            let clipped: Vec<f64> = query.iter().map(|c| c.max(0.0)).collect();
            let total: f64 = clipped.iter().sum();
            clipped.into_iter().map(move |c| if total > 0.0 { c / total } else { 1.0 / classes as f64 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(extra: &str, epsilon: f64) -> JobSpec {
        JobSpec::parse(&job_text(extra, epsilon), "test.toml").unwrap()
    }

    fn job_text(extra: &str, epsilon: f64) -> String {
        format!(
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
        )
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
    fn label_queries_take_their_share_of_the_budget_at_the_same_cost_per_answer() {
        let options = AccountingOptions::default();
        let with_target = |extra: &str| {
            let spec = JobSpec::parse(
                &job_text(extra, 2.0).replace("[schema]\n", "[schema]\ntarget = \"colour\"\n"),
                "t.toml",
            )
            .unwrap();
            let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();
            (spec, plan)
        };
        let (spec, plan) = with_target("sigma = 20.0\nqueries_per_iteration = 10\nlabel_share = 0.25");
        let realness = u64::from(plan.iterations) * 10;
        assert_eq!(plan.label_queries, (realness as f64 / 3.0).round() as u64);
        assert_eq!(plan.queries(), realness + plan.label_queries);
        // The colour's 3 values and its missing bin.
        let classes = plan.encoding.target_classes().unwrap() as u32;
        assert_eq!(classes, 4);
        assert!(plan.mechanisms().contains(&Mechanism::GnMax { sigma: 20.0, classes, queries: plan.label_queries }));
        // Every answer costs the same: the charge is that of plan.queries() GNMax answers,
        // and it fits the job's ε.
        let per_query = vec![Mechanism::GnMax { sigma: 20.0, classes: 2, queries: 1 }; plan.queries() as usize];
        let all = account(&per_query, spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        let charged = account(&plan.mechanisms(), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!((all - charged).abs() < 1e-9 && charged <= 2.0, "{all} vs {charged}");
        // Without labels the realness queries get the whole budget.
        let (_, plain) = with_target("sigma = 20.0\nqueries_per_iteration = 10\nlabel_share = 0.0");
        assert_eq!(plain.label_queries, 0);
        assert!(plain.iterations > plan.iterations);
        assert!(plain.mechanisms().iter().all(|m| !matches!(m, Mechanism::GnMax { classes: 4, .. })));
    }

    #[test]
    fn a_confidence_threshold_charges_its_check_on_every_query() {
        let options = AccountingOptions::default();
        let base = "sigma = 20.0\nqueries_per_iteration = 10\nrelease = \"label\"";
        let plain = job(base, 2.0);
        let plain = PatePlan::new(&plain, &Domain::from_spec(&plain), &options).unwrap();
        let spec = job(&format!("{base}\nthreshold = 60.0\nthreshold_sigma = 30.0"), 2.0);
        let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();
        assert_eq!(
            plan.mechanisms(),
            vec![
                Mechanism::Gaussian {
                    l2_sensitivity: 1.0,
                    noise_multiplier: 30.0,
                    releases: plan.queries(),
                    adjacency: Adjacency::AddRemove
                },
                Mechanism::GnMax { sigma: 20.0, classes: 2, queries: plan.queries() },
            ]
        );
        // The checks are paid for out of the same ε: fewer queries fit.
        assert!(plan.iterations < plain.iterations);
        let cost = account(&plan.mechanisms(), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!(cost <= 2.0);
        for bad in ["threshold = 0.0", "threshold = 101.0", "threshold = 50.0\nthreshold_sigma = -1.0"] {
            let spec = job(&format!("{base}\n{bad}"), 2.0);
            assert!(PatePlan::new(&spec, &Domain::from_spec(&spec), &options).is_err(), "{bad}");
        }
        // The check keeps a query whose noisy largest count reaches the threshold.
        let threshold = Threshold { count: 60.0, sigma: 30.0 };
        assert_eq!(threshold.clears(&[59.9, 60.0, 75.0]), [false, true, true]);
    }

    /// What each release is drawn on, and the answers read from its noisy values (the
    /// noise's law is `dpsynth-privacy`'s to test).
    #[test]
    fn realness_and_label_answers_are_post_processing_of_their_releases() {
        let votes = [30.0, 10.0];
        assert_eq!(realness_votes(&votes, 40, PateRelease::Label), [30.0, 10.0, 10.0, 30.0]);
        assert_eq!(realness_votes(&votes, 40, PateRelease::VoteShare), votes);
        assert_eq!(realness_answers(&[31.0, 9.0, 12.0, 28.0], 40, PateRelease::Label), [1.0, 0.0]);
        assert_eq!(realness_answers(&[20.0, -3.0, 44.0], 40, PateRelease::VoteShare), [0.5, 0.0, 1.0]);
        assert_eq!(largest_votes(&votes, 1, 40), [30.0, 30.0]);
        assert_eq!(largest_votes(&[1.0, 5.0, 2.0, 3.0, 0.0, 0.0], 3, 8), [5.0, 3.0]);
        let shares = label_shares(&[-1.0, 3.0, 1.0, 0.0, -2.0, 0.0], 3);
        assert_eq!(shares, [0.0, 0.75, 0.25, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]);
    }

    #[test]
    fn vote_counts_must_be_whole_and_within_the_teachers() {
        let whole = true;
        assert!(validate_votes(&[0.0, 3.0, 2.0], 3, 3, whole).is_ok());
        assert!(validate_votes(&[0.0, 4.0, 2.0], 3, 3, whole).is_err());
        assert!(validate_votes(&[0.5, 1.0, 2.0], 3, 3, whole).is_err());
        assert!(validate_votes(&[1.0, 2.0], 3, 3, whole).is_err());
        let graded = false;
        assert!(validate_votes(&[0.5, 1.0, 2.9], 3, 3, graded).is_ok());
        assert!(validate_votes(&[0.5, f64::NAN, 2.0], 3, 3, graded).is_err());
        assert!(validate_votes(&[0.5, -0.1, 2.0], 3, 3, graded).is_err());
    }
}
