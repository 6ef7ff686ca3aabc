//! Partitioning by the workers, the coordinator's side (`data::shard` is the workers'):
//! shards planned from public metadata, a task per shard writing its buckets and sketching
//! their units, a task per partition merging them and counting its units, and the two
//! sides' counts checked against each other before any partition is used. The coordinator
//! holds no row and no unit: its memory does not grow with the input.

use std::collections::BTreeMap;
use std::time::Duration;

use rhosynth_proto::task::Work;
use rhosynth_proto::{MergePartition, ReadShard};
use rhosynth_shared::data::input::SkippedRows;
use rhosynth_shared::data::partition::{PartitionKey, Partitioned, bucket_file, partition_file};
use rhosynth_shared::data::shard::{Census, SHARD_ROWS, ShardCounts, ShardJob, plan_shards};
use rhosynth_shared::data::sketch::UnitSketch;
use rhosynth_shared::data::source::Source;
use rhosynth_shared::storage;
use rhosynth_shared::wire::to_json;

use crate::context::{JobContext, JobError};
use crate::gather::Gather;
use crate::scratch;

/// How long a failed partitioning waits for its shard and merge tasks still running to end
/// (their workers are lost, or they finish), so that nothing they write outlives the job.
const SETTLE_LIMIT: Duration = Duration::from_secs(600);

/// Splits `input` (the job's, its files named absolutely) by privacy unit into `prefix` of
/// the scratch store, on the workers, under `key`.
pub(crate) async fn partition_by_workers(
    ctx: &JobContext<'_>,
    input: &Source,
    key: &PartitionKey,
    prefix: &str,
) -> Result<Partitioned, JobError> {
    let mut gather = ctx.gather();
    let partitioned = shuffle(ctx, &mut gather, (input, key), prefix).await;
    if partitioned.is_err() {
        gather.settle(SETTLE_LIMIT).await;
    }
    partitioned
}

/// The shard round, then the merge round, each answer checked as it comes.
async fn shuffle(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    (input, key): (&Source, &PartitionKey),
    prefix: &str,
) -> Result<Partitioned, JobError> {
    let spec = ctx.spec();
    let scratch_url = storage::absolute_url(&ctx.scratch.url);
    let scratch_url = scratch_url.trim_end_matches('/');
    let job = ShardJob {
        input: input.clone(),
        schema: spec.schema.clone(),
        domain: ctx.domain.clone(),
        partitions_url: format!("{scratch_url}/{prefix}"),
        partitions: spec.job.partitions,
    };
    let shards = plan_shards(input, SHARD_ROWS).await?;
    let job_json = to_json(&job);
    // The shards' number follows the input's size: the operator's log only, never the
    // job's progress.
    let logged = |done: usize, total: usize| tracing::info!(done, total, "shard read");

    let reads = shards
        .iter()
        .enumerate()
        .map(|(s, shard)| {
            let read = ReadShard {
                job_json: job_json.clone(),
                url: shard.url.clone(),
                row_groups: shard.row_groups.iter().map(|&g| g as u32).collect(),
                first_row: shard.first_row,
                shard: s as u32,
                key: key.to_bytes(),
            };
            (Work::ReadShard(read), Vec::new())
        })
        .collect();
    let mut read: Vec<Option<(ShardCounts, String)>> = vec![None; shards.len()];
    // Each partition's units as the readers sketched them, merged as they answer.
    let mut sketches = vec![UnitSketch::default(); spec.job.partitions as usize];
    let take_read = |s: usize, worker: &str, values: Vec<f64>| {
        let mut counts = ShardCounts::from_tensor(&job, &values)?;
        std::mem::take(&mut counts.sketches).iter().zip(&mut sketches).for_each(|(shard, all)| all.merge(shard));
        read[s] = Some((counts, worker.to_string()));
        Ok(())
    };
    gather.each(reads, "shard", take_read, logged).await?;
    let read: Vec<(ShardCounts, String)> = read.into_iter().map(|r| r.expect("every shard answered")).collect();
    log_skipped(read.iter().map(|(counts, _)| &counts.skipped));

    let urls: Vec<String> =
        (0..spec.job.partitions).map(|k| format!("{scratch_url}/{}", partition_file(prefix, k))).collect();
    let merge = Work::MergePartition(MergePartition { job_json, shards: shards.len() as u32 });
    let merges = urls.iter().map(|url| (merge.clone(), vec![url.clone()])).collect();
    let mut censuses: Vec<Option<Census>> = vec![None; urls.len()];
    let take_census = |k: usize, worker: &str, values: Vec<f64>| {
        let census = Census::from_tensor(&values, shards.len())?;
        // Each bucket holds what its reader wrote: a reader or an owner whose count is false
        // fails the job here, before any round.
        for (s, ((counts, reader), &merged)) in read.iter().zip(&census.rows_per_shard).enumerate() {
            if counts.rows[k] != merged {
                return Err(format!(
                    "partition {k}: {worker} merged {merged} rows from shard {s}, whose reader ({reader}) wrote {}",
                    counts.rows[k]
                ));
            }
        }
        // Its units are what the readers wrote: each row one, or as many as their sketch
        // estimates, within its stated error.
        let rows: u64 = census.rows_per_shard.iter().sum();
        let counted = if job.row_level() { census.units == rows } else { sketches[k].accepts(census.units) };
        if !counted {
            let estimate = sketches[k].estimate();
            return Err(format!(
                "partition {k}: {worker} counted {} units in {rows} rows, where its readers' sketch estimates \
                 {estimate:.0}",
                census.units
            ));
        }
        censuses[k] = Some(census);
        Ok(())
    };
    ctx.progress_mut().tasks_total = urls.len() as u32;
    gather.each(merges, "census", take_census, ctx.round_progress()).await?;

    // The buckets are merged: only the partitions stay for the job's rounds.
    let buckets: Vec<_> = (0..spec.job.partitions)
        .flat_map(|k| (0..shards.len() as u32).map(move |s| bucket_file(&partition_file(prefix, k), s)))
        .map(|bucket| ctx.scratch.child(&bucket))
        .collect();
    scratch::delete_objects(ctx.scratch, buckets).await;

    let mut partitioned =
        Partitioned { urls, units: 0, units_per_partition: Vec::new(), rows_per_unit: BTreeMap::new() };
    let mut rows: u64 = 0;
    // Saturating: each count is below 2⁵³ (checked), their sums over many partitions too.
    for census in censuses.into_iter().map(|c| c.expect("every partition answered")) {
        rows = census.rows_per_shard.iter().fold(rows, |sum, &r| sum.saturating_add(r));
        partitioned.units = partitioned.units.saturating_add(census.units);
        partitioned.units_per_partition.push(census.units);
        for (rows, units) in census.rows_per_unit {
            let held = partitioned.rows_per_unit.entry(rows).or_insert(0);
            *held = held.saturating_add(units);
        }
    }
    // Counts of the input: the operator's log only.
    tracing::info!(shards = shards.len(), rows, units = partitioned.units, "partitioned by the workers");
    Ok(partitioned)
}

/// The values that broke the schema, summed over the shards: row-level and private, for
/// the operator's log only (as the coordinator's own reading logs them).
pub(crate) fn log_skipped<'a>(shards: impl IntoIterator<Item = &'a SkippedRows>) {
    let mut total = SkippedRows::default();
    for skipped in shards {
        total.rows = total.rows.saturating_add(skipped.rows);
        for (key, n) in &skipped.by_column {
            let held = total.by_column.entry(key.clone()).or_insert(0);
            *held = held.saturating_add(*n);
        }
    }
    if !total.by_column.is_empty() {
        let by_column: Vec<String> =
            total.by_column.iter().map(|((column, reason), n)| format!("{column}: {reason} ×{n}")).collect();
        tracing::warn!(rows_left_out = total.rows, ?by_column, "values that break the job's schema");
    }
}

#[cfg(test)]
mod tests {
    use rhosynth_proto::MAX_RESULT_VALUES;
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::spec::{JobSpec, MAX_PARTITIONS};

    use super::*;

    /// A shard's counts for the most partitions a spec may declare, with a sketch of each
    /// and a thousand columns, fit one result: no job the spec admits fails on them after
    /// reading its input.
    #[test]
    fn the_most_partitions_fit_a_shards_counts() {
        let columns: String =
            (0..1000).map(|c| format!("[[schema.columns]]\nname = \"c{c}\"\nkind = \"identifier\"\n")).collect();
        let text = format!(
            "[job]\ndataset_id = \"d\"\npartitions = {MAX_PARTITIONS}\n[input]\nurls = [\"x.csv\"]\n[schema]\n\
             unit_column = \"c0\"\n{columns}[privacy]\nepsilon = 1.0\ndelta = 1e-6\n[generator]\nname = \"marginals\"\n\
             [output]\nurl = \"o\"\n"
        );
        let spec = JobSpec::parse(&text, "inline").unwrap();
        let domain = Domain::from_spec(&spec);
        let job = ShardJob {
            input: spec.input,
            schema: spec.schema,
            domain,
            partitions_url: "s".into(),
            partitions: MAX_PARTITIONS,
        };
        assert!(!job.row_level());
        assert!(ShardCounts::tensor_len(&job) as u64 <= MAX_RESULT_VALUES, "{}", ShardCounts::tensor_len(&job));
        assert!(
            JobSpec::parse(&text.replace(&format!("partitions = {MAX_PARTITIONS}"), "partitions = 16385"), "inline")
                .is_err()
        );
    }
}
