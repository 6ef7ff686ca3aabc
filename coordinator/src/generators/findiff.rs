//! DP-FinDiff on the coordinator: a DP unit count fixes the sampling rate, the DP-SGD run
//! is charged before its first round and trained by the engine (`crate::training`), and
//! the trained denoiser is sampled into the output. A checkpoint of the charged run is
//! written right after the charge and every `checkpoint_every` rounds; a coordinator
//! restarted on the same job id resumes from it without charging again, once, under a
//! resume lease.

use dpsynth_privacy::ledger::Ledger;
use dpsynth_privacy::release::Releases;
use dpsynth_proto::gradient_sum::Model;
use dpsynth_shared::accounting::mechanism::Mechanism;
use dpsynth_shared::dpsgd::compute_device;
use dpsynth_shared::dpsgd::optimizer::Optimizer;
use dpsynth_shared::dpsgd::params::TrainableLayers;
use dpsynth_shared::generators::findiff::diffusion::timestep_exponent;
use dpsynth_shared::generators::findiff::{FinDiffModel, FinDiffPlan, FinDiffRound, FinDiffSampler};
use dpsynth_shared::spec::{FinDiffParams, GeneratorSpec};

use super::{Admission, Charged, Fitted, Generator};
use crate::checkpoint::{self, ChargedRun, Checkpoint, Checkpointer};
use crate::context::{JobContext, JobError, Partitions, release_count, set_stage};
use crate::training::{self, TrainingRun};

/// A DP-FinDiff job: a new run, or a charged one resumed from its checkpoint.
pub struct FinDiff {
    params: FinDiffParams,
    start: Start,
}

enum Start {
    /// Planned; nothing charged. Admitted with the run calibrated at a stand-in rate.
    Fresh { plan: Box<FinDiffPlan>, bound: Vec<Mechanism> },
    /// Charged when it first started, as the ledger confirmed; this process holds its
    /// resume lease.
    Resumed(Box<Checkpoint>),
}

impl Generator for FinDiff {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        let GeneratorSpec::Findiff(params) = &ctx.spec().generator else {
            return Err(JobError::Other("not a DP-FinDiff job".into()));
        };
        let (scratch, job_id) = (ctx.scratch, &ctx.request.job_id);
        let start = match checkpoint::load(scratch, job_id).await? {
            Some(mut saved) => {
                saved.run.receipt = checkpoint::verify_charged(ledger, job_id, &saved.run.charge, &saved.run.receipt)?;
                if saved.run.model.domain != *ctx.domain {
                    return Err(JobError::Other(format!(
                        "job {job_id} has a checkpoint for another schema; resubmit it unchanged or under a new job id"
                    )));
                }
                // One coordinator resumes a checkpoint from a given round, and it takes the
                // lease before it reads anything private.
                checkpoint::take_resume_lease(scratch, job_id, saved.run.receipt.seq, saved.optimizer.step).await?;
                tracing::info!(
                    round = saved.optimizer.step,
                    rounds = saved.run.steps,
                    ledger_entry = saved.run.receipt.seq,
                    "resuming the charged DP-SGD run from its checkpoint"
                );
                Start::Resumed(Box::new(saved))
            }
            None => {
                let plan = FinDiffPlan::new(ctx.spec(), ctx.domain)?;
                let provisional = plan.provisional_rate();
                let cap = plan.calibrate(ctx.spec(), ledger.options(), provisional)?;
                Start::Fresh { bound: plan.mechanisms(provisional, cap), plan: Box::new(plan) }
            }
        };
        Ok(Self { params: params.clone(), start })
    }

    /// A new run's mechanisms at a stand-in rate bound its cost, since a calibrated run
    /// costs the job's (ε, δ) whatever the released count makes q.
    fn admission(&self) -> Admission {
        match &self.start {
            Start::Fresh { bound, .. } => Admission::Bound(bound.clone()),
            Start::Resumed(saved) => Admission::Charged { seq: saved.run.receipt.seq },
        }
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let Self { params, start } = self;
        let (scratch, job_id) = (ctx.scratch, ctx.request.job_id.as_str());
        let Checkpoint { run, mut optimizer, mut parameters } = match start {
            Start::Resumed(saved) => *saved,
            Start::Fresh { plan, .. } => charge_run(ctx, ledger, partitions, *plan, &params).await?,
        };
        ctx.progress_mut().epsilon_spent = run.cost.epsilon;
        set_stage(ctx.progress, "training (DP-SGD)");
        ctx.progress_mut().tasks_total = run.steps as u32;
        let training = TrainingRun {
            partitions,
            receipt: &run.receipt,
            rate: run.rate,
            clip: params.clip,
            noise_multiplier: run.sigma,
            expected_batch: run.rate * run.noisy_units.max(1.0),
            micro_batch: params.micro_batch,
            steps: run.steps,
            epsilon: run.cost.epsilon,
        };
        // The model's configuration is fixed for the run: encoded once; each round sets
        // its timestep exponent.
        let fixed =
            dpsynth_proto::FinDiffModel::from(&FinDiffRound { model: run.model.clone(), timestep_exponent: 0.0 });
        let model = |round: u64| {
            let epoch = round as f64 * run.rate;
            let exponent = timestep_exponent(params.alpha_start, params.alpha_end, epoch, params.epochs);
            Model::Findiff(dpsynth_proto::FinDiffModel { timestep_exponent: exponent, ..fixed.clone() })
        };
        let checkpointer = Checkpointer { scratch, job_id, run: &run, every: params.checkpoint_every };
        let trained = training::train(ctx, &training, &mut parameters, &mut optimizer, model, &checkpointer).await;
        // From here on the run is not resumable: a failed run stays charged and releases
        // nothing; a finished one is about to release, and resuming it would add rounds the
        // ledger never charged. A checkpoint that cannot be deleted stops the job before any
        // release (the ledger also refuses to resume a released charge).
        let deleted = checkpoint::delete(scratch, job_id).await;
        trained?;
        deleted?;

        let mut model = FinDiffModel::new(&run.model, &compute_device());
        let weights: Vec<f32> = parameters.iter().map(|&v| v as f32).collect();
        model.load_parameters(&weights).map_err(|e| JobError::Other(e.to_string()))?;
        let encoding = run.model.encoding.clone();
        let sampler = FinDiffSampler { model, encoding, sampling_steps: params.sampling_steps };
        let public_inputs = vec![
            format!(
                "privacy units: {} (Gaussian release, noise multiplier {}; charged in ledger entry {})",
                run.noisy_units, params.count_noise_multiplier, run.count_entry
            ),
            format!("DP-SGD: q = {:.6}, σ = {:.4}, C = {}, {} steps", run.rate, run.sigma, params.clip, run.steps),
        ];
        // The released count is already rounded and at least 1.
        let released_rows = Some(run.noisy_units as u64);
        let ChargedRun { receipt, cost, mechanisms, .. } = run;
        Ok(Fitted {
            sampler: Box::new(sampler),
            released_rows,
            charged: Charged { receipt, cost, mechanisms, public_inputs },
        })
    }
}

/// Charges a new run: the unit count, released with Gaussian noise and charged on its own
/// before anything derived from it (q, T, σ, a refusal, a log line) can leave, then the
/// DP-SGD run at the rate it fixes. Checkpointed at once, so a restart resumes the charge.
async fn charge_run(
    ctx: &JobContext<'_>,
    ledger: &mut Ledger,
    partitions: &Partitions,
    plan: FinDiffPlan,
    params: &FinDiffParams,
) -> Result<Checkpoint, JobError> {
    let spec = ctx.spec();
    let count_charge = ctx.charge_request(vec![plan.count_mechanism()]);
    let count_receipt = ctx.charge(ledger, &count_charge).await?;
    let noisy_units =
        release_count(&mut Releases::paid_by(&count_receipt)?, partitions, params.count_noise_multiplier)?;
    let rate = plan.rate(noisy_units);
    let sigma = match params.noise_multiplier {
        Some(sigma) => sigma,
        None => plan.calibrate(spec, ledger.options(), rate)?,
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
    let parameters: Vec<f64> =
        FinDiffModel::new(&plan.model, &compute_device()).parameters().into_iter().map(f64::from).collect();
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
    checkpoint::save(ctx.scratch, &ctx.request.job_id, &run, &optimizer, &parameters).await?;
    Ok(Checkpoint { run, optimizer, parameters })
}
