//! `[generator]`: which generator, and at most its own section of parameters (each
//! generator's parameters live in its folder, `params.rs`). The name, the spec and the
//! section are written once for every generator, from the generator list.

use serde::{Deserialize, Serialize};

use super::params::{GeneratorParams, PublicInputs};
use crate::dpsgd::run::{DpSgdParams, RunParams};

macro_rules! generator_section {
    ($($name:ident: $variant:ident($params:ident) by $side:ident $(, $dpsgd:ident)?;)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum GeneratorName {
            $($variant,)*
        }

        impl GeneratorName {
            /// Every generator, in the list's order.
            pub const ALL: &[GeneratorName] = &[$(GeneratorName::$variant),*];

            /// The name as `[generator] name` spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(GeneratorName::$variant => stringify!($name),)*
                }
            }

            /// Whether the DP-SGD engine trains the generator's model.
            pub fn trained_by_dpsgd(self) -> bool {
                match self {
                    $(GeneratorName::$variant => crate::if_dpsgd!($($dpsgd)? { true } else { false }),)*
                }
            }

        }

        /// The generator and its parameters. In TOML, `[generator] name = "…"` and at most
        /// the named generator's own section (`[generator.pate]`): a section of another
        /// generator is refused, never silently ignored.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(try_from = "GeneratorSection", into = "GeneratorSection")]
        pub enum GeneratorSpec {
            $($variant(super::$name::$params),)*
        }

        impl GeneratorSpec {
            pub fn name(&self) -> GeneratorName {
                match self {
                    $(GeneratorSpec::$variant(_) => GeneratorName::$variant,)*
                }
            }

            /// The parameters, as every generator's answer.
            pub fn params(&self) -> &dyn GeneratorParams {
                match self {
                    $(GeneratorSpec::$variant(p) => p,)*
                }
            }

            fn params_mut(&mut self) -> &mut dyn GeneratorParams {
                match self {
                    $(GeneratorSpec::$variant(p) => p,)*
                }
            }

            /// The run of a generator the DP-SGD engine trains.
            pub fn run(&self) -> Option<&RunParams> {
                match self {
                    $(GeneratorSpec::$variant(_p) => crate::if_dpsgd!($($dpsgd)? { Some(DpSgdParams::run(_p)) } else { None }),)*
                }
            }
        }

        /// `[generator]` as written.
        #[derive(Clone, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        struct GeneratorSection {
            name: GeneratorName,
            $(
                #[serde(default, skip_serializing_if = "Option::is_none")]
                $name: Option<super::$name::$params>,
            )*
        }

        impl TryFrom<GeneratorSection> for GeneratorSpec {
            type Error = String;

            fn try_from(s: GeneratorSection) -> Result<Self, String> {
                let given = [$((GeneratorName::$variant, s.$name.is_some())),*];
                if let Some((other, _)) = given.iter().find(|(n, present)| *present && *n != s.name) {
                    return Err(format!(
                        "[generator.{}] belongs to another generator; this job's generator is \"{}\"",
                        other.as_str(),
                        s.name.as_str()
                    ));
                }
                Ok(match s.name {
                    $(GeneratorName::$variant => GeneratorSpec::$variant(s.$name.unwrap_or_default()),)*
                })
            }
        }

        impl From<GeneratorSpec> for GeneratorSection {
            fn from(spec: GeneratorSpec) -> Self {
                let mut section = GeneratorSection { name: spec.name(), $($name: None),* };
                match spec {
                    $(GeneratorSpec::$variant(p) => section.$name = Some(p),)*
                }
                section
            }
        }
    };
}

crate::generator_list!(generator_section);

impl std::str::FromStr for GeneratorName {
    type Err = String;

    /// A name as `[generator] name` spells it.
    fn from_str(s: &str) -> Result<Self, String> {
        let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s);
        Self::deserialize(name).map_err(|e| e.to_string())
    }
}

impl GeneratorSpec {
    /// The reference set the generator reads when it plans (HARMONIC's prompts,
    /// DP-2Stage's and the sequence model's stage 1), if the spec names one.
    pub fn reference(&self) -> Option<&str> {
        self.params().public_inputs().reference.map(String::as_str)
    }

    /// The pretrained model's checkpoint the generator reads, if it reads one.
    pub fn checkpoint(&self) -> Option<&str> {
        self.params().public_inputs().checkpoint.map(String::as_str)
    }

    /// The public inputs the spec names, to bind declared ids to their URLs.
    pub fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        self.params_mut().public_inputs_mut()
    }

    /// Whether the generator draws whole histories (its output is counted in units), not
    /// rows.
    pub fn draws_histories(&self) -> bool {
        self.params().draws_histories()
    }

    /// Checks the generator's parameters where that needs no schema.
    pub fn validate(&self) -> Result<(), String> {
        self.params().validate()
    }

    /// Bins of numeric columns that declare none (the public domain's discretisation).
    pub fn default_bins(&self) -> u32 {
        self.params().default_bins()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name a spec writes is the list's, and every section parses alone.
    #[test]
    fn every_listed_name_parses_as_its_own() {
        for &name in GeneratorName::ALL {
            assert_eq!(name.as_str().parse::<GeneratorName>(), Ok(name));
            let section = format!("name = \"{0}\"\n[{0}]\n", name.as_str());
            let spec: GeneratorSpec = toml::from_str(&section).unwrap();
            assert_eq!(spec.name(), name);
            assert_eq!(spec.run().is_some(), name.trained_by_dpsgd());
        }
    }
}
