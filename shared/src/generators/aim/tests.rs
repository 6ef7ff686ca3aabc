use super::AimPlan;
use super::rounds::Schedule;
use crate::accounting::accountant::{Accountant, AccountingOptions, account};
use crate::data::domain::Domain;
use crate::spec::JobSpec;

const DEMO: &str = include_str!("../../../../examples/demo.toml");

/// The demo's job as an AIM job with `section` under `[generator.aim]`.
fn job(section: &str) -> JobSpec {
    let (head, rest) = DEMO.split_once("[generator]").unwrap();
    let output = &rest[rest.find("[output]").unwrap()..];
    JobSpec::parse(&format!("{head}[generator]\nname = \"aim\"\n\n[generator.aim]\n{section}\n{output}"), "demo.toml")
        .unwrap()
}

#[test]
fn candidates_are_the_workloads_subsets_with_their_weights() {
    let spec = job("");
    let domain = Domain::from_spec(&spec);
    let plan = AimPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    let n = domain.columns.len();
    // Default workload: every triple. Candidates: every column, pair and triple.
    let choose = |k: usize| (0..k).fold(1, |acc, i| acc * (n - i) / (i + 1));
    assert_eq!(plan.task.tables.len(), n + choose(2) + choose(3));
    assert!(plan.task.tables[..n].iter().enumerate().all(|(c, t)| t == &vec![c]));
    // A column is in C(n−1, 2) triples; a pair shares two columns with the n−2 triples
    // holding it and one with the 2·C(n−2, 2) holding one of them.
    let pairs_with = (n - 1) * (n - 2) / 2;
    assert_eq!(plan.weights[0], pairs_with as f64);
    let pair = plan.task.tables.iter().position(|t| t.len() == 2).unwrap();
    assert_eq!(plan.weights[pair], (2 * (n - 2) + (n - 2) * (n - 3)) as f64);
    assert_eq!(plan.rounds, 16 * n as u32);
    // ρ spends the job's ε under RDP.
    let epsilon = account(&plan.mechanisms(), Accountant::Rdp, spec.privacy.delta, &AccountingOptions::default())
        .unwrap()
        .epsilon;
    assert!(epsilon <= spec.privacy.epsilon && epsilon > 0.999 * spec.privacy.epsilon, "{epsilon}");
}

#[test]
fn a_named_workload_and_the_accountant_are_checked() {
    let spec = job(r#"workload = [["heart_rate", "spo2"], ["spo2", "heart_rate"], ["rhythm"]]"#);
    let plan = AimPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
    // Every column's 1-way table, and the one pair (named twice).
    assert_eq!(plan.task.tables.len(), Domain::from_spec(&spec).columns.len() + 1);
    let unknown = job(r#"workload = [["heart_rate", "nope"]]"#);
    let error = AimPlan::new(&unknown, &Domain::from_spec(&unknown), &AccountingOptions::default()).unwrap_err();
    assert!(error.to_string().contains("nope"), "{error}");
    let mut pld = job("");
    pld.privacy.accountant = Accountant::Pld;
    let error = AimPlan::new(&pld, &Domain::from_spec(&pld), &AccountingOptions::default()).unwrap_err();
    assert!(error.to_string().contains("rdp"), "{error}");
}

#[test]
fn the_schedule_spends_the_budget_evenly_then_exactly_what_is_left() {
    let spec = job("rounds = 40");
    let plan = AimPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
    let mut schedule = Schedule::new(&plan);
    // Forty rounds of the initial schedule spend ρ, 90 % of each on the measurement and
    // 10 % on the selection: AIM's σ = √(T / (2·0.9·ρ)) and ε = √(8·0.1·ρ / T), as
    // private-pgm's (a default of 90 % on the selection left the measurements three
    // times as noisy: Adult's 2-way TVD 0.039 against 0.027).
    assert!((40.0 * schedule.round_cost() - plan.rho).abs() < 1e-12 * plan.rho);
    let selection = schedule.epsilon * schedule.epsilon / 8.0;
    assert!((selection / schedule.round_cost() - 0.1).abs() < 1e-12);
    assert!((schedule.sigma - (40.0 / (2.0 * 0.9 * plan.rho)).sqrt()).abs() < 1e-9 * schedule.sigma);
    assert!((schedule.epsilon - (8.0 * 0.1 * plan.rho / 40.0).sqrt()).abs() < 1e-9 * schedule.epsilon);
    assert!(!schedule.fit_to(3.0 * schedule.round_cost()));
    let left = 1.5 * schedule.round_cost();
    assert!(schedule.fit_to(left));
    assert!((schedule.round_cost() - left).abs() < 1e-12 * left);
    let before = schedule;
    schedule.anneal();
    assert!((schedule.round_cost() - 4.0 * before.round_cost()).abs() < 1e-9 * before.round_cost());
}

/// With a target, its pairs with every other column are candidates measured first —
/// whatever the workload, but never one larger than the model may hold.
#[test]
fn the_targets_pairs_are_measured_first_within_the_model_limit() {
    let with_target = |section: &str| {
        let mut spec = job(section);
        spec.schema.target = Some("rhythm".into());
        let domain = Domain::from_spec(&spec);
        let plan = AimPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
        let rhythm = domain.index_of("rhythm").unwrap();
        (plan, domain, rhythm)
    };
    let (plan, domain, rhythm) = with_target(r#"workload = [["heart_rate", "spo2"]]"#);
    assert_eq!(plan.target_share, 0.2);
    assert_eq!(plan.target_pairs.len(), domain.columns.len() - 1);
    assert!(plan.target_pairs.iter().all(|&r| plan.task.tables[r].len() == 2 && plan.task.tables[r].contains(&rhythm)));
    // A limit below every pair's cells leaves none to measure first.
    let smallest = (0..domain.columns.len()).map(|c| domain.columns[c].bins()).min().unwrap();
    let limit = (domain.columns[rhythm].bins() * smallest) as f64 - 1.0;
    let (plan, _, _) = with_target(&format!("max_model_cells = {limit}"));
    assert!(
        plan.target_pairs.iter().all(|&r| plan.task.tables[r]
            .iter()
            .map(|&c| domain.columns[c].bins() as f64)
            .product::<f64>()
            <= limit)
    );
    assert!(plan.target_pairs.len() < domain.columns.len() - 1);
}
