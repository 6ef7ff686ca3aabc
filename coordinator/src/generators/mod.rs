//! The coordinator's side of each generator, behind one trait: the job's lifecycle
//! (`crate::job`) plans it from public information, admits its planned cost before any
//! read, partitions the input, lets it fit (its rounds through [`crate::gather`], every
//! noisy value drawn through `dpsynth_privacy::release` after the charge that pays for
//! it), then claims the one release and writes what its sampler draws. Its plan, task and
//! sampler live in the shared crate's `generators::<name>`, beside its worker side.

pub mod findiff;
pub mod marginals;
pub mod pate;

use dpsynth_privacy::ledger::{ChargeReceipt, Ledger};
use dpsynth_shared::accounting::accountant::PrivacyCost;
use dpsynth_shared::accounting::mechanism::Mechanism;
use dpsynth_shared::generators::Sampler;

pub use findiff::FinDiff;
pub use marginals::Marginals;
pub use pate::Pate;

use crate::context::{JobContext, JobError, Partitions};

/// A generator as its job runs it.
pub(crate) trait Generator: Sized {
    /// Plans from public information: the spec, the declared domain and the ledger's
    /// accounting options (or, resuming, a charged run the ledger confirms).
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError>;

    /// What the job is admitted with before any private read: its planned mechanisms, or a
    /// bound on them when the cost depends on a release.
    fn mechanisms(&self) -> Vec<Mechanism>;

    /// Refuses the job unless the ledger admits [`Generator::mechanisms`].
    async fn admit(&self, ctx: &JobContext<'_>, ledger: &mut Ledger) -> Result<(), JobError> {
        ctx.admit(ledger, &ctx.charge_request(self.mechanisms())).await.map(drop)
    }

    /// Its rounds on the workers over `partitions`, each charged before anything derived
    /// from it is drawn; returns the fitted sampler with what was charged.
    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError>;
}

/// What a generator fitted, and what it was charged for.
pub(crate) struct Fitted {
    pub sampler: Box<dyn Sampler>,
    /// Rows to write: the spec's, or a released count.
    pub rows: u64,
    /// The charge whose release the output is.
    pub receipt: ChargeReceipt,
    /// The job's whole cost (all its ledger entries), as its accountant states it.
    pub cost: PrivacyCost,
    pub mechanisms: Vec<Mechanism>,
    /// Released statistics the output depends on, for the manifest.
    pub public_inputs: Vec<String>,
}
