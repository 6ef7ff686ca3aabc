//! Empirical privacy audit in one run (Steinke, Nasr & Jagielski 2023): canary units
//! designed from the declared domain, each slipped into a job's input with probability ½,
//! a score per canary computed from what the job released, guesses for the highest and
//! lowest scores, and the ε those guesses prove at 95% confidence. A lower bound above the
//! claimed ε means the code around the accountant is wrong (an unclipped unit, noise drawn
//! at the wrong scale, a release that bypassed the ledger).
//!
//! This module holds the parts that need no cluster: the bound, the canaries, the scores
//! and a trained model's losses. `rhosynth_coordinator::audit` runs the job.

pub mod bound;
pub mod canary;
#[cfg(feature = "wire")]
pub mod loss;
pub mod score;
