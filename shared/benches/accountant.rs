//! Accountant speed: ε of a 10⁶-step DP-SGD run under RDP (target: well under 50 ms) and
//! of a 10⁵-step run under PLD (target: under 2 s), each beside a baseline measured in the
//! same run (the RDP of an unsampled Gaussian: a closed form, so the ratio shows the cost
//! of the subsampled analysis). Run with `cargo bench -p rhosynth-shared`.

use std::time::{Duration, Instant};

use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account};
use rhosynth_shared::accounting::mechanism::Mechanism;

/// Median wall time of `reps` runs of `f`.
fn median(reps: usize, mut f: impl FnMut() -> f64) -> (Duration, f64) {
    let mut times = Vec::with_capacity(reps);
    let mut value = 0.0;
    for _ in 0..reps {
        let start = Instant::now();
        value = std::hint::black_box(f());
        times.push(start.elapsed());
    }
    times.sort();
    (times[reps / 2], value)
}

fn main() {
    let options = AccountingOptions::default();
    let eps = |m: Mechanism, a: Accountant| account(&[m], a, 1e-5, &options).unwrap().epsilon;

    let (baseline, _) = median(21, || eps(Mechanism::dp_sgd(1.0, 1.1, 1_000_000), Accountant::Rdp));
    for (q, sigma) in [(0.01, 1.1), (0.001, 0.8), (0.2, 5.0)] {
        let (t, e) = median(21, || eps(Mechanism::dp_sgd(q, sigma, 1_000_000), Accountant::Rdp));
        println!(
            "rdp  T=1e6 q={q} σ={sigma}: ε={e:.4} in {:.2} ms (target < 50 ms; {:.0}× the unsampled-Gaussian baseline of {:.3} ms)",
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / baseline.as_secs_f64(),
            baseline.as_secs_f64() * 1e3
        );
    }
    for (q, sigma) in [(0.01, 1.1), (0.004266666666666667, 1.1), (0.05, 2.0)] {
        let (t, e) = median(3, || eps(Mechanism::dp_sgd(q, sigma, 100_000), Accountant::Pld));
        println!("pld  T=1e5 q={q} σ={sigma}: ε={e:.4} in {:.3} s (target < 2 s)", t.as_secs_f64());
    }
}
