//! PATH's private selection, with a bounded sensitivity: the coordinator over-generates
//! candidate histories from the trained model (post-processing), every private unit
//! votes for its `k` nearest candidates under a fixed public featurization, and the
//! coordinator keeps the candidates with the most votes after Gaussian noise. A unit casts
//! k votes of 1 on distinct candidates, so adding or removing it moves the vote vector by
//! √k in L2: the release is the Gaussian mechanism with sensitivity √k, charged with the
//! training run.
//!
//! Featurization (public, fixed, every feature in [0, 1]): per numeric column the mean and
//! the last of the history's values, scaled by the column's declared bounds (½ when it has
//! none), and for the order column the span (last − first) over the declared range instead;
//! per categorical column the share of rows in each category; per column that keeps
//! missing values the share of rows where it is missing; and the history's length over the
//! public row cap. A private history's values are those its tokens decode to (the middle
//! of a value's sub-cell, as a candidate's are), its order column's exact.

use serde::{Deserialize, Serialize};

use super::histories::Histories;
use super::task::SequenceModelSpec;
use crate::data::domain::{Domain, Encoding};

/// A run's selection settings, fixed when it is charged (k fixes the vote release's
/// sensitivity √k).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelectionSpec {
    /// Votes per unit (k).
    pub neighbours: usize,
    /// Candidates drawn per output unit.
    pub candidates: f64,
}

/// A selection round as a worker receives it.
#[derive(Clone, Debug)]
pub struct SelectionTask {
    pub model: SequenceModelSpec,
    /// Candidates' features, one row of [`feature_count`] values each.
    pub candidates: Vec<f32>,
    /// Votes per unit (k).
    pub neighbours: usize,
}

/// Features per history of a model's domain.
pub fn feature_count(model: &SequenceModelSpec) -> usize {
    let per_column = |c: &crate::data::domain::ColumnDomain| {
        let values = match &c.encoding {
            Encoding::Numeric { .. } => 2,
            Encoding::Categorical { categories, other } => categories.len() + usize::from(*other),
        };
        values + usize::from(c.missing)
    };
    1 + model.domain.columns.iter().map(per_column).sum::<usize>()
}

/// A history's features (see the module's documentation).
pub fn features(model: &SequenceModelSpec, rows: &[Vec<Option<f64>>]) -> Vec<f32> {
    let domain: &Domain = &model.domain;
    let order = model.layout.order_column();
    let n = rows.len().max(1) as f64;
    let mut out = Vec::with_capacity(feature_count(model));
    for (c, column) in domain.columns.iter().enumerate() {
        let values: Vec<f64> = rows.iter().filter_map(|r| r[c]).collect();
        match &column.encoding {
            Encoding::Numeric { min, max, .. } => {
                let width = (max - min).max(f64::MIN_POSITIVE);
                let scaled = |v: f64| ((v - min) / width).clamp(0.0, 1.0);
                let (first, last) = (values.first().copied(), values.last().copied());
                let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
                if Some(c) == order {
                    out.push(first.zip(last).map_or(0.0, |(a, b)| ((b - a) / width).clamp(0.0, 1.0)) as f32);
                } else {
                    out.push(mean.map_or(0.5, scaled) as f32);
                }
                out.push(last.map_or(0.5, scaled) as f32);
            }
            Encoding::Categorical { categories, other } => {
                let mut shares = vec![0f32; categories.len() + usize::from(*other)];
                for &code in &values {
                    if let Some(s) = shares.get_mut(code as usize) {
                        *s += 1.0;
                    }
                }
                out.extend(shares.iter().map(|s| s / n as f32));
            }
        }
        if column.missing {
            out.push(((rows.len() - values.len()) as f64 / n) as f32);
        }
    }
    out.push((rows.len() as f64 / model.layout.max_rows.max(1) as f64).min(1.0) as f32);
    out
}

impl SelectionTask {
    pub fn candidate_count(&self) -> usize {
        self.candidates.len() / feature_count(&self.model).max(1)
    }

    /// Votes a unit casts: k, or every candidate when there are fewer.
    pub fn votes_per_unit(&self) -> usize {
        self.neighbours.min(self.candidate_count())
    }

    /// Every unit's votes for its k nearest candidates (squared Euclidean distance; ties
    /// to the lower index), summed; and the number of units that voted.
    pub fn votes(&self, histories: &Histories) -> (Vec<f64>, u64) {
        let width = feature_count(&self.model);
        let k = self.votes_per_unit();
        let mut votes = vec![0f64; self.candidate_count()];
        let mut nearest: Vec<(f32, usize)> = Vec::with_capacity(k + 1);
        for history in &histories.units {
            let own = features(&self.model, &history.values(&self.model.layout));
            nearest.clear();
            for (i, candidate) in self.candidates.chunks_exact(width).enumerate() {
                let d: f32 = own.iter().zip(candidate).map(|(a, b)| (a - b) * (a - b)).sum();
                if nearest.len() < k || d < nearest[k - 1].0 {
                    let at = nearest.partition_point(|&(e, _)| e <= d);
                    nearest.insert(at, (d, i));
                    nearest.truncate(k);
                }
            }
            for &(_, i) in &nearest {
                votes[i] += 1.0;
            }
        }
        (votes, histories.units.len() as u64)
    }
}

/// Coordinator-side check of a worker's votes: one count per candidate, each a whole
/// number between 0 and the units that voted, summing to k votes per unit.
pub fn check_votes(votes: &[f64], units: u64, candidates: usize, per_unit: usize) -> Result<(), String> {
    if votes.len() != candidates {
        return Err(format!("expected {candidates} vote counts, got {}", votes.len()));
    }
    if votes.iter().any(|v| !(v.fract() == 0.0 && *v >= 0.0 && *v <= units as f64)) {
        return Err("a vote count is not a whole number between 0 and the units that voted".into());
    }
    let total: f64 = votes.iter().sum();
    if total != (units as usize * per_unit) as f64 {
        return Err(format!("{total} votes from {units} units of {per_unit} votes each"));
    }
    Ok(())
}

/// The wire form (`SelectionVotes` in `rhosynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::SelectionVotes;

    use super::{SelectionTask, feature_count};
    use crate::wire::{WireError, from_json, to_json};

    impl From<&SelectionTask> for SelectionVotes {
        fn from(task: &SelectionTask) -> Self {
            Self {
                model_json: to_json(&task.model),
                candidates: task.candidates.clone(),
                neighbours: task.neighbours as u32,
            }
        }
    }

    impl TryFrom<&SelectionVotes> for SelectionTask {
        type Error = WireError;

        fn try_from(wire: &SelectionVotes) -> Result<Self, WireError> {
            let model = from_json("sequence model", &wire.model_json)?;
            let width = feature_count(&model);
            if wire.candidates.is_empty() || !wire.candidates.len().is_multiple_of(width) {
                return Err(WireError::new(format!("candidate features are not whole rows of {width}")));
            }
            if wire.neighbours == 0 || wire.candidates.iter().any(|v| !v.is_finite()) {
                return Err(WireError::new("a selection needs k ≥ 1 and finite features"));
            }
            Ok(Self { model, candidates: wire.candidates.clone(), neighbours: wire.neighbours as usize })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::accountant::AccountingOptions;
    use crate::generators::sequence::SequencePlan;
    use crate::spec::JobSpec;

    fn model() -> SequenceModelSpec {
        let demo = include_str!("../../../../examples/icu-sequence.toml");
        let spec = JobSpec::parse(demo, "icu-sequence").unwrap();
        SequencePlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap().model
    }

    /// A history of `n` rows, every value at `level` of its column's range (categories:
    /// the first), times an hour apart.
    fn history(model: &SequenceModelSpec, n: usize, level: f64) -> Vec<Vec<Option<f64>>> {
        let order = model.layout.order_column().unwrap();
        (0..n)
            .map(|r| {
                model
                    .domain
                    .columns
                    .iter()
                    .enumerate()
                    .map(|(c, column)| match &column.encoding {
                        Encoding::Numeric { min, .. } if c == order => Some(min + 3600.0 * r as f64),
                        Encoding::Numeric { min, max, .. } => Some(min + level * (max - min)),
                        Encoding::Categorical { .. } => Some(0.0),
                    })
                    .collect()
            })
            .collect()
    }

    /// Every unit casts exactly k votes, on its k nearest candidates; the features are
    /// in [0, 1] and as many as declared.
    #[test]
    fn each_unit_votes_for_its_k_nearest_candidates() {
        let model = model();
        let levels = [0.1, 0.3, 0.5, 0.7, 0.9];
        let candidates: Vec<f32> = levels.iter().flat_map(|&l| features(&model, &history(&model, 10, l))).collect();
        assert_eq!(candidates.len(), levels.len() * feature_count(&model));
        assert!(candidates.iter().all(|v| (0.0..=1.0).contains(v)));
        let task = SelectionTask { model: model.clone(), candidates, neighbours: 2 };
        let units = vec![
            ("a".to_string(), history(&model, 10, 0.12)),
            ("b".to_string(), history(&model, 10, 0.88)),
            ("c".to_string(), history(&model, 10, 0.52)),
        ];
        let rows = units.into_iter().flat_map(|(id, rows)| rows.into_iter().map(move |row| (id.clone(), row)));
        let (votes, voted) = task.votes(&Histories::from_rows(rows, &task.model.layout));
        assert_eq!(voted, 3);
        // a: 0.1 and 0.3; b: 0.9 and 0.7; c: 0.5, then 0.7 (nearer than 0.3).
        assert_eq!(votes, vec![1.0, 1.0, 1.0, 2.0, 1.0]);
        check_votes(&votes, voted, 5, 2).unwrap();
    }

    /// What a worker could return to exceed √k: refused.
    #[test]
    fn votes_beyond_k_per_unit_are_refused() {
        let good = [1.0, 1.0, 2.0, 0.0];
        check_votes(&good, 2, 4, 2).unwrap();
        for (votes, units) in [
            (vec![1.0, 1.0, 3.0, 0.0], 2),  // more than one vote per unit on a candidate
            (vec![1.0, 1.0, 2.0, 1.0], 2),  // more than k per unit
            (vec![1.5, 0.5, 2.0, 0.0], 2),  // not whole votes
            (vec![-1.0, 3.0, 2.0, 0.0], 3), // negative
            (vec![1.0, 1.0, 2.0], 2),       // wrong length
        ] {
            assert!(check_votes(&votes, units, 4, 2).is_err(), "{votes:?}");
        }
    }
}
