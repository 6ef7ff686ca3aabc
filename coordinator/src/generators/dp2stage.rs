//! DP-2Stage on the coordinator: a DP-SGD generator (`super::dpsgd`) over a public
//! pretrained checkpoint. Its plan reads the checkpoint and its tokenizer (public, from
//! the spec's URL); stage 1 on pseudo rows from the declared domain runs after admission
//! and before anything is charged; stage 2 is the engine's DP-SGD run; rows are drawn by constrained decoding.

use dpsynth_proto::gradient_sum::Model;
use dpsynth_shared::accounting::accountant::AccountingOptions;
use dpsynth_shared::data::domain::Domain;
use dpsynth_shared::decoder::CheckpointError;
use dpsynth_shared::decoder::checkpoint::fetch;
use dpsynth_shared::dpsgd::compute_device;
use dpsynth_shared::dpsgd::params::TrainableLayers;
use dpsynth_shared::dpsgd::plan::RunPlan;
use dpsynth_shared::entropy::os_seed;
use dpsynth_shared::generators::dp2stage::pretrain::pretrain;
use dpsynth_shared::generators::dp2stage::{Dp2StageModelSpec, Dp2StagePlan, TextSampler};
use dpsynth_shared::generators::{PlanError, Sampler};
use dpsynth_shared::spec::{GeneratorName, GeneratorSpec, JobSpec};

use super::dpsgd::{DpSgdGenerator, RoundModel, Trained};
use crate::context::{JobError, blocking};

pub struct Dp2Stage;

/// Reading the operator's checkpoint failed (its store, not the job's data).
fn checkpoint_error(e: impl std::fmt::Display) -> JobError {
    JobError::Other(format!("dp2stage: {e}"))
}

/// What public information alone decides (the spec against the checkpoint, stage 1).
fn plan_error(e: impl std::fmt::Display) -> JobError {
    JobError::Plan(PlanError::new("dp2stage", e.to_string()))
}

impl DpSgdGenerator for Dp2Stage {
    const NAME: GeneratorName = GeneratorName::Dp2stage;
    type Model = Dp2StageModelSpec;

    /// Reads the public checkpoint and fixes how rows read with its tokenizer.
    async fn plan(
        spec: &JobSpec,
        domain: &Domain,
        options: &AccountingOptions,
    ) -> Result<(Dp2StageModelSpec, RunPlan), JobError> {
        let GeneratorSpec::Dp2stage(params) = &spec.generator else {
            return Err(JobError::Other("not a DP-2Stage job".into()));
        };
        let fetched = fetch(&params.checkpoint).await.map_err(checkpoint_error)?;
        let plan = Dp2StagePlan::new(spec, domain, options, &fetched.tokenizer, &fetched.sha256)?;
        // What the spec asks of the checkpoint is checked here, before admission.
        let config = fetched.checkpoint.config();
        let text = &plan.model.model.text;
        if params.blocks.is_some_and(|k| k > config.layers) {
            return Err(plan_error(format!(
                "blocks = {}: the checkpoint has {}",
                params.blocks.unwrap_or_default(),
                config.layers
            )));
        }
        if text.longest() > config.positions {
            return Err(plan_error(format!(
                "a row is up to {} tokens; the model's context is {}",
                text.longest(),
                config.positions
            )));
        }
        if text.vocabulary().last().is_some_and(|&t| t as usize >= config.vocabulary) {
            return Err(plan_error("the checkpoint's tokenizer and model do not belong together"));
        }
        Ok((plan.model, plan.run))
    }

    /// Stage 1 on a blocking thread: the checkpoint (the bytes the plan read) trained on
    /// pseudo rows from the declared domain with a non-private seed; no data.
    async fn initial_parameters(model: &Dp2StageModelSpec) -> Result<Vec<f32>, JobError> {
        let device = compute_device();
        let mut text_model = model.load_model(&device).await.map_err(|e| match e {
            CheckpointError::Format(message) => plan_error(message),
            other => checkpoint_error(other),
        })?;
        let pseudo = model.pseudo.clone();
        let seed = u64::from_le_bytes(os_seed().map_err(checkpoint_error)?[..8].try_into().expect("8 bytes"));
        blocking(move || -> Result<Vec<f32>, JobError> {
            let losses = pretrain(&mut text_model, &pseudo, seed).map_err(plan_error)?;
            let parameters = text_model.parameters();
            if !parameters.iter().all(|p| p.is_finite()) {
                return Err(plan_error("stage 1 diverged (non-finite weights): lower pseudo_learning_rate"));
            }
            tracing::info!(
                seed,
                steps = losses.len(),
                first_loss = losses.first().copied().unwrap_or_default(),
                last_loss = losses.last().copied().unwrap_or_default(),
                "DP-2Stage stage 1 (pseudo rows from the declared domain) trained"
            );
            Ok(parameters)
        })
        .await?
    }

    fn domain(model: &Dp2StageModelSpec) -> &Domain {
        &model.model.domain
    }

    /// The same model every round: encoded once.
    fn round_model<'a>(model: &Dp2StageModelSpec, _: &'a JobSpec, _: f64) -> Result<RoundModel<'a>, JobError> {
        let wire = dpsynth_proto::Dp2StageModel::from(model);
        Ok(Box::new(move |_| Model::Dp2stage(wire.clone())))
    }

    async fn sampler(trained: Trained<'_, '_, Dp2StageModelSpec>) -> Result<Box<dyn Sampler>, JobError> {
        let GeneratorSpec::Dp2stage(params) = &trained.ctx.spec().generator else {
            return Err(JobError::Other("not a DP-2Stage job".into()));
        };
        let mut model = trained.model.load_model(&compute_device()).await.map_err(checkpoint_error)?;
        model.load_parameters(&trained.parameters).map_err(|e| JobError::Other(e.to_string()))?;
        let spec = trained.model.model;
        Ok(Box::new(TextSampler {
            decoder: model.decoder,
            text: spec.text,
            domain: spec.domain,
            temperature: params.temperature,
        }))
    }
}
