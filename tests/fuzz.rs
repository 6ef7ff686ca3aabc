//! Property-based fuzzing of what arrives from outside the coordinator's trust: job specs
//! (submitters), input files (the data, through the job's own CSV and Parquet reader) and
//! worker results (workers are trusted with rows, not with what they send back).
//!
//! Each target runs `PROPTEST_CASES` cases, by default 256 (4096 when `CI` is set; the
//! input-reader target a quarter, since each case writes files): seconds either way. For a
//! longer hunt: `PROPTEST_CASES=100000 cargo test -p rhosynth-tests --test fuzz` (a debug
//! build: this crate's planted-bugs feature refuses an optimised one).
//! A failure prints the minimal input that triggers it.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use proptest::prelude::*;
use rhosynth_coordinator::worker_result::{MAX_RESULT_VALUES, ResultStream};
use rhosynth_proto::{Dtype, ResultHeader, TensorChunk, TensorMeta};
use rhosynth_shared::accounting::accountant::AccountingOptions;
use rhosynth_shared::data::domain::{Binning, Domain, Encoding};
use rhosynth_shared::data::input::{InputReader, validate};
use rhosynth_shared::data::{DataError, EncodedBatch};
use rhosynth_shared::dpsgd;
use rhosynth_shared::generators::findiff::FinDiffPlan;
use rhosynth_shared::generators::marginals::MarginalsPlan;
use rhosynth_shared::generators::pate::PatePlan;
use rhosynth_shared::generators::pate::task::validate_votes;
use rhosynth_shared::spec::JobSpec;

const DEMO: &str = include_str!("../examples/demo.toml");

/// `PROPTEST_CASES`, else 256 (4096 in CI), divided by `cost`.
fn cases(cost: u32) -> ProptestConfig {
    let default = if std::env::var_os("CI").is_some() { 4096 } else { 256 };
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(default);
    ProptestConfig { cases: (cases / cost).max(1), ..ProptestConfig::default() }
}

// ---------------------------------------------------------------- job spec parser

/// Values that have broken spec handling elsewhere: non-finite and extreme numbers, empty
/// and path-like strings, wrong types.
fn nasty_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1e308".to_string()),
        Just("9223372036854775807".to_string()),
        Just("-9223372036854775808".to_string()),
        Just("\"\"".to_string()),
        Just("\"../../x\"".to_string()),
        Just("[]".to_string()),
        Just("\"2025-13-45\"".to_string()),
        any::<f64>().prop_map(|x| format!("{x:?}")),
        any::<i64>().prop_map(|x| x.to_string()),
        (-5i64..300).prop_map(|x| x.to_string()),
        "[a-z_]{0,8}".prop_map(|s| format!("\"{s}\"")),
    ]
}

#[derive(Clone, Debug)]
enum Edit {
    SetValue(usize, String),
    Delete(usize),
    Duplicate(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), nasty_value()).prop_map(|(i, v)| Edit::SetValue(i, v)),
        1 => any::<usize>().prop_map(Edit::Delete),
        1 => any::<usize>().prop_map(Edit::Duplicate),
    ]
}

/// The demo spec with a few lines edited.
fn mutate(edits: &[Edit]) -> String {
    let mut lines: Vec<String> = DEMO.lines().map(String::from).collect();
    for edit in edits {
        let n = lines.len();
        match edit {
            Edit::SetValue(i, value) => {
                if let Some((key, _)) = lines[i % n].split_once(" = ") {
                    lines[i % n] = format!("{key} = {value}");
                }
            }
            Edit::Delete(i) => {
                lines.remove(i % n);
            }
            Edit::Duplicate(i) => {
                let line = lines[i % n].clone();
                lines.insert(i % n, line);
            }
        }
    }
    lines.join("\n")
}

/// What every accepted spec promises the code after it.
fn check_accepted(spec: &JobSpec) -> Result<(), TestCaseError> {
    prop_assert!(spec.privacy.epsilon > 0.0 && spec.privacy.epsilon.is_finite());
    prop_assert!((0.0..1.0).contains(&spec.privacy.delta));
    prop_assert!(spec.job.partitions >= 1);
    let domain = Domain::from_spec(spec);
    for column in &domain.columns {
        prop_assert!(column.bins() >= 1, "{column:?}");
        if let Encoding::Numeric { min, max, binning, .. } = &column.encoding {
            prop_assert!(min.is_finite() && max.is_finite() && min < max, "{column:?}");
            prop_assert!(!binning.is_empty(), "{column:?}");
            if let Binning::Real(edges) = binning {
                prop_assert!(edges.iter().all(|e| e.is_finite()), "{column:?}");
                prop_assert!(edges.windows(2).all(|w| w[0] < w[1]), "{column:?}");
            }
            for v in [*min, *max, (min + max) / 2.0] {
                prop_assert!(column.bin(Some(v)) < column.bins(), "{column:?} at {v}");
            }
        }
    }
    // Plans may refuse a spec, never panic on one.
    let _ = MarginalsPlan::new(spec, &domain, &AccountingOptions::default());
    let _ = FinDiffPlan::new(spec, &domain, &AccountingOptions::default());
    let _ = PatePlan::new(spec, &domain, &AccountingOptions::default());
    Ok(())
}

proptest! {
    #![proptest_config(cases(1))]

    #[test]
    fn spec_parser_never_panics_on_text(text in "\\PC{0,400}") {
        if let Ok(spec) = JobSpec::parse(&text, "fuzz.toml") {
            check_accepted(&spec)?;
        }
    }

    #[test]
    fn accepted_specs_keep_their_promises(edits in prop::collection::vec(edit(), 1..6)) {
        let text = mutate(&edits);
        match JobSpec::parse(&text, "fuzz.toml") {
            Ok(spec) => check_accepted(&spec)?,
            Err(e) => prop_assert!(e.to_string().contains("fuzz.toml"), "errors name the spec: {e}"),
        }
    }
}

// ---------------------------------------------------------------- input path

/// A small schema covering every column kind.
const SCHEMA: &str = r#"
[job]
dataset_id = "fuzz"
[input]
urls = ["URL"]
BAD_ROWS
[schema]
unit_column = "id"
[[schema.columns]]
name = "id"
kind = "identifier"
[[schema.columns]]
name = "n"
kind = "integer"
min = 0
max = 10
[[schema.columns]]
name = "x"
kind = "continuous"
min = -1.0
max = 1.0
[[schema.columns]]
name = "c"
kind = "categorical"
categories = ["a", "b"]
missing = "reject"
[[schema.columns]]
name = "t"
kind = "datetime"
min = "2020-01-01"
max = "2021-01-01"
[privacy]
epsilon = 1.0
delta = 1e-6
[generator]
name = "marginals"
[output]
url = "/nowhere"
"#;

/// One cell: valid values, values the schema rejects, missing, and CSV-hostile text.
fn cell(column: usize) -> BoxedStrategy<String> {
    let valid = match column {
        0 => "[a-z0-9]{1,4}".boxed(),
        1 => (-3i64..14).prop_map(|v| v.to_string()).boxed(),
        2 => (-2.0f64..2.0).prop_map(|v| format!("{v}")).boxed(),
        3 => prop_oneof![Just("a".to_string()), Just("b".to_string())].boxed(),
        _ => (2019i32..2022, 1u32..13, 1u32..29).prop_map(|(y, m, d)| format!("{y}-{m:02}-{d:02}")).boxed(),
    };
    prop_oneof![
        6 => valid,
        1 => Just(String::new()),
        1 => "[a-z .é\"]{1,5}",
        1 => prop_oneof![Just("NaN".to_string()), Just("inf".to_string()), Just("1e400".to_string()), Just("2.5".to_string())],
    ]
    .boxed()
}

fn rows() -> impl Strategy<Value = Vec<Vec<String>>> {
    prop::collection::vec((0..5).map(cell).collect::<Vec<_>>(), 0..40)
}

fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n']) { format!("\"{}\"", value.replace('"', "\"\"")) } else { value.to_string() }
}

const COLUMNS: [&str; 5] = ["id", "n", "x", "c", "t"];

fn write_csv(path: &std::path::Path, rows: &[Vec<String>]) {
    let mut text = COLUMNS.join(",") + "\n";
    for row in rows {
        text += &row.iter().map(|v| csv_field(v)).collect::<Vec<_>>().join(",");
        text += "\n";
    }
    std::fs::write(path, text).unwrap();
}

/// The same rows as a Parquet file of strings (empty cells as nulls).
async fn write_parquet(path: &std::path::Path, rows: &[Vec<String>]) {
    let columns: Vec<(&str, ArrayRef)> = COLUMNS
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let values: StringArray = rows.iter().map(|r| Some(r[i].as_str()).filter(|v| !v.is_empty())).collect();
            (*name, Arc::new(values) as ArrayRef)
        })
        .collect();
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let dir = path.parent().unwrap().to_str().unwrap();
    let location = rhosynth_shared::storage::open(dir).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let mut writer =
        rhosynth_shared::data::parquet_io::create_writer(location.store.clone(), location.child(name), batch.schema())
            .unwrap();
    writer.write(&batch).await.unwrap();
    writer.close().await.unwrap();
}

fn schema(url: &std::path::Path, bad_rows: &str) -> JobSpec {
    let text = SCHEMA.replace("URL", url.to_str().unwrap()).replace("BAD_ROWS", bad_rows);
    JobSpec::parse(&text, "fuzz.toml").unwrap()
}

/// Reads every batch; the rows, or the error that stopped the read.
async fn read_all(spec: &JobSpec, domain: &Domain) -> (EncodedBatch, Option<DataError>, Option<u64>) {
    let mut reader = InputReader::new(&spec.input, &spec.schema, domain);
    let mut all = EncodedBatch::empty(domain.columns.len());
    loop {
        match reader.next_batch().await {
            Ok(Some(batch)) => {
                all.units.extend(batch.units);
                all.values.iter_mut().zip(batch.values).for_each(|(a, b)| a.extend(b));
            }
            Ok(None) => return (all, None, reader.skipped().map(|s| s.rows)),
            Err(e) => return (all, Some(e), reader.skipped().map(|s| s.rows)),
        }
    }
}

/// Every encoded value lies in its column's public domain.
fn check_in_domain(domain: &Domain, batch: &EncodedBatch) -> Result<(), TestCaseError> {
    for (column, values) in domain.columns.iter().zip(&batch.values) {
        prop_assert_eq!(values.len(), batch.units.len());
        for value in values {
            match (value, &column.encoding) {
                (None, _) => prop_assert!(column.missing || column.name != "c", "c rejects missing values"),
                (Some(code), Encoding::Categorical { categories, other }) => {
                    prop_assert!(code.fract() == 0.0 && *code >= 0.0);
                    prop_assert!((*code as usize) < categories.len() + usize::from(*other));
                }
                (Some(v), Encoding::Numeric { min, max, .. }) => prop_assert!(min <= v && v <= max, "{v}"),
            }
        }
    }
    prop_assert!(batch.units.iter().all(|u| !u.is_empty()), "every kept row has its unit");
    Ok(())
}

proptest! {
    #![proptest_config(cases(4))]

    #[test]
    fn the_input_reader_keeps_rows_in_the_domain_and_accounts_for_every_row(rows in rows()) {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (csv, parquet) = (dir.path().join("in.csv"), dir.path().join("in.parquet"));
        write_csv(&csv, &rows);
        rt.block_on(write_parquet(&parquet, &rows));
        for file in [&csv, &parquet] {
            // Skipping: every row is either kept (in the domain) or counted as left out.
            let skip = schema(file, "bad_rows = \"skip\"");
            let domain = Domain::from_spec(&skip);
            let (kept, error, skipped) = rt.block_on(read_all(&skip, &domain));
            prop_assert!(error.is_none(), "{error:?}");
            check_in_domain(&domain, &kept)?;
            let skipped = skipped.expect("skipping");
            prop_assert_eq!(kept.len() as u64 + skipped, rows.len() as u64);

            // Failing: the same rows, or an error at the first bad value.
            let fail = schema(file, "");
            let (read, error, _) = rt.block_on(read_all(&fail, &domain));
            match error {
                None => {
                    prop_assert_eq!(skipped, 0);
                    prop_assert_eq!(&read, &kept);
                }
                Some(DataError::Value { .. }) => prop_assert!(skipped > 0),
                Some(other) => prop_assert!(false, "unexpected error {other}"),
            }

            // The data owner's validation finds exactly the rows that were left out.
            let validation = rt.block_on(validate(&fail, &domain, usize::MAX));
            prop_assert_eq!(validation.rows, rows.len() as u64);
            let mut bad_rows: Vec<u64> = validation
                .problems
                .iter()
                .map(|p| match p {
                    DataError::Value { row, .. } => *row,
                    other => panic!("unexpected problem {other}"),
                })
                .collect();
            bad_rows.sort_unstable();
            bad_rows.dedup();
            prop_assert_eq!(bad_rows.len() as u64, skipped);
        }
    }
}

// ---------------------------------------------------------------- worker results

fn header(shapes: Vec<Vec<u64>>, dtype: Dtype) -> ResultHeader {
    ResultHeader {
        worker_id: "w".into(),
        job_id: "j".into(),
        task_id: 0,
        attempt: 1,
        units: 3,
        tensors: shapes
            .into_iter()
            .enumerate()
            .map(|(i, shape)| TensorMeta { name: format!("t{i}"), shape, dtype: dtype as i32 })
            .collect(),
    }
}

fn shape() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(prop_oneof![0u64..5, Just(u64::MAX), Just(1 << 32), any::<u64>()], 0..4)
}

/// A worker's value: ordinary, or one that validation must catch.
fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => (0u32..5).prop_map(f64::from),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(-1.0),
        1 => Just(0.5),
        1 => any::<f64>(),
    ]
}

proptest! {
    #![proptest_config(cases(1))]

    #[test]
    fn result_streams_hold_exactly_what_their_headers_declare(
        shapes in prop::collection::vec(shape(), 0..4),
        chunks in prop::collection::vec((0u32..5, prop::collection::vec(any::<u8>(), 0..48)), 0..8),
        f64_dtype in prop::bool::weighted(0.9),
    ) {
        let dtype = if f64_dtype { Dtype::F64 } else { Dtype::Unspecified };
        let declared: Vec<Option<u64>> =
            shapes.iter().map(|s| s.iter().try_fold(1u64, |n, &d| n.checked_mul(d))).collect();
        let Ok(mut stream) = ResultStream::new(header(shapes.clone(), dtype)) else {
            let total = declared.iter().try_fold(0u64, |t, d| d.and_then(|d| t.checked_add(d)));
            prop_assert!(!f64_dtype && !shapes.is_empty() || total.is_none_or(|t| t > MAX_RESULT_VALUES));
            return Ok(());
        };
        prop_assert!(f64_dtype || shapes.is_empty());
        let mut received = vec![0usize; shapes.len()];
        for (index, data) in chunks {
            let len = data.len();
            match stream.push(TensorChunk { tensor_index: index, data }) {
                Ok(()) => received[index as usize] += len,
                Err(_) => {
                    let fits = (index as usize) < shapes.len()
                        && (received[index as usize] + len) as u64 <= declared[index as usize].unwrap() * 8;
                    prop_assert!(!fits, "a chunk within its declaration was refused");
                    return Ok(());
                }
            }
        }
        match stream.finish() {
            Ok(result) => {
                prop_assert_eq!(result.tensors.len(), shapes.len());
                for ((_, values), d) in result.tensors.iter().zip(&declared) {
                    prop_assert_eq!(values.len() as u64, d.unwrap());
                }
            }
            Err(_) => prop_assert!(received.iter().zip(&declared).any(|(r, d)| *r as u64 != d.unwrap() * 8)),
        }
    }

    #[test]
    fn accepted_gradient_sums_are_within_the_clipping_bound(
        sum in prop::collection::vec(value(), 0..8),
        units in 0u64..4,
        clip in prop_oneof![Just(1.0), 0.01f64..10.0],
    ) {
        if dpsgd::validate(&sum, units, 6, clip).is_ok() {
            prop_assert_eq!(sum.len(), 6);
            prop_assert!(sum.iter().all(|v| v.is_finite()));
            let norm = sum.iter().map(|v| v * v).sum::<f64>().sqrt();
            prop_assert!(norm <= units as f64 * clip * (1.0 + 1e-4));
        }
    }

    #[test]
    fn accepted_votes_are_counts_of_teachers(
        votes in prop::collection::vec(value(), 0..8),
        teachers in 0usize..4,
        whole in any::<bool>(),
    ) {
        if validate_votes(&votes, 6, teachers, whole).is_ok() {
            prop_assert_eq!(votes.len(), 6);
            prop_assert!(votes.iter().all(|v| (0.0..=teachers as f64).contains(v)));
            prop_assert!(!whole || votes.iter().all(|v| v.fract() == 0.0));
        }
    }

    #[test]
    fn accepted_contingency_tables_are_bounded_by_the_units(
        counts in prop::collection::vec(value(), 0..40),
        units in 0u64..4,
    ) {
        let spec = JobSpec::parse(DEMO, "demo.toml").unwrap();
        let domain = Domain::from_spec(&spec);
        let task = MarginalsPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap().task;
        // Either the real size, or the fuzzed vector.
        let counts = if counts.len() % 2 == 0 {
            (0..task.cells()).map(|i| counts.get(i % counts.len().max(1)).copied().unwrap_or(0.0)).collect()
        } else {
            counts
        };
        if task.validate(&counts, units).is_ok() {
            prop_assert_eq!(counts.len(), task.cells());
            prop_assert!(counts.iter().all(|c| c.is_finite() && *c >= 0.0 && c.fract() == 0.0));
            let total: f64 = counts.iter().sum();
            // Every table is bounded, so their sum is bounded by (tables × units × m).
            prop_assert!(total <= (task.tables.len() * units as usize) as f64 * f64::from(task.max_rows_per_unit));
        }
    }
}
