//! `rhosynth privacy …`: check any accountant number from the command line.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions, Conversion, account, calibrate_sigma};
use rhosynth_shared::accounting::gnmax;
use rhosynth_shared::accounting::mechanism::Mechanism;
use serde_json::json;

use super::print_json;

#[derive(Subcommand)]
pub enum PrivacyCommand {
    /// ε of a DP-SGD run (Poisson rate q, noise multiplier σ, T steps) at δ.
    Epsilon {
        #[command(flatten)]
        accounting: AccountingArgs,
        /// Poisson sampling rate (expected batch size / number of units).
        #[arg(long = "q")]
        q: f64,
        /// Noise multiplier: noise std / clipping norm.
        #[arg(long)]
        sigma: f64,
        /// Number of steps.
        #[arg(long)]
        steps: u64,
        #[arg(long)]
        delta: f64,
    },
    /// Smallest noise multiplier σ for which a DP-SGD run meets (ε, δ).
    Sigma {
        #[command(flatten)]
        accounting: AccountingArgs,
        #[arg(long)]
        epsilon: f64,
        #[arg(long)]
        delta: f64,
        #[arg(long = "q")]
        q: f64,
        #[arg(long)]
        steps: u64,
    },
    /// PATE GNMax: ln Pr[answer ≠ plurality] and the RDP of one answer at an order.
    Gnmax {
        /// Noise std on every vote count.
        #[arg(long)]
        sigma: f64,
        /// Vote histogram, comma-separated (e.g. 95,3,2).
        #[arg(long, value_delimiter = ',', required = true)]
        votes: Vec<f64>,
        /// RDP order α > 1.
        #[arg(long)]
        order: f64,
        /// Answered queries to compose (data-independently) into an ε.
        #[arg(long, requires = "delta")]
        queries: Option<u64>,
        #[arg(long, requires = "queries")]
        delta: Option<f64>,
    },
}

/// Accountant selection shared by the commands that compute ε.
#[derive(Args)]
pub struct AccountingArgs {
    /// rdp or pld.
    #[arg(long, default_value = "rdp")]
    accountant: Accountant,
    /// RDP → (ε, δ) conversion: improved or classic.
    #[arg(long, default_value = "improved", value_parser = parse_conversion)]
    conversion: Conversion,
    /// PLD discretisation interval of privacy-loss values.
    #[arg(long, default_value_t = rhosynth_shared::accounting::accountant::pld::DEFAULT_INTERVAL)]
    pld_interval: f64,
}

impl AccountingArgs {
    fn options(&self) -> AccountingOptions {
        AccountingOptions { conversion: self.conversion, pld_interval: self.pld_interval, ..Default::default() }
    }
}

fn parse_conversion(s: &str) -> Result<Conversion, String> {
    match s {
        "improved" => Ok(Conversion::Improved),
        "classic" => Ok(Conversion::Classic),
        other => Err(format!("unknown conversion {other:?} (use improved or classic)")),
    }
}

pub fn run(cmd: PrivacyCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PrivacyCommand::Epsilon { accounting, q, sigma, steps, delta } => {
            let cost =
                account(&[Mechanism::dp_sgd(q, sigma, steps)], accounting.accountant, delta, &accounting.options())?;
            let mut out = json!({"epsilon": cost.epsilon, "delta": cost.delta, "accountant": cost.accountant});
            if let Some(order) = cost.order {
                out["order"] = json!(order);
            }
            print_json(&out);
        }
        PrivacyCommand::Sigma { accounting, epsilon, delta, q, steps } => {
            let options = accounting.options();
            let sigma = calibrate_sigma(epsilon, delta, accounting.accountant, &options, |s| {
                vec![Mechanism::dp_sgd(q, s, steps)]
            })?;
            let achieved = account(&[Mechanism::dp_sgd(q, sigma, steps)], accounting.accountant, delta, &options)?;
            print_json(
                &json!({"sigma": sigma, "epsilon": achieved.epsilon, "delta": delta, "accountant": accounting.accountant}),
            );
        }
        PrivacyCommand::Gnmax { sigma, votes, order, queries, delta } => {
            let log_q = gnmax::log_q(&votes, sigma)?;
            let dependent = gnmax::rdp_data_dependent(log_q, sigma, order)?;
            let mut out = json!({
                "logq": log_q,
                "rdp_data_independent": gnmax::rdp_data_independent(sigma, order),
                "rdp_data_dependent": dependent,
                "note": "rdp_data_dependent depends on the private votes: an internal diagnostic, not a releasable cost",
            });
            if let (Some(queries), Some(delta)) = (queries, delta) {
                let classes = u32::try_from(votes.len()).context("too many classes")?;
                let cost = account(
                    &[Mechanism::GnMax { sigma, classes, queries }],
                    Accountant::Rdp,
                    delta,
                    &AccountingOptions::default(),
                )?;
                out["epsilon"] = json!(cost.epsilon);
                out["delta"] = json!(delta);
                out["order"] = json!(cost.order);
                out["queries"] = json!(queries);
            }
            print_json(&out);
        }
    }
    Ok(ExitCode::SUCCESS)
}
