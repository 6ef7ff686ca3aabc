//! The privacy core: mechanism descriptions with their privacy maps, the RDP and PLD
//! accountants, noise calibration, PATE's GNMax analysis, CSPRNG noise, and the durable
//! per-dataset privacy ledger. Pure library: no networking, no models.

pub mod accountant;
pub mod gnmax;
pub mod ledger;
pub mod math;
pub mod mechanism;
pub mod noise;

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
}
