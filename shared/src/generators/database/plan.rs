//! What a database job measures and spends, planned from the spec alone: one AIM plan per
//! table's view, each with its share of one zCDP budget.
//!
//! Privacy: one patient (the unit) reaches at most its table's cap product of rows in a
//! view, so each view's AIM run measures and selects at that sensitivity
//! (`AimPlan::over_view`), spending at most its share ρₜ. The runs compose: under
//! add/remove of one unit the whole job is ρ-zCDP with ρ = Σ ρₜ, charged once before the
//! first release. Everything sampled after is post-processing.

use serde::{Deserialize, Serialize};

use crate::accounting::accountant::{Accountant, AccountingOptions, zcdp_budget};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::database::cap::{UNIT_ROWS_BYTES, row_bytes, unit_rows_bytes};
use crate::data::database::view::ColumnAt;
use crate::data::database::{Database, DatabaseView, Layout, View};
use crate::data::domain::Domain;
use crate::generators::aim::AimPlan;
use crate::generators::{GeneratorSpec, PlanError};
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "database";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// A database job's plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DatabasePlan {
    pub layout: Layout,
    /// One AIM run per table's view, in layout order (the root first).
    pub views: Vec<AimPlan>,
    /// The job's zCDP budget: the views' shares together.
    pub rho: f64,
    /// The target whose table's model is raked before drawing (`DatabaseParams::rake`):
    /// a target below the root, with `rake` on.
    #[serde(default)]
    pub rake: Option<ColumnAt>,
}

/// Plans from the spec alone, as a job is submitted.
pub fn check(spec: &JobSpec, _domain: &Domain) -> Result<(), PlanError> {
    DatabasePlan::new(spec, &AccountingOptions::default()).map(drop)
}

impl DatabasePlan {
    pub fn new(spec: &JobSpec, options: &AccountingOptions) -> Result<Self, PlanError> {
        let GeneratorSpec::Database(params) = &spec.generator else {
            return Err(invalid("the job's generator is another"));
        };
        if spec.tables.is_empty() {
            return Err(invalid("a database job declares its tables below the root: [[tables]]"));
        }
        if spec.privacy.accountant != Accountant::Rdp {
            return Err(invalid("its AIM runs spend a zCDP budget, which only the RDP accountant analyses"));
        }
        if spec.calibration.is_some() || spec.schema.target.is_some() || spec.evaluation.is_some() {
            return Err(invalid(
                "a database job takes no [calibration], no [schema] target and no [evaluation] (not yet: \
                 docs/database.md)",
            ));
        }
        let layout = Layout::of(&Database::of_spec(spec));
        let held = unit_bytes(&layout);
        if held > UNIT_ROWS_BYTES {
            return Err(invalid(format!(
                "its caps (each table's max_per_parent, multiplied down the tables) let one unit's rows hold up to \
                 {} MiB on a worker, above the {} MiB a worker holds of one unit: lower the caps",
                held.div_ceil(1 << 20),
                UNIT_ROWS_BYTES >> 20
            )));
        }
        if let Some(name) = params.weights.keys().find(|name| !layout.tables.iter().any(|t| &t.name == *name)) {
            return Err(invalid(format!("weights name table '{name}', which the job does not declare")));
        }
        let target = params.target.as_deref().map(|target| target_column(&layout, target)).transpose()?;
        let weights: Vec<f64> =
            layout.tables.iter().map(|t| params.weights.get(&t.name).copied().unwrap_or(1.0)).collect();
        let total: f64 = weights.iter().sum();
        let rho = zcdp_budget(spec.privacy.epsilon, spec.privacy.delta, options).map_err(|e| invalid(e.to_string()))?;
        let views = weights
            .iter()
            .enumerate()
            .map(|(table, w)| {
                let view = DatabaseView { layout: layout.clone(), view: View { table } };
                let name = &layout.tables[table].name;
                AimPlan::over_view(&params.aim, view, target, rho * w / total)
                    .map_err(|e| invalid(format!("the view of table '{name}': {e}")))
            })
            .collect::<Result<_, _>>()?;
        let rake = target.filter(|t| params.rake && layout.tables[t.table].parent.is_some());
        Ok(Self { layout, views, rho, rake })
    }

    /// The one charge: the job's zCDP budget.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        vec![Mechanism::Zcdp { rho: self.rho, adjacency: Adjacency::AddRemove }]
    }
}

/// The most a worker holds for one unit while counting a view: its capped rows
/// (`cap::unit_rows_bytes`) and its rows of the widest view, from the caps alone.
fn unit_bytes(layout: &Layout) -> u64 {
    let view_rows = (0..layout.tables.len()).map(|table| {
        let columns = View { table }.domain(layout).columns.len();
        layout.reach(table).saturating_mul(row_bytes(columns))
    });
    unit_rows_bytes(layout).saturating_add(view_rows.max().unwrap_or(0))
}

/// The target `TABLE.COLUMN` as a layout column: a value column of a declared table.
fn target_column(layout: &Layout, target: &str) -> Result<ColumnAt, PlanError> {
    let refuse = |reason: String| invalid(format!("[generator.database] target '{target}': {reason}"));
    let (table, column) = target.split_once('.').ok_or_else(|| refuse("not TABLE.COLUMN".into()))?;
    let t = layout.tables.iter().position(|t| t.name.eq_ignore_ascii_case(table));
    let t = t.ok_or_else(|| refuse(format!("the job declares no table '{table}'")))?;
    let c = layout.tables[t].domain.index_of(column).filter(|&c| c < layout.tables[t].values());
    let c = c.ok_or_else(|| refuse(format!("table '{}' has no value column '{column}'", layout.tables[t].name)))?;
    Ok(ColumnAt { table: t, column: c })
}
