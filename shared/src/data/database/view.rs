//! A unit whole, as a worker reads it, and the views a database generator counts over it.
//! A worker reads the same partition index of every table (`passes`): each unit's
//! rows in every table, capped by the spec's public rule (`cap`) and joined by their
//! places. A [`View`] of a table makes one row per row of the table: its own values, its
//! place among its parent's rows, its ancestors' values and children's means, how many
//! rows each of its child tables holds under it and the mean of each of their plain
//! numeric values. A view is a function of one unit's rows alone, so a unit contributes at
//! most the table's cap product rows to it ([`View::max_rows_per_unit`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cap::DroppedRows;
use super::passes::{PASS_BYTES, PassReader};
use super::{Database, KEY_COLUMN, PARENT_COLUMN, PARENT_KEY_COLUMN, ROW_COLUMN};
use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::data::input::BATCH_ROWS;
use crate::data::{DataError, EncodedBatch};
use crate::spec::tables::{WithinEnd, parse_within};
use crate::spec::{Bound, ColumnKind, ColumnSpec, MissingPolicy, UnknownPolicy};

/// A view's column holding a row's place among its parent's rows (0 first).
pub const POSITION_COLUMN: &str = "__position";

/// A sequence's view column holding how many rows follow a row under its parent (0 for
/// the last): what ends a sequence (a death, a discharge) is drawn knowing it ends it.
pub const AFTER_COLUMN: &str = "__after";

/// Prefix of a view's columns holding the previous sibling's values (missing for the
/// first): `__prev.heart_rate`.
pub const PREVIOUS_PREFIX: &str = "__prev.";

/// Prefix of a view's column holding how many rows a child table holds under a row.
pub const COUNT_PREFIX: &str = "__n.";

/// Prefix of a view's column holding a child table's rows under a row per unit of the
/// row's span, when the child's rows lie inside it ([`Layout::span`]): `__rate.vitals`,
/// charts per second of the stay, beside their count. A count that follows its parent's
/// length is then ranked by one column a one-way table measures, where the count beside
/// the length is a pair whose cells noise drowns (docs/database.md, "Children per span").
pub const RATE_PREFIX: &str = "__rate.";

/// Bins of a rate column: √2 apart (`Binning::distances`), from the cap over the span's
/// declared range to the cap over its floor ([`Span::floor`]), a 2^23.5-th of the range:
/// 9 minutes of two centuries' declared dates, 8 seconds of three years'.
const RATE_BINS: u32 = 48;

/// Prefix of a view's columns holding the mean of a child table's value over the rows
/// under a row (missing when none has one): `__mean.vitals.heart_rate`. A row's children,
/// summarised in the row's own view, are counted at the row's table's bound on a unit's
/// rows, not at the children's larger one ([`Layout::summarised`]).
pub const MEAN_PREFIX: &str = "__mean.";

/// A database's tables as their partitions hold them: all a worker needs to read a unit
/// whole. Public: made from the spec alone.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// The root first, then parents before their children.
    pub tables: Vec<TableLayout>,
    /// Whether views hold their children's means ([`Layout::summarised`]).
    #[serde(default = "by_default")]
    pub means: bool,
    /// Whether a child whose rows lie inside their parent's interval is held also as a
    /// rate over it ([`Layout::span`]).
    #[serde(default = "by_default")]
    pub rates: bool,
}

/// A layout written without `means` or `rates` holds them, as a spec without them does.
fn by_default() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableLayout {
    pub name: String,
    /// Index of the parent table (`None`: the root).
    pub parent: Option<usize>,
    /// Rows per parent row (1 for the root).
    pub max_per_parent: u32,
    /// Its rows as a worker holds them, capped (a child's end with [`ROW_COLUMN`] and
    /// [`PARENT_COLUMN`]); as partitioned, [`Self::read_domain`].
    pub domain: Domain,
    /// Each own value column's interval (`within`), if it declares one.
    #[serde(default)]
    pub within: Vec<Option<Within>>,
    /// The own value column ordering its rows under one parent (its `order_by`): they are
    /// then a sequence, its view holds each row's previous sibling's values, and a sampler
    /// draws the siblings one after another.
    #[serde(default)]
    pub order_by: Option<usize>,
}

/// A column's interval: its ends, each a column of its row or an ancestor's row, or the
/// column's declared bound. Views hold the column's place in the interval, never its
/// value: a fraction of the interval with both ends, else its distance from the one end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Within {
    pub start: Option<ColumnAt>,
    pub end: Option<ColumnAt>,
}

/// A value column of a table of the layout (`column` indexes its own values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ColumnAt {
    pub table: usize,
    pub column: usize,
}

/// The interval a child table's rows lie in, both ends its ancestors' values (a chart
/// inside its admission: `admissions.admittime..dischtime`), and the shortest length a
/// rate is taken over.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub start: ColumnAt,
    pub end: ColumnAt,
    /// The declared range of the span (the end's declared maximum less the start's
    /// minimum) over 2^((RATE_BINS − 1)/2): a rate's bins reach from the cap over the range
    /// to the cap over it. A shorter span, or a missing one, counts as this long, in the
    /// view and when drawn alike.
    pub floor: f64,
}

impl Span {
    /// The span's length given its ends' values (`value(table, column)`), at least its floor.
    pub fn length(&self, value: impl Fn(usize, usize) -> Option<f64>) -> f64 {
        let length = value(self.end.table, self.end.column)
            .zip(value(self.start.table, self.start.column))
            .map_or(0.0, |(end, start)| end - start);
        length.max(self.floor)
    }
}

impl TableLayout {
    /// The columns of its own values (its place columns excluded).
    pub fn values(&self) -> usize {
        self.domain.columns.len() - if self.parent.is_some() { 2 } else { 0 }
    }

    /// Its partitions' domain, its rows as read before they are capped (`cap`): its own
    /// values, then (a child's) its own key's and its parent key's hashes.
    pub fn read_domain(&self) -> Domain {
        let mut domain = self.domain.clone();
        if self.parent.is_some() {
            domain.columns.truncate(self.values());
            domain.columns.extend([KEY_COLUMN, PARENT_KEY_COLUMN].map(|name| place_column(name, 1 << 52)));
        }
        domain
    }
}

impl Layout {
    pub fn of(db: &Database<'_>) -> Self {
        let root = TableLayout {
            name: db.root_name().to_string(),
            parent: None,
            max_per_parent: 1,
            domain: Domain::of_columns(&db.root_schema.columns, db.default_bins),
            within: Vec::new(),
            order_by: None,
        };
        let mut layout = Self { tables: vec![root], means: db.means, rates: db.rates };
        for table in db.tables {
            let parent = layout.tables.iter().position(|t| t.name == table.parent.table);
            let parent = parent.expect("a validated parent, declared first");
            let reach = layout.reach(parent) * u64::from(table.max_per_parent);
            let mut domain = Domain::of_columns(&table.columns, db.default_bins);
            domain.columns.extend([place_column(ROW_COLUMN, reach), place_column(PARENT_COLUMN, layout.reach(parent))]);
            layout.tables.push(TableLayout {
                name: table.name.clone(),
                parent: Some(parent),
                max_per_parent: table.max_per_parent,
                within: Vec::new(),
                order_by: table.order_by.as_deref().map(|o| domain.index_of(o).expect("a validated order column")),
                domain,
            });
        }
        // The intervals, once every table has its index.
        let columns = std::iter::once(&db.root_schema.columns).chain(db.tables.iter().map(|t| &t.columns));
        for (t, columns) in columns.enumerate() {
            let values = columns.iter().filter(|c| c.kind != ColumnKind::Identifier);
            let within = values.map(|c| c.within.as_deref().map(|text| layout.resolve(t, text))).collect();
            layout.tables[t].within = within;
        }
        layout
    }

    /// A validated `within` of a column of table `t`, by layout indices.
    fn resolve(&self, t: usize, text: &str) -> Within {
        let (start, end) = parse_within(text).expect("a validated interval");
        let at = |end: Option<WithinEnd>| {
            end.map(|end| {
                let table = end
                    .table
                    .map_or(t, |name| self.tables.iter().position(|t| t.name == name).expect("a validated table"));
                let column = self.tables[table].domain.index_of(&end.column).expect("a validated column");
                ColumnAt { table, column }
            })
        };
        Within { start: at(start), end: at(end) }
    }

    /// The most rows of table `t` one unit reaches (the product of the caps on its path).
    pub fn reach(&self, t: usize) -> u64 {
        self.reach_checked(t).expect("a layout a spec made: caps whose products fit in 32 bits")
    }

    /// [`Self::reach`], or `None` when it exceeds 2³².
    fn reach_checked(&self, t: usize) -> Option<u64> {
        let table = &self.tables[t];
        match table.parent {
            None => Some(1),
            Some(p) => self
                .reach_checked(p)?
                .checked_mul(u64::from(table.max_per_parent))
                .filter(|r| *r <= u64::from(u32::MAX)),
        }
    }

    /// The child columns whose mean over a row's children a view of table `t` holds, child
    /// table by child table in layout order: each plain numeric value column (not a time,
    /// not in an interval, not the table's order). What ties a row to its children at the
    /// row's sensitivity: their values are then drawn given it.
    pub fn summarised(&self, t: usize) -> Vec<ColumnAt> {
        if !self.means {
            return Vec::new();
        }
        let plain = |child: &TableLayout, c: usize| {
            let numeric = matches!(
                child.domain.columns[c].encoding,
                Encoding::Numeric { kind, .. } if kind != ColumnKind::Datetime
            );
            numeric && child.within.get(c).copied().flatten().is_none() && child.order_by != Some(c)
        };
        self.children(t)
            .flat_map(|table| {
                let child = &self.tables[table];
                (0..child.values()).filter(move |&c| plain(child, c)).map(move |column| ColumnAt { table, column })
            })
            .collect()
    }

    /// The interval child table `c`'s rows lie in, both ends values of its ancestors' rows:
    /// of its columns, its order's interval first, else the first declared. `None` without
    /// one, or with `rates` off. Public: from the spec alone.
    pub fn span(&self, c: usize) -> Option<Span> {
        if !self.rates {
            return None;
        }
        let table = &self.tables[c];
        let above = |at: Option<ColumnAt>| at.filter(|at| self.ancestors(c).any(|a| a == at.table));
        let spanned = table.order_by.into_iter().chain(0..table.values()).find_map(|column| {
            let within = self.within(c, column)?;
            above(within.start).zip(above(within.end))
        });
        let (start, end) = spanned?;
        let bound = |at: ColumnAt, high: bool| match &self.tables[at.table].domain.columns[at.column].encoding {
            Encoding::Numeric { min, max, .. } => Some(if high { *max } else { *min }),
            Encoding::Categorical { .. } => None,
        };
        let range = bound(end, true)? - bound(start, false)?;
        let floor = range * 2f64.powf(-f64::from(RATE_BINS - 1) / 2.0);
        (floor > 0.0).then_some(Span { start, end, floor })
    }

    /// How many columns describe a row of table `t` in its descendants' views: its own
    /// values, then its children's means ([`Self::summarised`]).
    pub fn described(&self, t: usize) -> usize {
        self.tables[t].values() + self.summarised(t).len()
    }

    /// The means of [`Self::summarised`]`(t)` over the children of each of `unit`'s rows of
    /// table `t` (a row's place in its table is its index there).
    fn means(&self, unit: &UnitRows, t: usize) -> Vec<Vec<Option<f64>>> {
        let summarised = self.summarised(t);
        let mut sums = vec![vec![(0.0, 0u32); summarised.len()]; unit.tables[t].len()];
        for (s, at) in summarised.iter().enumerate() {
            let parent = self.tables[at.table].values() + 1;
            for r in &unit.tables[at.table] {
                if let (Some(sum), Some(v)) = (sums.get_mut(place(r, parent) as usize), r[at.column]) {
                    sum[s].0 += v;
                    sum[s].1 += 1;
                }
            }
        }
        let mean = |(sum, n): (f64, u32)| (n > 0).then(|| sum / f64::from(n));
        sums.into_iter().map(|row| row.into_iter().map(mean).collect()).collect()
    }

    /// The child tables of table `t`, in layout order.
    pub fn children(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.tables.len()).filter(move |&c| self.tables[c].parent == Some(t))
    }

    /// The interval of own value column `c` of table `t`, if it has one.
    pub fn within(&self, t: usize, c: usize) -> Option<Within> {
        self.tables[t].within.get(c).copied().flatten()
    }

    /// Own value column `c` of table `t` as views hold it: its place in its interval (equal
    /// bins of the fraction with both ends; geometric bins of the distance from one end, up
    /// to the column's declared range), else as partitioned.
    pub fn view_column(&self, t: usize, c: usize) -> ColumnDomain {
        let raw = &self.tables[t].domain.columns[c];
        let (Some(within), Encoding::Numeric { min, max, binning, .. }) = (self.within(t, c), &raw.encoding) else {
            return raw.clone();
        };
        let bins = binning.len();
        let (max, binning) = match (within.start, within.end) {
            (Some(_), Some(_)) => (1.0, Binning::Real((0..=bins).map(|k| k as f64 / bins as f64).collect())),
            _ => (max - min, Binning::distances(max - min, bins as u32)),
        };
        let encoding = Encoding::Numeric { kind: ColumnKind::Continuous, min: 0.0, max, binning };
        // Missing where the value or an end may be.
        let ends = [within.start, within.end].into_iter().flatten();
        let missing = raw.missing || ends.into_iter().any(|at| self.tables[at.table].domain.columns[at.column].missing);
        ColumnDomain { name: raw.name.clone(), encoding, missing }
    }

    /// Own value column `c` of table `t` as views hold it, from the values of its row and
    /// its ancestors' rows (`value(table, column)`): its place in its interval (clamped into
    /// it; `None` when it or an end is missing), else its value.
    pub fn view_value(&self, t: usize, c: usize, value: impl Fn(usize, usize) -> Option<f64>) -> Option<f64> {
        let x = value(t, c);
        let Some(within) = self.within(t, c) else { return x };
        let x = x?;
        let range = match &self.tables[t].domain.columns[c].encoding {
            Encoding::Numeric { min, max, .. } => max - min,
            Encoding::Categorical { .. } => return None,
        };
        let end = |at: Option<ColumnAt>| at.map(|at| value(at.table, at.column));
        match (end(within.start), end(within.end)) {
            (Some(start), Some(end)) => {
                let (start, end) = (start?, end?);
                Some(if end > start { ((x - start) / (end - start)).clamp(0.0, 1.0) } else { 0.0 })
            }
            (Some(start), None) => Some((x - start?).clamp(0.0, range)),
            (None, Some(end)) => Some((end? - x).clamp(0.0, range)),
            (None, None) => Some(x),
        }
    }

    /// The value of own value column `c` of table `t` at `place` in its interval (as
    /// [`Self::view_value`] gives it), from its ends' values (`value(table, column)`, of its
    /// row and its ancestors' rows): what a sampler draws inside the interval. `None` when
    /// an end is missing.
    pub fn from_view_value(
        &self,
        t: usize,
        c: usize,
        place: f64,
        value: impl Fn(usize, usize) -> Option<f64>,
    ) -> Option<f64> {
        let Some(within) = self.within(t, c) else { return Some(place) };
        let end = |at: Option<ColumnAt>| at.map(|at| value(at.table, at.column));
        match (end(within.start), end(within.end)) {
            (Some(start), Some(end)) => {
                let (start, end) = (start?, end?);
                Some(start + place * (end - start).max(0.0))
            }
            (Some(start), None) => Some(start? + place),
            (None, Some(end)) => Some(end? - place),
            (None, None) => Some(place),
        }
    }

    /// A row of table `t` of `unit` and its ancestors' rows, by table (`None` for the
    /// tables off its path): up the tree, each ancestor's row by the place its child names.
    pub fn chain<'u>(
        &self,
        unit: &'u UnitRows,
        t: usize,
        row: &'u [Option<f64>],
    ) -> Result<Vec<Option<&'u [Option<f64>]>>, DataError> {
        let mut chain: Vec<Option<&[Option<f64>]>> = vec![None; self.tables.len()];
        chain[t] = Some(row);
        let (mut t, mut current) = (t, row);
        while let Some(p) = self.tables[t].parent {
            let parent = &self.tables[p];
            let wanted = match parent.parent {
                None => 0,
                Some(_) => place(current, self.tables[t].values() + 1) as usize,
            };
            let found = unit.tables[p].get(wanted).ok_or_else(|| {
                DataError::Internal(format!(
                    "a row of '{}' without its parent row in '{}'",
                    self.tables[t].name, parent.name
                ))
            })?;
            chain[p] = Some(found);
            (t, current) = (p, found);
        }
        Ok(chain)
    }

    /// The ancestors of table `t`, nearest first.
    pub fn ancestors(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.tables[t].parent, |&p| self.tables[p].parent)
    }
}

/// A view's columns of a child table's rows under a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChildColumn {
    /// The child table.
    pub table: usize,
    /// The view's column of their count.
    pub count: usize,
    /// With a span ([`Layout::span`]), the view's column of their rate over it.
    pub rate: Option<(usize, Span)>,
}

/// One unit's rows, table by table, each row as its partition holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UnitRows {
    pub tables: Vec<Vec<Vec<Option<f64>>>>,
}

/// A place column's value (an ordinal, never missing in a partition).
fn place(row: &[Option<f64>], column: usize) -> u32 {
    row[column].map_or(u32::MAX, |v| v as u32)
}

/// One table's rows, each with its place among its parent's rows, its ancestors' values
/// and its child tables' row counts under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The table's index in the layout (0: the root).
    pub table: usize,
}

impl View {
    /// At most this many rows of the view come from one unit.
    pub fn max_rows_per_unit(&self, layout: &Layout) -> u64 {
        layout.reach(self.table)
    }

    /// The view's columns: the table's own; for a child table [`POSITION_COLUMN`] and each
    /// ancestor's own and children's means, named `<table>.<column>`; then `__n.<child>`
    /// (and `__rate.<child>`, [`RATE_PREFIX`], with a span) for each child table and its children's
    /// means ([`MEAN_PREFIX`]).
    pub fn domain(&self, layout: &Layout) -> Domain {
        let table = &layout.tables[self.table];
        let mut columns: Vec<ColumnDomain> = (0..table.values()).map(|c| layout.view_column(self.table, c)).collect();
        if table.parent.is_some() {
            columns.push(count_column(POSITION_COLUMN, table.max_per_parent - 1));
        }
        if table.order_by.is_some() {
            columns.push(count_column(AFTER_COLUMN, table.max_per_parent - 1));
        }
        for a in layout.ancestors(self.table) {
            let ancestor = &layout.tables[a];
            columns.extend(
                (0..ancestor.values())
                    .map(|c| layout.view_column(a, c))
                    .chain(mean_columns(layout, a))
                    .map(|column| ColumnDomain { name: format!("{}.{}", ancestor.name, column.name), ..column }),
            );
        }
        if table.order_by.is_some() {
            columns.extend((0..table.values()).map(|c| {
                let column = layout.view_column(self.table, c);
                ColumnDomain { name: format!("{PREVIOUS_PREFIX}{}", column.name), missing: true, ..column }
            }));
        }
        for c in layout.children(self.table) {
            let child = &layout.tables[c];
            columns.push(count_column(&format!("{COUNT_PREFIX}{}", child.name), child.max_per_parent));
            columns.extend(
                layout
                    .span(c)
                    .map(|span| rate_column(&format!("{RATE_PREFIX}{}", child.name), child.max_per_parent, span)),
            );
        }
        columns.extend(mean_columns(layout, self.table));
        Domain { columns }
    }

    /// The view's columns of its children's means ([`Layout::summarised`]), its last.
    pub fn mean_columns(&self, layout: &Layout) -> std::ops::Range<usize> {
        let children = self.child_columns(layout);
        let start = children.last().map_or(self.previous_columns(layout).end, |c| c.rate.map_or(c.count, |r| r.0) + 1);
        start..start + layout.summarised(self.table).len()
    }

    /// Each child table's columns in the view: its rows under a row, and their rate over
    /// the row's span ([`Layout::span`]).
    pub fn child_columns(&self, layout: &Layout) -> Vec<ChildColumn> {
        let mut column = self.previous_columns(layout).end;
        (layout.children(self.table))
            .map(|table| {
                let span = layout.span(table);
                let child = ChildColumn { table, count: column, rate: span.map(|span| (column + 1, span)) };
                column += 1 + usize::from(span.is_some());
                child
            })
            .collect()
    }

    /// Each own value column of the view's table whose mean over its parent's rows the
    /// parent holds, with the view's column of that mean (among its parent's, the nearest
    /// ancestor's): a child's values are drawn given their mean.
    pub fn parent_means(&self, layout: &Layout) -> Vec<(usize, usize)> {
        let Some(p) = layout.tables[self.table].parent else { return Vec::new() };
        let start = self.ancestor_columns(layout).start + layout.tables[p].values();
        let summarised = layout.summarised(p);
        (summarised.iter().enumerate())
            .filter(|(_, at)| at.table == self.table)
            .map(|(s, at)| (at.column, start + s))
            .collect()
    }

    /// The view's columns of the previous sibling's own values (an ordered table's), in
    /// the order of its own: after its ancestors'.
    pub fn previous_columns(&self, layout: &Layout) -> std::ops::Range<usize> {
        let table = &layout.tables[self.table];
        let start = self.ancestor_columns(layout).end;
        start..start + if table.order_by.is_some() { table.values() } else { 0 }
    }

    /// The columns a sampler draws a row given: its ancestors' values and, in a sequence,
    /// its place, its rows after and its previous sibling's values.
    pub fn given_columns(&self, layout: &Layout) -> Vec<usize> {
        let mut given: Vec<usize> = self.ancestor_columns(layout).collect();
        if layout.tables[self.table].order_by.is_some() {
            let table = &layout.tables[self.table];
            given.extend([table.values(), table.values() + 1]);
            given.extend(self.previous_columns(layout));
        }
        given.sort_unstable();
        given
    }

    /// The view's columns of its table's ancestors, nearest first (after its own, its
    /// position and a sequence's rows after, as [`Self::domain`] lays them out): what a
    /// sampler conditions on.
    pub fn ancestor_columns(&self, layout: &Layout) -> std::ops::Range<usize> {
        let table = &layout.tables[self.table];
        let start = table.values() + usize::from(table.parent.is_some()) + usize::from(table.order_by.is_some());
        start..start + layout.ancestors(self.table).map(|a| layout.described(a)).sum::<usize>()
    }

    /// The view's column holding own value column `at.column` of ancestor table
    /// `at.table` (`None`: not an ancestor of the viewed table).
    pub fn ancestor_column(&self, layout: &Layout, at: ColumnAt) -> Option<usize> {
        let mut start = self.ancestor_columns(layout).start;
        for a in layout.ancestors(self.table) {
            if a == at.table {
                return (at.column < layout.tables[a].values()).then_some(start + at.column);
            }
            start += layout.described(a);
        }
        None
    }

    /// The view's rows of one unit (as `passes` reads it: places dense, one root
    /// row), in the order of the table's places.
    pub fn rows(&self, layout: &Layout, unit: &UnitRows) -> Result<Vec<Vec<Option<f64>>>, DataError> {
        let table = &layout.tables[self.table];
        let mut out = Vec::with_capacity(unit.tables[self.table].len());
        let mut positions: BTreeMap<u32, u32> = BTreeMap::new();
        // Each child table's rows under each row of this table, in one pass.
        let under: Vec<Vec<u32>> = layout
            .children(self.table)
            .map(|c| {
                let mut counts = vec![0u32; unit.tables[self.table].len()];
                let parent = layout.tables[c].values() + 1;
                for r in &unit.tables[c] {
                    if let Some(n) = counts.get_mut(place(r, parent) as usize) {
                        *n += 1;
                    }
                }
                counts
            })
            .collect();
        // The children's means of each row of this table and of its ancestors' tables.
        let tables = std::iter::once(self.table).chain(layout.ancestors(self.table));
        let mut means: BTreeMap<usize, Vec<Vec<Option<f64>>>> = tables.map(|t| (t, layout.means(unit, t))).collect();
        let spans: Vec<Option<Span>> = layout.children(self.table).map(|c| layout.span(c)).collect();
        // The last row seen under each parent row: the next one's previous sibling (rows come
        // in place order: by parent, then in their order under it).
        let mut previous: BTreeMap<u32, Vec<Option<f64>>> = BTreeMap::new();
        let mut siblings: BTreeMap<u32, u32> = BTreeMap::new();
        if table.parent.is_some() {
            unit.tables[self.table]
                .iter()
                .for_each(|row| *siblings.entry(place(row, table.values() + 1)).or_insert(0) += 1);
        }
        for (own, row) in unit.tables[self.table].iter().enumerate() {
            let chain = layout.chain(unit, self.table, row)?;
            let value = |t: usize, c: usize| chain[t].and_then(|row| row[c]);
            let viewed = |t: usize| (0..layout.tables[t].values()).map(move |c| layout.view_value(t, c, value));
            let mut values: Vec<Option<f64>> = viewed(self.table).collect();
            if table.parent.is_some() {
                let parent = place(row, table.values() + 1);
                let position = positions.entry(parent).or_insert(0);
                values.push(Some(f64::from(*position)));
                if table.order_by.is_some() {
                    values.push(Some(f64::from(siblings[&parent] - 1 - *position)));
                }
                *position += 1;
            }
            for a in layout.ancestors(self.table) {
                values.extend(viewed(a));
                // The ancestor's row by its place (the root's one row is the first).
                let index = match layout.tables[a].parent {
                    None => 0,
                    Some(_) => chain[a].map_or(0, |row| place(row, layout.tables[a].values()) as usize),
                };
                values.extend(means[&a].get(index).cloned().unwrap_or_else(|| vec![None; layout.summarised(a).len()]));
            }
            if table.order_by.is_some() {
                let mine: Vec<Option<f64>> = values[..table.values()].to_vec();
                let before = previous.insert(place(row, table.values() + 1), mine);
                values.extend(before.unwrap_or_else(|| vec![None; table.values()]));
            }
            for (counts, span) in under.iter().zip(&spans) {
                let count = f64::from(counts[own]);
                values.push(Some(count));
                values.extend(span.map(|span| Some(count / span.length(value))));
            }
            values.append(&mut means.get_mut(&self.table).expect("its own means")[own]);
            out.push(values);
        }
        Ok(out)
    }
}

/// The columns of table `t`'s children's means ([`Layout::summarised`]), each binned as
/// its child's column, missing where a row has no child with a value.
fn mean_columns(layout: &Layout, t: usize) -> impl Iterator<Item = ColumnDomain> + '_ {
    layout.summarised(t).into_iter().map(move |at| {
        let child = &layout.tables[at.table];
        let column = layout.view_column(at.table, at.column);
        ColumnDomain { name: format!("{MEAN_PREFIX}{}.{}", child.name, column.name), missing: true, ..column }
    })
}

/// A rate column: rows per unit of a span, up to `max` rows over the span's floor.
fn rate_column(name: &str, max: u32, span: Span) -> ColumnDomain {
    let max = f64::from(max.max(1)) / span.floor;
    let binning = Binning::distances(max, RATE_BINS);
    let encoding = Encoding::Numeric { kind: ColumnKind::Continuous, min: 0.0, max, binning };
    ColumnDomain { name: name.to_string(), encoding, missing: false }
}

/// A place column: ordinals below `reach`, one bin (a place is never a modelled value).
fn place_column(name: &str, reach: u64) -> ColumnDomain {
    let max = reach.saturating_sub(1) as f64;
    let binning = Binning::Integer(vec![(0, max as i64)]);
    let encoding = Encoding::Numeric { kind: ColumnKind::Integer, min: 0.0, max, binning };
    ColumnDomain { name: name.to_string(), encoding, missing: false }
}

/// An integer column of the counts 0..=`max`, one bin per count up to 32 of them.
fn count_column(name: &str, max: u32) -> ColumnDomain {
    let spec = ColumnSpec {
        name: name.to_string(),
        kind: ColumnKind::Integer,
        min: Some(Bound::Number(0.0)),
        max: Some(Bound::Number(f64::from(max.max(1)))),
        categories: None,
        unknown: UnknownPolicy::Reject,
        missing: MissingPolicy::Reject,
        bins: None,
        format: None,
        within: None,
    };
    Domain::of_columns(&[spec], 32).columns.remove(0)
}

/// A view of a database's partitions: what a count task reads instead of one table's
/// partitions (`MarginalsTask::database`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatabaseView {
    pub layout: Layout,
    pub view: View,
}

impl DatabaseView {
    /// Whether the layout is one a spec makes (the root first, each parent before its
    /// children, caps of at least 1) and the view one of its tables.
    pub fn is_consistent(&self) -> bool {
        let tables = &self.layout.tables;
        let well_formed = tables.iter().enumerate().all(|(t, table)| match table.parent {
            None => t == 0 && table.max_per_parent == 1 && table.order_by.is_none(),
            Some(p) => {
                p < t
                    && table.max_per_parent >= 1
                    && table.domain.columns.len() >= 2
                    && table.order_by.is_none_or(|o| o < table.values())
            }
        });
        // Each interval's ends: numeric columns of the row (declared before it) or of an
        // ancestor's row.
        // (Numeric with finite bounds in order: a place in an interval is clamped to them.)
        let numeric = |t: usize, c: usize| {
            let bounded = |min: f64, max: f64| min.is_finite() && max.is_finite() && min <= max;
            matches!(tables[t].domain.columns.get(c).map(|c| &c.encoding), Some(Encoding::Numeric { min, max, .. }) if bounded(*min, *max))
                && c < tables[t].values()
        };
        // (After the parents are known to come first: `ancestors` then ends.)
        let intervals = || {
            tables.iter().enumerate().all(|(t, table)| {
                (table.within.is_empty() || table.within.len() == table.values())
                    && table.within.iter().enumerate().all(|(c, within)| {
                        within.is_none_or(|w| {
                            let end_ok = |at: Option<ColumnAt>| {
                                at.is_none_or(|at| {
                                    let reachable = if at.table == t {
                                        at.column < c
                                    } else {
                                        at.table < tables.len() && self.layout.ancestors(t).any(|a| a == at.table)
                                    };
                                    reachable && numeric(at.table, at.column)
                                })
                            };
                            numeric(t, c) && (w.start.is_some() || w.end.is_some()) && end_ok(w.start) && end_ok(w.end)
                        })
                    })
            })
        };
        well_formed
            && !tables.is_empty()
            && self.view.table < tables.len()
            && (0..tables.len()).try_fold(1u64, |most, t| Some(most.max(self.layout.reach_checked(t)?))).is_some()
            && intervals()
    }

    /// The view's rows of the units in `urls` (the same partition index of every table, in
    /// layout order), a batch at a time.
    pub async fn reader<'a>(&'a self, urls: &'a [String]) -> Result<ViewReader<'a>, DataError> {
        Ok(ViewReader {
            view: self,
            columns: self.view.domain(&self.layout).columns.len(),
            passes: PassReader::open(&self.layout, urls, PASS_BYTES).await?,
            units: BTreeMap::new().into_iter(),
            next: None,
        })
    }
}

/// A view's rows of a partition, a batch at a time, each unit's rows whole in one batch
/// (a counter counts a unit as its batch ends: `Counter::add`). What it holds is one
/// pass's capped units ([`PASS_BYTES`]) and a batch.
pub struct ViewReader<'a> {
    view: &'a DatabaseView,
    columns: usize,
    passes: PassReader<'a>,
    /// The units of the pass being read, still to view.
    units: std::collections::btree_map::IntoIter<String, UnitRows>,
    /// A unit's view rows that did not fit the last batch: the next one's first.
    next: Option<(String, Vec<Vec<Option<f64>>>)>,
}

impl ViewReader<'_> {
    /// The next batch of at most [`BATCH_ROWS`] rows (or one unit's, if more), `None` at the
    /// end.
    pub async fn next_batch(&mut self) -> Result<Option<EncodedBatch>, DataError> {
        let (layout, view) = (&self.view.layout, &self.view.view);
        let mut batch = EncodedBatch::empty(self.columns);
        loop {
            let (unit, rows) = match self.next.take() {
                Some(next) => next,
                None => match self.units.next() {
                    Some((unit, rows)) => (unit, view.rows(layout, &rows)?),
                    None if !batch.units.is_empty() => return Ok(Some(batch)),
                    None => match self.passes.next_pass().await? {
                        Some(units) => {
                            self.units = units.into_iter();
                            continue;
                        }
                        None => {
                            self.log_read();
                            return Ok(None);
                        }
                    },
                },
            };
            if !batch.units.is_empty() && batch.units.len() + rows.len() > BATCH_ROWS {
                self.next = Some((unit, rows));
                return Ok(Some(batch));
            }
            for row in rows {
                batch.values.iter_mut().zip(row).for_each(|(column, value)| column.push(value));
                batch.units.push(unit.clone());
            }
        }
    }

    /// Counts of the input: the operator's log only, once a partition and job (every view
    /// of it reads the same rows; the root's is counted first), again if its task is
    /// retried; and how many readings its passes took (a partition that fills many wants
    /// more partitions).
    fn log_read(&self) {
        tracing::info!(table = self.view.view.table, readings = self.passes.readings(), "a partition's view read");
        if self.view.view.table != 0 {
            return;
        }
        for (table, d) in self.view.layout.tables.iter().zip(self.passes.dropped()) {
            let DroppedRows { over_cap, without_parent, duplicate_keys, .. } = d;
            tracing::info!(
                table = table.name,
                over_cap,
                without_parent,
                duplicate_keys,
                "rows a partition's cap left out"
            );
        }
    }
}
