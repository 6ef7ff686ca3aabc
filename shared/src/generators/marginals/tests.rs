use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;

use super::{MarginalsPlan, MarginalsSampler, MarginalsTask};
use crate::accounting::accountant::AccountingOptions;
use crate::data::EncodedBatch;
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

/// Histories of a unit column `id`, ordered by `t`, a dynamic `x` and a static `s`,
/// flattened over `steps` rows.
fn history_job(steps: u32) -> JobSpec {
    let toml = format!(
        r#"
[job]
dataset_id = "histories"
[input]
urls = ["./histories.csv"]
[schema]
unit_column = "id"
order_by = "t"
[[schema.columns]]
name = "id"
kind = "identifier"
[[schema.columns]]
name = "t"
kind = "integer"
min = 0
max = 9
[[schema.columns]]
name = "x"
kind = "categorical"
categories = ["a", "b", "c"]
[[schema.columns]]
name = "s"
kind = "categorical"
categories = ["u", "v"]
[privacy]
epsilon = 1.0
delta = 1e-6
ledger = "./ledger"
[generator]
name = "marginals"
[generator.marginals]
history_rows = {steps}
static_columns = ["s"]
[output]
url = "./out"
"#
    );
    JobSpec::parse(&toml, "histories.toml").unwrap()
}

/// Rows (unit, [t, x code, s code]) as one batch.
fn batch(rows: &[(&str, [f64; 3])]) -> EncodedBatch {
    let mut batch = EncodedBatch::empty(3);
    for (unit, values) in rows {
        batch.units.push(unit.to_string());
        for (column, v) in batch.values.iter_mut().zip(values) {
            column.push(Some(*v));
        }
    }
    batch
}

/// The tables a counter returns for these batches.
fn count(task: &MarginalsTask, batches: &[EncodedBatch]) -> (Vec<f64>, u64) {
    let mut counter = task.counter().unwrap();
    batches.iter().for_each(|b| counter.add(b));
    counter.finish()
}

#[test]
fn a_history_is_counted_once_as_its_first_rows_in_order() {
    let spec = history_job(2);
    let domain = Domain::from_spec(&spec);
    let plan = MarginalsPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    let task = &plan.task;
    // Variables: length, s, then (t, x) at steps 0 and 1, each with its missing value, and
    // absent; t after the first step is its gap to the previous row, in the bins 0, 1, 2,
    // 3–4 and 5–9. Tables: 6 one-way, 2 columns × 1 adjacent pair.
    assert_eq!(task.sizes(), vec![2, 3, 12, 5, 7, 5]);
    assert_eq!(task.tables.len(), 8);
    assert!((task.sensitivity() - 8f64.sqrt()).abs() < 1e-12);
    // Unit a: four rows read out of order (the first two by t are t = 1 with x = c, then
    // t = 3 with x = b); unit b: one row.
    let rows = [("a", [7.0, 0.0, 1.0]), ("a", [3.0, 1.0, 1.0]), ("b", [5.0, 0.0, 0.0]), ("a", [1.0, 2.0, 0.0])];
    let (counts, units) = count(task, &[batch(&rows[..2]), batch(&rows[2..]), batch(&[("a", [9.0, 0.0, 1.0])])]);
    assert_eq!(units, 2);
    let offsets = task.offsets();
    let table = |i: usize| &counts[offsets[i]..offsets[i + 1]];
    assert_eq!(table(0), [1.0, 1.0]); // lengths 1 (b) and 2 (a)
    assert_eq!(table(1), [2.0, 0.0, 0.0]); // s from each unit's first row: a's (t = 1) and b's u
    let mut t0 = vec![0.0; 12];
    (t0[1], t0[5]) = (1.0, 1.0);
    assert_eq!(table(2), t0);
    assert_eq!(table(3), [1.0, 0.0, 1.0, 0.0, 0.0]); // x at step 0: a (b's), c (a's)
    let mut t1 = vec![0.0; 7];
    (t1[2], t1[6]) = (1.0, 1.0); // a's second row 2 after its first, b absent
    assert_eq!(table(4), t1);
    assert_eq!(table(5), [0.0, 1.0, 0.0, 0.0, 1.0]);
    // x from step 0 to 1: (c, b) for a, (a, absent) for b.
    let mut x01 = vec![0.0; 25];
    (x01[2 * 5 + 1], x01[4]) = (1.0, 1.0);
    assert_eq!(table(7), x01);
    // The same rows split between workers, whole units each, sum to the same tables.
    let (a, _) = count(task, &[batch(&rows[..2]), batch(&rows[3..]), batch(&[("a", [9.0, 0.0, 1.0])])]);
    let (b, _) = count(task, &[batch(&rows[2..3])]);
    assert_eq!(a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>(), counts);
}

#[test]
fn histories_drawn_from_exact_tables_are_whole_and_follow_them() {
    // 3000 units: length 1–3 independent of the values, s alternating, t the step and x a
    // Markov chain (a → b → c → a, or stay): every column is a chain with the same end,
    // which the model represents exactly.
    let spec = history_job(3);
    let domain = Domain::from_spec(&spec);
    let plan = MarginalsPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    let mut rows = Vec::new();
    let mut truth = Vec::new();
    for i in 0..3000usize {
        let length = 1 + i % 3;
        let mut x = (i / 3) % 3;
        let mut history = Vec::new();
        for step in 0..length {
            history.push(x);
            rows.push((format!("u{i}"), [step as f64, x as f64, (i % 2) as f64]));
            if (i / 9 + step) % 2 == 0 {
                x = (x + 1) % 3;
            }
        }
        truth.push(history);
    }
    let rows: Vec<(&str, [f64; 3])> = rows.iter().map(|(u, v)| (u.as_str(), *v)).collect();
    let (counts, units) = count(&plan.task, &[batch(&rows)]);
    assert_eq!(units, 3000);
    let mut sampler = MarginalsSampler::new(plan, &counts, 1.0);
    assert_eq!(sampler.rows_per_draw(), 3);
    let n = 20_000;
    let drawn = sampler.sample(n, &mut ChaCha20Rng::seed_from_u64(3));
    assert_eq!(drawn.units(), n);
    // The fitted model keeps a sliver of mass on every cell (a missing x is 3).
    let x_of = |v: &SyntheticValue| match v {
        SyntheticValue::Category(c) => ["a", "b", "c"].iter().position(|x| x == c).expect("a declared category"),
        _ => 3,
    };
    let t_of = |v: &SyntheticValue| match v {
        SyntheticValue::Integer(t) => *t as f64,
        _ => f64::INFINITY,
    };
    let mut histories = Vec::new();
    let mut steps_seen = 0;
    let mut start = 0;
    for &end in &drawn.ends {
        let h = &drawn.rows[start..end];
        start = end;
        assert!((1..=3).contains(&h.len()));
        // Rows in order of t, s the same on every row.
        assert!(h.windows(2).all(|w| t_of(&w[0][0]) <= t_of(&w[1][0])));
        assert!(h.iter().all(|r| r[2] == h[0][2]));
        steps_seen += h.iter().enumerate().filter(|(s, r)| r[0] == SyntheticValue::Integer(*s as i64)).count();
        histories.push(h.iter().map(|r| x_of(&r[1])).collect::<Vec<usize>>());
    }
    assert!(steps_seen as f64 > 0.99 * drawn.rows.len() as f64, "t is the step in {steps_seen} rows");
    // Shares of events, drawn against true: five binomial standard errors of the draw
    // plus the fit's tolerance.
    type Event = fn(&[usize]) -> bool;
    let share = |hs: &[Vec<usize>], event: Event| hs.iter().filter(|h| event(h)).count() as f64 / hs.len() as f64;
    let events: [(&str, Event); 5] = [
        ("length 1", |h| h.len() == 1),
        ("length 3", |h| h.len() == 3),
        ("x₀ = b", |h| h[0] == 1),
        ("x₀x₁ = ab", |h| h.len() > 1 && h[0] == 0 && h[1] == 1),
        ("x₁x₂ = cc", |h| h.len() > 2 && h[1] == 2 && h[2] == 2),
    ];
    for (name, event) in events {
        let p = share(&truth, event);
        let seen = share(&histories, event);
        let tolerance = 5.0 * (p * (1.0 - p) / n as f64).sqrt() + 2e-3;
        assert!((seen - p).abs() < tolerance, "{name}: {seen} vs {p}");
    }
}
