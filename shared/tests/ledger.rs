//! Privacy ledger behaviour on a real local object store: admission and refusal,
//! composition across jobs, concurrent writers (tasks and processes), crash safety and
//! detection of torn or altered entries.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dpsynth_shared::privacy::accountant::{Accountant, AccountingOptions, account};
use dpsynth_shared::privacy::ledger::{Budget, ChargeRequest, ChargeStatus, EntryBody, Ledger, LedgerError};
use dpsynth_shared::privacy::mechanism::{Adjacency, Mechanism, Sampling};
use dpsynth_shared::storage;

const DATASET: &str = "test-dataset";

/// A pure-DP release whose PLD cost is additive across jobs.
fn laplace(epsilon0: f64) -> Mechanism {
    Mechanism::Laplace { l1_sensitivity: 1.0, scale: 1.0 / epsilon0, releases: 1, adjacency: Adjacency::AddRemove }
}

fn request(job: &str, mechanism: Mechanism, accountant: Accountant, delta: f64) -> ChargeRequest {
    ChargeRequest { job_id: job.to_string(), mechanisms: vec![mechanism], accountant, delta }
}

async fn init(dir: &Path, epsilon: f64, delta: f64) -> Ledger {
    let location = storage::open(dir.to_str().unwrap()).unwrap();
    Ledger::init(&location, DATASET, Budget { epsilon, delta }, Adjacency::AddRemove, AccountingOptions::default())
        .await
        .unwrap()
}

async fn open(dir: &Path) -> Result<Ledger, LedgerError> {
    Ledger::open(&storage::open(dir.to_str().unwrap()).unwrap(), DATASET).await
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.insert(path.display().to_string(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, &mut out);
    out
}

fn entries_dir(dir: &Path) -> std::path::PathBuf {
    dir.join(DATASET).join("entries")
}

/// Entry objects published in the store (staging files carry a `#`).
fn published(dir: &Path) -> usize {
    std::fs::read_dir(entries_dir(dir))
        .unwrap()
        .filter(|e| !e.as_ref().unwrap().file_name().to_string_lossy().contains('#'))
        .count()
}

fn laplace_cost(epsilon0: f64) -> f64 {
    account(&[laplace(epsilon0)], Accountant::Pld, 0.0, &AccountingOptions::default()).unwrap().epsilon
}

#[tokio::test]
async fn charges_until_the_budget_and_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, 1e-6).await;
    let cost = laplace_cost(0.3);
    assert!((cost - 0.3).abs() < 1e-3, "Laplace ε₀ = 0.3 costs {cost}");
    for i in 0..3 {
        let receipt = ledger.charge(&request(&format!("job-{i}"), laplace(0.3), Accountant::Pld, 0.0)).await.unwrap();
        assert_eq!(receipt.seq, i + 1);
        assert!((receipt.admission.after.epsilon - cost * (i + 1) as f64).abs() < 1e-12);
    }
    let before = snapshot(dir.path());
    let err = ledger.charge(&request("job-over", laplace(0.3), Accountant::Pld, 0.0)).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, LedgerError::BudgetExceeded { .. }), "{message}");
    assert!(message.contains("job-over") && message.contains(DATASET) && message.contains("Nothing was charged"));
    assert_eq!(before, snapshot(dir.path()), "a refused charge must leave the ledger unchanged");
    // The dry run agrees with the real charge and writes nothing either.
    assert!(ledger.check(&request("job-over", laplace(0.3), Accountant::Pld, 0.0)).await.is_err());
    assert!(ledger.check(&request("job-small", laplace(0.05), Accountant::Pld, 0.0)).await.unwrap().fits());
    assert_eq!(before, snapshot(dir.path()));
    // A fresh handle sees exactly what was charged.
    let reopened = open(dir.path()).await.unwrap();
    assert_eq!(reopened.charges().len(), 3);
    assert!((reopened.spent().unwrap().epsilon - 3.0 * cost).abs() < 1e-12);
}

#[tokio::test]
async fn rdp_charges_compose_by_adding_curves() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 10.0, 1e-5).await;
    let run = |steps| Mechanism::SubsampledGaussian {
        sampling: Sampling::Poisson { rate: 0.01 },
        noise_multiplier: 1.1,
        steps,
        max_examples_per_unit: 1,
    };
    ledger.charge(&request("a", run(500), Accountant::Rdp, 1e-5)).await.unwrap();
    ledger.charge(&request("b", run(500), Accountant::Rdp, 1e-5)).await.unwrap();
    let whole = account(&[run(1000)], Accountant::Rdp, 1e-5, &AccountingOptions::default()).unwrap();
    let spent = ledger.spent().unwrap();
    assert!((spent.epsilon - whole.epsilon).abs() < 1e-9 * whole.epsilon, "{} vs {}", spent.epsilon, whole.epsilon);
    // Two halves composed is much less than twice one half (the point of adding curves).
    let half = account(&[run(500)], Accountant::Rdp, 1e-5, &AccountingOptions::default()).unwrap();
    assert!(spent.epsilon < 2.0 * half.epsilon * 0.9);

    // A PLD charge composes basically with the RDP part, which then gets δ_B − δ_pld.
    let pld = ledger.charge(&request("c", run(200), Accountant::Pld, 2e-6)).await.unwrap();
    let rdp_curve =
        dpsynth_shared::privacy::accountant::rdp_curve(&[run(1000)], &AccountingOptions::default().orders).unwrap();
    let rdp_eps = rdp_curve.epsilon(1e-5 - 2e-6, AccountingOptions::default().conversion).unwrap().epsilon;
    let spent = ledger.spent().unwrap();
    assert!((spent.epsilon - (rdp_eps + pld.admission.cost.epsilon)).abs() < 1e-9);
    assert_eq!(spent.delta, 1e-5);
}

#[tokio::test]
async fn mechanisms_of_another_adjacency_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 10.0, 1e-5).await;
    let wor = Mechanism::SubsampledGaussian {
        sampling: Sampling::WithoutReplacement { batch_size: 100, population: 10_000 },
        noise_multiplier: 1.0,
        steps: 10,
        max_examples_per_unit: 1,
    };
    let err = ledger.charge(&request("wor", wor, Accountant::Rdp, 1e-5)).await.unwrap_err();
    assert!(matches!(err, LedgerError::Mechanism(_)), "{err}");
    assert_eq!(ledger.entries().len(), 1);
}

#[tokio::test]
async fn release_markers_set_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, 0.0).await;
    let receipt = ledger.charge(&request("j", laplace(0.1), Accountant::Pld, 0.0)).await.unwrap();
    assert_eq!(ledger.charges()[0].1, ChargeStatus::Charged);
    ledger.record_release(receipt.seq, "file:///out/j").await.unwrap();
    let reopened = open(dir.path()).await.unwrap();
    assert_eq!(reopened.charges()[0].1, ChargeStatus::Released);
    assert!(matches!(reopened.entries()[2].body, EntryBody::Release { charge_seq: 1, .. }));
}

#[tokio::test]
async fn second_init_and_missing_ledger_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(open(dir.path()).await, Err(LedgerError::NotInitialised { .. })));
    init(dir.path(), 1.0, 1e-6).await;
    let location = storage::open(dir.path().to_str().unwrap()).unwrap();
    let again = Ledger::init(
        &location,
        DATASET,
        Budget { epsilon: 5.0, delta: 1e-6 },
        Adjacency::AddRemove,
        Default::default(),
    )
    .await;
    assert!(matches!(again, Err(LedgerError::AlreadyExists { .. })));
    assert!(matches!(Ledger::open(&location, "../escape").await, Err(LedgerError::InvalidDatasetId(_))));
}

/// Charges Laplace(ε₀) releases until the ledger refuses; returns how many went through.
async fn charge_until_refused(dir: &Path, job_prefix: &str, epsilon0: f64) -> usize {
    let mut ledger = open(dir).await.unwrap();
    for won in 0.. {
        let job = request(&format!("{job_prefix}-{won}"), laplace(epsilon0), Accountant::Pld, 0.0);
        match ledger.charge(&job).await {
            Ok(_) => {}
            Err(LedgerError::BudgetExceeded { .. }) => return won,
            Err(e) => panic!("{e}"),
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_tasks_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 1.05;
    init(dir.path(), budget, 0.0).await;
    let cost = laplace_cost(0.1);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let dir = dir.path().to_path_buf();
            tokio::spawn(async move {
                // Each task has its own store handle, as separate coordinators would.
                charge_until_refused(&dir, &format!("t{t}"), 0.1).await
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let expected = (budget / cost).floor() as usize;
    assert_eq!(total, expected, "exactly as many charges as fit");
    let ledger = open(dir.path()).await.unwrap();
    assert_eq!(ledger.charges().len(), expected);
    assert!(ledger.spent().unwrap().epsilon <= budget);
}

/// Child-process body for the multi-process tests; does nothing unless spawned by them.
#[tokio::test]
async fn child_writer() {
    let Ok(dir) = std::env::var("DPSYNTH_LEDGER_CHILD_DIR") else {
        return;
    };
    let epsilon0: f64 = std::env::var("DPSYNTH_LEDGER_CHILD_EPS").unwrap().parse().unwrap();
    let won = charge_until_refused(Path::new(&dir), &format!("p{}", std::process::id()), epsilon0).await;
    println!("\nCHILD_WON={won}");
}

fn spawn_child(dir: &Path, epsilon0: f64) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env("DPSYNTH_LEDGER_CHILD_DIR", dir)
        .env("DPSYNTH_LEDGER_CHILD_EPS", epsilon0.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn concurrent_processes_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 2.05;
    init(dir.path(), budget, 0.0).await;
    let cost = laplace_cost(0.1);
    let children: Vec<_> = (0..4).map(|_| spawn_child(dir.path(), 0.1)).collect();
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let won: usize = stdout.lines().find_map(|l| l.strip_prefix("CHILD_WON=")).unwrap().trim().parse().unwrap();
        total += won;
    }
    let expected = (budget / cost).floor() as usize;
    assert_eq!(total, expected);
    let ledger = open(dir.path()).await.unwrap();
    assert_eq!(ledger.charges().len(), expected);
    assert!(ledger.spent().unwrap().epsilon <= budget);
}

#[tokio::test]
async fn a_killed_writer_leaves_a_loadable_ledger() {
    let dir = tempfile::tempdir().unwrap();
    init(dir.path(), 1e6, 0.0).await;
    for round in 0..3 {
        let mut child = spawn_child(dir.path(), 1e-3);
        let start = Instant::now();
        let target = 5 * (round + 1) + 2;
        while published(dir.path()) < target {
            assert!(start.elapsed() < Duration::from_secs(60), "child made no progress");
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap(); // SIGKILL, mid-charge or between charges
        child.wait().unwrap();
        let mut ledger = open(dir.path()).await.expect("ledger loads after the writer was killed");
        // Every complete object is a valid entry; staged, unpublished writes (also those
        // the kills of earlier rounds left behind) are ignored.
        assert_eq!(ledger.entries().len(), published(dir.path()));
        assert!(ledger.entries().len() >= target);
        let n = ledger.charges().len();
        let spent = ledger.spent().unwrap().epsilon;
        let expected = n as f64 * laplace_cost(1e-3);
        assert!((spent - expected).abs() < 1e-9, "spent {spent} for {n} charges");
        // And it keeps working.
        ledger.charge(&request("after-kill", laplace(1e-3), Accountant::Pld, 0.0)).await.unwrap();
    }
}

#[tokio::test]
async fn torn_and_altered_entries_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, 0.0).await;
    ledger.charge(&request("a", laplace(0.1), Accountant::Pld, 0.0)).await.unwrap();
    ledger.charge(&request("b", laplace(0.1), Accountant::Pld, 0.0)).await.unwrap();
    let entries = entries_dir(dir.path());
    let last = entries.join(format!("{:020}.json", 2));
    let original = std::fs::read(&last).unwrap();

    // A torn write: the object holds only a prefix of the entry.
    std::fs::write(&last, &original[..original.len() / 2]).unwrap();
    let err = open(dir.path()).await.err().expect("torn entry must fail the load");
    let message = err.to_string();
    assert!(matches!(err, LedgerError::Corrupt { .. }) && message.contains("00000000000000000002.json"), "{message}");

    // An edited charge (ε lowered after the fact) fails its checksum.
    let edited = String::from_utf8(original.clone()).unwrap().replacen("\"epsilon\": 0.1", "\"epsilon\": 0.01", 1);
    assert_ne!(edited.as_bytes(), original.as_slice());
    std::fs::write(&last, edited).unwrap();
    assert!(matches!(open(dir.path()).await, Err(LedgerError::Corrupt { .. })));

    // A deleted entry breaks the sequence.
    std::fs::write(&last, &original).unwrap();
    std::fs::remove_file(entries.join(format!("{:020}.json", 1))).unwrap();
    let err = open(dir.path()).await.err().expect("missing entry must fail the load");
    assert!(err.to_string().contains("missing"), "{err}");
}
