//! DP step vs non-private step on this CPU (flex backend), measured in one run: an
//! ordinary backward pass of the summed loss against the DP step (ghost norms +
//! book-keeping clipped sum), and their ratio (target: DP ≤ 1.5× the non-private time).
//! Two models: the DP-FinDiff denoiser (batch 256 rows) and the sequence transformer
//! (64 histories of the demo's ICU schema, one window each; tokens/s). Run with
//! `cargo bench -p rhosynth-shared --bench dpsgd_step`.

use std::time::{Duration, Instant};

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rhosynth_shared::data::domain::{Binning, Domain, Encoding};
use rhosynth_shared::data::examples::Examples;
use rhosynth_shared::decoder::DecoderConfig;
use rhosynth_shared::dpsgd::ghost::Plain;
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::dpsgd::{DpModel, RoundSettings, clipped_gradient_sum, compute_device};
use rhosynth_shared::generators::findiff::encoding::TabularEncoding;
use rhosynth_shared::generators::findiff::model::DenoiserConfig;
use rhosynth_shared::generators::findiff::{FinDiffModel, FinDiffModelSpec};
use rhosynth_shared::generators::sequence::{self, Histories, Layout, SequenceModel, SequenceModelSpec, WindowSpec};
use rhosynth_shared::spec::JobSpec;

const BATCH: usize = 256;
/// Adult's feature width: 6 numeric columns and 9 categorical ones embedded in 2-d.
const WIDTH: usize = 24;

fn time(f: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// Medians of `reps` alternating runs of `a` and `b`, after warm-up (the backend's
/// allocator grows during the first steps), so both see the same machine state.
fn paired_medians(reps: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..8 {
        a();
        b();
    }
    let (mut ta, mut tb): (Vec<Duration>, Vec<Duration>) = (0..reps).map(|_| (time(&mut a), time(&mut b))).unzip();
    ta.sort();
    tb.sort();
    (ta[reps / 2], tb[reps / 2])
}

fn main() {
    denoiser();
    transformer();
}

/// Histories of the demo's ICU schema (benchmark data: uniform values, hourly rows).
fn icu_histories(domain: &Domain, layout: &Layout, units: usize, rows: usize) -> Histories {
    let mut rng = ChaCha8Rng::from_seed([7; 32]);
    let order = domain.index_of("charttime").unwrap();
    let mut all = Vec::with_capacity(units * rows);
    for u in 0..units {
        for r in 0..rows {
            let row = domain
                .columns
                .iter()
                .enumerate()
                .map(|(c, column)| match &column.encoding {
                    _ if c == order => Some(1.74e9 + 3600.0 * r as f64),
                    Encoding::Categorical { categories, .. } => Some(rng.random_range(0..categories.len()) as f64),
                    Encoding::Numeric { min, max, .. } => Some(min + rng.random::<f64>() * (max - min)),
                })
                .collect();
            all.push((format!("patient-{u}"), row));
        }
    }
    Histories::from_rows(all, layout)
}

fn transformer() {
    let device = compute_device();
    let spec = JobSpec::parse(include_str!("../../examples/demo.toml"), "demo").unwrap();
    let domain = Domain::from_spec(&spec);
    let order = domain.index_of("charttime").unwrap();
    let range = match &domain.columns[order].encoding {
        Encoding::Numeric { min, max, .. } => max - min,
        _ => unreachable!(),
    };
    let layout = Layout::new(&domain, Some((order, Binning::gaps(range, 16, false))), &[], 8, 50);
    let window = WindowSpec { p_start: 0.2, context_rows: 2, window_rows: 4 };
    let units = 64;
    let examples = icu_histories(&domain, &layout, units, 20);
    let all: Vec<usize> = (0..units).collect();
    for width in [64, 128] {
        let transformer =
            DecoderConfig::new(layout.vocabulary(), layout.max_tokens(window.rows()), width, 4, 2, 4 * width);
        let spec = SequenceModelSpec {
            domain: domain.clone(),
            layout: layout.clone(),
            transformer,
            window: window.clone(),
            lagged: layout.lag_inputs(),
        };
        let model = SequenceModel::new(&spec, &device);
        let tracked = model.tracked();
        let seed = [1; 32];
        let settings = RoundSettings::new(0, 1.0, 1.0, seed, units).unwrap();
        let tokens = (0..units)
            .map(|u| sequence::window::window(&layout, &window, &examples.units[u], &seed).tokens.len())
            .sum::<usize>();
        let plain = || {
            let batch = tracked.losses(&examples, &all, &seed, &device, &mut Plain);
            let grads = batch.losses.sum().backward();
            std::hint::black_box(tracked.flat_gradient(&grads));
        };
        let dp = || {
            std::hint::black_box(clipped_gradient_sum(&model, &examples, &all, &settings, &device).unwrap());
        };
        let (t_plain, t_dp) = paired_medians(11, plain, dp);
        let rate = |t: Duration| tokens as f64 / t.as_secs_f64();
        println!(
            "transformer width={width} ({} parameters), {units} windows ({tokens} tokens): non-private {:.0} tokens/s, DP {:.0} tokens/s, DP/non-private time {:.2}× (target ≤ 1.5×)",
            model.parameter_count(),
            rate(t_plain),
            rate(t_dp),
            t_dp.as_secs_f64() / t_plain.as_secs_f64()
        );
    }
}

fn denoiser() {
    let device = compute_device();
    let examples = Examples {
        x: (0..BATCH * WIDTH).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect(),
        width: WIDTH,
        units: (0..BATCH).map(|u| (format!("u{u}"), u..u + 1)).collect(),
    };
    let units: Vec<usize> = (0..BATCH).collect();
    let defaults = rhosynth_shared::generators::findiff::FinDiffParams::default();
    for hidden in [256, 512] {
        let spec = FinDiffModelSpec {
            domain: Domain { columns: Vec::new() },
            encoding: TabularEncoding { features: Vec::new(), width: WIDTH },
            denoiser: DenoiserConfig::new(WIDTH, hidden, defaults.blocks, defaults.time_embedding),
            diffusion_steps: 500,
            beta_start: 1e-4,
            beta_end: 0.02,
            max_rows_per_unit: 1,
        };
        let mut model = FinDiffModel::new(&spec, &device);
        model.set_timestep_exponent(1.0);
        let tracked = model.tracked();
        let seed = [1; 32];
        let settings = RoundSettings::new(0, 1.0, 1.0, seed, BATCH).unwrap();
        let plain = || {
            let batch = tracked.losses(&examples, &units, &seed, &device, &mut Plain);
            let grads = batch.losses.sum().backward();
            std::hint::black_box(tracked.flat_gradient(&grads));
        };
        let dp = || {
            std::hint::black_box(clipped_gradient_sum(&model, &examples, &units, &settings, &device).unwrap());
        };
        let (t_plain, t_dp) = paired_medians(21, plain, dp);
        let rate = |t: Duration| BATCH as f64 / t.as_secs_f64();
        println!(
            "denoiser hidden={hidden} ({} parameters), batch {BATCH}: non-private {:.0} examples/s, DP {:.0} examples/s, DP/non-private time {:.2}× (target ≤ 1.5×)",
            model.parameter_count(),
            rate(t_plain),
            rate(t_dp),
            t_dp.as_secs_f64() / t_plain.as_secs_f64()
        );
    }
}
