//! A database served from an operator's declaration: the submitter's `[[tables]]` name
//! declared tables and the coordinator reads their declared files, every row, under the
//! dataset's one ledger. A table file of the submitter's choosing is refused before
//! anything is read, as are caps under which one patient's rows could outgrow what a
//! worker holds; a job on some of the tables charges the same budget.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use rhosynth_coordinator::datasets::Datasets;
use rhosynth_coordinator::service::CoordinatorConfig;
use rhosynth_coordinator::standalone::Standalone;
use rhosynth_proto::coordinator_client::CoordinatorClient;
use rhosynth_proto::{GetJobRequest, JobState, JobStatus, SubmitJobRequest};
use tonic::transport::Channel;

/// Submits `spec_toml` and follows it to its end.
async fn follow(client: &mut CoordinatorClient<Channel>, spec_toml: String) -> Result<JobStatus, tonic::Status> {
    let request = SubmitJobRequest { spec_toml, spec_path: "job.toml".into(), ..Default::default() };
    let job_id = client.submit_job(request).await?.into_inner().job_id;
    loop {
        let status = client.get_job(GetJobRequest { job_id: job_id.clone() }).await?.into_inner();
        if status.state != JobState::Running as i32 {
            return Ok(status);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_database_job_reads_the_declared_tables_under_one_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let db = rhosynth_shared::simulate::database::database_csv(200, 5);
    rhosynth_shared::testing::write_database(d, &db);
    let file = |name: &str| d.join(name).display().to_string();
    let ledger = d.join("declared-ledger");
    let declared = format!(
        "[[dataset]]\nid = \"icu\"\nunit_column = \"subject_id\"\nledger = {:?}\n\
         budget = {{ epsilon = 20.0, delta = 1e-5 }}\n[dataset.input]\nurls = [{:?}]\n\
         [[dataset.tables]]\nname = \"admissions\"\ninput = {{ urls = [{:?}] }}\n\
         [[dataset.tables]]\nname = \"vitals\"\ninput = {{ urls = [{:?}] }}\n",
        ledger.display().to_string(),
        file("patients.csv"),
        file("admissions.csv"),
        file("vitals.csv")
    );
    let datasets = Datasets::parse(&declared, "datasets.toml", d.join("ledger").to_str().unwrap()).unwrap();
    datasets.init_ledgers().await.unwrap();
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = d.join("scratch").to_str().unwrap().into();
    config.datasets = Some(datasets);
    let cluster = Standalone::start(config, 2).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(cluster.url.clone()).unwrap().connect().await.unwrap();
    let mut client = CoordinatorClient::new(channel);

    // The submitter's spec: the database job without a file, ledger or budget of its own.
    let submitted = |out: &str| {
        let mut text = String::new();
        for line in rhosynth_shared::testing::database_job(d, (3, 8), "order_by = \"charttime\"").lines() {
            if line.starts_with("urls = ") || line.starts_with("input = ") || line == "[input]" {
                continue;
            }
            text.push_str(&line.replace("dataset_id = \"db\"", "dataset_id = \"icu\""));
            text.push('\n');
        }
        text.replace("[privacy]\n", &format!("[output]\nurl = {:?}\n[privacy]\n", file(out)))
            .replace("name = \"database\"\n", "name = \"database\"\n[generator.database.aim]\nrounds = 40\n")
    };

    let own_file = submitted("out-own").replace(
        "name = \"vitals\"\n",
        &format!("name = \"vitals\"\ninput = {{ urls = [{:?}] }}\n", file("admissions.csv")),
    );
    let refused = follow(&mut client, own_file).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("a table's input"), "{}", refused.message());
    let undeclared = submitted("out-labs").replace("name = \"vitals\"", "name = \"labs\"");
    let refused = follow(&mut client, undeclared).await.unwrap_err();
    assert!(refused.message().contains("declares no table 'labs'"), "{}", refused.message());
    // Caps under which one patient's rows could hold more than a worker holds of one
    // (2¹² admissions of 2¹² charts each): refused from the spec alone,
    // the job never started, nothing read or charged.
    let wide = submitted("out-wide")
        .replace("max_per_parent = 3\n", "max_per_parent = 4096\n")
        .replace("max_per_parent = 8\n", "max_per_parent = 4096\n");
    let refused = follow(&mut client, wide).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("MiB a worker holds of one unit"), "{}", refused.message());
    assert!(!d.join("out-wide").exists(), "nothing written");
    assert_eq!(ledger_state(&ledger, "icu").await.0, 0, "refused before anything was charged");

    let status = follow(&mut client, submitted("out")).await.unwrap();
    assert_eq!(status.state, JobState::Succeeded as i32, "{}", status.message);
    let (manifest, tables) = read_database(&d.join("out"));
    assert_eq!(manifest["privacy"]["ledger_url"], ledger.to_str().unwrap());
    let names: Vec<&str> = tables.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["patients", "admissions", "vitals"]);
    let [(_, patients), (_, admissions), (_, vitals)] = &tables[..] else { panic!("three tables") };
    let subjects: HashSet<String> = keys(patients, "subject_id").into_iter().collect();
    let hadm: HashSet<String> = keys(admissions, "hadm_id").into_iter().collect();
    assert!(keys(admissions, "subject_id").iter().all(|s| subjects.contains(s)), "every admission's patient exists");
    assert!(keys(vitals, "hadm_id").iter().all(|h| hadm.contains(h)), "every chart's admission exists");
    assert!(!hadm.is_empty() && !keys(vitals, "hadm_id").is_empty());
    assert_eq!(ledger_state(&ledger, "icu").await.0, 1, "one charge, to the declared ledger");
    assert!(!d.join("ledger").join("icu").exists(), "never to the coordinator's default ledger");

    // Patients and their admissions alone: the same people, the same budget.
    let two = submitted("out-two");
    let two =
        two[..two.find("[[tables]]\nname = \"vitals\"").unwrap()].to_string() + &two[two.find("[privacy]").unwrap()..];
    let two = two.replace("[privacy]\n", &format!("[output]\nurl = {:?}\n[privacy]\n", file("out-two")));
    let status = follow(&mut client, two).await.unwrap();
    assert_eq!(status.state, JobState::Succeeded as i32, "{}", status.message);
    let (_, tables) = read_database(&d.join("out-two"));
    assert_eq!(tables.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["patients", "admissions"]);
    assert_eq!(ledger_state(&ledger, "icu").await.0, 2, "charged to the same ledger");
    cluster.shutdown().await;
}
