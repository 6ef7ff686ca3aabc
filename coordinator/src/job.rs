//! A job's lifecycle, written once for every generator: validate → open the dataset's
//! ledger and the scratch store → plan the generator → admit what the plan states, before
//! any private read → partition → its rounds and charges (`Generator::fit`) → claim the release
//! → write the parts its sampler draws → clean the scratch store → manifest. The
//! coordinator is the only place noise is drawn (`rhosynth_privacy::release`, only for what
//! a charge paid for) and the only ledger writer. A job that fails before its charge
//! spends nothing; a charged job that then fails has spent its budget but released
//! nothing; no manifest is written unless the whole output is. Every charge is released
//! at most once: the ledger's release marker is claimed before the first part.
//!
//! When each generator charges: marginals after aggregating, before their noise is
//! drawn; DP-FinDiff the unit count that fixes q as its own entry, then its whole DP-SGD
//! run before the first round; PATE its whole run before the first vote.
//!
//! What a submitter sees of a failure ([`JobError::submitter_message`]) never depends on
//! private data; the operator's log has the detail.

pub use crate::context::{INPUT_MISMATCH, JobEnv, JobError, JobRequest, Progress, ProgressHandle};
use crate::context::{JobContext, blocking, set_stage};

use arrow_array::RecordBatch;
use arrow_select::concat::concat_batches;
use rand::rngs::ChaCha20Rng;
use rhosynth_privacy::ledger::{ChargeRequest, ChargeStatus, Ledger, LedgerError};
use rhosynth_shared::accounting::accountant::AccountingOptions;
use rhosynth_shared::accounting::mechanism::Adjacency;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::entropy::os_rng;
use rhosynth_shared::generators::database::DatabaseSampler;
use rhosynth_shared::generators::{GeneratorSpec, Sampler};
use rhosynth_shared::output::{
    MANIFEST_FORMAT, Manifest, ManifestPrivacy, ManifestTable, OutputWriter, manifest_columns, rows_to_batch,
};
use rhosynth_shared::spec::{ColumnKind, ColumnSpec, JobSpec};
use rhosynth_shared::storage::{self, StoreLocation};
use tokio::sync::Notify;

use crate::generators::dpsgd::{DpSgdGenerator, DpSgdJob};
use crate::generators::{Admission, Charged, Draws, Fitted, Generator};
use crate::schedule::Schedule;
use crate::scheduler::Scheduler;
use crate::telemetry::Telemetry;
use crate::{run_lease, scratch};

/// Runs a job to completion.
#[tracing::instrument(name = "job", skip_all, fields(id = %request.job_id))]
pub async fn run_job(
    request: JobRequest,
    env: &JobEnv,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: ProgressHandle,
    cancel: &Notify,
) -> Result<Manifest, JobError> {
    let JobRequest { job_id, spec, .. } = &request;
    // Fixed as the job starts, before any private read.
    let schedule = env.release_quantum.map(|quantum| Schedule { started: std::time::Instant::now(), quantum });
    let output_url = request.resolved_output_url();
    set_stage(&progress, "planning");
    warn_equal_width_bins(spec);
    refuse_overlaps(spec, &output_url, &ledger_url(&request, env), env)?;
    // Before the ledger is opened: a second job to the same prefix is refused with nothing
    // charged, and this job's release marker names a prefix no other job writes.
    let output = OutputWriter::create(storage::open(&output_url)?, job_id).await?;
    let claim = output.claim();
    let written = tokio::select! {
        written = claimed(&request, env, scheduler, telemetry, &progress, schedule, output) => written,
        () = cancelled_before_release(cancel, &progress) => {
            stop_cancelled(&request, env).await;
            Err(JobError::Cancelled)
        }
    };
    if written.is_err() {
        // The claim's going shows the prefix's watcher when the job failed: at a boundary.
        if let Some(schedule) = &schedule {
            schedule.hold().await;
        }
        claim.abandon().await;
    }
    written
}

/// Resolves when the job is cancelled before its release began, never once it has: a
/// release runs to its end, so no manifest names parts a cancellation deleted.
async fn cancelled_before_release(cancel: &Notify, progress: &ProgressHandle) {
    cancel.notified().await;
    if progress.lock().unwrap_or_else(|e| e.into_inner()).releasing {
        std::future::pending::<()>().await;
    }
}

/// A cancelled job's cleanup (its future, and with it its `Gather`, dropped where it
/// stood, so the scheduler has forgotten its tasks): its partitions and run lease deleted.
/// What a worker still running one of its tasks writes afterwards is encrypted under the
/// job's lost key and swept with a stopped coordinator's (`scratch::sweep_stale`). A
/// charge already recorded stays: spent, unreleased.
async fn stop_cancelled(request: &JobRequest, env: &JobEnv) {
    tracing::warn!(job = request.job_id, "job cancelled before its release");
    if let Ok(scratch) = storage::open(&env.scratch_url) {
        scratch::delete_prefix(&scratch, &scratch::partition_prefix(&request.job_id)).await;
        run_lease::give_back(&scratch, &request.spec.job.dataset_id, &request.job_id).await;
    }
}

/// The ledger store a job charges: the request's, its spec's or the coordinator's default.
fn ledger_url(request: &JobRequest, env: &JobEnv) -> String {
    let spec_ledger = || request.spec.privacy.ledger.clone();
    request.ledger_url.clone().or_else(spec_ledger).unwrap_or_else(|| env.default_ledger_url.clone())
}

/// A job whose output prefix is claimed, from its ledger to its manifest.
async fn claimed(
    request: &JobRequest,
    env: &JobEnv,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: &ProgressHandle,
    schedule: Option<Schedule>,
    output: OutputWriter,
) -> Result<Manifest, JobError> {
    let JobRequest { job_id, spec, .. } = request;
    let ledger_url = &ledger_url(request, env);
    let domain = Domain::from_spec(spec);
    let ledger_location = storage::open(ledger_url)?;
    let mut ledger = open_ledger(&ledger_location, spec).await?;
    // A dataset's budget covers the people of one input: never charged for another file.
    ledger.bind_input(&request.ledger_input.clone().unwrap_or_else(|| spec.input_urls())).await?;
    let scratch_store = storage::open(&env.scratch_url)?;
    // Before any partition exists, so a coordinator sharing the store never sweeps ours.
    env.heartbeat.ensure(&scratch_store).await.map_err(|e| JobError::Scratch {
        doing: "writing this coordinator's heartbeat".into(),
        reason: e.to_string(),
    })?;
    let ctx = JobContext {
        request,
        domain: &domain,
        scratch: &scratch_store,
        keep_trained_model: env.keep_trained_models,
        scheduler,
        telemetry,
        progress,
        schedule,
    };
    let released = synthesize_with_generator(&ctx, &mut ledger, output).await;
    // Only this process's partitions and run lease of the job: another coordinator
    // sharing the scratch store may hold the same job id.
    scratch::delete_prefix(&scratch_store, &scratch::partition_prefix(job_id)).await;
    run_lease::give_back(&scratch_store, &spec.job.dataset_id, job_id).await;
    let (output, Charged { receipt, cost, mechanisms, mut public_inputs }) = released?;
    // The charge is released, so no checkpoint of it may be resumed: its leases are moot.
    scratch::delete_prefix(&scratch_store, &format!("{}/{job_id}", scratch::LEASES)).await;

    public_inputs.splice(0..0, declared_inputs(spec));
    let database = !spec.tables.is_empty();
    let sealed = output.seal(Manifest {
        format: MANIFEST_FORMAT.to_string(),
        rhosynth_version: env!("CARGO_PKG_VERSION").to_string(),
        job_id: job_id.clone(),
        generator: spec.generator.name().as_str().to_string(),
        created_at: chrono::Utc::now(),
        output_url: String::new(),
        rows: 0,
        columns: if database { Vec::new() } else { manifest_columns(&spec.schema.columns) },
        parts: Vec::new(),
        tables: if database { manifest_tables(spec) } else { Vec::new() },
        privacy: ManifestPrivacy {
            epsilon: cost.epsilon,
            delta: cost.delta,
            accountant: cost.accountant,
            mechanisms,
            dataset_id: spec.job.dataset_id.clone(),
            ledger_url: ledger_url.to_string(),
            ledger_entry: receipt.seq,
            public_inputs,
        },
    })?;
    // Before the manifest completes the release: the ledger records which manifest it is.
    ledger.record_published(receipt.seq, &sealed.sha256).await?;
    let manifest = output.finish(sealed).await?;
    set_stage(progress, "done");
    Ok(manifest)
}

macro_rules! generator_dispatch {
    ($($name:ident: $variant:ident($params:ident) by $side:ident $(, $dpsgd:ident)?;)*) => {
        /// [`synthesize`] with the spec's generator: its coordinator's side as the generator
        /// list names it, in the engine's `DpSgdJob` for a DP-SGD generator (whose
        /// parameters must be the list's).
        async fn synthesize_with_generator(
            ctx: &JobContext<'_>,
            ledger: &mut Ledger,
            output: OutputWriter,
        ) -> Result<(OutputWriter, Charged), JobError> {
            match &ctx.spec().generator {
                $(GeneratorSpec::$variant(_) => rhosynth_shared::if_dpsgd!($($dpsgd)? {
                    {
                        fn listed<G: DpSgdGenerator<Params = rhosynth_shared::generators::$name::$params>>() {}
                        listed::<crate::generators::$name::$side>();
                        synthesize::<DpSgdJob<crate::generators::$name::$side>>(ctx, ledger, output).await
                    }
                } else {
                    synthesize::<crate::generators::$name::$side>(ctx, ledger, output).await
                }),)*
            }
        }
    };
}

rhosynth_shared::generator_list!(generator_dispatch);

/// A generator from its plan to its written parts: nothing private is read before the
/// ledger admits the plan, and no part is written before the release is claimed.
async fn synthesize<G: Generator>(
    ctx: &JobContext<'_>,
    ledger: &mut Ledger,
    output: OutputWriter,
) -> Result<(OutputWriter, Charged), JobError> {
    let mut generator = G::plan(ctx, ledger).await?;
    admit(ctx, ledger, generator.admission()).await?;
    generator.prepare(ctx).await?;
    let partitions = generator.partition(ctx).await?;
    let Fitted { sampler, released_count, charged } = generator.fit(ctx, ledger, &partitions).await?;
    let units = ctx.spec().declared_output_size().or(released_count).ok_or_else(|| JobError::NoOutputSize)?;

    // Its first part would show a submitter when fitting ended: at a boundary instead.
    if let Some(schedule) = &ctx.schedule {
        schedule.hold().await;
    }
    set_stage(ctx.progress, "sampling");
    ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).releasing = true;
    // Sampling is post-processing: its randomness is not private.
    let rng = os_rng()?;
    // A charge already released (by another coordinator, or a resumed copy of this job)
    // is refused here.
    ledger.record_release(charged.receipt.seq, output.url()).await?;
    let output = match sampler {
        Draws::Table(sampler) => write_parts(ctx.spec(), output, units, sampler, rng).await?,
        Draws::Database(sampler) => write_database(ctx.spec(), output, units, sampler, rng).await?,
    };
    Ok((output, charged))
}

/// How far under the floor a plan's charge may be: calibrations land just under their
/// target, and a run's admission is priced at its best order (its held orders cost more).
const FLOOR_SLACK: f64 = 0.05;

/// Refuses the job unless the ledger admits `admission`, and (on a served dataset) unless
/// its planned charge reaches the dataset's floor: a job that reads the data costs at least
/// that, so a budget admits a bounded number of them.
async fn admit(ctx: &JobContext<'_>, ledger: &mut Ledger, admission: Admission) -> Result<(), JobError> {
    // Priced at the budget's δ (a job's own tiny δ would state a larger ε), with the slack
    // of a calibration that lands just under its target.
    let floor = |ledger: &Ledger, request: &ChargeRequest| {
        let Some(floor) = ctx.request.charge_floor else { return Ok(()) };
        let at_budget = ChargeRequest { delta: ledger.budget().delta, ..request.clone() };
        let cost = ledger.price(&at_budget)?.epsilon;
        let delta = at_budget.delta;
        if cost < floor * (1.0 - FLOOR_SLACK) { Err(JobError::BelowChargeFloor { cost, delta, floor }) } else { Ok(()) }
    };
    match admission {
        Admission::Cost(mechanisms) => {
            let request = ctx.charge_request(mechanisms);
            ctx.admit(ledger, &request).await?;
            floor(ledger, &request)
        }
        Admission::Bound(mechanisms) => {
            let request = ctx.charge_request(mechanisms);
            let admission = ctx.admit(ledger, &request).await?;
            floor(ledger, &request)?;
            let remaining = admission.budget.epsilon - admission.before.epsilon;
            let epsilon = ctx.spec().privacy.epsilon;
            if epsilon > remaining {
                return Err(JobError::OverRemainingBudget { epsilon, remaining, budget: admission.budget.epsilon });
            }
            Ok(())
        }
        Admission::Charged { seq } => {
            let job_id = &ctx.request.job_id;
            if !matches!(ledger.charged(seq), Some((request, ChargeStatus::Charged)) if &request.job_id == job_id) {
                return Err(JobError::Internal(format!(
                    "ledger entry {seq} is not a charge of job {job_id} awaiting its release"
                )));
            }
            Ok(())
        }
    }
}

/// Writes `units` units drawn by `sampler` (a row each, or a history each), part by part
/// (memory bounded by `rows_per_part`), each part drawn on a blocking thread.
async fn write_parts(
    spec: &JobSpec,
    mut output: OutputWriter,
    units: u64,
    mut sampler: Box<dyn Sampler>,
    mut rng: ChaCha20Rng,
) -> Result<OutputWriter, JobError> {
    let per_part = (spec.output.rows_per_part / sampler.rows_per_draw() as u64).max(1);
    let mut written = 0;
    while written < units {
        let n = (units - written).min(per_part);
        let part;
        (sampler, rng, part) = drawn(sampler, rng, move |s, rng| s.sample(n as usize, rng)).await?;
        if part.units() as u64 != n {
            return Err(JobError::Internal(format!("the sampler drew {} of {n} units", part.units())));
        }
        output.write_part(&rows_to_batch(spec, &part, written)).await?;
        written += n;
        tracing::info!(units = written, of = units, "synthetic units written");
    }
    Ok(output)
}

/// `draw` run on a blocking thread (a part is long to draw), the sampler and its generator
/// handed back with what it drew.
async fn drawn<S: Send + 'static, P: Send + 'static>(
    mut sampler: S,
    mut rng: ChaCha20Rng,
    draw: impl FnOnce(&mut S, &mut ChaCha20Rng) -> P + Send + 'static,
) -> Result<(S, ChaCha20Rng, P), JobError> {
    blocking(move || {
        let part = draw(&mut sampler, &mut rng);
        (sampler, rng, part)
    })
    .await
}

/// Writes `units` units of a database drawn by `sampler`, a batch of units at a time (as
/// many as fill `rows_per_part` rows of a table at its cap products), each batch drawn on
/// a blocking thread. A table's drawn rows are held until they fill a part (most units
/// reach far fewer rows than their caps allow): memory bounded by `rows_per_part` rows and
/// one batch a table.
async fn write_database(
    spec: &JobSpec,
    mut output: OutputWriter,
    units: u64,
    mut sampler: DatabaseSampler,
    mut rng: ChaCha20Rng,
) -> Result<OutputWriter, JobError> {
    let per_part = sampler.units_per_part(spec.output.rows_per_part);
    let names: Vec<String> = sampler.table_names().map(str::to_string).collect();
    let mut held: Vec<Vec<RecordBatch>> = vec![Vec::new(); names.len()];
    let mut written = 0;
    while written < units {
        let n = (units - written).min(per_part);
        let batches;
        (sampler, rng, batches) = drawn(sampler, rng, move |s, rng| s.sample(n as usize, rng)).await?;
        if batches[0].num_rows() as u64 != n {
            return Err(JobError::Internal(format!("the sampler drew {} of {n} units", batches[0].num_rows())));
        }
        written += n;
        for ((name, table), batch) in names.iter().zip(&mut held).zip(batches) {
            table.push(batch);
            let rows: usize = table.iter().map(RecordBatch::num_rows).sum();
            if rows as u64 >= spec.output.rows_per_part || (written == units && rows > 0) {
                let part = concat_batches(&table[0].schema(), table.iter())
                    .map_err(|e| JobError::Internal(format!("joining the drawn rows of table {name}: {e}")))?;
                output.write_table_part(name, &part).await?;
                table.clear();
            }
        }
        tracing::info!(units = written, of = units, "synthetic units drawn with their rows in every table");
    }
    Ok(output)
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
    match rhosynth_shared::eval::run(spec, train, test, &synthetic, &diagnostics).await {
        Ok(_) => tracing::info!(diagnostics, "evaluation report written to the diagnostics store"),
        Err(e) => tracing::warn!(error = %e, "evaluation failed; the synthetic output is complete regardless"),
    }
}

/// Numeric columns that declare no `bins` are cut into equal widths between their bounds,
/// where a skewed column can fall into one bin: said once a job (the spec is public). An
/// integer column with no more values than bins has a bin a value, and is not named.
fn warn_equal_width_bins(spec: &JobSpec) {
    let bins = spec.generator.default_bins();
    let numeric = |c: &&ColumnSpec| match (c.kind, &c.bins) {
        (_, Some(_)) => false,
        (ColumnKind::Integer, None) => c.bounds().is_none_or(|(lo, hi)| hi.floor() - lo.ceil() + 1.0 > f64::from(bins)),
        (ColumnKind::Continuous | ColumnKind::Datetime, None) => true,
        (ColumnKind::Categorical | ColumnKind::Identifier, None) => false,
    };
    let columns: Vec<&str> = spec.schema.columns.iter().filter(numeric).map(|c| c.name.as_str()).collect();
    if !columns.is_empty() {
        tracing::warn!(
            columns = %columns.join(", "),
            bins,
            "numeric columns without `bins` are cut into equal widths between min and max: a skewed column may \
             fall into one bin (declare `bins`, or draft with `rhosynth schema draft --epsilon` for quantile bins)"
        );
    }
}

/// Refuses an output prefix that is, contains or lies under the ledger, scratch or
/// diagnostics store (a submitter reads everything under the prefix it names) or the
/// job's checkpoint (later jobs treat it as public); and a reference set there (it is read
/// as public; the spec's check refuses one in the input, held-out files or the spec's
/// ledger, `generators::reference::check_location`).
fn refuse_overlaps(spec: &JobSpec, output_url: &str, ledger_url: &str, env: &JobEnv) -> Result<(), JobError> {
    let checkpoint = spec.generator.checkpoint();
    let reference = spec.generator.reference();
    let stores = [
        ("ledger", Some(ledger_url)),
        ("scratch", Some(env.scratch_url.as_str())),
        ("diagnostics", env.diagnostics_url.as_deref()),
        ("model", checkpoint),
    ];
    for (store, url) in stores {
        let Some(url) = url.filter(|url| !url.is_empty()) else { continue };
        if storage::nested(output_url, url) {
            return Err(JobError::OutputOverlaps { output: output_url.to_string(), store });
        }
        if let Some(reference) = reference.filter(|reference| store != "model" && storage::nested(reference, url)) {
            return Err(JobError::ReferenceOverlaps { reference: reference.to_string(), store });
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

fn declared_inputs(spec: &JobSpec) -> Vec<String> {
    let mut out: Vec<String> = spec
        .schema
        .columns
        .iter()
        .map(|c| format!("{}: kind, bounds, categories and bins as declared in the job spec", c.name))
        .collect();
    for table in &spec.tables {
        for column in &table.columns {
            out.push(format!(
                "{}.{}: kind, bounds, categories and bins as declared in the job spec",
                table.name, column.name
            ));
        }
        out.push(format!(
            "{}: at most {} rows per row of {} (declared max_per_parent{})",
            table.name,
            table.max_per_parent,
            table.parent.table,
            table.order_by.as_ref().map_or(", a keyed sample".into(), |o| format!(", the first by {o}"))
        ));
    }
    if let Some(rows) = spec.output.rows {
        out.push(format!("output rows: {rows} (declared)"));
    }
    if let Some(units) = spec.output.units {
        out.push(format!("output units: {units} (declared)"));
    }
    out
}

/// A database's tables as its manifest lists them (their rows and parts filled in as the
/// output is sealed).
fn manifest_tables(spec: &JobSpec) -> Vec<ManifestTable> {
    let root = ManifestTable {
        name: spec.schema.table.clone().unwrap_or_default(),
        key: spec.schema.unit_column.clone(),
        parent: None,
        rows: 0,
        columns: manifest_columns(&spec.schema.columns),
        parts: Vec::new(),
    };
    let children = spec.tables.iter().map(|t| ManifestTable {
        name: t.name.clone(),
        key: t.key.clone(),
        parent: Some(t.parent.clone()),
        rows: 0,
        columns: manifest_columns(&t.columns),
        parts: Vec::new(),
    });
    std::iter::once(root).chain(children).collect()
}
