//! The `rhosynth` binary's privacy and ledger commands, run as a user would: a real process,
//! its last stdout line parsed as JSON, its exit status checked.

use std::process::{Command, Output};

use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, account};
use rhosynth_shared::accounting::mechanism::Mechanism;
use serde_json::Value;

fn rhosynth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rhosynth")).args(args).output().expect("run rhosynth")
}

fn last_json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line =
        stdout.lines().last().unwrap_or_else(|| panic!("no stdout; stderr: {}", String::from_utf8_lossy(&out.stderr)));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {line}"))
}

const RUN: [&str; 8] = ["--q", "0.01", "--sigma", "1.1", "--steps", "2000", "--delta", "1e-5"];

#[test]
fn epsilon_agrees_with_the_library_for_both_accountants() {
    for (accountant, name) in [(Accountant::Rdp, "rdp"), (Accountant::Pld, "pld")] {
        let out = rhosynth(&[&["privacy", "epsilon", "--accountant", name][..], &RUN].concat());
        assert!(out.status.success());
        let v = last_json(&out);
        let expected =
            account(&[Mechanism::dp_sgd(0.01, 1.1, 2000)], accountant, 1e-5, &AccountingOptions::default()).unwrap();
        assert_eq!(v["epsilon"].as_f64().unwrap(), expected.epsilon);
        assert_eq!(v["accountant"], name);
        assert_eq!(v["delta"].as_f64().unwrap(), 1e-5);
        assert_eq!(v.get("order").is_some(), accountant == Accountant::Rdp);
    }
    // The classic conversion is never tighter than the improved one.
    let classic = last_json(&rhosynth(&[&["privacy", "epsilon", "--conversion", "classic"][..], &RUN].concat()));
    let improved = last_json(&rhosynth(&[&["privacy", "epsilon"][..], &RUN].concat()));
    assert!(classic["epsilon"].as_f64().unwrap() >= improved["epsilon"].as_f64().unwrap());
}

#[test]
fn sigma_meets_the_target() {
    let v = last_json(&rhosynth(&[
        "privacy",
        "sigma",
        "--epsilon",
        "2",
        "--delta",
        "1e-5",
        "--q",
        "0.02",
        "--steps",
        "500",
    ]));
    let sigma = v["sigma"].as_f64().unwrap();
    let eps = v["epsilon"].as_f64().unwrap();
    assert!(eps <= 2.0 && eps > 1.99, "σ {sigma} gives ε {eps}");
}

#[test]
fn gnmax_reports_both_bounds_and_composes_data_independently() {
    let v = last_json(&rhosynth(&[
        "privacy",
        "gnmax",
        "--sigma",
        "40",
        "--votes",
        "240,10",
        "--order",
        "8",
        "--queries",
        "1000",
        "--delta",
        "1e-5",
    ]));
    assert_eq!(v["rdp_data_independent"].as_f64().unwrap(), 8.0 / 1600.0);
    assert!(v["rdp_data_dependent"].as_f64().unwrap() < v["rdp_data_independent"].as_f64().unwrap());
    assert!(v["logq"].as_f64().unwrap() < 0.0);
    let gnmax = Mechanism::GnMax { sigma: 40.0, classes: 2, queries: 1000 };
    let expected = account(&[gnmax], Accountant::Rdp, 1e-5, &AccountingOptions::default()).unwrap();
    assert_eq!(v["epsilon"].as_f64().unwrap(), expected.epsilon);
    let bad = rhosynth(&["privacy", "gnmax", "--sigma", "40", "--votes", "240,10", "--order", "1"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("order > 1"));
}

#[test]
fn ledger_init_show_and_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().to_str().unwrap();
    let at = ["--dataset", "cli-test", "--store", store];
    let init = rhosynth(&[&["ledger", "init"][..], &at, &["--epsilon", "1.0", "--delta", "1e-5"]].concat());
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    let again = rhosynth(&[&["ledger", "init"][..], &at, &["--epsilon", "9", "--delta", "1e-5"]].concat());
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));

    let run = ["--q", "0.01", "--sigma", "4", "--steps", "1000", "--delta", "1e-5"];
    let fits = rhosynth(&[&["ledger", "charge-dry-run"][..], &at, &run].concat());
    assert!(fits.status.success(), "{}", String::from_utf8_lossy(&fits.stderr));
    let v = last_json(&fits);
    assert_eq!(v["admitted"], true);
    assert!(v["remaining_epsilon"].as_f64().unwrap() > 0.0);
    // The total is the tighter of the two accountants, at the budget's δ.
    let after = &v["spent_after"];
    let (rdp, pld) = (after["rdp_epsilon"].as_f64().unwrap(), after["pld_epsilon"].as_f64().unwrap());
    assert_eq!(after["epsilon"].as_f64().unwrap(), rdp.min(pld));
    assert_eq!(after["accountant"], if pld < rdp { "pld" } else { "rdp" });
    assert_eq!(after["delta"].as_f64().unwrap(), 1e-5);

    let gnmax = r#"{"kind":"gn_max","sigma":5,"classes":2,"queries":1000}"#;
    let too_much =
        rhosynth(&[&["ledger", "charge-dry-run"][..], &at, &["--mechanism", gnmax, "--delta", "1e-5"]].concat());
    assert_eq!(too_much.status.code(), Some(3), "budget refusal exits with 3");
    let v = last_json(&too_much);
    assert_eq!(v["admitted"], false);
    assert!(v["reason"].as_str().unwrap().contains("privacy budget exceeded"));

    let show = rhosynth(&[&["ledger", "show"][..], &at].concat());
    assert!(show.status.success());
    let v = last_json(&show);
    assert_eq!(v["entries"], 1, "dry runs write nothing");
    assert_eq!(v["spent"]["epsilon"].as_f64().unwrap(), 0.0);
    assert_eq!(v["budget"]["epsilon"].as_f64().unwrap(), 1.0);

    let missing = rhosynth(&["ledger", "show", "--dataset", "nope", "--store", store]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("rhosynth ledger init"));
}

/// `--worker-timeout 0` (and negative) once panicked at start; now a usage error.
#[test]
fn serve_refuses_a_worker_timeout_outside_its_range() {
    for bad in ["0", "-1", "NaN", "1e9"] {
        let out = rhosynth(&["serve", "--dev", "--listen", "127.0.0.1:0", &format!("--worker-timeout={bad}")]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("--worker-timeout"), "{bad}: {stderr}");
        assert!(!stderr.contains("panicked"), "{bad}: {stderr}");
    }
}

/// A production coordinator needs its datasets, submitters and TLS files; `--dev` (none of
/// them) only listens on loopback.
#[test]
fn serve_without_authentication_is_loopback_only() {
    let out = rhosynth(&["serve", "--listen", "127.0.0.1:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for flag in ["--datasets", "--submitters", "--tls-cert", "--tls-key", "--worker-ca"] {
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
    let out = rhosynth(&["serve", "--dev", "--listen", "0.0.0.0:0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("loopback only"), "{stderr}");
}

/// `demo --spec` runs a spec on the cohort the demo simulates; a spec reading another file
/// is refused before anything is simulated or read.
#[test]
fn demo_refuses_a_spec_that_reads_another_input() {
    let dir = tempfile::tempdir().unwrap();
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pbcseq-sequence.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_rhosynth"))
        .args(["demo", "--patients", "10", "--spec", spec.to_str().unwrap()])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reads the simulated cohort"));
    assert!(!dir.path().join("rhosynth-out").exists(), "nothing simulated");
}

/// A variable of the project's former name (`DPSYNTH_LEDGER`) would be ignored: both
/// binaries refuse to start, naming it and its new name, before doing anything.
#[test]
fn a_variable_of_the_former_name_is_refused_not_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rhosynth"))
        .args(["demo", "--patients", "10"])
        .env("DPSYNTH_LEDGER", "s3://bucket/ledger")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("DPSYNTH_LEDGER set") && stderr.contains("RHOSYNTH_LEDGER"), "{stderr}");
    assert!(!dir.path().join("rhosynth-out").exists(), "nothing ran");
    let worker = std::path::Path::new(env!("CARGO_BIN_EXE_rhosynth")).with_file_name("rhosynth-worker");
    assert!(worker.exists(), "{} is missing: run `cargo test --workspace` (it builds every binary)", worker.display());
    let out = Command::new(worker).env("DPSYNTH_COORDINATOR", "http://127.0.0.1:1").output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("RHOSYNTH_COORDINATOR"), "{stderr}");
}

/// Whatever umask the operator's shell has, every file and directory a job writes (the
/// simulated input, scratch, ledger, the evaluation's diagnostics, the release) is its
/// user's alone: private rows are never readable by other users of the machine.
#[test]
fn every_file_a_job_writes_is_private_to_its_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/icu-marginals.toml");
    let command = format!(
        "umask 022 && exec '{}' demo --patients 30 --spec '{}'",
        env!("CARGO_BIN_EXE_rhosynth"),
        spec.display()
    );
    let out = Command::new("sh").args(["-c", &command]).current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    fn walk(path: &std::path::Path, seen: &mut Vec<(String, u32)>) {
        seen.push((path.display().to_string(), std::fs::metadata(path).unwrap().permissions().mode() & 0o777));
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                walk(&entry.unwrap().path(), seen);
            }
        }
    }
    let mut seen = Vec::new();
    walk(&dir.path().join("rhosynth-out"), &mut seen);
    for store in ["scratch/instances", "/entries/", "diagnostics", "demo/input", "icu-marginals"] {
        assert!(seen.iter().any(|(path, _)| path.contains(store)), "{store} was written: {seen:?}");
    }
    assert!(seen.iter().any(|(path, _)| path.ends_with("report.json")), "the evaluation's report: {seen:?}");
    let open: Vec<_> = seen.iter().filter(|(_, mode)| mode & 0o077 != 0).collect();
    assert!(open.is_empty(), "readable by others: {open:?}");
}

/// `submit` never sends its token in the clear: not to a host named after user information
/// that a prefix check would take for loopback, not over http with a CA it would not use,
/// not over http to another host; it fails before connecting.
#[test]
fn submit_refuses_urls_that_would_send_its_token_in_the_clear() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/demo.toml");
    let spec = spec.to_str().unwrap();
    for (url, ca, refusal) in [
        ("http://127.0.0.1:@evil.example:50051", None, "names a user"),
        ("http://127.0.0.1:50051", Some("ca.pem"), "--tls-ca is for an https://"),
        ("http://coordinator.example:50051", None, "without TLS"),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rhosynth"));
        cmd.args(["submit", spec, "--coordinator", url]).env("RHOSYNTH_TOKEN", "a-token-0123456789");
        if let Some(ca) = ca {
            cmd.args(["--tls-ca", ca]);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{url}: {stderr}");
        assert!(stderr.contains(refusal), "{url}: {stderr}");
    }
}

#[test]
fn a_job_tied_to_a_parent_that_is_not_its_own_is_refused_before_it_starts() {
    let out = rhosynth(&["run", "no-such-spec.toml", "--stop-with-parent", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("process 1 is not this one's parent"), "{stderr}");
}
