//! Text ⇄ token ids for a pretrained model, through the `tokenizers` crate: from the
//! checkpoint's `tokenizer.json`, or built from a GGUF file's metadata (byte-level BPE:
//! its vocabulary, merges and pre-tokenizer name).

use tokenizers::Tokenizer;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;

use super::checkpoint::CheckpointError;
use super::gguf::{Gguf, Value};

/// A model's tokenizer and its end-of-text token.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Ends a sampled text; `None` when the checkpoint names none.
    pub eos: Option<u32>,
}

fn error(message: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Format(format!("tokenizer: {message}"))
}

impl TextTokenizer {
    /// From `tokenizer.json`; `eos` as the model's configuration names it.
    pub fn from_json(json: &[u8], eos: Option<u32>) -> Result<Self, CheckpointError> {
        Ok(Self { inner: Tokenizer::from_bytes(json).map_err(error)?, eos })
    }

    /// From a GGUF file's `tokenizer.ggml.*` metadata (model `gpt2`: byte-level BPE).
    pub fn from_gguf(file: &Gguf) -> Result<Self, CheckpointError> {
        let model = file.require("tokenizer.ggml.model")?.as_str().unwrap_or_default();
        if model != "gpt2" {
            return Err(error(format!("GGUF tokenizer model {model:?} (byte-level BPE, \"gpt2\", is supported)")));
        }
        let strings = |key: &str| -> Result<Vec<String>, CheckpointError> {
            let values = file.require(key)?.as_array().ok_or_else(|| error(format!("{key} is not an array")))?;
            values
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(|| error(format!("{key} holds a non-string"))))
                .collect()
        };
        let vocab: Vocab = strings("tokenizer.ggml.tokens")?.into_iter().zip(0u32..).collect();
        let merges: Merges = strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| error(format!("merge {m:?}")))
            })
            .collect::<Result<_, _>>()?;
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(error)?;
        let byte_level = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true));
        let pre = match file.get("tokenizer.ggml.pre").and_then(Value::as_str).unwrap_or("default") {
            "default" | "gpt-2" => byte_level,
            "smollm" => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                byte_level,
            ])),
            other => {
                return Err(error(format!("GGUF pre-tokenizer {other:?} (default, gpt-2 and smollm are supported)")));
            }
        };
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre)).with_decoder(Some(ByteLevelDecoder::default()));
        let eos = file.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64).map(|v| v as u32);
        Ok(Self { inner, eos })
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>, CheckpointError> {
        Ok(self.inner.encode(text, false).map_err(error)?.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, CheckpointError> {
        self.inner.decode(ids, false).map_err(error)
    }

    pub fn vocabulary(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
