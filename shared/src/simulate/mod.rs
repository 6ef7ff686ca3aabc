//! A built-in simulator of a realistic *longitudinal* private dataset, so the demo runs on
//! a fresh machine with no data: ICU-like vital signs (heart rate, respiratory rate,
//! temperature, SpO₂, blood pressure, cardiac rhythm, pain score), 4–50 charted visits per
//! patient, some measurements missing. What the vitals do over time is chosen
//! ([`Dynamics`]), so a generator is checked on more than one kind of history:
//!
//! - `hidden-state`: a hidden clinical state (stable, deteriorating, critical) drifts
//!   between visits as a Markov chain and sets every vital's mean;
//! - `ar1`: each vital is AR(1) around the stable mean, v_t − μ = ρ·(v_{t−1} − μ) + e_t,
//!   stationary with the stable spread, so its lag-1 autocorrelation is ρ;
//! - `treated`: AR(1) vitals, and at a random visit a treatment that lowers heart rate,
//!   respiratory rate and temperature at every visit after it (a later value follows an
//!   earlier event, not only the previous value).
//!
//! Visits are 30 minutes to 8 hours apart, or with `irregular` bursts of 5–30 minutes
//! between long gaps of up to two days.
//!
//! The data are simulated (no real person is in them), so the generator may be seeded
//! for reproducible demos; nothing here draws privacy noise.

pub mod database;

use std::fmt::Write as _;

use chrono::{Duration, NaiveDate};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Normal, StandardNormal};

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
/// What a treatment takes off HR, RR and temperature at every later visit.
const TREATMENT: [f64; 3] = [15.0, 4.0, 0.8];

/// What the vitals do from visit to visit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dynamics {
    HiddenState,
    Ar1 { rho: f64 },
    Treated { rho: f64 },
}

impl std::str::FromStr for Dynamics {
    type Err = String;

    /// `hidden-state`, `ar1:ρ` or `treated:ρ` (ρ in (−1, 1)).
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, given) = s.split_once(':').map_or((s, None), |(n, r)| (n, Some(r)));
        let rho = || -> Result<f64, String> {
            let r = given.ok_or_else(|| format!("{s}: give ρ, e.g. {s}:0.6"))?;
            match r.parse::<f64>() {
                Ok(v) if v.abs() < 1.0 => Ok(v),
                _ => Err(format!("{s}: ρ must be a number in (−1, 1)")),
            }
        };
        match name {
            "hidden-state" if given.is_none() => Ok(Dynamics::HiddenState),
            "ar1" => Ok(Dynamics::Ar1 { rho: rho()? }),
            "treated" => Ok(Dynamics::Treated { rho: rho()? }),
            _ => Err(format!("unknown dynamics {s:?}: hidden-state, ar1:ρ or treated:ρ")),
        }
    }
}

/// A simulated cohort's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cohort {
    pub patients: usize,
    pub dynamics: Dynamics,
    pub irregular: bool,
}

/// Simulates `patients` patients of the hidden-state cohort; returns the CSV text.
pub fn icu_vitals_csv(patients: usize, seed: u64) -> String {
    cohort_csv(&Cohort { patients, dynamics: Dynamics::HiddenState, irregular: false }, seed)
}

/// Simulates a cohort; returns the CSV text (header included).
pub fn cohort_csv(cohort: &Cohort, seed: u64) -> String {
    // Simulated people, the demo's data (no real row): public randomness, seeded.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = NaiveDate::from_ymd_opt(2025, 1, 1).unwrap().and_hms_opt(0, 0, 0).unwrap();
    let mut out = String::from(HEADER);
    out.push('\n');
    let (stable, stable_rhythm) = STATES[0];
    for p in 0..cohort.patients {
        let visits = rng.random_range(4..=50);
        let mut time = start + Duration::minutes(rng.random_range(0..365 * 24 * 60));
        let mut state = pick(&[0.6, 0.3, 0.1], &mut rng);
        // AR(1): the previous deviations from the stable means, drawn stationary; the
        // pain level; the visit after which a treatment acts.
        let autoregressive = match cohort.dynamics {
            Dynamics::HiddenState => None,
            Dynamics::Ar1 { rho } | Dynamics::Treated { rho } => Some(rho),
        };
        let mut deviation = [0.0; 6];
        let (mut pain_level, mut treated_at) = (0.0, visits);
        if autoregressive.is_some() {
            deviation = std::array::from_fn(|k| SPREAD[k] * normal(&mut rng));
            pain_level = 2.0 + 1.5 * normal(&mut rng);
            if matches!(cohort.dynamics, Dynamics::Treated { .. }) {
                treated_at = rng.random_range(0..visits - 1);
            }
        }
        for visit in 0..visits {
            let (vitals, rhythm_weights) = match autoregressive {
                None => {
                    let (means, weights) = STATES[state];
                    (std::array::from_fn(|k| Normal::new(means[k], SPREAD[k]).unwrap().sample(&mut rng)), weights)
                }
                Some(rho) => {
                    if visit > 0 {
                        let innovation = (1.0 - rho * rho).sqrt();
                        for (k, d) in deviation.iter_mut().enumerate() {
                            *d = rho * *d + innovation * SPREAD[k] * normal(&mut rng);
                        }
                        pain_level = 2.0 + rho * (pain_level - 2.0) + innovation * 1.5 * normal(&mut rng);
                    }
                    let mut vitals: [f64; 6] = std::array::from_fn(|k| stable[k] + deviation[k]);
                    if visit > treated_at {
                        vitals.iter_mut().zip(TREATMENT).for_each(|(v, t)| *v -= t);
                    }
                    (vitals, stable_rhythm)
                }
            };
            let missing = |rng: &mut ChaCha8Rng| rng.random::<f64>() < 0.05;
            let field = |v: f64, decimals: usize, rng: &mut ChaCha8Rng| {
                if missing(rng) { String::new() } else { format!("{v:.decimals$}") }
            };
            let rhythm = RHYTHMS[pick(&rhythm_weights, &mut rng)];
            let pain = match autoregressive {
                None => (rng.random_range(0..=3) + 3 * state as i64).min(10),
                Some(_) => pain_level.round().clamp(0.0, 10.0) as i64,
            };
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
            let minutes = if cohort.irregular && rng.random::<f64>() < 0.6 {
                rng.random_range(5..30)
            } else if cohort.irregular {
                rng.random_range(8 * 60..48 * 60)
            } else {
                rng.random_range(30..8 * 60)
            };
            time += Duration::minutes(minutes);
            if autoregressive.is_none() {
                state = pick(&TRANSITIONS[state], &mut rng);
            }
        }
    }
    out
}

pub(crate) fn normal(rng: &mut ChaCha8Rng) -> f64 {
    StandardNormal.sample(rng)
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

    /// Per patient, its rows' fields (CSV text split on commas), in visit order.
    fn patients(csv: &str) -> Vec<Vec<Vec<String>>> {
        let mut out: Vec<Vec<Vec<String>>> = Vec::new();
        let mut last = String::new();
        for line in csv.lines().skip(1) {
            let fields: Vec<String> = line.split(',').map(str::to_string).collect();
            if fields[0] != last {
                last = fields[0].clone();
                out.push(Vec::new());
            }
            out.last_mut().unwrap().push(fields);
        }
        out
    }

    /// Pooled lag-1 correlation of column `c` over consecutive present values.
    fn lag1(patients: &[Vec<Vec<String>>], c: usize) -> f64 {
        let tables: Vec<Vec<Vec<f64>>> =
            patients.iter().map(|rows| vec![rows.iter().filter_map(|r| r[c].parse().ok()).collect()]).collect();
        crate::eval::longitudinal::lag1(&tables, 0).unwrap()
    }

    /// AR(1) vitals have lag-1 ρ: 2,000 patients give ≈ 50,000 pairs, a standard error
    /// below (1 − ρ²)/√50,000 ≈ 0.004; rounding to whole units and the 5% missing values
    /// take a little off; tolerance 0.03.
    #[test]
    fn ar1_vitals_have_the_lag1_they_were_given() {
        for rho in [0.2, 0.6] {
            let csv = cohort_csv(&Cohort { patients: 2000, dynamics: Dynamics::Ar1 { rho }, irregular: false }, 3);
            let patients = patients(&csv);
            for (c, name) in [(2, "heart_rate"), (6, "sbp")] {
                let got = lag1(&patients, c);
                assert!((got - rho).abs() < 0.03, "ρ = {rho}, {name}: {got}");
            }
        }
        // The hidden state's vitals persist too, by another mechanism.
        let hidden = patients(&icu_vitals_csv(2000, 3));
        assert!(lag1(&hidden, 2) > 0.3, "{}", lag1(&hidden, 2));
    }

    /// A treatment lowers heart rate at the visits after it: the mean falls by 15 bpm
    /// against the untreated visits (means of thousands of values of spread 9).
    #[test]
    fn treated_patients_have_lower_heart_rates_after_their_treatment() {
        let csv = cohort_csv(&Cohort { patients: 2000, dynamics: Dynamics::Treated { rho: 0.5 }, irregular: false }, 5);
        let (first, last): (Vec<f64>, Vec<f64>) = patients(&csv)
            .iter()
            .filter_map(|rows| Some((rows[0][2].parse::<f64>().ok()?, rows.last()?[2].parse::<f64>().ok()?)))
            .unzip();
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        // The last visit is always after the treatment, the first never.
        assert!((mean(&first) - mean(&last) - 15.0).abs() < 1.5, "{} → {}", mean(&first), mean(&last));
    }

    /// Irregular sampling has bursts (gaps under half an hour) and long gaps (over 8 h);
    /// regular sampling neither.
    #[test]
    fn irregular_sampling_has_bursts_and_long_gaps() {
        let gaps = |irregular| {
            let csv = cohort_csv(&Cohort { patients: 200, dynamics: Dynamics::HiddenState, irregular }, 9);
            let mut gaps = Vec::new();
            for rows in patients(&csv) {
                let times: Vec<chrono::NaiveDateTime> = rows
                    .iter()
                    .map(|r| chrono::NaiveDateTime::parse_from_str(&r[1], "%Y-%m-%d %H:%M:%S").unwrap())
                    .collect();
                gaps.extend(times.windows(2).map(|w| (w[1] - w[0]).num_minutes()));
            }
            gaps
        };
        let (regular, irregular) = (gaps(false), gaps(true));
        assert!(regular.iter().all(|&m| (30..8 * 60).contains(&m)));
        let share = |v: &[i64], f: fn(i64) -> bool| v.iter().filter(|&&m| f(m)).count() as f64 / v.len() as f64;
        assert!((share(&irregular, |m| m < 30) - 0.6).abs() < 0.05);
        assert!((share(&irregular, |m| m >= 8 * 60) - 0.4).abs() < 0.05);
    }

    #[test]
    fn dynamics_are_named_with_their_rho() {
        assert_eq!("ar1:0.6".parse(), Ok(Dynamics::Ar1 { rho: 0.6 }));
        assert_eq!("treated:0.3".parse(), Ok(Dynamics::Treated { rho: 0.3 }));
        assert_eq!("hidden-state".parse(), Ok(Dynamics::HiddenState));
        for bad in ["ar1", "ar1:1.0", "ar1:x", "hidden-state:0.5", "arima"] {
            assert!(bad.parse::<Dynamics>().is_err(), "{bad}");
        }
    }
}
