//! Rows drawn from the trained model by constrained decoding: each row's tokens follow
//! the schema's grammar (a prefix's tokens are fed as they are, a value's drawn among the
//! tokens its column's labels allow), so every row parses. Post-processing only.

use rand::rngs::ChaCha20Rng;

use crate::data::domain::Domain;
use crate::decoder::{Decoder, KvCache};
use crate::generators::Sampler;
use crate::generators::row_text::{RowCursor, RowText};
use crate::generators::sequence::sampler::draw_allowed;
use crate::output::SyntheticUnits;

/// The trained decoder and how rows read.
pub struct TextSampler {
    pub decoder: Decoder,
    pub text: RowText,
    pub domain: Domain,
    /// Softmax temperature of each drawn token.
    pub temperature: f64,
}

/// Rows decoded together (memory bound).
const BATCH: usize = 256;

impl TextSampler {
    /// `count` rows of bins.
    pub fn draw_bins(&self, count: usize, rng: &mut ChaCha20Rng) -> Vec<Vec<usize>> {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let n = (count - out.len()).min(BATCH);
            out.extend(self.decode_batch(n, rng));
        }
        out
    }

    fn decode_batch(&self, count: usize, rng: &mut ChaCha20Rng) -> Vec<Vec<usize>> {
        let vocabulary = self.decoder.vocabulary();
        let mut cursors: Vec<RowCursor<'_>> = (0..count).map(|_| self.text.cursor()).collect();
        let mut caches = vec![KvCache::default(); count];
        // Every row starts with its first prefix's first token.
        let first = cursors[0].forced().expect("a row starts with a prefix");
        let mut next: Vec<u32> = vec![first; count];
        cursors.iter_mut().for_each(|c| c.advance(first).expect("the forced token"));
        let mut live: Vec<usize> = (0..count).collect();
        while !live.is_empty() {
            let inputs: Vec<u32> = live.iter().map(|&i| next[i]).collect();
            let mut batch: Vec<KvCache> = live.iter().map(|&i| std::mem::take(&mut caches[i])).collect();
            let logits = self.decoder.step(&inputs, &mut batch);
            for ((s, &i), cache) in live.iter().enumerate().zip(batch) {
                caches[i] = cache;
                let cursor = &mut cursors[i];
                let token = match cursor.forced() {
                    Some(t) => t,
                    None => {
                        let allowed: Vec<std::ops::Range<u32>> =
                            cursor.allowed().into_iter().map(|t| t..t + 1).collect();
                        draw_allowed(&logits[s * vocabulary..(s + 1) * vocabulary], &allowed, self.temperature, rng)
                    }
                };
                cursor.advance(token).expect("an allowed token");
                next[i] = token;
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
            .map(|bins| bins.iter().zip(&self.domain.columns).map(|(&b, column)| column.draw(b, rng)).collect())
            .collect();
        SyntheticUnits::one_row_each(values)
    }
}
