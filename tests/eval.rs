//! `rhosynth eval`: exact scores for a table against itself, the CLI end to end on the demo
//! and on pbcseq (rendered by headless Chromium when available), and evaluation at the
//! end of a job whose spec names a held-out set.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use rhosynth_coordinator::job::JobRequest;
use rhosynth_coordinator::service::CoordinatorConfig;
use rhosynth_coordinator::standalone::Standalone;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::eval;
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::testing::shared_data;

#[tokio::test]
async fn a_table_against_itself_scores_perfectly() {
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&demo_spec(dir.path(), 60), "demo").unwrap();
    let domain = Domain::from_spec(&spec);
    let table = rhosynth_shared::data::table::load(&spec, &domain, &spec.input.urls).await.unwrap();
    let report = eval::evaluate(&spec, &domain, &table, &table, &table, None);
    assert!((report.fidelity.hist - 1.0).abs() < 1e-12, "HIST {}", report.fidelity.hist);
    assert!((report.fidelity.pair - 1.0).abs() < 1e-12, "Pair {}", report.fidelity.pair);
    assert!((report.fidelity.triple - 1.0).abs() < 1e-12, "Triple {}", report.fidelity.triple);
    assert_eq!(report.fidelity.cor_acc, 1.0);
    assert!(report.fidelity.columns.iter().all(|c| c.w1.unwrap_or(0.0) == 0.0 && c.js.unwrap_or(0.0) == 0.0));
    assert_eq!(report.privacy.exact_copy_rate, 1.0);
    assert_eq!((report.privacy.dcr_synthetic_median, report.privacy.dcr_holdout_p5), (0.0, 0.0));
    let l = report.longitudinal.as_ref().expect("unit and order_by make it longitudinal");
    assert_eq!((l.state_transition_divergence, l.sequence_length_tv, l.tdcr_synthetic_median), (0.0, 0.0, 0.0));
    assert_eq!(l.tdcr_js, 0.0);
    // Dynamics: every numeric vital, the same three ways, and the demo's vitals persist.
    let order = spec.schema.order_by.as_deref();
    let numeric: Vec<&str> = domain
        .columns
        .iter()
        .filter(|c| eval::is_numeric(c) && Some(c.name.as_str()) != order)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(l.dynamics.iter().map(|d| d.column.as_str()).collect::<Vec<_>>(), numeric);
    for d in &l.dynamics {
        assert_eq!((d.lag1_synthetic, d.lag1_holdout), (d.lag1_real, d.lag1_real), "{}", d.column);
        assert_eq!((d.transition_error, d.holdout_transition_error), (0.0, 0.0), "{}", d.column);
    }
    assert_eq!((l.mean_lag1_gap(), l.holdout_mean_lag1_gap()), (Some(0.0), Some(0.0)));
    let persistent = l.dynamics.iter().filter(|d| d.lag1_real.is_some_and(|r| r > 0.2)).count();
    assert!(persistent > 0, "{:?}", l.dynamics);
    let html = eval::report::html(&report);
    assert!(html.contains("Dynamics within units") && html.contains("lag-1 autocorrelation per column"));
}

/// Splits a CSV by unit (column `unit`, an integer or `P…` id) into train and test files.
fn split_by_unit(csv: &Path, unit: usize, dir: &Path) -> (String, String) {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let (mut train, mut test) = (vec![header.to_string()], vec![header.to_string()]);
    for line in lines {
        let id: u64 = line.split(',').nth(unit).unwrap().trim_start_matches('P').parse().unwrap();
        if id.is_multiple_of(2) { train.push(line.into()) } else { test.push(line.into()) }
    }
    let (a, b) = (dir.join("train.csv"), dir.join("test.csv"));
    std::fs::write(&a, train.join("\n") + "\n").unwrap();
    std::fs::write(&b, test.join("\n") + "\n").unwrap();
    (a.to_str().unwrap().to_string(), b.to_str().unwrap().to_string())
}

/// Runs a job on `train` and evaluates its output; returns the report directory.
fn run_and_evaluate(spec_text: &str, train: &str, test: &str, dir: &Path) -> std::path::PathBuf {
    let spec_path = dir.join("job.toml");
    std::fs::write(&spec_path, spec_text).unwrap();
    let out = dir.join("synthetic");
    let run = Command::new(bin("rhosynth"))
        .args(["run", spec_path.to_str().unwrap(), "--output", out.to_str().unwrap()])
        .args(["--ledger", dir.join("ledger").to_str().unwrap(), "--scratch", dir.join("scratch").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let report = dir.join("report");
    let eval = Command::new(bin("rhosynth"))
        .args(["eval", "--spec", spec_path.to_str().unwrap(), "--train", train, "--test", test])
        .args(["--synthetic", out.to_str().unwrap(), "--out", report.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let summary = last_json(&eval.stdout);
    assert_eq!(summary["longitudinal"], true);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(report.join("report.json")).unwrap()).unwrap();
    assert!(json["notice"].as_str().unwrap().contains("DO NOT PUBLISH"));
    assert!(json["guarantee"]["epsilon"].as_f64().unwrap() > 0.0, "the manifest's guarantee is in the report");
    report
}

/// Headless Chromium must parse the page and find every plot.
fn rendered_plots(html: &Path) -> Option<usize> {
    let browser = ["chromium-headless-shell", "chromium", "chromium-browser"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()));
    let Some(browser) = browser else {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "headless Chromium missing in CI");
        eprintln!("\n*** SKIPPED rendering check: no headless Chromium ***\n");
        return None;
    };
    let dom = Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", html.display()))
        .output()
        .unwrap();
    assert!(dom.status.success(), "{}", String::from_utf8_lossy(&dom.stderr));
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("rhosynth evaluation report"));
    Some(dom.matches("<svg").count())
}

#[test]
fn eval_on_the_demo_output_renders() {
    let dir = tempfile::tempdir().unwrap();
    let spec = demo_spec(dir.path(), 80);
    let (train, test) = split_by_unit(&dir.path().join("icu_vitals.csv"), 0, dir.path());
    let spec = spec.replace(dir.path().join("icu_vitals.csv").to_str().unwrap(), &train);
    let report = run_and_evaluate(&spec, &train, &test, dir.path());
    // 9 columns, rows per unit, lag-1 and transition error per vital, DCR.
    if let Some(plots) = rendered_plots(&report.join("report.html")) {
        assert_eq!(plots, 13);
    }
}

#[test]
fn eval_on_pbcseq_renders() {
    let Some(pbcseq) = shared_data("pbcseq/pbcseq.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = split_by_unit(&pbcseq, 1, dir.path());
    let example = std::fs::read_to_string(repo().join("examples/pbcseq-marginals.toml")).unwrap();
    // Its own split, and no evaluation at the end of the job (this test runs `eval`).
    let spec =
        example[..example.find("[evaluation]").unwrap()].replace("./rhosynth-out/pbcseq-split/train.csv", &train);
    let report = run_and_evaluate(&spec, &train, &test, dir.path());
    // 18 synthesised columns, rows per unit, lag-1 and transition error per numeric
    // column, DCR.
    if let Some(plots) = rendered_plots(&report.join("report.html")) {
        assert_eq!(plots, 22);
    }
}

/// `rhosynth run` reads an input named through a parent folder (the examples read
/// `../shared/data`): the ledger binds the file's own path, so the job runs instead of
/// being refused for the `..` (which a ledger never records).
#[test]
fn run_reads_an_input_named_through_a_parent_folder() {
    let dir = tempfile::tempdir().unwrap();
    let absolute = dir.path().join("icu_vitals.csv");
    let spec = demo_spec(dir.path(), 40).replace(absolute.to_str().unwrap(), "../icu_vitals.csv");
    let sub = dir.path().join("jobs");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("job.toml"), &spec).unwrap();
    let run = Command::new(bin("rhosynth"))
        .current_dir(&sub)
        .args(["run", "job.toml", "--scratch", dir.path().join("scratch").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(manifest(&dir.path().join("out")).is_some());
    // The ledger (`<store>/<dataset>/entries/<seq>.json`) names the file itself.
    let entries = dir.path().join("ledger/demo-icu-vitals/entries");
    let canonical = std::fs::canonicalize(&absolute).unwrap();
    let names_file = std::fs::read_dir(entries)
        .unwrap()
        .flatten()
        .any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains(canonical.to_str().unwrap())));
    assert!(names_file, "the ledger binds {}", canonical.display());
}

/// The report is computed on private rows (training and held-out): it goes to the
/// operator's diagnostics store, never under the output prefix, and its figures stay out
/// of the log; a coordinator without a diagnostics store refuses such a job.
#[test]
fn a_job_naming_a_held_out_set_writes_its_report_to_the_diagnostics_store_only() {
    let dir = tempfile::tempdir().unwrap();
    let spec = demo_spec(dir.path(), 60);
    let (train, test) = split_by_unit(&dir.path().join("icu_vitals.csv"), 0, dir.path());
    let spec = spec.replace(dir.path().join("icu_vitals.csv").to_str().unwrap(), &train)
        + &format!("\n[evaluation]\ntest_urls = [\"{test}\"]\n");
    let spec = spec.replace("[job]\n", "[job]\nid = \"evaluated\"\n");
    std::fs::write(dir.path().join("job.toml"), &spec).unwrap();
    let diagnostics = dir.path().join("diagnostics");
    let run = Command::new(bin("rhosynth"))
        .args(["run", dir.path().join("job.toml").to_str().unwrap()])
        .args(["--scratch", dir.path().join("scratch").to_str().unwrap()])
        .args(["--diagnostics", diagnostics.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let out = dir.path().join("out");
    assert!(manifest(&out).is_some());
    let beside: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|name| !(name.starts_with("part-") || name == "_manifest.json"))
        .collect();
    assert!(beside.is_empty(), "only parts and the manifest under the output prefix: {beside:?}");
    let report_dir = diagnostics.join("evaluated");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(report_dir.join("report.json")).unwrap()).unwrap();
    assert!(report["fidelity"]["hist"].as_f64().unwrap() > 0.0);
    assert!(report_dir.join("report.html").exists());
    assert!(!stderr.contains("hist") && !stderr.contains("pair="), "evaluation figures in the log: {stderr}");

    // `serve` without --diagnostics: the job is refused at submission, before any read.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(async {
        let cluster = Standalone::start(CoordinatorConfig::default(), 0).await.unwrap();
        let spec = JobSpec::parse(&spec, "evaluated").unwrap();
        let request = JobRequest::new("evaluated-2", spec);
        let refused = cluster.service.start_job(request).map(|_| ()).unwrap_err();
        cluster.shutdown().await;
        refused
    });
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("diagnostics"), "{refused:?}");
}

/// `rhosynth eval` never writes its report into a release, nor under one; elsewhere the
/// report says at its top that it is not differentially private.
#[test]
fn eval_refuses_to_write_its_report_beside_a_release() {
    let dir = tempfile::tempdir().unwrap();
    let spec_path = dir.path().join("job.toml");
    std::fs::write(&spec_path, demo_spec(dir.path(), 40)).unwrap();
    let out = dir.path().join("synthetic");
    let run = Command::new(bin("rhosynth"))
        .args(["run", spec_path.to_str().unwrap(), "--output", out.to_str().unwrap()])
        .args(["--ledger", dir.path().join("ledger").to_str().unwrap()])
        .args(["--scratch", dir.path().join("scratch").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let input = dir.path().join("icu_vitals.csv");
    let eval = |report: &Path| {
        Command::new(bin("rhosynth"))
            .args(["eval", "--spec", spec_path.to_str().unwrap(), "--test", input.to_str().unwrap()])
            .args(["--synthetic", out.to_str().unwrap(), "--out", report.to_str().unwrap()])
            .output()
            .unwrap()
    };
    for report in [out.clone(), out.join("report"), out.join("a/b")] {
        let refused = eval(&report);
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success(), "{}: {stderr}", report.display());
        assert!(stderr.contains("must never sit beside a release"), "{stderr}");
        assert!(!report.join("report.json").exists() && !report.join("report.html").exists());
    }
    let report = dir.path().join("diagnostics");
    let accepted = eval(&report);
    assert!(accepted.status.success(), "{}", String::from_utf8_lossy(&accepted.stderr));
    assert_eq!(last_json(&accepted.stdout)["differentially_private"], false);
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(report.join("report.json")).unwrap()).unwrap();
    assert!(json["notice"].as_str().unwrap().starts_with("NOT DIFFERENTIALLY PRIVATE — DO NOT PUBLISH."));
    assert_eq!(json["differentially_private"], false);
    let html = std::fs::read_to_string(report.join("report.html")).unwrap();
    let banner = html.find("NOT DIFFERENTIALLY PRIVATE — DO NOT PUBLISH.").expect("banner");
    assert!(banner < html.find("<h1>").unwrap(), "the banner comes first");
}

/// Caps that bind (tiny here) sample each metric's input, and the report says what was
/// used out of what was available, in report.json and on the page.
#[tokio::test]
async fn the_report_states_what_its_caps_sampled() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = JobSpec::parse(&demo_spec(dir.path(), 30), "demo").unwrap();
    spec.schema.target = Some("rhythm".into());
    spec.schema.positive_class = Some("afib".into());
    let domain = Domain::from_spec(&spec);
    let table = rhosynth_shared::data::table::load(&spec, &domain, &spec.input.urls).await.unwrap();
    let rows = table.rows();
    let units = table.units.iter().collect::<std::collections::HashSet<_>>().len();

    // Default caps: this small table is evaluated whole.
    let whole = eval::evaluate(&spec, &domain, &table, &table, &table, None);
    let find = |report: &eval::EvalReport, metric: &str, table: &str| {
        let u = report.sampling.iter().find(|u| u.metric == metric && u.table == table);
        let u = u.unwrap_or_else(|| panic!("{metric} / {table} in {:?}", report.sampling));
        (u.used, u.available, u.sampled)
    };
    assert_eq!(find(&whole, "DCR reference", "train"), (rows, rows, false));
    assert_eq!(find(&whole, "DCR queries", "synthetic"), (rows, rows, false));
    assert_eq!(find(&whole, "TDCR reference (tables)", "train"), (units, units, false));
    assert_eq!(find(&whole, "utility: fitted", "synthetic"), (rows, rows, false));
    assert_eq!(whole.privacy.dcr_synthetic.len(), rows);

    let limits = eval::EvalLimits {
        dcr_queries: 7,
        dcr_reference: 50,
        attack_records: 5,
        attack_reference: 20,
        fidelity_rows: 30,
        fidelity_pairs: 4,
        fidelity_triples: 3,
        utility_fit_rows: 60,
        utility_test_rows: 40,
        tdcr_queries: 3,
        tdcr_reference: 10,
        ..eval::EvalLimits::default()
    };
    let stages = std::sync::Mutex::new(Vec::new());
    let progress = |s: &str| stages.lock().unwrap().push(s.to_string());
    let report = eval::evaluate_with(&spec, &domain, &table, &table, &table, None, &limits, &progress);
    let d = domain.columns.len();
    for (metric, name, used, available) in [
        ("DCR reference", "train", 50, rows),
        ("DCR queries", "synthetic", 7, rows),
        ("DCR queries", "test", 7, rows),
        ("exact-copy rate", "synthetic", rows, rows),
        ("membership attack members", "train", 5, rows),
        ("membership attack reference", "synthetic", 20, rows),
        ("Pair, CorAcc", "train", 30, rows),
        ("Pair, CorAcc", "column pairs", 4, d * (d - 1) / 2),
        ("Triple", "column triples", 3, d * (d - 1) * (d - 2) / 6),
        ("HIST, W1, JS", "synthetic", rows, rows),
        ("utility: fitted", "train", 60, rows),
        ("utility: scored", "test", 40, rows),
        ("TDCR queries (tables)", "synthetic", 3, units),
        ("TDCR reference (tables)", "train", 10, units),
    ] {
        assert_eq!(find(&report, metric, name), (used, available, used < available), "{metric} / {name}");
    }
    assert_eq!((report.privacy.dcr_synthetic.len(), report.privacy.dcr_holdout.len()), (7, 7));
    // The exact-copy rate reads every row whatever the caps.
    assert_eq!(report.privacy.exact_copy_rate, 1.0);
    assert_eq!(report.limits, limits);
    assert_eq!(
        *stages.lock().unwrap(),
        [
            "evaluation 1/4: fidelity",
            "evaluation 2/4: utility",
            "evaluation 3/4: longitudinal",
            "evaluation 4/4: empirical privacy"
        ]
    );
    assert_eq!(report.timings.len(), 4);

    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["differentially_private"], false);
    assert_eq!(json["limits"]["dcr_reference"], 50);
    let dcr = json["sampling"].as_array().unwrap().iter().find(|u| u["metric"] == "DCR reference").unwrap();
    assert_eq!(
        (dcr["used"].as_u64(), dcr["available"].as_u64(), dcr["sampled"].as_bool()),
        (Some(50), Some(rows as u64), Some(true))
    );
    let html = eval::report::html(&report);
    assert!(html.contains("id=\"sampling\""), "a Sampling section");
    assert!(html.contains(&format!(
        "<tr><td>DCR reference</td><td>train</td><td>50</td><td>{rows}</td><td><b>sampled</b></td></tr>"
    )));
    assert!(html.contains("were sampled under the evaluation's caps"), "a note at the top");
    let anything_sampled = whole.sampling.iter().any(|u| u.sampled);
    assert_eq!(eval::report::html(&whole).contains("were sampled under"), anything_sampled);
}

/// Writes a design matrix as CSV (features…, label).
fn write_design(d: &eval::utility::Design, path: &Path) {
    let mut text = String::new();
    for r in 0..d.rows {
        let row: Vec<String> = d.x[r * d.cols..(r + 1) * d.cols].iter().map(|v| v.to_string()).collect();
        text.push_str(&format!("{},{}\n", row.join(","), u8::from(d.y[r])));
    }
    std::fs::write(path, text).unwrap();
}

/// Our logistic regression on real Adult (train → test) against scikit-learn's on the
/// same encoding: ROC-AUC within 0.01.
#[tokio::test]
async fn adult_logistic_regression_matches_scikit_learn() {
    let (Some(train_csv), Some(test_csv)) = (shared_data("adult/adult.data"), shared_data("adult/adult.test")) else {
        return;
    };
    let text = std::fs::read_to_string(repo().join("examples/adult-marginals.toml")).unwrap();
    let spec = JobSpec::parse(&text, "adult").unwrap();
    let domain = Domain::from_spec(&spec);
    let train =
        rhosynth_shared::data::table::load(&spec, &domain, &[train_csv.to_str().unwrap().to_string()]).await.unwrap();
    let test =
        rhosynth_shared::data::table::load(&spec, &domain, &[test_csv.to_str().unwrap().to_string()]).await.unwrap();
    let target = domain.index_of("income").unwrap();
    let (dtrain, dtest) =
        (eval::utility::design(&domain, &train, target, 1.0), eval::utility::design(&domain, &test, target, 1.0));
    assert_eq!((dtrain.rows, dtest.rows), (32_561, 16_281));
    let p = eval::utility::logistic_regression(&dtrain, &dtest).unwrap();
    let (pos, neg): (Vec<_>, Vec<_>) = p.iter().zip(&dtest.y).partition(|(_, y)| **y);
    let ours = eval::privacy::auc(
        &pos.iter().map(|x| *x.0).collect::<Vec<_>>(),
        &neg.iter().map(|x| *x.0).collect::<Vec<_>>(),
    );
    eprintln!("rhosynth logistic regression ROC-AUC on Adult: {ours:.4}");
    assert!(ours > 0.85, "{ours}");

    let sklearn = Command::new("python3").args(["-c", "import sklearn"]).output();
    if !sklearn.is_ok_and(|o| o.status.success()) {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "scikit-learn missing in CI");
        eprintln!("\n*** SKIPPED scikit-learn comparison: scikit-learn not installed ***\n");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_design(&dtrain, &dir.path().join("train.csv"));
    write_design(&dtest, &dir.path().join("test.csv"));
    let out = Command::new("python3")
        .arg(repo().join("tests/sklearn_check.py"))
        .args([dir.path().join("train.csv"), dir.path().join("test.csv")])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let reference = last_json(&out.stdout)["roc_auc"].as_f64().unwrap();
    eprintln!("scikit-learn logistic regression ROC-AUC on the same encoding: {reference:.4}");
    assert!((ours - reference).abs() < 0.01, "rhosynth {ours} vs scikit-learn {reference}");
}

/// `rhosynth eval` of a database: a job's release against a held-out cohort, end to end.
/// Every synthetic row has its parent, each table has its section, the per-unit utility
/// is scored, the page renders with a plot per child table; a held-out database missing a
/// table and a label naming no column are refused with what is wrong.
#[test]
fn eval_of_a_database_reports_every_table() {
    use rhosynth_shared::simulate::database::database_csv;
    use rhosynth_shared::testing::write_database;
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train"), dir.path().join("test"));
    for (folder, patients, seed) in [(&train, 400, 5), (&test, 200, 6)] {
        std::fs::create_dir_all(folder).unwrap();
        write_database(folder, &database_csv(patients, seed));
    }
    let spec = std::fs::read_to_string(repo().join("examples/mimic-database.toml"))
        .unwrap()
        .replace("./rhosynth-out/database/input", train.to_str().unwrap())
        .replace("./rhosynth-out/ledger", dir.path().join("ledger").to_str().unwrap())
        .replace("./rhosynth-out/database/synthetic", dir.path().join("synthetic").to_str().unwrap());
    let spec_path = dir.path().join("job.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let run = Command::new(bin("rhosynth"))
        .args(["run", spec_path.to_str().unwrap(), "--scratch", dir.path().join("scratch").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let held_out = |tables: &[&str]| -> Vec<String> {
        tables.iter().flat_map(|t| ["--test".to_string(), format!("{t}={}/{t}.csv", test.display())]).collect()
    };
    let eval = |tests: Vec<String>, label: &str| {
        Command::new(bin("rhosynth"))
            .args(["eval", "--spec", spec_path.to_str().unwrap()])
            .args(tests)
            .args(["--synthetic", dir.path().join("synthetic").to_str().unwrap(), "--label", label])
            .args(["--out", dir.path().join("report").to_str().unwrap()])
            .output()
            .unwrap()
    };
    let all = ["patients", "admissions", "vitals"];
    let output = eval(held_out(&all), "admissions.outcome=died");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let summary = last_json(&output.stdout);
    let names: Vec<&str> = summary["tables"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, all);
    for t in summary["tables"].as_array().unwrap() {
        assert_eq!(t["with_parent"], 1.0, "{t}");
    }
    assert_eq!(summary["differentially_private"], false);
    let trained_on: Vec<&str> =
        summary["utility"].as_array().unwrap().iter().map(|u| u["trained_on"].as_str().unwrap()).collect();
    let on = ["synthetic", "real (train)", "synthetic, re-joined at random"];
    assert_eq!(trained_on, [on[0], on[0], on[1], on[1], on[2], on[2]], "two models on each");
    let links = summary["links_error"]["synthetic"].as_f64().unwrap();
    assert!((0.0..=2.0).contains(&links), "{summary}");
    let attack = summary["membership_auc"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&attack) && summary["exact_copy_rate"].as_f64().unwrap() < 0.05, "{summary}");
    let report = dir.path().join("report");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(report.join("report.json")).unwrap()).unwrap();
    assert!(json["notice"].as_str().unwrap().contains("DO NOT PUBLISH"));
    assert!((json["guarantee"]["epsilon"].as_f64().unwrap() - 4.0).abs() < 1e-3, "the manifest's guarantee");
    assert_eq!(json["tables"][2]["within"][0]["synthetic"], 1.0, "every chart inside its admission");
    let html = std::fs::read_to_string(report.join("report.html")).unwrap();
    assert!(all.iter().all(|t| html.contains(&format!("<h2>Table {t}</h2>"))));
    assert!(html.contains("Empirical privacy") && html.contains("Per patient") && html.contains("re-joined at random"));
    assert!(html.contains("Links between a row and its children"));
    for name in ["report.json", "report.html"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(report.join(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{name}: private data, its owner's only");
    }
    if let Some(plots) = rendered_plots(&report.join("report.html")) {
        assert_eq!(
            plots, 4,
            "the links, admissions per patient, vitals per admission, the distances to the closest record"
        );
    }

    let refused = eval(held_out(&all[..2]), "admissions.outcome=died");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("no files for table 'vitals'"));
    let refused = eval(held_out(&all), "admissions.result=died");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("table 'admissions' has no column 'result'"));
    // A release whose manifest lists other tables than the spec's is refused, not read as
    // a database without them.
    let manifest = dir.path().join("synthetic/_manifest.json");
    let mut listed: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    listed["tables"].as_array_mut().unwrap().pop();
    std::fs::write(&manifest, serde_json::to_vec(&listed).unwrap()).unwrap();
    let refused = eval(held_out(&all), "admissions.outcome=died");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("the release lists tables [\"patients\", \"admissions\"]"),
        "{stderr}"
    );
}
