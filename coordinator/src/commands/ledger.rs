//! `rhosynth ledger …`: create, inspect and test charges against a dataset's privacy ledger.

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use rhosynth_privacy::ledger::{Budget, ChargeRequest, Ledger, LedgerError, Spent, canonical_input};
use rhosynth_privacy::summary::{LedgerSummary, Reader};
use rhosynth_proto::GetLedgerRequest;
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions};
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
use rhosynth_shared::storage;
use serde_json::json;

use super::client::SubmitterArgs;
use super::{EXIT_BUDGET_REFUSED, print_json};

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// Create the ledger of a dataset with its total budget (fails if one exists).
    Init {
        #[command(flatten)]
        at: LedgerAt,
        /// Total ε the dataset may ever spend.
        #[arg(long)]
        epsilon: f64,
        /// Total δ the dataset may ever spend.
        #[arg(long)]
        delta: f64,
        /// Neighbouring relation every charge must be analysed under.
        #[arg(long, value_enum, default_value = "add-remove")]
        adjacency: AdjacencyArg,
        /// The dataset's input (repeatable): every charge must read exactly these files.
        /// Absent: the first charge binds the ledger to what it reads.
        #[arg(long)]
        input: Vec<String>,
    },
    /// Bind the ledger to its input's new place (the data moved): later charges must read
    /// these files. The binding is an entry of the ledger, kept with the others.
    Bind {
        #[command(flatten)]
        at: LedgerAt,
        /// The dataset's input (repeatable).
        #[arg(long, required = true)]
        input: Vec<String>,
    },
    /// Print the budget, every charge and the total spent: the ledger itself (`--store`, the
    /// data owner's), or a served dataset's as its coordinator shows it to this submitter
    /// (other submitters' charges by their cost alone).
    Show {
        /// Dataset id, as declared in job specs.
        #[arg(long)]
        dataset: String,
        /// Ledger store: a path, file://… or s3://bucket/prefix (the coordinator's options
        /// are then unused). Absent: ask the coordinator.
        #[arg(long)]
        store: Option<String>,
        #[command(flatten)]
        served: SubmitterArgs,
    },
    /// Price a job and say whether the ledger would admit it; writes nothing.
    ChargeDryRun {
        #[command(flatten)]
        at: LedgerAt,
        /// Job id to report.
        #[arg(long, default_value = "dry-run")]
        job_id: String,
        /// rdp or pld.
        #[arg(long, default_value = "rdp")]
        accountant: Accountant,
        /// δ at which the job states its ε.
        #[arg(long)]
        delta: f64,
        /// A DP-SGD run: Poisson rate …
        #[arg(long = "q", requires_all = ["sigma", "steps"], conflicts_with = "mechanism")]
        q: Option<f64>,
        /// … noise multiplier …
        #[arg(long)]
        sigma: Option<f64>,
        /// … and steps.
        #[arg(long)]
        steps: Option<u64>,
        /// Or any mechanism as JSON (repeatable), e.g.
        /// '{"kind":"gn_max","sigma":40,"classes":2,"queries":1000}'.
        #[arg(long)]
        mechanism: Vec<String>,
    },
}

/// Where a dataset's ledger lives.
#[derive(Args)]
pub struct LedgerAt {
    /// Dataset id, as declared in job specs (e.g. mimic-iv-ed-2026).
    #[arg(long)]
    dataset: String,
    /// Ledger store: a path, file://… or s3://bucket/prefix.
    #[arg(long)]
    store: String,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum AdjacencyArg {
    AddRemove,
    Substitution,
}

impl From<AdjacencyArg> for Adjacency {
    fn from(a: AdjacencyArg) -> Self {
        match a {
            AdjacencyArg::AddRemove => Adjacency::AddRemove,
            AdjacencyArg::Substitution => Adjacency::Substitution,
        }
    }
}

pub fn run(cmd: LedgerCommand) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run_async(cmd))
}

async fn open(at: &LedgerAt) -> anyhow::Result<Ledger> {
    let location = storage::open(&at.store)?;
    Ok(Ledger::open(&location, &at.dataset).await?)
}

/// A ledger total and what each accountant gives for it.
fn describe(spent: &Spent) -> String {
    let by = |name, epsilon: Option<f64>| epsilon.map_or(format!("{name} n/a"), |e| format!("{name} ε = {e:.6}"));
    format!(
        "ε = {:.6} at δ = {:e} by {} ({}, {})",
        spent.epsilon,
        spent.delta,
        spent.accountant,
        by("RDP", spent.rdp_epsilon),
        by("PLD", spent.pld_epsilon)
    )
}

/// Prints a summary: a table on stderr (the `input` line under its heading), and its JSON
/// (with `extra`'s fields) on stdout.
fn print_summary(summary: &LedgerSummary, input: Option<String>, extra: serde_json::Value) -> anyhow::Result<()> {
    let LedgerSummary { dataset, budget, adjacency, spent, remaining_epsilon, charges } = summary;
    say!("dataset {dataset} — budget ε = {}, δ = {:e} ({adjacency})", budget.epsilon, budget.delta);
    if let Some(input) = input {
        say!("input: {input}");
    }
    say!("{:>5}  {:<25}  {:<10}  {:<4}  {:>10}  {:<9}  mechanisms", "seq", "time", "job", "acct", "ε (job)", "status");
    for charge in charges {
        let mechanisms: Vec<String> = charge.mechanisms.iter().flatten().map(Mechanism::describe).collect();
        let time = charge.timestamp.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
        say!(
            "{:>5}  {:<25}  {:<10}  {:<4}  {:>10.4}  {:<9}  {}",
            charge.seq,
            time.as_deref().unwrap_or("—"),
            charge.job_id.as_deref().unwrap_or("(not yours)"),
            charge.accountant,
            charge.epsilon,
            format!("{:?}", charge.status).to_lowercase(),
            mechanisms.join("; ")
        );
    }
    say!("spent {}; remaining ε = {remaining_epsilon:.6}", describe(spent));
    let mut shown = serde_json::to_value(summary)?;
    if let (Some(shown), serde_json::Value::Object(extra)) = (shown.as_object_mut(), extra) {
        shown.extend(extra);
    }
    print_json(&shown);
    Ok(())
}

async fn run_async(cmd: LedgerCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        LedgerCommand::Init { at, epsilon, delta, adjacency, input } => {
            if !input.is_empty() {
                canonical_input(&input).map_err(|reason| anyhow::anyhow!("--input: {reason}"))?;
            }
            let location = storage::open(&at.store)?;
            let budget = Budget { epsilon, delta };
            let mut ledger =
                Ledger::init(&location, &at.dataset, budget, adjacency.into(), AccountingOptions::default()).await?;
            if !input.is_empty() {
                ledger.rebind_input(&input).await?;
            }
            say!("created the privacy ledger of '{}' at {} with ε = {epsilon}, δ = {delta}", at.dataset, at.store);
            print_json(&json!({"dataset": ledger.dataset_id(), "store": at.store, "budget": budget,
                "adjacency": ledger.adjacency(), "input": ledger.input()}));
        }
        LedgerCommand::Bind { at, input } => {
            let mut ledger = open(&at).await?;
            let before = ledger.input().map(<[String]>::to_vec);
            ledger.rebind_input(&input).await?;
            say!("the privacy ledger of '{}' is bound to {:?} (was {before:?})", at.dataset, ledger.input());
            print_json(&json!({"dataset": ledger.dataset_id(), "input": ledger.input(), "before": before}));
        }
        LedgerCommand::Show { dataset, store: Some(store), .. } => {
            let ledger = open(&LedgerAt { dataset, store }).await?;
            let summary = LedgerSummary::of(&ledger, Reader::Owner)?;
            let input = ledger.input().map_or("not bound yet".to_string(), |urls| urls.join(", "));
            print_summary(&summary, Some(input), json!({"input": ledger.input(), "entries": ledger.entries().len()}))?;
        }
        LedgerCommand::Show { dataset, store: None, served } => {
            let mut client = served.connect().await?;
            let shown = client
                .get_ledger(GetLedgerRequest { dataset_id: dataset })
                .await
                .map_err(|status| anyhow::anyhow!("the coordinator at {}: {}", served.coordinator, status.message()))?;
            let summary: LedgerSummary = serde_json::from_str(&shown.into_inner().summary_json)
                .context("the coordinator's ledger summary is not one this version reads")?;
            print_summary(&summary, None, json!({}))?;
        }
        LedgerCommand::ChargeDryRun { at, job_id, accountant, delta, q, sigma, steps, mechanism } => {
            let mechanisms = match (q, sigma, steps) {
                (Some(q), Some(sigma), Some(steps)) => vec![Mechanism::dp_sgd(q, sigma, steps)],
                _ if !mechanism.is_empty() => mechanism
                    .iter()
                    .map(|m| serde_json::from_str(m).with_context(|| format!("invalid --mechanism {m}")))
                    .collect::<anyhow::Result<_>>()?,
                _ => bail!("give a DP-SGD run (--q, --sigma, --steps) or --mechanism JSON"),
            };
            let mut ledger = open(&at).await?;
            let request = ChargeRequest { job_id, mechanisms, accountant, delta };
            match ledger.check(&request).await {
                Ok(admission) => {
                    say!(
                        "admitted: costs ε = {:.6} at δ = {:e} ({}); total after {} of ε = {}",
                        admission.cost.epsilon,
                        admission.cost.delta,
                        admission.cost.accountant,
                        describe(&admission.after),
                        admission.budget.epsilon
                    );
                    print_json(&json!({"admitted": true, "cost": admission.cost, "spent_before": admission.before,
                        "spent_after": admission.after, "remaining_epsilon": admission.remaining_epsilon(),
                        "budget": admission.budget}));
                }
                Err(e @ LedgerError::BudgetExceeded { .. }) => {
                    say!("refused: {e}");
                    print_json(&json!({"admitted": false, "reason": e.to_string()}));
                    return Ok(ExitCode::from(EXIT_BUDGET_REFUSED));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
