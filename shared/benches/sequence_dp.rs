//! The sequence model under DP (#39, item 2): `examples/icu-sequence.toml`'s model trained
//! with DP-SGD at (ε, δ) on simulated cohorts, its histories against the cohort and a
//! held-out cohort: per vital lag-1 autocorrelation, transition error and rows-per-unit TV.
//! Directions side by side: the example as it is (`DP_STAGE1_EPSILON=0`), and stage 1 on
//! a paid release (`DP_STAGE1_EPSILON=ε₁`): a Gaussian release of each history's length,
//! each column's first value and its lag-1 transitions (one unit's share of each table sums
//! to at most 1, so each table has L2 sensitivity 1), pseudo histories drawn from it, the
//! model pretrained on them without noise (post-processing), then DP-SGD at what is left
//! of ε (one RDP composition: count, release, run); or, with `DP_STAGE1=copula`, stage 1
//! on the history copula's release at ε₁ (as `examples/icu-sequence-reference.toml`
//! makes it: the model pretrained on its histories, which also give the lengths), then
//! DP-SGD calibrated to ε − ε₁ on its own (the two jobs composed as the ledger composes
//! them, by adding ε). The DP-SGD loop is the engine's round
//! (Poisson sampling, ghost-clipped sums, N(0, σ²C²) noise, the plan's optimizer) in one
//! process. Noise here comes from a seeded generator: simulated data, a benchmark only.
//!
//! `cargo bench -p rhosynth-shared --bench sequence_dp --profile dev`; environment:
//! `DP_PATIENTS` (3000), `DP_EPSILON` (2), `DP_STAGE1_EPSILON` (0), `DP_STAGE1` (`copula`: stage
//! 1 on the copula's release; else the release of tables above), `DP_DYNAMICS`
//! (`hidden-state,ar1:0.6`), `DP_EPOCHS`, `DP_BATCH`, `DP_LR` (the example's unless set),
//! `DP_COARSE` (0: stage 1's transitions between bins; k: between k groups of adjacent
//! bins, a bin drawn inside its group by the column's bins over all rows),
//! `DP_PRETRAIN_STEPS` (400; 1,500 on the copula's), `DP_PRETRAIN_BATCH` (32; 16), `DP_PRETRAIN_LR` (0.01), `DP_SEED` (1),
//! `DP_LENGTH_EPSILON` (0; else a Gaussian histogram of lengths of its own, sensitivity 1,
//! at this ε, used instead of stage 1's), `DP_LENGTH_SIGMA` (that histogram's noise
//! multiplier instead; the engine's `length_share` sets it from the job's ε), `DP_CONDITION_LENGTHS` (true: histories take
//! their lengths from a released histogram when there is one).

use std::time::Instant;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal};
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, calibrate_sigma};
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::histories::{ValueHistory, ValueLayout};
use rhosynth_shared::dpsgd::optimizer::{Optimizer, OptimizerSpec};
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::dpsgd::{RoundSettings, clipped_gradient_sum, compute_device};
use rhosynth_shared::eval::longitudinal::Longitudinal;
use rhosynth_shared::generators::GeneratorSpec;
use rhosynth_shared::generators::history_copula::{CopulaSampler, HistoryCopulaParams, HistoryCopulaPlan, simulated};
use rhosynth_shared::generators::sequence::ceiling::{SimulatedCohort, sample};
use rhosynth_shared::generators::sequence::params::PlainTraining;
use rhosynth_shared::generators::sequence::pretrain::train_plain;
use rhosynth_shared::generators::sequence::{Histories, Layout, SequenceModel, SequencePlan};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Gap bins (seconds): [0, 60), then doubling from one minute.
const GAP_BINS: usize = 18;

fn gap_bin(seconds: f64) -> usize {
    if seconds < 60.0 { 0 } else { ((seconds / 60.0).log2().floor() as usize + 1).min(GAP_BINS - 1) }
}

fn gap_draw(bin: usize, rng: &mut ChaCha8Rng) -> f64 {
    let (lo, hi) =
        if bin == 0 { (0.0, 60.0) } else { (60.0 * 2f64.powi(bin as i32 - 1), 60.0 * 2f64.powi(bin as i32)) };
    lo + rng.random::<f64>() * (hi - lo)
}

/// Each history's length, each column's first bin (with `coarse` groups: its bins over all
/// rows) and lag-1 transitions (between groups of bins: `coarse` groups of adjacent value
/// bins, missing its own; every bin its own group without), and the order column's gaps:
/// one unit adds at most 1 to each table's sum.
struct HistoryTables {
    lengths: Vec<f64>,
    first: Vec<Vec<f64>>,
    transitions: Vec<Vec<Vec<f64>>>,
    gaps: Vec<f64>,
    coarse: usize,
    /// Each column's group of each bin.
    group: Vec<Vec<usize>>,
}

impl HistoryTables {
    fn measure(domain: &Domain, order: usize, histories: &[ValueHistory], max_rows: usize, coarse: usize) -> Self {
        let bins: Vec<usize> = domain.columns.iter().map(|c| c.bins()).collect();
        let group: Vec<Vec<usize>> = domain
            .columns
            .iter()
            .map(|c| {
                let values = c.value_bins();
                let k = if coarse == 0 { values } else { coarse.min(values) };
                (0..c.bins()).map(|b| if b < values { b * k / values } else { k }).collect()
            })
            .collect();
        let groups: Vec<usize> = group.iter().map(|g| g.iter().max().unwrap() + 1).collect();
        let mut t = Self {
            lengths: vec![0.0; max_rows],
            first: bins.iter().map(|&b| vec![0.0; b]).collect(),
            transitions: groups.iter().map(|&g| vec![vec![0.0; g]; g]).collect(),
            gaps: vec![0.0; GAP_BINS],
            coarse,
            group,
        };
        for history in histories {
            let rows = history.rows();
            let n = rows.len().min(max_rows);
            if n == 0 {
                continue;
            }
            t.lengths[n - 1] += 1.0;
            for (c, column) in domain.columns.iter().enumerate() {
                if t.coarse == 0 {
                    t.first[c][column.bin(rows[0][c])] += 1.0;
                } else {
                    rows[..n].iter().for_each(|r| t.first[c][column.bin(r[c])] += 1.0 / n as f64);
                }
                let g = &t.group[c];
                for w in rows[..n].windows(2) {
                    t.transitions[c][g[column.bin(w[0][c])]][g[column.bin(w[1][c])]] += 1.0 / (n - 1) as f64;
                }
            }
            for w in rows[..n].windows(2) {
                if let (Some(a), Some(b)) = (w[0][order], w[1][order]) {
                    t.gaps[gap_bin(b - a)] += 1.0 / (n - 1) as f64;
                }
            }
        }
        t
    }

    /// Tables a unit touches: its L2 sensitivity is the square root.
    fn tables(&self) -> usize {
        2 + self.first.len() + self.transitions.len()
    }

    fn add_noise(&mut self, std: f64, rng: &mut ChaCha8Rng) {
        let normal = Normal::new(0.0, std).unwrap();
        let mut noisy = |v: &mut f64| *v += normal.sample(rng);
        self.lengths.iter_mut().for_each(&mut noisy);
        self.gaps.iter_mut().for_each(&mut noisy);
        self.first.iter_mut().flatten().for_each(&mut noisy);
        self.transitions.iter_mut().flatten().flatten().for_each(&mut noisy);
    }

    /// `count` pseudo histories: a length, each column's chain from its first bin through
    /// its transitions (a row with no mass left falls back to the column's first bins),
    /// values drawn inside bins, times by gaps.
    fn draw(&self, domain: &Domain, layout: &Layout, order: usize, count: usize, rng: &mut ChaCha8Rng) -> Histories {
        let pick = |weights: &[f64], rng: &mut ChaCha8Rng| -> Option<usize> {
            let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
            if total <= 0.0 {
                return None;
            }
            let mut x = rng.random::<f64>() * total;
            for (i, w) in weights.iter().enumerate() {
                x -= w.max(0.0);
                if x <= 0.0 {
                    return Some(i);
                }
            }
            Some(weights.len() - 1)
        };
        let mut rows = Vec::new();
        for u in 0..count {
            let n = pick(&self.lengths, rng).unwrap_or(0) + 1;
            let mut bins: Vec<usize> = self.first.iter().map(|f| pick(f, rng).unwrap_or(0)).collect();
            let mut time = None;
            for r in 0..n {
                if r > 0 {
                    for (c, b) in bins.iter_mut().enumerate() {
                        let g = &self.group[c];
                        // The next group, then a bin of it by the column's bins.
                        let next = pick(&self.transitions[c][g[*b]], rng);
                        if self.coarse == 0 {
                            *b = next.or_else(|| pick(&self.first[c], rng)).unwrap_or(0);
                            continue;
                        }
                        let within: Vec<f64> = (0..g.len())
                            .map(|i| if next.is_none_or(|n| g[i] == n) { self.first[c][i] } else { 0.0 })
                            .collect();
                        *b = pick(&within, rng).or_else(|| pick(&self.first[c], rng)).unwrap_or(0);
                    }
                }
                let mut row: Vec<Option<f64>> =
                    domain.columns.iter().zip(&bins).map(|(c, &b)| c.encoded(&c.draw(b, rng))).collect();
                time = match (time, r) {
                    (Some(t), r) if r > 0 => Some(t + gap_draw(pick(&self.gaps, rng).unwrap_or(0), rng)),
                    _ => row[order],
                };
                row[order] = time;
                rows.push((format!("p{u}"), row));
            }
        }
        Histories::from_rows(rows, layout)
    }
}

fn report(name: &str, l: &Longitudinal, seconds: f64) {
    let f = |v: Option<f64>| v.map_or("—".into(), |x| format!("{x:.3}"));
    let lags: Vec<String> =
        l.dynamics.iter().map(|d| format!("{} {}/{}", d.column, f(d.lag1_synthetic), f(d.lag1_real))).collect();
    println!("{name} ({seconds:.0} s): lag-1 synthetic/real {}", lags.join(", "));
    println!("  {}", l.dynamics_summary());
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let patients: usize = env("DP_PATIENTS", 3000);
    let epsilon: f64 = env("DP_EPSILON", 2.0);
    let stage1: f64 = env("DP_STAGE1_EPSILON", 0.0);
    let seed: u64 = env("DP_SEED", 1);
    let kinds: String = env("DP_DYNAMICS", "hidden-state,ar1:0.6".to_string());
    let dir = tempfile::tempdir().unwrap();
    let device = compute_device();
    println!("# Sequence model under DP: {patients} patients, ε = {epsilon}, stage 1 ε₁ = {stage1}, seed {seed}");
    for kind in kinds.split(',') {
        let cohort = SimulatedCohort::new(kind, patients, 2026 + seed, dir.path()).await;
        let mut spec = cohort.spec.clone();
        if let rhosynth_shared::generators::GeneratorSpec::Sequence(p) = &mut spec.generator {
            p.run.epochs = env("DP_EPOCHS", p.run.epochs);
            p.run.batch_size = env("DP_BATCH", p.run.batch_size);
            if let Ok(lr) = std::env::var("DP_LR") {
                p.run.optimizer = OptimizerSpec::Adam { lr: lr.parse().unwrap(), beta1: 0.9, beta2: 0.999, eps: 1e-8 };
            }
        }
        let options = AccountingOptions::default();
        let (domain, order) = (&cohort.domain, cohort.order);
        let plan = SequencePlan::new(&spec, domain, &options).unwrap();
        let histories = cohort.histories(&plan.model.layout);
        let started = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);

        // The run's shape at the true N (the count's own release is charged, not used).
        let n = histories.units.len() as f64;
        let run = &plan.run;
        let rate = run.rate(n);
        let steps = run.steps(rate);
        let max_rows = plan.model.layout.max_rows;
        let values = cohort.value_histories(&ValueLayout { width: domain.columns.len(), order: Some(order), max_rows });
        let mut tables = HistoryTables::measure(domain, order, &values, max_rows, env("DP_COARSE", 0));
        let sensitivity = (tables.tables() as f64).sqrt();
        let copula_stage1 = std::env::var("DP_STAGE1").as_deref() == Ok("copula") && stage1 > 0.0;
        let stage1_sigma = (stage1 > 0.0 && !copula_stage1).then(|| {
            let release = |s| vec![gaussian(sensitivity, s)];
            calibrate_sigma(stage1, spec.privacy.delta, Accountant::Rdp, &options, release).unwrap()
        });
        // The length histogram on its own (sensitivity 1), at its own ε.
        let length_epsilon: f64 = env("DP_LENGTH_EPSILON", 0.0);
        let length_sigma = (length_epsilon > 0.0).then(|| {
            let release = |s| vec![gaussian(1.0, s)];
            calibrate_sigma(length_epsilon, spec.privacy.delta, Accountant::Rdp, &options, release).unwrap()
        });
        let length_sigma = std::env::var("DP_LENGTH_SIGMA").ok().map(|s| s.parse::<f64>().unwrap()).or(length_sigma);
        let mechanisms = |s: f64| {
            let mut m = vec![run.count_mechanism(), Mechanism::dp_sgd(rate, s, steps)];
            m.extend(stage1_sigma.map(|s1| gaussian(sensitivity, s1)));
            m.extend(length_sigma.map(|sl| gaussian(1.0, sl)));
            m
        };
        let run_epsilon = if copula_stage1 { epsilon - stage1 } else { epsilon };
        let sigma = calibrate_sigma(run_epsilon, spec.privacy.delta, Accountant::Rdp, &options, mechanisms).unwrap();
        let mut model = SequenceModel::new(&plan.model, &device);
        let mut lengths = None;
        if let Some(sl) = length_sigma {
            let normal = Normal::new(0.0, sl).unwrap();
            lengths = Some(tables.lengths.iter().map(|v| v + normal.sample(&mut rng)).collect());
        }
        // Stage 1's pseudo histories (and what they are, for the report), and the
        // pretraining's default steps and batch.
        let stage_one = if copula_stage1 {
            let mut copula_spec = cohort.spec.clone();
            copula_spec.generator = GeneratorSpec::HistoryCopula(HistoryCopulaParams::default());
            copula_spec.privacy.epsilon = stage1;
            let copula_plan = HistoryCopulaPlan::new(&copula_spec, domain, &options).unwrap();
            let copula_histories = cohort.value_histories(&copula_plan.layout.value_layout());
            let copula = simulated::fit(&copula_plan, &copula_histories, |values, std| {
                let normal = Normal::new(0.0, std).unwrap();
                values.iter_mut().for_each(|v| *v += normal.sample(&mut rng));
            });
            let drawn = CopulaSampler::new(copula).histories(patients, &mut rng);
            let rows = drawn.iter().enumerate().flat_map(|(i, h)| h.iter().map(move |r| (format!("c{i}"), r.clone())));
            let pseudo = Histories::from_rows(rows, &plan.model.layout);
            let mut drawn_lengths = vec![0.0; max_rows];
            drawn.iter().for_each(|h| drawn_lengths[h.len().clamp(1, max_rows) - 1] += 1.0);
            lengths = lengths.or(Some(drawn_lengths));
            Some((pseudo, format!("the copula's histories (ε₁ = {stage1})"), (1500, 16)))
        } else if let Some(s1) = stage1_sigma {
            tables.add_noise(s1 * sensitivity, &mut rng);
            lengths = lengths.or_else(|| Some(tables.lengths.clone()));
            let pseudo = tables.draw(domain, &plan.model.layout, order, patients.max(2000), &mut rng);
            println!("{kind}: stage 1 σ₁ = {s1:.2} (Δ = {sensitivity:.2})");
            Some((pseudo, "stage 1's pseudo histories themselves".to_string(), (400, 32)))
        } else {
            None
        };
        if let Some((pseudo, what, (steps, batch))) = stage_one {
            let drawn: Vec<Vec<Vec<Option<f64>>>> = pseudo.units.iter().map(|h| h.values(&plan.model.layout)).collect();
            report(&format!("{kind}, {what}"), &cohort.evaluate(&drawn), started.elapsed().as_secs_f64());
            let pretraining = PlainTraining {
                steps: env("DP_PRETRAIN_STEPS", steps),
                batch: env("DP_PRETRAIN_BATCH", batch),
                learning_rate: env("DP_PRETRAIN_LR", 0.01),
            };
            let losses = train_plain(&mut model, &pseudo, &pretraining, seed);
            println!(
                "{kind}: pretrained {} steps: loss {:.1} → {:.1}",
                pretraining.steps,
                losses[0],
                losses.last().unwrap()
            );
            let l = cohort.evaluate(&sample(&model, patients.min(1000), lengths.clone(), seed + 2));
            report(&format!("{kind}, pretrained only"), &l, started.elapsed().as_secs_f64());
        }
        println!("{kind}: DP-SGD q = {rate:.4}, {steps} steps, σ = {sigma:.3}, ε = {epsilon}");
        let mut parameters: Vec<f64> = model.parameters().into_iter().map(f64::from).collect();
        let mut optimizer = Optimizer::new(run.run.optimizer, run.run.schedule, steps, parameters.len());
        let noise = Normal::new(0.0, sigma * run.run.clip).unwrap();
        for round in 0..steps {
            let units: Vec<usize> = (0..histories.units.len()).filter(|_| rng.random::<f64>() < rate).collect();
            let settings = RoundSettings::new(round, rate, run.run.clip, rng.random(), run.run.micro_batch).unwrap();
            let sum = clipped_gradient_sum(&model, &histories, &units, &settings, &device).unwrap().sum;
            let gradient: Vec<f64> = sum.iter().map(|s| (s + noise.sample(&mut rng)) / (rate * n)).collect();
            optimizer.step(&mut parameters, &gradient);
            let flat: Vec<f32> = parameters.iter().map(|&p| p as f32).collect();
            model.load_parameters(&flat).unwrap();
        }
        if !env("DP_CONDITION_LENGTHS", true) {
            lengths = None;
        }
        let l = cohort.evaluate(&sample(&model, patients, lengths, seed + 1));
        report(kind, &l, started.elapsed().as_secs_f64());
    }
}

fn gaussian(l2_sensitivity: f64, noise_multiplier: f64) -> Mechanism {
    Mechanism::Gaussian { l2_sensitivity, noise_multiplier, releases: 1, adjacency: Adjacency::AddRemove }
}
