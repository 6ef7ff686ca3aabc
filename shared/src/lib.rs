//! rhosynth's shared library: everything the coordinator and the workers have in common.

// Parameter checks are written `!(x > 0.0)` on purpose: NaN must fail them.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

pub mod accounting;
pub mod audit;
pub mod calibration;
pub mod data;
pub mod decoder;
pub mod dpsgd;
pub mod entropy;
pub mod eval;
pub mod generators;
pub mod logging;
pub mod metrics;
pub mod output;
pub mod pgm;
#[cfg(feature = "planted-bugs")]
pub mod planted;
pub mod process;
// `cargo test --workspace` unifies the tests crate's features into every crate it builds:
// an optimised build (what ships) can never carry a planted bug.
#[cfg(all(feature = "planted-bugs", not(debug_assertions)))]
compile_error!("the planted-bugs feature is for debug test builds only");
pub mod sampling;
pub mod schema_draft;
pub mod simulate;
pub mod spec;
pub mod storage;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
#[cfg(feature = "wire")]
pub mod wire;
#[cfg(any(test, feature = "test-support", feature = "cuda"))]
pub mod workloads;
