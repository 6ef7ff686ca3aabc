//! AIM on the coordinator: one round of every candidate table from the workers, the run's
//! zCDP budget charged, then the adaptive rounds — select, measure, refit — off the async
//! threads, each release paid from the budget.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_privacy::release::{Private, Releases, Unpaid, ZcdpRelease};
use rhosynth_shared::generators::aim::AimPlan;
use rhosynth_shared::generators::aim::rounds::{Schedule, eligible, qualities, quality_sensitivity};
use rhosynth_shared::generators::marginals::MarginalsSampler;
use rhosynth_shared::pgm::{GraphicalModel, Measurement};

use super::marginals::count_tables;
use super::{Admission, Charged, Draws, Fitted, Generator, calibration};
use crate::context::{JobContext, JobError, Partitions, ProgressHandle, blocking, set_stage};

/// A planned AIM job.
pub struct Aim {
    plan: AimPlan,
}

impl Generator for Aim {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        Ok(Self { plan: AimPlan::new(ctx.spec(), ctx.domain, ledger.options())? })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(self.plan.mechanisms())
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let Self { plan } = self;
        // The workload is the declared domain's: public, logged before any private read.
        tracing::info!(workload = %plan.workload, "AIM workload");
        let workload = format!("AIM workload: {}", plan.workload);
        let mut gather = ctx.gather();
        let exact = count_tables(ctx, &mut gather, partitions, &plan.task).await?;

        let mechanisms = plan.mechanisms();
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        let mut releases = Releases::paid_by(&receipt)?;
        let calibration =
            calibration::release(ctx, &mut gather, partitions, &mut releases, plan.calibration.as_ref()).await?;
        set_stage(ctx.progress, "selecting and measuring marginals");
        let domain = plan.task.domain.clone();
        let shown = rounds_shown(ctx.progress.clone(), String::new());
        let model = blocking(move || run_rounds(&plan, exact, &mut releases, &shown)).await??.model;
        // The default size: the model's total, pooled from the released measurements.
        let released_rows = Some(model.total.round().max(1.0) as u64);
        let cost = receipt.admission.cost.clone();
        let mut public_inputs = vec![workload];
        let sampler = Box::new(MarginalsSampler::from_model(domain, model));
        let sampler = calibration::apply(calibration, sampler, &mut public_inputs);
        let charged = Charged { receipt, cost, mechanisms, public_inputs };
        Ok(Fitted { sampler: Draws::Table(sampler), released_count: released_rows, charged })
    }
}

/// Shows AIM's rounds as a job's progress: the round in its stage (after `label`), and the
/// share of the run's ρ spent as its units (per cent): how many rounds a run takes is not
/// known ahead.
pub(crate) fn rounds_shown(progress: ProgressHandle, label: String) -> impl Fn(usize, f64) + Send {
    move |round, spent| {
        let mut progress = progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.stage = format!("{label}AIM round {round}, {:.0}% of its budget spent", 100.0 * spent);
        progress.tasks_total = 100;
        progress.tasks_done = (100.0 * spent).floor().clamp(0.0, 100.0) as u32;
    }
}

/// What a run released and the model fitted to it.
pub(crate) struct Measured {
    pub model: GraphicalModel,
    pub measurements: Vec<Measurement>,
}

/// The rounds: every 1-way table, the target's pairs, then selections and measurements
/// until the plan's ρ is spent (or no candidate fits the model's size limit), the model
/// refitted after each, each round shown to `shown` (its number, the share of ρ spent). A
/// run spends its own plan's ρ (to within rounding), whatever else the charge pays for (a
/// database job's other views).
pub(crate) fn run_rounds(
    plan: &AimPlan,
    exact: Private<Vec<f64>>,
    releases: &mut Releases,
    shown: &dyn Fn(usize, f64),
) -> Result<Measured, Unpaid> {
    let (left_at_start, released_before) = (releases.zcdp_left(), releases.zcdp_released().len());
    // Never above what the charge has left (the difference rounds either way).
    let left = |releases: &Releases| releases.zcdp_left().min(plan.rho - (left_at_start - releases.zcdp_left()));
    let sizes: Vec<usize> = plan.task.domain.columns.iter().map(|c| c.bins()).collect();
    let offsets = plan.task.offsets();
    let m = plan.sensitivity();
    let table = |r: usize| exact.map(|counts| counts[offsets[r]..offsets[r + 1]].to_vec());
    let iterations = plan.fit_iterations as usize;
    let mut schedule = Schedule::new(plan);
    let mut measurements = Vec::new();
    for c in (0..sizes.len()).filter(|&c| plan.measures(c)) {
        let counts = releases.zcdp_gaussian(table(c), m, schedule.sigma)?;
        measurements.push(Measurement { vars: vec![c], counts, sigma: schedule.sigma * m });
    }
    // The target's pairs, each with an equal part of target_share·ρ.
    if !plan.target_pairs.is_empty() {
        let sigma = (plan.target_pairs.len() as f64 / (2.0 * plan.target_share * plan.rho)).sqrt();
        for &r in &plan.target_pairs {
            let counts = releases.zcdp_gaussian(table(r), m, sigma)?;
            measurements.push(Measurement { vars: plan.task.tables[r].clone(), counts, sigma: sigma * m });
        }
    }
    let mut model = GraphicalModel::fit(&sizes, &measurements, iterations);
    let mut round = 0;
    while left(releases) > plan.rho * 1e-9 {
        let last = schedule.fit_to(left(releases));
        let spent = 1.0 - left(releases) / plan.rho;
        let candidates = eligible(plan, &model, spent * plan.max_model_cells);
        if candidates.is_empty() {
            tracing::info!(round, "AIM: no candidate fits the model's size limit; the rest of the budget is unused");
            break;
        }
        let noise = schedule.sigma * m;
        let scores = exact.map(|counts| qualities(plan, &offsets, counts, &model, &candidates, noise));
        let pick = releases.zcdp_exponential(scores, quality_sensitivity(plan, &candidates), schedule.epsilon)?;
        let r = candidates[pick];
        let vars = plan.task.tables[r].clone();
        let counts = releases.zcdp_gaussian(table(r), m, schedule.sigma)?;
        let before = model.marginal(&vars);
        measurements.push(Measurement { vars: vars.clone(), counts, sigma: noise });
        model = model.refit(&measurements, iterations);
        let moved: f64 = model.marginal(&vars).values.iter().zip(&before.values).map(|(a, b)| (a - b).abs()).sum();
        if moved <= (2.0 / std::f64::consts::PI).sqrt() * noise * before.values.len() as f64 {
            schedule.anneal();
        }
        round += 1;
        tracing::info!(
            round,
            measured = ?vars,
            rho_spent = plan.rho - left(releases),
            rho = plan.rho,
            model_cells = model.cells(),
            "AIM progress"
        );
        shown(round, 1.0 - left(releases) / plan.rho);
        if last {
            break;
        }
    }
    let run = &releases.zcdp_released()[released_before..];
    tracing::info!(
        measurements = measurements.len(),
        selections = run.len() - measurements.len(),
        rho_spent = run.iter().map(ZcdpRelease::rho).sum::<f64>(),
        rho = plan.rho,
        "AIM: rounds done"
    );
    Ok(Measured { model: model.refit(&measurements, 10 * iterations), measurements })
}

#[cfg(test)]
mod tests {
    use rand::{RngExt, SeedableRng};
    use rhosynth_privacy::ledger::{ChargeRequest, Ledger};
    use rhosynth_privacy::release::{Private, Releases, ZcdpRelease};
    use rhosynth_shared::accounting::Budget;
    use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account};
    use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::aim::AimPlan;
    use rhosynth_shared::spec::JobSpec;

    use rhosynth_shared::testing::{DEMO, generator, with_generator};

    /// A whole AIM run on exact tables of made-up rows, paid by a real ledger charge: the
    /// charge is the plan's ρ, what was run spends it (never more), and the RDP accountant's
    /// composition of exactly the releases that were run — each Gaussian measurement and each
    /// exponential draw as the mechanism it is, at the sensitivity m = 3 rows per unit —
    /// costs no more than the charge, while the same releases at their zCDP costs compose
    /// to the charge itself.
    /// With a target, its pairs are measured first, with a fifth of ρ among them.
    #[tokio::test]
    async fn the_ledger_charge_is_the_composition_of_what_the_run_released() {
        composes_to_the_charge(None).await;
        composes_to_the_charge(Some("rhythm")).await;
    }

    async fn composes_to_the_charge(target: Option<&str>) {
        let demo = match target {
            Some(t) => DEMO.replacen("[schema]\n", &format!("[schema]\ntarget = \"{t}\"\n"), 1),
            None => DEMO.to_string(),
        };
        let text = with_generator(&demo, &generator("aim", "max_rows_per_unit = 3\nrounds = 40"));
        let spec = JobSpec::parse(&text, "demo.toml").unwrap();
        let options = AccountingOptions::default();
        let plan = AimPlan::new(&spec, &Domain::from_spec(&spec), &options).unwrap();

        // Exact tables of 2000 rows with some structure (test data: a seeded RNG).
        let sizes: Vec<usize> = plan.task.domain.columns.iter().map(|c| c.bins()).collect();
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(7);
        let rows: Vec<Vec<usize>> = (0..2000)
            .map(|_| {
                let base = rng.random_range(0..sizes[0]);
                sizes.iter().map(|&n| if rng.random_bool(0.6) { base % n } else { rng.random_range(0..n) }).collect()
            })
            .collect();
        let mut exact = Vec::new();
        for vars in &plan.task.tables {
            let mut table = vec![0.0; vars.iter().map(|&v| sizes[v]).product()];
            for row in &rows {
                table[vars.iter().fold(0, |cell, &v| cell * sizes[v] + row[v])] += 1.0;
            }
            exact.extend(table);
        }

        let dir = tempfile::tempdir().unwrap();
        let store = rhosynth_shared::storage::open(dir.path().to_str().unwrap()).unwrap();
        let budget = Budget { epsilon: 10.0, delta: 1e-5 };
        let mut ledger = Ledger::init(&store, "aim-test", budget, Adjacency::AddRemove, options.clone()).await.unwrap();
        let request = ChargeRequest {
            job_id: "aim".into(),
            mechanisms: plan.mechanisms(),
            accountant: Accountant::Rdp,
            delta: spec.privacy.delta,
        };
        let receipt = ledger.charge(&request).await.unwrap();
        assert_eq!(receipt.mechanisms(), [Mechanism::Zcdp { rho: plan.rho, adjacency: Adjacency::AddRemove }]);
        let mut releases = Releases::paid_by(&receipt).unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let model =
            super::run_rounds(&plan, Private::new(exact), &mut releases, &|r, s| seen.lock().unwrap().push((r, s)))
                .unwrap()
                .model;
        let run = releases.zcdp_released().to_vec();
        // Every round shown once, in order, with the share of ρ spent growing to all of it.
        let seen = seen.into_inner().unwrap();
        assert!(seen.iter().enumerate().all(|(i, &(round, _))| round == i + 1), "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].1 < w[1].1) && seen.last().unwrap().1 > 1.0 - 1e-6, "{seen:?}");
        // The total is pooled by inverse variance; the 1-way tables alone (column c's total
        // has variance n_c·(σm)²) bound its standard deviation by σm / √Σ 1/n_c. Five of them.
        let ZcdpRelease::Gaussian { noise_multiplier, l2_sensitivity } = run[0] else { panic!("1-way first") };
        let std = noise_multiplier * l2_sensitivity / sizes.iter().map(|&n| 1.0 / n as f64).sum::<f64>().sqrt();
        assert!((model.total - 2000.0).abs() < 5.0 * std, "total {} (std ≤ {std})", model.total);

        let spent: f64 = run.iter().map(ZcdpRelease::rho).sum();
        assert!(spent <= plan.rho && spent > plan.rho * (1.0 - 1e-6), "spent {spent} of {}", plan.rho);
        let gaussians = run.iter().filter(|r| matches!(r, ZcdpRelease::Gaussian { .. })).count();
        let pairs = plan.target_pairs.len();
        assert_eq!(pairs, if target.is_some() { sizes.len() - 1 } else { 0 });
        assert_eq!(
            gaussians,
            sizes.len() + pairs + (run.len() - gaussians),
            "a measurement per column, per target pair and per selection"
        );
        let target_rho: f64 = run[sizes.len()..sizes.len() + pairs].iter().map(ZcdpRelease::rho).sum();
        assert!((target_rho - 0.2 * plan.rho * (pairs.min(1) as f64)).abs() < 1e-12, "{target_rho}");
        // Each release at its unit's sensitivity: m rows move a table by m, and a score by
        // m times the largest workload weight.
        let weight = plan.weights.iter().copied().fold(0.0, f64::max);
        for r in &run {
            match *r {
                ZcdpRelease::Gaussian { l2_sensitivity, .. } => assert_eq!(l2_sensitivity, 3.0),
                ZcdpRelease::Exponential { sensitivity, .. } => {
                    assert!(sensitivity > 0.0 && sensitivity <= 3.0 * weight)
                }
            }
        }
        let as_run: Vec<Mechanism> = run
            .iter()
            .map(|r| match *r {
                ZcdpRelease::Gaussian { l2_sensitivity, noise_multiplier } => Mechanism::Gaussian {
                    l2_sensitivity,
                    noise_multiplier,
                    releases: 1,
                    adjacency: Adjacency::AddRemove,
                },
                ZcdpRelease::Exponential { sensitivity, epsilon } => {
                    Mechanism::Exponential { sensitivity, epsilon, selections: 1 }
                }
            })
            .collect();
        let delta = spec.privacy.delta;
        let run_epsilon = account(&as_run, Accountant::Rdp, delta, &options).unwrap().epsilon;
        let charged = receipt.admission.cost.epsilon;
        assert!(run_epsilon <= charged * (1.0 + 1e-9), "run ε {run_epsilon} > charged ε {charged}");
        // The filter's own account — each release at its zCDP cost — is the charge; the
        // exponential draws may cost less as bounded-range mechanisms at large ε (where
        // randomized response's RDP is the smaller), so the run's true ε lies between the
        // Gaussian measurements' alone and the charge.
        let at_cost: Vec<Mechanism> =
            run.iter().map(|r| Mechanism::Zcdp { rho: r.rho(), adjacency: Adjacency::AddRemove }).collect();
        let filter_epsilon = account(&at_cost, Accountant::Rdp, delta, &options).unwrap().epsilon;
        assert!((filter_epsilon - charged).abs() < 1e-5 * charged, "filter ε {filter_epsilon} vs charged {charged}");
        let measurements: Vec<Mechanism> =
            as_run.iter().filter(|m| matches!(m, Mechanism::Gaussian { .. })).cloned().collect();
        let measured_epsilon = account(&measurements, Accountant::Rdp, delta, &options).unwrap().epsilon;
        assert!(run_epsilon >= measured_epsilon, "run ε {run_epsilon} below its measurements' {measured_epsilon}");
        assert!((charged - spec.privacy.epsilon).abs() < 1e-6 * spec.privacy.epsilon, "charged ε {charged}");
    }

    /// A database's views under one charge: each view's AIM run spends its own share of
    /// the charged ρ (the first run does not take the second's), every measurement and
    /// selection at that view's per-patient bound (1 row of the root's view, the cap of the
    /// admissions' view), and the two together spend the charge.
    #[tokio::test]
    async fn each_view_spends_its_own_share_of_one_charge() {
        use rhosynth_shared::data::database::{Database, DatabaseView, Layout, View};
        use rhosynth_shared::generators::aim::AimParams;

        let dir = tempfile::tempdir().unwrap();
        let spec = rhosynth_shared::testing::database_spec(dir.path(), (3, 10), "");
        let layout = Layout::of(&Database::of_spec(&spec));
        // Enough rounds for the admissions' view's 17 one-way tables (its vitals' means
        // among its columns).
        let params = AimParams { rounds: Some(40), ..AimParams::default() };
        let shares = [0.3, 0.7];
        let rho = 0.5;
        let plans: Vec<AimPlan> = (0..2)
            .map(|t| {
                let view = DatabaseView { layout: layout.clone(), view: View { table: t } };
                AimPlan::over_view(&params, view, None, shares[t] * rho).unwrap()
            })
            .collect();
        assert_eq!(plans.iter().map(|p| p.task.max_rows_per_unit).collect::<Vec<_>>(), [1, 3]);
        let view = DatabaseView { layout: layout.clone(), view: View { table: 1 } };
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(
                AimPlan::over_view(&params, view.clone(), None, bad).unwrap_err().to_string().contains("share of ρ")
            );
        }
        let mut cycle = view;
        cycle.layout.tables[1].parent = Some(2);
        assert!(AimPlan::over_view(&params, cycle, None, 0.1).unwrap_err().to_string().contains("layout"));

        let store = rhosynth_shared::storage::open(dir.path().to_str().unwrap()).unwrap();
        let options = AccountingOptions::default();
        let budget = Budget { epsilon: 10.0, delta: 1e-5 };
        let mut ledger = Ledger::init(&store, "db", budget, Adjacency::AddRemove, options).await.unwrap();
        let mechanisms = vec![Mechanism::Zcdp { rho, adjacency: Adjacency::AddRemove }];
        let request = ChargeRequest { job_id: "db".into(), mechanisms, accountant: Accountant::Rdp, delta: 1e-6 };
        let receipt = ledger.charge(&request).await.unwrap();
        let mut releases = Releases::paid_by(&receipt).unwrap();
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(5);
        for plan in &plans {
            // Exact tables of 500 made-up view rows (test data: a seeded RNG).
            let sizes: Vec<usize> = plan.task.domain.columns.iter().map(|c| c.bins()).collect();
            let rows: Vec<Vec<usize>> =
                (0..500).map(|_| sizes.iter().map(|&n| rng.random_range(0..n)).collect()).collect();
            let mut exact = Vec::new();
            for vars in &plan.task.tables {
                let mut table = vec![0.0; vars.iter().map(|&v| sizes[v]).product()];
                rows.iter().for_each(|row| table[vars.iter().fold(0, |cell, &v| cell * sizes[v] + row[v])] += 1.0);
                exact.extend(table);
            }
            let released = releases.zcdp_released().len();
            super::run_rounds(plan, Private::new(exact), &mut releases, &|_, _| {}).unwrap();
            let run = &releases.zcdp_released()[released..];
            let spent: f64 = run.iter().map(ZcdpRelease::rho).sum();
            assert!(
                spent <= plan.rho * (1.0 + 1e-9) && spent > plan.rho * (1.0 - 1e-6),
                "spent {spent} of {}",
                plan.rho
            );
            let m = f64::from(plan.task.max_rows_per_unit);
            let weight = plan.weights.iter().copied().fold(0.0, f64::max);
            for r in run {
                match *r {
                    ZcdpRelease::Gaussian { l2_sensitivity, .. } => assert_eq!(l2_sensitivity, m),
                    ZcdpRelease::Exponential { sensitivity, .. } => {
                        assert!(sensitivity > 0.0 && sensitivity <= m * weight)
                    }
                }
            }
        }
        assert!(releases.zcdp_left() < rho * 1e-6, "the charge is spent: {} left", releases.zcdp_left());
    }
}
