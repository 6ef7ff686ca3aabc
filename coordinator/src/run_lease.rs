//! One process trains a job's DP-SGD run. Whether fresh or resumed from a checkpoint, a
//! run first takes its job's lease, so the same job id given to a second coordinator (or a
//! second `run` on the same stores) is refused at its start, before anything private is
//! read, instead of training beside the first from its checkpoints.
//!
//! Leases are generations `runs/<dataset>/<job id>/<n>` in the scratch store, each written
//! create-if-absent; the highest generation holds. A holder that is gone — on this machine,
//! its process has exited; elsewhere, its coordinator's heartbeat is stale — is superseded
//! by writing generation n + 1, which only one contender can do.

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use rhosynth_shared::storage::StoreLocation;

use crate::context::JobError;
use crate::scratch;

const RUNS: &str = "runs";

/// How long a run held by a live coordinator on another machine is waited on before the
/// job is refused: long enough for a crashed one's heartbeat to go stale (6 minutes).
pub const PATIENCE: std::time::Duration =
    std::time::Duration::from_secs(scratch::STALE_AFTER.num_seconds() as u64 + 2 * scratch::HEARTBEAT.as_secs());

/// The process that holds a lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Holder {
    /// Its coordinator instance (whose heartbeat says whether it lives).
    instance: String,
    host: String,
    /// Boot id and PID namespace: a process id means something only where both match.
    machine: String,
    pid: u32,
}

impl Holder {
    fn this_process() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default();
        let namespace = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();
        let boot = read("/proc/sys/kernel/random/boot_id");
        let machine =
            if boot.is_empty() || namespace.is_empty() { String::new() } else { format!("{boot} {namespace}") };
        Self {
            instance: scratch::instance().to_string(),
            host: read("/proc/sys/kernel/hostname"),
            machine,
            pid: std::process::id(),
        }
    }

    /// Whether its process id can be checked here: same host, boot and PID namespace.
    fn on_this_machine(&self, us: &Holder) -> bool {
        !us.machine.is_empty() && self.machine == us.machine && self.host == us.host
    }

    /// Whether it is gone: on this machine its process has exited; anywhere, its
    /// coordinator's heartbeat is stale.
    async fn gone(&self, scratch: &StoreLocation, us: &Holder) -> Result<bool, JobError> {
        if self.on_this_machine(us) && !std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            return Ok(true);
        }
        let alive = scratch::alive(scratch, &self.instance).await.map_err(|e| JobError::Scratch {
            doing: format!("reading coordinator {}'s heartbeat", self.instance),
            reason: e.to_string(),
        })?;
        Ok(!alive)
    }
}

fn prefix(dataset: &str, job_id: &str) -> String {
    format!("{RUNS}/{dataset}/{job_id}")
}

/// The lease generations of a job, lowest first.
async fn generations(scratch: &StoreLocation, dataset: &str, job_id: &str) -> Result<Vec<u64>, JobError> {
    let listed: Vec<_> =
        scratch.store.list(Some(&scratch.child(&prefix(dataset, job_id)))).try_collect().await.map_err(|e| {
            JobError::Scratch { doing: format!("listing the run leases of {job_id}"), reason: e.to_string() }
        })?;
    let mut found: Vec<u64> = listed.iter().filter_map(|m| m.location.filename()?.parse().ok()).collect();
    found.sort_unstable();
    Ok(found)
}

async fn holder(scratch: &StoreLocation, dataset: &str, job_id: &str, generation: u64) -> Option<Holder> {
    let path = scratch.child(&format!("{}/{generation}", prefix(dataset, job_id)));
    let got = scratch.store.get(&path).await.ok()?;
    serde_json::from_slice(&got.bytes().await.ok()?).ok()
}

/// Takes job `job_id`'s run lease: a new one, or the next generation over a holder that
/// is gone; waits up to `patience` for a live holder on another machine to go stale, and
/// refuses while a live process holds it.
pub async fn take(
    scratch: &StoreLocation,
    dataset: &str,
    job_id: &str,
    patience: std::time::Duration,
) -> Result<(), JobError> {
    let us = Holder::this_process();
    let body = PutPayload::from(
        serde_json::to_vec(&us)
            .map_err(|e| JobError::Scratch { doing: "encoding a run lease".into(), reason: e.to_string() })?,
    );
    let started = std::time::Instant::now();
    loop {
        let next = match generations(scratch, dataset, job_id).await?.last() {
            None => 0,
            Some(&top) => match holder(scratch, dataset, job_id, top).await {
                Some(h) if h.instance == us.instance => return Ok(()),
                Some(h) if !h.gone(scratch, &us).await? => {
                    if h.on_this_machine(&us) || started.elapsed() >= patience {
                        tracing::warn!(job_id, host = h.host, pid = h.pid, "the job's run is held by a live process");
                        return Err(JobError::RunHeld { job_id: job_id.to_string() });
                    }
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                    continue;
                }
                // Gone, or never finished by its writer: superseded.
                _ => top + 1,
            },
        };
        let path = scratch.child(&format!("{}/{next}", prefix(dataset, job_id)));
        let create = PutOptions { mode: PutMode::Create, ..Default::default() };
        match scratch.store.put_opts(&path, body.clone(), create).await {
            Ok(_) => return Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => continue,
            Err(e) => {
                return Err(JobError::Scratch {
                    doing: format!("taking the run lease of {job_id}"),
                    reason: e.to_string(),
                });
            }
        }
    }
}

/// Gives job `job_id`'s run lease back if this process holds it (its run has ended,
/// either way), with the generations it superseded.
pub async fn give_back(scratch: &StoreLocation, dataset: &str, job_id: &str) {
    let Ok(found) = generations(scratch, dataset, job_id).await else { return };
    let Some(&top) = found.last() else { return };
    if holder(scratch, dataset, job_id, top).await.is_none_or(|h| h.instance != scratch::instance()) {
        return;
    }
    for generation in found {
        let path = scratch.child(&format!("{}/{generation}", prefix(dataset, job_id)));
        if let Err(e) = scratch.store.delete(&path).await {
            tracing::warn!(job_id, error = %e, "could not give the run lease back");
        }
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;
    use rhosynth_shared::storage;

    use super::{Holder, generations, give_back, prefix, take};

    /// A job's run is trained by one live process: a second one given the same job id is
    /// refused at its start (on this machine at once, elsewhere once its patience is
    /// spent), and a lease whose holder is gone (its process exited, its heartbeat stale)
    /// is superseded by the next generation, so a restarted coordinator resumes.
    #[tokio::test]
    async fn a_run_is_trained_by_one_live_process() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = storage::open(dir.path().to_str().unwrap()).unwrap();
        let hold = |job: &str, generation: u64, holder: Holder| {
            let path = scratch.child(&format!("{}/{generation}", prefix("d", job)));
            let store = scratch.store.clone();
            async move { store.put(&path, serde_json::to_vec(&holder).unwrap().into()).await.unwrap() }
        };
        let us = Holder::this_process();
        let other = |instance: &str, elsewhere: bool, pid: u32| Holder {
            instance: instance.into(),
            host: if elsewhere { "elsewhere".into() } else { us.host.clone() },
            machine: us.machine.clone(),
            pid,
        };
        let path = scratch.child(&format!("instances/{}", "live"));
        scratch.store.put(&path, chrono::Utc::now().to_rfc3339().into_bytes().into()).await.unwrap();
        let none = std::time::Duration::ZERO;

        // Ours: taken, taken again, given back.
        take(&scratch, "d", "a", none).await.unwrap();
        take(&scratch, "d", "a", none).await.unwrap();
        assert_eq!(generations(&scratch, "d", "a").await.unwrap(), [0]);
        give_back(&scratch, "d", "a").await;
        assert!(generations(&scratch, "d", "a").await.unwrap().is_empty());

        // Another live process on this machine (pid 1 lives; its heartbeat is fresh).
        hold("b", 0, other("live", false, 1)).await;
        let refused = take(&scratch, "d", "b", none).await.unwrap_err();
        assert!(refused.to_string().contains("is being trained by another coordinator"), "{refused}");
        assert_eq!(refused.submitter_message(), refused.to_string(), "a public refusal");
        // Giving back a lease that is not ours leaves it; another dataset's job is another lease.
        give_back(&scratch, "d", "b").await;
        assert_eq!(generations(&scratch, "d", "b").await.unwrap(), [0]);
        take(&scratch, "e", "b", none).await.unwrap();

        // A live coordinator elsewhere: refused once patience is spent.
        hold("c", 0, other("live", true, 1)).await;
        assert!(take(&scratch, "d", "c", none).await.is_err());

        // Gone: a process of this machine that exited, or a coordinator elsewhere whose
        // heartbeat is missing. Both are superseded by the next generation.
        hold("f", 0, other("live", false, u32::MAX)).await;
        take(&scratch, "d", "f", none).await.unwrap();
        hold("g", 3, other("crashed", true, 1)).await;
        take(&scratch, "d", "g", none).await.unwrap();
        assert_eq!(generations(&scratch, "d", "g").await.unwrap(), [3, 4]);
        give_back(&scratch, "d", "g").await;
        assert!(generations(&scratch, "d", "g").await.unwrap().is_empty());
    }
}
