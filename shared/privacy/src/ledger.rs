//! The global privacy ledger: one per protected dataset, shared by every job and every
//! scheduled run against it, and the only record of what has been spent.
//!
//! Layout: `<store>/<dataset_id>/entries/<seq, 20 digits>.json`, one object per entry.
//! Entry 0 declares the dataset's total budget; later entries are charges (written
//! *before* a noisy output leaves the coordinator) and release markers. A release marker
//! claims the one release of a charge: the coordinator writes it *before* the first part
//! of the output, and the ledger refuses a second one for the same charge (a second
//! marker found on load makes the ledger corrupt), so neither a racing coordinator nor a
//! resumed copy of a job can release a charged run twice; once the parts are written, the
//! manifest's SHA-256 is recorded before the manifest itself, so a release read back as a
//! reference is known to be the one released. An input entry binds the ledger to the
//! input its charges read (canonical URLs): a charge for another file is refused. Entries are
//! append-only and hash-chained: each object carries the SHA-256 of its own canonical
//! body and of its predecessor's, so a torn, edited or missing entry is detected on load
//! and the ledger refuses to operate until an operator repairs it (fail closed).
//!
//! Concurrency: an entry is written with create-if-absent (`PutMode::Create`, a local
//! hard link or an S3 `If-None-Match: *`). Two coordinators charging at once race for the
//! same sequence number; exactly one wins, the other reloads, re-checks the budget
//! against the new total and retries. A charge is either a whole object or absent, so a
//! writer killed mid-charge leaves a loadable ledger.
//!
//! Composition across jobs: the ledger composes the *mechanisms* of every charge under
//! both accountants — RDP (curves added on the ledger's orders, converted at the budget's
//! δ_B with the ledger's conversion) and PLD (one composition on the ledger's grid, ε at
//! δ_B) — and the dataset's guarantee is (ε, δ_B) with the smaller of the two ε. An
//! accountant that cannot analyse some charged mechanism (a PLD grid too large for a
//! nearly noiseless run) drops out of the total; if neither can, the ledger refuses. A
//! job's `accountant` only decides how its own cost (its receipt and manifest) is stated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use rhosynth_shared::accounting::Budget;
use rhosynth_shared::accounting::PrivacyError;
use rhosynth_shared::accounting::accountant::{
    Accountant, AccountingOptions, Conversion, PrivacyCost, RdpCurve, account, delta_left, rdp_curve,
};
use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism, PldComposition};
use rhosynth_shared::storage::{self, StoreLocation};

/// Version of the on-store format; loading refuses newer ones.
pub const FORMAT_VERSION: u32 = 1;

/// Retries of a charge that lost a race before giving up.
const MAX_ATTEMPTS: usize = 1000;

/// Slack for floating-point noise when comparing a total against the budget.
const BUDGET_SLACK: f64 = 1e-12;

/// What a job asks the ledger to charge: the mechanisms it will run and how to account them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChargeRequest {
    pub job_id: String,
    pub mechanisms: Vec<Mechanism>,
    /// How the job's own cost is computed (the ledger's total uses both accountants).
    pub accountant: Accountant,
    /// δ at which the job states its own ε; the ledger's total is at the budget's δ.
    pub delta: f64,
}

/// One ledger entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EntryBody {
    /// Entry 0: the dataset and its total budget.
    Init {
        dataset_id: String,
        budget: Budget,
        adjacency: Adjacency,
        options: AccountingOptions,
        format_version: u32,
        /// Ledgers written before the rename name it `dpsynth_version` (read, never written).
        #[serde(alias = "dpsynth_version")]
        rhosynth_version: String,
    },
    /// A charge, durable before the charged output is released. `cost` is the job's own,
    /// for the record; the ledger's total composes `request.mechanisms`.
    Charge { request: ChargeRequest, cost: PrivacyCost },
    /// Claims the one release of charge `charge_seq`, to `location`; written before the
    /// first part of its output (free; at most one per charge).
    Release { charge_seq: u64, job_id: String, location: String },
    /// The input the ledger's charges read (canonical URLs, sorted): a dataset's budget
    /// covers the people of one input, so a charge that reads another is refused until an
    /// operator binds the ledger anew (the data moved). The last such entry holds.
    Input { urls: Vec<String> },
    /// The SHA-256 of the manifest completing charge `charge_seq`'s release, written after
    /// its release marker and before the manifest (at most one per charge): a release read
    /// back as a reference must be the one released, manifest and (through it) every part.
    Published { charge_seq: u64, manifest_sha256: String },
}

/// An entry with its place in the chain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub seq: u64,
    pub timestamp: DateTime<Utc>,
    /// SHA-256 of the previous entry's canonical body (`None` for entry 0).
    pub prev_sha256: Option<String>,
    pub body: EntryBody,
}

/// How an entry is stored: the entry plus the hash of its canonical JSON. An entry is
/// read as the JSON written (`Value`) and hashed as such, so its hash does not depend on
/// how today's types spell an old entry's fields.
#[derive(Serialize, Deserialize)]
struct StoredEntry<E = Entry> {
    entry: E,
    sha256: String,
}

/// Whether a charge's output has been released yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChargeStatus {
    /// Durably charged; its release has not been claimed.
    Charged,
    /// Its one release has been claimed (the output may still be being written).
    Released,
}

/// Total spending of a dataset: every charged mechanism composed, at the budget's δ.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spent {
    /// The smaller of the two accountants' totals.
    pub epsilon: f64,
    /// The budget's δ_B.
    pub delta: f64,
    /// The accountant that gave `epsilon`.
    pub accountant: Accountant,
    /// RDP total and its optimal order; `None` when some charged mechanism has no RDP analysis.
    pub rdp_epsilon: Option<f64>,
    pub rdp_order: Option<f64>,
    /// PLD total; `None` when some charged mechanism has no PLD analysis.
    pub pld_epsilon: Option<f64>,
}

impl Spent {
    /// The total under one accountant (`None` when a charge has no analysis under it).
    pub fn under(&self, accountant: Accountant) -> Option<f64> {
        match accountant {
            Accountant::Rdp => self.rdp_epsilon,
            Accountant::Pld => self.pld_epsilon,
        }
    }
}

/// The answer to "may this job run?".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Admission {
    pub cost: PrivacyCost,
    pub before: Spent,
    pub after: Spent,
    pub budget: Budget,
}

impl Admission {
    /// Totals are stated at δ_B, so only ε can exceed the budget.
    pub fn fits(&self) -> bool {
        self.after.epsilon <= self.budget.epsilon + BUDGET_SLACK
    }

    pub fn remaining_epsilon(&self) -> f64 {
        (self.budget.epsilon - self.after.epsilon).max(0.0)
    }
}

/// A durable charge. Only the ledger makes one (after the entry is written), and only a
/// receipt opens the releases it paid for (`release::Releases::paid_by`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChargeReceipt {
    pub seq: u64,
    pub admission: Admission,
    /// Never read from a file (a checkpoint keeps receipts): [`Ledger::resume`] takes them
    /// from the ledger's own entry.
    #[serde(skip)]
    mechanisms: Vec<Mechanism>,
    #[serde(skip)]
    opened: Opened,
}

/// Whether the releases a charge paid for have been opened: shared by a receipt's clones,
/// so one charge opens one allowance (a second would spend the charge again).
#[derive(Clone, Debug, Default)]
struct Opened(Arc<std::sync::atomic::AtomicBool>);

impl PartialEq for Opened {
    /// Receipts compare by what was charged.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl ChargeReceipt {
    /// The mechanisms charged.
    pub fn mechanisms(&self) -> &[Mechanism] {
        &self.mechanisms
    }

    /// `true` the first time only, for this receipt and all its clones.
    pub(crate) fn open(&self) -> bool {
        !self.opened.0.swap(true, std::sync::atomic::Ordering::SeqCst)
    }

    #[cfg(test)]
    pub(crate) fn for_test(mechanisms: Vec<Mechanism>) -> Self {
        let cost = PrivacyCost { accountant: Accountant::Rdp, epsilon: 1.0, delta: 1e-6, order: None, rdp: None };
        let budget = Budget { epsilon: 10.0, delta: 1e-6 };
        let spent = Spent {
            epsilon: 0.0,
            delta: 1e-6,
            accountant: Accountant::Rdp,
            rdp_epsilon: None,
            rdp_order: None,
            pld_epsilon: None,
        };
        let admission = Admission { cost, before: spent, after: spent, budget };
        Self { seq: 1, admission, mechanisms, opened: Opened::default() }
    }
}

/// Ledger failures. Every refusal leaves the ledger unchanged.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error(
        "privacy budget exceeded for dataset '{dataset_id}': job '{job_id}' costs ε = {cost:.6} ({accountant}); \
         spent so far ε = {spent:.6}, after this job ε = {after:.6} ({after_accountant}), \
         but the dataset budget is ε = {budget_epsilon}, δ = {budget_delta:e}. Nothing was charged."
    )]
    BudgetExceeded {
        dataset_id: String,
        job_id: String,
        accountant: Accountant,
        cost: f64,
        spent: f64,
        after: f64,
        /// The accountant that gave the total after this job.
        after_accountant: Accountant,
        budget_epsilon: f64,
        budget_delta: f64,
    },
    #[error(
        "charge {charge_seq} of dataset '{dataset_id}' was already released (to {location_of_first}); \
         a charge is released at most once"
    )]
    AlreadyReleased { dataset_id: String, charge_seq: u64, location_of_first: String },
    #[error("no privacy ledger for dataset '{dataset_id}' at {url}: create it with `rhosynth ledger init`")]
    NotInitialised { dataset_id: String, url: String },
    #[error("a privacy ledger for dataset '{dataset_id}' already exists at {url}")]
    AlreadyExists { dataset_id: String, url: String },
    #[error(
        "dataset '{dataset_id}' already has a privacy ledger at {legacy}, the default location before the project \
         was renamed: a second ledger at {url} would give the dataset a second budget. Name {legacy} as the ledger \
         (--ledger or [privacy] ledger), or move it to {url}."
    )]
    LegacyExists { dataset_id: String, url: String, legacy: String },
    #[error(
        "the privacy ledger of dataset '{dataset_id}' is bound to the input {bound:?}, not {given:?}: a dataset's \
         budget covers the people of its own input. If the data moved, the operator binds the ledger to its new \
         place with `rhosynth ledger bind`; other data is another dataset, with a ledger of its own."
    )]
    OtherInput { dataset_id: String, bound: Vec<String>, given: Vec<String> },
    #[error(
        "the privacy ledger of dataset '{dataset_id}' holds charges but records no input: the operator binds it to \
         the files its charges read with `rhosynth ledger bind --input …` (ledgers made before inputs were recorded)"
    )]
    Unbound { dataset_id: String },
    #[error("the input of dataset '{dataset_id}': {reason}")]
    InvalidInput { dataset_id: String, reason: String },
    #[error("charge {charge_seq}'s release is not claimed, or its manifest is already recorded")]
    NotPublishable { charge_seq: u64 },
    #[error("privacy ledger object {object} is corrupt: {reason}. The ledger refuses to operate until it is repaired.")]
    Corrupt { object: String, reason: String },
    #[error("invalid dataset id {0:?}: use letters, digits, '.', '_' and '-'")]
    InvalidDatasetId(String),
    #[error("mechanism not allowed on this ledger: {0}")]
    Mechanism(String),
    #[error(transparent)]
    Privacy(#[from] PrivacyError),
    #[error("gave up after {0} conflicting concurrent writes")]
    Contention(usize),
    #[error("privacy ledger storage error at {object}: {source}")]
    Store { object: String, source: object_store::Error },
}

/// A dataset's ledger, loaded and verified.
pub struct Ledger {
    store: Arc<dyn ObjectStore>,
    dir: Path,
    url: String,
    entries: Vec<Entry>,
    hashes: Vec<String>,
    /// Charge seq → seq of its release marker.
    releases: HashMap<u64, u64>,
    /// Charge seq → the SHA-256 of its release's manifest.
    published: HashMap<u64, String>,
    /// The input this handle's next charge reads, to bind an unbound ledger to with it.
    reading: Option<Vec<String>>,
    /// Totals of the loaded charges; behind a lock so that `spent(&self)` can extend it.
    cache: Mutex<Option<Cache>>,
}

/// Every charged mechanism composed under both accountants. An accountant that cannot
/// analyse one of them is out for good (`Err` says why); the other still bounds the total.
#[derive(Clone)]
struct Totals {
    rdp: Result<RdpCurve, String>,
    pld: Result<PldComposition, String>,
    /// δ the charged mechanisms add outright (partition selection's thresholds).
    added_delta: f64,
}

impl Totals {
    fn new(options: &AccountingOptions) -> Self {
        Self {
            rdp: Ok(RdpCurve::zero(&options.orders)),
            pld: Ok(PldComposition::new(options.pld_interval)),
            added_delta: 0.0,
        }
    }

    fn add(&mut self, mechanisms: &[Mechanism], orders: &[f64]) {
        self.added_delta += mechanisms.iter().map(Mechanism::added_delta).sum::<f64>();
        if let Ok(curve) = &self.rdp {
            self.rdp = rdp_curve(mechanisms, orders).and_then(|c| curve.compose(&c)).map_err(|e| e.to_string());
        }
        if let Ok(pld) = &mut self.pld
            && let Err(e) = mechanisms.iter().try_for_each(|m| m.compose_into(pld))
        {
            self.pld = Err(e.to_string());
        }
    }

    /// The total at δ_B: the smaller ε of the accountants that can analyse every charge.
    fn spent(&self, budget: Budget, conversion: Conversion) -> Result<Spent, LedgerError> {
        let delta = delta_left(self.added_delta, budget.delta)?;
        let rdp = self.rdp.as_ref().ok().map(|c| c.epsilon(delta, conversion)).transpose()?;
        let pld = self.pld.as_ref().ok().map(|c| c.clone().epsilon(delta)).transpose()?;
        let candidates = [rdp.map(|r| (r.epsilon, Accountant::Rdp)), pld.map(|p| (p, Accountant::Pld))];
        let Some((epsilon, accountant)) = candidates.into_iter().flatten().min_by(|a, b| a.0.total_cmp(&b.0)) else {
            return Err(PrivacyError::Unsupported(format!(
                "no accountant can compose this dataset's charges (RDP: {}; PLD: {})",
                self.rdp.as_ref().err().map_or("", String::as_str),
                self.pld.as_ref().err().map_or("", String::as_str)
            ))
            .into());
        };
        Ok(Spent {
            epsilon,
            delta: budget.delta,
            accountant,
            rdp_epsilon: rdp.map(|r| r.epsilon),
            rdp_order: rdp.and_then(|r| r.order.is_finite().then_some(r.order)),
            pld_epsilon: pld,
        })
    }
}

/// [`Totals`] of the first `entries` entries, and their [`Spent`] once computed. The ledger
/// is append-only, so later checks compose only what was appended since.
struct Cache {
    entries: usize,
    totals: Totals,
    spent: Option<Spent>,
}

impl Cache {
    fn spent(&mut self, budget: Budget, conversion: Conversion) -> Result<Spent, LedgerError> {
        let spent = match self.spent {
            Some(spent) => spent,
            None => self.totals.spent(budget, conversion)?,
        };
        self.spent = Some(spent);
        Ok(spent)
    }
}

fn valid_dataset_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        && !id.starts_with('.')
}

/// The directory a local ledger under `./rhosynth-out/` had before the project was renamed
/// (`./dpsynth-out/`), where a dataset's ledger may already be (read, never written).
fn legacy_default(url: &str) -> Option<std::path::PathBuf> {
    let (scheme, path) = storage::canonical_url(url);
    let path = std::path::Path::new(&path);
    let renamed = path.components().any(|c| c.as_os_str() == "rhosynth-out");
    (scheme == "file" && renamed).then(|| {
        path.components()
            .map(|c| if c.as_os_str() == "rhosynth-out" { "dpsynth-out".as_ref() } else { c.as_os_str() })
            .collect()
    })
}

fn canonical_sha256(entry: &serde_json::Value) -> Result<String, serde_json::Error> {
    // A `Value`'s keys are sorted: the hash does not depend on field order.
    let bytes = serde_json::to_vec(entry)?;
    Ok(format!("{:x}", Sha256::digest(&bytes)))
}

impl Ledger {
    /// Creates the ledger of `dataset_id` under `location` with its total budget.
    pub async fn init(
        location: &StoreLocation,
        dataset_id: &str,
        budget: Budget,
        adjacency: Adjacency,
        options: AccountingOptions,
    ) -> Result<Self, LedgerError> {
        let valid = budget.epsilon > 0.0 && budget.epsilon.is_finite() && (0.0..1.0).contains(&budget.delta);
        if !valid {
            return Err(PrivacyError::InvalidParameter(format!(
                "budget needs ε > 0 and δ in [0, 1), got ε = {}, δ = {}",
                budget.epsilon, budget.delta
            ))
            .into());
        }
        let mut ledger = Self::handle(location, dataset_id)?;
        if let Some(legacy) = legacy_default(&location.url).filter(|dir| dir.join(dataset_id).join("entries").is_dir())
        {
            let (url, legacy) = (location.url.clone(), legacy.display().to_string());
            return Err(LedgerError::LegacyExists { dataset_id: dataset_id.to_string(), url, legacy });
        }
        let body = EntryBody::Init {
            dataset_id: dataset_id.to_string(),
            budget,
            adjacency,
            options,
            format_version: FORMAT_VERSION,
            rhosynth_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        if !ledger.try_append(body).await? {
            return Err(LedgerError::AlreadyExists { dataset_id: dataset_id.to_string(), url: location.url.clone() });
        }
        Ok(ledger)
    }

    /// Loads and verifies the ledger of `dataset_id` under `location`.
    pub async fn open(location: &StoreLocation, dataset_id: &str) -> Result<Self, LedgerError> {
        let mut ledger = Self::handle(location, dataset_id)?;
        ledger.refresh().await?;
        if ledger.entries.is_empty() {
            return Err(LedgerError::NotInitialised { dataset_id: dataset_id.to_string(), url: location.url.clone() });
        }
        Ok(ledger)
    }

    fn handle(location: &StoreLocation, dataset_id: &str) -> Result<Self, LedgerError> {
        if !valid_dataset_id(dataset_id) {
            return Err(LedgerError::InvalidDatasetId(dataset_id.to_string()));
        }
        Ok(Self {
            store: location.store.clone(),
            dir: location.child(dataset_id).join("entries"),
            url: location.url.clone(),
            entries: Vec::new(),
            hashes: Vec::new(),
            releases: HashMap::new(),
            published: HashMap::new(),
            reading: None,
            cache: Mutex::new(None),
        })
    }

    fn object_path(&self, seq: u64) -> Path {
        self.dir.clone().join(format!("{seq:020}.json").as_str())
    }

    /// Reads entries written since the last load, verifying each link of the chain.
    pub async fn refresh(&mut self) -> Result<(), LedgerError> {
        let store_err = |object: &Path| {
            let object = object.to_string();
            move |source| LedgerError::Store { object, source }
        };
        let mut names: Vec<Path> = self
            .store
            .list(Some(&self.dir))
            .map_ok(|meta| meta.location)
            .try_collect()
            .await
            .map_err(store_err(&self.dir))?;
        names.sort();
        for (index, name) in names.iter().enumerate() {
            let expected = self.object_path(index as u64);
            if *name != expected {
                return Err(LedgerError::Corrupt {
                    object: name.to_string(),
                    reason: format!("unexpected object; entry {expected} is missing or misnamed"),
                });
            }
        }
        for (seq, path) in names.iter().enumerate().skip(self.entries.len()) {
            let bytes = self.store.get(path).await.map_err(store_err(path))?.bytes().await.map_err(store_err(path))?;
            self.verify_and_push(seq as u64, path, &bytes)?;
        }
        Ok(())
    }

    fn verify_and_push(&mut self, seq: u64, path: &Path, bytes: &[u8]) -> Result<(), LedgerError> {
        let corrupt = |reason: String| LedgerError::Corrupt { object: path.to_string(), reason };
        let stored: StoredEntry<serde_json::Value> = serde_json::from_slice(bytes)
            .map_err(|e| corrupt(format!("unreadable (torn or truncated write?): {e}")))?;
        let hash = canonical_sha256(&stored.entry).map_err(|e| corrupt(e.to_string()))?;
        if hash != stored.sha256 {
            return Err(corrupt("checksum mismatch: the entry was altered after it was written".into()));
        }
        let entry: Entry = serde_json::from_value(stored.entry).map_err(|e| corrupt(format!("unreadable: {e}")))?;
        if entry.seq != seq {
            return Err(corrupt(format!("records sequence number {} at position {seq}", entry.seq)));
        }
        if entry.prev_sha256.as_ref() != self.hashes.last() {
            return Err(corrupt("does not chain to the previous entry".into()));
        }
        match (&entry.body, seq) {
            (EntryBody::Init { format_version, .. }, 0) if *format_version > FORMAT_VERSION => {
                return Err(corrupt(format!("written by a newer rhosynth (format {format_version})")));
            }
            (EntryBody::Init { .. }, 0) => {}
            (_, 0) => {
                return Err(corrupt("first entry is not the ledger's initialisation".into()));
            }
            (EntryBody::Init { .. }, _) => {
                return Err(corrupt("a second initialisation entry".into()));
            }
            (EntryBody::Release { charge_seq, .. }, _) => {
                let charged =
                    self.entries.get(*charge_seq as usize).map(|e| matches!(e.body, EntryBody::Charge { .. }));
                if charged != Some(true) {
                    return Err(corrupt(format!("release refers to {charge_seq}, which is not a charge")));
                }
                if let Some(first) = self.releases.get(charge_seq) {
                    return Err(corrupt(format!(
                        "a second release of charge {charge_seq} (the first is entry {first})"
                    )));
                }
            }
            (EntryBody::Published { charge_seq, .. }, _) => {
                if !self.releases.contains_key(charge_seq) {
                    return Err(corrupt(format!("publishes charge {charge_seq}, whose release was not claimed")));
                }
                if self.published.contains_key(charge_seq) {
                    return Err(corrupt(format!("a second manifest for charge {charge_seq}")));
                }
            }
            (EntryBody::Input { .. }, _) => {}
            (EntryBody::Charge { request, .. }, _) => {
                // A charge priced before its mechanism's map refused this adjacency (GNMax on
                // a substitution ledger, until 2026-11) would be composed below its cost.
                let adjacency = self.adjacency();
                if let Some(m) = request.mechanisms.iter().find(|m| !m.supports(adjacency)) {
                    return Err(corrupt(format!(
                        "charges {}, which is not analysed under this ledger's adjacency ({adjacency}): the total \
                         would understate what was spent",
                        m.describe()
                    )));
                }
            }
        }
        match &entry.body {
            EntryBody::Release { charge_seq, .. } => {
                self.releases.insert(*charge_seq, seq);
            }
            EntryBody::Published { charge_seq, manifest_sha256 } => {
                self.published.insert(*charge_seq, manifest_sha256.clone());
            }
            _ => {}
        }
        self.entries.push(entry);
        self.hashes.push(hash);
        Ok(())
    }

    /// Writes the next entry if nobody else has; `false` when another writer got there first.
    async fn try_append(&mut self, body: EntryBody) -> Result<bool, LedgerError> {
        let seq = self.entries.len() as u64;
        let entry = Entry { seq, timestamp: Utc::now(), prev_sha256: self.hashes.last().cloned(), body };
        let path = self.object_path(seq);
        let corrupt = |e: serde_json::Error| LedgerError::Corrupt { object: path.to_string(), reason: e.to_string() };
        let sha256 = canonical_sha256(&serde_json::to_value(&entry).map_err(corrupt)?).map_err(corrupt)?;
        let bytes = serde_json::to_vec_pretty(&StoredEntry { entry, sha256 }).map_err(corrupt)?;
        let options = PutOptions { mode: PutMode::Create, ..Default::default() };
        match self.store.put_opts(&path, PutPayload::from(bytes.clone()), options).await {
            Ok(_) => {
                self.verify_and_push(seq, &path, &bytes)?;
                Ok(true)
            }
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(source) => Err(LedgerError::Store { object: path.to_string(), source }),
        }
    }

    fn init_entry(&self) -> (&str, Budget, Adjacency, &AccountingOptions) {
        match &self.entries[0].body {
            EntryBody::Init { dataset_id, budget, adjacency, options, .. } => {
                (dataset_id, *budget, *adjacency, options)
            }
            _ => unreachable!("entry 0 is verified to be the initialisation"),
        }
    }

    pub fn dataset_id(&self) -> &str {
        self.init_entry().0
    }

    pub fn budget(&self) -> Budget {
        self.init_entry().1
    }

    pub fn adjacency(&self) -> Adjacency {
        self.init_entry().2
    }

    pub fn options(&self) -> &AccountingOptions {
        self.init_entry().3
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Every charge with its status.
    pub fn charges(&self) -> Vec<(&Entry, ChargeStatus)> {
        self.entries.iter().filter_map(|e| Some((e, self.charge_status(e.seq)?))).collect()
    }

    /// The status of charge `seq` as loaded (`refresh` first for news); `None` if entry
    /// `seq` is not a charge.
    pub fn charge_status(&self, seq: u64) -> Option<ChargeStatus> {
        self.charged(seq).map(|(_, status)| status)
    }

    /// What charge `seq` charged, and its status as loaded; `None` if entry `seq` is not a
    /// charge.
    pub fn charged(&self, seq: u64) -> Option<(&ChargeRequest, ChargeStatus)> {
        let EntryBody::Charge { request, .. } = &self.entries.get(usize::try_from(seq).ok()?)?.body else {
            return None;
        };
        let status = if self.releases.contains_key(&seq) { ChargeStatus::Released } else { ChargeStatus::Charged };
        Some((request, status))
    }

    /// Where charge `seq`'s one release was written, if it was claimed.
    pub fn release_location(&self, seq: u64) -> Option<&str> {
        let entry = self.entries.get(usize::try_from(*self.releases.get(&seq)?).ok()?)?;
        match &entry.body {
            EntryBody::Release { location, .. } => Some(location),
            _ => None,
        }
    }

    /// Every claimed release: its charge and location.
    pub fn release_locations(&self) -> impl Iterator<Item = (u64, &str)> {
        self.releases.keys().filter_map(|&charge| Some((charge, self.release_location(charge)?)))
    }

    /// The SHA-256 of charge `seq`'s released manifest, if recorded.
    pub fn published(&self, seq: u64) -> Option<&str> {
        self.published.get(&seq).map(String::as_str)
    }

    /// The input the ledger is bound to (canonical URLs, sorted), if any.
    pub fn input(&self) -> Option<&[String]> {
        self.entries.iter().rev().find_map(|e| match &e.body {
            EntryBody::Input { urls } => Some(urls.as_slice()),
            _ => None,
        })
    }

    /// Runs `f` on the totals of every loaded charge, first composing those loaded since
    /// the last call.
    fn with_cache<T>(&self, f: impl FnOnce(&mut Cache) -> T) -> T {
        let options = self.options();
        let mut guard = self.cache.lock().unwrap_or_else(|poisoned| {
            // A panic mid-composition may have left partial totals: start again.
            self.cache.clear_poison();
            let mut guard = poisoned.into_inner();
            *guard = None;
            guard
        });
        let cache = guard.get_or_insert_with(|| Cache { entries: 0, totals: Totals::new(options), spent: None });
        for entry in &self.entries[cache.entries..] {
            if let EntryBody::Charge { request, .. } = &entry.body {
                cache.totals.add(&request.mechanisms, &options.orders);
                cache.spent = None;
            }
        }
        cache.entries = self.entries.len();
        f(cache)
    }

    /// Total spent so far.
    pub fn spent(&self) -> Result<Spent, LedgerError> {
        let (budget, conversion) = (self.budget(), self.options().conversion);
        self.with_cache(|cache| cache.spent(budget, conversion))
    }

    /// Prices `request` with the ledger's own accounting options (never the caller's).
    pub fn price(&self, request: &ChargeRequest) -> Result<PrivacyCost, LedgerError> {
        let adjacency = self.adjacency();
        if let Some(m) = request.mechanisms.iter().find(|m| !m.supports(adjacency)) {
            return Err(LedgerError::Mechanism(format!(
                "{} is not analysed under this dataset's adjacency ({adjacency})",
                m.describe()
            )));
        }
        Ok(account(&request.mechanisms, request.accountant, request.delta, self.options())?)
    }

    /// The totals before and after `request`, and the cache to keep once it is charged.
    fn admission(&self, request: &ChargeRequest, cost: PrivacyCost) -> Result<(Admission, Cache), LedgerError> {
        let (budget, options) = (self.budget(), self.options());
        self.with_cache(|cache| {
            let before = cache.spent(budget, options.conversion)?;
            let mut next = Cache { entries: cache.entries + 1, totals: cache.totals.clone(), spent: None };
            next.totals.add(&request.mechanisms, &options.orders);
            let after = next.spent(budget, options.conversion)?;
            Ok((Admission { cost, before, after, budget }, next))
        })
    }

    fn refusal(&self, request: &ChargeRequest, admission: &Admission) -> LedgerError {
        LedgerError::BudgetExceeded {
            dataset_id: self.dataset_id().to_string(),
            job_id: request.job_id.clone(),
            accountant: request.accountant,
            cost: admission.cost.epsilon,
            spent: admission.before.epsilon,
            after: admission.after.epsilon,
            after_accountant: admission.after.accountant,
            budget_epsilon: admission.budget.epsilon,
            budget_delta: admission.budget.delta,
        }
    }

    /// Whether `request` fits in the remaining budget now, without writing anything.
    pub async fn check(&mut self, request: &ChargeRequest) -> Result<Admission, LedgerError> {
        self.refresh().await?;
        let (admission, _) = self.admission(request, self.price(request)?)?;
        if admission.fits() { Ok(admission) } else { Err(self.refusal(request, &admission)) }
    }

    /// Durably charges `request`, or refuses it (leaving the ledger unchanged) if it would
    /// exceed the budget. Call before the charged output leaves the coordinator.
    pub async fn charge(&mut self, request: &ChargeRequest) -> Result<ChargeReceipt, LedgerError> {
        let cost = self.price(request)?;
        for _ in 0..MAX_ATTEMPTS {
            self.refresh().await?;
            let (admission, totals) = self.admission(request, cost.clone())?;
            if !admission.fits() {
                return Err(self.refusal(request, &admission));
            }
            // An unbound ledger is bound to the input this charge read, just before it (then
            // priced again: the totals above end before the new entry).
            if let Some(reading) = self.reading.clone() {
                self.check_input(&reading)?;
                if self.input().is_none() {
                    self.try_append(EntryBody::Input { urls: reading }).await?;
                    continue;
                }
            }
            let seq = self.entries.len() as u64;
            let body = EntryBody::Charge { request: request.clone(), cost: cost.clone() };
            if self.try_append(body).await? {
                *self.cache.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(totals);
                tracing::info!(
                    dataset = self.dataset_id(),
                    job = request.job_id,
                    seq,
                    epsilon = admission.cost.epsilon,
                    total_epsilon = admission.after.epsilon,
                    "privacy ledger charged"
                );
                return Ok(ChargeReceipt {
                    seq,
                    admission,
                    mechanisms: request.mechanisms.clone(),
                    opened: Opened::default(),
                });
            }
            tracing::debug!(seq, "ledger write lost a race; reloading");
        }
        Err(LedgerError::Contention(MAX_ATTEMPTS))
    }

    /// The receipt of a charge that a run resumes from its checkpoint: `saved` as the
    /// checkpoint kept it, with the mechanisms of the ledger's own entry (they alone decide
    /// what may be released). `None` unless entry `saved.seq` is an unreleased charge of
    /// exactly `request`.
    pub fn resume(&self, saved: &ChargeReceipt, request: &ChargeRequest) -> Option<ChargeReceipt> {
        match self.charged(saved.seq)? {
            (charged, ChargeStatus::Charged) if charged == request => {
                Some(ChargeReceipt { mechanisms: charged.mechanisms.clone(), ..saved.clone() })
            }
            _ => None,
        }
    }

    /// Claims the one release of charge `charge_seq`'s output, to `location`: call before
    /// the first part of it is written. Refused if the charge was already released; the
    /// check is redone after every reload, so of two racing claims exactly one wins.
    pub async fn record_release(&mut self, charge_seq: u64, location: &str) -> Result<u64, LedgerError> {
        for _ in 0..MAX_ATTEMPTS {
            self.refresh().await?;
            let job_id = match self.entries.get(charge_seq as usize).map(|e| &e.body) {
                Some(EntryBody::Charge { request, .. }) => request.job_id.clone(),
                _ => {
                    return Err(LedgerError::Mechanism(format!("entry {charge_seq} is not a charge")));
                }
            };
            if let Some(&first) = self.releases.get(&charge_seq) {
                let location_of_first = match &self.entries[first as usize].body {
                    EntryBody::Release { location, .. } => location.clone(),
                    _ => unreachable!("releases maps charges to verified release markers"),
                };
                return Err(LedgerError::AlreadyReleased {
                    dataset_id: self.dataset_id().to_string(),
                    charge_seq,
                    location_of_first,
                });
            }
            let seq = self.entries.len() as u64;
            let body = EntryBody::Release { charge_seq, job_id, location: location.to_string() };
            if self.try_append(body).await? {
                return Ok(seq);
            }
        }
        Err(LedgerError::Contention(MAX_ATTEMPTS))
    }

    /// States the input this handle's charges read, before any of it is read: refused when
    /// the ledger is bound to another, or is unbound but already holds charges (whose input
    /// no one recorded: the operator binds it, `rhosynth ledger bind`). An unbound ledger
    /// is bound to it with the next charge (a refused charge writes nothing).
    pub async fn bind_input(&mut self, urls: &[String]) -> Result<(), LedgerError> {
        let given = self.canonical_input(urls)?;
        self.refresh().await?;
        self.check_input(&given)?;
        self.reading = Some(given);
        Ok(())
    }

    fn check_input(&self, given: &[String]) -> Result<(), LedgerError> {
        let dataset_id = self.dataset_id().to_string();
        match self.input() {
            Some(bound) if bound == given => Ok(()),
            Some(bound) => Err(LedgerError::OtherInput { dataset_id, bound: bound.to_vec(), given: given.to_vec() }),
            None if self.entries.iter().any(|e| matches!(e.body, EntryBody::Charge { .. })) => {
                Err(LedgerError::Unbound { dataset_id })
            }
            None => Ok(()),
        }
    }

    /// Binds the ledger to `urls` whatever it was bound to: the operator's, for a ledger
    /// made before bindings or when the data moved (`rhosynth ledger bind`, a declared
    /// dataset's input when `serve` starts).
    pub async fn rebind_input(&mut self, urls: &[String]) -> Result<(), LedgerError> {
        let urls = self.canonical_input(urls)?;
        for _ in 0..MAX_ATTEMPTS {
            self.refresh().await?;
            if self.try_append(EntryBody::Input { urls: urls.clone() }).await? {
                return Ok(());
            }
        }
        Err(LedgerError::Contention(MAX_ATTEMPTS))
    }

    fn canonical_input(&self, urls: &[String]) -> Result<Vec<String>, LedgerError> {
        canonical_input(urls)
            .map_err(|reason| LedgerError::InvalidInput { dataset_id: self.dataset_id().into(), reason })
    }

    /// Records the SHA-256 of the manifest about to complete charge `charge_seq`'s release:
    /// after its release marker, before the manifest is written.
    pub async fn record_published(&mut self, charge_seq: u64, manifest_sha256: &str) -> Result<u64, LedgerError> {
        for _ in 0..MAX_ATTEMPTS {
            self.refresh().await?;
            if !self.releases.contains_key(&charge_seq) || self.published.contains_key(&charge_seq) {
                return Err(LedgerError::NotPublishable { charge_seq });
            }
            let seq = self.entries.len() as u64;
            let body = EntryBody::Published { charge_seq, manifest_sha256: manifest_sha256.to_string() };
            if self.try_append(body).await? {
                return Ok(seq);
            }
        }
        Err(LedgerError::Contention(MAX_ATTEMPTS))
    }
}

/// An input as a ledger records it: each URL canonical (scheme, absolute path, links
/// resolved), sorted. A `..` segment is refused (a store resolves it after a link, not
/// before, so the text names another file than the one read), as is a file named twice.
pub fn canonical_input(urls: &[String]) -> Result<Vec<String>, String> {
    if let Some(url) = urls.iter().find(|url| url.split('/').any(|part| part == "..")) {
        return Err(format!("{url} has a `..` segment: name the file by its own path"));
    }
    let mut canonical: Vec<String> = urls
        .iter()
        .map(|url| {
            let (scheme, path) = storage::canonical_url(url);
            format!("{scheme}://{path}")
        })
        .collect();
    canonical.sort();
    if let Some(twice) = canonical.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("{} is named twice", twice[0]));
    }
    if canonical.is_empty() {
        return Err("no input files".into());
    }
    Ok(canonical)
}
