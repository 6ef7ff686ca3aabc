//! AIM on the coordinator: one round of every candidate table from the workers, the run's
//! zCDP budget charged, then the adaptive rounds — select, measure, refit — off the async
//! threads, each release paid from the budget.

use dpsynth_privacy::ledger::Ledger;
use dpsynth_privacy::release::{Private, Releases, Unpaid};
use dpsynth_shared::generators::aim::AimPlan;
use dpsynth_shared::generators::aim::rounds::{Schedule, eligible, qualities, quality_sensitivity};
use dpsynth_shared::generators::marginals::MarginalsSampler;
use dpsynth_shared::pgm::{GraphicalModel, Measurement};

use super::marginals::count_tables;
use super::{Admission, Charged, Fitted, Generator};
use crate::context::{JobContext, JobError, Partitions, blocking, set_stage};

/// A planned AIM job.
pub struct Aim {
    plan: AimPlan,
}

impl Generator for Aim {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        Ok(Self { plan: AimPlan::new(ctx.spec(), ctx.domain, ledger.options())? })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(vec![self.plan.mechanism()])
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let Self { plan } = self;
        let exact = count_tables(ctx, partitions, &plan.task).await?;

        let mechanisms = vec![plan.mechanism()];
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        set_stage(ctx.progress, "selecting and measuring marginals");
        let releases = Releases::paid_by(&receipt)?;
        let domain = plan.task.domain.clone();
        let model = blocking(move || run_rounds(&plan, exact, releases)).await??;
        // The default size: the model's total, pooled from the released measurements.
        let released_rows = Some(model.total.round().max(1.0) as u64);
        let cost = receipt.admission.cost.clone();
        let charged = Charged { receipt, cost, mechanisms, public_inputs: Vec::new() };
        Ok(Fitted {
            sampler: Box::new(MarginalsSampler::from_model(domain, model)),
            released_count: released_rows,
            charged,
        })
    }
}

/// The rounds: every 1-way table, then selections and measurements until the budget is
/// spent (or no candidate fits the model's size limit), the model refitted after each.
fn run_rounds(plan: &AimPlan, exact: Private<Vec<f64>>, mut releases: Releases) -> Result<GraphicalModel, Unpaid> {
    let sizes: Vec<usize> = plan.task.domain.columns.iter().map(|c| c.bins()).collect();
    let offsets = plan.task.offsets();
    let m = plan.sensitivity();
    let table = |r: usize| exact.map(|counts| counts[offsets[r]..offsets[r + 1]].to_vec());
    let iterations = plan.fit_iterations as usize;
    let mut schedule = Schedule::new(plan);
    let mut measurements = Vec::new();
    for c in 0..sizes.len() {
        let counts = releases.zcdp_gaussian(table(c), m, schedule.sigma)?;
        measurements.push(Measurement { vars: vec![c], counts, sigma: schedule.sigma * m });
    }
    let mut model = GraphicalModel::fit(&sizes, &measurements, iterations);
    let mut round = 0;
    while releases.zcdp_left() > plan.rho * 1e-9 {
        let last = schedule.fit_to(releases.zcdp_left());
        let spent = 1.0 - releases.zcdp_left() / plan.rho;
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
            rho_spent = plan.rho - releases.zcdp_left(),
            rho = plan.rho,
            model_cells = model.cells(),
            "AIM progress"
        );
        if last {
            break;
        }
    }
    Ok(model.refit(&measurements, 10 * iterations))
}
