//! Privacy accounting: mechanism descriptions with their privacy maps, the RDP and PLD
//! accountants, noise calibration and PATE's GNMax analysis. Pure arithmetic on public
//! parameters: workers may link it. Drawing noise and the ledger live in `rhosynth-privacy`,
//! which only the coordinator depends on.

pub mod accountant;
pub mod gnmax;
pub mod math;
pub mod mechanism;

use serde::{Deserialize, Serialize};

/// A dataset's total privacy budget.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub epsilon: f64,
    pub delta: f64,
}

/// Errors of the privacy core.
#[derive(Debug, thiserror::Error)]
pub enum PrivacyError {
    #[error("invalid privacy parameter: {0}")]
    InvalidParameter(String),
    #[error("unsupported analysis: {0}")]
    Unsupported(String),
    #[error("target cannot be reached: {0}")]
    Unreachable(String),
    #[error("entropy source failed: {0}")]
    Entropy(String),
    #[error("charge {0} already opened the releases it paid for: a charge is spent once")]
    SpentTwice(u64),
}
