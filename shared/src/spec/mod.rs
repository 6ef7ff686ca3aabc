//! The job spec (TOML): what to read, its *public* schema, the privacy budget, the
//! generator and where to write. Everything here is declared public by the user; nothing
//! in it may be derived from the private rows without spending budget.

mod datetime;
mod output;
mod schema;
pub mod tables;

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

pub use datetime::{parse_datetime, parse_datetime_as};
pub use output::{DEFAULT_OUTPUT_URL, OutputSpec};
pub use schema::{Bins, Bound, ColumnKind, ColumnSpec, MissingPolicy, OTHER_CATEGORY, SchemaSpec, UnknownPolicy};
pub use tables::{ParentSpec, TableSpec};

use crate::accounting::Budget;
use crate::accounting::accountant::Accountant;
use crate::data::source::{BadRows, Source};
use crate::dpsgd::run::RunParams;
use crate::generators::section::GeneratorSpec;

/// Errors in a job spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("job spec {path}: {message}")]
    Parse { path: String, message: String },
    #[error("job spec {path}: {message}")]
    Invalid { path: String, message: String },
    #[error("invalid {what} {id:?}: use 1 to 128 letters, digits, '.', '_' and '-', not starting with '.'")]
    InvalidId { what: &'static str, id: String },
}

/// Checks a dataset or job id: ids name object-store prefixes (ledgers, scratch), so an
/// empty id (every prefix) or a path (`../x`) must never get through.
pub fn validate_id(what: &'static str, id: &str) -> Result<(), SpecError> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !id.starts_with('.');
    if valid { Ok(()) } else { Err(SpecError::InvalidId { what, id: id.to_string() }) }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub job: JobSection,
    /// Absent when the coordinator's operator declares the dataset's input (`serve
    /// --datasets`); required otherwise (see [`JobSpec::require_input`]).
    #[serde(default)]
    pub input: Source,
    pub schema: SchemaSpec,
    /// A database job's tables below its root (`[input]` and `[schema]`); empty for a
    /// one-table job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableSpec>,
    pub privacy: PrivacySpec,
    pub generator: GeneratorSpec,
    #[serde(default)]
    pub output: OutputSpec,
    #[serde(default)]
    pub evaluation: Option<EvaluationSpec>,
    #[serde(default)]
    pub calibration: Option<CalibrationSpec>,
}

/// Marginal calibration (`[calibration]`; absent: off): a share of the job's ε buys noisy
/// 1-way tables (and the target's pairs) counted on the workers, and the generator's output
/// is reweighted to match them, then resampled. Charged in the generator's own entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalibrationSpec {
    /// The tables' Gaussian release costs this share of ρ, the zCDP budget that meets the
    /// job's (ε, δ) (Gaussian releases add up on that scale); the generator's noise is
    /// calibrated so that both compose to the job's (ε, δ).
    pub epsilon_share: f64,
    /// With a declared target, also its pair with every other column.
    pub target_pairs: bool,
    /// Units drawn per unit written: the pool the weights are fitted on.
    pub pool: u32,
    /// Rows a unit contributes to the tables (a reservoir in the worker).
    pub max_rows_per_unit: u32,
}

impl Default for CalibrationSpec {
    fn default() -> Self {
        Self { epsilon_share: 0.1, target_pairs: true, pool: 4, max_rows_per_unit: 1 }
    }
}

/// Evaluate the output at the end of the job (`report.json`, `report.html` beside it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvaluationSpec {
    /// Held-out real data, never used by the job (declared by the operator with the
    /// dataset under `serve --datasets`).
    #[serde(default)]
    pub test_urls: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The protected dataset, i.e. which privacy ledger pays (e.g. `mimic-iv-ed-2026`).
    pub dataset_id: String,
    /// Job id; a fresh one is generated when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Disjoint partitions of the private data (by privacy unit).
    #[serde(default = "default_partitions")]
    pub partitions: u32,
    /// Who reads the input into the partitions: the workers, a shard each (they need read
    /// access to the input), or the coordinator alone. A database's tables are partitioned
    /// by the coordinator.
    #[serde(default)]
    pub partition_by: PartitionBy,
}

/// Who reads a job's input into its partitions (`[job] partition_by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PartitionBy {
    /// The workers, each a shard of the input (`data::shard`): the coordinator holds no
    /// row and no unit, and reading scales with the workers.
    #[default]
    Workers,
    /// The coordinator alone, for a cluster whose workers may not read the input.
    Coordinator,
}

/// The most partitions a job may have: each shard's reader sketches each partition's units
/// in 4 KiB (`data::sketch`), and a worker writes a bucket to each.
pub const MAX_PARTITIONS: u32 = 16_384;

fn default_partitions() -> u32 {
    4
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrivacySpec {
    /// This job's ε and δ (charged to the dataset's ledger).
    pub epsilon: f64,
    pub delta: f64,
    #[serde(default = "default_accountant")]
    pub accountant: Accountant,
    /// Ledger store (path or URL); `--ledger` overrides it.
    #[serde(default)]
    pub ledger: Option<String>,
    /// The dataset's *total* budget, used only to create its ledger if none exists yet.
    #[serde(default)]
    pub dataset_budget: Option<Budget>,
}

fn default_accountant() -> Accountant {
    Accountant::Rdp
}

/// A spec written before the run table: a DP-SGD run setting in the generator's own
/// section is refused as unknown; the message says where it now belongs.
fn with_moved_field_hint(message: String) -> String {
    let field = message.split("unknown field `").nth(1).and_then(|rest| rest.split('`').next());
    match field {
        Some(field) if RunParams::has_field(field) => {
            format!(
                "{message}\n`{field}` is a DP-SGD run setting: for findiff, sequence, dp2stage and harmonic it \
                 belongs in [generator.<name>.run]"
            )
        }
        _ => message,
    }
}

impl JobSpec {
    /// The output size the spec declares, in the generator's own unit: histories for a
    /// generator of histories (`[output] units`), rows otherwise (`rows`). Without it, a
    /// job writes as many as its DP count released.
    pub fn declared_output_size(&self) -> Option<u64> {
        if self.draws_units() { self.output.units } else { self.output.rows }
    }

    /// Whether the output is counted in units: whole histories, or a database's units
    /// with everything under them.
    pub fn draws_units(&self) -> bool {
        self.generator.draws_histories() || !self.tables.is_empty()
    }

    /// Every file the job reads: the root's input, then each table's.
    pub fn input_urls(&self) -> Vec<String> {
        let tables = self.tables.iter().flat_map(|t| t.input.urls.iter());
        self.input.urls.iter().chain(tables).cloned().collect()
    }

    /// Parses and validates a spec; `path` names it in messages.
    pub fn parse(text: &str, path: &str) -> Result<Self, SpecError> {
        let spec: JobSpec = toml::from_str(text)
            .map_err(|e| SpecError::Parse { path: path.to_string(), message: with_moved_field_hint(e.to_string()) })?;
        let invalid = |message: String| SpecError::Invalid { path: path.to_string(), message };
        spec.validate().map_err(invalid)?;
        validate_id("dataset id", &spec.job.dataset_id).map_err(|e| invalid(e.to_string()))?;
        if let Some(id) = &spec.job.id {
            validate_id("job id", id).map_err(|e| invalid(e.to_string()))?;
        }
        Ok(spec)
    }

    /// Reads, parses and validates a spec file.
    pub fn load(path: &str) -> Result<Self, SpecError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SpecError::Parse { path: path.to_string(), message: format!("cannot read: {e}") })?;
        Self::parse(&text, path)
    }

    /// Refuses a spec with no input files (and an evaluation with no held-out files):
    /// checked when a job starts, after an operator-declared dataset has filled them in.
    pub fn require_input(&self) -> Result<(), SpecError> {
        let missing = |message: &str| Err(SpecError::Invalid { path: "job spec".into(), message: message.into() });
        if self.input.urls.is_empty() {
            return missing("[input] urls is empty");
        }
        if let Some(table) = self.tables.iter().find(|t| t.input.urls.is_empty()) {
            return missing(&format!("[[tables]] '{}': input urls is empty", table.name));
        }
        if self.evaluation.as_ref().is_some_and(|e| e.test_urls.is_empty()) {
            return missing("[evaluation] test_urls is empty");
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_PARTITIONS).contains(&self.job.partitions) {
            return Err(format!("[job] partitions must be 1 to {MAX_PARTITIONS}"));
        }
        std::iter::once(&self.input).chain(self.tables.iter().map(|t| &t.input)).try_for_each(|i| i.csv.check())?;
        let p = &self.privacy;
        if !(p.epsilon > 0.0 && p.epsilon.is_finite() && (0.0..1.0).contains(&p.delta)) {
            return Err(format!("[privacy] needs epsilon > 0 and delta in [0, 1), got {} and {}", p.epsilon, p.delta));
        }
        // A value read as missing must have somewhere to go.
        let inputs = std::iter::once((&self.input, &self.schema.columns))
            .chain(self.tables.iter().map(|t| (&t.input, &t.columns)));
        for (input, columns) in inputs {
            let rejecting =
                columns.iter().find(|c| c.kind != ColumnKind::Identifier && c.missing == MissingPolicy::Reject);
            if let (Some(BadRows::AsMissing), Some(c)) = (input.bad_rows, rejecting) {
                return Err(format!(
                    "bad_rows = \"as_missing\" reads a bad value as missing, which column '{}' rejects (missing = \
                     \"reject\"): keep its missing values, or skip bad rows (bad_rows = \"skip\")",
                    c.name
                ));
            }
        }
        let mut names = HashSet::new();
        for c in &self.schema.columns {
            if !names.insert(c.name.as_str()) {
                return Err(format!("column '{}' is declared twice", c.name));
            }
            c.validate()?;
        }
        let column = |name: &str| self.schema.columns.iter().find(|c| c.name == name);
        if let Some(unit) = &self.schema.unit_column {
            match column(unit) {
                Some(c) if c.kind == ColumnKind::Identifier => {}
                Some(_) => {
                    return Err(format!("unit column '{unit}' must have kind = \"identifier\""));
                }
                None => return Err(format!("unit column '{unit}' is not among the columns")),
            }
        }
        if let Some(order) = &self.schema.order_by {
            match column(order) {
                Some(c) if c.kind != ColumnKind::Identifier && c.kind != ColumnKind::Categorical => {}
                _ => return Err(format!("order_by '{order}' must be a declared numeric or datetime column")),
            }
        }
        if let Some(target) = &self.schema.target {
            match column(target) {
                Some(c) if c.kind != ColumnKind::Identifier => {}
                _ => {
                    return Err(format!("target '{target}' must be a declared, non-identifier column"));
                }
            }
        }
        self.generator.validate()?;
        if let Some(name) = &self.schema.table {
            tables::check_name(name)?;
        }
        let database = matches!(self.generator, GeneratorSpec::Database(_));
        if self.tables.is_empty() && self.schema.columns.iter().any(|c| c.within.is_some()) {
            return Err("`within` places a column inside an interval of a database's rows: declare [[tables]]".into());
        }
        if !self.tables.is_empty() {
            tables::validate(&self.input, &self.schema, &self.tables)?;
            if !database {
                return Err(format!(
                    "[[tables]]: generator '{}' synthesizes one table; a database's is \"database\"",
                    self.generator.name().as_str()
                ));
            }
        } else if database {
            return Err(
                "generator \"database\" synthesizes a database: declare its tables below the root, [[tables]]".into()
            );
        }
        if let Some(c) = &self.calibration {
            let valid = c.epsilon_share > 0.0
                && c.epsilon_share <= 0.5
                && (1..=64).contains(&c.pool)
                && c.max_rows_per_unit > 0;
            if !valid {
                return Err(
                    "[calibration] needs 0 < epsilon_share ≤ 0.5, 1 ≤ pool ≤ 64 and max_rows_per_unit ≥ 1".into()
                );
            }
        }
        let histories = self.generator.draws_histories();
        if self.draws_units() && self.output.rows.is_some() {
            return Err("[output] rows: the job draws whole units (histories, or a database's units); declare \
                        [output] units"
                .into());
        }
        if !self.draws_units() && self.output.units.is_some() {
            return Err(
                "[output] units is for jobs of whole units (histories, databases); declare [output] rows".into()
            );
        }
        if histories && self.schema.unit_column.is_none() {
            return Err("a generator of histories models each unit's history: [schema] needs a unit_column".into());
        }
        if self.output.rows_per_part == 0 {
            return Err("[output] rows_per_part must be at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{JobSpec, SpecError};

    const DEMO: &str = include_str!("../../../examples/demo.toml");

    fn with_job_id(id: &str) -> Result<JobSpec, SpecError> {
        JobSpec::parse(&DEMO.replace("[job]\n", &format!("[job]\nid = {id:?}\n")), "demo")
    }

    /// A generator's parameters are its own: another generator's section is refused.
    #[test]
    fn a_section_of_another_generator_is_refused() {
        let pate_in_marginals =
            DEMO.replace("[generator.marginals]", "[generator.pate]\nsigma = 5.0\n\n[generator.marginals]");
        let err = JobSpec::parse(&pate_in_marginals, "demo").unwrap_err().to_string();
        assert!(err.contains("[generator.pate] belongs to another generator"), "{err}");
        let spec = JobSpec::parse(DEMO, "demo").unwrap();
        assert!(matches!(&spec.generator, super::GeneratorSpec::Marginals(p) if p.max_rows_per_unit == 8));
        // It round-trips as written.
        let text = toml::to_string(&spec).unwrap();
        assert_eq!(JobSpec::parse(&text, "again").unwrap(), spec);
    }

    /// A bad value read as missing in a column that rejects missing values would reach a
    /// model with no place for it: the spec is refused, naming the column.
    #[test]
    fn reading_bad_values_as_missing_where_missing_is_rejected_is_refused() {
        let text = DEMO.replace("[input]\n", "[input]\nbad_rows = \"as_missing\"\n");
        assert!(JobSpec::parse(&text, "demo").is_ok());
        let rejecting = text.replacen("kind = \"integer\"", "kind = \"integer\"\nmissing = \"reject\"", 1);
        assert_ne!(rejecting, text);
        let err = JobSpec::parse(&rejecting, "demo").unwrap_err().to_string();
        assert!(err.contains("rejects (missing = \"reject\")"), "{err}");
    }

    /// Every example under `examples/` parses: they are what a new user copies.
    #[test]
    fn every_example_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let mut parsed = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                JobSpec::parse(&text, "example").unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                parsed += 1;
            }
        }
        assert!(parsed >= 17, "{parsed} examples");
    }

    /// A DP-SGD generator's run settings are its run table: one written in the generator's
    /// own section (as before the table) is refused with where it belongs; the table
    /// keeps the generator's defaults for what it does not name, and round-trips in TOML
    /// and JSON (the form a spec travels in).
    #[test]
    fn a_run_setting_belongs_in_the_run_table() {
        let old = include_str!("../../../examples/icu-sequence.toml").replace("[generator.sequence.run]\n", "");
        let err = JobSpec::parse(&old, "old").unwrap_err().to_string();
        assert!(err.contains("unknown field `epochs`") && err.contains("[generator.<name>.run]"), "{err}");
        let unknown =
            include_str!("../../../examples/icu-sequence.toml").replace("temperature = 1.0", "temperatur = 1.0");
        let err = JobSpec::parse(&unknown, "typo").unwrap_err().to_string();
        assert!(err.contains("unknown field `temperatur`") && !err.contains("run table"), "{err}");
        let spec = JobSpec::parse(include_str!("../../../examples/icu-sequence.toml"), "icu").unwrap();
        let super::GeneratorSpec::Sequence(p) = &spec.generator else { panic!("{:?}", spec.generator) };
        assert_eq!((p.run.epochs, p.run.batch_size, p.run.micro_batch), (12.0, 256.0, 64));
        let findiff = JobSpec::parse(include_str!("../../../examples/adult-findiff.toml"), "findiff").unwrap();
        let super::GeneratorSpec::Findiff(p) = &findiff.generator else { panic!("{:?}", findiff.generator) };
        assert_eq!(
            (p.run.epochs, p.run.batch_size, p.run.micro_batch, p.run.checkpoint_every),
            (40.0, 512.0, 256, 100)
        );
        for spec in [spec, findiff] {
            assert_eq!(JobSpec::parse(&toml::to_string(&spec).unwrap(), "again").unwrap(), spec);
            assert_eq!(serde_json::from_str::<JobSpec>(&serde_json::to_string(&spec).unwrap()).unwrap(), spec);
        }
    }

    /// A generator of histories counts its output in units and needs the unit column; a
    /// generator of rows counts rows: each refuses the other's size.
    #[test]
    fn output_sizes_are_counted_in_what_the_generator_draws() {
        let sequence = DEMO.replace("name = \"marginals\"", "name = \"sequence\"").replace(
            "[generator.marginals]\n# A patient contributes at most 8 of their visits (sampled inside the worker).\nmax_rows_per_unit = 8\n",
            "",
        );
        let sequence = format!(
            "{}{}",
            &sequence[..sequence.find("pairs = ").unwrap()],
            &sequence[sequence.find("[output]").unwrap()..]
        );
        let spec = JobSpec::parse(&sequence, "sequence").unwrap();
        assert!(matches!(spec.generator, super::GeneratorSpec::Sequence(_)));
        let refused = |text: &str, wanted: &str| {
            let err = JobSpec::parse(text, "bad").unwrap_err().to_string();
            assert!(err.contains(wanted), "{err}");
        };
        refused(&format!("{sequence}rows = 100\n"), "declare [output] units");
        assert_eq!(JobSpec::parse(&format!("{sequence}units = 100\n"), "ok").unwrap().output.units, Some(100));
        refused(&format!("{DEMO}units = 100\n"), "declare [output] rows");
        refused(&sequence.replace("unit_column = \"patient_id\"\n", ""), "needs a unit_column");
        // The marginals generator's flattened histories (PATH's Direct) are histories too.
        let direct = DEMO.replace("max_rows_per_unit = 8\n", "history_rows = 16\n");
        assert!(JobSpec::parse(&direct, "direct").unwrap().generator.draws_histories());
        refused(&format!("{direct}rows = 100\n"), "declare [output] units");
        refused(&direct.replace("unit_column = \"patient_id\"\n", ""), "needs a unit_column");
        refused(
            &DEMO.replace("max_rows_per_unit = 8\n", "max_rows_per_unit = 8\nhistory_rows = 16\n"),
            "does not apply",
        );
        refused(&DEMO.replace("max_rows_per_unit = 8\n", "history_rows = 0\n"), "history_rows must be");
        refused(&DEMO.replace("max_rows_per_unit = 8\n", "static_columns = [\"rhythm\"]\n"), "need history_rows");
        refused(&DEMO.replace("max_rows_per_unit = 8\n", "gap_bins = 12\n"), "need history_rows");
        refused(&direct.replace("history_rows = 16\n", "history_rows = 16\ngap_bins = 65\n"), "gap_bins ≤ 64");
    }

    /// Found by `tests/fuzz.rs`: infinite bounds, an integer column holding no integer, and
    /// zero bins were accepted and then overflowed or divided by zero in the domain.
    #[test]
    fn numeric_domains_are_finite_and_non_empty() {
        let heart_rate = "name = \"heart_rate\"\nkind = \"integer\"\nmin = 30\nmax = 220\nbins = 19\n";
        for (replacement, expected) in [
            ("min = -inf\nmax = 220\nbins = 19\n", "both finite"),
            ("min = 30\nmax = 1e300\nbins = 19\n", "both finite"),
            ("min = 30.2\nmax = 30.8\nbins = 19\n", "no integer lies between"),
            ("min = 30\nmax = 220\nbins = 0\n", "bins must be at least 1"),
        ] {
            let text = DEMO.replace(heart_rate, &format!("name = \"heart_rate\"\nkind = \"integer\"\n{replacement}"));
            assert_ne!(text, DEMO);
            let err = JobSpec::parse(&text, "demo").unwrap_err().to_string();
            assert!(err.contains(expected), "{replacement}: {err}");
        }
    }

    /// An empty id once named every job's scratch prefix (cleanup deleted them all), and a
    /// path escaped the scratch store.
    #[test]
    fn job_and_dataset_ids_cannot_name_other_prefixes() {
        for bad in ["", "../../x", "a/b", ".hidden", "x y", &"a".repeat(129)] {
            let err = with_job_id(bad).unwrap_err();
            assert!(err.to_string().starts_with("job spec demo: invalid job id"), "{bad:?}: {err}");
        }
        assert_eq!(with_job_id("nightly-2026.11_23").unwrap().job.id.as_deref(), Some("nightly-2026.11_23"));
        let bad_dataset = DEMO.replace("dataset_id = \"demo-icu-vitals\"", "dataset_id = \"../ledger\"");
        let err = JobSpec::parse(&bad_dataset, "demo").unwrap_err();
        assert!(err.to_string().starts_with("job spec demo: invalid dataset id"), "{err}");
    }
}
