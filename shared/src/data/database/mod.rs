//! A database by privacy unit (`[[tables]]`, `spec::tables`): read and capped by unit
//! into one set of partitions per table under one partition key ([`partition`]), so a
//! unit's rows in every table land in the same partition index and a worker sees the unit
//! whole. A child row carries its place under its unit (its ordinal among the unit's rows
//! of its table, and its parent's), never a key.

pub mod partition;
pub mod view;

use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::data::source::Source;
use crate::spec::{ColumnKind, JobSpec, SchemaSpec, TableSpec};

pub use partition::{DroppedRows, PartitionedTable, partition_database};
pub use view::{DatabaseView, Layout, UnitRows, View, read_units};

/// A child row's ordinal among its unit's rows of its table (in parent order, then the
/// table's cap order).
pub const ROW_COLUMN: &str = "__row";
/// A child row's parent's ordinal among its unit's rows of the parent table (0 under the
/// root).
pub const PARENT_COLUMN: &str = "__parent";

/// A database job's tables: the root (the job's `[input]` and `[schema]`) and the tables
/// below it, parents first (as `spec::tables::validate` checks).
pub struct Database<'a> {
    pub root_input: &'a Source,
    pub root_schema: &'a SchemaSpec,
    pub tables: &'a [TableSpec],
    /// Bins of a numeric column that declares none (the generator's).
    pub default_bins: u32,
}

impl<'a> Database<'a> {
    pub fn of_spec(spec: &'a JobSpec) -> Self {
        Self {
            root_input: &spec.input,
            root_schema: &spec.schema,
            tables: &spec.tables,
            default_bins: spec.generator.default_bins(),
        }
    }

    pub(super) fn root_name(&self) -> &str {
        self.root_schema.table.as_deref().unwrap_or("root")
    }

    /// The unit's key column, in every table.
    pub(super) fn unit_key(&self) -> &str {
        self.root_schema.unit_column.as_deref().expect("a validated database names its unit column")
    }

    /// The most rows of `table` one unit reaches: the product of the caps on its path.
    fn reach(&self, table: &str) -> u64 {
        if table == self.root_name() {
            return 1;
        }
        let child = self.tables.iter().find(|t| t.name == table).expect("a validated parent");
        self.reach(&child.parent.table) * u64::from(child.max_per_parent)
    }

    /// A child table's partition domain: its columns, then [`ROW_COLUMN`] and
    /// [`PARENT_COLUMN`].
    pub fn child_domain(&self, table: &TableSpec) -> Domain {
        let mut domain = Domain::of_columns(&table.columns, self.default_bins);
        let ordinal = |name: &str, reach: u64| {
            let max = reach.saturating_sub(1) as f64;
            let binning = Binning::Integer(vec![(0, max as i64)]);
            let encoding = Encoding::Numeric { kind: ColumnKind::Integer, min: 0.0, max, binning };
            ColumnDomain { name: name.to_string(), encoding, missing: false }
        };
        domain.columns.push(ordinal(ROW_COLUMN, self.reach(&table.name)));
        domain.columns.push(ordinal(PARENT_COLUMN, self.reach(&table.parent.table)));
        domain
    }
}
