//! Evaluation of synthetic data against real data: fidelity, longitudinal fidelity and
//! empirical privacy diagnostics, with a JSON and a self-contained HTML report.
//!
//! Evaluation reads *real* (private) data, train and held-out alike: its numbers are
//! diagnostics for the data owner, not for publication, and carry no DP guarantee. The
//! report says so at its top, and [`run`] refuses to write it into (or under) a release.
//!
//! Cost: every metric reads at most the rows its [`EvalLimits`] cap allows; larger tables
//! are sampled uniformly without replacement (a seeded, non-cryptographic RNG: the sampling
//! makes the diagnostics cheaper, it is not a privacy mechanism and protects nothing), and
//! the report lists, per metric, the rows used out of the rows available. Below the caps
//! nothing is sampled and every metric is exact.

pub mod database;
pub mod fidelity;
pub mod longitudinal;
pub mod privacy;
pub mod report;
pub mod utility;

use std::time::Instant;

use object_store::{ObjectStoreExt, PutPayload};
use rand::SeedableRng;
use rand::rngs::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::data::DataError;
use crate::data::domain::{ColumnDomain, Domain, Encoding};
use crate::data::table::{Table, load, release_parts};
use crate::output::MANIFEST;
use crate::spec::JobSpec;
use crate::storage;

/// Public caps on what each metric reads (rows, tables, column pairs), so that the cost of
/// an evaluation is bounded whatever the size of the tables. A table over a cap is sampled
/// uniformly without replacement, seeded by `seed`; below every cap the evaluation is exact.
/// Defaults are above UCI Adult (32 561 training and 16 281 held-out rows), so the checks
/// against scikit-learn run unsampled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalLimits {
    /// DCR: query rows, synthetic and held-out (each).
    pub dcr_queries: usize,
    /// DCR: training rows searched for the nearest record (the same sample for the
    /// synthetic and the held-out queries).
    pub dcr_reference: usize,
    /// Membership attack: members (training rows) and non-members (held-out rows), each.
    pub attack_records: usize,
    /// Membership attack: synthetic rows a record's nearest neighbour is searched among.
    pub attack_reference: usize,
    /// Pair and CorAcc: rows per table (real training, synthetic).
    pub fidelity_rows: usize,
    /// Pair and CorAcc: column pairs (sampled when the schema has more).
    pub fidelity_pairs: usize,
    /// Triple: column triples (sampled when the schema has more).
    pub fidelity_triples: usize,
    /// Utility: rows a model is fitted on (synthetic, real training; each).
    pub utility_fit_rows: usize,
    /// Utility: held-out rows scored.
    pub utility_test_rows: usize,
    /// TDCR: query tables (units), synthetic and held-out (each).
    pub tdcr_queries: usize,
    /// TDCR: training tables searched for the nearest table (the same sample for both
    /// query sets).
    pub tdcr_reference: usize,
    /// TDCR: the most DTW cells a brute-force search over the samples may fill (estimated
    /// from mean lengths); beyond it both TDCR samples shrink by one factor.
    pub tdcr_cells: u64,
    /// A database's evaluation: units read of each database (train, held-out, synthetic).
    /// (Absent from reports written before databases.)
    #[serde(default = "default_database_units")]
    pub database_units: usize,
    /// Seed of the (non-private) sampling RNG.
    pub seed: u64,
}

fn default_database_units() -> usize {
    EvalLimits::default().database_units
}

impl Default for EvalLimits {
    fn default() -> Self {
        Self {
            dcr_queries: 10_000,
            dcr_reference: 200_000,
            attack_records: 1_000,
            attack_reference: 8_000,
            fidelity_rows: 200_000,
            fidelity_pairs: 2_000,
            fidelity_triples: 500,
            utility_fit_rows: 50_000,
            utility_test_rows: 100_000,
            tdcr_queries: 5_000,
            tdcr_reference: 20_000,
            tdcr_cells: 20_000_000_000,
            database_units: 50_000,
            seed: 0x5eed,
        }
    }
}

/// How many of a table's rows (or tables) one metric used.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleUse {
    /// The metric and its part, e.g. "DCR reference".
    pub metric: String,
    /// Which table: "train", "test" (held-out), "synthetic", or "column pairs" or "column triples".
    pub table: String,
    pub used: usize,
    pub available: usize,
    /// `used < available`: sampled uniformly under the cap.
    pub sampled: bool,
}

/// The record of what every metric read, collected while evaluating.
#[derive(Clone, Debug, Default)]
pub struct Sampling {
    pub uses: Vec<SampleUse>,
    seed: u64,
}

impl Sampling {
    pub fn new(seed: u64) -> Self {
        Self { uses: Vec::new(), seed }
    }

    /// Up to `cap` of `0..available`, uniformly without replacement, in increasing order
    /// (all of them when `available <= cap`); recorded under `metric` / `table`. Every call
    /// draws from its own stream (seed, metric, table), so one metric's sample does not
    /// depend on which other metrics ran.
    pub fn sample(&mut self, metric: &str, table: &str, available: usize, cap: usize) -> Vec<usize> {
        let used = available.min(cap);
        let indices = if used == available {
            (0..available).collect()
        } else {
            let stream = format!("{metric}/{table}").bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3) // FNV-1a
            });
            // Which rows a diagnostic scores, for the data owner's report (never released, no
            // privacy noise): public randomness, seeded so that a report is repeatable.
            let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ stream);
            let mut picked = rand::seq::index::sample(&mut rng, available, used).into_vec();
            picked.sort_unstable();
            picked
        };
        self.record(metric, table, used, available);
        indices
    }

    /// Records that `metric` used `used` of `available` (e.g. every row: `used == available`).
    pub fn record(&mut self, metric: &str, table: &str, used: usize, available: usize) {
        self.uses.push(SampleUse {
            metric: metric.to_string(),
            table: table.to_string(),
            used,
            available,
            sampled: used < available,
        });
    }
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

/// Everything `rhosynth eval` reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalReport {
    /// Always present, first: "NOT DIFFERENTIALLY PRIVATE — DO NOT PUBLISH." and why.
    pub notice: String,
    /// Always `false`: the report is computed on private data without any DP mechanism.
    pub differentially_private: bool,
    /// The formal guarantee, from the synthetic output's manifest when there is one.
    pub guarantee: Option<serde_json::Value>,
    pub rows: RowCounts,
    /// Train-on-synthetic, test-on-real (when the spec names a categorical target).
    pub utility: Option<utility::Utility>,
    pub fidelity: fidelity::Fidelity,
    pub longitudinal: Option<longitudinal::Longitudinal>,
    pub privacy: privacy::PrivacyDiagnostics,
    /// The caps the evaluation ran under.
    pub limits: EvalLimits,
    /// Per metric and table, the rows (tables, pairs) used out of those available.
    pub sampling: Vec<SampleUse>,
    /// Wall-clock seconds per stage.
    pub timings: Vec<StageTiming>,
}

/// How long one evaluation stage took.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StageTiming {
    pub stage: String,
    pub seconds: f64,
}

/// Table sizes (private: part of a report that must not be published as is).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowCounts {
    pub train: usize,
    pub test: usize,
    pub synthetic: usize,
}

/// The first words of every report (JSON `notice`, the HTML page's banner).
macro_rules! not_dp {
    () => {
        "NOT DIFFERENTIALLY PRIVATE — DO NOT PUBLISH."
    };
}
pub const NOT_DP: &str = not_dp!();

/// The notice every report carries.
pub const NOTICE: &str = concat!(
    not_dp!(),
    " Computed on private data (the training and the held-out real tables): a diagnostic for the data owner, not a \
     privacy guarantee. The formal guarantee is the (ε, δ) below, from the privacy ledger."
);

/// Runs every evaluation the spec allows, under the default [`EvalLimits`].
pub fn evaluate(
    spec: &JobSpec,
    domain: &Domain,
    train: &Table,
    test: &Table,
    synthetic: &Table,
    guarantee: Option<serde_json::Value>,
) -> EvalReport {
    evaluate_with(spec, domain, train, test, synthetic, guarantee, &EvalLimits::default(), &|_| {})
}

/// Runs every evaluation the spec allows under `limits`. Each stage is logged when it
/// starts and when it is done ("evaluation [2/4]: utility done (12 s)"), and announced to
/// `progress` as it starts ("evaluation 2/4: utility").
#[allow(clippy::too_many_arguments)]
pub fn evaluate_with(
    spec: &JobSpec,
    domain: &Domain,
    train: &Table,
    test: &Table,
    synthetic: &Table,
    guarantee: Option<serde_json::Value>,
    limits: &EvalLimits,
    progress: &dyn Fn(&str),
) -> EvalReport {
    let order = spec.schema.order_by.as_deref().and_then(|o| domain.index_of(o));
    let order = spec.schema.unit_column.as_ref().and(order);
    let target = spec.schema.target.as_deref().and_then(|t| {
        let target = domain.index_of(t)?;
        let positive =
            match (&spec.schema.positive_class, &spec.schema.columns.iter().find(|c| c.name == t)?.categories) {
                (Some(p), _) => p.clone(),
                (None, Some(categories)) => categories.last()?.clone(),
                (None, None) => return None,
            };
        Some((target, positive))
    });
    let stages = 2 + usize::from(target.is_some()) + usize::from(order.is_some());
    let mut stage = 0;
    let mut timings = Vec::new();
    let mut timed = |name: &str| {
        stage += 1;
        progress(&format!("evaluation {stage}/{stages}: {name}"));
        tracing::info!(stage, stages, "evaluation [{stage}/{stages}]: {name} started");
        let started = Instant::now();
        let name = name.to_string();
        move |timings: &mut Vec<StageTiming>| {
            let seconds = started.elapsed().as_secs_f64();
            tracing::info!(stage, stages, seconds, "evaluation [{stage}/{stages}]: {name} done ({seconds:.1} s)");
            timings.push(StageTiming { stage: name, seconds });
        }
    };
    let mut sampling = Sampling::new(limits.seed);

    let done = timed("fidelity");
    let fidelity = fidelity::evaluate(domain, train, synthetic, limits, &mut sampling);
    done(&mut timings);
    let utility = target.and_then(|(target, positive)| {
        let done = timed("utility");
        let trained = [("synthetic", "synthetic", synthetic), ("real (train)", "train", train)];
        let utility = utility::evaluate(domain, (target, &positive), test, &trained, limits, &mut sampling);
        done(&mut timings);
        utility
    });
    let longitudinal = order.map(|order| {
        let done = timed("longitudinal");
        let longitudinal = longitudinal::evaluate(domain, order, train, test, synthetic, limits, &mut sampling);
        done(&mut timings);
        longitudinal
    });
    let done = timed("empirical privacy");
    let privacy = privacy::evaluate(domain, train, test, synthetic, limits, &mut sampling);
    done(&mut timings);
    EvalReport {
        notice: NOTICE.to_string(),
        differentially_private: false,
        guarantee,
        rows: RowCounts { train: train.rows(), test: test.rows(), synthetic: synthetic.rows() },
        utility,
        fidelity,
        longitudinal,
        privacy,
        limits: *limits,
        sampling: sampling.uses,
        timings,
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
    #[error("evaluation: the label '{label}': {reason}")]
    Label { label: String, reason: String },
    #[error("evaluation: the {argument} database's files: {reason}")]
    DatabaseFiles { argument: &'static str, reason: String },
    #[error(
        "evaluation: refusing to write the report to {out}: {reason}. The report is computed on private data and is \
         not differentially private; it must never sit beside a release. Write it to an operator-only location."
    )]
    BesideRelease { out: String, reason: String },
}

/// Refuses a report location that is the synthetic prefix itself, or that is (or lies
/// under) a prefix holding a rhosynth manifest: a report must never sit beside a release.
pub async fn check_report_location(out: &str, synthetic_url: &str) -> Result<(), EvalError> {
    let refuse = |reason: String| Err(EvalError::BesideRelease { out: out.to_string(), reason });
    let (scheme, path) = storage::canonical_url(out);
    if (scheme.clone(), path.clone()) == storage::canonical_url(synthetic_url) {
        return refuse(format!("it is the synthetic data's own prefix ({synthetic_url})"));
    }
    if scheme == "s3" {
        let (bucket, key) = path.split_once('/').unwrap_or((&path, ""));
        let location = storage::open(&format!("s3://{bucket}"))?;
        let parts: Vec<&str> = key.split('/').filter(|p| !p.is_empty()).collect();
        for depth in (0..=parts.len()).rev() {
            let prefix = parts[..depth].join("/");
            let manifest = if prefix.is_empty() { MANIFEST.to_string() } else { format!("{prefix}/{MANIFEST}") };
            match location.store.head(&location.child(&manifest)).await {
                Ok(_) => return refuse(format!("s3://{bucket}/{manifest} exists (a rhosynth release)")),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(EvalError::Io(format!("checking s3://{bucket}/{manifest}: {e}"))),
            }
        }
    } else if scheme == "file" {
        for dir in std::path::Path::new(&path).ancestors() {
            let manifest = dir.join(MANIFEST);
            if manifest.exists() {
                return refuse(format!("{} exists (a rhosynth release)", manifest.display()));
            }
        }
    }
    Ok(())
}

/// Loads the three tables, evaluates under the default [`EvalLimits`], and writes
/// `report.json` and `report.html` to `out`. Refuses (before reading anything) an `out` that
/// is the synthetic prefix or lies in or under a release ([`check_report_location`]).
/// Every stage is logged as it starts and ends (to the operator's log: stage times follow
/// the private tables' sizes); the metrics run on a blocking thread, so the async runtime
/// stays responsive meanwhile.
pub async fn run(
    spec: &JobSpec,
    train_urls: &[String],
    test_urls: &[String],
    synthetic_url: &str,
    out: &str,
) -> Result<EvalReport, EvalError> {
    check_report_location(out, synthetic_url).await?;
    let domain = Domain::from_spec(spec);
    tracing::info!("evaluation: loading the tables");
    let started = Instant::now();
    let (parts, manifest) = release_parts(synthetic_url).await?;
    let guarantee = manifest.and_then(|m| serde_json::to_value(&m.privacy).ok());
    let train = load(spec, &domain, train_urls).await?;
    let test = load(spec, &domain, test_urls).await?;
    let synthetic = load(spec, &domain, &parts).await?;
    // No row counts in the log: the tables' sizes are private figures too.
    tracing::info!("evaluation: tables loaded ({:.1} s)", started.elapsed().as_secs_f64());

    let spec_owned = spec.clone();
    let span = tracing::Span::current();
    let report = tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        evaluate_with(&spec_owned, &domain, &train, &test, &synthetic, guarantee, &EvalLimits::default(), &|_| {})
    })
    .await
    .map_err(|e| EvalError::Io(format!("evaluation worker: {e}")))?;

    let json = serde_json::to_vec_pretty(&report).map_err(|e| EvalError::Io(e.to_string()))?;
    write_report(out, json, report::html(&report)).await?;
    tracing::info!("evaluation: report written to {out} (not differentially private: do not publish)");
    Ok(report)
}

/// Writes `report.json` and `report.html` to `out`; on a local disk readable by their
/// owner only (they are private data, whatever folder they land in).
async fn write_report(out: &str, json: Vec<u8>, html: String) -> Result<(), EvalError> {
    let location = storage::open(out)?;
    let (scheme, path) = storage::canonical_url(out);
    for (name, bytes) in [("report.json", json), ("report.html", html.into_bytes())] {
        location
            .store
            .put(&location.child(name), PutPayload::from(bytes))
            .await
            .map_err(|e| EvalError::Io(format!("writing {out}/{name}: {e}")))?;
        if scheme == "file" {
            use std::os::unix::fs::PermissionsExt;
            let file = std::path::Path::new(&path).join(name);
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| EvalError::Io(format!("making {} private: {e}", file.display())))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_exact_below_the_cap_and_uniform_above() {
        let mut sampling = Sampling::new(1);
        assert_eq!(sampling.sample("m", "train", 5, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(sampling.sample("m", "test", 3, 10), vec![0, 1, 2]);
        let picked = sampling.sample("m", "synthetic", 1000, 10);
        assert_eq!(picked.len(), 10);
        assert!(picked.windows(2).all(|w| w[0] < w[1]) && picked[9] < 1000);
        // Deterministic per (seed, metric, table), independent of what ran before.
        assert_eq!(Sampling::new(1).sample("m", "synthetic", 1000, 10), picked);
        assert_ne!(Sampling::new(1).sample("other", "synthetic", 1000, 10), picked);
        let flags: Vec<_> = sampling.uses.iter().map(|u| (u.used, u.available, u.sampled)).collect();
        assert_eq!(flags, [(5, 5, false), (3, 3, false), (10, 1000, true)]);
    }

    #[tokio::test]
    async fn a_report_never_goes_beside_a_release() {
        let dir = tempfile::tempdir().unwrap();
        let release = dir.path().join("release");
        std::fs::create_dir_all(release.join("sub")).unwrap();
        std::fs::write(release.join(MANIFEST), "{}").unwrap();
        let release_url = release.to_str().unwrap();
        for out in [
            release_url.to_string(),
            format!("file://{release_url}/"),
            format!("{release_url}/report"),
            format!("{release_url}/sub/deeper"),
            format!("{}/../release/./sub", release_url),
        ] {
            let refused = check_report_location(&out, "/elsewhere/synthetic.csv").await;
            assert!(matches!(refused, Err(EvalError::BesideRelease { .. })), "{out}: {refused:?}");
        }
        // The synthetic prefix itself, even without a manifest.
        let plain = dir.path().join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        let plain = plain.to_str().unwrap();
        assert!(check_report_location(&format!("{plain}/"), plain).await.is_err());
        // Beside the release's parent, or anywhere else: fine.
        check_report_location(dir.path().join("diagnostics/job-1").to_str().unwrap(), release_url).await.unwrap();
        check_report_location(&format!("{plain}/report"), release_url).await.unwrap();
    }
}
