//! Synthetic-data generators. Each states what it measures and how it is charged, and
//! plans from public information only (the spec and the declared domain). Each is a
//! folder with the same files: `params` (its `[generator.<name>]` section), `plan` (from
//! public information: what it measures and the mechanisms it is charged for, and the
//! `check` a submitted spec meets), `task` (the worker's side: the aggregate it computes,
//! its wire form, and the coordinator's check of a worker's answer) and `sampler` (rows
//! drawn from what was fitted to released values), beside the model's own modules; and one
//! line in [`generator_list!`]. The coordinator's side (rounds, charges, releases) is
//! `rhosynth_coordinator::generators`.

pub mod aim;
pub mod database;
pub mod dp2stage;
pub mod findiff;
pub mod harmonic;
pub mod history_copula;
pub mod marginals;
pub mod params;
pub mod pate;
pub mod planning;
pub mod reference;
pub mod sampler;
pub mod section;
pub mod sequence;
pub mod trained;

pub use params::GeneratorParams;
pub use planning::{PlanError, order_with_gaps, require_columns, require_positive};
pub use sampler::Sampler;
pub use section::{GeneratorName, GeneratorSpec};

use crate::data::domain::Domain;
use crate::spec::JobSpec;

/// Every generator, one line each: its name (`[generator] name`, its `[generator.<name>]`
/// section, its folder here and its module in the coordinator's `generators`), its
/// variant and parameters (`<name>::<Params>`, which implement [`GeneratorParams`]), the
/// coordinator's side (`<name>::<Type>`) and, for a generator the DP-SGD engine trains,
/// `dpsgd` (its parameters implement `dpsgd::run::DpSgdParams`, which names the model its
/// rounds train). `$then!` expands the list: here into the name, the spec section, the
/// submission check and `GeneratorName::with_trainable` (the model a worker's round or an
/// audit builds); in the coordinator into its dispatch. A generator left out of any of them
/// is a compile error, not a silent arm.
#[macro_export]
macro_rules! generator_list {
    ($then:ident) => {
        $then! {
            marginals: Marginals(MarginalsParams) by Marginals;
            aim: Aim(AimParams) by Aim;
            findiff: Findiff(FinDiffParams) by FinDiff, dpsgd;
            pate: Pate(PateParams) by Pate;
            sequence: Sequence(SequenceParams) by Sequence, dpsgd;
            dp2stage: Dp2stage(LanguageModelParams) by Dp2Stage, dpsgd;
            harmonic: Harmonic(LanguageModelParams) by Harmonic, dpsgd;
            history_copula: HistoryCopula(HistoryCopulaParams) by HistoryCopula;
            database: Database(DatabaseParams) by Database;
        }
    };
}

/// `$then` for a list entry marked `dpsgd`, `$else` for one that is not.
#[doc(hidden)]
#[macro_export]
macro_rules! if_dpsgd {
    (dpsgd { $($then:tt)* } else { $($else:tt)* }) => { $($then)* };
    ({ $($then:tt)* } else { $($else:tt)* }) => { $($else)* };
}

macro_rules! submission_check {
    ($($name:ident: $variant:ident($params:ident) by $side:ident $(, $dpsgd:ident)?;)*) => {
        /// Plans the spec's generator from public information alone (each folder's
        /// `check`), so that bad parameters are refused when a job is submitted rather than
        /// when it runs. (A job plans again when it runs, with its ledger's accounting
        /// options.)
        pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
            match &spec.generator {
                $(GeneratorSpec::$variant(_) => $name::check(spec, domain),)*
            }
        }
    };
}

generator_list!(submission_check);
