//! The scratch store: private working state of coordinators, never readable by submitters.
//!
//! Namespaces: `partitions/<instance>/<job>` (encoded private rows, per coordinator
//! process), `checkpoints/<job>` (charged DP-SGD runs), `leases/<job>` (resume leases),
//! `instances/<instance>` (each live coordinator's heartbeat) and, for `rhosynth audit` only,
//! `models/<job>` (a DP-SGD job's model before and after training).
//!
//! Partitions are keyed by the coordinator process that wrote them, so several
//! coordinators (or `run`s) may share one scratch store: a process removes its own job's
//! partitions when the job ends, and at start sweeps those of processes whose heartbeat
//! is missing or stale (crashed), never those of a live one.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use tokio::sync::OnceCell;

use rhosynth_shared::storage::{self, StoreLocation};

pub const PARTITIONS: &str = "partitions";
pub const CHECKPOINTS: &str = "checkpoints";
pub const LEASES: &str = "leases";
const MODELS: &str = "models";
const INSTANCES: &str = "instances";

/// How often a coordinator process renews its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(30);
/// A heartbeat older than this marks a crashed process (ten missed renewals).
pub const STALE_AFTER: chrono::Duration = chrono::Duration::seconds(300);

/// This process's name in the scratch store: random, so two processes never collide.
pub fn instance() -> &'static str {
    static INSTANCE: OnceLock<String> = OnceLock::new();
    INSTANCE.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

/// Where this process partitions a job.
pub fn partition_prefix(job_id: &str) -> String {
    format!("{PARTITIONS}/{}/{job_id}", instance())
}

/// Where a DP-SGD job leaves its model before (`initial`) and after (`trained`) training
/// when its coordinator keeps them: the first and last rounds' tasks (`GradientSum`,
/// protobuf) with those weights.
pub fn kept_model(job_id: &str, stage: &str) -> String {
    format!("{MODELS}/{job_id}/{stage}")
}

/// This process's heartbeat in one scratch store: written, and awaited, before a job's
/// first partition, then renewed every `HEARTBEAT` while the coordinator that owns it
/// lives (a failed renewal is logged; a sweep treats the process as gone only after
/// `STALE_AFTER`). A coordinator that never partitions writes nothing.
#[derive(Clone, Debug, Default)]
pub struct Heartbeat(Arc<OnceCell<()>>);

impl Heartbeat {
    pub async fn ensure(&self, scratch: &StoreLocation) -> object_store::Result<()> {
        self.0
            .get_or_try_init(|| async {
                beat(scratch, Utc::now()).await?;
                let (owner, scratch) = (Arc::downgrade(&self.0), scratch.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(HEARTBEAT);
                    tick.tick().await; // immediate: the beat above
                    loop {
                        tick.tick().await;
                        if owner.strong_count() == 0 {
                            break;
                        }
                        if let Err(e) = beat(&scratch, Utc::now()).await {
                            tracing::warn!(error = %e, "could not renew the scratch heartbeat");
                        }
                    }
                });
                Ok(())
            })
            .await
            .map(|_| ())
    }
}

async fn beat(scratch: &StoreLocation, at: DateTime<Utc>) -> object_store::Result<()> {
    let path = scratch.child(&format!("{INSTANCES}/{}", instance()));
    scratch.store.put(&path, PutPayload::from(at.to_rfc3339().into_bytes())).await.map(|_| ())
}

/// Deletes the partitions of coordinator processes that are gone: no heartbeat, or one
/// older than `STALE_AFTER`. Returns the instances swept.
pub async fn sweep_stale(scratch: &StoreLocation) -> object_store::Result<Vec<String>> {
    let listed = scratch.store.list_with_delimiter(Some(&scratch.child(PARTITIONS))).await?;
    let mut swept = Vec::new();
    for prefix in listed.common_prefixes {
        let Some(owner) = prefix.filename().map(str::to_string) else { continue };
        if owner == instance() || alive(scratch, &owner).await? {
            continue;
        }
        tracing::info!(instance = owner, "deleting partitions left by a coordinator that is gone");
        delete_prefix(scratch, &format!("{PARTITIONS}/{owner}")).await;
        match scratch.store.delete(&scratch.child(&format!("{INSTANCES}/{owner}"))).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => tracing::warn!(instance = owner, error = %e, "could not delete a stale heartbeat"),
        }
        swept.push(owner);
    }
    Ok(swept)
}

/// Whether coordinator process `owner` has a heartbeat younger than `STALE_AFTER`.
pub async fn alive(scratch: &StoreLocation, owner: &str) -> object_store::Result<bool> {
    let path = scratch.child(&format!("{INSTANCES}/{owner}"));
    let bytes = match scratch.store.get(&path).await {
        Ok(found) => found.bytes().await?,
        Err(object_store::Error::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let beat = std::str::from_utf8(&bytes).ok().and_then(|t| DateTime::parse_from_rfc3339(t.trim()).ok());
    Ok(beat.is_some_and(|t| Utc::now() - t.with_timezone(&Utc) < STALE_AFTER))
}

/// Deletes every object under `prefix` of the scratch store (a job's partitions: they
/// hold encoded private rows; its resume leases). Failures are logged: the next sweep
/// retries partitions.
pub async fn delete_prefix(scratch: &StoreLocation, prefix: &str) {
    let path = scratch.child(prefix);
    let listed: Result<Vec<_>, _> = scratch.store.list(Some(&path)).map_ok(|m| m.location).try_collect().await;
    match listed {
        Ok(paths) => delete_objects(scratch, paths).await,
        Err(e) => tracing::warn!(%path, error = %e, "could not list scratch objects for cleanup"),
    }
    // A local store's listing leaves out the staged files of uploads a killed worker never
    // completed (`<object>#<n>`): they hold private rows too. (On S3 such an upload is
    // never listed either: a lifecycle rule aborts it, docs/running.md.)
    let (scheme, root) = storage::canonical_url(&scratch.url);
    let inside = prefix.trim_matches('/');
    if scheme == "file" && !inside.is_empty() && inside.split('/').all(|part| !matches!(part, "" | "." | "..")) {
        let dir = std::path::Path::new(&root).join(inside);
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), error = %e, "could not delete a scratch folder");
        }
    }
}

/// Deletes `paths` from the scratch store, logging what could not be deleted.
pub async fn delete_objects(scratch: &StoreLocation, paths: impl IntoIterator<Item = object_store::path::Path>) {
    for path in paths {
        if let Err(e) = scratch.store.delete(&path).await {
            tracing::warn!(%path, error = %e, "could not delete a scratch object");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn put(scratch: &StoreLocation, name: &str, body: &str) {
        scratch.store.put(&scratch.child(name), PutPayload::from(body.to_string().into_bytes())).await.unwrap();
    }

    async fn exists(scratch: &StoreLocation, name: &str) -> bool {
        scratch.store.head(&scratch.child(name)).await.is_ok()
    }

    /// A shared scratch store: the sweep removes the partitions of a crashed process (stale
    /// or missing heartbeat) and keeps those of a live one and its own.
    #[tokio::test]
    async fn the_sweep_spares_live_coordinators_partitions() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = storage::open(dir.path().to_str().unwrap()).unwrap();
        let part = "j/partition-00000/part-00000.parquet";
        for owner in ["live", "crashed", "silent", instance()] {
            put(&scratch, &format!("{PARTITIONS}/{owner}/{part}"), "rows").await;
        }
        put(&scratch, &format!("{INSTANCES}/live"), &Utc::now().to_rfc3339()).await;
        put(&scratch, &format!("{INSTANCES}/crashed"), &(Utc::now() - STALE_AFTER * 2).to_rfc3339()).await;

        let mut swept = sweep_stale(&scratch).await.unwrap();
        swept.sort();
        assert_eq!(swept, ["crashed", "silent"]);
        assert!(exists(&scratch, &format!("{PARTITIONS}/live/{part}")).await);
        assert!(exists(&scratch, &format!("{PARTITIONS}/{}/{part}", instance())).await);
        assert!(!exists(&scratch, &format!("{PARTITIONS}/crashed/{part}")).await);
        assert!(!exists(&scratch, &format!("{INSTANCES}/crashed")).await);
        assert!(!exists(&scratch, &format!("{PARTITIONS}/silent/{part}")).await);

        // Our own heartbeat, written before our first partition, keeps us alive for
        // another process's sweep.
        assert!(!alive(&scratch, instance()).await.unwrap());
        Heartbeat::default().ensure(&scratch).await.unwrap();
        assert!(alive(&scratch, instance()).await.unwrap());
    }

    /// A job's folder goes whole on a local store, with the staged file of an upload a
    /// killed worker never completed (object_store lists no such file); a prefix that
    /// climbs out of the store deletes no folder.
    #[tokio::test]
    async fn a_jobs_folder_goes_with_its_unfinished_uploads() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = storage::open(dir.path().to_str().unwrap()).unwrap();
        put(&scratch, "partitions/i/j/partition-00000/shard-00000.parquet", "rows").await;
        let staged = dir.path().join("partitions/i/j/partition-00001/shard-00000.parquet#1");
        std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
        std::fs::write(&staged, "half the rows").unwrap();
        put(&scratch, "partitions/i/other/kept.parquet", "rows").await;
        for outside in ["partitions/i/j/..", "./partitions", "partitions/../partitions/i/j"] {
            delete_prefix(&scratch, outside).await;
            assert!(staged.exists() && exists(&scratch, "partitions/i/other/kept.parquet").await, "{outside:?}");
        }
        delete_prefix(&scratch, "partitions/i/j").await;
        assert!(!dir.path().join("partitions/i/j").exists());
        assert!(exists(&scratch, "partitions/i/other/kept.parquet").await);
    }
}
