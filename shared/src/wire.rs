//! Tasks on the wire: each task kind is a typed message of `rhosynth.proto`. A configuration
//! fixed for the whole job (a domain, an encoding, a model's architecture) travels in it as
//! JSON of the shared type that defines it, so it has one definition.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A task that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("task: {0}")]
pub struct WireError(String);

impl WireError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A configuration as the JSON a task carries.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("task configurations serialise")
}

/// Inverse of [`to_json`]; `what` names the field in errors.
pub fn from_json<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, WireError> {
    serde_json::from_str(json).map_err(|e| WireError(format!("{what}: {e}")))
}

/// A 32-byte seed.
pub fn seed(bytes: &[u8]) -> Result<[u8; 32], WireError> {
    bytes.try_into().map_err(|_| WireError(format!("a seed has 32 bytes, not {}", bytes.len())))
}

#[cfg(test)]
mod tests {
    use rhosynth_proto::{GradientSum, TeacherVotes};

    use super::*;
    use crate::accounting::accountant::AccountingOptions;
    use crate::data::domain::Domain;
    use crate::dpsgd::RoundSettings;
    use crate::generators::GeneratorName;
    use crate::generators::findiff::{FinDiffPlan, FinDiffRound};
    use crate::generators::marginals::{MarginalsPlan, MarginalsTask};
    use crate::generators::pate::{PatePlan, Question, VoteTask};
    use crate::generators::sequence::{SequenceModelSpec, SequencePlan};
    use crate::spec::JobSpec;

    use crate::testing::demo_job as job;

    #[test]
    fn configurations_round_trip_and_malformed_ones_are_refused() {
        let json = to_json(&vec![1.5, -2.0]);
        assert_eq!(from_json::<Vec<f64>>("weights", &json).unwrap(), vec![1.5, -2.0]);
        assert!(from_json::<Vec<f64>>("weights", &json[1..]).unwrap_err().to_string().contains("weights"));
        assert_eq!(seed(&[7; 32]).unwrap(), [7; 32]);
        assert!(seed(&[7; 31]).is_err());
    }

    #[test]
    fn count_tables_round_trip_and_refuse_columns_outside_the_domain_or_too_many_cells() {
        let spec = JobSpec::parse(crate::testing::DEMO, "demo.toml").unwrap();
        let task = MarginalsPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap().task;
        let wire = rhosynth_proto::CountTables::from(&task);
        assert_eq!(MarginalsTask::try_from(&wire).unwrap(), task);
        let columns = task.domain.columns.len() as u32;
        let mut outside = wire.clone();
        outside.tables[0].columns = vec![columns];
        assert!(MarginalsTask::try_from(&outside).is_err());
        let mut empty = wire.clone();
        empty.tables[0].columns.clear();
        assert!(MarginalsTask::try_from(&empty).is_err());
        // Every column in one table: far more cells than one result may hold.
        let mut huge = wire;
        huge.tables[0].columns = (0..columns).collect();
        assert!(MarginalsTask::try_from(&huge).unwrap_err().to_string().contains("cells"));
        // A flattened history: its layout travels, and its tables may name its variables.
        let spec = job("[generator]\nname = \"marginals\"\n[generator.marginals]\nhistory_rows = 4\n\
                        static_columns = [\"rhythm\"]");
        let task = MarginalsPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap().task;
        let wire = rhosynth_proto::CountTables::from(&task);
        assert_eq!(MarginalsTask::try_from(&wire).unwrap(), task);
        let variables = task.sizes().len() as u32;
        assert!(variables > columns && task.tables.iter().flatten().any(|&v| v as u32 >= columns));
        let mut outside = wire.clone();
        outside.tables[0].columns = vec![variables];
        assert!(MarginalsTask::try_from(&outside).is_err());
        let mut misfit = wire.clone();
        misfit.history_json = misfit.history_json.replace("\"statics\":[", "\"statics\":[0,");
        assert!(MarginalsTask::try_from(&misfit).unwrap_err().to_string().contains("layout"));
        // The gap's domain is derived from the order column and gap_bins, never trusted.
        let mut forged = wire;
        assert!(forged.history_json.contains("\"gap_bins\":20"));
        forged.history_json = forged.history_json.replace("\"gap_bins\":20", "\"gap_bins\":21");
        assert!(MarginalsTask::try_from(&forged).unwrap_err().to_string().contains("layout"));
    }

    /// A database view travels with its layout; its domain and per-unit bound are
    /// derived from the layout on arrival, so a view sent with another domain, a smaller
    /// bound or a parent after its child is refused.
    #[test]
    fn count_tables_over_a_database_view_derive_their_domain_and_bound() {
        use crate::data::database::{Database, DatabaseView, Layout, View};

        let dir = tempfile::tempdir().unwrap();
        let spec = crate::testing::database_spec(dir.path(), (3, 10), "");
        let layout = Layout::of(&Database::of_spec(&spec));
        let task = MarginalsTask::over_view(DatabaseView { layout, view: View { table: 2 } }, vec![vec![0, 4]]);
        assert_eq!(task.max_rows_per_unit, 30);
        let wire = rhosynth_proto::CountTables::from(&task);
        assert_eq!(MarginalsTask::try_from(&wire).unwrap(), task);
        let refused = |wire: &rhosynth_proto::CountTables| MarginalsTask::try_from(wire).unwrap_err().to_string();
        let mut smaller = wire.clone();
        smaller.max_rows_per_unit = 1;
        assert!(refused(&smaller).contains("database view"));
        let mut other = wire.clone();
        other.domain_json = to_json(&Domain { columns: task.domain.columns[1..].to_vec() });
        assert!(refused(&other).contains("database view"));
        let mut cycle = wire.clone();
        cycle.database_json = cycle.database_json.replacen("\"parent\":0", "\"parent\":2", 1);
        assert_ne!(cycle.database_json, wire.database_json);
        assert!(refused(&cycle).contains("database view"));
        let mut flat = wire;
        flat.row_level = true;
        assert!(refused(&flat).contains("database view"));
    }

    #[test]
    fn gradient_sums_round_trip_and_refuse_bad_rates_clips_and_seeds() {
        let spec = job("[generator]\nname = \"findiff\"");
        let plan = FinDiffPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
        let settings = RoundSettings::new(3, 0.25, 1.5, [4; 32], 64).unwrap();
        let round = FinDiffRound { model: plan.model, timestep_exponent: 0.5 };
        let wire = GeneratorName::Findiff.gradient_sum(&settings, to_json(&round), vec![1.0, -2.0]);
        assert_eq!(RoundSettings::try_from(&wire).unwrap(), settings);
        assert_eq!(wire.generator, "findiff");
        let back: FinDiffRound = from_json("model", &wire.model_json).unwrap();
        assert_eq!((back.model.domain, back.timestep_exponent), (round.model.domain, 0.5));
        let spec = job("[generator]\nname = \"sequence\"\n[generator.sequence]\nstatic_columns = [\"rhythm\"]");
        let plan = SequencePlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
        let sequence = GeneratorName::Sequence.gradient_sum(&settings, to_json(&plan.model), vec![0.5]);
        assert_eq!(from_json::<SequenceModelSpec>("model", &sequence.model_json).unwrap(), plan.model);
        let spoiled = &sequence.model_json[..sequence.model_json.len() / 2];
        assert!(from_json::<SequenceModelSpec>("model", spoiled).is_err());
        let bad: [fn(&mut GradientSum); 5] = [
            |w| w.rate = 0.0,
            |w| w.rate = 1.5,
            |w| w.rate = f64::NAN,
            |w| w.clip = f64::INFINITY,
            |w| w.seed.truncate(31),
        ];
        for (i, spoil) in bad.iter().enumerate() {
            let mut spoiled = wire.clone();
            spoil(&mut spoiled);
            assert!(RoundSettings::try_from(&spoiled).is_err(), "case {i}");
        }
    }

    #[test]
    fn teacher_votes_round_trip_and_carry_exactly_the_rows_they_name() {
        let mut spec = job("[generator]\nname = \"pate\"\n[generator.pate]\nsigma = 500.0");
        spec.schema.target = Some("rhythm".into());
        let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
        let width = plan.encoding.width;
        let task = VoteTask {
            encoding: plan.encoding.clone(),
            teacher: plan.teacher_config(),
            seed: [2; 32],
            question: Question::Realness,
            fake_rows: 3,
            queries: 2,
        };
        let wire = task.task(vec![0.5; 5 * width]);
        let back = VoteTask::try_from(&wire).unwrap();
        assert_eq!((back.fake_rows, back.queries, back.seed, back.question), (3, 2, [2; 32], Question::Realness));
        assert_eq!(back.teacher, task.teacher);
        let bad: [fn(&mut TeacherVotes); 5] = [
            |w| w.question = rhosynth_proto::Question::Unspecified.into(),
            |w| w.question = rhosynth_proto::Question::Target.into(),
            |w| w.rows.truncate(1),
            |w| w.queries = u64::MAX,
            |w| w.seed.clear(),
        ];
        for (i, spoil) in bad.iter().enumerate() {
            let mut spoiled = wire.clone();
            spoil(&mut spoiled);
            assert!(VoteTask::try_from(&spoiled).is_err(), "case {i}");
        }
    }
}
