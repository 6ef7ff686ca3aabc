//! Histories drawn from the trained transformer, token by token, with constrained
//! decoding: at every step only the tokens the grammar allows there can be drawn, so every
//! history parses and ends with EOH within the length bucket it drew first. A history longer than one
//! window continues in a new window that begins, like the training windows, with MID, its
//! offset in the history, the statics and the last `context_rows` rows. Each history keeps its own cache of keys and
//! values, so a token costs one position's pass, not the window's. Post-processing only.

use rand::rngs::ChaCha20Rng;
use rand::{Rng, RngExt};

use super::task::SequenceModelSpec;
use super::tokens::{BOS, Cursor, Start};
use crate::decoder::{Decoder, KvCache};
use crate::generators::Sampler;
use crate::output::{SyntheticUnits, SyntheticValue};

/// One history being drawn.
struct Draw<'a> {
    /// The current window's tokens, how many of them the model has been fed (its cache
    /// holds their keys and values) and the grammar walked over them.
    tokens: Vec<u32>,
    /// Each token's lag-1 inputs (`Cursor::lagged` after it).
    lagged: Vec<[u32; 2]>,
    fed: usize,
    cache: KvCache,
    cursor: Cursor<'a>,
    /// Rows of the history so far (values in domain order).
    rows: Vec<Vec<Option<f64>>>,
    /// History index of the window's first row.
    window_first: usize,
    /// What to add to the window's order values to continue the history's clock (a
    /// window's first row carries its time in the coarser absolute bins).
    shift: f64,
    /// The length drawn from the released histogram, if one was given.
    length: Option<usize>,
    done: bool,
}

/// The trained transformer as a sampler of whole histories.
pub struct SequenceSampler {
    pub transformer: Decoder,
    pub spec: SequenceModelSpec,
    /// Softmax temperature of every draw (below 1: nearer the model's modes).
    pub temperature: f64,
    /// A released histogram of history lengths (weights of 1..=max_rows rows, negative
    /// ones read as 0): each history's length is drawn from it, and the model draws rows
    /// until it is reached; `None`: the model draws lengths too.
    pub lengths: Option<Vec<f64>>,
}

impl Sampler for SequenceSampler {
    fn rows_per_draw(&self) -> usize {
        self.spec.layout.max_rows
    }

    fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let mut out = SyntheticUnits::default();
        for history in self.histories(units, rng) {
            out.push(synthetic_rows(&self.spec, &history));
        }
        out
    }
}

/// Histories already drawn (and privately selected), written in order.
pub struct SelectedHistories {
    pub spec: SequenceModelSpec,
    pub histories: std::vec::IntoIter<Vec<Vec<Option<f64>>>>,
}

impl Sampler for SelectedHistories {
    fn rows_per_draw(&self) -> usize {
        self.spec.layout.max_rows
    }

    fn sample(&mut self, units: usize, _: &mut ChaCha20Rng) -> SyntheticUnits {
        let mut out = SyntheticUnits::default();
        for history in self.histories.by_ref().take(units) {
            out.push(synthetic_rows(&self.spec, &history));
        }
        out
    }
}

/// A history's rows as output values.
fn synthetic_rows<'a>(
    spec: &'a SequenceModelSpec,
    rows: &'a [Vec<Option<f64>>],
) -> impl Iterator<Item = Vec<SyntheticValue>> + 'a {
    rows.iter().map(|row| row.iter().zip(&spec.domain.columns).map(|(v, c)| c.synthetic(*v)).collect())
}

impl SequenceSampler {
    /// Draws `count` histories of at most `spec.layout.max_rows` rows, a batch at a time.
    pub fn histories(&self, count: usize, rng: &mut impl Rng) -> Vec<Vec<Vec<Option<f64>>>> {
        /// Histories decoded together (their caches bound the memory).
        const BATCH: usize = 256;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let n = (count - out.len()).min(BATCH);
            out.extend(self.decode_batch(n, rng));
        }
        out
    }

    /// Draws `count` histories together, a token of each per step.
    fn decode_batch(&self, count: usize, rng: &mut impl Rng) -> Vec<Vec<Vec<Option<f64>>>> {
        let (model, spec) = (&self.transformer, &self.spec);
        let layout = &spec.layout;
        let positions = model.context();
        let vocabulary = layout.vocabulary();
        let order = layout.order_column();
        let mut start = |_| {
            let mut cursor = Cursor::new(layout, 0);
            cursor.advance(BOS).expect("a history starts with BOS");
            let (mut tokens, mut lagged) = (vec![BOS], vec![cursor.lagged()]);
            let length = self.lengths.as_deref().map(|weights| {
                let rows = draw_weighted(&weights[..weights.len().min(layout.max_rows)], rng) + 1;
                let token = layout.length_token(rows);
                cursor.advance(token).expect("a length token of at most max_rows rows");
                cursor.hold_length(rows);
                tokens.push(token);
                lagged.push(cursor.lagged());
                rows
            });
            let cache = KvCache::default();
            Draw {
                tokens,
                lagged,
                fed: 0,
                cache,
                cursor,
                rows: Vec::new(),
                window_first: 0,
                shift: 0.0,
                length,
                done: false,
            }
        };
        let mut draws: Vec<Draw> = (0..count).map(&mut start).collect();
        loop {
            let live: Vec<usize> = (0..count).filter(|&i| !draws[i].done).collect();
            if live.is_empty() {
                break;
            }
            let inputs: Vec<u32> = live.iter().map(|&i| draws[i].tokens[draws[i].fed]).collect();
            let lagged: [Vec<u32>; 2] =
                [0, 1].map(|k| live.iter().map(|&i| draws[i].lagged[draws[i].fed][k]).collect());
            let mut caches: Vec<KvCache> = live.iter().map(|&i| std::mem::take(&mut draws[i].cache)).collect();
            // A model trained before lag-1 inputs existed has no tables for them.
            let logits = model.step(&inputs, &[&lagged[0][..], &lagged[1][..]][..model.lagged.len()], &mut caches);
            for ((s, &i), cache) in live.iter().enumerate().zip(caches) {
                let d = &mut draws[i];
                d.cache = cache;
                d.fed += 1;
                if d.fed < d.tokens.len() {
                    // Still feeding a new window's tokens.
                    continue;
                }
                let cursor = &mut d.cursor;
                let logits = &logits[s * vocabulary..(s + 1) * vocabulary];
                let token = draw_allowed(logits, &cursor.allowed(), self.temperature, rng);
                cursor.advance(token).expect("an allowed token");
                d.tokens.push(token);
                d.lagged.push(cursor.lagged());
                if cursor.is_done() || cursor.at_boundary() {
                    // A row is complete (or the history): bring the history up to date.
                    let known = d.rows.len() - d.window_first;
                    for row in cursor.rows.iter().skip(known) {
                        let mut row = row.clone();
                        if let Some(o) = order {
                            row[o] = row[o].map(|v| v + d.shift);
                        }
                        d.rows.push(row);
                    }
                }
                if cursor.is_done() {
                    d.done = true;
                } else if cursor.at_boundary()
                    && d.rows.len() < cursor.history_lengths().1
                    && d.tokens.len() + layout.max_row_tokens() > positions
                {
                    // The next row may not fit: continue in a new window, of the same length.
                    let length = cursor.history_lengths().1;
                    d.window_first = d.rows.len().saturating_sub(spec.window.context_rows);
                    let start = Start::Window { rows_before: d.window_first };
                    d.tokens = layout.encode(start, length, &d.rows[0], &d.rows[d.window_first..], false);
                    let mut replay = Cursor::new(layout, d.window_first);
                    d.lagged.clear();
                    for &t in &d.tokens {
                        replay.advance(t).expect("a re-encoded window follows the grammar");
                        d.lagged.push(replay.lagged());
                    }
                    // The window's clock continues the history's last known time.
                    let last = order.and_then(|o| d.rows.iter().rev().find_map(|r| r[o]));
                    d.shift = last.map_or(0.0, |t| t - replay.clock());
                    if let Some(rows) = d.length {
                        replay.hold_length(rows);
                    }
                    d.cursor = replay;
                    (d.fed, d.cache) = (0, KvCache::default());
                }
            }
        }
        draws.into_iter().map(|d| d.rows).collect()
    }
}

/// An index drawn with probability proportional to its weight (negative weights read as
/// 0; all zero: uniform).
fn draw_weighted(weights: &[f64], rng: &mut impl Rng) -> usize {
    let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    if !(total > 0.0) {
        return rng.random_range(0..weights.len().max(1));
    }
    let mut u = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        u -= w.max(0.0);
        if u < 0.0 {
            return i;
        }
    }
    weights.len() - 1
}

/// A token drawn from the softmax of `logits` restricted to `allowed`.
pub(crate) fn draw_allowed(
    logits: &[f32],
    allowed: &[std::ops::Range<u32>],
    temperature: f64,
    rng: &mut impl Rng,
) -> u32 {
    let ids = || allowed.iter().flat_map(|r| r.clone());
    let max = ids().map(|t| logits[t as usize]).fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = ids().map(|t| (f64::from(logits[t as usize] - max) / temperature).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut u = rng.random::<f64>() * total;
    for (t, w) in ids().zip(&weights) {
        if u < *w {
            return t;
        }
        u -= w;
    }
    ids().last().expect("the grammar always allows a token")
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// Draws follow the softmax of logits / T over the allowed tokens only: with logits
    /// (0, ln 3) the second token has probability 3/4 at T = 1 and 9/10 at T = ½ (4,000
    /// draws: standard deviation below 0.007, tolerance 0.035).
    #[test]
    fn draws_follow_the_tempered_softmax_of_the_allowed_tokens() {
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(11);
        let logits = [0.0, 3f32.ln(), 50.0];
        let allowed: Vec<std::ops::Range<u32>> = std::iter::once(0..2).collect();
        for (temperature, want) in [(1.0, 0.75), (0.5, 0.9)] {
            let second = (0..4000).filter(|_| draw_allowed(&logits, &allowed, temperature, &mut rng) == 1).count();
            let share = second as f64 / 4000.0;
            assert!((share - want).abs() < 0.035, "T = {temperature}: {share}");
        }
    }
}
