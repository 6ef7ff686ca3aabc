//! The Kubernetes manifests, run for real on one machine: renders `k8s/overlays/cpu` with
//! `kubectl kustomize`, starts the coordinator and both StatefulSet workers with *the same
//! command, args and environment* as their containers (addresses rewritten to 127.0.0.1,
//! the Secret's S3 credentials pointed at the test's S3 server, the TLS Secrets made with
//! `openssl`), then runs the CronJob's container twice against a dataset whose budget
//! affords one run: the first writes a
//! complete output, the second is refused (exit 3) and writes nothing. Also scrapes the
//! `/metrics` endpoints the manifests expose. Needs the S3 server `.ci/run` starts.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde_yaml_ng::Value;

/// The S3 server and the Secret's values for it.
fn s3_env() -> Option<Vec<(String, String)>> {
    let endpoint = std::env::var("RHOSYNTH_TEST_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:8333".into());
    if std::net::TcpStream::connect(endpoint.trim_start_matches("http://")).is_err() {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "no S3 server at {endpoint} in CI");
        eprintln!("\n*** SKIPPED: no S3-compatible server at {endpoint} (start SeaweedFS as .ci/run does) ***\n");
        return None;
    }
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "rhosynth".into());
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "rhosynth-secret".into());
    Some(vec![
        ("AWS_ENDPOINT_URL".into(), endpoint),
        ("AWS_ALLOW_HTTP".into(), "true".into()),
        ("AWS_ACCESS_KEY_ID".into(), key),
        ("AWS_SECRET_ACCESS_KEY".into(), secret),
        ("AWS_REGION".into(), "us-east-1".into()),
    ])
}

fn render() -> Vec<Value> {
    let out = Command::new("kubectl")
        .args(["kustomize", repo().join("k8s/overlays/cpu").to_str().unwrap()])
        .output()
        .expect("kubectl is installed");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n---\n").map(|doc| serde_yaml_ng::from_str(doc).unwrap()).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name_prefix: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"].as_str().unwrap().starts_with(name_prefix))
        .unwrap_or_else(|| panic!("no {kind} {name_prefix}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_sequence().map(|s| s.iter().map(|x| x.as_str().unwrap().to_string()).collect()).unwrap_or_default()
}

/// A container's command line and environment, resolved as the kubelet would.
struct Container {
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

fn container(docs: &[Value], pod_spec: &Value, pod_name: &str, secret: &[(String, String)]) -> Container {
    let c = &pod_spec["containers"][0];
    let mut argv = strings(&c["command"]);
    argv.extend(strings(&c["args"]));
    let mut env = Vec::new();
    for e in c["env"].as_sequence().into_iter().flatten() {
        let name = e["name"].as_str().unwrap().to_string();
        let from = &e["valueFrom"];
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if from["configMapKeyRef"].is_mapping() {
            let map = find(docs, "ConfigMap", from["configMapKeyRef"]["name"].as_str().unwrap());
            map["data"][from["configMapKeyRef"]["key"].as_str().unwrap()].as_str().unwrap().to_string()
        } else if from["fieldRef"]["fieldPath"] == "metadata.name" {
            pod_name.to_string()
        } else {
            panic!("unsupported env source for {name}")
        };
        env.push((name, value));
    }
    for source in c["envFrom"].as_sequence().into_iter().flatten() {
        assert_eq!(source["secretRef"]["name"], "rhosynth-s3", "the only Secret is the S3 credentials");
        env.extend(secret.iter().cloned());
    }
    Container { argv, env }
}

/// Rewrites cluster addresses (and mounted paths) to local ones.
fn rewrite(argv: &[String], map: &HashMap<String, String>) -> Vec<String> {
    argv.iter().map(|a| map.iter().fold(a.clone(), |acc, (from, to)| acc.replace(from, to))).collect()
}

fn command(argv: &[String], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(bin(&argv[0]));
    cmd.args(&argv[1..]).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    cmd
}

fn http_get(port: u16, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

#[test]
fn only_the_operators_monitoring_reaches_the_metrics_ports() {
    let docs = render();
    let policies: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "NetworkPolicy").collect();
    let mut scraped = 0;
    for policy in policies {
        for rule in policy["spec"]["ingress"].as_sequence().into_iter().flatten() {
            // A rule without `from` admits every pod in the cluster.
            let from = rule["from"].as_sequence().expect("every ingress rule names its peers");
            let ports: Vec<u64> =
                rule["ports"].as_sequence().unwrap().iter().map(|p| p["port"].as_u64().unwrap()).collect();
            if ports.iter().any(|p| [9090, 9091].contains(p)) {
                assert_eq!(ports.len(), 1, "{rule:?}");
                assert_eq!(from.len(), 1, "{rule:?}");
                assert_eq!(from[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"], "monitoring");
                assert!(from[0]["podSelector"].is_null(), "{rule:?}");
                scraped += 1;
            }
        }
    }
    assert_eq!(scraped, 2, "the coordinator's and the workers' metrics ports");
}

#[test]
fn manifests_run_locally_and_a_spent_budget_refuses_the_next_scheduled_run() {
    let Some(secret) = s3_env() else { return };
    let docs = render();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let env_map: HashMap<String, String> = secret.iter().cloned().collect();
    let store: Arc<dyn ObjectStore> = Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(&env_map["AWS_ENDPOINT_URL"])
            .with_allow_http(true)
            .with_bucket_name("rhosynth")
            .with_access_key_id(&env_map["AWS_ACCESS_KEY_ID"])
            .with_secret_access_key(&env_map["AWS_SECRET_ACCESS_KEY"])
            .with_region("us-east-1")
            .build()
            .unwrap(),
    );

    // The CronJob's job spec, from its ConfigMap; a fresh dataset id per test run.
    let dir = tempfile::tempdir().unwrap();
    let spec = find(&docs, "ConfigMap", "rhosynth-nightly-job")["data"]["job.toml"].as_str().unwrap().to_string();
    let dataset = format!("icu-vitals-{}-{}", std::process::id(), rand_suffix());
    let spec = spec.replace("dataset_id = \"icu-vitals\"", &format!("dataset_id = \"{dataset}\""));
    std::fs::write(dir.path().join("job.toml"), &spec).unwrap();
    let csv = rhosynth_shared::simulate::icu_vitals_csv(200, 11);
    rt.block_on(store.put(&Path::from("incoming/icu_vitals.csv"), PutPayload::from(csv.into_bytes()))).unwrap();

    let (grpc, metrics) = (free_port(), free_port());
    let worker_metrics = [free_port(), free_port()];
    let local = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let mut map: HashMap<String, String> = HashMap::from([
        ("0.0.0.0:50051".into(), format!("127.0.0.1:{grpc}")),
        ("https://rhosynth-coordinator:50051".into(), format!("https://127.0.0.1:{grpc}")),
        ("0.0.0.0:9090".into(), format!("127.0.0.1:{metrics}")),
        ("/etc/rhosynth/job/job.toml".into(), local("job.toml")),
        ("/etc/rhosynth/datasets/".into(), local("datasets/")),
        ("/etc/rhosynth/submitters/".into(), local("submitters/")),
        ("/etc/rhosynth/token/".into(), local("token/")),
        ("/etc/rhosynth/tls/".into(), local("coordinator-tls/")),
        ("/etc/rhosynth/worker-tls/".into(), local("worker-tls/")),
        ("/etc/rhosynth/coordinator-ca/".into(), local("coordinator-tls/")),
    ]);

    // What cert-manager issues (tls.yaml): a CA, the coordinator's server certificate and
    // the workers' client certificate, as the Secrets' files.
    let d = dir.path();
    ca(d, "ca");
    issue(d, "ca", "server", "subjectAltName=IP:127.0.0.1,DNS:rhosynth-coordinator\nextendedKeyUsage=serverAuth");
    issue(d, "ca", "worker", "extendedKeyUsage=clientAuth");
    for (secret_dir, leaf) in [("coordinator-tls", "server"), ("worker-tls", "worker")] {
        std::fs::create_dir_all(d.join(secret_dir)).unwrap();
        std::fs::copy(d.join("ca.pem"), d.join(secret_dir).join("ca.crt")).unwrap();
        std::fs::copy(d.join(format!("{leaf}.pem")), d.join(secret_dir).join("tls.crt")).unwrap();
        std::fs::copy(d.join(format!("{leaf}.key")), d.join(secret_dir).join("tls.key")).unwrap();
    }
    // The operator's Secrets: the CronJob's token, and its hash granting the dataset.
    let token = format!("nightly-{}", rand_suffix());
    std::fs::create_dir_all(d.join("token")).unwrap();
    std::fs::write(d.join("token/token"), &token).unwrap();
    std::fs::create_dir_all(d.join("submitters")).unwrap();
    let hash = rhosynth_coordinator::auth::token_sha256(&token);
    let grant = format!(
        "[[submitter]]\nname = \"nightly\"\ntoken_sha256 = \"{hash}\"\ndatasets = [\"{dataset}\"]\noutput_root = \
         \"s3://rhosynth/synthetic/icu-vitals/\"\n"
    );
    std::fs::write(d.join("submitters/submitters.toml"), grant).unwrap();
    // The declared dataset (its ConfigMap), with a budget (ε 0.5 at δ = 1e-5) that affords
    // one run calibrated to ε = 0.5 at δ = 1e-6 (cheaper at the larger δ), not two. The
    // coordinator creates its ledger at start.
    let declared = find(&docs, "ConfigMap", "rhosynth-datasets")["data"]["datasets.toml"].as_str().unwrap();
    assert!(declared.contains("id = \"icu-vitals\"") && declared.contains("epsilon = 10.0, delta = 1e-6"));
    let declared = declared
        .replace("id = \"icu-vitals\"", &format!("id = \"{dataset}\""))
        .replace("epsilon = 10.0, delta = 1e-6", "epsilon = 0.5, delta = 1e-5");
    std::fs::create_dir_all(d.join("datasets")).unwrap();
    std::fs::write(d.join("datasets/datasets.toml"), declared).unwrap();
    let config =
        container(&docs, &find(&docs, "Deployment", "rhosynth-coordinator")["spec"]["template"]["spec"], "c", &secret);

    // Coordinator and workers, exactly as the Deployment and StatefulSet run them.
    let coordinator = Proc::spawn(command(&rewrite(&config.argv, &map), &config.env));
    assert!(coordinator.wait_for("coordinator listening", Duration::from_secs(30)));
    let set = find(&docs, "StatefulSet", "rhosynth-worker");
    let replicas = set["spec"]["replicas"].as_u64().unwrap() as usize;
    assert_eq!(replicas, 2);
    let workers: Vec<Proc> = (0..replicas)
        .map(|i| {
            let pod = format!("rhosynth-worker-{i}");
            let c = container(&docs, &set["spec"]["template"]["spec"], &pod, &secret);
            map.insert("0.0.0.0:9091".into(), format!("127.0.0.1:{}", worker_metrics[i]));
            let w = Proc::spawn(command(&rewrite(&c.argv, &map), &c.env));
            assert!(w.wait_for("registered", Duration::from_secs(30)), "{pod} did not register");
            w
        })
        .collect();

    // The CronJob's container, twice.
    let cron = find(&docs, "CronJob", "rhosynth-nightly");
    let job_spec = &cron["spec"]["jobTemplate"]["spec"]["template"]["spec"];
    let submitter = container(&docs, job_spec, "rhosynth-nightly-1", &secret);
    let first = command(&rewrite(&submitter.argv, &map), &submitter.env).stdin(Stdio::null()).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let manifest = last_json(&first.stdout);
    let job = manifest["job_id"].as_str().unwrap().to_string();
    let listed: Vec<Path> = rt
        .block_on(store.list(Some(&Path::from("synthetic/icu-vitals"))).map_ok(|m| m.location).try_collect())
        .unwrap();
    assert!(listed.iter().any(|p| p.as_ref() == format!("synthetic/icu-vitals/{job}/_manifest.json")));

    // Metrics from the coordinator and a worker, on the ports the manifests declare.
    let scrape = http_get(metrics, "/metrics");
    assert!(scrape.contains(&format!("rhosynth_epsilon_spent{{dataset=\"{dataset}\"}}")), "{scrape}");
    assert!(
        scrape.contains("rhosynth_workers 2") && scrape.contains("rhosynth_jobs{state=\"succeeded\"} 1"),
        "{scrape}"
    );
    let worker_scrape = http_get(worker_metrics[0], "/metrics");
    assert!(worker_scrape.contains("rhosynth_worker_tasks_total"), "{worker_scrape}");
    assert!(http_get(worker_metrics[1], "/healthz").ends_with("ok"));

    let second = command(&rewrite(&submitter.argv, &map), &submitter.env).output().unwrap();
    assert_eq!(second.status.code(), Some(3), "{}", String::from_utf8_lossy(&second.stderr));
    assert!(String::from_utf8_lossy(&second.stderr).contains("privacy budget exceeded"));
    let after: Vec<Path> = rt
        .block_on(store.list(Some(&Path::from("synthetic/icu-vitals"))).map_ok(|m| m.location).try_collect())
        .unwrap();
    assert_eq!(
        after.iter().filter(|p| !p.as_ref().contains(&job)).count(),
        listed.iter().filter(|p| !p.as_ref().contains(&job)).count(),
        "the refused run wrote nothing"
    );
    drop(workers);
    drop(coordinator);
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}
