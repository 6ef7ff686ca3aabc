//! What every generator's sampler is to the job's lifecycle.

use rand::rngs::ChaCha20Rng;

use crate::output::SyntheticUnits;

/// Draws synthetic units from what a generator fitted to its released values: a row each
/// (`rows_per_draw` 1) or a whole history each. Sampling is post-processing: it costs no
/// budget, so its randomness need not be private (the lifecycle passes an OS-keyed
/// generator all the same).
pub trait Sampler: Send {
    /// Most rows one drawn unit has.
    fn rows_per_draw(&self) -> usize {
        1
    }

    fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits;
}
