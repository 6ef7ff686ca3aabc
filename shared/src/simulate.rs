//! A built-in simulator of a realistic *longitudinal* private dataset, so the demo runs on
//! a fresh machine with no data: ICU-like vital signs from a hidden Markov model. Each
//! patient has 4–50 charted visits; a hidden state (stable, deteriorating, critical)
//! drifts between visits and drives heart rate, respiratory rate, temperature, SpO₂,
//! blood pressure, cardiac rhythm and pain score; some measurements are missing.
//!
//! The data are simulated (no real person is in them), so the generator may be seeded
//! for reproducible demos; nothing here draws privacy noise.

use std::fmt::Write as _;

use chrono::{Duration, NaiveDate};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal};

use crate::sampling::pick;

/// Column header of the simulated CSV.
pub const HEADER: &str = "patient_id,charttime,heart_rate,resp_rate,temperature,spo2,sbp,dbp,rhythm,pain";

/// Cardiac rhythms the simulator emits (the demo spec declares exactly these).
pub const RHYTHMS: [&str; 4] = ["sinus", "afib", "svt", "vtach"];

/// Per hidden state: means of HR, RR, temperature, SpO₂, SBP, DBP, and rhythm weights.
const STATES: [([f64; 6], [f64; 4]); 3] = [
    ([78.0, 16.0, 36.9, 97.0, 122.0, 76.0], [0.92, 0.06, 0.02, 0.0]),
    ([102.0, 22.0, 37.9, 93.0, 106.0, 66.0], [0.70, 0.20, 0.08, 0.02]),
    ([126.0, 29.0, 38.7, 87.0, 88.0, 52.0], [0.45, 0.30, 0.15, 0.10]),
];
const SPREAD: [f64; 6] = [9.0, 3.0, 0.4, 2.0, 12.0, 8.0];
const TRANSITIONS: [[f64; 3]; 3] = [[0.85, 0.13, 0.02], [0.25, 0.60, 0.15], [0.05, 0.30, 0.65]];

/// Simulates `patients` patients; returns the CSV text (header included).
pub fn icu_vitals_csv(patients: usize, seed: u64) -> String {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = NaiveDate::from_ymd_opt(2025, 1, 1).unwrap().and_hms_opt(0, 0, 0).unwrap();
    let mut out = String::from(HEADER);
    out.push('\n');
    for p in 0..patients {
        let visits = rng.random_range(4..=50);
        let mut time = start + Duration::minutes(rng.random_range(0..365 * 24 * 60));
        let mut state = pick(&[0.6, 0.3, 0.1], &mut rng);
        for _ in 0..visits {
            let (means, rhythm_weights) = STATES[state];
            let mut vitals = [0.0; 6];
            for (k, v) in vitals.iter_mut().enumerate() {
                *v = Normal::new(means[k], SPREAD[k]).unwrap().sample(&mut rng);
            }
            let missing = |rng: &mut ChaCha8Rng| rng.random::<f64>() < 0.05;
            let field = |v: f64, decimals: usize, rng: &mut ChaCha8Rng| {
                if missing(rng) { String::new() } else { format!("{v:.decimals$}") }
            };
            let rhythm = RHYTHMS[pick(&rhythm_weights, &mut rng)];
            let pain = (rng.random_range(0..=3) + 3 * state as i64).min(10);
            let _ = writeln!(
                out,
                "P{p:05},{},{},{},{},{},{},{},{rhythm},{}",
                time.format("%Y-%m-%d %H:%M:%S"),
                field(vitals[0].clamp(30.0, 220.0), 0, &mut rng),
                field(vitals[1].clamp(4.0, 60.0), 0, &mut rng),
                field(vitals[2].clamp(33.0, 42.0), 1, &mut rng),
                field(vitals[3].clamp(60.0, 100.0), 0, &mut rng),
                field(vitals[4].clamp(50.0, 250.0), 0, &mut rng),
                field(vitals[5].clamp(20.0, 150.0), 0, &mut rng),
                if missing(&mut rng) { String::new() } else { pain.to_string() },
            );
            time += Duration::minutes(rng.random_range(30..8 * 60));
            state = pick(&TRANSITIONS[state], &mut rng);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patients_have_4_to_50_visits() {
        let csv = icu_vitals_csv(50, 1);
        let mut per_patient = std::collections::HashMap::<&str, usize>::new();
        for line in csv.lines().skip(1) {
            *per_patient.entry(line.split(',').next().unwrap()).or_default() += 1;
        }
        assert_eq!(per_patient.len(), 50);
        assert!(per_patient.values().all(|n| (4..=50).contains(n)));
        assert!(csv.lines().skip(1).all(|l| l.split(',').count() == 10));
    }
}
