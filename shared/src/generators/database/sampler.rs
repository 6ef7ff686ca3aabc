//! A synthetic database drawn down the tree from one fitted model per table's view
//! (`data::database::view`): the root's rows first, each with its children's counts; then
//! each child table's rows, as many under each synthetic parent row as the parent's count,
//! drawn from the table's model conditioned on the bins of the synthetic row's ancestors.
//! Every child row's parent exists by construction. Post-processing only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use rand::rngs::ChaCha20Rng;
use rand::{Rng, SeedableRng};

use super::rake::Raked;
use crate::data::database::view::{AFTER_COLUMN, ChildColumn, ColumnAt, POSITION_COLUMN};
use crate::data::database::{Layout, View};
use crate::data::domain::{ColumnDomain, Domain, Encoding};
use crate::output::{SyntheticValue, columns_to_batch};
use crate::pgm::{Given, GraphicalModel};
use crate::spec::{ColumnSpec, JobSpec};

/// A fitted database, drawn a batch of units at a time into one Arrow batch per table
/// with fresh keys: a unit's `syn-<n>`, a child row's `syn-<table>-<n>`, numbered on
/// from the batches drawn before.
pub struct DatabaseSampler {
    layout: Layout,
    views: Vec<FittedView>,
    tables: Vec<TableOutput>,
    /// The unit's key column (in every table).
    unit_key: String,
    /// Rows drawn so far, per table.
    drawn: Vec<u64>,
    /// Each table's draws planned, shared by every batch, slice and raking round.
    plans: Plans,
}

/// A table as written: its declared columns and which of them hold keys.
struct TableOutput {
    columns: Vec<ColumnSpec>,
    /// Its own key column, if it has one (the root's is the unit's).
    key: Option<String>,
    /// The column holding its parent row's key.
    parent_key: Option<String>,
}

impl DatabaseSampler {
    /// `models[t]` is fitted over table `t`'s view of `layout` (the spec's).
    pub fn new(spec: &JobSpec, layout: Layout, models: Vec<GraphicalModel>) -> Self {
        let unit_key = spec.schema.unit_column.clone().expect("a database job names its unit column");
        let root = TableOutput { columns: spec.schema.columns.clone(), key: Some(unit_key.clone()), parent_key: None };
        let children = spec.tables.iter().map(|t| TableOutput {
            columns: t.columns.clone(),
            key: t.key.clone(),
            parent_key: Some(t.parent.key.clone()),
        });
        let tables: Vec<TableOutput> = std::iter::once(root).chain(children).collect();
        let views = (models.into_iter().enumerate())
            .map(|(t, model)| FittedView { domain: View { table: t }.domain(&layout), model })
            .collect();
        let drawn = vec![0; tables.len()];
        let plans = Plans::new(&layout);
        Self { layout, views, tables, unit_key, drawn, plans }
    }

    /// The target's table's model tilted to the target's conditionals as it is drawn
    /// (`rake`), drawing at most `rows` of its rows a round for at most `rounds` tilts.
    pub fn rake(&mut self, target: ColumnAt, rows: u64, rounds: usize, rng: &mut impl Rng) -> Option<Raked> {
        super::rake::rake(&self.layout, &mut self.views, &self.plans, target, rows, rounds, rng)
    }

    /// The tables' names, root first: the batches of [`Self::sample`] in this order.
    pub fn table_names(&self) -> impl Iterator<Item = &str> {
        self.layout.tables.iter().map(|t| t.name.as_str())
    }

    /// How many units to draw at a time for parts of at most about `rows_per_part` rows:
    /// a unit reaches at most the sum of its tables' cap products.
    pub fn units_per_part(&self, rows_per_part: u64) -> u64 {
        let reach: u64 = (0..self.layout.tables.len()).map(|t| self.layout.reach(t)).sum();
        (rows_per_part / reach).max(1)
    }

    /// Draws `units` more units and all their rows, one batch per table.
    pub fn sample(&mut self, units: usize, rng: &mut impl Rng) -> Vec<RecordBatch> {
        let drawn = draw_database(&self.layout, &self.views, &self.plans, units, cores(), rng);
        let first = self.drawn.clone();
        let name = |t: usize, row: usize| match t {
            0 => format!("syn-{}", first[0] + row as u64),
            t => format!("syn-{}-{}", self.layout.tables[t].name, first[t] + row as u64),
        };
        let mut batches = Vec::with_capacity(drawn.len());
        for (t, rows) in drawn.into_iter().enumerate() {
            self.drawn[t] += rows.len() as u64;
            let (table, parent) = (&self.tables[t], self.layout.tables[t].parent);
            let places: Vec<(usize, Option<usize>)> = rows.iter().map(|r| (r.unit, r.parent)).collect();
            let values: Vec<Vec<SyntheticValue>> = rows.into_iter().map(|r| r.values).collect();
            let ids = |column: &str, i: usize| {
                let (unit, parent_row) = places[i];
                if column == self.unit_key {
                    Some(name(0, unit))
                } else if table.key.as_deref() == Some(column) {
                    Some(name(t, i))
                } else if table.parent_key.as_deref() == Some(column) {
                    Some(name(parent?, parent_row?))
                } else {
                    None
                }
            };
            batches.push(columns_to_batch(&table.columns, &values, ids));
        }
        batches
    }
}

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

/// What each table's rows hold while the tree is drawn: their bins as their descendants'
/// views hold them (own values, then their children's means).
#[derive(Default)]
pub(super) struct Drawn {
    rows: Vec<SyntheticRow>,
    bins: Vec<Vec<usize>>,
    /// The view's columns of the children's means.
    means: std::ops::Range<usize>,
    /// Per child table, how many rows each row has under it.
    counts: HashMap<usize, Vec<usize>>,
    /// Per child table with a rate, each row's bins of the columns its count was measured
    /// with (`Counted::strata`) and its rate drawn times its span's length.
    expected: HashMap<usize, Vec<(Vec<usize>, f64)>>,
}

/// Draws `units` root rows and everything under them, table by table in layout order;
/// `views[t]` is table `t`'s view fitted. `units` must be public or released (the root
/// model's noisy total), never a count a worker reported.
///
/// The root rows are drawn at once (their cells' counts rounded together,
/// `GraphicalModel::sample`), then everything under them in `slices` slices of them, each
/// on a thread with its own generator seeded from `rng` (a unit's rows are drawn given its
/// own alone, so the slices are the law of one draw), and joined: a slice's units and
/// parent rows numbered on from the slices before.
pub fn sample_database(
    layout: &Layout,
    views: &[FittedView],
    units: usize,
    slices: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<SyntheticRow>> {
    draw_database(layout, views, &Plans::new(layout), units, slices, rng)
}

/// [`sample_database`] with the draws planned in `plans`.
fn draw_database(
    layout: &Layout,
    views: &[FittedView],
    plans: &Plans,
    units: usize,
    slices: usize,
    rng: &mut impl Rng,
) -> Vec<Vec<SyntheticRow>> {
    let last = layout.tables.len() - 1;
    let roots = views[0].model.sample(units, rng);
    let drawn = in_slices(roots, slices, rng, |roots, rng| draw_tables(layout, views, plans, roots, last, None, rng));
    let mut tables: Vec<Vec<SyntheticRow>> = vec![Vec::new(); layout.tables.len()];
    for slice in drawn {
        let before: Vec<usize> = tables.iter().map(Vec::len).collect();
        for (t, table) in slice.into_iter().enumerate() {
            let parents_before = layout.tables[t].parent.map_or(0, |p| before[p]);
            tables[t].extend(table.rows.into_iter().map(|row| SyntheticRow {
                unit: row.unit + before[0],
                parent: row.parent.map(|p| p + parents_before),
                values: row.values,
            }));
        }
    }
    tables
}

/// The slices to draw in: one a core.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// Units whose children's counts are given out together by rank ([`Drawn::rank_counts`]):
/// a slice holds whole blocks of them, so the law of a draw does not follow the number of
/// cores. Small enough that a batch of units (331 at the scale benchmark's caps) spans two
/// slices; large enough for ranks (at 128, the ε = 50 test's stay × charts fell from
/// 0.93–0.95 to 0.91–0.94).
pub(super) const RANK_BLOCK: usize = 256;

/// `f(roots, rng)` run on the root rows `roots` split in at most `slices` slices of whole
/// blocks of [`RANK_BLOCK`] rows (the last block may be short), each on a thread with its
/// own generator seeded from `rng`; the slices' results in order.
pub(super) fn in_slices<T: Send>(
    mut roots: Vec<Vec<usize>>,
    slices: usize,
    rng: &mut impl Rng,
    f: impl Fn(Vec<Vec<usize>>, &mut ChaCha20Rng) -> T + Sync,
) -> Vec<T> {
    // Whole blocks of units a slice (`RANK_BLOCK`: what a slice draws does not depend on
    // how many slices there are).
    let units = roots.len();
    let blocks = units.div_ceil(RANK_BLOCK).max(1);
    let slices = slices.clamp(1, blocks);
    let shares: Vec<Vec<Vec<usize>>> = (0..slices)
        .map(|i| {
            let take = (blocks / slices + usize::from(i < blocks % slices)) * RANK_BLOCK;
            roots.drain(..take.min(roots.len())).collect()
        })
        .collect();
    let generators: Vec<ChaCha20Rng> = (0..slices).map(|_| ChaCha20Rng::from_rng(rng)).collect();
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (shares.into_iter().zip(generators))
            .map(|(share, mut rng)| scope.spawn(move || f(share, &mut rng)))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a slice of units drawn")).collect()
    })
}

/// Each table's model's draws planned per set of given columns (`pgm::Given`), made once
/// and shared by the slices drawing at once, the batches after and raking's rounds (a
/// plan holds no potential: it serves a tilted model too).
pub struct Plans(Vec<Mutex<HashMap<Vec<usize>, Arc<Given>>>>);

impl Plans {
    pub fn new(layout: &Layout) -> Self {
        Self(layout.tables.iter().map(|_| Mutex::default()).collect())
    }

    /// Table `t`'s plan given `vars`, made from `model` the first time.
    fn get(&self, t: usize, vars: &[usize], model: &GraphicalModel) -> Arc<Given> {
        let mut plans = self.0[t].lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        plans.entry(vars.to_vec()).or_insert_with(|| Arc::new(model.given(vars))).clone()
    }
}

/// [`sample_database`]'s tables up to table `last`; `view_rows`, if given, collects
/// table `last`'s rows as its view holds them (a bin of every view column).
pub(super) fn draw_tables(
    layout: &Layout,
    views: &[FittedView],
    plans: &Plans,
    roots: Vec<Vec<usize>>,
    last: usize,
    mut view_rows: Option<&mut Vec<Vec<usize>>>,
    rng: &mut impl Rng,
) -> Vec<Drawn> {
    assert!(
        views.len() == layout.tables.len()
            && views.iter().enumerate().all(|(t, v)| v.domain == View { table: t }.domain(layout)),
        "one fitted view per table, over its view's domain"
    );
    let mut drawn: Vec<Drawn> = Vec::with_capacity(last + 1);
    for (t, table) in layout.tables.iter().enumerate().take(last + 1) {
        let fitted = &views[t];
        let children: Vec<Counted> = (View { table: t }.child_columns(layout).into_iter())
            .map(|child| Counted { strata: measured_with(&fitted.model, child.count), child })
            .collect();
        let mut out = Drawn { means: View { table: t }.mean_columns(layout), ..Drawn::default() };
        match table.parent {
            None => {
                for (unit, row) in roots.iter().enumerate() {
                    let values = placed(layout, t, own_values(fitted, table.values(), row, rng), |_, _| None);
                    let lengths = lengths(&children, t, &values, |_, _| None);
                    out.keep(&fitted.domain, &children, (unit, None), (row.as_slice(), values), &lengths, &mut *rng);
                }
            }
            Some(p) => {
                let mut siblings = Siblings::new(layout, t, fitted, plans);
                let wanted = drawn[p].counts.get(&t).cloned().unwrap_or_default();
                for (parent, &n) in wanted.iter().enumerate().filter(|(_, n)| **n > 0) {
                    let ancestor = |a: usize, column: usize| {
                        let (mut at, mut row) = (p, parent);
                        while at != a {
                            (at, row) = (layout.tables[at].parent?, drawn[at].rows[row].parent?);
                        }
                        number(&drawn[at].rows[row].values[column])
                    };
                    let given = siblings.ancestors.clone().zip(ancestor_bins(&drawn, layout, p, parent)).collect();
                    let unit = drawn[p].rows[parent].unit;
                    let drawn_rows = view_rows.as_deref_mut().filter(|_| t == last);
                    for (row, values) in siblings.draw(given, n, ancestor, drawn_rows, rng) {
                        let lengths = lengths(&children, t, &values, ancestor);
                        out.keep(&fitted.domain, &children, (unit, Some(parent)), (&row, values), &lengths, &mut *rng);
                    }
                }
            }
        }
        out.rank_counts();
        drawn.push(out);
    }
    drawn
}

/// A row's own values (the first `own` columns of its view) drawn inside its bins.
fn own_values(fitted: &FittedView, own: usize, row: &[usize], rng: &mut impl Rng) -> Vec<SyntheticValue> {
    (0..own).map(|c| fitted.domain.columns[c].draw(row[c], rng)).collect()
}

/// The rows of child table `t` under one parent row after another, each drawn given the
/// bins of its ancestors' rows; a sequence's (a table with `order_by`) one after another,
/// each also given its place, the rows after it and the row before it.
struct Siblings<'a> {
    layout: &'a Layout,
    t: usize,
    fitted: &'a FittedView,
    /// The view's columns of the ancestors' values, of a sequence's previous row's, and
    /// its place and rows after.
    ancestors: std::ops::Range<usize>,
    previous: std::ops::Range<usize>,
    position: usize,
    after: Option<usize>,
    /// Each own value column whose mean over its siblings its parent holds, with the
    /// view's column of that mean; and those of them the siblings are moved onto
    /// ([`recentre`]): not a value another of the row's values is placed from (`within
    /// c..`), which would leave that one's interval.
    means: Vec<(usize, usize)>,
    recentred: Vec<(usize, usize)>,
    /// The model's draws planned per set of given columns (the same for every row but
    /// for parents' means left out when missing: a few sets), never per value drawn; the
    /// shared ones, and those this slice has taken.
    shared: &'a Plans,
    plans: HashMap<Vec<usize>, Arc<Given>>,
}

impl<'a> Siblings<'a> {
    fn new(layout: &'a Layout, t: usize, fitted: &'a FittedView, shared: &'a Plans) -> Self {
        let view = View { table: t };
        let position = fitted.domain.index_of(POSITION_COLUMN).expect("a child's view has its position");
        let means = view.parent_means(layout);
        let an_end = |c: usize| {
            let end = Some(ColumnAt { table: t, column: c });
            (0..layout.tables[t].values()).any(|o| layout.within(t, o).is_some_and(|w| w.start == end || w.end == end))
        };
        let recentred = means.iter().copied().filter(|&(c, _)| !an_end(c)).collect();
        Self {
            layout,
            t,
            fitted,
            ancestors: view.ancestor_columns(layout),
            previous: view.previous_columns(layout),
            position,
            after: fitted.domain.index_of(AFTER_COLUMN),
            means,
            recentred,
            shared,
            plans: HashMap::new(),
        }
    }

    /// One row drawn from the view's model given a bin of each column of `at`.
    fn draw_given(&mut self, at: &[(usize, usize)], rng: &mut impl Rng) -> Vec<usize> {
        let (vars, values): (Vec<usize>, Vec<usize>) = at.iter().copied().unzip();
        let (model, shared, t) = (&self.fitted.model, self.shared, self.t);
        self.plans.entry(vars).or_insert_with_key(|vars| shared.get(t, vars, model)).draw(model, &values, rng)
    }

    /// `n` rows under one parent row whose ancestors' bins are `given`, each with its bins
    /// and its values (placed in their intervals from `ancestor(table, column)`), in order;
    /// `drawn`, if given, collects their bins as the model drew them (a sequence's order
    /// values before they are sorted).
    fn draw(
        &mut self,
        given: Vec<(usize, usize)>,
        n: usize,
        ancestor: impl Fn(usize, usize) -> Option<f64>,
        drawn: Option<&mut Vec<Vec<usize>>>,
        rng: &mut impl Rng,
    ) -> Vec<(Vec<usize>, Vec<SyntheticValue>)> {
        let (layout, t, columns) = (self.layout, self.t, &self.fitted.domain.columns);
        // The parent's mean of a value drawn missing (no child has one) over a row drawn with
        // children says nothing of them, and no real row holds it with a child's value:
        // they are drawn without it (a value that may be missing is then drawn as its
        // column's, missing or not).
        let given: Vec<(usize, usize)> = given
            .into_iter()
            .filter(|&(v, bin)| !(self.means.iter().any(|m| m.1 == v) && bin == columns[v].value_bins()))
            .collect();
        let order = layout.tables[t].order_by;
        let bins: Vec<Vec<usize>> = match order {
            Some(_) => {
                let mut rows: Vec<Vec<usize>> = Vec::with_capacity(n);
                for k in 0..n {
                    let mut at = given.clone();
                    at.push((self.position, columns[self.position].bin(Some(k as f64))));
                    at.extend(self.after.map(|a| (a, columns[a].bin(Some((n - 1 - k) as f64)))));
                    at.extend(
                        self.previous
                            .clone()
                            .enumerate()
                            .map(|(c, v)| (v, rows.last().map_or(columns[v].value_bins(), |row| row[c]))),
                    );
                    rows.push(self.draw_given(&at, rng));
                }
                rows
            }
            None => (0..n).map(|_| self.draw_given(&given, rng)).collect(),
        };
        if let Some(drawn) = drawn {
            drawn.extend(bins.iter().cloned());
        }
        let own = layout.tables[t].values();
        let mut rows: Vec<(Vec<usize>, Vec<SyntheticValue>)> = bins
            .into_iter()
            .map(|row| {
                let values = own_values(self.fitted, own, &row, rng);
                (row, values)
            })
            .collect();
        let place = |values: &[SyntheticValue]| placed(layout, t, values.to_vec(), &ancestor);
        match order {
            // A sequence drawn in its order: its order values drawn, then given to its rows
            // in that order (the first row the earliest) with their bins (children are drawn
            // given them), as its view holds them, so every value placed from them is placed
            // after.
            Some(order) => {
                let mut ranked: Vec<(f64, SyntheticValue, usize)> =
                    rows.iter().map(|r| (order_key(&place(&r.1)[order]), r.1[order].clone(), r.0[order])).collect();
                ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
                for (row, (_, value, bin)) in rows.iter_mut().zip(ranked) {
                    (row.1[order], row.0[order]) = (value, bin);
                }
                rows.iter_mut().for_each(|row| row.1 = place(&row.1));
            }
            // Rows kept by a sample: in their drawn places.
            None => {
                rows.iter_mut().for_each(|row| row.1 = place(&row.1));
                rows.sort_by_key(|(row, _)| row[self.position]);
            }
        }
        for &(c, mean) in &self.recentred {
            if let (Some(&(_, bin)), Encoding::Numeric { binning, .. }) =
                (given.iter().find(|(v, _)| *v == mean), &columns[mean].encoding)
            {
                recentre(&columns[c], c, binning.interval(bin), &mut rows);
            }
        }
        rows
    }
}

/// Siblings' values of own column `c` (of domain `column`) moved alike, as little as
/// takes their mean into `(low, high)`, the bin of it their parent was drawn with; each
/// then held in the column's declared bounds, with its bin. Each value is drawn given the
/// parent's bin of the mean, measured beside the values at the children's larger bound
/// (noisier), so the values alone would drift back to the column's mean and the parent's
/// link to them thin out; moved alike, the siblings keep their differences (their
/// dynamics), and a mean already in its bin keeps its place there.
fn recentre(column: &ColumnDomain, c: usize, (low, high): (f64, f64), rows: &mut [(Vec<usize>, Vec<SyntheticValue>)]) {
    let Encoding::Numeric { kind, min, max, .. } = column.encoding else { return };
    let present: Vec<f64> = rows.iter().filter_map(|(_, values)| number(&values[c])).collect();
    if present.is_empty() {
        return;
    }
    let mean = present.iter().sum::<f64>() / present.len() as f64;
    let shift = mean.clamp(low, high) - mean;
    for (bins, values) in rows.iter_mut() {
        if let Some(value) = number(&values[c]) {
            values[c] = SyntheticValue::numeric(kind, (value + shift).clamp(min, max));
            bins[c] = column.bin(number(&values[c]));
        }
    }
}

impl Drawn {
    /// A drawn row: its bins, its own values (drawn inside them) and its children's counts
    /// (their values are drawn given their means' bins), each drawn in its bin, and with
    /// a rate its rate drawn in its bin times the row's span's length (`lengths`, by child).
    fn keep<R: Rng>(
        &mut self,
        domain: &Domain,
        children: &[Counted],
        (unit, parent): (usize, Option<usize>),
        (row, values): (&[usize], Vec<SyntheticValue>),
        lengths: &[f64],
        rng: &mut R,
    ) {
        self.bins.push(row[..values.len()].iter().chain(&row[self.means.clone()]).copied().collect());
        self.rows.push(SyntheticRow { unit, parent, values });
        for (Counted { child, strata }, length) in children.iter().zip(lengths) {
            let count = match domain.columns[child.count].draw(row[child.count], rng) {
                SyntheticValue::Integer(n) => n.max(0) as usize,
                value => unreachable!("a child's count, not {value:?}"),
            };
            self.counts.entry(child.table).or_default().push(count);
            if let Some((column, _)) = child.rate {
                let rate = number(&domain.columns[column].draw(row[column], rng)).expect("a rate is never missing");
                let stratum = strata.iter().map(|&v| row[v]).collect();
                self.expected.entry(child.table).or_default().push((stratum, rate * length));
            }
        }
    }

    /// Each child table's counts drawn, given out again in the order of the rows'
    /// expected counts (rate times span) where it has a rate, among the rows alike in the
    /// columns the count was measured with, of each block of [`RANK_BLOCK`] units: the
    /// counts keep the law the model drew them by given those columns, and follow the rows'
    /// spans as their rates do (a comonotone coupling: the real count is its rate times its
    /// span). A count leaves the row whose other bins it was drawn with (a mean drawn
    /// missing over a row given children is then left out, as noise makes it).
    fn rank_counts(&mut self) {
        for (child, expected) in &self.expected {
            let counts = self.counts.get_mut(child).expect("a count beside each rate");
            let group = |r: usize| (self.rows[r].unit / RANK_BLOCK, &expected[r].0);
            let mut order: Vec<usize> = (0..expected.len()).collect();
            order.sort_by(|&a, &b| group(a).cmp(&group(b)).then(expected[a].1.total_cmp(&expected[b].1)));
            // The counts of each group, ascending, in the same group order.
            let mut sorted: Vec<((usize, &Vec<usize>), usize)> =
                (0..counts.len()).map(|r| (group(r), counts[r])).collect();
            sorted.sort_unstable();
            let sorted: Vec<usize> = sorted.into_iter().map(|(_, count)| count).collect();
            for (row, count) in order.into_iter().zip(sorted) {
                counts[row] = count;
            }
        }
    }
}

/// Where a value sorts among its siblings: missing last (as the cap reads them).
fn order_key(value: &SyntheticValue) -> f64 {
    number(value).unwrap_or(f64::INFINITY)
}

/// A numeric or datetime value as a number (datetimes in epoch seconds).
fn number(value: &SyntheticValue) -> Option<f64> {
    match value {
        SyntheticValue::Integer(v) | SyntheticValue::Datetime(v) => Some(*v as f64),
        SyntheticValue::Real(v) => Some(*v),
        SyntheticValue::Missing | SyntheticValue::Category(_) => None,
    }
}

/// A row of table `t` drawn as its view holds it, made values: each column with an
/// interval placed in it from its ends, of the row itself (placed first: an end is
/// declared before its column) or of an ancestor's drawn row (`ancestor(table, column)`).
/// Inside the interval by construction, whatever the bin (a value past the column's
/// declared bounds is brought to them, as the input's values are).
fn placed(
    layout: &Layout,
    t: usize,
    mut values: Vec<SyntheticValue>,
    ancestor: impl Fn(usize, usize) -> Option<f64>,
) -> Vec<SyntheticValue> {
    for c in 0..values.len() {
        let Encoding::Numeric { kind, min, max, .. } = layout.tables[t].domain.columns[c].encoding else { continue };
        if layout.within(t, c).is_none() {
            continue;
        }
        let end =
            |table: usize, column: usize| if table == t { number(&values[column]) } else { ancestor(table, column) };
        let value = number(&values[c]).and_then(|place| layout.from_view_value(t, c, place, end));
        // Within the declared bounds as well, as the input is read (a distance from one end
        // may reach past them).
        values[c] = value.map_or(SyntheticValue::Missing, |v| SyntheticValue::numeric(kind, v.clamp(min, max)));
    }
    values
}

/// A child table's columns in its parent's view, and the columns its count was measured
/// with (each other column of a released table that holds the count): its counts are
/// given out by rank only among rows alike in these, so that every measured link of the
/// count is kept.
struct Counted {
    child: ChildColumn,
    strata: Vec<usize>,
}

/// The variables measured with `v` in `model`'s measurements, ascending.
fn measured_with(model: &GraphicalModel, v: usize) -> Vec<usize> {
    let mut with: Vec<usize> =
        model.measured().iter().filter(|set| set.contains(&v)).flatten().copied().filter(|&u| u != v).collect();
    with.sort_unstable();
    with.dedup();
    with
}

/// The length of a drawn row's span for each child of its table `t` with a rate
/// (`Layout::span`; 0 without), from the row's own values and its ancestors'
/// (`ancestor(table, column)`).
fn lengths(
    children: &[Counted],
    t: usize,
    values: &[SyntheticValue],
    ancestor: impl Fn(usize, usize) -> Option<f64>,
) -> Vec<f64> {
    let value =
        |table: usize, column: usize| if table == t { number(&values[column]) } else { ancestor(table, column) };
    children.iter().map(|c| c.child.rate.map_or(0.0, |(_, span)| span.length(value))).collect()
}

/// The bins of row `row` of table `p` and of its ancestors' rows as a view holds them
/// (own values, children's means), nearest first.
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
