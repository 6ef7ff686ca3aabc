//! `rhosynth validate`: the data owner's check of a job's input against its schema.
//!
//! It reads every input file of the spec as a job would (the same reader and encoder) and
//! reports where rows break the declared schema: file, column, row and what is wrong,
//! never the value. That report is row-level and private — it says, for instance, whether
//! and where a row holds a category the spec does not declare — so it is printed locally
//! only, for whoever may read the data. A job gives its submitter no such detail: it
//! fails with a generic "input does not match the declared schema", and the row-level
//! error goes to the coordinator's operator log. This command touches no ledger, scratch
//! store or output.

use std::process::ExitCode;

use clap::Args;
use rhosynth_shared::data::DataError;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::input;
use rhosynth_shared::spec::JobSpec;
use serde_json::json;

use super::print_json;

#[derive(Args)]
pub struct ValidateArgs {
    /// The job spec (TOML): its input files are checked against its schema.
    spec: String,
    /// Report at most this many problems (`truncated` says when there were more).
    #[arg(long, default_value_t = 100)]
    max_problems: usize,
}

/// A problem as JSON: file, column and row where known, and what is wrong.
fn problem_json(problem: &DataError) -> serde_json::Value {
    match problem {
        DataError::Value { file, column, row, reason } => {
            json!({"file": file, "column": column, "row": row, "message": reason})
        }
        DataError::MissingColumn { file, column } => json!({
            "file": file,
            "column": column,
            "row": null,
            "message": "declared in the job spec but not present in the file",
        }),
        DataError::DuplicateColumn { file, column } => json!({
            "file": file,
            "column": column,
            "row": null,
            "message": "the header names this column more than once",
        }),
        DataError::Read { file, message } => json!({"file": file, "column": null, "row": null, "message": message}),
        DataError::Internal(message) => json!({"file": null, "column": null, "row": null, "message": message}),
    }
}

pub fn run(args: ValidateArgs) -> anyhow::Result<ExitCode> {
    let spec = JobSpec::load(&args.spec)?;
    spec.require_input()?;
    let domain = Domain::from_spec(&spec);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let validation = runtime.block_on(input::validate(&spec, &domain, args.max_problems));
    for problem in &validation.problems {
        say!("{problem}");
    }
    if validation.truncated {
        say!("… more problems not shown (--max-problems {})", args.max_problems);
    }
    let valid = validation.is_valid();
    say!(
        "{}: {} file(s), {} rows read, {}. This report is row-level and private: keep it with the data.",
        args.spec,
        validation.files,
        validation.rows,
        if valid { "the input matches the declared schema" } else { "the input does NOT match the declared schema" }
    );
    print_json(&json!({
        "valid": valid,
        "files": validation.files,
        "rows": validation.rows,
        "problems": validation.problems.iter().map(problem_json).collect::<Vec<_>>(),
        "truncated": validation.truncated,
    }));
    Ok(if valid { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
