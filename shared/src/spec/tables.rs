//! `[[tables]]`: the tables of a database job below its root. The job's own `[input]` and
//! `[schema]` are the root table (one row per privacy unit, keyed by its `unit_column`,
//! named by its `table`); each table here names its parent, the column that refers to the
//! parent's key, and a public cap on its rows per parent row. One unit then reaches at most
//! the product of the caps along a table's path: the sensitivity of every release.
//!
//! Every table carries the unit's key (a column named as the root's `unit_column`): a
//! row's unit is read from the row itself and its parent looked up among that unit's rows
//! only, so which rows a unit keeps never depends on another unit's rows (a key repeated
//! across units, or another unit added, changes nothing of it).

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::schema::{ColumnKind, ColumnSpec, SchemaSpec};
use crate::data::source::Source;

/// Prefix of the columns a database's partitions add (a row's place under its unit):
/// reserved in every table.
pub const RESERVED_PREFIX: &str = "__";

/// A table below the root.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// Names the table's output dataset and its children's `parent.table`.
    pub name: String,
    pub input: Source,
    /// This table's own key (an identifier column), which its child tables refer to.
    #[serde(default)]
    pub key: Option<String>,
    pub parent: ParentSpec,
    /// Which rows of a parent row are kept under the cap: the first by this numeric or
    /// datetime column (missing values last); absent, a fixed-seed sample.
    #[serde(default)]
    pub order_by: Option<String>,
    /// Public cap on this table's rows per parent row; rows beyond it are dropped, with
    /// their own children.
    pub max_per_parent: u32,
    pub columns: Vec<ColumnSpec>,
}

/// The parent of a table: its name, and the column of this table holding the parent's key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParentSpec {
    pub table: String,
    pub key: String,
}

impl TableSpec {
    fn column(&self, name: &str) -> Option<&ColumnSpec> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// This table as a schema read by the unit's key (`unit`, the root's `unit_column`).
    pub fn schema(&self, unit: &str) -> SchemaSpec {
        SchemaSpec {
            unit_column: Some(unit.to_string()),
            target: None,
            positive_class: None,
            order_by: self.order_by.clone(),
            table: Some(self.name.clone()),
            columns: self.columns.clone(),
        }
    }
}

/// A table's name names an output prefix: the rule of a dataset id, without dots.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if valid { Ok(()) } else { Err(format!("table name {name:?}: use 1 to 64 letters, digits, '_' and '-'")) }
}

/// Checks a database's tables against the root's input and schema: unique valid names,
/// parents declared before their children, keys and order columns that exist with the
/// right kind, keys read alike in every table, and caps whose products along every path
/// fit in 32 bits. Returns each table's cap
/// product (the most rows one unit can reach in it), root first.
pub fn validate(root_input: &Source, root: &SchemaSpec, tables: &[TableSpec]) -> Result<Vec<u64>, String> {
    let Some(root_name) = &root.table else {
        return Err("a database job names its root table: [schema] table = \"…\"".into());
    };
    let Some(root_key) = &root.unit_column else {
        return Err("a database job's root table needs its key as [schema] unit_column (the privacy unit)".into());
    };
    let mut reach: HashMap<&str, (u64, Option<&str>)> = HashMap::new();
    let mut products = vec![1];
    for name in std::iter::once(root_name).chain(tables.iter().map(|t| &t.name)) {
        check_name(name)?;
    }
    for column in root.columns.iter().chain(tables.iter().flat_map(|t| &t.columns)) {
        if column.name.starts_with(RESERVED_PREFIX) {
            return Err(format!("column '{}': names starting with {RESERVED_PREFIX} are reserved", column.name));
        }
    }
    reach.insert(root_name, (1, Some(root_key)));
    for table in tables {
        let name = &table.name;
        // Keys are compared as read: a table trimming or stripping a suffix the root does
        // not would join one patient's rows to another's key.
        let (ours, root_csv) = (&table.input.csv, &root_input.csv);
        if ours.trim != root_csv.trim
            || ours.strip_suffix != root_csv.strip_suffix
            || ours.null_values != root_csv.null_values
        {
            return Err(format!(
                "table '{name}': its input must trim, strip suffixes and read nulls as [input.csv] does, so that keys \
                 read alike"
            ));
        }
        let mut names = HashSet::new();
        for c in &table.columns {
            if !names.insert(c.name.as_str()) {
                return Err(format!("table '{name}': column '{}' is declared twice", c.name));
            }
            c.validate().map_err(|e| format!("table '{name}': {e}"))?;
        }
        let identifier = |column: &str, role: &str| match table.column(column) {
            Some(c) if c.kind == ColumnKind::Identifier => Ok(()),
            Some(_) => Err(format!("table '{name}': {role} '{column}' must have kind = \"identifier\"")),
            None => Err(format!("table '{name}': {role} '{column}' is not among its columns")),
        };
        identifier(root_key, "the unit's key")?;
        identifier(&table.parent.key, "parent key")?;
        if let Some(key) = &table.key {
            identifier(key, "key")?;
            if key == &table.parent.key || key == root_key {
                return Err(format!("table '{name}': its key must be a column of its own, not its parent's or unit's"));
            }
        }
        if let Some(order) = &table.order_by {
            match table.column(order) {
                Some(c) if !matches!(c.kind, ColumnKind::Identifier | ColumnKind::Categorical) => {}
                _ => return Err(format!("table '{name}': order_by '{order}' must be a numeric or datetime column")),
            }
        }
        let parent = &table.parent.table;
        let (parent_reach, parent_key) = match reach.get(parent.as_str()) {
            Some(found) => *found,
            None if tables.iter().any(|t| &t.name == parent) => {
                return Err(format!("table '{name}': its parent '{parent}' must be declared before it"));
            }
            None => return Err(format!("table '{name}': its parent '{parent}' is not a table of the job")),
        };
        if parent_key.is_none() {
            return Err(format!("table '{name}': its parent '{parent}' declares no `key` to refer to"));
        }
        let under_root = &table.parent.table == root_name;
        if under_root != (&table.parent.key == root_key) {
            return Err(format!(
                "table '{name}': the unit's key '{root_key}' is the parent key of the tables under the root, and only theirs"
            ));
        }
        if table.max_per_parent == 0 {
            return Err(format!("table '{name}': max_per_parent must be at least 1"));
        }
        let product = parent_reach
            .checked_mul(u64::from(table.max_per_parent))
            .filter(|p| *p <= u64::from(u32::MAX))
            .ok_or_else(|| format!("table '{name}': the product of the caps along its path exceeds 2³²"))?;
        if reach.insert(name, (product, table.key.as_deref())).is_some() {
            return Err(format!("table name '{name}' is declared twice"));
        }
        products.push(product);
    }
    Ok(products)
}

#[cfg(test)]
mod tests {
    use crate::spec::JobSpec;
    use crate::testing::{generator, schema_job};

    const ROOT: &str =
        "table = \"patients\"\nunit_column = \"id\"\n[[schema.columns]]\nname = \"id\"\nkind = \"identifier\"";

    const STAYS: &str = r#"
[[tables]]
name = "stays"
key = "stay"
parent = { table = "patients", key = "id" }
order_by = "start"
max_per_parent = 4
input = { urls = ["stays.csv"] }
columns = [
  { name = "stay", kind = "identifier" },
  { name = "id", kind = "identifier" },
  { name = "start", kind = "datetime", min = "2020-01-01", max = "2030-01-01" },
  { name = "ward", kind = "categorical", categories = ["a", "b"] },
]

[[tables]]
name = "charts"
parent = { table = "stays", key = "stay" }
max_per_parent = 50
input = { urls = ["charts.csv"] }
columns = [
  { name = "id", kind = "identifier" },
  { name = "stay", kind = "identifier" },
  { name = "pulse", kind = "integer", min = 20, max = 250 },
]
"#;

    fn refusal(root: &str, tables: &str) -> String {
        let text = format!("{}{tables}", schema_job(root, &generator("database", "")));
        JobSpec::parse(&text, "db").unwrap_err().to_string()
    }

    /// A well-formed database parses under the database generator alone (which takes
    /// nothing else); each structural mistake is refused with what is wrong, and the caps
    /// multiply down a path.
    #[test]
    fn a_database_is_checked_table_by_table() {
        let text = format!("{}{STAYS}", schema_job(ROOT, &generator("database", "")));
        JobSpec::parse(&text, "db").unwrap();
        let one_table = format!("{}{STAYS}", schema_job(ROOT, &generator("aim", "")));
        let refused = JobSpec::parse(&one_table, "db").unwrap_err().to_string();
        assert!(refused.contains("generator 'aim' synthesizes one table"), "{refused}");
        let no_tables = JobSpec::parse(&schema_job(ROOT, &generator("database", "")), "db").unwrap_err().to_string();
        assert!(no_tables.contains("declare its tables below the root"), "{no_tables}");
        let rows = text.replace("url = \"out\"", "url = \"out\"\nrows = 10");
        let refused = JobSpec::parse(&rows, "db").unwrap_err().to_string();
        assert!(refused.contains("declare [output] units"), "{refused}");
        let spec: JobSpec = toml::from_str(&text).unwrap();
        assert_eq!(super::validate(&spec.input, &spec.schema, &spec.tables).unwrap(), vec![1, 4, 200]);
        let cases = [
            (ROOT.replace("table = \"patients\"\n", ""), STAYS.to_string(), "names its root table"),
            (ROOT.replace("unit_column = \"id\"\n", ""), STAYS.to_string(), "needs its key as [schema] unit_column"),
            (ROOT.into(), STAYS.replace("name = \"charts\"", "name = \"stays\""), "'stays' is declared twice"),
            (ROOT.into(), STAYS.replace("name = \"charts\"", "name = \"ch/arts\""), "table name \"ch/arts\""),
            (ROOT.into(), STAYS.replace("table = \"patients\"", "table = \"people\""), "'people' is not a table"),
            (ROOT.into(), STAYS.replace("key = \"stay\"\n", ""), "'stays' declares no `key`"),
            (ROOT.into(), STAYS.replace("table = \"patients\"", "table = \"charts\""), "must be declared before it"),
            (ROOT.into(), STAYS.replace("key = \"stay\"\n", "key = \"ward\"\n"), "key 'ward' must have kind"),
            (ROOT.into(), STAYS.replace("key = \"id\" }", "key = \"who\" }"), "parent key 'who' is not among"),
            (ROOT.into(), STAYS.replace("order_by = \"start\"", "order_by = \"ward\""), "order_by 'ward' must be"),
            (ROOT.into(), STAYS.replace("max_per_parent = 4", "max_per_parent = 0"), "at least 1"),
            (ROOT.into(), STAYS.replace("max_per_parent = 50", "max_per_parent = 4294967295"), "exceeds 2³²"),
            (ROOT.into(), STAYS.replace("name = \"pulse\"", "name = \"__row\""), "are reserved"),
            (ROOT.into(), STAYS.replace("max = 250 }", "max = 10 }"), "min must be below max"),
            (
                ROOT.into(),
                STAYS
                    .replace("  { name = \"id\", kind = \"identifier\" },\n  { name = \"stay\"", "  { name = \"stay\""),
                "the unit's key 'id' is not among",
            ),
            (
                ROOT.into(),
                STAYS.replace("table = \"stays\", key = \"stay\"", "table = \"stays\", key = \"id\""),
                "and only theirs",
            ),
            (ROOT.into(), STAYS.replace("key = \"stay\"\n", "key = \"id\"\n"), "a column of its own"),
            (
                ROOT.into(),
                STAYS.replace("[\"stays.csv\"] }", "[\"stays.csv\"], csv = { strip_suffix = \".\" } }"),
                "keys read alike",
            ),
            (
                ROOT.into(),
                STAYS.replace("[\"charts.csv\"] }", "[\"charts.csv\"], csv = { trim = false } }"),
                "keys read alike",
            ),
            (
                ROOT.into(),
                STAYS.replace("[\"charts.csv\"] }", "[\"charts.csv\"], csv = { null_values = [\"?\"] } }"),
                "keys read alike",
            ),
        ];
        for (root, tables, wanted) in cases {
            let refused = refusal(&root, &tables);
            assert!(refused.contains(wanted), "{wanted}: {refused}");
        }
    }

    /// A one-table spec is unchanged by the database fields, and a database spec
    /// round-trips in TOML and JSON (the forms a spec travels in).
    #[test]
    fn one_table_specs_stay_as_they_were_and_databases_round_trip() {
        let one = JobSpec::parse(&schema_job(ROOT, &generator("aim", "")), "one").unwrap();
        assert!(one.tables.is_empty());
        assert!(!toml::to_string(&one).unwrap().contains("tables"));
        let text = format!("{}{STAYS}", schema_job(ROOT, &generator("database", "")));
        let spec: JobSpec = toml::from_str(&text).unwrap();
        assert_eq!(spec.tables.len(), 2);
        assert_eq!(toml::from_str::<JobSpec>(&toml::to_string(&spec).unwrap()).unwrap(), spec);
        assert_eq!(serde_json::from_str::<JobSpec>(&serde_json::to_string(&spec).unwrap()).unwrap(), spec);
    }
}
