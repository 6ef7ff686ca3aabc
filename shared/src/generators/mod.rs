//! Synthetic-data generators. Each states what it measures and how it is charged.

pub mod findiff;
pub mod marginals;
pub mod pate;
