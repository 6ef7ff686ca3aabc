//! Rows drawn from the trained denoiser by ancestral sampling, decoded from the feature
//! space. Post-processing only.

use rand::rngs::ChaCha20Rng;

use super::diffusion;
use super::encoding::TabularEncoding;
use super::model::FinDiffModel;
use crate::dpsgd::compute_device;
use crate::generators::Sampler;
use crate::output::SyntheticUnits;

/// The trained denoiser, its encoding and how many denoising steps a sample takes.
pub struct FinDiffSampler {
    pub model: FinDiffModel,
    pub encoding: TabularEncoding,
    pub sampling_steps: u32,
}

impl Sampler for FinDiffSampler {
    fn sample(&mut self, rows: usize, rng: &mut ChaCha20Rng) -> SyntheticUnits {
        /// Rows denoised together (memory bound).
        const CHUNK: usize = 2048;
        let (device, width) = (compute_device(), self.encoding.width);
        let mut out = Vec::with_capacity(rows);
        while out.len() < rows {
            let m = (rows - out.len()).min(CHUNK);
            let model = &self.model;
            let x = diffusion::sample(&model.denoiser, &model.schedule, m, width, self.sampling_steps, &device, rng);
            out.extend(x.chunks(width).map(|row| self.encoding.decode_row(row)));
        }
        SyntheticUnits::one_row_each(out)
    }
}
