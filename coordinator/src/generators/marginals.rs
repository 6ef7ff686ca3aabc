//! DP marginals on the coordinator: one round of contingency tables from the workers,
//! one Gaussian release of all of them (charged first), then rows drawn from the noisy
//! tables.

use std::sync::Arc;

use dpsynth_privacy::ledger::Ledger;
use dpsynth_privacy::release::{Private, Releases};
use dpsynth_shared::entropy::os_rng;
use dpsynth_shared::generators::marginals::{self, MarginalsPlan, Synthesizer, decode_bin};
use dpsynth_shared::output::OutputWriter;
use dpsynth_shared::spec::JobSpec;
use dpsynth_shared::storage;

use crate::context::{JobContext, JobError, Partitions, Released, claim_release, set_stage, write_parts};
use crate::gather::{Answer, Gather, Round};

/// DP marginals: one Gaussian release of all tables, then sampling.
pub async fn run(ctx: &JobContext<'_>, ledger: &mut Ledger) -> Result<Released, JobError> {
    let (spec, output_url) = (ctx.spec(), ctx.output_url);
    let plan = MarginalsPlan::new(spec, ctx.domain)?;
    let sigma = plan.calibrate(spec, ledger.options())?;
    let charge = ctx.charge_request(vec![plan.mechanism(sigma)]);
    ctx.admit(ledger, &charge).await?;
    let output = OutputWriter::create(storage::open(output_url)?).await?;
    let partitioned = ctx.partition().await?;
    let counts = aggregate_marginals(ctx, &partitioned, &plan).await?;
    let receipt = ctx.charge(ledger, &charge).await?;
    set_stage(ctx.progress, "adding noise");
    let noisy = Releases::paid_by(&receipt)?.gaussian(counts, plan.task.sensitivity(), sigma)?;
    let synthesizer = Synthesizer::new(plan.clone(), &noisy);
    drop(noisy);

    set_stage(ctx.progress, "writing output");
    claim_release(ledger, &receipt, &output).await?;
    let rows = spec.output.rows.unwrap_or_else(|| synthesizer.noisy_total.round().max(1.0) as u64);
    let output = write_marginal_parts(spec, output, &synthesizer, rows).await?;
    let cost = receipt.admission.cost.clone();
    Ok(Released { output, receipt, cost, mechanisms: charge.mechanisms, public_inputs: Vec::new() })
}

async fn aggregate_marginals(
    ctx: &JobContext<'_>,
    partitioned: &Partitions,
    plan: &MarginalsPlan,
) -> Result<Private<Vec<f64>>, JobError> {
    set_stage(ctx.progress, "aggregating on workers");
    let groups: Vec<Vec<String>> = partitioned.urls.iter().map(|url| vec![url.clone()]).collect();
    let params = Arc::new(serde_json::to_vec(&plan.task).map_err(|e| JobError::Other(e.to_string()))?);
    let round = Round { kind: marginals::TASK_KIND, params, groups: &groups, tensor: "counts", len: plan.task.cells() };
    ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_total = groups.len() as u32;
    let started = std::time::Instant::now();
    // The partition's own unit count caps the worker's claim.
    let check = |a: Answer<'_>| {
        partitioned.units_per_partition.check(|units| plan.task.validate(a.values, a.claimed_units.min(units[a.group])))
    };
    let progress = |done: usize, total: usize| {
        ctx.progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_done = done as u32;
        let eta_s = (started.elapsed().as_secs_f64() / done as f64 * (total - done) as f64).round();
        tracing::info!(done, total, eta_s, "task done");
    };
    Gather::new(ctx.scheduler, ctx.telemetry, &ctx.request.job_id).round(round, check, progress).await
}

/// Samples `rows` synthetic rows from the noisy tables.
async fn write_marginal_parts(
    spec: &JobSpec,
    output: OutputWriter,
    synthesizer: &Synthesizer,
    rows: u64,
) -> Result<OutputWriter, JobError> {
    // Sampling from the noisy tables is post-processing; any good generator will do.
    let mut rng = os_rng()?;
    let columns = synthesizer.domain().columns.len();
    write_parts(spec, output, rows, |n| {
        let part = (0..n)
            .map(|_| {
                let bins = synthesizer.sample_bins(&mut rng);
                (0..columns).map(|c| decode_bin(synthesizer.domain(), c, bins[c], &mut rng)).collect()
            })
            .collect();
        std::future::ready(Ok(part))
    })
    .await
}
