//! The gRPC protocol between the rhosynth coordinator and its workers (`rhosynth.proto`).

tonic::include_proto!("rhosynth.v1");

pub mod tls;

/// Version of the protocol in `rhosynth.proto`; peers of another version are refused.
/// 2: DP-SGD round tasks (`dpsgd`) and long polling.
/// 3: typed tasks (`Task.work`, one message per kind) instead of a kind and opaque bytes.
/// 4: DP-SGD rounds of the sequence generator (`SequenceModel`) and its selection votes.
/// 5: DP-SGD rounds of DP-2Stage (`Dp2StageModel`).
/// 6: HARMONIC's prompts in `Dp2StageModel` (a worker of 5 would train without them).
/// 7: one model form in `GradientSum` (the generator's name and its model as JSON) for
///    every DP-SGD generator; `SelectionVotes` carries its model as JSON.
/// 8: `CountTables.database_json`, counts over a database view (a worker of 7 would count
///    the partitions as one table's).
/// 9: a database view holds its children's means (`__mean.<child>.<column>`), and each
///    descendant's view its ancestors' (a worker of 8 would count other columns).
/// 10: partitioning by the workers (`ReadShard`, `MergePartition`) and
///     `ReportFailureRequest.input_mismatch`.
/// 11: a CSV file's byte ranges (`ReadShard.bytes`), a shard's span of records in its
///     result, and the shards a merge reads named (`MergePartition.shards`).
/// 12: a database's partitions hold its rows as read (keys hashed, `__key` and
///     `__parent_key`); the worker caps each unit (a worker of 11 reads them as capped).
/// 13: a shard job's `keys` (a database table's, hashed by its reader: a worker of 12
///     would leave them out), and a database view's batches each holding its units whole.
/// 14: a database view holds a child's rate over its parent's span (`__rate.<child>`; a
///     worker of 13 would count other columns).
pub const PROTOCOL_VERSION: u32 = 14;

/// Most f64 values one result may declare (2 GiB): above any model's parameter count or
/// any task's table cells.
pub const MAX_RESULT_VALUES: u64 = 1 << 28;

/// Largest chunk of tensor bytes sent in one message.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Largest gRPC message either side accepts: a round task carries a model's weights.
pub const MAX_MESSAGE_BYTES: usize = 256 << 20;

/// Everything but the partition key, which no log may hold.
impl std::fmt::Debug for ReadShard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadShard")
            .field("url", &self.url)
            .field("row_groups", &self.row_groups)
            .field("first_row", &self.first_row)
            .field("bytes", &self.bytes)
            .field("shard", &self.shard)
            .field("key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard task logged with `?` (a task, its work) shows no byte of the partition key.
    #[test]
    fn a_shard_task_never_shows_its_key() {
        let work = task::Work::ReadShard(ReadShard { key: vec![0xab; 32], url: "in.csv".into(), ..Default::default() });
        let task = Task { work: Some(work), ..Default::default() };
        let shown = format!("{task:?}");
        assert!(shown.contains("in.csv") && shown.contains("<redacted>"), "{shown}");
        assert!(!shown.contains("171") && !shown.to_lowercase().contains("ab, ab"), "{shown}");
    }
}
