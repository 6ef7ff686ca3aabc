//! `rhosynth`: the coordinator's command line.
//!
//! Every command prints one JSON object as its last line on stdout, so scripts can read
//! results without parsing prose; logs go to stderr (`RUST_LOG` sets the level).

/// `eprintln!` that never fails: a reader of stderr that has gone (a closed pipe: the
/// program that started this one ended) is no reason to stop, let alone mid-job.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "rhosynth", version, about = "Differentially private synthetic data at cluster scale")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the built-in demo: simulated ICU vitals, 2 local workers, output under ./rhosynth-out/.
    Demo(commands::job::DemoArgs),
    /// Write a simulated ICU cohort (the demo's input) of any size, e.g. for benchmarks.
    Simulate(commands::job::SimulateArgs),
    /// Run a job on a standalone cluster: the coordinator and N local workers in this process.
    Run(commands::job::RunArgs),
    /// Serve the coordinator over gRPC (workers connect with `rhosynth-worker`).
    Serve(commands::job::ServeArgs),
    /// Submit a job to a running coordinator and follow it to the end.
    Submit(commands::job::SubmitArgs),
    /// Data owner's check: read a job's input with its schema and report every row that
    /// breaks it (file, column, row; never the value). Row-level output: keep it private.
    Validate(commands::validate::ValidateArgs),
    /// Draft a job spec from a CSV file: domains released with DP (--epsilon, charged), or
    /// the data's own, marked private.
    #[command(subcommand)]
    Schema(commands::schema::SchemaCommand),
    /// Empirical privacy audit: the job run once with canaries, and the ε its release proves
    /// (exit status 4 when that exceeds the claim). Writes only its report and own ledger.
    Audit(commands::audit::AuditArgs),
    /// Evaluate synthetic data against real training and held-out data (HTML + JSON report).
    Eval(commands::eval::EvalArgs),
    /// Create a submitter bearer token: the token for the submitter, its hash for `serve
    /// --submitters`.
    Token,
    /// Privacy calculators: ε for a noise level, noise for a target ε, PATE's GNMax.
    #[command(subcommand)]
    Privacy(commands::privacy::PrivacyCommand),
    /// The per-dataset privacy ledger: create it, inspect it, test a charge against it.
    #[command(subcommand)]
    Ledger(commands::ledger::LedgerCommand),
}

fn main() -> ExitCode {
    rhosynth_shared::logging::init();
    rhosynth_shared::process::private_files();
    if let Err(e) = rhosynth_shared::process::refuse_legacy_environment() {
        say!("error: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => commands::job::demo(args),
        Command::Simulate(args) => commands::job::simulate_command(args),
        Command::Run(args) => commands::job::run(args),
        Command::Serve(args) => commands::job::serve_command(args),
        Command::Submit(args) => commands::job::submit(args),
        Command::Validate(args) => commands::validate::run(args),
        Command::Schema(cmd) => commands::schema::run(cmd),
        Command::Audit(args) => commands::audit::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Token => commands::token::run(),
        Command::Privacy(cmd) => commands::privacy::run(cmd),
        Command::Ledger(cmd) => commands::ledger::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            say!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
