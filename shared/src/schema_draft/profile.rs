//! What a CSV file's rows say about each column, each privacy unit's rows bounded to m: the
//! private statistics a schema draft is made from (released with DP, or shown to the data
//! owner as they are).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use futures::StreamExt;
use object_store::ObjectStoreExt;

use crate::data::DataError;
use crate::data::input::MAX_HEADER_BYTES;
use crate::data::source::CsvOptions;
use crate::entropy::os_rng;
use crate::sampling::Reservoir;
use crate::storage;

/// What one cell holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Integer = 0,
    Decimal = 1,
    Text = 2,
    Missing = 3,
}

impl Shape {
    /// A normalised cell (`None`: missing).
    pub fn of(cell: Option<&str>) -> Shape {
        match cell {
            None => Shape::Missing,
            Some(c) if c.parse::<i64>().is_ok() => Shape::Integer,
            Some(c) if c.parse::<f64>().is_ok_and(f64::is_finite) => Shape::Decimal,
            Some(_) => Shape::Text,
        }
    }
}

/// One column's statistics over the kept rows (at most m per unit).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ColumnProfile {
    pub name: String,
    /// Rows by [`Shape`]: a unit adds at most m rows (L2 sensitivity m).
    pub shapes: [f64; 4],
    /// Per value present, the number of units holding it: a unit counts once per value,
    /// in at most m values.
    pub values: BTreeMap<String, f64>,
    /// The numeric cells (at most m per unit).
    pub numbers: Vec<f64>,
}

/// The file's columns (the unit column left out) and their statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub columns: Vec<ColumnProfile>,
}

/// The column names on the file's first line, reading no further than that line (at most
/// 64 KiB, else refused: column names are metadata, and nothing past them is read before
/// the ledger's check).
pub async fn header(url: &str, options: &CsvOptions) -> Result<Vec<String>, DataError> {
    let read_err = |message: String| DataError::Read { file: url.to_string(), message };
    let (location, path) = storage::open_file(url).map_err(|e| read_err(e.to_string()))?;
    let raw = location.store.get(&path).await.map_err(|e| read_err(e.to_string()))?.into_stream();
    let mut stream = crate::data::input::decoded(raw).await.map_err(|e| read_err(e.to_string()))?;
    let mut head = Vec::new();
    let line = loop {
        if let Some(line) = first_line(&head).filter(|l| l.len() <= MAX_HEADER_BYTES) {
            break line.to_vec();
        }
        if head.len() > MAX_HEADER_BYTES {
            return Err(read_err(format!("no header line ends within its first {MAX_HEADER_BYTES} bytes")));
        }
        match stream.next().await {
            Some(chunk) => head.extend_from_slice(&chunk.map_err(|e| read_err(e.to_string()))?),
            None => return Err(read_err("no header line".into())),
        }
    };
    let names: Vec<String> = fields(&line, options)
        .ok_or_else(|| read_err("the header line is not UTF-8 or leaves a quote open".into()))?
        .into_iter()
        .map(|n| n.trim().to_string())
        .collect();
    if names.iter().any(String::is_empty) {
        return Err(read_err("the header line names an empty column".into()));
    }
    Ok(names)
}

/// The first non-empty line of `head`, once its end is in `head`.
fn first_line(head: &[u8]) -> Option<&[u8]> {
    let end_of_line = |b: &u8| *b == b'\n' || *b == b'\r';
    let start = head.iter().position(|b| !end_of_line(b))?;
    let len = head[start..].iter().position(end_of_line)?;
    Some(&head[start..start + len])
}

/// The file's lines, split at `\n`, `\r\n` or `\r`; empty lines dropped. A row is one
/// line: a quoted field may not span lines, so what one line holds cannot change how
/// another is read.
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    bytes.split(|b| *b == b'\n' || *b == b'\r').filter(|l| !l.is_empty())
}

/// One line's fields, or `None` when it cannot be a row on its own: not UTF-8, or a quote
/// left open.
fn fields(line: &[u8], options: &CsvOptions) -> Option<Vec<String>> {
    let text = std::str::from_utf8(line).ok()?;
    if text.bytes().filter(|&b| b == b'"').count() % 2 == 1 {
        return None;
    }
    let mut reader =
        csv::ReaderBuilder::new().has_headers(false).delimiter(options.delimiter as u8).from_reader(text.as_bytes());
    let record = reader.records().next()?.ok()?;
    Some(record.iter().map(str::to_string).collect())
}

async fn read(url: &str) -> Result<bytes::Bytes, DataError> {
    let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.to_string(), message: e.to_string() };
    let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
    let get = location.store.get(&path).await.map_err(|e| read_err(&e))?;
    let mut text = crate::data::input::decoded(get.into_stream()).await.map_err(|e| read_err(&e))?;
    let mut bytes = Vec::new();
    while let Some(chunk) = text.next().await {
        bytes.extend_from_slice(&chunk.map_err(|e| read_err(&e))?);
    }
    Ok(bytes::Bytes::from(bytes))
}

/// Reads every row of the CSV at `url` (the header line naming `names`, then one row a
/// line), each cell normalised as the job reader does (`options`). A line that is not a
/// row on its own (not UTF-8, a quote left open, another number of fields, a comment) or
/// that names no unit is left out: that depends on the line alone, and nothing about the
/// rows makes an error. With `unit_column`, each unit's rows are bounded to
/// `max_rows_per_unit` by a reservoir (OS-keyed randomness: which rows are kept is
/// private); without, every row is its own unit.
pub async fn profile(
    url: &str,
    names: &[String],
    options: &CsvOptions,
    unit_column: Option<&str>,
    max_rows_per_unit: u32,
) -> Result<Profile, DataError> {
    let unit = match unit_column {
        Some(u) => Some(names.iter().position(|n| n == u).ok_or_else(|| DataError::Read {
            file: url.into(),
            message: format!("no column '{u}' (the unit column) on the header line"),
        })?),
        None => None,
    };
    let bytes = read(url).await?;
    let kept_columns: Vec<usize> = (0..names.len()).filter(|&c| Some(c) != unit).collect();
    let mut units: HashMap<String, Reservoir<Vec<Option<String>>>> = HashMap::new();
    let mut rows: Vec<Vec<Option<String>>> = Vec::new();
    let mut rng = os_rng().map_err(|e| DataError::Internal(e.to_string()))?;
    let comment = options.comment.map(String::from);
    for line in lines(&bytes).skip(1) {
        if comment.as_ref().is_some_and(|c| line.starts_with(c.as_bytes())) {
            continue;
        }
        let Some(record) = fields(line, options).filter(|r| r.len() == names.len()) else { continue };
        let cell = |c: usize| options.normalise(&record[c]).map(str::to_string);
        let row: Vec<Option<String>> = kept_columns.iter().map(|&c| cell(c)).collect();
        match unit {
            Some(u) => {
                if let Some(id) = cell(u) {
                    units.entry(id).or_default().offer(row, max_rows_per_unit as usize, &mut rng);
                }
            }
            None => rows.push(row),
        }
    }
    let mut columns: Vec<ColumnProfile> =
        kept_columns.iter().map(|&c| ColumnProfile { name: names[c].clone(), ..ColumnProfile::default() }).collect();
    let per_unit: Box<dyn Iterator<Item = Vec<Vec<Option<String>>>>> = match unit {
        Some(_) => Box::new(units.into_values().map(Reservoir::into_kept)),
        None => Box::new(rows.into_iter().map(|row| vec![row])),
    };
    for kept in per_unit {
        for (c, column) in columns.iter_mut().enumerate() {
            let mut held = BTreeSet::new();
            for row in &kept {
                let value = row[c].as_deref();
                let shape = Shape::of(value);
                column.shapes[shape as usize] += 1.0;
                let Some(value) = value else { continue };
                if matches!(shape, Shape::Integer | Shape::Decimal) {
                    column.numbers.push(value.parse().expect("a number"));
                }
                held.insert(value);
            }
            for value in held {
                *column.values.entry(value.to_string()).or_default() += 1.0;
            }
        }
    }
    Ok(Profile { columns })
}
