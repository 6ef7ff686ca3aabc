//! A model's trainable parameters as one flat vector: what the coordinator broadcasts,
//! what workers' clipped sums are laid out as, and what the optimizer steps.

use burn::module::Param;
use burn::tensor::{Device, Gradients, Tensor, TensorData};

use super::DpSgdError;
use super::layers::{Layer, LayerMut};

/// A model whose trainable parameters all sit in the engine's layers (`super::layers`).
/// The order of `layers()` defines the flat layout; within a layer: a linear's weight
/// (inputs × outputs, row-major) then its bias, an embedding's table (ids × width), a
/// norm's γ then its β if it has one.
pub trait TrainableLayers {
    fn layers(&self) -> Vec<Layer<'_>>;
    fn layers_mut(&mut self) -> Vec<LayerMut<'_>>;

    fn parameter_count(&self) -> usize {
        params(self).iter().map(ParamRef::len).sum()
    }

    /// The flat parameter vector.
    fn parameters(&self) -> Vec<f32> {
        params(self).iter().flat_map(ParamRef::values).collect()
    }

    /// Replaces every parameter from a flat vector laid out as [`TrainableLayers::parameters`].
    fn load_parameters(&mut self, flat: &[f32]) -> Result<(), DpSgdError> {
        let expected = self.parameter_count();
        if flat.len() != expected {
            return Err(DpSgdError::Model(format!("expected {expected} parameters, got {}", flat.len())));
        }
        let mut next = Slicer { flat, offset: 0 };
        for layer in self.layers_mut() {
            match layer {
                LayerMut::Linear(l) => {
                    l.weight = next.matrix(l.weight.dims(), &l.weight.device());
                    if let Some(b) = &mut l.bias {
                        *b = next.vector(b.dims(), &b.device());
                    }
                }
                LayerMut::Embedding(e) => e.weight = next.matrix(e.weight.dims(), &e.weight.device()),
                LayerMut::Norm(n) => {
                    n.gamma = next.vector(n.gamma.dims(), &n.gamma.device());
                    if let Some(b) = &mut n.beta {
                        *b = next.vector(b.dims(), &b.device());
                    }
                }
            }
        }
        Ok(())
    }

    /// The flat gradient of a model whose parameters were tracked (the non-private path).
    fn flat_gradient(&self, grads: &Gradients) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.parameter_count());
        for p in params(self) {
            match p.grad(grads) {
                Some(g) => out.extend(g),
                None => out.extend(std::iter::repeat_n(0.0, p.len())),
            }
        }
        out
    }
}

/// One parameter tensor of a layer.
enum ParamRef<'a> {
    Matrix(&'a Param<Tensor<2>>),
    Vector(&'a Param<Tensor<1>>),
}

impl ParamRef<'_> {
    fn len(&self) -> usize {
        match self {
            ParamRef::Matrix(p) => p.shape().num_elements(),
            ParamRef::Vector(p) => p.dims()[0],
        }
    }

    fn values(&self) -> Vec<f32> {
        match self {
            ParamRef::Matrix(p) => values(p.val().into_data()),
            ParamRef::Vector(p) => values(p.val().into_data()),
        }
    }

    fn grad(&self, grads: &Gradients) -> Option<Vec<f32>> {
        match self {
            ParamRef::Matrix(p) => p.val().grad(grads).map(|g| values(g.into_data())),
            ParamRef::Vector(p) => p.val().grad(grads).map(|g| values(g.into_data())),
        }
    }
}

/// Every parameter tensor in layout order.
fn params<M: TrainableLayers + ?Sized>(model: &M) -> Vec<ParamRef<'_>> {
    let mut out = Vec::new();
    for layer in model.layers() {
        match layer {
            Layer::Linear(l) => {
                out.push(ParamRef::Matrix(&l.weight));
                out.extend(l.bias.as_ref().map(ParamRef::Vector));
            }
            Layer::Embedding(e) => out.push(ParamRef::Matrix(&e.weight)),
            Layer::Norm(n) => {
                out.push(ParamRef::Vector(&n.gamma));
                out.extend(n.beta.as_ref().map(ParamRef::Vector));
            }
        }
    }
    out
}

/// Consecutive slices of a flat vector as parameters.
struct Slicer<'a> {
    flat: &'a [f32],
    offset: usize,
}

impl Slicer<'_> {
    fn take(&mut self, n: usize) -> Vec<f32> {
        let out = self.flat[self.offset..self.offset + n].to_vec();
        self.offset += n;
        out
    }

    fn matrix(&mut self, [rows, cols]: [usize; 2], device: &Device) -> Param<Tensor<2>> {
        Param::from_tensor(Tensor::from_data(TensorData::new(self.take(rows * cols), [rows, cols]), device))
    }

    fn vector(&mut self, [len]: [usize; 1], device: &Device) -> Param<Tensor<1>> {
        Param::from_tensor(Tensor::from_data(TensorData::new(self.take(len), [len]), device))
    }
}

/// A tensor's values as f32 (every model here is f32).
pub fn values(data: TensorData) -> Vec<f32> {
    data.convert::<f32>().try_into_vec::<f32>().expect("an f32 tensor converts to f32")
}

/// A float tensor's values as f64.
pub fn values_f64(data: TensorData) -> Vec<f64> {
    data.convert::<f64>().try_into_vec::<f64>().expect("a float tensor converts to f64")
}
