//! DP step vs non-private step on this CPU (flex backend), measured in one run: an
//! ordinary backward pass of the summed loss against the DP step (ghost norms +
//! book-keeping clipped sum), and their ratio (target: DP ≤ 1.5× the non-private time).
//! Two models (`rhosynth_shared::workloads`): the DP-FinDiff denoiser (batch 256 rows) and
//! the sequence transformer (64 histories of the demo's ICU schema, one window each;
//! tokens/s). Run with `cargo bench -p rhosynth-shared --bench dpsgd_step`.

use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::workloads::{Workload, paired_medians};

fn main() {
    let device = compute_device();
    let shapes = [("denoiser hidden", 256, 256, 21), ("denoiser hidden", 512, 256, 21)]
        .map(|(name, width, units, reps)| (name, width, Workload::denoiser(width, units, false), reps))
        .into_iter()
        .chain([64, 128].map(|width| ("transformer width", width, Workload::transformer(width, 64, false), 11)));
    for (name, width, workload, reps) in shapes {
        let model = workload.model(&device, None).unwrap();
        let dp = || {
            std::hint::black_box(model.clipped_step(1.0).unwrap());
        };
        let (t_plain, t_dp) = paired_medians(8, reps, model.plain_step(), dp);
        let (items, what) = workload.items();
        let rate = |t: std::time::Duration| items as f64 / t.as_secs_f64();
        println!(
            "{name}={width} ({} parameters), {} units ({items} {what}): non-private {:.0} {what}/s, DP {:.0} {what}/s, DP/non-private time {:.2}× (target ≤ 1.5×)",
            model.parameter_count(),
            workload.units(),
            rate(t_plain),
            rate(t_dp),
            t_dp.as_secs_f64() / t_plain.as_secs_f64()
        );
    }
}
