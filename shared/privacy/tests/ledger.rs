//! Privacy ledger behaviour on a real local object store: admission and refusal,
//! composition across jobs (against dp_accounting, `fixtures/ledger_composition.json`),
//! one release per charge, concurrent writers (tasks and processes), crash safety and
//! detection of torn or altered entries.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rhosynth_privacy::ledger::{Budget, ChargeRequest, ChargeStatus, EntryBody, Ledger, LedgerError};
use rhosynth_privacy::summary::{LedgerSummary, Reader};
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account};
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism, Sampling};
use rhosynth_shared::storage;
use sha2::{Digest, Sha256};

const DATASET: &str = "test-dataset";

/// δ_B of the ledgers these tests make.
const DELTA: f64 = 1e-6;

/// One Gaussian release of a sensitivity-1 query with noise multiplier σ.
fn gaussian(sigma: f64) -> Mechanism {
    Mechanism::Gaussian { l2_sensitivity: 1.0, noise_multiplier: sigma, releases: 1, adjacency: Adjacency::AddRemove }
}

fn request(job: &str, mechanism: Mechanism, accountant: Accountant, delta: f64) -> ChargeRequest {
    ChargeRequest { job_id: job.to_string(), mechanisms: vec![mechanism], accountant, delta }
}

async fn init(dir: &Path, epsilon: f64, delta: f64) -> Ledger {
    init_with(dir, Budget { epsilon, delta }, Adjacency::AddRemove).await
}

async fn init_with(dir: &Path, budget: Budget, adjacency: Adjacency) -> Ledger {
    let location = storage::open(dir.to_str().unwrap()).unwrap();
    Ledger::init(&location, DATASET, budget, adjacency, AccountingOptions::default()).await.unwrap()
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

/// The ledger's total after `n` such releases: the smaller of the RDP and PLD totals at δ_B.
fn total(n: u64, sigma: f64) -> f64 {
    let m = Mechanism::Gaussian {
        l2_sensitivity: 1.0,
        noise_multiplier: sigma,
        releases: n,
        adjacency: Adjacency::AddRemove,
    };
    let cost = |a| account(std::slice::from_ref(&m), a, DELTA, &AccountingOptions::default()).unwrap().epsilon;
    cost(Accountant::Rdp).min(cost(Accountant::Pld))
}

/// A budget that pays for exactly `n` such releases, well clear of the boundary.
fn budget_for(n: u64, sigma: f64) -> f64 {
    (total(n, sigma) + total(n + 1, sigma)) / 2.0
}

#[tokio::test]
async fn charges_until_the_budget_and_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), budget_for(3, 4.0), DELTA).await;
    for i in 0..3 {
        let receipt =
            ledger.charge(&request(&format!("job-{i}"), gaussian(4.0), Accountant::Pld, DELTA)).await.unwrap();
        assert_eq!(receipt.seq, i + 1);
        // The releases composed, not their costs summed.
        let after = receipt.admission.after.epsilon;
        assert!((after - total(i + 1, 4.0)).abs() < 1e-9 * after, "{after} vs {}", total(i + 1, 4.0));
        assert!(after < (i + 1) as f64 * total(1, 4.0) * 0.99 || i == 0);
    }
    let before = snapshot(dir.path());
    let err = ledger.charge(&request("job-over", gaussian(4.0), Accountant::Pld, DELTA)).await.unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, LedgerError::BudgetExceeded { .. }), "{message}");
    assert!(message.contains("job-over") && message.contains(DATASET) && message.contains("Nothing was charged"));
    assert_eq!(before, snapshot(dir.path()), "a refused charge must leave the ledger unchanged");
    // The dry run agrees with the real charge and writes nothing either.
    assert!(ledger.check(&request("job-over", gaussian(4.0), Accountant::Pld, DELTA)).await.is_err());
    assert!(ledger.check(&request("job-small", gaussian(40.0), Accountant::Pld, DELTA)).await.unwrap().fits());
    assert_eq!(before, snapshot(dir.path()));
    // A fresh handle sees exactly what was charged.
    let reopened = open(dir.path()).await.unwrap();
    assert_eq!(reopened.charges().len(), 3);
    assert_eq!(reopened.spent().unwrap(), ledger.spent().unwrap());
}

#[tokio::test]
async fn charges_compose_their_mechanisms_under_both_accountants() {
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
    let rdp = ledger.spent().unwrap().rdp_epsilon.unwrap();
    assert!((rdp - whole.epsilon).abs() < 1e-9 * whole.epsilon, "{rdp} vs {}", whole.epsilon);
    // Two halves composed is much less than twice one half (the point of adding curves).
    let half = account(&[run(500)], Accountant::Rdp, 1e-5, &AccountingOptions::default()).unwrap();
    assert!(rdp < 2.0 * half.epsilon * 0.9);

    // A PLD-priced charge joins both totals like any other; the job's accountant and δ
    // only state its own cost.
    let options = AccountingOptions::default();
    let pld = ledger.charge(&request("c", run(200), Accountant::Pld, 2e-6)).await.unwrap();
    assert_eq!(pld.admission.cost, account(&[run(200)], Accountant::Pld, 2e-6, &options).unwrap());
    let all = [run(500), run(500), run(200)];
    let rdp = account(&all, Accountant::Rdp, 1e-5, &options).unwrap();
    let pld = account(&all, Accountant::Pld, 1e-5, &options).unwrap();
    let spent = ledger.spent().unwrap();
    assert_eq!((spent.rdp_epsilon, spent.rdp_order), (Some(rdp.epsilon), rdp.order));
    assert_eq!(spent.pld_epsilon, Some(pld.epsilon));
    assert!(pld.epsilon < rdp.epsilon);
    assert_eq!((spent.epsilon, spent.accountant, spent.delta), (pld.epsilon, Accountant::Pld, 1e-5));
}

/// The charges of `fixtures/ledger_composition.json` and dp_accounting 0.6.0's totals of
/// their mechanisms after each one.
#[derive(serde::Deserialize)]
struct CompositionFixture {
    budget: Budget,
    orders: Vec<f64>,
    pld_interval: f64,
    tolerances: Tolerances,
    charges: Vec<FixtureCharge>,
}

#[derive(serde::Deserialize)]
struct Tolerances {
    eps_rel: f64,
    pld_eps_abs: f64,
}

#[derive(serde::Deserialize)]
struct FixtureCharge {
    job_id: String,
    accountant: Accountant,
    delta: f64,
    mechanisms: Vec<Mechanism>,
    after: ReferenceTotals,
}

#[derive(serde::Deserialize)]
struct ReferenceTotals {
    rdp_epsilon: f64,
    rdp_order: f64,
    pld_epsilon: f64,
}

#[tokio::test]
async fn mixed_accountants_compose_the_mechanisms_like_dp_accounting() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ledger_composition.json");
    let fixture: CompositionFixture = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let options = AccountingOptions::default();
    assert_eq!((&fixture.orders, fixture.pld_interval), (&options.orders, options.pld_interval));
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), fixture.budget.epsilon, fixture.budget.delta).await;
    // Marginals (RDP), DP-FinDiff (RDP), then PATE (PLD, at δ = δ_B): all admitted.
    for charge in &fixture.charges {
        let job = ChargeRequest {
            job_id: charge.job_id.clone(),
            mechanisms: charge.mechanisms.clone(),
            accountant: charge.accountant,
            delta: charge.delta,
        };
        let receipt = ledger.charge(&job).await.unwrap_or_else(|e| panic!("{}: {e}", charge.job_id));
        let spent = ledger.spent().unwrap();
        assert_eq!(spent, receipt.admission.after);
        let (reference, tol) = (&charge.after, &fixture.tolerances);
        let rdp = spent.rdp_epsilon.unwrap();
        assert!(
            (rdp - reference.rdp_epsilon).abs() <= tol.eps_rel * reference.rdp_epsilon,
            "{}: RDP ε {rdp} vs {}",
            charge.job_id,
            reference.rdp_epsilon
        );
        assert_eq!(spent.rdp_order, Some(reference.rdp_order), "{}", charge.job_id);
        let pld = spent.pld_epsilon.unwrap();
        assert!(
            (pld - reference.pld_epsilon).abs() <= tol.pld_eps_abs,
            "{}: PLD ε {pld} vs {}",
            charge.job_id,
            reference.pld_epsilon
        );
        assert_eq!(spent.epsilon, rdp.min(pld));
        assert_eq!(spent.accountant, if pld < rdp { Accountant::Pld } else { Accountant::Rdp });
        assert_eq!(spent.delta, fixture.budget.delta);
    }
    assert_eq!(ledger.charges().len(), fixture.charges.len());
}

#[tokio::test]
async fn an_accountant_that_cannot_analyse_a_charge_drops_out_of_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let budget = Budget { epsilon: 1e6, delta: 1e-5 };
    let mut ledger = init_with(dir.path(), budget, Adjacency::AddRemove).await;
    // So little noise that the PLD grid would be too large: only the RDP total remains.
    let loud = Mechanism::SubsampledGaussian {
        sampling: Sampling::Poisson { rate: 0.5 },
        noise_multiplier: 0.01,
        steps: 1,
        max_examples_per_unit: 1,
    };
    let options = AccountingOptions::default();
    assert!(account(std::slice::from_ref(&loud), Accountant::Pld, 1e-5, &options).is_err());
    ledger.charge(&request("loud", loud.clone(), Accountant::Rdp, 1e-5)).await.unwrap();
    // A PLD-priced job is still admitted, its own cost stated by PLD.
    let receipt = ledger.charge(&request("gauss", gaussian(10.0), Accountant::Pld, 1e-5)).await.unwrap();
    assert_eq!(receipt.admission.cost.accountant, Accountant::Pld);
    let spent = ledger.spent().unwrap();
    let rdp = account(&[loud, gaussian(10.0)], Accountant::Rdp, 1e-5, &options).unwrap();
    assert_eq!((spent.pld_epsilon, spent.accountant), (None, Accountant::Rdp));
    assert_eq!((spent.epsilon, spent.rdp_epsilon), (rdp.epsilon, Some(rdp.epsilon)));
}

#[tokio::test]
async fn mechanisms_of_another_adjacency_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 10.0, 1e-5).await;
    let substitution = Mechanism::Gaussian {
        l2_sensitivity: 1.0,
        noise_multiplier: 10.0,
        releases: 1,
        adjacency: Adjacency::Substitution,
    };
    let err = ledger.charge(&request("swap", substitution, Accountant::Rdp, 1e-5)).await.unwrap_err();
    assert!(matches!(err, LedgerError::Mechanism(_)), "{err}");
    assert_eq!(ledger.entries().len(), 1);
}

#[tokio::test]
async fn a_charge_is_released_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, DELTA).await;
    let receipt = ledger.charge(&request("j", gaussian(10.0), Accountant::Pld, DELTA)).await.unwrap();
    assert_eq!(ledger.charges()[0].1, ChargeStatus::Charged);
    assert_eq!(ledger.charge_status(receipt.seq), Some(ChargeStatus::Charged));
    assert_eq!(ledger.charge_status(0), None, "the init entry is not a charge");
    assert_eq!(ledger.charge_status(99), None);
    assert_eq!(ledger.record_release(receipt.seq, "file:///out/j").await.unwrap(), 2);
    let mut reopened = open(dir.path()).await.unwrap();
    assert_eq!(reopened.charges()[0].1, ChargeStatus::Released);
    assert_eq!(reopened.charge_status(receipt.seq), Some(ChargeStatus::Released));
    assert!(matches!(reopened.entries()[2].body, EntryBody::Release { charge_seq: 1, .. }));

    // A second release, from this handle or another, is refused and writes nothing.
    let before = snapshot(dir.path());
    for handle in [&mut ledger, &mut reopened] {
        let err = handle.record_release(receipt.seq, "file:///out/again").await.unwrap_err();
        assert!(
            matches!(&err, LedgerError::AlreadyReleased { charge_seq: 1, location_of_first, .. }
                if location_of_first == "file:///out/j"),
            "{err}"
        );
        assert!(err.to_string().contains(DATASET), "{err}");
    }
    assert_eq!(before, snapshot(dir.path()));
    assert_eq!(ledger.entries().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_two_racing_releases_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, DELTA).await;
    let seq = ledger.charge(&request("j", gaussian(10.0), Accountant::Pld, DELTA)).await.unwrap().seq;
    for round in 0..20 {
        // Each round a fresh charge, claimed by two coordinators with their own handles.
        let seq = if round == 0 {
            seq
        } else {
            ledger.charge(&request(&format!("j{round}"), gaussian(1000.0), Accountant::Pld, DELTA)).await.unwrap().seq
        };
        let claims: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|who| {
                let dir = dir.path().to_path_buf();
                tokio::spawn(async move {
                    let mut handle = open(&dir).await.unwrap();
                    handle.record_release(seq, &format!("file:///out/{who}")).await.map(|_| who)
                })
            })
            .collect();
        let mut results = Vec::new();
        for claim in claims {
            results.push(claim.await.unwrap());
        }
        let winners: Vec<&str> = results.iter().filter_map(|r| r.as_ref().ok().copied()).collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
        assert!(
            matches!(loser, LedgerError::AlreadyReleased { location_of_first, .. }
                if *location_of_first == format!("file:///out/{}", winners[0])),
            "{loser}"
        );
    }
    let reopened = open(dir.path()).await.unwrap();
    let markers = reopened.entries().iter().filter(|e| matches!(e.body, EntryBody::Release { .. })).count();
    assert_eq!(markers, 20);
    assert!(reopened.charges().iter().all(|(_, status)| *status == ChargeStatus::Released));
}

#[tokio::test]
async fn a_second_release_marker_on_the_store_makes_the_ledger_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, DELTA).await;
    ledger.charge(&request("j", gaussian(10.0), Accountant::Pld, DELTA)).await.unwrap();
    ledger.record_release(1, "file:///out/j").await.unwrap();
    // Hand-write entry 3: another release of charge 1, correctly hashed and chained.
    let entries = entries_dir(dir.path());
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(entries.join(format!("{:020}.json", 2))).unwrap()).unwrap();
    let mut entry = stored["entry"].clone();
    entry["seq"] = 3.into();
    entry["prev_sha256"] = stored["sha256"].clone();
    entry["body"]["location"] = "file:///out/again".into();
    let sha256 = format!("{:x}", Sha256::digest(serde_json::to_vec(&entry).unwrap()));
    let second = serde_json::json!({ "entry": entry, "sha256": sha256 });
    let name = format!("{:020}.json", 3);
    std::fs::write(entries.join(&name), serde_json::to_vec_pretty(&second).unwrap()).unwrap();
    let err = open(dir.path()).await.err().expect("a second release marker must fail the load");
    let message = err.to_string();
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{message}");
    assert!(message.contains(&name) && message.contains("second release"), "{message}");
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

/// Charges Gaussian(σ) releases until the ledger refuses; returns how many went through.
async fn charge_until_refused(dir: &Path, job_prefix: &str, sigma: f64) -> usize {
    let mut ledger = open(dir).await.unwrap();
    for won in 0.. {
        let job = request(&format!("{job_prefix}-{won}"), gaussian(sigma), Accountant::Pld, DELTA);
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
    let budget = budget_for(10, 5.0);
    init(dir.path(), budget, DELTA).await;
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let dir = dir.path().to_path_buf();
            tokio::spawn(async move {
                // Each task has its own store handle, as separate coordinators would.
                charge_until_refused(&dir, &format!("t{t}"), 5.0).await
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let expected = 10;
    assert_eq!(total, expected, "exactly as many charges as fit");
    let ledger = open(dir.path()).await.unwrap();
    assert_eq!(ledger.charges().len(), expected);
    assert!(ledger.spent().unwrap().epsilon <= budget);
}

/// Child-process body for the multi-process tests; does nothing unless spawned by them.
#[tokio::test]
async fn child_writer() {
    let Ok(dir) = std::env::var("RHOSYNTH_LEDGER_CHILD_DIR") else {
        return;
    };
    let sigma: f64 = std::env::var("RHOSYNTH_LEDGER_CHILD_SIGMA").unwrap().parse().unwrap();
    let won = charge_until_refused(Path::new(&dir), &format!("p{}", std::process::id()), sigma).await;
    println!("\nCHILD_WON={won}");
}

fn spawn_child(dir: &Path, sigma: f64) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
        .env("RHOSYNTH_LEDGER_CHILD_DIR", dir)
        .env("RHOSYNTH_LEDGER_CHILD_SIGMA", sigma.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn concurrent_processes_never_exceed_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget = budget_for(20, 5.0);
    init(dir.path(), budget, DELTA).await;
    let children: Vec<_> = (0..4).map(|_| spawn_child(dir.path(), 5.0)).collect();
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout);
        let won: usize = stdout.lines().find_map(|l| l.strip_prefix("CHILD_WON=")).unwrap().trim().parse().unwrap();
        total += won;
    }
    let expected = 20;
    assert_eq!(total, expected);
    let ledger = open(dir.path()).await.unwrap();
    assert_eq!(ledger.charges().len(), expected);
    assert!(ledger.spent().unwrap().epsilon <= budget);
}

#[tokio::test]
async fn a_killed_writer_leaves_a_loadable_ledger() {
    let dir = tempfile::tempdir().unwrap();
    init(dir.path(), 1e6, DELTA).await;
    for round in 0..3 {
        let mut child = spawn_child(dir.path(), 1000.0);
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
        let expected = total(n as u64, 1000.0);
        assert!((spent - expected).abs() < 1e-9 * expected, "spent {spent} for {n} charges");
        // And it keeps working.
        ledger.charge(&request("after-kill", gaussian(1000.0), Accountant::Pld, DELTA)).await.unwrap();
    }
}

#[tokio::test]
async fn torn_and_altered_entries_are_detected() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, DELTA).await;
    ledger.charge(&request("a", gaussian(10.0), Accountant::Pld, DELTA)).await.unwrap();
    ledger.charge(&request("b", gaussian(10.0), Accountant::Pld, DELTA)).await.unwrap();
    let entries = entries_dir(dir.path());
    let last = entries.join(format!("{:020}.json", 2));
    let original = std::fs::read(&last).unwrap();

    // A torn write: the object holds only a prefix of the entry.
    std::fs::write(&last, &original[..original.len() / 2]).unwrap();
    let err = open(dir.path()).await.err().expect("torn entry must fail the load");
    let message = err.to_string();
    assert!(matches!(err, LedgerError::Corrupt { .. }) && message.contains("00000000000000000002.json"), "{message}");

    // An edited charge (noise raised after the fact, so it would price lower) fails its checksum.
    let edited = String::from_utf8(original.clone()).unwrap().replacen(
        "\"noise_multiplier\": 10.0",
        "\"noise_multiplier\": 100.0",
        1,
    );
    assert_ne!(edited.as_bytes(), original.as_slice());
    std::fs::write(&last, edited).unwrap();
    assert!(matches!(open(dir.path()).await, Err(LedgerError::Corrupt { .. })));

    // A deleted entry breaks the sequence.
    std::fs::write(&last, &original).unwrap();
    std::fs::remove_file(entries.join(format!("{:020}.json", 1))).unwrap();
    let err = open(dir.path()).await.err().expect("missing entry must fail the load");
    assert!(err.to_string().contains("missing"), "{err}");
}

/// A partition selection's δ_τ is taken from the budget's δ before the dataset's total is
/// stated: the ledger's total equals the Gaussian's at δ_B − Σ δ_τ, and a charge whose
/// δ_τ would exhaust δ_B fails and leaves the ledger as it was.
#[tokio::test]
async fn partition_selection_takes_its_delta_from_the_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 100.0, DELTA).await;
    let selection =
        Mechanism::PartitionSelection { max_partitions: 1, noise_multiplier: 3.0, threshold_delta: 0.4 * DELTA };
    ledger.charge(&request("select", selection.clone(), Accountant::Rdp, DELTA)).await.unwrap();
    let options = AccountingOptions::default();
    let expected = |delta| {
        let cost = |a| account(&[gaussian(3.0)], a, delta, &options).unwrap().epsilon;
        cost(Accountant::Rdp).min(cost(Accountant::Pld))
    };
    assert_eq!(ledger.spent().unwrap().epsilon, expected(0.6 * DELTA));
    let before = snapshot(dir.path());
    let big = Mechanism::PartitionSelection { max_partitions: 1, noise_multiplier: 3.0, threshold_delta: 0.7 * DELTA };
    assert!(ledger.charge(&request("exhausts δ", big, Accountant::Rdp, 1e-3)).await.is_err());
    assert_eq!(snapshot(dir.path()), before);
    assert_eq!(open(dir.path()).await.unwrap().spent().unwrap().epsilon, expected(0.6 * DELTA));
}

/// Copies the files under `from` into `to`.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() { copy_tree(&path, &target) } else { std::fs::copy(&path, &target).map(drop).unwrap() }
    }
}

/// The ledger `dpsynth demo --patients 30` wrote before the project was renamed (entries
/// init, one marginals charge, its release): `dpsynth_version` in its initialisation.
fn legacy_fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dpsynth-ledger")
}

/// A ledger written under the old name opens (every checksum and link verifies), keeps its
/// charge and release, and composes a new charge exactly as a ledger written today does.
#[tokio::test]
async fn a_ledger_written_under_the_old_name_opens_and_composes() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&legacy_fixture(), dir.path());
    let location = storage::open(dir.path().to_str().unwrap()).unwrap();
    let mut old = Ledger::open(&location, "demo-icu-vitals").await.unwrap();
    assert_eq!(old.budget(), Budget { epsilon: 10.0, delta: 1e-5 });
    assert_eq!(old.adjacency(), Adjacency::AddRemove);
    let charges: Vec<ChargeRequest> = old
        .charges()
        .iter()
        .map(|(entry, status)| {
            assert_eq!(*status, ChargeStatus::Released);
            let EntryBody::Charge { request, .. } = &entry.body else { unreachable!() };
            request.clone()
        })
        .collect();
    assert_eq!(charges.len(), 1);
    assert!((old.spent().unwrap().epsilon - 0.914_950).abs() < 1e-6, "{:?}", old.spent());

    // The same charges, plus one more, in a ledger written today.
    let fresh = tempfile::tempdir().unwrap();
    let fresh_location = storage::open(fresh.path().to_str().unwrap()).unwrap();
    let options = AccountingOptions::default();
    let mut today =
        Ledger::init(&fresh_location, "demo-icu-vitals", old.budget(), Adjacency::AddRemove, options).await.unwrap();
    today.charge(&charges[0]).await.unwrap();
    let next = request("after-the-rename", gaussian(3.0), Accountant::Rdp, 1e-5);
    old.charge(&next).await.unwrap();
    today.charge(&next).await.unwrap();
    let reopened = Ledger::open(&location, "demo-icu-vitals").await.unwrap();
    assert_eq!(reopened.charges().len(), 2);
    let (composed, expected) = (reopened.spent().unwrap(), today.spent().unwrap());
    assert_eq!(composed.epsilon, expected.epsilon);
    assert!(composed.epsilon > 0.914_950 + 0.1, "{composed:?}");
    // What the new charge wrote names no old version.
    let written =
        std::fs::read_to_string(dir.path().join("demo-icu-vitals/entries/00000000000000000003.json")).unwrap();
    assert!(!written.contains("dpsynth"), "{written}");
}

/// The former default location `./dpsynth-out/ledger` holds a dataset's ledger: creating one
/// at the new default `./rhosynth-out/ledger` is refused (it would be a second budget).
#[tokio::test]
async fn a_new_default_ledger_beside_an_old_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&legacy_fixture(), &dir.path().join("dpsynth-out/ledger"));
    let location = storage::open(dir.path().join("rhosynth-out/ledger").to_str().unwrap()).unwrap();
    let budget = Budget { epsilon: 10.0, delta: 1e-5 };
    let options = AccountingOptions::default();
    let err = Ledger::init(&location, "demo-icu-vitals", budget, Adjacency::AddRemove, options.clone())
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, LedgerError::LegacyExists { .. }), "{err}");
    assert!(err.to_string().contains("dpsynth-out/ledger"), "{err}");
    assert!(!dir.path().join("rhosynth-out/ledger/demo-icu-vitals").exists());
    // Another dataset has no old ledger: created as usual.
    Ledger::init(&location, "another", budget, Adjacency::AddRemove, options).await.unwrap();
}

/// Every mechanism kind prices a substitution ledger at its substitution sensitivity or is
/// refused there. GNMax (PATE's teachers are keyed by the unit: a substitution moves two
/// votes, 2√2 not √2), the exponential mechanism and partition selection are analysed under
/// add/remove only; Gaussian and zCDP runs state their adjacency and are admitted only by a
/// ledger of the same one.
#[tokio::test]
async fn every_mechanism_kind_states_its_adjacency_or_is_refused() {
    let gaussian_of =
        |adjacency| Mechanism::Gaussian { l2_sensitivity: 1.0, noise_multiplier: 40.0, releases: 1, adjacency };
    let zcdp_of = |adjacency| Mechanism::Zcdp { rho: 0.01, adjacency };
    let add_remove_only = [
        Mechanism::GnMax { sigma: 40.0, classes: 2, queries: 100 },
        Mechanism::Exponential { sensitivity: 1.0, epsilon: 0.1, selections: 1 },
        Mechanism::PartitionSelection { max_partitions: 1, noise_multiplier: 40.0, threshold_delta: 1e-7 },
        Mechanism::dp_sgd(0.01, 2.0, 10),
        gaussian_of(Adjacency::AddRemove),
        zcdp_of(Adjacency::AddRemove),
    ];
    let budget = Budget { epsilon: 100.0, delta: 1e-5 };
    let (add_remove, substitution) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut add_remove = init_with(add_remove.path(), budget, Adjacency::AddRemove).await;
    let mut substitution = init_with(substitution.path(), budget, Adjacency::Substitution).await;
    for m in &add_remove_only {
        add_remove.charge(&request("a", m.clone(), Accountant::Rdp, 1e-5)).await.unwrap();
        let err = substitution.charge(&request("s", m.clone(), Accountant::Rdp, 1e-5)).await.unwrap_err();
        assert!(matches!(err, LedgerError::Mechanism(_)), "{}: {err}", m.describe());
    }
    assert_eq!(substitution.entries().len(), 1, "nothing charged on the substitution ledger");
    for m in [gaussian_of(Adjacency::Substitution), zcdp_of(Adjacency::Substitution)] {
        substitution.charge(&request("s", m.clone(), Accountant::Rdp, 1e-5)).await.unwrap();
        let err = add_remove.charge(&request("a", m.clone(), Accountant::Rdp, 1e-5)).await.unwrap_err();
        assert!(matches!(err, LedgerError::Mechanism(_)), "{}: {err}", m.describe());
    }
}

/// A substitution ledger written before GNMax was refused there may hold a GNMax charge,
/// which its total composes at a quarter of its cost: such a ledger is refused when read
/// (it must be repaired), never composed.
#[tokio::test]
async fn a_charge_the_ledger_cannot_price_under_its_adjacency_is_refused_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init_with(dir.path(), Budget { epsilon: 10.0, delta: 1e-5 }, Adjacency::AddRemove).await;
    let gnmax = Mechanism::GnMax { sigma: 40.0, classes: 2, queries: 100 };
    ledger.charge(&request("pate", gnmax, Accountant::Rdp, 1e-5)).await.unwrap();
    // As such a ledger was written: created under substitution, the chain intact.
    let entries = dir.path().join(DATASET).join("entries");
    let mut previous: Option<String> = None;
    for seq in 0..2 {
        let path = entries.join(format!("{seq:020}.json"));
        let mut stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        if seq == 0 {
            stored["entry"]["body"]["adjacency"] = "substitution".into();
        }
        stored["entry"]["prev_sha256"] = serde_json::json!(previous);
        let hash = format!("{:x}", Sha256::digest(serde_json::to_vec(&stored["entry"]).unwrap()));
        stored["sha256"] = hash.clone().into();
        std::fs::write(&path, serde_json::to_vec_pretty(&stored).unwrap()).unwrap();
        previous = Some(hash);
    }
    let err = open(dir.path()).await.map(drop).unwrap_err();
    assert!(matches!(err, LedgerError::Corrupt { .. }) && err.to_string().contains("not analysed under"), "{err}");
}

/// A ledger is bound to one input. An unbound ledger is bound to the input of its first
/// charge, written with that charge (a refused charge writes nothing); the same files
/// spelled another way are the same input; another file, a superset, a `..` or a file
/// named twice is refused with nothing written. A ledger that holds charges but no input
/// (made before inputs were recorded) waits for the operator's binding, an entry like
/// the others, which also moves a bound ledger to its data's new place.
#[tokio::test]
async fn a_ledger_charges_one_input() {
    let dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let (a, b) = (data.path().join("a.csv").display().to_string(), data.path().join("b.csv").display().to_string());
    let mut ledger = init(dir.path(), 1.0, DELTA).await;
    ledger.bind_input(std::slice::from_ref(&a)).await.unwrap();
    assert_eq!((ledger.input(), ledger.entries().len()), (None, 1), "stating the input writes nothing");
    let refused = ledger.charge(&request("big", gaussian(0.1), Accountant::Rdp, DELTA)).await.unwrap_err();
    assert!(matches!(refused, LedgerError::BudgetExceeded { .. }));
    assert_eq!((ledger.input(), ledger.entries().len()), (None, 1), "a refused charge binds nothing");
    ledger.charge(&request("j", gaussian(10.0), Accountant::Rdp, DELTA)).await.unwrap();
    // The charge written after the binding is counted once, on this handle as on a new one.
    ledger.charge(&request("k", gaussian(10.0), Accountant::Rdp, DELTA)).await.unwrap();
    assert_eq!(ledger.spent().unwrap(), open(dir.path()).await.unwrap().spent().unwrap());
    let canonical_a = format!("file://{}", std::fs::canonicalize(data.path()).unwrap().join("a.csv").display());
    assert_eq!(ledger.input(), Some([canonical_a].as_slice()));
    assert!(matches!(ledger.entries()[1].body, EntryBody::Input { .. }));
    assert!(matches!(ledger.entries()[2].body, EntryBody::Charge { .. }));

    let before = snapshot(dir.path());
    let mut reopened = open(dir.path()).await.unwrap();
    reopened.bind_input(&[format!("file://{}/./a.csv", data.path().display())]).await.unwrap();
    let err = reopened.bind_input(std::slice::from_ref(&b)).await.unwrap_err();
    assert!(matches!(err, LedgerError::OtherInput { .. }) && err.to_string().contains("ledger bind"), "{err}");
    let superset = [a.clone(), b.clone()];
    assert!(matches!(reopened.bind_input(&superset).await, Err(LedgerError::OtherInput { .. })));
    for bad in [vec![format!("{}/x/../a.csv", data.path().display())], vec![a.clone(), a.clone()]] {
        assert!(matches!(reopened.bind_input(&bad).await, Err(LedgerError::InvalidInput { .. })), "{bad:?}");
    }
    assert_eq!(before, snapshot(dir.path()), "refusals write nothing");
    reopened.rebind_input(std::slice::from_ref(&b)).await.unwrap();
    let mut moved = open(dir.path()).await.unwrap();
    moved.bind_input(std::slice::from_ref(&b)).await.unwrap();
    assert!(matches!(moved.bind_input(std::slice::from_ref(&a)).await, Err(LedgerError::OtherInput { .. })));

    // Charges without an input: the operator binds the ledger first.
    let legacy = tempfile::tempdir().unwrap();
    let mut ledger = init(legacy.path(), 1.0, DELTA).await;
    ledger.charge(&request("old", gaussian(10.0), Accountant::Rdp, DELTA)).await.unwrap();
    let err = ledger.bind_input(std::slice::from_ref(&a)).await.unwrap_err();
    assert!(matches!(err, LedgerError::Unbound { .. }) && err.to_string().contains("ledger bind"), "{err}");
    ledger.rebind_input(std::slice::from_ref(&a)).await.unwrap();
    ledger.bind_input(std::slice::from_ref(&a)).await.unwrap();
}

/// A release's manifest hash is recorded once, after its release marker: before the
/// marker, or a second time, it is refused; a second one found on the store makes the
/// ledger corrupt.
#[tokio::test]
async fn a_release_records_its_manifest_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 1.0, DELTA).await;
    let receipt = ledger.charge(&request("j", gaussian(10.0), Accountant::Rdp, DELTA)).await.unwrap();
    let early = ledger.record_published(receipt.seq, "aa").await.unwrap_err();
    assert!(matches!(early, LedgerError::NotPublishable { charge_seq: 1 }), "{early}");
    ledger.record_release(receipt.seq, "file:///out/j").await.unwrap();
    assert_eq!(ledger.published(receipt.seq), None);
    assert_eq!(ledger.record_published(receipt.seq, "aa").await.unwrap(), 3);
    let mut reopened = open(dir.path()).await.unwrap();
    assert_eq!(reopened.published(receipt.seq), Some("aa"));
    assert!(matches!(reopened.record_published(receipt.seq, "bb").await, Err(LedgerError::NotPublishable { .. })));

    // A second record written behind the ledger's back (hashed and chained) is corrupt.
    let entries = entries_dir(dir.path());
    let stored: serde_json::Value =
        serde_json::from_slice(&std::fs::read(entries.join(format!("{:020}.json", 3))).unwrap()).unwrap();
    let mut entry = stored["entry"].clone();
    entry["seq"] = 4.into();
    entry["prev_sha256"] = stored["sha256"].clone();
    entry["body"]["manifest_sha256"] = "bb".into();
    let sha256 = format!("{:x}", Sha256::digest(serde_json::to_vec(&entry).unwrap()));
    let second = serde_json::json!({ "entry": entry, "sha256": sha256 });
    std::fs::write(entries.join(format!("{:020}.json", 4)), serde_json::to_vec_pretty(&second).unwrap()).unwrap();
    let err = open(dir.path()).await.err().expect("a second manifest record must fail the load");
    assert!(matches!(err, LedgerError::Corrupt { .. }) && err.to_string().contains("a second manifest"), "{err}");
}

#[tokio::test]
async fn a_summary_shows_every_cost_and_only_the_readers_own_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let mut ledger = init(dir.path(), 2.0, DELTA).await;
    let mine = ledger.charge(&request("alice.j1", gaussian(10.0), Accountant::Rdp, DELTA)).await.unwrap();
    ledger.charge(&request("bob.j1", gaussian(20.0), Accountant::Pld, 1e-7)).await.unwrap();
    ledger.record_release(mine.seq, "file:///out/alice/j1").await.unwrap();

    let alices = |job: &str| job.starts_with("alice.");
    let summary = LedgerSummary::of(&ledger, Reader::Submitter { own: &alices }).unwrap();
    let spent = ledger.spent().unwrap();
    assert_eq!((summary.dataset.as_str(), summary.budget, summary.spent), (DATASET, ledger.budget(), spent));
    assert_eq!(summary.remaining_epsilon, 2.0 - spent.epsilon);
    let [alice, bob] = summary.charges.as_slice() else { panic!("{:?}", summary.charges) };
    assert_eq!((alice.seq, alice.status), (1, ChargeStatus::Released));
    assert_eq!(alice.job_id.as_deref(), Some("alice.j1"));
    assert_eq!(alice.mechanisms.as_deref(), Some(&[gaussian(10.0)][..]));
    // Another submitter's charge: its cost, as the ledger recorded it, and nothing else.
    let EntryBody::Charge { cost, .. } = &ledger.entries()[2].body else { panic!() };
    assert_eq!((bob.seq, bob.status, bob.accountant), (2, ChargeStatus::Charged, Accountant::Pld));
    assert_eq!((bob.epsilon, bob.delta), (cost.epsilon, 1e-7));
    assert_eq!((bob.job_id.as_deref(), bob.mechanisms.as_deref()), (None, None));
    assert!(!serde_json::to_string(&summary).unwrap().contains("bob"), "another submitter's name leaked");
    // A charge's time is not a submitter's to see, its own charges' either.
    assert!(summary.charges.iter().all(|c| c.timestamp.is_none()));

    // The data owner's view names every job, with its time.
    let whole = LedgerSummary::of(&ledger, Reader::Owner).unwrap();
    assert_eq!(whole.charges[1].job_id.as_deref(), Some("bob.j1"));
    assert_eq!(whole.charges[1].timestamp, Some(ledger.entries()[2].timestamp));
}
