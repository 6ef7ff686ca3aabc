//! `[generator.database]`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::generators::aim::AimParams;
use crate::generators::params::{GeneratorParams, PublicInputs};

/// Parameters of the database generator: AIM over each table's view, with its share of
/// the job's ρ.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseParams {
    /// Each view's AIM run (`[generator.database.aim]`). A view's bound on a unit's rows
    /// is its table's cap product, so `max_rows_per_unit` is not set here; a database
    /// declares no target, so neither is `target_share`.
    pub aim: AimParams,
    /// Each table's weight in the split of ρ among the views, by table name; a table not
    /// named weighs 1.
    pub weights: BTreeMap<String, f64>,
}

impl GeneratorParams for DatabaseParams {
    fn validate(&self) -> Result<(), String> {
        self.aim.validate().map_err(|e| e.replace("[generator.aim]", "[generator.database.aim]"))?;
        if self.aim.max_rows_per_unit != AimParams::default().max_rows_per_unit || self.aim.target_share.is_some() {
            return Err("[generator.database.aim]: a view is bounded by its table's caps (max_per_parent) and a \
                        database has no target: leave max_rows_per_unit and target_share out"
                .into());
        }
        if let Some((name, w)) = self.weights.iter().find(|(_, w)| !(w.is_finite() && **w > 0.0)) {
            return Err(format!("[generator.database] weights: table '{name}' weighs {w}; weights are positive"));
        }
        Ok(())
    }

    fn default_bins(&self) -> u32 {
        self.aim.default_bins
    }

    fn draws_histories(&self) -> bool {
        false
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs::none()
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs::none()
    }
}
