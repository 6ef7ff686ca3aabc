//! A job's lifecycle: validate → check that the ledger can afford the planned cost →
//! partition → run tasks on workers → add noise → charge → release (write output) →
//! manifest. The coordinator is the only place noise is drawn and the only ledger writer.
//! A job that fails before its charge spends nothing; no manifest is written unless the
//! whole output is.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use dpsynth_shared::data::DataError;
use dpsynth_shared::data::domain::Domain;
use dpsynth_shared::data::input::InputReader;
use dpsynth_shared::data::partition::{PartitionKey, PartitionWriter};
use dpsynth_shared::generators::marginals::{self, MarginalsPlan, Synthesizer, decode_bin};
use dpsynth_shared::output::{
    MANIFEST_FORMAT, Manifest, ManifestColumn, ManifestPrivacy, OutputWriter, output_schema, rows_to_batch,
};
use dpsynth_shared::privacy::accountant::{AccountingOptions, calibrate_sigma};
use dpsynth_shared::privacy::ledger::{ChargeRequest, Ledger, LedgerError};
use dpsynth_shared::privacy::mechanism::Adjacency;
use dpsynth_shared::privacy::noise::Noise;
use dpsynth_shared::spec::JobSpec;
use dpsynth_shared::storage::{self, StoreLocation};
use object_store::ObjectStoreExt;
use rand::SeedableRng;
use rand::rngs::{ChaCha20Rng, SysRng};

use crate::scheduler::{Scheduler, TaskDef, TaskEvent};
use crate::telemetry::Telemetry;

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
    Plan(#[from] marginals::PlanError),
    #[error(transparent)]
    Privacy(#[from] dpsynth_shared::privacy::PrivacyError),
    #[error("worker {worker}: task {task_id} failed: {error}")]
    Task { worker: String, task_id: u64, error: String },
    #[error("worker {worker} returned an invalid aggregate for task {task_id}: {reason}")]
    BadResult { worker: String, task_id: u64, reason: String },
    #[error("{0}")]
    Other(String),
}

impl JobError {
    /// The ledger refused the job (budget); not a malfunction.
    pub fn is_refusal(&self) -> bool {
        matches!(self, JobError::Ledger(LedgerError::BudgetExceeded { .. }))
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
    // `{job_id}` in the output URL gives every (scheduled) run its own prefix.
    let output_url = request.output_url.clone().unwrap_or_else(|| spec.output.url.clone()).replace("{job_id}", job_id);
    let ledger_url = request
        .ledger_url
        .clone()
        .or_else(|| spec.privacy.ledger.clone())
        .unwrap_or_else(|| env.default_ledger_url.clone());

    // 1. Plan and price, from public information only.
    set_stage(&progress, "planning");
    let domain = Domain::from_spec(spec);
    let plan = MarginalsPlan::new(spec, &domain)?;
    let ledger_location = storage::open(&ledger_url)?;
    let mut ledger = open_ledger(&ledger_location, spec).await?;
    let accounting = ledger.options().clone();
    let sigma = calibrate_sigma(spec.privacy.epsilon, spec.privacy.delta, spec.privacy.accountant, &accounting, |s| {
        vec![plan.mechanism(s)]
    })?;
    let charge = ChargeRequest {
        job_id: job_id.clone(),
        mechanisms: vec![plan.mechanism(sigma)],
        accountant: spec.privacy.accountant,
        delta: spec.privacy.delta,
    };
    let admission = ledger.check(&charge).await;
    if let Ok(spent) = ledger.spent() {
        telemetry.dataset(&spec.job.dataset_id, spent.epsilon, ledger.budget().epsilon);
    }
    let admission = admission?;
    tracing::info!(
        sigma,
        epsilon = admission.cost.epsilon,
        remaining_after = admission.remaining_epsilon(),
        "ledger admits the job's planned cost"
    );
    let output = OutputWriter::create(storage::open(&output_url)?).await?;

    // 2. Partition by privacy unit into the scratch store.
    set_stage(&progress, "partitioning");
    let scratch = storage::open(&env.scratch_url)?;
    let result = partition_and_aggregate(&request, &scratch, &domain, &plan, scheduler, telemetry, &progress).await;
    cleanup_scratch(&scratch, job_id).await;
    let mut counts = result?;

    // 3. Noise, once per cell, here and only here.
    set_stage(&progress, "adding noise");
    let std = sigma * plan.task.sensitivity();
    Noise::from_os()?.add_gaussian(&mut counts, std);
    let synthesizer = Synthesizer::new(plan.clone(), &counts);
    drop(counts);

    // 4. Charge before anything derived from the noisy counts leaves the coordinator.
    set_stage(&progress, "charging the ledger");
    let receipt = ledger.charge(&charge).await?;
    telemetry.dataset(&spec.job.dataset_id, receipt.admission.after.epsilon, receipt.admission.budget.epsilon);
    progress.lock().unwrap_or_else(|e| e.into_inner()).epsilon_spent = receipt.admission.cost.epsilon;

    // 5. Release: synthetic parts, then the manifest.
    set_stage(&progress, "writing output");
    let rows = spec.output.rows.unwrap_or_else(|| synthesizer.noisy_total.round().max(1.0) as u64);
    let output = write_parts(spec, output, &synthesizer, rows).await?;
    let manifest = output
        .finish(Manifest {
            format: MANIFEST_FORMAT.to_string(),
            dpsynth_version: env!("CARGO_PKG_VERSION").to_string(),
            job_id: job_id.clone(),
            generator: "marginals".to_string(),
            created_at: chrono::Utc::now(),
            rows: 0,
            columns: output_schema(spec)
                .fields()
                .iter()
                .map(|f| ManifestColumn { name: f.name().clone(), data_type: f.data_type().to_string() })
                .collect(),
            parts: Vec::new(),
            privacy: ManifestPrivacy {
                epsilon: receipt.admission.cost.epsilon,
                delta: receipt.admission.cost.delta,
                accountant: receipt.admission.cost.accountant,
                mechanisms: charge.mechanisms.clone(),
                dataset_id: spec.job.dataset_id.clone(),
                ledger_url: ledger_url.clone(),
                ledger_entry: receipt.seq,
                public_inputs: public_inputs(spec),
            },
        })
        .await?;
    ledger.record_release(receipt.seq, &output_url).await?;
    if let Some(evaluation) = &spec.evaluation {
        // Post-processing of the released output plus real data: no budget; diagnostics only.
        set_stage(&progress, "evaluating");
        match dpsynth_shared::eval::run(spec, &spec.input.urls, &evaluation.test_urls, &output_url, &output_url).await {
            Ok(report) => {
                tracing::info!(hist = report.fidelity.hist, pair = report.fidelity.pair, "evaluation report written")
            }
            Err(e) => tracing::warn!(error = %e, "evaluation failed; the synthetic output is complete regardless"),
        }
    }
    set_stage(&progress, "done");
    Ok(manifest)
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

async fn partition_and_aggregate(
    request: &JobRequest,
    scratch: &StoreLocation,
    domain: &Domain,
    plan: &MarginalsPlan,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: &ProgressHandle,
) -> Result<Vec<f64>, JobError> {
    let spec = &request.spec;
    let key = PartitionKey::generate()?;
    let mut writer = PartitionWriter::new(scratch, &request.job_id, domain, spec.job.partitions, key)?;
    let mut input = InputReader::new(spec, domain);
    while let Some(batch) = input.next_batch().await? {
        writer.write(batch).await?;
    }
    let urls = writer.finish().await?;

    set_stage(progress, "aggregating on workers");
    let params = Arc::new(serde_json::to_vec(&plan.task).map_err(|e| JobError::Other(e.to_string()))?);
    let tasks: Vec<TaskDef> = urls
        .into_iter()
        .enumerate()
        .map(|(i, url)| TaskDef {
            job_id: request.job_id.clone(),
            task_id: i as u64,
            kind: marginals::TASK_KIND.to_string(),
            params: params.clone(),
            partition_urls: vec![url],
        })
        .collect();
    let total = tasks.len();
    progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_total = total as u32;
    let started = std::time::Instant::now();
    let mut events = scheduler.submit(&request.job_id, tasks);
    let mut done = HashSet::new();
    let mut sum = vec![0.0; plan.task.cells()];
    let outcome = loop {
        if done.len() == total {
            break Ok(sum);
        }
        match events.recv().await {
            Some(TaskEvent::Done(result)) => {
                let counts = result.tensors.iter().find(|(n, _)| n == "counts").map(|(_, c)| c.as_slice());
                let check = counts.ok_or_else(|| "no 'counts' tensor".to_string()).and_then(|c| {
                    plan.task.validate(c, result.units)?;
                    Ok(c)
                });
                match check {
                    Ok(counts) if done.insert(result.task_id) => {
                        sum.iter_mut().zip(counts).for_each(|(s, c)| *s += c);
                        telemetry.task_done(result.seconds);
                        progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_done = done.len() as u32;
                        let per_task = started.elapsed().as_secs_f64() / done.len() as f64;
                        let eta_s = (per_task * (total - done.len()) as f64).round();
                        tracing::info!(
                            task = result.task_id,
                            worker = result.worker,
                            done = done.len(),
                            total,
                            eta_s,
                            "task done"
                        );
                    }
                    Ok(_) => {}
                    Err(reason) => {
                        break Err(JobError::BadResult { worker: result.worker, task_id: result.task_id, reason });
                    }
                }
            }
            Some(TaskEvent::Requeued { task_id, worker }) => {
                tracing::warn!(task = task_id, worker, "worker lost mid-task; task requeued");
            }
            Some(TaskEvent::Failed { task_id, worker, error }) => {
                break Err(JobError::Task { worker, task_id, error });
            }
            None => break Err(JobError::Other("scheduler stopped".into())),
        }
    };
    scheduler.cancel(&request.job_id);
    outcome
}

/// Deletes the job's partitions: they hold encoded private rows.
async fn cleanup_scratch(scratch: &StoreLocation, job_id: &str) {
    use futures::TryStreamExt;
    let prefix = scratch.child(job_id);
    let listed: Result<Vec<_>, _> = scratch.store.list(Some(&prefix)).map_ok(|m| m.location).try_collect().await;
    match listed {
        Ok(paths) => {
            for path in paths {
                if let Err(e) = scratch.store.delete(&path).await {
                    tracing::warn!(%path, error = %e, "could not delete a scratch partition");
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not list scratch partitions for cleanup"),
    }
}

/// Samples `rows` synthetic rows, part by part (memory bounded by `rows_per_part`).
async fn write_parts(
    spec: &JobSpec,
    mut output: OutputWriter,
    synthesizer: &Synthesizer,
    rows: u64,
) -> Result<OutputWriter, JobError> {
    // Sampling from the noisy tables is post-processing; any good generator will do.
    let mut rng = ChaCha20Rng::try_from_rng(&mut SysRng).map_err(|e| JobError::Other(format!("OS entropy: {e}")))?;
    let columns = synthesizer.domain().columns.len();
    let mut written = 0;
    while written < rows {
        let n = (rows - written).min(spec.output.rows_per_part);
        let part: Vec<Vec<_>> = (0..n)
            .map(|_| {
                let bins = synthesizer.sample_bins(&mut rng);
                (0..columns).map(|c| decode_bin(synthesizer.domain(), c, bins[c], &mut rng)).collect()
            })
            .collect();
        output.write_part(&rows_to_batch(spec, &part, written)).await?;
        written += n;
    }
    Ok(output)
}

fn public_inputs(spec: &JobSpec) -> Vec<String> {
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
