use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

use super::{MarginalsPlan, MarginalsSampler};
use crate::accounting::accountant::AccountingOptions;
use crate::data::domain::Domain;
use crate::generators::Sampler;
use crate::output::SyntheticValue;
use crate::spec::JobSpec;

const DEMO: &str = include_str!("../../../../examples/demo.toml");

/// The demo's marginals job measuring `pairs` (TOML).
fn job(pairs: &str) -> JobSpec {
    let (head, rest) = DEMO.split_once("pairs = ").unwrap();
    let rest = &rest[rest.find('\n').unwrap()..];
    JobSpec::parse(&format!("{head}pairs = {pairs}{rest}"), "demo.toml").unwrap()
}

const TRIANGLE: &str = r#"[["heart_rate", "sbp"], ["sbp", "dbp"], ["dbp", "heart_rate"]]"#;

#[test]
fn pairs_may_form_cycles_but_not_oversized_cliques() {
    let spec = job(TRIANGLE);
    let domain = Domain::from_spec(&spec);
    let plan = MarginalsPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    assert_eq!(plan.task.tables.len(), domain.columns.len() + 3);
    // Every pair of columns: the model would need one clique over all of them.
    let names: Vec<&str> = domain.columns.iter().map(|c| c.name.as_str()).collect();
    let all: Vec<String> = names
        .iter()
        .enumerate()
        .flat_map(|(i, a)| names[i + 1..].iter().map(move |b| format!(r#"["{a}", "{b}"]"#)))
        .collect();
    let spec = job(&format!("[{}]", all.join(", ")));
    let error =
        MarginalsPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap_err().to_string();
    assert!(error.contains("clique"), "{error}");
    let spec = job(r#"[["sbp", "dbp"], ["dbp", "sbp"]]"#);
    assert!(
        MarginalsPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default())
            .unwrap_err()
            .to_string()
            .contains("twice")
    );
}

#[test]
fn rows_follow_consistent_tables_of_a_cycle() {
    // Exact tables of a known table of rows over (heart_rate, sbp, dbp): the triangle's
    // model is their 3-way clique, and rows drawn from it reproduce every pair.
    let spec = job(TRIANGLE);
    let domain = Domain::from_spec(&spec);
    let plan = MarginalsPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    let [hr, sbp, dbp] = ["heart_rate", "sbp", "dbp"].map(|n| domain.index_of(n).unwrap());
    let rows: Vec<Vec<usize>> = (0..6000)
        .map(|i| {
            let mut bins: Vec<usize> = domain.columns.iter().map(|c| i % c.bins()).collect();
            bins[hr] = 5 + i % 3;
            bins[sbp] = bins[hr] + (i / 3) % 2;
            bins[dbp] = if i % 5 == 0 { 2 } else { bins[sbp] - 3 };
            bins
        })
        .collect();
    let sizes = plan.task.table_sizes();
    let mut counts = vec![0.0; plan.task.cells()];
    for row in &rows {
        let mut offset = 0;
        for (table, size) in plan.task.tables.iter().zip(&sizes) {
            counts[offset + table.iter().fold(0, |acc, &c| acc * domain.columns[c].bins() + row[c])] += 1.0;
            offset += size;
        }
    }
    let mut sampler = MarginalsSampler::new(plan.clone(), &counts, 1.0);
    assert!((sampler.noisy_total() - 6000.0).abs() < 1e-6);
    let n = 30_000;
    let drawn = sampler.sample(n, &mut ChaCha20Rng::seed_from_u64(9)).rows;
    let bin = |row: &[SyntheticValue], c: usize| match row[c] {
        SyntheticValue::Integer(v) => domain.columns[c].bin(Some(v as f64)),
        // The fitted model keeps a sliver of mass on every cell, the missing bin's too.
        _ => usize::MAX,
    };
    for (a, b) in [(hr, sbp), (sbp, dbp), (dbp, hr)] {
        for (x, y) in [(5, 5), (5, 6), (6, 3), (7, 2), (6, 4)] {
            let p = rows.iter().filter(|r| r[a] == x && r[b] == y).count() as f64 / rows.len() as f64;
            let seen = drawn.iter().filter(|r| bin(r, a) == x && bin(r, b) == y).count() as f64 / n as f64;
            // Five binomial standard errors of the draw, plus the fit's tolerance.
            let tolerance = 5.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-3;
            assert!((seen - p).abs() < tolerance, "({a}, {b}) = ({x}, {y}): {seen} vs {p}");
        }
    }
}
