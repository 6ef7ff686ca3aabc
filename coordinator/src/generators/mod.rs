//! The coordinator's side of each generator: what it does between a job's admission and
//! its release, in the job's context ([`crate::job::JobContext`]). Each plans from public
//! information (the shared crate's `generators::<name>` plan), admits its planned cost,
//! partitions, charges, runs its rounds through [`crate::gather`], releases only through
//! `dpsynth_privacy::release`, claims its one release and writes its parts.

pub mod findiff;
pub mod marginals;
pub mod pate;

use dpsynth_privacy::ledger::Ledger;
use dpsynth_shared::spec::GeneratorSpec;

use crate::job::{JobContext, JobError, Released};

/// Runs the job's generator.
pub async fn run(ctx: &JobContext<'_>, ledger: &mut Ledger) -> Result<Released, JobError> {
    match &ctx.spec().generator {
        GeneratorSpec::Marginals(_) => marginals::run(ctx, ledger).await,
        GeneratorSpec::Findiff(params) => findiff::run(ctx, params, ledger).await,
        GeneratorSpec::Pate(_) => pate::run(ctx, ledger).await,
    }
}
