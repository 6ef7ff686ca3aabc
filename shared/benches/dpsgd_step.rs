//! DP step vs non-private step for the DP-FinDiff denoiser on this CPU (flex backend),
//! batch 256, measured in one run: examples/s of an ordinary backward pass of the summed
//! loss, of the DP step (ghost norms + book-keeping clipped sum), and their ratio
//! (target: DP ≤ 1.5× the non-private time). Run with
//! `cargo bench -p dpsynth-shared --bench dpsgd_step`.

use std::time::{Duration, Instant};

use dpsynth_shared::data::domain::Domain;
use dpsynth_shared::data::examples::Examples;
use dpsynth_shared::dpsgd::ghost::Plain;
use dpsynth_shared::dpsgd::params::LinearStack;
use dpsynth_shared::dpsgd::{DpModel, RoundSettings, RowRef, clipped_gradient_sum, compute_device};
use dpsynth_shared::generators::findiff::encoding::TabularEncoding;
use dpsynth_shared::generators::findiff::model::DenoiserConfig;
use dpsynth_shared::generators::findiff::{FinDiffModel, FinDiffModelSpec};

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
    let device = compute_device();
    let examples = Examples {
        x: (0..BATCH * WIDTH).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect(),
        width: WIDTH,
        units: (0..BATCH).map(|u| (format!("u{u}"), u..u + 1)).collect(),
    };
    let units: Vec<usize> = (0..BATCH).collect();
    let rows: Vec<RowRef<'_>> =
        examples.units.iter().map(|(id, r)| RowRef { row: r.start, unit: id, position: 0 }).collect();
    let defaults = dpsynth_shared::spec::FinDiffParams::default();
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
        let settings = RoundSettings { round: 0, rate: 1.0, clip: 1.0, seed: [1; 32], micro_batch: BATCH };
        let plain = || {
            let losses = tracked.losses(&examples, &rows, &settings.seed, &device, &mut Plain);
            let grads = losses.sum().backward();
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
