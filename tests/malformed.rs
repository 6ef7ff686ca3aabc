//! Bad input through `dpsynth run`: each case fails with an error naming the file (and
//! the column and row where there is one), writes no manifest and charges nothing.

mod common;

use std::path::Path;
use std::process::Command;

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

    fn edit_spec(&self, edit: impl FnOnce(String) -> String) {
        let path = self.dir.path().join("job.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(path, edit(text)).unwrap();
    }

    /// Runs the job; asserts it failed cleanly and returns its stderr.
    fn fails(&self, envs: &[(&str, &str)]) -> String {
        let out = Command::new(bin("dpsynth"))
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
        stderr
    }
}

fn has_manifest(dir: &Path) -> bool {
    dir.join("_manifest.json").exists()
}

fn set_field(line: &mut String, index: usize, value: &str) {
    let mut fields: Vec<&str> = line.split(',').collect();
    fields[index] = value;
    *line = fields.join(",");
}

#[test]
fn corrupt_parquet() {
    let case = Case::new(|_| {});
    std::fs::write(case.path("data.parquet"), b"PAR1 this is not a parquet file PAR1").unwrap();
    let data = case.path("data.parquet");
    case.edit_spec(|s| s.replace(&case.path("icu_vitals.csv"), &data));
    let err = case.fails(&[]);
    assert!(err.contains("data.parquet") && err.contains("not a readable Parquet file"), "{err}");
}

#[test]
fn csv_row_with_the_wrong_number_of_fields() {
    let case = Case::new(|lines| lines[7].push_str(",extra"));
    let err = case.fails(&[]);
    assert!(err.contains("icu_vitals.csv") && err.contains("incorrect number of fields"), "{err}");
}

#[test]
fn value_of_the_wrong_type() {
    let case = Case::new(|lines| set_field(&mut lines[5], 2, "fast"));
    let err = case.fails(&[]);
    assert!(err.contains("icu_vitals.csv: column 'heart_rate', row 5: not an integer"), "{err}");
    assert!(!err.contains("fast"), "private values must not be echoed: {err}");
}

#[test]
fn category_not_declared() {
    let case = Case::new(|lines| set_field(&mut lines[12], 8, "bradycardia"));
    let err = case.fails(&[]);
    assert!(err.contains("column 'rhythm', row 12") && err.contains("does not declare"), "{err}");
    assert!(!err.contains("bradycardia"), "private values must not be echoed: {err}");
}

#[test]
fn unknown_spec_field() {
    let case = Case::new(|_| {});
    case.edit_spec(|s| s.replace("[job]\n", "[job]\ncolour = \"blue\"\n"));
    let err = case.fails(&[]);
    assert!(err.contains("job.toml") && err.contains("unknown field `colour`"), "{err}");
}

#[test]
fn unreachable_input_urls() {
    let case = Case::new(|_| {});
    let missing = case.path("nowhere/missing.csv");
    case.edit_spec(|s| s.replace(&case.path("icu_vitals.csv"), &missing));
    let err = case.fails(&[]);
    assert!(err.contains("missing.csv"), "{err}");

    let case = Case::new(|_| {});
    case.edit_spec(|s| s.replace(&case.path("icu_vitals.csv"), "s3://no-such-bucket/vitals.csv"));
    let port = free_port().to_string();
    let endpoint = format!("http://127.0.0.1:{port}");
    let err = case.fails(&[
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_RETRY_MAX_RETRIES", "0"),
    ]);
    assert!(err.contains("s3://no-such-bucket/vitals.csv"), "{err}");
}
