//! The layers the engine clips per unit. A model the engine trains is built from these
//! alone, so the ghost tape (`super::ghost`) knows every parameter's per-unit gradient
//! form: linears (rows × inputs), embedding tables (one row per id) and layer norms.

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, Tensor};

/// ε inside the layer norm's square root.
const NORM_EPSILON: f64 = 1e-5;

/// Layer normalisation over the last dimension with a learned scale γ and shift β.
/// Its own module (not burn's) so that the normalised input, which the per-unit gradient
/// of γ needs, is computed in one place for both passes.
#[derive(Module, Debug)]
pub struct LayerNorm {
    pub gamma: Param<Tensor<1>>,
    pub beta: Param<Tensor<1>>,
}

impl LayerNorm {
    /// γ = 1, β = 0.
    pub fn new(width: usize, device: &Device) -> Self {
        Self {
            gamma: Param::from_tensor(Tensor::ones([width], device)),
            beta: Param::from_tensor(Tensor::zeros([width], device)),
        }
    }

    /// (x − mean) / √(var + ε) per row.
    pub fn normalize(input: Tensor<2>) -> Tensor<2> {
        let (var, mean) = input.clone().var_mean_bias(1);
        (input - mean) / (var + NORM_EPSILON).sqrt()
    }

    pub fn forward(&self, input: Tensor<2>) -> Tensor<2> {
        Self::normalize(input) * self.gamma.val().unsqueeze::<2>() + self.beta.val().unsqueeze::<2>()
    }
}

/// A layer of a model, in the order its parameters are laid out.
pub enum Layer<'a> {
    Linear(&'a Linear),
    Embedding(&'a Embedding),
    Norm(&'a LayerNorm),
}

/// A layer whose parameters are about to be replaced.
pub enum LayerMut<'a> {
    Linear(&'a mut Linear),
    Embedding(&'a mut Embedding),
    Norm(&'a mut LayerNorm),
}
