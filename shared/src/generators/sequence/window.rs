//! PATH's dynamic window: the one training example a sampled unit contributes in a round.
//!
//! A split row k is 0 with probability `p_start`, else uniform over the unit's other rows;
//! the example is up to `context_rows` rows before k (no loss) and up to `window_rows` rows
//! from k (loss), with EOH when the window reaches the history's end. Whatever the
//! history's length, the unit is one sequence, so its sensitivity is one clipped gradient.
//! The split is non-private randomness keyed by the round seed and the unit's id.

use rand::RngExt;
use serde::{Deserialize, Serialize};

use super::histories::History;
use super::tokens::{Cursor, Layout, Start};
use crate::dpsgd::keyed_rng;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowSpec {
    pub p_start: f64,
    pub context_rows: usize,
    pub window_rows: usize,
}

impl WindowSpec {
    /// Most rows in one example.
    pub fn rows(&self) -> usize {
        self.context_rows + self.window_rows
    }
}

/// One example: its tokens, the first token the loss counts (from the length token when
/// it starts the history), and how many of the history's rows come before it.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub tokens: Vec<u32>,
    pub loss_from: usize,
    pub rows_before: usize,
}

/// The example of a unit's history in a round.
pub fn window(layout: &Layout, spec: &WindowSpec, history: &History, seed: &[u8; 32]) -> Window {
    let len = history.len();
    let mut rng = keyed_rng(seed, &history.id, 0);
    let k = if len <= 1 || rng.random::<f64>() < spec.p_start { 0 } else { rng.random_range(1..len) };
    let first = k.saturating_sub(spec.context_rows);
    let end = len.min(k + spec.window_rows.max(1));
    let start = if first == 0 { Start::History } else { Start::Window { rows_before: first } };
    let tokens = history.encode(layout, start, first..end, end == len);
    let loss_from = if k == 0 { 1 } else { history.encode(layout, start, first..k, false).len() };
    Window { tokens, loss_from, rows_before: first }
}

/// Windows padded to one length, as model inputs and next-token targets.
pub struct PaddedBatch {
    /// Inputs, sequences × length.
    pub inputs: Vec<u32>,
    /// Each input's lag-1 tokens (`Cursor::lagged`: the bin and the refinement the field
    /// the next token belongs to held in the previous row), one vector per kind.
    pub lagged: [Vec<u32>; 2],
    pub targets: Vec<u32>,
    /// Additive grammar mask per input position: 0 for allowed next tokens, −10⁹ else.
    pub allowed: Vec<f32>,
    /// 1 where the target counts in the loss.
    pub weights: Vec<f32>,
    pub length: usize,
}

/// Pads windows to their longest (minus one: the last token is only a target).
pub fn pad(layout: &Layout, windows: &[Window]) -> PaddedBatch {
    let length = windows.iter().map(|w| w.tokens.len() - 1).max().unwrap_or(1).max(1);
    let vocabulary = layout.vocabulary();
    let n = windows.len() * length;
    let mut batch = PaddedBatch {
        inputs: vec![super::tokens::EOH; n],
        lagged: [vec![layout.no_lag(); n], vec![layout.no_lag(); n]],
        targets: vec![super::tokens::EOH; n],
        allowed: vec![0.0; n * vocabulary],
        weights: vec![0.0; n],
        length,
    };
    for (s, w) in windows.iter().enumerate() {
        let mut cursor = Cursor::new(layout, w.rows_before);
        cursor.advance(w.tokens[0]).expect("a window starts with BOS or MID");
        for i in 1..w.tokens.len() {
            let p = s * length + i - 1;
            batch.inputs[p] = w.tokens[i - 1];
            let [bin, refinement] = cursor.lagged();
            (batch.lagged[0][p], batch.lagged[1][p]) = (bin, refinement);
            batch.targets[p] = w.tokens[i];
            let mask = &mut batch.allowed[p * vocabulary..(p + 1) * vocabulary];
            mask.fill(-1e9);
            for range in cursor.allowed() {
                mask[range.start as usize..range.end as usize].fill(0.0);
            }
            if i >= w.loss_from {
                batch.weights[p] = 1.0;
            }
            cursor.advance(w.tokens[i]).expect("an encoded window follows the grammar");
        }
    }
    batch
}
