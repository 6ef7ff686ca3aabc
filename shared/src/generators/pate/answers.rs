//! The coordinator's reading of released votes: what each release is drawn on, and the
//! answers, confidence checks and label shares read off its noisy values (post-processing).

use crate::generators::pate::PateRelease;

/// What a realness release is drawn on: under `Label`, each query's [real, generated]
/// vote histogram (GNMax over two classes); under `VoteShare`, each real count.
pub fn realness_votes(real_votes: &[f64], teachers: u32, how: PateRelease) -> Vec<f64> {
    let k = f64::from(teachers);
    match how {
        PateRelease::Label => real_votes.iter().flat_map(|&real| [real, k - real]).collect(),
        PateRelease::VoteShare => real_votes.to_vec(),
    }
}

/// The answers, from the released [`realness_votes`] (post-processing): the GNMax label (1
/// when the noisy real count is the larger) or the noisy real share (÷ k, clamped to [0, 1]).
pub fn realness_answers(noisy: &[f64], teachers: u32, how: PateRelease) -> Vec<f32> {
    match how {
        PateRelease::Label => noisy.chunks(2).map(|h| f32::from(u8::from(h[0] > h[1]))).collect(),
        PateRelease::VoteShare => noisy.iter().map(|&v| (v / f64::from(teachers)).clamp(0.0, 1.0) as f32).collect(),
    }
}

/// Each query's largest vote count: what confident GNMax's check is drawn on.
pub fn largest_votes(votes: &[f64], per_query: usize, teachers: u32) -> Vec<f64> {
    let k = f64::from(teachers);
    match per_query {
        // One realness count r stands for the histogram [r, k − r].
        1 => votes.iter().map(|&r| r.max(k - r)).collect(),
        n => votes.chunks(n).map(|c| c.iter().copied().fold(0.0, f64::max)).collect(),
    }
}

/// Confident GNMax's check: a query is answered when its largest vote count plus
/// N(0, `sigma`²) reaches `count` (teachers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub count: f64,
    pub sigma: f64,
}

impl Threshold {
    /// Which queries clear the threshold, given their released noisy largest counts.
    pub fn clears(&self, noisy_largest: &[f64]) -> Vec<bool> {
        noisy_largest.iter().map(|&c| c >= self.count).collect()
    }
}

/// Label shares from released class histograms (post-processing): negative counts as 0,
/// normalised; uniform if all are 0.
pub fn label_shares(noisy: &[f64], classes: usize) -> Vec<f64> {
    noisy
        .chunks(classes)
        .flat_map(|query| {
            let clipped: Vec<f64> = query.iter().map(|c| c.max(0.0)).collect();
            let total: f64 = clipped.iter().sum();
            clipped.into_iter().map(move |c| if total > 0.0 { c / total } else { 1.0 / classes as f64 })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each release is drawn on, and the answers read from its noisy values (the
    /// noise's law is `rhosynth-privacy`'s to test).
    #[test]
    fn realness_and_label_answers_are_post_processing_of_their_releases() {
        let votes = [30.0, 10.0];
        assert_eq!(realness_votes(&votes, 40, PateRelease::Label), [30.0, 10.0, 10.0, 30.0]);
        assert_eq!(realness_votes(&votes, 40, PateRelease::VoteShare), votes);
        assert_eq!(realness_answers(&[31.0, 9.0, 12.0, 28.0], 40, PateRelease::Label), [1.0, 0.0]);
        assert_eq!(realness_answers(&[20.0, -3.0, 44.0], 40, PateRelease::VoteShare), [0.5, 0.0, 1.0]);
        assert_eq!(largest_votes(&votes, 1, 40), [30.0, 30.0]);
        assert_eq!(largest_votes(&[1.0, 5.0, 2.0, 3.0, 0.0, 0.0], 3, 8), [5.0, 3.0]);
        let shares = label_shares(&[-1.0, 3.0, 1.0, 0.0, -2.0, 0.0], 3);
        assert_eq!(shares, [0.0, 0.75, 0.25, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0]);
    }
}
