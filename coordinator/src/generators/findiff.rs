//! DP-FinDiff on the coordinator: a DP-SGD generator (`super::dpsgd`) whose rounds carry
//! the adaptive timestep sampler's exponent for the round's epoch, sampled by ancestral
//! denoising.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::dpsgd::plan::RunPlan;
use rhosynth_shared::generators::findiff::diffusion::timestep_exponent;
use rhosynth_shared::generators::findiff::{
    FinDiffModel, FinDiffModelSpec, FinDiffParams, FinDiffPlan, FinDiffRound, FinDiffSampler,
};
use rhosynth_shared::generators::{GeneratorSpec, Sampler};
use rhosynth_shared::spec::JobSpec;

use super::dpsgd::{DpSgdGenerator, RoundModel, Trained, each_round};
use crate::context::JobError;

pub struct FinDiff;

fn params(spec: &JobSpec) -> Result<&FinDiffParams, JobError> {
    match &spec.generator {
        GeneratorSpec::Findiff(params) => Ok(params),
        _ => Err(JobError::Internal("not a DP-FinDiff job".into())),
    }
}

impl DpSgdGenerator for FinDiff {
    type Params = FinDiffParams;
    type Model = FinDiffModelSpec;

    async fn plan(spec: &JobSpec, domain: &Domain, ledger: &Ledger) -> Result<(FinDiffModelSpec, RunPlan), JobError> {
        let plan = FinDiffPlan::new(spec, domain, ledger.options())?;
        Ok((plan.model, plan.run))
    }

    fn domain(model: &FinDiffModelSpec) -> &Domain {
        &model.domain
    }

    async fn initial_parameters(model: &FinDiffModelSpec) -> Result<Vec<f32>, JobError> {
        Ok(FinDiffModel::new(model, &compute_device()).parameters())
    }

    /// The model's configuration is fixed for the run; each round sets its timestep
    /// exponent.
    fn round_model<'a>(model: &FinDiffModelSpec, spec: &'a JobSpec, rate: f64) -> Result<RoundModel<'a>, JobError> {
        let (model, params) = (model.clone(), params(spec)?);
        Ok(each_round::<FinDiffParams>(move |round| {
            let exponent =
                timestep_exponent(params.alpha_start, params.alpha_end, round as f64 * rate, params.run.epochs);
            FinDiffRound { model: model.clone(), timestep_exponent: exponent }
        }))
    }

    async fn sampler(trained: Trained<'_, '_, FinDiffModelSpec>) -> Result<Box<dyn Sampler>, JobError> {
        let mut denoiser = FinDiffModel::new(&trained.model, &compute_device());
        denoiser.load_parameters(&trained.parameters).map_err(|e| JobError::Model(e.to_string()))?;
        let sampling_steps = params(trained.ctx.spec())?.sampling_steps;
        Ok(Box::new(FinDiffSampler { model: denoiser, encoding: trained.model.encoding, sampling_steps }))
    }
}
