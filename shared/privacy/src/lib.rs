//! What only the coordinator may do with private data's consequences: draw privacy noise
//! ([`release`]) and record what it costs ([`ledger`]). Workers do not depend on this crate,
//! so no code that runs beside the rows can draw noise or touch a ledger.

pub mod ledger;
pub mod release;
pub mod summary;
