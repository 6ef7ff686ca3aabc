//! What the job measures, planned from the spec and the declared domain alone.

use serde::{Deserialize, Serialize};

use super::task::MarginalsTask;
use crate::accounting::PrivacyError;
use crate::accounting::accountant::{AccountingOptions, calibrate_sigma};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::data::domain::Domain;
use crate::generators::{PlanError, require_columns};
use crate::spec::{GeneratorSpec, JobSpec};

/// This generator's name in plan errors.
const GENERATOR: &str = "marginals";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// The measurement plan of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginalsPlan {
    pub task: MarginalsTask,
    /// Tree edges (parent, child) in sampling order; `root` has no parent.
    pub edges: Vec<(usize, usize)>,
    pub root: usize,
}

impl MarginalsPlan {
    pub fn new(spec: &JobSpec, domain: &Domain) -> Result<Self, PlanError> {
        require_columns(GENERATOR, domain)?;
        let n = domain.columns.len();
        let GeneratorSpec::Marginals(params) = &spec.generator else {
            return Err(invalid("the job's generator is another"));
        };
        let index = |name: &str| {
            domain.index_of(name).ok_or_else(|| invalid(format!("pair names '{name}', not a synthesised column")))
        };
        let target = spec.schema.target.as_deref().and_then(|t| domain.index_of(t));
        let (root, edges) = match &params.pairs {
            Some(pairs) => {
                let edges: Vec<(usize, usize)> =
                    pairs.iter().map(|[p, c]| Ok((index(p)?, index(c)?))).collect::<Result<_, PlanError>>()?;
                let root = edges.first().map_or(0, |e| e.0);
                (root, edges)
            }
            None => match target {
                Some(t) => (t, (0..n).filter(|c| *c != t).map(|c| (t, c)).collect()),
                None => (0, (1..n).map(|c| (c - 1, c)).collect()),
            },
        };
        // The edges must form a tree reaching every column from the root, parents first.
        let mut reached = vec![false; n];
        reached[root] = true;
        for &(p, c) in &edges {
            if !reached[p] || reached[c] {
                return Err(invalid(format!(
                    "pairs must form a tree listed parents first; ({}, {}) does not",
                    domain.columns[p].name, domain.columns[c].name
                )));
            }
            reached[c] = true;
        }
        if let Some(c) = reached.iter().position(|r| !r) {
            return Err(invalid(format!("column '{}' is in no pair", domain.columns[c].name)));
        }
        let mut tables: Vec<Vec<usize>> = (0..n).map(|c| vec![c]).collect();
        tables.extend(edges.iter().map(|&(p, c)| vec![p, c]));
        let task = MarginalsTask {
            domain: domain.clone(),
            tables,
            max_rows_per_unit: params.max_rows_per_unit,
            row_level: spec.schema.unit_column.is_none(),
        };
        Ok(Self { task, edges, root })
    }

    /// The smallest σ for which the one release meets the job's (ε, δ).
    pub fn calibrate(&self, spec: &JobSpec, options: &AccountingOptions) -> Result<f64, PrivacyError> {
        let p = &spec.privacy;
        calibrate_sigma(p.epsilon, p.delta, p.accountant, options, |s| vec![self.mechanism(s)])
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
