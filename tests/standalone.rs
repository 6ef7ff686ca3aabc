//! Standalone clusters (coordinator + workers over loopback gRPC): the demo, Adult's
//! fidelity, the manifest contract and budget refusal.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use rhosynth_coordinator::job::JobRequest;
use rhosynth_coordinator::service::CoordinatorConfig;
use rhosynth_coordinator::standalone::Standalone;
use rhosynth_privacy::ledger::{EntryBody, Ledger};
use rhosynth_proto::JobState;
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use rhosynth_shared::data::source::Format;
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;
use rhosynth_shared::testing::shared_data;
use sha2::{Digest, Sha256};

const RUNNING: i32 = JobState::Running as i32;
const SUCCEEDED: i32 = JobState::Succeeded as i32;
const REFUSED: i32 = JobState::Refused as i32;

/// Runs a job on a fresh 2-worker standalone cluster; returns (state, message).
async fn run(spec: JobSpec, scratch: &std::path::Path) -> (i32, String) {
    run_with_floor(spec, scratch, None).await
}

/// [`run`], the job's planned charge held to `charge_floor` as a served dataset's is.
async fn run_with_floor(spec: JobSpec, scratch: &std::path::Path, charge_floor: Option<f64>) -> (i32, String) {
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = scratch.to_str().unwrap().to_string();
    let cluster = Standalone::start(config, 2).await.unwrap();
    let job_id = format!("test-{}", std::process::id());
    let request = JobRequest { charge_floor, ..JobRequest::new(job_id.clone(), spec) };
    cluster.service.start_job(request).unwrap();
    let status = loop {
        let s = cluster.service.job_status(&job_id).unwrap();
        if s.state != RUNNING {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    cluster.shutdown().await;
    (status.state, status.message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_spec_job_writes_a_verifiable_output_and_charges_once() {
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&demo_spec(dir.path(), 120), "demo").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");

    let out = dir.path().join("out");
    let manifest = manifest(&out).expect("manifest written");
    assert_eq!(manifest["format"], "rhosynth.manifest.v1");
    let names: Vec<&str> =
        manifest["columns"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    let declared: Vec<&str> = spec.schema.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, declared, "output keeps the input's column names");
    let mut rows = 0;
    for part in manifest["parts"].as_array().unwrap() {
        let bytes = std::fs::read(out.join(part["path"].as_str().unwrap())).unwrap();
        assert_eq!(format!("{:x}", Sha256::digest(&bytes)), part["sha256"].as_str().unwrap());
        rows += part["rows"].as_u64().unwrap();
    }
    assert_eq!(rows, manifest["rows"].as_u64().unwrap());
    assert!(rows > 0);

    let epsilon = manifest["privacy"]["epsilon"].as_f64().unwrap();
    assert!(epsilon <= spec.privacy.epsilon && epsilon > 0.99 * spec.privacy.epsilon);
    let (charges, spent) = ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await;
    assert_eq!(charges, 1);
    let own = ledger_total_under(&dir.path().join("ledger"), &spec.job.dataset_id, spec.privacy.accountant).await;
    assert!((own - epsilon).abs() < 1e-12 && spent <= own + 1e-12 && spent <= 10.0, "{own} {spent} {epsilon}");
    // The partitions (encoded private rows) are gone.
    let leftover = walk(&dir.path().join("scratch/partitions"));
    assert!(leftover.is_empty(), "scratch not cleaned: {leftover:?}");
}

/// A sequence job writes whole histories: one fresh id per synthetic patient, as many
/// patients as the released unit count, each within the public row cap, in time order and
/// inside the declared schema. The ledger holds the count and the run; with a private
/// selection the run's entry holds the DP-SGD rounds and the vote release exactly (σ from
/// the plan, sensitivity √k), and the job's ε stays its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_job_writes_whole_histories_under_fresh_ids() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::sequence::SequencePlan;

    let select = Some("select_epsilon = 0.5\nselect_candidates = 2.0\nselect_neighbours = 3\n");
    // (selection, max_rows, declared units): one-row histories still count units.
    for (selection, max_rows, units) in [(None, 12, None), (select, 12, None), (select, 1, Some(7))] {
        let dir = tempfile::tempdir().unwrap();
        let mut text = sequence_spec(dir.path(), 80, max_rows);
        if let Some(select) = selection {
            text = text.replace("[generator.sequence]\n", &format!("[generator.sequence]\n{select}"));
        }
        if let Some(units) = units {
            text += &format!("units = {units}\n");
        }
        let spec = JobSpec::parse(&text, "sequence").unwrap();
        let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
        assert_eq!(state, SUCCEEDED, "{message}");
        let out = dir.path().join("out");
        let manifest = manifest(&out).expect("manifest written");
        assert_eq!(manifest["generator"], "sequence");
        let released: u64 = manifest["privacy"]["public_inputs"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str()?.strip_prefix("privacy units: "))
            .map(|s| s.split(' ').next().unwrap().parse().unwrap())
            .next()
            .expect("the released unit count is a public input");

        let histories = whole_histories(&spec, &out, &manifest, max_rows).await;
        assert_eq!(histories.len() as u64, units.unwrap_or(released));
        assert!(max_rows == 1 || histories.iter().any(|t| t.len() > 1), "histories, not rows");

        let charged = charged_mechanisms(dir.path(), &spec.job.dataset_id).await;
        assert_eq!(charged.len(), 2, "the unit count, then the run");
        let plan = SequencePlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
        assert!(matches!(charged[1][0], Mechanism::SubsampledGaussian { .. }));
        assert_eq!(&charged[1][1..], plan.run.after_training.as_slice());
        // The run's charge holds the length histogram's release after the selection's.
        let lengths = plan.lengths.map(rhosynth_shared::generators::sequence::plan::length_mechanism);
        assert_eq!(charged[1].last(), lengths.as_ref());
        let inputs = manifest["privacy"]["public_inputs"].to_string();
        assert!(inputs.contains("history lengths: a Gaussian histogram of the units' lengths"), "{inputs}");
        match selection {
            None => assert_eq!(charged[1].len(), 2),
            Some(_) => assert!(matches!(
                charged[1][1],
                Mechanism::Gaussian { l2_sensitivity, releases: 1, .. } if l2_sensitivity == 3f64.sqrt()
            )),
        }
        let epsilon = manifest["privacy"]["epsilon"].as_f64().unwrap();
        assert!(epsilon <= spec.privacy.epsilon * (1.0 + 1e-9) && epsilon > 0.99 * spec.privacy.epsilon);
    }
}

/// The synthetic histories under `out`, as their charttimes, after checking what every
/// generator of histories promises: every row fits the declared schema, a unit's rows are
/// contiguous under a fresh id never reused, at most `max_rows` of them, in time order.
async fn whole_histories(
    spec: &JobSpec,
    out: &std::path::Path,
    manifest: &serde_json::Value,
    max_rows: usize,
) -> Vec<Vec<Option<f64>>> {
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::data::input::InputReader;

    let mut read = spec.clone();
    read.input.urls = parts(out, manifest);
    read.input.format = Some(Format::Parquet);
    let domain = Domain::from_spec(&read);
    let order = domain.index_of("charttime").unwrap();
    let mut reader = InputReader::new(&read.input, &read.schema, &domain);
    let mut histories: Vec<(String, Vec<Option<f64>>)> = Vec::new();
    while let Some(batch) = reader.next_batch().await.unwrap() {
        for (r, unit) in batch.units.iter().enumerate() {
            match histories.last_mut() {
                Some((id, times)) if id == unit => times.push(batch.values[order][r]),
                _ => histories.push((unit.clone(), vec![batch.values[order][r]])),
            }
        }
    }
    assert!(reader.skipped().is_none_or(|s| s.rows == 0), "every synthetic row fits the declared schema");
    let ids: std::collections::HashSet<&str> = histories.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids.len(), histories.len());
    assert!(ids.iter().all(|id| id.starts_with("syn-")));
    for (id, times) in &histories {
        assert!((1..=max_rows).contains(&times.len()), "{id}: {} rows", times.len());
        let known: Vec<f64> = times.iter().flatten().copied().collect();
        assert!(known.windows(2).all(|w| w[1] >= w[0]), "{id}: {known:?}");
    }
    histories.into_iter().map(|(_, times)| times).collect()
}

/// Each named column's lag-1 over consecutive values of a unit, as `read` reads its
/// input (file order groups a unit's rows).
async fn lag1_of(read: &JobSpec, names: &[&str]) -> Vec<f64> {
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::eval::longitudinal::lag1;

    let domain = Domain::from_spec(read);
    let columns: Vec<usize> = names.iter().map(|name| domain.index_of(name).unwrap()).collect();
    let mut reader = rhosynth_shared::data::input::InputReader::new(&read.input, &read.schema, &domain);
    let mut units: Vec<(String, Vec<Vec<f64>>)> = Vec::new();
    while let Some(batch) = reader.next_batch().await.unwrap() {
        for (r, unit) in batch.units.iter().enumerate() {
            if units.last().is_none_or(|(id, _)| id != unit) {
                units.push((unit.clone(), vec![Vec::new(); columns.len()]));
            }
            for (v, &c) in columns.iter().enumerate() {
                units.last_mut().unwrap().1[v].extend(batch.values[c][r]);
            }
        }
    }
    let tables: Vec<Vec<Vec<f64>>> = units.into_iter().map(|(_, v)| v).collect();
    (0..columns.len()).map(|v| lag1(&tables, v).unwrap()).collect()
}

/// PATH's Direct baseline end to end: the marginals generator over each patient's first
/// L visits flattened writes whole histories (the released number of them, in time order,
/// mostly L visits long as the cohort's are), and its one charge is the plan's Gaussian
/// release of K = 1 + L·d + (L − 1)·d tables at sensitivity √K.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_history_job_writes_whole_histories_and_charges_its_tables() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::marginals::MarginalsPlan;

    const STEPS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let text = demo_spec(dir.path(), 400);
    let section = &text[text.find("[generator.marginals]").unwrap()..text.find("[output]").unwrap()];
    let text = text.replace(section, &format!("[generator.marginals]\nhistory_rows = {STEPS}\n\n"));
    let spec = JobSpec::parse(&text, "direct").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");

    let domain = Domain::from_spec(&spec);
    let options = AccountingOptions::default();
    let plan = MarginalsPlan::new(&spec, &domain, &options).unwrap();
    let d = domain.columns.len();
    let tables = 1 + STEPS * d + (STEPS - 1) * d;
    assert_eq!(plan.task.tables.len(), tables);
    let sigma = plan.calibrate(&spec, &options).unwrap();
    let charged = charged_mechanisms(dir.path(), &spec.job.dataset_id).await;
    assert_eq!(charged, vec![plan.mechanisms(sigma)]);
    assert!(matches!(charged[0][0], Mechanism::Gaussian { l2_sensitivity, .. }
        if (l2_sensitivity - (tables as f64).sqrt()).abs() < 1e-12));

    let out = dir.path().join("out");
    let manifest = manifest(&out).expect("manifest written");
    let histories = whole_histories(&spec, &out, &manifest, STEPS).await;
    // The demo's patients have at least 4 visits: nearly all are L long once cut to L.
    // The length table's noise (σ·√K ≈ 40 per cell here) against 400 units leaves L the
    // most common length by a wide margin.
    let mut lengths = [0; STEPS + 1];
    histories.iter().for_each(|h| lengths[h.len()] += 1);
    assert_eq!((1..=STEPS).max_by_key(|&l| lengths[l]), Some(STEPS), "{lengths:?}");
    // Their number is the tables' pooled noisy total: 400 within a few times σ·√K·√(cells
    // per table / K) ≈ 16.
    assert!((300..=500).contains(&histories.len()), "{} histories", histories.len());
}

/// The history copula end to end on an AR(1) cohort (the demo's schema, ρ = 0.6, 1,500
/// patients, ε = 2): two worker rounds, one charge of exactly the plan's three Gaussian
/// releases, whole histories in time order, and the vitals keep their lag-1
/// autocorrelations (≈ 0.59): a mean gap under 0.1, each under 0.3. A released lag-1's own
/// noise is about σ·clip / units ≈ 0.02 at 1,500 units, and a Gaussian copula is this
/// cohort's law; a single vital's Pearson lag-1 also moves with the released margins'
/// noise (one vital's gap reached 0.21 in one of ten runs; the mean 0.013–0.068), hence
/// the mean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_copula_job_keeps_each_histories_lag1_within_its_charge() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::history_copula::HistoryCopulaPlan;
    use rhosynth_shared::simulate::{Cohort, Dynamics, cohort_csv};

    let dir = tempfile::tempdir().unwrap();
    let text = demo_spec(dir.path(), 10).replace("epsilon = 1.0\n", "epsilon = 2.0\n");
    let cohort = Cohort { patients: 1500, dynamics: Dynamics::Ar1 { rho: 0.6 }, irregular: false };
    std::fs::write(dir.path().join("icu_vitals.csv"), cohort_csv(&cohort, 7)).unwrap();
    let text = with_generator(&text, &generator("history_copula", ""));
    let spec = JobSpec::parse(&text, "copula").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");

    let domain = Domain::from_spec(&spec);
    let plan = HistoryCopulaPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    assert_eq!(charged_mechanisms(dir.path(), &spec.job.dataset_id).await, vec![plan.mechanisms()]);
    let out = dir.path().join("out");
    let manifest = manifest(&out).expect("manifest written");
    let histories = whole_histories(&spec, &out, &manifest, plan.layout.max_rows).await;
    // The released count: the length cells' noisy sum, σ_L·√50 ≈ 90 around 1,500.
    assert!((1150..=1850).contains(&histories.len()), "{} histories", histories.len());

    const VITALS: [&str; 6] = ["heart_rate", "resp_rate", "temperature", "spo2", "sbp", "dbp"];
    let real = lag1_of(&spec, &VITALS).await;
    let mut synthetic = spec.clone();
    synthetic.input.urls = parts(&out, &manifest);
    synthetic.input.format = Some(Format::Parquet);
    let synthetic = lag1_of(&synthetic, &VITALS).await;
    let gaps: Vec<f64> = real.iter().zip(&synthetic).map(|(r, s)| (r - s).abs()).collect();
    let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    assert!(mean < 0.1, "mean lag-1 gap {mean:.3}: synthetic {synthetic:?} against {real:?}");
    assert!(gaps.iter().all(|g| *g < 0.3), "synthetic {synthetic:?} against {real:?}");
}

/// The sequence model's stage 1 on a history copula job's release of the same AR(1)
/// cohort (ρ = 0.6, 1,500 patients, ε = 1 each): the release's histories keep each
/// vital's lag-1, the model is trained on them without noise before its charged DP-SGD
/// run, and its histories keep lag-1 too, where DP-SGD from random weights learns none
/// (lag-1 0.00–0.04 at 3,000 patients, docs/generators/sequence.md): heart rate's and
/// temperature's above 0.3, halfway to the cohort's 0.59 (measured 0.57 and 0.45; a
/// Pearson lag-1 over ~10⁴ pairs has a sampling error near 0.01). The ledger holds the
/// copula's charge, then the sequence job's count and run; its manifest names the release
/// and composes both charges. (The job's own input as its reference is refused at
/// submission: `bad_generator_parameters_are_refused_at_submission`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_job_pretrains_on_a_history_copula_release() {
    use rhosynth_shared::simulate::{Cohort, Dynamics, cohort_csv};

    let dir = tempfile::tempdir().unwrap();
    let cohort = Cohort { patients: 1500, dynamics: Dynamics::Ar1 { rho: 0.6 }, irregular: false };
    let base = demo_spec(dir.path(), 10);
    std::fs::write(dir.path().join("icu_vitals.csv"), cohort_csv(&cohort, 7)).unwrap();
    let (release, released) = (dir.path().join("out"), dir.path().join("copula"));
    let copula = with_generator(&base, &generator("history_copula", ""))
        .replace(release.to_str().unwrap(), released.to_str().unwrap());
    let (state, message) = run(JobSpec::parse(&copula, "copula").unwrap(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");

    let section = |reference: &str| {
        format!(
            "[generator]\nname = \"sequence\"\n\n[generator.sequence]\nmax_rows = 12\nwidth = 16\nheads = 2\nlayers = 1\n\
             mlp = 32\nreference = \"{reference}\"\npretrain_steps = 600\n\n[generator.sequence.run]\nepochs = 1.0\n"
        )
    };
    let text = with_generator(&base, &section(released.to_str().unwrap()));
    let spec = JobSpec::parse(&text, "sequence").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let charged = charged_mechanisms(dir.path(), &spec.job.dataset_id).await;
    assert_eq!(charged.len(), 3, "the copula's release, then the sequence job's count and run");
    let manifest = manifest(&release).expect("manifest written");
    let inputs = manifest["privacy"]["public_inputs"].to_string();
    assert!(inputs.contains("reference set of stage 1"), "{inputs}");
    assert!(inputs.contains("composes this job's charges with that release's"), "{inputs}");

    let mut synthetic = spec.clone();
    synthetic.input.urls = parts(&release, &manifest);
    synthetic.input.format = Some(Format::Parquet);
    let synthetic = lag1_of(&synthetic, &["heart_rate", "temperature"]).await;
    assert!(synthetic.iter().all(|&l| l > 0.3), "lag-1 {synthetic:?} (real ≈ 0.59)");
}

/// DP-2Stage end to end on the first block of a real pretrained model (SmolLM2-135M's GGUF
/// file, which `.ci/run` fetches): stage 1 on pseudo rows, the charged DP-SGD run over the
/// patients (LoRA adapters on the wire), and rows drawn by constrained decoding. The
/// ledger holds the unit count and the run, within the job's ε.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dp2stage_job_fine_tunes_a_pretrained_model_within_its_charge() {
    let Ok(checkpoint) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: set RHOSYNTH_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (.ci/run fetches it)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let generator = format!(
        "[generator]\nname = \"dp2stage\"\n\n[generator.dp2stage]\ncheckpoint = \"{checkpoint}\"\nblocks = 1\nlora = {{}}\npseudo_rows = 64\npseudo_epochs = 1.0\n\n[generator.dp2stage.run]\nepochs = 1.0\nbatch_size = 16\nmicro_batch = 8"
    );
    let spec = JobSpec::parse(&with_generator(&demo_spec(dir.path(), 60), &generator), "dp2stage").unwrap();
    fine_tunes_within_its_charge(&spec, dir.path(), dir.path(), 0, "dp2stage").await;

    // More blocks than the checkpoint has: refused from public information, nothing charged.
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(
        &with_generator(&demo_spec(dir.path(), 60), &generator.replace("blocks = 1", "blocks = 99")),
        "dp2stage",
    )
    .unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_ne!(state, SUCCEEDED);
    assert!(message.contains("blocks = 99"), "{message}");
    assert!(charged_mechanisms(dir.path(), &spec.job.dataset_id).await.is_empty());
}

/// HARMONIC end to end: a marginals job's release of the same data is the reference set
/// its prompts are made of. The HARMONIC job is charged its own count and run in the same
/// ledger, after the release's charge, and its manifest names the release and says the
/// guarantee composes both jobs' charges. The same release with a ledger that lacks its
/// charge, or a reference set that is not there, is refused with nothing charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harmonic_job_prompts_with_a_release_within_its_charge() {
    let Ok(checkpoint) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: set RHOSYNTH_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf (.ci/run fetches it)");
        return;
    };
    let released = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&demo_spec(released.path(), 60), "marginals").unwrap();
    let (state, message) = run(spec, &released.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let reference = released.path().join("out");
    let ledger = released.path().join("ledger");

    let generator = format!(
        "[generator]\nname = \"harmonic\"\n\n[generator.harmonic]\ncheckpoint = \"{checkpoint}\"\nreference = \"{}\"\nneighbours = 1\nblocks = 1\nlora = {{}}\npseudo_rows = 32\npseudo_epochs = 1.0\n\n[generator.harmonic.run]\nepochs = 1.0\nbatch_size = 16\nmicro_batch = 8",
        reference.display()
    );
    let harmonic = |dir: &std::path::Path, generator: &str| {
        JobSpec::parse(&with_generator(&demo_spec(dir, 60), generator), "harmonic").unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let same_data = |text: String, dir: &std::path::Path| {
        text.replace(dir.join("ledger").to_str().unwrap(), ledger.to_str().unwrap()).replace(
            dir.join("icu_vitals.csv").to_str().unwrap(),
            released.path().join("icu_vitals.csv").to_str().unwrap(),
        )
    };
    let text = same_data(with_generator(&demo_spec(dir.path(), 60), &generator), dir.path());
    let spec = JobSpec::parse(&text, "harmonic").unwrap();
    let manifest = fine_tunes_within_its_charge(&spec, dir.path(), released.path(), 1, "harmonic").await;
    let inputs = manifest["privacy"]["public_inputs"].to_string();
    assert!(
        inputs.contains(&reference.display().to_string())
            && inputs.contains("composes this job's charges with that release's"),
        "{inputs}"
    );

    // The release's charge and release are not in this ledger: refused before admission.
    let dir = tempfile::tempdir().unwrap();
    let spec = harmonic(dir.path(), &generator);
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_ne!(state, SUCCEEDED);
    assert!(message.contains("this ledger did not charge and release"), "{message}");
    assert!(charged_mechanisms(dir.path(), &spec.job.dataset_id).await.is_empty());

    // A copy of the release elsewhere: not where this ledger says it was released (its
    // manifest could claim any charge), refused before admission.
    let copy = released.path().join("copy");
    std::fs::create_dir_all(&copy).unwrap();
    for file in std::fs::read_dir(&reference).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, copy.join(file.file_name().unwrap())).unwrap();
    }
    let before = charged_mechanisms(released.path(), &spec.job.dataset_id).await.len();
    let dir = tempfile::tempdir().unwrap();
    let text = same_data(
        with_generator(
            &demo_spec(dir.path(), 60),
            &generator.replace(&reference.display().to_string(), copy.to_str().unwrap()),
        ),
        dir.path(),
    );
    let (state, message) = run(JobSpec::parse(&text, "harmonic").unwrap(), &dir.path().join("scratch")).await;
    assert_ne!(state, SUCCEEDED);
    assert!(message.contains("this ledger did not charge and release"), "{message}");
    assert_eq!(charged_mechanisms(released.path(), &spec.job.dataset_id).await.len(), before);

    // A reference set that is not there: refused before anything is charged.
    let dir = tempfile::tempdir().unwrap();
    let spec = harmonic(dir.path(), &generator.replace(&reference.display().to_string(), "/nonexistent/release"));
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_ne!(state, SUCCEEDED);
    assert!(message.contains("reference"), "{message}");
    assert!(charged_mechanisms(dir.path(), &spec.job.dataset_id).await.is_empty());
}

/// Runs a language-model job in `dir` and checks it: it succeeds, the ledger under
/// `ledger_dir` holds its unit count and then its run after `prior` charges, its ε is the
/// job's, every written value lies in the declared domain. Returns its manifest.
async fn fine_tunes_within_its_charge(
    spec: &JobSpec,
    dir: &std::path::Path,
    ledger_dir: &std::path::Path,
    prior: usize,
    generator: &str,
) -> serde_json::Value {
    let (state, message) = run(spec.clone(), &dir.join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let out = dir.join("out");
    let manifest = manifest(&out).expect("manifest written");
    assert_eq!(manifest["generator"], generator);
    assert!(manifest["rows"].as_u64().unwrap() > 0);
    let charged = charged_mechanisms(ledger_dir, &spec.job.dataset_id).await;
    assert_eq!(charged.len(), prior + 2, "the unit count, then the run");
    assert!(matches!(charged[prior + 1][..], [Mechanism::SubsampledGaussian { .. }]));
    let epsilon = manifest["privacy"]["epsilon"].as_f64().unwrap();
    assert!(epsilon <= spec.privacy.epsilon * (1.0 + 1e-9) && epsilon > 0.99 * spec.privacy.epsilon);
    let written = histograms(spec, parts(&out, &manifest), Format::Parquet).await;
    assert!(written.iter().all(|h| (h.iter().sum::<f64>() - 1.0).abs() < 1e-9));
    manifest
}

/// AIM end to end on the demo cohort: the ledger holds exactly the run's zCDP budget,
/// which spends the job's ε under RDP and no more, and the rows come out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aim_job_charges_exactly_its_zcdp_budget() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::aim::AimPlan;

    let dir = tempfile::tempdir().unwrap();
    let section = r#"max_rows_per_unit = 4
workload = [["heart_rate", "spo2", "rhythm"], ["sbp", "dbp"]]
rounds = 18
"#;
    let spec = JobSpec::parse(&with_generator(&demo_spec(dir.path(), 120), &generator("aim", section)), "aim").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let plan = AimPlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
    assert_eq!(charged_mechanisms(dir.path(), &spec.job.dataset_id).await, vec![plan.mechanisms()]);
    let manifest = manifest(&dir.path().join("out")).expect("manifest written");
    let epsilon = manifest["privacy"]["epsilon"].as_f64().unwrap();
    assert!(epsilon <= spec.privacy.epsilon * (1.0 + 1e-9) && epsilon > 0.99 * spec.privacy.epsilon, "{epsilon}");
    assert!(manifest["rows"].as_u64().unwrap() > 0);
}

/// The mechanisms of every charge in the ledger under `dir`, in ledger order.
async fn charged_mechanisms(dir: &std::path::Path, dataset: &str) -> Vec<Vec<Mechanism>> {
    let store = storage::open(dir.join("ledger").to_str().unwrap()).unwrap();
    let ledger = Ledger::open(&store, dataset).await.unwrap();
    ledger
        .charges()
        .into_iter()
        .map(|(entry, _)| match &entry.body {
            EntryBody::Charge { request, .. } => request.mechanisms.clone(),
            other => panic!("not a charge: {other:?}"),
        })
        .collect()
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flat_map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() { walk(&p) } else { vec![p.display().to_string()] }
        })
        .collect()
}

/// A submitter reads everything under the output prefix it names, so that prefix may
/// not hold (or sit inside) the ledger or the scratch store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_inside_the_ledger_or_scratch_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for (inside, store) in [(dir.path().join("ledger/out"), "ledger"), (dir.path().join("scratch"), "scratch")] {
        let text = demo_spec(dir.path(), 30).replace(out.to_str().unwrap(), inside.to_str().unwrap());
        let spec = JobSpec::parse(&text, "overlap").unwrap();
        let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
        assert_eq!(state, JobState::Failed as i32, "{message}");
        assert!(message.contains(&format!("overlaps the coordinator's {store} store")), "{message}");
        assert!(manifest(&inside).is_none());
        assert_eq!(ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await.0, 0, "nothing charged");
        assert!(walk(&dir.path().join("scratch/partitions")).is_empty(), "nothing read");
    }
    // A language model's reference set is read as public: never from the scratch store
    // (partitions of private rows); and no output over its checkpoint.
    let lm = |extra: &str| {
        JobSpec::parse(&with_generator(&demo_spec(dir.path(), 30), &lm_generator(dir.path(), extra)), "lm").unwrap()
    };
    let scratch = dir.path().join("scratch");
    // (The ledger is refused when the spec is checked, before the job starts.)
    let extra = format!("reference = \"{}\"", scratch.join("partitions").display());
    let (state, message) = run(lm(&extra), &scratch).await;
    assert_eq!(state, JobState::Failed as i32, "{message}");
    assert!(
        message.contains("reference set") && message.contains("overlaps the coordinator's scratch store"),
        "{message}"
    );
    assert_eq!(ledger_state(&dir.path().join("ledger"), "demo-icu-vitals").await.0, 0, "nothing charged");
    let over_model =
        demo_spec(dir.path(), 30).replace(out.to_str().unwrap(), dir.path().join("models").to_str().unwrap());
    let reference = format!("reference = \"{}\"", dir.path().join("public").display());
    let spec = JobSpec::parse(&with_generator(&over_model, &lm_generator(dir.path(), &reference)), "lm").unwrap();
    let (state, message) = run(spec, &scratch).await;
    assert!(
        state == JobState::Failed as i32 && message.contains("overlaps the coordinator's model store"),
        "{message}"
    );
}

fn lm_generator(dir: &std::path::Path, extra: &str) -> String {
    format!(
        "[generator]\nname = \"harmonic\"\n\n[generator.harmonic]\ncheckpoint = \"{}\"\n{extra}",
        dir.join("models/smol.gguf").display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_over_budget_is_refused_before_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let text = demo_spec(dir.path(), 30).replace("epsilon = 1.0\n", "epsilon = 11.0\n");
    let spec = JobSpec::parse(&text, "over-budget").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, REFUSED, "{message}");
    assert!(message.contains("privacy budget exceeded") && message.contains("demo-icu-vitals"), "{message}");
    assert!(manifest(&dir.path().join("out")).is_none());
    assert_eq!(ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await.0, 0);
    // Refused at planning: nothing was partitioned.
    assert!(walk(&dir.path().join("scratch/partitions")).is_empty());
    // Its claim on the output prefix went with it.
    assert!(walk(&dir.path().join("out")).is_empty(), "{:?}", walk(&dir.path().join("out")));
}

/// One job writes one prefix. While a job runs it holds a claim on its output prefix; a
/// second job to that prefix is refused before the ledger changes, and told why (a public
/// cause); the first completes, its manifest replacing the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_job_to_a_claimed_prefix_is_refused_before_the_ledger_changes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&demo_spec(dir.path(), 2000), "claim").unwrap();
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = dir.path().join("scratch").to_str().unwrap().to_string();
    let cluster = Standalone::start(config, 2).await.unwrap();
    let request = |job_id: &str| JobRequest::new(job_id, spec.clone());
    let ended = async |job_id: &str| loop {
        let s = cluster.service.job_status(job_id).unwrap();
        if s.state != RUNNING {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cluster.service.start_job(request("first")).unwrap();
    let claim = dir.path().join("out/_claim.json");
    while !claim.exists() && cluster.service.job_status("first").unwrap().state == RUNNING {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(claim.exists(), "the first job holds its prefix while it runs");
    cluster.service.start_job(request("second")).unwrap();
    let second = ended("second").await;
    assert_eq!(second.state, JobState::Failed as i32, "{}", second.message);
    assert!(second.message.contains("is being written by job first"), "{}", second.message);
    let first = ended("first").await;
    cluster.shutdown().await;
    assert_eq!(first.state, SUCCEEDED, "{}", first.message);
    assert!(manifest(&dir.path().join("out")).is_some() && !claim.exists(), "the manifest replaced the claim");
    let ledger = Ledger::open(&storage::open(dir.path().join("ledger").to_str().unwrap()).unwrap(), "demo-icu-vitals")
        .await
        .unwrap();
    let jobs: Vec<&str> = ledger
        .charges()
        .iter()
        .map(|(e, _)| match &e.body {
            EntryBody::Charge { request, .. } => request.job_id.as_str(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(jobs, ["first"], "only the first job was charged");

    // A claim left by a job that is gone: refused, saying so, with nothing charged or read.
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&demo_spec(dir.path(), 30), "claimed").unwrap();
    std::fs::create_dir_all(dir.path().join("out")).unwrap();
    std::fs::write(dir.path().join("out/_claim.json"), r#"{"job_id":"gone","claimed_at":"2026-11-26T00:00:00Z"}"#)
        .unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, JobState::Failed as i32, "{message}");
    assert!(message.contains("is being written by job gone") && message.contains("_claim.json"), "{message}");
    assert_eq!(ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await.0, 0, "nothing charged");
    assert!(walk(&dir.path().join("scratch/partitions")).is_empty(), "nothing read");
    assert!(dir.path().join("out/_claim.json").exists(), "another job's claim is left alone");
}

/// A generator's parameters are checked when the job is submitted: a bad one is refused
/// as an invalid argument, and no job starts (nothing is opened, read or charged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_generator_parameters_are_refused_at_submission() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = dir.path().join("scratch").to_str().unwrap().to_string();
    let cluster = Standalone::start(config, 0).await.unwrap();
    let cases = [
        (pate_spec(dir.path(), 20, 1), "PATE needs at least 2 teachers"),
        (findiff_spec(dir.path(), 20, 1.0).replace("batch_size = 32", "batch_size = 32\nclip = -1.0"), "clip"),
        // Stage 1 reads its reference as public: never the job's own input.
        (
            sequence_spec(dir.path(), 20, 12).replace(
                "[generator.sequence]\n",
                &format!("[generator.sequence]\nreference = \"{}\"\n", dir.path().join("icu_vitals.csv").display()),
            ),
            "reference overlaps the job's private data",
        ),
    ];
    for (i, (text, expected)) in cases.into_iter().enumerate() {
        let spec = JobSpec::parse(&text, "bad").unwrap();
        let job_id = format!("bad-{i}");
        let request = JobRequest::new(job_id.clone(), spec);
        let status = cluster.service.start_job(request).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(expected), "{status:?}");
        assert!(cluster.service.job_status(&job_id).is_none(), "no job was started");
    }
    cluster.shutdown().await;
    assert!(!dir.path().join("ledger").exists() && !dir.path().join("scratch").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_sgd_budgets_are_enforced_before_training() {
    let dir = tempfile::tempdir().unwrap();
    // Over the dataset's budget: refused before a row is read, as every generator.
    let text = findiff_spec(dir.path(), 30, 1.0).replace("epsilon = 1.0\n", "epsilon = 11.0\n");
    let spec = JobSpec::parse(&text, "findiff-over-budget").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, REFUSED, "{message}");
    assert!(message.contains("exceeds what remains of the dataset's budget"), "{message}");
    assert!(walk(&dir.path().join("scratch/partitions")).is_empty(), "refused at planning: nothing was partitioned");
    assert_eq!(ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await.0, 0, "nothing charged");

    // A fixed σ that would cost more than the job's ε = 1. Whether it does depends on q,
    // i.e. on the unit count: the refusal (and the ε it states) is decided on the noisy
    // count, which is therefore charged as its own entry first — repeating the job cannot
    // average uncharged counts. Nothing else is charged and nothing is released.
    let text = findiff_spec(dir.path(), 30, 1.0).replace("batch_size = 32", "batch_size = 32\nnoise_multiplier = 0.3");
    let spec = JobSpec::parse(&text, "findiff-sigma").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, REFUSED, "{message}");
    assert!(message.contains("above the job's ε = 1"), "{message}");
    assert!(message.contains("only the unit count release (ledger entry "), "{message}");
    assert!(manifest(&dir.path().join("out")).is_none());
    let charged = charged_mechanisms(dir.path(), &spec.job.dataset_id).await;
    let count = Mechanism::Gaussian {
        l2_sensitivity: 1.0,
        noise_multiplier: match &spec.generator {
            rhosynth_shared::generators::GeneratorSpec::Findiff(p) => p.run.count_noise_multiplier,
            other => panic!("a DP-FinDiff job, not {other:?}"),
        },
        releases: 1,
        adjacency: Adjacency::AddRemove,
    };
    assert_eq!(charged, vec![vec![count]], "exactly the unit count release was charged");
}

/// A dataset's ledger charges one input: a job that reads another file is refused before
/// a row is read, with nothing charged. A job's planned charge must reach its dataset's
/// floor: one planned at exactly the floor runs, one below it is refused from its plan
/// alone, before anything is read or charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_reads_its_ledgers_input_and_pays_at_least_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&demo_spec(dir.path(), 30), "first").unwrap();
    let epsilon = spec.privacy.epsilon;
    let (state, message) = run_with_floor(spec.clone(), &dir.path().join("scratch"), Some(epsilon)).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let ledger = dir.path().join("ledger");
    let charges = || charged_mechanisms(dir.path(), &spec.job.dataset_id);
    assert_eq!(charges().await.len(), 1);

    let other = tempfile::tempdir().unwrap();
    let text =
        demo_spec(other.path(), 30).replace(other.path().join("ledger").to_str().unwrap(), ledger.to_str().unwrap());
    let (state, message) = run(JobSpec::parse(&text, "copy").unwrap(), &other.path().join("scratch")).await;
    assert_ne!(state, SUCCEEDED);
    assert!(message.contains("not bound to the input this job reads"), "{message}");
    assert!(!message.contains("icu_vitals.csv"), "the operator's file names stay in its log: {message}");
    assert!(walk(&other.path().join("scratch/partitions")).is_empty(), "nothing was read");
    assert_eq!(charges().await.len(), 1, "nothing was charged");

    let text = demo_spec(dir.path(), 30)
        .replace(dir.path().join("out").to_str().unwrap(), dir.path().join("out-2").to_str().unwrap());
    let spec = JobSpec::parse(&text, "below-floor").unwrap();
    let (state, message) = run_with_floor(spec, &dir.path().join("scratch"), Some(2.0 * epsilon)).await;
    assert_eq!(state, REFUSED, "{message}");
    assert!(message.contains(&format!("below this dataset's floor of ε = {}", 2.0 * epsilon)), "{message}");
    assert!(walk(&dir.path().join("scratch/partitions")).is_empty(), "refused at planning: nothing was partitioned");
    assert_eq!(charges().await.len(), 1, "nothing was charged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adult_marginals_one_way_tv_is_small() {
    let Some(adult) = shared_data("adult/adult.data") else { return };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("examples/adult-marginals.toml")).unwrap();
    // Fidelity only here; the evaluation section (TSTR) is exercised in tests/eval.rs.
    let text = text.split("[evaluation]").next().unwrap().to_string();
    let text = text
        .replace("../shared/data/adult/adult.data", adult.to_str().unwrap())
        .replace("./rhosynth-out/ledger", dir.path().join("ledger").to_str().unwrap())
        .replace("./rhosynth-out/adult-marginals", dir.path().join("out").to_str().unwrap());
    let spec = JobSpec::parse(&text, "adult").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let out = dir.path().join("out");
    let m = manifest(&out).unwrap();
    let real = histograms(&spec, spec.input.urls.clone(), Format::Csv).await;
    let synthetic = histograms(&spec, parts(&out, &m), Format::Parquet).await;
    let tvs: Vec<f64> = real.iter().zip(&synthetic).map(|(a, b)| tv(a, b)).collect();
    let mean = tvs.iter().sum::<f64>() / tvs.len() as f64;
    eprintln!("1-way TV per column: {tvs:.4?}; mean {mean:.4}");
    assert!(mean < 0.05, "mean 1-way TV {mean}");
    // The noisy size estimate is close to the real 32,561 rows (noise std ≈ σ·√K·√bins).
    let rows = m["rows"].as_f64().unwrap();
    assert!((rows - 32_561.0).abs() < 500.0, "{rows}");
}

#[test]
fn the_demo_command_works_on_a_fresh_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin("rhosynth")).arg("demo").current_dir(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let manifest_json = last_json(&out.stdout);
    let job = manifest_json["job_id"].as_str().unwrap();
    let written = manifest(&dir.path().join("rhosynth-out/demo/synthetic").join(job)).expect("manifest on disk");
    assert_eq!(written, manifest_json);
    assert!(String::from_utf8_lossy(&out.stderr).contains("privacy ledger of 'demo-icu-vitals'"));
}

/// One round of tasks (one per partition group, all doing `work`) on a fresh cluster of
/// `workers`, through the coordinator's gather: the sum of every task's `tensor` (`len`
/// values), in task order. Every worker must take part.
async fn one_round(
    workers: usize,
    work: rhosynth_proto::task::Work,
    groups: &[Vec<String>],
    tensor: &'static str,
    len: usize,
) -> Vec<f64> {
    use rhosynth_coordinator::gather::{Answer, Gather, Round};

    let cluster = Standalone::start(CoordinatorConfig::default(), workers).await.unwrap();
    while cluster.service.scheduler().live_workers().len() < workers {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let telemetry = rhosynth_coordinator::telemetry::Telemetry::default();
    let job = format!("round-{tensor}-{workers}");
    let mut gather = Gather::new(cluster.service.scheduler(), &telemetry, &job);
    let holders = std::sync::Mutex::new(std::collections::HashSet::new());
    let round = Round { work, groups, tensor, len };
    let check = |a: Answer<'_>| {
        holders.lock().unwrap().insert(a.worker.to_string());
        Ok(())
    };
    let sum = gather.round(round, check, |_, _| {}).await.unwrap();
    drop(gather);
    assert_eq!(holders.lock().unwrap().len(), workers, "every worker held some partitions");
    cluster.shutdown().await;
    // The test reads the exact sum; a job only ever releases it.
    let mut out = Vec::new();
    sum.check(|v| {
        out = v.clone();
        Ok::<(), ()>(())
    })
    .unwrap();
    out
}

/// One DP-SGD round with q = 1 (every unit sampled) on a cluster of `workers`: the sum of
/// the partitions' clipped gradient sums, before noise.
async fn one_round_sum(
    workers: usize,
    urls: &[String],
    plan: &rhosynth_shared::generators::findiff::FinDiffPlan,
    weights: &[f32],
) -> Vec<f64> {
    use rhosynth_proto::task::Work;
    use rhosynth_shared::dpsgd::RoundSettings;
    use rhosynth_shared::generators::GeneratorName;
    use rhosynth_shared::generators::findiff::FinDiffRound;

    let settings = RoundSettings::new(0, 1.0, 0.5, [9; 32], 16).unwrap();
    let model = FinDiffRound { model: plan.model.clone(), timestep_exponent: 1.0 };
    let work = Work::GradientSum(GeneratorName::Findiff.gradient_sum(
        &settings,
        rhosynth_shared::wire::to_json(&model),
        weights.to_vec(),
    ));
    let groups: Vec<Vec<String>> = urls.iter().map(|u| vec![u.clone()]).collect();
    one_round(workers, work, &groups, "gradient_sum", weights.len()).await
}

/// Partitions a spec's input into `partitions` under `dir`; returns the partition URLs.
async fn partition(spec: &JobSpec, dir: &std::path::Path, partitions: u32) -> Vec<String> {
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::data::input::InputReader;
    use rhosynth_shared::data::partition::{PartitionKey, PartitionWriter};

    let domain = Domain::from_spec(spec);
    let scratch = storage::open(dir.join("scratch").to_str().unwrap()).unwrap();
    let mut writer =
        PartitionWriter::new(&scratch, "round", &domain, partitions, PartitionKey::generate().unwrap()).unwrap();
    let mut input = InputReader::new(&spec.input, &spec.schema, &domain);
    while let Some(batch) = input.next_batch().await.unwrap() {
        writer.write(batch).await.unwrap();
    }
    writer.finish().await.unwrap().urls
}

/// A PATE job's ledger entry is exactly its answered queries, each charged at the
/// data-independent per-query cost and composed by the accountant; releasing the GNMax
/// label or the noisy vote share costs the same, and so does a target-label answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pate_job_charges_exactly_its_answered_queries() {
    use rhosynth_shared::accounting::accountant::{AccountingOptions, account};

    let mut charged = Vec::new();
    // (release, target, label queries): with the target "rhythm" (4 values and missing)
    // and label_share = 0.5, half of the answers are target labels.
    for (release, target, labels) in [("label", None, 0), ("vote_share", None, 0), ("vote_share", Some("rhythm"), 16)] {
        let dir = tempfile::tempdir().unwrap();
        let mut text = pate_spec(dir.path(), 60, 4)
            .replace("[generator.pate]\n", &format!("[generator.pate]\nrelease = \"{release}\"\n"));
        if let Some(target) = target {
            text = text.replace("[schema]\n", &format!("[schema]\ntarget = \"{target}\"\n"));
            text = text.replace("max_iterations = 2\n", "max_iterations = 1\nlabel_share = 0.5\n");
        }
        let spec = JobSpec::parse(&text, "pate").unwrap();
        let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
        assert_eq!(state, SUCCEEDED, "{message}");
        let m = manifest(&dir.path().join("out")).expect("manifest written");
        assert_eq!(m["rows"], 50);
        assert_eq!(m["generator"], "pate");
        let answered = pate_answered(&m) as usize;
        assert_eq!(answered, 2 * 16, "{release} {target:?}");
        let public = m["privacy"]["public_inputs"].to_string();
        assert!(public.contains(&format!("{labels} target labels")), "{public}");

        let (entries, total) = ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await;
        assert_eq!(entries, 1, "one charge for the whole run");
        let epsilon =
            ledger_total_under(&dir.path().join("ledger"), &spec.job.dataset_id, spec.privacy.accountant).await;
        assert!(total <= epsilon + 1e-12);
        let per_query = Mechanism::GnMax { sigma: 40.0, classes: 2, queries: 1 };
        let expected = account(
            &vec![per_query; answered],
            spec.privacy.accountant,
            spec.privacy.delta,
            &AccountingOptions::default(),
        )
        .unwrap()
        .epsilon;
        assert!((epsilon - expected).abs() <= 1e-9 * expected, "{release}: ledger ε {epsilon} vs {expected}");
        charged.push(epsilon);
    }
    assert!(
        charged.iter().all(|c| (c - charged[0]).abs() <= 1e-9 * charged[0]),
        "label, vote share and target labels cost the same: {charged:?}"
    );

    // A confidence threshold: every query is also charged its check (Gaussian on the
    // largest count, sensitivity 1, σ₁ = 30); what cleared it is reported.
    let dir = tempfile::tempdir().unwrap();
    let text = pate_spec(dir.path(), 60, 4)
        .replace("[generator.pate]\n", "[generator.pate]\nthreshold = 3.0\nthreshold_sigma = 30.0\n");
    let spec = JobSpec::parse(&text, "pate").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");
    let m = manifest(&dir.path().join("out")).expect("manifest written");
    let asked = pate_answered(&m);
    assert!(m["privacy"]["public_inputs"].to_string().contains("cleared the threshold"));
    let (entries, total) = ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await;
    assert_eq!(entries, 1);
    let epsilon = ledger_total_under(&dir.path().join("ledger"), &spec.job.dataset_id, spec.privacy.accountant).await;
    assert!(total <= epsilon + 1e-12);
    let mechanisms = [
        Mechanism::Gaussian {
            l2_sensitivity: 1.0,
            noise_multiplier: 30.0,
            releases: asked,
            adjacency: Adjacency::AddRemove,
        },
        Mechanism::GnMax { sigma: 40.0, classes: 2, queries: asked },
    ];
    let expected = account(&mechanisms, spec.privacy.accountant, spec.privacy.delta, &AccountingOptions::default())
        .unwrap()
        .epsilon;
    assert!((epsilon - expected).abs() <= 1e-9 * expected, "ledger ε {epsilon} vs {expected}");
}

/// PATE teachers are the partitions: every unit is in exactly one teacher's rows, and a
/// vote round — real-or-generated or target labels — gives the same counts on 1, 2 or 4
/// workers (teachers are fit deterministically wherever they run; tasks hold several
/// teachers each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_two_and_four_workers_cast_the_same_pate_votes() {
    use rhosynth_proto::task::Work;
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::generators::pate::{PatePlan, Question, VoteTask};

    let dir = tempfile::tempdir().unwrap();
    let text = pate_spec(dir.path(), 120, 8).replace("[schema]\n", "[schema]\ntarget = \"rhythm\"\n");
    let spec = JobSpec::parse(&text, "votes").unwrap();
    let domain = rhosynth_shared::data::domain::Domain::from_spec(&spec);
    let plan = PatePlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    let urls = partition(&spec, dir.path(), 8).await;

    // Each patient's rows are all in one partition (teacher), and every patient is in one.
    let task = VoteTask {
        encoding: plan.encoding.clone(),
        teacher: plan.teacher_config(),
        seed: [3; 32],
        question: Question::Realness,
        fake_rows: 64,
        queries: 40,
    };
    let mut owner = std::collections::HashMap::new();
    let mut rows = 0;
    for url in &urls {
        let examples = task.load_examples(std::slice::from_ref(url)).await.unwrap();
        rows += examples.x.len() / plan.encoding.width;
        for (unit, _) in &examples.units {
            assert!(owner.insert(unit.clone(), url.clone()).is_none(), "unit {unit} is in two teachers");
        }
    }
    assert_eq!(owner.len(), 120, "every patient is in a teacher");
    let all = task.load_examples(&urls).await.unwrap();
    assert_eq!(rows, all.x.len() / plan.encoding.width, "no row lost or duplicated");

    // Generated rows from an untrained generator (any fixed rows will do).
    let mut gan = rhosynth_shared::generators::pate::gan::PateGan::new(
        plan.encoding.clone(),
        plan.params.clone(),
        rhosynth_shared::dpsgd::compute_device().autodiff(),
        [5; 32],
    );
    let mut generated = gan.sample(task.fake_rows);
    generated.extend(gan.queries(task.queries));
    let groups: Vec<Vec<String>> = urls.chunks(2).map(<[String]>::to_vec).collect();
    let mut reference = None;
    for workers in [1, 2, 4] {
        let work = Work::TeacherVotes(task.task(generated.clone()));
        let total = one_round(workers, work, &groups, "votes", task.queries).await;
        assert!(total.iter().all(|v| (0.0..=8.0).contains(v)));
        match &reference {
            None => reference = Some(total),
            Some(r) => assert_eq!(&total, r, "{workers} workers voted differently"),
        }
    }
    let total = reference.unwrap();
    assert!(total.iter().any(|&v| v > 0.0) && total.iter().any(|&v| v < 8.0), "votes are informative: {total:?}");

    // Target labels: each teacher's class probabilities over the rhythms (4 and missing),
    // summed.
    let classes = plan.encoding.target_classes().unwrap();
    assert_eq!(classes, 5);
    let labels = VoteTask { question: Question::Target, fake_rows: 0, ..task };
    let queries = &generated[64 * plan.encoding.width..];
    let mut reference = None;
    for workers in [1, 2, 4] {
        let len = labels.queries * classes;
        let work = Work::TeacherVotes(labels.task(queries.to_vec()));
        let total = one_round(workers, work, &groups, "votes", len).await;
        match &reference {
            None => reference = Some(total),
            Some(r) => assert_eq!(&total, r, "{workers} workers labelled differently"),
        }
    }
    let total = reference.unwrap();
    // Per query, the 8 teachers' probabilities sum to 8, and they do not all agree.
    assert!(total.chunks(classes).all(|q| (q.iter().sum::<f64>() - 8.0).abs() < 1e-9), "{total:?}");
    assert!(total.chunks(classes).any(|q| q.iter().all(|&v| v < 8.0 - 1e-6)), "{total:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_two_and_four_workers_return_the_same_clipped_gradient_sum() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::dpsgd::params::TrainableLayers;
    use rhosynth_shared::dpsgd::{RoundSettings, clipped_gradient_sum, compute_device};
    use rhosynth_shared::generators::findiff::{FinDiffModel, FinDiffPlan};

    let dir = tempfile::tempdir().unwrap();
    // Every row of a patient kept: no random subsampling, so all runs see the same examples.
    let text = findiff_spec(dir.path(), 60, 1.0).replace("max_rows_per_unit = 8", "max_rows_per_unit = 100000");
    let spec = JobSpec::parse(&text, "round").unwrap();
    let domain = Domain::from_spec(&spec);
    let plan = FinDiffPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
    let urls = partition(&spec, dir.path(), 6).await;
    let device = compute_device();
    let model = FinDiffModel::new(&plan.model, &device);
    let weights = model.parameters();

    // Reference: every unit in one place, one process, no gRPC.
    let mut model = model;
    model.set_timestep_exponent(1.0);
    let all = plan.model.load_examples(&urls).await.unwrap();
    let units: Vec<usize> = (0..all.units.len()).collect();
    assert_eq!(units.len(), 60);
    let settings = RoundSettings::new(0, 1.0, 0.5, [9; 32], 16).unwrap();
    let reference = clipped_gradient_sum(&model, &all, &units, &settings, &device).unwrap().sum;
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!(norm(&reference) > 0.0 && norm(&reference) <= 60.0 * 0.5 * (1.0 + 1e-5));

    // Gathered in task order: bit-identical on any cluster, and within f32 rounding of
    // the single-process sum (per-partition sums are added in another order there).
    let mut gathered: Option<Vec<f64>> = None;
    for workers in [1, 2, 4] {
        let sum = one_round_sum(workers, &urls, &plan, &weights).await;
        let diff: Vec<f64> = sum.iter().zip(&reference).map(|(a, b)| a - b).collect();
        let err = norm(&diff) / norm(&reference);
        assert!(err < 1e-5, "{workers} workers: relative error {err:e} against the single-process sum");
        match &gathered {
            None => gathered = Some(sum),
            Some(first) => {
                assert!(first.iter().zip(&sum).all(|(a, b)| a.to_bits() == b.to_bits()), "{workers} workers")
            }
        }
    }
}

/// A sequence job's selection votes gathered from 1, 2 and 4 workers: the same counts,
/// bit for bit, k from every unit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_two_and_four_workers_cast_the_same_selection_votes() {
    use rhosynth_proto::task::Work;
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::dpsgd::compute_device;
    use rhosynth_shared::generators::sequence::selection::{SelectionTask, features};
    use rhosynth_shared::generators::sequence::{SequenceModel, SequencePlan, SequenceSampler};

    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::parse(&sequence_spec(dir.path(), 60, 12), "selection").unwrap();
    let plan = SequencePlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
    let urls = partition(&spec, dir.path(), 6).await;
    let groups: Vec<Vec<String>> = urls.iter().map(|u| vec![u.clone()]).collect();
    // Candidates from an untrained model (any histories will do).
    let model = SequenceModel::new(&plan.model, &compute_device());
    let sampler =
        SequenceSampler { transformer: model.transformer, spec: plan.model.clone(), temperature: 1.0, lengths: None };
    let candidates = sampler.histories(40, &mut rhosynth_shared::entropy::os_rng().unwrap());
    let features = candidates.iter().flat_map(|h| features(&plan.model, h)).collect();
    let task = SelectionTask { model: plan.model.clone(), candidates: features, neighbours: 3 };
    let mut reference: Option<Vec<f64>> = None;
    for workers in [1, 2, 4] {
        let votes = one_round(workers, Work::SelectionVotes((&task).into()), &groups, "votes", 40).await;
        assert_eq!(votes.iter().sum::<f64>(), 3.0 * 60.0);
        match &reference {
            None => reference = Some(votes),
            Some(r) => assert!(r.iter().zip(&votes).all(|(a, b)| a.to_bits() == b.to_bits()), "{workers} workers"),
        }
    }
    // Every unit in one place gives the same votes.
    let all = plan.model.load_histories(&urls).await.unwrap();
    assert_eq!(task.votes(&all).0, reference.unwrap());
}

/// Contingency tables gathered from 1, 2 and 4 workers, for the marginals generator's
/// star of pairs, AIM's candidates (every column, pair and triple) and flattened
/// histories (12 steps, a static column, pairs at every step): the same counts, bit for bit, and
/// every row (every patient) counted once in every table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_two_and_four_workers_count_the_same_marginals() {
    use rhosynth_proto::task::Work;
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::aim::AimPlan;
    use rhosynth_shared::generators::marginals::MarginalsPlan;

    let dir = tempfile::tempdir().unwrap();
    // Every row of a patient kept: no random subsampling, so all runs count the same rows.
    let text = demo_spec(dir.path(), 50).replace("max_rows_per_unit = 8", "max_rows_per_unit = 100000");
    let spec = JobSpec::parse(&text, "marginals").unwrap();
    let domain = Domain::from_spec(&spec);
    let aim = JobSpec::parse(&with_generator(&text, &generator("aim", "max_rows_per_unit = 100000")), "aim").unwrap();
    let pairs = &text[text.find("pairs = ").unwrap()..];
    let pairs = &pairs[..pairs.find('\n').unwrap()];
    let direct = text
        .replace("max_rows_per_unit = 100000", "history_rows = 12\nstatic_columns = [\"rhythm\"]")
        .replace(pairs, r#"pairs = [["sbp", "dbp"], ["rhythm", "pain"]]"#);
    let direct = JobSpec::parse(&direct, "direct").unwrap();
    let tasks = [
        MarginalsPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap().task,
        AimPlan::new(&aim, &domain, &AccountingOptions::default()).unwrap().task,
        MarginalsPlan::new(&direct, &domain, &AccountingOptions::default()).unwrap().task,
    ];
    let d = domain.columns.len();
    assert_eq!(tasks[1].tables.len(), d + d * (d - 1) / 2 + d * (d - 1) * (d - 2) / 6);
    let input = std::fs::read_to_string(dir.path().join("icu_vitals.csv")).unwrap();
    let rows = input.lines().count() - 1;
    let patients =
        input.lines().skip(1).map(|l| l.split(',').next().unwrap()).collect::<std::collections::HashSet<_>>();
    let urls = partition(&spec, dir.path(), 4).await;
    let groups: Vec<Vec<String>> = urls.iter().map(|u| vec![u.clone()]).collect();
    for task in &tasks {
        // A flattened history counts each patient once.
        let counted = if task.history.is_some() { patients.len() } else { rows };
        let mut reference: Option<Vec<f64>> = None;
        for workers in [1, 2, 4] {
            let counts = one_round(workers, Work::CountTables(task.into()), &groups, "counts", task.cells()).await;
            let mut offset = 0;
            for size in task.table_sizes() {
                assert_eq!(counts[offset..offset + size].iter().sum::<f64>(), counted as f64);
                offset += size;
            }
            match &reference {
                None => reference = Some(counts),
                Some(r) => {
                    assert!(r.iter().zip(&counts).all(|(a, b)| a.to_bits() == b.to_bits()), "{workers} workers")
                }
            }
        }
    }
}

/// A hostile worker answering DP-SGD rounds with a gradient sum beyond units × C (claiming
/// more units than its partition holds): the coordinator rejects it and the job fails without releasing anything (its run was
/// charged before the first round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_gradient_sum_fails_the_job_and_releases_nothing() {
    use rhosynth_proto::coordinator_client::CoordinatorClient;
    use rhosynth_proto::result_chunk::Part;
    use rhosynth_proto::{
        Dtype, PROTOCOL_VERSION, PollTaskRequest, RegisterWorkerRequest, ResultChunk, ResultHeader, TensorChunk,
        TensorMeta,
    };

    let dir = tempfile::tempdir().unwrap();
    let mut spec = JobSpec::parse(&findiff_spec(dir.path(), 40, 1.0), "hostile").unwrap();
    // Partitioned by the coordinator: the hostile worker's first task is a round.
    spec.job.partition_by = rhosynth_shared::spec::PartitionBy::Coordinator;
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = dir.path().join("scratch").to_str().unwrap().to_string();
    let cluster = Standalone::start(config, 0).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(cluster.url.clone()).unwrap().connect().await.unwrap();
    let mut client = CoordinatorClient::new(channel).max_decoding_message_size(rhosynth_proto::MAX_MESSAGE_BYTES);
    let worker_id = client
        .register_worker(RegisterWorkerRequest {
            protocol_version: PROTOCOL_VERSION,
            worker_name: "hostile".into(),
            capabilities: None,
            rhosynth_version: "test".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .worker_id;
    cluster.service.start_job(JobRequest::new("hostile", spec.clone())).unwrap();

    let task = loop {
        let polled = client.poll_task(PollTaskRequest { worker_id: worker_id.clone(), wait_ms: 500 }).await.unwrap();
        if let Some(task) = polled.into_inner().task {
            break task;
        }
    };
    let Some(rhosynth_proto::task::Work::GradientSum(round)) = &task.work else { panic!("a DP-SGD round") };
    let weights = &round.weights;
    // A declared shape whose product overflows u64 (it once panicked the handler): refused
    // as an invalid argument, and the task stays the worker's to answer.
    let overflowing = ResultHeader {
        worker_id: worker_id.clone(),
        job_id: task.job_id.clone(),
        task_id: task.task_id,
        attempt: task.attempt,
        units: 1,
        tensors: vec![TensorMeta {
            name: "gradient_sum".into(),
            shape: vec![1 << 32, 1 << 32, 2],
            dtype: rhosynth_proto::Dtype::F64 as i32,
        }],
    };
    let refused = client
        .submit_result(tokio_stream::iter(vec![ResultChunk { part: Some(Part::Header(overflowing)) }]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    // C = 1 and a sum of norm 1000, with a claim of 2⁶⁴ − 1 sampled units: the partition
    // holds at most 40, and its own count, not the worker's claim, bounds the sum.
    let mut sum = vec![0f64; weights.len()];
    sum[0] = 1000.0;
    let header = ResultHeader {
        worker_id: worker_id.clone(),
        job_id: task.job_id.clone(),
        task_id: task.task_id,
        attempt: task.attempt,
        units: u64::MAX,
        tensors: vec![TensorMeta {
            name: "gradient_sum".into(),
            shape: vec![sum.len() as u64],
            dtype: Dtype::F64 as i32,
        }],
    };
    let bytes: Vec<u8> = sum.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut chunks = vec![ResultChunk { part: Some(Part::Header(header)) }];
    for piece in bytes.chunks(rhosynth_proto::CHUNK_BYTES) {
        chunks.push(ResultChunk { part: Some(Part::Data(TensorChunk { tensor_index: 0, data: piece.to_vec() })) });
    }
    client.submit_result(tokio_stream::iter(chunks)).await.unwrap();

    let status = loop {
        let s = cluster.service.job_status("hostile").unwrap();
        if s.state != RUNNING {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    cluster.shutdown().await;
    assert_eq!(status.state, JobState::Failed as i32, "{}", status.message);
    // The reason (with the oversized norm) is for the operator's log, not the submitter.
    assert!(status.message.contains("operator log") && !status.message.contains("units × C"), "{}", status.message);
    assert!(manifest(&dir.path().join("out")).is_none(), "nothing released");
    let charges = ledger_state(&dir.path().join("ledger"), &spec.job.dataset_id).await.0;
    assert_eq!(charges, 2, "the unit count and the run, charged before round 1");
    assert!(!dir.path().join("scratch/checkpoints/hostile").exists(), "a failed run is not resumable");
}

/// Calibration: a barely trained DP-FinDiff job misses the 1-way marginals; with
/// `[calibration]` its output is raked to noisy 1-way tables counted on the workers,
/// released with the calibration's share of ρ and charged in the run's own entry, and the
/// job still costs no more than its ε. Raking matches the last table it fits exactly on the
/// pool where the pool reaches every cell (`pain`: the generator draws all its values), so
/// that column's shares are off only by the targets' noise (σΔ per cell over N rows) and the
/// resampling (binomial over the n rows written): within five of each per cell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calibrated_job_matches_the_one_way_marginals_within_its_charge() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::findiff::FinDiffPlan;

    let dir = tempfile::tempdir().unwrap();
    let mut mean_tv = Vec::new();
    for (name, calibration) in [("plain", ""), ("calibrated", "\n[calibration]\nepsilon_share = 0.3\n")] {
        let sub = dir.path().join(name);
        std::fs::create_dir_all(&sub).unwrap();
        // Rows as units (the calibration counts one row each: Δ = √d).
        let text = findiff_spec(&sub, 200, 1.0).replace("unit_column = \"patient_id\"\n", "") + calibration;
        let spec = JobSpec::parse(&text, name).unwrap();
        let (state, message) = run(spec.clone(), &sub.join("scratch")).await;
        assert_eq!(state, SUCCEEDED, "{message}");
        let out = sub.join("out");
        let m = manifest(&out).unwrap();
        let epsilon = m["privacy"]["epsilon"].as_f64().unwrap();
        assert!(epsilon <= spec.privacy.epsilon * (1.0 + 1e-9), "{epsilon}");
        let real = histograms(&spec, spec.input.urls.clone(), Format::Csv).await;
        let synthetic = histograms(&spec, parts(&out, &m), Format::Parquet).await;
        let tvs: Vec<f64> = real.iter().zip(&synthetic).map(|(a, b)| tv(a, b)).collect();
        eprintln!("{name}: 1-way TV per column {tvs:.4?}");
        mean_tv.push(tvs.iter().sum::<f64>() / tvs.len() as f64);

        let charged = charged_mechanisms(&sub, &spec.job.dataset_id).await;
        let domain = Domain::from_spec(&spec);
        let plan = FinDiffPlan::new(&spec, &domain, &AccountingOptions::default()).unwrap();
        let Some(calibration) = plan.run.calibration else {
            assert_eq!(charged[1].len(), 1, "{:?}", charged[1]);
            continue;
        };
        assert_eq!(calibration.task.sensitivity(), (domain.columns.len() as f64).sqrt());
        assert_eq!(charged.len(), 2, "the unit count, then the run");
        assert_eq!(charged[1].len(), 2, "{:?}", charged[1]);
        assert_eq!(charged[1][1], calibration.mechanism(), "the calibration in the run's own entry");
        let last = domain.columns.len() - 1;
        assert_eq!(domain.columns[last].name, "pain");
        let written = m["rows"].as_f64().unwrap();
        let input_rows = std::fs::read_to_string(&spec.input.urls[0]).unwrap().lines().count() as f64 - 1.0;
        let noise = calibration.noise_multiplier * calibration.task.sensitivity() / input_rows;
        let bound: f64 = real[last].iter().map(|p| 5.0 * ((p * (1.0 - p) / written).sqrt() + noise)).sum::<f64>() / 2.0;
        assert!(tvs[last] <= bound, "pain: TV {} above {bound}", tvs[last]);
    }
    eprintln!("mean 1-way TV: plain {:.4}, calibrated {:.4}", mean_tv[0], mean_tv[1]);
    assert!(mean_tv[1] < mean_tv[0], "{mean_tv:?}");
}

/// A calibrated PATE job: its vote tasks group several teachers' partitions, which rounds
/// of one partition a task (the calibration's count, or any other) may have placed on
/// different workers; the job still finishes (it once hung: no worker held a whole group).
/// The calibration is charged in the run's one entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calibrated_pate_job_runs_its_votes_and_charges_the_calibration() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::generators::pate::PatePlan;

    let dir = tempfile::tempdir().unwrap();
    let text = pate_spec(dir.path(), 60, 4).replace("[generator.pate]\n", "[generator.pate]\nteachers_per_task = 2\n")
        + "\n[calibration]\nepsilon_share = 0.2\n";
    let spec = JobSpec::parse(&text, "pate-calibrated").unwrap();
    let scratch = dir.path().join("scratch");
    let finished = tokio::time::timeout(Duration::from_secs(120), run(spec.clone(), &scratch));
    let (state, message) = finished.await.expect("the job finishes");
    assert_eq!(state, SUCCEEDED, "{message}");
    assert_eq!(manifest(&dir.path().join("out")).expect("manifest written")["rows"], 50);
    let plan = PatePlan::new(&spec, &Domain::from_spec(&spec), &AccountingOptions::default()).unwrap();
    let calibration = plan.calibration.as_ref().expect("planned").mechanism();
    let charged = charged_mechanisms(dir.path(), &spec.job.dataset_id).await;
    assert_eq!(charged, vec![plan.mechanisms()]);
    assert_eq!(charged[0].last(), Some(&calibration));
}

/// Counts of a database view on a cluster: each worker reads one partition of every table
/// and counts the view's rows (real gRPC). The counts match the simulated CSV text, and
/// one more patient with admissions and charts far beyond the caps (and admission keys
/// other patients hold) moves each table by exactly their capped rows: at most the view's
/// bound per table, and the concatenated tables by at most the declared L2 sensitivity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_view_is_counted_per_patient_within_its_bound() {
    use rhosynth_proto::task::Work;
    use rhosynth_shared::data::database::{Database, DatabaseView, Layout, View, partition_database};
    use rhosynth_shared::data::partition::PartitionKey;
    use rhosynth_shared::generators::marginals::MarginalsTask;
    use rhosynth_shared::simulate::database::database_csv;
    use rhosynth_shared::testing::database_spec;
    use std::collections::HashMap;

    const CAPS: (u32, u32) = (2, 6);
    let db = database_csv(200, 17);
    let mut extra = (String::new(), String::new());
    for (i, hadm) in db.admissions.lines().skip(1).take(6).map(|l| l.split(',').next().unwrap()).enumerate() {
        extra.0.push_str(&format!("{hadm},SX,2026-0{}-01 00:00:00,2026-0{}-03 00:00:00,urgent,home\n", i + 1, i + 1));
        for hour in 0..40 {
            extra.1.push_str(&format!("SX,{hadm},2026-0{}-01 {:02}:30:00,130,30,88\n", i + 1, hour % 24));
        }
    }
    // Admissions by (comorbidity, their charts); charts by (admission type, SpO₂ bin).
    let mut counted = Vec::new();
    for with_sx in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut files = db.clone();
        if with_sx {
            files.patients.push_str("SX,90,M,severe\n");
            files.admissions.push_str(&extra.0);
            files.vitals.push_str(&extra.1);
        }
        rhosynth_shared::testing::write_database(dir.path(), &files);
        let spec = database_spec(dir.path(), CAPS, "order_by = \"charttime\"");
        let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
        let database = Database::of_spec(&spec);
        let tables = partition_database(&database, &scratch, "db", 3, PartitionKey::generate().unwrap()).await.unwrap();
        let layout = Layout::of(&database);
        let groups: Vec<Vec<String>> =
            (0..3).map(|k| tables.iter().map(|t| t.partitions.urls[k].clone()).collect()).collect();
        let mut views = Vec::new();
        for (table, pairs) in
            [(1, [["patients.comorbidity", "__n.vitals"]]), (2, [["admissions.admission_type", "spo2"]])]
        {
            let view = DatabaseView { layout: layout.clone(), view: View { table } };
            let domain = view.view.domain(&layout);
            let index = |name: &str| domain.index_of(name).unwrap();
            let columns: Vec<Vec<usize>> = pairs.iter().map(|p| p.iter().map(|c| index(c)).collect()).collect();
            let task = MarginalsTask::over_view(view, [columns, vec![vec![0]]].concat());
            let counts = one_round(2, Work::CountTables((&task).into()), &groups, "counts", task.cells()).await;
            views.push((task, counts));
        }
        counted.push(views);
    }
    // Without SX: the admissions view's first table from the CSV text.
    let comorbidity: HashMap<String, usize> = db
        .patients
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), ["none", "mild", "severe"].iter().position(|c| *c == f[3]).unwrap())
        })
        .collect();
    let mut charts: HashMap<&str, usize> = HashMap::new();
    db.vitals.lines().skip(1).for_each(|l| *charts.entry(l.split(',').nth(1).unwrap()).or_default() += 1);
    let mut stays: HashMap<&str, Vec<(String, &str)>> = HashMap::new();
    for line in db.admissions.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        stays.entry(f[1]).or_default().push((f[2].to_string(), f[0]));
    }
    let (task, counts) = &counted[0][0];
    let n_bins = task.sizes()[task.tables[0][1]];
    let mut wanted = vec![0.0; task.table_sizes()[0]];
    for (subject, mut list) in stays {
        list.sort();
        for (_, hadm) in list.into_iter().take(CAPS.0 as usize) {
            let n = charts.get(hadm).copied().unwrap_or(0).min(CAPS.1 as usize);
            wanted[comorbidity[subject] * n_bins + n] += 1.0;
        }
    }
    assert_eq!(counts[..wanted.len()], wanted[..], "the admissions view's counts against the CSV text");

    for (before, after) in counted[0].iter().zip(&counted[1]) {
        let (task, bound) = (&before.0, f64::from(before.0.max_rows_per_unit));
        let offsets = task.offsets();
        let moved: Vec<f64> = after.1.iter().zip(&before.1).map(|(a, b)| a - b).collect();
        assert!(moved.iter().all(|d| *d >= 0.0), "adding a patient only adds rows");
        for table in offsets.windows(2) {
            let l1: f64 = moved[table[0]..table[1]].iter().sum();
            assert_eq!(l1, bound, "the added patient gives each table exactly its capped rows");
        }
        let l2 = moved.iter().map(|d| d * d).sum::<f64>().sqrt();
        assert!(l2 <= task.sensitivity() + 1e-9, "moved by {l2}, declared {}", task.sensitivity());
    }
}

/// A database job end to end in a standalone cluster (real gRPC, 2 workers): three tables
/// (patients → admissions → vitals) read by patient, one ledger charge (the plan's one
/// zCDP budget), and a release of three Parquet datasets under the prefix whose manifest
/// lists them. Keys are fresh (none of the input's), unique in their table, and every
/// child row's parent exists and belongs to the same patient; no parent has more rows
/// than its declared cap; charts are in time order under their admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_job_releases_every_table_with_its_keys_under_one_charge() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::generators::database::DatabasePlan;
    use std::collections::{HashMap, HashSet};

    const CAPS: (u32, u32) = (3, 8);
    let dir = tempfile::tempdir().unwrap();
    let db = rhosynth_shared::simulate::database::database_csv(300, 11);
    rhosynth_shared::testing::write_database(dir.path(), &db);
    let out = dir.path().join("out");
    let text = rhosynth_shared::testing::database_job(dir.path(), CAPS, "order_by = \"charttime\"")
        .replace(
            "[privacy]\n",
            &format!(
                "[output]\nurl = {:?}\n[privacy]\nledger = {:?}\ndataset_budget = {{ epsilon = 10.0, delta = 1e-5 }}\n",
                out.display().to_string(),
                dir.path().join("ledger").display().to_string()
            ),
        )
        .replace("name = \"database\"\n", "name = \"database\"\n[generator.database.aim]\nrounds = 40\n");
    let spec = JobSpec::parse(&text, "database").unwrap();
    let (state, message) = run(spec.clone(), &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");

    let plan = DatabasePlan::new(&spec, &AccountingOptions::default()).unwrap();
    assert_eq!(charged_mechanisms(dir.path(), &spec.job.dataset_id).await, vec![plan.mechanisms()]);
    let (manifest, tables) = read_database(&out);
    let epsilon = manifest["privacy"]["epsilon"].as_f64().unwrap();
    assert!(epsilon <= spec.privacy.epsilon * (1.0 + 1e-9) && epsilon > 0.99 * spec.privacy.epsilon, "{epsilon}");
    assert_eq!(manifest["format"], "rhosynth.database-manifest.v1");
    assert_eq!(manifest["parts"].as_array().unwrap().len(), 0, "a database's parts are listed by table");
    let names: Vec<&str> = tables.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["patients", "admissions", "vitals"]);
    let rows_of = |batches: &[arrow_array::RecordBatch]| batches.iter().map(|b| b.num_rows()).sum::<usize>();
    let rows: u64 = tables.iter().map(|(_, b)| rows_of(b) as u64).sum();
    assert_eq!(manifest["rows"].as_u64().unwrap(), rows);
    // Each table keeps its declared columns, in order.
    let declared = [
        spec.schema.columns.iter().map(|c| c.name.clone()).collect::<Vec<_>>(),
        spec.tables[0].columns.iter().map(|c| c.name.clone()).collect(),
        spec.tables[1].columns.iter().map(|c| c.name.clone()).collect(),
    ];
    for ((_, batch), declared) in tables.iter().zip(&declared) {
        let names: Vec<String> = batch[0].schema().fields().iter().map(|f| f.name().clone()).collect();
        assert_eq!(&names, declared);
    }
    let [(_, patients), (_, admissions), (_, vitals)] = &tables[..] else { panic!("three tables") };

    // Fresh keys, unique in their table; no key of the input.
    let subjects = keys(patients, "subject_id");
    let unique: HashSet<&String> = subjects.iter().collect();
    assert_eq!(unique.len(), subjects.len(), "one row per synthetic patient");
    let input_keys: HashSet<&str> = db.admissions.lines().skip(1).flat_map(|l| l.split(',').take(2)).collect();
    // Referential integrity: every admission's patient exists; every chart's admission
    // exists and belongs to the chart's patient.
    let hadm = keys(admissions, "hadm_id");
    let admitted = keys(admissions, "subject_id");
    assert_eq!(hadm.iter().collect::<HashSet<_>>().len(), hadm.len(), "admission keys are unique");
    let patient_of: HashMap<&String, &String> = hadm.iter().zip(&admitted).collect();
    assert!(admitted.iter().all(|s| unique.contains(s)), "every admission's patient exists");
    let (charted, chart_subject) = (keys(vitals, "hadm_id"), keys(vitals, "subject_id"));
    for (h, s) in charted.iter().zip(&chart_subject) {
        assert_eq!(patient_of.get(h), Some(&s), "chart of admission {h} belongs to its patient");
    }
    for key in subjects.iter().chain(&hadm) {
        assert!(!input_keys.contains(key.as_str()), "{key} is a key of the input");
    }
    // No parent has more rows than its cap.
    let most = |children: &[String]| {
        let mut counts: HashMap<&String, u32> = HashMap::new();
        children.iter().for_each(|k| *counts.entry(k).or_default() += 1);
        counts.values().copied().max().unwrap_or(0)
    };
    assert!(most(&admitted) <= CAPS.0 && most(&charted) <= CAPS.1);
    assert!(rows_of(admissions) > 0 && rows_of(vitals) > 0);
    // Charts in time order under each admission (each admission's charts are contiguous).
    let times: Vec<Option<i64>> = column::<arrow_array::TimestampMillisecondArray>(vitals, "charttime")
        .iter()
        .flat_map(|a| a.iter().collect::<Vec<_>>())
        .collect();
    for i in 1..times.len() {
        if charted[i] == charted[i - 1] {
            let (a, b) = (times[i - 1].unwrap_or(i64::MAX), times[i].unwrap_or(i64::MAX));
            assert!(b >= a, "charts of {} out of order", charted[i]);
        }
    }
    eprintln!(
        "patients {} (input 300), admissions {}, charts {}",
        subjects.len(),
        rows_of(admissions),
        rows_of(vitals)
    );
}

/// A database release at ε = 50 on a simulated cohort whose admissions' charts follow
/// their stay (charted every one to four hours inside it; 48 at most an admission, so the
/// cap rarely cuts them): the release keeps the rank correlation of a stay's length and
/// its charts within 0.1 of the real one (before the charts' rate over the stay,
/// `__rate.vitals`, it was near 0: the count and the stay were drawn apart), and, the real
/// tables having no missing value, draws none (before, the noise of each column's missing
/// cell drew some: `generators::database::missing`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_release_keeps_charts_following_their_stay_and_no_phantom_missing_value() {
    use std::collections::HashMap;

    use arrow_array::Array;
    use rhosynth_shared::spec::parse_datetime;
    use rhosynth_shared::testing::{database_job, rank_correlation, with_intervals, write_database};

    const CAPS: (u32, u32) = (3, 48);
    let dir = tempfile::tempdir().unwrap();
    let db = rhosynth_shared::simulate::database::database_csv(800, 13);
    write_database(dir.path(), &db);
    let out = dir.path().join("out");
    let text = with_intervals(&database_job(dir.path(), CAPS, "order_by = \"charttime\""))
        .replace(
            "[privacy]\nepsilon = 4.0\n",
            &format!(
                "[output]\nurl = {:?}\n[privacy]\nepsilon = 50.0\nledger = {:?}\ndataset_budget = {{ epsilon = 100.0, \
                 delta = 1e-5 }}\n",
                out.display().to_string(),
                dir.path().join("ledger").display().to_string()
            ),
        )
        .replace("name = \"database\"\n", "name = \"database\"\n[generator.database.aim]\nrounds = 60\n");
    let spec = JobSpec::parse(&text, "database").unwrap();
    let (state, message) = run(spec, &dir.path().join("scratch")).await;
    assert_eq!(state, SUCCEEDED, "{message}");

    // The real stays and charts, as the caps keep them: a patient's first three admissions,
    // an admission's first 48 charts.
    let mut charts: HashMap<&str, f64> = HashMap::new();
    db.vitals.lines().skip(1).for_each(|l| *charts.entry(l.split(',').nth(1).unwrap()).or_default() += 1.0);
    let mut by_patient: HashMap<&str, Vec<(f64, f64, &str)>> = HashMap::new();
    for line in db.admissions.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let (admit, disch) = (parse_datetime(f[2]).unwrap(), parse_datetime(f[3]).unwrap());
        by_patient.entry(f[1]).or_default().push((admit, disch, f[0]));
    }
    let mut real = Vec::new();
    for mut stays in by_patient.into_values() {
        stays.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (admit, disch, hadm) in stays.into_iter().take(CAPS.0 as usize) {
            real.push((disch - admit, charts.get(hadm).copied().unwrap_or(0.0).min(f64::from(CAPS.1))));
        }
    }

    let (_, tables) = read_database(&out);
    for (name, batches) in &tables {
        for batch in batches {
            for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                assert_eq!(column.null_count(), 0, "{name}.{} drawn missing; the real table has none", field.name());
            }
        }
    }
    let [_, (_, admissions), (_, vitals)] = &tables[..] else { panic!("three tables") };
    let mut drawn_charts: HashMap<String, f64> = HashMap::new();
    keys(vitals, "hadm_id").into_iter().for_each(|h| *drawn_charts.entry(h).or_default() += 1.0);
    let times = |name: &str| -> Vec<i64> {
        let arrays = column::<arrow_array::TimestampMillisecondArray>(admissions, name);
        arrays.iter().flat_map(|a| a.iter().map(Option::unwrap).collect::<Vec<_>>()).collect()
    };
    let (admit, disch) = (times("admittime"), times("dischtime"));
    let drawn: Vec<(f64, f64)> = (keys(admissions, "hadm_id").iter().zip(admit.iter().zip(&disch)))
        .map(|(h, (a, d))| ((d - a) as f64 / 1000.0, drawn_charts.get(h).copied().unwrap_or(0.0)))
        .collect();
    let (r, d) = (rank_correlation(&real), rank_correlation(&drawn));
    eprintln!("FIG stay × charts (rank): real {r:.3}, released {d:.3}");
    assert!(r >= 0.8, "the simulated charts follow their stay: {r:.2}");
    assert!((d - r).abs() < 0.1, "stay × charts: {d:.2} released, {r:.2} real");
}
