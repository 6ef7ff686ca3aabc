//! DP-2Stage (Afonja et al. 2024) on the engine: a pretrained language model fine-tuned on
//! rows as text (`row_text`) in two stages.
//!
//! - Stage 1 (`pretrain`): without privacy, on pseudo rows drawn uniformly from the
//!   *declared* domain — the model learns the rows' format and nothing of the data (the
//!   seed drew bounds from the private rows, an unaccounted leak).
//! - Stage 2 (`model`): DP-SGD on the private rows through the engine, each unit's rows
//!   one clipped gradient, value tokens' loss weighted λ and the format's 1 − λ.
//! - Sampling (`sampler`): constrained decoding over the schema's grammar, so every row
//!   parses (no rejection).
//!
//! The checkpoint is public: the coordinator and the workers each read it from its URL
//! (`task`), and stage 1 runs on the coordinator before anything is charged (`plan`).

pub mod model;
pub mod params;
pub mod plan;
pub mod pretrain;
pub mod prompting;
pub mod row_text;
pub mod sampler;
pub mod task;

pub use model::{TextModel, TextModelSpec, TextRows};
pub use params::{LanguageModelParams, LoraParams};
pub use plan::{Dp2StagePlan, check};
pub use prompting::Prompting;
pub use sampler::TextSampler;
pub use task::Dp2StageModelSpec;

#[cfg(test)]
pub(crate) mod tests;
