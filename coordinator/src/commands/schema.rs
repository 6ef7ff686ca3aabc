//! `rhosynth schema draft`: a job spec drafted from a CSV file, for the data owner.
//!
//! With `--epsilon` the domains are released with DP: the ledger is checked before any row
//! is read, charged before anything is drawn, and the draft's one release is claimed before
//! it is written. Without, the draft holds the data's own domains, marked private: it is
//! for the data owner, like `validate`'s report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use rhosynth_coordinator::datasets::{Datasets, DraftSource};
use rhosynth_coordinator::schema_draft::DraftRelease;
use rhosynth_coordinator::service::new_job_id;
use rhosynth_privacy::ledger::{ChargeRequest, Ledger, LedgerError};
use rhosynth_privacy::release::Releases;
use rhosynth_shared::accounting::accountant::Accountant;
use rhosynth_shared::data::source::CsvOptions;
use rhosynth_shared::generators::GeneratorName;
use rhosynth_shared::schema_draft::profile::{header, profile};
use rhosynth_shared::schema_draft::{DraftJob, DraftOptions, Exact, Provenance, draft, render};
use rhosynth_shared::storage;
use serde_json::json;

use super::{EXIT_BUDGET_REFUSED, print_json};

#[derive(Subcommand)]
pub enum SchemaCommand {
    /// Draft a job spec from a CSV file (header line first). With --epsilon its domains
    /// are released with DP and charged to the dataset's ledger; without, they are the
    /// data's own, marked private, for the data owner only.
    Draft(DraftArgs),
}

#[derive(Args)]
pub struct DraftArgs {
    /// The CSV file (header line first): a path, file://… or s3://… Not with --datasets,
    /// which names the dataset's own.
    #[arg(required_unless_present = "datasets", conflicts_with = "datasets")]
    data: Option<String>,
    /// Write the draft here (refused if the file exists); stdout when absent.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The privacy unit's column. With --epsilon, name it or say --row-level.
    #[arg(long, conflicts_with_all = ["row_level", "datasets"])]
    unit_column: Option<String>,
    /// Every row is its own privacy unit (with --epsilon and no --unit-column: say so).
    #[arg(long, conflicts_with = "datasets")]
    row_level: bool,
    /// Rows a unit contributes at most (a uniform sample of its rows); 1 when every row is
    /// a unit.
    #[arg(long, default_value_t = 1)]
    max_rows_per_unit: u32,
    /// Release the domains with DP at this ε, charged to --dataset's ledger.
    #[arg(long, requires = "dataset")]
    epsilon: Option<f64>,
    /// δ of the release (half of it for partition selection's thresholds).
    #[arg(long, default_value_t = 1e-6)]
    delta: f64,
    /// Dataset id: the ledger charged, and the draft's `dataset_id`.
    #[arg(long)]
    dataset: Option<String>,
    /// The operator's datasets file (`serve --datasets`): the dataset's declared input,
    /// unit column and ledger are the draft's, so a declared dataset's ledger is only ever
    /// charged for its own rows and privacy unit.
    #[arg(long, requires_all = ["dataset", "epsilon"])]
    datasets: Option<String>,
    /// Ledger store: a path, file://… or s3://bucket/prefix (with --datasets: for datasets
    /// that name none, as `serve --ledger`).
    #[arg(long)]
    store: Option<String>,
    /// Bins (quantiles) per numeric column; a value many rows share adds a bin of its own.
    #[arg(long, default_value_t = 10)]
    bins: u32,
    /// Categories kept per column at most; the rest go to __other__.
    #[arg(long, default_value_t = 100)]
    max_categories: usize,
    /// Categories below this share of their column's count go to __other__.
    #[arg(long, default_value_t = 0.001)]
    min_share: f64,
    /// The generator of the job the draft runs (`[generator] name`).
    #[arg(long, default_value = "aim")]
    generator: GeneratorName,
    /// The ε the drafted job is charged when it runs (`[privacy] epsilon`).
    #[arg(long, default_value_t = 1.0)]
    epsilon_job: f64,
}

pub fn run(cmd: SchemaCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cmd {
        SchemaCommand::Draft(args) => runtime.block_on(draft_command(args)),
    }
}

/// What a draft reads, how, and whom it charges.
struct Source {
    data: String,
    csv: CsvOptions,
    unit: Option<String>,
    ledger: Option<String>,
    /// The files the ledger is bound to (a declared database's every table's; else `data`).
    bound: Vec<String>,
}

/// The data, unit and ledger: a declared dataset's own, or the caller's.
fn source(args: &DraftArgs) -> anyhow::Result<Source> {
    if let (Some(path), Some(id)) = (&args.datasets, &args.dataset) {
        let datasets = Datasets::load(path, args.store.as_deref().unwrap_or_default())?;
        let DraftSource { url: data, csv, unit_column: unit, ledger_url: ledger, ledger_input: bound } =
            datasets.draft_source(id)?;
        if ledger.is_empty() {
            bail!("dataset '{id}' names no ledger store: pass --store, as to `serve --ledger`");
        }
        if !csv.has_header {
            bail!("dataset '{id}' declares a CSV file without a header line: a draft needs its column names");
        }
        return Ok(Source { data, csv, unit, ledger: Some(ledger), bound });
    }
    let data = args.data.clone().expect("clap requires DATA without --datasets");
    let bound = vec![data.clone()];
    Ok(Source { data, csv: CsvOptions::default(), unit: args.unit_column.clone(), ledger: args.store.clone(), bound })
}

async fn draft_command(args: DraftArgs) -> anyhow::Result<ExitCode> {
    if args.max_rows_per_unit == 0 || args.bins < 2 || args.max_categories == 0 || !(0.0..1.0).contains(&args.min_share)
    {
        bail!("--max-rows-per-unit must be ≥ 1, --bins ≥ 2, --max-categories ≥ 1 and --min-share in [0, 1)");
    }
    if let Some(out) = &args.out
        && out.exists()
    {
        bail!("{} exists: the draft is never written over a file", out.display());
    }
    if !(args.epsilon_job > 0.0 && args.epsilon_job.is_finite()) {
        bail!("--epsilon-job must be a positive number");
    }
    let mut job = DraftJob { generator: args.generator, epsilon: args.epsilon_job, ledger: None };
    let options = DraftOptions {
        bins: args.bins,
        max_categories: args.max_categories,
        min_share: args.min_share,
        ..DraftOptions::default()
    };
    let Source { data, csv, unit, ledger: store, bound } = source(&args)?;
    let unit = unit.as_deref();
    if unit.is_none() && args.max_rows_per_unit != 1 {
        bail!("--max-rows-per-unit bounds a unit's rows: without a unit column every row is a unit (m = 1)");
    }
    let dataset_id = args.dataset.clone().unwrap_or_else(|| stem(&data));
    // The header names the columns: metadata, read before the check; no row is.
    let names = header(&data, &csv).await?;
    let Some(epsilon) = args.epsilon else {
        let profile = profile(&data, &names, &csv, unit, args.max_rows_per_unit).await?;
        let draft = draft(&profile, unit, &mut Exact, &options).unwrap_or_else(|never| match never {});
        let text = render(&draft, &data, &dataset_id, &Provenance::Exact, &job);
        let written = emit(&text, args.out.as_deref())?;
        say!("schema draft of {data} written{written}: its domains are the data's own — PRIVATE.");
        print_json(&json!({"draft": args.out, "columns": draft.columns.len(), "released": false}));
        return Ok(ExitCode::SUCCESS);
    };
    if unit.is_none() && !args.row_level && args.datasets.is_none() {
        bail!(
            "a DP draft needs its privacy unit: --unit-column COLUMN, or --row-level if every row is a different \
             person (else a person with k rows pays k times what the ledger records)"
        );
    }
    let Some(store) = store else { bail!("--epsilon charges a ledger: pass --store (or --datasets)") };
    let mut ledger = Ledger::open(&storage::open(&store)?, &dataset_id).await.with_context(|| {
        format!("opening the ledger of '{dataset_id}' in {store} (create it with `rhosynth ledger init`)")
    })?;
    // The ledger's budget covers the people of its own input, not any file named here.
    ledger.bind_input(&bound).await?;
    if let Some(u) = unit
        && !names.iter().any(|n| n == u)
    {
        bail!("{data} has no column '{u}'");
    }
    let columns = names.len() - usize::from(unit.is_some());
    let plan = DraftRelease::new(columns, args.max_rows_per_unit, epsilon, args.delta, ledger.options())?;
    let request = ChargeRequest {
        job_id: format!("schema-draft-{}", new_job_id()),
        mechanisms: plan.mechanisms(),
        accountant: Accountant::Rdp,
        delta: args.delta,
    };
    let refused = |e: LedgerError| {
        say!("refused: {e}");
        print_json(&json!({"refused": e.to_string()}));
        Ok(ExitCode::from(EXIT_BUDGET_REFUSED))
    };
    match ledger.check(&request).await {
        Err(e @ LedgerError::BudgetExceeded { .. }) => return refused(e),
        other => other?,
    };
    // No error below depends on the rows: rows that do not parse are left out.
    let profile = profile(&data, &names, &csv, unit, args.max_rows_per_unit).await?;
    let receipt = match ledger.charge(&request).await {
        Err(e @ LedgerError::BudgetExceeded { .. }) => return refused(e),
        other => other?,
    };
    let mut releases = Releases::paid_by(&receipt)?;
    let draft = draft(&profile, unit, &mut plan.measure(&mut releases), &options)?;
    let location = args.out.as_ref().map_or_else(|| "stdout".to_string(), |p| p.display().to_string());
    ledger.record_release(receipt.seq, &location).await?;
    // The job charges the ledger the draft did (a declared dataset's is the operator's).
    // (a local path made absolute: the spec runs from wherever it is saved).
    if args.datasets.is_none() {
        let local = !store.contains("://");
        job.ledger =
            Some(if local { std::path::absolute(&store)?.to_string_lossy().into_owned() } else { store.clone() });
    }
    let provenance =
        Provenance::Released { epsilon, delta: args.delta, dataset_id: dataset_id.clone(), charge_seq: receipt.seq };
    let text = render(&draft, &data, &dataset_id, &provenance, &job);
    let written = emit(&text, args.out.as_deref())?;
    say!(
        "schema draft of {data} released{written} at ε = {:.6} (δ = {:e}), charged to '{dataset_id}' as entry {}",
        receipt.admission.cost.epsilon,
        args.delta,
        receipt.seq
    );
    print_json(&json!({
        "draft": args.out,
        "columns": draft.columns.len(),
        "released": true,
        "epsilon": receipt.admission.cost.epsilon,
        "delta": args.delta,
        "charge_seq": receipt.seq,
        "noise_multiplier": plan.noise_multiplier,
    }));
    Ok(ExitCode::SUCCESS)
}

/// Writes the draft to `out` (a new file) or stdout; says where.
fn emit(text: &str, out: Option<&Path>) -> anyhow::Result<String> {
    match out {
        Some(path) => {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.write_all(text.as_bytes())?;
            Ok(format!(" to {}", path.display()))
        }
        None => {
            print!("{text}");
            Ok(String::new())
        }
    }
}

/// The file name without its extension: a draft's default dataset id.
fn stem(url: &str) -> String {
    let name = url.rsplit('/').next().unwrap_or(url);
    name.split('.').next().filter(|s| !s.is_empty()).unwrap_or("dataset").to_string()
}
