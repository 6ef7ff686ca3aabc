use super::AimPlan;
use super::rounds::Schedule;
use crate::accounting::accountant::{Accountant, AccountingOptions, account};
use crate::data::domain::Domain;
use crate::spec::JobSpec;
use crate::testing::{demo_job, generator};

/// The demo's job as an AIM job with `section` under `[generator.aim]`.
fn job(section: &str) -> JobSpec {
    demo_job(&generator("aim", section))
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

/// A table shaped like the census extract a newcomer tried (#37): 42 columns with the
/// census-income data's domain sizes (`0` a numeric column with the default bins), or
/// `columns` of them cycled, under `[generator.aim]` `section`.
fn census_like(columns: usize, section: &str) -> Result<JobSpec, crate::spec::SpecError> {
    const SIZES: [usize; 42] = [
        0, 9, 52, 47, 17, 0, 3, 7, 24, 15, 5, 10, 2, 3, 6, 8, 0, 0, 0, 6, 6, 51, 38, 8, 0, 10, 9, 10, 3, 4, 7, 5, 43,
        43, 43, 5, 3, 3, 3, 0, 2, 2,
    ];
    let mut text = String::from(
        "[job]\ndataset_id = \"census\"\n[input]\nurls = [\"census.csv\"]\n[schema]\nunit_column = \"id\"\n\
         [[schema.columns]]\nname = \"id\"\nkind = \"identifier\"\n",
    );
    for c in 0..columns {
        text += &match SIZES[c % SIZES.len()] {
            0 => format!("[[schema.columns]]\nname = \"c{c}\"\nkind = \"integer\"\nmin = 0\nmax = 100000\n"),
            n => {
                let categories: Vec<String> = (0..n).map(|i| format!("\"v{i}\"")).collect();
                format!(
                    "[[schema.columns]]\nname = \"c{c}\"\nkind = \"categorical\"\ncategories = [{}]\n",
                    categories.join(", ")
                )
            }
        };
    }
    text += "[privacy]\nepsilon = 1.0\ndelta = 1e-6\naccountant = \"rdp\"\nledger = \"./ledger\"\n";
    text += &format!("[generator]\nname = \"aim\"\n[generator.aim]\n{section}\n[output]\nurl = \"./out\"\n");
    JobSpec::parse(&text, "census.toml")
}

/// With no workload, AIM plans a 42- and an 80-column table that every triple would not
/// fit: every pair, then the triples of the smallest tables while the candidate tables
/// fit the cell budget, said in the plan's words. `all-triples` is refused there with a
/// message that names `auto`; a misspelt rule names the three.
#[test]
fn the_default_workload_fits_wide_tables() {
    for columns in [42, 80] {
        let spec = census_like(columns, "").unwrap();
        let domain = Domain::from_spec(&spec);
        let plan = AimPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
        let sizes: Vec<f64> = domain.columns.iter().map(|c| c.bins() as f64).collect();
        let total: f64 = plan.task.tables.iter().map(|t| t.iter().map(|&c| sizes[c]).product::<f64>()).sum();
        assert!(total <= super::plan::MAX_CANDIDATE_CELLS, "{columns}: {total}");
        let pairs = plan.task.tables.iter().filter(|t| t.len() == 2).count();
        let triples = plan.task.tables.iter().filter(|t| t.len() == 3).count();
        assert_eq!(pairs, columns * (columns - 1) / 2, "{columns}: every pair");
        assert!(triples > 0 && triples < columns * (columns - 1) * (columns - 2) / 6, "{columns}: {triples}");
        // The triples taken are the smallest: none left out is smaller than one taken.
        let cells = |t: &Vec<usize>| t.iter().map(|&c| sizes[c]).product::<f64>();
        let taken: std::collections::HashSet<&Vec<usize>> = plan.task.tables.iter().filter(|t| t.len() == 3).collect();
        let largest_taken = taken.iter().map(|t| cells(t)).fold(0.0, f64::max);
        for a in 0..columns {
            for b in a + 1..columns {
                for c in b + 1..columns {
                    let t = vec![a, b, c];
                    assert!(taken.contains(&t) || cells(&t) >= largest_taken, "{columns}: {t:?} left out");
                }
            }
        }
        assert!(plan.workload.starts_with("auto:") && plan.workload.contains("cells"), "{}", plan.workload);
        let triples = census_like(columns, "workload = \"all-triples\"").unwrap();
        let refused = AimPlan::new(&triples, &domain, &AccountingOptions::default()).unwrap_err();
        assert!(refused.to_string().contains("\"auto\""), "{refused}");
        let pairs = census_like(columns, "workload = \"all-pairs\"").unwrap();
        let plan = AimPlan::new(&pairs, &domain, &AccountingOptions::default()).unwrap();
        assert!(plan.task.tables.iter().all(|t| t.len() <= 2));
    }
    let misspelt = census_like(42, "workload = \"all-pair\"").unwrap_err();
    assert!(misspelt.to_string().contains("all-pairs"), "{misspelt}");
    // A small table keeps every triple.
    let spec = job("");
    let plan = AimPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
    assert_eq!(plan.workload.split(';').next(), Some("auto: every set of three columns"));
}
