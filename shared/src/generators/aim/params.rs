//! `[generator.aim]`.

use serde::{Deserialize, Serialize};

use crate::generators::params::{DEFAULT_BINS, GeneratorParams, PublicInputs};

/// AIM's workload: a rule over the declared columns, or the column sets themselves.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Workload {
    Rule(WorkloadRule),
    Sets(Vec<Vec<String>>),
}

impl<'de> Deserialize<'de> for Workload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Rule(String),
            Sets(Vec<Vec<String>>),
        }
        match Written::deserialize(deserializer) {
            Ok(Written::Sets(sets)) => Ok(Workload::Sets(sets)),
            Ok(Written::Rule(rule)) => {
                let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(&rule);
                WorkloadRule::deserialize(name).map(Workload::Rule).map_err(|_| {
                    serde::de::Error::custom(format!(
                        "workload \"{rule}\": \"auto\", \"all-pairs\", \"all-triples\" or a list of column sets"
                    ))
                })
            }
            Err(_) => Err(serde::de::Error::custom(
                "workload: \"auto\", \"all-pairs\", \"all-triples\" or a list of column sets, e.g. [[\"age\", \"sex\"]]",
            )),
        }
    }
}

impl Default for Workload {
    fn default() -> Self {
        Workload::Rule(WorkloadRule::Auto)
    }
}

/// A workload from the schema alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadRule {
    /// Every triple while the candidate tables fit AIM's cell budget; past it every pair,
    /// then the triples of smallest tables first while they fit.
    Auto,
    AllPairs,
    AllTriples,
}

/// Parameters of the AIM generator (adaptive marginals with graphical-model inference).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AimParams {
    /// Rows a unit may contribute; a unit with more is subsampled inside its worker.
    pub max_rows_per_unit: u32,
    /// The marginals the output should preserve: `"auto"` (the default), `"all-pairs"`,
    /// `"all-triples"`, or column sets; every subset of a set is a candidate measurement.
    pub workload: Workload,
    /// Selection rounds T at the start (annealing may end the run sooner); default 16·d.
    pub rounds: Option<u32>,
    /// Share of each round's budget spent on selection (the rest on measurement). AIM's
    /// 0.1: the paper's α = 0.9 is the measurement's share.
    pub selection_share: f64,
    /// The most cells the model's cliques may hold together once the budget is spent; a
    /// candidate is eligible while the model with it stays within the spent share of it.
    pub max_model_cells: f64,
    /// Mirror-descent steps of each round's fit (the last fit takes ten times as many).
    pub fit_iterations: u32,
    /// Bins for numeric columns without `bins`.
    pub default_bins: u32,
    /// Share of ρ spent, before the adaptive rounds, on measuring every pair of the
    /// schema's target with another column (the downstream use the spec declares).
    /// Default: 0.2 with a target, else 0.
    pub target_share: Option<f64>,
}

impl Default for AimParams {
    fn default() -> Self {
        Self {
            max_rows_per_unit: 1,
            workload: Workload::default(),
            rounds: None,
            selection_share: 0.1,
            max_model_cells: 1e6,
            fit_iterations: 100,
            default_bins: DEFAULT_BINS,
            target_share: None,
        }
    }
}

impl GeneratorParams for AimParams {
    fn validate(&self) -> Result<(), String> {
        let valid = self.max_rows_per_unit > 0
            && self.default_bins >= 2
            && self.selection_share > 0.0
            && self.selection_share < 1.0
            && (1.0..=1e7).contains(&self.max_model_cells)
            && (1..=10_000).contains(&self.fit_iterations)
            && self.rounds.is_none_or(|t| (1..=10_000).contains(&t))
            && self.target_share.is_none_or(|s| (0.0..=0.5).contains(&s));
        if valid {
            return Ok(());
        }
        Err("[generator.aim] needs max_rows_per_unit ≥ 1, default_bins ≥ 2, 0 < selection_share < 1, \
             1 ≤ max_model_cells ≤ 10⁷, 1 ≤ fit_iterations ≤ 10⁴, 1 ≤ rounds ≤ 10⁴ and 0 ≤ target_share ≤ 0.5"
            .into())
    }

    fn default_bins(&self) -> u32 {
        self.default_bins
    }

    fn draws_histories(&self) -> bool {
        false
    }

    fn public_inputs(&self) -> PublicInputs<&String> {
        PublicInputs::none()
    }

    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String> {
        PublicInputs::none()
    }
}
