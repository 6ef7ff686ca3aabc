//! Bad input through `rhosynth run`: each case fails, writes no manifest and charges
//! nothing. Where the input was read, the submitter's error is one fixed sentence — where
//! a row breaks the schema is private — and the detail (file, column, row; never the
//! value) is in the operator log only (in `rhosynth run` the same process's stderr).
//! `rhosynth validate`, the data owner's local check, reports that detail.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::*;

struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    /// The demo spec on 40 simulated patients, with `edit` applied to the CSV's lines.
    fn new(edit: impl FnOnce(&mut Vec<String>)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let spec = demo_spec(dir.path(), 40);
        let csv = dir.path().join("icu_vitals.csv");
        let mut lines: Vec<String> = std::fs::read_to_string(&csv).unwrap().lines().map(String::from).collect();
        edit(&mut lines);
        std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
        std::fs::write(dir.path().join("job.toml"), spec).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    fn spec(&self) -> PathBuf {
        self.dir.path().join("job.toml")
    }

    fn edit_spec(&self, edit: impl FnOnce(String) -> String) {
        let text = std::fs::read_to_string(self.spec()).unwrap();
        std::fs::write(self.spec(), edit(text)).unwrap();
    }

    /// Runs the job; asserts it failed cleanly (status 1, no manifest, nothing charged).
    fn fails(&self, envs: &[(&str, &str)]) -> Output {
        let out = Command::new(bin("rhosynth"))
            .args(["run", &self.path("job.toml"), "--scratch", &self.path("scratch")])
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "expected failure, got {:?}: {stderr}", out.status);
        assert!(!has_manifest(&self.dir.path().join("out")), "a failed job must not write a manifest");
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (charges, spent) = rt.block_on(ledger_state(&self.dir.path().join("ledger"), "demo-icu-vitals"));
        assert_eq!((charges, spent), (0, 0.0), "a failed job must charge nothing");
        out
    }

    /// Runs the job on input that breaks its schema: what the submitter sees (the last
    /// stdout line's `error`, the "job … failed:" line) is the fixed sentence; returns the
    /// operator log (stderr), which has the detail.
    fn input_mismatch(&self, envs: &[(&str, &str)]) -> String {
        let out = self.fails(envs);
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        let error = last_json(&out.stdout)["error"].as_str().expect("an error for the submitter").to_string();
        assert_eq!(error, input_mismatch_message(), "{log}");
        for private in ["icu_vitals", "parquet", "missing.csv", "s3://", "column", "row", "line"] {
            assert!(!error.contains(private), "the submitter's error names '{private}': {error}");
        }
        assert!(!error.chars().any(|c| c.is_ascii_digit()), "the submitter's error has a number: {error}");
        let failed = log.lines().find(|l| l.starts_with("job ") && l.contains(" failed: ")).expect("a 'failed' line");
        assert!(failed.ends_with(&format!(" failed: {}", input_mismatch_message())), "{failed}");
        log
    }

    /// `rhosynth validate` on the case's spec: asserts it found the input invalid; returns
    /// its problems and stderr.
    fn invalid(&self, envs: &[(&str, &str)]) -> (Vec<serde_json::Value>, String) {
        let (code, report, stderr) = validate(&self.spec(), &[], envs);
        assert_eq!(code, Some(1), "{stderr}");
        assert_eq!(report["valid"], false, "{report}");
        assert_eq!(report["files"], 1, "{report}");
        assert_eq!(report["truncated"], false, "{report}");
        let problems = report["problems"].as_array().unwrap().clone();
        assert!(!problems.is_empty(), "{report}");
        self.wrote_nothing();
        (problems, stderr)
    }

    /// Asserts that no ledger, scratch store or output exists.
    fn wrote_nothing(&self) {
        for dir in ["ledger", "scratch", "out"] {
            assert!(!self.dir.path().join(dir).exists(), "validate must not create {dir}");
        }
    }
}

fn has_manifest(dir: &Path) -> bool {
    dir.join("_manifest.json").exists()
}

/// Asserts that `problem` is a bad value at (file, column, row) with `message`.
fn value_problem(problem: &serde_json::Value, file: &str, column: &str, row: u64, message: &str) {
    assert!(problem["file"].as_str().unwrap().ends_with(file), "{problem}");
    assert_eq!(problem["column"], column, "{problem}");
    assert_eq!(problem["row"], row, "{problem}");
    assert!(problem["message"].as_str().unwrap().contains(message), "{problem}");
}

#[test]
fn corrupt_parquet() {
    let case = Case::new(|_| {});
    std::fs::write(case.path("data.parquet"), b"PAR1 this is not a parquet file PAR1").unwrap();
    let data = case.path("data.parquet");
    case.edit_spec(|s| s.replace(&case.path("icu_vitals.csv"), &data));
    let (problems, stderr) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0]["file"].as_str().unwrap().ends_with("data.parquet"), "{problems:?}");
    assert!(problems[0]["message"].as_str().unwrap().contains("not a readable Parquet file"), "{problems:?}");
    assert!(stderr.contains("data.parquet: not a readable Parquet file"), "{stderr}");

    let log = case.input_mismatch(&[]);
    assert!(log.contains("data.parquet") && log.contains("not a readable Parquet file"), "{log}");
}

#[test]
fn csv_row_with_the_wrong_number_of_fields() {
    let case = Case::new(|lines| lines[7].push_str(",extra"));
    let (problems, stderr) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "reading a malformed CSV stops at the bad line: {problems:?}");
    assert!(problems[0]["file"].as_str().unwrap().ends_with("icu_vitals.csv"), "{problems:?}");
    assert!(problems[0]["message"].as_str().unwrap().contains("incorrect number of fields"), "{problems:?}");
    assert!(stderr.contains("icu_vitals.csv: malformed CSV: incorrect number of fields"), "{stderr}");
    assert!(!stderr.contains("extra"), "private values must not be echoed: {stderr}");

    let log = case.input_mismatch(&[]);
    assert!(log.contains("icu_vitals.csv") && log.contains("incorrect number of fields"), "{log}");
}

#[test]
fn value_of_the_wrong_type() {
    let case = Case::new(|lines| set_field(&mut lines[5], 2, "fast"));
    let (problems, stderr) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    value_problem(&problems[0], "icu_vitals.csv", "heart_rate", 5, "not an integer");
    assert!(stderr.contains("icu_vitals.csv: column 'heart_rate', row 5: not an integer"), "{stderr}");
    assert!(!stderr.contains("fast"), "private values must not be echoed: {stderr}");

    let log = case.input_mismatch(&[]);
    assert!(log.contains("icu_vitals.csv: column 'heart_rate', row 5: not an integer"), "{log}");
    assert!(!log.contains("fast"), "private values must not be echoed: {log}");
}

#[test]
fn category_not_declared() {
    let case = Case::new(|lines| set_field(&mut lines[12], 8, "bradycardia"));
    let (problems, stderr) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    value_problem(&problems[0], "icu_vitals.csv", "rhythm", 12, "does not declare");
    assert!(stderr.contains("icu_vitals.csv: column 'rhythm', row 12"), "{stderr}");
    assert!(!stderr.contains("bradycardia"), "private values must not be echoed: {stderr}");

    let log = case.input_mismatch(&[]);
    assert!(log.contains("column 'rhythm', row 12") && log.contains("does not declare"), "{log}");
    assert!(!log.contains("bradycardia"), "private values must not be echoed: {log}");
}

#[test]
fn missing_value_in_a_column_that_rejects_them() {
    // The simulation never leaves a rhythm out.
    let case = Case::new(|lines| set_field(&mut lines[9], 8, ""));
    case.edit_spec(|s| s.replace("name = \"rhythm\"\n", "name = \"rhythm\"\nmissing = \"reject\"\n"));
    let (problems, _) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    value_problem(&problems[0], "icu_vitals.csv", "rhythm", 9, "missing value");

    let log = case.input_mismatch(&[]);
    assert!(log.contains("icu_vitals.csv: column 'rhythm', row 9: missing value"), "{log}");
}

#[test]
fn missing_privacy_unit_id() {
    let case = Case::new(|lines| set_field(&mut lines[3], 0, ""));
    let (problems, _) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    value_problem(&problems[0], "icu_vitals.csv", "patient_id", 3, "privacy-unit id is missing");

    let log = case.input_mismatch(&[]);
    assert!(log.contains("icu_vitals.csv: column 'patient_id', row 3: the privacy-unit id is missing"), "{log}");
}

#[test]
fn validate_collects_every_problem_up_to_the_limit() {
    let case = Case::new(|lines| {
        set_field(&mut lines[4], 8, "bradycardia");
        set_field(&mut lines[20], 2, "fast");
        set_field(&mut lines[31], 8, "asystole");
    });
    let (problems, stderr) = case.invalid(&[]);
    let mut found: Vec<(String, u64)> =
        problems.iter().map(|p| (p["column"].as_str().unwrap().to_string(), p["row"].as_u64().unwrap())).collect();
    found.sort_by_key(|(_, row)| *row);
    assert_eq!(found, [("rhythm".into(), 4), ("heart_rate".into(), 20), ("rhythm".into(), 31)], "{problems:?}");
    for value in ["bradycardia", "fast", "asystole"] {
        assert!(!stderr.contains(value), "private values must not be echoed: {stderr}");
    }

    let (code, report, _) = validate(&case.spec(), &["--max-problems", "2"], &[]);
    assert_eq!(code, Some(1));
    assert_eq!((report["valid"].clone(), report["truncated"].clone()), (false.into(), true.into()), "{report}");
    assert_eq!(report["problems"].as_array().unwrap().len(), 2, "{report}");
    case.wrote_nothing();
}

#[test]
fn validate_goes_on_with_the_next_file() {
    let case = Case::new(|_| {});
    let csv = case.path("icu_vitals.csv");
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    std::fs::write(case.path("no_rhythm.csv"), "patient_id,charttime\nP00001,2025-02-03\n").unwrap();
    let urls = format!("[\"{}\", \"{csv}\", \"{}\"]", case.path("missing.csv"), case.path("no_rhythm.csv"));
    case.edit_spec(|s| s.replace(&format!("[\"{csv}\"]"), &urls));
    let (code, report, _) = validate(&case.spec(), &[], &[]);
    assert_eq!(code, Some(1));
    assert_eq!((report["files"].clone(), report["rows"].clone()), (3.into(), rows.into()), "{report}");
    let problems = report["problems"].as_array().unwrap();
    assert_eq!(problems.len(), 2, "{report}");
    assert!(problems[0]["file"].as_str().unwrap().ends_with("missing.csv"), "{report}");
    assert!(problems[1]["file"].as_str().unwrap().ends_with("no_rhythm.csv"), "{report}");
    assert_eq!(problems[1]["column"], "heart_rate", "the first declared column it lacks: {report}");
    assert!(problems[1]["message"].as_str().unwrap().contains("not present in the file"), "{report}");
    case.wrote_nothing();
}

#[test]
fn validate_accepts_input_that_matches_the_schema() {
    let case = Case::new(|_| {});
    let rows = std::fs::read_to_string(case.path("icu_vitals.csv")).unwrap().lines().count() - 1;
    let (code, report, stderr) = validate(&case.spec(), &[], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["files"], 1, "{report}");
    assert_eq!(report["rows"], rows, "{report}");
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    assert_eq!(report["truncated"], false, "{report}");
    case.wrote_nothing();
}

#[test]
fn unknown_spec_field() {
    let case = Case::new(|_| {});
    case.edit_spec(|s| s.replace("[job]\n", "[job]\ncolour = \"blue\"\n"));
    // Refused before any input is read: the spec is public, so the error names it.
    let out = case.fails(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job.toml") && err.contains("unknown field `colour`"), "{err}");
    let (code, _, stderr) = validate(&case.spec(), &[], &[]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("job.toml") && stderr.contains("unknown field `colour`"), "{stderr}");
}

#[test]
fn unreachable_input_urls() {
    let case = Case::new(|_| {});
    let missing = case.path("nowhere/missing.csv");
    case.edit_spec(|s| s.replace(&case.path("icu_vitals.csv"), &missing));
    let (problems, _) = case.invalid(&[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0]["file"].as_str().unwrap().ends_with("nowhere/missing.csv"), "{problems:?}");
    let log = case.input_mismatch(&[]);
    assert!(log.contains("missing.csv"), "{log}");

    let case = Case::new(|_| {});
    case.edit_spec(|s| s.replace(&case.path("icu_vitals.csv"), "s3://no-such-bucket/vitals.csv"));
    let port = free_port().to_string();
    let endpoint = format!("http://127.0.0.1:{port}");
    let envs = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_RETRY_MAX_RETRIES", "0"),
    ];
    let (problems, _) = case.invalid(&envs);
    assert_eq!(problems[0]["file"], "s3://no-such-bucket/vitals.csv", "{problems:?}");
    let log = case.input_mismatch(&envs);
    assert!(log.contains("s3://no-such-bucket/vitals.csv"), "{log}");
}

/// A job that skips bad rows, or reads their bad values as missing (what a served dataset
/// reads with: the row stays, and only a row without its unit id is left out), runs; the
/// operator's log counts them by column and reason, never a value.
#[test]
fn skipping_or_reading_bad_values_as_missing_lets_the_job_run() {
    for (policy, left_out) in [("skip", 3), ("as_missing", 1)] {
        let case = Case::new(|lines| {
            set_field(&mut lines[4], 8, "bradycardia");
            set_field(&mut lines[20], 2, "fast");
            set_field(&mut lines[31], 0, "");
        });
        case.edit_spec(|s| s.replace("[input]\n", &format!("[input]\nbad_rows = \"{policy}\"\n")));
        let out = Command::new(bin("rhosynth"))
            .args(["run", &case.path("job.toml"), "--scratch", &case.path("scratch")])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{policy}: {log}");
        assert!(has_manifest(&case.dir.path().join("out")));
        let rt = tokio::runtime::Runtime::new().unwrap();
        assert_eq!(rt.block_on(ledger_state(&case.dir.path().join("ledger"), "demo-icu-vitals")).0, 1);
        let counted = log.lines().find(|l| l.contains("break the job's schema")).expect("a line for the operator");
        assert!(counted.contains(&format!("rows_left_out={left_out}")), "{policy}: {counted}");
        for part in ["rhythm: a category that the spec does not declare", "heart_rate: not an integer ×1", "patient_id"]
        {
            assert!(counted.contains(part), "{policy}: {part}: {counted}");
        }
        for value in ["bradycardia", "fast"] {
            assert!(!log.contains(value), "private values must not be echoed: {log}");
        }
    }
}
