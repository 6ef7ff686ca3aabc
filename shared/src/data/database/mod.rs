//! A database by privacy unit (`[[tables]]`, `spec::tables`): read by unit into one set
//! of partitions per table under one partition key ([`partition`]), so a unit's rows in
//! every table land in the same partition index and a worker sees the unit whole; that
//! worker caps it by the spec's public rule ([`cap`]). A kept child row carries its place
//! under its unit (its ordinal among the unit's rows of its table, and its parent's),
//! never a key.

pub mod cap;
pub mod partition;
pub mod passes;
pub mod view;

use crate::data::source::Source;
use crate::generators::GeneratorSpec;
use crate::spec::{JobSpec, SchemaSpec, TableSpec};

pub use cap::DroppedRows;
pub use partition::{PartitionedTable, partition_database};
pub use passes::read_units;
pub use view::{DatabaseView, Layout, UnitRows, View};

/// A child row's ordinal among its unit's rows of its table (in parent order, then the
/// table's cap order).
pub const ROW_COLUMN: &str = "__row";
/// A child row's parent's ordinal among its unit's rows of the parent table (0 under the
/// root).
pub const PARENT_COLUMN: &str = "__parent";
/// A child row's own key as partitioned (a hash: `partition`), before it is capped.
pub const KEY_COLUMN: &str = "__key";
/// A child row's parent's key as partitioned (a hash), before it is capped.
pub const PARENT_KEY_COLUMN: &str = "__parent_key";

/// A database job's tables: the root (the job's `[input]` and `[schema]`) and the tables
/// below it, parents first (as `spec::tables::validate` checks).
pub struct Database<'a> {
    pub root_input: &'a Source,
    pub root_schema: &'a SchemaSpec,
    pub tables: &'a [TableSpec],
    /// Bins of a numeric column that declares none (the generator's).
    pub default_bins: u32,
    /// Whether views hold their children's means (`DatabaseParams::means`).
    pub means: bool,
    /// Whether views hold a child inside its parent's interval as a rate over it
    /// (`DatabaseParams::rates`).
    pub rates: bool,
}

impl<'a> Database<'a> {
    pub fn of_spec(spec: &'a JobSpec) -> Self {
        Self {
            root_input: &spec.input,
            root_schema: &spec.schema,
            tables: &spec.tables,
            default_bins: spec.generator.default_bins(),
            means: match &spec.generator {
                GeneratorSpec::Database(params) => params.means,
                _ => true,
            },
            rates: match &spec.generator {
                GeneratorSpec::Database(params) => params.rates,
                _ => true,
            },
        }
    }

    pub(super) fn root_name(&self) -> &str {
        self.root_schema.table.as_deref().unwrap_or("root")
    }

    /// The unit's key column, in every table.
    pub(super) fn unit_key(&self) -> &str {
        self.root_schema.unit_column.as_deref().expect("a validated database names its unit column")
    }
}
