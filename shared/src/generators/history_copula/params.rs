//! `[generator.history_copula]`.

use serde::{Deserialize, Serialize};

use crate::generators::params::{DEFAULT_BINS, DEFAULT_GAP_BINS, GeneratorParams, PublicInputs};

/// Parameters of the history copula: whole histories drawn from a Gaussian copula whose
/// latent normals follow a VAR(1), fitted to two released rounds of bounded per-unit
/// statistics (margins, then same-row and lag-1 moments) and a length histogram.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryCopulaParams {
    /// Columns that hold one value per unit: modelled with the rest, written from the
    /// history's first row on every row.
    pub static_columns: Vec<String>,
    /// Rows of a history read (its first ones in order), and the most a drawn one has.
    pub max_rows: usize,
    /// Geometric bins of the gap between consecutive order values.
    pub gap_bins: u32,
    /// Shares of the job's budget (zCDP terms, where Gaussian releases add up) spent on
    /// the margins and on the length histogram; the moments get the rest.
    pub margin_share: f64,
    pub length_share: f64,
    /// L2 bound of one unit's moments vector; default: the number of modelled columns.
    pub moment_clip: Option<f64>,
}

impl Default for HistoryCopulaParams {
    fn default() -> Self {
        Self {
            static_columns: Vec::new(),
            max_rows: 50,
            gap_bins: DEFAULT_GAP_BINS,
            margin_share: 0.3,
            length_share: 0.05,
            moment_clip: None,
        }
    }
}

impl GeneratorParams for HistoryCopulaParams {
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    fn default_bins(&self) -> u32 {
        DEFAULT_BINS
    }

    fn draws_histories(&self) -> bool {
        true
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs::none()
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs::none()
    }
}
