//! `[generator.marginals]`.

use serde::{Deserialize, Serialize};

use crate::generators::params::{DEFAULT_BINS, GeneratorParams, MAX_GAP_BINS, MAX_HISTORY_ROWS, PublicInputs};

/// Parameters of the DP marginals generator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MarginalsParams {
    /// Rows a unit may contribute; a unit with more is subsampled inside its worker.
    pub max_rows_per_unit: u32,
    /// Two-way marginals to measure, as `[column, column]` pairs (any graph: the fitted
    /// model handles cycles, within a clique-size limit). Default: a star around the
    /// target column, or a chain in column order without a target; with `history_rows`,
    /// none (a pair is then measured within every step).
    pub pairs: Option<Vec<[String; 2]>>,
    /// Bins for numeric columns without `bins` (integer columns with at most this many
    /// values get one bin per value).
    pub default_bins: u32,
    /// PATH's "Direct" baseline: each unit's first `history_rows` rows (in `order_by`
    /// order) as one flattened row, measured as every step's 1-way tables and each
    /// column's table of adjacent steps; the output is whole histories.
    pub history_rows: Option<u32>,
    /// With `history_rows`: columns holding one value per unit, measured once (from its
    /// first row) and written on every row of a history.
    pub static_columns: Vec<String>,
    /// With `history_rows`: geometric bins of the gap between consecutive order values
    /// (default [`DEFAULT_GAP_BINS`](crate::generators::params::DEFAULT_GAP_BINS)).
    pub gap_bins: Option<u32>,
}

impl Default for MarginalsParams {
    fn default() -> Self {
        Self {
            max_rows_per_unit: 1,
            pairs: None,
            default_bins: DEFAULT_BINS,
            history_rows: None,
            static_columns: Vec::new(),
            gap_bins: None,
        }
    }
}

impl GeneratorParams for MarginalsParams {
    fn validate(&self) -> Result<(), String> {
        if self.max_rows_per_unit == 0
            || self.default_bins < 2
            || self.gap_bins.is_some_and(|g| !(1..=MAX_GAP_BINS).contains(&g))
        {
            return Err(
                "[generator.marginals] needs max_rows_per_unit ≥ 1, default_bins ≥ 2 and 1 ≤ gap_bins ≤ 64".into()
            );
        }
        match self.history_rows {
            Some(rows) if !(1..=MAX_HISTORY_ROWS).contains(&rows) => {
                Err(format!("[generator.marginals] history_rows must be between 1 and {MAX_HISTORY_ROWS}"))
            }
            Some(_) if self.max_rows_per_unit != 1 => Err("[generator.marginals] with history_rows a unit is one \
                                                           flattened history: max_rows_per_unit does not apply"
                .into()),
            None if !self.static_columns.is_empty() || self.gap_bins.is_some() => {
                Err("[generator.marginals] static_columns and gap_bins need history_rows".into())
            }
            _ => Ok(()),
        }
    }

    fn default_bins(&self) -> u32 {
        self.default_bins
    }

    /// PATH's Direct draws a flattened history per unit.
    fn draws_histories(&self) -> bool {
        self.history_rows.is_some()
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs::none()
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs::none()
    }
}
