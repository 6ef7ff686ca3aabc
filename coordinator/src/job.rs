//! A job's lifecycle: validate → check that the ledger can afford the planned cost →
//! partition → run tasks on workers → add noise → charge → claim the release → write the
//! output → manifest. The coordinator is the only place noise is drawn and the only ledger
//! writer. A job that fails before its charge spends nothing; no manifest is written
//! unless the whole output is.
//!
//! Marginals charge after aggregating (nothing noisy leaves before). DP-FinDiff charges
//! the unit count that fixes q as its own entry as soon as it is drawn, then its whole
//! DP-SGD run before the first round; PATE charges its whole run before the first vote. A
//! charged job that then fails has spent its budget but released nothing. Every charge is
//! released at most once: the ledger's release marker is claimed before the first part.
//!
//! What a submitter sees of a failure ([`JobError::submitter_message`]) never depends on
//! private data; the operator's log has the detail.

use std::sync::{Arc, Mutex};

use dpsynth_privacy::ledger::{Admission, ChargeReceipt, ChargeRequest, Ledger, LedgerError};
use dpsynth_privacy::release::{Private, Releases, Unpaid};
use dpsynth_shared::accounting::accountant::{AccountingOptions, PrivacyCost, calibrate_sigma};
use dpsynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use dpsynth_shared::data::DataError;
use dpsynth_shared::data::domain::Domain;
use dpsynth_shared::data::input::InputReader;
use dpsynth_shared::data::partition::{PartitionKey, PartitionWriter, Partitioned};
use dpsynth_shared::dpsgd::optimizer::Optimizer;
use dpsynth_shared::dpsgd::params::LinearStack;
use dpsynth_shared::dpsgd::{RoundSettings, compute_device};
use dpsynth_shared::entropy::{os_rng, os_seed};
use dpsynth_shared::generators::findiff::diffusion::{self, timestep_exponent};
use dpsynth_shared::generators::findiff::encoding::TabularEncoding;
use dpsynth_shared::generators::findiff::{FinDiffModel, FinDiffPlan, FinDiffRound};
use dpsynth_shared::generators::marginals::{self, MarginalsPlan, Synthesizer, decode_bin};
use dpsynth_shared::generators::pate::gan::PateGan;
use dpsynth_shared::generators::pate::{PatePlan, Threshold};
use dpsynth_shared::output::{
    MANIFEST_FORMAT, Manifest, ManifestColumn, ManifestPrivacy, OutputWriter, SyntheticValue, output_schema,
    rows_to_batch,
};
use dpsynth_shared::spec::{FinDiffParams, GeneratorSpec, JobSpec};
use dpsynth_shared::storage::{self, StoreLocation};
use dpsynth_shared::wire::encode_task;

use crate::checkpoint::{self, ChargedRun, Checkpointer};
use crate::gather::{Answer, Gather, Round};
use crate::scheduler::Scheduler;
use crate::scratch;
use crate::telemetry::Telemetry;
use crate::training::{self, TrainingRun};

/// Why a job did not complete.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Output(#[from] dpsynth_shared::output::OutputError),
    #[error(transparent)]
    Storage(#[from] dpsynth_shared::storage::StorageError),
    #[error(transparent)]
    Plan(#[from] dpsynth_shared::generators::PlanError),
    #[error(transparent)]
    Privacy(#[from] dpsynth_shared::accounting::PrivacyError),
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
    #[error(transparent)]
    Spec(#[from] dpsynth_shared::spec::SpecError),
    /// A release must never share a prefix with private or operator-only state.
    #[error("the output location {output} overlaps the coordinator's {store} store; choose another output prefix")]
    OutputOverlaps { output: String, store: &'static str },
    #[error("{0}")]
    Other(String),
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
        )
    }

    /// What the submitter may see. Ledger, spec, plan and calibration errors depend only on
    /// public inputs (the spec, the ledger, released and charged statistics); any other
    /// failure can follow a private read and might describe it (a row, a column, a worker's
    /// aggregate), so the submitter gets a fixed sentence and the operator's log the detail.
    pub fn submitter_message(&self) -> String {
        match self {
            JobError::Ledger(_)
            | JobError::OverJobEpsilon { .. }
            | JobError::OverRemainingBudget { .. }
            | JobError::Spec(_)
            | JobError::Plan(_)
            | JobError::Privacy(_)
            | JobError::Unpaid(_)
            | JobError::OutputOverlaps { .. }
            | JobError::Storage(_) => self.to_string(),
            JobError::Data(_) => format!("{INPUT_MISMATCH} (details are in the coordinator's operator log)"),
            JobError::Output(_) | JobError::Task { .. } | JobError::BadResult { .. } | JobError::Other(_) => {
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
}

impl JobRequest {
    /// The output prefix: the override or the spec's, where `{job_id}` gives every
    /// (scheduled) run its own prefix.
    pub fn resolved_output_url(&self) -> String {
        self.output_url.clone().unwrap_or_else(|| self.spec.output.url.clone()).replace("{job_id}", &self.job_id)
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
}

/// Shared per-job progress, updated by the runner.
pub type ProgressHandle = Arc<Mutex<Progress>>;

fn set_stage(progress: &ProgressHandle, stage: &str) {
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
    /// This coordinator's liveness in the scratch store, shared by its jobs.
    pub heartbeat: scratch::Heartbeat,
}

/// Runs a job to completion.
#[tracing::instrument(name = "job", skip_all, fields(id = %request.job_id))]
pub async fn run_job(
    request: JobRequest,
    env: &JobEnv,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: ProgressHandle,
) -> Result<Manifest, JobError> {
    let JobRequest { job_id, spec, .. } = &request;
    let output_url = request.resolved_output_url();
    let ledger_url = request
        .ledger_url
        .clone()
        .or_else(|| spec.privacy.ledger.clone())
        .unwrap_or_else(|| env.default_ledger_url.clone());

    set_stage(&progress, "planning");
    refuse_overlaps(&output_url, &ledger_url, env)?;
    let domain = Domain::from_spec(spec);
    let ledger_location = storage::open(&ledger_url)?;
    let mut ledger = open_ledger(&ledger_location, spec).await?;
    let scratch_store = storage::open(&env.scratch_url)?;
    // Before any partition exists, so a coordinator sharing the store never sweeps ours.
    env.heartbeat.ensure(&scratch_store).await.map_err(|e| JobError::Other(format!("scratch heartbeat: {e}")))?;
    let ctx = JobContext { request: &request, domain: &domain, scheduler, telemetry, progress: &progress };
    let released = match &spec.generator {
        GeneratorSpec::Marginals(_) => run_marginals(&ctx, &mut ledger, &scratch_store, &output_url).await,
        GeneratorSpec::Findiff(params) => run_findiff(&ctx, params, &mut ledger, &scratch_store, &output_url).await,
        GeneratorSpec::Pate(_) => run_pate(&ctx, &mut ledger, &scratch_store, &output_url).await,
    };
    // Only this process's partitions of the job: another coordinator sharing the scratch
    // store may hold the same job id.
    scratch::delete_prefix(&scratch_store, &scratch::partition_prefix(job_id)).await;
    let Released { output, receipt, cost, mechanisms, mut public_inputs } = released?;
    // The charge is released, so no checkpoint of it may be resumed: its leases are moot.
    scratch::delete_prefix(&scratch_store, &format!("{}/{job_id}", scratch::LEASES)).await;

    public_inputs.splice(0..0, declared_inputs(spec));
    let manifest = output
        .finish(Manifest {
            format: MANIFEST_FORMAT.to_string(),
            dpsynth_version: env!("CARGO_PKG_VERSION").to_string(),
            job_id: job_id.clone(),
            generator: spec.generator.name().as_str().to_string(),
            created_at: chrono::Utc::now(),
            rows: 0,
            columns: output_schema(spec)
                .fields()
                .iter()
                .map(|f| ManifestColumn { name: f.name().clone(), data_type: f.data_type().to_string() })
                .collect(),
            parts: Vec::new(),
            privacy: ManifestPrivacy {
                epsilon: cost.epsilon,
                delta: cost.delta,
                accountant: cost.accountant,
                mechanisms,
                dataset_id: spec.job.dataset_id.clone(),
                ledger_url: ledger_url.clone(),
                ledger_entry: receipt.seq,
                public_inputs,
            },
        })
        .await?;
    set_stage(&progress, "done");
    Ok(manifest)
}

/// Writes the evaluation report the spec asks for (if any) to the diagnostics store, after
/// the job has ended: the submitter's status never waits on it (its duration follows the
/// private tables' sizes). Computed on private data (training and held-out rows): a
/// diagnostic for the data owner, written to the operator's store and never beside the
/// release; its figures stay out of the log and the job status.
/// Its stage lines (timings follow the tables' sizes) go to the operator log only.
#[tracing::instrument(name = "evaluation", skip_all, fields(job = %request.job_id))]
pub async fn evaluate_for_owner(request: &JobRequest, env: &JobEnv) {
    // `start_job` refuses an evaluation on a coordinator without a diagnostics store.
    let spec = &request.spec;
    let (Some(evaluation), Some(diagnostics)) = (&spec.evaluation, &env.diagnostics_url) else { return };
    let diagnostics = format!("{}/{}", diagnostics.trim_end_matches('/'), request.job_id);
    let (train, test) = (&spec.input.urls, &evaluation.test_urls);
    let synthetic = request.resolved_output_url();
    match dpsynth_shared::eval::run(spec, train, test, &synthetic, &diagnostics).await {
        Ok(_) => tracing::info!(diagnostics, "evaluation report written to the diagnostics store"),
        Err(e) => tracing::warn!(error = %e, "evaluation failed; the synthetic output is complete regardless"),
    }
}

/// Claims the one release of `receipt`'s charge in the ledger: after this, and only after
/// this, may parts be written. A charge already released (by another coordinator, or a
/// resumed copy of this job) is refused here.
async fn claim_release(ledger: &mut Ledger, receipt: &ChargeReceipt, output: &OutputWriter) -> Result<(), JobError> {
    ledger.record_release(receipt.seq, output.url()).await?;
    Ok(())
}

/// Refuses an output prefix that is, contains or lies under the ledger, scratch or
/// diagnostics store: a submitter reads everything under the prefix it names.
fn refuse_overlaps(output_url: &str, ledger_url: &str, env: &JobEnv) -> Result<(), JobError> {
    let stores = [
        ("ledger", Some(ledger_url)),
        ("scratch", Some(env.scratch_url.as_str())),
        ("diagnostics", env.diagnostics_url.as_deref()),
    ];
    for (store, url) in stores {
        if url.is_some_and(|url| storage::nested(output_url, url)) {
            return Err(JobError::OutputOverlaps { output: output_url.to_string(), store });
        }
    }
    Ok(())
}

/// Opens the dataset's ledger, creating it when the spec declares the dataset's budget.
async fn open_ledger(location: &StoreLocation, spec: &JobSpec) -> Result<Ledger, JobError> {
    let dataset = &spec.job.dataset_id;
    match (Ledger::open(location, dataset).await, spec.privacy.dataset_budget) {
        (Err(LedgerError::NotInitialised { .. }), Some(budget)) => {
            tracing::info!(dataset, epsilon = budget.epsilon, delta = budget.delta, "creating the dataset's ledger");
            match Ledger::init(location, dataset, budget, Adjacency::AddRemove, AccountingOptions::default()).await {
                Err(LedgerError::AlreadyExists { .. }) => Ok(Ledger::open(location, dataset).await?),
                other => Ok(other?),
            }
        }
        (Ok(ledger), Some(declared)) if declared != ledger.budget() => {
            // The ledger's budget is the one that binds; a spec cannot change it.
            tracing::warn!(
                dataset,
                ledger_epsilon = ledger.budget().epsilon,
                spec_epsilon = declared.epsilon,
                "the spec's dataset_budget differs from the existing ledger's; the ledger's applies"
            );
            Ok(ledger)
        }
        (result, _) => Ok(result?),
    }
}

/// A job's partitions in the scratch store. Their unit counts are private: a release
/// alone makes one public, and they bound what a worker may return for a partition.
pub struct Partitions {
    pub urls: Vec<String>,
    pub units: Private<u64>,
    pub units_per_partition: Private<Vec<u64>>,
}

/// What every generator needs from its job.
struct JobContext<'a> {
    request: &'a JobRequest,
    domain: &'a Domain,
    scheduler: &'a Scheduler,
    telemetry: &'a Telemetry,
    progress: &'a ProgressHandle,
}

/// A generator's released output, with what was charged for it.
struct Released {
    output: OutputWriter,
    /// The charge whose release this output is.
    receipt: ChargeReceipt,
    /// The job's whole cost (all its ledger entries), as its accountant states it.
    cost: PrivacyCost,
    mechanisms: Vec<Mechanism>,
    /// Released statistics the output depends on, for the manifest.
    public_inputs: Vec<String>,
}

impl JobContext<'_> {
    fn spec(&self) -> &JobSpec {
        &self.request.spec
    }

    /// Checks the charge with the ledger, updating the dataset gauges.
    async fn admit(&self, ledger: &mut Ledger, charge: &ChargeRequest) -> Result<Admission, JobError> {
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
    async fn charge(&self, ledger: &mut Ledger, charge: &ChargeRequest) -> Result<ChargeReceipt, JobError> {
        set_stage(self.progress, "charging the ledger");
        let receipt = ledger.charge(charge).await?;
        self.telemetry.dataset(
            &self.spec().job.dataset_id,
            receipt.admission.after.epsilon,
            receipt.admission.budget.epsilon,
        );
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).epsilon_spent = receipt.admission.cost.epsilon;
        Ok(receipt)
    }

    /// Splits the private input by privacy unit into the scratch store.
    async fn partition(&self, scratch: &StoreLocation) -> Result<Partitions, JobError> {
        set_stage(self.progress, "partitioning");
        let spec = self.spec();
        let key = PartitionKey::generate()?;
        // Under this process's prefix: a resumed job (a new process) never reuses a URL
        // whose contents a worker may still hold from before.
        let prefix = scratch::partition_prefix(&self.request.job_id);
        let mut writer = PartitionWriter::new(scratch, &prefix, self.domain, spec.job.partitions, key)?;
        let mut input = InputReader::new(spec, self.domain);
        while let Some(batch) = input.next_batch().await? {
            writer.write(batch).await?;
        }
        if let Some(skipped) = input.skipped().filter(|s| s.rows > 0) {
            // Row-level and private: the operator's log only.
            let by_column: Vec<String> =
                skipped.by_column.iter().map(|((column, reason), n)| format!("{column}: {reason} ×{n}")).collect();
            tracing::warn!(rows = skipped.rows, ?by_column, "rows left out: they break the job's schema");
        }
        let Partitioned { urls, units, units_per_partition } = writer.finish().await?;
        Ok(Partitions { urls, units: Private::new(units), units_per_partition: Private::new(units_per_partition) })
    }

    fn charge_request(&self, mechanisms: Vec<Mechanism>) -> ChargeRequest {
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
fn release_count(releases: &mut Releases, partitions: &Partitions, sigma: f64) -> Result<f64, JobError> {
    let units = partitions.units.map(|&n| vec![n as f64]);
    let noisy = releases.gaussian_each(units, 1.0, sigma)?;
    Ok(noisy[0].round().max(1.0))
}

/// DP marginals: one Gaussian release of all tables, then sampling.
async fn run_marginals(
    ctx: &JobContext<'_>,
    ledger: &mut Ledger,
    scratch: &StoreLocation,
    output_url: &str,
) -> Result<Released, JobError> {
    let spec = ctx.spec();
    let plan = MarginalsPlan::new(spec, ctx.domain)?;
    let accounting = ledger.options().clone();
    let sigma = calibrate_sigma(spec.privacy.epsilon, spec.privacy.delta, spec.privacy.accountant, &accounting, |s| {
        vec![plan.mechanism(s)]
    })?;
    let charge = ctx.charge_request(vec![plan.mechanism(sigma)]);
    ctx.admit(ledger, &charge).await?;
    let output = OutputWriter::create(storage::open(output_url)?).await?;
    let partitioned = ctx.partition(scratch).await?;
    let counts = aggregate_marginals(ctx, &partitioned, &plan).await?;
    let receipt = ctx.charge(ledger, &charge).await?;
    set_stage(ctx.progress, "adding noise");
    let noisy = Releases::paid_by(&receipt)?.gaussian(counts, plan.task.sensitivity(), sigma)?;
    let synthesizer = Synthesizer::new(plan.clone(), &noisy);
    drop(noisy);

    set_stage(ctx.progress, "writing output");
    claim_release(ledger, &receipt, &output).await?;
    let rows = spec.output.rows.unwrap_or_else(|| synthesizer.noisy_total.round().max(1.0) as u64);
    let output = write_marginal_parts(spec, output, &synthesizer, rows).await?;
    let cost = receipt.admission.cost.clone();
    Ok(Released { output, receipt, cost, mechanisms: charge.mechanisms, public_inputs: Vec::new() })
}

async fn aggregate_marginals(
    ctx: &JobContext<'_>,
    partitioned: &Partitions,
    plan: &MarginalsPlan,
) -> Result<Private<Vec<f64>>, JobError> {
    set_stage(ctx.progress, "aggregating on workers");
    let groups: Vec<Vec<String>> = partitioned.urls.iter().map(|url| vec![url.clone()]).collect();
    let params = Arc::new(serde_json::to_vec(&plan.task).map_err(|e| JobError::Other(e.to_string()))?);
    let round = Round { kind: marginals::TASK_KIND, params, groups: &groups, tensor: "counts", len: plan.task.cells() };
    ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_total = groups.len() as u32;
    let started = std::time::Instant::now();
    // The partition's own unit count caps the worker's claim.
    let check = |a: Answer<'_>| {
        partitioned.units_per_partition.check(|units| plan.task.validate(a.values, a.claimed_units.min(units[a.group])))
    };
    let progress = |done: usize, total: usize| {
        ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_done = done as u32;
        let eta_s = (started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64).round();
        tracing::info!(done, total, eta_s, "task done");
    };
    Gather::new(ctx.scheduler, ctx.telemetry, &ctx.request.job_id).round(round, check, progress).await
}

/// DP-FinDiff: a DP unit count fixes the sampling rate; the whole DP-SGD run is charged
/// before the first round; the trained model is sampled into the output. A checkpoint of
/// the charged run is written right after the charge and every `checkpoint_every` rounds;
/// a coordinator restarted on the same job id resumes from it without charging again,
/// once, under a resume lease.
async fn run_findiff(
    ctx: &JobContext<'_>,
    params: &FinDiffParams,
    ledger: &mut Ledger,
    scratch: &StoreLocation,
    output_url: &str,
) -> Result<Released, JobError> {
    let spec = ctx.spec();
    let job_id = &ctx.request.job_id;
    let device = compute_device();
    let resumed = checkpoint::load(scratch, job_id).await?;
    let (run, mut optimizer, mut parameters, partitioned, output) = match resumed {
        Some(mut saved) => {
            saved.run.receipt = checkpoint::verify_charged(ledger, job_id, &saved.run.charge, &saved.run.receipt)?;
            if saved.run.model.domain != *ctx.domain {
                return Err(JobError::Other(format!(
                    "job {job_id} has a checkpoint for another schema; resubmit it unchanged or under a new job id"
                )));
            }
            checkpoint::take_resume_lease(scratch, job_id, saved.run.receipt.seq, saved.optimizer.step).await?;
            tracing::info!(
                round = saved.optimizer.step,
                rounds = saved.run.steps,
                ledger_entry = saved.run.receipt.seq,
                "resuming the charged DP-SGD run from its checkpoint"
            );
            let output = OutputWriter::create(storage::open(output_url)?).await?;
            // The previous coordinator's partitions are its own (swept once it is gone).
            let partitioned = ctx.partition(scratch).await?;
            (saved.run, saved.optimizer, saved.parameters, partitioned, output)
        }
        None => {
            let plan = FinDiffPlan::new(spec, ctx.domain)?;
            let accounting = ledger.options().clone();
            // Before touching the data, against a bound that does not depend on it: a run
            // calibrated to the job's (ε, δ) costs exactly that whatever q turns out to be,
            // and a given noise multiplier is refused below if it would cost more.
            // The ledger composes under both accountants, so the actual q's total can differ
            // from the provisional one's: the declared ε must also fit what is left.
            let provisional = plan.provisional_rate();
            let cap = plan.calibrate(spec, &accounting, provisional)?;
            let admission = ctx.admit(ledger, &ctx.charge_request(plan.mechanisms(provisional, cap))).await?;
            let remaining = admission.budget.epsilon - admission.before.epsilon;
            if spec.privacy.epsilon > remaining {
                return Err(JobError::OverRemainingBudget {
                    epsilon: spec.privacy.epsilon,
                    remaining,
                    budget: admission.budget.epsilon,
                });
            }
            let output = OutputWriter::create(storage::open(output_url)?).await?;
            let partitioned = ctx.partition(scratch).await?;
            // The unit count, released with Gaussian noise and charged on its own before
            // anything derived from it (q, T, σ, a refusal, a log line) can leave. Rounded at
            // once: the noisy double's low bits are never used.
            let count_charge = ctx.charge_request(vec![plan.count_mechanism()]);
            let count_receipt = ctx.charge(ledger, &count_charge).await?;
            let noisy_units =
                release_count(&mut Releases::paid_by(&count_receipt)?, &partitioned, params.count_noise_multiplier)?;
            let rate = plan.rate(noisy_units);
            let sigma = match params.noise_multiplier {
                Some(sigma) => sigma,
                None => plan.calibrate(spec, &accounting, rate)?,
            };
            let mechanisms = plan.mechanisms(rate, sigma);
            // A given σ must still fit the job's own ε (a calibrated one does by construction).
            let cost = ledger.price(&ctx.charge_request(mechanisms.clone()))?;
            if cost.epsilon > spec.privacy.epsilon * (1.0 + 1e-9) {
                return Err(JobError::OverJobEpsilon {
                    cost: cost.epsilon,
                    delta: cost.delta,
                    epsilon: spec.privacy.epsilon,
                    count_entry: count_receipt.seq,
                });
            }
            let charge = ctx.charge_request(vec![plan.run_mechanism(rate, sigma)]);
            let receipt = ctx.charge(ledger, &charge).await?;
            let steps = plan.steps(rate);
            tracing::info!(sigma, steps, epsilon = cost.epsilon, "DP-SGD run charged");
            let model = FinDiffModel::new(&plan.model, &device);
            let parameters: Vec<f64> = model.parameters().into_iter().map(f64::from).collect();
            let optimizer = Optimizer::new(params.optimizer, params.schedule, steps, parameters.len());
            let run = ChargedRun {
                model: plan.model,
                noisy_units,
                rate,
                sigma,
                steps,
                count_entry: count_receipt.seq,
                mechanisms,
                cost,
                charge,
                receipt,
            };
            checkpoint::save(scratch, job_id, &run, &optimizer, &parameters).await?;
            (run, optimizer, parameters, partitioned, output)
        }
    };
    ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).epsilon_spent = run.cost.epsilon;

    set_stage(ctx.progress, "training (DP-SGD)");
    ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_total = run.steps as u32;
    let training = TrainingRun {
        job_id,
        partitions: &partitioned.urls,
        partition_units: &partitioned.units_per_partition,
        receipt: &run.receipt,
        rate: run.rate,
        clip: params.clip,
        noise_multiplier: run.sigma,
        expected_batch: run.rate * run.noisy_units.max(1.0),
        micro_batch: params.micro_batch,
        steps: run.steps,
        epsilon: run.cost.epsilon,
    };
    let encode = |settings: &RoundSettings, weights: &[f32]| {
        let epoch = settings.round as f64 * run.rate;
        let round = FinDiffRound {
            settings: settings.clone(),
            model: run.model.clone(),
            timestep_exponent: timestep_exponent(params.alpha_start, params.alpha_end, epoch, params.epochs),
        };
        encode_task(&round, weights)
    };
    let checkpointer = Checkpointer { scratch, job_id, run: &run, every: params.checkpoint_every };
    let trained = training::train(
        &training,
        &mut parameters,
        &mut optimizer,
        encode,
        &checkpointer,
        ctx.scheduler,
        ctx.telemetry,
        ctx.progress,
    )
    .await;
    // From here on the run is not resumable: a failed run stays charged and releases
    // nothing; a finished one is about to release, and resuming it would add rounds the
    // ledger never charged. A checkpoint that cannot be deleted stops the job before any
    // release (the ledger also refuses to resume a released charge).
    let deleted = checkpoint::delete(scratch, job_id).await;
    trained?;
    deleted?;

    set_stage(ctx.progress, "sampling");
    claim_release(ledger, &run.receipt, &output).await?;
    let mut model = FinDiffModel::new(&run.model, &device);
    let weights: Vec<f32> = parameters.iter().map(|&v| v as f32).collect();
    model.load_parameters(&weights).map_err(|e| JobError::Other(e.to_string()))?;
    let rows = spec.output.rows.unwrap_or_else(|| run.noisy_units.round().max(1.0) as u64);
    let output = write_findiff_parts(spec, output, model, &run.model.encoding, rows, params.sampling_steps).await?;
    let public_inputs = vec![
        format!(
            "privacy units: {} (Gaussian release, noise multiplier {}; charged in ledger entry {})",
            run.noisy_units, params.count_noise_multiplier, run.count_entry
        ),
        format!("DP-SGD: q = {:.6}, σ = {:.4}, C = {}, {} steps", run.rate, run.sigma, params.clip, run.steps),
    ];
    Ok(Released { output, receipt: run.receipt, cost: run.cost, mechanisms: run.mechanisms, public_inputs })
}

/// PATE-TabTransGAN: the plan fixes σ and how many iterations of queries the job's ε pays
/// for (data-independent GNMax cost); all of it, and the unit count when the output is
/// sized by it, is charged before the first vote is aggregated. Teachers vote on the
/// workers; the noisy labels train the student and generator here; the generator is
/// sampled into the output.
async fn run_pate(
    ctx: &JobContext<'_>,
    ledger: &mut Ledger,
    scratch: &StoreLocation,
    output_url: &str,
) -> Result<Released, JobError> {
    let spec = ctx.spec();
    let job_id = &ctx.request.job_id;
    let plan = PatePlan::new(spec, ctx.domain, ledger.options())?;
    let charge = ctx.charge_request(plan.mechanisms());
    ctx.admit(ledger, &charge).await?;
    tracing::info!(
        teachers = plan.teachers,
        sigma = plan.sigma,
        iterations = plan.iterations,
        queries = plan.queries(),
        "PATE plan: the job's ε pays for this many answered queries"
    );
    let output = OutputWriter::create(storage::open(output_url)?).await?;
    let partitioned = ctx.partition(scratch).await?;
    let receipt = ctx.charge(ledger, &charge).await?;
    let mut releases = Releases::paid_by(&receipt)?;
    let mut public_inputs = Vec::new();
    let rows = match spec.output.rows {
        Some(rows) => rows,
        None => {
            let noise = plan.params.count_noise_multiplier;
            // Rounded at once: the noisy double's low bits are never used.
            let noisy_units = release_count(&mut releases, &partitioned, noise)?;
            public_inputs
                .push(format!("privacy units: {noisy_units} (Gaussian release, noise multiplier {noise}; charged)"));
            noisy_units as u64
        }
    };

    set_stage(ctx.progress, "teachers voting (PATE)");
    // The label queries are one more round of tasks.
    ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_total =
        plan.iterations + u32::from(plan.label_queries > 0);
    let device = compute_device().autodiff();
    let gan = PateGan::new(plan.encoding.clone(), plan.params.clone(), device, os_seed()?);
    let run = crate::pate::VoteRun {
        job_id,
        partitions: &partitioned.urls,
        plan: &plan,
        epsilon: receipt.admission.cost.epsilon,
    };
    let (gan, labels, summary) =
        crate::pate::train(&run, &mut releases, gan, ctx.scheduler, ctx.telemetry, ctx.progress).await?;
    tracing::info!(
        asked = plan.queries(),
        released = summary.released,
        real_share = summary.real_share,
        "PATE training done"
    );

    set_stage(ctx.progress, "sampling");
    claim_release(ledger, &receipt, &output).await?;
    let gan = Arc::new(Mutex::new(gan));
    let labels = Arc::new(labels);
    let encoding = Arc::new(plan.encoding.clone());
    let output = write_parts(spec, output, rows, |n| {
        let (gan, labels, encoding) = (gan.clone(), labels.clone(), encoding.clone());
        async move {
            tokio::task::spawn_blocking(move || -> Result<Vec<Vec<SyntheticValue>>, JobError> {
                let mut x = gan.lock().unwrap_or_else(|e| e.into_inner()).sample_output(n as usize);
                if let Some(labels) = labels.as_ref() {
                    // Post-processing: the label model draws each row's target.
                    labels.relabel(&encoding, &mut x, &mut os_rng()?);
                }
                Ok(x.chunks(encoding.width).map(|row| encoding.decode_row(row)).collect())
            })
            .await
            .map_err(|e| JobError::Other(e.to_string()))?
        }
    })
    .await?;
    let threshold = match plan.threshold {
        Some(Threshold { count: t, sigma: s }) => {
            format!(
                "; confident GNMax (threshold {t} teachers, σ₁ = {s}): each query charged as answered, {} cleared the threshold and were released",
                summary.released
            )
        }
        None => String::new(),
    };
    public_inputs.push(format!(
        "PATE: {} teachers, GNMax σ = {} on the vote counts, {} answered queries ({} iterations × {} real-or-generated, {} target labels){threshold}",
        plan.teachers,
        plan.sigma,
        plan.queries(),
        plan.iterations,
        plan.params.queries_per_iteration,
        plan.label_queries
    ));
    let cost = receipt.admission.cost.clone();
    Ok(Released { output, receipt, cost, mechanisms: charge.mechanisms, public_inputs })
}

/// Samples `rows` synthetic rows from the trained denoiser, streaming one part at a time.
async fn write_findiff_parts(
    spec: &JobSpec,
    output: OutputWriter,
    model: FinDiffModel,
    encoding: &TabularEncoding,
    rows: u64,
    sampling_steps: u32,
) -> Result<OutputWriter, JobError> {
    const CHUNK: u64 = 2048;
    let model = Arc::new(model);
    let encoding = Arc::new(encoding.clone());
    write_parts(spec, output, rows, |n| {
        let (model, encoding) = (model.clone(), encoding.clone());
        async move {
            tokio::task::spawn_blocking(move || -> Result<Vec<Vec<SyntheticValue>>, JobError> {
                // Sampling is post-processing; its randomness is not private.
                let mut rng = os_rng()?;
                let device = compute_device();
                let mut out = Vec::with_capacity(n as usize);
                let mut done = 0;
                while done < n {
                    let m = (n - done).min(CHUNK) as usize;
                    let x = diffusion::sample(
                        &model.denoiser,
                        &model.schedule,
                        m,
                        encoding.width,
                        sampling_steps,
                        &device,
                        &mut rng,
                    );
                    out.extend(x.chunks(encoding.width).map(|row| encoding.decode_row(row)));
                    done += m as u64;
                }
                Ok(out)
            })
            .await
            .map_err(|e| JobError::Other(e.to_string()))?
        }
    })
    .await
}

/// Writes `rows` rows part by part (memory bounded by `rows_per_part`); `part(n)` draws
/// the next `n` synthetic rows.
async fn write_parts<F, Fut>(
    spec: &JobSpec,
    mut output: OutputWriter,
    rows: u64,
    mut part: F,
) -> Result<OutputWriter, JobError>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Vec<SyntheticValue>>, JobError>>,
{
    let mut written = 0;
    while written < rows {
        let n = (rows - written).min(spec.output.rows_per_part);
        output.write_part(&rows_to_batch(spec, &part(n).await?, written)).await?;
        written += n;
        tracing::info!(rows = written, of = rows, "synthetic rows written");
    }
    Ok(output)
}

/// Samples `rows` synthetic rows from the noisy tables.
async fn write_marginal_parts(
    spec: &JobSpec,
    output: OutputWriter,
    synthesizer: &Synthesizer,
    rows: u64,
) -> Result<OutputWriter, JobError> {
    // Sampling from the noisy tables is post-processing; any good generator will do.
    let mut rng = os_rng()?;
    let columns = synthesizer.domain().columns.len();
    write_parts(spec, output, rows, |n| {
        let part = (0..n)
            .map(|_| {
                let bins = synthesizer.sample_bins(&mut rng);
                (0..columns).map(|c| decode_bin(synthesizer.domain(), c, bins[c], &mut rng)).collect()
            })
            .collect();
        std::future::ready(Ok(part))
    })
    .await
}

fn declared_inputs(spec: &JobSpec) -> Vec<String> {
    let mut out: Vec<String> = spec
        .schema
        .columns
        .iter()
        .map(|c| format!("{}: kind, bounds, categories and bins as declared in the job spec", c.name))
        .collect();
    if let Some(rows) = spec.output.rows {
        out.push(format!("output rows: {rows} (declared)"));
    }
    out
}
