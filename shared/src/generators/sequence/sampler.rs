//! Histories drawn from the trained transformer, token by token, with constrained
//! decoding: at every step only the tokens the grammar allows there can be drawn, so every
//! history parses and ends with EOH within the public row cap. A history longer than one
//! window continues in a new window that begins, like the training windows, with MID, the
//! statics and the last `context_rows` rows. Post-processing only.

use rand::{Rng, RngExt};

use super::model::{TokenBatch, Transformer};
use super::task::SequenceModelSpec;
use super::tokens::{BOS, Cursor, EOH, MID};
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::params::values;

/// One history being drawn.
struct Draw<'a> {
    /// The current window's tokens, and the grammar walked over them.
    tokens: Vec<u32>,
    cursor: Cursor<'a>,
    /// Rows of the history so far (values in domain order).
    rows: Vec<Vec<Option<f64>>>,
    /// History index of the window's first row.
    window_first: usize,
    /// What to add to the window's order values to continue the history's clock (a
    /// window's first row carries its time in the coarser absolute bins).
    shift: f64,
    done: bool,
}

/// Draws `count` histories of at most `spec.layout.max_rows` rows.
pub fn sample_histories(
    model: &Transformer,
    spec: &SequenceModelSpec,
    count: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<Vec<Option<f64>>>> {
    let layout = &spec.layout;
    let positions = model.positions();
    let vocabulary = layout.vocabulary();
    let order = layout.order_column();
    let start = |_| {
        let mut cursor = Cursor::new(layout, layout.max_rows);
        cursor.advance(BOS).expect("a history starts with BOS");
        Draw { tokens: vec![BOS], cursor, rows: Vec::new(), window_first: 0, shift: 0.0, done: false }
    };
    let mut draws: Vec<Draw> = (0..count).map(start).collect();
    while draws.iter().any(|d| !d.done) {
        let live: Vec<usize> = (0..count).filter(|&i| !draws[i].done).collect();
        let length = live.iter().map(|&i| draws[i].tokens.len()).max().unwrap_or(1);
        let mut tokens = vec![EOH; live.len() * length];
        for (s, &i) in live.iter().enumerate() {
            tokens[s * length..s * length + draws[i].tokens.len()].copy_from_slice(&draws[i].tokens);
        }
        let logits = values(
            model.forward(&TokenBatch { tokens: &tokens, sequences: live.len(), length }, &mut Plain).into_data(),
        );
        for (s, &i) in live.iter().enumerate() {
            let d = &mut draws[i];
            let cursor = &mut d.cursor;
            let at = s * length + d.tokens.len() - 1;
            let row = &logits[at * vocabulary..(at + 1) * vocabulary];
            let token = draw_allowed(row, &cursor.allowed(), rng);
            cursor.advance(token).expect("an allowed token");
            d.tokens.push(token);
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
                && d.rows.len() < layout.max_rows
                && d.tokens.len() + layout.max_row_tokens() > positions
            {
                // The next row may not fit: continue in a new window.
                d.window_first = d.rows.len().saturating_sub(spec.window.context_rows);
                d.tokens = layout.encode(MID, &d.rows[0], &d.rows[d.window_first..], false);
                let mut replay = Cursor::new(layout, layout.max_rows - d.window_first);
                for &t in &d.tokens {
                    replay.advance(t).expect("a re-encoded window follows the grammar");
                }
                // The window's clock continues the history's last known time.
                let last = order.and_then(|o| d.rows.iter().rev().find_map(|r| r[o]));
                d.shift = last.map_or(0.0, |t| t - replay.clock());
                d.cursor = replay;
            }
        }
    }
    draws.into_iter().map(|d| d.rows).collect()
}

/// A token drawn from the softmax of `logits` restricted to `allowed`.
fn draw_allowed(logits: &[f32], allowed: &[std::ops::Range<u32>], rng: &mut impl Rng) -> u32 {
    let ids = || allowed.iter().flat_map(|r| r.clone());
    let max = ids().map(|t| logits[t as usize]).fold(f32::NEG_INFINITY, f32::max);
    let weights: Vec<f64> = ids().map(|t| f64::from(logits[t as usize] - max).exp()).collect();
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
