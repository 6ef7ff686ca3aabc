//! Noise samplers for the coordinator, the only place dpsynth adds privacy noise.
//!
//! Noise comes from ChaCha20 keyed from the operating system's entropy source
//! ([`Noise::from_os`]). The type only accepts generators marked [`CryptoRng`]; a
//! deterministic one may be passed by tests through [`Noise::with_rng`], never in production.
//!
//! Floating-point caveats: samples are IEEE-754 doubles (Ziggurat for the normal, a
//! difference of exponentials for the Laplace). Textbook floating-point noise is known to
//! leak through the pattern of low-order bits of `value + noise` (Mironov 2012), an attack
//! that needs the exact noisy output at full precision. dpsynth does not publish raw noisy
//! sums: DP-SGD sums feed an optimizer whose parameters are only released after many
//! steps, and noisy counts are rounded before use. The samplers are not "snapped" or
//! discrete; a release that publishes raw noisy values should round them to a grid coarser
//! than the noise's resolution.

use rand::rngs::{ChaCha20Rng, SysRng};
use rand::{CryptoRng, RngExt, SeedableRng, TryRng};
use rand_distr::{Exp1, StandardNormal};

use super::PrivacyError;

/// Slices longer than this are filled by several threads, each with its own ChaCha20
/// stream keyed from the parent generator.
const PARALLEL_THRESHOLD: usize = 1 << 20;
const CHUNK: usize = 1 << 18;

/// A source of privacy noise backed by a cryptographically secure generator.
pub struct Noise<R: CryptoRng = ChaCha20Rng> {
    rng: R,
}

/// ChaCha20 keyed with 256 bits from the OS entropy source: for all private randomness
/// (noise, which units or rows are sampled) and for seeds nobody may guess.
pub fn os_rng() -> Result<ChaCha20Rng, PrivacyError> {
    ChaCha20Rng::try_from_rng(&mut SysRng).map_err(|e| PrivacyError::Entropy(format!("cannot read OS entropy: {e}")))
}

/// 256 bits from the OS entropy source.
pub fn os_seed() -> Result<[u8; 32], PrivacyError> {
    let mut seed = [0u8; 32];
    SysRng.try_fill_bytes(&mut seed).map_err(|e| PrivacyError::Entropy(format!("cannot read OS entropy: {e}")))?;
    Ok(seed)
}

impl Noise<ChaCha20Rng> {
    /// ChaCha20 keyed from the OS ([`os_rng`]).
    pub fn from_os() -> Result<Self, PrivacyError> {
        Ok(Self { rng: os_rng()? })
    }
}

impl<R: CryptoRng> Noise<R> {
    /// Uses a given CSPRNG (tests pass a seeded one to make statistics reproducible).
    pub fn with_rng(rng: R) -> Self {
        Self { rng }
    }

    /// One N(0, std²) sample.
    pub fn gaussian(&mut self, std: f64) -> f64 {
        std * self.rng.sample::<f64, _>(StandardNormal)
    }

    /// One Laplace(0, scale) sample.
    pub fn laplace(&mut self, scale: f64) -> f64 {
        scale * (self.rng.sample::<f64, _>(Exp1) - self.rng.sample::<f64, _>(Exp1))
    }

    /// Adds independent N(0, std²) noise to every value (a DP-SGD step noises every
    /// parameter). Long slices are split across threads.
    pub fn add_gaussian(&mut self, values: &mut [f64], std: f64) {
        self.fill(values, move |rng, v| *v += std * rng.sample::<f64, _>(StandardNormal));
    }

    /// [`Noise::add_gaussian`] for `f32` parameters; the noise is drawn in `f64`.
    pub fn add_gaussian_f32(&mut self, values: &mut [f32], std: f64) {
        self.fill(values, move |rng, v| *v = (f64::from(*v) + std * rng.sample::<f64, _>(StandardNormal)) as f32);
    }

    /// Adds independent Laplace(0, scale) noise to every value.
    pub fn add_laplace(&mut self, values: &mut [f64], scale: f64) {
        self.fill(values, move |rng, v| {
            *v += scale * (rng.sample::<f64, _>(Exp1) - rng.sample::<f64, _>(Exp1));
        });
    }

    fn fill<T: Send>(&mut self, values: &mut [T], add: impl Fn(&mut ChaCha20Rng, &mut T) + Sync) {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        if values.len() < PARALLEL_THRESHOLD || threads == 1 {
            let mut rng = ChaCha20Rng::from_rng(&mut self.rng);
            values.iter_mut().for_each(|v| add(&mut rng, v));
            return;
        }
        let mut chunks: Vec<(ChaCha20Rng, &mut [T])> =
            values.chunks_mut(CHUNK).map(|c| (ChaCha20Rng::from_rng(&mut self.rng), c)).collect();
        let per_thread = chunks.len().div_ceil(threads);
        std::thread::scope(|scope| {
            for group in chunks.chunks_mut(per_thread) {
                let add = &add;
                scope.spawn(move || {
                    for (rng, chunk) in group.iter_mut() {
                        chunk.iter_mut().for_each(|v| add(rng, v));
                    }
                });
            }
        });
    }
}
