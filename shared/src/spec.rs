//! The job spec (TOML): what to read, its *public* schema, the privacy budget, the
//! generator and where to write. Everything here is declared public by the user; nothing
//! in it may be derived from the private rows without spending budget.

use std::collections::HashSet;

use chrono::{DateTime, NaiveDate, NaiveDateTime};
use serde::{Deserialize, Serialize};

use crate::accounting::Budget;
use crate::accounting::accountant::Accountant;

/// Errors in a job spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("job spec {path}: {message}")]
    Parse { path: String, message: String },
    #[error("job spec {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("invalid {what} {id:?}: use 1 to 128 letters, digits, '.', '_' and '-', not starting with '.'")]
    InvalidId { what: &'static str, id: String },
}

/// Checks a dataset or job id: ids name object-store prefixes (ledgers, scratch), so an
/// empty id (every prefix) or a path (`../x`) must never get through.
pub fn validate_id(what: &'static str, id: &str) -> Result<(), SpecError> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !id.starts_with('.');
    if valid { Ok(()) } else { Err(SpecError::InvalidId { what, id: id.to_string() }) }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub job: JobSection,
    /// Absent when the coordinator's operator declares the dataset's input (`serve
    /// --datasets`); required otherwise (see [`JobSpec::require_input`]).
    #[serde(default)]
    pub input: InputSpec,
    pub schema: SchemaSpec,
    pub privacy: PrivacySpec,
    pub generator: GeneratorSpec,
    #[serde(default)]
    pub output: OutputSpec,
    #[serde(default)]
    pub evaluation: Option<EvaluationSpec>,
    #[serde(default)]
    pub calibration: Option<CalibrationSpec>,
}

/// Marginal calibration (`[calibration]`; absent: off): a share of the job's ε buys noisy
/// 1-way tables (and the target's pairs) counted on the workers, and the generator's output
/// is reweighted to match them, then resampled. Charged in the generator's own entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalibrationSpec {
    /// The tables' Gaussian release costs this share of ρ, the zCDP budget that meets the
    /// job's (ε, δ) (Gaussian releases add up on that scale); the generator's noise is
    /// calibrated so that both compose to the job's (ε, δ).
    pub epsilon_share: f64,
    /// With a declared target, also its pair with every other column.
    pub target_pairs: bool,
    /// Units drawn per unit written: the pool the weights are fitted on.
    pub pool: u32,
    /// Rows a unit contributes to the tables (a reservoir in the worker).
    pub max_rows_per_unit: u32,
}

impl Default for CalibrationSpec {
    fn default() -> Self {
        Self { epsilon_share: 0.1, target_pairs: true, pool: 4, max_rows_per_unit: 1 }
    }
}

/// Evaluate the output at the end of the job (`report.json`, `report.html` beside it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluationSpec {
    /// Held-out real data, never used by the job (declared by the operator with the
    /// dataset under `serve --datasets`).
    #[serde(default)]
    pub test_urls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The protected dataset, i.e. which privacy ledger pays (e.g. `mimic-iv-ed-2026`).
    pub dataset_id: String,
    /// Job id; a fresh one is generated when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Disjoint partitions of the private data (by privacy unit).
    #[serde(default = "default_partitions")]
    pub partitions: u32,
}

fn default_partitions() -> u32 {
    4
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Csv,
    Parquet,
}

impl Format {
    /// By file extension: `.parquet`/`.pq` is Parquet, anything else CSV.
    pub fn detect(url: &str) -> Format {
        let lower = url.to_ascii_lowercase();
        if lower.ends_with(".parquet") || lower.ends_with(".pq") { Format::Parquet } else { Format::Csv }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSpec {
    /// Files to read: paths, `file://` or `s3://` URLs.
    pub urls: Vec<String>,
    /// Autodetected from the extension when absent.
    #[serde(default)]
    pub format: Option<Format>,
    #[serde(default)]
    pub csv: CsvOptions,
    /// What a row that breaks the schema does (absent: `fail`).
    #[serde(default)]
    pub bad_rows: Option<BadRows>,
}

/// What reading does with a row whose values break the schema (an undeclared category
/// under `unknown = "reject"`, a missing value under `missing = "reject"`, a value that does
/// not parse, a missing unit id).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadRows {
    /// The job stops with an error naming file, column and row (the data owner's `run`).
    #[default]
    Fail,
    /// The row is left out and counted in the operator's log. Leaving out a row depends on
    /// that row alone, so the job's guarantee covers it.
    Skip,
    /// The value is read as missing and counted in the operator's log; the row stays (a row
    /// without its unit id is left out). A coordinator serving declared datasets reads
    /// this way, with every column keeping missing values and undeclared categories in
    /// `__other__`: then the rows a job reads, and the work it does, do not depend on the
    /// schema its submitter chose (a failure, or a count of rows kept, would tell it whether
    /// rows break that schema).
    AsMissing,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CsvOptions {
    pub delimiter: char,
    /// Whether the first line names the columns. Without a header, the schema's columns
    /// are the file's columns, in order.
    pub has_header: bool,
    /// Spellings of a missing value (after trimming).
    pub null_values: Vec<String>,
    /// Lines starting with this are skipped (e.g. `|` in Adult's test file).
    pub comment: Option<char>,
    /// Strip spaces around values (Adult writes `, `).
    pub trim: bool,
    /// Suffix removed from values before matching (Adult's test labels end with `.`).
    pub strip_suffix: Option<String>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self {
            delimiter: ',',
            has_header: true,
            null_values: vec![String::new(), "NA".into()],
            comment: None,
            trim: true,
            strip_suffix: None,
        }
    }
}

impl CsvOptions {
    /// A cell's text as every reader of this file takes it (trimmed, suffix stripped),
    /// `None` when it spells a missing value.
    pub fn normalise<'a>(&self, cell: &'a str) -> Option<&'a str> {
        let mut v = cell;
        if self.trim {
            v = v.trim();
        }
        if let Some(suffix) = &self.strip_suffix {
            v = v.strip_suffix(suffix.as_str()).unwrap_or(v);
        }
        if self.null_values.iter().any(|n| n == v) { None } else { Some(v) }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaSpec {
    /// The privacy unit (e.g. a patient id); absent ⇒ each row is a unit.
    #[serde(default)]
    pub unit_column: Option<String>,
    /// Column the synthetic data is most often used to predict.
    #[serde(default)]
    pub target: Option<String>,
    /// The target's positive class for utility metrics (default: its last category).
    #[serde(default)]
    pub positive_class: Option<String>,
    /// Column ordering each unit's rows (e.g. a visit day), for longitudinal evaluation.
    #[serde(default)]
    pub order_by: Option<String>,
    pub columns: Vec<ColumnSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnKind {
    /// Real numbers within declared bounds.
    Continuous,
    /// Integers within declared bounds.
    Integer,
    /// One of the declared categories.
    Categorical,
    /// A timestamp within declared bounds (ISO 8601: a date, or a date and time after `T` or
    /// a space, with or without seconds, `Z` or an offset; or the column's `format`).
    Datetime,
    /// An identifier: never synthesised from data (the unit column gets synthetic ids).
    Identifier,
}

/// What to do with a value that is missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingPolicy {
    /// Missing is a value of its own, measured and synthesised like the others.
    #[default]
    Keep,
    /// A missing value is an input error.
    Reject,
}

/// What to do with a category that is not declared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPolicy {
    /// An undeclared category is an input error.
    #[default]
    Reject,
    /// Undeclared categories go to an explicit `__other__` bucket.
    Other,
}

/// Name of the bucket for undeclared categories.
pub const OTHER_CATEGORY: &str = "__other__";

/// A public bound: a number, or a date/time for datetime columns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bound {
    Number(f64),
    Text(String),
}

/// Public discretisation of a numeric column for count-based generators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bins {
    /// This many equal-width bins between the bounds.
    Count(u32),
    /// Explicit increasing edges, first = min and last = max.
    Edges(Vec<f64>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    pub name: String,
    pub kind: ColumnKind,
    #[serde(default)]
    pub min: Option<Bound>,
    #[serde(default)]
    pub max: Option<Bound>,
    #[serde(default)]
    pub categories: Option<Vec<String>>,
    #[serde(default)]
    pub unknown: UnknownPolicy,
    #[serde(default)]
    pub missing: MissingPolicy,
    #[serde(default)]
    pub bins: Option<Bins>,
    /// A datetime column's format in the files (chrono syntax, e.g. `"%d/%m/%Y %H:%M"`),
    /// for values no common form reads ([`parse_datetime`]); bounds stay in the common forms.
    #[serde(default)]
    pub format: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivacySpec {
    /// This job's ε and δ (charged to the dataset's ledger).
    pub epsilon: f64,
    pub delta: f64,
    #[serde(default = "default_accountant")]
    pub accountant: Accountant,
    /// Ledger store (path or URL); `--ledger` overrides it.
    #[serde(default)]
    pub ledger: Option<String>,
    /// The dataset's *total* budget, used only to create its ledger if none exists yet.
    #[serde(default)]
    pub dataset_budget: Option<Budget>,
}

fn default_accountant() -> Accountant {
    Accountant::Rdp
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratorName {
    Marginals,
    Aim,
    Findiff,
    Pate,
    Sequence,
    Dp2stage,
    Harmonic,
    HistoryCopula,
}

impl std::str::FromStr for GeneratorName {
    type Err = String;

    /// A name as `[generator] name` spells it.
    fn from_str(s: &str) -> Result<Self, String> {
        let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s);
        Self::deserialize(name).map_err(|e| e.to_string())
    }
}

impl GeneratorName {
    pub fn as_str(self) -> &'static str {
        match self {
            GeneratorName::Marginals => "marginals",
            GeneratorName::Aim => "aim",
            GeneratorName::Findiff => "findiff",
            GeneratorName::Pate => "pate",
            GeneratorName::Sequence => "sequence",
            GeneratorName::Dp2stage => "dp2stage",
            GeneratorName::Harmonic => "harmonic",
            GeneratorName::HistoryCopula => "history_copula",
        }
    }

    /// Whether the DP-SGD engine trains the generator's model.
    pub fn trained_by_dpsgd(self) -> bool {
        matches!(
            self,
            GeneratorName::Findiff | GeneratorName::Sequence | GeneratorName::Dp2stage | GeneratorName::Harmonic
        )
    }
}

/// The generator and its parameters. In TOML, `[generator] name = "…"` and at most the
/// named generator's own section (`[generator.pate]`): a section of another generator is
/// refused, never silently ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "GeneratorSection", into = "GeneratorSection")]
pub enum GeneratorSpec {
    Marginals(MarginalsParams),
    Aim(AimParams),
    Findiff(FinDiffParams),
    Pate(PateParams),
    Sequence(SequenceParams),
    Dp2stage(LanguageModelParams),
    Harmonic(LanguageModelParams),
    HistoryCopula(HistoryCopulaParams),
}

/// Bins of numeric columns that declare none, for every generator but marginals (whose
/// `default_bins` sets it).
const DEFAULT_BINS: u32 = 32;

impl GeneratorSpec {
    pub fn name(&self) -> GeneratorName {
        match self {
            GeneratorSpec::Marginals(_) => GeneratorName::Marginals,
            GeneratorSpec::Aim(_) => GeneratorName::Aim,
            GeneratorSpec::Findiff(_) => GeneratorName::Findiff,
            GeneratorSpec::Pate(_) => GeneratorName::Pate,
            GeneratorSpec::Sequence(_) => GeneratorName::Sequence,
            GeneratorSpec::Dp2stage(_) => GeneratorName::Dp2stage,
            GeneratorSpec::Harmonic(_) => GeneratorName::Harmonic,
            GeneratorSpec::HistoryCopula(_) => GeneratorName::HistoryCopula,
        }
    }

    /// Whether the generator draws whole histories (its output is counted in units), not
    /// rows.
    pub fn draws_histories(&self) -> bool {
        match self {
            GeneratorSpec::Sequence(_) | GeneratorSpec::HistoryCopula(_) => true,
            GeneratorSpec::Marginals(p) => p.history_rows.is_some(),
            _ => false,
        }
    }

    /// Bins of numeric columns that declare none (the public domain's discretisation).
    pub fn default_bins(&self) -> u32 {
        match self {
            GeneratorSpec::Marginals(p) => p.default_bins,
            GeneratorSpec::Aim(p) => p.default_bins,
            _ => DEFAULT_BINS,
        }
    }
}

/// `[generator]` as written.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GeneratorSection {
    name: GeneratorName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marginals: Option<MarginalsParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aim: Option<AimParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    findiff: Option<FinDiffParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pate: Option<PateParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sequence: Option<SequenceParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dp2stage: Option<LanguageModelParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    harmonic: Option<LanguageModelParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history_copula: Option<HistoryCopulaParams>,
}

impl TryFrom<GeneratorSection> for GeneratorSpec {
    type Error = String;

    fn try_from(s: GeneratorSection) -> Result<Self, String> {
        let given = [
            (GeneratorName::Marginals, s.marginals.is_some()),
            (GeneratorName::Aim, s.aim.is_some()),
            (GeneratorName::Findiff, s.findiff.is_some()),
            (GeneratorName::Pate, s.pate.is_some()),
            (GeneratorName::Sequence, s.sequence.is_some()),
            (GeneratorName::Dp2stage, s.dp2stage.is_some()),
            (GeneratorName::Harmonic, s.harmonic.is_some()),
            (GeneratorName::HistoryCopula, s.history_copula.is_some()),
        ];
        if let Some((other, _)) = given.iter().find(|(n, present)| *present && *n != s.name) {
            return Err(format!(
                "[generator.{}] belongs to another generator; this job's generator is \"{}\"",
                other.as_str(),
                s.name.as_str()
            ));
        }
        Ok(match s.name {
            GeneratorName::Marginals => GeneratorSpec::Marginals(s.marginals.unwrap_or_default()),
            GeneratorName::Aim => GeneratorSpec::Aim(s.aim.unwrap_or_default()),
            GeneratorName::Findiff => GeneratorSpec::Findiff(s.findiff.unwrap_or_default()),
            GeneratorName::Pate => GeneratorSpec::Pate(s.pate.unwrap_or_default()),
            GeneratorName::Sequence => GeneratorSpec::Sequence(s.sequence.unwrap_or_default()),
            GeneratorName::Dp2stage => GeneratorSpec::Dp2stage(s.dp2stage.unwrap_or_default()),
            GeneratorName::Harmonic => GeneratorSpec::Harmonic(s.harmonic.unwrap_or_default()),
            GeneratorName::HistoryCopula => GeneratorSpec::HistoryCopula(s.history_copula.unwrap_or_default()),
        })
    }
}

impl From<GeneratorSpec> for GeneratorSection {
    fn from(spec: GeneratorSpec) -> Self {
        let name = spec.name();
        let mut section = GeneratorSection {
            name,
            marginals: None,
            aim: None,
            findiff: None,
            pate: None,
            sequence: None,
            dp2stage: None,
            harmonic: None,
            history_copula: None,
        };
        match spec {
            GeneratorSpec::Marginals(p) => section.marginals = Some(p),
            GeneratorSpec::Aim(p) => section.aim = Some(p),
            GeneratorSpec::Findiff(p) => section.findiff = Some(p),
            GeneratorSpec::Pate(p) => section.pate = Some(p),
            GeneratorSpec::Sequence(p) => section.sequence = Some(p),
            GeneratorSpec::Dp2stage(p) => section.dp2stage = Some(p),
            GeneratorSpec::Harmonic(p) => section.harmonic = Some(p),
            GeneratorSpec::HistoryCopula(p) => section.history_copula = Some(p),
        }
        section
    }
}

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

/// Parameters of the DP-FinDiff generator (defaults: the paper's, except as noted).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FinDiffParams {
    /// Expected passes over the data; T = epochs / q steps.
    pub epochs: f64,
    /// Expected batch size q·N̂ (the paper's 128).
    pub batch_size: f64,
    /// Per-unit L2 clipping norm C.
    pub clip: f64,
    /// Noise multiplier σ; default: calibrated so the job meets its (ε, δ).
    pub noise_multiplier: Option<f64>,
    /// Noise multiplier of the unit-count release that fixes q (sensitivity 1).
    pub count_noise_multiplier: f64,
    /// Rows a unit contributes (the unit's rows are summed before clipping).
    pub max_rows_per_unit: u32,
    /// Denoiser width (paper: 512; 256 trains about 3× faster on a CPU at similar utility).
    pub hidden: usize,
    pub blocks: usize,
    pub time_embedding: usize,
    /// Width of each categorical value's frozen embedding.
    pub embedding_width: usize,
    pub diffusion_steps: u32,
    pub beta_start: f64,
    pub beta_end: f64,
    /// Adaptive timestep sampler P_k(t) ∝ t^α_k, α from `alpha_start` to `alpha_end`.
    pub alpha_start: f64,
    pub alpha_end: f64,
    pub optimizer: crate::dpsgd::optimizer::OptimizerSpec,
    pub schedule: crate::dpsgd::optimizer::Schedule,
    /// Respaced ancestral sampling steps (≤ diffusion_steps).
    pub sampling_steps: u32,
    /// Units per backward pass on a worker (memory only).
    pub micro_batch: usize,
    /// Rounds between coordinator checkpoints.
    pub checkpoint_every: u64,
}

impl Default for FinDiffParams {
    fn default() -> Self {
        Self {
            epochs: 20.0,
            batch_size: 128.0,
            clip: 1.0,
            noise_multiplier: None,
            count_noise_multiplier: 20.0,
            max_rows_per_unit: 1,
            hidden: 256,
            blocks: 2,
            time_embedding: 64,
            embedding_width: 2,
            diffusion_steps: 500,
            beta_start: 1e-4,
            beta_end: 0.02,
            alpha_start: 3.0,
            alpha_end: -1.0,
            optimizer: crate::dpsgd::optimizer::OptimizerSpec::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            schedule: crate::dpsgd::optimizer::Schedule::Cosine,
            sampling_steps: 100,
            micro_batch: 256,
            checkpoint_every: 100,
        }
    }
}

/// Parameters of the sequence generator: whole unit histories as token sequences, a
/// decoder-only transformer trained with user-level DP-SGD (defaults train the demo's
/// 10,000 ICU patients in minutes on 2 CPU cores).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SequenceParams {
    /// Columns that hold one value per unit, written once per history (from its first row).
    pub static_columns: Vec<String>,
    /// Rows of a history the model sees (its first ones in order) and the most a synthetic
    /// history has.
    pub max_rows: usize,
    /// Rows of a training window that carry the loss, and rows of context before them.
    pub window_rows: usize,
    pub context_rows: usize,
    /// Probability that a training window starts at the history's beginning.
    pub p_start: f64,
    /// Refinement tokens within a numeric bin.
    pub fine: u32,
    /// Geometric bins of the gap between consecutive order values.
    pub gap_bins: u32,
    /// Transformer: width, attention heads, blocks, MLP hidden width.
    pub width: usize,
    pub heads: usize,
    pub layers: usize,
    pub mlp: usize,
    /// Expected passes over the units; T = epochs / q rounds.
    pub epochs: f64,
    /// Expected units per round q·N̂.
    pub batch_size: f64,
    /// Per-unit L2 clipping norm C.
    pub clip: f64,
    /// Noise multiplier σ; default: calibrated so the job meets its (ε, δ).
    pub noise_multiplier: Option<f64>,
    /// Noise multiplier of the unit-count release that fixes q (sensitivity 1).
    pub count_noise_multiplier: f64,
    pub optimizer: crate::dpsgd::optimizer::OptimizerSpec,
    pub schedule: crate::dpsgd::optimizer::Schedule,
    /// Units per backward pass on a worker (memory only).
    pub micro_batch: usize,
    /// Rounds between coordinator checkpoints.
    pub checkpoint_every: u64,
    /// Softmax temperature of sampling (post-processing; below 1 draws nearer the model's
    /// modes, trading diversity for typicality).
    pub temperature: f64,
    /// ε of the private selection among over-generated histories, part of the job's ε
    /// (its noise is calibrated to it alone; the run's σ to what is left); absent: none.
    pub select_epsilon: Option<f64>,
    /// Candidates drawn per output unit for the selection.
    pub select_candidates: f64,
    /// Votes a unit casts, for its nearest candidates (L2 sensitivity √k).
    pub select_neighbours: usize,
    /// Share of the job's budget (in zCDP terms, where Gaussian releases add up) spent on
    /// the released histogram of history lengths (one cell per length up to `max_rows`,
    /// sensitivity 1 under add/remove) that synthetic histories take their lengths from;
    /// the run's σ is calibrated to the rest. 0: the model draws lengths (it learns them
    /// only from windows that start a history).
    pub length_share: f64,
}

impl Default for SequenceParams {
    fn default() -> Self {
        Self {
            static_columns: Vec::new(),
            max_rows: 50,
            window_rows: 8,
            context_rows: 2,
            p_start: 0.25,
            fine: 8,
            gap_bins: DEFAULT_GAP_BINS,
            width: 64,
            heads: 4,
            layers: 2,
            mlp: 128,
            epochs: 8.0,
            batch_size: 256.0,
            clip: 1.0,
            noise_multiplier: None,
            count_noise_multiplier: 20.0,
            optimizer: crate::dpsgd::optimizer::OptimizerSpec::Adam { lr: 3e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            schedule: crate::dpsgd::optimizer::Schedule::Cosine,
            micro_batch: 64,
            checkpoint_every: 50,
            temperature: 1.0,
            select_epsilon: None,
            select_candidates: 4.0,
            select_neighbours: 4,
            length_share: 0.05,
        }
    }
}

/// Parameters of the history copula: whole histories drawn from a Gaussian copula whose
/// latent normals follow a VAR(1), fitted to two released rounds of bounded per-unit
/// statistics (margins, then same-row and lag-1 moments) and a length histogram.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryCopulaParams {
    /// Columns that hold one value per unit: modelled with the rest, written from the
    /// history's first row on every row.
    pub static_columns: Vec<String>,
    /// Rows of a history read (its first ones in order), and the most a drawn one has.
    pub max_rows: usize,
    /// Geometric bins of the gap between consecutive order values.
    pub gap_bins: u32,
    /// Shares of the job's budget (zCDP terms, where Gaussian releases add up) spent on
    /// the margins and on the length histogram; the moments get the rest.
    pub margin_share: f64,
    pub length_share: f64,
    /// L2 bound of one unit's moments vector; default: the number of modelled columns.
    pub moment_clip: Option<f64>,
}

impl Default for HistoryCopulaParams {
    fn default() -> Self {
        Self {
            static_columns: Vec::new(),
            max_rows: 50,
            gap_bins: DEFAULT_GAP_BINS,
            margin_share: 0.3,
            length_share: 0.05,
            moment_clip: None,
        }
    }
}

/// Parameters of the language-model generators: a pretrained model fine-tuned on rows as
/// text, first without privacy on public examples (stage 1), then with DP-SGD on the
/// private rows. DP-2Stage's stage 1 reads pseudo rows from the declared domain; HARMONIC
/// (`reference`, `neighbours`) prompts each row with its nearest rows of a public reference
/// set and trains stage 1 on the reference set itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LanguageModelParams {
    /// The pretrained checkpoint: a GGUF file, or a folder holding `config.json`,
    /// `model.safetensors` and `tokenizer.json` (a path or an object-store URL; never a hub).
    pub checkpoint: String,
    /// Keep the checkpoint's first blocks only (all by default): a smaller model for CPUs.
    pub blocks: Option<usize>,
    /// LoRA adapters (`lora = {}` for the defaults); absent: every parameter is fine-tuned.
    pub lora: Option<LoraParams>,
    /// λ, the loss weight of value tokens (the format's tokens get 1 − λ).
    pub value_weight: f64,
    /// A public table or a rhosynth release (e.g. a marginals job's output) in this job's
    /// schema, never private data: HARMONIC's prompts come from it (required), and stage 1
    /// trains on it (DP-2Stage: instead of pseudo rows, if named).
    pub reference: Option<String>,
    /// HARMONIC: the reference set's first rows that are read (a release's rows are in
    /// random order).
    pub reference_rows: usize,
    /// HARMONIC: k, the reference rows each example is prompted with.
    pub neighbours: usize,
    /// Stage 1: examples (DP-2Stage: pseudo rows drawn uniformly from the declared domain,
    /// or the reference set's rows; HARMONIC: reference rows, each prompted with its nearest
    /// other reference rows), rows
    /// a step, passes and Adam's learning rate (no privacy cost: it reads no private data).
    pub pseudo_rows: usize,
    pub pseudo_batch: usize,
    pub pseudo_epochs: f64,
    pub pseudo_learning_rate: f64,
    /// Rows a unit contributes (its rows share one clipped gradient).
    pub max_rows_per_unit: u32,
    /// Expected passes over the units; T = epochs / q rounds.
    pub epochs: f64,
    /// Expected units per round q·N̂.
    pub batch_size: f64,
    /// Per-unit L2 clipping norm C.
    pub clip: f64,
    /// Noise multiplier σ; default: calibrated so the job meets its (ε, δ).
    pub noise_multiplier: Option<f64>,
    /// Noise multiplier of the unit-count release that fixes q (sensitivity 1).
    pub count_noise_multiplier: f64,
    pub optimizer: crate::dpsgd::optimizer::OptimizerSpec,
    pub schedule: crate::dpsgd::optimizer::Schedule,
    /// Units per backward pass on a worker (memory only).
    pub micro_batch: usize,
    /// Rounds between coordinator checkpoints.
    pub checkpoint_every: u64,
    /// Softmax temperature of each sampled value token (post-processing).
    pub temperature: f64,
}

impl Default for LanguageModelParams {
    fn default() -> Self {
        Self {
            checkpoint: String::new(),
            blocks: None,
            lora: None,
            value_weight: 0.65,
            reference: None,
            reference_rows: 10_000,
            neighbours: 3,
            pseudo_rows: 2000,
            pseudo_batch: 32,
            pseudo_epochs: 2.0,
            pseudo_learning_rate: 1e-3,
            max_rows_per_unit: 1,
            epochs: 2.0,
            batch_size: 256.0,
            clip: 1.0,
            noise_multiplier: None,
            count_noise_multiplier: 20.0,
            optimizer: crate::dpsgd::optimizer::OptimizerSpec::Adam { lr: 3e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            schedule: crate::dpsgd::optimizer::Schedule::Cosine,
            micro_batch: 32,
            checkpoint_every: 50,
            temperature: 1.0,
        }
    }
}

/// LoRA adapters of a pretrained model: rank, scale α (the update is scaled by α / rank)
/// and the linears they adapt (`qkv`, `output`, `up`, `down`, `head`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraParams {
    pub rank: usize,
    pub alpha: f64,
    pub targets: Vec<String>,
}

impl Default for LoraParams {
    fn default() -> Self {
        Self { rank: 8, alpha: 16.0, targets: vec!["qkv".into(), "output".into()] }
    }
}

/// Parameters of the DP marginals generator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MarginalsParams {
    /// Rows a unit may contribute; a unit with more is subsampled inside its worker.
    pub max_rows_per_unit: u32,
    /// Two-way marginals to measure, as `[column, column]` pairs (any graph: the fitted
    /// model handles cycles, within a clique-size limit). Default: a star around the
    /// target column, or a chain in column order without a target; with `history_rows`,
    /// none (a pair is then measured within every step).
    pub pairs: Option<Vec<[String; 2]>>,
    /// Bins for numeric columns without `bins` (integer columns with at most this many
    /// values get one bin per value).
    pub default_bins: u32,
    /// PATH's "Direct" baseline: each unit's first `history_rows` rows (in `order_by`
    /// order) as one flattened row, measured as every step's 1-way tables and each
    /// column's table of adjacent steps; the output is whole histories.
    pub history_rows: Option<u32>,
    /// With `history_rows`: columns holding one value per unit, measured once (from its
    /// first row) and written on every row of a history.
    pub static_columns: Vec<String>,
    /// With `history_rows`: geometric bins of the gap between consecutive order values
    /// (default [`DEFAULT_GAP_BINS`]).
    pub gap_bins: Option<u32>,
}

impl Default for MarginalsParams {
    fn default() -> Self {
        Self {
            max_rows_per_unit: 1,
            pairs: None,
            default_bins: DEFAULT_BINS,
            history_rows: None,
            static_columns: Vec::new(),
            gap_bins: None,
        }
    }
}

/// Most steps a flattened history may have (`history_rows`).
pub const MAX_HISTORY_ROWS: u32 = 1000;

/// Bins of the gap between consecutive order values, unless a generator's `gap_bins` says.
pub const DEFAULT_GAP_BINS: u32 = 20;

/// Most bins of the gap between consecutive order values (`gap_bins`).
pub const MAX_GAP_BINS: u32 = 64;

/// AIM's workload: a rule over the declared columns, or the column sets themselves.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Workload {
    Rule(WorkloadRule),
    Sets(Vec<Vec<String>>),
}

impl<'de> Deserialize<'de> for Workload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Rule(String),
            Sets(Vec<Vec<String>>),
        }
        match Written::deserialize(deserializer) {
            Ok(Written::Sets(sets)) => Ok(Workload::Sets(sets)),
            Ok(Written::Rule(rule)) => {
                let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(&rule);
                WorkloadRule::deserialize(name).map(Workload::Rule).map_err(|_| {
                    serde::de::Error::custom(format!(
                        "workload \"{rule}\": \"auto\", \"all-pairs\", \"all-triples\" or a list of column sets"
                    ))
                })
            }
            Err(_) => Err(serde::de::Error::custom(
                "workload: \"auto\", \"all-pairs\", \"all-triples\" or a list of column sets, e.g. [[\"age\", \"sex\"]]",
            )),
        }
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload::Rule(WorkloadRule::Auto)
    }
}

/// A workload from the schema alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadRule {
    /// Every triple while the candidate tables fit AIM's cell budget; past it every pair,
    /// then the triples of smallest tables first while they fit.
    Auto,
    AllPairs,
    AllTriples,
}

/// Parameters of the AIM generator (adaptive marginals with graphical-model inference).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AimParams {
    /// Rows a unit may contribute; a unit with more is subsampled inside its worker.
    pub max_rows_per_unit: u32,
    /// The marginals the output should preserve: `"auto"` (the default), `"all-pairs"`,
    /// `"all-triples"`, or column sets; every subset of a set is a candidate measurement.
    pub workload: Workload,
    /// Selection rounds T at the start (annealing may end the run sooner); default 16·d.
    pub rounds: Option<u32>,
    /// Share of each round's budget spent on selection (the rest on measurement). AIM's
    /// 0.1: the paper's α = 0.9 is the measurement's share.
    pub selection_share: f64,
    /// The most cells the model's cliques may hold together once the budget is spent; a
    /// candidate is eligible while the model with it stays within the spent share of it.
    pub max_model_cells: f64,
    /// Mirror-descent steps of each round's fit (the last fit takes ten times as many).
    pub fit_iterations: u32,
    /// Bins for numeric columns without `bins`.
    pub default_bins: u32,
    /// Share of ρ spent, before the adaptive rounds, on measuring every pair of the
    /// schema's target with another column (the downstream use the spec declares).
    /// Default: 0.2 with a target, else 0.
    pub target_share: Option<f64>,
}

impl Default for AimParams {
    fn default() -> Self {
        Self {
            max_rows_per_unit: 1,
            workload: Workload::default(),
            rounds: None,
            selection_share: 0.1,
            max_model_cells: 1e6,
            fit_iterations: 100,
            default_bins: DEFAULT_BINS,
            target_share: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Output prefix (path, `file://` or `s3://`); `--output` overrides it. `{dataset_id}`
    /// and `{job_id}` are filled in. Default: `./rhosynth-out/{dataset_id}/{job_id}`; a
    /// served job that names none writes under its submitter's `output_root`.
    #[serde(default = "default_output_url")]
    pub url: String,
    /// Synthetic rows; default: the DP estimate of the input's size released by the job.
    /// (A generator of whole histories counts units instead: `units`.)
    #[serde(default)]
    pub rows: Option<u64>,
    /// Synthetic units (histories), for a generator of whole histories; default: the DP
    /// estimate of the input's unit count released by the job.
    #[serde(default)]
    pub units: Option<u64>,
    #[serde(default = "default_rows_per_part")]
    pub rows_per_part: u64,
}

fn default_rows_per_part() -> u64 {
    50_000
}

/// Where a job that names no output writes: its own folder under the working directory.
pub const DEFAULT_OUTPUT_URL: &str = "./rhosynth-out/{dataset_id}/{job_id}";

fn default_output_url() -> String {
    DEFAULT_OUTPUT_URL.to_string()
}

impl Default for OutputSpec {
    fn default() -> Self {
        Self { url: default_output_url(), rows: None, units: None, rows_per_part: default_rows_per_part() }
    }
}

impl OutputSpec {
    /// The prefix with its dataset and job filled in.
    pub fn url_for(&self, dataset_id: &str, job_id: &str) -> String {
        self.url.replace("{dataset_id}", dataset_id).replace("{job_id}", job_id)
    }

    /// What every job's prefix starts with (up to a `{job_id}`): for overlap checks.
    pub fn root(&self, dataset_id: &str) -> String {
        let url = self.url.replace("{dataset_id}", dataset_id);
        url.split("{job_id}").next().unwrap_or_default().to_string()
    }

    /// Whether the spec names no output (the default).
    pub fn is_default(&self) -> bool {
        self.url == DEFAULT_OUTPUT_URL
    }
}

/// Parses a date/time bound or value to seconds since the Unix epoch: the ISO 8601 forms
/// people's files hold (date only; a time after `T` or a space, with or without seconds
/// and fractions; `Z` or an offset, else UTC).
pub fn parse_datetime(s: &str) -> Option<f64> {
    let s = s.trim();
    let seconds =
        |t: DateTime<chrono::FixedOffset>| t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) * 1e-6;
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(seconds(t));
    }
    // `Z` as the zero offset, so one set of forms reads both.
    let zoned = s.strip_suffix('Z').or_else(|| s.strip_suffix('z')).map(|t| format!("{t}+00:00"));
    for sep in ['T', ' '] {
        for time in ["%H:%M:%S%.f", "%H:%M"] {
            let naive = format!("%Y-%m-%d{sep}{time}");
            if let Some(z) = &zoned {
                if let Ok(t) = DateTime::parse_from_str(z, &format!("{naive}%:z")) {
                    return Some(seconds(t));
                }
            } else if let Ok(t) = DateTime::parse_from_str(s, &format!("{naive}%:z")) {
                return Some(seconds(t));
            } else if let Ok(t) = NaiveDateTime::parse_from_str(s, &naive) {
                return Some(t.and_utc().timestamp() as f64 + f64::from(t.and_utc().timestamp_subsec_micros()) * 1e-6);
            }
        }
    }
    NaiveDate::parse_from_str(s, "%Y-%m-%d").ok().map(|d| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp() as f64)
}

/// Longest datetime `format` accepted.
const MAX_FORMAT_LEN: usize = 64;

/// A declared datetime `format` must be chrono syntax, short, without epoch seconds (`%s`),
/// and read back an instant it writes (its date, for a format without a time): else every
/// value would fail, or be read wrong, only once the job runs.
fn check_datetime_format(format: &str) -> Result<(), String> {
    use chrono::format::{Item, StrftimeItems};
    if format.len() > MAX_FORMAT_LEN || format.contains("%s") {
        return Err(format!("must be at most {MAX_FORMAT_LEN} characters, without %s"));
    }
    if StrftimeItems::new(format).any(|item| matches!(item, Item::Error)) {
        return Err(format!("'{format}' is not chrono syntax"));
    }
    let instant = NaiveDate::from_ymd_opt(2001, 2, 3).unwrap().and_hms_opt(4, 5, 6).unwrap();
    let written = instant.format(format).to_string();
    let midnight = instant.date().and_hms_opt(0, 0, 0).unwrap();
    let read = parse_datetime_as(&written, format);
    let at = |t: NaiveDateTime| Some(t.and_utc().timestamp() as f64);
    let minute = instant.date().and_hms_opt(4, 5, 0).unwrap();
    if read != at(instant) && read != at(midnight) && read != at(minute) {
        return Err(format!("'{format}' does not read back the dates it writes (a date, and a time if any)"));
    }
    Ok(())
}

/// Parses a value in a declared chrono `format` (a date and time, or a date alone).
pub fn parse_datetime_as(s: &str, format: &str) -> Option<f64> {
    let s = s.trim();
    if let Ok(t) = DateTime::parse_from_str(s, format) {
        return Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) * 1e-6);
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
        let t = t.and_utc();
        return Some(t.timestamp() as f64 + f64::from(t.timestamp_subsec_micros()) * 1e-6);
    }
    NaiveDate::parse_from_str(s, format).ok().map(|d| d.and_hms_opt(0, 0, 0).unwrap().and_utc().timestamp() as f64)
}

impl ColumnSpec {
    /// Declared numeric bounds (datetime bounds in epoch seconds).
    pub fn bounds(&self) -> Option<(f64, f64)> {
        let value = |b: &Option<Bound>| match (b, self.kind) {
            (Some(Bound::Number(x)), ColumnKind::Continuous | ColumnKind::Integer) => Some(*x),
            (Some(Bound::Text(s)), ColumnKind::Datetime) => parse_datetime(s),
            _ => None,
        };
        Some((value(&self.min)?, value(&self.max)?))
    }

    fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        if self.format.is_some() && self.kind != ColumnKind::Datetime {
            return Err(format!("column '{name}': only datetime columns take a `format`"));
        }
        if let Some(format) = &self.format {
            check_datetime_format(format).map_err(|why| format!("column '{name}': `format` {why}"))?;
        }
        match self.kind {
            ColumnKind::Continuous | ColumnKind::Integer | ColumnKind::Datetime => {
                let (lo, hi) = self.bounds().ok_or_else(|| {
                    let example = if self.kind == ColumnKind::Datetime { "\"2020-01-01\"" } else { "numbers" };
                    format!("column '{name}' needs public bounds `min` and `max` ({example})")
                })?;
                // Beyond 2⁵³ integers and epoch seconds are not exact in f64.
                const EXACT: f64 = 9_007_199_254_740_992.0;
                if !(lo < hi && lo.abs() <= EXACT && hi.abs() <= EXACT) {
                    return Err(format!("column '{name}': min must be below max, both finite and within ±2⁵³"));
                }
                if self.kind == ColumnKind::Integer && lo.ceil() > hi.floor() {
                    return Err(format!("column '{name}': no integer lies between min and max"));
                }
                if self.bins == Some(Bins::Count(0)) {
                    return Err(format!("column '{name}': bins must be at least 1"));
                }
                if let Some(Bins::Edges(edges)) = &self.bins {
                    let increasing = edges.windows(2).all(|w| w[0] < w[1]);
                    if edges.len() < 2 || !increasing || edges[0] != lo || *edges.last().unwrap() != hi {
                        return Err(format!("column '{name}': bin edges must increase from min ({lo}) to max ({hi})"));
                    }
                }
                if self.categories.is_some() {
                    return Err(format!("column '{name}': only categorical columns take `categories`"));
                }
            }
            ColumnKind::Categorical => {
                let categories = self
                    .categories
                    .as_ref()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| format!("column '{name}' needs its public list of `categories`"))?;
                let mut seen = HashSet::new();
                if let Some(dup) = categories.iter().find(|c| !seen.insert(c.as_str())) {
                    return Err(format!("column '{name}': category '{dup}' is declared twice"));
                }
                if categories.iter().any(|c| c == OTHER_CATEGORY) {
                    return Err(format!("column '{name}': '{OTHER_CATEGORY}' is reserved"));
                }
            }
            ColumnKind::Identifier => {}
        }
        Ok(())
    }
}

impl JobSpec {
    /// The output size the spec declares, in the generator's own unit: histories for a
    /// generator of histories (`[output] units`), rows otherwise (`rows`). Without it, a
    /// job writes as many as its DP count released.
    pub fn declared_output_size(&self) -> Option<u64> {
        if self.generator.draws_histories() { self.output.units } else { self.output.rows }
    }

    /// Parses and validates a spec; `path` names it in messages.
    pub fn parse(text: &str, path: &str) -> Result<Self, SpecError> {
        let spec: JobSpec =
            toml::from_str(text).map_err(|e| SpecError::Parse { path: path.to_string(), message: e.to_string() })?;
        let invalid = |message: String| SpecError::Invalid { path: path.to_string(), message };
        spec.validate().map_err(invalid)?;
        validate_id("dataset id", &spec.job.dataset_id).map_err(|e| invalid(e.to_string()))?;
        if let Some(id) = &spec.job.id {
            validate_id("job id", id).map_err(|e| invalid(e.to_string()))?;
        }
        Ok(spec)
    }

    /// Reads, parses and validates a spec file.
    pub fn load(path: &str) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::Parse { path: path.to_string(), message: format!("cannot read: {e}") })?;
        Self::parse(&text, path)
    }

    /// Refuses a spec with no input files (and an evaluation with no held-out files):
    /// checked when a job starts, after an operator-declared dataset has filled them in.
    pub fn require_input(&self) -> Result<(), SpecError> {
        let missing = |message: &str| Err(SpecError::Invalid { path: "job spec".into(), message: message.into() });
        if self.input.urls.is_empty() {
            return missing("[input] urls is empty");
        }
        if self.evaluation.as_ref().is_some_and(|e| e.test_urls.is_empty()) {
            return missing("[evaluation] test_urls is empty");
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), String> {
        if self.job.partitions == 0 {
            return Err("[job] partitions must be at least 1".into());
        }
        let p = &self.privacy;
        if !(p.epsilon > 0.0 && p.epsilon.is_finite() && (0.0..1.0).contains(&p.delta)) {
            return Err(format!("[privacy] needs epsilon > 0 and delta in [0, 1), got {} and {}", p.epsilon, p.delta));
        }
        let mut names = HashSet::new();
        for c in &self.schema.columns {
            if !names.insert(c.name.as_str()) {
                return Err(format!("column '{}' is declared twice", c.name));
            }
            c.validate()?;
        }
        let column = |name: &str| self.schema.columns.iter().find(|c| c.name == name);
        if let Some(unit) = &self.schema.unit_column {
            match column(unit) {
                Some(c) if c.kind == ColumnKind::Identifier => {}
                Some(_) => {
                    return Err(format!("unit column '{unit}' must have kind = \"identifier\""));
                }
                None => return Err(format!("unit column '{unit}' is not among the columns")),
            }
        }
        if let Some(order) = &self.schema.order_by {
            match column(order) {
                Some(c) if c.kind != ColumnKind::Identifier && c.kind != ColumnKind::Categorical => {}
                _ => return Err(format!("order_by '{order}' must be a declared numeric or datetime column")),
            }
        }
        if let Some(target) = &self.schema.target {
            match column(target) {
                Some(c) if c.kind != ColumnKind::Identifier => {}
                _ => {
                    return Err(format!("target '{target}' must be a declared, non-identifier column"));
                }
            }
        }
        if let GeneratorSpec::Marginals(m) = &self.generator
            && (m.max_rows_per_unit == 0
                || m.default_bins < 2
                || m.gap_bins.is_some_and(|g| !(1..=MAX_GAP_BINS).contains(&g)))
        {
            return Err(
                "[generator.marginals] needs max_rows_per_unit ≥ 1, default_bins ≥ 2 and 1 ≤ gap_bins ≤ 64".into()
            );
        }
        if let GeneratorSpec::Marginals(m) = &self.generator {
            match m.history_rows {
                Some(rows) if !(1..=MAX_HISTORY_ROWS).contains(&rows) => {
                    return Err(format!("[generator.marginals] history_rows must be between 1 and {MAX_HISTORY_ROWS}"));
                }
                Some(_) if m.max_rows_per_unit != 1 => {
                    return Err("[generator.marginals] with history_rows a unit is one flattened history: \
                                max_rows_per_unit does not apply"
                        .into());
                }
                None if !m.static_columns.is_empty() || m.gap_bins.is_some() => {
                    return Err("[generator.marginals] static_columns and gap_bins need history_rows".into());
                }
                _ => {}
            }
        }
        if let GeneratorSpec::Aim(a) = &self.generator
            && (a.max_rows_per_unit == 0
                || a.default_bins < 2
                || !(a.selection_share > 0.0 && a.selection_share < 1.0)
                || !(a.max_model_cells >= 1.0 && a.max_model_cells <= 1e7)
                || !(1..=10_000).contains(&a.fit_iterations)
                || a.rounds.is_some_and(|t| !(1..=10_000).contains(&t))
                || a.target_share.is_some_and(|s| !(0.0..=0.5).contains(&s)))
        {
            return Err("[generator.aim] needs max_rows_per_unit ≥ 1, default_bins ≥ 2, 0 < selection_share < 1, \
                        1 ≤ max_model_cells ≤ 10⁷, 1 ≤ fit_iterations ≤ 10⁴, 1 ≤ rounds ≤ 10⁴ and \
                        0 ≤ target_share ≤ 0.5"
                .into());
        }
        if let Some(c) = &self.calibration {
            let valid = c.epsilon_share > 0.0
                && c.epsilon_share <= 0.5
                && (1..=64).contains(&c.pool)
                && c.max_rows_per_unit > 0;
            if !valid {
                return Err(
                    "[calibration] needs 0 < epsilon_share ≤ 0.5, 1 ≤ pool ≤ 64 and max_rows_per_unit ≥ 1".into()
                );
            }
        }
        let histories = self.generator.draws_histories();
        if histories && self.output.rows.is_some() {
            return Err("[output] rows: the generator draws whole histories; declare [output] units".into());
        }
        if !histories && self.output.units.is_some() {
            return Err("[output] units is for generators of whole histories; declare [output] rows".into());
        }
        if histories && self.schema.unit_column.is_none() {
            return Err("a generator of histories models each unit's history: [schema] needs a unit_column".into());
        }
        if self.output.rows_per_part == 0 {
            return Err("[output] rows_per_part must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{JobSpec, SpecError};

    const DEMO: &str = include_str!("../../examples/demo.toml");

    fn with_job_id(id: &str) -> Result<JobSpec, SpecError> {
        JobSpec::parse(&DEMO.replace("[job]\n", &format!("[job]\nid = {id:?}\n")), "demo")
    }

    /// A generator's parameters are its own: another generator's section is refused.
    #[test]
    fn a_section_of_another_generator_is_refused() {
        let pate_in_marginals =
            DEMO.replace("[generator.marginals]", "[generator.pate]\nsigma = 5.0\n\n[generator.marginals]");
        let err = JobSpec::parse(&pate_in_marginals, "demo").unwrap_err().to_string();
        assert!(err.contains("[generator.pate] belongs to another generator"), "{err}");
        let spec = JobSpec::parse(DEMO, "demo").unwrap();
        assert!(matches!(&spec.generator, super::GeneratorSpec::Marginals(p) if p.max_rows_per_unit == 8));
        // It round-trips as written.
        let text = toml::to_string(&spec).unwrap();
        assert_eq!(JobSpec::parse(&text, "again").unwrap(), spec);
    }

    /// A generator of histories counts its output in units and needs the unit column; a
    /// generator of rows counts rows: each refuses the other's size.
    #[test]
    fn output_sizes_are_counted_in_what_the_generator_draws() {
        let sequence = DEMO.replace("name = \"marginals\"", "name = \"sequence\"").replace(
            "[generator.marginals]\n# A patient contributes at most 8 of their visits (sampled inside the worker).\nmax_rows_per_unit = 8\n",
            "",
        );
        let sequence = format!(
            "{}{}",
            &sequence[..sequence.find("pairs = ").unwrap()],
            &sequence[sequence.find("[output]").unwrap()..]
        );
        let spec = JobSpec::parse(&sequence, "sequence").unwrap();
        assert!(matches!(spec.generator, super::GeneratorSpec::Sequence(_)));
        let refused = |text: &str, wanted: &str| {
            let err = JobSpec::parse(text, "bad").unwrap_err().to_string();
            assert!(err.contains(wanted), "{err}");
        };
        refused(&format!("{sequence}rows = 100\n"), "declare [output] units");
        assert_eq!(JobSpec::parse(&format!("{sequence}units = 100\n"), "ok").unwrap().output.units, Some(100));
        refused(&format!("{DEMO}units = 100\n"), "declare [output] rows");
        refused(&sequence.replace("unit_column = \"patient_id\"\n", ""), "needs a unit_column");
        // The marginals generator's flattened histories (PATH's Direct) are histories too.
        let direct = DEMO.replace("max_rows_per_unit = 8\n", "history_rows = 16\n");
        assert!(JobSpec::parse(&direct, "direct").unwrap().generator.draws_histories());
        refused(&format!("{direct}rows = 100\n"), "declare [output] units");
        refused(&direct.replace("unit_column = \"patient_id\"\n", ""), "needs a unit_column");
        refused(
            &DEMO.replace("max_rows_per_unit = 8\n", "max_rows_per_unit = 8\nhistory_rows = 16\n"),
            "does not apply",
        );
        refused(&DEMO.replace("max_rows_per_unit = 8\n", "history_rows = 0\n"), "history_rows must be");
        refused(&DEMO.replace("max_rows_per_unit = 8\n", "static_columns = [\"rhythm\"]\n"), "need history_rows");
        refused(&DEMO.replace("max_rows_per_unit = 8\n", "gap_bins = 12\n"), "need history_rows");
        refused(&direct.replace("history_rows = 16\n", "history_rows = 16\ngap_bins = 65\n"), "gap_bins ≤ 64");
    }

    /// Found by `tests/fuzz.rs`: infinite bounds, an integer column holding no integer, and
    /// zero bins were accepted and then overflowed or divided by zero in the domain.
    #[test]
    fn numeric_domains_are_finite_and_non_empty() {
        let heart_rate = "name = \"heart_rate\"\nkind = \"integer\"\nmin = 30\nmax = 220\nbins = 19\n";
        for (replacement, expected) in [
            ("min = -inf\nmax = 220\nbins = 19\n", "both finite"),
            ("min = 30\nmax = 1e300\nbins = 19\n", "both finite"),
            ("min = 30.2\nmax = 30.8\nbins = 19\n", "no integer lies between"),
            ("min = 30\nmax = 220\nbins = 0\n", "bins must be at least 1"),
        ] {
            let text = DEMO.replace(heart_rate, &format!("name = \"heart_rate\"\nkind = \"integer\"\n{replacement}"));
            assert_ne!(text, DEMO);
            let err = JobSpec::parse(&text, "demo").unwrap_err().to_string();
            assert!(err.contains(expected), "{replacement}: {err}");
        }
    }

    /// An empty id once named every job's scratch prefix (cleanup deleted them all), and a
    /// path escaped the scratch store.
    #[test]
    fn job_and_dataset_ids_cannot_name_other_prefixes() {
        for bad in ["", "../../x", "a/b", ".hidden", "x y", &"a".repeat(129)] {
            let err = with_job_id(bad).unwrap_err();
            assert!(err.to_string().starts_with("job spec demo: invalid job id"), "{bad:?}: {err}");
        }
        assert_eq!(with_job_id("nightly-2026.11_23").unwrap().job.id.as_deref(), Some("nightly-2026.11_23"));
        let bad_dataset = DEMO.replace("dataset_id = \"demo-icu-vitals\"", "dataset_id = \"../ledger\"");
        let err = JobSpec::parse(&bad_dataset, "demo").unwrap_err();
        assert!(err.to_string().starts_with("job spec demo: invalid dataset id"), "{err}");
    }
}
