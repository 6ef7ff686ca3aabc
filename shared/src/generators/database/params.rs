//! `[generator.database]`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::generators::aim::AimParams;
use crate::generators::params::{GeneratorParams, PublicInputs};

/// Parameters of the database generator: AIM over each table's view, with its share of
/// the job's ρ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DatabaseParams {
    /// Each view's AIM run (`[generator.database.aim]`). A view's bound on a unit's rows
    /// is its table's cap product, so `max_rows_per_unit` is not set here; `target_share`
    /// goes with `target`.
    pub aim: AimParams,
    /// A column of one table, `TABLE.COLUMN`, the database's declared downstream use (the
    /// label a model will learn, e.g. `admissions.outcome`): its table's view measures the
    /// column's pair with every other column of the view, and each descendant table's view
    /// its pair with each of that table's own columns, first, with `aim.target_share` of the
    /// view's ρ (default 0.2), so its links across the tables do not rest on AIM selecting
    /// them. For cohorts of thousands of units: at a few hundred, its pairs' cells are
    /// noise (docs/database.md).
    pub target: Option<String>,
    /// Each table's weight in the split of ρ among the views, by table name; a table not
    /// named weighs 1.
    pub weights: BTreeMap<String, f64>,
    /// Each view holds the mean of its children's plain numeric values over a row's
    /// children, and a child value is drawn given its parent's mean of it: its links to
    /// its ancestors are then measured at the parent's bound, not its own larger one
    /// (docs/database.md, "Children's means"). Each mean is one more column of the
    /// parent's view, whose one-way table takes its share of the view's ρ: for cohorts
    /// of thousands of units. On by default.
    pub means: bool,
    /// A child table whose rows lie inside their parent's interval (an own column
    /// `within` two of its ancestors' values: charts inside their admission) is held in
    /// its parent's view also as its rows per unit of the interval's length
    /// (`__rate.<child>`), and the counts drawn are given to the rows in the order of their
    /// drawn rate times their drawn interval: a count that follows its parent's length
    /// keeps it (docs/database.md, "Children per span"). On by default.
    pub rates: bool,
    /// With a `target` below the root: tilt the target's table's model, before the
    /// database is drawn, until rows drawn under synthetic parents hold the target's
    /// measured conditionals as the model holds them (`generators::database::rake`). A row
    /// drawn given many columns otherwise counts what they say alike many times over, and
    /// the target's rate drifts (deaths drawn at 4.4–7.1% of admissions, 8.1% real).
    /// Post-processing: free; at most 16 tilts of 20,000 drawn rows, none once the drawn
    /// conditionals are within chance of the model's (docs/database.md). On by default;
    /// declare it `false` for a target that is one of a sequence's values on a cohort of a
    /// few hundred units: tilted given the previous row's values, it drags the row's other
    /// values and their persistence (PBC at ε = 4, docs/database.md).
    pub rake: bool,
}

impl Default for DatabaseParams {
    fn default() -> Self {
        Self { aim: AimParams::default(), target: None, weights: BTreeMap::new(), means: true, rates: true, rake: true }
    }
}

impl GeneratorParams for DatabaseParams {
    fn validate(&self) -> Result<(), String> {
        self.aim.validate().map_err(|e| e.replace("[generator.aim]", "[generator.database.aim]"))?;
        if self.aim.max_rows_per_unit != AimParams::default().max_rows_per_unit {
            return Err("[generator.database.aim]: a view is bounded by its table's caps (max_per_parent): leave \
                        max_rows_per_unit out"
                .into());
        }
        if self.aim.target_share.is_some() && self.target.is_none() {
            return Err("[generator.database.aim] target_share is the share of [generator.database] target's pairs: \
                        declare the target"
                .into());
        }
        if self.target.as_deref().is_some_and(|t| t.split_once('.').is_none_or(|(t, c)| t.is_empty() || c.is_empty())) {
            return Err("[generator.database] target is TABLE.COLUMN, a column of one of the job's tables".into());
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
