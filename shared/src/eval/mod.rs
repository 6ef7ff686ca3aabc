//! Evaluation of synthetic data against real data: fidelity, longitudinal fidelity and
//! empirical privacy diagnostics, with a JSON and a self-contained HTML report.
//!
//! Evaluation reads *real* (private) data, train and held-out alike: its numbers are
//! diagnostics for the data owner, not for publication, and carry no DP guarantee.

pub mod fidelity;
pub mod longitudinal;
pub mod privacy;
pub mod report;
pub mod utility;

use serde::{Deserialize, Serialize};

use object_store::{ObjectStoreExt, PutPayload};

use crate::data::DataError;
use crate::data::domain::{ColumnDomain, Domain, Encoding};
use crate::data::input::InputReader;
use crate::output::{MANIFEST, Manifest};
use crate::spec::{Format, JobSpec};
use crate::storage;

/// A table loaded for evaluation: per row its unit and its encoded values.
#[derive(Clone, Debug)]
pub struct Table {
    pub units: Vec<String>,
    /// `columns[d][row]`: category code or clamped number; `None` = missing.
    pub columns: Vec<Vec<Option<f64>>>,
}

impl Table {
    pub fn rows(&self) -> usize {
        self.units.len()
    }
}

/// Reads `urls` with the spec's schema (CSV dialect for CSV files).
pub async fn load(spec: &JobSpec, domain: &Domain, urls: &[String]) -> Result<Table, DataError> {
    let mut spec = spec.clone();
    spec.input.urls = urls.to_vec();
    spec.input.format = None;
    if urls.iter().all(|u| Format::detect(u) == Format::Parquet) {
        // dpsynth's own output spells values exactly as declared.
        spec.input.csv.strip_suffix = None;
    }
    let mut table = Table { units: Vec::new(), columns: vec![Vec::new(); domain.columns.len()] };
    let mut reader = InputReader::new(&spec, domain);
    while let Some(batch) = reader.next_batch().await? {
        table.units.extend(batch.units);
        for (column, values) in table.columns.iter_mut().zip(batch.values) {
            column.extend(values);
        }
    }
    Ok(table)
}

/// `items.iter().map(f)`, spread over all cores (nearest-neighbour searches).
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = items.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> =
            items.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<_>>())).collect();
        handles.into_iter().flat_map(|h| h.join().expect("worker thread")).collect()
    })
}

/// Whether a column is numeric (compared as numbers) or categorical.
pub fn is_numeric(c: &ColumnDomain) -> bool {
    matches!(c.encoding, Encoding::Numeric { .. })
}

/// Everything `dpsynth eval` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalReport {
    /// Always present: evaluation used private data.
    pub notice: String,
    /// The formal guarantee, from the synthetic output's manifest when there is one.
    pub guarantee: Option<serde_json::Value>,
    pub rows: RowCounts,
    /// Train-on-synthetic, test-on-real (when the spec names a categorical target).
    pub utility: Option<utility::Utility>,
    pub fidelity: fidelity::Fidelity,
    pub longitudinal: Option<longitudinal::Longitudinal>,
    pub privacy: privacy::PrivacyDiagnostics,
}

/// Table sizes (private: part of a report that must not be published as is).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowCounts {
    pub train: usize,
    pub test: usize,
    pub synthetic: usize,
}

/// The notice every report carries.
pub const NOTICE: &str = "Computed on private data (the training and the held-out real tables): a diagnostic for the \
     data owner, NOT for publication as is, and not a privacy guarantee. The formal guarantee is the (ε, δ) \
     below, from the privacy ledger.";

/// Runs every evaluation the spec allows.
pub fn evaluate(
    spec: &JobSpec,
    domain: &Domain,
    train: &Table,
    test: &Table,
    synthetic: &Table,
    guarantee: Option<serde_json::Value>,
) -> EvalReport {
    let order = spec.schema.order_by.as_deref().and_then(|o| domain.index_of(o));
    let longitudinal = match (&spec.schema.unit_column, order) {
        (Some(_), Some(order)) => Some(longitudinal::evaluate(domain, order, train, test, synthetic)),
        _ => None,
    };
    let utility = spec.schema.target.as_deref().and_then(|t| {
        let target = domain.index_of(t)?;
        let positive =
            match (&spec.schema.positive_class, &spec.schema.columns.iter().find(|c| c.name == t)?.categories) {
                (Some(p), _) => p.clone(),
                (None, Some(categories)) => categories.last()?.clone(),
                (None, None) => return None,
            };
        utility::evaluate(domain, target, &positive, train, test, synthetic)
    });
    EvalReport {
        notice: NOTICE.to_string(),
        guarantee,
        rows: RowCounts { train: train.rows(), test: test.rows(), synthetic: synthetic.rows() },
        utility,
        fidelity: fidelity::evaluate(domain, train, synthetic),
        longitudinal,
        privacy: privacy::evaluate(domain, train, test, synthetic),
    }
}

/// Errors of an evaluation run.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    #[error("evaluation: {0}")]
    Io(String),
}

/// The synthetic data at `url`: a dpsynth output prefix (its manifest lists the parts and
/// states the guarantee) or a single file.
async fn synthetic_source(url: &str) -> Result<(Vec<String>, Option<serde_json::Value>), EvalError> {
    if std::path::Path::new(url.trim_start_matches("file://")).is_file() {
        return Ok((vec![url.to_string()], None));
    }
    let location = storage::open_existing_prefix(url)?;
    match location.store.get(&location.child(MANIFEST)).await {
        Ok(got) => {
            let bytes = got.bytes().await.map_err(|e| EvalError::Io(e.to_string()))?;
            let manifest: Manifest =
                serde_json::from_slice(&bytes).map_err(|e| EvalError::Io(format!("{url}/{MANIFEST}: {e}")))?;
            let base = url.trim_end_matches('/');
            let parts = manifest.parts.iter().map(|p| format!("{base}/{}", p.path)).collect();
            Ok((parts, serde_json::to_value(&manifest.privacy).ok()))
        }
        Err(object_store::Error::NotFound { .. }) => Ok((vec![url.to_string()], None)),
        Err(e) => Err(EvalError::Io(format!("{url}: {e}"))),
    }
}

/// Loads the three tables, evaluates, and writes `report.json` and `report.html` to `out`.
pub async fn run(
    spec: &JobSpec,
    train_urls: &[String],
    test_urls: &[String],
    synthetic_url: &str,
    out: &str,
) -> Result<EvalReport, EvalError> {
    let domain = Domain::from_spec(spec);
    let (parts, guarantee) = synthetic_source(synthetic_url).await?;
    let train = load(spec, &domain, train_urls).await?;
    let test = load(spec, &domain, test_urls).await?;
    let synthetic = load(spec, &domain, &parts).await?;
    let report = evaluate(spec, &domain, &train, &test, &synthetic, guarantee);
    let location = storage::open(out)?;
    let json = serde_json::to_vec_pretty(&report).map_err(|e| EvalError::Io(e.to_string()))?;
    for (name, bytes) in [("report.json", json), ("report.html", report::html(&report).into_bytes())] {
        location
            .store
            .put(&location.child(name), PutPayload::from(bytes))
            .await
            .map_err(|e| EvalError::Io(format!("writing {out}/{name}: {e}")))?;
    }
    Ok(report)
}
