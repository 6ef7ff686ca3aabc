//! `rhosynth run | demo | serve | submit`: running synthesis jobs.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rhosynth_coordinator::auth::Access;
use rhosynth_coordinator::datasets::Datasets;
use rhosynth_coordinator::job::JobRequest;
use rhosynth_coordinator::scratch;
use rhosynth_coordinator::server::serve;
use rhosynth_coordinator::service::{CoordinatorConfig, CoordinatorService, new_job_id};
use rhosynth_coordinator::standalone::Standalone;
use rhosynth_privacy::ledger::Ledger;
use rhosynth_proto::{GetJobRequest, JobState, JobStatus, SubmitJobRequest};
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;
use rhosynth_shared::{process, simulate};

use super::client::SubmitterArgs;
use super::{EXIT_BUDGET_REFUSED, print_json};

/// The demo's job spec, compiled in so the demo needs no files.
const DEMO_SPEC: &str = include_str!("../../../examples/demo.toml");
/// Where the demo writes its simulated cohorts (the demo and the ICU examples read them).
const DEMO_INPUT: &str = "./rhosynth-out/demo/input/icu_vitals.csv";
const DEMO_HOLDOUT: &str = "./rhosynth-out/demo/input/icu_vitals_holdout.csv";

#[derive(Args)]
pub struct SimulateArgs {
    /// Where to write the CSV (with `--relational`: the folder of its three CSV files).
    out: String,
    /// Simulated patients (4–50 charted visits each).
    #[arg(long, default_value_t = 400)]
    patients: usize,
    /// The simulator's seed (simulated data hold no person, so a fixed seed is fine).
    #[arg(long, default_value_t = 2026)]
    seed: u64,
    /// What the vitals do over time: `hidden-state` (a clinical state drifting between
    /// visits), `ar1:ρ` (each vital AR(1), lag-1 autocorrelation ρ) or `treated:ρ` (AR(1),
    /// and a treatment that lowers later values).
    #[arg(long, default_value = "hidden-state")]
    dynamics: simulate::Dynamics,
    /// Irregular sampling: bursts of visits minutes apart between gaps of up to two days.
    #[arg(long)]
    irregular: bool,
    /// A MIMIC-shaped database instead: `patients.csv` → `admissions.csv` → `vitals.csv`
    /// (vitals charted during each admission), sicker patients with more admissions and
    /// worse vitals.
    #[arg(long, conflicts_with_all = ["dynamics", "irregular"])]
    relational: bool,
}

/// Writes a simulated ICU cohort (the demo's private input, at any size), or a simulated
/// database of patients, admissions and vitals.
pub fn simulate_command(args: SimulateArgs) -> anyhow::Result<ExitCode> {
    if args.relational {
        let db = simulate::database::database_csv(args.patients, args.seed);
        std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out))?;
        for (name, text) in [("patients", &db.patients), ("admissions", &db.admissions), ("vitals", &db.vitals)] {
            let path = std::path::Path::new(&args.out).join(format!("{name}.csv"));
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            say!("{}: {} rows", path.display(), text.lines().count() - 1);
        }
        say!("simulated a database of {} patients into {}", args.patients, args.out);
        return Ok(ExitCode::SUCCESS);
    }
    let cohort = simulate::Cohort { patients: args.patients, dynamics: args.dynamics, irregular: args.irregular };
    write_cohort(&args.out, &cohort, args.seed, "")?;
    Ok(ExitCode::SUCCESS)
}

/// Writes a simulated cohort to `path` and says so (`what`: its role).
fn write_cohort(path: &str, cohort: &simulate::Cohort, seed: u64, what: &str) -> anyhow::Result<()> {
    std::fs::write(path, simulate::cohort_csv(cohort, seed)).with_context(|| format!("writing {path}"))?;
    say!("simulated {} ICU patients' vital signs ({:?}) into {path}{what}", cohort.patients, cohort.dynamics);
    Ok(())
}

#[derive(Args)]
pub struct DemoArgs {
    /// Simulated patients in the private input (4–50 charted visits each).
    #[arg(long, default_value_t = 400)]
    patients: usize,
    /// Run this job spec on the simulated cohort instead of the built-in one (e.g.
    /// examples/icu-copula.toml). It reads the simulated input, and a held-out cohort of
    /// a fifth as many patients for its evaluation.
    #[arg(long)]
    spec: Option<String>,
    /// What the simulated vitals do over time (as `simulate --dynamics`).
    #[arg(long, default_value = "hidden-state")]
    dynamics: simulate::Dynamics,
    /// Irregular sampling (as `simulate --irregular`).
    #[arg(long)]
    irregular: bool,
}

#[derive(Args)]
pub struct RunArgs {
    /// The job spec (TOML).
    spec: String,
    /// Local workers to start.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Output prefix (path, file:// or s3://); overrides the spec.
    #[arg(long)]
    output: Option<String>,
    /// Ledger store; overrides the spec.
    #[arg(long)]
    ledger: Option<String>,
    /// Scratch store for the job's partitions (deleted when the job ends). Partitions a
    /// crashed coordinator or `run` left there are swept at start; live ones are kept.
    #[arg(long, default_value = "./rhosynth-out/scratch")]
    scratch: String,
    /// Where an `[evaluation]` report goes (`<diagnostics>/<job id>/`): it is computed on
    /// private data, for the data owner only, never beside the output.
    #[arg(long, default_value = "./rhosynth-out/diagnostics")]
    diagnostics: String,
    /// How progress is shown on stderr: a bar, or one JSON line per change (`{"progress":
    /// {…}}`, for programs such as the Python package).
    #[arg(long, value_enum, default_value = "bar")]
    progress: ProgressFormat,
    /// Cancel the job, as an interrupt does, when process PID, which must be this one's
    /// parent, ends (a notebook's kernel killed): a program's job should not run on without
    /// it. Named, not taken from the start, so that a parent gone before is noticed.
    #[arg(long, value_name = "PID")]
    stop_with_parent: Option<u32>,
}

/// How a job's progress is shown.
#[derive(Clone, Copy, ValueEnum)]
pub enum ProgressFormat {
    Bar,
    Json,
}

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Scratch store for partitions; workers must be able to read it.
    #[arg(long, env = "RHOSYNTH_SCRATCH", default_value = "./rhosynth-out/scratch")]
    scratch: String,
    /// Ledger store used when a job spec names none.
    #[arg(long, env = "RHOSYNTH_LEDGER", default_value = "./rhosynth-out/ledger")]
    ledger: String,
    /// Seconds without heartbeat before a worker is declared dead (0.1 to 86400).
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds)]
    worker_timeout: f64,
    /// With declared datasets: a job's release and end are shown to its submitter only at
    /// q, 2q, 4q, … seconds after it started (0.1 to 86400), so their timing, which
    /// follows the private rows, shows a submitter little.
    #[arg(long, env = "RHOSYNTH_RELEASE_QUANTUM", default_value_t = 10.0, value_parser = parse_seconds)]
    release_quantum: f64,
    /// The operator's store for evaluation reports (diagnostics computed on private data,
    /// for the data owner only). Without it, jobs asking for an evaluation are refused.
    #[arg(long, env = "RHOSYNTH_DIAGNOSTICS")]
    diagnostics: Option<String>,
    /// Serve Prometheus `/metrics` and `/healthz` on this address.
    #[arg(long, env = "RHOSYNTH_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Operator-declared datasets (TOML): jobs name one of these and get its input,
    /// privacy unit, ledger and budget from it.
    #[arg(long, env = "RHOSYNTH_DATASETS", required_unless_present = "dev")]
    datasets: Option<String>,
    /// Declared submitters (TOML): bearer-token hashes and the datasets each may use.
    #[arg(long, env = "RHOSYNTH_SUBMITTERS", required_unless_present = "dev")]
    submitters: Option<String>,
    /// The coordinator's TLS certificate (PEM).
    #[arg(long, env = "RHOSYNTH_TLS_CERT", required_unless_present = "dev")]
    tls_cert: Option<PathBuf>,
    /// The coordinator's TLS key (PEM).
    #[arg(long, env = "RHOSYNTH_TLS_KEY", required_unless_present = "dev")]
    tls_key: Option<PathBuf>,
    /// The CA whose client certificates identify workers (PEM).
    #[arg(long, env = "RHOSYNTH_WORKER_CA", required_unless_present = "dev")]
    worker_ca: Option<PathBuf>,
    /// Development mode: no TLS and no authentication, submitters choose inputs and
    /// ledgers (so declared datasets are refused with it). Loopback only.
    #[arg(long, conflicts_with_all = ["datasets", "submitters", "tls_cert", "tls_key", "worker_ca"])]
    dev: bool,
}

#[derive(Args)]
pub struct SubmitArgs {
    /// The job spec (TOML).
    spec: String,
    #[command(flatten)]
    client: SubmitterArgs,
    #[arg(long)]
    output: Option<String>,
    #[arg(long)]
    ledger: Option<String>,
    /// How progress is shown on stderr (as `run --progress`).
    #[arg(long, value_enum, default_value = "bar")]
    progress: ProgressFormat,
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.1..=86_400.0).contains(&s) => Ok(s),
        Ok(s) => Err(format!("{s} is outside 0.1 to 86400 seconds")),
        Err(e) => Err(e.to_string()),
    }
}

/// Deletes partitions that crashed coordinators left in the scratch store (encoded
/// private rows); a live coordinator sharing the store keeps its own.
async fn sweep_stale_partitions(scratch: &str) -> anyhow::Result<()> {
    let location = storage::open(scratch)?;
    let swept = scratch::sweep_stale(&location).await.context("sweeping the scratch store")?;
    if !swept.is_empty() {
        tracing::info!(coordinators = swept.len(), "deleted partitions left by crashed coordinators");
    }
    Ok(())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// A job's progress bar: it counts tasks or DP-SGD rounds; the stage in the message says
/// which.
fn progress_bar() -> ProgressBar {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len}, ETA {eta} — {msg}")
            .expect("valid template"),
    );
    bar
}

/// Shows a job's status on its bar.
fn show(bar: &ProgressBar, s: &JobStatus) {
    bar.set_length(u64::from(s.tasks_total));
    bar.set_position(u64::from(s.tasks_done));
    bar.set_message(format!("{} (ε spent {:.4})", s.message, s.epsilon_spent));
}

/// A job's progress as its format says: on a bar, or as a JSON line on stderr each time
/// it changes.
enum Shown {
    Bar(ProgressBar),
    Json { last: String },
}

impl Shown {
    fn new(format: ProgressFormat) -> Self {
        match format {
            ProgressFormat::Bar => Shown::Bar(progress_bar()),
            ProgressFormat::Json => Shown::Json { last: String::new() },
        }
    }

    fn show(&mut self, s: &JobStatus) {
        match self {
            Shown::Bar(bar) => show(bar, s),
            Shown::Json { last } => {
                let state = JobState::try_from(s.state).map_or("unknown".into(), |s| format!("{s:?}").to_lowercase());
                let line = serde_json::json!({"progress": {
                    "state": state, "done": s.tasks_done, "total": s.tasks_total,
                    "message": s.message, "epsilon_spent": s.epsilon_spent,
                }})
                .to_string();
                if line != *last {
                    say!("{line}");
                    *last = line;
                }
            }
        }
    }

    fn finish(&self) {
        if let Shown::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// Shows a job's progress until it ends; returns its final status.
async fn follow(
    format: ProgressFormat,
    mut status: impl AsyncFnMut() -> anyhow::Result<JobStatus>,
) -> anyhow::Result<JobStatus> {
    let mut shown = Shown::new(format);
    loop {
        let s = status().await?;
        shown.show(&s);
        if s.state != JobState::Running as i32 {
            shown.finish();
            return Ok(s);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Prints a finished job's result; the exit status says how it ended.
fn report(status: &JobStatus) -> ExitCode {
    match JobState::try_from(status.state) {
        Ok(JobState::Succeeded) => {
            let manifest: serde_json::Value = serde_json::from_str(&status.manifest_json).unwrap_or_default();
            say!(
                "job {} succeeded: {} rows, ε = {} (δ = {}) charged to dataset '{}'",
                status.job_id,
                manifest["rows"],
                manifest["privacy"]["epsilon"],
                manifest["privacy"]["delta"],
                manifest["privacy"]["dataset_id"].as_str().unwrap_or_default()
            );
            print_json(&manifest);
            ExitCode::SUCCESS
        }
        Ok(JobState::Refused) => {
            say!("job {} refused: {}", status.job_id, status.message);
            print_json(&serde_json::json!({"job_id": status.job_id, "state": "refused", "error": status.message}));
            ExitCode::from(EXIT_BUDGET_REFUSED)
        }
        _ => {
            say!("job {} failed: {}", status.job_id, status.message);
            print_json(&serde_json::json!({"job_id": status.job_id, "state": "failed", "error": status.message}));
            ExitCode::FAILURE
        }
    }
}

/// Where a standalone job reads, writes and keeps its scratch and diagnostics.
struct Locations {
    output: Option<String>,
    ledger: Option<String>,
    scratch: String,
    diagnostics: String,
}

/// Resolves on an interrupt (SIGINT, SIGTERM) or when `parent` is no longer this
/// process's parent (it ended, and this one was adopted by another).
async fn stop(parent: Option<u32>) {
    let Some(parent) = parent else { return super::shutdown_signal().await };
    let parent_gone = async {
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        while std::os::unix::process::parent_id() == parent {
            tick.tick().await;
        }
    };
    tokio::select! {
        () = super::shutdown_signal() => {}
        () = parent_gone => say!("the process that started this job has ended"),
    }
}

/// The exit status of a job stopped by an interrupt (128 + SIGINT, as a shell reports it).
const EXIT_INTERRUPTED: u8 = 130;

/// A standalone job's end: its status, and whether an interrupt (SIGINT or SIGTERM)
/// cancelled it.
struct Ended {
    status: JobStatus,
    interrupted: bool,
}

impl Ended {
    fn exit_code(&self) -> ExitCode {
        let code = report(&self.status);
        if self.interrupted && self.status.state != JobState::Succeeded as i32 {
            return ExitCode::from(EXIT_INTERRUPTED);
        }
        code
    }
}

/// Runs a job on an in-process cluster (coordinator + local workers over loopback gRPC).
/// An interrupt cancels the job: it stops with nothing released unless its release has
/// begun, which then runs to its end.
async fn run_standalone(
    spec: JobSpec,
    workers: usize,
    at: Locations,
    format: ProgressFormat,
    stop_with_parent: Option<u32>,
) -> anyhow::Result<Ended> {
    let ledger = at.ledger.as_ref().or(spec.privacy.ledger.as_ref());
    for (store, url) in [("scratch", Some(&at.scratch)), ("diagnostics", Some(&at.diagnostics)), ("ledger", ledger)] {
        url.into_iter().for_each(|url| process::warn_if_shared(store, url));
    }
    sweep_stale_partitions(&at.scratch).await?;
    let mut config = CoordinatorConfig::default();
    config.env.scratch_url = at.scratch;
    config.env.diagnostics_url = Some(at.diagnostics.clone());
    config.access = Access::InProcess;
    let cluster = Standalone::start(config, workers).await.context("starting the local cluster")?;
    tracing::info!(coordinator = cluster.url, workers, "standalone cluster started");
    let job_id = spec.job.id.clone().unwrap_or_else(new_job_id);
    let request = JobRequest { output_url: at.output, ledger_url: at.ledger, ..JobRequest::new(job_id.clone(), spec) };
    let mut shown = Shown::new(format);
    let mut interrupted = false;
    let status = {
        let run = cluster.run_job(request, |s| shown.show(s));
        tokio::pin!(run);
        tokio::select! {
            status = &mut run => status,
            () = stop(stop_with_parent) => {
                interrupted = true;
                say!("interrupted: cancelling job {job_id}; nothing is released unless its release has begun");
                cluster.service.cancel_job(&job_id);
                run.await
            }
        }
    }
    .map_err(anyhow::Error::msg);
    shown.finish();
    if cluster.service.diagnostics_pending(&job_id) {
        let report = format!("{}/{job_id}", at.diagnostics.trim_end_matches('/'));
        say!("writing the evaluation report (for the data owner, not differentially private) to {report}");
        while cluster.service.diagnostics_pending(&job_id) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    cluster.shutdown().await;
    Ok(Ended { status: status?, interrupted })
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if let Some(pid) = args.stop_with_parent
        && std::os::unix::process::parent_id() != pid
    {
        bail!(
            "--stop-with-parent {pid}: process {pid} is not this one's parent (it has ended, or another stands between)"
        );
    }
    let mut spec = JobSpec::load(&args.spec)?;
    let inputs = std::iter::once(&mut spec.input).chain(spec.tables.iter_mut().map(|t| &mut t.input));
    for input in inputs {
        input.urls = input.urls.iter().map(|url| without_parent_segments(url)).collect::<anyhow::Result<_>>()?;
    }
    let at =
        Locations { output: args.output, ledger: args.ledger, scratch: args.scratch, diagnostics: args.diagnostics };
    let run = run_standalone(spec, args.workers, at, args.progress, args.stop_with_parent);
    Ok(runtime()?.block_on(run)?.exit_code())
}

/// A local input path with a `..` segment (an example reading `../shared/data`) as the file
/// it names, links resolved: a ledger binds an input by its own path and refuses `..`, which
/// a store would resolve after a link. Other URLs as written.
fn without_parent_segments(url: &str) -> anyhow::Result<String> {
    let path = url.strip_prefix("file://").unwrap_or(url);
    if path.contains("://") || !path.split('/').any(|segment| segment == "..") {
        return Ok(url.to_string());
    }
    let resolved = std::fs::canonicalize(path).with_context(|| format!("input file {path}"))?;
    Ok(resolved.to_string_lossy().into_owned())
}

pub fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let spec = match &args.spec {
        Some(path) => JobSpec::load(path)?,
        None => JobSpec::parse(DEMO_SPEC, "examples/demo.toml (built in)")?,
    };
    // The demo writes its cohort to one place; a spec reading another file would train on
    // something the demo did not simulate.
    if spec.input.urls != [DEMO_INPUT] {
        anyhow::bail!("a demo spec reads the simulated cohort: [input] urls = [\"{DEMO_INPUT}\"]");
    }
    if let Some(dir) = std::path::Path::new(DEMO_INPUT).parent() {
        std::fs::create_dir_all(dir)?;
    }
    let patients = args.patients.max(1);
    let holdout = (patients / 5).max(1);
    // Fixed seeds: the cohorts are simulated (no real person), so the demo is reproducible.
    let cohort = |patients| simulate::Cohort { patients, dynamics: args.dynamics, irregular: args.irregular };
    write_cohort(DEMO_INPUT, &cohort(patients), 2026, " (the demo's private input)")?;
    write_cohort(DEMO_HOLDOUT, &cohort(holdout), 2027, " (the demo's held-out cohort)")?;
    let job_id = new_job_id();
    let mut output = spec.output.url_for(&spec.job.dataset_id, &job_id);
    if !spec.output.url.contains("{job_id}") {
        output = format!("{output}/{job_id}");
    }
    let ledger_url = spec.privacy.ledger.clone().context("a demo spec names its ledger ([privacy] ledger)")?;
    let dataset = spec.job.dataset_id.clone();
    let spec = JobSpec { job: rhosynth_shared::spec::JobSection { id: Some(job_id), ..spec.job.clone() }, ..spec };
    let rt = runtime()?;
    let at = Locations {
        output: Some(output),
        ledger: None,
        scratch: "./rhosynth-out/scratch".into(),
        diagnostics: "./rhosynth-out/diagnostics".into(),
    };
    let code = rt.block_on(run_standalone(spec, 2, at, ProgressFormat::Bar, None))?.exit_code();
    rt.block_on(async {
        let ledger = Ledger::open(&storage::open(&ledger_url)?, &dataset).await?;
        let spent = ledger.spent()?;
        say!(
            "privacy ledger of '{dataset}' at {ledger_url}: {} charges, ε spent {:.4} of {} (δ = {:e}); see `rhosynth ledger show --dataset {dataset} --store {ledger_url}`",
            ledger.charges().len(),
            spent.epsilon,
            ledger.budget().epsilon,
            ledger.budget().delta
        );
        anyhow::Ok(())
    })?;
    Ok(code)
}

pub fn serve_command(args: ServeArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        if args.dev && !args.listen.ip().is_loopback() {
            bail!("--dev serves without TLS or authentication, so it listens on loopback only (not {})", args.listen);
        }
        let mut config = CoordinatorConfig::default();
        for (store, url) in [
            ("scratch", Some(&args.scratch)),
            ("ledger", Some(&args.ledger)),
            ("diagnostics", args.diagnostics.as_ref()),
        ] {
            url.into_iter().for_each(|url| process::warn_if_shared(store, url));
        }
        sweep_stale_partitions(&args.scratch).await?;
        if let Some(path) = &args.datasets {
            let datasets = Datasets::load(path, &args.ledger)?;
            datasets.init_ledgers().await?;
            tracing::info!(datasets = ?datasets.ids().collect::<Vec<_>>(), "serving the declared datasets");
            config.datasets = Some(datasets);
        }
        let tls = match (&args.tls_cert, &args.tls_key, &args.worker_ca, &args.submitters) {
            _ if args.dev => {
                tracing::warn!("development mode: no TLS, no authentication (loopback only)");
                None
            }
            (Some(cert), Some(key), Some(ca), Some(submitters)) => {
                config.access = Access::load_submitters(submitters).map_err(anyhow::Error::msg)?;
                Some(rhosynth_proto::tls::server_config(cert, key, ca).context("reading the TLS files")?)
            }
            _ => bail!("serve needs --tls-cert, --tls-key, --worker-ca and --submitters (or --dev on loopback)"),
        };
        config.env.scratch_url = args.scratch;
        config.env.default_ledger_url = args.ledger;
        config.env.diagnostics_url = args.diagnostics;
        config.worker_timeout = Duration::from_secs_f64(args.worker_timeout);
        if config.datasets.is_some() {
            config.env.release_quantum = Some(Duration::from_secs_f64(args.release_quantum));
        }
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        tracing::info!(address = %listener.local_addr()?, tls = tls.is_some(), "coordinator listening");
        let service = CoordinatorService::new(config);
        if let Some(addr) = args.metrics_listen {
            let metrics = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
            let scraped = service.clone();
            tokio::spawn(rhosynth_shared::metrics::serve(metrics, std::sync::Arc::new(move || scraped.metrics())));
            tracing::info!(%addr, "metrics listening");
        }
        serve(listener, service, tls, async {
            super::shutdown_signal().await;
            tracing::info!("shutting down");
        })
        .await?;
        Ok(ExitCode::SUCCESS)
    })
}

pub fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&args.spec).with_context(|| format!("reading {}", args.spec))?;
    // Validate locally first: a bad spec should fail here, with its path.
    JobSpec::parse(&text, &args.spec)?;
    runtime()?.block_on(async {
        let mut client = args.client.connect().await?;
        let submitted = client
            .submit_job(SubmitJobRequest {
                spec_toml: text,
                spec_path: args.spec.clone(),
                output_url: args.output,
                ledger_url: args.ledger,
            })
            .await;
        let job_id = match submitted {
            Ok(r) => r.into_inner().job_id,
            Err(status) => bail!("the coordinator rejected the job: {}", status.message()),
        };
        say!("submitted job {job_id} to {}", args.client.coordinator);
        let status = follow(args.progress, async || {
            Ok(client.get_job(GetJobRequest { job_id: job_id.clone() }).await.context("polling the job")?.into_inner())
        })
        .await?;
        Ok(report(&status))
    })
}
