//! A unit's history as tokens, over a vocabulary built from the declared schema alone.
//!
//! A sequence is `START LENGTH statics row* [EOH]`:
//! - START is `BOS` when it begins the history, `MID OFFSET` when it is a window of one
//!   begun earlier, OFFSET one of [`Layout::offsets`] tokens for how many of the history's
//!   rows came before the window (in equal buckets of the public row cap), so a window
//!   knows how far into its history it is;
//! - LENGTH is the history's length, in the same number of equal buckets of the cap: the
//!   model draws it first, as one categorical, and the grammar then ends the history
//!   inside that bucket (a length learned as an end-of-history rate at every row comes out
//!   geometric);
//! - the static columns appear once, the others once per row;
//! - each value is a *field*: one token per bin of its column (the missing bin included),
//!   then, for a numeric bin holding more than one value, one of [`Layout::fine`]
//!   refinement tokens *of that column* for its position inside the bin (uniform
//!   sub-cells). A column's own refinement tokens let attention find the previous row's
//!   value of the same column by content: where a column's within-unit variation lies
//!   inside one or two of its bins, its dynamics live in the refinements (layouts saved
//!   before shared one set of refinement tokens, and still read so);
//! - with an order column, a row begins with it: the first row of a sequence carries its
//!   value, later rows the gap to the previous row, in public gap bins (geometric between
//!   0 and the column's declared range, or declared edges);
//! - `EOH` ends the history, after at least one row and at most `max_rows`.
//!
//! [`Cursor`] is the grammar: at every position it names the valid next tokens, so the
//! model's training loss and its sampling are both restricted to them, and every sequence
//! it accepts parses to rows ([`Cursor::advance`] builds them as it goes).

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::spec::ColumnKind;

/// Begins a history.
pub const BOS: u32 = 0;
/// Begins a window that starts inside a history.
pub const MID: u32 = 1;
/// Ends a history.
pub const EOH: u32 = 2;
const SPECIAL: u32 = 3;

/// A token the grammar does not allow where it stands.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("token {token} is not valid at position {position}")]
pub struct ParseError {
    pub token: u32,
    pub position: usize,
}

/// How a sequence starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Start {
    /// At the history's beginning (`BOS`).
    History,
    /// Inside the history, after `rows_before` of its rows (`MID OFFSET`).
    Window { rows_before: usize },
}

/// One value's tokens: its bins and whether a bin is refined.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct FieldTokens {
    /// First bin token.
    offset: u32,
    /// Value bins (the missing bin, if any, is `bins`).
    binning: Option<Binning>,
    bins: u32,
    missing: bool,
    integer: bool,
    /// First of this field's own refinement tokens; `None`: the set every field shared in
    /// layouts saved before (from `SPECIAL`).
    #[serde(default)]
    fine_offset: Option<u32>,
}

impl FieldTokens {
    fn of_column(column: &ColumnDomain, offset: u32) -> Self {
        let (binning, integer) = match &column.encoding {
            Encoding::Categorical { .. } => (None, false),
            Encoding::Numeric { kind, binning, .. } => (Some(binning.clone()), *kind == ColumnKind::Integer),
        };
        let bins = (column.bins() - usize::from(column.missing)) as u32;
        Self { offset, binning, bins, missing: column.missing, integer, fine_offset: None }
    }

    fn tokens(&self) -> Range<u32> {
        self.offset..self.offset + self.bins + u32::from(self.missing)
    }

    /// Gives a numeric field its own `fine` refinement tokens from `next`; returns the
    /// next free token.
    fn with_refinements(mut self, next: u32, fine: u32) -> (Self, u32) {
        if self.binning.is_none() {
            return (self, next);
        }
        self.fine_offset = Some(next);
        (self, next + fine)
    }

    /// The first refinement token of this field.
    fn fine_start(&self) -> u32 {
        self.fine_offset.unwrap_or(SPECIAL)
    }

    /// Refinement levels of a bin (0: the bin is one value, or missing, or a category).
    fn levels(&self, bin: u32, fine: u32) -> u32 {
        match &self.binning {
            Some(Binning::Integer(ranges)) if bin < self.bins => {
                let (lo, hi) = ranges[bin as usize];
                let values = (hi - lo + 1) as u64;
                if values <= 1 { 0 } else { values.min(u64::from(fine)) as u32 }
            }
            Some(Binning::Real(_)) if bin < self.bins => fine,
            _ => 0,
        }
    }

    /// Bin and refinement of a value (categorical: its code; numeric: clamped already).
    fn encode(&self, value: Option<f64>, fine: u32) -> (u32, Option<u32>) {
        let Some(v) = value else { return (self.bins, None) };
        let bin = match &self.binning {
            None => (v as u32).min(self.bins - 1),
            Some(b) => b.bin(v) as u32,
        };
        let levels = self.levels(bin, fine);
        let refined = match &self.binning {
            Some(Binning::Integer(ranges)) if levels > 0 => {
                let (lo, hi) = ranges[bin as usize];
                let values = (hi - lo + 1) as f64;
                Some((((v.round() - lo as f64) * f64::from(levels) / values).floor() as u32).min(levels - 1))
            }
            Some(Binning::Real(edges)) if levels > 0 => {
                let (lo, hi) = (edges[bin as usize], edges[bin as usize + 1]);
                Some((((v - lo) / (hi - lo) * f64::from(levels)).floor().max(0.0) as u32).min(levels - 1))
            }
            _ => None,
        };
        (bin, refined)
    }

    /// The value a bin and refinement stand for: the middle of the sub-cell.
    fn decode(&self, bin: u32, refined: Option<u32>, fine: u32) -> Option<f64> {
        if bin >= self.bins {
            return None;
        }
        let levels = self.levels(bin, fine);
        let f = f64::from(refined.unwrap_or(0));
        Some(match &self.binning {
            None => f64::from(bin),
            Some(Binning::Integer(ranges)) => {
                let (lo, hi) = ranges[bin as usize];
                if levels == 0 {
                    lo as f64
                } else {
                    let values = (hi - lo + 1) as f64;
                    lo as f64 + ((f + 0.5) * values / f64::from(levels)).floor()
                }
            }
            Some(Binning::Real(edges)) => {
                let (lo, hi) = (edges[bin as usize], edges[bin as usize + 1]);
                lo + (f + 0.5) / f64::from(levels.max(1)) * (hi - lo)
            }
        })
        .map(|v| if self.integer { v.round() } else { v })
    }
}

/// Which value a field holds.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Field {
    /// A domain column's value.
    Column(usize),
    /// The order column's gap to the previous row.
    Gap,
}

/// The token layout of a job's histories, from its domain and declared choices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    columns: Vec<FieldTokens>,
    /// Domain indices written once per history.
    statics: Vec<usize>,
    /// Domain indices written in every row after the order column.
    row_columns: Vec<usize>,
    /// The order column's domain index, and its gap tokens.
    order: Option<(usize, FieldTokens)>,
    /// Refinement levels of a numeric bin.
    pub fine: u32,
    /// Most rows of a history.
    pub max_rows: usize,
    /// Offset tokens (buckets of rows before a window) from id `offset_start`, then as many
    /// length tokens (buckets of a history's rows).
    pub offsets: u32,
    offset_start: u32,
    vocabulary: u32,
}

/// Most offset (and length) tokens: histories with more rows share buckets.
const MAX_OFFSETS: usize = 32;

impl Layout {
    /// `order`: the order column and its gap bins; `statics`: columns written once.
    pub fn new(
        domain: &Domain,
        order: Option<(usize, Binning)>,
        statics: &[usize],
        fine: u32,
        max_rows: usize,
    ) -> Self {
        let mut next = SPECIAL;
        let columns: Vec<FieldTokens> = domain
            .columns
            .iter()
            .map(|c| {
                let bins = FieldTokens::of_column(c, next);
                let (field, end) = bins.clone().with_refinements(bins.tokens().end, fine);
                next = end;
                field
            })
            .collect();
        let order = order.map(|(index, binning)| {
            let column = &domain.columns[index];
            let integer = matches!(column.encoding, Encoding::Numeric { kind: ColumnKind::Integer, .. });
            let bins = binning.len() as u32;
            let gap = FieldTokens {
                offset: next,
                binning: Some(binning),
                bins,
                missing: column.missing,
                integer,
                fine_offset: None,
            };
            let (gap, end) = gap.clone().with_refinements(gap.tokens().end, fine);
            next = end;
            (index, gap)
        });
        let order_index = order.as_ref().map(|(i, _)| *i);
        let row_columns =
            (0..domain.columns.len()).filter(|c| !statics.contains(c) && Some(*c) != order_index).collect();
        let offsets = max_rows.clamp(1, MAX_OFFSETS) as u32;
        let vocabulary = next + 2 * offsets;
        let statics = statics.to_vec();
        Self { columns, statics, row_columns, order, fine, max_rows, offsets, offset_start: next, vocabulary }
    }

    /// The bucket of `n` of `max_rows` (0 ≤ n < max_rows).
    fn bucket(&self, n: usize) -> u32 {
        (n.min(self.max_rows - 1) * self.offsets as usize / self.max_rows.max(1)) as u32
    }

    /// The offset token of a window after `rows_before` rows of its history.
    fn offset_token(&self, rows_before: usize) -> u32 {
        self.offset_start + self.bucket(rows_before)
    }

    fn length_start(&self) -> u32 {
        self.offset_start + self.offsets
    }

    /// The length token of a history of `rows` rows (1 ≤ rows ≤ max_rows).
    pub fn length_token(&self, rows: usize) -> u32 {
        self.length_start() + self.bucket(rows.max(1) - 1)
    }

    /// The history lengths a length token stands for, as an inclusive range.
    pub fn lengths(&self, token: u32) -> (usize, usize) {
        let bucket = token - self.length_start();
        let mut lengths = (1..=self.max_rows).filter(|&n| self.bucket(n - 1) == bucket);
        let first = lengths.next().expect("every length bucket holds a length");
        (first, lengths.next_back().unwrap_or(first))
    }

    pub fn vocabulary(&self) -> usize {
        self.vocabulary as usize
    }

    /// The lag-1 input where a token has none; lag-1 inputs are token ids or this.
    pub fn no_lag(&self) -> u32 {
        self.vocabulary
    }

    /// The size of each table of lag-1 inputs (bins, refinements).
    pub fn lag_inputs(&self) -> Vec<usize> {
        vec![self.vocabulary as usize + 1; 2]
    }

    /// Columns of a row of output (the domain's).
    pub fn width(&self) -> usize {
        self.columns.len()
    }

    /// Most tokens one row takes.
    pub fn max_row_tokens(&self) -> usize {
        let field = |f: &FieldTokens| 1 + usize::from(f.binning.is_some());
        let order = self.order.as_ref().map_or(0, |(_, gap)| field(gap).max(field(&self.columns[self.order_index()])));
        order + self.row_columns.iter().map(|&c| field(&self.columns[c])).sum::<usize>()
    }

    /// Most tokens a sequence of `rows` rows takes, START (with its offset), LENGTH and
    /// EOH included.
    pub fn max_tokens(&self, rows: usize) -> usize {
        let statics: usize = self.statics.iter().map(|&c| 1 + usize::from(self.columns[c].binning.is_some())).sum();
        4 + statics + rows * self.max_row_tokens()
    }

    /// The order column's domain index.
    pub fn order_column(&self) -> Option<usize> {
        self.order.as_ref().map(|(i, _)| *i)
    }

    fn order_index(&self) -> usize {
        self.order.as_ref().map_or(usize::MAX, |(i, _)| *i)
    }

    fn field_tokens(&self, field: Field) -> &FieldTokens {
        match field {
            Field::Column(c) => &self.columns[c],
            Field::Gap => &self.order.as_ref().expect("a gap field implies an order column").1,
        }
    }

    /// Fields of the `row`-th row of a sequence.
    fn row_fields(&self, row: usize) -> impl Iterator<Item = Field> + '_ {
        let first = self.order.as_ref().map(|(index, _)| if row == 0 { Field::Column(*index) } else { Field::Gap });
        first.into_iter().chain(self.row_columns.iter().map(|&c| Field::Column(c)))
    }

    /// Appends a field's tokens; returns the value they decode to.
    fn push_field(&self, field: Field, value: Option<f64>, out: &mut Vec<u32>) -> Option<f64> {
        let tokens = self.field_tokens(field);
        let (bin, refined) = tokens.encode(value, self.fine);
        out.push(tokens.offset + bin);
        out.extend(refined.map(|f| tokens.fine_start() + f));
        tokens.decode(bin, refined, self.fine)
    }

    /// Appends the static columns' tokens of a history (`value(c)`: its first row's value
    /// of domain column `c`).
    pub fn push_statics(&self, value: impl Fn(usize) -> Option<f64>, out: &mut Vec<u32>) {
        for &c in &self.statics {
            self.push_field(Field::Column(c), value(c), out);
        }
    }

    /// Appends a row's tokens after its order field (`value(c)`: the row's value of domain
    /// column `c`).
    pub fn push_row(&self, value: impl Fn(usize) -> Option<f64>, out: &mut Vec<u32>) {
        for &c in &self.row_columns {
            self.push_field(Field::Column(c), value(c), out);
        }
    }

    /// How many of `tokens` the fields in `fields` take from their start (a bin, and its
    /// refinement where the bin has levels).
    fn fields_len(&self, fields: impl Iterator<Item = Field>, tokens: &[u32]) -> usize {
        fields.fold(0, |at, field| {
            let field = self.field_tokens(field);
            at + 1 + usize::from(field.levels(tokens[at] - field.offset, self.fine) > 0)
        })
    }

    /// How many tokens the static columns take at the start of `tokens` (as
    /// [`Layout::push_statics`] wrote them).
    pub fn statics_len(&self, tokens: &[u32]) -> usize {
        self.fields_len(self.statics.iter().map(|&c| Field::Column(c)), tokens)
    }

    /// How many tokens the row at the start of `tokens` takes (as [`Layout::push_row`]
    /// wrote it).
    pub fn row_len(&self, tokens: &[u32]) -> usize {
        self.fields_len(self.row_columns.iter().map(|&c| Field::Column(c)), tokens)
    }

    /// The order field's tokens of a sequence's `row`-th row (its value for the first row,
    /// else its gap to `previous`, the last order value as decoded), and the value they
    /// decode to: gaps are taken from decoded values, so rounding never accumulates.
    pub fn order_tokens(&self, row: usize, value: Option<f64>, previous: Option<f64>) -> (Vec<u32>, Option<f64>) {
        let mut out = Vec::new();
        let Some((index, _)) = &self.order else { return (out, None) };
        let decoded = if row == 0 {
            self.push_field(Field::Column(*index), value, &mut out)
        } else {
            let base = previous.unwrap_or_else(|| self.order_min());
            let gap = self.push_field(Field::Gap, value.map(|v| (v - base).max(0.0)), &mut out);
            gap.map(|g| (base + g).min(self.order_max()))
        };
        (out, decoded)
    }

    fn order_min(&self) -> f64 {
        match self.order.as_ref().map(|(i, _)| &self.columns[*i].binning) {
            Some(Some(Binning::Integer(r))) => r[0].0 as f64,
            Some(Some(Binning::Real(e))) => e[0],
            _ => 0.0,
        }
    }

    fn order_max(&self) -> f64 {
        match self.order.as_ref().map(|(i, _)| &self.columns[*i].binning) {
            Some(Some(Binning::Integer(r))) => r[r.len() - 1].1 as f64,
            Some(Some(Binning::Real(e))) => e[e.len() - 1],
            _ => f64::INFINITY,
        }
    }

    /// A sequence of whole rows of a history of `length` rows: `start`, the length, the
    /// static columns of `statics` (the history's first row), rows (values in domain
    /// order), and EOH when `end`.
    pub fn encode(
        &self,
        start: Start,
        length: usize,
        statics: &[Option<f64>],
        rows: &[Vec<Option<f64>>],
        end: bool,
    ) -> Vec<u32> {
        let mut static_tokens = Vec::new();
        self.push_statics(|c| statics[c], &mut static_tokens);
        let order = self.order_column();
        let rows = rows.iter().map(|row| {
            let mut tokens = Vec::new();
            self.push_row(|c| row[c], &mut tokens);
            (order.and_then(|i| row[i]), tokens)
        });
        self.encode_tokens(start, length, &static_tokens, rows, end)
    }

    /// [`Layout::encode`] from tokens: the static columns' tokens, and each row's order
    /// value with its tokens after the order field. The order fields are written here, as
    /// they depend on where the sequence starts: its first row's value, then gaps.
    pub fn encode_tokens<R: AsRef<[u32]>>(
        &self,
        start: Start,
        length: usize,
        statics: &[u32],
        rows: impl IntoIterator<Item = (Option<f64>, R)>,
        end: bool,
    ) -> Vec<u32> {
        let mut out = match start {
            Start::History => vec![BOS],
            Start::Window { rows_before } => vec![MID, self.offset_token(rows_before)],
        };
        out.push(self.length_token(length));
        out.extend_from_slice(statics);
        let mut previous = None;
        for (r, (order, tokens)) in rows.into_iter().enumerate() {
            let (order_tokens, decoded) = self.order_tokens(r, order, previous);
            out.extend(order_tokens);
            previous = decoded.or(previous);
            out.extend_from_slice(tokens.as_ref());
        }
        if end {
            out.push(EOH);
        }
        out
    }

    /// Parses a sequence (START … EOH or a prefix of whole rows) that follows
    /// `rows_before` rows of its history into rows.
    pub fn parse(&self, tokens: &[u32], rows_before: usize) -> Result<Vec<Vec<Option<f64>>>, ParseError> {
        let mut cursor = Cursor::new(self, rows_before);
        for (position, &token) in tokens.iter().enumerate() {
            cursor.advance(token).map_err(|_| ParseError { token, position })?;
        }
        Ok(cursor.rows)
    }
}

/// Where a cursor stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    Start,
    /// After MID: the window's offset.
    Offset,
    /// The history's length.
    Length,
    /// The i-th static field.
    Static(usize),
    /// Between rows (or before the first): a row's first token, or EOH.
    Boundary,
    /// The i-th field of the current row.
    Row(usize),
    /// The refinement token of a field's bin: `levels` of them valid, from `start`.
    Fine {
        start: u32,
        levels: u32,
    },
    Done,
}

/// A row field's tokens, kept for the next row's lag-1 inputs.
#[derive(Clone, Copy, Debug)]
struct Lagged {
    field: Field,
    bin: Option<u32>,
    refinement: Option<u32>,
}

/// The grammar, walked token by token: what may come next, and the rows read so far.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    layout: &'a Layout,
    stage: Stage,
    /// Stage to go to after a refinement token, and the field it refines.
    after_fine: Option<(Stage, Field, u32)>,
    /// Rows of the history before this sequence.
    rows_before: usize,
    /// The lengths the history may have (once its length token is read).
    lengths: (usize, usize),
    statics: Vec<Option<f64>>,
    /// Rows read so far, in domain order (statics filled in when a row starts).
    pub rows: Vec<Vec<Option<f64>>>,
    /// Last known order value.
    previous: Option<f64>,
    /// Per field of a row, which field it is and its bin and refinement tokens, in the
    /// last complete row and in the current one: the lag-1 inputs ([`Cursor::lagged`]).
    last_row: Vec<Lagged>,
    this_row: Vec<Lagged>,
}

impl<'a> Cursor<'a> {
    /// A cursor at the start of a sequence that follows `rows_before` rows of its history.
    pub fn new(layout: &'a Layout, rows_before: usize) -> Self {
        Self {
            layout,
            stage: Stage::Start,
            after_fine: None,
            rows_before,
            lengths: (1, layout.max_rows),
            statics: vec![None; layout.width()],
            rows: Vec::new(),
            previous: None,
            last_row: Vec::new(),
            this_row: Vec::new(),
        }
    }

    /// The lag-1 inputs of the next token: the bin and the refinement tokens the same
    /// field took in the previous row, each [`Layout::no_lag`] where there is none (no
    /// previous row in this sequence, no refinement, statics, the start). They let the
    /// model read a value's predecessor directly, at full resolution, whatever the tokens
    /// between them, so a few hundred rounds learn what a history does over time.
    pub fn lagged(&self) -> [u32; 2] {
        let none = self.layout.no_lag();
        // The previous row's tokens of `field` at slot i: none where that slot held another
        // field (a sequence's first row carries the order value, later rows its gap).
        let slot = |row: &[Lagged], i: usize, field: Field| match row.get(i) {
            Some(lagged) if lagged.field == field => [lagged.bin.unwrap_or(none), lagged.refinement.unwrap_or(none)],
            _ => [none, none],
        };
        match (self.stage, self.after_fine) {
            (Stage::Row(i), _) => match self.field(Stage::Row(i)) {
                Some(field) => slot(&self.last_row, i, field),
                None => [none, none],
            },
            (Stage::Fine { .. }, Some((Stage::Row(i), field, _))) => slot(&self.last_row, i, field),
            (Stage::Boundary, _) if !self.this_row.is_empty() => slot(&self.this_row, 0, self.first_row_field()),
            _ => [none, none],
        }
    }

    pub fn is_done(&self) -> bool {
        self.stage == Stage::Done
    }

    /// The lengths the history may have: once its length token is read, that bucket's.
    pub fn history_lengths(&self) -> (usize, usize) {
        self.lengths
    }

    /// Holds the history to exactly `rows` rows, one of its length token's (a length drawn
    /// from a released histogram rather than by the model).
    pub fn hold_length(&mut self, rows: usize) {
        assert!((self.lengths.0..=self.lengths.1).contains(&rows), "{rows} rows is not in {:?}", self.lengths);
        self.lengths = (rows, rows);
    }

    /// The order value the next gap counts from.
    pub fn clock(&self) -> f64 {
        self.previous.unwrap_or_else(|| self.layout.order_min())
    }

    /// Whether the cursor stands between rows (a row may start or the history end).
    pub fn at_boundary(&self) -> bool {
        self.stage == Stage::Boundary
    }

    fn field(&self, stage: Stage) -> Option<Field> {
        match stage {
            Stage::Static(i) => Some(Field::Column(self.layout.statics[i])),
            Stage::Row(i) => self.layout.row_fields(self.rows.len() - 1).nth(i),
            _ => None,
        }
    }

    fn first_row_field(&self) -> Field {
        self.layout.row_fields(self.rows.len()).next().expect("a row has at least one field")
    }

    /// The valid next tokens, as ranges of ids.
    pub fn allowed(&self) -> Vec<Range<u32>> {
        match self.stage {
            Stage::Start => std::iter::once(BOS..MID + 1).collect(),
            Stage::Offset => std::iter::once(self.layout.offset_start..self.layout.length_start()).collect(),
            // A length of at least one row after those before.
            Stage::Length => {
                std::iter::once(self.layout.length_token(self.rows_before + 1)..self.layout.vocabulary).collect()
            }
            Stage::Static(_) | Stage::Row(_) => {
                vec![self.layout.field_tokens(self.field(self.stage).expect("a field stage")).tokens()]
            }
            Stage::Boundary if self.rows_before + self.rows.len() >= self.lengths.1 => {
                std::iter::once(EOH..EOH + 1).collect()
            }
            // A sequence has at least one row, a history at least its length's first.
            Stage::Boundary if self.rows.is_empty() || self.rows_before + self.rows.len() < self.lengths.0 => {
                std::iter::once(self.layout.field_tokens(self.first_row_field()).tokens()).collect()
            }
            Stage::Boundary => vec![EOH..EOH + 1, self.layout.field_tokens(self.first_row_field()).tokens()],
            Stage::Fine { start, levels } => std::iter::once(start..start + levels).collect(),
            Stage::Done => Vec::new(),
        }
    }

    fn is_allowed(&self, token: u32) -> bool {
        self.allowed().iter().any(|r| r.contains(&token))
    }

    /// The stage after the field at `stage` is complete.
    fn after(&self, stage: Stage) -> Stage {
        match stage {
            Stage::Static(i) if i + 1 < self.layout.statics.len() => Stage::Static(i + 1),
            Stage::Static(_) => Stage::Boundary,
            Stage::Row(i) if i + 1 < self.layout.row_fields(self.rows.len() - 1).count() => Stage::Row(i + 1),
            _ => Stage::Boundary,
        }
    }

    /// Stores a field's value.
    fn store(&mut self, field: Field, value: Option<f64>, stage: Stage) {
        match (stage, field) {
            (Stage::Static(_), Field::Column(c)) => self.statics[c] = value,
            (_, Field::Column(c)) => {
                let value = match (Some(c) == self.layout.order.as_ref().map(|(i, _)| *i), value) {
                    (true, Some(v)) => {
                        self.previous = Some(v);
                        Some(v)
                    }
                    _ => value,
                };
                self.rows.last_mut().expect("a row is open")[c] = value;
            }
            (_, Field::Gap) => {
                let index = self.layout.order_index();
                let value = value.map(|gap| {
                    let v = self.previous.unwrap_or_else(|| self.layout.order_min()) + gap;
                    v.min(self.layout.order_max())
                });
                if value.is_some() {
                    self.previous = value;
                }
                self.rows.last_mut().expect("a row is open")[index] = value;
            }
        }
    }

    /// Consumes one token; refused if the grammar does not allow it here.
    pub fn advance(&mut self, token: u32) -> Result<(), ParseError> {
        if !self.is_allowed(token) {
            return Err(ParseError { token, position: 0 });
        }
        let first_field = if self.layout.statics.is_empty() { Stage::Boundary } else { Stage::Static(0) };
        match self.stage {
            Stage::Start if token == MID => self.stage = Stage::Offset,
            Stage::Start | Stage::Offset => self.stage = Stage::Length,
            Stage::Length => {
                self.lengths = self.layout.lengths(token);
                self.stage = first_field;
            }
            Stage::Boundary if token == EOH => self.stage = Stage::Done,
            Stage::Boundary | Stage::Static(_) | Stage::Row(_) => {
                let stage = if self.stage == Stage::Boundary {
                    self.rows.push(self.statics.clone());
                    self.last_row = std::mem::take(&mut self.this_row);
                    Stage::Row(0)
                } else {
                    self.stage
                };
                let field = self.field(stage).expect("a field stage");
                if let Stage::Row(i) = stage {
                    let unset = Lagged { field, bin: None, refinement: None };
                    self.this_row.resize(self.this_row.len().max(i + 1), unset);
                    self.this_row[i] = Lagged { field, bin: Some(token), refinement: None };
                }
                let tokens = self.layout.field_tokens(field);
                let bin = token - tokens.offset;
                let levels = tokens.levels(bin, self.layout.fine);
                if levels > 0 {
                    self.after_fine = Some((stage, field, bin));
                    self.stage = Stage::Fine { start: tokens.fine_start(), levels };
                } else {
                    let value = tokens.decode(bin, None, self.layout.fine);
                    self.store(field, value, stage);
                    self.stage = self.after(stage);
                }
            }
            Stage::Fine { start, .. } => {
                let (stage, field, bin) = self.after_fine.take().expect("a refinement follows a bin");
                if let Stage::Row(i) = stage {
                    self.this_row[i].refinement = Some(token);
                }
                let value = self.layout.field_tokens(field).decode(bin, Some(token - start), self.layout.fine);
                self.store(field, value, stage);
                self.stage = self.after(stage);
            }
            Stage::Done => unreachable!("nothing is allowed after EOH"),
        }
        Ok(())
    }
}
