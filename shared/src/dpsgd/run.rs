//! `[generator.<name>.run]`: how a DP-SGD generator trains, one table for every generator
//! the engine trains. Each generator keeps its own defaults (a diffusion model and a
//! language model want different epochs and batches), and a table that names some
//! fields keeps the generator's defaults for the others.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize};

use super::optimizer::{OptimizerSpec, Schedule};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    /// Expected passes over the units; T = epochs / q rounds.
    pub epochs: f64,
    /// Expected units per round q·N̂.
    pub batch_size: f64,
    /// Per-unit L2 clipping norm C.
    pub clip: f64,
    /// Noise multiplier σ; default: calibrated so the job meets its (ε, δ).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_multiplier: Option<f64>,
    /// Noise multiplier of the unit-count release that fixes q (sensitivity 1).
    pub count_noise_multiplier: f64,
    pub optimizer: OptimizerSpec,
    pub schedule: Schedule,
    /// Units per backward pass on a worker (memory only).
    pub micro_batch: usize,
    /// Rounds between coordinator checkpoints.
    pub checkpoint_every: u64,
}

/// The defaults a generator does not change.
impl Default for RunParams {
    fn default() -> Self {
        Self {
            epochs: 8.0,
            batch_size: 256.0,
            clip: 1.0,
            noise_multiplier: None,
            count_noise_multiplier: 20.0,
            optimizer: OptimizerSpec::Adam { lr: 3e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            schedule: Schedule::Cosine,
            micro_batch: 64,
            checkpoint_every: 50,
        }
    }
}

impl RunParams {
    /// Whether `name` is one of the run table's fields (told apart by serde's own
    /// refusal of an unknown one, so the names are declared once, above).
    pub fn has_field(name: &str) -> bool {
        let probe = serde_json::json!({ name: null });
        serde_json::from_value::<RunParams>(probe).is_err_and(|e| !e.to_string().starts_with("unknown field"))
    }
}

/// The parameters of a generator the DP-SGD engine trains: its run.
pub trait DpSgdParams {
    /// Its run's defaults.
    fn run_defaults() -> RunParams;

    /// Its run (`[generator.<name>.run]`).
    fn run(&self) -> &RunParams;
}

/// Reads a run table over the generator's defaults (`deserialize_with` of each
/// generator's `run` field): a field the table names replaces the default, an unknown
/// one is refused.
pub fn over_defaults<'de, G: DpSgdParams, D: Deserializer<'de>>(deserializer: D) -> Result<RunParams, D::Error> {
    let given = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    // TOML has no null: a null here is a float JSON cannot hold (nan, inf), which would
    // otherwise read as an absent σ.
    if let Some((name, _)) = given.iter().find(|(_, v)| v.is_null()) {
        return Err(D::Error::custom(format!("{name} must be a finite number")));
    }
    let mut run = match serde_json::to_value(G::run_defaults()) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => unreachable!("a RunParams serializes to a JSON object"),
    };
    run.extend(given);
    serde_json::from_value(serde_json::Value::Object(run)).map_err(D::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Slow(RunParams);

    impl DpSgdParams for Slow {
        fn run_defaults() -> RunParams {
            RunParams { epochs: 20.0, batch_size: 128.0, ..RunParams::default() }
        }

        fn run(&self) -> &RunParams {
            &self.0
        }
    }

    #[derive(Debug, Deserialize)]
    struct Section {
        #[serde(deserialize_with = "over_defaults::<Slow, _>")]
        run: RunParams,
    }

    /// A table that names some fields keeps the generator's own defaults for the rest,
    /// not the engine's; an unknown or mistyped field is refused by name.
    #[test]
    fn a_partial_table_keeps_the_generators_defaults() {
        let section: Section = toml::from_str("[run]\nepochs = 5\nnoise_multiplier = 1.5").unwrap();
        let expected = RunParams { epochs: 5.0, noise_multiplier: Some(1.5), ..Slow::run_defaults() };
        assert_eq!(section.run, expected);
        assert_eq!(section.run.batch_size, 128.0);
        let unknown = toml::from_str::<Section>("[run]\nepoch = 5").unwrap_err().to_string();
        assert!(unknown.contains("unknown field `epoch`"), "{unknown}");
        let mistyped = toml::from_str::<Section>("[run]\nepochs = \"five\"").unwrap_err().to_string();
        assert!(mistyped.contains("invalid type"), "{mistyped}");
        // A σ JSON cannot hold is refused, not read as absent (calibrated).
        for sigma in ["nan", "inf"] {
            let err = toml::from_str::<Section>(&format!("[run]\nnoise_multiplier = {sigma}")).unwrap_err().to_string();
            assert!(err.contains("noise_multiplier must be a finite number"), "{err}");
        }
    }
}
