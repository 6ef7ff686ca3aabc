//! A database on the coordinator: its tables partitioned by unit, every view's candidate
//! tables counted by the workers, the job's zCDP budget charged once, then each view's AIM
//! rounds with its share of it, and the database drawn down the tree of its tables.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_privacy::release::{Releases, Unpaid};
use rhosynth_shared::entropy::os_rng;
use rhosynth_shared::generators::aim::AimPlan;
use rhosynth_shared::generators::database::missing::without_phantoms;
use rhosynth_shared::generators::database::rake::{RAKING_ROUNDS, RAKING_ROWS, Raked};
use rhosynth_shared::generators::database::{DatabasePlan, DatabaseSampler};

use super::aim::{Measured, rounds_shown, run_rounds};
use super::marginals::count_tables;
use super::{Admission, Charged, Draws, Fitted, Generator};
use crate::context::{JobContext, JobError, Partitions, blocking, set_stage};

/// A planned database job.
pub struct Database {
    plan: DatabasePlan,
}

impl Generator for Database {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        Ok(Self { plan: DatabasePlan::new(ctx.spec(), ledger.options())? })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(self.plan.mechanisms())
    }

    async fn partition(&self, ctx: &JobContext<'_>) -> Result<Partitions, JobError> {
        ctx.partition_database().await
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let Self { plan } = self;
        // The workloads follow the declared domains: public, logged before any private read.
        let mut public_inputs = Vec::new();
        for (table, view) in plan.layout.tables.iter().zip(&plan.views) {
            tracing::info!(table = table.name, workload = %view.workload, rho = view.rho, "AIM workload of a view");
            public_inputs.push(format!("the view of table {}: AIM workload {}", table.name, view.workload));
        }
        let mut gather = ctx.gather();
        let mut exact = Vec::with_capacity(plan.views.len());
        for view in &plan.views {
            exact.push(count_tables(ctx, &mut gather, partitions, &view.task).await?);
        }

        let mechanisms = plan.mechanisms();
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        let mut releases = Releases::paid_by(&receipt)?;
        set_stage(ctx.progress, "selecting and measuring marginals of each table's view");
        let views = plan.views;
        let progress = ctx.progress.clone();
        let layout = plan.layout.clone();
        let models = blocking(move || {
            let count = views.len();
            let fit = |(i, (view, exact)): (usize, (&AimPlan, _))| {
                let shown = rounds_shown(progress.clone(), format!("view {} of {count}: ", i + 1));
                let Measured { model, measurements } = run_rounds(view, exact, &mut releases, &shown)?;
                // Post-processing of what the run released: logged once it is paid for.
                let (domain, own) = (&view.task.domain, layout.tables[i].values());
                let (model, ruled_out) = without_phantoms(domain, own, model, &measurements);
                let names: Vec<&str> = ruled_out.iter().map(|&c| domain.columns[c].name.as_str()).collect();
                tracing::info!(table = layout.tables[i].name, columns = ?names, "released missing within noise of none");
                Ok(model)
            };
            views.iter().zip(exact).enumerate().map(fit).collect::<Result<Vec<_>, Unpaid>>()
        })
        .await??;
        // The size: the root view's model total, pooled from its released measurements.
        let released_units = Some(models[0].total.round().max(1.0) as u64);
        let mut sampler = DatabaseSampler::new(ctx.spec(), plan.layout, models);
        if let Some(target) = plan.rake {
            set_stage(ctx.progress, "raking the target's table's model to rows drawn under synthetic parents");
            // Post-processing of the fitted models: its randomness is not private.
            let mut rng = os_rng()?;
            sampler = blocking(move || {
                let started = std::time::Instant::now();
                if let Some(Raked { before, after, chance, tilts }) =
                    sampler.rake(target, RAKING_ROWS, RAKING_ROUNDS, &mut rng)
                {
                    tracing::info!(
                        before,
                        after,
                        chance,
                        tilts,
                        seconds = started.elapsed().as_secs_f64(),
                        "raked: the target's drawn conditionals' gap from the model's, per row (no tilt once within \
                         chance's)"
                    );
                }
                sampler
            })
            .await?;
        }
        let cost = receipt.admission.cost.clone();
        let charged = Charged { receipt, cost, mechanisms, public_inputs };
        Ok(Fitted { sampler: Draws::Database(sampler), released_count: released_units, charged })
    }
}
