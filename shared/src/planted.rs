//! Bugs planted on purpose, to show that `rhosynth audit` catches them: compiled only with
//! the `planted-bugs` feature, which only the tests crate's dev-dependencies enable (so
//! `cargo test --workspace` compiles it into that run's debug binaries too, where nothing
//! calls it; an optimised build refuses the feature), and set only by a call from a test.
//! Process-wide: a test that plants one runs in a test binary of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static NOISE_DIVISOR: AtomicU64 = AtomicU64::new(0x3ff0_0000_0000_0000); // 1.0
static UNITS_UNBOUNDED: AtomicBool = AtomicBool::new(false);

/// A bug to plant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bug {
    /// Every release's Gaussian noise divided by this (the charge unchanged).
    NoiseDividedBy(f64),
    /// A unit's rows are not capped at `max_rows_per_unit`: its contribution is unclipped.
    UnboundedUnits,
}

/// Plants `bug` for the rest of the process.
pub fn plant(bug: Bug) {
    tracing::warn!(?bug, "planted bug: this process's releases are NOT differentially private");
    match bug {
        Bug::NoiseDividedBy(by) => NOISE_DIVISOR.store(by.to_bits(), Ordering::SeqCst),
        Bug::UnboundedUnits => UNITS_UNBOUNDED.store(true, Ordering::SeqCst),
    }
}

pub fn noise_divisor() -> f64 {
    f64::from_bits(NOISE_DIVISOR.load(Ordering::SeqCst))
}

pub fn units_unbounded() -> bool {
    UNITS_UNBOUNDED.load(Ordering::SeqCst)
}
