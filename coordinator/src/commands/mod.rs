//! One module per command group.

pub mod eval;
pub mod job;
pub mod ledger;
pub mod privacy;
pub mod schema;
pub mod token;
pub mod validate;

/// Exit status when the privacy ledger refuses a job (its budget would be exceeded).
pub const EXIT_BUDGET_REFUSED: u8 = 3;

/// Prints the command's result: one JSON object on the last line of stdout.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}
