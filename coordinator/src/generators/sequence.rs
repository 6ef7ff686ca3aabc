//! The sequence generator on the coordinator: a DP-SGD generator (`super::dpsgd`) whose
//! model configuration is fixed for the run, sampled by constrained decoding of whole
//! histories; with `select_epsilon`, the output is the privately selected best of
//! over-generated candidates (`generators::sequence::selection`), the vote release paid
//! by the run's charge.

use std::sync::Arc;

use rand::RngExt;

use rhosynth_privacy::ledger::Ledger;
use rhosynth_proto::task::Work;
use rhosynth_shared::accounting::mechanism::Mechanism;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::dpsgd::plan::RunPlan;
use rhosynth_shared::entropy::os_rng;
use rhosynth_shared::generators::sequence::params::PlainTraining;
use rhosynth_shared::generators::sequence::plan::{length_cells, length_mechanism};
use rhosynth_shared::generators::sequence::pretrain::{StageOne, reference_histories, train_plain};
use rhosynth_shared::generators::sequence::sampler::SelectedHistories;
use rhosynth_shared::generators::sequence::selection::{SelectionSpec, SelectionTask, check_votes, features};
use rhosynth_shared::generators::sequence::{
    Histories, SequenceModel, SequenceModelSpec, SequenceParams, SequencePlan, SequenceSampler,
};
use rhosynth_shared::generators::{GeneratorName, GeneratorSpec, PlanError, Sampler};
use rhosynth_shared::spec::JobSpec;
use serde::{Deserialize, Serialize};

use super::dpsgd::{DpSgdGenerator, RoundModel, Trained, same_every_round};
use super::reference::guarantee;
use crate::context::{JobError, blocking, set_stage};
use crate::gather::{Answer, Round};

pub struct Sequence;

/// What a sequence run is charged and checkpointed with: the model, and the selection's
/// settings (so a resumed run selects as it was charged, whatever the resubmitted spec
/// says).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SequenceRun {
    model: SequenceModelSpec,
    selection: Option<SelectionSpec>,
    /// The length release's noise multiplier (absent in checkpoints from before it).
    #[serde(default)]
    lengths: Option<f64>,
    /// Stage 1's reference set, what was read and the guarantee it carries (for the
    /// manifest; absent without stage 1, and in checkpoints from before it).
    #[serde(default)]
    reference: Option<String>,
    /// Stage 1's histories and training, for the initial parameters only (a resumed run
    /// is past them).
    #[serde(skip)]
    stage1: Option<Arc<(Histories, PlainTraining)>>,
}

impl DpSgdGenerator for Sequence {
    type Params = SequenceParams;
    type Model = SequenceRun;

    async fn plan(spec: &JobSpec, domain: &Domain, ledger: &Ledger) -> Result<(SequenceRun, RunPlan), JobError> {
        let plan = SequencePlan::new(spec, domain, ledger.options())?;
        let (mut reference, mut stage1) = (None, None);
        // The reference set is public (a declared table or a charged release): what reading
        // it found may be shown.
        if let Some(StageOne { reference: url, training }) = plan.stage1 {
            let (histories, read, manifest) = reference_histories(spec, domain, &url, &plan.model.layout)
                .await
                .map_err(|e| JobError::Plan(PlanError::new(GeneratorName::Sequence.as_str(), e.to_string())))?;
            reference = Some(guarantee(GeneratorName::Sequence, &url, &read, manifest, ledger)?);
            stage1 = Some(Arc::new((histories, training)));
        }
        let run =
            SequenceRun { model: plan.model, selection: plan.selection, lengths: plan.lengths, reference, stage1 };
        Ok((run, plan.run))
    }

    fn domain(run: &SequenceRun) -> &Domain {
        &run.model.domain
    }

    fn public_inputs(run: &SequenceRun) -> Vec<String> {
        let cells = run.model.layout.max_rows;
        let stage1 = run.reference.iter().map(|source| format!("reference set of stage 1: {source}"));
        run.lengths
            .map(|sigma| {
                format!(
                    "history lengths: a Gaussian histogram of the units' lengths ({cells} cells, noise multiplier \
                     {sigma:.3}, sensitivity 1 under add/remove), released with the run's charge; drawn histories take \
                     their lengths from it (negative cells as empty)"
                )
            })
            .into_iter()
            .chain(stage1)
            .collect()
    }

    /// Random weights, trained on stage 1's reference histories (on a blocking thread,
    /// with a non-private seed) when the spec names them.
    async fn initial_parameters(run: &SequenceRun) -> Result<Vec<f32>, JobError> {
        let mut model = SequenceModel::new(&run.model, &compute_device());
        let Some(stage1) = run.stage1.clone() else { return Ok(model.parameters()) };
        let seed: u64 = os_rng().map_err(|e| JobError::Model(e.to_string()))?.random();
        blocking(move || -> Result<Vec<f32>, JobError> {
            let (histories, training) = &*stage1;
            let losses = train_plain(&mut model, histories, training, seed);
            let parameters = model.parameters();
            if !parameters.iter().all(|p| p.is_finite()) {
                let message = "stage 1 diverged (non-finite weights): lower pretrain_learning_rate";
                return Err(JobError::Plan(PlanError::new(GeneratorName::Sequence.as_str(), message)));
            }
            tracing::info!(
                seed,
                steps = losses.len(),
                histories = histories.units.len(),
                first_loss = losses.first().copied().unwrap_or_default(),
                last_loss = losses.last().copied().unwrap_or_default(),
                "stage 1 (the reference histories) trained"
            );
            Ok(parameters)
        })
        .await?
    }

    /// The same model every round: encoded once.
    fn round_model<'a>(run: &SequenceRun, _: &'a JobSpec, _: f64) -> Result<RoundModel<'a>, JobError> {
        Ok(same_every_round::<SequenceParams>(&run.model))
    }

    async fn sampler(mut trained: Trained<'_, '_, SequenceRun>) -> Result<Box<dyn Sampler>, JobError> {
        let mut model = SequenceModel::new(&trained.model.model, &compute_device());
        model.load_parameters(&trained.parameters).map_err(|e| JobError::Model(e.to_string()))?;
        // Post-processing settings come from the spec as submitted.
        let GeneratorSpec::Sequence(params) = &trained.ctx.spec().generator else {
            return Err(JobError::Internal("not a sequence job".into()));
        };
        let spec = trained.model.model.clone();
        let temperature = params.temperature;
        // What the run's charge paid for after training: the length histogram (released
        // here), then the selection's votes.
        let mut after: Vec<Mechanism> = trained.plan.after_training.clone();
        let lengths = match trained.model.lengths {
            Some(sigma) => {
                let charged = after.iter().position(|m| *m == length_mechanism(sigma)).ok_or_else(|| {
                    JobError::Internal("the run's charge holds no length release of its settings".into())
                })?;
                after.remove(charged);
                let max_rows = spec.layout.max_rows;
                let cells = trained.partitions.rows_per_unit.map(|rows| length_cells(rows, max_rows));
                Some(trained.releases.gaussian(cells, 1.0, sigma)?)
            }
            None => None,
        };
        let sampler = SequenceSampler { transformer: model.transformer, spec, temperature, lengths };
        match (after.as_slice(), trained.model.selection.clone()) {
            ([], None) => Ok(Box::new(sampler)),
            ([mechanism], Some(selection)) => select(&mut trained, sampler, &mechanism.clone(), &selection).await,
            _ => Err(JobError::Internal("the run's charge and its selection settings disagree".into())),
        }
    }
}

/// The private selection: candidates drawn, votes gathered from the workers, released
/// with the charged mechanism's own noise, and the most voted kept.
async fn select(
    trained: &mut Trained<'_, '_, SequenceRun>,
    sampler: SequenceSampler,
    mechanism: &Mechanism,
    selection: &SelectionSpec,
) -> Result<Box<dyn Sampler>, JobError> {
    let neighbours = selection.neighbours;
    let (l2_sensitivity, noise_multiplier) = vote_release(mechanism, neighbours)?;
    // Public: the declared or released output size, and the charged settings.
    let keep = trained.ctx.spec().declared_output_size().unwrap_or(trained.released_units) as usize;
    let count = ((keep as f64 * selection.candidates).ceil() as usize).max(keep).max(neighbours);
    set_stage(trained.ctx.progress, "sampling candidates (private selection)");
    tracing::info!(candidates = count, keep, "drawing the selection's candidates");
    let (sampler, candidates) = blocking(move || -> Result<_, JobError> {
        let mut rng = os_rng()?;
        let candidates = sampler.histories(count, &mut rng);
        Ok((sampler, candidates))
    })
    .await??;
    let spec = sampler.spec;
    let task = SelectionTask {
        candidates: candidates.iter().flat_map(|h| features(&spec, h)).collect(),
        model: spec,
        neighbours,
    };
    let per_unit = task.votes_per_unit();
    set_stage(trained.ctx.progress, "private selection (votes)");
    let partitions = trained.partitions;
    let groups = &partitions.groups;
    let round = Round { work: Work::SelectionVotes((&task).into()), groups, tensor: "votes", len: count };
    // A partition's own unit count caps the worker's claim of how many voted.
    let check = |a: Answer<'_>| {
        partitions.units_per_partition.check(|units| {
            if a.claimed_units > units[a.group] {
                return Err(format!("{} units voted in a partition of {}", a.claimed_units, units[a.group]));
            }
            check_votes(a.values, a.claimed_units, count, per_unit)
        })
    };
    let votes = trained.gather.round(round, check, |_, _| {}).await?;
    let noisy = trained.releases.gaussian(votes, l2_sensitivity, noise_multiplier)?;
    let mut order: Vec<usize> = (0..count).collect();
    order.sort_by(|&a, &b| noisy[b].total_cmp(&noisy[a]).then(a.cmp(&b)));
    let mut chosen = vec![false; count];
    order.iter().take(keep).for_each(|&i| chosen[i] = true);
    let histories: Vec<_> = candidates.into_iter().zip(chosen).filter_map(|(h, c)| c.then_some(h)).collect();
    tracing::info!(kept = histories.len(), of = count, "private selection released");
    Ok(Box::new(SelectedHistories { spec: task.model, histories: histories.into_iter() }))
}

/// The vote release's (Δ, σ), from its charged mechanism, refused unless k votes per unit
/// are the sensitivity it was charged for (√k): what is drawn is what was charged.
fn vote_release(mechanism: &Mechanism, neighbours: usize) -> Result<(f64, f64), JobError> {
    match *mechanism {
        Mechanism::Gaussian { l2_sensitivity, noise_multiplier, releases: 1, .. }
            if (neighbours as f64).sqrt() == l2_sensitivity =>
        {
            Ok((l2_sensitivity, noise_multiplier))
        }
        _ => Err(JobError::Internal(format!(
            "the selection's {neighbours} votes per unit are not what its charge ({mechanism:?}) paid for"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use rhosynth_shared::accounting::mechanism::Adjacency;

    use super::*;

    /// A selection whose k is not the charged sensitivity's is refused, whatever the spec
    /// of a resubmitted job says.
    #[test]
    fn votes_are_released_only_at_the_charged_sensitivity() {
        let charged = |l2_sensitivity, releases| Mechanism::Gaussian {
            l2_sensitivity,
            noise_multiplier: 7.5,
            releases,
            adjacency: Adjacency::AddRemove,
        };
        assert_eq!(vote_release(&charged(2.0, 1), 4).unwrap(), (2.0, 7.5));
        assert!(vote_release(&charged(2.0, 1), 400).is_err());
        assert!(vote_release(&charged(2.0, 2), 4).is_err());
        assert!(vote_release(&Mechanism::dp_sgd(0.1, 1.0, 10), 1).is_err());
    }
}
