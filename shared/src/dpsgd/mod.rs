//! Distributed DP-SGD, generic over the model.
//!
//! Per round, the coordinator broadcasts the parameters; every worker Poisson-samples the
//! units of its partitions with the *global* rate q (so the union over workers is Poisson
//! sampling of the whole dataset), computes each sampled unit's gradient (the sum over
//! the unit's rows), clips it as a whole to L2 norm C and returns the sum and the number
//! of sampled units. The coordinator alone adds N(0, σ²C²) per coordinate, divides by
//! the *expected* batch q·N̂ and steps its optimizer.
//!
//! Privacy map: one unit changes the summed clipped gradient by at most C (add/remove),
//! so T rounds are the Poisson-subsampled Gaussian mechanism with rate q, noise
//! multiplier σ and T steps (`Mechanism::dp_sgd`), charged before the first round.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ghost;
pub mod layers;
pub mod optimizer;
pub mod params;
pub mod plan;
pub mod run;
pub mod trainable;

use burn::tensor::{Device, Tensor};
use rand::rngs::ChaCha8Rng;
use rand::{CryptoRng, RngExt, SeedableRng};
use sha2::{Digest, Sha256};

use ghost::{GhostTape, Hook, clipped_sum};
use params::TrainableLayers;

/// Engine errors.
#[derive(Debug, thiserror::Error)]
pub enum DpSgdError {
    #[error("model: {0}")]
    Model(String),
    #[error("a DP-SGD round needs 0 < rate ≤ 1 and a positive finite clip, not rate {rate} and clip {clip}")]
    Round { rate: f64, clip: f64 },
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Privacy(#[from] crate::accounting::PrivacyError),
}

/// The device models run on: the first CUDA GPU with the `cuda` feature, else the CPU.
pub fn compute_device() -> Device {
    #[cfg(feature = "cuda")]
    {
        Device::cuda(0)
    }
    #[cfg(not(feature = "cuda"))]
    {
        cpu_device()
    }
}

/// The CPU (`flex`) backend: every build has it, a GPU build to check its GPU against.
pub fn cpu_device() -> Device {
    Device::flex()
}

/// A worker's private examples, grouped by privacy unit.
pub trait UnitExamples {
    fn unit_count(&self) -> usize;
}

/// A model the engine can train: the losses of a micro-batch of units through a layer
/// hook.
pub trait DpModel: TrainableLayers {
    type Examples: UnitExamples;

    /// The losses of `units` (indices into `examples`) and the unit of each row the
    /// model's layers see. Any randomness inside the loss is non-private and keyed by
    /// `seed` and the unit's id, so a sum does not depend on which worker holds which unit.
    fn losses(
        &self,
        examples: &Self::Examples,
        units: &[usize],
        seed: &[u8; 32],
        device: &Device,
        hook: &mut impl Hook,
    ) -> Batch;
}

/// The generator of a unit's non-private randomness in a round (a row's timestep, a
/// window's split), keyed by the round seed, the unit's id and a position in the unit:
/// the same on any worker and in any micro-batch.
pub fn keyed_rng(seed: &[u8; 32], unit: &str, position: usize) -> ChaCha8Rng {
    let mut hasher = Sha256::new();
    hasher.update(seed);
    hasher.update((unit.len() as u64).to_le_bytes());
    hasher.update(unit.as_bytes());
    hasher.update((position as u64).to_le_bytes());
    ChaCha8Rng::from_seed(hasher.finalize().into())
}

/// A micro-batch's losses (only their sum is differentiated) and, for each row every layer
/// sees, the index of its unit in the micro-batch.
pub struct Batch {
    pub losses: Tensor<1>,
    pub units: Vec<usize>,
}

/// Settings of one round that every worker gets; valid by construction (the coordinator's
/// and a worker's alike).
#[derive(Clone, Debug, PartialEq)]
pub struct RoundSettings {
    pub(crate) round: u64,
    /// Poisson sampling rate q of every unit.
    pub(crate) rate: f64,
    /// L2 clipping norm C of a unit's whole gradient (the run's `clip`).
    pub(crate) clip: f64,
    /// Keys the non-private per-row randomness of this round.
    pub(crate) seed: [u8; 32],
    /// Units per backward pass (memory bound; no effect on the result).
    pub(crate) micro_batch: usize,
}

impl RoundSettings {
    /// Round `round` at sampling rate 0 < q ≤ 1, clipping to a positive finite norm.
    pub fn new(round: u64, rate: f64, clip: f64, seed: [u8; 32], micro_batch: usize) -> Result<Self, DpSgdError> {
        if !(rate > 0.0 && rate <= 1.0 && clip > 0.0 && clip.is_finite()) {
            return Err(DpSgdError::Round { rate, clip });
        }
        Ok(Self { round, rate, clip, seed, micro_batch })
    }
}

/// A round as `GradientSum` (`rhosynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::GradientSum;

    use super::RoundSettings;
    use crate::wire::{WireError, seed};

    impl TryFrom<&GradientSum> for RoundSettings {
        type Error = WireError;

        fn try_from(wire: &GradientSum) -> Result<Self, WireError> {
            let seed = seed(&wire.seed)?;
            RoundSettings::new(wire.round, wire.rate, wire.clip, seed, wire.micro_batch as usize)
                .map_err(|e| WireError::new(e.to_string()))
        }
    }
}

/// A worker's share of one round.
#[derive(Clone, Debug)]
pub struct Contribution {
    pub sum: Vec<f64>,
    /// Sampled units (private: validation only, never released).
    pub units: u64,
}

/// Poisson-samples `examples`' units with rate q from a CSPRNG, then sums their clipped
/// gradients.
pub fn contribute<M: DpModel>(
    model: &M,
    examples: &M::Examples,
    settings: &RoundSettings,
    rng: &mut impl CryptoRng,
    device: &Device,
) -> Result<Contribution, DpSgdError> {
    let sampled: Vec<usize> = (0..examples.unit_count()).filter(|_| rng.random::<f64>() < settings.rate).collect();
    clipped_gradient_sum(model, examples, &sampled, settings, device)
}

/// Sum of the clipped gradients of the given units.
pub fn clipped_gradient_sum<M: DpModel>(
    model: &M,
    examples: &M::Examples,
    units: &[usize],
    settings: &RoundSettings,
    device: &Device,
) -> Result<Contribution, DpSgdError> {
    let mut sum = vec![0f64; model.parameter_count()];
    for chunk in units.chunks(settings.micro_batch.max(1)) {
        let mut tape = GhostTape::default();
        let batch = model.losses(examples, chunk, &settings.seed, device, &mut tape);
        let clipped = clipped_sum(model, tape, batch.losses, &batch.units, chunk.len(), settings.clip)?;
        sum.iter_mut().zip(&clipped.sum).for_each(|(s, c)| *s += f64::from(*c));
    }
    // The worker refuses to return what the coordinator would refuse: a sum beyond the
    // clipping bound means a norm was understated, and no such aggregate may leave.
    validate(&sum, units.len() as u64, model.parameter_count(), settings.clip)
        .map_err(|e| DpSgdError::Model(format!("clipping check failed: {e}")))?;
    Ok(Contribution { sum, units: units.len() as u64 })
}

/// Coordinator-side check of a worker's sum: right length, finite, and ‖sum‖ ≤ units·C
/// (with f32 rounding slack). Anything else is a broken or hostile worker.
pub fn validate(sum: &[f64], units: u64, parameters: usize, clip: f64) -> Result<(), String> {
    if sum.len() != parameters {
        return Err(format!("expected {parameters} gradient coordinates, got {}", sum.len()));
    }
    if sum.iter().any(|v| !v.is_finite()) {
        return Err("the gradient sum is not finite".into());
    }
    let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt();
    let bound = units as f64 * clip * (1.0 + 1e-4);
    if norm > bound {
        return Err(format!("the gradient sum has norm {norm:.6}, above units × C = {bound:.6}"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use rand::SeedableRng;
    use rand::rngs::ChaCha8Rng;
    use rand_distr::{Distribution, StandardNormal};

    use super::*;
    use crate::data::domain::Domain;
    use crate::data::examples::Examples;
    use crate::entropy::os_rng;
    use crate::generators::findiff::encoding::TabularEncoding;
    use crate::generators::findiff::model::DenoiserConfig;
    use crate::generators::findiff::{FinDiffModel, FinDiffModelSpec};
    use ghost::Plain;

    const WIDTH: usize = 5;

    pub(crate) fn model(device: &Device) -> FinDiffModel {
        let spec = FinDiffModelSpec {
            domain: Domain { columns: Vec::new() },
            encoding: TabularEncoding { features: Vec::new(), width: WIDTH },
            denoiser: DenoiserConfig::new(WIDTH, 24, 2, 8),
            diffusion_steps: 50,
            beta_start: 1e-4,
            beta_end: 0.02,
            max_rows_per_unit: 4,
        };
        let mut m = FinDiffModel::new(&spec, device);
        m.set_timestep_exponent(1.0);
        m
    }

    /// `rows_of[u]` rows for unit u, features from a fixed-seed generator (test data).
    pub(crate) fn examples(rows_of: &[usize]) -> Examples {
        let mut rng = ChaCha8Rng::from_seed([11; 32]);
        let mut ex = Examples { x: Vec::new(), width: WIDTH, units: Vec::new() };
        for (u, &n) in rows_of.iter().enumerate() {
            let start = ex.x.len() / WIDTH;
            ex.units.push((format!("unit-{u}"), start..start + n));
            ex.x.extend((0..n * WIDTH).map(|_| 0.7 * Distribution::<f32>::sample(&StandardNormal, &mut rng)));
        }
        ex
    }

    /// One ordinary backward pass per unit.
    fn naive_unit_gradients(model: &FinDiffModel, ex: &Examples, seed: &[u8; 32], device: &Device) -> Vec<Vec<f64>> {
        let tracked = model.tracked();
        (0..ex.units.len())
            .map(|u| {
                let batch = tracked.losses(ex, &[u], seed, device, &mut Plain);
                let grads = batch.losses.sum().backward();
                tracked.flat_gradient(&grads).into_iter().map(f64::from).collect()
            })
            .collect()
    }

    fn norm(v: &[f64]) -> f64 {
        v.iter().map(|x| x * x).sum::<f64>().sqrt()
    }

    fn relative_error(a: &[f64], b: &[f64]) -> f64 {
        let diff: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
        norm(&diff) / norm(b)
    }

    fn settings(clip: f64) -> RoundSettings {
        RoundSettings::new(0, 1.0, clip, [3; 32], 7).unwrap()
    }

    fn check_against_naive(rows_of: &[usize]) {
        let device = compute_device();
        let model = model(&device);
        let ex = examples(rows_of);
        let naive = naive_unit_gradients(&model, &ex, &[3; 32], &device);
        let norms: Vec<f64> = naive.iter().map(|g| norm(g)).collect();
        let mut sorted = norms.clone();
        sorted.sort_by(f64::total_cmp);
        // C at the median: half the units are clipped, half are not.
        let clip = sorted[sorted.len() / 2];
        let mut expected = vec![0.0; model.parameter_count()];
        for (g, n) in naive.iter().zip(&norms) {
            let c = (clip / n).min(1.0);
            expected.iter_mut().zip(g).for_each(|(e, v)| *e += c * v);
        }
        let all: Vec<usize> = (0..ex.units.len()).collect();
        let got = clipped_gradient_sum(&model, &ex, &all, &settings(clip), &device).unwrap();
        let err = relative_error(&got.sum, &expected);
        assert!(err < 1e-5, "ghost clipped sum differs from the per-example loop: relative error {err:e}");

        // The ghost norms themselves, unit by unit.
        let mut tape = GhostTape::default();
        let batch = model.losses(&ex, &all, &[3; 32], &device, &mut tape);
        let ghost = clipped_sum(&model, tape, batch.losses, &batch.units, all.len(), clip).unwrap();
        for (g, n) in ghost.norms.iter().zip(&norms) {
            assert!((g - n).abs() <= 1e-5 * n, "ghost norm {g} vs per-example norm {n}");
        }
    }

    #[test]
    fn ghost_clipping_equals_a_per_example_loop_for_single_row_units() {
        check_against_naive(&[1; 24]);
    }

    #[test]
    fn ghost_clipping_equals_a_per_example_loop_for_multi_row_units() {
        check_against_naive(&[1, 3, 2, 4, 1, 2, 3, 1, 4, 2, 1, 3, 2, 2, 1, 4]);
    }

    #[test]
    fn no_unit_contributes_more_than_the_clipping_norm() {
        let device = compute_device();
        let model = model(&device);
        let ex = examples(&[1, 2, 3, 1, 4, 2, 1, 1]);
        for clip in [1e-3, 0.05, 1.0] {
            for u in 0..ex.units.len() {
                let alone = clipped_gradient_sum(&model, &ex, &[u], &settings(clip), &device).unwrap();
                let n = norm(&alone.sum);
                assert!(n <= clip * (1.0 + 1e-5), "unit {u} contributes norm {n} > C = {clip}");
                validate(&alone.sum, 1, model.parameter_count(), clip).unwrap();
            }
            // Eight units can never sum beyond 8·C.
            let all: Vec<usize> = (0..ex.units.len()).collect();
            let sum = clipped_gradient_sum(&model, &ex, &all, &settings(clip), &device).unwrap();
            assert!(norm(&sum.sum) <= 8.0 * clip * (1.0 + 1e-5));
        }
    }

    #[test]
    fn sums_do_not_depend_on_how_units_are_split_or_batched() {
        let device = compute_device();
        let model = model(&device);
        let rows_of = [1, 2, 1, 3, 1, 1, 2, 4, 1, 2, 1, 1];
        let whole = examples(&rows_of);
        let all: Vec<usize> = (0..whole.units.len()).collect();
        let reference = clipped_gradient_sum(&model, &whole, &all, &settings(0.5), &device).unwrap().sum;
        for workers in [2, 3] {
            let mut total = vec![0.0; reference.len()];
            for w in 0..workers {
                // Worker w holds every `workers`-th unit, in its own Examples.
                let mut part = Examples { x: Vec::new(), width: WIDTH, units: Vec::new() };
                for (_, (id, range)) in whole.units.iter().enumerate().filter(|(u, _)| u % workers == w) {
                    let start = part.x.len() / WIDTH;
                    part.units.push((id.clone(), start..start + range.len()));
                    part.x.extend_from_slice(&whole.x[range.start * WIDTH..range.end * WIDTH]);
                }
                let units: Vec<usize> = (0..part.units.len()).collect();
                let mut s = settings(0.5);
                s.micro_batch = 2 + w;
                let sum = clipped_gradient_sum(&model, &part, &units, &s, &device).unwrap().sum;
                total.iter_mut().zip(&sum).for_each(|(t, v)| *t += v);
            }
            let err = relative_error(&total, &reference);
            assert!(err < 1e-5, "{workers} workers: relative error {err:e}");
        }
    }

    #[test]
    fn poisson_sampling_includes_each_unit_at_the_rate() {
        // q = 0.3 over 2000 units: the count is Binomial(2000, 0.3), sd ≈ 20.5; ±5 sd.
        let device = compute_device();
        let model = model(&device);
        let ex = examples(&[1; 2000]);
        let mut rng = os_rng().unwrap();
        let mut s = settings(1.0);
        s.rate = 0.3;
        s.micro_batch = 2000;
        let c = contribute(&model, &ex, &s, &mut rng, &device).unwrap();
        assert!((c.units as f64 - 600.0).abs() < 5.0 * 20.5, "sampled {} units", c.units);
        s.rate = 0.0;
        assert_eq!(contribute(&model, &ex, &s, &mut rng, &device).unwrap().units, 0);
    }

    #[test]
    fn validation_rejects_sums_beyond_units_times_clip() {
        assert!(validate(&[3.0, 4.0], 5, 2, 1.0).is_ok());
        assert!(validate(&[3.0, 4.0], 4, 2, 1.0).unwrap_err().contains("above"));
        assert!(validate(&[f64::NAN, 0.0], 4, 2, 1.0).is_err());
        assert!(validate(&[0.0], 4, 2, 1.0).is_err());
    }
}
