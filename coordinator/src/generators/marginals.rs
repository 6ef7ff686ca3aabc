//! DP marginals on the coordinator: one round of contingency tables from the workers,
//! charged once summed, then one Gaussian release of all of them, sampled from.

use dpsynth_privacy::ledger::Ledger;
use dpsynth_privacy::release::Releases;
use dpsynth_proto::task::Work;
use dpsynth_shared::generators::marginals::{MarginalsPlan, MarginalsSampler};

use super::{Admission, Charged, Fitted, Generator};
use crate::context::{JobContext, JobError, Partitions, blocking, set_stage};
use crate::gather::{Answer, Round};

/// A planned marginals job: what it measures and the σ its one release is drawn with.
pub struct Marginals {
    plan: MarginalsPlan,
    sigma: f64,
}

impl Generator for Marginals {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        let plan = MarginalsPlan::new(ctx.spec(), ctx.domain)?;
        let sigma = plan.calibrate(ctx.spec(), ledger.options())?;
        Ok(Self { plan, sigma })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(vec![self.plan.mechanism(self.sigma)])
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let Self { plan, sigma } = self;
        set_stage(ctx.progress, "aggregating on workers");
        let groups: Vec<Vec<String>> = partitions.urls.iter().map(|url| vec![url.clone()]).collect();
        let task = &plan.task;
        let round =
            Round { work: Work::CountTables(task.into()), groups: &groups, tensor: "counts", len: task.cells() };
        ctx.progress_mut().tasks_total = groups.len() as u32;
        // The partition's own unit count caps the worker's claim.
        let check = |a: Answer<'_>| {
            partitions.units_per_partition.check(|units| task.validate(a.values, a.claimed_units.min(units[a.group])))
        };
        let counts = ctx.gather().round(round, check, ctx.round_progress()).await?;

        let mechanisms = vec![plan.mechanism(sigma)];
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        set_stage(ctx.progress, "adding noise");
        let sensitivity = task.sensitivity();
        let noisy = Releases::paid_by(&receipt)?.gaussian(counts, sensitivity, sigma)?;
        set_stage(ctx.progress, "fitting the model");
        let sampler = blocking(move || MarginalsSampler::new(plan, &noisy, sigma * sensitivity)).await?;
        // The default size: the tables' pooled noisy total, released by the same mechanism.
        let released_rows = Some(sampler.noisy_total().round().max(1.0) as u64);
        let cost = receipt.admission.cost.clone();
        let charged = Charged { receipt, cost, mechanisms, public_inputs: Vec::new() };
        Ok(Fitted { sampler: Box::new(sampler), released_count: released_rows, charged })
    }
}
