//! `rhosynth eval`: fidelity, longitudinal and empirical-privacy report for synthetic data;
//! for a database (a spec with `[[tables]]`), per-table, cross-table and per-unit measures.

use std::process::ExitCode;

use clap::Args;
use rhosynth_shared::data::database::{Database, Layout};
use rhosynth_shared::eval;
use rhosynth_shared::eval::database;
use rhosynth_shared::spec::JobSpec;

use super::print_json;

#[derive(Args)]
pub struct EvalArgs {
    /// The job spec: schema, privacy unit, ordering (`order_by`) and target.
    #[arg(long)]
    spec: String,
    /// Real training data (default: the spec's input). A database's: `TABLE=URL`, every
    /// table at least once.
    #[arg(long)]
    train: Vec<String>,
    /// Real held-out data. A database's: `TABLE=URL`, every table at least once.
    #[arg(long, required = true)]
    test: Vec<String>,
    /// Synthetic data: a rhosynth output prefix (with its manifest) or a file. A database's:
    /// its release prefix, or `TABLE=URL` for every table.
    #[arg(long, required = true)]
    synthetic: Vec<String>,
    /// A database's per-unit label for train-on-synthetic, test-on-real:
    /// `TABLE.COLUMN=CATEGORY`, true of a unit when any of its rows of the table holds it
    /// (e.g. `admissions.outcome=died`).
    #[arg(long)]
    label: Option<String>,
    /// Where to write report.json and report.html (path or URL): an operator-only location,
    /// never the synthetic output or any prefix under a release (refused). The report is not
    /// differentially private.
    #[arg(long)]
    out: String,
}

pub fn run(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let spec = JobSpec::load(&args.spec)?;
    if !spec.tables.is_empty() {
        return run_database(&spec, args);
    }
    anyhow::ensure!(
        args.label.is_none(),
        "--label is for a database (a spec with [[tables]]); this spec's target is its label"
    );
    let [synthetic] = args.synthetic.as_slice() else {
        anyhow::bail!("--synthetic names one table's release or file (several are for a database's tables)");
    };
    let train = if args.train.is_empty() { spec.input.urls.clone() } else { args.train };
    anyhow::ensure!(!train.is_empty(), "no training files: the spec has no [input] urls and --train is not given");
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = runtime.block_on(eval::run(&spec, &train, &args.test, synthetic, &args.out))?;
    say!(
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
        say!("Sampled under the evaluation's caps: {}.", sampled.join("; "));
    }
    say!("{}", eval::NOTICE);
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

/// A database's evaluation: a line per table, then the per-unit utility.
fn run_database(spec: &JobSpec, args: EvalArgs) -> anyhow::Result<ExitCode> {
    let layout = Layout::of(&Database::of_spec(spec));
    let train = if args.train.is_empty() {
        database::spec_files(spec)
    } else {
        database::files_by_table(&layout, "train", &args.train)?
    };
    let test = database::files_by_table(&layout, "test", &args.test)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let limits = eval::EvalLimits::default();
    let report = runtime.block_on(database::run(
        spec,
        &train,
        &test,
        &args.synthetic,
        args.label.as_deref(),
        &args.out,
        &limits,
    ))?;
    let mut tables = Vec::new();
    for t in &report.tables {
        let children: Vec<String> = t
            .children
            .iter()
            .map(|c| format!(", {} per row TVD {:.3} (train {:.3})", c.child, c.tvd.synthetic, c.tvd.train))
            .collect();
        let cross = t.cross_mean();
        say!(
            "{}: {:.2}% with parent, HIST {:.4}{}{}",
            t.name,
            100.0 * t.integrity.with_parent,
            t.fidelity.hist,
            children.concat(),
            cross.map_or(String::new(), |(s, r)| format!(", cross-table TVD {s:.3} (train {r:.3})"))
        );
        tables.push(serde_json::json!({
            "name": t.name,
            "with_parent": t.integrity.with_parent,
            "hist": t.fidelity.hist,
            "children": t.children.iter().map(|c| serde_json::json!({"child": c.child, "tvd": c.tvd.synthetic, "train": c.tvd.train})).collect::<Vec<_>>(),
            "cross_tvd": cross.map(|c| c.0),
            "cross_tvd_train": cross.map(|c| c.1),
        }));
    }
    let mut utility = Vec::new();
    if let Some(u) = &report.utility {
        let scores: Vec<String> =
            u.scores.iter().map(|s| format!("{} on {} {:.3}", s.model, s.trained_on, s.roc_auc)).collect();
        say!("TSTR ROC-AUC ({}): {}", u.target, scores.join(", "));
        utility = u
            .scores
            .iter()
            .map(|s| serde_json::json!({"model": s.model, "trained_on": s.trained_on, "roc_auc": s.roc_auc}))
            .collect();
    }
    let links = report.links_error();
    if let Some((synthetic, train)) = links {
        say!("Links of a row to its children's summaries: mean absolute difference {synthetic:.3} (train {train:.3}).");
    }
    let p = &report.privacy;
    say!(
        "Per patient: DCR median synthetic {:.4} vs held-out {:.4}; exact copies {:.4}; MIA AUC {:.3}.",
        p.dcr_synthetic_median,
        p.dcr_holdout_median,
        p.exact_copy_rate,
        p.membership_auc
    );
    say!("Report: {}/report.html. {}", args.out, eval::NOTICE);
    print_json(&serde_json::json!({
        "out": args.out,
        "tables": tables,
        "utility": utility,
        "links_error": links.map(|(synthetic, train)| serde_json::json!({"synthetic": synthetic, "train": train})),
        "dcr_synthetic_median": p.dcr_synthetic_median,
        "dcr_holdout_median": p.dcr_holdout_median,
        "exact_copy_rate": p.exact_copy_rate,
        "membership_auc": p.membership_auc,
        "differentially_private": false,
        "sampled": report.sampling.iter().any(|u| u.sampled),
    }));
    Ok(ExitCode::SUCCESS)
}
