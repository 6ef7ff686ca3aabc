//! The rhosynth coordinator: owns jobs, has private data split into partitions by privacy
//! unit (by its workers, or itself), hands tasks to workers, adds all noise, writes the privacy ledger and the output.

pub mod audit;
pub mod auth;
pub(crate) mod checkpoint;
pub mod context;
pub mod datasets;
pub mod gather;
pub(crate) mod generators;
pub mod job;
pub(crate) mod run_lease;
pub mod schedule;
pub mod scheduler;
pub mod schema_draft;
pub mod scratch;
pub mod server;
pub mod service;
pub(crate) mod shuffle;
pub mod standalone;
pub mod telemetry;
pub(crate) mod training;
pub mod worker_result;
