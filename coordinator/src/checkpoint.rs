//! Coordinator checkpoints of a DP-SGD run, so a restarted coordinator resumes a job whose
//! run is already charged instead of charging (or training) it again.
//!
//! A checkpoint holds the plan as charged (model layout with its frozen embeddings, N̂, q,
//! σ, T, the ledger receipt), the optimizer state and the f64 master parameters. It lives
//! in the scratch store under `checkpoints/<job id>` (private storage, like the
//! partitions) and is deleted as soon as training ends, either way. The noise generator's
//! state is never saved: a resumed run draws fresh noise from the OS.
//!
//! Format: a u32 length, the JSON header, then the parameters and the optimizer's moments
//! as little-endian f64.

use dpsynth_shared::dpsgd::optimizer::Optimizer;
use dpsynth_shared::generators::findiff::FinDiffModelSpec;
use dpsynth_shared::privacy::ledger::{ChargeReceipt, ChargeRequest, EntryBody, Ledger};
use dpsynth_shared::storage::StoreLocation;
use object_store::{ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

use crate::job::JobError;

/// The plan a run was charged for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChargedRun {
    pub model: FinDiffModelSpec,
    pub noisy_units: f64,
    pub rate: f64,
    pub sigma: f64,
    pub steps: u64,
    pub charge: ChargeRequest,
    pub receipt: ChargeReceipt,
}

#[derive(Serialize, Deserialize)]
struct Header {
    run: ChargedRun,
    optimizer: Optimizer,
}

/// A run's state after `optimizer.step` rounds.
pub struct Checkpoint {
    pub run: ChargedRun,
    pub optimizer: Optimizer,
    pub parameters: Vec<f64>,
}

fn path(scratch: &StoreLocation, job_id: &str) -> object_store::path::Path {
    scratch.child(&format!("checkpoints/{job_id}"))
}

fn f64s(bytes: &[u8]) -> Vec<f64> {
    bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Overwrites the job's checkpoint (a single PUT: readers see the old or the new one).
pub async fn save(
    scratch: &StoreLocation,
    job_id: &str,
    run: &ChargedRun,
    optimizer: &Optimizer,
    parameters: &[f64],
) -> Result<(), JobError> {
    let header = serde_json::to_vec(&Header { run: run.clone(), optimizer: optimizer.clone() })
        .map_err(|e| JobError::Other(format!("checkpoint header: {e}")))?;
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
    scratch
        .store
        .put(&path(scratch, job_id), PutPayload::from(bytes))
        .await
        .map_err(|e| JobError::Other(format!("writing the checkpoint of {job_id}: {e}")))?;
    Ok(())
}

/// The job's checkpoint, if a previous coordinator left one.
pub async fn load(scratch: &StoreLocation, job_id: &str) -> Result<Option<Checkpoint>, JobError> {
    let bytes = match scratch.store.get(&path(scratch, job_id)).await {
        Ok(r) => r.bytes().await.map_err(|e| JobError::Other(format!("reading the checkpoint of {job_id}: {e}")))?,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(e) => return Err(JobError::Other(format!("reading the checkpoint of {job_id}: {e}"))),
    };
    let corrupt = |why: &str| JobError::Other(format!("the checkpoint of {job_id} is corrupt: {why}"));
    let len = u32::from_le_bytes(bytes.get(..4).ok_or_else(|| corrupt("truncated"))?.try_into().expect("4")) as usize;
    let header: Header = serde_json::from_slice(bytes.get(4..4 + len).ok_or_else(|| corrupt("truncated header"))?)
        .map_err(|e| corrupt(&e.to_string()))?;
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
pub struct Checkpointer<'a> {
    pub scratch: &'a StoreLocation,
    pub job_id: &'a str,
    pub run: &'a ChargedRun,
    pub every: u64,
}

impl Checkpointer<'_> {
    pub async fn after_round(&self, optimizer: &Optimizer, parameters: &[f64]) -> Result<(), JobError> {
        if optimizer.step.is_multiple_of(self.every.max(1)) && optimizer.step < self.run.steps {
            save(self.scratch, self.job_id, self.run, optimizer, parameters).await?;
        }
        Ok(())
    }
}

pub async fn delete(scratch: &StoreLocation, job_id: &str) {
    match scratch.store.delete(&path(scratch, job_id)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => tracing::warn!(job = job_id, error = %e, "could not delete the job's checkpoint"),
    }
}

/// A checkpoint may be resumed only if the ledger holds exactly the charge it names, for
/// this job and these mechanisms: resuming never spends budget, so it must not be able to
/// skip a charge.
pub fn verify_charged(ledger: &Ledger, job_id: &str, run: &ChargedRun) -> Result<(), JobError> {
    let found = ledger.charges().into_iter().any(|(entry, _)| {
        entry.seq == run.receipt.seq
            && matches!(&entry.body, EntryBody::Charge { request, .. } if request.job_id == job_id && *request == run.charge)
    });
    if found {
        Ok(())
    } else {
        Err(JobError::Other(format!(
            "job {job_id} has a checkpoint but the ledger holds no matching charge (entry {}); refusing to resume",
            run.receipt.seq
        )))
    }
}
