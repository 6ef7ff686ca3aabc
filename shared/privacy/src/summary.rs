//! What a reader is shown of a ledger: the budget, the total spent and every charge. The
//! data owner reads it whole (`rhosynth ledger show --store`); a submitter of a served
//! dataset reads it through the coordinator: every charge's cost and status, the job ids
//! and mechanisms of its own charges only (others' are those submitters' business), and no
//! charge's time (a schema draft charges when its read of the data ends, not at a
//! boundary of a schedule, and any charge's time carries the coordinator's load).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use rhosynth_shared::accounting::accountant::Accountant;
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};

use crate::ledger::{Budget, ChargeStatus, EntryBody, Ledger, LedgerError, Spent};

/// A ledger as one reader is shown it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerSummary {
    pub dataset: String,
    pub budget: Budget,
    pub adjacency: Adjacency,
    pub spent: Spent,
    pub remaining_epsilon: f64,
    pub charges: Vec<ChargeSummary>,
}

/// One charge: its cost always; whose it is and what it ran where the reader may know.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChargeSummary {
    pub seq: u64,
    /// `None` for a submitter.
    pub timestamp: Option<DateTime<Utc>>,
    pub status: ChargeStatus,
    /// The accountant that stated the job's own `epsilon` at its `delta`.
    pub accountant: Accountant,
    pub epsilon: f64,
    pub delta: f64,
    /// `None`: not the reader's own charge.
    pub job_id: Option<String>,
    pub mechanisms: Option<Vec<Mechanism>>,
}

/// Who reads a ledger.
pub enum Reader<'a> {
    /// The data owner: everything.
    Owner,
    /// A submitter, whose own jobs `own` tells.
    Submitter { own: &'a dyn Fn(&str) -> bool },
}

impl LedgerSummary {
    /// The summary `reader` is shown.
    pub fn of(ledger: &Ledger, reader: Reader) -> Result<Self, LedgerError> {
        let spent = ledger.spent()?;
        let budget = ledger.budget();
        let charges = ledger
            .charges()
            .into_iter()
            .filter_map(|(entry, status)| {
                let EntryBody::Charge { request, cost } = &entry.body else { return None };
                let (own, timestamp) = match &reader {
                    Reader::Owner => (true, Some(entry.timestamp)),
                    Reader::Submitter { own } => (own(&request.job_id), None),
                };
                Some(ChargeSummary {
                    seq: entry.seq,
                    timestamp,
                    status,
                    accountant: cost.accountant,
                    epsilon: cost.epsilon,
                    delta: cost.delta,
                    job_id: own.then(|| request.job_id.clone()),
                    mechanisms: own.then(|| request.mechanisms.clone()),
                })
            })
            .collect();
        Ok(Self {
            dataset: ledger.dataset_id().to_string(),
            budget,
            adjacency: ledger.adjacency(),
            spent,
            remaining_epsilon: (budget.epsilon - spent.epsilon).max(0.0),
            charges,
        })
    }
}
