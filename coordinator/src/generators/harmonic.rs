//! HARMONIC on the coordinator: DP-2Stage's language model (`super::dp2stage`) trained on
//! examples that prompt each private row with its nearest rows of the public reference set.

use rhosynth_shared::generators::GeneratorName;

use super::dp2stage::{Examples, LanguageModel};

/// HARMONIC's examples: rows after their nearest reference rows.
pub struct PromptedRows;

impl Examples for PromptedRows {
    const GENERATOR: GeneratorName = GeneratorName::Harmonic;
    const PROMPTED: bool = true;
}

pub type Harmonic = LanguageModel<PromptedRows>;
