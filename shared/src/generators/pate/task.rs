//! The worker's side: a vote round (each partition's teacher fit on its rows, voting on
//! generated queries), its wire form, and the coordinator's check of the summed votes.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use sha2::{Digest, Sha256};

use super::encoding::PateEncoding;
use super::teacher::{Features, TargetModel, Teacher, TeacherConfig};
use crate::data::examples::Examples;
use crate::generators::pate::TeacherVote;

/// What the teachers are asked about the query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Question {
    /// Is the row real or generated (one vote in [0, 1] per query)?
    Realness,
    /// Which target value goes with the rest of the row (a probability per target value)?
    Target,
}

/// One vote round as a worker receives it (the generated rows travel beside it:
/// `fake_rows` rows for the teachers to train against, then `queries` rows to vote on).
#[derive(Clone, Debug)]
pub struct VoteTask {
    pub encoding: PateEncoding,
    pub teacher: TeacherConfig,
    /// Keys which generated rows each teacher trains against (not private).
    pub seed: [u8; 32],
    pub question: Question,
    /// Generated rows to train against (0 for target questions).
    pub fake_rows: usize,
    pub queries: usize,
}

impl VoteTask {
    /// The teachers' real rows: a partition's rows, all of them (a unit lives in one
    /// teacher, so its row count does not change the sensitivity).
    pub async fn load_examples(&self, urls: &[String]) -> Result<Examples, crate::data::DataError> {
        let encoding = &self.encoding;
        Examples::load(urls, &encoding.domain, u32::MAX, encoding.width, |batch, row, out| {
            encoding.encode_row(batch, row, out)
        })
        .await
    }

    /// Numbers a teacher returns per query: 1 for realness, one per target value.
    pub fn votes_per_query(&self) -> usize {
        match self.question {
            Question::Realness => 1,
            Question::Target => self.encoding.target_classes().unwrap_or(0),
        }
    }

    /// Whether each teacher's votes are whole numbers (hard realness votes).
    pub fn whole_votes(&self) -> bool {
        self.question == Question::Realness && self.teacher.vote != TeacherVote::Probability
    }

    /// The teacher of partition `url` fit on `real` and its votes on the queries
    /// (`votes_per_query` each, each in [0, 1]). Deterministic in (task, url, rows).
    pub fn teacher_votes(&self, url: &str, real: &Examples, generated: &[f32]) -> Result<Vec<f64>, String> {
        match self.question {
            Question::Realness => self.realness_votes(url, real, generated),
            Question::Target => self.target_votes(real, generated),
        }
    }

    /// A target classifier fit on the partition's rows; its class probabilities per query.
    fn target_votes(&self, real: &Examples, queries: &[f32]) -> Result<Vec<f64>, String> {
        let w = self.encoding.width;
        let classes = self.encoding.target_classes().ok_or("a target question needs a categorical target")?;
        if queries.len() != self.queries * w {
            return Err(format!("expected {} query features, got {}", self.queries * w, queries.len()));
        }
        let mut labels = vec![0.0; real.x.len() / w * classes];
        for (x, l) in real.x.chunks(w).zip(labels.chunks_mut(classes)) {
            l[self.encoding.target_class(x).unwrap_or_default()] = 1.0;
        }
        let model = TargetModel::fit(&self.encoding, &self.teacher, &real.x, &labels)
            .ok_or("a target question needs a categorical target")?;
        Ok(model.probabilities(queries))
    }

    fn realness_votes(&self, url: &str, real: &Examples, generated: &[f32]) -> Result<Vec<f64>, String> {
        let w = self.encoding.width;
        if generated.len() != (self.fake_rows + self.queries) * w {
            return Err(format!(
                "expected {} generated features, got {}",
                (self.fake_rows + self.queries) * w,
                generated.len()
            ));
        }
        let (pool, queries) = generated.split_at(self.fake_rows * w);
        let n_real = real.x.len() / w;
        // As many generated rows as real ones (the pool permitting), drawn by a generator
        // keyed by the round and the partition: the same on any worker.
        let mut hasher = Sha256::new();
        hasher.update(self.seed);
        hasher.update(url.as_bytes());
        let mut rng = ChaCha8Rng::from_seed(hasher.finalize().into());
        let mut order: Vec<usize> = (0..self.fake_rows).collect();
        let m = n_real.min(self.fake_rows);
        for i in 0..m {
            let j = rng.random_range(i..self.fake_rows);
            order.swap(i, j);
        }
        let mut fake: Vec<f32> = order[..m].iter().flat_map(|&r| pool[r * w..(r + 1) * w].iter().copied()).collect();
        if let Some(slot) = self.encoding.target_slot().filter(|_| self.teacher.target_interactions) {
            // The partition's own rows with their target values shuffled among them are
            // fakes too: a steady lesson in which target value goes with which row, not
            // relative to the moving generator.
            let mut targets: Vec<usize> = (0..n_real).collect();
            for i in (1..n_real).rev() {
                targets.swap(i, rng.random_range(0..=i));
            }
            for (i, &j) in targets.iter().enumerate() {
                let mut row = real.x[i * w..(i + 1) * w].to_vec();
                row[slot.clone()].copy_from_slice(&real.x[j * w + slot.start..j * w + slot.end]);
                fake.extend(row);
            }
        }
        let features = Features::new(&self.encoding, &self.teacher);
        let teacher = Teacher::fit(features, &self.teacher, &real.x, &fake, w, &mut rng);
        Ok(teacher.votes(queries, w, self.teacher.vote))
    }
}
/// The round as `TeacherVotes` (`rhosynth.proto`).
#[cfg(feature = "wire")]
mod wire {
    use rhosynth_proto::{MAX_RESULT_VALUES, TeacherVotes};

    use super::{PateEncoding, Question, VoteTask};
    use crate::wire::{WireError, from_json, seed, to_json};

    impl VoteTask {
        /// The round as a task, with the generated rows' features (`fake_rows`, then the
        /// queries).
        pub fn task(&self, rows: Vec<f32>) -> TeacherVotes {
            let question = match self.question {
                Question::Realness => rhosynth_proto::Question::Realness,
                Question::Target => rhosynth_proto::Question::Target,
            };
            TeacherVotes {
                encoding_json: to_json(&self.encoding),
                teacher_json: to_json(&self.teacher),
                seed: self.seed.to_vec(),
                question: question.into(),
                fake_rows: self.fake_rows as u64,
                queries: self.queries as u64,
                rows,
            }
        }
    }

    impl TryFrom<&TeacherVotes> for VoteTask {
        type Error = WireError;

        fn try_from(wire: &TeacherVotes) -> Result<Self, WireError> {
            let question = match wire.question() {
                rhosynth_proto::Question::Realness => Question::Realness,
                rhosynth_proto::Question::Target => Question::Target,
                rhosynth_proto::Question::Unspecified => return Err(WireError::new("a vote round asks no question")),
            };
            let encoding: PateEncoding = from_json("encoding", &wire.encoding_json)?;
            let (fake_rows, queries) = (wire.fake_rows as usize, wire.queries as usize);
            if question == Question::Target && fake_rows > 0 {
                return Err(WireError::new("a target question trains against no generated rows"));
            }
            // The rows it carries are exactly those it names, and the votes fit in one result.
            let features = fake_rows.checked_add(queries).and_then(|n| n.checked_mul(encoding.width));
            let classes = match question {
                Question::Realness => Some(1),
                Question::Target => encoding.target_classes(),
            };
            let votes = classes.and_then(|c| queries.checked_mul(c));
            if features != Some(wire.rows.len()) || votes.is_none_or(|v| v as u64 > MAX_RESULT_VALUES) {
                return Err(WireError::new("a vote round's rows or votes do not match what it declares"));
            }
            Ok(Self {
                encoding,
                teacher: from_json("teacher", &wire.teacher_json)?,
                seed: seed(&wire.seed)?,
                question,
                fake_rows,
                queries,
            })
        }
    }
}

/// Checks a task's vote counts: `expected` of them, each in [0, teachers] (a whole number
/// when `whole`).
pub fn validate_votes(votes: &[f64], expected: usize, teachers: usize, whole: bool) -> Result<(), String> {
    if votes.len() != expected {
        return Err(format!("expected {expected} vote counts, got {}", votes.len()));
    }
    match votes.iter().find(|v| !((0.0..=teachers as f64).contains(*v) && (!whole || v.fract() == 0.0))) {
        Some(v) => {
            Err(format!("vote count {v} is not a {} in [0, {teachers}]", if whole { "whole number" } else { "number" }))
        }
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vote_counts_must_be_whole_and_within_the_teachers() {
        let whole = true;
        assert!(validate_votes(&[0.0, 3.0, 2.0], 3, 3, whole).is_ok());
        assert!(validate_votes(&[0.0, 4.0, 2.0], 3, 3, whole).is_err());
        assert!(validate_votes(&[0.5, 1.0, 2.0], 3, 3, whole).is_err());
        assert!(validate_votes(&[1.0, 2.0], 3, 3, whole).is_err());
        let graded = false;
        assert!(validate_votes(&[0.5, 1.0, 2.9], 3, 3, graded).is_ok());
        assert!(validate_votes(&[0.5, f64::NAN, 2.0], 3, 3, graded).is_err());
        assert!(validate_votes(&[0.5, -0.1, 2.0], 3, 3, graded).is_err());
    }
}
