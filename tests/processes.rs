//! The Kubernetes shape on one machine: `rhosynth serve`, separate `rhosynth-worker`
//! processes and `rhosynth submit`, over real sockets; a worker killed mid-job.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use rhosynth_shared::accounting::accountant::Accountant;

/// A coordinator process on a free port; returns it and its URL.
fn coordinator(dir: &Path) -> (Proc, String) {
    coordinator_on(dir, free_port())
}

fn coordinator_on(dir: &Path, port: u16) -> (Proc, String) {
    let mut cmd = Command::new(bin("rhosynth"));
    cmd.args(["serve", "--dev", "--listen", &format!("127.0.0.1:{port}"), "--worker-timeout", "1"])
        .args(["--scratch", dir.join("scratch").to_str().unwrap()])
        .args(["--ledger", dir.join("ledger").to_str().unwrap()]);
    let proc = Proc::spawn(cmd);
    assert!(proc.wait_for("coordinator listening", Duration::from_secs(20)), "coordinator did not start");
    (proc, format!("http://127.0.0.1:{port}"))
}

fn worker(url: &str, name: &str) -> Proc {
    let mut cmd = Command::new(bin("rhosynth-worker"));
    cmd.args(["--coordinator", url, "--name", name]);
    let proc = Proc::spawn(cmd);
    assert!(proc.wait_for("registered", Duration::from_secs(20)), "worker {name} did not register");
    proc
}

fn submit(spec: &Path, url: &str) -> Output {
    Command::new(bin("rhosynth"))
        .args(["submit", spec.to_str().unwrap(), "--coordinator", url])
        .output()
        .expect("run rhosynth submit")
}

fn write_spec(dir: &Path, patients: usize, dataset: &str, partitions: u32) -> std::path::PathBuf {
    place_spec(dir, demo_spec(dir, patients), dataset, partitions)
}

/// Gives a spec its own dataset (ledger), partition count and output directory.
fn place_spec(dir: &Path, text: String, dataset: &str, partitions: u32) -> std::path::PathBuf {
    let text = text
        .replace("dataset_id = \"demo-icu-vitals\"", &format!("dataset_id = \"{dataset}\""))
        .replace("partitions = 4", &format!("partitions = {partitions}"))
        .replace(dir.join("out").to_str().unwrap(), dir.join(format!("out-{dataset}")).to_str().unwrap());
    let path = dir.join(format!("{dataset}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn killing_a_worker_during_dp_sgd_rounds_completes_with_the_same_charge() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, url) = coordinator(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let spec = |name: &str| place_spec(dir.path(), findiff_spec(dir.path(), 300, 4.0), name, 6);

    let mut doomed = worker(&url, "doomed");
    let _survivor = worker(&url, "survivor");
    let out = submit(&spec("calm-sgd"), &url);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Same job; one worker is SIGKILLed once it is training.
    doomed.drain();
    coordinator.drain();
    let stormy = spec("stormy-sgd");
    let submitter = std::thread::spawn({
        let url = url.clone();
        move || submit(&stormy, &url)
    });
    assert!(doomed.wait_for("partition loaded", Duration::from_secs(60)), "the doomed worker never trained");
    assert!(coordinator.wait_for("DP-SGD run charged", Duration::from_secs(5)));
    std::thread::sleep(Duration::from_millis(300));
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let out = submitter.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = manifest(&dir.path().join("out-stormy-sgd")).expect("manifest written");
    assert!(m["rows"].as_u64().unwrap() > 0);
    assert_eq!(m["generator"], "findiff");
    assert!(coordinator.wait_for("worker lost", Duration::from_secs(10)), "the coordinator never noticed the kill");

    let calm = rt.block_on(ledger_state(&dir.path().join("ledger"), "calm-sgd"));
    let stormy = rt.block_on(ledger_state(&dir.path().join("ledger"), "stormy-sgd"));
    assert_eq!((calm.0, stormy.0), (2, 2), "each run charged exactly once (its unit count, then its run)");
    for job in ["calm-sgd", "stormy-sgd"] {
        // The count and the run together are calibrated to the job's ε = 1 under RDP at the
        // orders held for the released count (`dpsgd::plan::COUNT_BAND`), so at the best
        // order the ledger's RDP total is at most 1 and within a few percent of it; its total
        // (the tighter of RDP and PLD) is no larger.
        let rdp = rt.block_on(ledger_total_under(&dir.path().join("ledger"), job, Accountant::Rdp));
        let total = rt.block_on(ledger_state(&dir.path().join("ledger"), job)).1;
        assert!(rdp <= 1.0 + 1e-9 && rdp > 0.97 && total <= rdp + 1e-12, "calibrated to ε = 1: {job} {rdp} {total}");
    }
}

#[test]
fn killing_a_worker_mid_pate_iteration_redoes_its_votes_without_charging_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, url) = coordinator(dir.path());
    let mut doomed = worker(&url, "doomed");
    let _survivor = worker(&url, "survivor");
    // One teacher per task, each slow enough (many Newton steps) to be killed mid-fit.
    let text = pate_spec(dir.path(), 300, 4).replace("max_iterations = 2", "max_iterations = 4").replace(
        "[generator.pate]\n",
        "[generator.pate]\nrelease = \"label\"\nteachers_per_task = 1\nteacher_newton_steps = 3000\n",
    );
    let spec = place_spec(dir.path(), text, "stormy-pate", 6);
    let submitter = std::thread::spawn({
        let url = url.clone();
        move || submit(&spec, &url)
    });
    assert!(coordinator.wait_for("PATE progress", Duration::from_secs(120)), "no iteration finished");
    doomed.drain();
    assert!(doomed.wait_for("task started", Duration::from_secs(60)), "the doomed worker never voted again");
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let out = submitter.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = manifest(&dir.path().join("out-stormy-pate")).expect("manifest written");
    assert_eq!(m["generator"], "pate");
    assert!(coordinator.wait_for("its partitions are redone", Duration::from_secs(10)), "no vote task was redone");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (charges, epsilon) = rt.block_on(ledger_state(&dir.path().join("ledger"), "stormy-pate"));
    assert_eq!(charges, 1, "charged once");
    let charged_queries = m["privacy"]["mechanisms"][0]["queries"].as_u64().unwrap();
    assert_eq!(pate_answered(&m), charged_queries, "every charged query answered once, none twice");
    let charged = m["privacy"]["epsilon"].as_f64().unwrap();
    let own = rt.block_on(ledger_total_under(&dir.path().join("ledger"), "stormy-pate", manifest_accountant(&m)));
    assert!((own - charged).abs() < 1e-9 * charged && epsilon <= own + 1e-12, "{own} {epsilon} vs {charged}");
}

#[test]
fn a_restarted_coordinator_resumes_a_charged_dp_sgd_run_without_charging_again() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (mut first, url) = coordinator_on(dir.path(), port);
    let _workers = [worker(&url, "a"), worker(&url, "b")];
    let text = findiff_spec(dir.path(), 300, 20.0)
        .replace("[job]", "[job]\nid = \"resumable\"")
        .replace("batch_size = 32", "batch_size = 32\ncheckpoint_every = 5");
    let spec = place_spec(dir.path(), text, "resumable", 4);
    let submitter = std::thread::spawn({
        let (spec, url) = (spec.clone(), url.clone());
        move || submit(&spec, &url)
    });
    assert!(first.wait_for("DP-SGD run charged", Duration::from_secs(60)), "training never started");
    let checkpoint = dir.path().join("scratch/checkpoints/resumable");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !checkpoint.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // ~190 rounds: killed well inside the run, after some periodic checkpoints.
    std::thread::sleep(Duration::from_millis(700));
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let lost = submitter.join().unwrap();
    assert!(!lost.status.success(), "the submitter saw its coordinator die");
    assert!(checkpoint.exists(), "a checkpoint survives the crash");
    assert!(manifest(&dir.path().join("out-resumable")).is_none(), "nothing was released");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let charged = rt.block_on(ledger_state(&dir.path().join("ledger"), "resumable"));
    assert_eq!(charged.0, 2, "the unit count and the run");

    // Same job id, same scratch and ledger: the run resumes and is not charged again.
    let (second, url) = coordinator_on(dir.path(), port);
    let out = submit(&spec, &url);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(second.wait_for("resuming the charged DP-SGD run", Duration::from_secs(1)), "the run did not resume");
    let m = manifest(&dir.path().join("out-resumable")).expect("manifest written");
    assert!(m["rows"].as_u64().unwrap() > 0);
    let after = rt.block_on(ledger_state(&dir.path().join("ledger"), "resumable"));
    assert_eq!(after, charged, "resuming charged nothing more");
    assert!(!checkpoint.exists(), "the checkpoint is removed once the job is done");
}

#[test]
fn serve_two_workers_and_submit() {
    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, url) = coordinator(dir.path());
    let _workers = [worker(&url, "a"), worker(&url, "b")];
    let spec = write_spec(dir.path(), 150, "processes", 4);
    let out = submit(&spec, &url);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let m = last_json(&out.stdout);
    assert_eq!(manifest(&dir.path().join("out-processes")).unwrap(), m);
    assert!(m["rows"].as_u64().unwrap() > 0);
}

#[test]
fn killing_a_worker_mid_job_still_completes_with_the_same_charge() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, url) = coordinator(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();

    // Undisturbed run.
    let calm = write_spec(dir.path(), 3000, "calm", 12);
    let mut doomed = worker(&url, "doomed");
    let _survivor = worker(&url, "survivor");
    let out = submit(&calm, &url);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Same job; one worker is SIGKILLed as soon as it starts a task.
    doomed.drain();
    coordinator.drain();
    let stormy = write_spec(dir.path(), 3000, "stormy", 12);
    let submitter = std::thread::spawn({
        let url = url.clone();
        move || submit(&stormy, &url)
    });
    assert!(doomed.wait_for("task started", Duration::from_secs(60)), "the doomed worker got no task");
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let out = submitter.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(manifest(&dir.path().join("out-stormy")).is_some());
    assert!(coordinator.wait_for("worker lost", Duration::from_secs(10)), "the coordinator never noticed the kill");
    if coordinator.wait_for("its partitions are redone", Duration::from_secs(1)) {
        eprintln!("the killed worker's running task was requeued and redone");
    }

    let calm = rt.block_on(ledger_state(&dir.path().join("ledger"), "calm"));
    let stormy = rt.block_on(ledger_state(&dir.path().join("ledger"), "stormy"));
    assert_eq!(calm.0, 1);
    assert_eq!(stormy.0, 1, "charged exactly once despite the lost worker");
    assert_eq!(calm.1, stormy.1, "same ledger total as the undisturbed run");
}

/// Partitioning by the workers: a shard's reader SIGKILLed mid-shard is redone by another
/// worker, and the partitions hold each input row once (an owner's count of a bucket that
/// is not its reader's fails the job): the job completes, charged once, and the
/// coordinator's operator log counts exactly the input's rows.
#[test]
fn a_shard_reader_killed_mid_shard_is_redone_without_double_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, url) = coordinator(dir.path());
    let spec = write_spec(dir.path(), 20_000, "shards", 4);
    let csv = std::fs::read_to_string(dir.path().join("icu_vitals.csv")).unwrap();
    let rows = csv.lines().count() - 1;
    drop(csv);
    let mut doomed = worker(&url, "doomed");
    let submitter = std::thread::spawn({
        let url = url.clone();
        move || submit(&spec, &url)
    });
    assert!(doomed.wait_for("work=\"read shard\"", Duration::from_secs(60)), "the doomed worker read no shard");
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    let after: Vec<String> = doomed.lines.try_iter().collect();
    assert!(!after.iter().any(|line| line.contains("task started")), "killed after its shard: {after:?}");
    let _survivor = worker(&url, "survivor");
    let out = submitter.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(coordinator.wait_for("its partitions are redone", Duration::from_secs(10)), "no task was requeued");
    let line = coordinator.line_with("partitioned by the workers", Duration::from_secs(10)).expect("partitioned");
    let counted = line.split_whitespace().find_map(|field| field.strip_prefix("rows=")).expect("rows counted");
    assert_eq!(counted, rows.to_string(), "each input row once: {line}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(rt.block_on(ledger_state(&dir.path().join("ledger"), "shards")).0, 1, "charged once");
}

/// A shard's reader whose counts are not what it wrote (a bucket's rows, plus one) fails
/// the job before anything is charged or released: the owner's count of that bucket
/// disagrees. The operator's log says which counts disagree; the submitter only that the
/// job failed. The lying worker speaks the real protocol over a real socket and does the
/// real work.
#[test]
fn a_lying_shard_reader_fails_the_job_before_any_release() {
    use rhosynth_proto::coordinator_client::CoordinatorClient;
    use rhosynth_proto::task::Work;
    use rhosynth_proto::{PROTOCOL_VERSION, PollTaskRequest, RegisterWorkerRequest};

    let dir = tempfile::tempdir().unwrap();
    let (coordinator, url) = coordinator(dir.path());
    let spec = write_spec(dir.path(), 300, "lied-to", 4);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let liar_url = url.clone();
    let liar = rt.spawn(async move {
        let channel = tonic::transport::Endpoint::from_shared(liar_url).unwrap().connect().await.unwrap();
        let mut client = CoordinatorClient::new(channel);
        let registered = client
            .register_worker(RegisterWorkerRequest {
                protocol_version: PROTOCOL_VERSION,
                worker_name: "liar".into(),
                capabilities: None,
                rhosynth_version: env!("CARGO_PKG_VERSION").into(),
            })
            .await
            .unwrap();
        let worker_id = registered.into_inner().worker_id;
        let mut executor = rhosynth_worker::execute::Executor::default();
        let mut lied = false;
        loop {
            let poll = PollTaskRequest { worker_id: worker_id.clone(), wait_ms: 300 };
            let Some(task) = client.poll_task(poll).await.unwrap().into_inner().task else { continue };
            let mut aggregate = executor.execute(&task).await.unwrap();
            if matches!(task.work, Some(Work::ReadShard(_))) {
                aggregate.tensors[0].1[0] += 1.0;
                lied = true;
            }
            assert!(lied, "a shard is read before anything else");
            rhosynth_worker::submit(&mut client, &worker_id, &task, aggregate).await.unwrap();
        }
    });
    let out = submit(&spec, &url);
    liar.abort();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        last_json(&out.stdout)["error"].as_str().unwrap().contains("failed while processing private data"),
        "{stdout}"
    );
    assert!(!stdout.contains("rows") && !stdout.contains("shard"), "{stdout}");
    assert!(coordinator.wait_for("whose reader", Duration::from_secs(10)), "the operator log names the disagreement");
    assert_eq!(rt.block_on(ledger_state(&dir.path().join("ledger"), "lied-to")), (0, 0.0), "nothing charged");
    assert!(manifest(&dir.path().join("out-lied-to")).is_none(), "nothing released");
}

#[test]
fn a_worker_of_another_protocol_version_is_refused() {
    use rhosynth_proto::coordinator_client::CoordinatorClient;
    use rhosynth_proto::{PROTOCOL_VERSION, RegisterWorkerRequest};

    let dir = tempfile::tempdir().unwrap();
    let (_coordinator, url) = coordinator(dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(url).unwrap().connect().await.unwrap();
        let mut client = CoordinatorClient::new(channel);
        client
            .register_worker(RegisterWorkerRequest {
                protocol_version: PROTOCOL_VERSION + 1,
                worker_name: "from-the-future".into(),
                capabilities: None,
                rhosynth_version: "9.9.9".into(),
            })
            .await
            .unwrap_err()
    });
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    assert!(status.message().contains("incompatible rhosynth protocol"), "{}", status.message());
}

/// The runs of digits in `text`, as written.
fn numbers(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_digit()).filter(|n| !n.is_empty()).collect()
}

#[test]
fn a_submitter_learns_nothing_row_level_from_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let (coordinator, url) = coordinator(dir.path());
    let _worker = worker(&url, "only");
    // A category the spec does not declare at data row 237 (a number below any port).
    let text = demo_spec(dir.path(), 150).replace("[job]\n", "[job]\nid = \"no-oracle\"\n");
    let spec = place_spec(dir.path(), text, "no-oracle", 4);
    let csv = dir.path().join("icu_vitals.csv");
    let mut lines: Vec<String> = std::fs::read_to_string(&csv).unwrap().lines().map(String::from).collect();
    assert!(lines.len() > 300);
    set_field(&mut lines[237], 8, "bradycardia");
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();

    let out = submit(&spec, &url);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(last_json(&out.stdout)["error"], input_mismatch_message(), "{stdout}");
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for private in ["rhythm", "icu_vitals", "bradycardia", "row "] {
            assert!(!text.contains(private), "the submitter's {name} has '{private}': {text}");
        }
        assert!(!numbers(text).contains(&"237"), "the submitter's {name} has the row number: {text}");
    }
    assert!(
        coordinator.wait_for("icu_vitals.csv: column 'rhythm', row 237: a category", Duration::from_secs(5)),
        "the operator log has the row-level detail"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(rt.block_on(ledger_state(&dir.path().join("ledger"), "no-oracle")), (0, 0.0), "nothing charged");
    assert!(manifest(&dir.path().join("out-no-oracle")).is_none());
}

/// The program that started a job stops reading its output (a notebook's kernel killed, a
/// pipe into `head`): the job still ends, released, rather than losing its workers to a
/// failed write of a log line.
#[test]
fn a_job_whose_output_is_no_longer_read_still_ends() {
    let dir = tempfile::tempdir().unwrap();
    let spec = write_spec(dir.path(), 60, "unread", 2);
    let mut child = Command::new(bin("rhosynth"))
        .args(["run", spec.to_str().unwrap(), "--workers", "2", "--progress", "json"])
        .args(["--scratch", dir.path().join("scratch").to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop((child.stdout.take(), child.stderr.take()));
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the job never ended");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success(), "{status}");
    assert!(manifest(&dir.path().join("out-unread")).is_some(), "released");
}

/// A coordinator's peak memory (VmHWM), in bytes.
fn peak_memory(proc: &Proc) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", proc.child.id())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The coordinator holds no row of a database: the same patients with twenty times the
/// charts (each written twenty times, under caps that keep them all) move its peak memory
/// by less than the added charts take as CSV text, where holding them as it used to (every
/// kept child row while it capped them) took several times that.
#[test]
fn a_database_coordinators_memory_does_not_follow_its_charts() {
    use rhosynth_shared::simulate::database::database_csv;

    let db = database_csv(300, 5);
    let run = |copies: usize| {
        let dir = tempfile::tempdir().unwrap();
        let mut files = db.clone();
        let (header, rows) = db.vitals.split_once('\n').unwrap();
        files.vitals =
            format!("{header}\n{}", rows.lines().flat_map(|l| vec![format!("{l}\n"); copies]).collect::<String>());
        rhosynth_shared::testing::write_database(dir.path(), &files);
        let text = rhosynth_shared::testing::database_job(dir.path(), (3, 8000), "order_by = \"charttime\"").replace(
            "delta = 1e-6\n",
            &format!(
                "delta = 1e-6\ndataset_budget = {{ epsilon = 100.0, delta = 1e-3 }}\n[output]\nurl = {:?}\n",
                dir.path().join("out").to_str().unwrap()
            ),
        );
        let spec = dir.path().join("job.toml");
        std::fs::write(&spec, text).unwrap();
        let (coordinator, url) = coordinator(dir.path());
        let _worker = worker(&url, "a");
        let out = submit(&spec, &url);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (peak_memory(&coordinator), files.vitals.len() as u64)
    };
    let (once, text_once) = run(1);
    let (twenty, text_twenty) = run(20);
    let added = text_twenty - text_once;
    assert!(
        twenty.saturating_sub(once) < added,
        "the coordinator's peak went from {once} to {twenty} bytes with {added} bytes more charts"
    );
}
