//! `rhosynth audit`: the job's mechanism, exactly as configured, run once on a stand-in
//! dataset plus canary units each included with probability ½, and the ε lower bound its
//! release proves (Steinke, Nasr & Jagielski 2023; `rhosynth_shared::audit`).
//!
//! Nothing it produces is a release. The job is charged to an audit ledger of the audit's
//! own (never the dataset's), with add/remove neighbours (the theorem's: a canary is in or
//! out); its input (the stand-in and the canaries) and its synthetic output live in a
//! private temporary directory removed when the audit ends or is stopped, and what remains
//! is the report and that ledger, in a directory apart from the job's stores and from any
//! release. The stand-in may be the job's private input: then the report is a diagnostic
//! computed on private data, for the data owner only (as `eval`'s).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use object_store::ObjectStoreExt;
use prost::Message;
use rhosynth_proto::{GradientSum, JobState};
use rhosynth_shared::accounting::Budget;
use rhosynth_shared::accounting::PrivacyError;
use rhosynth_shared::audit::bound::epsilon_lower_bound;
use rhosynth_shared::audit::canary;
use rhosynth_shared::audit::loss::{LossError, loss_gains};
use rhosynth_shared::audit::score::{Score, guess, nearest_scores, pair_scores};
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::input::InputReader;
use rhosynth_shared::data::partition::{PartitionKey, PartitionWriter};
use rhosynth_shared::data::source::Format;
use rhosynth_shared::data::table::{self, Table};
use rhosynth_shared::entropy::os_rng;
use rhosynth_shared::eval;
use rhosynth_shared::output::{OutputWriter, SyntheticUnits, rows_to_batch};
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;
use serde::{Deserialize, Serialize};
use tempfile::TempDir;

use crate::auth::Access;
use crate::job::JobRequest;
use crate::scratch;
use crate::service::{CoordinatorConfig, new_job_id};
use crate::standalone::Standalone;

/// Confidence of the bound: 95%.
pub const SIGNIFICANCE: f64 = 0.05;
/// Canary units written per Parquet part of the audit's input.
const UNITS_PER_PART: usize = 50_000;

/// How to audit.
#[derive(Clone, Debug)]
pub struct AuditOptions {
    /// Canary units (M).
    pub canaries: usize,
    /// Rows per canary unit (1 when the schema has no unit column).
    pub canary_rows: usize,
    /// Guesses at each end of the scores (k: k "in", k "out").
    pub guesses: usize,
    /// How canaries are scored (chosen before the run: one score, one test).
    pub score: Score,
    /// The stand-in data (files in the job's input format); `None`: the job's own input.
    pub data: Option<Vec<String>>,
    /// Local workers of the standalone cluster the job runs on.
    pub workers: usize,
    /// Where each audit's directory (its report and ledger) goes: a local directory apart
    /// from the job's stores and any release.
    pub out: PathBuf,
}

impl AuditOptions {
    /// k = M/10 at each end and a canary of 8 rows where units have histories: defaults
    /// that leave each side enough canaries and a guess set large enough to bound ε ≈ 4.
    pub fn new(spec: &JobSpec, canaries: usize, out: PathBuf) -> Self {
        let canary_rows = if spec.schema.unit_column.is_some() { 8 } else { 1 };
        Self { canaries, canary_rows, guesses: canaries.div_ceil(10), score: Score::Pairs, data: None, workers: 2, out }
    }
}

/// What the report says of itself: it is computed on the stand-in data.
pub const NOTICE: &str = "Computed on the stand-in data (row count included): when that data is private, this \
report is for the data owner and is not a release.";

/// What the audit found (`report.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditReport {
    pub notice: String,
    pub job_id: String,
    pub generator: String,
    /// The ε and δ the job was charged (its manifest's), which the audit tests.
    pub claimed_epsilon: f64,
    pub delta: f64,
    pub canaries: u64,
    pub canary_rows: u64,
    /// Canaries the coins put in the job's input.
    pub included: u64,
    pub guesses: u64,
    pub correct: u64,
    /// The largest ε the guesses reject at 95% confidence, at the claimed δ.
    pub epsilon_lower_bound: f64,
    pub significance: f64,
    /// How a canary was scored.
    pub score: Score,
    pub score_description: String,
    /// The stand-in data's files and rows (canaries excluded).
    pub stand_in: Vec<String>,
    pub stand_in_rows: u64,
    pub seconds: f64,
    /// `epsilon_lower_bound ≤ claimed_epsilon`.
    pub passed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("audit options: {0}")]
    Options(String),
    #[error("the stand-in or the canaries: {0}")]
    Data(#[from] rhosynth_shared::data::DataError),
    #[error("writing the audit's input: {0}")]
    Output(#[from] rhosynth_shared::output::OutputError),
    #[error("storage: {0}")]
    Storage(#[from] rhosynth_shared::storage::StorageError),
    #[error("the audited job ended {state}: {message}")]
    Job { state: String, message: String },
    #[error("the loss score: {0}")]
    Loss(#[from] LossError),
    #[error("{0}")]
    Entropy(#[from] PrivacyError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The loss score needs every canary unit's gain; fewer reached the model's examples.
    #[error("{reached} of {canaries} canary units reached the model's examples")]
    CanariesMissed { reached: usize, canaries: usize },
    /// A model the DP-SGD job left in the audit's scratch store could not be read.
    #[error("the {stage} model: {reason}")]
    KeptModel { stage: String, reason: String },
    #[error("the job's manifest: {0}")]
    Manifest(serde_json::Error),
    #[error("the audit's report: {0}")]
    Report(serde_json::Error),
}

/// The audit's working directory: in the system's temporary directory, readable by this
/// user alone. It holds a copy of the stand-in, the coins (in the job's input) and the
/// job's output; its owner removes it once the audit's tasks have stopped.
pub fn work_dir() -> std::io::Result<TempDir> {
    tempfile::Builder::new().prefix("rhosynth-audit-").permissions(private()).tempdir()
}

fn private() -> std::fs::Permissions {
    std::fs::Permissions::from_mode(0o700)
}

/// Runs the audit of `spec` in `work` (a [`work_dir`]) and writes
/// `<out>/<audit id>/report.json` beside its ledger.
pub async fn run(spec: &JobSpec, options: &AuditOptions, work: &Path) -> Result<AuditReport, AuditError> {
    let started = Instant::now();
    check(spec, options)?;
    let out = check_out(spec, options).await?;
    let job_id = format!("audit-{}", new_job_id().trim_start_matches("job-"));
    let dir = out.join(&job_id);
    // The report is a diagnostic on the stand-in: this user's alone, as the work files.
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, private())?;
    let url = |name: &str| path_url(&work.join(name));
    let domain = Domain::from_spec(spec);

    let stand_in_urls = options.data.clone().unwrap_or_else(|| spec.input.urls.clone());
    let stand_in = table::load(spec, &domain, &stand_in_urls).await?;
    let order_by = spec.schema.order_by.as_ref().and_then(|o| domain.index_of(o));
    // The design is public: any generator will do; the coins that include canaries must
    // be unpredictable, so they come from the OS.
    let mut rng = os_rng()?;
    let canaries = canary::design(&domain, order_by, options.canaries, options.canary_rows, &mut rng);
    let included = canary::include(options.canaries, &mut rng);
    let input = write_units(spec, &input_units(&domain, &stand_in, &canaries, &included), &url("input")).await?;

    let mut job = spec.clone();
    job.job.id = Some(job_id.clone());
    job.input.urls = input;
    job.input.format = Some(Format::Parquet);
    job.input.csv.strip_suffix = None;
    job.evaluation = None;
    // A ledger of the audit's own, holding exactly this job's claim.
    job.privacy.dataset_budget = Some(Budget { epsilon: spec.privacy.epsilon, delta: spec.privacy.delta });
    let ledger = path_url(&dir.join("ledger"));
    let synthetic_url = url("synthetic");
    let keep_models = options.score == Score::Loss;
    let manifest = run_job(job.clone(), options.workers, &url("scratch"), keep_models, &synthetic_url, &ledger).await?;

    let scores = match options.score {
        Score::Pairs | Score::Nearest => {
            let (parts, _) = table::release_parts(&synthetic_url).await?;
            let synthetic = table::load(&job, &domain, &parts).await?;
            let (table, ends) = (table_of(&domain, &canaries), &canaries.ends);
            match options.score {
                Score::Pairs => pair_scores(&domain, &table, ends, &synthetic, &stand_in),
                _ => nearest_scores(&domain, &table, ends, &synthetic),
            }
        }
        Score::Loss => {
            let initial = read_kept_model(&url("scratch"), &job_id, "initial").await?;
            let trained = read_kept_model(&url("scratch"), &job_id, "trained").await?;
            let partitions = canary_partitions(&job, &domain, &canaries, &url("canaries")).await?;
            let gains = loss_gains(&trained, &initial.weights, &partitions).await?;
            if gains.len() != options.canaries {
                return Err(AuditError::CanariesMissed { reached: gains.len(), canaries: options.canaries });
            }
            gains
        }
    };
    // Ties are broken by a generator of their own: the guesses owe nothing to the coins.
    let mut ties = os_rng()?;
    let guesses = guess(&scores, &included, options.guesses, &mut ties);
    let (claimed_epsilon, delta) = (manifest.privacy.epsilon, manifest.privacy.delta);
    let bound = epsilon_lower_bound(options.canaries as u64, guesses.made, guesses.correct, delta, SIGNIFICANCE);
    let report = AuditReport {
        notice: NOTICE.into(),
        job_id,
        generator: manifest.generator.clone(),
        claimed_epsilon,
        delta,
        canaries: options.canaries as u64,
        canary_rows: options.canary_rows as u64,
        included: included.iter().filter(|&&i| i).count() as u64,
        guesses: guesses.made,
        correct: guesses.correct,
        epsilon_lower_bound: bound,
        significance: SIGNIFICANCE,
        score: options.score,
        score_description: options.score.describe().into(),
        stand_in: stand_in_urls,
        stand_in_rows: stand_in.rows() as u64,
        seconds: started.elapsed().as_secs_f64(),
        passed: bound <= claimed_epsilon,
    };
    let json = serde_json::to_vec_pretty(&report).map_err(AuditError::Report)?;
    std::fs::write(dir.join("report.json"), json)?;
    Ok(report)
}

fn check(spec: &JobSpec, options: &AuditOptions) -> Result<(), AuditError> {
    let refuse = |m: &str| Err(AuditError::Options(m.to_string()));
    if options.canaries < 2 {
        return refuse("--canaries must be at least 2");
    }
    if options.guesses == 0 || 2 * options.guesses > options.canaries {
        return refuse("--guesses k needs 1 ≤ 2k ≤ canaries");
    }
    if options.canary_rows == 0 || (spec.schema.unit_column.is_none() && options.canary_rows != 1) {
        return refuse("a canary has 1 row without a unit column, at least 1 with one");
    }
    if options.workers == 0 {
        return refuse("--workers must be at least 1");
    }
    // Its canaries are rows of one table; a database's other tables would be read as
    // they are, private, beside the stand-in.
    if !spec.tables.is_empty() {
        return refuse("an audit plants canaries in one table; a database job ([[tables]]) is not audited yet");
    }
    if options.score == Score::Loss && !spec.generator.name().trained_by_dpsgd() {
        return refuse("the loss score needs a generator trained by DP-SGD");
    }
    Ok(())
}

/// `--out`, absolute: a local directory that overlaps none of the job's input, output or
/// ledger and lies under no release (the report is a diagnostic on the stand-in data).
async fn check_out(spec: &JobSpec, options: &AuditOptions) -> Result<PathBuf, AuditError> {
    let refuse = |m: String| Err(AuditError::Options(m));
    let text = options.out.to_string_lossy();
    // `..` after a symbolic link leads elsewhere than the text the checks compare.
    if text.contains("://") || options.out.components().any(|c| c == std::path::Component::ParentDir) {
        return refuse(format!("--out {text}: a local directory, named without `..`"));
    }
    if options.data.is_none() {
        spec.require_input().map_err(|e| AuditError::Options(format!("the stand-in is the job's input: {e}")))?;
    }
    let out = std::path::absolute(&options.out)?;
    let out_url = path_url(&out);
    let data = options.data.iter().flatten();
    let ledger = spec.privacy.ledger.clone().unwrap_or_else(|| CoordinatorConfig::default().env.default_ledger_url);
    let output = spec.output.root(&spec.job.dataset_id);
    let stores = spec.input.urls.iter().chain(data).chain([&output, &ledger]);
    for url in stores {
        if storage::nested(&out_url, url) {
            return refuse(format!(
                "--out {out_url} overlaps {url}: the audit's report belongs apart from the job's stores"
            ));
        }
    }
    eval::check_report_location(&out_url, &output).await.map_err(|e| AuditError::Options(e.to_string()))?;
    Ok(out)
}

fn path_url(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The stand-in's units (their rows together, in first-seen order) and the included
/// canaries: the audited job's input.
fn input_units(domain: &Domain, stand_in: &Table, canaries: &SyntheticUnits, included: &[bool]) -> SyntheticUnits {
    let mut rows_of: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut order = Vec::new();
    for (r, unit) in stand_in.units.iter().enumerate() {
        rows_of
            .entry(unit.as_str())
            .or_insert_with(|| {
                order.push(unit.as_str());
                Vec::new()
            })
            .push(r);
    }
    let mut units = SyntheticUnits::default();
    for unit in order {
        units.push(rows_of[unit].iter().map(|&r| {
            domain.columns.iter().zip(&stand_in.columns).map(|(c, values)| c.synthetic(values[r])).collect()
        }));
    }
    let mut start = 0;
    for (&end, &include) in canaries.ends.iter().zip(included) {
        if include {
            units.push(canaries.rows[start..end].iter().cloned());
        }
        start = end;
    }
    units
}

/// Writes units as Parquet parts in the spec's columns (ids renumbered); returns the parts.
async fn write_units(spec: &JobSpec, units: &SyntheticUnits, url: &str) -> Result<Vec<String>, AuditError> {
    let mut writer = OutputWriter::create(storage::open(url)?, "audit-stand-in").await?;
    let mut first = 0;
    while first < units.units() {
        let last = (first + UNITS_PER_PART).min(units.units());
        let from = if first == 0 { 0 } else { units.ends[first - 1] };
        let part = SyntheticUnits {
            rows: units.rows[from..units.ends[last - 1]].to_vec(),
            ends: units.ends[first..last].iter().map(|e| e - from).collect(),
        };
        writer.write_part(&rows_to_batch(spec, &part, first as u64)).await?;
        first = last;
    }
    Ok(writer.part_urls())
}

/// A model a DP-SGD job left in the audit's scratch store (`initial` or `trained`).
async fn read_kept_model(scratch_url: &str, job_id: &str, stage: &str) -> Result<GradientSum, AuditError> {
    let failed = |e: &dyn std::fmt::Display| AuditError::KeptModel { stage: stage.into(), reason: e.to_string() };
    let scratch = storage::open(scratch_url)?;
    let path = scratch.child(&scratch::kept_model(job_id, stage));
    let bytes = scratch.store.get(&path).await.map_err(|e| failed(&e))?.bytes().await.map_err(|e| failed(&e))?;
    GradientSum::decode(bytes).map_err(|e| failed(&e))
}

/// Every canary (in or out) in one partition, read back as a worker reads its own: units
/// in canary order.
async fn canary_partitions(
    job: &JobSpec,
    domain: &Domain,
    canaries: &SyntheticUnits,
    url: &str,
) -> Result<Vec<String>, AuditError> {
    let input = job.input.of_files(&write_units(job, canaries, &format!("{url}/rows")).await?);
    let store = storage::open(&format!("{url}/partitions"))?;
    let key = PartitionKey::generate()?;
    let mut writer = PartitionWriter::new(&store, "canaries", domain, 1, key)?;
    let mut input = InputReader::new(&input, &job.schema, domain);
    while let Some(batch) = input.next_batch().await? {
        writer.write(batch).await?;
    }
    Ok(writer.finish().await?.urls)
}

/// The canaries as an evaluation table (encoded values).
fn table_of(domain: &Domain, canaries: &SyntheticUnits) -> Table {
    Table {
        units: vec![String::new(); canaries.rows.len()],
        columns: (0..domain.columns.len())
            .map(|d| canaries.rows.iter().map(|row| domain.columns[d].encoded(&row[d])).collect())
            .collect(),
    }
}

/// Runs the job on an in-process cluster and returns its manifest; logs its progress.
async fn run_job(
    spec: JobSpec,
    workers: usize,
    scratch: &str,
    keep_models: bool,
    output: &str,
    ledger: &str,
) -> Result<rhosynth_shared::output::Manifest, AuditError> {
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = scratch.to_string();
    // For the loss score (a DP-SGD generator's, in the audit's own scratch store).
    config.env.keep_trained_models = keep_models;
    config.access = Access::InProcess;
    let cluster = Standalone::start(config, workers).await?;
    let job_id = spec.job.id.clone().expect("set by the audit");
    let request = JobRequest {
        output_url: Some(output.to_string()),
        ledger_url: Some(ledger.to_string()),
        ..JobRequest::new(job_id.clone(), spec)
    };
    let mut last_log = Instant::now();
    let status = cluster
        .run_job(request, |status| {
            if last_log.elapsed() > Duration::from_secs(10) {
                tracing::info!(stage = status.message, epsilon_spent = status.epsilon_spent, "audited job running");
                last_log = Instant::now();
            }
        })
        .await;
    cluster.shutdown().await;
    let status = status.map_err(|message| AuditError::Job { state: "without running".into(), message })?;
    if status.state != JobState::Succeeded as i32 {
        let state = JobState::try_from(status.state).map_or("unknown".into(), |s| format!("{s:?}").to_lowercase());
        return Err(AuditError::Job { state, message: status.message });
    }
    serde_json::from_str(&status.manifest_json).map_err(AuditError::Manifest)
}
