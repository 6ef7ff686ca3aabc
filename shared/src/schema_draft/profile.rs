//! What a CSV file's rows say about each column, each privacy unit's rows bounded to m: the
//! private statistics a schema draft is made from (released with DP, or shown to the data
//! owner as they are).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::data::DataError;
use crate::entropy::os_rng;
use crate::sampling::Reservoir;
use crate::storage;
use object_store::ObjectStoreExt;

/// What one cell holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    Integer = 0,
    Decimal = 1,
    Text = 2,
    Missing = 3,
}

impl Shape {
    /// Trimmed: empty and `NA` are missing (the job reader's defaults).
    pub fn of(cell: &str) -> Shape {
        match cell {
            "" | "NA" => Shape::Missing,
            _ if cell.parse::<i64>().is_ok() => Shape::Integer,
            _ if cell.parse::<f64>().is_ok_and(f64::is_finite) => Shape::Decimal,
            _ => Shape::Text,
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

async fn read(url: &str) -> Result<bytes::Bytes, DataError> {
    let read_err = |e: &dyn std::fmt::Display| DataError::Read { file: url.to_string(), message: e.to_string() };
    let (location, path) = storage::open_file(url).map_err(|e| read_err(&e))?;
    let get = location.store.get(&path).await.map_err(|e| read_err(&e))?;
    get.bytes().await.map_err(|e| read_err(&e))
}

/// Reads every row of the CSV at `url` (a header line naming `names`, then rows). Rows
/// with another number of fields, or with no unit id, are left out: leaving a row out
/// depends on that row alone, and no reading error depends on the rows. With
/// `unit_column`, each unit's rows are bounded to `max_rows_per_unit` by a reservoir
/// (OS-keyed randomness: which rows are kept is private); without, every row is its own
/// unit.
pub async fn profile(
    url: &str,
    names: &[String],
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
    let mut reader = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(bytes.as_ref());
    let kept_columns: Vec<usize> = (0..names.len()).filter(|&c| Some(c) != unit).collect();
    let mut units: HashMap<String, Reservoir<Vec<String>>> = HashMap::new();
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut rng = os_rng().map_err(|e| DataError::Internal(e.to_string()))?;
    for record in reader.byte_records() {
        // Reading from memory, a record only fails on I/O: never on its content.
        let record = record.map_err(|e| DataError::Read { file: url.into(), message: e.to_string() })?;
        if record.len() != names.len() {
            continue;
        }
        let cell = |c: usize| String::from_utf8_lossy(&record[c]).trim().to_string();
        let row: Vec<String> = kept_columns.iter().map(|&c| cell(c)).collect();
        match unit {
            Some(u) => {
                let id = cell(u);
                if Shape::of(&id) != Shape::Missing {
                    units.entry(id).or_default().offer(row, max_rows_per_unit as usize, &mut rng);
                }
            }
            None => rows.push(row),
        }
    }
    let mut columns: Vec<ColumnProfile> =
        kept_columns.iter().map(|&c| ColumnProfile { name: names[c].clone(), ..ColumnProfile::default() }).collect();
    let per_unit: Box<dyn Iterator<Item = Vec<Vec<String>>>> = match unit {
        Some(_) => Box::new(units.into_values().map(Reservoir::into_kept)),
        None => Box::new(rows.into_iter().map(|row| vec![row])),
    };
    for kept in per_unit {
        for (c, column) in columns.iter_mut().enumerate() {
            let mut held = BTreeSet::new();
            for row in &kept {
                let shape = Shape::of(&row[c]);
                column.shapes[shape as usize] += 1.0;
                match shape {
                    Shape::Missing => continue,
                    Shape::Integer | Shape::Decimal => column.numbers.push(row[c].parse().expect("a number")),
                    Shape::Text => {}
                }
                held.insert(row[c].as_str());
            }
            for value in held {
                *column.values.entry(value.to_string()).or_default() += 1.0;
            }
        }
    }
    Ok(Profile { columns })
}
