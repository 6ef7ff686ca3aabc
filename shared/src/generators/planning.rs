//! What every generator's plan shares: its error, and the checks most plans make.

use crate::data::domain::{Binning, Domain, Encoding};
use crate::spec::{ColumnKind, JobSpec};

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
