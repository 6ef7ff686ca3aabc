//! dpsynth's shared library: everything the coordinator and the workers have in common.

// Parameter checks are written `!(x > 0.0)` on purpose: NaN must fail them.
#![allow(clippy::neg_cmp_op_on_partial_ord)]

pub mod accounting;
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
pub mod sampling;
pub mod schema_draft;
pub mod simulate;
pub mod spec;
pub mod storage;
#[cfg(feature = "wire")]
pub mod wire;
