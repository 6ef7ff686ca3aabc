//! A simulated MIMIC-shaped database, the demo data of a database job: patients →
//! admissions → vital signs charted during each admission, with dependence across the
//! levels. A latent frailty (from age, comorbidity and chance) makes a patient's
//! admissions more frequent, more often emergencies, longer and more often fatal, and
//! their vitals worse (faster heart and breathing, lower SpO₂); vitals are AR(1) within an
//! admission (lag-1 autocorrelation 0.6). Keys are unique, every admission's patient and
//! every chart's admission exist, admissions of one patient do not overlap and nothing
//! follows a death, and a chart time lies inside its admission.
//!
//! The data are simulated (no real person is in them), so the generator may be seeded;
//! nothing here draws privacy noise.

use std::fmt::Write as _;

use chrono::{Duration, NaiveDate, NaiveDateTime};
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Poisson};

use super::normal;
use crate::sampling::pick;

pub const PATIENTS_HEADER: &str = "subject_id,age,sex,comorbidity";
pub const ADMISSIONS_HEADER: &str = "hadm_id,subject_id,admittime,dischtime,admission_type,outcome";
pub const VITALS_HEADER: &str = "subject_id,hadm_id,charttime,heart_rate,resp_rate,spo2";

pub const COMORBIDITIES: [&str; 3] = ["none", "mild", "severe"];
pub const ADMISSION_TYPES: [&str; 3] = ["emergency", "urgent", "elective"];
pub const OUTCOMES: [&str; 3] = ["home", "transfer", "died"];

/// Lag-1 autocorrelation of every vital within an admission.
pub const VITALS_RHO: f64 = 0.6;

const TIME: &str = "%Y-%m-%d %H:%M:%S";

/// The three tables as CSV text (headers included).
#[derive(Clone, Debug, PartialEq)]
pub struct Database {
    pub patients: String,
    pub admissions: String,
    pub vitals: String,
}

/// Simulates `patients` patients with their admissions and vitals.
pub fn database_csv(patients: usize, seed: u64) -> Database {
    // Simulated people, the demo's data (no real row): public randomness, seeded.
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let start = NaiveDate::from_ymd_opt(2024, 1, 1).unwrap().and_hms_opt(0, 0, 0).unwrap();
    let mut db = Database {
        patients: format!("{PATIENTS_HEADER}\n"),
        admissions: format!("{ADMISSIONS_HEADER}\n"),
        vitals: format!("{VITALS_HEADER}\n"),
    };
    let mut hadm = 0u64;
    for p in 0..patients {
        let subject = format!("S{p:06}");
        let age: u32 = rng.random_range(18..=90);
        let old = f64::from(age - 18) / 72.0;
        let comorbidity = pick(&[0.55 - 0.3 * old, 0.3, 0.15 + 0.3 * old], &mut rng);
        let frailty = (0.6 * old + [0.0, 0.3, 0.7][comorbidity] + 0.2 * normal(&mut rng)).clamp(0.0, 1.5);
        let sex = if rng.random::<f64>() < 0.5 { "F" } else { "M" };
        let _ = writeln!(db.patients, "{subject},{age},{sex},{}", COMORBIDITIES[comorbidity]);

        let admissions = 1 + Poisson::new(0.4 + 2.0 * frailty).unwrap().sample(&mut rng) as usize;
        let mut admit = start + Duration::hours(rng.random_range(0..180 * 24));
        for _ in 0..admissions {
            hadm += 1;
            let kind = pick(&[0.3 + 0.4 * frailty / 1.5, 0.3, 0.4 - 0.4 * frailty / 1.5], &mut rng);
            let emergency = kind == 0;
            let hours = (24.0 * (1.0 + frailty) * (0.5 * normal(&mut rng)).exp() * if emergency { 1.5 } else { 1.0 })
                .clamp(4.0, 30.0 * 24.0)
                .round() as i64;
            let discharge = admit + Duration::hours(hours);
            let died = 0.01 + 0.08 * frailty + if emergency { 0.03 } else { 0.0 };
            let outcome = pick(&[0.85 - died, 0.15, died], &mut rng);
            let _ = writeln!(
                db.admissions,
                "H{hadm:07},{subject},{},{},{},{}",
                admit.format(TIME),
                discharge.format(TIME),
                ADMISSION_TYPES[kind],
                OUTCOMES[outcome]
            );
            chart(&mut db.vitals, (&subject, hadm), (admit, discharge), frailty, emergency, &mut rng);
            if outcome == 2 {
                break;
            }
            // The next admission after this one's discharge: sooner for the frail.
            let days = (60.0 * (1.6 - frailty) * (0.7 * normal(&mut rng)).exp()).clamp(2.0, 720.0);
            admit = discharge + Duration::hours((days * 24.0) as i64);
        }
    }
    db
}

/// Vitals charted every 1 to 4 hours strictly inside the admission, AR(1) around means
/// the patient's frailty and an emergency admission shift.
fn chart(
    out: &mut String,
    (subject, hadm): (&str, u64),
    (admit, discharge): (NaiveDateTime, NaiveDateTime),
    frailty: f64,
    emergency: bool,
    rng: &mut ChaCha8Rng,
) {
    let acute = if emergency { 1.0 } else { 0.0 };
    let means = [80.0 + 22.0 * frailty + 8.0 * acute, 16.0 + 5.0 * frailty + 2.0 * acute, 97.5 - 4.0 * frailty - acute];
    let spread = [10.0, 3.0, 1.5];
    let innovation = (1.0 - VITALS_RHO * VITALS_RHO).sqrt();
    let mut deviation: [f64; 3] = std::array::from_fn(|k| spread[k] * normal(rng));
    let mut time = admit + Duration::minutes(rng.random_range(10..60));
    while time < discharge {
        let [hr, rr, spo2] = std::array::from_fn(|k| means[k] + deviation[k]);
        let _ = writeln!(
            out,
            "{subject},H{hadm:07},{},{:.0},{:.0},{:.0}",
            time.format(TIME),
            hr.clamp(30.0, 220.0),
            rr.clamp(4.0, 60.0),
            spo2.clamp(60.0, 100.0)
        );
        for (k, d) in deviation.iter_mut().enumerate() {
            *d = VITALS_RHO * *d + innovation * spread[k] * normal(rng);
        }
        time += Duration::minutes(rng.random_range(60..=240));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn rows(csv: &str) -> Vec<Vec<&str>> {
        csv.lines().skip(1).map(|l| l.split(',').collect()).collect()
    }

    fn time(text: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(text, TIME).unwrap()
    }

    /// Keys are unique and every reference resolves; admissions of a patient follow one
    /// another without overlap, none after a death; every chart lies inside its admission;
    /// the same seed gives the same database.
    #[test]
    fn the_database_keeps_its_keys_and_times() {
        let db = database_csv(300, 5);
        assert_eq!(db, database_csv(300, 5));
        let patients = rows(&db.patients);
        let admissions = rows(&db.admissions);
        let vitals = rows(&db.vitals);
        assert_eq!(patients.len(), 300);
        let subjects: HashMap<&str, ()> = patients.iter().map(|r| (r[0], ())).collect();
        assert_eq!(subjects.len(), 300);
        let mut stays: HashMap<&str, (NaiveDateTime, NaiveDateTime)> = HashMap::new();
        let mut last: HashMap<&str, (NaiveDateTime, &str)> = HashMap::new();
        for a in &admissions {
            assert!(subjects.contains_key(a[1]), "admission {} of unknown patient {}", a[0], a[1]);
            let (admit, discharge) = (time(a[2]), time(a[3]));
            assert!(admit < discharge);
            if let Some((previous_discharge, previous_outcome)) = last.get(a[1]) {
                assert!(*previous_discharge < admit, "overlapping admissions of {}", a[1]);
                assert_ne!(*previous_outcome, "died", "an admission after a death");
            }
            last.insert(a[1], (discharge, a[5]));
            assert!(stays.insert(a[0], (admit, discharge)).is_none(), "admission key {} twice", a[0]);
        }
        let mut charted: HashMap<&str, usize> = HashMap::new();
        for v in &vitals {
            let (admit, discharge) = stays[v[1]];
            let at = time(v[2]);
            assert!(admit < at && at < discharge, "chart {} outside {}..{}", v[2], admit, discharge);
            *charted.entry(v[1]).or_default() += 1;
        }
        assert!(charted.len() as f64 > 0.95 * stays.len() as f64, "most admissions have vitals");
    }

    /// The levels depend on one another: patients with severe comorbidity have more
    /// admissions, and their charted heart rates and SpO₂ are worse, than those with none;
    /// and heart rate is autocorrelated within an admission.
    #[test]
    fn sicker_patients_have_more_admissions_and_worse_vitals() {
        let db = database_csv(2000, 9);
        let comorbidity: HashMap<&str, &str> = rows(&db.patients).into_iter().map(|r| (r[0], r[3])).collect();
        let admissions = rows(&db.admissions);
        let patient_of: HashMap<&str, &str> = admissions.iter().map(|a| (a[0], a[1])).collect();
        let mut count: HashMap<&str, f64> = HashMap::new();
        for a in &admissions {
            *count.entry(a[1]).or_default() += 1.0;
        }
        // The mean of a value over the rows of one comorbidity group.
        let mean_by = |group: &str, values: &[(&str, f64)]| {
            let picked: Vec<f64> = values.iter().filter(|(s, _)| comorbidity[s] == group).map(|(_, v)| *v).collect();
            picked.iter().sum::<f64>() / picked.len() as f64
        };
        let counts: Vec<(&str, f64)> = count.into_iter().collect();
        let (none, severe) = (mean_by("none", &counts), mean_by("severe", &counts));
        // Poisson means 0.4 + 2·frailty: about 1.4 + 0.5 against 1.4 + 1.7 (frailty ≈ 0.27 and 0.9).
        assert!(severe > none + 0.8, "admissions: severe {severe:.2}, none {none:.2}");
        let vitals = rows(&db.vitals);
        let by_vital = |k: usize| -> Vec<(&str, f64)> {
            vitals.iter().map(|v| (patient_of[v[1]], v[k].parse::<f64>().unwrap())).collect()
        };
        assert!(vitals.iter().all(|v| patient_of[v[1]] == v[0]), "a chart's patient is its admission's");
        let (heart, spo2) = (by_vital(3), by_vital(5));
        let (hr_none, hr_severe) = (mean_by("none", &heart), mean_by("severe", &heart));
        assert!(hr_severe > hr_none + 8.0, "heart rate: severe {hr_severe:.1}, none {hr_none:.1}");
        let (spo2_none, spo2_severe) = (mean_by("none", &spo2), mean_by("severe", &spo2));
        assert!(spo2_severe < spo2_none - 1.5, "SpO2: severe {spo2_severe:.1}, none {spo2_none:.1}");
        // Lag-1 of heart rate within admissions, around each admission's own mean.
        let mut by_stay: HashMap<&str, Vec<f64>> = HashMap::new();
        for v in &vitals {
            by_stay.entry(v[1]).or_default().push(v[3].parse().unwrap());
        }
        let (mut num, mut den) = (0.0, 0.0);
        for series in by_stay.values().filter(|s| s.len() >= 3) {
            let mean = series.iter().sum::<f64>() / series.len() as f64;
            num += series.windows(2).map(|w| (w[0] - mean) * (w[1] - mean)).sum::<f64>();
            den += series.iter().map(|v| (v - mean).powi(2)).sum::<f64>();
        }
        let lag1 = num / den;
        // ρ = 0.6, less the bias of centring each short series on its own mean.
        assert!((0.35..0.65).contains(&lag1), "heart rate lag-1 {lag1:.2}");
    }
}
