//! Synthetic-data generators. Each states what it measures and how it is charged.

pub mod marginals;
