//! A synthetic database drawn down the tree from one fitted model per table's view
//! (`data::database::view`): the root's rows first, each with its children's counts; then
//! each child table's rows, as many under each synthetic parent row as the parent's count,
//! drawn from the table's model conditioned on the bins of the synthetic row's ancestors.
//! Every child row's parent exists by construction. Post-processing only.

use std::collections::HashMap;

use rand::Rng;

use crate::data::database::view::POSITION_COLUMN;
use crate::data::database::{Layout, View};
use crate::data::domain::Domain;
use crate::output::SyntheticValue;
use crate::pgm::GraphicalModel;

/// A view's fitted model: over the bins of the view's domain.
pub struct FittedView {
    pub domain: Domain,
    pub model: GraphicalModel,
}

/// One synthetic row of a table: its unit (the index of its root row), its parent (the
/// index of its row in the parent table; `None` at the root) and its own values.
#[derive(Clone, Debug, PartialEq)]
pub struct SyntheticRow {
    pub unit: usize,
    pub parent: Option<usize>,
    pub values: Vec<SyntheticValue>,
}

/// What each table's rows hold while the tree is drawn: their own bins.
struct Drawn {
    rows: Vec<SyntheticRow>,
    bins: Vec<Vec<usize>>,
    /// Per child table, how many rows each row has under it.
    counts: HashMap<usize, Vec<usize>>,
}

/// Draws `units` root rows and everything under them, table by table in layout order;
/// `views[t]` is table `t`'s view fitted. `units` must be public or released (the root
/// model's noisy total), never a count a worker reported.
pub fn sample_database(
    layout: &Layout,
    views: &[FittedView],
    units: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<SyntheticRow>> {
    assert!(
        views.len() == layout.tables.len()
            && views.iter().enumerate().all(|(t, v)| v.domain == View { table: t }.domain(layout)),
        "one fitted view per table, over its view's domain"
    );
    let mut drawn: Vec<Drawn> = Vec::with_capacity(layout.tables.len());
    for (t, table) in layout.tables.iter().enumerate() {
        let fitted = &views[t];
        let own = table.values();
        let children: Vec<(usize, usize)> = child_columns(layout, t, &fitted.domain);
        let mut out = Drawn { rows: Vec::new(), bins: Vec::new(), counts: HashMap::new() };
        let keep = |out: &mut Drawn, unit: usize, parent: Option<usize>, row: &[usize], rng: &mut _| {
            out.keep(&fitted.domain, own, &children, (unit, parent), row, rng)
        };
        match table.parent {
            None => {
                for (unit, row) in fitted.model.sample(units, rng).iter().enumerate() {
                    keep(&mut out, unit, None, row, &mut *rng);
                }
            }
            Some(p) => {
                // The ancestors' columns in this view, and their bins for each parent row.
                let ancestors = ancestor_columns(layout, t);
                let mut conditioned: HashMap<Vec<usize>, GraphicalModel> = HashMap::new();
                let wanted = drawn[p].counts.get(&t).cloned().unwrap_or_default();
                for (parent, &n) in wanted.iter().enumerate().filter(|(_, n)| **n > 0) {
                    let given = ancestor_bins(&drawn, layout, p, parent);
                    let model = conditioned.entry(given.clone()).or_insert_with(|| {
                        let allowed: Vec<(usize, Vec<bool>)> = ancestors
                            .clone()
                            .zip(&given)
                            .map(|(v, &bin)| {
                                let mut mask = vec![false; fitted.domain.columns[v].bins()];
                                mask[bin] = true;
                                (v, mask)
                            })
                            .collect();
                        fitted.model.conditioned(&allowed)
                    });
                    let mut rows = model.sample(n, rng);
                    // In the order of their drawn places under the parent.
                    if let Some(position) = fitted.domain.index_of(POSITION_COLUMN) {
                        rows.sort_by_key(|r| r[position]);
                    }
                    let unit = drawn[p].rows[parent].unit;
                    for row in &rows {
                        keep(&mut out, unit, Some(parent), row, &mut *rng);
                    }
                }
            }
        }
        drawn.push(out);
    }
    drawn.into_iter().map(|d| d.rows).collect()
}

impl Drawn {
    /// A drawn row of bins: its own values drawn inside their bins, its children's counts.
    fn keep<R: Rng>(
        &mut self,
        domain: &Domain,
        own: usize,
        children: &[(usize, usize)],
        (unit, parent): (usize, Option<usize>),
        row: &[usize],
        rng: &mut R,
    ) {
        let values = (0..own).map(|c| domain.columns[c].draw(row[c], rng)).collect();
        self.rows.push(SyntheticRow { unit, parent, values });
        self.bins.push(row[..own].to_vec());
        for &(child, column) in children {
            let count = match domain.columns[column].draw(row[column], rng) {
                SyntheticValue::Integer(n) => n.max(0) as usize,
                _ => 0,
            };
            self.counts.entry(child).or_default().push(count);
        }
    }
}

/// Each child table of `t` with its count column in `t`'s view.
fn child_columns(layout: &Layout, t: usize, domain: &Domain) -> Vec<(usize, usize)> {
    let column = |c: usize| domain.index_of(&format!("__n.{}", layout.tables[c].name)).expect("a view's count column");
    layout.children(t).map(|c| (c, column(c))).collect()
}

/// The view's columns of `t`'s ancestors, nearest first (after its own and its position,
/// as `View::domain` lays them out).
fn ancestor_columns(layout: &Layout, t: usize) -> std::ops::Range<usize> {
    let start = layout.tables[t].values() + 1;
    start..start + layout.ancestors(t).map(|a| layout.tables[a].values()).sum::<usize>()
}

/// The own bins of row `row` of table `p` and of its ancestors' rows, nearest first.
fn ancestor_bins(drawn: &[Drawn], layout: &Layout, mut p: usize, mut row: usize) -> Vec<usize> {
    let mut bins = Vec::new();
    loop {
        bins.extend_from_slice(&drawn[p].bins[row]);
        match (layout.tables[p].parent, drawn[p].rows[row].parent) {
            (Some(up), Some(up_row)) => (p, row) = (up, up_row),
            _ => return bins,
        }
    }
}
