//! Rows drawn from the trained generator; with a label model, each row's target is drawn
//! from it. Post-processing only.

use rand::rngs::ChaCha20Rng;

use super::encoding::PateEncoding;
use super::gan::PateGan;
use super::teacher::TargetModel;
use crate::generators::Sampler;
use crate::output::SyntheticUnits;

/// The trained generator and, when the plan had label queries, the label model fit to
/// the released label shares.
pub struct PateSampler {
    pub gan: PateGan,
    pub labels: Option<TargetModel>,
    pub encoding: PateEncoding,
}

impl Sampler for PateSampler {
    fn sample(&mut self, rows: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        let mut x = self.gan.sample_output(rows);
        if let Some(labels) = &self.labels {
            labels.relabel(&self.encoding, &mut x, rng);
        }
        SyntheticUnits::one_row_each(x.chunks(self.encoding.width).map(|row| self.encoding.decode_row(row)).collect())
    }
}
