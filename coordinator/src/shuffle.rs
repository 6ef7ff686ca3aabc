//! Partitioning by the workers, the coordinator's side (`data::shard` is the workers'):
//! shards planned from public metadata, a task per shard writing its buckets and sketching
//! their units, a task per partition merging them and counting its units, and the two
//! sides' counts checked against each other before any partition is used. The coordinator
//! holds no row and no unit: its memory does not grow with the input.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rhosynth_proto::MergePartition;
use rhosynth_proto::task::Work;
use rhosynth_shared::data::input::SkippedRows;
use rhosynth_shared::data::partition::{PartitionKey, Partitioned, bucket_file, partition_file};
use rhosynth_shared::data::shard::{
    Census, RecordSpan, Shard, ShardCounts, ShardJob, ShardPart, ShardSize, plan_shards,
};
use rhosynth_shared::data::sketch::UnitSketch;
use rhosynth_shared::storage;
use rhosynth_shared::wire::to_json;

use crate::context::{JobContext, JobError};
use crate::gather::Gather;
use crate::scratch;

/// How long a failed partitioning waits for its shard and merge tasks still running to end
/// (their workers are lost, or they finish), so that nothing they write outlives the job.
const SETTLE_LIMIT: Duration = Duration::from_secs(600);

/// The scratch store's URL of partition prefix `prefix`: a shard job's `partitions_url`.
pub(crate) fn partitions_url(ctx: &JobContext<'_>, prefix: &str) -> String {
    format!("{}/{prefix}", storage::absolute_url(&ctx.scratch.url).trim_end_matches('/'))
}

/// Splits `job`'s input (its files named absolutely) by privacy unit into `prefix` of the
/// scratch store (`job.partitions_url`), on the workers, under `key`.
pub(crate) async fn partition_by_workers(
    ctx: &JobContext<'_>,
    job: &ShardJob,
    key: &PartitionKey,
    prefix: &str,
) -> Result<Partitioned, JobError> {
    let mut gather = ctx.gather();
    let partitioned = shuffle(ctx, &mut gather, (job, key), prefix).await;
    if partitioned.is_err() {
        gather.settle(SETTLE_LIMIT).await;
    }
    partitioned
}

/// The shard round, then the merge round, each answer checked as it comes.
async fn shuffle(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    (job, key): (&ShardJob, &PartitionKey),
    prefix: &str,
) -> Result<Partitioned, JobError> {
    let partitions = job.partitions;
    let mut shards = plan_shards(&job.input, ShardSize::default()).await?;
    let job_json = to_json(&job);
    let read_task =
        |(s, shard): (usize, &Shard)| (Work::ReadShard(shard.task(job_json.clone(), s as u32, key)), Vec::new());
    // The shards' number follows the input's size: the operator's log only, never the
    // job's progress.
    let logged = |done: usize, total: usize| tracing::info!(done, total, "shard read");

    let mut answers = ShardAnswers::new(&shards, partitions as usize);
    let take_read = |s: usize, worker: &str, values: Vec<f64>| answers.take(job, &shards, s, worker, &values);
    gather.each(shards.iter().enumerate().map(read_task).collect(), "shard", take_read, logged).await?;

    // A file whose ranges do not join is read again whole, after the other shards.
    let unjoined = std::mem::take(&mut answers.unjoined);
    if !unjoined.is_empty() {
        // The operator's log: a quoted field that spans lines across a boundary (the same
        // for every job on the file), a line longer than a range, a worker or store error.
        tracing::warn!(files = ?unjoined, "a CSV file's ranges do not join: it is read whole");
        let first = shards.len();
        shards.extend(unjoined.iter().map(|url| Shard::whole(url)));
        let reads = shards.iter().enumerate().skip(first).map(read_task).collect();
        let take_whole =
            |s: usize, worker: &str, values: Vec<f64>| answers.take(job, &shards, first + s, worker, &values);
        gather.each(reads, "shard", take_whole, logged).await?;
    }
    let ShardAnswers { read, sketches, .. } = answers;
    let read: Vec<(ShardCounts, String)> = read.into_iter().map(|r| r.expect("every shard answered")).collect();
    // The shards merged, in the input's order: a file read again whole in place of its ranges.
    let merged: Vec<u32> = merge_order(&shards, &unjoined);
    log_skipped(merged.iter().map(|&s| &read[s as usize].0.skipped));

    let scratch_url = storage::absolute_url(&ctx.scratch.url);
    let scratch_url = scratch_url.trim_end_matches('/');
    let urls: Vec<String> = (0..partitions).map(|k| format!("{scratch_url}/{}", partition_file(prefix, k))).collect();
    let merge = Work::MergePartition(MergePartition { job_json, shards: merged.clone() });
    let merges = urls.iter().map(|url| (merge.clone(), vec![url.clone()])).collect();
    let mut censuses: Vec<Option<Census>> = vec![None; urls.len()];
    let take_census = |k: usize, worker: &str, values: Vec<f64>| {
        let census = Census::from_tensor(&values, merged.len())?;
        // Each bucket holds what its reader wrote: a reader or an owner whose count is false
        // fails the job here, before any round.
        for (&s, &merged) in merged.iter().zip(&census.rows_per_shard) {
            let (counts, reader) = &read[s as usize];
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
    let buckets: Vec<_> = (0..partitions)
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
    tracing::info!(shards = merged.len(), rows, units = partitioned.units, "partitioned by the workers");
    Ok(partitioned)
}

fn merge_sketches(into: &mut [UnitSketch], from: &[UnitSketch]) {
    from.iter().zip(into).for_each(|(from, into)| into.merge(from));
}

/// A shard reader's answer: its counts, and who read it.
type Answers = [Option<(ShardCounts, String)>];

/// The shard readers' answers as they come, and each partition's units as the readers
/// sketched them. A file read in byte ranges keeps its ranges' sketches apart until all of
/// them have answered, then merges them where the ranges join, or drops them and marks the
/// file to be read whole: the coordinator holds the sketches of the files being read, not
/// of every file.
struct ShardAnswers {
    read: Vec<Option<(ShardCounts, String)>>,
    sketches: Vec<UnitSketch>,
    /// Per file read in ranges (its shards are consecutive, and no file is named twice: the
    /// ledger refuses such an input before any read), its ranges and their sketches so far.
    split: BTreeMap<String, (std::ops::Range<usize>, Vec<UnitSketch>)>,
    /// The files whose ranges do not join.
    unjoined: BTreeSet<String>,
}

impl ShardAnswers {
    fn new(shards: &[Shard], partitions: usize) -> Self {
        let mut split: BTreeMap<String, (std::ops::Range<usize>, Vec<UnitSketch>)> = BTreeMap::new();
        for (s, shard) in shards.iter().enumerate() {
            if matches!(shard.part, ShardPart::Bytes { .. }) {
                split.entry(shard.url.clone()).or_insert((s..s, Vec::new())).0.end = s + 1;
            }
        }
        let sketches = vec![UnitSketch::default(); partitions];
        Self { read: Vec::new(), sketches, split, unjoined: BTreeSet::new() }
    }

    /// The answer of shard `s` of `shards`, read by `worker`.
    fn take(&mut self, job: &ShardJob, shards: &[Shard], s: usize, worker: &str, values: &[f64]) -> Result<(), String> {
        let mut counts = ShardCounts::from_tensor(job, values)?;
        let answer = std::mem::take(&mut counts.sketches);
        self.read.resize(shards.len(), None);
        self.read[s] = Some((counts, worker.to_string()));
        let url = &shards[s].url;
        let Some((ranges, held)) = self.split.get_mut(url) else {
            merge_sketches(&mut self.sketches, &answer);
            return Ok(());
        };
        held.resize(answer.len(), UnitSketch::default());
        merge_sketches(held, &answer);
        if self.read[ranges.clone()].iter().any(Option::is_none) {
            return Ok(());
        }
        let (ranges, held) = self.split.remove(url).expect("found above");
        if ranges_join(&shards[ranges.clone()], &self.read[ranges]) {
            merge_sketches(&mut self.sketches, &held);
        } else {
            self.unjoined.insert(url.clone());
        }
        Ok(())
    }
}

/// Whether a file's ranges join: each read, starting where the one before it ended (in
/// the range, past the header), and ending past its range's end; the last at the file's.
/// What honest readers of a file without a quoted field across a boundary report.
fn ranges_join(ranges: &[Shard], answers: &Answers) -> bool {
    let mut previous = None;
    for (shard, answer) in ranges.iter().zip(answers) {
        let (ShardPart::Bytes { start, end }, Some((counts, _))) = (&shard.part, answer) else {
            return false;
        };
        let RecordSpan::Bytes { first, end: last } = counts.span else {
            return false;
        };
        // (`first <= last` holds: a span read from its tensor.)
        if previous.is_some_and(|previous| previous != first) || first < *start || last < *end {
            return false;
        }
        previous = Some(last);
    }
    matches!(ranges.last(), Some(Shard { part: ShardPart::Bytes { end, .. }, .. }) if previous == Some(*end))
}

/// The shards to merge, in the input's order: each file's own, or, for a file in
/// `read_whole`, the whole-file shard planned for it after the others.
fn merge_order(shards: &[Shard], read_whole: &BTreeSet<String>) -> Vec<u32> {
    let whole = |url: &str| shards.iter().rposition(|s| s.url == url && s.part == ShardPart::Whole);
    let mut order = Vec::new();
    for (s, shard) in shards.iter().enumerate() {
        let replaced = read_whole.contains(&shard.url);
        match shard.part {
            // The whole-file reading stands where the file's first range stood.
            ShardPart::Bytes { start: 0, .. } if replaced => order.push(whole(&shard.url).expect("planned") as u32),
            _ if replaced => {}
            _ => order.push(s as u32),
        }
    }
    order
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
    use rhosynth_shared::data::input::InputReader;
    use rhosynth_shared::data::partition::PartitionWriter;
    use rhosynth_shared::data::shard::{merge_partition, read_shard};
    use rhosynth_shared::spec::{JobSpec, MAX_PARTITIONS};
    use rhosynth_shared::testing::partition_rows;

    use super::*;

    /// Two CSV files cut into ranges of 97 bytes; in one, every 7th row's note is quoted
    /// and spans two lines. Its ranges that start inside a note do not join, so that file
    /// is read whole in their place, and the partitions are row for row those of the
    /// coordinator's own reading; the other file keeps its ranges. Without a unit column,
    /// the kept ranges name their rows by range: the same rows, each its own unit.
    #[tokio::test]
    async fn a_file_whose_ranges_do_not_join_is_read_whole_in_their_place() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, multiline: bool| {
            let mut text = String::from("id,note,x\n");
            for r in 0..300 {
                let note = match r % 7 {
                    0 if multiline => format!("\"a \"\"quoted\"\", note\nof two lines {r}\""),
                    _ => format!("note {r}"),
                };
                text.push_str(&format!("u{},{note},{}\n", r % 40, r % 100));
            }
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let (notes, plain) = (write("notes.csv", true), write("plain.csv", false));
        for unit_column in [true, false] {
            let spec = format!(
                "[job]\ndataset_id = \"d\"\npartitions = 5\n[input]\nurls = [\"{notes}\", \"{plain}\"]\n[schema]\n\
                 unit_column = \"id\"\n[[schema.columns]]\nname = \"id\"\nkind = \"identifier\"\n[[schema.columns]]\n\
                 name = \"x\"\nkind = \"integer\"\nmin = 0\nmax = 100\n[privacy]\nepsilon = 1.0\ndelta = 1e-6\n\
                 [generator]\nname = \"marginals\"\n[output]\nurl = \"o\"\n"
            );
            let spec = if unit_column { spec } else { spec.replace("unit_column = \"id\"\n", "") };
            let spec = JobSpec::parse(&spec, "inline").unwrap();
            let domain = Domain::from_spec(&spec);
            let key = PartitionKey::generate().unwrap();
            let here = storage::open(dir.path().join(format!("here-{unit_column}")).to_str().unwrap()).unwrap();
            let mut writer = PartitionWriter::new(&here, "job", &domain, 5, key.clone()).unwrap();
            let mut input = InputReader::new(&spec.input, &spec.schema, &domain);
            while let Some(batch) = input.next_batch().await.unwrap() {
                writer.write(batch).await.unwrap();
            }
            let by_coordinator = writer.finish().await.unwrap();

            let mut shards = plan_shards(&spec.input, ShardSize { rows: 1 << 20, bytes: 97 }).await.unwrap();
            let planned = shards.len();
            assert!(shards.iter().all(|s| matches!(s.part, ShardPart::Bytes { .. })), "{shards:?}");
            let workers = dir.path().join(format!("workers-{unit_column}/job")).display().to_string();
            let job = ShardJob {
                input: spec.input.clone(),
                schema: spec.schema.clone(),
                domain: domain.clone(),
                partitions_url: workers,
                partitions: 5,
                keys: Vec::new(),
            };
            let mut answers = ShardAnswers::new(&shards, 5);
            for (s, shard) in shards.iter().enumerate() {
                let counts = read_shard(&job, shard, s as u32, key.clone()).await.unwrap();
                answers.take(&job, &shards, s, "w", &counts.to_tensor(&job)).unwrap();
            }
            assert!(answers.split.is_empty(), "every file's ranges answered");
            let unjoined = std::mem::take(&mut answers.unjoined);
            assert_eq!(unjoined, BTreeSet::from([notes.clone()]));
            shards.push(Shard::whole(&notes));
            let counts = read_shard(&job, &shards[planned], planned as u32, key.clone()).await.unwrap();
            answers.take(&job, &shards, planned, "w", &counts.to_tensor(&job)).unwrap();
            assert!(answers.read.iter().all(Option::is_some), "every shard answered");
            let order = merge_order(&shards, &unjoined);
            let plain_ranges: Vec<u32> = (0..planned as u32).filter(|&s| shards[s as usize].url == plain).collect();
            assert_eq!(order, [vec![planned as u32], plain_ranges].concat());

            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            for (k, url) in by_coordinator.urls.iter().enumerate() {
                let merged_url = url.replace(&format!("/here-{unit_column}/"), &format!("/workers-{unit_column}/"));
                let census = merge_partition(&job, &merged_url, &order).await.unwrap();
                let (merged, read_here) =
                    (partition_rows(&merged_url, &domain).await, partition_rows(url, &domain).await);
                if unit_column {
                    assert_eq!(census.units, by_coordinator.units_per_partition[k], "partition {k}'s units");
                    assert_eq!(merged, read_here, "partition {k}");
                }
                ours.extend(merged);
                theirs.extend(read_here);
            }
            assert_eq!(ours.len(), 600);
            let values = |rows: &[(String, Vec<Option<f64>>)]| {
                let mut values: Vec<String> = rows.iter().map(|(_, v)| format!("{v:?}")).collect();
                values.sort();
                values
            };
            assert_eq!(values(&ours), values(&theirs));
            if !unit_column {
                let units: BTreeSet<&String> = ours.iter().map(|(unit, _)| unit).collect();
                assert_eq!(units.len(), 600, "each row its own unit");
            }
        }
    }

    /// Spans a reader could report for a file of two ranges, `[0, 100)` and `[100, 150)`:
    /// only those of honest readers join.
    #[test]
    fn only_spans_honest_readers_report_join() {
        let url = "f.csv";
        let ranges =
            [(0, 100), (100, 150)].map(|(start, end)| Shard { url: url.into(), part: ShardPart::Bytes { start, end } });
        let answer = |span: RecordSpan| {
            let counts = ShardCounts { rows: vec![0], sketches: Vec::new(), skipped: SkippedRows::default(), span };
            Some((counts, String::new()))
        };
        let bytes = |first, end| RecordSpan::Bytes { first, end };
        let joins = |spans: [RecordSpan; 2]| ranges_join(&ranges, &spans.map(answer));
        assert!(joins([bytes(10, 104), bytes(104, 150)]), "after a header, a record across the boundary");
        assert!(joins([bytes(10, 150), bytes(150, 150)]), "a record to the file's end");
        assert!(!joins([bytes(10, 104), bytes(102, 150)]), "a guess inside the record before");
        assert!(!joins([bytes(10, 104), RecordSpan::Lost]));
        assert!(!joins([bytes(10, 104), bytes(104, 149)]), "not to the file's end");
        assert!(!joins([bytes(10, 99), bytes(99, 150)]), "ended before its range's end");
        assert!(!joins([bytes(10, 104), bytes(104, 160)]), "past the file's end");
        assert!(!joins([RecordSpan::Unsplit, bytes(104, 150)]));
    }

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
            keys: Vec::new(),
        };
        assert!(!job.row_level());
        assert!(ShardCounts::tensor_len(&job) as u64 <= MAX_RESULT_VALUES, "{}", ShardCounts::tensor_len(&job));
        assert!(
            JobSpec::parse(&text.replace(&format!("partitions = {MAX_PARTITIONS}"), "partitions = 16385"), "inline")
                .is_err()
        );
    }
}
