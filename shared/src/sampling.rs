//! Sampling helpers for public randomness (synthesis from released statistics,
//! simulation). Never used to draw privacy noise.

use rand::{Rng, RngExt};

/// An index drawn with probability proportional to `weights` (which sum to 1).
pub fn pick(weights: &[f64], rng: &mut impl Rng) -> usize {
    let u: f64 = rng.random();
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if u < acc {
            return i;
        }
    }
    weights.len() - 1
}
