//! `rhosynth audit`: an empirical lower bound on the job's ε, from one run with canaries.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use rhosynth_coordinator::audit::{self, AuditOptions};
use rhosynth_shared::audit::score::Score;
use rhosynth_shared::spec::JobSpec;

use super::{EXIT_AUDIT_FAILED, print_json};

#[derive(Args)]
pub struct AuditArgs {
    /// The job spec (TOML) whose mechanism is audited, exactly as configured.
    spec: String,
    /// Canary units (M), each put into the job's input with probability ½.
    #[arg(long, default_value_t = 1000)]
    canaries: usize,
    /// Stand-in data with the spec's schema (files in its input format); default: the
    /// job's input. The report is computed on it: keep it private if the data is.
    #[arg(long, num_args = 1..)]
    data: Option<Vec<String>>,
    /// Guesses at each end of the scores (k "in", k "out"); default M/10.
    #[arg(long)]
    guesses: Option<usize>,
    /// How a canary is scored: `pairs` (its 2-way cells in the release against the
    /// stand-in), `nearest` (distance to the nearest synthetic row) or, for generators
    /// trained by DP-SGD, `loss` (the trained model's loss on it: white-box).
    #[arg(long, default_value = "pairs")]
    score: Score,
    /// Rows per canary unit (only with a unit column); default 8 there, 1 otherwise.
    #[arg(long)]
    canary_rows: Option<usize>,
    /// Local workers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where the audit's directory (report.json and its own ledger) is made.
    #[arg(long, default_value = "./rhosynth-out/audit")]
    out: PathBuf,
}

pub fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let spec = JobSpec::load(&args.spec)?;
    let mut options = AuditOptions::new(&spec, args.canaries, args.out);
    options.data = args.data;
    options.workers = args.workers;
    options.score = args.score;
    options.guesses = args.guesses.unwrap_or(options.guesses);
    options.canary_rows = args.canary_rows.unwrap_or(options.canary_rows);
    let work = audit::work_dir().context("creating the audit's working directory")?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let path = work.path().to_path_buf();
    // On a task of its own, so a signal is seen even while scoring keeps a thread busy.
    let audit = runtime.spawn(async move { audit::run(&spec, &options, &path).await });
    let outcome = runtime.block_on(async {
        tokio::select! {
            biased;
            _ = super::shutdown_signal() => None,
            joined = audit => Some(joined),
        }
    });
    // The cluster's tasks (the only ones that write the working files, a copy of the
    // stand-in data) end at their next await before the files are removed, so none can
    // write them anew; a stopped audit still scoring on a thread past the timeout only
    // reads them.
    runtime.shutdown_timeout(Duration::from_secs(30));
    let kept = work.path().display().to_string();
    if let Err(e) = work.close() {
        // Loud, and the audit's outcome still stands: the owner must remove the copy.
        say!("WARNING: could not remove the audit's working directory {kept} (a copy of the stand-in data): {e}");
    }
    let Some(joined) = outcome else { bail!("stopped: the audit's working files are removed") };
    let report = joined??;
    say!(
        "audit {} ({}): {} canaries ({} included), {} of {} guesses right: ε ≥ {:.3} at {:.0}% confidence, claimed ε = {} (δ = {:e}): {}",
        report.job_id,
        report.generator,
        report.canaries,
        report.included,
        report.correct,
        report.guesses,
        report.epsilon_lower_bound,
        100.0 * (1.0 - report.significance),
        report.claimed_epsilon,
        report.delta,
        if report.passed { "consistent with the claim" } else { "THE CLAIM IS FALSIFIED" }
    );
    print_json(&serde_json::to_value(&report)?);
    Ok(if report.passed { ExitCode::SUCCESS } else { ExitCode::from(EXIT_AUDIT_FAILED) })
}
