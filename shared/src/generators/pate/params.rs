//! `[generator.pate]`.

use serde::{Deserialize, Serialize};

use crate::generators::params::{DEFAULT_BINS, GeneratorParams, PublicInputs};

/// Parameters of the PATE-TabTransGAN generator (defaults: the paper's models; privacy
/// and loop settings chosen for sound, data-independent accounting).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PateParams {
    /// GNMax noise: standard deviation added to each of the two vote counts (real, fake);
    /// default: teachers / 5.
    pub sigma: Option<f64>,
    /// Generated rows the teachers label per iteration (B).
    pub queries_per_iteration: u32,
    /// Upper limit on iterations; the budget stops the run earlier when it runs out.
    pub max_iterations: Option<u32>,
    /// Generated rows sent per iteration; each teacher draws as many fakes as it has rows.
    pub fake_rows: u32,
    /// Teachers (partitions) per worker task; a task returns the sum of their votes.
    pub teachers_per_task: u32,
    /// What is released per query (see [`PateRelease`]).
    pub release: PateRelease,
    /// Probability that each column of a query is redrawn uniformly (exploration).
    pub explore: f64,
    /// What a teacher's vote means (see [`TeacherVote`]).
    pub vote: TeacherVote,
    /// The teachers' model (see [`TeacherModel`]).
    pub teacher: TeacherModel,
    /// Teachers' L2 penalty; Newton iterations of the logistic regression.
    pub teacher_l2: f64,
    pub teacher_newton_steps: u32,
    /// The MLP teacher: hidden tanh units and full-batch Adam steps.
    pub teacher_hidden: usize,
    pub teacher_mlp_steps: u32,
    /// Give the teachers the products of the target's indicator with every feature, so
    /// they see class-conditional structure (plain logistic regression on one-hot columns
    /// only sees each column's marginal).
    pub target_interactions: bool,
    /// Student (discriminator) and generator steps per iteration, on the labels released
    /// so far (post-processing).
    pub student_steps: u32,
    pub generator_steps: u32,
    /// The student learns the answers of the last this many iterations (the teachers judge
    /// against the generator of their iteration, so older answers go stale).
    pub student_window: u32,
    pub batch_size: usize,
    pub student_learning_rate: f64,
    pub generator_learning_rate: f64,
    /// Output rows are drawn from this many times as many generated rows, weighted by the
    /// student's odds of "real" (0: plain generator samples).
    pub reweight_pool: u32,
    /// Generator: latent width, residual blocks and their width; Gumbel-softmax temperature.
    pub latent: usize,
    pub generator_width: usize,
    pub generator_blocks: usize,
    pub temperature: f64,
    /// Student: token width, encoder layers and heads.
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    /// Noise multiplier of the unit-count release that sizes the output when `[output]
    /// rows` is not declared (sensitivity 1).
    pub count_noise_multiplier: f64,
    /// With a categorical target: the share of the answered queries spent on labelling
    /// generated rows (classic PATE): each teacher's classifier of the target votes its
    /// class probabilities, the noisy vote histogram trains a label model, and the label
    /// model draws the output rows' target. 0: the paper's real-or-generated queries only.
    pub label_share: f64,
    /// Confident GNMax (Papernot et al. 2018): a query is answered only when its largest
    /// vote count plus N(0, threshold_sigma²) reaches `threshold` (in teachers). Charged
    /// data-independently before the run: every query pays for its check (the Gaussian
    /// mechanism on the largest count, sensitivity 1) and for an answer (it may pass), so
    /// it filters uncertain answers out of what the models learn but saves no ε. None:
    /// every query is answered.
    pub threshold: Option<f64>,
    /// Noise of the threshold check (default: `sigma`).
    pub threshold_sigma: Option<f64>,
}

/// What the coordinator releases for each query. Both cost the same under the
/// data-independent analysis: GNMax over two classes with N(0, σ²) per count is a function
/// of the vote margin real − fake = 2·real − k plus N(0, 2σ²), i.e. of the real count plus
/// N(0, σ²/2) — the Gaussian mechanism at sensitivity 1, RDP α/σ² per query.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PateRelease {
    /// The GNMax label: 1 when the noisy real count beats the noisy fake count (the paper).
    Label,
    /// The noisy share of teachers voting "real", clamped to [0, 1]: the same release before
    /// its sign is taken, so the student also learns how strongly the teachers agree.
    VoteShare,
}

/// A PATE teacher's real-vs-generated model, refit from scratch on its partition every
/// iteration (target labels always use logistic regression).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeacherModel {
    /// L2-regularised logistic regression by Newton's method (the paper's).
    Logistic,
    /// One hidden tanh layer trained by full-batch Adam from a seeded start: sees
    /// non-linear structure (a value real only mid-range) at several times the cost.
    Mlp,
}

/// How a PATE teacher turns its real-vs-generated scores into votes on a batch of queries.
/// Whatever the rule, a teacher's vote on a query lies in [0, 1], so one unit (in one
/// teacher) moves each query's real count by at most 1: the privacy analysis is the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeacherVote {
    /// Its probability that the row is real: a graded vote. Early generated rows all look
    /// fake; hard votes are then all 0 and carry no direction, probabilities still rank
    /// the rows.
    Probability,
    /// 1 when it takes the row for real (probability above ½; the paper's rule).
    Absolute,
    /// 1 for the half of the batch it scores most real.
    Relative,
}

impl Default for PateParams {
    fn default() -> Self {
        Self {
            sigma: None,
            queries_per_iteration: 64,
            max_iterations: None,
            fake_rows: 512,
            teachers_per_task: 8,
            release: PateRelease::VoteShare,
            explore: 0.02,
            vote: TeacherVote::Probability,
            teacher: TeacherModel::Logistic,
            teacher_l2: 1.0,
            teacher_newton_steps: 6,
            teacher_hidden: 16,
            teacher_mlp_steps: 200,
            target_interactions: true,
            student_steps: 50,
            generator_steps: 10,
            student_window: 4,
            batch_size: 128,
            student_learning_rate: 1e-3,
            generator_learning_rate: 2e-4,
            reweight_pool: 4,
            latent: 128,
            generator_width: 256,
            generator_blocks: 3,
            temperature: 0.2,
            d_model: 64,
            layers: 3,
            heads: 4,
            count_noise_multiplier: 20.0,
            label_share: 0.25,
            threshold: None,
            threshold_sigma: None,
        }
    }
}

impl GeneratorParams for PateParams {
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    fn default_bins(&self) -> u32 {
        DEFAULT_BINS
    }

    fn draws_histories(&self) -> bool {
        false
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs::none()
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs::none()
    }
}
