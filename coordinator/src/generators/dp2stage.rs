//! The language-model generators on the coordinator, DP-2Stage and HARMONIC: DP-SGD
//! generators (`super::dpsgd`) over a public pretrained checkpoint. The plan reads the
//! checkpoint and its tokenizer (public, from the spec's URL) and the public
//! reference set; stage 1 on public examples (DP-2Stage: pseudo rows from the declared
//! domain, or the rows of a named reference set; HARMONIC: the reference set, each row
//! after its nearest others) runs after admission and before anything is
//! charged; stage 2 is the engine's DP-SGD run; rows are drawn by constrained decoding.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::decoder::CheckpointError;
use rhosynth_shared::decoder::checkpoint::fetch;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::dpsgd::plan::RunPlan;
use rhosynth_shared::entropy::os_seed;
use rhosynth_shared::generators::dp2stage::plan::check;
use rhosynth_shared::generators::dp2stage::pretrain::pretrain;
use rhosynth_shared::generators::dp2stage::{
    Dp2StageModelSpec, Dp2StagePlan, LanguageModelParams, Prompting, TextSampler,
};
use rhosynth_shared::generators::{GeneratorName, GeneratorSpec, PlanError, Sampler};
use rhosynth_shared::spec::JobSpec;

use super::dpsgd::{DpSgdGenerator, RoundModel, Trained, same_every_round};
use super::reference;
use crate::context::{JobError, blocking};

/// How a language-model generator makes its examples: a private row alone (DP-2Stage), or
/// a private row after its nearest rows of the reference set (HARMONIC's prompts).
pub trait Examples: Send + Sync {
    const GENERATOR: GeneratorName;
    /// Whether each example is prompted with reference rows.
    const PROMPTED: bool;
}

/// DP-2Stage's examples: rows alone.
pub struct RowsAlone;

impl Examples for RowsAlone {
    const GENERATOR: GeneratorName = GeneratorName::Dp2stage;
    const PROMPTED: bool = false;
}

/// A language-model generator, by how it makes its examples.
pub struct LanguageModel<E: Examples>(std::marker::PhantomData<E>);

pub type Dp2Stage = LanguageModel<RowsAlone>;

impl<E: Examples> LanguageModel<E> {
    /// Reading the operator's checkpoint failed (its store, not the job's data).
    fn read_error(e: impl std::fmt::Display) -> JobError {
        JobError::Model(format!("{}: {e}", E::GENERATOR.as_str()))
    }

    /// What public information alone decides (the spec against the checkpoint, stage 1).
    fn plan_error(e: impl std::fmt::Display) -> JobError {
        JobError::Plan(PlanError::new(E::GENERATOR.as_str(), e.to_string()))
    }

    fn params(spec: &JobSpec) -> Result<&LanguageModelParams, JobError> {
        match &spec.generator {
            GeneratorSpec::Dp2stage(p) if !E::PROMPTED => Ok(p),
            GeneratorSpec::Harmonic(p) if E::PROMPTED => Ok(p),
            _ => Err(JobError::Internal(format!("not a {} job", E::GENERATOR.as_str()))),
        }
    }
}

impl<E: Examples> DpSgdGenerator for LanguageModel<E> {
    type Params = LanguageModelParams;
    type Model = Dp2StageModelSpec;

    /// Reads the public checkpoint and fixes how rows read with its tokenizer; reads the
    /// public reference set (HARMONIC's prompts, or DP-2Stage's stage-1 table).
    async fn plan(spec: &JobSpec, domain: &Domain, ledger: &Ledger) -> Result<(Dp2StageModelSpec, RunPlan), JobError> {
        let params = Self::params(spec)?;
        check(spec, domain)?;
        let fetched = fetch(&params.checkpoint).await.map_err(Self::read_error)?;
        // The reference set is public (a declared table or release): what reading it found
        // may be shown.
        let prompting = match &params.reference {
            Some(url) => {
                let (mut prompting, manifest) = Prompting::load(
                    spec,
                    domain,
                    url,
                    params.reference_rows,
                    if E::PROMPTED { params.neighbours } else { 0 },
                )
                .await
                .map_err(Self::plan_error)?;
                prompting.source = reference::guarantee(E::GENERATOR, url, &prompting.source, manifest, ledger)?;
                Some(prompting)
            }
            None => None,
        };
        let plan = Dp2StagePlan::new(spec, domain, ledger.options(), &fetched.tokenizer, &fetched.sha256, prompting)?;
        // What the spec asks of the checkpoint is checked here, before admission.
        let config = fetched.checkpoint.config();
        let text = &plan.model.model.text;
        if params.blocks.is_some_and(|k| k > config.layers) {
            return Err(Self::plan_error(format!(
                "blocks = {}: the checkpoint has {}",
                params.blocks.unwrap_or_default(),
                config.layers
            )));
        }
        let longest = plan.model.model.longest();
        if longest > config.positions {
            return Err(Self::plan_error(format!(
                "an example is up to {longest} tokens; the model's context is {}",
                config.positions
            )));
        }
        if text.vocabulary().last().is_some_and(|&t| t as usize >= config.vocabulary) {
            return Err(Self::plan_error("the checkpoint's tokenizer and model do not belong together"));
        }
        Ok((plan.model, plan.run))
    }

    /// Stage 1 on a blocking thread: the checkpoint (the bytes the plan read) trained on
    /// public examples with a non-private seed; no private data.
    async fn initial_parameters(model: &Dp2StageModelSpec) -> Result<Vec<f32>, JobError> {
        let device = compute_device();
        let mut text_model = model.load_model(&device).await.map_err(|e| match e {
            CheckpointError::Format(message) => Self::plan_error(message),
            other => Self::read_error(other),
        })?;
        let pseudo = model.pseudo.clone();
        let seed = u64::from_le_bytes(os_seed().map_err(Self::read_error)?[..8].try_into().expect("8 bytes"));
        blocking(move || -> Result<Vec<f32>, JobError> {
            let losses = pretrain(&mut text_model, &pseudo, seed).map_err(Self::plan_error)?;
            let parameters = text_model.parameters();
            if !parameters.iter().all(|p| p.is_finite()) {
                return Err(Self::plan_error("stage 1 diverged (non-finite weights): lower pseudo_learning_rate"));
            }
            tracing::info!(
                seed,
                steps = losses.len(),
                first_loss = losses.first().copied().unwrap_or_default(),
                last_loss = losses.last().copied().unwrap_or_default(),
                generator = E::GENERATOR.as_str(),
                "stage 1 (public examples) trained"
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
        Ok(same_every_round::<LanguageModelParams>(model))
    }

    fn public_inputs(model: &Dp2StageModelSpec) -> Vec<String> {
        let mut inputs = vec![format!("checkpoint: {} (SHA-256 {})", model.checkpoint, model.checkpoint_sha256)];
        if let Some(p) = &model.model.prompting {
            let used =
                if E::PROMPTED { format!("prompts (k = {}) and stage 1", p.neighbours) } else { "stage 1".into() };
            inputs.push(format!("reference set of the {used}: {}", p.source));
        }
        inputs
    }

    async fn sampler(trained: Trained<'_, '_, Dp2StageModelSpec>) -> Result<Box<dyn Sampler>, JobError> {
        let temperature = Self::params(trained.ctx.spec())?.temperature;
        let mut model = trained.model.load_model(&compute_device()).await.map_err(Self::read_error)?;
        model.load_parameters(&trained.parameters).map_err(|e| JobError::Model(e.to_string()))?;
        Ok(Box::new(TextSampler { decoder: model.decoder, spec: trained.model.model, temperature }))
    }
}
