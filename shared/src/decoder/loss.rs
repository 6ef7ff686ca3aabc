//! The training loss of a decoder: next-token log-loss per sequence.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

/// Mean next-token loss of each sequence over its weighted positions, with each position's
/// logits restricted to the tokens its grammar allows (`allowed`: additive 0 / −10⁹ mask,
/// rows × vocabulary; `weights`: 1 where the position's next token counts, else 0).
pub fn next_token_losses(
    logits: Tensor<2>,
    targets: &[u32],
    allowed: Vec<f32>,
    weights: Vec<f32>,
    sequences: usize,
) -> Tensor<1> {
    let device = logits.device();
    let [rows, vocabulary] = logits.dims();
    let plain = device.clone().without_autodiff();
    let mask = Tensor::<2>::from_data(TensorData::new(allowed, [rows, vocabulary]), &plain);
    let logp = log_softmax(logits + mask, 1);
    let targets: Vec<i64> = targets.iter().map(|&t| i64::from(t)).collect();
    let index = Tensor::<2, Int>::from_data(TensorData::new(targets, [rows, 1]), &logp.device());
    let picked = logp.gather(1, index);
    let counts: Vec<f32> = weights.chunks(rows / sequences).map(|w| w.iter().sum::<f32>().max(1.0)).collect();
    let scaled: Vec<f32> =
        weights.chunks(rows / sequences).zip(&counts).flat_map(|(w, c)| w.iter().map(move |v| v / c)).collect();
    let scale = Tensor::<2>::from_data(TensorData::new(scaled, [rows, 1]), &plain);
    -(picked * scale).reshape([sequences, rows / sequences]).sum_dim(1).reshape([sequences])
}
