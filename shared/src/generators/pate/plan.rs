//! How many queries the job's ε pays for, with what noise: fixed before any row is read.

use super::answers::Threshold;
use super::encoding::PateEncoding;
use super::teacher::TeacherConfig;
use crate::accounting::accountant::{AccountingOptions, account};
use crate::accounting::mechanism::{Adjacency, Mechanism};
use crate::calibration::{CalibrationPlan, with_calibration};
use crate::data::domain::Domain;
use crate::generators::pate::{PateParams, PateRelease};
use crate::generators::{PlanError, require_columns, require_positive};
use crate::spec::JobSpec;

/// This generator's name in plan errors.
const GENERATOR: &str = "pate";

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}
/// A PATE job's plan, fixed before any row is read.
#[derive(Clone, Debug)]
pub struct PatePlan {
    pub encoding: PateEncoding,
    pub params: PateParams,
    pub teachers: u32,
    pub sigma: f64,
    /// Confident GNMax's check, when the spec asks for one.
    pub threshold: Option<Threshold>,
    pub iterations: u32,
    /// Target-label queries answered after the last iteration.
    pub label_queries: u64,
    /// Whether the unit count is released to size the output (no `[output] rows`).
    pub count: bool,
    pub calibration: Option<CalibrationPlan>,
}

/// Plans from the spec and the declared domain alone, as a job is submitted.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    PatePlan::new(spec, domain, &AccountingOptions::default()).map(drop)
}

impl PatePlan {
    /// Validates the parameters and finds how many iterations the job's ε pays for.
    pub fn new(spec: &JobSpec, domain: &Domain, options: &AccountingOptions) -> Result<Self, PlanError> {
        let crate::generators::GeneratorSpec::Pate(params) = spec.generator.clone() else {
            return Err(invalid("the job's generator is another"));
        };
        let teachers = spec.job.partitions;
        if teachers < 2 {
            return Err(invalid("PATE needs at least 2 teachers ([job] partitions)"));
        }
        let sigma = params.sigma.unwrap_or(f64::from(teachers) / 5.0);
        let threshold =
            params.threshold.map(|count| Threshold { count, sigma: params.threshold_sigma.unwrap_or(sigma) });
        let positive = [
            ("sigma", sigma),
            ("threshold_sigma", threshold.map_or(1.0, |t| t.sigma)),
            ("teacher_l2", params.teacher_l2),
            ("temperature", params.temperature),
            ("student_learning_rate", params.student_learning_rate),
            ("generator_learning_rate", params.generator_learning_rate),
            ("count_noise_multiplier", params.count_noise_multiplier),
        ];
        require_positive(GENERATOR, &positive)?;
        if !(0.0..=1.0).contains(&params.explore) {
            return Err(invalid(format!("explore must be a probability, got {}", params.explore)));
        }
        if let Some(t) = params.threshold.filter(|t| !(t.is_finite() && *t > 0.0 && *t <= f64::from(teachers))) {
            return Err(invalid(format!("threshold must be a count of teachers in (0, {teachers}], got {t}")));
        }
        if !(0.0..1.0).contains(&params.label_share) {
            return Err(invalid(format!("label_share must be in [0, 1), got {}", params.label_share)));
        }
        let counts = [
            ("queries_per_iteration", params.queries_per_iteration as usize),
            ("fake_rows", params.fake_rows as usize),
            ("teacher_newton_steps", params.teacher_newton_steps as usize),
            ("teacher_hidden", params.teacher_hidden),
            ("teacher_mlp_steps", params.teacher_mlp_steps as usize),
            ("teachers_per_task", params.teachers_per_task as usize),
            ("batch_size", params.batch_size),
            ("student_window", params.student_window as usize),
            ("latent", params.latent),
            ("generator_width", params.generator_width),
            ("layers", params.layers),
            ("heads", params.heads),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(format!("{name} must be at least 1")));
        }
        if !params.d_model.is_multiple_of(params.heads) {
            return Err(invalid(format!(
                "d_model ({}) must be a multiple of heads ({})",
                params.d_model, params.heads
            )));
        }
        require_columns(GENERATOR, domain)?;
        let encoding = PateEncoding::new(domain, spec.schema.target.as_deref());
        let mut plan = Self {
            encoding,
            params,
            teachers,
            sigma,
            threshold,
            iterations: 0,
            label_queries: 0,
            count: spec.output.rows.is_none(),
            calibration: CalibrationPlan::new(spec, domain, options)?,
        };
        plan.iterations = plan.affordable_iterations(spec, options)?;
        plan.label_queries = plan.label_queries_for(plan.iterations);
        Ok(plan)
    }

    /// Largest iteration count (≤ `max_iterations`) whose charge fits the job's (ε, δ).
    fn affordable_iterations(&self, spec: &JobSpec, options: &AccountingOptions) -> Result<u32, PlanError> {
        let fits = |t: u32| -> Result<bool, PlanError> {
            let cost = account(&self.mechanisms_for(t), spec.privacy.accountant, spec.privacy.delta, options)
                .map_err(|e| invalid(e.to_string()))?;
            Ok(cost.epsilon <= spec.privacy.epsilon)
        };
        let cap = self.params.max_iterations.unwrap_or(1 << 20);
        if cap == 0 || !fits(1)? {
            return Err(invalid(format!(
                "ε = {} does not pay for one iteration of {} queries at σ = {} (raise σ or ε, or lower queries_per_iteration)",
                spec.privacy.epsilon, self.params.queries_per_iteration, self.sigma
            )));
        }
        // ε grows with the number of answers: bisect on [fits, does not fit).
        let (mut lo, mut hi) = (1u32, 2u32);
        while hi <= cap && fits(hi)? {
            lo = hi;
            hi = hi.saturating_mul(2);
        }
        let mut hi = hi.min(cap.saturating_add(1));
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? { lo = mid } else { hi = mid }
        }
        Ok(lo)
    }

    /// Queries answered over the whole run (real-or-generated and target labels).
    pub fn queries(&self) -> u64 {
        u64::from(self.iterations) * u64::from(self.params.queries_per_iteration) + self.label_queries
    }

    /// Label queries beside `iterations` iterations: `label_share` of all answers (none
    /// without a categorical target).
    fn label_queries_for(&self, iterations: u32) -> u64 {
        if self.encoding.target_classes().is_none() {
            return 0;
        }
        let share = self.params.label_share;
        let realness = f64::from(iterations) * f64::from(self.params.queries_per_iteration);
        (realness * share / (1.0 - share)).round() as u64
    }

    fn mechanisms_for(&self, iterations: u32) -> Vec<Mechanism> {
        let mut out = Vec::new();
        if self.count {
            out.push(Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: self.params.count_noise_multiplier,
                releases: 1,
                adjacency: Adjacency::AddRemove,
            });
        }
        let queries = u64::from(iterations) * u64::from(self.params.queries_per_iteration);
        let labels = self.label_queries_for(iterations);
        if let Some(threshold) = self.threshold {
            // Every query's check, on its largest vote count (sensitivity 1).
            out.push(Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: threshold.sigma,
                releases: queries + labels,
                adjacency: Adjacency::AddRemove,
            });
        }
        if let (Some(classes), true) = (self.encoding.target_classes(), labels > 0) {
            out.push(Mechanism::GnMax { sigma: self.sigma, classes: classes as u32, queries: labels });
        }
        out.push(match self.params.release {
            PateRelease::Label => Mechanism::GnMax { sigma: self.sigma, classes: 2, queries },
            // The real count (sensitivity 1) with N(0, σ²/2): the same cost as GNMax.
            PateRelease::VoteShare => Mechanism::Gaussian {
                l2_sensitivity: 1.0,
                noise_multiplier: self.share_noise(),
                releases: queries,
                adjacency: Adjacency::AddRemove,
            },
        });
        with_calibration(out, self.calibration.as_ref())
    }

    /// Noise multiplier of a vote-share release (σ/√2 on the real count: GNMax's cost).
    pub fn share_noise(&self) -> f64 {
        self.sigma / std::f64::consts::SQRT_2
    }

    /// What the whole run is charged: [unit count,] [confidence checks,] [target labels,]
    /// real-or-generated answers[, calibration].
    pub fn mechanisms(&self) -> Vec<Mechanism> {
        self.mechanisms_for(self.iterations)
    }

    pub fn teacher_config(&self) -> TeacherConfig {
        TeacherConfig {
            model: self.params.teacher,
            l2: self.params.teacher_l2,
            newton_steps: self.params.teacher_newton_steps,
            hidden: self.params.teacher_hidden,
            mlp_steps: self.params.teacher_mlp_steps,
            target_interactions: self.params.target_interactions,
            vote: self.params.vote,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(extra: &str, epsilon: f64) -> JobSpec {
        JobSpec::parse(&job_text(extra, epsilon), "test.toml").unwrap()
    }

    fn job_text(extra: &str, epsilon: f64) -> String {
        let schema = "[[schema.columns]]\nname = \"colour\"\nkind = \"categorical\"\ncategories = [\"red\", \"green\", \"blue\"]";
        crate::testing::schema_job(schema, &crate::testing::generator("pate", extra))
            .replace("[job]\n", "[job]\npartitions = 100\n")
            .replace("epsilon = 1.0\n", &format!("epsilon = {epsilon}\n"))
            + "rows = 10\n"
    }
    #[test]
    fn the_plan_answers_as_many_queries_as_the_budget_pays_for_and_no_more() {
        let options = AccountingOptions::default();
        let spec = job("sigma = 20.0\nqueries_per_iteration = 10\nrelease = \"label\"", 2.0);
        let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();
        let cost = |t| account(&plan.mechanisms_for(t), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!(plan.iterations > 1);
        assert!(cost(plan.iterations) <= 2.0 && cost(plan.iterations + 1) > 2.0);
        assert_eq!(plan.mechanisms(), vec![Mechanism::GnMax { sigma: 20.0, classes: 2, queries: plan.queries() }]);
        // The noisy vote share costs exactly what the label does.
        let share = job("sigma = 20.0\nqueries_per_iteration = 10\nrelease = \"vote_share\"", 2.0);
        let share = PatePlan::new(&share, &Domain::from_spec(&share), &options).unwrap();
        assert_eq!(share.iterations, plan.iterations);
        let share_cost = account(&share.mechanisms(), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!((share_cost - cost(plan.iterations)).abs() < 1e-12);
        // A budget that cannot pay one iteration is refused up front.
        let poor = job("sigma = 1.0\nqueries_per_iteration = 10", 0.1);
        let error = PatePlan::new(&poor, &Domain::from_spec(&poor), &options).unwrap_err().to_string();
        assert!(error.contains("does not pay for one iteration"), "{error}");
    }

    #[test]
    fn label_queries_take_their_share_of_the_budget_at_the_same_cost_per_answer() {
        let options = AccountingOptions::default();
        let with_target = |extra: &str| {
            let spec = JobSpec::parse(
                &job_text(extra, 2.0).replace("[schema]\n", "[schema]\ntarget = \"colour\"\n"),
                "t.toml",
            )
            .unwrap();
            let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();
            (spec, plan)
        };
        let (spec, plan) = with_target("sigma = 20.0\nqueries_per_iteration = 10\nlabel_share = 0.25");
        let realness = u64::from(plan.iterations) * 10;
        assert_eq!(plan.label_queries, (realness as f64 / 3.0).round() as u64);
        assert_eq!(plan.queries(), realness + plan.label_queries);
        // The colour's 3 values and its missing bin.
        let classes = plan.encoding.target_classes().unwrap() as u32;
        assert_eq!(classes, 4);
        assert!(plan.mechanisms().contains(&Mechanism::GnMax { sigma: 20.0, classes, queries: plan.label_queries }));
        // Every answer costs the same: the charge is that of plan.queries() GNMax answers,
        // and it fits the job's ε.
        let per_query = vec![Mechanism::GnMax { sigma: 20.0, classes: 2, queries: 1 }; plan.queries() as usize];
        let all = account(&per_query, spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        let charged = account(&plan.mechanisms(), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!((all - charged).abs() < 1e-9 && charged <= 2.0, "{all} vs {charged}");
        // Without labels the realness queries get the whole budget.
        let (_, plain) = with_target("sigma = 20.0\nqueries_per_iteration = 10\nlabel_share = 0.0");
        assert_eq!(plain.label_queries, 0);
        assert!(plain.iterations > plan.iterations);
        assert!(plain.mechanisms().iter().all(|m| !matches!(m, Mechanism::GnMax { classes: 4, .. })));
    }

    #[test]
    fn a_confidence_threshold_charges_its_check_on_every_query() {
        let options = AccountingOptions::default();
        let base = "sigma = 20.0\nqueries_per_iteration = 10\nrelease = \"label\"";
        let plain = job(base, 2.0);
        let plain = PatePlan::new(&plain, &Domain::from_spec(&plain), &options).unwrap();
        let spec = job(&format!("{base}\nthreshold = 60.0\nthreshold_sigma = 30.0"), 2.0);
        let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();
        assert_eq!(
            plan.mechanisms(),
            vec![
                Mechanism::Gaussian {
                    l2_sensitivity: 1.0,
                    noise_multiplier: 30.0,
                    releases: plan.queries(),
                    adjacency: Adjacency::AddRemove
                },
                Mechanism::GnMax { sigma: 20.0, classes: 2, queries: plan.queries() },
            ]
        );
        // The checks are paid for out of the same ε: fewer queries fit.
        assert!(plan.iterations < plain.iterations);
        let cost = account(&plan.mechanisms(), spec.privacy.accountant, 1e-5, &options).unwrap().epsilon;
        assert!(cost <= 2.0);
        for bad in ["threshold = 0.0", "threshold = 101.0", "threshold = 50.0\nthreshold_sigma = -1.0"] {
            let spec = job(&format!("{base}\n{bad}"), 2.0);
            assert!(PatePlan::new(&spec, &Domain::from_spec(&spec), &options).is_err(), "{bad}");
        }
        // The check keeps a query whose noisy largest count reaches the threshold.
        let threshold = Threshold { count: 60.0, sigma: 30.0 };
        assert_eq!(threshold.clears(&[59.9, 60.0, 75.0]), [false, true, true]);
    }
}
