//! PATE-TabTransGAN (Youssef & Woźniak): teacher ensembles on disjoint partitions judge
//! generated rows as real or fake; only a noisy aggregate of their votes leaves the
//! coordinator; a transformer student learns it and a generator learns to fool the student.
//!
//! - Teachers (`teacher`): one per partition, on the worker that holds it, refit every
//!   iteration on its real rows against as many generated rows. Each votes on every query
//!   with a number in [0, 1] (its probability that the row is real by default; the paper's
//!   hard vote is an option). A task returns, per query, the sum of its teachers' votes —
//!   never anything per teacher or per row.
//! - Aggregation (on the coordinator): one privacy unit lives in one partition, so it moves
//!   each query's real count by at most 1. Released per query: the GNMax label (N(0, σ²) on
//!   the real and on the fake count, label = the larger) or the noisy real share (N(0, σ²/2)
//!   on the real count). Both are the Gaussian mechanism on the vote margin: RDP α/σ² per
//!   answered query, charged data-independently. The paper's Eq. 2 is not a valid bound
//!   for Gaussian noise and is not used.
//! - Confident GNMax (optional `threshold`): a query is answered only when its largest
//!   count plus N(0, σ₁²) reaches the threshold. The check is the Gaussian mechanism on the
//!   largest count (sensitivity 1) and is charged for every query, as is an answer (it may
//!   pass): under the data-independent charge it filters answers but saves nothing.
//! - Stopping rule: the number of iterations is the largest whose answered queries fit the
//!   job's ε under the ledger's accountant — a data-independent figure fixed before any
//!   vote, and charged in full before the first answer is released.
//! - Queries (public: drawn from the generator): some columns redrawn at random
//!   (exploration); with a target, half of them are the other half with the target changed,
//!   so the teachers say which target value fits a row better.
//! - Student and generator (`model`, `gan`) train on released answers only.
//! - Labels (a departure, `label_share` of the answers; on by default with a target): after
//!   the last iteration, the teachers fit a classifier of the target on their rows and
//!   vote its class probabilities on rows drawn as the output is drawn (classic PATE
//!   labelling). One unit moves one teacher's probability vector, by at most √2 in L2: the
//!   noisy histogram (N(0, σ²) per class) is GNMax's, at the same data-independent cost
//!   per answer. A label model fit to the released shares draws the output rows' target.

pub mod answers;
pub mod encoding;
pub mod gan;
pub mod model;
pub mod params;
pub mod plan;
pub mod sampler;
pub mod task;
pub mod teacher;

pub use params::{PateParams, PateRelease, TeacherModel, TeacherVote};
pub use plan::{PatePlan, check};
pub use sampler::PateSampler;
pub use task::{Question, VoteTask};
