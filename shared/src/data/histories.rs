//! A worker's partitions as unit histories: rows grouped by unit as they are read (units in
//! first-seen order), each unit's rows put in order once all are in. How a unit's rows are
//! held is the reader's choice ([`UnitRows`]): the sequence model holds tokens, the history
//! copula values ([`ValueRows`]), both flat, never a vector per row.

use std::collections::HashMap;

use super::DataError;
use super::domain::Domain;
use super::partition::read_partition;

/// How a unit's rows are held while they are read, and its history once they are all in.
pub trait UnitRows: Default {
    /// What holding a row needs (the columns, the order column, the row cap).
    type Layout;
    type History;
    /// Adds a row; `value(c)` is its value of domain column `c`.
    fn push(&mut self, layout: &Self::Layout, value: impl Fn(usize) -> Option<f64>);
    fn history(self, id: String, layout: &Self::Layout) -> Self::History;
}

/// The rows to keep, as their indices in file order, sorted by `order` (NaN, a missing
/// value, last; ties in file order): the first `max_rows` of them.
pub fn in_order(order: &[f64], max_rows: usize) -> Vec<usize> {
    let mut rows: Vec<usize> = (0..order.len()).collect();
    rows.sort_by(|&a, &b| match (order[a].is_nan(), order[b].is_nan()) {
        (false, false) => order[a].total_cmp(&order[b]),
        (false, true) => std::cmp::Ordering::Less,
        (true, false) => std::cmp::Ordering::Greater,
        (true, true) => std::cmp::Ordering::Equal,
    });
    rows.truncate(max_rows);
    rows
}

/// Rows grouped by unit, in first-seen order.
struct Grouping<R> {
    index: HashMap<String, usize>,
    units: Vec<(String, R)>,
}

impl<R: UnitRows> Grouping<R> {
    fn new() -> Self {
        Self { index: HashMap::new(), units: Vec::new() }
    }

    /// Adds a row to its unit's (an id is copied once per unit, not per row).
    fn push(&mut self, layout: &R::Layout, unit: &str, value: impl Fn(usize) -> Option<f64>) {
        let i = match self.index.get(unit) {
            Some(&i) => i,
            None => {
                self.index.insert(unit.to_string(), self.units.len());
                self.units.push((unit.to_string(), R::default()));
                self.units.len() - 1
            }
        };
        self.units[i].1.push(layout, value);
    }

    fn histories(self, layout: &R::Layout) -> Vec<R::History> {
        self.units.into_iter().map(|(id, rows)| rows.history(id, layout)).collect()
    }
}

/// Histories of rows (values in domain order) held as `R`.
pub fn group<R: UnitRows>(
    rows: impl IntoIterator<Item = (String, Vec<Option<f64>>)>,
    layout: &R::Layout,
) -> Vec<R::History> {
    let mut grouping = Grouping::<R>::new();
    for (unit, row) in rows {
        grouping.push(layout, &unit, |c| row[c]);
    }
    grouping.histories(layout)
}

/// Histories of a worker's partitions (a unit's rows are all in one) held as `R`.
pub async fn read_histories<R: UnitRows>(
    urls: &[String],
    domain: &Domain,
    layout: &R::Layout,
) -> Result<Vec<R::History>, DataError> {
    let mut grouping = Grouping::<R>::new();
    for url in urls {
        read_partition(url, domain, |batch| {
            for (r, unit) in batch.units.iter().enumerate() {
                grouping.push(layout, unit, |c| batch.values[c][r]);
            }
            Ok(())
        })
        .await?;
    }
    Ok(grouping.histories(layout))
}

/// What holding rows as values needs.
#[derive(Clone, Debug)]
pub struct ValueLayout {
    /// Columns of a row (the domain's).
    pub width: usize,
    /// The order column, if rows are ordered.
    pub order: Option<usize>,
    pub max_rows: usize,
}

/// A unit's rows as values, a layout's `width` (one or more columns) to a row, NaN where
/// missing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ValueRows {
    values: Vec<f64>,
}

/// A unit's history held as values: its first `max_rows` rows in order.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueHistory {
    pub id: String,
    width: usize,
    values: Vec<f64>,
}

impl ValueHistory {
    pub fn len(&self) -> usize {
        self.values.len() / self.width
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The rows, values in domain order (`None` missing).
    pub fn rows(&self) -> Vec<Vec<Option<f64>>> {
        let value = |v: f64| (!v.is_nan()).then_some(v);
        self.values.chunks_exact(self.width).map(|row| row.iter().map(|&v| value(v)).collect()).collect()
    }
}

impl UnitRows for ValueRows {
    type Layout = ValueLayout;
    type History = ValueHistory;

    fn push(&mut self, layout: &ValueLayout, value: impl Fn(usize) -> Option<f64>) {
        self.values.extend((0..layout.width).map(|c| value(c).unwrap_or(f64::NAN)));
    }

    fn history(self, id: String, layout: &ValueLayout) -> ValueHistory {
        let width = layout.width;
        let rows = self.values.len() / width;
        let kept: Vec<usize> = match layout.order {
            Some(o) => {
                in_order(&self.values.iter().skip(o).step_by(width).copied().collect::<Vec<_>>(), layout.max_rows)
            }
            None => (0..rows.min(layout.max_rows)).collect(),
        };
        let values = kept.iter().flat_map(|&r| self.values[r * width..(r + 1) * width].iter().copied()).collect();
        ValueHistory { id, width: layout.width, values }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows in order of their order value, missing ones last, ties in file order, the
    /// first `max_rows`; units in first-seen order, whatever rows lie between.
    #[test]
    fn histories_keep_their_first_rows_in_order() {
        assert_eq!(in_order(&[3.0, f64::NAN, 1.0, 3.0, 2.0, f64::NAN], 10), [2, 4, 0, 3, 1, 5]);
        assert_eq!(in_order(&[3.0, f64::NAN, 1.0, 3.0, 2.0], 3), [2, 4, 0]);
        let layout = ValueLayout { width: 2, order: Some(1), max_rows: 3 };
        let rows = [
            ("u", [Some(1.0), Some(5.0)]),
            ("v", [Some(9.0), Some(0.0)]),
            ("u", [None, None]),
            ("u", [Some(3.0), Some(4.0)]),
            ("u", [Some(2.0), Some(5.0)]),
            ("u", [Some(7.0), Some(8.0)]),
        ];
        let histories = group::<ValueRows>(rows.iter().map(|(u, r)| (u.to_string(), r.to_vec())), &layout);
        let ids: Vec<&str> = histories.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["u", "v"]);
        assert_eq!(histories[0].rows(), [[Some(3.0), Some(4.0)], [Some(1.0), Some(5.0)], [Some(2.0), Some(5.0)]]);
        assert_eq!(histories[1].rows(), [[Some(9.0), Some(0.0)]]);
        let unordered = ValueLayout { order: None, ..layout };
        let histories = group::<ValueRows>(rows.iter().map(|(u, r)| (u.to_string(), r.to_vec())), &unordered);
        assert_eq!(histories[0].rows(), [[Some(1.0), Some(5.0)], [None, None], [Some(3.0), Some(4.0)]]);
    }
}
