//! DP-2Stage (Afonja et al. 2024) on the engine: a pretrained language model fine-tuned on
//! rows as text (`super::row_text`) in two stages.
//!
//! - Stage 1 (`pretrain`): without privacy, on pseudo rows drawn uniformly from the
//!   *declared* domain — the model learns the rows' format and nothing of the data (the
//!   seed drew bounds from the private rows, an unaccounted leak).
//! - Stage 2 (`model`): DP-SGD on the private rows through the engine, each unit's rows
//!   one clipped gradient, value tokens' loss weighted λ and the format's 1 − λ.
//! - Sampling (`sampler`): constrained decoding over the schema's grammar, so every row
//!   parses (no rejection).
//!
//! The job lifecycle's side (spec section, plan, worker task, coordinator rounds) comes
//! next; these parts are tested on their own.

pub mod model;
pub mod pretrain;
pub mod sampler;

#[cfg(test)]
mod tests;
