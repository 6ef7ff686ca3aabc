//! The worker's side: the model a DP-SGD round trains (its configuration; the round's
//! settings and weights travel beside it) and the worker's histories.

use std::collections::HashMap;

use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::model::SequenceModel;
use super::params::SequenceParams;
use super::tokens::Layout;
use super::window::WindowSpec;
use crate::data::DataError;
use crate::data::domain::Domain;
use crate::data::partition::read_partition;
use crate::decoder::DecoderConfig;
use crate::dpsgd::UnitExamples;
use crate::dpsgd::trainable::{Trainable, Trains};

/// Everything a worker needs to rebuild the model of a job (no weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SequenceModelSpec {
    pub domain: Domain,
    pub layout: Layout,
    pub transformer: DecoderConfig,
    pub window: WindowSpec,
    /// Sizes of the decoder's lag-1 input tables (`Layout::lag_inputs`); empty in a model
    /// charged before they existed (a checkpoint resumed across the upgrade).
    #[serde(default)]
    pub lagged: Vec<usize>,
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
        let mut histories = Histories::default();
        let mut index = HashMap::new();
        for (unit, row) in rows {
            histories.push(&mut index, &unit, row);
        }
        histories.ordered(layout.order_column(), layout.max_rows)
    }

    /// A worker's histories from its partitions (a unit's rows are in one partition),
    /// grouped as they are read, ordered by `order`, the first `max_rows` of each.
    pub async fn load(
        urls: &[String],
        domain: &Domain,
        order: Option<usize>,
        max_rows: usize,
    ) -> Result<Self, DataError> {
        let mut histories = Histories::default();
        let mut index = HashMap::new();
        for url in urls {
            read_partition(url, domain, |batch| {
                for (r, unit) in batch.units.iter().enumerate() {
                    histories.push(&mut index, unit, batch.values.iter().map(|column| column[r]).collect());
                }
                Ok(())
            })
            .await?;
        }
        Ok(histories.ordered(order, max_rows))
    }

    /// Adds a row to its unit's history; `index` maps unit ids to positions (an id is
    /// copied once per unit, not per row).
    fn push(&mut self, index: &mut HashMap<String, usize>, unit: &str, row: Vec<Option<f64>>) {
        let i = match index.get(unit) {
            Some(&i) => i,
            None => {
                index.insert(unit.to_string(), self.units.len());
                self.units.push((unit.to_string(), Vec::new()));
                self.units.len() - 1
            }
        };
        self.units[i].1.push(row);
    }

    /// Each unit's rows in order, the first `max_rows` of them.
    fn ordered(mut self, order: Option<usize>, max_rows: usize) -> Self {
        for (_, rows) in &mut self.units {
            if let Some(order) = order {
                rows.sort_by(|a, b| match (a[order], b[order]) {
                    (Some(x), Some(y)) => x.total_cmp(&y),
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (None, None) => std::cmp::Ordering::Equal,
                });
            }
            rows.truncate(max_rows);
            rows.shrink_to_fit();
        }
        self
    }
}

impl SequenceModelSpec {
    /// The worker's histories from its partitions (a unit's rows are in one partition),
    /// grouped as they are read.
    pub async fn load_histories(&self, urls: &[String]) -> Result<Histories, DataError> {
        Histories::load(urls, &self.domain, self.layout.order_column(), self.layout.max_rows).await
    }
}

impl Trains for SequenceParams {
    type Model = SequenceModelSpec;
}

impl Trainable for SequenceModelSpec {
    type Model = SequenceModel;
    type Error = std::convert::Infallible;

    async fn build(&self, device: &Device) -> Result<SequenceModel, Self::Error> {
        Ok(SequenceModel::new(self, device))
    }

    async fn load(&self, urls: &[String]) -> Result<Histories, DataError> {
        self.load_histories(urls).await
    }
}
