//! Partitioning by privacy unit: every row of a unit lands in one partition, no unit is
//! in two, no row is lost, and the units are counted by their rows.

use std::collections::{HashMap, HashSet};

use rhosynth_shared::data::EncodedBatch;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::partition::{PartitionKey, PartitionWriter, read_partition};
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;
use rhosynth_shared::testing::partition_rows;

const SPEC: &str = r#"
[job]
dataset_id = "partition-test"
partitions = 7
[input]
urls = ["unused.csv"]
[schema]
unit_column = "id"
[[schema.columns]]
name = "id"
kind = "identifier"
[[schema.columns]]
name = "x"
kind = "integer"
min = 0
max = 1000
[privacy]
epsilon = 1.0
delta = 1e-6
[generator]
name = "marginals"
[output]
url = "unused"
"#;

#[tokio::test]
async fn units_never_straddle_partitions() {
    let spec = JobSpec::parse(SPEC, "inline").unwrap();
    let domain = Domain::from_spec(&spec);
    let dir = tempfile::tempdir().unwrap();
    let scratch = storage::open(dir.path().to_str().unwrap()).unwrap();
    let mut writer = PartitionWriter::new(&scratch, "job", &domain, 7, PartitionKey::generate().unwrap()).unwrap();
    // 500 units with 1..=20 rows each, interleaved across 10 batches.
    let mut expected: HashMap<String, usize> = HashMap::new();
    for batch in 0..10 {
        let mut rows = EncodedBatch::empty(1);
        for unit in 0..500 {
            let n = unit % 20 + 1;
            for r in 0..n {
                if r % 10 == batch {
                    rows.units.push(format!("patient-{unit}"));
                    rows.values[0].push(Some(r as f64));
                    *expected.entry(format!("patient-{unit}")).or_default() += 1;
                }
            }
        }
        writer.write(rows).await.unwrap();
    }
    let partitioned = writer.finish().await.unwrap();
    // 25 units of each length 1..=20, however their rows arrived.
    assert_eq!(partitioned.rows_per_unit, (1..=20).map(|rows| (rows, 25)).collect());
    assert_eq!((partitioned.units, partitioned.units_per_partition.iter().sum::<u64>()), (500, 500));
    let urls = partitioned.urls;
    assert_eq!(urls.len(), 7);
    let mut seen_in: HashMap<String, HashSet<usize>> = HashMap::new();
    let mut rows_of: HashMap<String, usize> = HashMap::new();
    for (p, url) in urls.iter().enumerate() {
        read_partition(url, &domain, |batch| {
            for unit in batch.units {
                seen_in.entry(unit.clone()).or_default().insert(p);
                *rows_of.entry(unit).or_default() += 1;
            }
            Ok(())
        })
        .await
        .unwrap();
    }
    assert!(seen_in.values().all(|parts| parts.len() == 1), "a unit straddles partitions");
    assert_eq!(rows_of, expected, "every row of every unit arrives exactly once");
    let used: HashSet<usize> = seen_in.values().flatten().copied().collect();
    assert_eq!(used.len(), 7, "500 units spread over all 7 partitions");
}

#[test]
fn the_partition_key_is_secret_and_per_job() {
    let (a, b) = (PartitionKey::generate().unwrap(), PartitionKey::generate().unwrap());
    let units: Vec<String> = (0..64).map(|i| format!("u{i}")).collect();
    let pa: Vec<u32> = units.iter().map(|u| a.partition_of(u, 1000)).collect();
    let pb: Vec<u32> = units.iter().map(|u| b.partition_of(u, 1000)).collect();
    assert_ne!(pa, pb, "two jobs' keys assign units differently");
    assert_eq!(pa, units.iter().map(|u| a.partition_of(u, 1000)).collect::<Vec<_>>(), "deterministic per key");
}

/// The input of [`workers_partition_as_the_coordinator_does`]: units whose rows are spread
/// over a CSV file, a gzipped CSV file with a byte-order mark, and a Parquet file of
/// 60-row row groups; every 97th row has a value that breaks the schema.
fn shuffled_input(dir: &std::path::Path, unit_column: bool) -> JobSpec {
    use std::io::Write;
    let line = |r: usize| {
        let unit = format!("u{}", (r * 7919) % 173);
        let x = if r.is_multiple_of(97) { "n/a".to_string() } else { (r % 1000).to_string() };
        (unit, x)
    };
    let mut csv = String::from("id,x\n");
    (0..400).map(line).for_each(|(u, x)| csv.push_str(&format!("{u},{x}\n")));
    std::fs::write(dir.join("a.csv"), csv).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"\xef\xbb\xbfid,x\n").unwrap();
    (400..700).map(line).for_each(|(u, x)| gz.write_all(format!("{u},{x}\n").as_bytes()).unwrap());
    std::fs::write(dir.join("b.csv.gz"), gz.finish().unwrap()).unwrap();
    let (units, xs): (Vec<String>, Vec<String>) = (700..1330).map(line).unzip();
    let batch = arrow_array::RecordBatch::try_from_iter([
        ("id", std::sync::Arc::new(arrow_array::StringArray::from(units)) as arrow_array::ArrayRef),
        ("x", std::sync::Arc::new(arrow_array::StringArray::from(xs)) as arrow_array::ArrayRef),
    ])
    .unwrap();
    let properties =
        parquet::file::properties::WriterProperties::builder().set_max_row_group_row_count(Some(60)).build();
    let file = std::fs::File::create(dir.join("c.parquet")).unwrap();
    let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let urls: Vec<String> =
        ["a.csv", "b.csv.gz", "c.parquet"].iter().map(|f| format!("\"{}\"", dir.join(f).display())).collect();
    let text = SPEC.replace("urls = [\"unused.csv\"]", &format!("urls = [{}]\nbad_rows = \"skip\"", urls.join(", ")));
    let text = if unit_column { text } else { text.replace("unit_column = \"id\"\n", "") };
    JobSpec::parse(&text, "inline").unwrap()
}

/// Partitioning by the workers (shards, their buckets, each partition merged) writes the
/// partitions the coordinator's own reading writes for the same key: the same rows in
/// the same partitions, in the same order, counted alike, with the same bad rows left out.
/// Parquet shards of two row groups number their rows from the file's (a row-level unit
/// is named by it), and units straddle shards and files. The readers' sketches of each
/// partition's units accept the owner's count, and not twice it.
#[tokio::test]
async fn workers_partition_as_the_coordinator_does() {
    use rhosynth_shared::data::input::InputReader;
    use rhosynth_shared::data::shard::{
        RecordSpan, ShardCounts, ShardJob, ShardPart, ShardSize, merge_partition, plan_shards, read_shard,
    };

    for unit_column in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let spec = shuffled_input(dir.path(), unit_column);
        let domain = Domain::from_spec(&spec);
        let key = PartitionKey::generate().unwrap();

        let here = storage::open(dir.path().join("here").to_str().unwrap()).unwrap();
        let mut writer = PartitionWriter::new(&here, "job", &domain, 7, key.clone()).unwrap();
        let mut input = InputReader::new(&spec.input, &spec.schema, &domain);
        while let Some(batch) = input.next_batch().await.unwrap() {
            writer.write(batch).await.unwrap();
        }
        let skipped_here = input.skipped().unwrap().clone();
        let by_coordinator = writer.finish().await.unwrap();

        // A row-level unit of a CSV byte range is named by the range (its row in the file is
        // not known to its reader): the ranges are compared by units with a unit column.
        let bytes = if unit_column { 1000 } else { u64::MAX };
        let shards = plan_shards(&spec.input, ShardSize { rows: 120, bytes }).await.unwrap();
        // The plain CSV file in ranges of 1,000 bytes, the gzipped one whole, and the
        // Parquet file's 11 row groups two by two.
        let ranges = if unit_column { 4 } else { 1 };
        assert_eq!(shards.len(), ranges + 1 + 6);
        let first_rows: Vec<u64> = shards[ranges + 1..]
            .iter()
            .map(|s| match s.part {
                ShardPart::RowGroups { first_row, .. } => first_row,
                _ => panic!("{s:?}"),
            })
            .collect();
        assert_eq!(first_rows, [0, 120, 240, 360, 480, 600]);
        let partitions_url = dir.path().join("workers/job").display().to_string();
        let job = ShardJob {
            input: spec.input.clone(),
            schema: spec.schema.clone(),
            domain: domain.clone(),
            partitions_url,
            partitions: 7,
            keys: Vec::new(),
        };
        let mut read: Vec<ShardCounts> = Vec::new();
        for (s, shard) in shards.iter().enumerate() {
            read.push(read_shard(&job, shard, s as u32, key.clone()).await.unwrap());
        }
        // The ranges join: each starts where the one before it ended.
        let spans: Vec<RecordSpan> = read[..ranges].iter().map(|r| r.span).collect();
        for pair in spans.windows(2) {
            let (RecordSpan::Bytes { end, .. }, RecordSpan::Bytes { first, .. }) = (pair[0], pair[1]) else {
                panic!("{spans:?}");
            };
            assert_eq!(end, first, "{spans:?}");
        }
        let skipped: u64 = read.iter().map(|r| r.skipped.rows).sum();
        assert_eq!((skipped, skipped_here.rows), (14, 14), "every 97th row of 1330 is left out");
        for (column_reason, n) in &skipped_here.by_column {
            assert_eq!(read.iter().filter_map(|r| r.skipped.by_column.get(column_reason)).sum::<u64>(), *n);
        }

        let mut units = 0;
        for (k, url) in by_coordinator.urls.iter().enumerate() {
            let merged_url = url.replace("/here/", "/workers/");
            let all: Vec<u32> = (0..shards.len() as u32).collect();
            let census = merge_partition(&job, &merged_url, &all).await.unwrap();
            let ours = partition_rows(&merged_url, &domain).await;
            assert_eq!(ours, partition_rows(url, &domain).await, "partition {k}");
            assert_eq!(census.units, by_coordinator.units_per_partition[k], "partition {k}'s units");
            let written: Vec<u64> = read.iter().map(|r| r.rows[k]).collect();
            assert_eq!(census.rows_per_shard, written, "partition {k}: what was merged is what was written");
            if unit_column {
                let mut sketch = rhosynth_shared::data::sketch::UnitSketch::default();
                read.iter().for_each(|r| sketch.merge(&r.sketches[k]));
                assert!(sketch.accepts(census.units), "partition {k}: the readers' sketch and the owner agree");
                assert!(!sketch.accepts(census.units * 2), "partition {k}: twice the units is refused");
            } else {
                assert!(read.iter().all(|r| r.sketches.is_empty()), "a row-level job's units are its rows");
            }
            for (rows, n) in census.rows_per_unit {
                units += n;
                assert!(by_coordinator.rows_per_unit.get(&rows).is_some_and(|&all| all >= n));
            }
        }
        assert_eq!(units, by_coordinator.units);
        assert_eq!(by_coordinator.units, if unit_column { 173 } else { 1330 - 14 });
    }
}

/// An input with no rows at all (a Parquet file of no row group) has no shard, and each
/// partition is merged from none: an empty file, no unit.
#[tokio::test]
async fn an_input_without_rows_partitions_into_empty_partitions() {
    use rhosynth_shared::data::shard::{ShardJob, ShardSize, merge_partition, plan_shards};

    let dir = tempfile::tempdir().unwrap();
    let schema = std::sync::Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("id", arrow_schema::DataType::Utf8, true),
        arrow_schema::Field::new("x", arrow_schema::DataType::Utf8, true),
    ]));
    let file = std::fs::File::create(dir.path().join("empty.parquet")).unwrap();
    parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap().close().unwrap();
    let url = dir.path().join("empty.parquet").display().to_string();
    let spec = JobSpec::parse(&SPEC.replace("unused.csv", &url), "inline").unwrap();
    let domain = Domain::from_spec(&spec);
    assert!(plan_shards(&spec.input, ShardSize { rows: 120, bytes: 1000 }).await.unwrap().is_empty());
    let partitions_url = dir.path().join("workers/job").display().to_string();
    let job = ShardJob {
        input: spec.input,
        schema: spec.schema,
        domain: domain.clone(),
        partitions_url,
        partitions: 7,
        keys: Vec::new(),
    };
    let url = rhosynth_shared::data::partition::partition_file(&job.partitions_url, 3);
    let census = merge_partition(&job, &url, &[]).await.unwrap();
    assert_eq!((census.units, census.rows_per_shard.len(), census.rows_per_unit.len()), (0, 0, 0));
    assert!(partition_rows(&url, &domain).await.is_empty());
}

/// Data the project did not make, read in byte ranges of 16 KiB as workers read a large
/// file's: UCI Adult's training and test files (no header; the test file starts with a `|`
/// comment and ends labels with `.`) and PBC's visits (a header and a unit column). Every
/// file's ranges join, and their rows are the whole reading's, in order.
#[tokio::test]
async fn files_from_outside_read_in_ranges_as_whole() {
    use rhosynth_shared::data::input::InputReader;
    use rhosynth_shared::data::shard::ShardPart;
    use rhosynth_shared::testing::shared_data;

    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let cases = [("adult-marginals.toml", "adult/adult.data"), ("adult-marginals.toml", "adult/adult.test")];
    let cases = cases.into_iter().chain([("pbcseq-marginals.toml", "pbcseq/pbcseq.csv")]);
    for (example, data) in cases {
        let Some(file) = shared_data(data) else { return };
        let mut spec = JobSpec::load(examples.join(example).to_str().unwrap()).unwrap();
        spec.input.urls = vec![file.display().to_string()];
        let domain = Domain::from_spec(&spec);
        // Each row's values (a row-level unit is named by its range: compared by values).
        let read = |part: ShardPart| {
            let (input, schema, domain) = (&spec.input, &spec.schema, &domain);
            async move {
                let mut reader = InputReader::new(input, schema, domain).with_part(part);
                let mut rows = Vec::new();
                while let Some(batch) = reader.next_batch().await.unwrap() {
                    for r in 0..batch.len() {
                        let unit = schema.unit_column.as_ref().map(|_| batch.units[r].clone());
                        rows.push((unit, batch.values.iter().map(|column| column[r]).collect::<Vec<_>>()));
                    }
                }
                (rows, reader.span())
            }
        };
        let (whole, _) = read(ShardPart::Whole).await;
        let size = std::fs::metadata(&file).unwrap().len();
        let (mut rows, mut end) = (Vec::new(), 0);
        for start in (0..size).step_by(16 << 10) {
            let (part_rows, span) = read(ShardPart::Bytes { start, end: (start + (16 << 10)).min(size) }).await;
            let (first, last) = span.unwrap_or_else(|| panic!("{data}: the range from {start} lost"));
            assert_eq!(first, if start == 0 { first } else { end }, "{data}: the range from {start} joins");
            rows.extend(part_rows);
            end = last;
        }
        assert_eq!(end, size, "{data}");
        assert!(whole.len() > 1500, "{data}: {} rows", whole.len());
        assert_eq!(rows, whole, "{data}");
    }
}
