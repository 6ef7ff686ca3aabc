//! The coordinator's side of each generator, behind one trait: the job's lifecycle
//! (`crate::job`) plans it, admits what the plan states before any private read (the
//! lifecycle's step, not the generator's), partitions the input, lets it fit (its rounds
//! through [`crate::gather`], every noisy value drawn through `rhosynth_privacy::release`
//! after the charge that pays for it), then claims the one release and writes what its
//! sampler draws. Its plan, task and sampler live in the shared crate's
//! `generators::<name>`, beside its worker side.

pub mod aim;
pub(crate) mod calibration;
pub mod database;
pub mod dp2stage;
pub mod dpsgd;
pub mod findiff;
pub mod harmonic;
pub mod history_copula;
pub mod marginals;
pub mod pate;
pub(crate) mod reference;
pub mod sequence;

use rhosynth_privacy::ledger::{ChargeReceipt, Ledger};
use rhosynth_shared::accounting::accountant::PrivacyCost;
use rhosynth_shared::accounting::mechanism::Mechanism;
use rhosynth_shared::generators::Sampler;
use rhosynth_shared::generators::database::DatabaseSampler;

use crate::context::{JobContext, JobError, Partitions};
use crate::gather::{Answer, Gather, Round};

/// One round of a bounded aggregate, a task per partition: each answer checked by
/// `check(values, units)` against its partition's own unit count (a worker's claim is
/// capped by it, never trusted); the exact sum stays private.
pub(crate) async fn partition_round(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    partitions: &Partitions,
    (work, tensor, len): (rhosynth_proto::task::Work, &'static str, usize),
    check: impl Fn(&[f64], u64) -> Result<(), String>,
) -> Result<rhosynth_privacy::release::Private<Vec<f64>>, JobError> {
    let round = Round { work, groups: &partitions.groups, tensor, len };
    ctx.progress_mut().tasks_total = partitions.groups.len() as u32;
    let check = |a: Answer<'_>| {
        partitions.units_per_partition.check(|units| check(a.values, a.claimed_units.min(units[a.group])))
    };
    gather.round(round, check, ctx.round_progress()).await
}

/// A generator as its job runs it.
pub(crate) trait Generator: Sized {
    /// Plans from public information: the spec, the declared domain and the ledger's
    /// accounting options; or takes over a run of this job the ledger has already charged
    /// (a DP-SGD run's checkpoint, verified against the ledger, under its resume lease).
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError>;

    /// What the lifecycle asks the ledger to admit before any private read.
    fn admission(&self) -> Admission;

    /// Long work from public information only (a model's initial parameters, pretraining
    /// on public pseudo rows), after admission and before any private read: its time and
    /// its failures can depend on nothing private, and a refused job never costs it.
    async fn prepare(&mut self, _ctx: &JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }

    /// The private input split by privacy unit into the scratch store: one table's
    /// partitions, unless the generator reads otherwise.
    async fn partition(&self, ctx: &JobContext<'_>) -> Result<Partitions, JobError> {
        ctx.partition().await
    }

    /// Its rounds on the workers over `partitions`, each charged before anything derived
    /// from it is drawn; returns the fitted sampler with what was charged.
    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError>;
}

/// What a job must be admitted with before it reads private data.
pub(crate) enum Admission {
    /// The planned mechanisms: the job's cost.
    Cost(Vec<Mechanism>),
    /// Mechanisms that bound a cost fixed later by a release (a DP-SGD run's rate follows
    /// the released unit count): admitted, and the job's declared ε must also fit what is left
    /// of the budget.
    Bound(Vec<Mechanism>),
    /// A run of this job the ledger charged when it first started (entry `seq`) and has
    /// not released: resuming it spends nothing.
    Charged { seq: u64 },
}

/// What a generator fitted, and what it was charged for.
pub(crate) struct Fitted {
    pub sampler: Draws,
    /// The output's size (units the sampler draws) from a release, for a spec that
    /// declares none.
    pub released_count: Option<u64>,
    pub charged: Charged,
}

/// What a fitted generator draws: one table's rows (or histories), or a database.
pub(crate) enum Draws {
    Table(Box<dyn Sampler>),
    Database(DatabaseSampler),
}

/// What a job was charged for, for its manifest.
pub(crate) struct Charged {
    /// The charge whose release the output is.
    pub receipt: ChargeReceipt,
    /// The job's whole cost (all its ledger entries), as its accountant states it.
    pub cost: PrivacyCost,
    pub mechanisms: Vec<Mechanism>,
    /// Released statistics the output depends on.
    pub public_inputs: Vec<String>,
}
