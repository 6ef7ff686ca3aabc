//! The models of the generators the DP-SGD engine trains, by name: a round's task names
//! its generator, and a worker or an audit picks the model from it (the generator list's
//! `dpsgd` entries).

use crate::dpsgd::trainable::{Trains, WithTrainable};

use super::GeneratorName;

macro_rules! trained_models {
    ($($name:ident: $variant:ident($params:ident) by $side:ident $(, $dpsgd:ident)?;)*) => {
        impl GeneratorName {
            /// `work` done with the model the generator's DP-SGD rounds train; none for a
            /// generator the engine does not train.
            pub fn with_trainable<W: WithTrainable>(self, work: W) -> Option<W::Output> {
                match self {
                    $(GeneratorName::$variant => crate::if_dpsgd!($($dpsgd)? {
                        Some(work.with::<<super::$name::$params as Trains>::Model>())
                    } else {
                        { drop(work); None }
                    }),)*
                }
            }
        }
    };
}

crate::generator_list!(trained_models);

/// A DP-SGD round as a task (`GradientSum`), which names its generator.
#[cfg(feature = "wire")]
impl GeneratorName {
    /// The round of this generator's model: the round's settings, the model as the
    /// generator's parameters name it (`Trains::Model`, as JSON), and its weights.
    pub fn gradient_sum(
        self,
        settings: &crate::dpsgd::RoundSettings,
        model_json: String,
        weights: Vec<f32>,
    ) -> rhosynth_proto::GradientSum {
        rhosynth_proto::GradientSum {
            round: settings.round,
            rate: settings.rate,
            clip: settings.clip,
            seed: settings.seed.to_vec(),
            micro_batch: u32::try_from(settings.micro_batch).unwrap_or(u32::MAX),
            generator: self.as_str().to_string(),
            model_json,
            weights,
        }
    }
}
