//! `rhosynth audit` end to end on a standalone cluster, bounded for CI: an honest
//! mechanism's lower bound stays below its claim, and a planted bug (noise divided by 10,
//! planted only by this test binary: `rhosynth_shared::planted`) is caught. One test: a
//! planted bug holds for the whole process, so the honest audit runs first. Clipping off
//! (a unit's rows uncapped in the workers) is planted last: the coordinator's bound on
//! what a partition may return stops that job before any release.
//!
//! The job is built for a sharp audit: a code column of 1000 declared categories, which
//! the stand-in rows leave mostly empty, so a canary's code is nearly its own cell; the
//! marginals generator measures it with the Gaussian mechanism at ε = 1 (noise multiplier
//! σ ≈ 4 per unit of count, three marginals). A canary moves its cells by 1 against noise
//! of σ√3 ≈ 7 (honest: undetectable) or 0.7 (the bug: most canaries show, and the true ε
//! is about ten times the claim); 60,000 synthetic rows keep the sampling noise below it.
//! Measured (M = 2000, k = 200): honest bounds 0 to 0.22 over 20 runs, buggy 1.44 to 1.99
//! over 40; the buggy bound exceeds 1 unless the right guesses fall about 6 standard
//! deviations below their mean.

mod common;

use std::os::unix::fs::PermissionsExt;

use common::demo_spec;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rhosynth_coordinator::audit::{AuditError, AuditOptions, AuditReport, run, work_dir};
use rhosynth_shared::audit::score::Score;
use rhosynth_shared::planted::{Bug, plant};
use rhosynth_shared::spec::JobSpec;

const MARGINALS: &str =
    "name = \"marginals\"\n[generator.marginals]\nmax_rows_per_unit = 1\npairs = [[\"code\", \"level\"]]";

fn job_spec(dir: &std::path::Path, generator: &str) -> JobSpec {
    // The stand-in: 2000 rows over the first 20 codes (simulated: a fixed seed is fine).
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut csv = String::from("code,level\n");
    for _ in 0..2000 {
        csv += &format!("c{:04},{}\n", rng.random_range(0..20), rng.random_range(0..10));
    }
    let input = dir.join("stand-in.csv");
    std::fs::write(&input, csv).unwrap();
    let codes: Vec<String> = (0..1000).map(|i| format!("\"c{i:04}\"")).collect();
    let text = format!(
        r#"
[job]
dataset_id = "audit-test"
[input]
urls = ["{input}"]
[schema]
[[schema.columns]]
name = "code"
kind = "categorical"
categories = [{codes}]
[[schema.columns]]
name = "level"
kind = "integer"
min = 0
max = 9
[privacy]
epsilon = 1.0
delta = 1e-5
[generator]
{generator}
[output]
url = "{out}"
rows = 60000
"#,
        input = input.display(),
        codes = codes.join(", "),
        out = dir.join("never-written").display()
    );
    JobSpec::parse(&text, "audit-test.toml").unwrap()
}

/// One audit in a working directory of its own, removed after it.
async fn audit(spec: &JobSpec, options: &AuditOptions) -> Result<AuditReport, AuditError> {
    let work = work_dir().unwrap();
    run(spec, options, work.path()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_passes_an_honest_mechanism_and_catches_a_planted_bug() {
    let dir = tempfile::tempdir().unwrap();
    let spec = job_spec(dir.path(), MARGINALS);
    let options = AuditOptions::new(&spec, 2000, dir.path().join("audits"));
    let honest = audit(&spec, &options).await.unwrap();
    assert_eq!((honest.canaries, honest.guesses), (2000, 400));
    assert!((honest.claimed_epsilon - 1.0).abs() < 1e-6 && honest.delta == 1e-5, "{honest:?}");
    assert!(honest.passed && honest.epsilon_lower_bound <= honest.claimed_epsilon, "{honest:?}");
    // The audit wrote its report and ledger, and nothing else: no input, no release.
    let audit_dir = dir.path().join("audits").join(&honest.job_id);
    let mode = std::fs::metadata(&audit_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the report is the data owner's");
    let mut left: Vec<String> =
        std::fs::read_dir(&audit_dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    left.sort();
    assert_eq!(left, ["ledger", "report.json"]);
    assert!(!dir.path().join("never-written").exists());

    // White-box: a DP-FinDiff job's loss gains on its canaries (small: 2 epochs, hidden 32).
    let findiff = job_spec(
        dir.path(),
        "name = \"findiff\"\n[generator.findiff]\nmax_rows_per_unit = 1\nhidden = 32\nembedding_width = 4\n[generator.findiff.run]\nepochs = 2",
    );
    let mut loss = AuditOptions::new(&findiff, 400, dir.path().join("audits"));
    loss.score = Score::Loss;
    let white_box = audit(&findiff, &loss).await.unwrap();
    assert_eq!((white_box.generator.as_str(), white_box.score, white_box.guesses), ("findiff", Score::Loss, 80));
    assert!(white_box.passed && white_box.epsilon_lower_bound <= white_box.claimed_epsilon, "{white_box:?}");
    // The loss score is for models the DP-SGD engine trains.
    match audit(&spec, &loss).await {
        Err(AuditError::Options(message)) => assert!(message.contains("DP-SGD"), "{message}"),
        other => panic!("a loss score for marginals: {other:?}"),
    }
    // The report never goes beside the job's stores or a release.
    let beside = AuditOptions::new(&spec, 100, dir.path().join("never-written").join("audits"));
    assert!(matches!(audit(&spec, &beside).await, Err(AuditError::Options(_))));
    let dotted = AuditOptions::new(&spec, 100, dir.path().join("x").join("..").join("audits"));
    assert!(matches!(audit(&spec, &dotted).await, Err(AuditError::Options(m)) if m.contains("..")));

    plant(Bug::NoiseDividedBy(10.0));
    let buggy = audit(&spec, &options).await.unwrap();
    assert!(!buggy.passed && buggy.epsilon_lower_bound > buggy.claimed_epsilon, "{buggy:?}");

    // Clipping off in the workers (a unit's rows uncapped) never reaches a release: the
    // coordinator checks each aggregate against its units' bound and stops the job first.
    let demo = JobSpec::parse(&demo_spec(dir.path(), 60), "demo").unwrap();
    let mut options = AuditOptions::new(&demo, 100, dir.path().join("audits"));
    options.canary_rows = 32;
    plant(Bug::UnboundedUnits);
    match audit(&demo, &options).await {
        Err(AuditError::Job { state, .. }) => assert_eq!(state, "failed"),
        other => panic!("an uncapped unit was released: {other:?}"),
    }
    // The dataset's own ledger (the demo spec names one) was never opened.
    assert!(!dir.path().join("ledger").exists());
}
