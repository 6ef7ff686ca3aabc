//! The data plane: the public domain of each column, streaming and encoding the private
//! input, and splitting it into disjoint partitions by privacy unit (on the coordinator, or
//! by the workers in shards).

pub mod csv_split;
pub mod database;
pub mod domain;
pub mod examples;
pub mod histories;
pub mod input;
pub mod parquet_io;
pub mod partition;
pub mod shard;
pub mod sketch;
pub mod source;
pub mod table;

/// Input and partition errors. They name the file, column and row, never a value.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{file}: column '{column}', row {row}: {reason}")]
    Value { file: String, column: String, row: u64, reason: &'static str },
    #[error("{file}: column '{column}' is declared in the job spec but not present in the file")]
    MissingColumn { file: String, column: String },
    #[error("{file}: the header names column '{column}' more than once")]
    DuplicateColumn { file: String, column: String },
    #[error("{file}: {message}")]
    Read { file: String, message: String },
    #[error("data plane: {0}")]
    Internal(String),
}

/// Rows encoded against the public domain: per row its privacy unit, per domain column a
/// value (category code or clamped number; `None` = missing).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EncodedBatch {
    pub units: Vec<String>,
    pub values: Vec<Vec<Option<f64>>>,
}

impl EncodedBatch {
    pub fn empty(columns: usize) -> Self {
        Self { units: Vec::new(), values: vec![Vec::new(); columns] }
    }

    pub fn len(&self) -> usize {
        self.units.len()
    }

    pub fn is_empty(&self) -> bool {
        self.units.is_empty()
    }

    /// This batch without the rows marked in `left_out`.
    pub fn without(self, left_out: &[bool]) -> Self {
        let keep = |i: &usize| !left_out[*i];
        let units = self.units.into_iter().enumerate().filter(|(i, _)| keep(i)).map(|(_, u)| u).collect();
        let values = self
            .values
            .into_iter()
            .map(|column| column.into_iter().enumerate().filter(|(i, _)| keep(i)).map(|(_, v)| v).collect())
            .collect();
        Self { units, values }
    }
}
