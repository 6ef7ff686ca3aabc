//! The layers the engine clips per unit. A model the engine trains is built from these
//! alone, so the ghost tape (`super::ghost`) knows every parameter's per-unit gradient
//! form: linears (rows × inputs), embedding tables (one row per id) and norms (layer or RMS).

use burn::module::{Module, Param};
use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, Tensor};

/// Normalisation over the last dimension with a learned scale γ: a layer norm (centred,
/// with a shift β) or an RMS norm (neither). Its own module (not burn's) so that the
/// normalised input, which the per-unit gradient of γ needs, is computed in one place for
/// both passes.
#[derive(Module, Debug)]
pub struct Norm {
    pub gamma: Param<Tensor<1>>,
    /// The shift; a layer norm has one, an RMS norm none.
    pub beta: Option<Param<Tensor<1>>>,
    pub epsilon: f64,
}

impl Norm {
    /// A layer norm with γ = 1, β = 0.
    pub fn layer(width: usize, epsilon: f64, device: &Device) -> Self {
        Self {
            gamma: Param::from_tensor(Tensor::ones([width], device)),
            beta: Some(Param::from_tensor(Tensor::zeros([width], device))),
            epsilon,
        }
    }

    /// An RMS norm with γ = 1.
    pub fn rms(width: usize, epsilon: f64, device: &Device) -> Self {
        Self { gamma: Param::from_tensor(Tensor::ones([width], device)), beta: None, epsilon }
    }

    /// Parameters: γ, and β for a layer norm.
    pub fn parameter_count(&self) -> usize {
        self.gamma.dims()[0] * if self.beta.is_some() { 2 } else { 1 }
    }

    /// x̂ per row: (x − mean) / √(var + ε) for a layer norm, x / √(mean(x²) + ε) for an
    /// RMS norm.
    pub fn normalize(&self, input: Tensor<2>) -> Tensor<2> {
        if self.beta.is_some() {
            let (var, mean) = input.clone().var_mean_bias(1);
            (input - mean) / (var + self.epsilon).sqrt()
        } else {
            let mean_square = input.clone().square().mean_dim(1);
            input / (mean_square + self.epsilon).sqrt()
        }
    }

    pub fn forward(&self, input: Tensor<2>) -> Tensor<2> {
        let scaled = self.normalize(input) * self.gamma.val().unsqueeze::<2>();
        match &self.beta {
            Some(beta) => scaled + beta.val().unsqueeze::<2>(),
            None => scaled,
        }
    }
}

/// A layer of a model, in the order its parameters are laid out.
pub enum Layer<'a> {
    Linear(&'a Linear),
    Embedding(&'a Embedding),
    Norm(&'a Norm),
}

impl Layer<'_> {
    /// Its parameters: a linear's weight and bias, an embedding's table, a norm's γ and β.
    pub fn parameter_count(&self) -> usize {
        match self {
            Layer::Linear(l) => l.weight.shape().num_elements() + l.bias.as_ref().map_or(0, |b| b.dims()[0]),
            Layer::Embedding(e) => e.weight.shape().num_elements(),
            Layer::Norm(n) => n.parameter_count(),
        }
    }
}

/// A layer whose parameters are about to be replaced.
pub enum LayerMut<'a> {
    Linear(&'a mut Linear),
    Embedding(&'a mut Embedding),
    Norm(&'a mut Norm),
}
