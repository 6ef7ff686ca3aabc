//! Marginal calibration on the coordinator, for any generator whose spec asks for it: the
//! plan's tables counted on the workers (as the marginals generator counts), released with
//! the noise the generator's charge paid for, then the generator's sampler wrapped to rake
//! its draws to them (`rhosynth_shared::calibration`).

use rhosynth_privacy::release::Releases;
use rhosynth_shared::calibration::{CalibratedSampler, CalibrationPlan, Targets};
use rhosynth_shared::generators::Sampler;

use super::marginals::count_tables;
use crate::context::{JobContext, JobError, Partitions};
use crate::gather::Gather;

/// Released calibration targets.
pub(crate) struct Calibration {
    plan: CalibrationPlan,
    targets: Targets,
}

/// The job's calibration targets, counted over `partitions` and released, paid from
/// `releases` (the generator's charge, which includes the plan's mechanism); `None` for a
/// job without calibration.
pub(crate) async fn release(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    partitions: &Partitions,
    releases: &mut Releases,
    plan: Option<&CalibrationPlan>,
) -> Result<Option<Calibration>, JobError> {
    let Some(plan) = plan else { return Ok(None) };
    let exact = count_tables(ctx, gather, partitions, &plan.task).await?;
    let noisy = releases.gaussian(exact, plan.task.sensitivity(), plan.noise_multiplier)?;
    tracing::info!(tables = plan.task.tables.len(), "calibration tables released");
    Ok(Some(Calibration { targets: Targets::new(&plan.task, &noisy), plan: plan.clone() }))
}

/// `sampler`, its draws raked to the released targets when there are any (noted among the
/// output's public inputs).
pub(crate) fn apply(
    calibration: Option<Calibration>,
    sampler: Box<dyn Sampler>,
    public_inputs: &mut Vec<String>,
) -> Box<dyn Sampler> {
    let Some(Calibration { plan, targets }) = calibration else { return sampler };
    let task = &plan.task;
    public_inputs.push(format!(
        "calibration: {} tables (every column's, then the target's pairs), at most {} rows per unit, Gaussian \
         noise multiplier {:.4} at L2 sensitivity {:.4}; the output raked to them from a pool {}× its size",
        task.tables.len(),
        task.max_rows_per_unit,
        plan.noise_multiplier,
        task.sensitivity(),
        plan.pool
    ));
    Box::new(CalibratedSampler {
        inner: sampler,
        targets,
        pool: plan.pool,
        max_rows_per_unit: task.max_rows_per_unit,
        domain: plan.task.domain,
    })
}
