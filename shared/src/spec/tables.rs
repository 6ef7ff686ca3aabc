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
use crate::data::source::{CsvOptions, Source};

/// Prefix of the columns a database's partitions add (a row's place under its unit):
/// reserved in every table.
pub const RESERVED_PREFIX: &str = "__";

/// A table below the root.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// Names the table's output dataset and its children's `parent.table`.
    pub name: String,
    /// Its file; on a served dataset, the operator's (the submitter leaves it out).
    #[serde(default)]
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

/// One end of a column's `within` interval: a column of the same row (`table` is `None`)
/// or of the named table (the column's own or an ancestor).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WithinEnd {
    pub table: Option<String>,
    pub column: String,
}

/// Parses `within = "start..end"`: each end empty (the column's declared bound), a column
/// of the same row (`admittime`) or of a table (`admissions.admittime`; a bare end after a
/// table's start is of that table, so `"admissions.admittime..dischtime"` reads both from
/// the admission). At least one end is a column.
pub fn parse_within(text: &str) -> Result<(Option<WithinEnd>, Option<WithinEnd>), String> {
    let Some((start, end)) = text.split_once("..") else {
        return Err(format!("within {text:?}: write start..end, e.g. \"admissions.admittime..dischtime\""));
    };
    let end_of = |text: &str, table: Option<&str>| {
        let text = text.trim();
        (!text.is_empty()).then(|| match text.split_once('.') {
            Some((table, column)) => WithinEnd { table: Some(table.to_string()), column: column.to_string() },
            None => WithinEnd { table: table.map(str::to_string), column: text.to_string() },
        })
    };
    let start = end_of(start, None);
    let end = end_of(end, start.as_ref().and_then(|s| s.table.as_deref()));
    if start.is_none() && end.is_none() {
        return Err(format!("within {text:?}: name a column at one end at least"));
    }
    Ok((start, end))
}

/// Checks the `within` intervals of table `name`'s `columns`: each on a numeric or
/// datetime column without explicit bin edges, each end a column of the same kind family
/// (datetimes with datetimes), of the same row and declared before it, or of a table that
/// `scope` finds (the table itself or an ancestor).
fn check_within<'a>(
    name: &str,
    columns: &'a [ColumnSpec],
    scope: impl Fn(&str) -> Option<&'a [ColumnSpec]>,
) -> Result<(), String> {
    let numeric = |c: &ColumnSpec| matches!(c.kind, ColumnKind::Integer | ColumnKind::Continuous);
    for (i, column) in columns.iter().enumerate() {
        let Some(text) = &column.within else { continue };
        let what = format!("table '{name}': column '{}' within {text:?}", column.name);
        if !(numeric(column) || column.kind == ColumnKind::Datetime) {
            return Err(format!("{what}: only numeric and datetime columns lie within an interval"));
        }
        if matches!(column.bins, Some(super::Bins::Edges(_))) {
            return Err(format!("{what}: its bins are cut inside the interval: declare a count of bins, not edges"));
        }
        let (start, end) = parse_within(text).map_err(|e| format!("table '{name}': {e}"))?;
        for end in start.iter().chain(&end) {
            let found = match &end.table {
                None => columns[..i].iter().find(|c| c.name == end.column),
                Some(table) => {
                    let Some(table_columns) = scope(table) else {
                        return Err(format!("{what}: '{table}' is neither this table nor one of its ancestors"));
                    };
                    table_columns.iter().find(|c| c.name == end.column)
                }
            };
            let alike = |c: &&ColumnSpec| (c.kind == ColumnKind::Datetime) == (column.kind == ColumnKind::Datetime);
            match found {
                Some(c) if (numeric(c) || c.kind == ColumnKind::Datetime) && alike(&c) => {}
                Some(_) => return Err(format!("{what}: '{}' is not a column of the same kind", end.column)),
                None if end.table.is_none() => {
                    return Err(format!("{what}: '{}' is not a column declared before it in its row", end.column));
                }
                None => return Err(format!("{what}: '{}' is not a column of that table", end.column)),
            }
            if end.table.as_deref() == Some(name) && end.column == column.name {
                return Err(format!("{what}: a column cannot lie within itself"));
            }
            if end.table.as_deref() == Some(name) && !columns[..i].iter().any(|c| c.name == end.column) {
                return Err(format!("{what}: '{}' must be declared before it in its row", end.column));
            }
        }
    }
    Ok(())
}

/// The columns of `wanted` if it is `from` or one of its ancestors (`scope`: each table's
/// columns and parent).
fn in_scope<'a>(
    scope: &HashMap<&str, (&'a [ColumnSpec], Option<&str>)>,
    from: &str,
    wanted: &str,
) -> Option<&'a [ColumnSpec]> {
    let mut at = Some(from);
    while let Some(name) = at {
        let (columns, parent) = scope.get(name)?;
        if name == wanted {
            return Some(*columns);
        }
        at = *parent;
    }
    None
}

/// A table's name names an output prefix: the rule of a dataset id, without dots.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if valid { Ok(()) } else { Err(format!("table name {name:?}: use 1 to 64 letters, digits, '_' and '-'")) }
}

/// Whether two tables' CSV options read a key alike (trimmed, suffixes stripped, nulls).
pub fn keys_read_alike(root: &CsvOptions, table: &CsvOptions) -> bool {
    table.trim == root.trim && table.strip_suffix == root.strip_suffix && table.null_values == root.null_values
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
    let mut folders = HashSet::new();
    for name in std::iter::once(root_name).chain(tables.iter().map(|t| &t.name)) {
        check_name(name)?;
        // Each names its output folder: two that differ only in case are one folder on
        // some stores.
        if !folders.insert(name.to_ascii_lowercase()) {
            return Err(format!("table name '{name}' is declared twice (names are compared ignoring case)"));
        }
    }
    for column in root.columns.iter().chain(tables.iter().flat_map(|t| &t.columns)) {
        if column.name.starts_with(RESERVED_PREFIX) {
            return Err(format!("column '{}': names starting with {RESERVED_PREFIX} are reserved", column.name));
        }
    }
    reach.insert(root_name, (1, Some(root_key)));
    // Each table's columns and parent: the tables a column's `within` may name.
    let mut scope: HashMap<&str, (&[ColumnSpec], Option<&str>)> = HashMap::new();
    scope.insert(root_name, (&root.columns, None));
    check_within(root_name, &root.columns, |t| in_scope(&scope, root_name, t))?;
    for table in tables {
        let name = &table.name;
        // Keys are compared as read: a table trimming or stripping a suffix the root does
        // not would join one patient's rows to another's key.
        if !keys_read_alike(&root_input.csv, &table.input.csv) {
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
            // A sequence's order values are handed to its rows in order: each row's must be
            // placed alike, from its ancestors alone.
            let own_end = |text: &String| {
                parse_within(text).is_ok_and(|(start, end)| {
                    start.iter().chain(&end).any(|e| e.table.as_deref().is_none_or(|t| t == name.as_str()))
                })
            };
            if table.column(order).and_then(|c| c.within.as_ref()).is_some_and(own_end) {
                return Err(format!(
                    "table '{name}': order_by '{order}' may lie within its ancestors' values, not its own row's"
                ));
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
        scope.insert(name, (&table.columns, Some(parent)));
        check_within(name, &table.columns, |t| in_scope(&scope, name, t))?;
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
        JobSpec::parse(&text, "db").unwrap().require_input().unwrap();
        // A table's files may be left to a served dataset's declaration, but a job needs them.
        let unfiled = JobSpec::parse(&text.replace("input = { urls = [\"stays.csv\"] }\n", ""), "db").unwrap();
        let missing = unfiled.require_input().unwrap_err().to_string();
        assert!(missing.contains("[[tables]] 'stays': input urls is empty"), "{missing}");
        let one_table = format!("{}{STAYS}", schema_job(ROOT, &generator("aim", "")));
        let refused = JobSpec::parse(&one_table, "db").unwrap_err().to_string();
        assert!(refused.contains("generator 'aim' synthesizes one table"), "{refused}");
        let no_tables = JobSpec::parse(&schema_job(ROOT, &generator("database", "")), "db").unwrap_err().to_string();
        assert!(no_tables.contains("declare its tables below the root"), "{no_tables}");
        let timed_root = format!(
            "{ROOT}\n[[schema.columns]]\nname = \"born\"\nkind = \"integer\"\nmin = 0\nmax = 9\n[[schema.columns]]\nname = \
             \"died\"\nkind = \"integer\"\nmin = 0\nmax = 9\nwithin = \"born..\""
        );
        let one_table = JobSpec::parse(&schema_job(&timed_root, &generator("aim", "")), "one").unwrap_err().to_string();
        assert!(one_table.contains("`within` places a column inside an interval"), "{one_table}");
        JobSpec::parse(&format!("{}{STAYS}", schema_job(&timed_root, &generator("database", ""))), "db").unwrap();
        let rows = text.replace("url = \"out\"", "url = \"out\"\nrows = 10");
        let refused = JobSpec::parse(&rows, "db").unwrap_err().to_string();
        assert!(refused.contains("declare [output] units"), "{refused}");
        let spec: JobSpec = toml::from_str(&text).unwrap();
        assert_eq!(super::validate(&spec.input, &spec.schema, &spec.tables).unwrap(), vec![1, 4, 200]);
        // Intervals: a stay ends at or after its start, a chart's time inside its stay.
        let timed = STAYS
            .replace(
                "{ name = \"ward\", kind = \"categorical\", categories = [\"a\", \"b\"] },",
                "{ name = \"ward\", kind = \"categorical\", categories = [\"a\", \"b\"] },\n  { name = \"end\", \
                 kind = \"datetime\", min = \"2020-01-01\", max = \"2030-01-01\", within = \"start..\" },",
            )
            .replace(
                "{ name = \"pulse\", kind = \"integer\", min = 20, max = 250 },",
                "{ name = \"pulse\", kind = \"integer\", min = 20, max = 250 },\n  { name = \"at\", kind = \
                 \"datetime\", min = \"2020-01-01\", max = \"2030-01-01\", within = \"stays.start..end\" },",
            );
        JobSpec::parse(&format!("{}{timed}", schema_job(ROOT, &generator("database", ""))), "db").unwrap();
        let within = |from: &str, to: &str| timed.replace(from, to);
        let pulse = "{ name = \"pulse\", kind = \"integer\", min = 20, max = 250 }";
        let cases = [
            (ROOT.into(), within("\"start..\"", "\"end..\""), "'end' is not a column declared before it in its row"),
            (ROOT.into(), within("\"start..\"", "\"..\""), "name a column at one end at least"),
            (ROOT.into(), within("order_by = \"start\"", "order_by = \"end\""), "not its own row's"),
            (ROOT.into(), within("\"start..\"", "\"start\""), "write start..end"),
            (ROOT.into(), within("\"stays.start..end\"", "\"charts.pulse..\""), "not a column of the same kind"),
            (ROOT.into(), within("\"stays.start..end\"", "\"people.start..\""), "'people' is neither this table"),
            (ROOT.into(), within("\"start..\"", "\"charts.at..\""), "'charts' is neither this table"),
            (ROOT.into(), within("\"start..\"", "\"stays.end..\""), "a column cannot lie within itself"),
            (
                ROOT.into(),
                within(pulse, &pulse.replace(" }", ", within = \"stays.start..\" }")),
                "not a column of the same kind",
            ),
            (
                ROOT.into(),
                within(
                    "within = \"stays.start..end\"",
                    "within = \"stays.start..end\", bins = [1577836800, 1700000000, 1893456000]",
                ),
                "declare a count of bins",
            ),
            (ROOT.replace("table = \"patients\"\n", ""), STAYS.to_string(), "names its root table"),
            (ROOT.replace("unit_column = \"id\"\n", ""), STAYS.to_string(), "needs its key as [schema] unit_column"),
            (ROOT.into(), STAYS.replace("name = \"charts\"", "name = \"stays\""), "'stays' is declared twice"),
            (ROOT.into(), STAYS.replace("name = \"charts\"", "name = \"Stays\""), "'Stays' is declared twice"),
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
