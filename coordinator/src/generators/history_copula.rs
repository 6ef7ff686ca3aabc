//! The history copula on the coordinator: the margins round, one charge for all three
//! releases, the margins and lengths released, the moments round in the scores those
//! margins give, its release, and the copula fitted to what was released.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_privacy::release::{Private, Releases};
use rhosynth_proto::task::Work;
use rhosynth_shared::generators::history_copula::model::Released;
use rhosynth_shared::generators::history_copula::{
    CopulaModel, CopulaSampler, HistoryCopulaPlan, HistoryStatisticsTask,
};
use rhosynth_shared::generators::sequence::plan::length_cells;

use super::{Admission, Charged, Draws, Fitted, Generator, partition_round};
use crate::context::{JobContext, JobError, Partitions, blocking, set_stage};
use crate::gather::Gather;

/// A planned history copula job.
pub struct HistoryCopula {
    plan: HistoryCopulaPlan,
}

/// One round of per-unit statistics ([`partition_round`]).
async fn statistics(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    partitions: &Partitions,
    task: &HistoryStatisticsTask,
) -> Result<Private<Vec<f64>>, JobError> {
    let work = (Work::HistoryStatistics(task.into()), "statistics", task.len());
    partition_round(ctx, gather, partitions, work, |values, units| task.check(values, units)).await
}

impl Generator for HistoryCopula {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        Ok(Self { plan: HistoryCopulaPlan::new(ctx.spec(), ctx.domain, ledger.options())? })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(self.plan.mechanisms())
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let plan = self.plan;
        let mut gather = ctx.gather();
        set_stage(ctx.progress, "margins on workers");
        let margins_task = plan.margins_task();
        let margins = statistics(ctx, &mut gather, partitions, &margins_task).await?;

        let mechanisms = plan.mechanisms();
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        set_stage(ctx.progress, "adding noise");
        let mut releases = Releases::paid_by(&receipt)?;
        let margins = releases.gaussian(margins, margins_task.sensitivity(), plan.margins_sigma)?;
        let cells = partitions.rows_per_unit.map(|rows| length_cells(rows, plan.layout.max_rows));
        let lengths = releases.gaussian(cells, 1.0, plan.lengths_sigma)?;

        set_stage(ctx.progress, "moments on workers");
        let margin_noise = plan.margins_sigma * margins_task.sensitivity();
        let (released_margins, ..) = CopulaModel::margins(&plan.layout, &margins, margin_noise);
        let moments_task = plan.moments_task(&released_margins);
        let moments = statistics(ctx, &mut gather, partitions, &moments_task).await?;
        let moments = releases.gaussian(moments, moments_task.sensitivity(), plan.moments_sigma)?;

        set_stage(ctx.progress, "fitting the model");
        let released_units = lengths.iter().sum::<f64>().round().max(1.0) as u64;
        let layout = plan.layout.clone();
        let released = Released { margins, margin_noise, moments, moment_noise: plan.moments_sigma * plan.moment_clip };
        let model = blocking(move || CopulaModel::fit(layout, released, lengths)).await?;
        let public_inputs = vec![format!(
            "history copula: Gaussian releases of each unit's margins (noise multiplier {:.3}, sensitivity {:.3}), \
             of its same-row and lag-1 moments in normal scores and each column's ramp moments (on scores along \
             the released margins' curves; noise multiplier {:.3}, one vector clipped to L2 {}), and of \
             the histogram of history lengths ({} cells, noise multiplier {:.3}, sensitivity 1), all under \
             add/remove and paid by the job's one charge",
            plan.margins_sigma,
            margins_task.sensitivity(),
            plan.moments_sigma,
            plan.moment_clip,
            plan.layout.max_rows,
            plan.lengths_sigma,
        )];
        let cost = receipt.admission.cost.clone();
        let charged = Charged { receipt, cost, mechanisms, public_inputs };
        Ok(Fitted {
            sampler: Draws::Table(Box::new(CopulaSampler::new(model))),
            released_count: Some(released_units),
            charged,
        })
    }
}
