//! `rhosynth eval`: fidelity, longitudinal and empirical-privacy report for synthetic data.

use std::process::ExitCode;

use clap::Args;
use rhosynth_shared::eval;
use rhosynth_shared::spec::JobSpec;

use super::print_json;

#[derive(Args)]
pub struct EvalArgs {
    /// The job spec: schema, privacy unit, ordering (`order_by`) and target.
    #[arg(long)]
    spec: String,
    /// Real training data (default: the spec's input).
    #[arg(long)]
    train: Vec<String>,
    /// Real held-out data.
    #[arg(long, required = true)]
    test: Vec<String>,
    /// Synthetic data: a rhosynth output prefix (with its manifest) or a file.
    #[arg(long)]
    synthetic: String,
    /// Where to write report.json and report.html (path or URL): an operator-only location,
    /// never the synthetic output or any prefix under a release (refused). The report is not
    /// differentially private.
    #[arg(long)]
    out: String,
}

pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let spec = JobSpec::load(&args.spec)?;
    let train = if args.train.is_empty() { spec.input.urls.clone() } else { args.train };
    anyhow::ensure!(!train.is_empty(), "no training files: the spec has no [input] urls and --train is not given");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(eval::run(&spec, &train, &args.test, &args.synthetic, &args.out))?;
    eprintln!(
        "HIST {:.4}, Pair {:.4}, Triple {:.4}, CorAcc {:.4}; DCR median synthetic {:.4} vs held-out {:.4}; MIA AUC {:.3}. Report: {}/report.html",
        report.fidelity.hist,
        report.fidelity.pair,
        report.fidelity.triple,
        report.fidelity.cor_acc,
        report.privacy.dcr_synthetic_median,
        report.privacy.dcr_holdout_median,
        report.privacy.membership_auc,
        args.out
    );
    let sampled: Vec<String> = report
        .sampling
        .iter()
        .filter(|u| u.sampled)
        .map(|u| format!("{} ({}): {} of {}", u.metric, u.table, u.used, u.available))
        .collect();
    if !sampled.is_empty() {
        eprintln!("Sampled under the evaluation's caps: {}.", sampled.join("; "));
    }
    eprintln!("{}", eval::NOTICE);
    print_json(&serde_json::json!({
        "out": args.out,
        "hist": report.fidelity.hist,
        "pair": report.fidelity.pair,
        "triple": report.fidelity.triple,
        "cor_acc": report.fidelity.cor_acc,
        "dcr_synthetic_median": report.privacy.dcr_synthetic_median,
        "dcr_holdout_median": report.privacy.dcr_holdout_median,
        "exact_copy_rate": report.privacy.exact_copy_rate,
        "membership_auc": report.privacy.membership_auc,
        "longitudinal": report.longitudinal.is_some(),
        "differentially_private": false,
        "sampled": report.sampling.iter().any(|u| u.sampled),
    }));
    Ok(ExitCode::SUCCESS)
}
