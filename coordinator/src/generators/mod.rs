//! The coordinator's side of each generator: what it does between a job's admission and
//! its release, in the job's context ([`crate::context::JobContext`]). Each plans from
//! public information (the shared crate's `generators::<name>` plan), admits its planned
//! cost before any read, partitions, runs its rounds through [`crate::gather`], and draws
//! every noisy value through `dpsynth_privacy::release` after the charge that pays for it
//! (marginals charge after their one round, DP-FinDiff and PATE before their first); then
//! it claims its one release and writes its parts.

pub mod findiff;
pub mod marginals;
pub mod pate;

use dpsynth_privacy::ledger::Ledger;
use dpsynth_shared::spec::GeneratorSpec;

use crate::context::{JobContext, JobError, Released};

/// Runs the job's generator.
pub async fn run(ctx: &JobContext<'_>, ledger: &mut Ledger) -> Result<Released, JobError> {
    match &ctx.spec().generator {
        GeneratorSpec::Marginals(_) => marginals::run(ctx, ledger).await,
        GeneratorSpec::Findiff(params) => findiff::run(ctx, params, ledger).await,
        GeneratorSpec::Pate(_) => pate::run(ctx, ledger).await,
    }
}
