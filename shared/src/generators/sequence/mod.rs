//! A sequence generator after PATH: whole unit histories as token sequences, a
//! decoder-only transformer trained with user-level DP-SGD on the distributed engine.
//!
//! - Tokens (`tokens`): a vocabulary from the declared schema only; numeric values as a
//!   public bin and a refinement token; the order column as gaps; a grammar that names
//!   the valid next tokens everywhere, so training and sampling stay inside it and every
//!   accepted sequence parses.
//! - Training examples (`window`): one dynamic window per sampled unit and round, so a
//!   unit's sensitivity is one clipped gradient whatever its history's length, cut from
//!   the worker's histories held as tokens (`histories`).
//! - Model (`model`): the engine's decoder (`crate::decoder`, GPT block); every parameter (embeddings and norms included)
//!   is clipped per unit by the engine's ghost tape.
//! - Stage 1 (`pretrain`): the model trained without noise on a public reference set or a
//!   charged release (such as a history copula job's) before DP-SGD.
//! - The ceiling (`ceiling`): the same model trained without privacy, a benchmark only.
//! - Sampling (`sampler`): constrained decoding of whole histories, a key/value cache per
//!   history; optionally a private selection among over-generated ones (`selection`).

pub mod ceiling;
pub mod histories;
pub mod model;
pub mod params;
pub mod plan;
pub mod pretrain;
pub mod sampler;
pub mod selection;
pub mod task;
pub mod tokens;
pub mod window;

pub use histories::Histories;
pub use model::SequenceModel;
pub use params::SequenceParams;
pub use plan::{SequencePlan, check};
pub use sampler::SequenceSampler;
pub use task::SequenceModelSpec;
pub use tokens::Layout;
pub use window::WindowSpec;

#[cfg(test)]
mod tests;
