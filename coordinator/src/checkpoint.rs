//! Coordinator checkpoints of a DP-SGD run, so a restarted coordinator resumes a job whose
//! run is already charged instead of charging (or training) it again.
//!
//! A checkpoint holds the plan as charged (the generator's name and model configuration,
//! the run's plan, N̂, q, σ, T, the ledger receipts), the optimizer state and the f64
//! master parameters. It lives
//! in the scratch store under `checkpoints/<job id>` (private storage, like the
//! partitions) and is deleted as soon as training ends, either way. The noise generator's
//! state is never saved: a resumed run draws fresh noise from the OS.
//!
//! A checkpoint is resumed at most once per saved round: the resuming coordinator first
//! creates `leases/<job id>/<charge entry>-<round>` with create-if-absent, so two
//! coordinators given the same job cannot both continue it; and only a charge the ledger
//! has not released may be resumed at all.
//!
//! Format: a u32 length, the JSON header, then the parameters and the optimizer's moments
//! as little-endian f64.

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use rhosynth_privacy::ledger::{ChargeReceipt, ChargeRequest, ChargeStatus, Ledger};
use rhosynth_shared::accounting::accountant::PrivacyCost;
use rhosynth_shared::accounting::mechanism::Mechanism;
use rhosynth_shared::dpsgd::optimizer::Optimizer;
use rhosynth_shared::dpsgd::plan::RunPlan;
use rhosynth_shared::generators::GeneratorName;
use rhosynth_shared::storage::StoreLocation;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::context::JobError;
use crate::scratch;

/// The plan a run was charged for; `M` is the generator's model configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChargedRun<M> {
    /// The generator that planned it (a checkpoint resumes under the same one only).
    pub generator: GeneratorName,
    pub model: M,
    pub plan: RunPlan,
    /// The released unit count (rounded), charged in ledger entry `count_entry`.
    pub noisy_units: f64,
    pub rate: f64,
    pub sigma: f64,
    pub steps: u64,
    pub count_entry: u64,
    /// All of the job's mechanisms (count and run) and their cost, for the manifest.
    pub mechanisms: Vec<Mechanism>,
    pub cost: PrivacyCost,
    /// The run's own charge.
    pub charge: ChargeRequest,
    pub receipt: ChargeReceipt,
}

#[derive(Serialize, Deserialize)]
struct Header<M> {
    run: ChargedRun<M>,
    optimizer: Optimizer,
}

/// A run's state after `optimizer.step` rounds.
pub struct Checkpoint<M> {
    pub run: ChargedRun<M>,
    pub optimizer: Optimizer,
    pub parameters: Vec<f64>,
}

fn path(scratch: &StoreLocation, job_id: &str) -> object_store::path::Path {
    scratch.child(&format!("{}/{job_id}", scratch::CHECKPOINTS))
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Overwrites the job's checkpoint (a single PUT: readers see the old or the new one).
pub async fn save<M: Clone + Serialize>(
    scratch: &StoreLocation,
    job_id: &str,
    run: &ChargedRun<M>,
    optimizer: &Optimizer,
    parameters: &[f64],
) -> Result<(), JobError> {
    let header = serde_json::to_vec(&Header { run: run.clone(), optimizer: optimizer.clone() }).map_err(|e| {
        JobError::Scratch { doing: format!("encoding the checkpoint of {job_id}"), reason: e.to_string() }
    })?;
    let [m, v] = optimizer.moments();
    // Three arrays of equal length; SGD's missing second moment is written as zeros.
    let zeros = vec![0.0; if v.is_empty() { m.len() } else { 0 }];
    let v = if v.is_empty() { &zeros[..] } else { v };
    let mut bytes = Vec::with_capacity(4 + header.len() + 8 * 3 * parameters.len());
    bytes.extend((header.len() as u32).to_le_bytes());
    bytes.extend(header);
    for x in parameters.iter().chain(m).chain(v) {
        bytes.extend(x.to_le_bytes());
    }
    scratch.store.put(&path(scratch, job_id), PutPayload::from(bytes)).await.map_err(|e| JobError::Scratch {
        doing: format!("writing the checkpoint of {job_id}"),
        reason: e.to_string(),
    })?;
    Ok(())
}

/// The job's checkpoint, if a previous coordinator left one: a run of `generator`.
pub async fn load<M: DeserializeOwned>(
    scratch: &StoreLocation,
    job_id: &str,
    generator: GeneratorName,
) -> Result<Option<Checkpoint<M>>, JobError> {
    let reading = |e: object_store::Error| JobError::Scratch {
        doing: format!("reading the checkpoint of {job_id}"),
        reason: e.to_string(),
    };
    let bytes = match scratch.store.get(&path(scratch, job_id)).await {
        Ok(r) => r.bytes().await.map_err(reading)?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(reading(e)),
    };
    let corrupt = |why: &str| JobError::CheckpointCorrupt { job_id: job_id.to_string(), reason: why.to_string() };
    let len = u32::from_le_bytes(bytes.get(..4).ok_or_else(|| corrupt("truncated"))?.try_into().expect("4")) as usize;
    let header = bytes.get(4..4 + len).ok_or_else(|| corrupt("truncated header"))?;
    // The generator first, so a checkpoint of another generator is named as such.
    #[derive(Deserialize)]
    struct Planned {
        run: Named,
    }
    #[derive(Deserialize)]
    struct Named {
        generator: GeneratorName,
    }
    let planned: Planned = serde_json::from_slice(header).map_err(|e| corrupt(&e.to_string()))?;
    if planned.run.generator != generator {
        return Err(JobError::ResumeRefused {
            job_id: job_id.to_string(),
            reason: format!(
                "its checkpoint is of a {} run, not {} (resubmit it unchanged or under a new job id)",
                planned.run.generator.as_str(),
                generator.as_str()
            ),
        });
    }
    let mut header: serde_json::Value = serde_json::from_slice(header).map_err(|e| corrupt(&e.to_string()))?;
    if let Some(plan) = header.pointer_mut("/run/plan") {
        RunPlan::upgrade_stored(plan);
    }
    let header: Header<M> = serde_json::from_value(header).map_err(|e| corrupt(&e.to_string()))?;
    let rest = &bytes[4 + len..];
    if !rest.len().is_multiple_of(3 * 8) {
        return Err(corrupt("parameter arrays of unequal length"));
    }
    let values = f64s(rest);
    let n = values.len() / 3;
    let mut optimizer = header.optimizer;
    optimizer.restore_moments(values[n..2 * n].to_vec(), values[2 * n..].to_vec()).map_err(|e| corrupt(&e))?;
    Ok(Some(Checkpoint { run: header.run, optimizer, parameters: values[..n].to_vec() }))
}

/// Saves a run every `every` rounds while training.
pub struct Checkpointer<'a, M> {
    pub scratch: &'a StoreLocation,
    pub job_id: &'a str,
    pub run: &'a ChargedRun<M>,
}

impl<M: Clone + Serialize> Checkpointer<'_, M> {
    pub async fn after_round(&self, optimizer: &Optimizer, parameters: &[f64]) -> Result<(), JobError> {
        if optimizer.step.is_multiple_of(self.run.plan.run.checkpoint_every.max(1)) && optimizer.step < self.run.steps {
            save(self.scratch, self.job_id, self.run, optimizer, parameters).await?;
        }
        Ok(())
    }
}

/// Deletes the job's checkpoint; an error here must stop the job before it releases.
pub async fn delete(scratch: &StoreLocation, job_id: &str) -> Result<(), JobError> {
    match scratch.store.delete(&path(scratch, job_id)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(JobError::Scratch {
            doing: format!(
                "deleting the checkpoint of {job_id} (not releasing: a later resume of it would train past its charge)"
            ),
            reason: e.to_string(),
        }),
    }
}

/// A checkpoint may be resumed only if the ledger holds exactly the charge it names, for
/// this job and these mechanisms, and has not released it: resuming never spends budget,
/// so it must not be able to skip a charge or produce a second release. Returns the
/// receipt to release from, its mechanisms the ledger's (never the checkpoint file's).
pub fn verify_charged(
    ledger: &Ledger,
    job_id: &str,
    charge: &ChargeRequest,
    saved: &ChargeReceipt,
) -> Result<ChargeReceipt, JobError> {
    let seq = saved.seq;
    let found = ledger.charged(seq).filter(|(request, _)| request.job_id == job_id && *request == charge);
    let refused = |reason: String| JobError::ResumeRefused { job_id: job_id.to_string(), reason };
    match found {
        Some((_, ChargeStatus::Charged)) => ledger
            .resume(saved, charge)
            .ok_or_else(|| refused(format!("the ledger's charge {seq} changed while resuming"))),
        Some((_, ChargeStatus::Released)) => {
            Err(refused(format!("its checkpoint is of charge {seq}, which the ledger has already released")))
        }
        None => Err(refused(format!("it has a checkpoint but the ledger holds no matching charge (entry {seq})"))),
    }
}

/// Takes the one resume of charge `seq`'s checkpoint saved after `round` rounds
/// (create-if-absent), or fails when another coordinator already resumed it from there.
pub async fn take_resume_lease(scratch: &StoreLocation, job_id: &str, seq: u64, round: u64) -> Result<(), JobError> {
    let name = format!("{}/{job_id}/{seq}-{round}", scratch::LEASES);
    let options = PutOptions { mode: PutMode::Create, ..Default::default() };
    let body = PutPayload::from(format!("resumed at {}\n", chrono::Utc::now().to_rfc3339()).into_bytes());
    match scratch.store.put_opts(&scratch.child(&name), body, options).await {
        Ok(_) => Ok(()),
        Err(object_store::Error::AlreadyExists { .. }) => Err(JobError::ResumeRefused {
            job_id: job_id.to_string(),
            reason: format!("another coordinator already resumed this charged run from round {round}"),
        }),
        Err(e) => {
            Err(JobError::Scratch { doing: format!("taking the resume lease of {job_id}"), reason: e.to_string() })
        }
    }
}

#[cfg(test)]
mod tests {
    use rhosynth_privacy::ledger::{Budget, ChargeReceipt, ChargeRequest, Ledger};
    use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions};
    use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};
    use rhosynth_shared::storage;

    use super::{take_resume_lease, verify_charged};

    fn request(job_id: &str) -> ChargeRequest {
        ChargeRequest {
            job_id: job_id.into(),
            mechanisms: vec![Mechanism::dp_sgd(0.01, 1.0, 100)],
            accountant: Accountant::Rdp,
            delta: 1e-6,
        }
    }

    #[tokio::test]
    async fn a_checkpoint_resumes_once_and_never_after_its_release() {
        let dir = tempfile::tempdir().unwrap();
        let store = storage::open(dir.path().join("ledger").to_str().unwrap()).unwrap();
        let budget = Budget { epsilon: 10.0, delta: 1e-5 };
        let mut ledger =
            Ledger::init(&store, "d", budget, Adjacency::AddRemove, AccountingOptions::default()).await.unwrap();
        let charge = request("j");
        let receipt = ledger.charge(&charge).await.unwrap();
        // A receipt read back from a checkpoint file carries no mechanisms (a file cannot
        // pay for releases); the resumed receipt gets the ledger entry's.
        let from_file: ChargeReceipt = serde_json::from_str(&serde_json::to_string(&receipt).unwrap()).unwrap();
        assert!(from_file.mechanisms().is_empty());
        let resumed = verify_charged(&ledger, "j", &charge, &from_file).unwrap();
        assert_eq!(resumed.mechanisms(), charge.mechanisms.as_slice());
        // Another job's or another run's charge does not vouch for this checkpoint.
        assert!(verify_charged(&ledger, "k", &request("k"), &receipt).is_err());

        let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
        take_resume_lease(&scratch, "j", receipt.seq, 40).await.unwrap();
        let second = take_resume_lease(&scratch, "j", receipt.seq, 40).await.unwrap_err();
        assert!(second.to_string().contains("already resumed"), "{second}");
        // A later checkpoint of the same run is a new resume.
        take_resume_lease(&scratch, "j", receipt.seq, 80).await.unwrap();

        ledger.record_release(receipt.seq, "out").await.unwrap();
        let released = verify_charged(&ledger, "j", &charge, &receipt).unwrap_err();
        assert!(released.to_string().contains("already released"), "{released}");
    }
}
