//! What every generator trained by the DP-SGD engine shares on the coordinator: a DP
//! unit count fixes the sampling rate, the run is charged before its first round and
//! trained by `crate::training`, and the trained model becomes the sampler. A checkpoint
//! of the charged run is written right after the charge and every `checkpoint_every`
//! rounds; a coordinator restarted on the same job id resumes from it without charging
//! again, once, under a resume lease.

use object_store::{ObjectStoreExt, PutPayload};
use prost::Message;
use rhosynth_privacy::ledger::Ledger;
use rhosynth_privacy::release::Releases;
use rhosynth_shared::accounting::mechanism::Mechanism;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::dpsgd::RoundSettings;
use rhosynth_shared::dpsgd::optimizer::Optimizer;
use rhosynth_shared::dpsgd::plan::RunPlan;
use rhosynth_shared::dpsgd::trainable::Trains;
use rhosynth_shared::generators::{PlanError, Sampler};
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::wire::to_json;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Admission, Charged, Draws, Fitted, Generator, calibration};
use crate::checkpoint::{self, ChargedRun, Checkpoint, Checkpointer};
use crate::context::{JobContext, JobError, Partitions, blocking, release_count, set_stage};
use crate::gather::Gather;
use crate::training::{self, TrainingRun};
use crate::{run_lease, scratch};

/// The model the workers train in each round, as the JSON its task carries
/// (`GradientSum.model_json`): made by [`same_every_round`] or [`each_round`] from the
/// model the generator's parameters name.
pub(crate) type RoundModel<'a> = Box<dyn Fn(u64) -> String + Send + Sync + 'a>;

/// A model no round changes: serialised once, not every round (a language model's
/// carries its reference set's prompts).
pub(crate) fn same_every_round<P: Trains>(model: &P::Model) -> RoundModel<'static> {
    let json = to_json(model);
    Box::new(move |_| json.clone())
}

/// A model each round sets something of (DP-FinDiff's timestep exponent).
pub(crate) fn each_round<'a, P: Trains>(model: impl Fn(u64) -> P::Model + Send + Sync + 'a) -> RoundModel<'a> {
    Box::new(move |round| to_json(&model(round)))
}

/// A generator whose model the DP-SGD engine trains.
pub(crate) trait DpSgdGenerator {
    /// Its parameters (the generator list's), which name the model its rounds train.
    type Params: Trains;
    /// The model's configuration: what a checkpoint keeps and a worker rebuilds it from.
    type Model: Clone + Serialize + DeserializeOwned + Send + Sync;

    /// The model and the run, from public information only (the spec, the declared
    /// domain, the ledger's accounting options and charges, a public pretrained checkpoint,
    /// a public reference set).
    async fn plan(spec: &JobSpec, domain: &Domain, ledger: &Ledger) -> Result<(Self::Model, RunPlan), JobError>;

    fn domain(model: &Self::Model) -> &Domain;

    /// Public inputs beside the spec's that the model was built from (a checkpoint, a
    /// reference set), for the manifest.
    fn public_inputs(_model: &Self::Model) -> Vec<String> {
        Vec::new()
    }

    /// The model's initial parameters, in the engine's flat layout, from public
    /// information only: in `Generator::prepare`, after admission (it may be long work,
    /// such as pretraining on public pseudo rows) and before any private read.
    async fn initial_parameters(model: &Self::Model) -> Result<Vec<f32>, JobError>;

    /// The model the workers train in each round of a run at rate `rate`.
    fn round_model<'a>(model: &Self::Model, spec: &'a JobSpec, rate: f64) -> Result<RoundModel<'a>, JobError>;

    /// The trained model as the job's sampler. What the run's charge paid for after its
    /// rounds (`RunPlan::after_training`) is spent here.
    async fn sampler(trained: Trained<'_, '_, Self::Model>) -> Result<Box<dyn Sampler>, JobError>;
}

/// A trained run, as its generator turns it into a sampler.
pub(crate) struct Trained<'t, 'a, M> {
    pub model: M,
    pub parameters: Vec<f32>,
    pub ctx: &'t JobContext<'a>,
    /// The job's rounds, for rounds after training.
    pub gather: &'t mut Gather<'a>,
    pub partitions: &'t Partitions,
    /// What the run's charge paid for after training.
    pub releases: &'t mut Releases,
    pub plan: &'t RunPlan,
    /// The released unit count.
    pub released_units: u64,
}

/// A job of a DP-SGD generator: a new run, or a charged one resumed from its checkpoint.
pub struct DpSgdJob<G: DpSgdGenerator> {
    start: Start<G::Model>,
}

enum Start<M> {
    /// Planned; nothing charged. Admitted with the run calibrated at a stand-in rate; its
    /// initial parameters once prepared.
    Fresh { model: M, plan: RunPlan, bound: Vec<Mechanism>, parameters: Option<Vec<f32>> },
    /// Charged when it first started, as the ledger confirmed; this process holds its
    /// resume lease.
    Resumed(Box<Checkpoint<M>>),
}

impl<G: DpSgdGenerator> Generator for DpSgdJob<G> {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        let (scratch, job_id) = (ctx.scratch, &ctx.request.job_id);
        // One process trains a job's run, fresh or resumed: taken before its checkpoint is read.
        run_lease::take(scratch, &ctx.spec().job.dataset_id, job_id, run_lease::PATIENCE).await?;
        let start = match checkpoint::load::<G::Model>(scratch, job_id, ctx.spec().generator.name()).await? {
            Some(mut saved) => {
                saved.run.receipt = checkpoint::verify_charged(ledger, job_id, &saved.run.charge, &saved.run.receipt)?;
                if G::domain(&saved.run.model) != ctx.domain {
                    return Err(JobError::ResumeRefused {
                        job_id: job_id.to_string(),
                        reason: "its checkpoint is for another schema (resubmit it unchanged or under a new job id)"
                            .into(),
                    });
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
                let (model, plan) = G::plan(ctx.spec(), ctx.domain, ledger).await?;
                let provisional = plan.provisional_units();
                let (planned, spec, options) = (plan.clone(), ctx.spec().clone(), ledger.options().clone());
                let cap = blocking(move || planned.calibrate(&spec, &options, provisional)).await??;
                Start::Fresh { bound: plan.mechanisms(plan.rate(provisional), cap), model, plan, parameters: None }
            }
        };
        Ok(Self { start })
    }

    /// A new run's mechanisms at a stand-in rate bound its cost, since a calibrated run
    /// costs the job's (ε, δ) whatever the released count makes q.
    fn admission(&self) -> Admission {
        match &self.start {
            Start::Fresh { bound, .. } => Admission::Bound(bound.clone()),
            Start::Resumed(saved) => Admission::Charged { seq: saved.run.receipt.seq },
        }
    }

    /// A new run's initial parameters, refused if a round's task could not carry them.
    async fn prepare(&mut self, ctx: &JobContext<'_>) -> Result<(), JobError> {
        let Start::Fresh { model, parameters, .. } = &mut self.start else { return Ok(()) };
        set_stage(ctx.progress, "preparing the model");
        let initial = G::initial_parameters(model).await?;
        // Every round's task carries the weights: a model too large for one message is
        // refused here, before any private read.
        let bytes = initial.len().saturating_mul(4);
        if bytes > rhosynth_proto::MAX_MESSAGE_BYTES / 2 {
            return Err(JobError::Plan(PlanError::new(
                ctx.spec().generator.name().as_str(),
                format!("{} trainable parameters ({bytes} bytes a round) exceed a task's message", initial.len()),
            )));
        }
        *parameters = Some(initial);
        Ok(())
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let (scratch, job_id) = (ctx.scratch, ctx.request.job_id.as_str());
        let Checkpoint { run, mut optimizer, mut parameters } = match self.start {
            Start::Resumed(saved) => *saved,
            Start::Fresh { model, plan, parameters, .. } => {
                let parameters =
                    parameters.ok_or_else(|| JobError::Internal("a DP-SGD run fitted unprepared".into()))?;
                let charged = charge_run::<G>(ctx, ledger, partitions, model, plan, parameters).await?;
                if ctx.keep_trained_model {
                    let initial: Vec<f32> = charged.parameters.iter().map(|&v| v as f32).collect();
                    keep_model::<G>(ctx, &charged.run, "initial", 0, initial).await?;
                }
                charged
            }
        };
        ctx.progress_mut().epsilon_spent = run.cost.epsilon;
        set_stage(ctx.progress, "training (DP-SGD)");
        ctx.progress_mut().tasks_total = run.steps as u32;
        // The run's one allowance: training's steps (those before a resumed checkpoint's
        // step spent already), then what it paid for after training.
        let mut releases = Releases::paid_by(&run.receipt)?;
        releases.resume_after(optimizer.step)?;
        let mut training = TrainingRun {
            partitions,
            releases: &mut releases,
            settings: &run.plan.run,
            rate: run.rate,
            noise_multiplier: run.sigma,
            expected_batch: run.rate * run.noisy_units.max(1.0),
            steps: run.steps,
            epsilon: run.cost.epsilon,
        };
        let model = G::round_model(&run.model, ctx.spec(), run.rate)?;
        let checkpointer = Checkpointer { scratch, job_id, run: &run };
        // One gather for all of the job's rounds, so their task ids never repeat.
        let mut gather = ctx.gather();
        let trained =
            training::train(ctx, &mut gather, &mut training, &mut parameters, &mut optimizer, model, &checkpointer)
                .await;
        // From here on the run is not resumable: a failed run stays charged and releases
        // nothing; a finished one is about to release, and resuming it would add rounds the
        // ledger never charged. A checkpoint that cannot be deleted stops the job before any
        // release (the ledger also refuses to resume a released charge).
        let deleted = checkpoint::delete(scratch, job_id).await;
        trained?;
        deleted?;

        let parameters: Vec<f32> = parameters.iter().map(|&v| v as f32).collect();
        if ctx.keep_trained_model {
            keep_model::<G>(ctx, &run, "trained", run.steps.saturating_sub(1), parameters.clone()).await?;
        }
        let mut public_inputs = vec![
            format!(
                "privacy units: {} (Gaussian release, noise multiplier {}; charged in ledger entry {})",
                run.noisy_units, run.plan.run.count_noise_multiplier, run.count_entry
            ),
            format!(
                "DP-SGD: q = {:.6}, σ = {:.4}, C = {}, {} steps",
                run.rate, run.sigma, run.plan.run.clip, run.steps
            ),
        ];
        public_inputs.extend(G::public_inputs(&run.model));
        // The released count is already rounded and at least 1.
        let released_units = run.noisy_units as u64;
        let ChargedRun { model, plan, receipt, cost, mechanisms, .. } = run;
        let trained = Trained {
            model,
            parameters,
            ctx,
            gather: &mut gather,
            partitions,
            releases: &mut releases,
            plan: &plan,
            released_units,
        };
        let sampler = G::sampler(trained).await?;
        let calibration =
            calibration::release(ctx, &mut gather, partitions, &mut releases, plan.calibration.as_deref()).await?;
        let sampler = calibration::apply(calibration, sampler, &mut public_inputs);
        Ok(Fitted {
            sampler: Draws::Table(sampler),
            released_count: Some(released_units),
            charged: Charged { receipt, cost, mechanisms, public_inputs },
        })
    }
}

/// Leaves the model in the scratch store (`rhosynth audit`'s white-box score): round
/// `round`'s task with `parameters`, the public initial ones or those the charged run
/// trained. The store is private.
async fn keep_model<G: DpSgdGenerator>(
    ctx: &JobContext<'_>,
    run: &ChargedRun<G::Model>,
    stage: &str,
    round: u64,
    parameters: Vec<f32>,
) -> Result<(), JobError> {
    let model = G::round_model(&run.model, ctx.spec(), run.rate)?;
    let settings = RoundSettings::new(round, run.rate, run.plan.run.clip, [0; 32], run.plan.run.micro_batch)
        .map_err(|e| JobError::Internal(e.to_string()))?;
    let task = ctx.spec().generator.name().gradient_sum(&settings, model(round), parameters);
    let path = ctx.scratch.child(&scratch::kept_model(&ctx.request.job_id, stage));
    ctx.scratch
        .store
        .put(&path, PutPayload::from(task.encode_to_vec()))
        .await
        .map_err(|e| JobError::Scratch { doing: format!("keeping the {stage} model"), reason: e.to_string() })?;
    Ok(())
}

/// Charges a new run: the unit count, released with Gaussian noise and charged on its own
/// before anything derived from it (q, T, σ, a refusal, a log line) can leave, then the
/// DP-SGD run at the rate it fixes. Checkpointed at once, so a restart resumes the charge.
async fn charge_run<G: DpSgdGenerator>(
    ctx: &JobContext<'_>,
    ledger: &mut Ledger,
    partitions: &Partitions,
    model: G::Model,
    plan: RunPlan,
    parameters: Vec<f32>,
) -> Result<Checkpoint<G::Model>, JobError> {
    let spec = ctx.spec();
    let count_charge = ctx.charge_request(vec![plan.count_mechanism()]);
    let count_receipt = ctx.charge(ledger, &count_charge).await?;
    let noisy_units =
        release_count(&mut Releases::paid_by(&count_receipt)?, partitions, plan.run.count_noise_multiplier)?;
    let rate = plan.rate(noisy_units);
    // σ and the job's cost at its held orders: the cost stated (manifest, progress) is
    // that bound, never a tighter figure picked after N̂ (`dpsgd::plan::COUNT_BAND`).
    let (settling, owned, options) = (plan.clone(), spec.clone(), ledger.options().clone());
    let (sigma, cost) = blocking(move || settling.settle(&owned, &options, noisy_units)).await??;
    let mechanisms = plan.mechanisms(rate, sigma);
    // A given σ must still fit the job's own ε (a calibrated one does by construction).
    if cost.epsilon > spec.privacy.epsilon * (1.0 + 1e-9) {
        return Err(JobError::OverJobEpsilon {
            cost: cost.epsilon,
            delta: cost.delta,
            epsilon: spec.privacy.epsilon,
            count_entry: count_receipt.seq,
        });
    }
    let charge = ctx.charge_request(plan.charged_with_run(rate, sigma));
    let receipt = ctx.charge(ledger, &charge).await?;
    let steps = plan.steps(rate);
    tracing::info!(sigma, steps, epsilon = cost.epsilon, "DP-SGD run charged");
    let parameters: Vec<f64> = parameters.into_iter().map(f64::from).collect();
    let optimizer = Optimizer::new(plan.run.optimizer, plan.run.schedule, steps, parameters.len());
    let run = ChargedRun {
        generator: spec.generator.name(),
        model,
        plan,
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
