//! What a submitter of a served dataset can watch before a job's release. Two jobs whose
//! schemas fit 10⁵ and 10⁶ of one declared dataset's rows show their submitters the same
//! statuses, apart from the job id, until their end is shown at a boundary of their
//! schedule: no stage, task count or ε that could time the rows read.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use rhosynth_coordinator::datasets::Datasets;
use rhosynth_coordinator::service::{CoordinatorConfig, SCHEDULED};
use rhosynth_coordinator::standalone::Standalone;
use rhosynth_proto::coordinator_client::CoordinatorClient;
use rhosynth_proto::{GetJobRequest, JobState, JobStatus, SubmitJobRequest};

/// A job's spec: column `c` declares `categories` and refuses any other.
fn spec(categories: &str, out: &std::path::Path) -> String {
    format!(
        "[job]\ndataset_id = \"wide\"\npartitions = 4\n[schema]\nunit_column = \"person\"\n\
         [[schema.columns]]\nname = \"person\"\nkind = \"identifier\"\n\
         [[schema.columns]]\nname = \"c\"\nkind = \"categorical\"\ncategories = {categories}\nunknown = \"reject\"\n\
         [privacy]\nepsilon = 0.5\ndelta = 1e-7\n[generator]\nname = \"marginals\"\n[output]\nurl = \"{}\"\n",
        out.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_submitter_sees_before_the_release_does_not_count_rows() {
    let dir = tempfile::tempdir().unwrap();
    // 10⁶ rows of 2·10⁵ people: c is "a" on a tenth of them.
    let mut csv = String::from("person,c\n");
    for i in 0..1_000_000u32 {
        csv.push_str(&format!("p{},{}\n", i % 200_000, if i % 10 == 0 { "a" } else { "b" }));
    }
    std::fs::write(dir.path().join("rows.csv"), csv).unwrap();
    let declared = format!(
        "[[dataset]]\nid = \"wide\"\nunit_column = \"person\"\nbudget = {{ epsilon = 10.0, delta = 1e-6 }}\n\
         [dataset.input]\nurls = [\"{}\"]\n",
        dir.path().join("rows.csv").display()
    );
    let datasets = Datasets::parse(&declared, "datasets.toml", dir.path().join("ledger").to_str().unwrap()).unwrap();
    datasets.init_ledgers().await.unwrap();
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = dir.path().join("scratch").to_str().unwrap().into();
    config.env.release_quantum = Some(Duration::from_millis(500));
    config.datasets = Some(datasets);
    let cluster = Standalone::start(config, 2).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(cluster.url.clone()).unwrap().connect().await.unwrap();
    let mut client = CoordinatorClient::new(channel);

    let mut seen: Vec<(BTreeSet<String>, JobStatus)> = Vec::new();
    let mut submitted = Vec::new();
    for (categories, out) in [("[\"a\"]", "out-a"), ("[\"a\", \"b\"]", "out-ab")] {
        let spec_toml = spec(categories, &dir.path().join(out));
        let request = SubmitJobRequest { spec_toml, spec_path: "job.toml".into(), ..Default::default() };
        submitted.push(chrono::Utc::now());
        let job_id = client.submit_job(request).await.unwrap().into_inner().job_id;
        let mut before = BTreeSet::new();
        let last = loop {
            let status = client.get_job(GetJobRequest { job_id: job_id.clone() }).await.unwrap().into_inner();
            if status.state != JobState::Running as i32 {
                break status;
            }
            before.insert(format!("{:?}", JobStatus { job_id: String::new(), ..status }));
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(last.state, JobState::Succeeded as i32, "{}", last.message);
        seen.push((before, last));
    }
    cluster.shutdown().await;
    let only =
        format!("{:?}", JobStatus { state: JobState::Running as i32, message: SCHEDULED.into(), ..Default::default() });
    for (before, _) in &seen {
        assert_eq!(before.iter().collect::<Vec<_>>(), [&only], "every status before the end");
    }
    // The ledger, which any submitter of the dataset can read, changed only at boundaries:
    // each charge was written just after q·2^k from its job's start (q = 0.5 s).
    let location = rhosynth_shared::storage::open(dir.path().join("ledger").to_str().unwrap()).unwrap();
    let ledger = rhosynth_privacy::ledger::Ledger::open(&location, "wide").await.unwrap();
    let charged: Vec<_> = ledger.charges().iter().map(|(entry, _)| entry.timestamp).collect();
    assert_eq!(charged.len(), 2);
    for (at, submitted) in charged.iter().zip(&submitted) {
        let after = (*at - *submitted).as_seconds_f64();
        let boundary = (0..12).map(|k| 0.5 * f64::from(1 << k)).find(|b| after >= *b && after < b + 0.25);
        assert!(boundary.is_some(), "charged {after:.3} s after submission: not just after a boundary");
    }
    // Both read every row: a value the schema does not fit is `__other__`, not a row left out.
    for (_, last) in &seen {
        let manifest: serde_json::Value = serde_json::from_str(&last.manifest_json).unwrap();
        assert!(manifest["rows"].as_u64().unwrap() > 0);
    }
}
