//! Who may talk to a production coordinator (`serve` with TLS, declared datasets and
//! submitters): real processes over TLS sockets, certificates made with `openssl`.
//! Workers without a certificate from the workers' CA, submitters without a known token,
//! a token used on a dataset it was not granted, and a job that tries to choose its own
//! input, ledger or an output outside its submitter's root are all refused; an authorised
//! job runs and charges the declared ledger, even when a row breaks the submitter's schema
//! (the row is left out, never reported).

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use rhosynth_proto::coordinator_client::CoordinatorClient;
use rhosynth_proto::{GetJobRequest, PROTOCOL_VERSION, RegisterWorkerRequest};
use tonic::transport::Endpoint;

fn submit(dir: &Path, spec: &Path, url: &str, token: Option<&str>) -> Output {
    let mut cmd = Command::new(bin("rhosynth"));
    cmd.args(["submit", spec.to_str().unwrap(), "--coordinator", url, "--tls-ca"])
        .arg(dir.join("ca.pem"))
        .env_remove("RHOSYNTH_TOKEN");
    if let Some(token) = token {
        cmd.env("RHOSYNTH_TOKEN", token);
    }
    cmd.output().expect("run rhosynth submit")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn only_authenticated_workers_and_authorised_submitters_reach_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca(d, "ca");
    issue(d, "ca", "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth");
    issue(d, "ca", "worker", "extendedKeyUsage=clientAuth");
    ca(d, "rogue-ca");
    issue(d, "rogue-ca", "rogue", "extendedKeyUsage=clientAuth");

    // The operator declares the dataset (input, unit, ledger, budget) and two submitters.
    let submitted = demo_spec(d, 60);
    let input = d.join("icu_vitals.csv");
    // One row holds a rhythm the submitter's schema does not declare. On a declared dataset
    // it is left out: a failure would tell the submitter, for free, that such a row exists.
    let mut lines: Vec<String> = std::fs::read_to_string(&input).unwrap().lines().map(String::from).collect();
    set_field(&mut lines[5], 8, "bradycardia");
    std::fs::write(&input, lines.join("\n") + "\n").unwrap();
    let ledger = d.join("declared-ledger");
    std::fs::write(
        d.join("datasets.toml"),
        format!(
            "[[dataset]]\nid = \"icu\"\nunit_column = \"patient_id\"\nledger = \"{}\"\nbudget = {{ epsilon = 10.0, \
             delta = 1e-5 }}\n[dataset.input]\nurls = [\"{}\"]\n",
            ledger.display(),
            input.display()
        ),
    )
    .unwrap();
    let (alice, bob, carol) = ("alice-token-0123456789", "bob-token-0123456789", "carol-token-0123456789");
    std::fs::write(
        d.join("submitters.toml"),
        format!(
            "[[submitter]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\ndatasets = [\"icu\"]\noutput_root = \"{}\"\n\n\
             [[submitter]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\ndatasets = [\"claims\"]\noutput_root = \"{}\"\n\n\
             [[submitter]]\nname = \"carol\"\ntoken_sha256 = \"{}\"\ndatasets = [\"icu\"]\noutput_root = \"{}\"\n",
            rhosynth_coordinator::auth::token_sha256(alice),
            d.join("out").display(),
            rhosynth_coordinator::auth::token_sha256(bob),
            d.join("bob").display(),
            rhosynth_coordinator::auth::token_sha256(carol),
            d.join("carol").display()
        ),
    )
    .unwrap();

    let port = free_port();
    let mut cmd = Command::new(bin("rhosynth"));
    cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--worker-timeout", "1", "--release-quantum", "0.2"])
        .args(["--scratch", d.join("scratch").to_str().unwrap(), "--ledger", d.join("ledger").to_str().unwrap()])
        .args(["--datasets", d.join("datasets.toml").to_str().unwrap()])
        .args(["--submitters", d.join("submitters.toml").to_str().unwrap()])
        .args([
            "--tls-cert",
            d.join("server.pem").to_str().unwrap(),
            "--tls-key",
            d.join("server.key").to_str().unwrap(),
        ])
        .args(["--worker-ca", d.join("ca.pem").to_str().unwrap()]);
    let coordinator = Proc::spawn(cmd);
    assert!(coordinator.wait_for("coordinator listening", Duration::from_secs(20)), "coordinator did not start");
    let url = format!("https://127.0.0.1:{port}");

    let worker = |name: &str, cert: &str| {
        let mut cmd = Command::new(bin("rhosynth-worker"));
        cmd.args(["--coordinator", &url, "--name", name, "--tls-ca", d.join("ca.pem").to_str().unwrap()])
            .args(["--tls-cert", d.join(format!("{cert}.pem")).to_str().unwrap()])
            .args(["--tls-key", d.join(format!("{cert}.key")).to_str().unwrap()]);
        Proc::spawn(cmd)
    };

    // A worker whose certificate another CA signed never registers.
    let rogue = worker("rogue", "rogue");
    assert!(!rogue.wait_for("registered", Duration::from_secs(3)), "a rogue worker registered");
    drop(rogue);
    // A client with no certificate at all is refused at the worker RPCs.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(async {
        let tls = rhosynth_proto::tls::client_config(&d.join("ca.pem"), None).unwrap();
        let channel = Endpoint::from_shared(url.clone()).unwrap().tls_config(tls).unwrap().connect().await.unwrap();
        let mut client = CoordinatorClient::new(channel.clone());
        let register = client
            .register_worker(RegisterWorkerRequest {
                protocol_version: PROTOCOL_VERSION,
                worker_name: "anonymous".into(),
                capabilities: None,
                rhosynth_version: String::new(),
            })
            .await
            .unwrap_err();
        let status = client.get_job(GetJobRequest { job_id: "alice.x".into() }).await.unwrap_err();
        (register.code(), status.code())
    });
    assert_eq!(refused, (tonic::Code::Unauthenticated, tonic::Code::Unauthenticated));
    assert!(!coordinator.wait_for("worker registered", Duration::from_millis(200)), "no worker may have registered");
    let _good = worker("good", "worker");

    // The submitter's spec names the dataset; input, ledger and budget are the operator's.
    let declared_only = submitted
        .lines()
        .filter(|l| !l.starts_with("urls = ") && !l.starts_with("ledger = ") && !l.starts_with("dataset_budget = "))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("[input]\n", "")
        .replace("dataset_id = \"demo-icu-vitals\"", "dataset_id = \"icu\"\nid = \"nightly\"");
    let spec = d.join("job.toml");
    std::fs::write(&spec, &declared_only).unwrap();

    let out = submit(d, &spec, &url, None);
    assert!(!out.status.success() && stderr(&out).contains("bearer token is required"), "{}", stderr(&out));
    let out = submit(d, &spec, &url, Some("guessed-token"));
    assert!(!out.status.success() && stderr(&out).contains("unknown bearer token"), "{}", stderr(&out));
    let out = submit(d, &spec, &url, Some(bob));
    assert!(!out.status.success() && stderr(&out).contains("may not run jobs on dataset 'icu'"), "{}", stderr(&out));
    // Alice may use the dataset, but not point it at other files or a fresh ledger.
    let own_input = d.join("own-input.toml");
    std::fs::write(&own_input, format!("{declared_only}\n[input]\nurls = [\"/etc/hostname\"]\n")).unwrap();
    let out = submit(d, &own_input, &url, Some(alice));
    assert!(stderr(&out).contains("a job may not set [input]"), "{}", stderr(&out));
    let own_ledger = d.join("own-ledger.toml");
    let fresh = declared_only.replace("[privacy]\n", "[privacy]\ndataset_budget = { epsilon = 1000.0, delta = 0.1 }\n");
    std::fs::write(&own_ledger, fresh).unwrap();
    let out = submit(d, &own_ledger, &url, Some(alice));
    assert!(stderr(&out).contains("a job may not set [privacy] dataset_budget"), "{}", stderr(&out));
    // Nor write anywhere but under her own output root (here: into Bob's).
    let elsewhere = d.join("elsewhere.toml");
    let bobs = declared_only.replace(d.join("out").to_str().unwrap(), d.join("bob/x").to_str().unwrap());
    std::fs::write(&elsewhere, bobs).unwrap();
    let out = submit(d, &elsewhere, &url, Some(alice));
    assert!(stderr(&out).contains("outside submitter 'alice''s output root"), "{}", stderr(&out));
    assert_eq!(rt.block_on(ledger_state(&ledger, "icu")).0, 0, "nothing charged by refused jobs");

    // A token is never sent in the clear (only loopback may skip TLS).
    let out = Command::new(bin("rhosynth"))
        .args(["submit", spec.to_str().unwrap(), "--coordinator", "http://192.0.2.1:50051"])
        .env("RHOSYNTH_TOKEN", alice)
        .output()
        .unwrap();
    assert!(stderr(&out).contains("refusing to send a bearer token without TLS"), "{}", stderr(&out));

    let out = submit(d, &spec, &url, Some(alice));
    assert!(out.status.success(), "{}", stderr(&out));
    let status = last_json(&out.stdout);
    assert_eq!(status["job_id"], "alice.nightly", "{status}");
    let m = manifest(&d.join("out")).expect("manifest written");
    assert!(m["rows"].as_u64().unwrap() > 0);
    assert_eq!(m["privacy"]["ledger_url"], ledger.to_str().unwrap());
    assert_eq!(rt.block_on(ledger_state(&ledger, "icu")).0, 1, "charged to the declared ledger");
    assert!(!d.join("ledger").join("icu").exists(), "never to the coordinator's default ledger");
    // A spec that names no output writes under her root, in the job's own folder.
    let unnamed = d.join("no-output.toml");
    let without = &declared_only[..declared_only.find("[output]").unwrap()];
    std::fs::write(&unnamed, without.replace("id = \"nightly\"", "id = \"unnamed\"")).unwrap();
    let out = submit(d, &unnamed, &url, Some(alice));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(manifest(&d.join("out").join("alice.unnamed")).is_some(), "released under the output root");

    // Bob cannot even see that Alice's job exists.
    let seen = rt.block_on(async {
        let tls = rhosynth_proto::tls::client_config(&d.join("ca.pem"), None).unwrap();
        let channel = Endpoint::from_shared(url.clone()).unwrap().tls_config(tls).unwrap().connect().await.unwrap();
        let as_ = |token: &'static str| {
            CoordinatorClient::with_interceptor(channel.clone(), move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
                Ok(r)
            })
        };
        let job = || GetJobRequest { job_id: "alice.nightly".into() };
        let bob_sees = as_(bob).get_job(job()).await.map_err(|s| s.code());
        let alice_sees = as_(alice).get_job(job()).await.map(|r| r.into_inner().job_id).map_err(|s| s.code());
        (bob_sees.err(), alice_sees)
    });
    assert_eq!(seen, (Some(tonic::Code::NotFound), Ok("alice.nightly".to_string())));

    // The dataset's ledger as each submitter sees it: every charge's cost and the totals,
    // as the data owner's own view gives them, and only the submitter's own jobs by name.
    let show = |token: &str| {
        Command::new(bin("rhosynth"))
            .args(["ledger", "show", "--dataset", "icu", "--coordinator", &url, "--tls-ca"])
            .arg(d.join("ca.pem"))
            .env("RHOSYNTH_TOKEN", token)
            .output()
            .unwrap()
    };
    let owner = Command::new(bin("rhosynth"))
        .args(["ledger", "show", "--dataset", "icu", "--store", ledger.to_str().unwrap()])
        .output()
        .unwrap();
    let owner = last_json(&owner.stdout);
    let costs = |shown: &serde_json::Value| -> Vec<(u64, f64, String)> {
        let charges = shown["charges"].as_array().unwrap().iter();
        charges.map(|c| (c["seq"].as_u64().unwrap(), c["epsilon"].as_f64().unwrap(), c["status"].to_string())).collect()
    };
    let alice_sees = show(alice);
    assert!(alice_sees.status.success(), "{}", stderr(&alice_sees));
    let alice_sees = last_json(&alice_sees.stdout);
    let carol_out = show(carol);
    assert!(carol_out.status.success(), "{}", stderr(&carol_out));
    let carol_sees = last_json(&carol_out.stdout);
    for seen in [&alice_sees, &carol_sees] {
        assert_eq!((&seen["spent"], &seen["budget"]), (&owner["spent"], &owner["budget"]), "{seen}");
        assert_eq!(costs(seen), costs(&owner));
        assert!(seen.get("input").is_none(), "the operator's files are not a submitter's to see: {seen}");
    }
    assert_eq!(costs(&owner).len(), 2);
    let named = |shown: &serde_json::Value, field: &str| -> Vec<serde_json::Value> {
        shown["charges"].as_array().unwrap().iter().map(|c| c[field].clone()).collect()
    };
    assert_eq!(named(&alice_sees, "job_id"), [serde_json::json!("alice.nightly"), serde_json::json!("alice.unnamed")]);
    assert!(named(&alice_sees, "mechanisms").iter().all(|m| !m.as_array().unwrap().is_empty()));
    assert!(named(&carol_sees, "job_id").iter().chain(&named(&carol_sees, "mechanisms")).all(|v| v.is_null()));
    // No charge's time (the data owner's view has them).
    assert!(named(&alice_sees, "timestamp").iter().chain(&named(&carol_sees, "timestamp")).all(|v| v.is_null()));
    assert!(named(&owner, "timestamp").iter().all(|v| v.is_string()));
    let carol_text = String::from_utf8_lossy(&carol_out.stdout).into_owned() + &stderr(&carol_out);
    assert!(!carol_text.contains("alice"), "another submitter's jobs named: {carol_text}");
    // A dataset not granted is absent; an unknown token is refused.
    let out = show(bob);
    assert!(!out.status.success() && stderr(&out).contains("no dataset 'icu' is granted"), "{}", stderr(&out));
    let out = show("guessed-token");
    assert!(!out.status.success() && stderr(&out).contains("unknown bearer token"), "{}", stderr(&out));
}
