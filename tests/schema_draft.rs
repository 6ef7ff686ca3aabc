//! `rhosynth schema draft --epsilon`: a draft's domains released with DP through the real
//! binary and a real ledger — checked before any row is read, charged before the release,
//! its one release claimed — and what it may and may not hold. And the newcomer's next
//! step: a spec that names no output runs.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::*;
use rhosynth_privacy::ledger::{Budget, EntryBody, Ledger};
use rhosynth_shared::accounting::accountant::AccountingOptions;
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use rhosynth_shared::spec::{ColumnKind, JobSpec};
use rhosynth_shared::storage;

/// 3000 patients with 1 to 3 visits: an age uniform on 20..=80, a colour among three
/// common ones, a code only its own patient holds (300 of them), a decimal score.
fn write_visits(path: &Path) {
    let mut text = String::from("patient,age,colour,code,score\n");
    for p in 0..3000 {
        for v in 0..(1 + p % 3) {
            let colour = ["red", "green", "blue"][(p + v) % 3];
            let code = if p < 300 { format!("rare-{p}") } else { "common".to_string() };
            text.push_str(&format!("p{p},{},{colour},{code},{}.25\n", 20 + (p * 7 + v) % 61, p % 50));
        }
    }
    std::fs::write(path, text).unwrap();
}

async fn init_ledger(dir: &Path, epsilon: f64) -> Ledger {
    let location = storage::open(dir.join("ledger").to_str().unwrap()).unwrap();
    let budget = Budget { epsilon, delta: 1e-5 };
    Ledger::init(&location, "visits", budget, Adjacency::AddRemove, AccountingOptions::default()).await.unwrap()
}

/// A directory holding the visits file and the dataset's ledger with budget ε.
async fn visits_with_ledger(epsilon: f64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("visits.csv");
    write_visits(&data);
    init_ledger(dir.path(), epsilon).await;
    (dir, data)
}

fn draft(dir: &Path, data: &Path) -> Output {
    Command::new(bin("rhosynth"))
        .args(["schema", "draft"])
        .arg(data)
        .args(["--unit-column", "patient", "--max-rows-per-unit", "2", "--epsilon", "1", "--delta", "1e-6"])
        .args(["--dataset", "visits", "--store"])
        .arg(dir.join("ledger"))
        .arg("--out")
        .arg(dir.join("draft.toml"))
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_released_draft_is_charged_holds_only_common_values_and_parses() {
    let (dir, data) = visits_with_ledger(10.0).await;
    let out = draft(dir.path(), &data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // The ledger bound to the file read, one charge, at most ε = 1 at δ = 1e-6, then its
    // release marker.
    let ledger =
        Ledger::open(&storage::open(dir.path().join("ledger").to_str().unwrap()).unwrap(), "visits").await.unwrap();
    let bodies: Vec<&EntryBody> = ledger.entries().iter().map(|e| &e.body).collect();
    assert_eq!(bodies.len(), 4, "init, input, charge, release");
    let canonical = format!("file://{}", data.canonicalize().unwrap().display());
    assert!(
        matches!(bodies[1], EntryBody::Input { urls } if urls == std::slice::from_ref(&canonical)),
        "{:?}",
        bodies[1]
    );
    let EntryBody::Charge { request, cost } = bodies[2] else { panic!("entry 2 is the charge") };
    assert!(cost.epsilon <= 1.0 && cost.epsilon > 0.99, "{}", cost.epsilon);
    // Four columns: three Gaussian histograms and one partition selection each, with
    // Δ = m = 2 and L = m = 2.
    assert!(matches!(request.mechanisms[0], Mechanism::Gaussian { l2_sensitivity: 2.0, releases: 12, .. }));
    let selections = request
        .mechanisms
        .iter()
        .filter(|m| matches!(m, Mechanism::PartitionSelection { max_partitions: 2, .. }))
        .count();
    assert_eq!(selections, 4);
    assert!(matches!(bodies[3], EntryBody::Release { charge_seq: 2, .. }));

    let text = std::fs::read_to_string(dir.path().join("draft.toml")).unwrap();
    assert!(!text.contains("PRIVATE") && text.contains("partition selection"), "{text}");
    // No code only one patient holds is released (each passes with probability
    // δ_τ/L = 6.25e-8); the common ones are (their counts are far above the threshold).
    assert!(!text.contains("rare-"), "{text}");
    let spec = JobSpec::parse(&text, "draft").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(spec.schema.unit_column.as_deref(), Some("patient"));
    let column = |name: &str| spec.schema.columns.iter().find(|c| c.name == name).unwrap();
    let mut colours = column("colour").categories.clone().unwrap();
    colours.sort();
    assert_eq!(colours, ["blue", "green", "red"]);
    assert_eq!(column("code").categories.as_deref(), Some(&["common".to_string()][..]));
    // Values not listed may exist: they go to __other__.
    assert!(text.matches("unknown = \"other\"").count() == 2, "{text}");
    // Age: the quarter-octave buckets around 20 and 80 hold 150–300 rows against a
    // cutoff near 140, so the bounds are theirs or, rarely, the next one in.
    let age = column("age");
    assert_eq!(age.kind, ColumnKind::Integer);
    let bound = |b: &Option<rhosynth_shared::spec::Bound>| match b {
        Some(rhosynth_shared::spec::Bound::Number(x)) => *x,
        other => panic!("{other:?}"),
    };
    let (min, max) = (bound(&age.min), bound(&age.max));
    assert!((16.0..=23.0).contains(&min) && (76.0..=108.0).contains(&max), "age {min}..{max}");
    assert_eq!(column("score").kind, ColumnKind::Continuous);
    // Another file charged to the same dataset: refused before it is read, nothing written.
    let other = dir.path().join("other.csv");
    std::fs::copy(&data, &other).unwrap();
    std::fs::remove_file(dir.path().join("draft.toml")).unwrap();
    let refused = draft(dir.path(), &other);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is bound to the input") && stderr.contains("ledger bind"), "{stderr}");
    assert_eq!(std::fs::read_dir(dir.path().join("ledger/visits/entries")).unwrap().count(), 4);
    assert!(!dir.path().join("draft.toml").exists());
}

/// Over budget: refused (exit 3) at the check, before the rows are read, and nothing is
/// written. Rows that do not parse never make an error (they are left out), so no failure
/// before the charge can depend on them.
#[tokio::test]
async fn an_over_budget_draft_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("visits.csv");
    std::fs::write(&data, "patient,age\np1,30,unexpected,fields\n\"unterminated\n").unwrap();
    init_ledger(dir.path(), 0.5).await;
    let before = std::fs::read_dir(dir.path().join("ledger/visits/entries")).unwrap().count();
    let out = draft(dir.path(), &data);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refused"));
    assert_eq!(std::fs::read_dir(dir.path().join("ledger/visits/entries")).unwrap().count(), before);
    assert!(!dir.path().join("draft.toml").exists());
}

/// A DP draft states its privacy unit: without --unit-column or --row-level it is refused
/// before anything is read or charged (a person with k rows would pay k times what the
/// ledger records). A declared dataset's draft takes the declaration's input, unit and
/// ledger, and a caller may not set them.
#[tokio::test]
async fn a_draft_charges_a_ledger_only_for_its_declared_unit_and_input() {
    let (dir, data) = visits_with_ledger(10.0).await;
    let entries = || std::fs::read_dir(dir.path().join("ledger/visits/entries")).unwrap().count();
    let before = entries();
    let unstated = Command::new(bin("rhosynth"))
        .args(["schema", "draft"])
        .arg(&data)
        .args(["--epsilon", "1", "--dataset", "visits", "--store"])
        .arg(dir.path().join("ledger"))
        .output()
        .unwrap();
    assert_eq!(unstated.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unstated.stderr).contains("privacy unit"));
    assert_eq!(entries(), before);

    let declared = dir.path().join("datasets.toml");
    std::fs::write(
        &declared,
        format!(
            "[[dataset]]\nid = \"visits\"\nunit_column = \"patient\"\nledger = {:?}\n\
             budget = {{ epsilon = 10.0, delta = 1e-5 }}\n[dataset.input]\nurls = [{:?}]\n",
            dir.path().join("ledger").to_str().unwrap(),
            data.to_str().unwrap()
        ),
    )
    .unwrap();
    let with = |extra: &[&str]| {
        Command::new(bin("rhosynth"))
            .args(["schema", "draft", "--epsilon", "1", "--dataset", "visits", "--datasets"])
            .arg(&declared)
            .args(extra)
            .output()
            .unwrap()
    };
    // The caller may not name another unit column or file.
    assert_eq!(with(&["--unit-column", "colour"]).status.code(), Some(2));
    assert_eq!(with(&[data.to_str().unwrap()]).status.code(), Some(2));
    assert_eq!(entries(), before);
    let out = with(&["--out", dir.path().join("draft.toml").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(entries(), before + 3, "the input binding, the charge and its release marker");
    let text = std::fs::read_to_string(dir.path().join("draft.toml")).unwrap();
    let spec = JobSpec::parse(&text, "draft").unwrap();
    assert_eq!(spec.schema.unit_column.as_deref(), Some("patient"));
}

/// A spec with no `[output]` runs, and writes its release under the working directory,
/// one folder a job: `./rhosynth-out/<dataset>/<job id>/`. A numeric column without
/// `bins` is named in a warning (heart rate here; not pain, whose 11 values have a bin
/// each).
#[test]
fn a_spec_without_output_writes_under_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let text = demo_spec(dir.path(), 40).replacen("max = 220\nbins = 19\n", "max = 220\n", 1);
    let without = &text[..text.find("[output]").unwrap()];
    assert!(!without.contains("[output]") && !without.contains("bins = 19"));
    std::fs::write(dir.path().join("job.toml"), without).unwrap();
    let run = || {
        let out = Command::new(bin("rhosynth"))
            .current_dir(dir.path())
            .args(["run", "job.toml", "--scratch", "scratch"])
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        let warning = log.lines().find(|l| l.contains("without `bins`")).unwrap_or_else(|| panic!("{log}"));
        assert!(warning.contains("heart_rate") && !warning.contains("pain"), "{warning}");
    };
    run();
    run();
    let jobs: Vec<_> = std::fs::read_dir(dir.path().join("rhosynth-out/demo-icu-vitals")).unwrap().flatten().collect();
    assert_eq!(jobs.len(), 2, "one folder a job");
    for job in jobs {
        let manifest = manifest(&job.path()).expect("a complete release");
        assert_eq!(manifest["job_id"].as_str(), job.file_name().to_str());
    }
}

/// Draft, then run: `--generator aim --epsilon-job 0.5` writes a spec that runs as it is,
/// charged to the ledger the draft was, at the job's ε.
#[tokio::test]
async fn a_released_draft_runs_as_written() {
    let (dir, data) = visits_with_ledger(10.0).await;
    let out = Command::new(bin("rhosynth"))
        .args(["schema", "draft"])
        .arg(&data)
        .args(["--unit-column", "patient", "--epsilon", "1", "--dataset", "visits", "--store"])
        .arg(dir.path().join("ledger"))
        .args(["--generator", "aim", "--epsilon-job", "0.5", "--out", "job.toml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(bin("rhosynth"))
        .args(["run", "job.toml", "--scratch", "scratch"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let jobs: Vec<_> = std::fs::read_dir(dir.path().join("rhosynth-out/visits")).unwrap().flatten().collect();
    let manifest = manifest(&jobs[0].path()).expect("a complete release");
    assert_eq!(manifest["generator"], "aim");
    let epsilon = manifest["privacy"]["epsilon"].as_f64().unwrap();
    assert!(epsilon <= 0.5 && epsilon > 0.49, "{epsilon}");
    let bad = Command::new(bin("rhosynth"))
        .args(["schema", "draft"])
        .arg(&data)
        .args(["--generator", "aimm"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("history_copula"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
