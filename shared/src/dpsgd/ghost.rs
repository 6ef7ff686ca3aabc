//! Per-unit clipped gradient sums without per-example backward passes (ghost clipping
//! with book-keeping, Bu et al. 2023), for every layer kind of `super::layers`.
//!
//! Every layer adds a zero probe p that requires grad to its output z. One backward pass
//! of Σᵢ Lᵢ gives δ = ∂L/∂z row by row and never computes a weight gradient. Rows are
//! whatever the layer sees (a table row, or a token position); each row belongs to a unit.
//!
//! - Linear z = a·W + b: unit u's gradient is Σ_{r∈u} a_rᵀ δ_r. Its squared norm is either
//!   the Gram form Σ_{r,s∈u} (a_r·a_s + 1)(δ_r·δ_s) (the +1 is the bias), summed in f64,
//!   or, when every unit has T rows and T·in·out < T²·(in + out), the per-unit gradient
//!   itself as one batched matmul in f64 (its entries may cancel). Clipped sum:
//!   Aᵀ·(c ⊙ Δ).
//! - Embedding z_r = E[id_r]: unit u's gradient has row v = Σ_{r∈u, id_r=v} δ_r, so its
//!   squared norm is Σ over position pairs with equal ids of δ_r·δ_s, computed as the
//!   norms of those per-id sums (f64).
//! - Norm z = x̂·γ (+ β for a layer norm): γ and β are small, so their per-unit gradients
//!   Σ_{r∈u} δ_r ⊙ x̂_r and Σ_{r∈u} δ_r are formed directly (f64).
//!
//! Layers add up to each unit's whole-gradient norm ‖g_u‖; with c_u = min(1, C/‖g_u‖)
//! each layer's clipped sum is its gradient with δ_r scaled by c of r's unit.

use std::collections::HashMap;

use burn::module::ParamId;
use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, FloatDType, Int, Tensor, TensorData};

use super::DpSgdError;
use super::layers::{Layer, Norm};
use super::params::{TrainableLayers, values, values_f64};

/// How a model applies its layers: plainly, or recording what ghost clipping needs.
pub trait Hook {
    fn linear(&mut self, layer: &Linear, input: Tensor<2>) -> Tensor<2>;
    /// Rows of `table` for `ids`.
    fn embedding(&mut self, table: &Embedding, ids: &[u32]) -> Tensor<2>;
    fn norm(&mut self, layer: &Norm, input: Tensor<2>) -> Tensor<2>;
}

/// The ordinary forward pass (sampling, the non-private baseline).
pub struct Plain;

fn id_tensor(ids: &[u32], device: &Device) -> Tensor<1, Int> {
    let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let n = ids.len();
    Tensor::from_data(TensorData::new(ids, [n]), device)
}

impl Hook for Plain {
    fn linear(&mut self, layer: &Linear, input: Tensor<2>) -> Tensor<2> {
        layer.forward(input)
    }

    fn embedding(&mut self, table: &Embedding, ids: &[u32]) -> Tensor<2> {
        let weight = table.weight.val();
        let ids = id_tensor(ids, &weight.device());
        weight.select(0, ids)
    }

    fn norm(&mut self, layer: &Norm, input: Tensor<2>) -> Tensor<2> {
        layer.forward(input)
    }
}

enum Record {
    /// Layer input, without autodiff.
    Linear {
        input: Tensor<2>,
        probe: Tensor<2>,
    },
    Embedding {
        ids: Vec<u32>,
        probe: Tensor<2>,
    },
    /// The normalised input x̂, without autodiff.
    Norm {
        normalized: Tensor<2>,
        probe: Tensor<2>,
    },
}

impl Record {
    fn probe(&self) -> &Tensor<2> {
        match self {
            Record::Linear { probe, .. } | Record::Embedding { probe, .. } | Record::Norm { probe, .. } => probe,
        }
    }
}

/// Records each layer's input and output probe during a forward pass. Parameters enter
/// as constants, so the backward pass computes only activation gradients.
#[derive(Default)]
pub struct GhostTape {
    records: HashMap<ParamId, Record>,
    repeated: Option<ParamId>,
}

impl GhostTape {
    fn probe(rows: usize, outputs: usize, device: &Device) -> Tensor<2> {
        Tensor::<2>::zeros([rows, outputs], &device.clone().autodiff()).require_grad()
    }

    fn record(&mut self, id: ParamId, record: Record) {
        if self.records.insert(id, record).is_some() {
            self.repeated = Some(id);
        }
    }
}

impl Hook for GhostTape {
    fn linear(&mut self, layer: &Linear, input: Tensor<2>) -> Tensor<2> {
        let weight = layer.weight.val().without_autodiff();
        let [rows, _] = input.dims();
        let [_, outputs] = weight.dims();
        let probe = Self::probe(rows, outputs, &input.device());
        let mut z = input.clone().autodiff().matmul(weight);
        if let Some(bias) = &layer.bias {
            z = z + bias.val().without_autodiff().unsqueeze::<2>();
        }
        let z = z + probe.clone();
        self.record(layer.weight.id, Record::Linear { input: input.without_autodiff(), probe });
        z
    }

    fn embedding(&mut self, table: &Embedding, ids: &[u32]) -> Tensor<2> {
        let weight = table.weight.val().without_autodiff();
        let [_, width] = weight.dims();
        let device = weight.device();
        let probe = Self::probe(ids.len(), width, &device);
        let z = weight.select(0, id_tensor(ids, &device)).autodiff() + probe.clone();
        self.record(table.weight.id, Record::Embedding { ids: ids.to_vec(), probe });
        z
    }

    fn norm(&mut self, layer: &Norm, input: Tensor<2>) -> Tensor<2> {
        let normalized = layer.normalize(input.autodiff());
        let [rows, width] = normalized.dims();
        let probe = Self::probe(rows, width, &normalized.device());
        let gamma = layer.gamma.val().without_autodiff().unsqueeze::<2>();
        let mut z = normalized.clone() * gamma + probe.clone();
        if let Some(beta) = &layer.beta {
            z = z + beta.val().without_autodiff().unsqueeze::<2>();
        }
        self.record(layer.gamma.id, Record::Norm { normalized: normalized.without_autodiff(), probe });
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
    /// Per layer, each unit's norm of that layer's gradient (tests compare them).
    pub layer_norms: Vec<Vec<f64>>,
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

/// How a batch's rows map to its units, which decides each linear's norm form.
enum Layout {
    /// Row r is unit r.
    Singletons,
    /// Unit u is rows u·T .. (u+1)·T.
    Uniform(usize),
    /// Any other grouping: each unit's rows.
    Members(Vec<Vec<usize>>),
}

impl Layout {
    fn of(units: &[usize], unit_count: usize) -> Self {
        let mut members = vec![Vec::new(); unit_count];
        units.iter().enumerate().for_each(|(r, &u)| members[u].push(r));
        let rows = units.len();
        if members.iter().all(|m| m.len() == 1) {
            return Layout::Singletons;
        }
        if unit_count > 0 && rows.is_multiple_of(unit_count) {
            let t = rows / unit_count;
            if units.iter().enumerate().all(|(r, &u)| u == r / t) {
                return Layout::Uniform(t);
            }
        }
        Layout::Members(members)
    }
}

/// A layer's per-unit squared gradient norms.
fn layer_norms2(
    record: &Record,
    delta: &Tensor<2>,
    bias: bool,
    units: &[usize],
    unit_count: usize,
    layout: &Layout,
) -> Vec<f64> {
    let [rows, width] = delta.dims();
    match record {
        Record::Linear { input: a, .. } => {
            let [_, inputs] = a.dims();
            let bias_term = if bias { 1.0 } else { 0.0 };
            match layout {
                // Non-negative terms: f32 is accurate; layers add up in f64.
                Layout::Singletons => {
                    let a2 = a.clone().square().sum_dim(1);
                    let d2 = delta.clone().square().sum_dim(1);
                    let per_row = values(((a2 + bias_term as f32) * d2).into_data());
                    let mut out = vec![0.0; unit_count];
                    units.iter().zip(per_row).for_each(|(&u, v)| out[u] += f64::from(v));
                    out
                }
                // The per-unit gradient's entries are sums that may cancel, and its squared
                // norm a sum of many terms: both in f64, or a norm read short would let a
                // clipped gradient exceed C.
                Layout::Uniform(t) if inputs * width < t * (inputs + width) => {
                    let per_unit = a.clone().cast(FloatDType::F64).reshape([unit_count, *t, inputs]).swap_dims(1, 2);
                    let d3 = delta.clone().cast(FloatDType::F64).reshape([unit_count, *t, width]);
                    let weight = per_unit.matmul(d3.clone()).square().sum_dim(2).sum_dim(1);
                    let mut out = values_f64(weight.into_data());
                    if bias {
                        let b = values_f64(d3.sum_dim(1).square().sum_dim(2).into_data());
                        out.iter_mut().zip(b).for_each(|(o, v)| *o += v);
                    }
                    out
                }
                Layout::Uniform(t) => {
                    let members: Vec<Vec<usize>> = (0..unit_count).map(|u| (u * t..(u + 1) * t).collect()).collect();
                    let (a, d) = (values(a.clone().into_data()), values(delta.clone().into_data()));
                    unit_norms2(&a, &d, inputs, width, &members, bias_term)
                }
                Layout::Members(members) => {
                    let (a, d) = (values(a.clone().into_data()), values(delta.clone().into_data()));
                    unit_norms2(&a, &d, inputs, width, members, bias_term)
                }
            }
        }
        Record::Embedding { ids, .. } => {
            let d = values(delta.clone().into_data());
            let mut per_id: HashMap<(usize, u32), Vec<f64>> = HashMap::new();
            for r in 0..rows {
                let acc = per_id.entry((units[r], ids[r])).or_insert_with(|| vec![0.0; width]);
                acc.iter_mut().zip(&d[r * width..(r + 1) * width]).for_each(|(s, v)| *s += f64::from(*v));
            }
            let mut out = vec![0.0; unit_count];
            for ((u, _), sum) in per_id {
                out[u] += sum.iter().map(|v| v * v).sum::<f64>();
            }
            out
        }
        Record::Norm { normalized, .. } => {
            let (x, d) = (values(normalized.clone().into_data()), values(delta.clone().into_data()));
            let mut grads = vec![vec![0.0; if bias { 2 * width } else { width }]; unit_count];
            for r in 0..rows {
                let g = &mut grads[units[r]];
                for j in 0..width {
                    let dv = f64::from(d[r * width + j]);
                    g[j] += dv * f64::from(x[r * width + j]);
                    if bias {
                        g[width + j] += dv;
                    }
                }
            }
            grads.iter().map(|g| g.iter().map(|v| v * v).sum()).collect()
        }
    }
}

/// A layer's clipped gradient sum, in its parameters' layout order, appended to `sum`.
fn layer_clipped_sum(layer: &Layer<'_>, record: &Record, delta: Tensor<2>, per_row: &[f32], sum: &mut Vec<f32>) {
    let [rows, width] = delta.dims();
    match (layer, record) {
        (Layer::Linear(linear), Record::Linear { input, .. }) => {
            let c = Tensor::<2>::from_data(TensorData::new(per_row.to_vec(), [rows, 1]), &delta.device());
            let weighted = delta * c;
            sum.extend(values(input.clone().transpose().matmul(weighted.clone()).into_data()));
            if linear.bias.is_some() {
                sum.extend(values(weighted.sum_dim(0).into_data()));
            }
        }
        (Layer::Embedding(table), Record::Embedding { ids, .. }) => {
            let [count, _] = table.weight.dims();
            let d = values(delta.into_data());
            let mut out = vec![0f64; count * width];
            for r in 0..rows {
                let row = &mut out[ids[r] as usize * width..(ids[r] as usize + 1) * width];
                let c = f64::from(per_row[r]);
                row.iter_mut().zip(&d[r * width..(r + 1) * width]).for_each(|(o, v)| *o += c * f64::from(*v));
            }
            sum.extend(out.into_iter().map(|v| v as f32));
        }
        (Layer::Norm(norm), Record::Norm { normalized, .. }) => {
            let (x, d) = (values(normalized.clone().into_data()), values(delta.into_data()));
            let shift = norm.beta.is_some();
            let mut out = vec![0f64; if shift { 2 * width } else { width }];
            for r in 0..rows {
                let c = f64::from(per_row[r]);
                for j in 0..width {
                    let dv = c * f64::from(d[r * width + j]);
                    out[j] += dv * f64::from(x[r * width + j]);
                    if shift {
                        out[width + j] += dv;
                    }
                }
            }
            sum.extend(out.into_iter().map(|v| v as f32));
        }
        _ => unreachable!("records are looked up by the layer's own parameter"),
    }
}

/// Each unit's factor min(1, C/‖g_u‖) as the f32 the sums are scaled by, rounded down so
/// that the clipped norm c_u·‖g_u‖ never exceeds C; refused if it could (a norm that is not
/// a number would leave its unit unclipped).
fn clip_factors(norms: &[f64], clip: f64) -> Result<Vec<f32>, DpSgdError> {
    norms
        .iter()
        .map(|&n| {
            if !n.is_finite() {
                return Err(DpSgdError::Model(format!("a unit's gradient norm is {n}")));
            }
            let mut c = if n > clip { (clip / n) as f32 } else { 1.0 };
            if f64::from(c) * n > clip {
                c = c.next_down();
            }
            if f64::from(c) * n > clip * (1.0 + 1e-9) {
                return Err(DpSgdError::Model(format!("a clipped norm {} exceeds C = {clip}", f64::from(c) * n)));
            }
            Ok(c)
        })
        .collect()
}

/// The parameter a layer's record is keyed by, and whether it has a bias (a norm: a shift β).
fn key(layer: &Layer<'_>) -> (ParamId, bool) {
    match layer {
        Layer::Linear(l) => (l.weight.id, l.bias.is_some()),
        Layer::Embedding(e) => (e.weight.id, false),
        Layer::Norm(n) => (n.gamma.id, n.beta.is_some()),
    }
}

/// Clipped gradient sum of `losses` for a model whose forward pass ran through `tape`.
///
/// Every layer saw the same rows; `units[r]` is row r's unit in `0..unit_count` (a unit's
/// rows are summed before clipping); `clip` is C. Losses may be per row or per unit:
/// only their sum is differentiated.
pub fn clipped_sum<M: TrainableLayers>(
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
    if units.iter().any(|&u| u >= unit_count) {
        return Err(DpSgdError::Model(format!("a row names a unit beyond the batch's {unit_count}")));
    }
    let device = losses.device().without_autodiff();
    let grads = losses.sum().backward();
    let layout = Layout::of(units, unit_count);
    let mut norms2 = vec![0f64; unit_count];
    let mut layer_norms = Vec::new();
    let mut pending = Vec::new();
    for layer in model.layers() {
        let (id, bias) = key(&layer);
        let record = tape
            .records
            .get(&id)
            .ok_or_else(|| DpSgdError::Model("a layer of the model was not used in the forward pass".to_string()))?;
        let [rows, width] = record.probe().dims();
        if rows != units.len() {
            return Err(DpSgdError::Model(format!("a layer saw {rows} rows but {} have units", units.len())));
        }
        let delta = record
            .probe()
            .grad(&grads)
            .unwrap_or_else(|| Tensor::<2>::zeros([rows, width], &device))
            .without_autodiff();
        let contribution = layer_norms2(record, &delta, bias, units, unit_count, &layout);
        norms2.iter_mut().zip(&contribution).for_each(|(n, c)| *n += c);
        layer_norms.push(contribution.into_iter().map(|c| c.max(0.0).sqrt()).collect());
        pending.push((layer, record, delta));
    }
    let norms: Vec<f64> = norms2.into_iter().map(|n| n.max(0.0).sqrt()).collect();
    let factors = clip_factors(&norms, clip)?;
    let per_row: Vec<f32> = units.iter().map(|&u| factors[u]).collect();
    let mut sum = Vec::with_capacity(model.parameter_count());
    for (layer, record, delta) in pending {
        layer_clipped_sum(&layer, record, delta, &per_row, &mut sum);
    }
    Ok(ClippedSum { sum, norms, layer_norms })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units of T rows whose per-unit gradient entries cancel (terms of 10⁷): the batched
    /// form's squared norm matches the exact one to f64 precision (summed in f32 it was off
    /// by 1.4·10⁻⁴ of itself, either way), and a clipped norm never exceeds C.
    #[test]
    fn a_uniform_layouts_norm_is_exact_when_entries_cancel() {
        let (units, t, inputs, width) = (2, 4, 2, 2);
        let device = Default::default();
        // Rows alternate (a, δ) and (a + ε, −δ): each entry Σ_t a_t δ_t is about t·ε·δ, its terms 10⁷.
        let a: Vec<f32> = (0..units * t * inputs)
            .map(|i| 1e4 + 0.013 * i as f32 + if (i / inputs) % 2 == 1 { 1.37 } else { 0.0 })
            .collect();
        let sign = |r: usize| if r.is_multiple_of(2) { 1.0 } else { -1.0 };
        let d: Vec<f32> = (0..units * t * width).map(|i| (1e3 + 0.7 * (i % width) as f32) * sign(i / width)).collect();
        let record = Record::Linear {
            input: Tensor::<2>::from_data(TensorData::new(a.clone(), [units * t, inputs]), &device),
            probe: Tensor::<2>::zeros([units * t, width], &device),
        };
        let delta = Tensor::<2>::from_data(TensorData::new(d.clone(), [units * t, width]), &device);
        let rows: Vec<usize> = (0..units * t).map(|r| r / t).collect();
        let got = layer_norms2(&record, &delta, false, &rows, units, &Layout::Uniform(t));
        for (u, got) in got.iter().enumerate() {
            let mut exact = 0.0;
            for i in 0..inputs {
                for j in 0..width {
                    let g: f64 =
                        (u * t..(u + 1) * t).map(|r| f64::from(a[r * inputs + i]) * f64::from(d[r * width + j])).sum();
                    exact += g * g;
                }
            }
            assert!((got - exact).abs() <= 1e-12 * exact, "unit {u}: {got} vs {exact}");
        }
        for (norm, clip) in [(3.0, 1.0), (1.0 + 1e-12, 1.0), (7.0, 0.3), (0.5, 1.0)] {
            let c = clip_factors(&[norm], clip).unwrap()[0];
            assert!(f64::from(c) * norm <= clip, "{norm} {clip}: {c}");
        }
        assert!(clip_factors(&[f64::NAN], 1.0).is_err(), "a NaN norm is refused, not left unclipped");
    }

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
