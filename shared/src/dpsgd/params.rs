//! A model's trainable parameters as one flat vector: what the coordinator broadcasts,
//! what workers' clipped sums are laid out as, and what the optimizer steps.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Gradients, Tensor, TensorData};

use super::DpSgdError;

/// A model whose trainable parameters are all in linear layers (embeddings of one-hot
/// inputs, attention projections and MLPs are all linear layers). Order of `linears()`
/// defines the flat layout: per layer its weight (d_in × d_out, row-major), then its bias.
pub trait LinearStack {
    fn linears(&self) -> Vec<&Linear>;
    fn linears_mut(&mut self) -> Vec<&mut Linear>;

    fn parameter_count(&self) -> usize {
        self.linears()
            .iter()
            .map(|l| l.weight.shape().num_elements() + l.bias.as_ref().map_or(0, |b| b.dims()[0]))
            .sum()
    }

    /// The flat parameter vector.
    fn parameters(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.parameter_count());
        for layer in self.linears() {
            out.extend(values(layer.weight.val().into_data()));
            if let Some(bias) = &layer.bias {
                out.extend(values(bias.val().into_data()));
            }
        }
        out
    }

    /// Replaces every parameter from a flat vector laid out as [`LinearStack::parameters`].
    fn load_parameters(&mut self, flat: &[f32]) -> Result<(), DpSgdError> {
        let expected = self.parameter_count();
        if flat.len() != expected {
            return Err(DpSgdError::Model(format!("expected {expected} parameters, got {}", flat.len())));
        }
        let mut offset = 0;
        for layer in self.linears_mut() {
            let device = layer.weight.device();
            let [inputs, outputs] = layer.weight.dims();
            let weight = &flat[offset..offset + inputs * outputs];
            offset += inputs * outputs;
            layer.weight =
                Param::from_tensor(Tensor::from_data(TensorData::new(weight.to_vec(), [inputs, outputs]), &device));
            if layer.bias.is_some() {
                let bias = &flat[offset..offset + outputs];
                offset += outputs;
                layer.bias =
                    Some(Param::from_tensor(Tensor::from_data(TensorData::new(bias.to_vec(), [outputs]), &device)));
            }
        }
        Ok(())
    }

    /// The flat gradient of a model whose parameters were tracked (the non-private path).
    fn flat_gradient(&self, grads: &Gradients) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.parameter_count());
        for layer in self.linears() {
            let [inputs, outputs] = layer.weight.dims();
            match layer.weight.val().grad(grads) {
                Some(g) => out.extend(values(g.into_data())),
                None => out.extend(std::iter::repeat_n(0.0, inputs * outputs)),
            }
            if let Some(bias) = &layer.bias {
                match bias.val().grad(grads) {
                    Some(g) => out.extend(values(g.into_data())),
                    None => out.extend(std::iter::repeat_n(0.0, outputs)),
                }
            }
        }
        out
    }
}

/// A tensor's values as f32 (every model here is f32).
pub fn values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().try_into_vec::<f32>().expect("an f32 tensor converts to f32")
}
