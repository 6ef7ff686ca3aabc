//! HARMONIC (Wang et al. 2024) with a formal guarantee: a pretrained language model
//! fine-tuned on instructions "here are k similar records, write one more", on the engine
//! of DP-2Stage (`super::dp2stage`: the same text model, DP-SGD run and constrained
//! decoding).
//!
//! The seed builds each example from a private row's k nearest *private* rows. That has no
//! bounded sensitivity: one unit is a neighbour in the prompts of arbitrarily many other
//! units' examples (a hub row can be among the nearest of every row), and adding it also
//! changes which rows are the others' nearest; so one unit changes an unbounded number of
//! examples, and no per-unit clipping bounds its effect on a gradient sum.
//!
//! Here the k neighbours come from a *reference set* that is public or already released
//! with DP and charged (e.g. a marginals job's output, named in the spec), and the answer
//! is one private row. An example then depends on exactly one private row (its answer,
//! and the neighbours that row selects among public rows), so one unit still changes only
//! its own examples, and the guarantee is ordinary DP-SGD's. The reference set is also
//! what stage 1 trains on (each reference row after its nearest other reference rows):
//! post-processing of public data, free. Sampling prompts the model with the nearest
//! reference rows of a uniformly drawn reference row.
//!
//! The seed's instruction words are left out: the prompt is the k rows as text, then the
//! answer; a fine-tuned model learns the layout, and words would only cost tokens.
//!
//! The folder holds what HARMONIC adds to DP-2Stage's: its name in the generator list and
//! its tests; the reference set's prompts (`dp2stage::prompting`) serve DP-2Stage's stage 1
//! too.

pub use super::dp2stage::{LanguageModelParams, check};

#[cfg(test)]
mod tests;
