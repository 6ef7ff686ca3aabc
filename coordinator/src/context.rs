//! What every generator's run shares with its job: the request and environment, the
//! errors (and what a submitter may see of them), progress, and the context a generator
//! runs in (admission, charge, partitioning, the unit count's release).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use rhosynth_privacy::ledger::{Admission, ChargeReceipt, ChargeRequest, Ledger, LedgerError};
use rhosynth_privacy::release::{Private, Releases, Unpaid};
use rhosynth_shared::accounting::mechanism::Mechanism;
use rhosynth_shared::data::DataError;
use rhosynth_shared::data::database::partition::{check_headers, shard_jobs};
use rhosynth_shared::data::database::{Database, partition_database};
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::input::InputReader;
use rhosynth_shared::data::partition::{PartitionKey, PartitionWriter, Partitioned};
use rhosynth_shared::data::shard::ShardJob;
use rhosynth_shared::data::source::Source;
use rhosynth_shared::spec::{JobSpec, PartitionBy};
use rhosynth_shared::storage::{self, StoreLocation};

use crate::gather::Gather;
use crate::schedule::Schedule;
use crate::scheduler::Scheduler;
use crate::scratch;
use crate::shuffle;
use crate::telemetry::Telemetry;

/// Why a job did not complete.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Output(#[from] rhosynth_shared::output::OutputError),
    #[error(transparent)]
    Storage(#[from] rhosynth_shared::storage::StorageError),
    #[error(transparent)]
    Plan(#[from] rhosynth_shared::generators::PlanError),
    #[error(transparent)]
    Privacy(#[from] rhosynth_shared::accounting::PrivacyError),
    #[error(transparent)]
    Unpaid(#[from] Unpaid),
    #[error("worker {worker}: task {task_id} failed: {error}")]
    Task { worker: String, task_id: u64, error: String },
    #[error("worker {worker} returned an invalid aggregate for task {task_id}: {reason}")]
    BadResult { worker: String, task_id: u64, reason: String },
    /// Decided on the released (charged) unit count, so it may carry figures derived from it.
    #[error(
        "the job's noise_multiplier gives ε = {cost:.6} at δ = {delta:e}, above the job's ε = {epsilon}; \
         only the unit count release (ledger entry {count_entry}) was charged"
    )]
    OverJobEpsilon { cost: f64, delta: f64, epsilon: f64, count_entry: u64 },
    /// DP-FinDiff's cost depends on q, known only after the (charged) unit count: before
    /// reading a row, its declared ε must fit what is left of the dataset's budget.
    #[error(
        "the job's ε = {epsilon} exceeds what remains of the dataset's budget (ε = {remaining:.6} of {budget}); \
         nothing was read or charged"
    )]
    OverRemainingBudget { epsilon: f64, remaining: f64, budget: f64 },
    /// Decided on the plan alone (public), before any private read.
    #[error(
        "the job's planned charge is ε = {cost:.6} at the dataset budget's δ = {delta:e}, below this dataset's \
         floor of ε = {floor} per job (min_job_epsilon; a job stating its ε at a smaller δ pays less at the \
         budget's); nothing was read or charged"
    )]
    BelowChargeFloor { cost: f64, delta: f64, floor: f64 },
    #[error(transparent)]
    Spec(#[from] rhosynth_shared::spec::SpecError),
    /// A release must never share a prefix with private or operator-only state.
    #[error("the output location {output} overlaps the coordinator's {store} store; choose another output prefix")]
    OutputOverlaps { output: String, store: &'static str },
    /// A reference set is read as public: never from a store of private rows or accounting.
    #[error("the reference set {reference} overlaps the coordinator's {store} store; name a public table or release")]
    ReferenceOverlaps { reference: String, store: &'static str },
    /// Another live process trains this job's run (`run_lease`): the scratch store's
    /// state, never the data's.
    #[error("job {job_id} is being trained by another coordinator; refusing to train it twice")]
    RunHeld { job_id: String },
    /// The coordinator's scratch store (checkpoints, leases, heartbeats, kept models)
    /// failed: operator state, never the data's, but logged for the operator only.
    #[error("scratch store: {doing}: {reason}")]
    Scratch { doing: String, reason: String },
    #[error("the checkpoint of job {job_id} is corrupt: {reason}")]
    CheckpointCorrupt { job_id: String, reason: String },
    /// A saved run may resume only as charged, once, under the same generator and schema.
    #[error("job {job_id}: {reason}; refusing to resume")]
    ResumeRefused { job_id: String, reason: String },
    /// A model's parameters or its operator-supplied checkpoint could not be loaded.
    #[error("model: {0}")]
    Model(String),
    #[error("the spec declares no output size and the generator released no count")]
    NoOutputSize,
    #[error("the scheduler stopped")]
    SchedulerStopped,
    #[error("a blocking task failed: {0}")]
    Blocking(#[from] tokio::task::JoinError),
    /// Cancelled (`rhosynth run` interrupted) before its release began.
    #[error("the job was cancelled before its release: nothing was released (a charge already recorded stays spent)")]
    Cancelled,
    /// What the engine's own invariants rule out (a bug, not an input).
    #[error("internal error: {0}")]
    Internal(String),
}

/// What a submitter is told when the input does not match the schema the spec declares.
pub const INPUT_MISMATCH: &str = "input does not match the declared schema";

impl JobError {
    /// The ledger refused the job (budget); not a malfunction.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            JobError::Ledger(LedgerError::BudgetExceeded { .. })
                | JobError::OverJobEpsilon { .. }
                | JobError::OverRemainingBudget { .. }
                | JobError::BelowChargeFloor { .. }
        )
    }

    /// What the submitter may see. Ledger, spec, plan and calibration errors depend only on
    /// public inputs (the spec, the ledger, released and charged statistics); any other
    /// failure can follow a private read and might describe it (a row, a column, a worker's
    /// aggregate), so the submitter gets a fixed sentence and the operator's log the detail.
    pub fn submitter_message(&self) -> String {
        match self {
            // The operator's file names stay in the operator's log.
            JobError::Ledger(
                LedgerError::OtherInput { .. } | LedgerError::Unbound { .. } | LedgerError::InvalidInput { .. },
            ) => "the dataset's ledger is not bound to the input this job reads; the operator's log says why".into(),
            JobError::Ledger(_)
            | JobError::OverJobEpsilon { .. }
            | JobError::OverRemainingBudget { .. }
            | JobError::BelowChargeFloor { .. }
            | JobError::Spec(_)
            | JobError::Plan(_)
            | JobError::Privacy(_)
            | JobError::Unpaid(_)
            | JobError::OutputOverlaps { .. }
            | JobError::ReferenceOverlaps { .. }
            | JobError::RunHeld { .. }
            | JobError::Cancelled
            | JobError::Storage(_) => self.to_string(),
            JobError::Output(e) if e.is_public() => self.to_string(),
            JobError::Data(_) => format!("{INPUT_MISMATCH} (details are in the coordinator's operator log)"),
            JobError::Output(_)
            | JobError::Task { .. }
            | JobError::BadResult { .. }
            | JobError::Scratch { .. }
            | JobError::CheckpointCorrupt { .. }
            | JobError::ResumeRefused { .. }
            | JobError::Model(_)
            | JobError::NoOutputSize
            | JobError::SchedulerStopped
            | JobError::Blocking(_)
            | JobError::Internal(_) => {
                "the job failed while processing private data; the reason is in the coordinator's operator log".into()
            }
        }
    }
}

/// A job as submitted.
#[derive(Clone, Debug)]
pub struct JobRequest {
    pub job_id: String,
    pub spec: JobSpec,
    /// Overrides the spec's output URL.
    pub output_url: Option<String>,
    /// Overrides the spec's ledger store.
    pub ledger_url: Option<String>,
    /// The least ε the job's planned charge may state (a served dataset's
    /// `min_job_epsilon`): each job that reads the data costs at least this much.
    pub charge_floor: Option<f64>,
    /// The files a served dataset's ledger is bound to (all its tables'), checked in place
    /// of the files the job reads: a served database job may read some of its declared
    /// tables. `None`: the job's own input is checked.
    pub ledger_input: Option<Vec<String>>,
}

impl JobRequest {
    /// A job as its spec says, nothing overridden.
    pub fn new(job_id: impl Into<String>, spec: JobSpec) -> Self {
        Self { job_id: job_id.into(), spec, output_url: None, ledger_url: None, charge_floor: None, ledger_input: None }
    }

    /// The output prefix: the override or the spec's, where `{job_id}` gives every
    /// (scheduled) run its own prefix.
    pub fn resolved_output_url(&self) -> String {
        let dataset = &self.spec.job.dataset_id;
        match &self.output_url {
            Some(url) => url.replace("{dataset_id}", dataset).replace("{job_id}", &self.job_id),
            None => self.spec.output.url_for(dataset, &self.job_id),
        }
    }
}

/// Where a job stands, for status calls and progress bars. Counts of rows or units are
/// private and never appear here.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub stage: String,
    pub tasks_total: u32,
    pub tasks_done: u32,
    pub epsilon_spent: f64,
    /// The release has begun (its marker claimed, parts being written): from here a job
    /// runs to its end, cancelled or not.
    pub releasing: bool,
}

/// Shared per-job progress, updated by the runner.
pub type ProgressHandle = Arc<Mutex<Progress>>;

pub(crate) fn set_stage(progress: &ProgressHandle, stage: &str) {
    tracing::info!(stage, "job progress");
    progress.lock().unwrap_or_else(|e| e.into_inner()).stage = stage.to_string();
}

/// Settings of the coordinator that jobs need.
#[derive(Clone, Debug)]
pub struct JobEnv {
    pub scratch_url: String,
    pub default_ledger_url: String,
    /// The operator's store for evaluation reports (diagnostics computed on private data,
    /// for the data owner only); `None`: this coordinator refuses jobs that ask for one.
    pub diagnostics_url: Option<String>,
    /// Whether a DP-SGD job leaves its trained model in the scratch store
    /// (`scratch::kept_model`): set by `rhosynth audit` for its white-box score, off on
    /// every coordinator that serves or runs jobs.
    pub keep_trained_models: bool,
    /// This coordinator's liveness in the scratch store, shared by its jobs.
    pub heartbeat: scratch::Heartbeat,
    /// A served dataset's submitters see a job's release and end only at the boundaries
    /// of a schedule with this quantum (`schedule`); `None`: as they happen (the data
    /// owner's own `run`).
    pub release_quantum: Option<std::time::Duration>,
}

/// A job's partitions in the scratch store. Their unit counts are private: a release
/// alone makes one public, and they bound what a worker may return for a partition.
pub(crate) struct Partitions {
    /// Each partition's files, a task's group: the one table's partition, or the same
    /// partition of every table of a database (in layout order).
    pub groups: Vec<Vec<String>>,
    pub units: Private<u64>,
    pub units_per_partition: Private<Vec<u64>>,
    /// Units by their number of rows.
    pub rows_per_unit: Private<std::collections::BTreeMap<u32, u64>>,
}

impl Partitions {
    /// `groups` of files, their units counted in `partitioned` (one table's, or a
    /// database's root's).
    fn of(groups: Vec<Vec<String>>, partitioned: Partitioned) -> Self {
        let Partitioned { units, units_per_partition, rows_per_unit, .. } = partitioned;
        Self {
            groups,
            units: Private::new(units),
            units_per_partition: Private::new(units_per_partition),
            rows_per_unit: Private::new(rows_per_unit),
        }
    }
}

/// What every generator needs from its job.
pub(crate) struct JobContext<'a> {
    pub request: &'a JobRequest,
    pub domain: &'a Domain,
    /// The private working store (partitions, checkpoints).
    pub scratch: &'a StoreLocation,
    /// `JobEnv::keep_trained_models`.
    pub keep_trained_model: bool,
    pub scheduler: &'a Scheduler,
    pub telemetry: &'a Telemetry,
    pub progress: &'a ProgressHandle,
    /// When its charges and release may happen (served datasets).
    pub schedule: Option<Schedule>,
}

impl<'a> JobContext<'a> {
    pub fn spec(&self) -> &JobSpec {
        &self.request.spec
    }

    /// The job's progress, to update.
    pub fn progress_mut(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The job's rounds of tasks (cancelled when dropped).
    pub fn gather(&self) -> Gather<'a> {
        Gather::new(self.scheduler, self.telemetry, &self.request.job_id)
    }

    /// Follows one round's tasks: done so far, and an ETA at the round's pace.
    pub fn round_progress(&self) -> impl FnMut(usize, usize) + '_ {
        let started = Instant::now();
        move |done, total| {
            self.progress_mut().tasks_done = done as u32;
            let eta_s = (started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64).round();
            tracing::info!(done, total, eta_s, "task done");
        }
    }

    /// Checks the charge with the ledger, updating the dataset gauges.
    pub async fn admit(&self, ledger: &mut Ledger, charge: &ChargeRequest) -> Result<Admission, JobError> {
        let admission = ledger.check(charge).await;
        if let Ok(spent) = ledger.spent() {
            self.telemetry.dataset(&self.spec().job.dataset_id, spent.epsilon, ledger.budget().epsilon);
        }
        let admission = admission?;
        tracing::info!(
            epsilon = admission.cost.epsilon,
            remaining_after = admission.remaining_epsilon(),
            "ledger admits the job's planned cost"
        );
        Ok(admission)
    }

    /// Charges the ledger: after this, and only after this, may derived output leave.
    pub async fn charge(&self, ledger: &mut Ledger, charge: &ChargeRequest) -> Result<ChargeReceipt, JobError> {
        // A charge's time follows the private reading before it, and any submitter of the
        // dataset sees the ledger (a refusal states what is spent): at a boundary.
        if let Some(schedule) = &self.schedule {
            schedule.hold().await;
        }
        set_stage(self.progress, "charging the ledger");
        let receipt = ledger.charge(charge).await?;
        self.telemetry.dataset(
            &self.spec().job.dataset_id,
            receipt.admission.after.epsilon,
            receipt.admission.budget.epsilon,
        );
        self.progress_mut().epsilon_spent = receipt.admission.cost.epsilon;
        Ok(receipt)
    }

    /// Splits the private input by privacy unit into the scratch store: on the workers, or
    /// here ([`PartitionBy`]).
    pub async fn partition(&self) -> Result<Partitions, JobError> {
        set_stage(self.progress, "partitioning");
        let spec = self.spec();
        let key = PartitionKey::generate()?;
        // Under this process's prefix: a resumed job (a new process) never reuses a URL
        // whose contents a worker may still hold from before.
        let prefix = scratch::partition_prefix(&self.request.job_id);
        // Each file by its absolute name: the one the ledger was bound to, whatever a
        // worker's working directory (a row-level unit is named by it, on either path).
        let files = Source {
            urls: spec.input.urls.iter().map(|url| storage::absolute_url(url)).collect(),
            ..spec.input.clone()
        };
        let mut input = InputReader::new(&files, &spec.schema, self.domain);
        // Every file fits the schema before any row is read (a later file's wrong header
        // would otherwise fail the job after the earlier files' rows, timed by their size).
        input.check_headers().await?;
        let partitioned = match spec.job.partition_by {
            PartitionBy::Workers => {
                let job = ShardJob {
                    input: files.clone(),
                    schema: spec.schema.clone(),
                    domain: self.domain.clone(),
                    partitions_url: shuffle::partitions_url(self, &prefix),
                    partitions: spec.job.partitions,
                    keys: Vec::new(),
                };
                shuffle::partition_by_workers(self, &job, &key, &prefix).await?
            }
            PartitionBy::Coordinator => {
                let mut writer = PartitionWriter::new(self.scratch, &prefix, self.domain, spec.job.partitions, key)?;
                while let Some(batch) = input.next_batch().await? {
                    writer.write(batch).await?;
                }
                shuffle::log_skipped(input.skipped());
                writer.finish().await?
            }
        };
        let groups = partitioned.urls.iter().map(|url| vec![url.clone()]).collect();
        Ok(Partitions::of(groups, partitioned))
    }

    /// Splits a database's tables by privacy unit into the scratch store, on the workers or
    /// here ([`PartitionBy`]): one set of partitions per table under one key, a unit's rows
    /// in the same partition index of every table. The units are the root's.
    pub async fn partition_database(&self) -> Result<Partitions, JobError> {
        set_stage(self.progress, "partitioning");
        let spec = self.spec();
        let key = PartitionKey::generate()?;
        let prefix = scratch::partition_prefix(&self.request.job_id);
        let database = Database::of_spec(spec);
        let tables: Vec<Partitioned> = match spec.job.partition_by {
            PartitionBy::Workers => {
                // Every table's files fit its columns before any row of any table is read.
                check_headers(&database).await?;
                let mut tables = Vec::new();
                for (table, job) in shard_jobs(&database, &shuffle::partitions_url(self, &prefix), spec.job.partitions)
                {
                    tables.push(shuffle::partition_by_workers(self, &job, &key, &format!("{prefix}/{table}")).await?);
                }
                tables
            }
            PartitionBy::Coordinator => {
                let tables = partition_database(&database, self.scratch, &prefix, spec.job.partitions, key).await?;
                for table in &tables {
                    // A count of the input: the operator's log only (the workers log what
                    // their cap leaves out).
                    tracing::info!(table = table.name, bad = table.bad, "rows left out as read: breaking the schema");
                }
                tables.into_iter().map(|t| t.partitions).collect()
            }
        };
        let groups =
            (0..spec.job.partitions as usize).map(|k| tables.iter().map(|t| t.urls[k].clone()).collect()).collect();
        let root = tables.into_iter().next().expect("a database has its root");
        Ok(Partitions::of(groups, root))
    }

    pub fn charge_request(&self, mechanisms: Vec<Mechanism>) -> ChargeRequest {
        let spec = self.spec();
        ChargeRequest {
            job_id: self.request.job_id.clone(),
            mechanisms,
            accountant: spec.privacy.accountant,
            delta: spec.privacy.delta,
        }
    }
}

/// The unit count (sensitivity 1), released with N(0, σ²) and rounded at once: the noisy double's low bits are never used.
pub(crate) fn release_count(releases: &mut Releases, partitions: &Partitions, sigma: f64) -> Result<f64, JobError> {
    let units = partitions.units.map(|&n| vec![n as f64]);
    let noisy = releases.gaussian_each(units, 1.0, sigma)?;
    Ok(noisy[0].round().max(1.0))
}

/// Runs model work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, JobError> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Failures that may follow a private read say what happened to the operator's log
    /// only: the submitter gets the one fixed sentence, whatever the variant carries.
    #[test]
    fn what_may_follow_a_private_read_reaches_the_submitter_as_one_sentence() {
        let detail = "row 17: heart_rate 212";
        let failures = [
            JobError::Scratch { doing: detail.into(), reason: detail.into() },
            JobError::CheckpointCorrupt { job_id: "j".into(), reason: detail.into() },
            JobError::ResumeRefused { job_id: "j".into(), reason: detail.into() },
            JobError::Model(detail.into()),
            JobError::NoOutputSize,
            JobError::SchedulerStopped,
            JobError::Internal(detail.into()),
            JobError::BadResult { worker: "w".into(), task_id: 1, reason: detail.into() },
        ];
        for failure in failures {
            let told = failure.submitter_message();
            assert!(told.starts_with("the job failed while processing private data"), "{told}");
            assert!(!told.contains(detail), "{told}");
        }
    }
}
