//! Databases (`[[tables]]`, `docs/database.md`): AIM over each table's view of the units
//! (`data::database::view`), each run with its share of one zCDP budget, then a synthetic
//! database drawn down the tree of the tables with fresh keys.

pub mod missing;
pub mod params;
pub mod plan;
pub mod rake;
pub mod sampler;

pub use params::DatabaseParams;
pub use plan::{DatabasePlan, check};
pub use sampler::{DatabaseSampler, FittedView, Plans, SyntheticRow, sample_database};
