//! Synthetic-data generators. Each states what it measures and how it is charged, and
//! plans from public information only (the spec and the declared domain). Each is a
//! folder with the same files: `plan` (from public information: what it measures and the
//! mechanisms it is charged for), `task` (the worker's side: the aggregate it computes,
//! its wire form, and the coordinator's check of a worker's answer) and `sampler` (rows
//! drawn from what was fitted to released values), beside the model's own modules. The
//! coordinator's side (rounds, charges, releases) is `rhosynth_coordinator::generators`.

pub mod aim;
pub mod dp2stage;
pub mod findiff;
pub mod harmonic;
pub mod history_copula;
pub mod marginals;
pub mod pate;
pub mod reference;
pub mod section;
pub mod sequence;

pub use section::{GeneratorName, GeneratorSpec};

use rand::rngs::ChaCha20Rng;

use crate::accounting::accountant::AccountingOptions;
use crate::data::domain::{Binning, Domain, Encoding};
use crate::output::SyntheticUnits;
use crate::spec::{ColumnKind, JobSpec};

/// Draws synthetic units from what a generator fitted to its released values: a row each
/// (`rows_per_draw` 1) or a whole history each. Sampling is post-processing: it costs no
/// budget, so its randomness need not be private (the lifecycle passes an OS-keyed
/// generator all the same).
pub trait Sampler: Send {
    /// Most rows one drawn unit has.
    fn rows_per_draw(&self) -> usize {
        1
    }

    fn sample(&mut self, units: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits;
}

/// Why a generator cannot run a spec. Decided from the spec alone, so it may be shown to
/// the submitter.
#[derive(Debug, thiserror::Error)]
#[error("{generator} generator: {message}")]
pub struct PlanError {
    generator: &'static str,
    message: String,
}

impl PlanError {
    pub fn new(generator: &'static str, message: impl Into<String>) -> Self {
        Self { generator, message: message.into() }
    }
}

/// Plans the spec's generator from public information alone, so that bad parameters are
/// refused when a job is submitted rather than when it runs. (A job plans again when it
/// runs, with its ledger's accounting options.)
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    match &spec.generator {
        GeneratorSpec::Marginals(_) => {
            marginals::MarginalsPlan::new(spec, domain, &AccountingOptions::default()).map(drop)
        }
        GeneratorSpec::Aim(_) => aim::AimPlan::new(spec, domain, &AccountingOptions::default()).map(drop),
        GeneratorSpec::Findiff(_) => findiff::FinDiffPlan::new(spec, domain, &AccountingOptions::default()).map(drop),
        GeneratorSpec::Pate(_) => pate::PatePlan::new(spec, domain, &AccountingOptions::default()).map(drop),
        GeneratorSpec::Sequence(_) => {
            sequence::SequencePlan::new(spec, domain, &AccountingOptions::default()).map(drop)
        }
        // How rows read needs the checkpoint's tokenizer: checked when the job runs.
        GeneratorSpec::Dp2stage(_) | GeneratorSpec::Harmonic(_) => dp2stage::plan::check(spec, domain).map(drop),
        GeneratorSpec::HistoryCopula(_) => {
            history_copula::HistoryCopulaPlan::new(spec, domain, &AccountingOptions::default()).map(drop)
        }
    }
}

/// Checks that every named parameter is a positive finite number.
pub fn require_positive(generator: &'static str, params: &[(&str, f64)]) -> Result<(), PlanError> {
    match params.iter().find(|(_, v)| !(v.is_finite() && *v > 0.0)) {
        Some((name, v)) => Err(PlanError::new(generator, format!("{name} must be a positive number, got {v}"))),
        None => Ok(()),
    }
}

/// The order column's domain index and the public bins of the gap between consecutive
/// order values (geometric over its declared range), if the schema orders rows.
pub fn order_with_gaps(
    generator: &'static str,
    spec: &JobSpec,
    domain: &Domain,
    gap_bins: u32,
) -> Result<Option<(usize, Binning)>, PlanError> {
    let Some(name) = &spec.schema.order_by else { return Ok(None) };
    let invalid = |message: String| PlanError::new(generator, message);
    let index = domain.index_of(name).ok_or_else(|| invalid(format!("order_by '{name}' is not synthesised")))?;
    let Encoding::Numeric { kind, min, max, .. } = &domain.columns[index].encoding else {
        return Err(invalid(format!("order_by '{name}' must be numeric or a datetime")));
    };
    Ok(Some((index, Binning::gaps(max - min, gap_bins, *kind == ColumnKind::Integer))))
}

/// Checks that the schema has a column to synthesise.
pub fn require_columns(generator: &'static str, domain: &Domain) -> Result<(), PlanError> {
    if domain.columns.is_empty() {
        return Err(PlanError::new(generator, "the schema has no column to synthesise"));
    }
    Ok(())
}
