//! Streaming the private input (CSV or Parquet, from any object store) in record batches
//! and encoding each value against the public schema. Memory is bounded by the batch
//! size. A row that breaks the schema either stops the job with an error naming file,
//! column and row, is left out, or has its bad values read as missing ([`BadRows`]). Values are never echoed into errors or
//! logs: they are private. Such an error is itself row-level and private (it says where a
//! row breaks the schema): the coordinator logs it for its operator only. [`validate`]
//! reads the same way for the data owner, collecting problems instead of stopping.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use bytes::{Buf, Bytes};
use futures::StreamExt;
use object_store::{GetOptions, GetRange, ObjectStoreExt};

use super::csv_split::RecordCut;
use super::shard::ShardPart;
use super::source::{BadRows, CsvOptions, Format, Source};
use super::{DataError, EncodedBatch};
use crate::data::domain::Domain;
use crate::data::parquet_io;
use crate::spec::{ColumnKind, JobSpec, MissingPolicy, SchemaSpec, UnknownPolicy, parse_datetime, parse_datetime_as};
use crate::storage;

/// Rows per record batch.
pub const BATCH_ROWS: usize = 8192;

/// Problems collected while validating (see [`validate`]); at most `limit` are kept.
struct Problems {
    found: Vec<DataError>,
    limit: usize,
    truncated: bool,
}

impl Problems {
    fn record(&mut self, problem: DataError) {
        if self.found.len() < self.limit {
            self.found.push(problem);
        } else {
            self.truncated = true;
        }
    }
}

const MISSING_REJECTED: &str = "missing value, and the spec sets missing = \"reject\"";
const UNIT_MISSING: &str = "the privacy-unit id is missing";
const UNDECLARED_CATEGORY: &str = "a category that the spec does not declare (declare it, or set unknown = \"other\")";
const NOT_AN_INTEGER: &str = "not an integer";
const NOT_A_NUMBER: &str = "not a finite number";
const NOT_THE_DATETIME_FORMAT: &str = "not a date/time in the column's declared `format`";
const NOT_A_COMMON_DATETIME: &str = "not a date/time in a common ISO 8601 form (YYYY-MM-DD, with a time \
     HH:MM[:SS[.fff]] after `T` or a space, optionally `Z` or ±HH:MM); declare the column's `format` for another";

/// Every reason a value breaks the schema ([`DataError::Value`]): what a shard's reader
/// counts values by, by index (`data::shard`).
pub const BAD_VALUE_REASONS: [&str; 7] = [
    MISSING_REJECTED,
    UNIT_MISSING,
    UNDECLARED_CATEGORY,
    NOT_AN_INTEGER,
    NOT_A_NUMBER,
    NOT_THE_DATETIME_FORMAT,
    NOT_A_COMMON_DATETIME,
];

/// Values that break the schema, by column and reason, and the rows left out for them
/// ([`BadRows::Skip`]; under [`BadRows::AsMissing`] only rows without their unit).
/// Row-level and private: for the operator's log only.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SkippedRows {
    pub rows: u64,
    /// (column, reason) → values that broke the schema.
    pub by_column: BTreeMap<(String, &'static str), u64>,
}

/// What reading does with a value that breaks the schema.
enum OnBadValue {
    /// The read fails with the problem (a job under [`BadRows::Fail`]).
    Stop,
    /// The problem is recorded and the value read as missing (validation).
    Collect(Problems),
    /// The row is left out and counted (a job under [`BadRows::Skip`]).
    Skip(SkippedRows),
    /// The value is read as missing and counted; a row without its unit is left out (a job
    /// under [`BadRows::AsMissing`]).
    AsMissing(SkippedRows),
}

impl OnBadValue {
    /// Handles one bad value; `Ok(true)` when its row is to be left out.
    fn handle(&mut self, problem: DataError) -> Result<bool, DataError> {
        match self {
            OnBadValue::Stop => Err(problem),
            OnBadValue::Collect(p) => {
                p.record(problem);
                Ok(false)
            }
            OnBadValue::Skip(skipped) | OnBadValue::AsMissing(skipped) => {
                if let DataError::Value { column, reason, .. } = problem {
                    *skipped.by_column.entry((column, reason)).or_default() += 1;
                }
                Ok(matches!(self, OnBadValue::Skip(_)))
            }
        }
    }

    /// Handles a row without its unit id: `Ok(true)` when it is to be left out.
    fn handle_unitless(&mut self, problem: DataError) -> Result<bool, DataError> {
        Ok(self.handle(problem)? || matches!(self, OnBadValue::AsMissing(_)))
    }

    fn counts(&mut self) -> Option<&mut SkippedRows> {
        match self {
            OnBadValue::Skip(skipped) | OnBadValue::AsMissing(skipped) => Some(skipped),
            _ => None,
        }
    }
}

/// Where each schema column is found in the file, and how to encode it.
struct ColumnPlan {
    name: String,
    source: usize,
    kind: ColumnKind,
    missing: MissingPolicy,
    unknown: UnknownPolicy,
    /// Index in the domain (`None` for identifiers).
    domain: Option<usize>,
    categories: HashMap<String, u32>,
    bounds: (f64, f64),
    /// A datetime column's declared format.
    format: Option<String>,
}

/// Encodes raw string batches of one file into [`EncodedBatch`]es.
struct Encoder<'a> {
    /// The file as errors name it.
    file: String,
    /// What a row-level unit's name starts with: the file, and a byte-range shard's start.
    unit_names: String,
    options: &'a CsvOptions,
    plans: Vec<ColumnPlan>,
    unit: Option<usize>,
    /// Key columns read beside the unit (a database table's keys).
    keys: Vec<usize>,
    domain_len: usize,
    /// Data rows seen so far in this file (for row numbers in errors).
    rows_seen: u64,
}

impl<'a> Encoder<'a> {
    /// Maps schema columns to file columns: by name when the file names them, else by position.
    fn new(
        input: &'a Source,
        schema: &SchemaSpec,
        domain: &Domain,
        file: &str,
        names: Option<&[String]>,
        keys: &[&str],
    ) -> Result<Self, DataError> {
        // A declared column named twice: which of them the job would read is ambiguous.
        for c in &schema.columns {
            if names.is_some_and(|names| names.iter().filter(|n| **n == c.name).count() > 1) {
                return Err(DataError::DuplicateColumn { file: file.to_string(), column: c.name.clone() });
            }
        }
        let mut plans = Vec::new();
        for (position, c) in schema.columns.iter().enumerate() {
            let source = match names {
                Some(names) => names
                    .iter()
                    .position(|n| n == &c.name)
                    .ok_or_else(|| DataError::MissingColumn { file: file.to_string(), column: c.name.clone() })?,
                None => position,
            };
            let categories =
                c.categories.iter().flatten().enumerate().map(|(i, name)| (name.clone(), i as u32)).collect();
            plans.push(ColumnPlan {
                name: c.name.clone(),
                source,
                kind: c.kind,
                missing: c.missing,
                unknown: c.unknown,
                domain: domain.index_of(&c.name),
                categories,
                bounds: c.bounds().unwrap_or((f64::NEG_INFINITY, f64::INFINITY)),
                format: c.format.clone(),
            });
        }
        let unit = match &schema.unit_column {
            // Never read as "each row is a unit": a unit's rows would count several times.
            Some(u) => Some(plans.iter().position(|p| &p.name == u).ok_or_else(|| {
                DataError::Internal(format!("the unit column '{u}' is not among the spec's columns"))
            })?),
            None => None,
        };
        let keys =
            keys.iter()
                .map(|k| {
                    plans.iter().position(|p| p.name == *k).ok_or_else(|| {
                        DataError::Internal(format!("the key column '{k}' is not among the spec's columns"))
                    })
                })
                .collect::<Result<_, _>>()?;
        Ok(Self {
            file: file.to_string(),
            unit_names: file.to_string(),
            options: &input.csv,
            plans,
            unit,
            keys,
            domain_len: domain.columns.len(),
            rows_seen: 0,
        })
    }

    fn error(&self, column: &str, row: u64, reason: &'static str) -> DataError {
        DataError::Value { file: self.file.clone(), column: column.to_string(), row, reason }
    }

    /// Normalised text of a cell, `None` when missing.
    fn cell<'b>(&self, array: &'b arrow_array::StringArray, i: usize) -> Option<&'b str> {
        if array.is_null(i) {
            return None;
        }
        self.options.normalise(array.value(i))
    }

    /// Encodes a batch, handing each bad value to `on_bad` (see [`OnBadValue`]), with the
    /// key columns of its rows.
    fn encode(&mut self, batch: &RecordBatch, on_bad: &mut OnBadValue) -> Result<KeyedBatch, DataError> {
        let n = batch.num_rows();
        let first_row = self.rows_seen + 1;
        let mut out =
            EncodedBatch { units: Vec::with_capacity(n), values: vec![Vec::with_capacity(n); self.domain_len] };
        let mut left_out = vec![false; n];
        let columns: Vec<Arc<dyn Array>> = self
            .plans
            .iter()
            .map(|p| arrow_cast::cast(batch.column(p.source), &DataType::Utf8))
            .collect::<Result<_, _>>()
            .map_err(|e| DataError::Read { file: self.file.clone(), message: e.to_string() })?;
        for (plan, column) in self.plans.iter().zip(&columns) {
            let strings = column.as_string::<i32>();
            for (i, left_out) in left_out.iter_mut().enumerate() {
                let row = first_row + i as u64;
                let cell = self.cell(strings, i);
                let Some(d) = plan.domain else {
                    continue;
                };
                let value = match cell {
                    None if plan.missing == MissingPolicy::Reject => {
                        let e = self.error(&plan.name, row, MISSING_REJECTED);
                        *left_out |= on_bad.handle(e)?;
                        None
                    }
                    None => None,
                    Some(text) => match self.encode_value(plan, text, row) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            *left_out |= on_bad.handle(e)?;
                            None
                        }
                    },
                };
                out.values[d].push(value);
            }
        }
        for (i, left_out) in left_out.iter_mut().enumerate() {
            let row = first_row + i as u64;
            let unit = match self.unit {
                Some(u) => match self.cell(columns[u].as_string::<i32>(), i) {
                    Some(id) => id.to_string(),
                    None => {
                        *left_out |= on_bad.handle_unitless(self.error(&self.plans[u].name, row, UNIT_MISSING))?;
                        String::new()
                    }
                },
                // Each row is its own unit: name it by file and row.
                None => format!("{}#{row}", self.unit_names),
            };
            out.units.push(unit);
        }
        let mut keys: Vec<Vec<Option<String>>> = self
            .keys
            .iter()
            .map(|&k| {
                let strings = columns[k].as_string::<i32>();
                (0..n).map(|i| self.cell(strings, i).map(str::to_string)).collect()
            })
            .collect();
        self.rows_seen += n as u64;
        if let Some(skipped) = on_bad.counts()
            && left_out.contains(&true)
        {
            skipped.rows += left_out.iter().filter(|l| **l).count() as u64;
            out = out.without(&left_out);
            for column in &mut keys {
                let all = std::mem::take(column);
                *column = all.into_iter().zip(&left_out).filter(|(_, l)| !**l).map(|(k, _)| k).collect();
            }
        }
        Ok(KeyedBatch { rows: out, keys })
    }

    fn encode_value(&self, plan: &ColumnPlan, text: &str, row: u64) -> Result<f64, DataError> {
        let clamp = |v: f64| v.clamp(plan.bounds.0, plan.bounds.1);
        match plan.kind {
            ColumnKind::Categorical => match plan.categories.get(text) {
                Some(code) => Ok(f64::from(*code)),
                None if plan.unknown == UnknownPolicy::Other => Ok(plan.categories.len() as f64),
                None => Err(self.error(&plan.name, row, UNDECLARED_CATEGORY)),
            },
            ColumnKind::Integer => match text.parse::<f64>() {
                Ok(v) if v.is_finite() && v.fract() == 0.0 => Ok(clamp(v)),
                _ => Err(self.error(&plan.name, row, NOT_AN_INTEGER)),
            },
            ColumnKind::Continuous => match text.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(clamp(v)),
                _ => Err(self.error(&plan.name, row, NOT_A_NUMBER)),
            },
            ColumnKind::Datetime => match &plan.format {
                Some(format) => parse_datetime_as(text, format)
                    .map(clamp)
                    .ok_or_else(|| self.error(&plan.name, row, NOT_THE_DATETIME_FORMAT)),
                None => {
                    parse_datetime(text).map(clamp).ok_or_else(|| self.error(&plan.name, row, NOT_A_COMMON_DATETIME))
                }
            },
            ColumnKind::Identifier => unreachable!("identifiers are not encoded"),
        }
    }
}

/// A file being read.
enum OpenFile {
    Csv {
        stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
        buffered: Bytes,
        decoder: Box<arrow_csv::reader::Decoder>,
        done: bool,
        /// A byte-range shard's records, cut from what the stream reads.
        cut: Option<RecordCut>,
    },
    Parquet {
        stream: parquet::arrow::async_reader::ParquetRecordBatchStream<parquet_io::ObjectReader>,
    },
}

/// Encoded rows with their keys ([`InputReader::with_keys`]; missing: `None`).
pub struct KeyedBatch {
    pub rows: EncodedBatch,
    /// Per key column, each row's key.
    pub keys: Vec<Vec<Option<String>>>,
}

/// Pulls encoded batches from every file of an input section, one file after another,
/// in a schema.
pub struct InputReader<'a> {
    input: &'a Source,
    schema: &'a SchemaSpec,
    domain: &'a Domain,
    keys: Vec<&'a str>,
    next_file: usize,
    current: Option<(Encoder<'a>, OpenFile)>,
    on_bad: OnBadValue,
    /// One shard's part of its file ([`Self::with_part`]).
    part: ShardPart,
    /// Where a byte-range shard's records lay, once read ([`Self::span`]).
    span: Option<(u64, u64)>,
}

impl<'a> InputReader<'a> {
    /// A reader of `input`'s files in `schema`: a bad value stops it or leaves its row
    /// out, as `bad_rows` says.
    pub fn new(input: &'a Source, schema: &'a SchemaSpec, domain: &'a Domain) -> Self {
        let on_bad = match input.bad_rows.unwrap_or_default() {
            BadRows::Fail => OnBadValue::Stop,
            BadRows::Skip => OnBadValue::Skip(SkippedRows::default()),
            BadRows::AsMissing => OnBadValue::AsMissing(SkippedRows::default()),
        };
        let part = ShardPart::Whole;
        Self { input, schema, domain, keys: Vec::new(), next_file: 0, current: None, on_bad, part, span: None }
    }

    /// Reads only `part` of each file: one shard of the input (`data::shard`).
    pub fn with_part(mut self, part: ShardPart) -> Self {
        self.part = part;
        self
    }

    /// The file offsets of a byte-range shard's first record and of the end of its last,
    /// once its file is read (`data::csv_split`).
    pub fn span(&self) -> Option<(u64, u64)> {
        self.span
    }

    /// Also reads `columns` (identifiers of the schema) as each row's keys:
    /// [`Self::next_keyed_batch`].
    pub fn with_keys(mut self, columns: Vec<&'a str>) -> Self {
        self.keys = columns;
        self
    }

    /// The rows left out and the values that broke the schema so far (none unless the spec
    /// skips bad rows or reads their values as missing).
    pub fn skipped(&self) -> Option<&SkippedRows> {
        match &self.on_bad {
            OnBadValue::Skip(skipped) | OnBadValue::AsMissing(skipped) => Some(skipped),
            _ => None,
        }
    }

    /// An associated function, not a method: the reader holds a stream that is not
    /// `Sync`, so a borrow of it may not live across an await of a task that moves.
    async fn open(
        input: &'a Source,
        declared: &'a SchemaSpec,
        domain: &'a Domain,
        keys: &[&str],
        url: &str,
        part: &ShardPart,
    ) -> Result<(Encoder<'a>, OpenFile), DataError> {
        let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.to_string(), message: e.to_string() };
        let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
        let format = input.format.unwrap_or_else(|| Format::detect(url));
        match (format, part) {
            (Format::Csv, ShardPart::RowGroups { .. }) | (Format::Parquet, ShardPart::Bytes { .. }) => {
                Err(DataError::Internal(format!("{url}: a {format:?} file's shard of {part:?}")))
            }
            (Format::Csv, ShardPart::Whole) => {
                let get = location.store.get(&path).await.map_err(|e| read_err(&e))?;
                let mut stream = decoded(get.into_stream()).await.map_err(|e| read_err(&e))?;
                let (names, buffered) = if input.csv.has_header {
                    let (names, rest) = read_header(&mut stream, &input.csv, url).await?;
                    (Some(names), rest)
                } else {
                    (None, Bytes::new())
                };
                let encoder = Encoder::new(input, declared, domain, url, names.as_deref(), keys)?;
                Ok((encoder, csv_source(input, declared, names.as_deref(), stream, buffered, None)))
            }
            (Format::Csv, &ShardPart::Bytes { start, end }) => {
                // The header (after a byte-order mark), and where the records start; the
                // file's size comes with it (one request, not a HEAD first).
                let most = (BYTE_ORDER_MARK.len() + MAX_HEADER_BYTES + 1) as u64;
                let first = GetOptions { range: Some(GetRange::Bounded(0..most)), ..Default::default() };
                let got = location.store.get_opts(&path, first).await.map_err(|e| read_err(&e))?;
                let size = got.meta.size;
                let head = got.bytes().await.map_err(|e| read_err(&e))?;
                let bom = if head.starts_with(BYTE_ORDER_MARK) { BYTE_ORDER_MARK.len() } else { 0 };
                let (names, data_start) = if input.csv.has_header {
                    let line = header_end(&head[bom..]).ok_or_else(|| no_header_line(url))?;
                    (Some(header_names(&head[bom..bom + line], &input.csv)), (bom + line + 1) as u64)
                } else {
                    (None, bom as u64)
                };
                let comment = input.csv.comment.map(|c| c as u8);
                let (cut, read) = RecordCut::new((start, end), data_start, size, input.csv.delimiter as u8, comment);
                let stream = if read.is_empty() {
                    futures::stream::empty().boxed()
                } else {
                    let range = GetOptions { range: Some(GetRange::Bounded(read.clone())), ..Default::default() };
                    location.store.get_opts(&path, range).await.map_err(|e| read_err(&e))?.into_stream()
                };
                // Errors name the shard (rows are counted from its first); a row-level unit
                // is named by the shard's start and its row in it.
                let file = format!("{url} (the shard from byte {start})");
                let mut encoder = Encoder::new(input, declared, domain, &file, names.as_deref(), keys)?;
                encoder.unit_names = format!("{url}@{start}");
                Ok((encoder, csv_source(input, declared, names.as_deref(), stream, Bytes::new(), Some(cut))))
            }
            (Format::Parquet, part) => {
                let (row_groups, first_row) = match part {
                    ShardPart::RowGroups { groups, first_row } => (Some(groups.clone()), *first_row),
                    _ => (None, 0),
                };
                let (schema, stream) =
                    parquet_io::open_row_groups(location.store.clone(), path, BATCH_ROWS, row_groups)
                        .await
                        .map_err(|e| read_err(&format!("not a readable Parquet file: {e}")))?;
                let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
                let mut encoder = Encoder::new(input, declared, domain, url, Some(&names), keys)?;
                encoder.rows_seen = first_row;
                Ok((encoder, OpenFile::Parquet { stream }))
            }
        }
    }

    /// Opens every file and checks its header (a Parquet file's schema) against the schema,
    /// reading no row: an input that does not fit fails before any row of it, or of the
    /// inputs read after it, is read (the failure's time then says nothing of their size).
    pub async fn check_headers(&mut self) -> Result<(), DataError> {
        for url in &self.input.urls {
            Self::open(self.input, self.schema, self.domain, &self.keys, url, &ShardPart::Whole).await?;
        }
        Ok(())
    }

    /// The next encoded batch, or `None` after the last file.
    pub async fn next_batch(&mut self) -> Result<Option<EncodedBatch>, DataError> {
        Ok(self.next_keyed_batch().await?.map(|batch| batch.rows))
    }

    /// The next encoded batch with its rows' keys ([`Self::with_keys`]), or `None` after
    /// the last file.
    pub async fn next_keyed_batch(&mut self) -> Result<Option<KeyedBatch>, DataError> {
        loop {
            if self.current.is_none() {
                let Some(url) = self.input.urls.get(self.next_file) else {
                    return Ok(None);
                };
                // Counted before opening: validation goes on with the next file.
                self.next_file += 1;
                self.current =
                    Some(Self::open(self.input, self.schema, self.domain, &self.keys, url, &self.part).await?);
            }
            let (encoder, source) = self.current.as_mut().expect("opened above");
            let file = encoder.file.clone();
            let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: file.clone(), message: e.to_string() };
            let batch = match source {
                OpenFile::Csv { stream, buffered, decoder, done, cut } => loop {
                    if buffered.is_empty() && !*done {
                        match stream.next().await {
                            Some(chunk) => {
                                let chunk = chunk.map_err(|e| read_err(&e))?;
                                *buffered = match cut {
                                    Some(cut) => {
                                        let records = chunk.slice_ref(cut.take(&chunk));
                                        *done = cut.is_done();
                                        records
                                    }
                                    None => chunk,
                                };
                            }
                            None => {
                                if cut.as_ref().is_some_and(|cut| cut.span().is_none()) {
                                    return Err(read_err(&"the shard's last record runs past what its reader reads"));
                                }
                                *done = true
                            }
                        }
                    }
                    let used = decoder.decode(buffered).map_err(|e| csv_err(&file, &e))?;
                    buffered.advance(used);
                    if decoder.capacity() == 0 || (*done && buffered.is_empty()) {
                        match decoder.flush().map_err(|e| csv_err(&file, &e))? {
                            Some(batch) => break Some(batch),
                            None if *done => break None,
                            None => {}
                        }
                    }
                },
                OpenFile::Parquet { stream } => match stream.next().await {
                    Some(batch) => Some(batch.map_err(|e| read_err(&format!("corrupt Parquet data: {e}")))?),
                    None => None,
                },
            };
            match batch {
                Some(batch) => return encoder.encode(&batch, &mut self.on_bad).map(Some),
                None => {
                    if let Some((_, OpenFile::Csv { cut: Some(cut), .. })) = &self.current {
                        self.span = cut.span();
                    }
                    self.current = None;
                }
            }
        }
    }
}

/// What [`validate`] found. Row-level and private: for the data owner's eyes only.
#[derive(Debug)]
pub struct Validation {
    /// Input files of the spec.
    pub files: usize,
    /// Data rows read (of a file whose reading stopped at an error, only the record
    /// batches before it count).
    pub rows: u64,
    /// The first problems, in reading order (within a batch of rows, column by column).
    pub problems: Vec<DataError>,
    /// More problems were found than kept.
    pub truncated: bool,
}

impl Validation {
    pub fn is_valid(&self) -> bool {
        self.problems.is_empty() && !self.truncated
    }
}

/// Reads every input file of `spec` as a job would, but collects up to `max_problems`
/// problems instead of stopping at the first: bad values (the row goes on), and errors
/// that stop reading a file (unreadable, malformed, a declared column absent; the next
/// file goes on). A database's tables are read each against its own columns, with its
/// keys. For the data owner: the result says where rows break the schema.
pub async fn validate(spec: &JobSpec, domain: &Domain, max_problems: usize) -> Validation {
    let unit = spec.schema.unit_column.as_deref().unwrap_or_default();
    let root = (&spec.input, spec.schema.clone(), domain.clone(), Vec::new());
    let tables = spec.tables.iter().map(|t| {
        let keys: Vec<&str> = std::iter::once(t.parent.key.as_str()).chain(t.key.as_deref()).collect();
        (&t.input, t.schema(unit), Domain::of_columns(&t.columns, spec.generator.default_bins()), keys)
    });
    let mut problems = Problems { found: Vec::new(), limit: max_problems, truncated: false };
    let (mut rows, mut files) = (0, 0);
    for (input, schema, domain, keys) in std::iter::once(root).chain(tables) {
        let mut reader = InputReader::new(input, &schema, &domain).with_keys(keys);
        reader.on_bad = OnBadValue::Collect(problems);
        loop {
            match reader.next_batch().await {
                Ok(Some(batch)) => rows += batch.len() as u64,
                Ok(None) => break,
                Err(e) => {
                    // Stops this file only; the next one goes on.
                    let _ = reader.on_bad.handle(e);
                    reader.current = None;
                }
            }
        }
        let OnBadValue::Collect(found) = reader.on_bad else { unreachable!("set above") };
        (problems, files) = (found, files + input.urls.len());
    }
    Validation { files, rows, problems: problems.found, truncated: problems.truncated }
}

/// A CSV file's records as they stream in (`buffered` first), decoded against the header's
/// `names` (else the declared columns, in order). The decoder is fed a line feed first:
/// csv_core strips a byte-order mark from the start of the first bytes it is fed, which
/// would make a record's value depend on where reading began (the file's own mark is gone
/// before this).
fn csv_source(
    input: &Source,
    declared: &SchemaSpec,
    names: Option<&[String]>,
    stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    buffered: Bytes,
    cut: Option<RecordCut>,
) -> OpenFile {
    let fields = names.map_or(declared.columns.len(), <[String]>::len);
    let schema =
        Schema::new((0..fields).map(|i| Field::new(format!("c{i}"), DataType::Utf8, true)).collect::<Vec<_>>());
    let mut builder = arrow_csv::ReaderBuilder::new(Arc::new(schema))
        .with_header(false)
        .with_batch_size(BATCH_ROWS)
        .with_delimiter(input.csv.delimiter as u8);
    if let Some(c) = input.csv.comment {
        builder = builder.with_comment(c as u8);
    }
    let buffered = Bytes::from([b"\n".as_slice(), &buffered].concat());
    OpenFile::Csv { stream, buffered, decoder: Box::new(builder.build_decoder()), done: false, cut }
}

fn csv_err(file: &str, e: &arrow_schema::ArrowError) -> DataError {
    let e = e.to_string();
    let e = e.strip_prefix("Csv error: ").unwrap_or(&e);
    DataError::Read {
        file: file.to_string(),
        message: format!("malformed CSV: {e} (lines counted from the first data row)"),
    }
}

/// A compressed CSV file's codec, from its first bytes (gzip `1f 8b`, zstd `28 b5 2f fd`),
/// decoding chunk by chunk as the file streams in.
enum Codec {
    Gzip(Box<flate2::write::MultiGzDecoder<Vec<u8>>>),
    Zstd(zstd::stream::write::Decoder<'static, Vec<u8>>),
}

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const BYTE_ORDER_MARK: &[u8] = b"\xef\xbb\xbf";

/// Whether a file starting with `head` (its first 4 bytes) is compressed ([`Codec`]).
pub(crate) fn is_compressed(head: &[u8]) -> bool {
    head.starts_with(GZIP_MAGIC) || head.starts_with(ZSTD_MAGIC)
}

impl Codec {
    fn detect(head: &[u8]) -> std::io::Result<Option<Self>> {
        Ok(if head.starts_with(GZIP_MAGIC) {
            Some(Codec::Gzip(Box::new(flate2::write::MultiGzDecoder::new(Vec::new()))))
        } else if head.starts_with(ZSTD_MAGIC) {
            Some(Codec::Zstd(zstd::stream::write::Decoder::new(Vec::new())?))
        } else {
            None
        })
    }

    /// The bytes `chunk` decodes to (fed at most [`PIECE`] bytes at a time, so one call's
    /// output stays within the codec's expansion of that much).
    fn push(&mut self, chunk: &[u8]) -> std::io::Result<Bytes> {
        use std::io::Write;
        let out = match self {
            Codec::Gzip(d) => {
                d.write_all(chunk)?;
                d.get_mut()
            }
            Codec::Zstd(d) => {
                d.write_all(chunk)?;
                d.flush()?;
                d.get_mut()
            }
        };
        Ok(Bytes::from(std::mem::take(out)))
    }

    /// The bytes left at the end of the file (an error if it ends inside a frame).
    fn finish(self) -> std::io::Result<Bytes> {
        Ok(Bytes::from(match self {
            Codec::Gzip(d) => d.finish()?,
            // `finish` refuses a file that ends inside a frame (`into_inner` alone would not).
            Codec::Zstd(d) => d.finish()?,
        }))
    }
}

/// A CSV file's text as it streams in: decompressed when its first bytes are gzip's or
/// zstd's, and without a leading UTF-8 byte-order mark (Excel's "CSV UTF-8").
pub(crate) async fn decoded(
    mut raw: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
) -> object_store::Result<futures::stream::BoxStream<'static, object_store::Result<Bytes>>> {
    let failed = |e: std::io::Error| object_store::Error::Generic { store: "decompression", source: Box::new(e) };
    // Enough bytes to tell the codec (a stream's first chunk may be shorter).
    let mut head = Vec::new();
    while head.len() < 4 {
        match raw.next().await.transpose()? {
            Some(chunk) => head.extend_from_slice(&chunk),
            None => break,
        }
    }
    let first = Bytes::from(head);
    let text: futures::stream::BoxStream<'static, object_store::Result<Bytes>> =
        match Codec::detect(&first).map_err(failed)? {
            None => futures::stream::once(async move { Ok(first) }).chain(raw).boxed(),
            Some(codec) => {
                let raw = futures::stream::once(async move { Ok(first) }).chain(raw).boxed();
                futures::stream::unfold(Some((raw, codec)), move |state| async move {
                    let (mut raw, mut codec) = state?;
                    loop {
                        match raw.next().await {
                            Some(Ok(chunk)) => {
                                let mut out = Vec::new();
                                for piece in chunk.chunks(PIECE) {
                                    match codec.push(piece) {
                                        Ok(decoded) => out.extend_from_slice(&decoded),
                                        Err(e) => return Some((Err(failed(e)), None)),
                                    }
                                }
                                if out.is_empty() {
                                    continue;
                                }
                                return Some((Ok(Bytes::from(out)), Some((raw, codec))));
                            }
                            Some(Err(e)) => return Some((Err(e), None)),
                            None => {
                                return match codec.finish() {
                                    Ok(out) if out.is_empty() => None,
                                    Ok(out) => Some((Ok(out), None)),
                                    Err(e) => Some((Err(failed(e)), None)),
                                };
                            }
                        }
                    }
                })
                .boxed()
            }
        };
    // The text's first bytes (at least 3 where the file has as many), without a
    // byte-order mark.
    let mut text = text;
    let mut start = Vec::new();
    while start.len() < 3 {
        match text.next().await.transpose()? {
            Some(chunk) => start.extend_from_slice(&chunk),
            None => break,
        }
    }
    let start = Bytes::from(start);
    let start = if start.starts_with(BYTE_ORDER_MARK) { start.slice(BYTE_ORDER_MARK.len()..) } else { start };
    Ok(futures::stream::once(async move { Ok(start) }).chain(text).boxed())
}

/// Compressed bytes decoded at a time.
const PIECE: usize = 8 * 1024;

/// The longest header line read (column names are metadata: nothing past them is read
/// before it is whole).
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;

fn no_header_line(file: &str) -> DataError {
    let message = format!("no header line ends within its first {MAX_HEADER_BYTES} bytes");
    DataError::Read { file: file.to_string(), message }
}

/// Where the header line that `head` (the text's first bytes) starts with ends: its line
/// feed, within the first [`MAX_HEADER_BYTES`] bytes and one.
fn header_end(head: &[u8]) -> Option<usize> {
    head.iter().take(MAX_HEADER_BYTES + 1).position(|b| *b == b'\n')
}

/// The column names a header line (without its `\n`) gives.
fn header_names(line: &[u8], options: &CsvOptions) -> Vec<String> {
    let line = String::from_utf8_lossy(line);
    line.trim_end_matches('\r').split(options.delimiter).map(|n| n.trim().trim_matches('"').to_string()).collect()
}

/// Reads up to the end of the header line (at most [`MAX_HEADER_BYTES`]); returns the
/// column names and the bytes after it.
async fn read_header(
    stream: &mut (impl futures::Stream<Item = object_store::Result<Bytes>> + Unpin),
    options: &CsvOptions,
    file: &str,
) -> Result<(Vec<String>, Bytes), DataError> {
    let mut head = Vec::new();
    loop {
        if let Some(end) = header_end(&head) {
            return Ok((header_names(&head[..end], options), Bytes::copy_from_slice(&head[end + 1..])));
        }
        if head.len() > MAX_HEADER_BYTES {
            return Err(no_header_line(file));
        }
        match stream.next().await {
            Some(chunk) => head.extend_from_slice(
                &chunk.map_err(|e| DataError::Read { file: file.to_string(), message: e.to_string() })?,
            ),
            None => {
                return Err(DataError::Read { file: file.to_string(), message: "no header line".into() });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A spec reading `file`: a unit, a datetime (with `format` when given) and an integer.
    fn spec(file: &std::path::Path, format: Option<&str>) -> JobSpec {
        parsed(file, format).unwrap()
    }

    fn parsed(file: &std::path::Path, format: Option<&str>) -> Result<JobSpec, crate::spec::SpecError> {
        let format = format.map_or(String::new(), |f| format!("format = \"{f}\"\n"));
        let text = format!(
            r#"
[job]
dataset_id = "files"

[input]
urls = ["{}"]
format = "csv"

[schema]
unit_column = "id"

[[schema.columns]]
name = "id"
kind = "identifier"

[[schema.columns]]
name = "t"
kind = "datetime"
min = "2185-01-01"
max = "2186-01-01"
{format}
[[schema.columns]]
name = "x"
kind = "integer"
min = 0
max = 100

[privacy]
epsilon = 1.0
delta = 1e-6

[generator]
name = "marginals"

[output]
url = "/unused"
"#,
            file.display()
        );
        JobSpec::parse(&text, "files")
    }

    async fn read(spec: &JobSpec) -> Result<crate::data::table::Table, DataError> {
        crate::data::table::load(spec, &Domain::from_spec(spec), &spec.input.urls).await
    }

    const CSV: &str = "id,t,x\nP1,2185-11-18 11:56:00,7\nP1,2185-11-18 12:30:00,9\nP2,2185-11-19 08:00:00,42\n";

    /// The same rows read alike from a plain file, one with a UTF-8 byte-order mark, a
    /// gzip file, a zstd file, and a gzip file whose name does not say so.
    #[tokio::test]
    async fn files_as_people_have_them_read_alike() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            path
        };
        let gzip = |text: &[u8]| {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(text).unwrap();
            e.finish().unwrap()
        };
        let plain = read(&spec(&write("plain.csv", CSV.as_bytes()), None)).await.unwrap();
        assert_eq!(plain.units, ["P1", "P1", "P2"]);
        let bom = [b"\xef\xbb\xbf".as_slice(), CSV.as_bytes()].concat();
        let files = [
            write("bom.csv", &bom),
            write("data.csv.gz", &gzip(CSV.as_bytes())),
            write("bom.csv.gz", &gzip(&bom)),
            write("data.csv.zst", &zstd::encode_all(CSV.as_bytes(), 3).unwrap()),
            write("unnamed", &gzip(CSV.as_bytes())),
        ];
        for file in files {
            assert_eq!(read(&spec(&file, None)).await.unwrap(), plain, "{}", file.display());
        }
        let gzipped = gzip(CSV.as_bytes());
        let zstded = zstd::encode_all(CSV.as_bytes(), 3).unwrap();
        for (name, whole) in [("cut.csv.gz", &gzipped), ("cut.csv.zst", &zstded)] {
            let cut = write(name, &whole[..whole.len() - 6]);
            assert!(read(&spec(&cut, None)).await.is_err(), "{name}: cut short is an error, not fewer rows");
        }
    }

    /// A file read in byte ranges of every size reads the rows it reads whole, in order,
    /// wherever the ranges join (each starts where the one before it ended, none lost), and
    /// they join wherever a range is no shorter than the file's longest line and no quoted
    /// field spans lines: quotes inside a field, `""`, a delimiter in quotes, CRLF, a comment
    /// with a CR and a quote, blank lines, a byte-order mark starting a later record, a last
    /// line without its line feed, and a file without a header. Where a quoted field spans
    /// lines, some sizes do not join; a file whose lines end in CR alone is read whole.
    #[tokio::test]
    async fn a_file_read_in_ranges_that_join_reads_as_it_does_whole() {
        // Each row's unit and `x`, and the span read.
        type Read = (Vec<(String, Option<f64>)>, Option<(u64, u64)>);
        async fn read_part(
            input: &Source,
            schema: &SchemaSpec,
            domain: &Domain,
            part: ShardPart,
        ) -> Result<Read, DataError> {
            let mut reader = InputReader::new(input, schema, domain).with_part(part);
            let mut rows = Vec::new();
            while let Some(batch) = reader.next_batch().await? {
                rows.extend((0..batch.len()).map(|r| (batch.units[r].clone(), batch.values[1][r])));
            }
            Ok((rows, reader.span()))
        }
        let dir = tempfile::tempdir().unwrap();
        let mut spec = spec(std::path::Path::new("unused"), None);
        spec.input.csv.comment = Some('#');
        let domain = Domain::from_spec(&spec);
        let plain = "\u{feff}id,note,t,x\nP1,\"a, \"\"b\"\"\",2185-01-02,1\r\nP2,x\"y,2185-01-03,2\n\n\
                     # \"odd\r\"\nP1,,2185-01-04,3\n\u{feff}P3,\"\",2185-01-05,4";
        let multiline = "id,note,t,x\nP1,plain,2185-01-02,1\nP2,\"two\nlines, P9\",2185-01-03,2\nP3,z,2185-01-04,3\n";
        let headerless = "P1,2185-01-02,1\nP2,2185-01-03,2\n";
        let cr_only = "P1,2185-01-02,1\rP2,2185-01-03,2\rP3,2185-01-04,3\r";
        // Name, text, header, rows, whether a quoted field spans lines.
        let cases = [
            ("plain.csv", plain, true, 4, false),
            ("multiline.csv", multiline, true, 3, true),
            ("headerless.csv", headerless, false, 2, false),
            ("cr.csv", cr_only, false, 3, false),
        ];
        for (name, text, has_header, records, spans_lines) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let mut input = Source { urls: vec![path.display().to_string()], ..spec.input.clone() };
            input.csv.has_header = has_header;
            let (whole, _) = read_part(&input, &spec.schema, &domain, ShardPart::Whole).await.unwrap();
            assert_eq!(whole.len(), records, "{name}: {whole:?}");
            let longest = text.split_inclusive('\n').map(str::len).max().unwrap() as u64;
            let mut unjoined_long = 0;
            for size in 1..=text.len() as u64 {
                let (mut rows, mut end, mut joined) = (Vec::new(), None, true);
                for start in (0..text.len() as u64).step_by(size as usize) {
                    let part = ShardPart::Bytes { start, end: (start + size).min(text.len() as u64) };
                    match read_part(&input, &spec.schema, &domain, part).await {
                        Ok((part_rows, Some((first, last)))) => {
                            joined &= end.is_none_or(|end| end == first);
                            end = Some(last);
                            rows.extend(part_rows);
                        }
                        Ok((_, None)) => panic!("{name}: a range read without its span"),
                        Err(_) => joined = false,
                    }
                }
                if joined {
                    assert_eq!(rows, whole, "{name}, ranges of {size} bytes");
                } else if size >= longest {
                    unjoined_long += 1;
                }
            }
            assert_eq!(unjoined_long > 0, spans_lines, "{name}: {unjoined_long} sizes past its longest line");
        }
    }
    /// A header naming a column twice is refused, naming the column.
    #[tokio::test]
    async fn a_header_naming_a_column_twice_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("twice.csv");
        std::fs::write(&path, "id,x,t,x\nP1,1,2185-11-18,2\n").unwrap();
        let refused = read(&spec(&path, None)).await.unwrap_err();
        assert!(matches!(&refused, DataError::DuplicateColumn { column, .. } if column == "x"), "{refused}");
        // Columns the spec does not read may repeat (trailing delimiters name "" twice).
        std::fs::write(&path, "id,t,x,,,note,note\nP1,2185-11-18,2,,,a,b\n").unwrap();
        assert_eq!(read(&spec(&path, None)).await.unwrap().units, ["P1"]);
    }

    /// Datetimes in the ISO 8601 forms exports write read as the same instant; another
    /// form reads through the column's declared `format`, and not without it.
    #[tokio::test]
    async fn datetimes_read_in_common_forms_and_a_declared_format() {
        let at = parse_datetime("2185-11-18 11:56:00").unwrap();
        for form in [
            "2185-11-18T11:56",
            "2185-11-18 11:56",
            "2185-11-18T11:56:00",
            "2185-11-18T11:56:00.000",
            "2185-11-18T11:56:00Z",
            "2185-11-18T11:56Z",
            "2185-11-18T12:56:00+01:00",
            "2185-11-18 12:56+01:00",
            " 2185-11-18T11:56:00 ",
        ] {
            assert_eq!(parse_datetime(form), Some(at), "{form}");
        }
        assert_eq!(parse_datetime("2185-11-18T11:56:00.5"), Some(at + 0.5));
        assert_eq!(parse_datetime("2185-11-18"), Some(at - (11.0 * 3600.0 + 56.0 * 60.0)));
        assert_eq!(parse_datetime("18/11/2185 11:56"), None);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("uk.csv");
        std::fs::write(&path, "id,t,x\nP1,18/11/2185 11:56,7\n").unwrap();
        let read_with = read(&spec(&path, Some("%d/%m/%Y %H:%M"))).await.unwrap();
        assert_eq!(read_with.columns[0], [Some(at)]);
        assert!(matches!(read(&spec(&path, None)).await, Err(DataError::Value { .. })));
    }

    /// A `format` that cannot read what it writes (no year, not chrono syntax, epoch
    /// seconds, too long) is refused when the spec is read, not when every value fails.
    #[test]
    fn a_format_that_cannot_read_its_dates_is_refused_with_the_spec() {
        let path = std::path::Path::new("unused.csv");
        let parse = |format: &str| parsed(path, Some(format)).is_ok();
        for good in ["%d/%m/%Y %H:%M", "%d/%m/%Y", "%Y%m%d%H%M%S", "%d.%m.%Y %H:%M:%S%.f"] {
            assert!(parse(good), "{good}");
        }
        for bad in ["%H:%M", "%Y", "%Q", "%s", &"%Y-%m-%d ".repeat(20)] {
            assert!(!parse(bad), "{bad}");
        }
    }
}
