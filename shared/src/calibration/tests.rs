use rand::rngs::{ChaCha8Rng, ChaCha20Rng};
use rand::{RngExt, SeedableRng};

use super::raking::{rake, resample};
use super::{CalibratedSampler, CalibrationPlan, Targets, with_calibration};
use crate::accounting::accountant::{AccountingOptions, account, zcdp_budget};
use crate::data::domain::Domain;
use crate::generators::Sampler;
use crate::generators::marginals::MarginalsPlan;
use crate::output::{SyntheticUnits, SyntheticValue};
use crate::spec::JobSpec;
use crate::testing::{generator, schema_job};

/// Three columns, `colour` the target; `extra` appended (a `[calibration]` section).
fn job(extra: &str) -> JobSpec {
    let schema = r#"
target = "colour"
[[schema.columns]]
name = "colour"
kind = "categorical"
categories = ["red", "green", "blue"]
missing = "reject"
[[schema.columns]]
name = "size"
kind = "categorical"
categories = ["s", "m", "l", "xl"]
missing = "reject"
[[schema.columns]]
name = "age"
kind = "integer"
min = 0
max = 99
bins = 5
missing = "reject"
"#;
    let text = schema_job(schema, &generator("marginals", ""))
        .replace("delta = 1e-5\n", "delta = 1e-5\nledger = \"l\"\ndataset_budget = { epsilon = 10.0, delta = 1e-5 }\n");
    JobSpec::parse(&format!("{text}{extra}"), "t.toml").unwrap()
}

fn category(names: &[&str], i: usize) -> SyntheticValue {
    SyntheticValue::Category(names[i].to_string())
}

const COLOURS: [&str; 3] = ["red", "green", "blue"];
const SIZES: [&str; 4] = ["s", "m", "l", "xl"];

/// One row: colour, size, age.
fn row(colour: usize, size: usize, age: i64) -> Vec<SyntheticValue> {
    vec![category(&COLOURS, colour), category(&SIZES, size), SyntheticValue::Integer(age)]
}

/// The weighted shares of a table over `units`, binned as the raking bins them.
fn shares(units: &SyntheticUnits, weights: &[f64], domain: &Domain, columns: &[usize]) -> Vec<f64> {
    let sizes: Vec<usize> = domain.columns.iter().map(|c| c.bins()).collect();
    let mut table = vec![0.0; columns.iter().map(|&c| sizes[c]).product()];
    let mut begin = 0;
    for (u, &end) in units.ends.iter().enumerate() {
        let rows = (end - begin) as f64;
        for row in &units.rows[begin..end] {
            let cell = columns.iter().fold(0, |acc, &c| acc * sizes[c] + domain.columns[c].bin_of(&row[c]).unwrap());
            table[cell] += weights[u] / rows;
        }
        begin = end;
    }
    let total: f64 = table.iter().sum();
    table.iter().map(|v| v / total).collect()
}

/// The plan: every column's 1-way table and the target's pairs, one Gaussian release that
/// costs the declared share of the job's zCDP budget; the generator's noise calibrated with
/// it composes to ε; none without the section.
#[test]
fn the_release_alone_costs_its_share_and_the_generator_composes_with_it() {
    let options = AccountingOptions::default();
    let spec = job("[calibration]\nepsilon_share = 0.2");
    let domain = Domain::from_spec(&spec);
    let plan = CalibrationPlan::new(&spec, &domain, &options).unwrap().unwrap();
    assert_eq!(plan.task.tables, vec![vec![0], vec![1], vec![2], vec![0, 1], vec![0, 2]]);
    assert_eq!(plan.task.sensitivity(), 5f64.sqrt());
    assert!(plan.task.row_level);
    let budget = zcdp_budget(1.0, 1e-5, &options).unwrap();
    assert!((plan.rho() - 0.2 * budget).abs() < 1e-12 * budget, "{} of {budget}", plan.rho());

    // The marginals generator's own σ is calibrated with it: the two compose to ε.
    let marginals = MarginalsPlan::new(&spec, &domain, &options).unwrap();
    assert_eq!(marginals.calibration.as_ref(), Some(&plan));
    let sigma = marginals.calibrate(&spec, &options).unwrap();
    let charged = marginals.mechanisms(sigma);
    assert_eq!(charged, with_calibration(vec![marginals.mechanism(sigma)], Some(&plan)));
    let total = account(&charged, spec.privacy.accountant, spec.privacy.delta, &options).unwrap();
    assert!((total.epsilon - 1.0).abs() < 1e-5, "{}", total.epsilon);
    let uncalibrated = job("");
    assert!(CalibrationPlan::new(&uncalibrated, &domain, &options).unwrap().is_none());
    let plain =
        MarginalsPlan::new(&uncalibrated, &domain, &options).unwrap().calibrate(&uncalibrated, &options).unwrap();
    assert!(sigma > plain, "the calibration's share leaves the generator more noise ({sigma} vs {plain})");

    let pairs_off = job("[calibration]\ntarget_pairs = false");
    assert_eq!(CalibrationPlan::new(&pairs_off, &domain, &options).unwrap().unwrap().task.tables.len(), 3);
    for bad in ["epsilon_share = 0.0", "epsilon_share = 0.6", "pool = 0", "max_rows_per_unit = 0"] {
        let text = format!("{}[calibration]\n{bad}\n", include_str!("../../../examples/demo.toml"));
        assert!(JobSpec::parse(&text, "demo.toml").is_err(), "{bad}");
    }
}

/// Rows of one unit each: raking is iterative proportional fitting, and targets the pool
/// can meet (the shares of the pool under other weights) are met to the tolerance, 1-way
/// tables and a pair alike.
#[test]
fn raking_meets_targets_the_pool_can_meet() {
    let spec = job("[calibration]");
    let domain = Domain::from_spec(&spec);
    let plan = CalibrationPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut pool = SyntheticUnits::default();
    for _ in 0..3000 {
        let colour = rng.random_range(0..3);
        pool.push([row(colour, (colour + rng.random_range(0..2)) % 4, rng.random_range(0..100))]);
    }
    // Targets: the pool's own tables under weights favouring blue and large ages.
    let truth: Vec<f64> = pool
        .rows
        .iter()
        .map(|r| {
            let blue = if r[0] == category(&COLOURS, 2) { 3.0 } else { 1.0 };
            let SyntheticValue::Integer(age) = r[2] else { unreachable!() };
            blue * (1.0 + age as f64 / 50.0)
        })
        .collect();
    let noisy: Vec<f64> = plan.task.tables.iter().flat_map(|t| shares(&pool, &truth, &domain, t)).collect();
    let targets = Targets::new(&plan.task, &noisy);
    let weights = rake(&pool, &domain, &targets, 1);
    for table in &plan.task.tables {
        let want = shares(&pool, &truth, &domain, table);
        let got = shares(&pool, &weights, &domain, table);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "table {table:?}: {got:?} vs {want:?}");
        }
    }
}

/// Units of several rows: each counts as min(rows, m) rows spread over its cells, as the
/// worker's reservoir counts it, and the geometric-mean update still meets targets the
/// pool can meet.
#[test]
fn raking_histories_counts_each_as_the_reservoir_does() {
    let spec = job("[calibration]\ntarget_pairs = false\nmax_rows_per_unit = 2");
    let domain = Domain::from_spec(&spec);
    let plan = CalibrationPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap().unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut pool = SyntheticUnits::default();
    for _ in 0..2000 {
        let colour = rng.random_range(0..3);
        let rows = rng.random_range(1..6);
        pool.push((0..rows).map(|_| row(colour, rng.random_range(0..4), rng.random_range(0..100))));
    }
    // A unit's rows weigh min(rows, 2) / rows each: the table is the shares below with
    // unit weights × min(rows, 2).
    let counted = |u: usize, w: f64| {
        let rows = pool.ends[u] - if u == 0 { 0 } else { pool.ends[u - 1] };
        w * rows.min(2) as f64
    };
    let truth: Vec<f64> = (0..pool.units())
        .map(|u| {
            let first = if u == 0 { 0 } else { pool.ends[u - 1] };
            if pool.rows[first][0] == category(&COLOURS, 0) { 4.0 } else { 1.0 }
        })
        .collect();
    let as_counted = |w: &[f64]| (0..w.len()).map(|u| counted(u, w[u])).collect::<Vec<f64>>();
    let noisy: Vec<f64> =
        plan.task.tables.iter().flat_map(|t| shares(&pool, &as_counted(&truth), &domain, t)).collect();
    let weights = rake(&pool, &domain, &Targets::new(&plan.task, &noisy), 2);
    for table in &plan.task.tables {
        let want = shares(&pool, &as_counted(&truth), &domain, table);
        let got = shares(&pool, &as_counted(&weights), &domain, table);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-3, "table {table:?}: {got:?} vs {want:?}");
        }
    }
}

/// Systematic resampling draws unit i ⌊n·wᵢ/W⌋ or one more times, n in all.
#[test]
fn resampling_draws_each_unit_its_share() {
    let weights = [0.5, 3.0, 0.0, 1.25, 7.0, 0.25];
    let total: f64 = weights.iter().sum();
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    for n in [1, 7, 100, 1001] {
        let picks = resample(&weights, n, &mut rng);
        assert_eq!(picks.len(), n);
        for (i, w) in weights.iter().enumerate() {
            let drawn = picks.iter().filter(|&&p| p == i).count() as f64;
            let expected = n as f64 * w / total;
            assert!(drawn >= expected.floor() - 1e-9 && drawn <= expected.floor() + 1.0, "unit {i}: {drawn} for {n}");
        }
    }
}

/// A generator whose rows miss the released marginals: calibrated, its output's 1-way
/// shares sit within five binomial standard deviations of the targets, and a value whose
/// noisy count came out negative is not drawn.
#[test]
fn a_calibrated_sampler_matches_the_released_shares() {
    struct Skewed;
    impl Sampler for Skewed {
        fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
            let rows = (0..units).map(|_| {
                let colour = if rng.random_bool(0.8) { 0 } else { rng.random_range(1..3) };
                row(colour, rng.random_range(0..3), rng.random_range(0..100))
            });
            SyntheticUnits::one_row_each(rows.collect())
        }
    }
    let spec = job("[calibration]\ntarget_pairs = false");
    let domain = Domain::from_spec(&spec);
    let plan = CalibrationPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap().unwrap();
    // colour 0.2 / 0.3 / 0.5; size 0.4 / 0.4 / 0.2 / (negative: nothing); age by bin.
    let noisy = [200.0, 300.0, 500.0, 400.0, 400.0, 200.0, -30.0, 100.0, 100.0, 100.0, 300.0, 400.0];
    let mut sampler = CalibratedSampler {
        inner: Box::new(Skewed),
        targets: Targets::new(&plan.task, &noisy),
        domain: domain.clone(),
        pool: 4,
        max_rows_per_unit: 1,
    };
    let n = 20_000;
    let out = sampler.sample(n, &mut ChaCha20Rng::seed_from_u64(11));
    assert_eq!(out.units(), n);
    let ones = vec![1.0; n];
    let want = [vec![0.2, 0.3, 0.5], vec![0.4, 0.4, 0.2, 0.0], vec![0.1, 0.1, 0.1, 0.3, 0.4]];
    for (c, want) in want.iter().enumerate() {
        let got = shares(&out, &ones, &domain, &[c]);
        for (g, w) in got.iter().zip(want) {
            let tolerance = 5.0 * (w * (1.0 - w) / n as f64).sqrt() + 1e-9;
            assert!((g - w).abs() <= tolerance, "column {c}: {got:?} vs {want:?}");
        }
    }
}
