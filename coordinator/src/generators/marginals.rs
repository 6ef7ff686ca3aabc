//! DP marginals on the coordinator: one round of contingency tables from the workers,
//! charged once summed, then one Gaussian release of all of them, sampled from.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_privacy::release::{Private, Releases};
use rhosynth_proto::task::Work;
use rhosynth_shared::generators::marginals::{MarginalsPlan, MarginalsSampler, MarginalsTask};

use super::{Admission, Charged, Draws, Fitted, Generator, calibration, partition_round};
use crate::context::{JobContext, JobError, Partitions, blocking, set_stage};
use crate::gather::Gather;

/// A planned marginals job: what it measures and the σ its one release is drawn with.
pub struct Marginals {
    plan: MarginalsPlan,
    sigma: f64,
}

/// One round of contingency tables from the workers ([`partition_round`]). AIM counts its
/// candidates the same way.
pub(crate) async fn count_tables(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    partitions: &Partitions,
    task: &MarginalsTask,
) -> Result<Private<Vec<f64>>, JobError> {
    set_stage(ctx.progress, "aggregating on workers");
    let work = (Work::CountTables(task.into()), "counts", task.cells());
    partition_round(ctx, gather, partitions, work, |values, units| task.validate(values, units)).await
}

impl Generator for Marginals {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        let plan = MarginalsPlan::new(ctx.spec(), ctx.domain, ledger.options())?;
        let sigma = plan.calibrate(ctx.spec(), ledger.options())?;
        Ok(Self { plan, sigma })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(self.plan.mechanisms(self.sigma))
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let Self { plan, sigma } = self;
        let task = &plan.task;
        let mut gather = ctx.gather();
        let counts = count_tables(ctx, &mut gather, partitions, task).await?;

        let mechanisms = plan.mechanisms(sigma);
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        set_stage(ctx.progress, "adding noise");
        let sensitivity = task.sensitivity();
        let mut releases = Releases::paid_by(&receipt)?;
        let noisy = releases.gaussian(counts, sensitivity, sigma)?;
        let calibration =
            calibration::release(ctx, &mut gather, partitions, &mut releases, plan.calibration.as_ref()).await?;
        set_stage(ctx.progress, "fitting the model");
        let sampler = blocking(move || MarginalsSampler::new(plan, &noisy, sigma * sensitivity)).await?;
        // The default size: the tables' pooled noisy total, released by the same mechanism.
        let released_rows = Some(sampler.noisy_total().round().max(1.0) as u64);
        let cost = receipt.admission.cost.clone();
        let mut public_inputs = Vec::new();
        let sampler = calibration::apply(calibration, Box::new(sampler), &mut public_inputs);
        let charged = Charged { receipt, cost, mechanisms, public_inputs };
        Ok(Fitted { sampler: Draws::Table(sampler), released_count: released_rows, charged })
    }
}
