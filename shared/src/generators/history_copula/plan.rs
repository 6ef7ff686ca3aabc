//! What a history copula job measures and is charged for, from the spec alone: three
//! Gaussian releases (margins, moments, lengths), their noise multipliers in the shares of
//! the job's budget the spec names, calibrated together to the job's (ε, δ).

use super::model::{MAX_SCORE, Margin};
use super::task::{CopulaLayout, HistoryStatisticsTask, Stage};
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::Domain;
use crate::generators::params::{MAX_GAP_BINS, MAX_HISTORY_ROWS};
use crate::generators::{GeneratorSpec, PlanError, order_with_gaps, require_columns};
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "history_copula";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// A planned history copula job.
#[derive(Clone, Debug, PartialEq)]
pub struct HistoryCopulaPlan {
    pub layout: CopulaLayout,
    /// L2 bound of a unit's moments vector.
    pub moment_clip: f64,
    /// Noise multipliers of the margins, moments and length releases.
    pub margins_sigma: f64,
    pub moments_sigma: f64,
    pub lengths_sigma: f64,
}

/// Plans from the spec and the declared domain alone, as a job is submitted.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    HistoryCopulaPlan::new(spec, domain, &AccountingOptions::default()).map(drop)
}

impl HistoryCopulaPlan {
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        let GeneratorSpec::HistoryCopula(params) = &spec.generator else {
            return Err(invalid("the job's generator is another"));
        };
        require_columns(GENERATOR, domain)?;
        if !(1..=MAX_HISTORY_ROWS as usize).contains(&params.max_rows) || !(1..=MAX_GAP_BINS).contains(&params.gap_bins)
        {
            return Err(invalid(format!("need 1 ≤ max_rows ≤ {MAX_HISTORY_ROWS} and 1 ≤ gap_bins ≤ {MAX_GAP_BINS}")));
        }
        if spec.calibration.is_some() {
            return Err(invalid("[calibration] is not supported: the copula draws whole histories, not rows to rake"));
        }
        let (m, l) = (params.margin_share, params.length_share);
        if !(m > 0.0 && l > 0.0 && m + l < 0.9) {
            return Err(invalid("margin_share and length_share must be positive and leave the moments at least 0.1"));
        }
        let order = order_with_gaps(GENERATOR, spec, domain, params.gap_bins)?;
        let columns: Vec<usize> =
            (0..domain.columns.len()).filter(|&c| order.as_ref().is_none_or(|(o, _)| *o != c)).collect();
        if columns.is_empty() {
            return Err(invalid("the schema has no column to model beside the order column"));
        }
        let clip = params.moment_clip.unwrap_or(columns.len() as f64);
        let statics = params
            .static_columns
            .iter()
            .map(|name| match domain.index_of(name) {
                Some(i) if columns.contains(&i) => Ok(i),
                Some(_) => Err(invalid(format!("static column '{name}' is the order column"))),
                None => Err(invalid(format!("static column '{name}' is not a synthesised column"))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let layout = CopulaLayout { domain: domain.clone(), columns, order, statics, max_rows: params.max_rows };
        // No unit's vector is longer: every entry is a product of two scores.
        let longest = MAX_SCORE * MAX_SCORE * (layout.moment_len() as f64).sqrt();
        if !(clip > 0.0 && clip <= longest) {
            return Err(invalid(format!(
                "moment_clip must be positive and at most {longest:.0} (no unit's moments reach further)"
            )));
        }
        let mut plan = Self { layout, moment_clip: clip, margins_sigma: 0.0, moments_sigma: 0.0, lengths_sigma: 0.0 };
        let scaled = |s: f64| {
            let mut p = plan.clone();
            (p.margins_sigma, p.moments_sigma, p.lengths_sigma) =
                (s / m.sqrt(), s / (1.0 - m - l).sqrt(), s / l.sqrt());
            p
        };
        let privacy = &spec.privacy;
        let s =
            calibrate_sigma(privacy.epsilon, privacy.delta, privacy.accountant, options, |s| scaled(s).mechanisms())
                .map_err(|e| invalid(format!("calibrating the releases' noise: {e}")))?;
        plan = scaled(s);
        Ok(plan)
    }

    /// The margins round's task.
    pub fn margins_task(&self) -> HistoryStatisticsTask {
        HistoryStatisticsTask { layout: self.layout.clone(), stage: Stage::Margins }
    }

    /// The moments round's task, its scores from the released margins.
    pub fn moments_task(&self, margins: &[Margin]) -> HistoryStatisticsTask {
        let scores = margins.iter().map(Margin::scores).collect();
        let cumulative = margins.iter().map(Margin::cumulative).collect();
        HistoryStatisticsTask {
            layout: self.layout.clone(),
            stage: Stage::Moments { scores, cumulative, clip: self.moment_clip },
        }
    }

    /// What the job is charged for: the margins (one block per column, and the order
    /// column's first value and gaps, each a unit's shares summing to 1: L2 sensitivity
    /// √blocks), the moments (one clipped vector a unit), the lengths (one cell a unit).
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        let gaussian = |l2_sensitivity: f64, noise_multiplier| Mechanism::Gaussian {
            l2_sensitivity,
            noise_multiplier,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        };
        vec![
            gaussian(self.margins_task().sensitivity(), self.margins_sigma),
            gaussian(self.moment_clip, self.moments_sigma),
            gaussian(1.0, self.lengths_sigma),
        ]
    }
}
