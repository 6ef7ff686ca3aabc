//! A worker's histories, held as the tokens they train on: per unit one flat array of its
//! static columns' tokens and each row's tokens after the order field, with the order
//! column's values beside it. The order fields stay values because a window writes its
//! first row's order value whole and later rows' as gaps from it, so their tokens depend
//! on where the window starts. A row takes a few bytes per column instead of a vector of
//! values (`docs/benchmarks.md` measures both).

use std::ops::Range;

use super::tokens::{Layout, Start};
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::histories::{UnitRows, group, in_order, read_histories};
use crate::dpsgd::UnitExamples;

/// One unit's history: its first `max_rows` rows in order, as tokens.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    pub id: String,
    /// Each row's order value, NaN where it is missing (every one without an order
    /// column): one a row.
    order: Vec<f64>,
    /// The static columns' tokens (of the first row in order), then each row's tokens
    /// after its order field.
    tokens: Vec<u32>,
}

impl History {
    /// Rows in the history.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The sequence of rows `rows` of the history (see [`Layout::encode`]).
    pub fn encode(&self, layout: &Layout, start: Start, rows: Range<usize>, end: bool) -> Vec<u32> {
        debug_assert!(rows.end <= self.len(), "rows {rows:?} of a history of {}", self.len());
        let statics = layout.statics_len(&self.tokens);
        let rows = self.rows(layout, statics).skip(rows.start).take(rows.len());
        layout.encode_tokens(start, self.len(), &self.tokens[..statics], rows, end)
    }

    /// The history's values in domain order, as its tokens decode (a value's sub-cell),
    /// the order column's exact.
    pub fn values(&self, layout: &Layout) -> Vec<Vec<Option<f64>>> {
        let tokens = self.encode(layout, Start::History, 0..self.len(), true);
        let mut rows = layout.parse(&tokens, 0).expect("a history's own tokens follow the grammar");
        if let Some(c) = layout.order_column() {
            rows.iter_mut().zip(&self.order).for_each(|(row, &v)| row[c] = present(v));
        }
        rows
    }

    /// Each row's order value and its tokens, from the end of the statics.
    fn rows<'a>(&'a self, layout: &'a Layout, statics: usize) -> impl Iterator<Item = (Option<f64>, &'a [u32])> + 'a {
        let mut at = statics;
        self.order.iter().map(move |&order| {
            let len = layout.row_len(&self.tokens[at..]);
            at += len;
            (present(order), &self.tokens[at - len..at])
        })
    }
}

/// A stored order value as read: NaN is missing.
fn present(v: f64) -> Option<f64> {
    (!v.is_nan()).then_some(v)
}

/// A unit's rows as they are read, each as its statics' tokens then its own, in file order.
#[derive(Default)]
struct TokenRows {
    order: Vec<f64>,
    tokens: Vec<u32>,
}

impl UnitRows for TokenRows {
    type Layout = Layout;
    type History = History;

    fn push(&mut self, layout: &Layout, value: impl Fn(usize) -> Option<f64>) {
        self.order.push(layout.order_column().and_then(&value).unwrap_or(f64::NAN));
        layout.push_statics(&value, &mut self.tokens);
        layout.push_row(&value, &mut self.tokens);
    }

    /// The history: rows in order ([`in_order`]), the statics of the first.
    fn history(self, id: String, layout: &Layout) -> History {
        let mut spans = Vec::with_capacity(self.order.len());
        let mut at = 0;
        for _ in &self.order {
            let statics = at..at + layout.statics_len(&self.tokens[at..]);
            let row = statics.end..statics.end + layout.row_len(&self.tokens[statics.end..]);
            at = row.end;
            spans.push((statics, row));
        }
        // Without an order column every value is missing: rows stay in file order.
        let kept = in_order(&self.order, layout.max_rows);
        let statics = kept.first().map_or(0..0, |&r| spans[r].0.clone());
        let mut tokens = Vec::with_capacity(statics.len() + kept.iter().map(|&r| spans[r].1.len()).sum::<usize>());
        tokens.extend_from_slice(&self.tokens[statics]);
        for &r in &kept {
            tokens.extend_from_slice(&self.tokens[spans[r].1.clone()]);
        }
        let order = kept.iter().map(|&r| self.order[r]).collect();
        History { id, order, tokens }
    }
}

/// A worker's units' histories.
#[derive(Clone, Debug, Default)]
pub struct Histories {
    pub units: Vec<History>,
}

impl UnitExamples for Histories {
    fn unit_count(&self) -> usize {
        self.units.len()
    }
}

impl Histories {
    /// Rows (values in domain order) grouped by unit, as [`Histories::load`] groups them.
    pub fn from_rows(rows: impl IntoIterator<Item = (String, Vec<Option<f64>>)>, layout: &Layout) -> Self {
        Self { units: group::<TokenRows>(rows, layout) }
    }

    /// A worker's histories from its partitions (a unit's rows are in one partition):
    /// each unit's rows ordered by the order column (missing values last, ties in file
    /// order), the first `max_rows` of them.
    pub async fn load(urls: &[String], domain: &Domain, layout: &Layout) -> Result<Self, DataError> {
        Ok(Self { units: read_histories::<TokenRows>(urls, domain, layout).await? })
    }
}
