//! DP-2Stage on the coordinator: a DP-SGD generator (`super::dpsgd`) over a public
//! pretrained checkpoint. Its plan reads the checkpoint and its tokenizer (public, from
//! the spec's URL) and runs stage 1 on pseudo rows from the declared domain before anything
//! is charged; stage 2 is the engine's DP-SGD run; rows are drawn by constrained decoding.

use dpsynth_proto::gradient_sum::Model;
use dpsynth_shared::accounting::accountant::AccountingOptions;
use dpsynth_shared::data::domain::Domain;
use dpsynth_shared::decoder::checkpoint::fetch;
use dpsynth_shared::dpsgd::compute_device;
use dpsynth_shared::dpsgd::params::TrainableLayers;
use dpsynth_shared::entropy::os_seed;
use dpsynth_shared::generators::Sampler;
use dpsynth_shared::generators::dp2stage::pretrain::pretrain;
use dpsynth_shared::generators::dp2stage::{Dp2StageModelSpec, Dp2StagePlan, TextModel, TextSampler};
use dpsynth_shared::spec::{GeneratorName, GeneratorSpec, JobSpec};

use super::dpsgd::{DpSgdGenerator, Planned, RoundModel, Trained};
use crate::context::{JobError, blocking};

pub struct Dp2Stage;

fn checkpoint_error(e: impl std::fmt::Display) -> JobError {
    JobError::Other(format!("dp2stage: {e}"))
}

impl DpSgdGenerator for Dp2Stage {
    const NAME: GeneratorName = GeneratorName::Dp2stage;
    type Model = Dp2StageModelSpec;

    /// Reads the public checkpoint, fixes how rows read with its tokenizer, and trains
    /// stage 1 (no data: the declared domain and a non-private seed) on a blocking thread.
    async fn plan(
        spec: &JobSpec,
        domain: &Domain,
        options: &AccountingOptions,
    ) -> Result<Planned<Dp2StageModelSpec>, JobError> {
        let GeneratorSpec::Dp2stage(params) = &spec.generator else {
            return Err(JobError::Other("not a DP-2Stage job".into()));
        };
        let (checkpoint, tokenizer) = fetch(&params.checkpoint).await.map_err(checkpoint_error)?;
        let plan = Dp2StagePlan::new(spec, domain, options, &tokenizer)?;
        let seed = u64::from_le_bytes(os_seed().map_err(checkpoint_error)?[..8].try_into().expect("8 bytes"));
        let (model, pseudo) = (plan.model.clone(), plan.pseudo.clone());
        let parameters = blocking(move || -> Result<Vec<f32>, JobError> {
            let device = compute_device();
            let decoder = checkpoint.load(&device).map_err(checkpoint_error)?;
            let mut text_model = TextModel::new(&model.model, decoder, &device).map_err(checkpoint_error)?;
            let losses = pretrain(&mut text_model, &pseudo, seed).map_err(checkpoint_error)?;
            tracing::info!(
                steps = losses.len(),
                first_loss = losses.first().copied().unwrap_or_default(),
                last_loss = losses.last().copied().unwrap_or_default(),
                "DP-2Stage stage 1 (pseudo rows from the declared domain) trained"
            );
            Ok(text_model.parameters())
        })
        .await??;
        Ok(Planned { model: plan.model, run: plan.run, parameters })
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
