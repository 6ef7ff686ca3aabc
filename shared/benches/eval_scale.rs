//! `rhosynth eval` at the scale that made it unusable (2·10⁵ rows × 40 columns: 20 numeric,
//! 19 categorical, a binary target), with the default `EvalLimits`: the time of every
//! stage and what each metric sampled. The data are simulated (three latent factors drive
//! every column; 2 % missing cells); the "synthetic" table is a shifted draw of the same
//! model, the held-out table a quarter of the size.
//!
//! `cargo bench -p rhosynth-shared --bench eval_scale` runs the row-level case, then the
//! longitudinal one (5 rows per unit, ordered by the first numeric column). `EVAL_ROWS`
//! sets the size, `EVAL_ROWS_PER_UNIT` the rows per unit; `-- flat` or `-- longitudinal`
//! runs one case.

use std::time::Instant;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, StandardNormal};
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::table::Table;
use rhosynth_shared::eval::{EvalLimits, evaluate_with};
use rhosynth_shared::spec::JobSpec;

const NUMERIC: usize = 20;
const CATEGORICAL: usize = 19;

fn spec_text(longitudinal: bool) -> String {
    let mut s =
        String::from("[job]\ndataset_id = \"bench\"\n[input]\nurls = [\"unused.csv\"]\n[schema]\ntarget = \"y\"\n");
    if longitudinal {
        s += "unit_column = \"unit\"\norder_by = \"n00\"\n[[schema.columns]]\nname = \"unit\"\nkind = \"identifier\"\n";
    }
    for i in 0..NUMERIC {
        s += &format!("[[schema.columns]]\nname = \"n{i:02}\"\nkind = \"continuous\"\nmin = 0.0\nmax = 100.0\n");
    }
    for i in 0..CATEGORICAL {
        let categories: Vec<String> = (0..3 + i % 10).map(|c| format!("\"c{c}\"")).collect();
        s += &format!(
            "[[schema.columns]]\nname = \"k{i:02}\"\nkind = \"categorical\"\ncategories = [{}]\n",
            categories.join(", ")
        );
    }
    s += "[[schema.columns]]\nname = \"y\"\nkind = \"categorical\"\ncategories = [\"no\", \"yes\"]\n";
    s + "[privacy]\nepsilon = 1.0\ndelta = 1e-5\n[generator]\nname = \"marginals\"\n[output]\nurl = \"unused\"\n"
}

fn table(rng: &mut ChaCha8Rng, rows: usize, rows_per_unit: usize, shift: f64) -> Table {
    let d = NUMERIC + CATEGORICAL + 1;
    let mut columns: Vec<Vec<Option<f64>>> = (0..d).map(|_| Vec::with_capacity(rows)).collect();
    let mut units = Vec::with_capacity(rows);
    for r in 0..rows {
        units.push(format!("u{}", r / rows_per_unit));
        let z: Vec<f64> = (0..3).map(|_| StandardNormal.sample(rng)).collect();
        for (c, column) in columns.iter_mut().enumerate() {
            let latent = z[c % 3] + shift;
            let noise: f64 = StandardNormal.sample(rng);
            let v = if c < NUMERIC {
                (50.0 + 15.0 * latent + 10.0 * noise).clamp(0.0, 100.0)
            } else if c < NUMERIC + CATEGORICAL {
                let k = (3 + (c - NUMERIC) % 10) as f64;
                (((latent + 0.5 * noise) / 4.0 + 0.5) * k).floor().clamp(0.0, k - 1.0)
            } else {
                f64::from(u8::from(z[0] + z[1] + noise > 0.5))
            };
            column.push(if c < d - 1 && rng.random::<f64>() < 0.02 { None } else { Some(v) });
        }
    }
    Table { units, columns }
}

fn case(longitudinal: bool, rows: usize, rows_per_unit: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let spec = JobSpec::parse(&spec_text(longitudinal), "bench").expect("bench spec");
    let domain = Domain::from_spec(&spec);
    let per_unit = if longitudinal { rows_per_unit } else { 1 };
    let train = table(&mut rng, rows, per_unit, 0.0);
    let test = table(&mut rng, rows / 4, per_unit, 0.0);
    let synthetic = table(&mut rng, rows, per_unit, 0.1);
    let name = if longitudinal { format!("longitudinal, {per_unit} rows per unit") } else { "row-level".into() };
    println!("{name}: train {rows} x {} columns, held-out {}, synthetic {rows}", domain.columns.len(), rows / 4);
    let start = Instant::now();
    let report =
        evaluate_with(&spec, &domain, &train, &test, &synthetic, None, &EvalLimits::default(), &|s| println!("  {s}"));
    for t in &report.timings {
        println!("  {:<20} {:>7.1} s", t.stage, t.seconds);
    }
    println!(
        "  total {:.1} s (HIST {:.4}, Pair {:.4}, DCR median {:.4})",
        start.elapsed().as_secs_f64(),
        report.fidelity.hist,
        report.fidelity.pair,
        report.privacy.dcr_synthetic_median
    );
    for u in report.sampling.iter().filter(|u| u.sampled) {
        println!("  sampled: {} ({}): {} of {}", u.metric, u.table, u.used, u.available);
    }
}

fn main() {
    let env = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let (rows, rows_per_unit) = (env("EVAL_ROWS", 200_000), env("EVAL_ROWS_PER_UNIT", 5));
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let wants = |c: &str| args.is_empty() || args.iter().any(|a| a == c);
    if wants("flat") {
        case(false, rows, rows_per_unit);
    }
    if wants("longitudinal") {
        case(true, rows, rows_per_unit);
    }
}
