//! Partitioning by privacy unit: every row of a unit lands in one partition, no unit is
//! in two, no row is lost, and the units are counted by their rows.

use std::collections::{HashMap, HashSet};

use rhosynth_shared::data::EncodedBatch;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::data::partition::{PartitionKey, PartitionWriter, read_partition};
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;

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
