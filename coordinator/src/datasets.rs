//! Operator-declared datasets (`serve --datasets datasets.toml`): what binds a ledger to
//! its data. Each dataset has an id, its input, its privacy unit, its total budget and its
//! ledger store, all chosen by the operator. A job names a dataset id and may not set input
//! files, held-out files, the unit column, a ledger or a budget: the coordinator fills
//! them in from the declaration, so one input is always charged to one ledger (and no two
//! declarations name the same file). Every row is read whatever the submitter's schema:
//! a value it does not fit is read as missing or `__other__`.
//!
//! ```toml
//! [[dataset]]
//! id = "mimic-iv-ed-2026"
//! unit_column = "subject_id"        # absent: each row is its own privacy unit
//! ledger = "s3://rhosynth/ledger"     # absent: the coordinator's --ledger
//! budget = { epsilon = 10.0, delta = 1e-6 }
//! min_job_epsilon = 0.05            # absent: 0.01; a job declares at least this ε
//! holdout_urls = ["s3://private/ed/holdout.parquet"]   # evaluation only
//! [dataset.input]
//! urls = ["s3://private/ed/vitals.parquet"]
//!
//! [[dataset]]                       # a database: the input is its root table
//! id = "mimic-iv-2026"
//! unit_column = "subject_id"        # every table's unit (docs/database.md)
//! budget = { epsilon = 10.0, delta = 1e-6 }
//! [dataset.input]
//! urls = ["s3://private/mimic/patients.parquet"]
//! [[dataset.tables]]                # the tables a job's [[tables]] may name, by name
//! name = "admissions"
//! input = { urls = ["s3://private/mimic/admissions.parquet"] }
//!
//! [[model]]                         # public pretrained checkpoints jobs may name by id
//! id = "smollm2-135m"
//! url = "s3://models/SmolLM2-135M-Instruct.Q4_1.gguf"
//!
//! [[reference]]                     # public tables or DP releases jobs prompt or pretrain with
//! id = "ed-marginals-2026-11"
//! url = "s3://releases/ed/marginals-2026-11"
//! datasets = ["mimic-iv-ed-2026"]   # the datasets whose jobs may name it
//! ```
//!
//! A database job's `[[tables]]` name declared tables and get their files; the keys,
//! parents and caps are the submitter's (a row's unit is read from its own unit column,
//! so no choice of keys moves a row to another unit). A job may read a subset of a
//! dataset's tables: the same people, under the same budget.
//!
//! A language-model job names a declared model's id as its `checkpoint`, and a HARMONIC,
//! DP-2Stage or sequence job a declared reference's id as its `reference`: the coordinator
//! and workers read only what the operator declared public, never a location a submitter
//! chose (reading one would tell whether, and how, a private object parses, and private
//! neighbours would have no bounded sensitivity).

use std::collections::{HashMap, HashSet};

use rhosynth_privacy::ledger::{Budget, Ledger, LedgerError};
use rhosynth_shared::accounting::accountant::AccountingOptions;
use rhosynth_shared::accounting::mechanism::Adjacency;
use rhosynth_shared::data::source::{BadRows, CsvOptions, Format, Source};
use rhosynth_shared::spec::tables::{check_name, keys_read_alike};
use rhosynth_shared::spec::{ColumnKind, ColumnSpec, MissingPolicy, PartitionBy, UnknownPolicy, validate_id};
use rhosynth_shared::storage;
use serde::Deserialize;

use crate::job::JobRequest;

#[derive(Debug, thiserror::Error)]
pub enum DatasetsError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("dataset '{0}' is not declared on this coordinator")]
    Unknown(String),
    #[error("dataset '{dataset}' is declared by the operator: a job may not set {field}")]
    SetBySubmitter { dataset: String, field: &'static str },
    #[error("dataset '{dataset}': {message}")]
    Ledger { dataset: String, message: String },
    #[error("dataset '{dataset}' declares no table '{table}': a job's [[tables]] name its declared tables")]
    UnknownTable { dataset: String, table: String },
    #[error("dataset '{dataset}' has privacy unit '{unit}': the spec must declare it as an identifier column")]
    UnitColumnMissing { dataset: String, unit: String },
    #[error("dataset '{dataset}' takes jobs of ε ≥ {floor} (min_job_epsilon), not ε = {epsilon}")]
    BelowMinJobEpsilon { dataset: String, epsilon: f64, floor: f64 },
    #[error("the output location {output} overlaps a declared dataset's input or ledger; choose another prefix")]
    OutputOverlaps { output: String },
    #[error("model '{0}' is not declared on this coordinator: name a declared model's id as the checkpoint")]
    UnknownModel(String),
    #[error(
        "reference '{0}' is not declared for this dataset on this coordinator: name the id of a reference set the \
         operator declared for it"
    )]
    UnknownReference(String),
}

/// One declared dataset.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredDataset {
    pub id: String,
    pub input: Source,
    #[serde(default)]
    pub unit_column: Option<String>,
    #[serde(default)]
    pub ledger: Option<String>,
    pub budget: Budget,
    /// Held-out files for evaluation reports (diagnostics for the data owner).
    #[serde(default)]
    pub holdout_urls: Vec<String>,
    /// The least ε a job may declare: the budget then runs at most budget/floor jobs, each
    /// showing its submitter a little timing (`schedule`).
    #[serde(default = "default_min_job_epsilon")]
    pub min_job_epsilon: f64,
    /// A database's tables below the root (`input`), each read by the unit column.
    #[serde(default)]
    pub tables: Vec<DeclaredTable>,
    /// Who reads the input into a job's partitions: the operator's choice, whatever a
    /// submitter's spec says (`"coordinator"` keeps the input and the partition key off
    /// the workers).
    #[serde(default)]
    pub partition_by: PartitionBy,
}

/// A table of a declared database: the name a job's `[[tables]]` gives it, and its file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredTable {
    pub name: String,
    pub input: Source,
}

impl DeclaredDataset {
    /// Every file of the dataset: the root's and its tables'.
    fn input_urls(&self) -> Vec<String> {
        let tables = self.tables.iter().flat_map(|t| &t.input.urls);
        self.input.urls.iter().chain(tables).cloned().collect()
    }
}

fn default_min_job_epsilon() -> f64 {
    0.01
}

/// A public pretrained checkpoint the operator offers to language-model jobs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredModel {
    pub id: String,
    /// A `.gguf` file or a Hugging Face folder (path or object-store URL).
    pub url: String,
}

/// A public reference set (a public table or a rhosynth release) the operator offers to
/// HARMONIC jobs on the datasets it names.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeclaredReference {
    pub id: String,
    pub url: String,
    pub datasets: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DatasetsFile {
    dataset: Vec<DeclaredDataset>,
    #[serde(default)]
    model: Vec<DeclaredModel>,
    #[serde(default)]
    reference: Vec<DeclaredReference>,
}

/// The datasets a coordinator serves, by id.
#[derive(Clone, Debug)]
pub struct Datasets {
    by_id: HashMap<String, DeclaredDataset>,
    /// Declared checkpoints' URLs by id.
    models: HashMap<String, String>,
    /// Declared reference sets by id.
    references: HashMap<String, DeclaredReference>,
    /// Ledger store of datasets that name none.
    default_ledger: String,
}

impl Datasets {
    /// Parses a datasets file; `default_ledger` serves datasets that name no ledger.
    pub fn parse(text: &str, path: &str, default_ledger: &str) -> Result<Self, DatasetsError> {
        let invalid = |message: String| DatasetsError::File { path: path.to_string(), message };
        let file: DatasetsFile = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut by_id = HashMap::new();
        for dataset in file.dataset {
            validate_id("dataset id", &dataset.id).map_err(|e| invalid(e.to_string()))?;
            check_input(&dataset.input).map_err(|e| invalid(format!("dataset '{}': {e}", dataset.id)))?;
            let mut names = HashSet::new();
            for table in &dataset.tables {
                let fail = |e: String| invalid(format!("dataset '{}', table '{}': {e}", dataset.id, table.name));
                check_name(&table.name).map_err(fail)?;
                if !names.insert(table.name.to_ascii_lowercase()) {
                    return Err(fail("declared twice (names are compared ignoring case)".into()));
                }
                check_input(&table.input).map_err(fail)?;
                if !keys_read_alike(&dataset.input.csv, &table.input.csv) {
                    return Err(fail("its input must trim, strip suffixes and read nulls as the root's does".into()));
                }
            }
            if !dataset.tables.is_empty() && dataset.unit_column.is_none() {
                return Err(invalid(format!("dataset '{}' declares tables: name their unit_column", dataset.id)));
            }
            let Budget { epsilon, delta } = dataset.budget;
            if !(epsilon > 0.0 && epsilon.is_finite() && (0.0..1.0).contains(&delta)) {
                return Err(invalid(format!("dataset '{}' needs a budget with ε > 0 and δ in [0, 1)", dataset.id)));
            }
            if !(dataset.min_job_epsilon > 0.0 && dataset.min_job_epsilon <= epsilon) {
                return Err(invalid(format!("dataset '{}' needs 0 < min_job_epsilon ≤ its budget's ε", dataset.id)));
            }
            // One person's rows under two declarations would have two budgets.
            let files =
                |d: &DeclaredDataset| d.input_urls().into_iter().chain(d.holdout_urls.clone()).collect::<Vec<_>>();
            for other in by_id.values() {
                for (a, b) in files(&dataset).iter().flat_map(|a| files(other).into_iter().map(move |b| (a.clone(), b)))
                {
                    if storage::nested(&a, &b) {
                        return Err(invalid(format!(
                            "datasets '{}' and '{}' name overlapping files ({a}, {b}): the same people would have two \
                             budgets",
                            other.id, dataset.id
                        )));
                    }
                }
            }
            let id = dataset.id.clone();
            if by_id.insert(id.clone(), dataset).is_some() {
                return Err(invalid(format!("dataset '{id}' is declared twice")));
            }
        }
        let mut models = HashMap::new();
        for model in file.model {
            validate_id("model id", &model.id).map_err(|e| invalid(e.to_string()))?;
            if models.insert(model.id.clone(), model.url).is_some() {
                return Err(invalid(format!("model '{}' is declared twice", model.id)));
            }
        }
        let mut references = HashMap::new();
        for reference in file.reference {
            validate_id("reference id", &reference.id).map_err(|e| invalid(e.to_string()))?;
            // Neighbours are public: a reference set may not overlap any dataset's private
            // files or ledger store.
            let private = by_id.values().flat_map(|d: &DeclaredDataset| {
                d.input_urls()
                    .into_iter()
                    .chain(d.holdout_urls.clone())
                    .chain(d.ledger.clone())
                    .chain([default_ledger.to_string()])
            });
            if reference.url.split('/').any(|segment| segment == "..") {
                return Err(invalid(format!("reference '{}': a location with `..` is refused", reference.id)));
            }
            if let Some(url) = private.into_iter().find(|url| storage::nested(&reference.url, url)) {
                return Err(invalid(format!("reference '{}' overlaps private data or a ledger ({url})", reference.id)));
            }
            if let Some(unknown) = reference.datasets.iter().find(|d| !by_id.contains_key(*d)) {
                return Err(invalid(format!("reference '{}' names an undeclared dataset '{unknown}'", reference.id)));
            }
            if references.insert(reference.id.clone(), reference.clone()).is_some() {
                return Err(invalid(format!("reference '{}' is declared twice", reference.id)));
            }
        }
        Ok(Self { by_id, models, references, default_ledger: default_ledger.to_string() })
    }

    pub fn load(path: &str, default_ledger: &str) -> Result<Self, DatasetsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| DatasetsError::File { path: path.to_string(), message: format!("cannot read: {e}") })?;
        Self::parse(&text, path, default_ledger)
    }

    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.by_id.keys().map(String::as_str)
    }

    fn ledger_url(&self, dataset: &DeclaredDataset) -> String {
        dataset.ledger.clone().unwrap_or_else(|| self.default_ledger.clone())
    }

    /// The ledger store of declared dataset `id`.
    pub fn ledger_of(&self, id: &str) -> Option<String> {
        self.by_id.get(id).map(|dataset| self.ledger_url(dataset))
    }

    /// Creates the ledgers that do not exist yet with their declared budgets and inputs, and
    /// refuses a declaration whose budget or input differs from its existing ledger's: a
    /// ledger's budget is fixed when it is created, its input until an operator rebinds it.
    pub async fn init_ledgers(&self) -> Result<(), DatasetsError> {
        for dataset in self.by_id.values() {
            let fail = |message: String| DatasetsError::Ledger { dataset: dataset.id.clone(), message };
            let location = storage::open(&self.ledger_url(dataset)).map_err(|e| fail(e.to_string()))?;
            let options = AccountingOptions::default();
            let mut ledger = match Ledger::open(&location, &dataset.id).await {
                Err(LedgerError::NotInitialised { .. }) => {
                    tracing::info!(dataset = dataset.id, "creating the declared dataset's ledger");
                    match Ledger::init(&location, &dataset.id, dataset.budget, Adjacency::AddRemove, options).await {
                        Err(LedgerError::AlreadyExists { .. }) => Ledger::open(&location, &dataset.id).await,
                        other => other,
                    }
                }
                other => other,
            }
            .map_err(|e| fail(e.to_string()))?;
            if ledger.budget() != dataset.budget {
                return Err(fail(format!(
                    "the declared budget (ε = {}, δ = {}) differs from the ledger's (ε = {}, δ = {}); the ledger's is \
                     fixed at creation: correct the declaration",
                    dataset.budget.epsilon,
                    dataset.budget.delta,
                    ledger.budget().epsilon,
                    ledger.budget().delta
                )));
            }
            // Every job of the dataset reads its declared input: the ledger records which
            // (the operator's declaration binds a ledger made before inputs were recorded).
            let urls = dataset.input_urls();
            let bound = match ledger.input() {
                None => ledger.rebind_input(&urls).await,
                Some(_) => ledger.bind_input(&urls).await,
            };
            bound.map_err(|e| fail(e.to_string()))?;
        }
        Ok(())
    }

    /// What `rhosynth schema draft` reads and charges for a declared dataset: its input (one
    /// CSV file, read with its declared options), its unit column and its ledger store —
    /// never a caller's.
    pub fn draft_source(&self, id: &str) -> Result<DraftSource, DatasetsError> {
        let dataset = self.by_id.get(id).ok_or_else(|| DatasetsError::Unknown(id.to_string()))?;
        let [url] = dataset.input.urls.as_slice() else {
            return Err(DatasetsError::Ledger {
                dataset: id.to_string(),
                message: "a schema draft reads one CSV file; this dataset declares several inputs".into(),
            });
        };
        if dataset.input.format.unwrap_or_else(|| Format::detect(url)) != Format::Csv {
            return Err(DatasetsError::Ledger {
                dataset: id.to_string(),
                message: "a schema draft reads a CSV file; this dataset's input is Parquet".into(),
            });
        }
        Ok(DraftSource {
            url: url.clone(),
            csv: dataset.input.csv.clone(),
            unit_column: dataset.unit_column.clone(),
            ledger_url: self.ledger_url(dataset),
            ledger_input: dataset.input_urls(),
        })
    }

    /// Binds a submitted job to its declared dataset: refuses what only the operator may
    /// set, then fills in the input, unit column, held-out files and ledger.
    pub fn bind(&self, request: &mut JobRequest) -> Result<(), DatasetsError> {
        let id = request.spec.job.dataset_id.clone();
        let dataset = self.by_id.get(&id).ok_or_else(|| DatasetsError::Unknown(id.clone()))?;
        let refuse = |field| Err(DatasetsError::SetBySubmitter { dataset: id.clone(), field });
        let spec = &mut request.spec;
        if spec.input != Source::default() {
            return refuse("[input]");
        }
        // A database's tables are the declared ones, read from the declared files.
        if spec.tables.iter().any(|t| t.input != Source::default()) {
            return refuse("a table's input ([[tables]] input)");
        }
        let declared_tables = spec
            .tables
            .iter()
            .map(|t| {
                let declared = dataset.tables.iter().find(|d| d.name == t.name);
                declared.ok_or_else(|| DatasetsError::UnknownTable { dataset: id.clone(), table: t.name.clone() })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if request.ledger_url.is_some() || spec.privacy.ledger.is_some() {
            return refuse("a ledger store");
        }
        if spec.privacy.dataset_budget.is_some() {
            return refuse("[privacy] dataset_budget");
        }
        if spec.evaluation.as_ref().is_some_and(|e| !e.test_urls.is_empty()) {
            return refuse("[evaluation] test_urls");
        }
        if spec.schema.unit_column.as_ref().is_some_and(|unit| Some(unit) != dataset.unit_column.as_ref()) {
            return refuse("a unit column other than the declared one");
        }
        // Without the unit column among its columns a spec would read every row as a unit
        // of its own: a patient with k rows would count k times.
        if let Some(unit) = &dataset.unit_column
            && !spec.schema.columns.iter().any(|c| &c.name == unit && c.kind == ColumnKind::Identifier)
        {
            return Err(DatasetsError::UnitColumnMissing { dataset: id.clone(), unit: unit.clone() });
        }
        // A submitter reads everything under its output prefix: it may not hold (or sit
        // inside) any declared input, held-out file or ledger store; nor may it overwrite a
        // declared reference set or model (later jobs read them as public).
        let output = request.resolved_output_url();
        let declared = self
            .by_id
            .values()
            .flat_map(|d| d.input_urls().into_iter().chain(d.holdout_urls.clone()).chain([self.ledger_url(d)]))
            .chain(self.references.values().map(|r| r.url.clone()))
            .chain(self.models.values().cloned());
        if declared.into_iter().any(|url| storage::nested(&output, &url)) {
            return Err(DatasetsError::OutputOverlaps { output });
        }
        let spec = &mut request.spec;
        // A model and a reference set are named by the ids the operator declared.
        let inputs = spec.generator.public_inputs_mut();
        if let Some(checkpoint) = inputs.checkpoint {
            let url = self.models.get(checkpoint).ok_or_else(|| DatasetsError::UnknownModel(checkpoint.clone()))?;
            *checkpoint = url.clone();
        }
        if let Some(reference) = inputs.reference {
            let declared = self
                .references
                .get(reference)
                .filter(|r| r.datasets.contains(&id))
                .ok_or_else(|| DatasetsError::UnknownReference(reference.clone()))?;
            *reference = declared.url.clone();
        }
        if spec.privacy.epsilon < dataset.min_job_epsilon {
            let (epsilon, floor) = (spec.privacy.epsilon, dataset.min_job_epsilon);
            return Err(DatasetsError::BelowMinJobEpsilon { dataset: id, epsilon, floor });
        }
        // The declared ε is the submitter's word; the plan's charge must reach the floor too,
        // so a DP-SGD run's σ is calibrated from ε (a declared σ would set its cost apart
        // from the plan admitted, and could fail the job after its count was read).
        if spec.generator.run().is_some_and(|run| run.noise_multiplier.is_some()) {
            return refuse("a DP-SGD noise_multiplier (it is calibrated from the job's ε)");
        }
        request.charge_floor = Some(dataset.min_job_epsilon);
        request.ledger_input = Some(dataset.input_urls());
        // Every row of every table is read whatever the submitter's schema: a value it does
        // not fit is missing (or `__other__`), so the work a job does never counts rows that
        // fit a predicate the submitter chose.
        read_every_row(&mut spec.input, &mut spec.schema.columns, &dataset.input);
        for (table, declared) in spec.tables.iter_mut().zip(declared_tables) {
            read_every_row(&mut table.input, &mut table.columns, &declared.input);
        }
        spec.schema.unit_column = dataset.unit_column.clone();
        spec.job.partition_by = dataset.partition_by;
        if let Some(evaluation) = &mut spec.evaluation {
            evaluation.test_urls = dataset.holdout_urls.clone();
        }
        request.ledger_url = Some(self.ledger_url(dataset));
        Ok(())
    }
}

/// What a schema draft of a declared dataset reads (`url`, its root table's one CSV file)
/// and charges.
pub struct DraftSource {
    pub url: String,
    pub csv: CsvOptions,
    pub unit_column: Option<String>,
    pub ledger_url: String,
    /// The files the ledger is bound to: the draft's, or with a database's tables theirs too.
    pub ledger_input: Vec<String>,
}

/// Checks a declared input: files named, CSV with a header line, no `bad_rows = "fail"`.
fn check_input(input: &Source) -> Result<(), String> {
    if input.urls.is_empty() {
        return Err("no input urls".into());
    }
    input.csv.check()?;
    let csv = input.urls.iter().any(|u| input.format.unwrap_or_else(|| Format::detect(u)) == Format::Csv);
    if csv && !input.csv.has_header {
        // Else a submitter's column count would set how many fields a row must have,
        // and a failure would say, for free, whether some row has another count.
        return Err("declared CSV inputs need a header line".into());
    }
    if input.bad_rows == Some(BadRows::Fail) {
        return Err("bad_rows = \"fail\" would tell submitters, for free, whether a row breaks the schema they \
                    declare; a declared dataset reads such values as missing (check files with `rhosynth validate`)"
            .into());
    }
    Ok(())
}

/// Sets a table's input to the declared one, read so that no row is left out for its
/// values: each is read as missing or `__other__` where the submitter's schema does not
/// fit it.
fn read_every_row(input: &mut Source, columns: &mut [ColumnSpec], declared: &Source) {
    *input = declared.clone();
    input.bad_rows = Some(BadRows::AsMissing);
    for column in columns {
        column.missing = MissingPolicy::Keep;
        if column.kind == ColumnKind::Categorical {
            column.unknown = UnknownPolicy::Other;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rhosynth_shared::generators::GeneratorSpec;
    use rhosynth_shared::spec::JobSpec;

    const DATASETS: &str = r#"
[[dataset]]
id = "icu"
unit_column = "patient_id"
ledger = "/srv/ledger"
budget = { epsilon = 10.0, delta = 1e-6 }
holdout_urls = ["/srv/icu/holdout.csv"]
[dataset.input]
urls = ["/srv/icu/vitals.csv"]
"#;

    const SPEC: &str = r#"
[job]
dataset_id = "icu"
[schema]
unit_column = "patient_id"
[[schema.columns]]
name = "patient_id"
kind = "identifier"
[[schema.columns]]
name = "pain"
kind = "integer"
min = 0
max = 10
[privacy]
epsilon = 1.0
delta = 1e-7
[generator]
name = "marginals"
[output]
url = "/srv/out"
"#;

    fn request(extra: &str) -> JobRequest {
        let spec = JobSpec::parse(&format!("{SPEC}{extra}"), "job.toml").unwrap();
        JobRequest::new("j", spec)
    }

    #[test]
    fn a_job_gets_the_declared_input_and_ledger() {
        let datasets = Datasets::parse(DATASETS, "datasets.toml", "/default").unwrap();
        let mut job = request("[evaluation]\n");
        datasets.bind(&mut job).unwrap();
        assert_eq!(job.spec.input.urls, ["/srv/icu/vitals.csv"]);
        assert_eq!(job.spec.evaluation.unwrap().test_urls, ["/srv/icu/holdout.csv"]);
        assert_eq!(job.ledger_url.as_deref(), Some("/srv/ledger"));
        assert_eq!(job.spec.input.bad_rows, Some(BadRows::AsMissing), "a row that breaks the schema is never reported");
        // Nor left out: a value the schema does not fit is read as missing or `__other__`.
        let pain = job.spec.schema.columns.iter().find(|c| c.name == "pain").unwrap();
        assert_eq!(pain.missing, MissingPolicy::Keep);
        assert_eq!(job.spec.job.partition_by, PartitionBy::Workers);
        // Who partitions is the operator's choice: a job's own `[job] partition_by` is not.
        let confined = DATASETS.replace("[dataset.input]\n", "partition_by = \"coordinator\"\n[dataset.input]\n");
        let confined = Datasets::parse(&confined, "datasets.toml", "/default").unwrap();
        let mut job = request("");
        job.spec.job.partition_by = PartitionBy::Workers;
        confined.bind(&mut job).unwrap();
        assert_eq!(job.spec.job.partition_by, PartitionBy::Coordinator);
        let failing = DATASETS.replace("[dataset.input]\n", "[dataset.input]\nbad_rows = \"fail\"\n");
        let err = Datasets::parse(&failing, "datasets.toml", "/default").unwrap_err();
        assert!(err.to_string().contains("bad_rows = \"fail\""), "{err}");
        let headless = format!("{DATASETS}[dataset.input.csv]\nhas_header = false\n");
        let err = Datasets::parse(&headless, "datasets.toml", "/default").unwrap_err();
        assert!(err.to_string().contains("need a header line"), "{err}");
    }

    const DATABASE: &str = r#"
[[dataset]]
id = "icu"
unit_column = "subject_id"
ledger = "/srv/ledger"
budget = { epsilon = 10.0, delta = 1e-6 }
[dataset.input]
urls = ["/srv/db/patients.csv"]
[[dataset.tables]]
name = "admissions"
input = { urls = ["/srv/db/admissions.csv"] }
[[dataset.tables]]
name = "vitals"
input = { urls = ["/srv/db/vitals.csv"] }
"#;

    /// A database job on a declared database: its tables name declared tables and read the
    /// declared files, every row of each (never another file a submitter names: another
    /// dataset's people under this budget); some of the tables are the same people.
    #[test]
    fn a_database_job_reads_the_declared_tables() {
        let datasets = Datasets::parse(DATABASE, "datasets.toml", "/default").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let job = || {
            let mut spec = rhosynth_shared::testing::database_spec(dir.path(), (2, 4), "");
            spec.job.dataset_id = "icu".into();
            spec.input = Source::default();
            for table in &mut spec.tables {
                table.input = Source::default();
            }
            spec.output.url = "/srv/out".into();
            JobRequest::new("j", spec)
        };
        let mut bound = job();
        datasets.bind(&mut bound).unwrap();
        let urls: Vec<_> = bound.spec.tables.iter().map(|t| t.input.urls.clone()).collect();
        assert_eq!(urls, [["/srv/db/admissions.csv"], ["/srv/db/vitals.csv"]]);
        assert_eq!(bound.spec.input.urls, ["/srv/db/patients.csv"]);
        for table in &bound.spec.tables {
            assert_eq!(table.input.bad_rows, Some(BadRows::AsMissing), "{}: no row reported", table.name);
            assert!(table.columns.iter().all(|c| c.missing == MissingPolicy::Keep), "{}: nor left out", table.name);
        }
        let outcome = bound.spec.tables[0].columns.iter().find(|c| c.name == "outcome").unwrap();
        assert_eq!(outcome.unknown, UnknownPolicy::Other);
        // The ledger is checked against every declared file, whichever tables a job reads.
        let declared = ["/srv/db/patients.csv", "/srv/db/admissions.csv", "/srv/db/vitals.csv"].map(String::from);
        assert_eq!(bound.ledger_input.as_deref(), Some(declared.as_slice()));
        let mut some = job();
        some.spec.tables.truncate(1);
        datasets.bind(&mut some).unwrap();
        assert_eq!(some.ledger_input.as_deref(), Some(declared.as_slice()));

        let mut own_file = job();
        own_file.spec.tables[1].input.urls = vec!["/srv/other/vitals.csv".into()];
        let err = datasets.bind(&mut own_file).unwrap_err();
        assert!(
            matches!(err, DatasetsError::SetBySubmitter { .. }) && err.to_string().contains("table's input"),
            "{err}"
        );
        let mut undeclared = job();
        undeclared.spec.tables[1].name = "labs".into();
        assert!(matches!(datasets.bind(&mut undeclared), Err(DatasetsError::UnknownTable { .. })));
        let mut holding = job();
        holding.output_url = Some("/srv/db".into());
        assert!(matches!(datasets.bind(&mut holding), Err(DatasetsError::OutputOverlaps { .. })));

        let refused =
            |text: &str| Datasets::parse(text, "datasets.toml", "/default").map(drop).unwrap_err().to_string();
        let no_unit = DATABASE.replace("unit_column = \"subject_id\"\n", "");
        assert!(refused(&no_unit).contains("name their unit_column"));
        let twice = DATABASE.replace("name = \"vitals\"", "name = \"Admissions\"");
        assert!(refused(&twice).contains("declared twice"));
        let failing = DATABASE.replace("vitals.csv\"] }", "vitals.csv\"], bad_rows = \"fail\" }");
        assert!(refused(&failing).contains("bad_rows = \"fail\""));
        let trimmed = DATABASE.replace("vitals.csv\"] }", "vitals.csv\"], csv = { trim = false } }");
        assert!(refused(&trimmed).contains("as the root's does"));
        let other = format!(
            "{DATABASE}[[dataset]]\nid = \"ed\"\nbudget = {{ epsilon = 1.0, delta = 1e-6 }}\n[dataset.input]\nurls = [\"/srv/db/vitals.csv\"]\n"
        );
        assert!(refused(&other).contains("overlapping files"));
    }

    /// A dataset takes jobs of at least its `min_job_epsilon` (0.01 unless declared), so a
    /// budget runs a bounded number of them.
    #[test]
    fn a_job_below_the_datasets_epsilon_floor_is_refused() {
        let datasets = Datasets::parse(DATASETS, "datasets.toml", "/default").unwrap();
        let mut job = request("");
        job.spec.privacy.epsilon = 0.009;
        let err = datasets.bind(&mut job).unwrap_err();
        assert!(matches!(err, DatasetsError::BelowMinJobEpsilon { floor: 0.01, .. }), "{err}");
        let floored = DATASETS.replace("holdout_urls", "min_job_epsilon = 0.5\nholdout_urls");
        let datasets = Datasets::parse(&floored, "datasets.toml", "/default").unwrap();
        let mut job = request("");
        job.spec.privacy.epsilon = 0.4;
        assert!(datasets.bind(&mut job).unwrap_err().to_string().contains("ε ≥ 0.5"));
        job.spec.privacy.epsilon = 0.5;
        datasets.bind(&mut job).unwrap();
        let above = DATASETS.replace("holdout_urls", "min_job_epsilon = 11.0\nholdout_urls");
        assert!(Datasets::parse(&above, "datasets.toml", "/default").is_err());
    }

    /// Two declarations may not name the same or nested files: one person's rows would
    /// have two budgets.
    #[test]
    fn overlapping_declared_inputs_are_refused() {
        for (second, holdout) in
            [("/srv/icu/vitals.csv", "/h.csv"), ("/srv/icu", "/h.csv"), ("/other.csv", "/srv/icu/holdout.csv")]
        {
            let text = format!(
                "{DATASETS}\n[[dataset]]\nid = \"copy\"\nbudget = {{ epsilon = 1.0, delta = 1e-6 }}\nholdout_urls = [\"{holdout}\"]\n[dataset.input]\nurls = [\"{second}\"]\n"
            );
            let err = Datasets::parse(&text, "datasets.toml", "/default").map(drop).unwrap_err().to_string();
            assert!(err.contains("overlapping files"), "{second}: {err}");
        }
        let apart = format!(
            "{DATASETS}\n[[dataset]]\nid = \"other\"\nbudget = {{ epsilon = 1.0, delta = 1e-6 }}\n[dataset.input]\nurls = [\"/srv/claims.csv\"]\n"
        );
        Datasets::parse(&apart, "datasets.toml", "/default").unwrap();
    }

    #[test]
    fn a_job_may_not_choose_what_the_operator_declares() {
        let datasets = Datasets::parse(DATASETS, "datasets.toml", "/default").unwrap();
        let refused = |mut job: JobRequest| datasets.bind(&mut job).unwrap_err().to_string();
        assert!(refused(request("[input]\nurls = [\"/etc/passwd\"]\n")).contains("[input]"));
        assert!(refused(request("[evaluation]\ntest_urls = [\"/x.csv\"]\n")).contains("test_urls"));
        let mut job = request("");
        job.ledger_url = Some("/tmp/fresh-ledger".into());
        assert!(refused(job).contains("ledger"));
        let mut job = request("");
        job.spec.privacy.dataset_budget = Some(Budget { epsilon: 1e6, delta: 0.5 });
        assert!(refused(job).contains("dataset_budget"));
        let mut job = request("");
        job.spec.schema.unit_column = Some("pain".into());
        assert!(refused(job).contains("unit column"));
        // Leaving the unit column out would make every row a unit of its own.
        let mut job = request("");
        job.spec.schema.unit_column = None;
        job.spec.schema.columns.retain(|c| c.name != "patient_id");
        assert!(matches!(datasets.bind(&mut job), Err(DatasetsError::UnitColumnMissing { .. })));
        let mut job = request("");
        job.spec.job.dataset_id = "other".into();
        assert!(matches!(datasets.bind(&mut job), Err(DatasetsError::Unknown(_))));
        // An output prefix holding the declared input (or its ledger) would hand it over.
        for inside in ["/srv/icu", "/srv/ledger/out", "/srv"] {
            let mut job = request("");
            job.output_url = Some(inside.into());
            assert!(matches!(datasets.bind(&mut job), Err(DatasetsError::OutputOverlaps { .. })), "{inside}");
        }
    }

    /// A language-model job's checkpoint is a declared model's id, never a location of the
    /// submitter's choosing (a private object's parse errors would tell about it).
    #[test]
    fn a_checkpoint_is_a_declared_model() {
        let declared = format!("{DATASETS}[[model]]\nid = \"smol\"\nurl = \"/srv/models/smol.gguf\"\n");
        let datasets = Datasets::parse(&declared, "datasets.toml", "/default").unwrap();
        let job = |checkpoint: &str| {
            let text = SPEC.replace(
                "name = \"marginals\"",
                &format!("name = \"dp2stage\"\n[generator.dp2stage]\ncheckpoint = \"{checkpoint}\""),
            );
            let spec = JobSpec::parse(&text, "job.toml").unwrap();
            JobRequest::new("j", spec)
        };
        let mut named = job("smol");
        datasets.bind(&mut named).unwrap();
        let GeneratorSpec::Dp2stage(params) = &named.spec.generator else { unreachable!() };
        assert_eq!(params.checkpoint, "/srv/models/smol.gguf");
        for chosen in ["/srv/icu/vitals.csv", "/srv/models/smol.gguf", "s3://private/x.gguf"] {
            let mut request = job(chosen);
            assert!(matches!(datasets.bind(&mut request), Err(DatasetsError::UnknownModel(_))), "{chosen}");
        }
    }

    /// A reference set is the id of a reference declared for the job's dataset: its
    /// neighbours are never read from a location of the submitter's choosing (such as the
    /// dataset's own input), and a declared one may not overlap private files or ledgers.
    #[test]
    fn a_reference_set_is_declared_for_the_dataset() {
        let declare = |url: &str, datasets: &str| {
            format!(
                "{DATASETS}[[model]]\nid = \"smol\"\nurl = \"/srv/models/smol.gguf\"\n\
                 [[reference]]\nid = \"icu-marginals\"\nurl = \"{url}\"\ndatasets = [{datasets}]\n"
            )
        };
        let datasets = Datasets::parse(&declare("/srv/releases/icu-marginals", "\"icu\""), "d", "/default").unwrap();
        let job = |reference: &str| {
            let text = SPEC.replace(
                "name = \"marginals\"",
                &format!(
                    "name = \"harmonic\"\n[generator.harmonic]\ncheckpoint = \"smol\"\nreference = \"{reference}\""
                ),
            );
            let spec = JobSpec::parse(&text, "job.toml").unwrap();
            JobRequest::new("j", spec)
        };
        let mut named = job("icu-marginals");
        datasets.bind(&mut named).unwrap();
        let GeneratorSpec::Harmonic(params) = &named.spec.generator else { unreachable!() };
        assert_eq!(params.reference.as_deref(), Some("/srv/releases/icu-marginals"));
        assert_eq!(params.checkpoint, "/srv/models/smol.gguf");
        for chosen in ["/srv/icu/vitals.csv", "/srv/releases/icu-marginals", "smol"] {
            let mut request = job(chosen);
            assert!(matches!(datasets.bind(&mut request), Err(DatasetsError::UnknownReference(_))), "{chosen}");
        }
        // A job may not write its output over a declared reference set.
        let mut overwrite = job("icu-marginals");
        overwrite.output_url = Some("/srv/releases/icu-marginals".into());
        assert!(matches!(datasets.bind(&mut overwrite), Err(DatasetsError::OutputOverlaps { .. })));
        // Nor over (or around) a declared model, which later jobs read as public.
        for over in ["/srv/models/smol.gguf", "/srv/models"] {
            let mut overwrite = job("icu-marginals");
            overwrite.output_url = Some(over.into());
            assert!(matches!(datasets.bind(&mut overwrite), Err(DatasetsError::OutputOverlaps { .. })), "{over}");
        }
        // Declared for no dataset of this job: refused as undeclared.
        let elsewhere = Datasets::parse(&declare("/srv/releases/icu-marginals", ""), "d", "/default").unwrap();
        assert!(matches!(elsewhere.bind(&mut job("icu-marginals")), Err(DatasetsError::UnknownReference(_))));
        for (url, datasets, says) in [
            ("/srv/icu", "\"icu\"", "overlaps"),
            ("/srv/icu/holdout.csv", "\"icu\"", "overlaps"),
            ("/srv/ledger/icu", "\"icu\"", "overlaps"),
            ("/srv/releases/x", "\"ed\"", "undeclared dataset"),
            ("/srv/releases/../icu/vitals.csv", "\"icu\"", "`..`"),
        ] {
            let err = Datasets::parse(&declare(url, datasets), "d", "/default").unwrap_err().to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
        // The sequence model's stage 1 reads a declared reference set too, never a location
        // of the submitter's choosing.
        let sequence = |reference: &str| {
            let text = SPEC.replace(
                "name = \"marginals\"",
                &format!("name = \"sequence\"\n[generator.sequence]\nreference = \"{reference}\""),
            );
            let spec = JobSpec::parse(&text, "job.toml").unwrap();
            JobRequest::new("j", spec)
        };
        let mut named = sequence("icu-marginals");
        datasets.bind(&mut named).unwrap();
        let GeneratorSpec::Sequence(params) = &named.spec.generator else { unreachable!() };
        assert_eq!(params.reference.as_deref(), Some("/srv/releases/icu-marginals"));
        for chosen in ["/srv/icu/vitals.csv", "/srv/releases/icu-marginals"] {
            let mut request = sequence(chosen);
            assert!(matches!(datasets.bind(&mut request), Err(DatasetsError::UnknownReference(_))), "{chosen}");
        }
    }

    #[tokio::test]
    async fn ledgers_are_created_with_the_declared_budget_and_a_changed_budget_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().to_str().unwrap();
        let text = DATASETS.replace("/srv/ledger", ledger);
        Datasets::parse(&text, "datasets.toml", "/default").unwrap().init_ledgers().await.unwrap();
        let opened = Ledger::open(&storage::open(ledger).unwrap(), "icu").await.unwrap();
        assert_eq!(opened.budget(), Budget { epsilon: 10.0, delta: 1e-6 });
        // Restarting with the same declaration is fine; raising the budget is not.
        Datasets::parse(&text, "datasets.toml", "/default").unwrap().init_ledgers().await.unwrap();
        let raised = text.replace("epsilon = 10.0", "epsilon = 100.0");
        let err = Datasets::parse(&raised, "datasets.toml", "/default").unwrap().init_ledgers().await.unwrap_err();
        assert!(err.to_string().contains("differs from the ledger's"), "{err}");
        // The ledger is bound to the declared input; another is refused until it is rebound.
        assert_eq!(opened.input(), Some(["file:///srv/icu/vitals.csv".to_string()].as_slice()));
        let moved = text.replace("/srv/icu/vitals.csv", "/srv/icu/other.csv");
        let err = Datasets::parse(&moved, "datasets.toml", "/default").unwrap().init_ledgers().await.unwrap_err();
        assert!(err.to_string().contains("is bound to the input"), "{err}");

        // A ledger made before inputs were recorded, already charged: the declaration binds it.
        let legacy = tempfile::tempdir().unwrap();
        let location = storage::open(legacy.path().to_str().unwrap()).unwrap();
        let budget = Budget { epsilon: 10.0, delta: 1e-6 };
        let mut old =
            Ledger::init(&location, "icu", budget, Adjacency::AddRemove, AccountingOptions::default()).await.unwrap();
        let gaussian = rhosynth_shared::accounting::mechanism::Mechanism::Gaussian {
            l2_sensitivity: 1.0,
            noise_multiplier: 10.0,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        };
        let accountant = rhosynth_shared::accounting::accountant::Accountant::Rdp;
        let charge = rhosynth_privacy::ledger::ChargeRequest {
            job_id: "old".into(),
            mechanisms: vec![gaussian],
            accountant,
            delta: 1e-6,
        };
        old.charge(&charge).await.unwrap();
        let text = DATASETS.replace("/srv/ledger", legacy.path().to_str().unwrap());
        Datasets::parse(&text, "datasets.toml", "/default").unwrap().init_ledgers().await.unwrap();
        let bound = Ledger::open(&location, "icu").await.unwrap();
        assert_eq!(bound.input(), Some(["file:///srv/icu/vitals.csv".to_string()].as_slice()));
    }

    /// A served job's planned charge is held to the dataset's floor (`charge_floor`), and a
    /// DP-SGD run's σ is calibrated from its ε: a declared σ is refused.
    #[test]
    fn a_served_job_is_held_to_the_floor_and_its_sigma_is_calibrated() {
        let datasets = Datasets::parse(DATASETS, "datasets.toml", "/default").unwrap();
        let mut job = request("");
        datasets.bind(&mut job).unwrap();
        assert_eq!(job.charge_floor, Some(0.01));
        let text = SPEC
            .replace("name = \"marginals\"", "name = \"findiff\"\n[generator.findiff.run]\nnoise_multiplier = 50.0");
        let spec = JobSpec::parse(&text, "job.toml").unwrap();
        let mut job = JobRequest { spec, ..request("") };
        let err = datasets.bind(&mut job).unwrap_err();
        assert!(matches!(err, DatasetsError::SetBySubmitter { .. }) && err.to_string().contains("noise_multiplier"));
    }
}
