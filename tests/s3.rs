//! Against a real S3-compatible server (SeaweedFS, started by `.ci/run` on 127.0.0.1):
//! a job reading its input from S3 and writing output, manifest, scratch partitions and
//! ledger to S3; a CSV object read in byte ranges; and concurrent ledger charges relying on
//! S3's create-if-absent.
//!
//! Server: `RHOSYNTH_TEST_S3_ENDPOINT` (default http://127.0.0.1:8333), bucket
//! `RHOSYNTH_TEST_S3_BUCKET` (default rhosynth-test), keys rhosynth / rhosynth-secret unless
//! `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` say otherwise. Skipped, loudly, only when
//! no server is reachable outside CI.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::*;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rhosynth_privacy::ledger::{Budget, ChargeRequest, Ledger, LedgerError};
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account};
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use rhosynth_shared::storage::StoreLocation;
use sha2::{Digest, Sha256};

struct S3 {
    endpoint: String,
    bucket: String,
    key: String,
    secret: String,
}

impl S3 {
    fn from_env() -> Option<Self> {
        let endpoint = std::env::var("RHOSYNTH_TEST_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:8333".into());
        let address = endpoint.trim_start_matches("http://").trim_end_matches('/').to_string();
        if std::net::TcpStream::connect(&address).is_err() {
            assert!(std::env::var("CI").as_deref() != Ok("true"), "no S3 server at {endpoint} in CI");
            eprintln!("\n*** SKIPPED: no S3-compatible server at {endpoint} (start SeaweedFS as .ci/run does) ***\n");
            return None;
        }
        Some(Self {
            endpoint,
            bucket: std::env::var("RHOSYNTH_TEST_S3_BUCKET").unwrap_or_else(|_| "rhosynth-test".into()),
            key: std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "rhosynth".into()),
            secret: std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "rhosynth-secret".into()),
        })
    }

    fn envs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", self.key.clone()),
            ("AWS_SECRET_ACCESS_KEY", self.secret.clone()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::new(
            AmazonS3Builder::new()
                .with_endpoint(&self.endpoint)
                .with_allow_http(true)
                .with_bucket_name(&self.bucket)
                .with_access_key_id(&self.key)
                .with_secret_access_key(&self.secret)
                .with_region("us-east-1")
                .build()
                .unwrap(),
        )
    }

    fn url(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), chrono_free_nanos())
}

fn chrono_free_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test]
async fn a_job_reads_and_writes_s3() {
    let Some(s3) = S3::from_env() else { return };
    let store = s3.store();
    let root = unique("job");
    let dir = tempfile::tempdir().unwrap();
    let local_spec = demo_spec(dir.path(), 80);
    let csv = std::fs::read(dir.path().join("icu_vitals.csv")).unwrap();
    store.put(&Path::from(format!("{root}/input/icu_vitals.csv")), PutPayload::from(csv)).await.unwrap();
    let spec = local_spec
        .replace(dir.path().join("icu_vitals.csv").to_str().unwrap(), &s3.url(&format!("{root}/input/icu_vitals.csv")));
    std::fs::write(dir.path().join("job.toml"), spec).unwrap();

    let output = s3.url(&format!("{root}/out"));
    let ledger = s3.url(&format!("{root}/ledger"));
    let out = Command::new(bin("rhosynth"))
        .args(["run", dir.path().join("job.toml").to_str().unwrap()])
        .args(["--output", &output, "--ledger", &ledger, "--scratch", &s3.url(&format!("{root}/scratch"))])
        .envs(s3.envs())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed = last_json(&out.stdout);

    let manifest_bytes =
        store.get(&Path::from(format!("{root}/out/_manifest.json"))).await.unwrap().bytes().await.unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(&manifest_bytes).unwrap();
    assert_eq!(manifest, printed);
    for part in manifest["parts"].as_array().unwrap() {
        let key = format!("{root}/out/{}", part["path"].as_str().unwrap());
        let bytes = store.get(&Path::from(key)).await.unwrap().bytes().await.unwrap();
        assert_eq!(format!("{:x}", Sha256::digest(&bytes)), part["sha256"].as_str().unwrap());
    }
    let location = StoreLocation { store: store.clone(), prefix: Path::from(format!("{root}/ledger")), url: ledger };
    let ledger = Ledger::open(&location, "demo-icu-vitals").await.unwrap();
    assert_eq!(ledger.charges().len(), 1);
    let spent = ledger.spent().unwrap();
    let charged = manifest["privacy"]["epsilon"].as_f64().unwrap();
    assert_eq!(spent.under(manifest_accountant(&manifest)), Some(charged));
    assert!(spent.epsilon <= charged);

    // Writing the same output again is refused: the manifest is create-if-absent.
    let again = Command::new(bin("rhosynth"))
        .args(["run", dir.path().join("job.toml").to_str().unwrap()])
        .args(["--output", &output, "--ledger", &location.url, "--scratch", &s3.url(&format!("{root}/scratch"))])
        .envs(s3.envs())
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a complete dataset"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_charges_on_s3_never_exceed_the_budget() {
    let Some(s3) = S3::from_env() else { return };
    let root = unique("ledger");
    let location = StoreLocation { store: s3.store(), prefix: Path::from(root.as_str()), url: s3.url(&root) };
    // Gaussian releases compose: the ledger's total after n of them is one Gaussian's
    // with σ/√n (the smaller of RDP and PLD at δ_B); the budget pays for exactly five.
    let delta = 1e-6;
    let gaussian = |n| Mechanism::Gaussian {
        l2_sensitivity: 1.0,
        noise_multiplier: 5.0,
        releases: n,
        adjacency: Adjacency::AddRemove,
    };
    let total_after = |n| {
        let cost = |a| account(&[gaussian(n)], a, delta, &AccountingOptions::default()).unwrap().epsilon;
        cost(Accountant::Rdp).min(cost(Accountant::Pld))
    };
    let budget = (total_after(5) + total_after(6)) / 2.0;
    Ledger::init(&location, "s3-race", Budget { epsilon: budget, delta }, Adjacency::AddRemove, Default::default())
        .await
        .unwrap();
    let release = gaussian(1);
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let location = StoreLocation { store: s3.store(), ..location.clone() };
            let release = release.clone();
            tokio::spawn(async move {
                let mut ledger = Ledger::open(&location, "s3-race").await.unwrap();
                for won in 0.. {
                    let request = ChargeRequest {
                        job_id: format!("t{t}-{won}"),
                        mechanisms: vec![release.clone()],
                        accountant: Accountant::Pld,
                        delta,
                    };
                    match ledger.charge(&request).await {
                        Ok(_) => {}
                        Err(LedgerError::BudgetExceeded { .. }) => return won,
                        Err(e) => panic!("{e}"),
                    }
                }
                unreachable!()
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 5);
    let ledger = Ledger::open(&location, "s3-race").await.unwrap();
    assert_eq!(ledger.charges().len(), total);
    assert!(ledger.spent().unwrap().epsilon <= budget);
}

/// A Parquet object of several upload parts (the writers upload in 5 MiB parts, two in
/// flight, to bound memory): it completes as one multipart upload and reads back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parquet_object_of_several_upload_parts_round_trips() {
    use arrow_array::{ArrayRef, Float64Array, RecordBatch};
    use futures::StreamExt;
    use rhosynth_shared::data::parquet_io::{create_writer, open_stream};

    let Some(s3) = S3::from_env() else { return };
    let store = s3.store();
    let path = Path::from(format!("{}/large.parquet", unique("parts")));
    // Distinct values (no dictionary): about 8 bytes a row, 24 MB in all.
    let (batches, rows) = (30, 100_000);
    let batch = |b: usize| {
        let values = Float64Array::from_iter_values((0..rows).map(|i| ((b * rows + i) as f64).sqrt() * 1.000_001));
        RecordBatch::try_from_iter(vec![("x", Arc::new(values) as ArrayRef)]).unwrap()
    };
    let mut writer = create_writer(store.clone(), path.clone(), batch(0).schema()).unwrap();
    for b in 0..batches {
        writer.write(&batch(b)).await.unwrap();
    }
    writer.close().await.unwrap();
    let size = store.head(&path).await.unwrap().size;
    assert!(size > 3 * 5 * 1024 * 1024, "{size} bytes: fewer than four parts");
    let (_, mut stream) = open_stream(store.clone(), path, 65_536).await.unwrap();
    let (mut seen, mut sum) = (0, 0.0);
    while let Some(batch) = stream.next().await {
        let batch = batch.unwrap();
        let column = batch.column(0).as_any().downcast_ref::<Float64Array>().unwrap();
        seen += column.len();
        sum += column.values().iter().sum::<f64>();
    }
    let expected: f64 = (0..batches * rows).map(|i| (i as f64).sqrt() * 1.000_001).sum();
    assert_eq!(seen, batches * rows);
    assert!((sum - expected).abs() < 1e-6 * expected);
}

/// A CSV object larger than a range (64 MiB) is read by the workers in byte ranges, through
/// ranged GETs, and every row is partitioned once. In one object a quoted note spans lines
/// across the first boundary: its second range guesses a record start inside the note, so
/// the object is read again whole in place of its ranges (the operator's log says so).
#[tokio::test]
async fn a_csv_object_larger_than_a_range_is_read_in_ranges() {
    const RANGE: usize = 64 << 20;
    let Some(s3) = S3::from_env() else { return };
    let store = s3.store();
    let root = unique("ranges");
    let dir = tempfile::tempdir().unwrap();
    for straddles in [false, true] {
        let mut text = String::from("id,note,x\n");
        let mut rows = 0;
        while text.len() < RANGE + (1 << 20) {
            let note = if straddles && (RANGE - 200..RANGE - 100).contains(&text.len()) {
                // The note's line feed lies past the boundary, in quotes.
                format!("\"{}\nof two lines\"", "n".repeat(RANGE + 10 - text.len()))
            } else {
                format!("note {rows}")
            };
            text.push_str(&format!("u{},{note},{}\n", rows % 1000, rows % 100));
            rows += 1;
        }
        let key = format!("{root}/input-{straddles}.csv");
        store.put(&Path::from(key.clone()), PutPayload::from(text.into_bytes())).await.unwrap();
        let spec = format!(
            "[job]\ndataset_id = \"ranges-{straddles}\"\n[input]\nurls = [\"{}\"]\n[schema]\nunit_column = \"id\"\n\
             [[schema.columns]]\nname = \"id\"\nkind = \"identifier\"\n[[schema.columns]]\nname = \"x\"\n\
             kind = \"integer\"\nmin = 0\nmax = 99\n[privacy]\nepsilon = 1.0\ndelta = 1e-6\n\
             dataset_budget = {{ epsilon = 10.0, delta = 1e-5 }}\n[generator]\nname = \"marginals\"\n\
             [output]\nrows = 1000\n",
            s3.url(&key)
        );
        let job = dir.path().join(format!("job-{straddles}.toml"));
        std::fs::write(&job, spec).unwrap();
        let out = Command::new(bin("rhosynth"))
            .args(["run", job.to_str().unwrap()])
            .args(["--output", &s3.url(&format!("{root}/out-{straddles}"))])
            .args(["--ledger", &s3.url(&format!("{root}/ledger")), "--scratch", &s3.url(&format!("{root}/scratch"))])
            .envs(s3.envs())
            .output()
            .unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{log}");
        let line = log.lines().find(|l| l.contains("partitioned by the workers")).expect("partitioned");
        let field = |name: &str| line.split_whitespace().find_map(|f| f.strip_prefix(name)).map(str::to_string);
        assert_eq!(field("rows="), Some(rows.to_string()), "each row once: {line}");
        assert_eq!(field("units="), Some("1000".into()), "{line}");
        // Two ranges merged, or the object read whole in their place.
        assert_eq!(field("shards="), Some(if straddles { "1" } else { "2" }.into()), "{line}");
        assert_eq!(log.contains("ranges do not join"), straddles, "{log}");
    }
}
