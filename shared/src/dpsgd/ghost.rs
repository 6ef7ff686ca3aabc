//! Per-unit clipped gradient sums without per-example backward passes (ghost clipping
//! with book-keeping, Bu et al. 2023).
//!
//! Every linear layer computes z = a·W + b + p, with p a zero probe that requires grad.
//! One backward pass of Σᵢ Lᵢ gives δ = ∂L/∂z (= ∂Lᵢ/∂zᵢ row by row) and never computes a
//! weight gradient. A unit u's gradient of that layer is Σ_{r∈u} a_rᵀ δ_r, whose squared
//! Frobenius norm is Σ_{r,s∈u} (a_r·a_s + 1)(δ_r·δ_s) (the +1 is the bias). Summing over
//! layers gives each unit's whole-gradient norm ‖g_u‖; with c_u = min(1, C/‖g_u‖) the
//! clipped sum of a layer is Aᵀ·(c ⊙ Δ) and Σ_r c_r δ_r — one matmul per layer.
//! When every unit is one row the Gram matrices reduce to ‖a_r‖²·‖δ_r‖².

use std::collections::HashMap;

use burn::module::ParamId;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData};

use super::DpSgdError;
use super::params::{LinearStack, values};

/// How a model applies its linear layers: plainly, or recording what ghost clipping needs.
pub trait LinearHook {
    fn linear(&mut self, layer: &Linear, input: Tensor<2>) -> Tensor<2>;
}

/// The ordinary forward pass (sampling, the non-private baseline).
pub struct Plain;

impl LinearHook for Plain {
    fn linear(&mut self, layer: &Linear, input: Tensor<2>) -> Tensor<2> {
        layer.forward(input)
    }
}

struct Record {
    /// Layer input, without autodiff.
    input: Tensor<2>,
    probe: Tensor<2>,
}

/// Records each layer's input and output probe during a forward pass. Weights enter as
/// constants, so the backward pass computes only activation gradients.
#[derive(Default)]
pub struct GhostTape {
    records: HashMap<ParamId, Record>,
    repeated: Option<ParamId>,
}

impl LinearHook for GhostTape {
    fn linear(&mut self, layer: &Linear, input: Tensor<2>) -> Tensor<2> {
        let weight = layer.weight.val().without_autodiff();
        let [rows, _] = input.dims();
        let [_, outputs] = weight.dims();
        let device = input.device();
        let probe = Tensor::<2>::zeros([rows, outputs], &device.clone().autodiff()).require_grad();
        let mut z = input.clone().autodiff().matmul(weight);
        if let Some(bias) = &layer.bias {
            z = z + bias.val().without_autodiff().unsqueeze::<2>();
        }
        let z = z + probe.clone();
        let id = layer.weight.id;
        if self.records.insert(id, Record { input: input.without_autodiff(), probe }).is_some() {
            self.repeated = Some(id);
        }
        z
    }
}

/// The clipped sum a worker returns for one batch, and what the tests inspect.
#[derive(Clone, Debug)]
pub struct ClippedSum {
    /// Σ_u c_u·g_u, flattened in the model's parameter order.
    pub sum: Vec<f32>,
    /// ‖g_u‖ before clipping, per unit (private: never leaves the worker).
    pub norms: Vec<f64>,
}

/// Per-row unit indices `0..units` as the one-hot matrix S (rows × units).
fn membership(units: &[usize], count: usize, device: &Device) -> Tensor<2> {
    let mut s = vec![0f32; units.len() * count];
    for (r, &u) in units.iter().enumerate() {
        s[r * count + u] = 1.0;
    }
    Tensor::from_data(TensorData::new(s, [units.len(), count]), device)
}

/// Clipped gradient sum of `losses` (one per row; rows of a unit are summed before
/// clipping) for a model whose forward pass ran through `tape`.
///
/// `units[r]` is row r's unit in `0..unit_count`; `clip` is C.
pub fn clipped_sum<M: LinearStack>(
    model: &M,
    tape: GhostTape,
    losses: Tensor<1>,
    units: &[usize],
    unit_count: usize,
    clip: f64,
) -> Result<ClippedSum, DpSgdError> {
    if let Some(id) = tape.repeated {
        return Err(DpSgdError::Model(format!(
            "layer {id} is applied twice in one forward pass; ghost norms need one"
        )));
    }
    let [rows] = losses.dims();
    if rows != units.len() || units.iter().any(|&u| u >= unit_count) {
        return Err(DpSgdError::Model(format!("{rows} losses but {} unit indices", units.len())));
    }
    let device = losses.device().without_autodiff();
    let grads = losses.sum().backward();
    let singletons = unit_count == rows;
    let s = (!singletons).then(|| membership(units, unit_count, &device));
    let mut norms2 = Tensor::<2>::zeros([1, unit_count], &device);
    let mut deltas = Vec::new();
    for layer in model.linears() {
        let record = tape.records.get(&layer.weight.id).ok_or_else(|| {
            DpSgdError::Model("a linear layer of the model was not used in the forward pass".to_string())
        })?;
        let [_, outputs] = layer.weight.dims();
        let delta = record
            .probe
            .grad(&grads)
            .unwrap_or_else(|| Tensor::<2>::zeros([rows, outputs], &device))
            .without_autodiff();
        let a = record.input.clone();
        let bias = if layer.bias.is_some() { 1.0 } else { 0.0 };
        let contribution = match &s {
            None => {
                let a2 = a.clone().square().sum_dim(1);
                let d2 = delta.clone().square().sum_dim(1);
                ((a2 + bias) * d2).transpose()
            }
            Some(s) => {
                let ka = a.clone().matmul(a.clone().transpose()) + bias;
                let kd = delta.clone().matmul(delta.clone().transpose());
                // Σ_{r,s ∈ u} K_rs = (Sᵀ (K ⊙ S Sᵀ) S)_uu, computed as column sums of (K S) ⊙ S.
                let same_unit = s.clone().matmul(s.clone().transpose());
                ((ka * kd * same_unit).matmul(s.clone()) * s.clone()).sum_dim(0)
            }
        };
        norms2 = norms2 + contribution;
        deltas.push((a, delta));
    }
    let norms: Vec<f64> = values(norms2.into_data()).into_iter().map(|n| f64::from(n.max(0.0)).sqrt()).collect();
    let factors: Vec<f32> = norms.iter().map(|&n| if n > clip { (clip / n) as f32 } else { 1.0 }).collect();
    let per_unit = Tensor::<2>::from_data(TensorData::new(factors, [unit_count, 1]), &device);
    let per_row = match &s {
        None => per_unit,
        Some(s) => s.clone().matmul(per_unit),
    };
    let mut sum = Vec::with_capacity(model.parameter_count());
    for (layer, (a, delta)) in model.linears().into_iter().zip(deltas) {
        let weighted = delta * per_row.clone();
        sum.extend(values(a.transpose().matmul(weighted.clone()).into_data()));
        if layer.bias.is_some() {
            sum.extend(values(weighted.sum_dim(0).into_data()));
        }
    }
    Ok(ClippedSum { sum, norms })
}
