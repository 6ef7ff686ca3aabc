//! The worker's side: the model a DP-SGD round trains (its configuration; the round's
//! settings and weights travel beside it) and the worker's histories.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::model::TransformerConfig;
use super::tokens::Layout;
use super::window::WindowSpec;
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::partition::read_partition;
use crate::dpsgd::UnitExamples;

/// Everything a worker needs to rebuild the model of a job (no weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SequenceModelSpec {
    pub domain: Domain,
    pub layout: Layout,
    pub transformer: TransformerConfig,
    pub window: WindowSpec,
}

/// A worker's units, each with its rows in order (values in domain order), at most the
/// layout's `max_rows` of them (the first ones).
#[derive(Clone, Debug, Default)]
pub struct Histories {
    pub units: Vec<(String, Vec<Vec<Option<f64>>>)>,
}

impl UnitExamples for Histories {
    fn unit_count(&self) -> usize {
        self.units.len()
    }
}

impl Histories {
    /// Groups rows by unit (in first-seen order) and orders each unit's rows by the order
    /// column, missing values last, ties in file order.
    pub fn from_rows(rows: impl IntoIterator<Item = (String, Vec<Option<f64>>)>, layout: &Layout) -> Self {
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut units: Vec<(String, Vec<Vec<Option<f64>>>)> = Vec::new();
        for (unit, row) in rows {
            let i = *index.entry(unit.clone()).or_insert_with(|| {
                units.push((unit, Vec::new()));
                units.len() - 1
            });
            units[i].1.push(row);
        }
        if let Some(order) = layout.order_column() {
            for (_, rows) in &mut units {
                rows.sort_by(|a, b| match (a[order], b[order]) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => std::cmp::Ordering::Equal,
                });
            }
        }
        for (_, rows) in &mut units {
            rows.truncate(layout.max_rows);
        }
        Self { units }
    }
}

impl SequenceModelSpec {
    /// The worker's histories from its partitions (a unit's rows are in one partition).
    pub async fn load_histories(&self, urls: &[String]) -> Result<Histories, DataError> {
        let mut rows = Vec::new();
        for url in urls {
            read_partition(url, &self.domain, |batch| {
                for (r, unit) in batch.units.iter().enumerate() {
                    rows.push((unit.clone(), batch.values.iter().map(|column| column[r]).collect()));
                }
                Ok(())
            })
            .await?;
        }
        Ok(Histories::from_rows(rows, &self.layout))
    }
}

/// The model as `SequenceModel` (`dpsynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use dpsynth_proto::SequenceModel;

    use super::SequenceModelSpec;
    use crate::wire::{WireError, from_json, to_json};

    impl From<&SequenceModelSpec> for SequenceModel {
        fn from(spec: &SequenceModelSpec) -> Self {
            Self { spec_json: to_json(spec) }
        }
    }

    impl TryFrom<&SequenceModel> for SequenceModelSpec {
        type Error = WireError;

        fn try_from(wire: &SequenceModel) -> Result<Self, WireError> {
            from_json("sequence model", &wire.spec_json)
        }
    }
}
