//! Rows drawn from the trained model by constrained decoding: each row's tokens follow
//! the schema's grammar (a prefix's tokens are fed as they are, a value's drawn among the
//! tokens its column's labels allow), so every row parses. HARMONIC's rows are written
//! after a prompt of public reference rows. Post-processing only.

use rand::rngs::ChaCha20Rng;

use super::row_text::RowCursor;
use crate::decoder::{Decoder, KvCache};
use crate::generators::Sampler;

use super::model::TextModelSpec;
use crate::generators::sequence::sampler::draw_allowed;
use crate::output::SyntheticUnits;

/// The trained decoder and how rows read.
pub struct TextSampler {
    pub decoder: Decoder,
    pub spec: TextModelSpec,
    /// Softmax temperature of each drawn token.
    pub temperature: f64,
}

/// Rows decoded together (memory bound).
const BATCH: usize = 256;

impl TextSampler {
    /// `count` rows of bins, with progress (a token at a time is slow on a CPU).
    pub fn draw_bins(&self, count: usize, rng: &mut ChaCha20Rng) -> Vec<Vec<usize>> {
        let mut out = Vec::with_capacity(count);
        let started = std::time::Instant::now();
        while out.len() < count {
            let n = (count - out.len()).min(BATCH);
            out.extend(self.decode_batch(n, rng));
            let eta = started.elapsed().as_secs_f64() * (count - out.len()) as f64 / out.len() as f64;
            tracing::info!(rows = out.len(), of = count, eta_s = eta.round(), "rows decoded");
        }
        out
    }

    fn decode_batch(&self, count: usize, rng: &mut ChaCha20Rng) -> Vec<Vec<usize>> {
        let vocabulary = self.decoder.vocabulary();
        let mut cursors: Vec<RowCursor<'_>> = (0..count).map(|_| self.spec.text.cursor()).collect();
        let mut caches = vec![KvCache::default(); count];
        // Each row's prompt, reversed: fed as it is before the row's own tokens.
        let mut pending: Vec<Vec<u32>> = (0..count)
            .map(|_| {
                let mut prompt = self.spec.sampling_prompt(rng);
                prompt.reverse();
                prompt
            })
            .collect();
        // The first token: the prompt's, or the row's first prefix's (forced).
        let mut next: Vec<u32> = (0..count)
            .map(|i| match pending[i].pop() {
                Some(t) => t,
                None => {
                    let first = cursors[i].forced().expect("a row starts with a prefix");
                    cursors[i].advance(first).expect("the forced token");
                    first
                }
            })
            .collect();
        let mut live: Vec<usize> = (0..count).collect();
        while !live.is_empty() {
            let inputs: Vec<u32> = live.iter().map(|&i| next[i]).collect();
            let mut batch: Vec<KvCache> = live.iter().map(|&i| std::mem::take(&mut caches[i])).collect();
            let logits = self.decoder.step(&inputs, &[], &mut batch);
            for ((s, &i), cache) in live.iter().enumerate().zip(batch) {
                caches[i] = cache;
                next[i] = match pending[i].pop() {
                    Some(t) => t,
                    None => {
                        let cursor = &mut cursors[i];
                        let token = match cursor.forced() {
                            Some(t) => t,
                            None => {
                                let allowed: Vec<std::ops::Range<u32>> =
                                    cursor.allowed().into_iter().map(|t| t..t + 1).collect();
                                let row_logits = &logits[s * vocabulary..(s + 1) * vocabulary];
                                draw_allowed(row_logits, &allowed, self.temperature, rng)
                            }
                        };
                        cursor.advance(token).expect("an allowed token");
                        token
                    }
                };
            }
            live.retain(|&i| cursors[i].row().is_none());
        }
        cursors.iter().map(|c| c.row().expect("a finished row")).collect()
    }
}

impl Sampler for TextSampler {
    fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let rows = self.draw_bins(units, rng);
        let values = rows
            .iter()
            .map(|bins| bins.iter().zip(&self.spec.domain.columns).map(|(&b, column)| column.draw(b, rng)).collect())
            .collect();
        SyntheticUnits::one_row_each(values)
    }
}
