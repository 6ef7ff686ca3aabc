//! Databases (`[[tables]]`): a synthetic database drawn down the tree of its tables from
//! one model per table's view. Being built (#40, `docs/database.md`): the tree sampler is
//! here; the plan, the charge and the job are not yet, so no spec names this generator.

pub mod sampler;

pub use sampler::{FittedView, SyntheticRow, sample_database};
