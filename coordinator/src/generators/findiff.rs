//! DP-FinDiff on the coordinator: a DP unit count fixes the sampling rate, the DP-SGD run
//! is charged before its first round and trained by the engine (`crate::training`), and
//! the trained denoiser is sampled into the output.

use std::sync::Arc;

use dpsynth_privacy::ledger::Ledger;
use dpsynth_privacy::release::Releases;
use dpsynth_shared::dpsgd::optimizer::Optimizer;
use dpsynth_shared::dpsgd::params::LinearStack;
use dpsynth_shared::dpsgd::{RoundSettings, compute_device};
use dpsynth_shared::entropy::os_rng;
use dpsynth_shared::generators::findiff::diffusion::{self, timestep_exponent};
use dpsynth_shared::generators::findiff::encoding::TabularEncoding;
use dpsynth_shared::generators::findiff::{FinDiffModel, FinDiffPlan, FinDiffRound};
use dpsynth_shared::output::{OutputWriter, SyntheticValue};
use dpsynth_shared::spec::{FinDiffParams, JobSpec};
use dpsynth_shared::storage;
use dpsynth_shared::wire::encode_task;

use crate::checkpoint::{self, ChargedRun, Checkpointer};
use crate::context::{JobContext, JobError, Released, claim_release, release_count, set_stage, write_parts};
use crate::training::{self, TrainingRun};

/// DP-FinDiff: a DP unit count fixes the sampling rate; the whole DP-SGD run is charged
/// before the first round; the trained model is sampled into the output. A checkpoint of
/// the charged run is written right after the charge and every `checkpoint_every` rounds;
/// a coordinator restarted on the same job id resumes from it without charging again,
/// once, under a resume lease.
pub async fn run(ctx: &JobContext<'_>, params: &FinDiffParams, ledger: &mut Ledger) -> Result<Released, JobError> {
    let (spec, scratch, output_url) = (ctx.spec(), ctx.scratch, ctx.output_url);
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
            let partitioned = ctx.partition().await?;
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
            let partitioned = ctx.partition().await?;
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
