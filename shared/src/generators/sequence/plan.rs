//! The model and the privacy parameters that do not depend on the data: the token layout
//! from the declared schema, the transformer's sizes and the DP-SGD run's plan.

use super::pretrain::{MAX_PRETRAIN_BATCH, MAX_PRETRAIN_STEPS, StageOne};
use super::selection::SelectionSpec;
use super::task::SequenceModelSpec;
use super::tokens::Layout;
use super::window::WindowSpec;
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma, zcdp_budget};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::calibration::CalibrationPlan;
use crate::data::domain::Domain;
use crate::decoder::DecoderConfig;
use crate::dpsgd::plan::RunPlan;
use crate::generators::reference::check_location;
use crate::generators::sequence::SequenceParams;
use crate::generators::{GeneratorSpec, PlanError, order_with_gaps, require_columns, require_positive};
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "sequence";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// A sequence job's plan. The run's sampling rate depends on the DP unit count and is
/// fixed later.
#[derive(Clone, Debug)]
pub struct SequencePlan {
    pub model: SequenceModelSpec,
    /// The private selection, when the spec asks for one (its release is one of the run's
    /// `after_training` mechanisms).
    pub selection: Option<SelectionSpec>,
    /// The noise multiplier of the released length histogram, when there is one (one of
    /// the run's `after_training` mechanisms, [`length_mechanism`]).
    pub lengths: Option<f64>,
    /// Stage 1, when the spec names a reference set.
    pub stage1: Option<StageOne>,
    pub run: RunPlan,
}

/// Plans from the spec and the declared domain alone, as a job is submitted.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    SequencePlan::new(spec, domain, &AccountingOptions::default()).map(drop)
}

impl SequencePlan {
    /// `options`: the ledger's accounting options (the selection's noise is calibrated
    /// under them).
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        let GeneratorSpec::Sequence(params) = spec.generator.clone() else {
            return Err(invalid("the job's generator is another"));
        };
        let mut run = RunPlan::new(GENERATOR, &params.run)?;
        if !(params.temperature.is_finite() && params.temperature > 0.0) {
            return Err(invalid("temperature must be a positive number"));
        }
        if !(0.0..=1.0).contains(&params.p_start) {
            return Err(invalid("p_start is a probability: need 0 ≤ p_start ≤ 1"));
        }
        let sizes = [params.max_rows, params.window_rows, params.width, params.heads, params.layers, params.mlp];
        if sizes.contains(&0) || params.fine == 0 || params.gap_bins == 0 {
            return Err(invalid("max_rows, window_rows, width, heads, layers, mlp, fine and gap_bins must be ≥ 1"));
        }
        if !params.width.is_multiple_of(params.heads) {
            return Err(invalid(format!("width {} is not a multiple of heads {}", params.width, params.heads)));
        }
        let training = params.pretraining();
        let stage1 = match &params.reference {
            Some(reference) => {
                check_location(spec, reference).map_err(invalid)?;
                require_positive(GENERATOR, &[("pretrain_learning_rate", training.learning_rate)])?;
                if !(1..=MAX_PRETRAIN_STEPS).contains(&training.steps)
                    || !(1..=MAX_PRETRAIN_BATCH).contains(&training.batch)
                {
                    return Err(invalid(format!(
                        "stage 1 needs 1 ≤ pretrain_steps ≤ {MAX_PRETRAIN_STEPS} and 1 ≤ pretrain_batch ≤ \
                         {MAX_PRETRAIN_BATCH}"
                    )));
                }
                Some(StageOne { reference: reference.clone(), training })
            }
            None if training != SequenceParams::default().pretraining() => {
                return Err(invalid(
                    "pretrain_steps, pretrain_batch and pretrain_learning_rate set stage 1: name its reference",
                ));
            }
            None => None,
        };
        require_columns(GENERATOR, domain)?;
        let order = order_with_gaps(GENERATOR, spec, domain, params.gap_bins)?;
        let order_index = order.as_ref().map(|(i, _)| *i);
        let statics = params
            .static_columns
            .iter()
            .map(|name| match domain.index_of(name) {
                Some(i) if Some(i) != order_index => Ok(i),
                Some(_) => Err(invalid(format!("static column '{name}' is the order column"))),
                None => Err(invalid(format!("static column '{name}' is not a synthesised column"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let layout = Layout::new(domain, order, &statics, params.fine, params.max_rows);
        let window =
            WindowSpec { p_start: params.p_start, context_rows: params.context_rows, window_rows: params.window_rows };
        let transformer = DecoderConfig::new(
            layout.vocabulary(),
            layout.max_tokens(window.rows()),
            params.width,
            params.heads,
            params.layers,
            params.mlp,
        );
        if let Some(epsilon) = params.select_epsilon {
            run.after_training.push(selection_mechanism(spec, &params, epsilon, options)?);
        }
        let lengths = length_noise(spec, params.length_share, options)?;
        run.after_training.extend(lengths.map(length_mechanism));
        run.calibration = CalibrationPlan::new(spec, domain, options)?.map(Box::new);
        if run.calibration.is_some() && params.select_epsilon.is_some() {
            return Err(invalid(
                "[calibration] and select_epsilon both choose the output among drawn histories: use one",
            ));
        }
        let lagged = layout.lag_inputs();
        let model = SequenceModelSpec { domain: domain.clone(), layout, transformer, window, lagged };
        let selection = params
            .select_epsilon
            .map(|_| SelectionSpec { neighbours: params.select_neighbours, candidates: params.select_candidates });
        Ok(Self { model, selection, lengths, stage1, run })
    }
}

/// The length release's noise multiplier: the share `share` of the job's zCDP budget ρ,
/// σ_L = 1/√(2·share·ρ); `None` for a share of 0.
fn length_noise(spec: &JobSpec, share: f64, options: &AccountingOptions) -> Result<Option<f64>, PlanError> {
    if !(0.0..0.5).contains(&share) {
        return Err(invalid("length_share must be at least 0 and below 0.5 (0: no length release)"));
    }
    if share == 0.0 {
        return Ok(None);
    }
    let rho = zcdp_budget(spec.privacy.epsilon, spec.privacy.delta, options)
        .map_err(|e| invalid(format!("the job's zCDP budget: {e}")))?;
    Ok(Some(1.0 / (2.0 * share * rho).sqrt()))
}

/// The histogram of history lengths: each unit adds 1 to one cell (its length, at most
/// `max_rows`), so the vector's L2 sensitivity is 1.
pub fn length_mechanism(noise_multiplier: f64) -> Mechanism {
    Mechanism::Gaussian { l2_sensitivity: 1.0, noise_multiplier, releases: 1, adjacency: Adjacency::AddRemove }
}

/// The exact histogram the length release adds noise to: `max_rows` cells, cell k the
/// units of k + 1 rows (those with more counted at `max_rows`, the rows they train on).
pub fn length_cells(rows_per_unit: &std::collections::BTreeMap<u32, u64>, max_rows: usize) -> Vec<f64> {
    let mut cells = vec![0.0; max_rows];
    for (&rows, &units) in rows_per_unit {
        cells[(rows.max(1) as usize).min(max_rows) - 1] += units as f64;
    }
    cells
}

/// The selection's vote release: Gaussian, L2 sensitivity √k, its σ the smallest that
/// costs `epsilon` alone at the job's δ.
fn selection_mechanism(
    spec: &JobSpec,
    params: &SequenceParams,
    epsilon: f64,
    options: &AccountingOptions,
) -> Result<Mechanism, PlanError> {
    if !(epsilon.is_finite() && epsilon > 0.0 && epsilon < spec.privacy.epsilon) {
        return Err(invalid(format!(
            "select_epsilon must be positive and below the job's ε = {}, got {epsilon}",
            spec.privacy.epsilon
        )));
    }
    if params.select_neighbours == 0 || !(params.select_candidates.is_finite() && params.select_candidates >= 1.0) {
        return Err(invalid("the selection needs select_neighbours ≥ 1 and select_candidates ≥ 1"));
    }
    let l2_sensitivity = (params.select_neighbours as f64).sqrt();
    let gaussian = |noise_multiplier| Mechanism::Gaussian {
        l2_sensitivity,
        noise_multiplier,
        releases: 1,
        adjacency: Adjacency::AddRemove,
    };
    let privacy = &spec.privacy;
    let sigma = calibrate_sigma(epsilon, privacy.delta, privacy.accountant, options, |s| vec![gaussian(s)])
        .map_err(|e| invalid(format!("calibrating the selection's noise: {e}")))?;
    Ok(gaussian(sigma))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A unit counts once, at its length; longer ones at `max_rows`, the rows they train on.
    #[test]
    fn length_cells_count_each_unit_once_at_its_trained_length() {
        // Units: 2 of one row, 1 of three, 4 of five, 1 of seven.
        let rows_per_unit = [(1, 2), (3, 1), (5, 4), (7, 1)].into_iter().collect();
        assert_eq!(length_cells(&rows_per_unit, 5), vec![2.0, 0.0, 1.0, 0.0, 5.0]);
        assert_eq!(length_cells(&rows_per_unit, 8), vec![2.0, 0.0, 1.0, 0.0, 4.0, 0.0, 1.0, 0.0]);
        assert_eq!(length_cells(&rows_per_unit, 8).iter().sum::<f64>(), 8.0);
    }

    /// The example's length release (ε = 1, δ = 1e-8, 5% of the zCDP budget) has σ_L
    /// ≈ 24, and it is part of the run's charge; a share of 0 releases none.
    #[test]
    fn the_length_release_takes_its_share_of_the_budget() {
        let text = include_str!("../../../../examples/icu-sequence.toml");
        let spec = JobSpec::parse(text, "example").unwrap();
        let (domain, options) = (Domain::from_spec(&spec), AccountingOptions::default());
        let plan = SequencePlan::new(&spec, &domain, &options).unwrap();
        let sigma = plan.lengths.unwrap();
        assert!((23.0..25.0).contains(&sigma), "σ_L = {sigma}");
        let rho = zcdp_budget(1.0, 1e-8, &options).unwrap();
        assert!((1.0 / (2.0 * sigma * sigma) - 0.05 * rho).abs() < 1e-12);
        assert_eq!(plan.run.after_training, vec![length_mechanism(sigma)]);
        let off = text.replace("[generator.sequence]\n", "[generator.sequence]\nlength_share = 0.0\n");
        let plan = SequencePlan::new(&JobSpec::parse(&off, "off").unwrap(), &domain, &options).unwrap();
        assert_eq!((plan.lengths, plan.run.after_training.len()), (None, 0));
    }

    /// Stage 1's reference set is read as public: never the job's input, held-out files or
    /// ledger (at, in or around them), nor a location named through `..`; its training is
    /// bounded, and its settings without a reference are refused rather than ignored.
    #[test]
    fn stage_one_reads_only_a_public_reference_within_bounds() {
        let text = include_str!("../../../../examples/icu-sequence.toml");
        let spec = JobSpec::parse(text, "example").unwrap();
        let (domain, options) = (Domain::from_spec(&spec), AccountingOptions::default());
        let plan = SequencePlan::new(&spec, &domain, &options).unwrap();
        let stage1 = plan.stage1.unwrap();
        assert_eq!(stage1.reference, "./rhosynth-out/icu-sequence-reference");
        assert_eq!((stage1.training.steps, stage1.training.batch), (1500, 16));
        let with = |from: &str, to: &str| {
            let changed = text.replace(from, to);
            assert_ne!(changed, text, "{from}");
            SequencePlan::new(&JobSpec::parse(&changed, "changed").unwrap(), &domain, &options).map(drop)
        };
        let reference = "reference = \"./rhosynth-out/icu-sequence-reference\"";
        for private in [
            "./rhosynth-out/demo/input/icu_vitals.csv",
            "./rhosynth-out/demo/input",
            "./rhosynth-out/demo/input/icu_vitals_holdout.csv",
            "./rhosynth-out/ledger/demo-icu-cohort",
            "./public/../rhosynth-out/demo/input/icu_vitals.csv",
        ] {
            let err = with(reference, &format!("reference = \"{private}\"")).unwrap_err().to_string();
            assert!(err.contains("overlaps the job's private data") || err.contains("`..`"), "{private}: {err}");
        }
        for bad in ["pretrain_steps = 0", "pretrain_steps = 20001", "pretrain_batch = 1025"] {
            assert!(with("pretrain_steps = 1500", bad).is_err(), "{bad}");
        }
        let err = with(&format!("{reference}\npretrain_steps = 1500"), "pretrain_steps = 3000").unwrap_err();
        assert!(err.to_string().contains("name its reference"), "{err}");
        with(&format!("{reference}\npretrain_steps = 1500\n"), "").unwrap();
    }
}
