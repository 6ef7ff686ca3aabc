//! The coordinator's optimizer, applied to its f64 master copy of the parameters after
//! noise was added. Post-processing of the noisy gradient: no privacy cost of its own.

use serde::{Deserialize, Serialize};

/// Learning-rate schedule over the run's steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Constant,
    /// Cosine decay from the base rate to 0 at the last step.
    Cosine,
}

impl Schedule {
    pub fn rate(self, base: f64, step: u64, steps: u64) -> f64 {
        match self {
            Schedule::Constant => base,
            Schedule::Cosine => {
                let progress = step as f64 / steps.max(1) as f64;
                0.5 * base * (1.0 + (std::f64::consts::PI * progress.min(1.0)).cos())
            }
        }
    }
}

/// Optimizer choice and hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerSpec {
    Adam { lr: f64, beta1: f64, beta2: f64, eps: f64 },
    Sgd { lr: f64, momentum: f64 },
}

impl Default for OptimizerSpec {
    fn default() -> Self {
        OptimizerSpec::Adam { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8 }
    }
}

/// Optimizer state: everything a checkpoint must hold to resume exactly.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Optimizer {
    pub spec: OptimizerSpec,
    pub schedule: Schedule,
    pub steps: u64,
    pub step: u64,
    /// First moment (Adam) or velocity (SGD). Stored apart from the JSON header.
    #[serde(skip)]
    m: Vec<f64>,
    /// Second moment (Adam only).
    #[serde(skip)]
    v: Vec<f64>,
}

impl Optimizer {
    pub fn new(spec: OptimizerSpec, schedule: Schedule, steps: u64, parameters: usize) -> Self {
        let v = if matches!(spec, OptimizerSpec::Adam { .. }) { vec![0.0; parameters] } else { Vec::new() };
        Self { spec, schedule, steps, step: 0, m: vec![0.0; parameters], v }
    }

    /// The moment vectors (first, second), for checkpoints.
    pub fn moments(&self) -> [&[f64]; 2] {
        [&self.m, &self.v]
    }

    /// Restores moments saved by [`Optimizer::moments`]. An SGD optimizer has no second
    /// moment: a checkpoint stores it padded with zeros, which is accepted and dropped.
    pub fn restore_moments(&mut self, m: Vec<f64>, v: Vec<f64>) -> Result<(), String> {
        let adam = matches!(self.spec, OptimizerSpec::Adam { .. });
        if adam && m.len() != v.len() {
            return Err(format!("moments of {} and {} values", m.len(), v.len()));
        }
        self.v = if adam { v } else { Vec::new() };
        self.m = m;
        Ok(())
    }

    /// One step: `params -= update(gradient)`.
    pub fn step(&mut self, params: &mut [f64], gradient: &[f64]) {
        assert_eq!(params.len(), gradient.len(), "gradient and parameters differ in length");
        match self.spec {
            OptimizerSpec::Adam { lr, beta1, beta2, eps } => {
                let t = (self.step + 1) as i32;
                let lr = self.schedule.rate(lr, self.step, self.steps);
                let (c1, c2) = (1.0 - beta1.powi(t), 1.0 - beta2.powi(t));
                for (((p, g), m), v) in params.iter_mut().zip(gradient).zip(&mut self.m).zip(&mut self.v) {
                    *m = beta1 * *m + (1.0 - beta1) * g;
                    *v = beta2 * *v + (1.0 - beta2) * g * g;
                    *p -= lr * (*m / c1) / ((*v / c2).sqrt() + eps);
                }
            }
            OptimizerSpec::Sgd { lr, momentum } => {
                let lr = self.schedule.rate(lr, self.step, self.steps);
                for ((p, g), m) in params.iter_mut().zip(gradient).zip(&mut self.m) {
                    *m = momentum * *m + g;
                    *p -= lr * *m;
                }
            }
        }
        self.step += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adam_first_step_moves_each_coordinate_by_the_learning_rate() {
        // Bias correction makes Adam's first update lr·g/|g| (up to eps).
        let mut opt = Optimizer::new(OptimizerSpec::default(), Schedule::Constant, 10, 3);
        let mut p = vec![1.0, 1.0, 1.0];
        opt.step(&mut p, &[0.5, -2.0, 1e-3]);
        for (x, want) in p.iter().zip([1.0 - 1e-3, 1.0 + 1e-3, 1.0 - 1e-3]) {
            assert!((x - want).abs() < 1e-8, "{x} vs {want}");
        }
    }

    #[test]
    fn sgd_momentum_accumulates_velocity() {
        let mut opt = Optimizer::new(OptimizerSpec::Sgd { lr: 0.1, momentum: 0.9 }, Schedule::Constant, 10, 1);
        let mut p = vec![0.0];
        opt.step(&mut p, &[1.0]);
        opt.step(&mut p, &[1.0]);
        // v1 = 1, v2 = 1.9: p = -0.1 - 0.19.
        assert!((p[0] + 0.29).abs() < 1e-12);
    }

    #[test]
    fn cosine_schedule_starts_at_base_and_ends_at_zero() {
        assert_eq!(Schedule::Cosine.rate(2.0, 0, 100), 2.0);
        assert!((Schedule::Cosine.rate(2.0, 50, 100) - 1.0).abs() < 1e-12);
        assert!(Schedule::Cosine.rate(2.0, 100, 100).abs() < 1e-12);
    }
}
