//! Releasing private aggregates: the one place rhosynth draws privacy noise.
//!
//! A [`Releases`] is made from the ledger's receipt for a charge and holds what that charge
//! paid for. Each release names its sensitivity and noise multiplier; it draws noise only
//! if a charged mechanism has exactly those parameters and releases left, and uses them up.
//! So what is charged and what is drawn cannot disagree (OpenDP's measurement: the function
//! and its privacy map built together), and nothing is drawn before a charge. Exact
//! aggregates travel as [`Private`], which has no way out but a release.
//!
//! The noise source is private to this module:
//!
//! ```compile_fail
//! // Nothing outside `release` can draw privacy noise.
//! let _ = rhosynth_privacy::release::Noise::from_os();
//! ```
//!
//! Noise comes from ChaCha20 keyed from the operating system's entropy source. Floating-point
//! caveat: samples are IEEE-754 doubles (Ziggurat for the normal). Textbook floating-point
//! noise is known to leak through the low-order bits of `value + noise` (Mironov 2012), an
//! attack that needs the exact noisy output at full precision. rhosynth does not publish raw
//! noisy sums: DP-SGD sums feed an optimizer whose parameters are released only after many
//! steps, noisy counts are rounded at once, and PATE publishes only comparisons and
//! normalised shares.

use rand::rngs::ChaCha20Rng;
use rand::{CryptoRng, RngExt, SeedableRng};
use rand_distr::StandardNormal;
use rhosynth_shared::accounting::mechanism::{Mechanism, Sampling};
use rhosynth_shared::entropy::os_rng;

use crate::ledger::ChargeReceipt;

/// Slices longer than this are filled by several threads, each with its own ChaCha20
/// stream keyed from the parent generator.
const PARALLEL_THRESHOLD: usize = 1 << 20;
const CHUNK: usize = 1 << 18;

/// A value computed from private rows: an exact aggregate or a unit count. It has no
/// `Debug`, `Display`, `Clone` or `Serialize`; only a release makes it public.
pub struct Private<T>(T);

impl<T> Private<T> {
    pub fn new(value: T) -> Self {
        Self(value)
    }

    /// A value derived from this one, private as well.
    pub fn map<U>(&self, derive: impl FnOnce(&T) -> U) -> Private<U> {
        Private(derive(&self.0))
    }

    /// Runs a check on the value (a worker's aggregate against its bounds). Its outcome
    /// depends on private data: it may stop a job, and its detail goes to the operator log.
    /// (The coordinator is trusted: `Private` keeps private values from being released by
    /// accident, it does not hide them from the code that holds them.)
    pub fn check<E>(&self, check: impl FnOnce(&T) -> Result<(), E>) -> Result<(), E> {
        check(&self.0)
    }
}

/// A release that no charged mechanism pays for: a bug, never a data-dependent event (its
/// fields are public parameters).
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("no charge pays for this release: {what}")]
pub struct Unpaid {
    what: String,
}

/// What one charge paid for, and how much of it is left.
#[derive(Clone, Debug, PartialEq)]
enum Paid {
    Gaussian { l2_sensitivity: f64, noise_multiplier: f64, left: u64 },
    GnMax { sigma: f64, classes: u32, left: u64 },
    DpSgd { noise_multiplier: f64, rate: f64, left: u64 },
    Exponential { sensitivity: f64, epsilon: f64, left: u64 },
    PartitionSelection { max_partitions: u32, noise_multiplier: f64, threshold_delta: f64, left: u64 },
}

impl Paid {
    fn left(&mut self) -> &mut u64 {
        match self {
            Paid::Gaussian { left, .. }
            | Paid::GnMax { left, .. }
            | Paid::DpSgd { left, .. }
            | Paid::Exponential { left, .. }
            | Paid::PartitionSelection { left, .. } => left,
        }
    }

    /// The same mechanism, whatever is left of it.
    fn same(&self, other: &Paid) -> bool {
        let (mut a, mut b) = (self.clone(), other.clone());
        (*a.left(), *b.left()) = (0, 0);
        a == b
    }
}

/// One release paid from a zCDP budget, as it was run: kept so that what a run did can be
/// composed and set against what was charged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ZcdpRelease {
    /// N(0, (σΔ)²) on every coordinate of a query with L2 sensitivity Δ.
    Gaussian { l2_sensitivity: f64, noise_multiplier: f64 },
    /// One exponential-mechanism draw over scores with the given sensitivity.
    Exponential { sensitivity: f64, epsilon: f64 },
}

impl ZcdpRelease {
    /// Whether every parameter is a positive finite number (anything else is refused
    /// unpaid: a zero or negative Δ, σ or ε prices nothing real).
    fn is_valid(&self) -> bool {
        let positive = |x: f64| x.is_finite() && x > 0.0;
        match *self {
            ZcdpRelease::Gaussian { l2_sensitivity, noise_multiplier } => {
                positive(l2_sensitivity) && positive(noise_multiplier)
            }
            ZcdpRelease::Exponential { sensitivity, epsilon } => positive(sensitivity) && positive(epsilon),
        }
    }

    /// Its zCDP cost: 1/(2σ²) for the Gaussian, ε²/8 for the exponential mechanism
    /// (Cesar & Rogers 2021).
    pub fn rho(&self) -> f64 {
        match *self {
            ZcdpRelease::Gaussian { noise_multiplier, .. } => 1.0 / (2.0 * noise_multiplier * noise_multiplier),
            ZcdpRelease::Exponential { epsilon, .. } => epsilon * epsilon / 8.0,
        }
    }
}

/// The releases one charge pays for, with the noise to draw them.
pub struct Releases {
    paid: Vec<Paid>,
    /// What is left of the charge's zCDP budgets (a privacy filter over adaptive releases).
    zcdp_left: f64,
    /// The releases paid from the zCDP budget so far, in order.
    zcdp_released: Vec<ZcdpRelease>,
    noise: Noise,
}

/// Relative slack on a zCDP budget, so that a run spending exactly what is left (its
/// last round computes that from the rest) is not refused over rounding; the budget a
/// charge pays for is ρ/(1 + slack), so slack included the spend stays within ρ.
const ZCDP_SLACK: f64 = 1e-9;

impl Releases {
    /// Everything `receipt`'s charge paid for, once: a second call on the same charge (this
    /// receipt or a clone) is refused, so one charge is never spent twice.
    pub fn paid_by(receipt: &ChargeReceipt) -> Result<Self, rhosynth_shared::accounting::PrivacyError> {
        if !receipt.open() {
            return Err(rhosynth_shared::accounting::PrivacyError::SpentTwice(receipt.seq));
        }
        // Identical mechanisms pool their releases: which entry pays for a draw is immaterial.
        let mut paid: Vec<Paid> = Vec::new();
        let mut zcdp_left = 0.0;
        for m in receipt.mechanisms() {
            if let Mechanism::Zcdp { rho, .. } = *m {
                // Less the slack a spend may take, so the total never exceeds ρ.
                zcdp_left += rho / (1.0 + ZCDP_SLACK);
                continue;
            }
            let mut entry = match *m {
                Mechanism::Gaussian { l2_sensitivity, noise_multiplier, releases, .. } => {
                    Paid::Gaussian { l2_sensitivity, noise_multiplier, left: releases }
                }
                Mechanism::GnMax { sigma, classes, queries } => Paid::GnMax { sigma, classes, left: queries },
                Mechanism::SubsampledGaussian {
                    sampling: Sampling::Poisson { rate }, noise_multiplier, steps, ..
                } => Paid::DpSgd { noise_multiplier, rate, left: steps },
                Mechanism::Exponential { sensitivity, epsilon, selections } => {
                    Paid::Exponential { sensitivity, epsilon, left: selections }
                }
                Mechanism::PartitionSelection { max_partitions, noise_multiplier, threshold_delta } => {
                    Paid::PartitionSelection { max_partitions, noise_multiplier, threshold_delta, left: 1 }
                }
                Mechanism::Zcdp { .. } => unreachable!("taken above"),
            };
            match paid.iter_mut().find(|p| p.same(&entry)) {
                Some(p) => *p.left() += *entry.left(),
                None => paid.push(entry),
            }
        }
        Ok(Self { paid, zcdp_left, zcdp_released: Vec::new(), noise: Noise::from_os()? })
    }

    /// Uses up `n` releases of the paid mechanism `matches` selects; returns it.
    fn spend(&mut self, n: u64, what: impl Fn() -> String, matches: impl Fn(&Paid) -> bool) -> Result<Paid, Unpaid> {
        let paid = self.paid.iter_mut().find(|p| matches(p)).ok_or_else(|| Unpaid { what: what() })?;
        let left = paid.left();
        *left = left.checked_sub(n).ok_or_else(|| Unpaid { what: what() })?;
        Ok(paid.clone())
    }

    /// One release of a vector query with L2 sensitivity Δ: N(0, (σΔ)²) on every coordinate.
    pub fn gaussian(
        &mut self,
        exact: Private<Vec<f64>>,
        l2_sensitivity: f64,
        noise_multiplier: f64,
    ) -> Result<Vec<f64>, Unpaid> {
        self.gaussian_releases(exact, 1, l2_sensitivity, noise_multiplier)
    }

    /// Each value its own release of sensitivity Δ (one per query): N(0, (σΔ)²) on each.
    pub fn gaussian_each(
        &mut self,
        exact: Private<Vec<f64>>,
        l2_sensitivity: f64,
        noise_multiplier: f64,
    ) -> Result<Vec<f64>, Unpaid> {
        let n = exact.0.len() as u64;
        self.gaussian_releases(exact, n, l2_sensitivity, noise_multiplier)
    }

    fn gaussian_releases(
        &mut self,
        exact: Private<Vec<f64>>,
        n: u64,
        l2_sensitivity: f64,
        noise_multiplier: f64,
    ) -> Result<Vec<f64>, Unpaid> {
        let what = || format!("{n} Gaussian release(s) with Δ = {l2_sensitivity}, σ = {noise_multiplier}");
        self.spend(n, what, |p| {
            matches!(*p, Paid::Gaussian { l2_sensitivity: d, noise_multiplier: s, .. }
                if d == l2_sensitivity && s == noise_multiplier)
        })?;
        Ok(self.noise.noised(exact, noise_multiplier * l2_sensitivity))
    }

    /// GNMax's noisy histograms: `histograms` holds one query's `classes` vote counts after
    /// another; N(0, σ²) on every count (one unit moves one teacher's vote).
    pub fn gnmax(&mut self, histograms: Private<Vec<f64>>, classes: u32, sigma: f64) -> Result<Vec<f64>, Unpaid> {
        let queries = (histograms.0.len() / classes.max(1) as usize) as u64;
        let what = || format!("{queries} GNMax answer(s) over {classes} classes with σ = {sigma}");
        if histograms.0.len() as u64 != queries * u64::from(classes) {
            return Err(Unpaid { what: what() });
        }
        self.spend(
            queries,
            what,
            |p| matches!(*p, Paid::GnMax { sigma: s, classes: k, .. } if s == sigma && k == classes),
        )?;
        Ok(self.noise.noised(histograms, sigma))
    }

    /// One DP-SGD step at Poisson rate `rate`: the sum of clipped per-example gradients
    /// (norm ≤ `clip` each) with N(0, (σC)²) on every coordinate, as the charged mechanism
    /// states (a unit of m examples is accounted at σ/m).
    pub fn dp_sgd_step(
        &mut self,
        sum: Private<Vec<f64>>,
        clip: f64,
        noise_multiplier: f64,
        rate: f64,
    ) -> Result<Vec<f64>, Unpaid> {
        let what = || format!("a DP-SGD step with σ = {noise_multiplier} at rate {rate}");
        let charged = |p: &Paid| matches!(*p, Paid::DpSgd { noise_multiplier: s, rate: q, .. } if s == noise_multiplier && q == rate);
        self.spend(1, what, charged)?;
        Ok(self.noise.noised(sum, noise_multiplier * clip))
    }

    /// One draw of the exponential mechanism: the index of one of `scores` (each moved by
    /// at most Δ = `sensitivity` by one unit), picked with probability ∝ exp(ε·score/(2Δ))
    /// as the Gumbel-max of ε·score/(2Δ) + G with G standard Gumbel from the CSPRNG.
    /// Floating-point caveat: the draw is on doubles, not Ilvento's (2020) exact base-2
    /// sampler; only the index leaves.
    pub fn exponential(&mut self, scores: Private<Vec<f64>>, sensitivity: f64, epsilon: f64) -> Result<usize, Unpaid> {
        let what = || format!("an exponential-mechanism draw with Δ = {sensitivity}, ε = {epsilon}");
        // How many candidates there are is public; a score's value is not, so no check
        // on it may fail here (a NaN, a caller's bug, is never picked).
        if scores.0.is_empty() {
            return Err(Unpaid { what: what() });
        }
        let charged = |p: &Paid| matches!(*p, Paid::Exponential { sensitivity: d, epsilon: e, .. } if d == sensitivity && e == epsilon);
        self.spend(1, what, charged)?;
        Ok(self.noise.gumbel_max(&scores.0, epsilon / (2.0 * sensitivity)))
    }

    /// Partition selection over keys whose exact distinct-unit counts are `counts` (each
    /// unit counted once per key, in at most L = `max_partitions` keys): per key, its
    /// noisy count if that passed the threshold, else `None` — a key that did not pass
    /// must not leave, nor anything about it.
    pub fn partition_selection(
        &mut self,
        counts: Private<Vec<f64>>,
        max_partitions: u32,
        noise_multiplier: f64,
        threshold_delta: f64,
    ) -> Result<Vec<Option<f64>>, Unpaid> {
        let what = || {
            format!("partition selection with σ = {noise_multiplier}, L = {max_partitions}, δ_τ = {threshold_delta}")
        };
        self.spend(1, what, |p| {
            matches!(*p, Paid::PartitionSelection { max_partitions: l, noise_multiplier: s, threshold_delta: d, .. }
                if l == max_partitions && s == noise_multiplier && d == threshold_delta)
        })?;
        let threshold = Mechanism::selection_threshold(max_partitions, noise_multiplier, threshold_delta);
        let noisy = self.noise.noised(counts, noise_multiplier * f64::from(max_partitions).sqrt());
        Ok(noisy.into_iter().map(|c| (c > threshold).then_some(c)).collect())
    }

    /// The zCDP budget not yet spent.
    pub fn zcdp_left(&self) -> f64 {
        self.zcdp_left
    }

    /// The releases paid from the zCDP budget so far, in order.
    pub fn zcdp_released(&self) -> &[ZcdpRelease] {
        &self.zcdp_released
    }

    /// Takes `release`'s cost from the charged zCDP budget, or refuses if its parameters
    /// are not positive or less is left.
    fn spend_zcdp(&mut self, release: ZcdpRelease, what: impl Fn() -> String) -> Result<(), Unpaid> {
        let rho = release.rho();
        if !release.is_valid() || rho > self.zcdp_left * (1.0 + ZCDP_SLACK) {
            return Err(Unpaid { what: what() });
        }
        self.zcdp_left = (self.zcdp_left - rho).max(0.0);
        self.zcdp_released.push(release);
        Ok(())
    }

    /// A Gaussian release paid from the zCDP budget: N(0, (σΔ)²) on every coordinate of a
    /// query with L2 sensitivity Δ, costing 1/(2σ²).
    pub fn zcdp_gaussian(
        &mut self,
        exact: Private<Vec<f64>>,
        l2_sensitivity: f64,
        noise_multiplier: f64,
    ) -> Result<Vec<f64>, Unpaid> {
        let what =
            || format!("a Gaussian release with Δ = {l2_sensitivity}, σ = {noise_multiplier} within a zCDP budget");
        self.spend_zcdp(ZcdpRelease::Gaussian { l2_sensitivity, noise_multiplier }, what)?;
        Ok(self.noise.noised(exact, noise_multiplier * l2_sensitivity))
    }

    /// An exponential-mechanism draw paid from the zCDP budget, costing ε²/8.
    pub fn zcdp_exponential(
        &mut self,
        scores: Private<Vec<f64>>,
        sensitivity: f64,
        epsilon: f64,
    ) -> Result<usize, Unpaid> {
        let what = || format!("an exponential-mechanism draw with ε = {epsilon} within a zCDP budget");
        if scores.0.is_empty() {
            return Err(Unpaid { what: what() });
        }
        self.spend_zcdp(ZcdpRelease::Exponential { sensitivity, epsilon }, what)?;
        Ok(self.noise.gumbel_max(&scores.0, epsilon / (2.0 * sensitivity)))
    }

    /// Marks `steps` DP-SGD steps as already released (a run resumed from its checkpoint).
    pub fn resume_after(&mut self, steps: u64) -> Result<(), Unpaid> {
        self.spend(steps, || format!("{steps} DP-SGD steps"), |p| matches!(p, Paid::DpSgd { .. })).map(|_| ())
    }
}

/// The source of privacy noise: a CSPRNG, reachable only through [`Releases`].
struct Noise<R: CryptoRng = ChaCha20Rng> {
    rng: R,
}

impl Noise<ChaCha20Rng> {
    fn from_os() -> Result<Self, rhosynth_shared::accounting::PrivacyError> {
        Ok(Self { rng: os_rng()? })
    }
}

impl<R: CryptoRng> Noise<R> {
    /// The private values with N(0, std²) added to each: now they may be released.
    fn noised(&mut self, exact: Private<Vec<f64>>, std: f64) -> Vec<f64> {
        #[cfg(feature = "planted-bugs")]
        let std = std / rhosynth_shared::planted::noise_divisor();
        let mut values = exact.0;
        self.add_gaussian(&mut values, std);
        values
    }

    /// The index of the largest `scale·score + G`, G standard Gumbel (−ln(−ln U), U
    /// uniform on (0, 1)): a draw ∝ exp(scale·score). A NaN score (a caller's bug) is
    /// never picked. `scores` is not empty.
    fn gumbel_max(&mut self, scores: &[f64], scale: f64) -> usize {
        let mut gumbel = || -(-self.rng.random::<f64>().max(f64::MIN_POSITIVE).ln()).ln();
        let noisy = scores.iter().map(|s| if s.is_nan() { f64::NEG_INFINITY } else { scale * s + gumbel() });
        noisy.enumerate().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(i, _)| i).expect("non-empty")
    }

    /// Adds independent N(0, std²) noise to every value (a DP-SGD step noises every
    /// parameter). Long slices are split across threads.
    fn add_gaussian(&mut self, values: &mut [f64], std: f64) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let add = move |rng: &mut ChaCha20Rng, v: &mut f64| *v += std * rng.sample::<f64, _>(StandardNormal);
        if values.len() < PARALLEL_THRESHOLD || threads == 1 {
            let mut rng = ChaCha20Rng::from_rng(&mut self.rng);
            values.iter_mut().for_each(|v| add(&mut rng, v));
            return;
        }
        let mut chunks: Vec<(ChaCha20Rng, &mut [f64])> =
            values.chunks_mut(CHUNK).map(|c| (ChaCha20Rng::from_rng(&mut self.rng), c)).collect();
        let per_thread = chunks.len().div_ceil(threads);
        std::thread::scope(|scope| {
            for group in chunks.chunks_mut(per_thread) {
                scope.spawn(move || {
                    for (rng, chunk) in group.iter_mut() {
                        chunk.iter_mut().for_each(|v| add(rng, v));
                    }
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    //! Statistical checks of the noise against its exact distribution, with seeded
    //! ChaCha20 for reproducibility (production noise is keyed from the OS). For n samples
    //! the sample mean has std σ/√n and the sample variance σ²·√(2/n); we allow 5 standard
    //! errors. The Kolmogorov–Smirnov statistic's 0.1% critical value is 1.949/√n.

    use rand::SeedableRng;
    use rhosynth_shared::accounting::math::normal_cdf;
    use rhosynth_shared::accounting::mechanism::{Adjacency, Sampling};

    use super::*;

    fn seeded(paid: Vec<Paid>, seed: u64) -> Releases {
        Releases {
            paid,
            zcdp_left: 0.0,
            zcdp_released: Vec::new(),
            noise: Noise { rng: ChaCha20Rng::seed_from_u64(seed) },
        }
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

    fn assert_standard_normal(x: &mut [f64], std: f64) {
        let (mean, var) = mean_var(x);
        let n = x.len() as f64;
        assert!(mean.abs() < 5.0 * std / n.sqrt(), "mean {mean}");
        assert!((var - std * std).abs() < 5.0 * std * std * (2.0 / n).sqrt(), "var {var}");
        let d = ks_statistic(x, |v| normal_cdf(v / std));
        assert!(d < 1.949 / n.sqrt(), "KS {d}");
    }

    /// A key held by one unit passes at rate δ_τ/L (here 0.1, within 5 binomial standard
    /// errors over 200,000 keys); a key of 40 units passes always, with its count noised
    /// by σ√L; a key that did not pass gives nothing back.
    #[test]
    fn partition_selection_passes_a_lone_key_at_its_rate() {
        let (n, l, sigma, delta) = (200_000, 2, 1.0, 0.2);
        let paid = vec![Paid::PartitionSelection {
            max_partitions: l,
            noise_multiplier: sigma,
            threshold_delta: delta,
            left: 1,
        }];
        let mut releases = seeded(paid, 5);
        let mut counts = vec![1.0; n];
        counts.extend(vec![40.0; n]);
        let passed = releases.partition_selection(Private::new(counts), l, sigma, delta).unwrap();
        let lone = passed[..n].iter().filter(|c| c.is_some()).count() as f64 / n as f64;
        let p = delta / f64::from(l);
        assert!((lone - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(), "lone keys passed at {lone}");
        let mut common: Vec<f64> = passed[n..].iter().map(|c| c.expect("a common key passes") - 40.0).collect();
        assert_standard_normal(&mut common, sigma * f64::from(l).sqrt());
        // Paid once: a second selection is refused.
        assert!(releases.partition_selection(Private::new(vec![1.0]), l, sigma, delta).is_err());
    }

    #[test]
    fn a_gaussian_release_draws_sigma_times_delta() {
        let (n, delta, sigma) = (200_000, 1.5, 2.0);
        let paid = vec![Paid::Gaussian { l2_sensitivity: delta, noise_multiplier: sigma, left: 1 }];
        let mut releases = seeded(paid, 1);
        let mut x = releases.gaussian(Private::new(vec![0.0; n]), delta, sigma).unwrap();
        assert_standard_normal(&mut x, sigma * delta);
    }

    #[test]
    fn long_vectors_use_independent_streams_with_the_right_law() {
        // Above the parallel threshold: several threads, one ChaCha20 stream each.
        let n = 3 << 20;
        let paid = vec![Paid::DpSgd { noise_multiplier: 0.5, rate: 0.1, left: 1 }];
        let mut x = seeded(paid, 3).dp_sgd_step(Private::new(vec![0.0; n]), 2.0, 0.5, 0.1).unwrap();
        // Chunks must not repeat each other (a shared or reused stream would).
        let chunk = 1 << 18;
        assert_ne!(x[..16], x[chunk..chunk + 16]);
        assert_standard_normal(&mut x, 0.5 * 2.0);
    }

    #[test]
    fn exponential_draws_follow_the_softmax_of_the_scaled_scores() {
        let (n, scores) = (40_000, vec![0.0, 1.0, 2.0, 0.5]);
        let paid = vec![Paid::Exponential { sensitivity: 2.0, epsilon: 4.0, left: n }];
        let mut releases = seeded(paid, 5);
        let mut seen = [0.0; 4];
        for _ in 0..n {
            seen[releases.exponential(Private::new(scores.clone()), 2.0, 4.0).unwrap()] += 1.0;
        }
        // P(i) ∝ exp(ε·score/(2Δ)) = exp(score).
        let total: f64 = scores.iter().map(|s: &f64| s.exp()).sum();
        for (s, count) in scores.iter().zip(seen) {
            let p = s.exp() / total;
            let f = count / n as f64;
            assert!((f - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(), "score {s}: {f} vs {p}");
        }
        assert!(releases.exponential(Private::new(scores), 2.0, 4.0).is_err(), "all draws used");
    }

    #[test]
    fn a_zcdp_budget_pays_for_adaptive_releases_until_it_is_spent() {
        let receipt = ChargeReceipt::for_test(vec![Mechanism::Zcdp { rho: 0.5, adjacency: Adjacency::AddRemove }]);
        let mut releases = Releases::paid_by(&receipt).unwrap();
        // Four draws at ε = 1 (1/8 each) spend it all, up to the slack.
        for _ in 0..3 {
            releases.zcdp_exponential(Private::new(vec![1.0, 2.0]), 1.0, 1.0).unwrap();
        }
        assert!((releases.zcdp_left() - 0.125).abs() < 1e-9 && releases.zcdp_left() < 0.125);
        assert!(releases.zcdp_gaussian(Private::new(vec![0.0]), 1.0, 1.0).is_err(), "costs 0.5");
        // The last round spends exactly what is left: σ = 1/√(2·left).
        let sigma = 1.0 / (2.0 * releases.zcdp_left()).sqrt();
        assert!(releases.zcdp_gaussian(Private::new(vec![0.0; 3]), 0.0, sigma).is_err(), "Δ = 0");
        assert!(releases.zcdp_gaussian(Private::new(vec![0.0; 3]), 2.0, -sigma).is_err(), "σ < 0");
        assert!(releases.zcdp_exponential(Private::new(vec![1.0]), 1.0, -1e-3).is_err(), "ε < 0");
        releases.zcdp_gaussian(Private::new(vec![0.0; 3]), 2.0, sigma).unwrap();
        assert!(releases.zcdp_exponential(Private::new(vec![1.0]), 1.0, 1e-3).is_err(), "nothing left");
        // What was run, refusals left out, spends the budget.
        let run = releases.zcdp_released();
        assert_eq!(run.len(), 4);
        assert_eq!(run[3], ZcdpRelease::Gaussian { l2_sensitivity: 2.0, noise_multiplier: sigma });
        assert!((run.iter().map(ZcdpRelease::rho).sum::<f64>() - 0.5).abs() < 1e-9);
        // No zCDP budget charged: nothing is paid from one.
        let mut none =
            Releases::paid_by(&ChargeReceipt::for_test(vec![Mechanism::GnMax { sigma: 10.0, classes: 2, queries: 1 }]))
                .unwrap();
        assert!(none.zcdp_gaussian(Private::new(vec![0.0]), 1.0, 100.0).is_err());
    }

    /// One charge, one allowance: a second `paid_by` on the same receipt, or on a clone of
    /// it, is refused (it would spend the whole charge again).
    #[test]
    fn a_charge_opens_its_releases_once() {
        let receipt = ChargeReceipt::for_test(vec![Mechanism::GnMax { sigma: 10.0, classes: 2, queries: 1 }]);
        let copy = receipt.clone();
        let mut releases = Releases::paid_by(&receipt).unwrap();
        for again in [&receipt, &copy] {
            let refused = Releases::paid_by(again).map(drop).unwrap_err();
            assert!(matches!(refused, rhosynth_shared::accounting::PrivacyError::SpentTwice(1)), "{refused}");
        }
        releases.gnmax(Private::new(vec![3.0, 1.0]), 2, 10.0).unwrap();
        assert!(releases.gnmax(Private::new(vec![3.0, 1.0]), 2, 10.0).is_err(), "one query was paid");
    }

    #[test]
    fn only_what_was_charged_is_drawn() {
        let receipt = ChargeReceipt::for_test(vec![
            Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: 20.0,
                releases: 3,
                adjacency: Adjacency::AddRemove,
            },
            Mechanism::GnMax { sigma: 10.0, classes: 2, queries: 2 },
            Mechanism::Exponential { sensitivity: 1.0, epsilon: 0.5, selections: 1 },
            Mechanism::SubsampledGaussian {
                sampling: Sampling::Poisson { rate: 0.1 },
                noise_multiplier: 1.1,
                steps: 5,
                max_examples_per_unit: 1,
            },
        ]);
        let mut releases = Releases::paid_by(&receipt).unwrap();
        // A σ or Δ other than the charged one is refused, whatever is left.
        assert!(releases.gaussian(Private::new(vec![1.0]), 1.0, 2.0).is_err());
        assert!(releases.gaussian(Private::new(vec![1.0]), 2.0, 20.0).is_err());
        assert!(releases.gnmax(Private::new(vec![1.0, 2.0]), 2, 1.0).is_err());
        assert!(releases.gnmax(Private::new(vec![1.0, 2.0, 3.0]), 2, 10.0).is_err(), "not whole histograms");
        assert!(releases.dp_sgd_step(Private::new(vec![0.0]), 1.0, 0.9, 0.1).is_err());
        assert!(releases.dp_sgd_step(Private::new(vec![0.0]), 1.0, 1.1, 0.2).is_err(), "another rate");
        assert!(releases.exponential(Private::new(vec![1.0, 2.0]), 1.0, 1.0).is_err(), "another ε");
        assert!(releases.exponential(Private::new(vec![1.0, 2.0]), 2.0, 0.5).is_err(), "another Δ");
        assert!(releases.exponential(Private::new(vec![]), 1.0, 0.5).is_err(), "no candidates");
        // What was charged is drawn, then no more.
        releases.gaussian(Private::new(vec![1.0; 4]), 1.0, 20.0).unwrap();
        releases.gaussian_each(Private::new(vec![1.0; 2]), 1.0, 20.0).unwrap();
        assert!(releases.gaussian(Private::new(vec![1.0]), 1.0, 20.0).is_err());
        releases.gnmax(Private::new(vec![1.0; 4]), 2, 10.0).unwrap();
        assert!(releases.gnmax(Private::new(vec![1.0; 2]), 2, 10.0).is_err());
        releases.resume_after(4).unwrap();
        releases.dp_sgd_step(Private::new(vec![0.0]), 1.0, 1.1, 0.1).unwrap();
        assert!(releases.dp_sgd_step(Private::new(vec![0.0]), 1.0, 1.1, 0.1).is_err());
        releases.exponential(Private::new(vec![1.0, 2.0]), 1.0, 0.5).unwrap();
        assert!(releases.exponential(Private::new(vec![1.0, 2.0]), 1.0, 0.5).is_err());
    }

    /// PATE with a binary target charges two GNMax entries with the same σ and classes
    /// (labels and realness answers): they pool, so any split of the draws is paid for.
    #[test]
    fn identical_charges_pool_their_releases() {
        let receipt = ChargeReceipt::for_test(vec![
            Mechanism::GnMax { sigma: 10.0, classes: 2, queries: 167 },
            Mechanism::GnMax { sigma: 10.0, classes: 2, queries: 500 },
        ]);
        let mut releases = Releases::paid_by(&receipt).unwrap();
        for _ in 0..5 {
            releases.gnmax(Private::new(vec![1.0; 200]), 2, 10.0).unwrap();
        }
        releases.gnmax(Private::new(vec![1.0; 334]), 2, 10.0).unwrap();
        assert!(releases.gnmax(Private::new(vec![1.0; 2]), 2, 10.0).is_err());
    }

    #[test]
    fn os_keyed_sources_differ() {
        let (mut a, mut b) = (Noise::from_os().unwrap(), Noise::from_os().unwrap());
        let (mut xa, mut xb) = (vec![0.0; 8], vec![0.0; 8]);
        a.add_gaussian(&mut xa, 1.0);
        b.add_gaussian(&mut xb, 1.0);
        assert_ne!(xa, xb);
    }
}
