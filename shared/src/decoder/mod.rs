//! Decoder-only transformers: one model for the sequence generator (GPT block, trained
//! from scratch on history tokens) and for pretrained language models (GPT-2 and the Llama
//! family, loaded from a checkpoint and fine-tuned, fully or through LoRA adapters).
//!
//! - `model`: the decoder and its configuration; which layers are trainable.
//! - `attention`: causal self-attention, grouped-query heads, rotary positions.
//! - `cache`: decoding a token at a time with a key/value cache.
//! - `loss`: next-token log-loss, masked and weighted per position.
//! - `lora`: low-rank adapters, ordinary linears to the engine.
//! - `checkpoint`: pretrained weights (Hugging Face safetensors, GGUF via `gguf`).
//! - `tokenizer`: text ⇄ ids for pretrained models.

pub mod attention;
pub mod cache;
pub mod checkpoint;
pub mod gguf;
pub mod lora;
pub mod loss;
pub mod model;
pub mod tokenizer;

#[cfg(test)]
mod tests;

pub use cache::KvCache;
pub use checkpoint::{Checkpoint, CheckpointError};
pub use lora::LoraConfig;
pub use loss::next_token_losses;
pub use model::{Decoder, DecoderConfig, Family, TokenBatch};
