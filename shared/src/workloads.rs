//! Model workloads of a given shape, for timing a DP step (`benches/dpsgd_step.rs`) and
//! for checking it across devices (`rhosynth-worker --check-gpu`): the DP-FinDiff denoiser
//! over rows as wide as Adult's features, and the sequence transformer over histories of
//! the demo's ICU schema. Uniform: every unit one row (one history of 20 rows). Ragged:
//! units of 1 to 4 rows (histories of 10 to 30 rows), so clipping sums a unit's rows before
//! its norm.
//! Benchmark data: values from a fixed seed, nothing private.

use std::time::{Duration, Instant};

use burn::tensor::Device;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

use crate::data::domain::{Binning, Domain, Encoding};
use crate::data::examples::Examples;
use crate::decoder::DecoderConfig;
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::params::TrainableLayers;
use crate::dpsgd::{Contribution, DpModel, DpSgdError, RoundSettings, clipped_gradient_sum};
use crate::generators::findiff::encoding::TabularEncoding;
use crate::generators::findiff::model::DenoiserConfig;
use crate::generators::findiff::{FinDiffModel, FinDiffModelSpec, FinDiffParams};
use crate::generators::sequence::{self, Histories, Layout, SequenceModel, SequenceModelSpec, WindowSpec};
use crate::spec::JobSpec;

/// Adult's feature width: 6 numeric columns and 9 categorical ones embedded in 2-d.
const ADULT_WIDTH: usize = 24;
/// The round seed of every step: the timesteps and windows drawn are the same on any device.
const SEED: [u8; 32] = [1; 32];

/// A model's shape and its units' examples.
pub enum Workload {
    Denoiser { spec: FinDiffModelSpec, examples: Examples },
    Transformer { spec: SequenceModelSpec, examples: Histories },
}

impl Workload {
    /// The denoiser at `hidden` width over `units` units.
    pub fn denoiser(hidden: usize, units: usize, ragged: bool) -> Self {
        let rows = |u: usize| if ragged { 1 + u % 4 } else { 1 };
        let mut ranges = Vec::with_capacity(units);
        let mut end = 0;
        for u in 0..units {
            ranges.push((format!("u{u}"), end..end + rows(u)));
            end += rows(u);
        }
        let examples = Examples {
            x: (0..end * ADULT_WIDTH).map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0).collect(),
            width: ADULT_WIDTH,
            units: ranges,
        };
        let defaults = FinDiffParams::default();
        let spec = FinDiffModelSpec {
            domain: Domain { columns: Vec::new() },
            encoding: TabularEncoding { features: Vec::new(), width: ADULT_WIDTH },
            denoiser: DenoiserConfig::new(ADULT_WIDTH, hidden, defaults.blocks, defaults.time_embedding),
            diffusion_steps: 500,
            beta_start: 1e-4,
            beta_end: 0.02,
            max_rows_per_unit: if ragged { 4 } else { 1 },
        };
        Self::Denoiser { spec, examples }
    }

    /// The transformer at `width` (4 heads, 2 blocks) over `units` histories, one window each.
    pub fn transformer(width: usize, units: usize, ragged: bool) -> Self {
        let job = JobSpec::parse(include_str!("../../examples/demo.toml"), "demo").expect("the demo spec parses");
        let domain = Domain::from_spec(&job);
        let order = domain.index_of("charttime").expect("the demo's histories are ordered by charttime");
        let Encoding::Numeric { min, max, .. } = domain.columns[order].encoding else {
            unreachable!("charttime is numeric")
        };
        let layout = Layout::new(&domain, Some((order, Binning::gaps(max - min, 16, false))), &[], 8, 50);
        let window = WindowSpec { p_start: 0.2, context_rows: 2, window_rows: 4 };
        let rows = |u: usize| if ragged { 10 + u * 13 % 21 } else { 20 };
        // public randomness: benchmark values, nothing private.
        let mut rng = ChaCha8Rng::from_seed([7; 32]);
        let mut all = Vec::new();
        for u in 0..units {
            for r in 0..rows(u) {
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
        let examples = Histories::from_rows(all, &layout);
        let transformer =
            DecoderConfig::new(layout.vocabulary(), layout.max_tokens(window.rows()), width, 4, 2, 4 * width);
        let lagged = layout.lag_inputs();
        let spec = SequenceModelSpec { domain, layout, transformer, window, lagged };
        Self::Transformer { spec, examples }
    }

    /// Units in a step (all of them).
    pub fn units(&self) -> usize {
        match self {
            Self::Denoiser { examples, .. } => examples.units.len(),
            Self::Transformer { examples, .. } => examples.units.len(),
        }
    }

    /// What a step reads: rows for the denoiser, tokens of the windows for the transformer.
    pub fn items(&self) -> (usize, &'static str) {
        match self {
            Self::Denoiser { examples, .. } => (examples.x.len() / examples.width, "rows"),
            Self::Transformer { spec, examples } => {
                let tokens = examples
                    .units
                    .iter()
                    .map(|unit| sequence::window::window(&spec.layout, &spec.window, unit, &SEED).tokens.len())
                    .sum();
                (tokens, "tokens")
            }
        }
    }

    /// This workload's model on `device`: freshly initialised, or with `parameters` (the
    /// same model as one on another device).
    pub fn model(&self, device: &Device, parameters: Option<&[f32]>) -> Result<Model<'_>, DpSgdError> {
        let mut built = match self {
            Self::Denoiser { spec, examples } => {
                let mut model = FinDiffModel::new(spec, device);
                model.set_timestep_exponent(1.0);
                Built::Denoiser(model, examples)
            }
            Self::Transformer { spec, examples } => Built::Transformer(SequenceModel::new(spec, device), examples),
        };
        if let Some(parameters) = parameters {
            match &mut built {
                Built::Denoiser(m, _) => m.load_parameters(parameters)?,
                Built::Transformer(m, _) => m.load_parameters(parameters)?,
            }
        }
        Ok(Model { built, units: (0..self.units()).collect(), device: device.clone() })
    }
}

/// A workload's model on one device, over every unit of the workload.
pub struct Model<'a> {
    built: Built<'a>,
    units: Vec<usize>,
    device: Device,
}

/// A model with the examples it reads.
enum Built<'a> {
    Denoiser(FinDiffModel, &'a Examples),
    Transformer(SequenceModel, &'a Histories),
}

impl Model<'_> {
    pub fn parameters(&self) -> Vec<f32> {
        match &self.built {
            Built::Denoiser(m, _) => m.parameters(),
            Built::Transformer(m, _) => m.parameters(),
        }
    }

    pub fn parameter_count(&self) -> usize {
        match &self.built {
            Built::Denoiser(m, _) => m.parameter_count(),
            Built::Transformer(m, _) => m.parameter_count(),
        }
    }

    /// A worker's share of one DP step over every unit: per-unit gradients clipped to
    /// `clip` and summed (the coordinator's noise and optimizer step are not in it).
    pub fn clipped_step(&self, clip: f64) -> Result<Contribution, DpSgdError> {
        let settings = RoundSettings::new(0, 1.0, clip, SEED, self.units.len())?;
        match &self.built {
            Built::Denoiser(m, examples) => clipped_gradient_sum(m, *examples, &self.units, &settings, &self.device),
            Built::Transformer(m, examples) => clipped_gradient_sum(m, *examples, &self.units, &settings, &self.device),
        }
    }

    /// A closure running one non-private step over every unit: the ordinary backward pass
    /// of the summed loss, its gradient read back (the baseline a DP step is timed against).
    pub fn plain_step(&self) -> impl FnMut() + '_ {
        let tracked = match &self.built {
            Built::Denoiser(m, examples) => Built::Denoiser(m.tracked(), examples),
            Built::Transformer(m, examples) => Built::Transformer(m.tracked(), examples),
        };
        move || match &tracked {
            Built::Denoiser(m, examples) => plain(m, *examples, &self.units, &self.device),
            Built::Transformer(m, examples) => plain(m, *examples, &self.units, &self.device),
        }
    }
}

fn plain<M: DpModel>(model: &M, examples: &M::Examples, units: &[usize], device: &Device) {
    let batch = model.losses(examples, units, &SEED, device, &mut Plain);
    let grads = batch.losses.sum().backward();
    std::hint::black_box(model.flat_gradient(&grads));
}

/// How far `got` lies from `expected`, relative to `expected`'s L2 norm: a GPU's sum
/// against the CPU's. NaN where either holds one (never within a tolerance).
pub fn relative_distance(expected: &[f64], got: &[f64]) -> f64 {
    assert_eq!(expected.len(), got.len(), "two sums of one model");
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut expected.iter().zip(got).map(|(e, g)| e - g)) / norm(&mut expected.iter().copied())
}

fn time(f: &mut impl FnMut()) -> Duration {
    let start = Instant::now();
    f();
    start.elapsed()
}

/// Medians of `reps` alternating runs of `a` and `b`, after `warm_up` runs of each (the
/// backend's allocator grows, and a GPU compiles its kernels, during the first steps), so
/// both see the same machine state.
pub fn paired_medians(warm_up: usize, reps: usize, mut a: impl FnMut(), mut b: impl FnMut()) -> (Duration, Duration) {
    for _ in 0..warm_up {
        a();
        b();
    }
    let (ta, tb): (Vec<Duration>, Vec<Duration>) = (0..reps).map(|_| (time(&mut a), time(&mut b))).unzip();
    (median(ta), median(tb))
}

/// The median of `reps` runs of `f` after `warm_up` runs.
pub fn median_time(warm_up: usize, reps: usize, mut f: impl FnMut()) -> Duration {
    (0..warm_up).for_each(|_| f());
    median((0..reps).map(|_| time(&mut f)).collect())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dpsgd::cpu_device;

    /// The device check compares two devices through a model given another's parameters:
    /// on one device, that copy takes the very same clipped step, ragged units included.
    #[test]
    fn a_model_given_anothers_parameters_takes_the_same_step() {
        let device = cpu_device();
        for workload in [Workload::denoiser(32, 12, true), Workload::transformer(16, 6, true)] {
            let first = workload.model(&device, None).unwrap();
            let copy = workload.model(&device, Some(&first.parameters())).unwrap();
            let fresh = workload.model(&device, None).unwrap();
            let step = first.clipped_step(1.0).unwrap();
            assert_eq!(step.sum, copy.clipped_step(1.0).unwrap().sum);
            assert_ne!(step.sum, fresh.clipped_step(1.0).unwrap().sum, "a fresh model is initialised anew");
            assert_eq!(step.units, workload.units() as u64);
        }
    }

    #[test]
    fn the_relative_distance_is_the_differences_norm_over_the_expected_norm() {
        assert_eq!(relative_distance(&[3.0, 4.0], &[3.0, 4.0]), 0.0);
        assert!((relative_distance(&[3.0, 4.0], &[3.0, 4.5]) - 0.1).abs() < 1e-15);
        assert!(relative_distance(&[3.0, 4.0], &[f64::NAN, 4.0]).is_nan());
    }

    /// Ragged units hold different numbers of rows (and histories different lengths).
    #[test]
    fn ragged_units_differ_in_size() {
        let Workload::Denoiser { examples, .. } = Workload::denoiser(8, 8, true) else { unreachable!() };
        let rows: Vec<usize> = examples.units.iter().map(|(_, r)| r.len()).collect();
        assert_eq!(rows, [1, 2, 3, 4, 1, 2, 3, 4]);
        let Workload::Transformer { examples, .. } = Workload::transformer(8, 3, true) else { unreachable!() };
        let Workload::Transformer { examples: uniform, .. } = Workload::transformer(8, 3, false) else {
            unreachable!()
        };
        assert_ne!(examples.units[1].len(), examples.units[2].len());
        assert_eq!(uniform.units[1].len(), uniform.units[2].len());
    }
}
