//! Per-unit clipped gradient sums without per-example backward passes (ghost clipping
//! with book-keeping, Bu et al. 2023).
//!
//! Every linear layer computes z = a·W + b + p, with p a zero probe that requires grad.
//! One backward pass of Σᵢ Lᵢ gives δ = ∂L/∂z (= ∂Lᵢ/∂zᵢ row by row) and never computes a
//! weight gradient. A unit u's gradient of that layer is Σ_{r∈u} a_rᵀ δ_r, whose squared
//! Frobenius norm is Σ_{r,s∈u} (a_r·a_s + 1)(δ_r·δ_s) (the +1 is the bias). Summing over
//! layers gives each unit's whole-gradient norm ‖g_u‖; with c_u = min(1, C/‖g_u‖) the
//! clipped sum of a layer is Aᵀ·(c ⊙ Δ) and Σ_r c_r δ_r — one matmul per layer.
//! When every unit is one row the Gram matrices reduce to ‖a_r‖²·‖δ_r‖²; for multi-row
//! units the pairs are summed in f64 (their terms cancel).

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

/// One layer's squared gradient norm per unit, Σ_{r,s∈u} (a_r·a_s + bias)(δ_r·δ_s), in f64.
/// The terms of a multi-row unit have both signs: summed in f32 their cancellation can
/// understate a norm by far more than its size and leave the unit unclipped.
fn unit_norms2(a: &[f32], delta: &[f32], inputs: usize, outputs: usize, members: &[Vec<usize>], bias: f64) -> Vec<f64> {
    fn row(m: &[f32], width: usize, r: usize) -> &[f32] {
        &m[r * width..(r + 1) * width]
    }
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| f64::from(*p) * f64::from(*q)).sum::<f64>();
    members
        .iter()
        .map(|rows| {
            let mut total = 0.0;
            for (i, &r) in rows.iter().enumerate() {
                for &s in &rows[i..] {
                    let ka = dot(row(a, inputs, r), row(a, inputs, s)) + bias;
                    let kd = dot(row(delta, outputs, r), row(delta, outputs, s));
                    total += if r == s { ka * kd } else { 2.0 * ka * kd };
                }
            }
            total
        })
        .collect()
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
    // Rows of each unit, for the multi-row norms.
    let members = (!singletons).then(|| {
        let mut members = vec![Vec::new(); unit_count];
        units.iter().enumerate().for_each(|(r, &u)| members[u].push(r));
        members
    });
    let mut norms2 = vec![0f64; unit_count];
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
        match &members {
            // Non-negative terms: f32 is accurate; layers add up in f64.
            None => {
                let a2 = a.clone().square().sum_dim(1);
                let d2 = delta.clone().square().sum_dim(1);
                let contribution = values(((a2 + bias as f32) * d2).into_data());
                norms2.iter_mut().zip(contribution).for_each(|(n, c)| *n += f64::from(c));
            }
            Some(members) => {
                let [_, inputs] = a.dims();
                let (a, d) = (values(a.clone().into_data()), values(delta.clone().into_data()));
                let contribution = unit_norms2(&a, &d, inputs, outputs, members, bias);
                norms2.iter_mut().zip(contribution).for_each(|(n, c)| *n += c);
            }
        }
        deltas.push((a, delta));
    }
    let norms: Vec<f64> = norms2.into_iter().map(|n| n.max(0.0).sqrt()).collect();
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

#[cfg(test)]
mod tests {
    use super::unit_norms2;

    /// Two rows of one unit whose gradients almost cancel: a_rᵀδ_r + a_sᵀδ_s is small while
    /// each term is large. The f64 Gram sum matches the norm of the summed gradient.
    #[test]
    fn cancelling_rows_keep_their_true_norm() {
        let (inputs, outputs) = (64, 32);
        let a_row: Vec<f32> = (0..inputs).map(|i| 300.0 + (i as f32) * 0.37).collect();
        let d_row: Vec<f32> = (0..outputs).map(|j| 50.0 - (j as f32) * 1.1).collect();
        // Row 2 = row 1 with δ negated and nudged: the unit's gradient is a ⊗ (nudge).
        let nudge: Vec<f32> = (0..outputs).map(|j| if j % 3 == 0 { 1e-3 } else { 0.0 }).collect();
        let d_neg: Vec<f32> = d_row.iter().zip(&nudge).map(|(d, n)| -d + n).collect();
        let a = [a_row.clone(), a_row.clone()].concat();
        let d = [d_row.clone(), d_neg.clone()].concat();
        let got = unit_norms2(&a, &d, inputs, outputs, &[vec![0, 1]], 1.0)[0];
        // Exact: weight part ‖a‖²‖Σδ‖² plus bias part ‖Σδ‖², with Σδ computed in f64.
        let sum_d: Vec<f64> = d_row.iter().zip(&d_neg).map(|(p, q)| f64::from(*p) + f64::from(*q)).collect();
        let a2: f64 = a_row.iter().map(|v| f64::from(*v).powi(2)).sum();
        let d2: f64 = sum_d.iter().map(|v| v * v).sum();
        let exact = (a2 + 1.0) * d2;
        assert!((got - exact).abs() <= 1e-4 * exact, "{got} vs {exact}");
        // The same sum accumulated in f32 (as before) is off by orders of magnitude.
        let f32_sum: f32 = {
            let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| p * q).sum::<f32>();
            let (a0, d0, d1) = (&a_row[..], &d_row[..], &d_neg[..]);
            let kaa = dot(a0, a0) + 1.0;
            kaa * dot(d0, d0) + kaa * dot(d1, d1) + 2.0 * kaa * dot(d0, d1)
        };
        assert!((f64::from(f32_sum) - exact).abs() > 10.0 * exact, "f32 {f32_sum} vs {exact}");
    }
}
