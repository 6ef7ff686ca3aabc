//! What the job measures, planned from the spec and the declared domain alone.

use serde::{Deserialize, Serialize};

use super::history::HistoryLayout;
use super::task::{MAX_MODEL_CELLS, MarginalsTask};
use crate::accounting::PrivacyError;
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::calibration::{CalibrationPlan, with_calibration};
use crate::data::domain::Domain;
use crate::generators::params::DEFAULT_GAP_BINS;
use crate::generators::{GeneratorSpec, PlanError, require_columns};
use crate::pgm::JunctionTree;
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "marginals";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// The measurement plan of a job: every column's 1-way table, then the pairs' (or a
/// flattened history's tables).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginalsPlan {
    pub task: MarginalsTask,
    pub calibration: Option<CalibrationPlan>,
}

/// Plans from the spec and the declared domain alone, as a job is submitted.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    MarginalsPlan::new(spec, domain, &AccountingOptions::default()).map(drop)
}

impl MarginalsPlan {
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        require_columns(GENERATOR, domain)?;
        let n = domain.columns.len();
        let GeneratorSpec::Marginals(params) = &spec.generator else {
            return Err(invalid("the job's generator is another"));
        };
        let index = |name: &str| {
            domain.index_of(name).ok_or_else(|| invalid(format!("pair names '{name}', not a synthesised column")))
        };
        let target = spec.schema.target.as_deref().and_then(|t| domain.index_of(t));
        let history = params
            .history_rows
            .map(|rows| {
                let gap_bins = params.gap_bins.unwrap_or(DEFAULT_GAP_BINS);
                HistoryLayout::new(GENERATOR, spec, domain, rows as usize, &params.static_columns, gap_bins)
            })
            .transpose()?;
        let pairs: Vec<Vec<usize>> = match &params.pairs {
            Some(pairs) => {
                pairs.iter().map(|[a, b]| Ok(vec![index(a)?, index(b)?])).collect::<Result<_, PlanError>>()?
            }
            None if history.is_some() => Vec::new(),
            None => match target {
                Some(t) => (0..n).filter(|c| *c != t).map(|c| vec![t, c]).collect(),
                None => (1..n).map(|c| vec![c - 1, c]).collect(),
            },
        };
        for (i, pair) in pairs.iter().enumerate() {
            let name = |c: usize| &domain.columns[c].name;
            if pair[0] == pair[1] {
                return Err(invalid(format!("pair ({0}, {0}) names one column twice", name(pair[0]))));
            }
            if pairs[..i].iter().any(|p| p.iter().all(|c| pair.contains(c))) {
                return Err(invalid(format!("pair ({}, {}) is listed twice", name(pair[0]), name(pair[1]))));
            }
        }
        let task = match history {
            Some(history) => {
                let tables = history.tables(&pairs);
                MarginalsTask::over_histories(domain, history, tables)
            }
            None => {
                let mut tables: Vec<Vec<usize>> = (0..n).map(|c| vec![c]).collect();
                tables.extend(pairs);
                MarginalsTask::new(spec, domain, tables, params.max_rows_per_unit)
            }
        };
        let model_cells = JunctionTree::cells_for(&task.sizes(), &task.tables);
        if model_cells > MAX_MODEL_CELLS {
            return Err(invalid(format!(
                "the tables need a model of {model_cells:.0} clique cells (at most {MAX_MODEL_CELLS:.0}): \
                 measure fewer pairs, pairs without cycles, coarser bins or fewer history_rows"
            )));
        }
        // The summed tables live on the coordinator too: the same bound.
        if task.cells() as f64 > MAX_MODEL_CELLS {
            return Err(invalid(format!("the tables hold more than {MAX_MODEL_CELLS:.0} cells")));
        }
        Ok(Self { task, calibration: CalibrationPlan::new(spec, domain, options)? })
    }

    /// The smallest σ for which the release (and its calibration's) meets the job's (ε, δ).
    pub fn calibrate(&self, spec: &JobSpec, options: &AccountingOptions) -> Result<f64, PrivacyError> {
        let p = &spec.privacy;
        calibrate_sigma(p.epsilon, p.delta, p.accountant, options, |s| self.mechanisms(s))
    }

    /// What the job is charged for: the tables' release with noise multiplier `sigma`, then
    /// its calibration's.
    pub fn mechanisms(&self, sigma: f64) -> Vec<Mechanism> {
        with_calibration(vec![self.mechanism(sigma)], self.calibration.as_ref())
    }

    /// The single Gaussian release this plan makes, with noise multiplier `sigma`.
    pub fn mechanism(&self, sigma: f64) -> Mechanism {
        Mechanism::Gaussian {
            l2_sensitivity: self.task.sensitivity(),
            noise_multiplier: sigma,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }
    }
}
