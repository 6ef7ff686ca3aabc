//! Statistical checks of the noise samplers against their exact distributions. The
//! generators here are seeded ChaCha20 instances, for reproducibility only; production
//! noise is keyed from the OS (`Noise::from_os`).
//!
//! Tolerances: for n samples the sample mean has std σ/√n and the sample variance
//! σ²·√(2/n) (Gaussian) or σ²·√(5/n) (Laplace, kurtosis 6); we allow 5 standard errors.
//! The Kolmogorov–Smirnov statistic's 0.1% critical value is 1.949/√n.

use dpsynth_shared::privacy::math::normal_cdf;
use dpsynth_shared::privacy::noise::Noise;
use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

fn seeded(seed: u64) -> Noise<ChaCha20Rng> {
    Noise::with_rng(ChaCha20Rng::seed_from_u64(seed))
}

fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    (mean, var)
}

fn ks_statistic(x: &mut [f64], cdf: impl Fn(f64) -> f64) -> f64 {
    x.sort_by(f64::total_cmp);
    let n = x.len() as f64;
    x.iter().enumerate().fold(0.0_f64, |d, (i, v)| {
        let f = cdf(*v);
        d.max((f - i as f64 / n).abs()).max(((i + 1) as f64 / n - f).abs())
    })
}

fn laplace_cdf(scale: f64) -> impl Fn(f64) -> f64 {
    move |x| {
        if x < 0.0 { 0.5 * (x / scale).exp() } else { 1.0 - 0.5 * (-x / scale).exp() }
    }
}

#[test]
fn gaussian_matches_its_distribution() {
    let (n, std) = (200_000, 3.0);
    let mut x = vec![0.0; n];
    seeded(1).add_gaussian(&mut x, std);
    let (mean, var) = mean_var(&x);
    let nf = n as f64;
    assert!(mean.abs() < 5.0 * std / nf.sqrt(), "mean {mean}");
    assert!((var - std * std).abs() < 5.0 * std * std * (2.0 / nf).sqrt(), "var {var}");
    let d = ks_statistic(&mut x, |v| normal_cdf(v / std));
    assert!(d < 1.949 / nf.sqrt(), "KS {d}");
}

#[test]
fn laplace_matches_its_distribution() {
    let (n, scale) = (200_000, 0.5);
    let mut x = vec![0.0; n];
    seeded(2).add_laplace(&mut x, scale);
    let (mean, var) = mean_var(&x);
    let nf = n as f64;
    let sd = scale * 2f64.sqrt();
    assert!(mean.abs() < 5.0 * sd / nf.sqrt(), "mean {mean}");
    assert!((var - 2.0 * scale * scale).abs() < 5.0 * 2.0 * scale * scale * (5.0 / nf).sqrt(), "var {var}");
    let d = ks_statistic(&mut x, laplace_cdf(scale));
    assert!(d < 1.949 / nf.sqrt(), "KS {d}");
}

#[test]
fn long_vectors_use_independent_streams_with_the_right_law() {
    // Above the parallel threshold: several threads, one ChaCha20 stream each.
    let n = 3 << 20;
    let mut x = vec![0.0_f32; n];
    seeded(3).add_gaussian_f32(&mut x, 1.0);
    let mut x: Vec<f64> = x.into_iter().map(f64::from).collect();
    let (mean, var) = mean_var(&x);
    let nf = n as f64;
    assert!(mean.abs() < 5.0 / nf.sqrt() && (var - 1.0).abs() < 5.0 * (2.0 / nf).sqrt(), "{mean} {var}");
    // Chunks must not repeat each other (a shared or reused stream would).
    let chunk = 1 << 18;
    assert_ne!(x[..16], x[chunk..chunk + 16]);
    let d = ks_statistic(&mut x, normal_cdf);
    assert!(d < 1.949 / nf.sqrt(), "KS {d}");
}

#[test]
fn os_keyed_sources_differ() {
    let (mut a, mut b) = (Noise::from_os().unwrap(), Noise::from_os().unwrap());
    let xa: Vec<f64> = (0..8).map(|_| a.gaussian(1.0)).collect();
    let xb: Vec<f64> = (0..8).map(|_| b.gaussian(1.0)).collect();
    assert_ne!(xa, xb);
}
