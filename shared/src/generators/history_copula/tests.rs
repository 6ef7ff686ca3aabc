use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal};

use super::*;
use crate::accounting::accountant::AccountingOptions;
use crate::data::histories::{ValueHistory, ValueLayout, ValueRows, group};
use crate::generators::GeneratorSpec;
use crate::generators::history_copula::HistoryCopulaParams;
use crate::generators::sequence::ceiling::SimulatedCohort;

/// The simulated cohort's spec with this generator at `epsilon`.
fn plan_for(cohort: &SimulatedCohort, epsilon: f64) -> HistoryCopulaPlan {
    let mut spec = cohort.spec.clone();
    spec.generator = GeneratorSpec::HistoryCopula(HistoryCopulaParams::default());
    spec.privacy.epsilon = epsilon;
    HistoryCopulaPlan::new(&spec, &cohort.domain, &AccountingOptions::default()).unwrap()
}

fn cohort_histories(cohort: &SimulatedCohort, plan: &HistoryCopulaPlan) -> Vec<ValueHistory> {
    cohort.value_histories(&plan.layout.value_layout())
}

/// The copula fitted to the cohort's statistics, with the plan's noise when `noise` gives
/// its seed (a seeded generator: simulated data, a test). A zero noise level is passed to
/// the fit for the noiseless ceiling, so nothing is shrunk or cut.
fn fit(cohort: &SimulatedCohort, plan: &HistoryCopulaPlan, noise: Option<u64>) -> CopulaModel {
    let histories = cohort_histories(cohort, plan);
    match noise {
        Some(seed) => {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            simulated::fit(plan, &histories, |values, std| {
                let normal = Normal::new(0.0, std).unwrap();
                values.iter_mut().for_each(|v| *v += normal.sample(&mut rng));
            })
        }
        None => {
            let mut exact = plan.clone();
            (exact.margins_sigma, exact.moments_sigma, exact.lengths_sigma) = (0.0, 0.0, 0.0);
            simulated::fit(&exact, &histories, |_, _| {})
        }
    }
}

/// Fitted without noise, the copula draws histories whose every vital keeps its lag-1
/// autocorrelation. On an AR(1) cohort (a Gaussian copula, as the model assumes): within
/// 0.05 of the cohort's (the standard error of a lag-1 over ~40,000 pairs is under 0.01;
/// the rest is what the bins lose) and transitions within 2× the held-out cohort's error.
/// On a hidden-state cohort (a mixture the model flattens): within 0.1.
#[tokio::test]
async fn without_noise_the_copula_keeps_each_vitals_lag1() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, tolerance) in [("ar1:0.6", 0.05), ("hidden-state", 0.1)] {
        let cohort = SimulatedCohort::new(kind, 1500, 7, dir.path()).await;
        let plan = plan_for(&cohort, 2.0);
        let sampler = CopulaSampler::new(fit(&cohort, &plan, None));
        let l = cohort.evaluate(&sampler.histories(1500, &mut ChaCha8Rng::seed_from_u64(3)));
        for d in &l.dynamics {
            let (real, synthetic) = (d.lag1_real.unwrap(), d.lag1_synthetic.unwrap());
            assert!(
                (real - synthetic).abs() < tolerance,
                "{kind} {}: lag-1 {synthetic:.3} against {real:.3}",
                d.column
            );
        }
        let (error, floor) = (l.state_transition_divergence, l.holdout_transition_error());
        if kind.starts_with("ar1") {
            assert!(error <= 2.0 * floor, "{kind}: transition error {error:.3}, held out {floor:.3}");
        }
        assert!(l.sequence_length_tv < 0.1, "{kind}: rows-per-unit TV {}", l.sequence_length_tv);
    }
}

/// At ε = 2 on 3,000 units, the bounds on both cohorts: mean lag-1 gap under 0.1,
/// transition error under 0.2, rows-per-unit TV under 0.15 (the hidden-state cohort's
/// transitions: 0.13–0.17 over three seeds; 0.18–0.22 with slopes fitted one by one).
#[tokio::test]
async fn at_epsilon_two_the_copula_keeps_the_dynamics() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["ar1:0.6", "hidden-state"] {
        let cohort = SimulatedCohort::new(kind, 3000, 11, dir.path()).await;
        let plan = plan_for(&cohort, 2.0);
        let sampler = CopulaSampler::new(fit(&cohort, &plan, Some(5)));
        let l = cohort.evaluate(&sampler.histories(3000, &mut ChaCha8Rng::seed_from_u64(4)));
        eprintln!("{kind}: {}", l.dynamics_summary());
        assert!(l.mean_lag1_gap().unwrap() < 0.1, "{kind}: {}", l.dynamics_summary());
        assert!(l.sequence_length_tv < 0.15, "{kind}: {}", l.dynamics_summary());
        assert!(l.state_transition_divergence < 0.2, "{kind}: {}", l.dynamics_summary());
    }
}

/// One unit moves each margin block by at most 1 (so the vector by at most √blocks) and
/// its moments by at most the clip, however long or extreme its history; a worker's sum
/// beyond what its units can add is refused.
#[tokio::test]
async fn one_unit_moves_each_release_by_at_most_its_sensitivity() {
    let dir = tempfile::tempdir().unwrap();
    let cohort = SimulatedCohort::new("ar1:0.6", 50, 3, dir.path()).await;
    let plan = plan_for(&cohort, 2.0);
    let mut histories = cohort_histories(&cohort, &plan);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    // An extreme unit: every value at a bound, its full length.
    let template = histories[0].rows();
    let extreme: Vec<Vec<Option<f64>>> = (0..plan.layout.max_rows * 2)
        .map(|r| {
            let mut row = template[r % template.len()].clone();
            for &c in &plan.layout.columns {
                if let crate::data::domain::Encoding::Numeric { min, max, .. } = cohort.domain.columns[c].encoding {
                    row[c] = Some(if rng.random::<bool>() { min } else { max });
                }
            }
            row
        })
        .collect();
    // Held whole, so the sums' own cut at max_rows is what bounds it.
    let whole = ValueLayout { max_rows: usize::MAX, ..plan.layout.value_layout() };
    let extreme = group::<ValueRows>(extreme.into_iter().map(|row| ("extreme".to_string(), row)), &whole);
    assert_eq!(extreme[0].len(), 2 * plan.layout.max_rows);
    let moments_task =
        plan.moments_task(&CopulaModel::margins(&plan.layout, &plan.margins_task().sum(&histories).0, 0.0).0);
    for task in [plan.margins_task(), moments_task] {
        let (without, units) = task.sum(&histories);
        task.check(&without, units).unwrap();
        histories.extend(extreme.iter().cloned());
        let (with, _) = task.sum(&histories);
        histories.pop();
        let moved: Vec<f64> = with.iter().zip(&without).map(|(a, b)| a - b).collect();
        let norm = moved.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!(norm <= task.sensitivity() + 1e-9, "moved {norm} > {}", task.sensitivity());
        if let Stage::Margins = task.stage {
            let mut start = 0;
            for block in plan.layout.margin_blocks() {
                assert!(moved[start..start + block].iter().sum::<f64>() <= 1.0 + 1e-9);
                start += block;
            }
        }
        let inflated: Vec<f64> = without.iter().map(|v| v * 3.0 + 1.0).collect();
        assert!(task.check(&inflated, units).is_err());
    }
}

/// Drawn histories take their lengths from the released histogram, their times never go
/// back, and every value is inside its column's bounds.
#[tokio::test]
async fn histories_follow_the_released_lengths_and_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let cohort = SimulatedCohort::new("ar1:0.6", 300, 5, dir.path()).await;
    let plan = plan_for(&cohort, 2.0);
    let mut model = fit(&cohort, &plan, None);
    let mut lengths = vec![-3.0; plan.layout.max_rows];
    (lengths[1], lengths[6]) = (1.0, 3.0);
    model.lengths = lengths;
    let drawn = CopulaSampler::new(model).histories(4000, &mut ChaCha8Rng::seed_from_u64(9));
    let sevens = drawn.iter().filter(|h| h.len() == 7).count() as f64;
    assert!(drawn.iter().all(|h| h.len() == 2 || h.len() == 7));
    // 3/4 of 4,000 draws: standard deviation √(4000·¾·¼) ≈ 27.
    assert!((sevens - 3000.0).abs() < 120.0, "{sevens}");
    let (order, _) = plan.layout.order.clone().unwrap();
    for h in &drawn {
        assert!(h.windows(2).all(|w| w[1][order] >= w[0][order]));
        for row in h {
            for (c, v) in row.iter().enumerate() {
                let column = &cohort.domain.columns[c];
                if let (Some(v), crate::data::domain::Encoding::Numeric { min, max, .. }) = (v, &column.encoding) {
                    assert!((*min..=*max).contains(v), "{} = {v}", column.name);
                }
            }
        }
    }
}

/// Parameters a job cannot run are refused from the spec alone: lengths past the bound,
/// a clip no unit's moments can reach, `[calibration]` (which the copula cannot honour).
#[tokio::test]
async fn impossible_parameters_are_refused_when_planned() {
    let dir = tempfile::tempdir().unwrap();
    let cohort = SimulatedCohort::new("ar1:0.6", 20, 3, dir.path()).await;
    let plan = |params: HistoryCopulaParams| {
        let mut spec = cohort.spec.clone();
        spec.generator = GeneratorSpec::HistoryCopula(params);
        HistoryCopulaPlan::new(&spec, &cohort.domain, &AccountingOptions::default()).map(drop)
    };
    assert!(plan(HistoryCopulaParams::default()).is_ok());
    assert!(plan(HistoryCopulaParams { max_rows: 0, ..Default::default() }).is_err());
    assert!(plan(HistoryCopulaParams { max_rows: 1_000_000_000, ..Default::default() }).is_err());
    assert!(plan(HistoryCopulaParams { moment_clip: Some(1e300), ..Default::default() }).is_err());
    assert!(plan(HistoryCopulaParams { margin_share: 0.9, ..Default::default() }).is_err());
    let text = include_str!("../../../../examples/icu-copula.toml");
    let spec = crate::spec::JobSpec::parse(&format!("{text}\n[calibration]\n"), "calibrated").unwrap();
    let domain = crate::data::domain::Domain::from_spec(&spec);
    let refused = HistoryCopulaPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap_err();
    assert!(refused.to_string().contains("[calibration]"), "{refused}");
}

/// Whatever the released values (noise beyond any scale gives infinities), the fit ends
/// with a stationary model: finite matrices, draws inside the bounds.
#[tokio::test]
async fn a_fit_of_any_released_values_ends_stationary() {
    let dir = tempfile::tempdir().unwrap();
    let cohort = SimulatedCohort::new("ar1:0.6", 50, 3, dir.path()).await;
    let plan = plan_for(&cohort, 2.0);
    let margins = vec![f64::INFINITY; plan.margins_task().len()];
    let moments: Vec<f64> =
        (0..plan.layout.moment_len()).map(|i| if i % 2 == 0 { f64::INFINITY } else { -1e300 }).collect();
    let released = model::Released { margins, margin_noise: f64::INFINITY, moments, moment_noise: 1.0 };
    let model = CopulaModel::fit(plan.layout.clone(), released, vec![1.0; plan.layout.max_rows]);
    assert!(model.transition.iter().chain(&model.stationary).chain(&model.innovation).all(|v| v.is_finite()));
    let shape = model
        .shape
        .iter()
        .flat_map(|s| s.slopes.iter().flatten().chain(&s.offsets).chain(s.quantiles.iter().flatten()));
    assert!(shape.copied().all(f64::is_finite));
    let drawn = CopulaSampler::new(model).histories(20, &mut ChaCha8Rng::seed_from_u64(1));
    assert_eq!(drawn.len(), 20);
}
