//! What an AIM job may measure and spend, planned from the spec and the declared domain.

use serde::{Deserialize, Serialize};

use crate::accounting::accountant::{Accountant, AccountingOptions, zcdp_budget};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::calibration::{CalibrationPlan, with_calibration};
use crate::data::database::DatabaseView;
use crate::data::database::view::{ColumnAt, POSITION_COLUMN};
use crate::data::domain::Domain;
use crate::generators::aim::{AimParams, WorkloadRule, params};
use crate::generators::marginals::MarginalsTask;
use crate::generators::{GeneratorSpec, PlanError, require_columns};
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "aim";

/// The most cells the candidate tables may hold together: the workers count them all
/// once and the coordinator keeps their sums (8 bytes a cell), and one answer per
/// partition while gathering.
pub const MAX_CANDIDATE_CELLS: f64 = 5e6;

/// The share of ρ on the target's pairs when the spec declares a target and says nothing:
/// the spec's declared downstream use. On Adult its figures are level with
/// `target_share = 0` within their spread (README, AIM).
pub const DEFAULT_TARGET_SHARE: f64 = 0.2;

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// An AIM job's plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AimPlan {
    /// Every candidate table: each column's 1-way table first (in column order), then
    /// the larger candidates; columns ascending within a table.
    pub task: MarginalsTask,
    /// Each table's workload weight: Σ over workload sets s of |r ∩ s|.
    pub weights: Vec<f64>,
    /// The run's zCDP budget.
    pub rho: f64,
    pub rounds: u32,
    pub selection_share: f64,
    pub max_model_cells: f64,
    pub fit_iterations: u32,
    /// The candidates (table indices) measured before the adaptive rounds, with
    /// `target_share` of ρ among them: every pair of the target with another column; in a
    /// database view of a sequence, each value with its previous sibling's.
    pub target_pairs: Vec<usize>,
    pub target_share: f64,
    pub calibration: Option<CalibrationPlan>,
    /// Columns the sampler draws a row given (a database view's ancestors' values; in a
    /// sequence also the row's place and its previous sibling's values): no table
    /// of them alone is measured or selected, the model only ever asked how the other
    /// columns follow them.
    #[serde(default)]
    pub conditioned: Vec<usize>,
    /// Pairs of columns no measured table holds together: in a database view, a value
    /// drawn given its mean over its parent's rows and every other column of its
    /// ancestors. The mean carries what those say of the value, measured in the parent's
    /// view; measured here too, the sampler would count it twice.
    #[serde(default)]
    pub kept_apart: Vec<[usize; 2]>,
    /// The workload and its candidate tables' cells, in words (the log and the manifest:
    /// from the declared domain alone).
    pub workload: String,
}

/// Plans from the spec and the declared domain alone, as a job is submitted.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    AimPlan::new(spec, domain, &AccountingOptions::default()).map(drop)
}

impl AimPlan {
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        require_columns(GENERATOR, domain)?;
        let GeneratorSpec::Aim(params) = &spec.generator else {
            return Err(invalid("the job's generator is another"));
        };
        if spec.privacy.accountant != Accountant::Rdp {
            return Err(invalid(
                "AIM spends a zCDP budget, which only the RDP accountant analyses: accountant = \"rdp\"",
            ));
        }
        let target = spec.schema.target.as_deref().and_then(|t| domain.index_of(t));
        // The target's pairs: every other column with it.
        let pairs: Vec<[usize; 2]> = match target {
            Some(t) => (0..domain.columns.len()).filter(|&c| c != t).map(|c| [c.min(t), c.max(t)]).collect(),
            None => Vec::new(),
        };
        let calibration = CalibrationPlan::new(spec, domain, options)?;
        let budget =
            zcdp_budget(spec.privacy.epsilon, spec.privacy.delta, options).map_err(|e| invalid(e.to_string()))?;
        // Calibration's Gaussian release takes its share of ρ: both compose to the budget.
        let rho = budget - calibration.as_ref().map_or(0.0, CalibrationPlan::rho);
        let task = |candidates| MarginalsTask::new(spec, domain, candidates, params.max_rows_per_unit);
        Self::planned(params, domain, pairs, (rho, calibration), task)
    }

    /// AIM over a database view (`data::database::view`) with its share `rho` of a job's
    /// zCDP budget: every table counted over the view's rows, a unit moving each by at most
    /// the viewed table's cap product (which replaces `params.max_rows_per_unit`). With a
    /// `target` column of the database, the view of its table measures the target's pair
    /// with every other column first, and the view of a table below it the target's pair
    /// with each of the table's own columns.
    pub fn over_view(
        params: &AimParams,
        database: DatabaseView,
        target: Option<ColumnAt>,
        rho: f64,
    ) -> Result<Self, PlanError> {
        if !(rho.is_finite() && rho > 0.0) {
            return Err(invalid(format!("a view's share of ρ must be positive, not {rho}")));
        }
        if !database.is_consistent() {
            return Err(invalid("the database view's layout is not one a spec makes"));
        }
        let domain = database.view.domain(&database.layout);
        require_columns(GENERATOR, &domain)?;
        // What the sampler draws a row given: its ancestors' values and, in a sequence, its
        // place and its previous sibling's values. A sequence's dynamics come first: each
        // value's pair with the one before it.
        let (layout, view) = (&database.layout, database.view);
        let conditioned = view.given_columns(layout);
        let previous = view.previous_columns(layout);
        let mut pairs: Vec<[usize; 2]> = previous.clone().enumerate().map(|(c, before)| [c, before]).collect();
        // And each value's pair with its mean over the parent's rows, which the parent's
        // view ties to the parent's other columns at the parent's sensitivity.
        let parent_means = view.parent_means(layout);
        pairs.extend(parent_means.iter().map(|&(c, mean)| [c, mean]));
        let ancestors = view.ancestor_columns(layout);
        let kept_apart: Vec<[usize; 2]> = (parent_means.iter())
            .flat_map(|&(c, mean)| ancestors.clone().filter(move |&a| a != mean).map(move |a| [c, a]))
            .collect();
        if let Some(target) = target {
            let own = layout.tables[view.table].values();
            if target.table == view.table {
                // Not with a sibling's place or values: they say one thing many ways (the
                // first row has no previous one), and the model, told each apart, would
                // count it many times over when drawing the target given them all.
                let structural = |c: usize| previous.contains(&c) || domain.index_of(POSITION_COLUMN) == Some(c);
                let others = (0..domain.columns.len()).filter(|&c| c != target.column && !structural(c));
                pairs.extend(others.map(|c| [target.column.min(c), target.column.max(c)]));
            } else if let Some(at) = view.ancestor_column(layout, target) {
                // A value whose mean its parent holds is tied to the target through it (the
                // parent's view measures that, at a smaller sensitivity than this one): the
                // others, and this view's own means, with the target directly.
                let through_mean = |c: &usize| parent_means.iter().any(|(own, _)| own == c);
                let direct = (0..own).filter(|c| !through_mean(c)).chain(view.mean_columns(layout));
                pairs.extend(direct.map(|c| [c.min(at), c.max(at)]));
            }
            pairs.sort_unstable();
            pairs.dedup();
        }
        pairs.retain(|pair| !kept_apart.contains(pair));
        let task = |candidates| MarginalsTask::over_view(database, candidates);
        let plan = Self::planned(params, &domain, pairs, (rho, None), task)?;
        Ok(Self { conditioned, kept_apart, ..plan })
    }

    /// The candidates, their weights and the rounds of `params` over `domain`, spending
    /// `rho` (with `calibration` beside it), counted by the task `task` makes of the
    /// candidates.
    fn planned(
        params: &AimParams,
        domain: &Domain,
        pairs: Vec<[usize; 2]>,
        (rho, calibration): (f64, Option<CalibrationPlan>),
        task: impl FnOnce(Vec<Vec<usize>>) -> MarginalsTask,
    ) -> Result<Self, PlanError> {
        let sizes: Vec<usize> = domain.columns.iter().map(|c| c.bins()).collect();
        let cells = |set: &[usize]| set.iter().map(|&c| sizes[c] as f64).product::<f64>();
        let Workload { sets: workload, described } = workload(params, domain, cells)?;
        // Every non-empty subset of a workload set, small enough to be measured alone.
        let mut candidates: Vec<Vec<usize>> = (0..domain.columns.len()).map(|c| vec![c]).collect();
        let mut larger: Vec<Vec<usize>> = workload
            .iter()
            .flat_map(|set| {
                (1..1u32 << set.len()).map(move |mask| {
                    set.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, &c)| c).collect::<Vec<_>>()
                })
            })
            .filter(|r| r.len() > 1 && cells(r) <= params.max_model_cells)
            .collect();
        // The pairs measured first are candidates (and counted) whatever the workload.
        let target_share = match pairs.is_empty() {
            false => params.target_share.unwrap_or(DEFAULT_TARGET_SHARE),
            true => 0.0,
        };
        let first: Vec<Vec<usize>> = match target_share > 0.0 {
            true => pairs.iter().map(|p| p.to_vec()).filter(|r| cells(r) <= params.max_model_cells).collect(),
            false => Vec::new(),
        };
        larger.extend(first.iter().cloned());
        larger.sort_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
        larger.dedup();
        candidates.extend(larger);
        let target_pairs: Vec<usize> =
            first.iter().map(|r| candidates.iter().position(|c| c == r).expect("a candidate")).collect();
        let weights = candidates
            .iter()
            .map(|r| workload.iter().map(|s| s.iter().filter(|c| r.contains(c)).count() as f64).sum())
            .collect();
        let total: f64 = candidates.iter().map(|r| cells(r)).sum();
        if total > MAX_CANDIDATE_CELLS {
            return Err(invalid(format!(
                "the workload ({described}) has candidate tables of {total:.0} cells (at most \
                 {MAX_CANDIDATE_CELLS:.0}): name a smaller workload, \"auto\", or coarser bins"
            )));
        }
        let rounds = params.rounds.unwrap_or(16 * domain.columns.len() as u32);
        // The 1-way phase costs d·(1 − share)/T of the budget: at most half of it, and at
        // most 0.8 with the target's pairs.
        let d = domain.columns.len() as f64;
        if 2.0 * d * (1.0 - params.selection_share) > f64::from(rounds) {
            return Err(invalid(format!(
                "{rounds} rounds cannot pay for the {d} one-way tables: need rounds ≥ 2·d·(1 − selection_share)"
            )));
        }
        if d * (1.0 - params.selection_share) / f64::from(rounds) + target_share > 0.8 {
            return Err(invalid("the one-way tables and target_share leave under a fifth of ρ for the rounds"));
        }
        let task_tables = candidates.len();
        let task = task(candidates);
        Ok(Self {
            task,
            weights,
            rho,
            rounds,
            selection_share: params.selection_share,
            max_model_cells: params.max_model_cells,
            fit_iterations: params.fit_iterations,
            target_pairs,
            target_share,
            calibration,
            conditioned: Vec::new(),
            kept_apart: Vec::new(),
            workload: format!("{described}; {} candidate tables of {total:.0} cells", task_tables),
        })
    }

    /// The one charge: the run's zCDP budget, and its calibration's release.
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        let run = Mechanism::Zcdp { rho: self.rho, adjacency: Adjacency::AddRemove };
        with_calibration(vec![run], self.calibration.as_ref())
    }

    /// Whether the plan measures or selects candidate table `r`: not one of columns the
    /// sampler conditions on alone, nor one holding two columns kept apart.
    pub fn measures(&self, r: usize) -> bool {
        let set = &self.task.tables[r];
        !set.iter().all(|c| self.conditioned.contains(c))
            && !self.kept_apart.iter().any(|pair| pair.iter().all(|c| set.contains(c)))
    }

    /// L2 (and L1) sensitivity of one table: a unit moves at most m rows.
    pub fn sensitivity(&self) -> f64 {
        f64::from(self.task.max_rows_per_unit)
    }
}

/// The most columns whose every triple the plan lists (C(300, 3) ≈ 4.5·10⁶ sets).
const MAX_COLUMNS_FOR_TRIPLES: usize = 300;

/// Every `k`-set of `n` columns, in lexicographic order (the one set of all columns
/// when there are fewer than `k`).
fn every_set(n: usize, k: usize) -> Vec<Vec<usize>> {
    let k = n.min(k);
    let mut sets = Vec::new();
    let mut set: Vec<usize> = (0..k).collect();
    loop {
        sets.push(set.clone());
        let Some(i) = (0..k).rev().find(|&i| set[i] < n - k + i) else { break };
        set[i] += 1;
        for j in i + 1..k {
            set[j] = set[j - 1] + 1;
        }
    }
    sets
}

/// The workload as column sets (ascending) and how it was chosen. `auto` takes every
/// triple while the candidate tables (every 1-way table, and each pair and triple the
/// model may hold: at most `max_model_cells`) fit [`MAX_CANDIDATE_CELLS`]; past that,
/// every pair (the smallest first, while they fit), then the triples of the smallest
/// tables first while they fit. A rule of the declared domain alone: public.
fn workload(params: &AimParams, domain: &Domain, cells: impl Fn(&[usize]) -> f64) -> Result<Workload, PlanError> {
    let n = domain.columns.len();
    let rule = match &params.workload {
        params::Workload::Rule(rule) => *rule,
        params::Workload::Sets(sets) => {
            let mut sets = sets
                .iter()
                .map(|set| {
                    let mut columns = set
                        .iter()
                        .map(|name| {
                            domain
                                .index_of(name)
                                .ok_or_else(|| invalid(format!("workload names '{name}', not a synthesised column")))
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    columns.sort_unstable();
                    columns.dedup();
                    if columns.is_empty() || columns.len() > 8 {
                        return Err(invalid("a workload set names 1 to 8 columns"));
                    }
                    Ok(columns)
                })
                .collect::<Result<Vec<_>, _>>()?;
            sets.sort();
            sets.dedup();
            let described = format!("{} column sets named in the spec", sets.len());
            return Ok(Workload { sets, described });
        }
    };
    // A spec's columns are many at most in the hundreds (MAX_COLUMNS_FOR_TRIPLES): past
    // that the triples alone would not fit in memory, let alone the cell budget.
    let triples = || {
        if n > MAX_COLUMNS_FOR_TRIPLES {
            return Err(invalid(format!(
                "{n} columns have too many triples to plan: name the workload, or \"all-pairs\" (at most \
                 {MAX_COLUMNS_FOR_TRIPLES} columns for triples)"
            )));
        }
        Ok(every_set(n, 3))
    };
    let (sets, described) = match rule {
        WorkloadRule::AllPairs => (every_set(n, 2), "every pair of columns (all-pairs)".to_string()),
        WorkloadRule::AllTriples => (triples()?, "every set of three columns (all-triples)".to_string()),
        WorkloadRule::Auto => {
            // Past MAX_COLUMNS_FOR_TRIPLES no triple can fit the budget beside the pairs.
            let triples = if n > MAX_COLUMNS_FOR_TRIPLES { Vec::new() } else { triples()? };
            let pairs = every_set(n, 2);
            let held = |set: &Vec<usize>| set.len() < 2 || cells(set) <= params.max_model_cells;
            let one_way: f64 = (0..n).map(|c| cells(&[c])).sum();
            let pair_cells: f64 = pairs.iter().filter(|p| held(p)).map(|p| cells(p)).sum();
            let triple_cells: f64 = triples.iter().filter(|t| t.len() == 3 && held(t)).map(|t| cells(t)).sum();
            if n <= MAX_COLUMNS_FOR_TRIPLES && one_way + pair_cells + triple_cells <= MAX_CANDIDATE_CELLS {
                (triples, "auto: every set of three columns".to_string())
            } else {
                let smallest_first = |mut sets: Vec<Vec<usize>>| {
                    sets.retain(|s| held(s));
                    sets.sort_by(|a, b| cells(a).total_cmp(&cells(b)).then(a.cmp(b)));
                    sets
                };
                let mut total = one_way;
                let mut chosen = Vec::new();
                let (all_pairs, all_triples) = (smallest_first(pairs), smallest_first(triples));
                let (pair_count, triple_count) = (all_pairs.len(), all_triples.len());
                for set in all_pairs.into_iter().chain(all_triples) {
                    if total + cells(&set) <= MAX_CANDIDATE_CELLS {
                        total += cells(&set);
                        chosen.push(set);
                    }
                }
                let kept_pairs = chosen.iter().filter(|s| s.len() == 2).count();
                let kept_triples = chosen.len() - kept_pairs;
                let described = format!(
                    "auto: {kept_pairs} of {pair_count} pairs and {kept_triples} of {triple_count} triples \
                     (every triple's tables would exceed {MAX_CANDIDATE_CELLS:.0} cells; smallest tables first)"
                );
                (chosen, described)
            }
        }
    };
    let mut sets = sets;
    sets.sort();
    sets.dedup();
    Ok(Workload { sets, described })
}

/// The workload's column sets and a line that says how they were chosen.
struct Workload {
    sets: Vec<Vec<usize>>,
    described: String,
}
