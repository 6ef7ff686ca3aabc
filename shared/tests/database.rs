//! Reading a database by privacy unit: a unit's rows in every table land in one partition
//! index; the worker reading a unit keeps at most each child table's cap of rows per
//! parent row, the first by `order_by` (or a fixed-seed sample), with their places under
//! the unit; rows of dropped or absent parents are left out and counted. Checked against
//! the simulated database's own CSV text, recounted here.

use std::collections::{BTreeMap, HashMap};

use rhosynth_shared::data::database::{
    Database, DroppedRows, Layout, PARENT_COLUMN, PartitionedTable, ROW_COLUMN, View, partition_database, read_units,
};
use rhosynth_shared::data::partition::PartitionKey;
use rhosynth_shared::generators::database::{FittedView, Plans, sample_database};
use rhosynth_shared::output::SyntheticValue;
use rhosynth_shared::pgm::{GraphicalModel, Measurement};
use rhosynth_shared::simulate::database::{Database as SimulatedDatabase, database_csv};
use rhosynth_shared::spec::{JobSpec, parse_datetime};
use rhosynth_shared::storage;
use rhosynth_shared::testing::{database_job, rank_correlation, with_intervals, write_database};

const ADMISSIONS_CAP: usize = 2;
const VITALS_CAP: usize = 6;

/// The CSV's data rows as fields.
fn rows(csv: &str) -> Vec<Vec<String>> {
    csv.lines().skip(1).map(|l| l.split(',').map(str::to_string).collect()).collect()
}

fn seconds(text: &str) -> f64 {
    parse_datetime(text).unwrap()
}

/// A table's kept rows: by unit, the partition index and the rows' values (a child's
/// followed by its `__row` and `__parent`).
type ReadBack = HashMap<String, Vec<(usize, Vec<Option<f64>>)>>;

/// Every unit's kept rows as the workers cap them, each partition index read whole, table
/// by table; and what was left out of each table (by the caps, and as read).
struct Kept {
    rows: Vec<ReadBack>,
    dropped: Vec<DroppedRows>,
    layout: Layout,
}

async fn kept(spec: &JobSpec, tables: &[PartitionedTable]) -> Kept {
    let layout = Layout::of(&Database::of_spec(spec));
    let mut rows = vec![ReadBack::new(); tables.len()];
    let mut dropped: Vec<DroppedRows> =
        tables.iter().map(|t| DroppedRows { bad: t.bad, ..Default::default() }).collect();
    for p in 0..tables[0].partitions.urls.len() {
        let urls: Vec<String> = tables.iter().map(|t| t.partitions.urls[p].clone()).collect();
        let (units, left_out) = read_units(&layout, &urls).await.unwrap();
        dropped.iter_mut().zip(&left_out).for_each(|(total, d)| total.add(d));
        for (unit, unit_rows) in units {
            for (t, table_rows) in unit_rows.tables.into_iter().enumerate() {
                rows[t].entry(unit.clone()).or_default().extend(table_rows.into_iter().map(|row| (p, row)));
            }
        }
    }
    Kept { rows, dropped, layout }
}

async fn partitioned(dir: &std::path::Path, vitals_order: &str) -> (JobSpec, Vec<PartitionedTable>) {
    let text = database_job(dir, (ADMISSIONS_CAP as u32, VITALS_CAP as u32), vitals_order);
    let spec = JobSpec::parse(&text, "db").unwrap();
    let reach = rhosynth_shared::spec::tables::validate(&spec.input, &spec.schema, &spec.tables).unwrap();
    assert_eq!(reach, vec![1, ADMISSIONS_CAP as u64, (ADMISSIONS_CAP * VITALS_CAP) as u64]);
    let scratch = storage::open(dir.join("scratch").to_str().unwrap()).unwrap();
    let key = PartitionKey::generate().unwrap();
    let tables = partition_database(&Database::of_spec(&spec), &scratch, "job", 5, key).await.unwrap();
    (spec, tables)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_units_rows_are_capped_by_the_public_rule_and_partitioned_together() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_csv(300, 5);
    // A patient written twice, an admission of no patient with two charts, and a chart of
    // no admission of its patient.
    let patients = format!("{}S000000,50,F,none\n", db.patients);
    let admissions = format!("{}H999999,S999999,2025-01-01 00:00:00,2025-01-02 00:00:00,urgent,home\n", db.admissions);
    let vitals = format!(
        "{}S999999,H999999,2025-01-01 01:00:00,80,16,97\nS999999,H999999,2025-01-01 02:00:00,81,16,97\n\
         S000001,H888888,2025-01-01 01:00:00,80,16,97\n",
        db.vitals
    );
    write_database(dir.path(), &SimulatedDatabase { patients, admissions, vitals });
    let (spec, tables) = partitioned(dir.path(), "order_by = \"charttime\"").await;
    assert_eq!(tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["patients", "admissions", "vitals"]);

    // What the rule keeps, recounted from the CSV text: each patient's first admissions
    // by time, each kept admission's first charts by time.
    let mut admissions_of: BTreeMap<String, Vec<(f64, String)>> = BTreeMap::new();
    for row in rows(&db.admissions) {
        admissions_of.entry(row[1].clone()).or_default().push((seconds(&row[2]), row[0].clone()));
    }
    let mut charts_of: HashMap<String, Vec<f64>> = HashMap::new();
    for row in rows(&db.vitals) {
        charts_of.entry(row[1].clone()).or_default().push(seconds(&row[2]));
    }
    let (mut admissions_over, mut charts_over, mut charts_of_capped) = (0, 0, 0);
    // By unit: the kept admission times in order, and each one's kept chart times.
    let mut expected: HashMap<String, Vec<(f64, Vec<f64>)>> = HashMap::new();
    for (subject, mut stays) in admissions_of {
        stays.sort_by(|a, b| a.0.total_cmp(&b.0));
        admissions_over += stays.len().saturating_sub(ADMISSIONS_CAP);
        for (i, (admitted, hadm)) in stays.into_iter().enumerate() {
            let mut charts = charts_of.remove(&hadm).unwrap_or_default();
            if i >= ADMISSIONS_CAP {
                charts_of_capped += charts.len();
                continue;
            }
            charts.sort_by(f64::total_cmp);
            charts_over += charts.len().saturating_sub(VITALS_CAP);
            charts.truncate(VITALS_CAP);
            expected.entry(subject.clone()).or_default().push((admitted, charts));
        }
    }
    assert!(admissions_over > 20 && charts_over > 1000, "the caps bind: {admissions_over}, {charts_over}");

    assert_eq!(tables[0].partitions.units, 300);
    let Kept { rows: read, dropped, layout } = kept(&spec, &tables).await;
    let [patient_rows, admission_rows, vital_rows] = &read[..] else { panic!("three tables") };
    let dropped = |t: usize| (dropped[t].over_cap, dropped[t].without_parent, dropped[t].duplicate_keys);
    assert_eq!(dropped(0), (1, 0, 0), "the second row of S000000");
    assert_eq!(dropped(1), (admissions_over as u64, 1, 0));
    // The charts of an admission the cap dropped go with it, by the cap; three charts
    // have no admission of their patient.
    assert_eq!(dropped(2), ((charts_over + charts_of_capped) as u64, 3, 0));
    // One unit reaches at most the product of the caps in each table.
    assert!(admission_rows.values().all(|rows| rows.len() <= ADMISSIONS_CAP));
    assert!(vital_rows.values().all(|rows| rows.len() <= ADMISSIONS_CAP * VITALS_CAP));

    let column = |t: usize, name: &str| layout.tables[t].domain.index_of(name).unwrap();
    let (admitted, row, parent) = (column(1, "admittime"), column(1, ROW_COLUMN), column(2, PARENT_COLUMN));
    let (charted, chart_row) = (column(2, "charttime"), column(2, ROW_COLUMN));
    assert_eq!(patient_rows.len(), 300);
    assert_eq!(admission_rows.len(), expected.len(), "every patient with an admission, no orphan");
    for (unit, rows) in patient_rows {
        assert_eq!(rows.len(), 1, "{unit}: one row");
        let partition = &rows[0].0;
        let stays = admission_rows.get(unit).map_or(&[][..], |r| &r[..]);
        let charts = vital_rows.get(unit).map_or(&[][..], |r| &r[..]);
        assert!(stays.iter().chain(charts).all(|(p, _)| p == partition), "{unit}: one partition in every table");
        let wanted = expected.get(unit).map_or(&[][..], |w| &w[..]);
        // The kept admissions: the first by time, numbered in that order.
        let mut got: Vec<(f64, f64)> = stays.iter().map(|(_, v)| (v[row].unwrap(), v[admitted].unwrap())).collect();
        got.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(got, wanted.iter().enumerate().map(|(i, (t, _))| (i as f64, *t)).collect::<Vec<_>>(), "{unit}");
        // Each kept admission's first charts, under its number; charts numbered in order.
        for (ordinal, (_, times)) in wanted.iter().enumerate() {
            let mut got: Vec<f64> = charts
                .iter()
                .filter(|(_, v)| v[parent] == Some(ordinal as f64))
                .map(|(_, v)| v[charted].unwrap())
                .collect();
            got.sort_by(f64::total_cmp);
            assert_eq!(&got, times, "{unit}, admission {ordinal}");
        }
        let mut numbers: Vec<f64> = charts.iter().map(|(_, v)| v[chart_row].unwrap()).collect();
        numbers.sort_by(f64::total_cmp);
        assert_eq!(numbers, (0..charts.len()).map(|n| n as f64).collect::<Vec<_>>(), "{unit}");
    }
    assert_eq!(spec.tables.len(), 2);
}

/// Without `order_by`, a fixed-seed sample: the same rows on every reading of the same
/// files, within the cap, and not simply the first in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_order_the_cap_keeps_the_same_sample_every_time() {
    let dir = tempfile::tempdir().unwrap();
    let db = database_csv(120, 9);
    write_database(dir.path(), &db);
    let charts = |(spec, tables): (JobSpec, Vec<PartitionedTable>)| async move {
        let Kept { mut rows, layout, .. } = kept(&spec, &tables).await;
        let vitals = &layout.tables[2].domain;
        let (time, parent) = (vitals.index_of("charttime").unwrap(), vitals.index_of(PARENT_COLUMN).unwrap());
        let mut kept: Vec<(String, u64, u64)> = rows
            .remove(2)
            .into_iter()
            .flat_map(|(unit, rows)| {
                rows.into_iter().map(move |(_, v)| (unit.clone(), v[parent].unwrap() as u64, v[time].unwrap() as u64))
            })
            .collect();
        kept.sort();
        kept
    };
    let first = charts(partitioned(dir.path(), "").await).await;
    let again = charts(partitioned(dir.path(), "").await).await;
    assert_eq!(first, again, "the same sample on the same files");
    let mut per_stay: BTreeMap<(String, u64), Vec<u64>> = BTreeMap::new();
    first.iter().for_each(|(u, p, t)| per_stay.entry((u.clone(), *p)).or_default().push(*t));
    assert!(per_stay.values().all(|times| times.len() <= VITALS_CAP));
    // Charts are written in time order: a prefix rule would keep each stay's first ones.
    let by_time = charts(partitioned(dir.path(), "order_by = \"charttime\"").await).await;
    assert_ne!(first, by_time, "a sample, not the first rows");
}

/// A partition read in passes within a small bound keeps what one reading keeps: each
/// unit whole in exactly one pass, the same rows and the same counts left out. The first
/// passes follow the files' rows; a pass whose units' size passes the bound is read again
/// as two. The size is the rows read, not the rows the caps keep: under other caps the
/// same partition is read in the same passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_read_in_passes_keeps_what_one_reading_keeps() {
    use rhosynth_shared::data::database::passes::{Pass, PassReader, read_pass};

    let dir = tempfile::tempdir().unwrap();
    let db = database_csv(300, 4);
    write_database(dir.path(), &db);
    let (spec, tables) = partitioned(dir.path(), "order_by = \"charttime\"").await;
    let layout = Layout::of(&Database::of_spec(&spec));
    let urls: Vec<String> = tables.iter().map(|t| t.partitions.urls[0].clone()).collect();
    let (whole, dropped) = read_units(&layout, &urls).await.unwrap();
    assert!(whole.len() > 20, "{} units", whole.len());
    // A bound that holds the largest patient (a row counts for under 1 KiB, a patient
    // beside its rows for under 4 KiB), far below the partition's.
    let mut rows_of: HashMap<String, u64> = HashMap::new();
    for (csv, subject) in [(&db.patients, 0), (&db.admissions, 1), (&db.vitals, 0)] {
        rows(csv).into_iter().for_each(|r| *rows_of.entry(r[subject].clone()).or_default() += 1);
    }
    let limit = 4096 + 1024 * rows_of.values().max().unwrap();
    assert_eq!(read_pass(&layout, &urls, Pass::ALL, Some(limit)).await.unwrap(), None, "the whole is over the bound");

    let mut reader = PassReader::open(&layout, &urls, limit).await.unwrap();
    let mut passes = Vec::new();
    while let Some(units) = reader.next_pass().await.unwrap() {
        passes.push(units);
    }
    let left_out = reader.dropped().to_vec();
    assert!(passes.len() >= 2, "{} passes", passes.len());
    let mut joined = BTreeMap::new();
    for units in passes {
        for (unit, rows) in units {
            assert!(joined.insert(unit, rows).is_none(), "a unit in one pass only");
        }
    }
    assert_eq!(joined, whole, "the same units and rows");
    assert_eq!(left_out, dropped, "the same rows left out");

    // Caps of 8 admissions and 40 charts keep other rows of the same partition.
    let wide = database_job(dir.path(), (8, 40), "order_by = \"charttime\"");
    let wide = Layout::of(&Database::of_spec(&JobSpec::parse(&wide, "db").unwrap()));
    let readings = |layout: Layout| {
        let urls = urls.clone();
        async move {
            let mut reader = PassReader::open(&layout, &urls, limit).await.unwrap();
            let mut kept = 0;
            while let Some(units) = reader.next_pass().await.unwrap() {
                kept += units.values().map(|u| u.tables.iter().map(Vec::len).sum::<usize>()).sum::<usize>();
            }
            (reader.readings(), kept)
        }
    };
    let ((narrow, kept), (wide, kept_wide)) = (readings(layout).await, readings(wide).await);
    assert!(kept_wide > kept, "{kept_wide} rows kept under the wider caps, {kept} under the narrow");
    assert_eq!(narrow, wide, "the same readings whatever the caps");
}

/// A key held by two kept rows: both rows stay, the children go to the first (in cap
/// order), and the repeat is counted; a row breaking its table's schema is counted too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_key_sends_its_children_to_the_first_row() {
    let dir = tempfile::tempdir().unwrap();
    let patients = "subject_id,age,sex,comorbidity\nP1,40,F,none\n";
    let admissions = "hadm_id,subject_id,admittime,dischtime,admission_type,outcome\n\
                      A1,P1,2025-02-01 00:00:00,2025-02-02 00:00:00,urgent,home\n\
                      A1,P1,2025-01-01 00:00:00,2025-01-02 00:00:00,elective,home\n";
    let vitals = "subject_id,hadm_id,charttime,heart_rate,resp_rate,spo2\nP1,A1,2025-01-01 01:00:00,80,16,97\n\
                  P1,A1,2025-02-01 01:00:00,90,18,96\nP1,A1,not a time,90,18,96\n";
    write_database(
        dir.path(),
        &SimulatedDatabase { patients: patients.into(), admissions: admissions.into(), vitals: vitals.into() },
    );
    let text = database_job(dir.path(), (ADMISSIONS_CAP as u32, VITALS_CAP as u32), "order_by = \"charttime\"")
        .replace("input = { urls = [", "input = { bad_rows = \"skip\", urls = [");
    let spec: JobSpec = toml::from_str(&text).unwrap();
    let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
    let tables = partition_database(&Database::of_spec(&spec), &scratch, "job", 2, PartitionKey::generate().unwrap())
        .await
        .unwrap();
    assert_eq!(tables[1].partitions.units, 1);
    let Kept { mut rows, dropped, layout } = kept(&spec, &tables).await;
    let (admissions, vitals) = (&layout.tables[1].domain, &layout.tables[2].domain);
    assert_eq!(dropped[1].duplicate_keys, 1);
    assert_eq!((dropped[2].bad, dropped[2].without_parent, dropped[2].over_cap), (1, 0, 0));
    // The January admission is first by time: number 0, and both charts are under it.
    let charts = rows[2].remove("P1").unwrap();
    let parent = vitals.index_of(PARENT_COLUMN).unwrap();
    assert_eq!(charts.iter().map(|(_, v)| v[parent]).collect::<Vec<_>>(), [Some(0.0), Some(0.0)]);
    let stays = rows[1].remove("P1").unwrap();
    let (row, time) = (admissions.index_of(ROW_COLUMN).unwrap(), admissions.index_of("admittime").unwrap());
    let first = stays.iter().find(|(_, v)| v[row] == Some(0.0)).unwrap();
    assert_eq!(first.1[time], Some(seconds("2025-01-01 00:00:00")));
}

/// A table whose file lacks a declared column fails the reading before any row of any
/// table is read: nothing is written to the scratch store (else the failure would come
/// after the patients' and admissions' rows, timed by their size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_does_not_fit_fails_before_any_row_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut db = database_csv(50, 3);
    db.vitals = db.vitals.replacen("spo2", "sao2", 1);
    write_database(dir.path(), &db);
    let spec = rhosynth_shared::testing::database_spec(dir.path(), (2, 6), "order_by = \"charttime\"");
    let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
    let Err(err) =
        partition_database(&Database::of_spec(&spec), &scratch, "job", 2, PartitionKey::generate().unwrap()).await
    else {
        panic!("a vitals file without spo2 was read");
    };
    assert!(err.to_string().contains("spo2"), "{err}");
    let written = walk(&dir.path().join("scratch"));
    assert!(written.is_empty(), "no table's partitions were written: {written:?}");
}

/// The files under `dir`, at any depth (none if it does not exist).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.map(|e| e.unwrap().path()).flat_map(|path| if path.is_dir() { walk(&path) } else { vec![path] }).collect()
}

/// Every unit's kept rows, table by table, as sorted rows of values.
async fn kept_by_unit(spec: &JobSpec, tables: &[PartitionedTable]) -> BTreeMap<String, Vec<Vec<Vec<u64>>>> {
    let mut out: BTreeMap<String, Vec<Vec<Vec<u64>>>> = BTreeMap::new();
    for (t, table) in kept(spec, tables).await.rows.into_iter().enumerate() {
        for (unit, rows) in table {
            let mut rows: Vec<Vec<u64>> =
                rows.into_iter().map(|(_, v)| v.iter().map(|x| x.map_or(u64::MAX, f64::to_bits)).collect()).collect();
            rows.sort();
            let tables = out.entry(unit).or_insert_with(|| vec![Vec::new(); tables.len()]);
            tables[t] = rows;
        }
    }
    out
}

/// Neighbouring databases: one more patient, written first in every file, with more
/// admissions and charts than the caps and admission keys that other patients' admissions
/// also hold. Every other patient keeps exactly the same rows, under a time order and
/// under the sample alike; the added one stays within the caps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adding_a_patient_changes_no_other_patients_rows() {
    let db = database_csv(150, 21);
    let taken: Vec<String> = rows(&db.admissions).into_iter().take(6).map(|r| r[0].clone()).collect();
    let mut admissions = String::new();
    let mut vitals = String::new();
    for (i, hadm) in taken.iter().enumerate() {
        admissions.push_str(&format!(
            "{hadm},SX,2026-0{}-01 00:00:00,2026-0{}-03 00:00:00,urgent,home\n",
            i + 1,
            i + 1
        ));
        for hour in 0..40 {
            vitals.push_str(&format!("SX,{hadm},2026-0{}-01 {:02}:30:00,{},20,90\n", i + 1, hour % 24, 100 + hour));
        }
    }
    let with_one_more = |csv: &str, rows: &str| {
        let (header, rest) = csv.split_once('\n').unwrap();
        format!("{header}\n{rows}{rest}")
    };
    for order in ["order_by = \"charttime\"", ""] {
        let (without, with) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        write_database(without.path(), &db);
        let one_more = SimulatedDatabase {
            patients: with_one_more(&db.patients, "SX,70,M,severe\n"),
            admissions: with_one_more(&db.admissions, &admissions),
            vitals: with_one_more(&db.vitals, &vitals),
        };
        write_database(with.path(), &one_more);
        let (spec, tables) = partitioned(without.path(), order).await;
        let before = kept_by_unit(&spec, &tables).await;
        let (spec, tables) = partitioned(with.path(), order).await;
        let mut after = kept_by_unit(&spec, &tables).await;
        let added = after.remove("SX").expect("the added patient");
        assert_eq!(before.len(), after.len());
        for (unit, tables) in &before {
            assert_eq!(Some(tables), after.get(unit), "{unit} ({order:?})");
        }
        assert_eq!(added.iter().map(Vec::len).collect::<Vec<_>>(), [1, ADMISSIONS_CAP, ADMISSIONS_CAP * VITALS_CAP]);
    }
}

/// The database job over `db` with the admissions and the charts each split into two
/// files, a row in one and the next in the other, named in the other order.
fn split_job(dir: &std::path::Path, db: &SimulatedDatabase, vitals_order: &str) -> JobSpec {
    let mut text = database_job(dir, (ADMISSIONS_CAP as u32, VITALS_CAP as u32), vitals_order);
    for (table, csv) in [("admissions", &db.admissions), ("vitals", &db.vitals)] {
        let (header, rows) = csv.split_once('\n').unwrap();
        let halves: [String; 2] = [0, 1].map(|half| {
            let mine = rows.lines().enumerate().filter(|(i, _)| i % 2 == half).map(|(_, l)| format!("{l}\n"));
            format!("{header}\n{}", mine.collect::<String>())
        });
        let file = |half: usize| dir.join(format!("{table}-{half}.csv"));
        std::fs::write(file(0), &halves[0]).unwrap();
        std::fs::write(file(1), &halves[1]).unwrap();
        let one = format!("{:?}", dir.join(format!("{table}.csv")).to_str().unwrap());
        let two = format!("{:?}, {:?}", file(1).to_str().unwrap(), file(0).to_str().unwrap());
        assert!(text.contains(&one));
        text = text.replace(&one, &two);
    }
    JobSpec::parse(&text, "db").unwrap()
}

/// A patient's rows spread over several files of a table, in another order than the
/// patient's: the admissions and the charts each split into two files, a row in one and
/// the next in the other, so a patient with two admissions has them in both files and an
/// admission's charts sit in both. Each patient keeps exactly the rows it keeps from one
/// file (capped by time: where the rows sit does not move the cap), all of them in one
/// partition index in every table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_patients_rows_in_several_files_are_capped_as_one() {
    let db = database_csv(150, 23);
    let (whole, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write_database(whole.path(), &db);
    write_database(split.path(), &db);
    let order = "order_by = \"charttime\"";
    let spec = split_job(split.path(), &db, order);
    let scratch = storage::open(split.path().join("scratch").to_str().unwrap()).unwrap();
    let tables = partition_database(&Database::of_spec(&spec), &scratch, "job", 5, PartitionKey::generate().unwrap())
        .await
        .unwrap();
    let (whole_spec, whole_tables) = partitioned(whole.path(), order).await;
    let from_one = kept_by_unit(&whole_spec, &whole_tables).await;
    let from_two = kept_by_unit(&spec, &tables).await;
    assert_eq!(from_one, from_two);
    assert!(from_two.values().any(|t| t[1].len() == ADMISSIONS_CAP), "patients with admissions in both files");
    let Kept { rows, .. } = kept(&spec, &tables).await;
    for (unit, patient) in &rows[0] {
        let partition = patient[0].0;
        let rest = rows[1..].iter().flat_map(|table| table.get(unit).into_iter().flatten());
        assert!(rest.into_iter().all(|(p, _)| *p == partition), "{unit}: one partition in every table");
    }
}

/// The workers partition a database as the coordinator does: each table's files cut into
/// byte ranges of 397 bytes, each range read into its buckets by a shard's reader (keys
/// hashed there), each partition merged from its buckets in the files' order. With a
/// patient's admissions and charts spread over two files each and many ranges, every
/// partition of every table holds row for row what the coordinator's reading writes under
/// the same key, so a patient's rows in every table land in one partition index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_partition_a_database_as_the_coordinator_does() {
    use rhosynth_shared::data::database::partition::shard_jobs;
    use rhosynth_shared::data::partition::partition_file;
    use rhosynth_shared::data::shard::{ShardPart, ShardSize, merge_partition, plan_shards, read_shard};
    use rhosynth_shared::testing::partition_rows;

    let dir = tempfile::tempdir().unwrap();
    let db = database_csv(120, 31);
    write_database(dir.path(), &db);
    let spec = split_job(dir.path(), &db, "order_by = \"charttime\"");
    let database = Database::of_spec(&spec);
    let key = PartitionKey::generate().unwrap();
    let here = storage::open(dir.path().join("here").to_str().unwrap()).unwrap();
    let by_coordinator = partition_database(&database, &here, "job", 5, key.clone()).await.unwrap();

    let workers = dir.path().join("workers").display().to_string();
    let mut by_workers: Vec<Vec<String>> = Vec::new();
    for (name, job) in shard_jobs(&database, &format!("{workers}/job"), 5) {
        let shards = plan_shards(&job.input, ShardSize { rows: 1 << 20, bytes: 397 }).await.unwrap();
        let ranges = shards.iter().filter(|s| matches!(s.part, ShardPart::Bytes { .. })).count();
        assert!(ranges > 4, "{name}: {ranges} byte ranges");
        for (s, shard) in shards.iter().enumerate() {
            read_shard(&job, shard, s as u32, key.clone()).await.unwrap();
        }
        let order: Vec<u32> = (0..shards.len() as u32).collect();
        let mut urls = Vec::new();
        for k in 0..5 {
            let url = format!("{workers}/{}", partition_file(&format!("job/{name}"), k));
            merge_partition(&job, &url, &order).await.unwrap();
            urls.push(url);
        }
        by_workers.push(urls);
    }
    let mut partition_of: BTreeMap<String, usize> = BTreeMap::new();
    for (table, urls) in by_coordinator.iter().zip(&by_workers) {
        for (k, (ours, theirs)) in table.partitions.urls.iter().zip(urls).enumerate() {
            let (ours, theirs) =
                (partition_rows(ours, &table.domain).await, partition_rows(theirs, &table.domain).await);
            assert_eq!(theirs, ours, "{} partition {k}: row for row", table.name);
            for (unit, _) in theirs {
                assert_eq!(*partition_of.entry(unit).or_insert(k), k, "a patient's rows in one partition index");
            }
        }
    }
    assert_eq!(partition_of.len(), 120);
}

/// A worker reads one partition index of every table and sees each patient whole: the
/// views join each row to its ancestors' values and count its children, matching the
/// CSV text; a unit gives a view at most the table's cap product rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_join_each_row_to_its_ancestors_and_count_its_children() {
    use rhosynth_shared::data::database::view::{AFTER_COLUMN, POSITION_COLUMN};

    let dir = tempfile::tempdir().unwrap();
    let db = database_csv(200, 13);
    write_database(dir.path(), &db);
    let (spec, tables) = partitioned(dir.path(), "order_by = \"charttime\"").await;
    let layout = Layout::of(&Database::of_spec(&spec));
    assert_eq!((0..3).map(|t| layout.reach(t)).collect::<Vec<_>>(), [1, 2, 12]);
    // Each patient's attributes and admissions (by time), and each admission's charts.
    let patient: HashMap<String, Vec<String>> = rows(&db.patients).into_iter().map(|r| (r[0].clone(), r)).collect();
    let mut stays: HashMap<String, Vec<(f64, String)>> = HashMap::new();
    for r in rows(&db.admissions) {
        stays.entry(r[1].clone()).or_default().push((seconds(&r[2]), r[0].clone()));
    }
    stays.values_mut().for_each(|s| s.sort_by(|a, b| a.0.total_cmp(&b.0)));
    let mut charts: HashMap<String, usize> = HashMap::new();
    rows(&db.vitals).into_iter().for_each(|r| *charts.entry(r[1].clone()).or_default() += 1);
    // Each admission's kept charts' means (its first by time), in the columns' order.
    let mut by_stay: HashMap<String, Vec<(f64, [f64; 3])>> = HashMap::new();
    for r in rows(&db.vitals) {
        let values = [3, 4, 5].map(|c| r[c].parse::<f64>().unwrap());
        by_stay.entry(r[1].clone()).or_default().push((seconds(&r[2]), values));
    }
    let means = |hadm: &str| -> Vec<Option<f64>> {
        let Some(kept) = by_stay.get(hadm) else { return vec![None; 3] };
        let mut kept = kept.clone();
        kept.sort_by(|a, b| a.0.total_cmp(&b.0));
        kept.truncate(VITALS_CAP);
        (0..3).map(|c| Some(kept.iter().map(|k| k.1[c]).sum::<f64>() / kept.len() as f64)).collect()
    };

    let views = [View { table: 0 }, View { table: 1 }, View { table: 2 }];
    let domains: Vec<_> = views.iter().map(|v| v.domain(&layout)).collect();
    let names = |d: usize| domains[d].columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>();
    assert_eq!(names(0), ["age", "sex", "comorbidity", "__n.admissions"]);
    assert_eq!(
        names(1),
        [
            "admittime",
            "dischtime",
            "admission_type",
            "outcome",
            POSITION_COLUMN,
            AFTER_COLUMN,
            "patients.age",
            "patients.sex",
            "patients.comorbidity",
            "__prev.admittime",
            "__prev.dischtime",
            "__prev.admission_type",
            "__prev.outcome",
            "__n.vitals",
            "__mean.vitals.heart_rate",
            "__mean.vitals.resp_rate",
            "__mean.vitals.spo2"
        ]
    );
    assert_eq!(names(2)[..6], ["charttime", "heart_rate", "resp_rate", "spo2", POSITION_COLUMN, AFTER_COLUMN]);
    assert_eq!(
        names(2)[6..],
        [
            "admissions.admittime",
            "admissions.dischtime",
            "admissions.admission_type",
            "admissions.outcome",
            "admissions.__mean.vitals.heart_rate",
            "admissions.__mean.vitals.resp_rate",
            "admissions.__mean.vitals.spo2",
            "patients.age",
            "patients.sex",
            "patients.comorbidity",
            "__prev.charttime",
            "__prev.heart_rate",
            "__prev.resp_rate",
            "__prev.spo2"
        ]
    );

    let mut seen = 0;
    for k in 0..tables[0].partitions.urls.len() {
        let urls: Vec<String> = tables.iter().map(|t| t.partitions.urls[k].clone()).collect();
        for (unit, rows) in read_units(&layout, &urls).await.unwrap().0 {
            seen += 1;
            let [root, stay_rows, chart_rows] = [0, 1, 2].map(|t| views[t].rows(&layout, &rows).unwrap());
            let p = &patient[&unit];
            let age = p[1].parse::<f64>().unwrap();
            let kept: Vec<&(f64, String)> = stays[&unit].iter().take(ADMISSIONS_CAP).collect();
            assert_eq!(root, vec![vec![Some(age), root[0][1], root[0][2], Some(kept.len() as f64)]], "{unit}");
            assert_eq!(stay_rows.len(), kept.len());
            for (i, (stay, (admitted, hadm))) in stay_rows.iter().zip(&kept).enumerate() {
                assert_eq!(stay[0], Some(*admitted), "{unit}: admissions in time order");
                assert_eq!(stay[4], Some(i as f64), "{unit}: position");
                assert_eq!(stay[5], Some((kept.len() - 1 - i) as f64), "{unit}: admissions after this one");
                assert_eq!(stay[6..9], root[0][..3], "{unit}: the patient's values");
                // Admissions are a sequence (by admission time): each holds the one before.
                let before = if i == 0 { vec![None; 4] } else { stay_rows[i - 1][..4].to_vec() };
                assert_eq!(stay[9..13], before[..], "{unit}: the previous admission's values");
                let wanted = charts.get(hadm).copied().unwrap_or(0).min(VITALS_CAP);
                assert_eq!(stay[13], Some(wanted as f64), "{unit}: charts of {hadm}");
                let close = |a: &[Option<f64>], b: &[Option<f64>]| {
                    a.len() == b.len()
                        && a.iter().zip(b).all(|(a, b)| match (a, b) {
                            (Some(a), Some(b)) => (a - b).abs() < 1e-9,
                            (a, b) => a == b,
                        })
                };
                assert!(close(&stay[14..17], &means(hadm)), "{unit}: the means of {hadm}'s kept charts");
            }
            assert!(chart_rows.len() as u64 <= views[2].max_rows_per_unit(&layout));
            for (i, chart) in chart_rows.iter().enumerate() {
                let stay = stay_rows.iter().find(|s| s[..4] == chart[6..10]).expect("the chart's admission");
                assert!(chart[0] > stay[0] && chart[0] < stay[1], "{unit}: a chart inside its admission");
                assert_eq!(chart[10..13], stay[14..17], "{unit}: its admission's means");
                assert_eq!(chart[13..16], root[0][..3]);
                // The previous chart of the same admission (charts come in place order).
                let first = chart[4] == Some(0.0);
                let before = if first { vec![None; 4] } else { chart_rows[i - 1][..4].to_vec() };
                assert_eq!(chart[16..20], before[..], "{unit}: the previous chart's values");
                let last = chart_rows.get(i + 1).is_none_or(|next| next[4] == Some(0.0));
                assert_eq!(chart[5] == Some(0.0), last, "{unit}: no chart after the last");
            }
        }
    }
    assert_eq!(seen, 200, "every patient in one partition");
}

/// The views of a simulated database of `patients` (seed `seed`; caps 3 admissions a
/// patient, 8 charts an admission, charts in time order), every row of each.
async fn simulated_views(patients: usize, seed: u64) -> (Layout, Vec<Vec<Vec<Option<f64>>>>) {
    let dir = tempfile::tempdir().unwrap();
    write_database(dir.path(), &database_csv(patients, seed));
    let spec = rhosynth_shared::testing::database_spec(dir.path(), (3, 8), "order_by = \"charttime\"");
    let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
    let tables = partition_database(&Database::of_spec(&spec), &scratch, "job", 2, PartitionKey::generate().unwrap())
        .await
        .unwrap();
    view_rows(&spec, &tables).await
}

/// Every row of each table's view, over all partitions.
async fn view_rows(spec: &JobSpec, tables: &[PartitionedTable]) -> (Layout, Vec<Vec<Vec<Option<f64>>>>) {
    let layout = Layout::of(&Database::of_spec(spec));
    let mut all = vec![Vec::new(); layout.tables.len()];
    for k in 0..tables[0].partitions.urls.len() {
        let urls: Vec<String> = tables.iter().map(|t| t.partitions.urls[k].clone()).collect();
        for rows in read_units(&layout, &urls).await.unwrap().0.values() {
            for (t, out) in all.iter_mut().enumerate() {
                out.extend(View { table: t }.rows(&layout, rows).unwrap());
            }
        }
    }
    (layout, all)
}

/// The exact (noise-free) table of `vars` (ascending) over rows of bins, last variable fastest.
fn exact(rows: &[Vec<usize>], sizes: &[usize], vars: &[usize]) -> Measurement {
    let mut counts = vec![0.0; vars.iter().map(|&v| sizes[v]).product()];
    for row in rows {
        counts[vars.iter().fold(0, |cell, &v| cell * sizes[v] + row[v])] += 1.0;
    }
    Measurement { vars: vars.to_vec(), counts, sigma: 1.0 }
}

/// Each view's rows as bins, and a model per view fitted to the exact (noise-free) tables
/// of every column and of `pairs[t]` (by name) in view `t`.
fn fit_exactly(
    layout: &Layout,
    values: &[Vec<Vec<Option<f64>>>],
    pairs: &[&[(&str, &str)]],
) -> (Vec<Vec<Vec<usize>>>, Vec<FittedView>) {
    let sets: Vec<Vec<Vec<&str>>> = pairs.iter().map(|p| p.iter().map(|&(a, b)| vec![a, b]).collect()).collect();
    fit_views(layout, values, &sets, None, 2000)
}

/// Each view's rows as bins, and a model per view fitted with `iterations` steps to the
/// tables of every column and of `sets[t]` (by name) in view `t`: exact, or with Gaussian
/// noise of `noise`'s σ drawn from its generator.
fn fit_views(
    layout: &Layout,
    values: &[Vec<Vec<Option<f64>>>],
    sets: &[Vec<Vec<&str>>],
    mut noise: Option<(f64, &mut rand::rngs::ChaCha8Rng)>,
    iterations: usize,
) -> (Vec<Vec<Vec<usize>>>, Vec<FittedView>) {
    use rand_distr::{Distribution, Normal};

    let mut bins = Vec::new();
    let mut fitted = Vec::new();
    for (t, rows) in values.iter().enumerate() {
        let domain = View { table: t }.domain(layout);
        let sizes: Vec<usize> = domain.columns.iter().map(|c| c.bins()).collect();
        let view: Vec<Vec<usize>> =
            rows.iter().map(|row| row.iter().zip(&domain.columns).map(|(v, c)| c.bin(*v)).collect()).collect();
        let mut measured: Vec<_> = (0..sizes.len()).map(|v| exact(&view, &sizes, &[v])).collect();
        for set in &sets[t] {
            let mut vars: Vec<usize> = set.iter().map(|c| domain.index_of(c).unwrap()).collect();
            vars.sort_unstable();
            measured.push(exact(&view, &sizes, &vars));
        }
        if let Some((sigma, rng)) = noise.as_mut() {
            for m in &mut measured {
                m.counts.iter_mut().for_each(|c| *c += Normal::new(0.0, *sigma).unwrap().sample(&mut **rng));
                m.sigma = *sigma;
            }
        }
        fitted.push(FittedView { model: GraphicalModel::fit(&sizes, &measured, iterations), domain });
        bins.push(view);
    }
    (bins, fitted)
}

/// Drawn down the tree from models fitted to the exact view tables of the simulated
/// database (every column's, and a few pairs within and across tables): every child row's
/// parent exists and shares its patient; admissions per patient follow the real
/// distribution; and the cross-table joints (comorbidity × admissions, admission type ×
/// heart rate) are far closer to the real ones than tables joined at random would be.
/// This checks the sampler, not privacy: no noise is drawn here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_drawn_down_the_tree_keeps_its_cross_table_structure() {
    use rand::SeedableRng;

    let (layout, values) = simulated_views(1500, 31).await;
    // Pairs by name: (root) age, comorbidity × admissions; (admissions) type × comorbidity,
    // outcome, charts and the charts' mean heart rate, whose bin the charts realise (a
    // plan measures a value's link to its ancestors through its mean alone:
    // `siblings_realise_the_mean_their_parent_was_drawn_with`); (vitals) heart rate and
    // SpO₂ × type and comorbidity.
    let pairs: [&[(&str, &str)]; 3] = [
        &[("age", "comorbidity"), ("comorbidity", "__n.admissions"), ("age", "__n.admissions")],
        &[
            ("admission_type", "patients.comorbidity"),
            ("admission_type", "outcome"),
            ("admission_type", "__n.vitals"),
            ("admission_type", "__mean.vitals.heart_rate"),
            ("admittime", "dischtime"),
        ],
        &[
            ("heart_rate", "admissions.admission_type"),
            ("heart_rate", "patients.comorbidity"),
            ("spo2", "patients.comorbidity"),
            ("heart_rate", "spo2"),
        ],
    ];
    let (bins, fitted) = fit_exactly(&layout, &values, &pairs);
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(7);
    // In three slices, as cores draw them.
    let synthetic = sample_database(&layout, &fitted, 1500, 3, &mut rng);
    let [patients, admissions, vitals] = &synthetic[..] else { panic!("three tables") };

    // Referential integrity, by construction, across the slices; each patient its own
    // number (what its key is written from), numbered on from the slice before.
    assert_eq!(patients.len(), 1500);
    assert!(patients.iter().enumerate().all(|(i, r)| r.unit == i && r.parent.is_none()));
    for (child, parent) in [(admissions, patients), (vitals, admissions)] {
        assert!(child.iter().all(|r| r.parent.is_some_and(|p| p < parent.len() && parent[p].unit == r.unit)));
    }
    // Comorbidity × admissions per patient: the real joint (from the root view's exact
    // bins), the synthetic one, and the product of the real margins (random joining).
    let root = View { table: 0 }.domain(&layout);
    let (comorbidity, count) = (root.index_of("comorbidity").unwrap(), root.index_of("__n.admissions").unwrap());
    let joint = |pairs: &mut dyn Iterator<Item = (usize, usize)>| {
        let mut table = [[0.0; 4]; 4];
        let mut n = 0.0;
        pairs.for_each(|(c, k)| {
            table[c][k] += 1.0;
            n += 1.0;
        });
        table.map(|row| row.map(|x| x / n))
    };
    let real = joint(&mut bins[0].iter().map(|r| (r[comorbidity], r[count])));
    let categories = ["none", "mild", "severe"];
    let under: Vec<usize> =
        (0..patients.len()).map(|p| admissions.iter().filter(|a| a.parent == Some(p)).count()).collect();
    let drawn = joint(&mut patients.iter().zip(&under).map(|(p, &k)| {
        let SyntheticValue::Category(c) = &p.values[comorbidity] else { panic!("a comorbidity") };
        (categories.iter().position(|x| x == c).unwrap(), k)
    }));
    let margin = |axis: usize| -> Vec<f64> {
        (0..4).map(|i| (0..4).map(|j| if axis == 0 { real[i][j] } else { real[j][i] }).sum()).collect()
    };
    let (by_comorbidity, by_count) = (margin(0), margin(1));
    let tvd = |a: &[[f64; 4]; 4], b: &dyn Fn(usize, usize) -> f64| {
        (0..4).flat_map(|i| (0..4).map(move |j| (i, j))).map(|(i, j)| (a[i][j] - b(i, j)).abs()).sum::<f64>() / 2.0
    };
    let drawn_tvd = tvd(&real, &|i, j| drawn[i][j]);
    let random_tvd = tvd(&real, &|i, j| by_comorbidity[i] * by_count[j]);
    assert!(drawn_tvd < 0.5 * random_tvd && drawn_tvd < 0.04, "drawn {drawn_tvd:.3}, random joining {random_tvd:.3}");

    // Mean heart rate by admission type: real (the capped charts the models saw, each
    // with its admission's type in the vitals view) against drawn.
    let kinds = ["emergency", "urgent", "elective"];
    let kind = View { table: 2 }.domain(&layout).index_of("admissions.admission_type").unwrap();
    let mut real_hr: HashMap<String, (f64, f64)> = HashMap::new();
    for row in &values[2] {
        let e = real_hr.entry(kinds[row[kind].unwrap() as usize].to_string()).or_default();
        (e.0, e.1) = (e.0 + row[1].unwrap(), e.1 + 1.0);
    }
    let mut drawn_hr: HashMap<String, (f64, f64)> = HashMap::new();
    // The fitted model keeps a sliver of mass on the (never measured) missing bins.
    let missing = vitals.iter().filter(|v| v.values[1] == SyntheticValue::Missing).count();
    assert!(missing * 100 < vitals.len(), "{missing} of {} heart rates missing", vitals.len());
    for v in vitals {
        let SyntheticValue::Category(kind) = &admissions[v.parent.unwrap()].values[2] else { continue };
        let SyntheticValue::Real(hr) = v.values[1] else { continue };
        let e = drawn_hr.entry(kind.clone()).or_default();
        (e.0, e.1) = (e.0 + hr, e.1 + 1.0);
    }
    let mean = |m: &HashMap<String, (f64, f64)>, k: &str| m[k].0 / m[k].1;
    let spread = mean(&real_hr, "emergency") - mean(&real_hr, "elective");
    assert!(spread > 5.0, "the simulated dependence: {spread:.1} bpm");
    for kind in kinds {
        let (r, d) = (mean(&real_hr, kind), mean(&drawn_hr, kind));
        assert!((r - d).abs() < spread / 8.0, "{kind}: real {r:.1}, drawn {d:.1} (spread {spread:.1})");
    }
}

/// A value's link to its parent's attributes drawn through the parent's mean of it alone:
/// the vitals' model is fitted with each chart value's pair with its admission's mean of
/// it (and the one before it) and nothing else of the admission; the admissions' with the
/// outcome's pair with the means. Drawn down the tree (exact tables, no noise), the charts
/// of admissions that ended in death still run faster and lower in SpO₂ than the others'
/// by about the real gap; with no mean to go through, no pair would tie them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_link_to_its_parent_is_drawn_through_the_parents_mean_of_it() {
    use rand::SeedableRng;

    let (layout, values) = simulated_views(1500, 31).await;
    let pairs: [&[(&str, &str)]; 3] = [
        &[("comorbidity", "__n.admissions")],
        &[
            ("outcome", "__mean.vitals.heart_rate"),
            ("outcome", "__mean.vitals.spo2"),
            ("outcome", "__n.vitals"),
            ("admittime", "dischtime"),
        ],
        &[
            ("heart_rate", "admissions.__mean.vitals.heart_rate"),
            ("spo2", "admissions.__mean.vitals.spo2"),
            ("heart_rate", "__prev.heart_rate"),
            ("spo2", "__prev.spo2"),
        ],
    ];
    let (_, fitted) = fit_exactly(&layout, &values, &pairs);
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(11);
    let synthetic = sample_database(&layout, &fitted, 1500, 2, &mut rng);
    let [_, admissions, vitals] = &synthetic[..] else { panic!("three tables") };

    // Per outcome, the mean of the admissions' means (each admission once): real, from
    // the admissions' view (the capped charts the models saw), and drawn.
    let stays = View { table: 1 }.domain(&layout);
    let outcome = stays.index_of("outcome").unwrap();
    let mut charts: HashMap<usize, Vec<&rhosynth_shared::generators::database::SyntheticRow>> = HashMap::new();
    vitals.iter().for_each(|v| charts.entry(v.parent.unwrap()).or_default().push(v));
    for (column, name) in [(1, "heart_rate"), (3, "spo2")] {
        let mean = stays.index_of(&format!("__mean.vitals.{name}")).unwrap();
        let mut real = [Vec::new(), Vec::new()];
        for row in values[1].iter().filter(|r| r[mean].is_some()) {
            real[usize::from(row[outcome] == Some(2.0))].push(row[mean].unwrap());
        }
        let mut drawn = [Vec::new(), Vec::new()];
        for (a, rows) in &charts {
            let value = |v: &SyntheticValue| match v {
                SyntheticValue::Real(x) => Some(*x),
                _ => None,
            };
            let x: Vec<f64> = rows.iter().filter_map(|v| value(&v.values[column])).collect();
            let SyntheticValue::Category(o) = &admissions[*a].values[3] else { continue };
            drawn[usize::from(o == "died")].push(x.iter().sum::<f64>() / x.len() as f64);
        }
        let (real_gap, _) = gap(&real);
        let (drawn_gap, se) = gap(&drawn);
        // Binned as its column and drawn as a chain given it and the chart
        // before: the link kept to within half its size, beyond the draw's own error; with
        // nothing tying the charts to the outcome it would be 0 ± `se`.
        let what = format!("{name}: real gap {real_gap:.2}, drawn {drawn_gap:.2} ± {se:.2}");
        assert!(real_gap.abs() > 4.0 * se, "the simulated dependence: {what}");
        assert!((drawn_gap - real_gap).abs() < 0.5 * real_gap.abs() + 3.0 * se, "{what}");
    }
}

/// A patient's link to the charts of its admissions, through the admissions' means of
/// them: the admissions' view is fitted exactly (comorbidity with the mean heart rate),
/// the charts' with noise (σ = 40 rows a cell, as a chart's larger bound brings) on each
/// heart rate's pair with its admission's mean of it. Drawn given the mean's bin alone,
/// the charts drift back to the overall mean and the correlation of comorbidity with an
/// admission's realised mean heart rate falls (0.50 against 0.61 real); moved alike onto
/// the mean drawn for their admission, they keep it within 0.05.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn siblings_realise_the_mean_their_parent_was_drawn_with() {
    use rand::SeedableRng;

    let (layout, values) = simulated_views(1500, 31).await;
    let sets: Vec<Vec<Vec<&str>>> = vec![
        vec![vec!["comorbidity", "__n.admissions"]],
        vec![vec!["patients.comorbidity", "__mean.vitals.heart_rate"], vec!["patients.comorbidity", "__n.vitals"]],
        vec![vec!["heart_rate", "admissions.__mean.vitals.heart_rate"], vec!["heart_rate", "__prev.heart_rate"]],
    ];
    let (_, mut fitted) = fit_views(&layout, &values, &sets, None, 2000);
    let noise = &mut rand::rngs::ChaCha8Rng::seed_from_u64(5);
    let (_, mut noisy) = fit_views(&layout, &values, &sets, Some((40.0, noise)), 2000);
    fitted[2] = noisy.pop().unwrap();

    let stays = View { table: 1 }.domain(&layout);
    let (comorbidity, mean) =
        (stays.index_of("patients.comorbidity").unwrap(), stays.index_of("__mean.vitals.heart_rate").unwrap());
    let real: Vec<(f64, f64)> = values[1].iter().filter_map(|r| Some((r[comorbidity]?, r[mean]?))).collect();
    let real = lag_one(&real);
    let synthetic = sample_database(&layout, &fitted, 1500, 2, &mut rand::rngs::ChaCha8Rng::seed_from_u64(9));
    let [patients, admissions, vitals] = &synthetic[..] else { panic!("three tables") };
    let heart_rate = |v: &SyntheticValue| match v {
        SyntheticValue::Real(x) => Some(*x),
        _ => None,
    };
    let mut charts: HashMap<usize, Vec<f64>> = HashMap::new();
    vitals.iter().for_each(|v| charts.entry(v.parent.unwrap()).or_default().extend(heart_rate(&v.values[1])));
    let levels = ["none", "mild", "severe"];
    let drawn: Vec<(f64, f64)> = (charts.iter())
        .filter(|(_, x)| !x.is_empty())
        .filter_map(|(&a, x)| {
            let SyntheticValue::Category(c) = &patients[admissions[a].unit].values[2] else { return None };
            Some((levels.iter().position(|l| l == c)? as f64, x.iter().sum::<f64>() / x.len() as f64))
        })
        .collect();
    let drawn = lag_one(&drawn);
    assert!(real > 0.3, "the simulated link: {real:.2}");
    assert!(
        (drawn - real).abs() < 0.05,
        "comorbidity × an admission's mean heart rate: {drawn:.2} drawn, {real:.2} real"
    );
}

/// A mean drawn missing over an admission drawn with charts (noise puts mass there; no
/// real admission holds it, so the charts' model has nothing for it) says nothing of its
/// charts: they are drawn without it. Here a third of the admissions' view rows lose their
/// means before the fit (exact tables, no noise), as a noisy release may have it; the
/// charts' model is fitted to the real rows. The charts drawn keep the real spread of heart
/// rate; drawn given the missing mean, a third of them would be drawn from cells no row
/// filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_are_drawn_without_a_mean_drawn_missing() {
    use rand::SeedableRng;

    let (layout, mut values) = simulated_views(1500, 31).await;
    let stays = View { table: 1 }.domain(&layout);
    let means = View { table: 1 }.mean_columns(&layout);
    assert_eq!(stays.columns[means.start].name, "__mean.vitals.heart_rate");
    for row in values[1].iter_mut().step_by(3) {
        row[means.clone()].fill(None);
    }
    let pairs: [&[(&str, &str)]; 3] = [
        &[("comorbidity", "__n.admissions")],
        &[("outcome", "__mean.vitals.heart_rate"), ("__n.vitals", "__mean.vitals.heart_rate")],
        &[("heart_rate", "admissions.__mean.vitals.heart_rate"), ("heart_rate", "__prev.heart_rate")],
    ];
    let (_, fitted) = fit_exactly(&layout, &values, &pairs);
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(3);
    let synthetic = sample_database(&layout, &fitted, 1500, 2, &mut rng);
    let spread = |x: &[f64]| {
        let m = x.iter().sum::<f64>() / x.len() as f64;
        (x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() as f64 - 1.0)).sqrt()
    };
    let real: Vec<f64> = values[2].iter().filter_map(|r| r[1]).collect();
    let drawn: Vec<f64> = (synthetic[2].iter())
        .filter_map(|v| match v.values[1] {
            SyntheticValue::Real(x) => Some(x),
            _ => None,
        })
        .collect();
    let (real_sd, drawn_sd) = (spread(&real), spread(&drawn));
    // Drawing inside 10-bpm bins adds 10²/12 to the variance (2% on the sd), the draw's
    // own error about 1.5% (charts of 3,000 admissions); drawn from empty cells, a third
    // of the charts widen it by a fifth.
    assert!((drawn_sd / real_sd - 1.0).abs() < 0.1, "heart rate sd: real {real_sd:.2}, drawn {drawn_sd:.2}");
}

/// The difference of the means of `groups[1]` and `groups[0]`, and its standard error.
fn gap(groups: &[Vec<f64>; 2]) -> (f64, f64) {
    let moments = |x: &[f64]| {
        let m = x.iter().sum::<f64>() / x.len() as f64;
        (m, x.iter().map(|v| (v - m).powi(2)).sum::<f64>() / (x.len() as f64 - 1.0) / x.len() as f64)
    };
    let ((m0, v0), (m1, v1)) = (moments(&groups[0]), moments(&groups[1]));
    (m1 - m0, (v0 + v1).sqrt())
}

/// Data the project did not make: the Mayo PBC cohort (`../shared/data/pbcseq`, 312
/// patients, 1,945 lab visits) split into patients (follow-up, status, age, sex) and
/// visits (day, bilirubin, albumin, edema, stage), visits capped at 8 a patient by day.
/// Drawn down the tree from models fitted to the exact view tables (no noise): status ×
/// visits per patient stays far closer to the real joint than joining at random, and the
/// mean bilirubin of each status's visits stays near the real one, where joining at random
/// would give every status the overall mean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_data_keeps_its_cross_table_structure_down_the_tree() {
    use rand::SeedableRng;

    let Some(pbc) = rhosynth_shared::testing::shared_data("pbcseq/pbcseq.csv") else { return };
    let text = std::fs::read_to_string(pbc).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let field = |row: &[&str], name: &str| row[header.iter().position(|h| *h == name).unwrap()].to_string();
    let (mut patients, mut visits) =
        ("id,futime,status,age,sex\n".to_string(), "id,day,bili,albumin,edema,stage\n".to_string());
    let mut seen = std::collections::HashSet::new();
    for line in text.lines().skip(1) {
        let row: Vec<&str> = line.split(',').collect();
        let id = field(&row, "id");
        if seen.insert(id.clone()) {
            let [futime, status, age, sex] = ["futime", "status", "age", "sex"].map(|n| field(&row, n));
            patients.push_str(&format!("{id},{futime},{status},{age},{sex}\n"));
        }
        let [day, bili, albumin, edema, stage] = ["day", "bili", "albumin", "edema", "stage"].map(|n| field(&row, n));
        visits.push_str(&format!("{id},{day},{bili},{albumin},{edema},{stage}\n"));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("patients.csv"), patients).unwrap();
    std::fs::write(dir.path().join("visits.csv"), visits).unwrap();
    let file = |name: &str| dir.path().join(name).display().to_string();
    // Bounds and categories are public metadata (the survival package's documentation).
    let spec: JobSpec = toml::from_str(&format!(
        r#"
[job]
dataset_id = "pbc"
[input]
urls = [{patients:?}]
[schema]
table = "patients"
unit_column = "id"
columns = [
  {{ name = "id", kind = "identifier" }},
  {{ name = "futime", kind = "integer", min = 0, max = 6000 }},
  {{ name = "status", kind = "categorical", categories = ["0", "1", "2"] }},
  {{ name = "age", kind = "continuous", min = 20, max = 90 }},
  {{ name = "sex", kind = "categorical", categories = ["f", "m"] }},
]
[[tables]]
name = "visits"
parent = {{ table = "patients", key = "id" }}
order_by = "day"
max_per_parent = 8
input = {{ urls = [{visits:?}] }}
columns = [
  {{ name = "id", kind = "identifier" }},
  {{ name = "day", kind = "integer", min = 0, max = 6000 }},
  {{ name = "bili", kind = "continuous", min = 0, max = 50, bins = [0, 0.6, 0.8, 1, 1.4, 2, 3, 5, 8, 12, 20, 50] }},
  {{ name = "albumin", kind = "continuous", min = 1, max = 9 }},
  {{ name = "edema", kind = "continuous", min = 0, max = 1, bins = 3 }},
  {{ name = "stage", kind = "integer", min = 1, max = 4 }},
]
[privacy]
epsilon = 1.0
delta = 1e-6
[generator]
name = "aim"
"#,
        patients = file("patients.csv"),
        visits = file("visits.csv"),
    ))
    .unwrap();
    rhosynth_shared::spec::tables::validate(&spec.input, &spec.schema, &spec.tables).unwrap();
    let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
    let tables = partition_database(&Database::of_spec(&spec), &scratch, "pbc", 2, PartitionKey::generate().unwrap())
        .await
        .unwrap();
    assert_eq!(tables[0].partitions.units, 312);
    let (layout, values) = view_rows(&spec, &tables).await;
    let pairs: [&[(&str, &str)]; 2] = [
        // With the status's pairs with the visits' means, whose bins the visits realise.
        &[
            ("status", "__n.visits"),
            ("futime", "status"),
            ("age", "status"),
            ("status", "__mean.visits.bili"),
            ("status", "__mean.visits.albumin"),
        ],
        &[
            ("bili", "patients.status"),
            ("albumin", "patients.status"),
            ("bili", "albumin"),
            ("stage", "bili"),
            ("edema", "bili"),
        ],
    ];
    let (bins, fitted) = fit_exactly(&layout, &values, &pairs);
    let synthetic = sample_database(&layout, &fitted, 3120, 2, &mut rand::rngs::ChaCha8Rng::seed_from_u64(3));
    let [drawn_patients, drawn_visits] = &synthetic[..] else { panic!("two tables") };

    // Status × visits per patient (0 to 8): real, drawn, and the product of real margins.
    let root = View { table: 0 }.domain(&layout);
    let (status, count) = (root.index_of("status").unwrap(), root.index_of("__n.visits").unwrap());
    let mut real = vec![vec![0.0; 9]; 4];
    bins[0].iter().for_each(|r| real[r[status]][r[count]] += 1.0 / 312.0);
    let mut drawn = vec![vec![0.0; 9]; 4];
    for (p, row) in drawn_patients.iter().enumerate() {
        let SyntheticValue::Category(s) = &row.values[status] else { continue };
        let k = drawn_visits.iter().filter(|v| v.parent == Some(p)).count();
        drawn[s.parse::<usize>().unwrap()][k] += 1.0 / drawn_patients.len() as f64;
    }
    let rows: Vec<f64> = real.iter().map(|r| r.iter().sum()).collect();
    let columns: Vec<f64> = (0..9).map(|k| real.iter().map(|r| r[k]).sum()).collect();
    let tvd = |f: &dyn Fn(usize, usize) -> f64| {
        (0..4).flat_map(|s| (0..9).map(move |k| (s, k))).map(|(s, k)| (real[s][k] - f(s, k)).abs()).sum::<f64>() / 2.0
    };
    let (drawn_tvd, random_tvd) = (tvd(&|s, k| drawn[s][k]), tvd(&|s, k| rows[s] * columns[k]));
    assert!(drawn_tvd < 0.5 * random_tvd, "status × visits: drawn {drawn_tvd:.3}, random joining {random_tvd:.3}");

    // Mean bilirubin of each status's (capped) visits: real against drawn.
    let visits = View { table: 1 }.domain(&layout);
    let (bili, parent_status) = (visits.index_of("bili").unwrap(), visits.index_of("patients.status").unwrap());
    let mut real_bili = [(0.0, 0.0); 3];
    for row in &values[1] {
        if let (Some(b), Some(s)) = (row[bili], row[parent_status]) {
            real_bili[s as usize] = (real_bili[s as usize].0 + b, real_bili[s as usize].1 + 1.0);
        }
    }
    let mut drawn_bili = [(0.0, 0.0); 3];
    for v in drawn_visits {
        let patient = &drawn_patients[v.parent.unwrap()];
        if let (SyntheticValue::Real(b), SyntheticValue::Category(s)) = (&v.values[bili], &patient.values[status]) {
            let s: usize = s.parse().unwrap();
            drawn_bili[s] = (drawn_bili[s].0 + b, drawn_bili[s].1 + 1.0);
        }
    }
    let mean = |m: &[(f64, f64); 3], s: usize| m[s].0 / m[s].1;
    let overall = real_bili.iter().map(|m| m.0).sum::<f64>() / real_bili.iter().map(|m| m.1).sum::<f64>();
    for s in [0, 2] {
        let (r, d) = (mean(&real_bili, s), mean(&drawn_bili, s));
        eprintln!(
            "FIG status {s}: real {r:.2} drawn {d:.2} overall {overall:.2}; tvd {drawn_tvd:.3} random {random_tvd:.3}"
        );
        assert!(
            (r - d).abs() < (r - overall).abs() / 2.0,
            "status {s}: real {r:.2}, drawn {d:.2}, overall {overall:.2}"
        );
    }
}

/// The views of 800 simulated patients (seed `seed`) with their times in intervals
/// ([`with_intervals`]), caps 3 and 8, charts ordered by time.
async fn timed_views(seed: u64) -> (Layout, Vec<Vec<Vec<Option<f64>>>>) {
    timed_views_capped(seed, (3, 8), "").await
}

/// [`timed_views`] with caps `caps` and `params` in `[generator.database]`.
async fn timed_views_capped(seed: u64, caps: (u32, u32), params: &str) -> (Layout, Vec<Vec<Vec<Option<f64>>>>) {
    let dir = tempfile::tempdir().unwrap();
    write_database(dir.path(), &database_csv(800, seed));
    let text = with_intervals(&database_job(dir.path(), caps, "order_by = \"charttime\""));
    let text = format!("{text}\n[generator.database]\n{params}\n");
    let spec = JobSpec::parse(&text, "db").unwrap();
    let scratch = storage::open(dir.path().join("scratch").to_str().unwrap()).unwrap();
    let tables = partition_database(&Database::of_spec(&spec), &scratch, "job", 2, PartitionKey::generate().unwrap())
        .await
        .unwrap();
    view_rows(&spec, &tables).await
}

/// Times declared inside their parent's interval (`within`): the views hold a chart's
/// place in its admission (a fraction in [0, 1]) and a stay's length (from the admission
/// on), and a database drawn from models fitted to them (no noise) has every chart inside
/// its drawn admission and every discharge at or after its admission, by construction:
/// the charts do not pile up on the admission's ends (as clipping would pile them), their
/// places in the admission follow the real ones, and the stays' lengths the real lengths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_lie_inside_their_parents_interval_without_piling_on_its_ends() {
    use rand::SeedableRng;

    let (layout, values) = timed_views(41).await;
    // The views: stays' lengths in seconds from the admission, charts' places in [0, 1].
    let stays: Vec<f64> = values[1].iter().map(|r| r[1].unwrap()).collect();
    let places: Vec<f64> = values[2].iter().map(|r| r[0].unwrap()).collect();
    assert!(stays.iter().all(|s| *s > 0.0) && places.iter().all(|u| (0.0..=1.0).contains(u)));
    assert!(places.iter().any(|u| *u > 0.5), "places spread over the stay");

    let pairs: [&[(&str, &str)]; 3] = [&[], &[("dischtime", "admission_type")], &[("charttime", "__position")]];
    let (_, fitted) = fit_exactly(&layout, &values, &pairs);
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(3);
    let synthetic = sample_database(&layout, &fitted, 800, 2, &mut rng);
    let [_, admissions, vitals] = &synthetic[..] else { panic!("three tables") };
    // Times may be missing (declared `missing = "keep"`: the fitted model keeps a sliver of
    // mass on the never-measured missing bins), and a time placed from a missing end is.
    let time = |v: &SyntheticValue| match v {
        SyntheticValue::Datetime(t) => Some(*t as f64),
        SyntheticValue::Missing => None,
        other => panic!("a time, not {other:?}"),
    };
    let mut drawn_stays = Vec::new();
    for a in admissions {
        let (Some(admit), Some(disch)) = (time(&a.values[0]), time(&a.values[1])) else { continue };
        assert!(disch >= admit, "a discharge before its admission");
        drawn_stays.push(disch - admit);
    }
    let (mut drawn_places, mut on_ends) = (Vec::new(), 0);
    for v in vitals {
        let a = &admissions[v.parent.unwrap()];
        let [Some(admit), Some(disch), Some(chart)] = [&a.values[0], &a.values[1], &v.values[0]].map(time) else {
            continue;
        };
        assert!(admit <= chart && chart <= disch, "a chart outside its admission");
        drawn_places.push((chart - admit) / (disch - admit).max(1.0));
        // On an end: within a second of it (a datetime is floored to the second).
        on_ends += usize::from((chart - admit).abs() < 1.0 || (disch - chart).abs() < 1.0);
    }
    assert!(drawn_stays.len() * 100 > admissions.len() * 98 && drawn_places.len() * 100 > vitals.len() * 97);
    assert!(on_ends * 100 < vitals.len(), "{on_ends} of {} charts on an end of their stay", vitals.len());
    // Places in tenths of the stay: real against drawn (equal bins of the fraction, so
    // drawing inside a bin is exact to the tenth).
    let tenths = |xs: &[f64]| {
        let mut h = [0.0; 10];
        xs.iter().for_each(|x| h[((x * 10.0) as usize).min(9)] += 1.0 / xs.len() as f64);
        h
    };
    let (real, drawn) = (tenths(&places), tenths(&drawn_places));
    let tvd: f64 = real.iter().zip(&drawn).map(|(a, b)| (a - b).abs()).sum::<f64>() / 2.0;
    assert!(tvd < 0.05, "places in the stay: TVD {tvd:.3} ({real:.2?} real, {drawn:.2?} drawn)");
    // Stays' lengths: medians (the fitted model keeps slivers of mass on the long, empty
    // bins, which a mean would follow).
    let median = |xs: &[f64]| {
        let mut xs = xs.to_vec();
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2] / 3600.0
    };
    let (real_stay, drawn_stay) = (median(&stays), median(&drawn_stays));
    assert!((drawn_stay / real_stay - 1.0).abs() < 0.15, "stays: {real_stay:.1} h real, {drawn_stay:.1} h drawn");
}

/// Each drawn admission's stay and its charts, from a synthetic database.
fn stays_and_charts(synthetic: &[Vec<rhosynth_shared::generators::database::SyntheticRow>]) -> Vec<(f64, f64)> {
    let mut charts = vec![0.0; synthetic[1].len()];
    synthetic[2].iter().for_each(|v| charts[v.parent.unwrap()] += 1.0);
    (synthetic[1].iter().zip(charts))
        .filter_map(|(a, n)| match (&a.values[0], &a.values[1]) {
            (SyntheticValue::Datetime(admit), SyntheticValue::Datetime(disch)) => Some(((disch - admit) as f64, n)),
            _ => None,
        })
        .collect()
}

/// Charts lie inside their admission (`within`), so the admissions' view holds each
/// admission's charts per second of its stay (`__rate.vitals`) beside their count; the
/// sampler gives the drawn counts out in the order of each admission's drawn rate times
/// its drawn stay. Fitted (no noise) to the one-way tables alone, the drawn database keeps
/// the real rank correlation of a stay's length and its charts within 0.05, and their
/// mean within three standard errors; without the rate (`rates = false`) the count is drawn apart from the
/// stay and the correlation is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_count_follows_its_parents_span_through_its_rate() {
    use rand::SeedableRng;

    let drawn = |params: &'static str| async move {
        let (layout, values) = timed_views_capped(41, (3, 48), params).await;
        let domain = View { table: 1 }.domain(&layout);
        let (stay, count) = (domain.index_of("dischtime").unwrap(), domain.index_of("__n.vitals").unwrap());
        let real: Vec<(f64, f64)> = values[1].iter().map(|r| (r[stay].unwrap(), r[count].unwrap())).collect();
        assert_eq!(domain.index_of("__rate.vitals").is_some(), params.is_empty());
        let pairs: [&[(&str, &str)]; 3] = [&[], &[], &[("charttime", "__position")]];
        let (_, fitted) = fit_exactly(&layout, &values, &pairs);
        let synthetic = sample_database(&layout, &fitted, 800, 2, &mut rand::rngs::ChaCha8Rng::seed_from_u64(3));
        (real, stays_and_charts(&synthetic))
    };
    let mean = |xs: &[(f64, f64)]| xs.iter().map(|x| x.1).sum::<f64>() / xs.len() as f64;
    let (real, with) = drawn("").await;
    let (r, w) = (rank_correlation(&real), rank_correlation(&with));
    assert!(r > 0.8, "the simulated charts follow the stay: {r:.2}");
    assert!((w - r).abs() < 0.05, "stay × charts: {w:.2} drawn, {r:.2} real");
    // Three standard errors of a mean of the drawn counts.
    let sd = (real.iter().map(|x| (x.1 - mean(&real)).powi(2)).sum::<f64>() / real.len() as f64).sqrt();
    let tolerance = 3.0 * sd / (with.len() as f64).sqrt();
    assert!((mean(&with) - mean(&real)).abs() < tolerance, "charts: {:.2} drawn, {:.2} real", mean(&with), mean(&real));
    let (_, without) = drawn("rates = false").await;
    let wo = rank_correlation(&without);
    assert!(wo.abs() < 0.1, "without the rate: {wo:.2}");
}

/// Pooled lag-1 correlation of a value over consecutive pairs.
fn lag_one(pairs: &[(f64, f64)]) -> f64 {
    let n = pairs.len() as f64;
    let (ma, mb) = (pairs.iter().map(|p| p.0).sum::<f64>() / n, pairs.iter().map(|p| p.1).sum::<f64>() / n);
    let cov: f64 = pairs.iter().map(|(a, b)| (a - ma) * (b - mb)).sum();
    let (va, vb): (f64, f64) =
        (pairs.iter().map(|p| (p.0 - ma).powi(2)).sum(), pairs.iter().map(|p| (p.1 - mb).powi(2)).sum());
    cov / (va * vb).sqrt()
}

/// An ordered table's rows are a sequence: its view holds each row's previous sibling's
/// values, and the sampler draws an admission's charts one after another, each given the
/// one before. Fitted (no noise) with each value's pair with its previous value, the drawn
/// heart rates keep the real lag-1 correlation within an admission; without those pairs
/// the same sampler draws charts independently given their admission, and the
/// correlation falls to what the admissions' own means leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_keeps_its_lag_one_dependence() {
    use rand::SeedableRng;

    let (layout, values) = timed_views(43).await;
    let domain = View { table: 2 }.domain(&layout);
    let (hr, before) = (domain.index_of("heart_rate").unwrap(), domain.index_of("__prev.heart_rate").unwrap());
    let real: Vec<(f64, f64)> = values[2].iter().filter_map(|r| Some((r[before]?, r[hr]?))).collect();
    let real = lag_one(&real);
    assert!(real > 0.3, "the simulated dynamics: {real:.2}");

    let drawn_lag = |pairs: &[(&str, &str)]| {
        let pairs: [&[(&str, &str)]; 3] = [&[], &[], pairs];
        let (_, fitted) = fit_exactly(&layout, &values, &pairs);
        let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(9);
        let synthetic = sample_database(&layout, &fitted, 800, 2, &mut rng);
        let vitals = &synthetic[2];
        let consecutive: Vec<(f64, f64)> = vitals
            .windows(2)
            .filter(|w| w[0].parent == w[1].parent)
            .filter_map(|w| match (&w[0].values[1], &w[1].values[1]) {
                (SyntheticValue::Real(a), SyntheticValue::Real(b)) => Some((*a, *b)),
                _ => None,
            })
            .collect();
        lag_one(&consecutive)
    };
    let with = drawn_lag(&[
        ("heart_rate", "__prev.heart_rate"),
        ("charttime", "__prev.charttime"),
        ("heart_rate", "admissions.admission_type"),
    ]);
    assert!((with - real).abs() < 0.1, "lag-1 of heart rate: {with:.2} drawn, {real:.2} real");
    let without = drawn_lag(&[("charttime", "__prev.charttime"), ("heart_rate", "admissions.admission_type")]);
    assert!(without < real / 2.0, "without the dynamics' pairs: {without:.2} ({real:.2} real)");
}

/// A patient's last admission is drawn given many columns its model never measured
/// together (its place and rows after, its patient's values, its previous admission's,
/// each missing before a first admission). From models fitted to noisy tables of sets as
/// AIM selects them (σ = 8 rows a cell), the drawn death rate of last admissions is off
/// the model's own by more than three standard errors. Raking the target
/// (`generators::database::rake`) brings it, and the death rate of all admissions, within
/// three standard errors of the model's. Over noise seeds 1–9 the unraked rate is off in
/// seven, and raked both are within in all seven (without the set of the outcome and the
/// admission's chart count, in five).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raking_brings_the_targets_drawn_rate_to_the_models_own() {
    use rand::SeedableRng;
    use rhosynth_shared::data::database::view::ColumnAt;
    use rhosynth_shared::generators::database::rake::{RAKING_ROUNDS, RAKING_ROWS, rake};

    let (layout, values) = timed_views(47).await;
    let sets: Vec<Vec<Vec<&str>>> = vec![
        vec![vec!["comorbidity", "__n.admissions"], vec!["age", "comorbidity"]],
        vec![
            vec!["outcome", "__position", "__after"],
            vec!["outcome", "patients.comorbidity"],
            vec!["outcome", "patients.age"],
            vec!["outcome", "__prev.outcome", "__prev.admittime"],
            vec!["admission_type", "patients.comorbidity"],
            vec!["outcome", "admission_type"],
            vec!["outcome", "__n.vitals"],
        ],
        vec![vec!["heart_rate", "__prev.heart_rate"], vec!["heart_rate", "admissions.outcome"]],
    ];
    let noise = &mut rand::rngs::ChaCha8Rng::seed_from_u64(1);
    let (_, mut fitted) = fit_views(&layout, &values, &sets, Some((8.0, noise)), 1000);
    let domain = View { table: 1 }.domain(&layout);
    let (outcome, after) = (domain.index_of("outcome").unwrap(), domain.index_of("__after").unwrap());
    // The model's own death rate (outcome's third category) of last admissions and of all.
    let joint = fitted[1].model.marginal(&[outcome, after]);
    let afters = joint.sizes[1];
    let count = |o: usize, last: bool| {
        (0..afters).filter(|&a| !last || a == 0).map(|a| joint.values[o * afters + a]).sum::<f64>()
    };
    let model = [true, false].map(|last| count(2, last) / (0..joint.sizes[0]).map(|o| count(o, last)).sum::<f64>());
    // The drawn rates, each with the admissions it is over.
    let drawn = |fitted: &[FittedView]| {
        let synthetic = sample_database(&layout, fitted, 4000, 2, &mut rand::rngs::ChaCha8Rng::seed_from_u64(11));
        let admissions = &synthetic[1];
        let is_last = |i: usize| admissions.get(i + 1).is_none_or(|next| next.parent != admissions[i].parent);
        let died = |i: &usize| admissions[*i].values[outcome] == SyntheticValue::Category("died".into());
        [true, false].map(|last| {
            let rows: Vec<usize> = (0..admissions.len()).filter(|&i| !last || is_last(i)).collect();
            (rows.iter().filter(|i| died(i)).count() as f64 / rows.len() as f64, rows.len() as f64)
        })
    };
    // Three standard errors of a rate drawn over n admissions at the model's rate.
    let tolerance = |p: f64, n: f64| 3.0 * (p * (1.0 - p) / n).sqrt();
    let before = drawn(&fitted);
    let ((unraked, n), p) = (before[0], model[0]);
    assert!(
        (unraked - p).abs() > tolerance(p, n),
        "unraked, last admissions: died {unraked:.3} drawn, {p:.3} the model's (± {:.3})",
        tolerance(p, n)
    );
    let target = ColumnAt { table: 1, column: outcome };
    let rng = &mut rand::rngs::ChaCha8Rng::seed_from_u64(12);
    let plans = Plans::new(&layout);
    let raked = rake(&layout, &mut fitted, &plans, target, RAKING_ROWS, RAKING_ROUNDS, rng).unwrap();
    assert!(raked.tilts >= 1 && raked.after < raked.before, "the gap falls: {raked:?}");
    // It stops at chance's gap (or at its last round).
    assert!(raked.after <= raked.chance || raked.tilts == RAKING_ROUNDS, "{raked:?}");
    let after_raking = drawn(&fitted);
    for (k, which) in ["last admissions", "all admissions"].iter().enumerate() {
        let ((raked, n), p) = (after_raking[k], model[k]);
        assert!(
            (raked - p).abs() < tolerance(p, n),
            "raked, {which}: died {raked:.3} drawn, {p:.3} the model's (± {:.3}; {:.3} unraked)",
            tolerance(p, n),
            before[k].0
        );
    }
    // Nothing to rake at the root: drawn given nothing.
    assert!(rake(&layout, &mut fitted, &plans, ColumnAt { table: 0, column: 2 }, RAKING_ROWS, 1, rng).is_none());
}

/// A layout arrives with a count task: a worker derives the view's domain and bound from
/// it, so one no spec makes is refused, not read: a root ordered as a sequence (its view
/// would read places its rows do not have), an interval on a column whose bounds are out of
/// order, an end in a table that is not an ancestor.
#[test]
fn a_layout_no_spec_makes_is_refused() {
    use rhosynth_shared::data::database::DatabaseView;
    use rhosynth_shared::data::database::view::ColumnAt;
    use rhosynth_shared::data::domain::Encoding;

    let dir = tempfile::tempdir().unwrap();
    let text = with_intervals(&database_job(dir.path(), (3, 8), "order_by = \"charttime\""));
    let spec = JobSpec::parse(&text, "db").unwrap();
    let layout = Layout::of(&Database::of_spec(&spec));
    let view = |layout: &Layout| DatabaseView { layout: layout.clone(), view: View { table: 2 } };
    assert!(view(&layout).is_consistent());
    let mut root_ordered = layout.clone();
    root_ordered.tables[0].order_by = Some(0);
    assert!(!view(&root_ordered).is_consistent());
    let mut reversed = layout.clone();
    if let Encoding::Numeric { min, max, .. } = &mut reversed.tables[1].domain.columns[0].encoding {
        std::mem::swap(min, max);
    }
    assert!(!view(&reversed).is_consistent(), "an end with its bounds out of order");
    let mut sideways = layout.clone();
    let within = sideways.tables[1].within[1].as_mut().unwrap();
    within.start = Some(ColumnAt { table: 2, column: 0 });
    assert!(!view(&sideways).is_consistent(), "an end in a table below");
}

/// The example database job parses and plans as its comments say: caps 5 and 24 (120
/// charts a patient at most), one zCDP charge split over three views, the charts' view a
/// sequence with its dynamics' pairs measured first.
#[test]
fn the_example_database_job_plans() {
    use rhosynth_shared::accounting::accountant::AccountingOptions;
    use rhosynth_shared::generators::database::DatabasePlan;

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mimic-database.toml");
    let spec = JobSpec::parse(&std::fs::read_to_string(&path).unwrap(), "mimic-database.toml").unwrap();
    let plan = DatabasePlan::new(&spec, &AccountingOptions::default()).unwrap();
    assert_eq!((0..3).map(|t| plan.layout.reach(t)).collect::<Vec<_>>(), [1, 5, 120]);
    let shares: f64 = plan.views.iter().map(|v| v.rho).sum();
    assert!((shares - plan.rho).abs() < 1e-12 * plan.rho, "the views' shares are the charge");
    assert_eq!(plan.views.iter().map(|v| v.task.max_rows_per_unit).collect::<Vec<_>>(), [1, 5, 120]);
    // The declared target (`admissions.outcome`): in the admissions' view, its pair with
    // every column but a sibling's place and values (the charts' means among them); in the
    // vitals', with each chart value whose mean the admission does not hold.
    let pairs = |v: usize| -> Vec<Vec<String>> {
        let domain = View { table: v }.domain(&plan.layout);
        let view = &plan.views[v];
        let named = |r: &usize| view.task.tables[*r].iter().map(|&c| domain.columns[c].name.clone()).collect();
        view.target_pairs.iter().map(named).collect()
    };
    assert!(pairs(0).is_empty(), "the root is above the target");
    let with_outcome: Vec<String> = pairs(1)
        .into_iter()
        .filter(|p| p.contains(&"outcome".to_string()) && !p.contains(&"__prev.outcome".to_string()))
        .map(|p| p.into_iter().find(|c| c != "outcome").unwrap())
        .collect();
    let wanted = ["admittime", "dischtime", "admission_type", "__after", "patients.age", "patients.sex"];
    let means = ["__mean.vitals.heart_rate", "__mean.vitals.resp_rate", "__mean.vitals.spo2"];
    let children = ["patients.comorbidity", "__n.vitals", "__rate.vitals"];
    assert_eq!(with_outcome, [&wanted[..], &children[..], &means[..]].concat());
    assert_eq!(pairs(1).len(), 12 + 4, "and each admission value with the one before it");
    let charts = ["charttime", "heart_rate", "resp_rate", "spo2"];
    let mut expected: Vec<Vec<String>> = charts.iter().map(|c| vec![c.to_string(), format!("__prev.{c}")]).collect();
    expected.extend(charts[1..].iter().map(|c| vec![c.to_string(), format!("admissions.__mean.vitals.{c}")]));
    expected.push(vec!["charttime".to_string(), "admissions.outcome".to_string()]);
    let mut got = pairs(2);
    let rank = |p: &Vec<String>| (p[1].starts_with("admissions"), p[1].contains("outcome"));
    got.sort_by_key(|p| (rank(p), charts.iter().position(|c| *c == p[0])));
    assert_eq!(
        got, expected,
        "each chart value with the one before it, with its admission's mean of it, and the time with the target"
    );
    assert_eq!(plan.views.iter().map(|v| v.target_share).collect::<Vec<_>>(), [0.0, 0.2, 0.2]);
    // A chart value is measured with its admission's mean of it and with none of the
    // admission's or the patient's other columns (the mean carries what they say of it).
    let (vitals, domain) = (&plan.views[2], View { table: 2 }.domain(&plan.layout));
    let name = |c: usize| domain.columns[c].name.as_str();
    for value in ["heart_rate", "resp_rate", "spo2"] {
        let given: Vec<&str> = (0..vitals.task.tables.len())
            .filter(|&r| vitals.measures(r) && vitals.task.tables[r].iter().any(|&c| name(c) == value))
            .flat_map(|r| vitals.task.tables[r].iter().map(|&c| name(c)))
            .filter(|c| c.starts_with("admissions.") || c.starts_with("patients."))
            .collect();
        assert!(given.iter().all(|c| *c == format!("admissions.__mean.vitals.{value}")), "{value}: {given:?}");
        assert!(!given.is_empty(), "{value} with its admission's mean");
    }
    assert!((0..vitals.task.tables.len()).any(|r| vitals.measures(r)
        && vitals.task.tables[r].iter().map(|&c| name(c)).collect::<Vec<_>>() == ["charttime", "admissions.outcome"]));

    // A target no table holds, and a target share without a target, are refused.
    for (section, refused) in [
        ("target = \"admissions.result\"", "table 'admissions' has no value column 'result'"),
        ("target = \"stays.outcome\"", "the job declares no table 'stays'"),
        ("target = \"admissions.hadm_id\"", "no value column 'hadm_id'"),
    ] {
        let text = std::fs::read_to_string(&path).unwrap().replace("target = \"admissions.outcome\"", section);
        let spec = JobSpec::parse(&text, "db").unwrap();
        let error = DatabasePlan::new(&spec, &AccountingOptions::default()).unwrap_err().to_string();
        assert!(error.contains(refused), "{error}");
    }
    // With `means = false` no view holds a mean, and a chart value goes with the target
    // directly.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("target = \"admissions.outcome\"", "target = \"admissions.outcome\"\nmeans = false");
    let plain = DatabasePlan::new(&JobSpec::parse(&text, "db").unwrap(), &AccountingOptions::default()).unwrap();
    for table in 0..3 {
        let domain = View { table }.domain(&plain.layout);
        assert!(domain.columns.iter().all(|c| !c.name.contains("__mean.")), "{:?}", domain.columns);
    }
    assert!(plain.views[2].kept_apart.is_empty());
    // A layout written without the switch holds the means, as a spec without it does.
    let mut written = serde_json::to_value(&plan.layout).unwrap();
    written.as_object_mut().unwrap().remove("means");
    assert!(serde_json::from_value::<Layout>(written).unwrap().means);
    let domain = View { table: 2 }.domain(&plain.layout);
    let outcome = domain.index_of("admissions.outcome").unwrap();
    let paired = |c: &str| {
        plain.views[2]
            .target_pairs
            .iter()
            .any(|&r| plain.views[2].task.tables[r] == [domain.index_of(c).unwrap(), outcome])
    };
    assert!(["charttime", "heart_rate", "resp_rate", "spo2"].iter().all(|c| paired(c)));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("target = \"admissions.outcome\"", "[generator.database.aim]\ntarget_share = 0.3");
    assert!(JobSpec::parse(&text, "db").unwrap_err().to_string().contains("declare the target"));
    // The target's table is raked by default (its column among the admissions' own), not
    // with `rake = false`, and never a target of the root (drawn given nothing).
    assert_eq!(
        plan.rake.map(|t| (t.table, plan.layout.tables[1].domain.columns[t.column].name.as_str())),
        Some((1, "outcome"))
    );
    let plan_of = |replace: &str| {
        let text = std::fs::read_to_string(&path).unwrap().replace("target = \"admissions.outcome\"", replace);
        DatabasePlan::new(&JobSpec::parse(&text, "db").unwrap(), &AccountingOptions::default()).unwrap()
    };
    assert_eq!(plan_of("target = \"admissions.outcome\"\nrake = false").rake, None);
    assert_eq!(plan_of("target = \"patients.comorbidity\"").rake, None);
}

/// `rhosynth validate` of a database job reads every table against its own columns and
/// keys: a chart's heart rate that is no number and an admissions file without its key
/// column are reported with their files, beside the root's rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_a_database_reads_every_table() {
    use rhosynth_shared::data::domain::Domain;
    use rhosynth_shared::data::{DataError, input};

    let dir = tempfile::tempdir().unwrap();
    let mut db = database_csv(50, 3);
    let spec = rhosynth_shared::testing::database_spec(dir.path(), (3, 8), "order_by = \"charttime\"");
    write_database(dir.path(), &db);
    let valid = input::validate(&spec, &Domain::from_spec(&spec), 10).await;
    assert!(valid.is_valid(), "{:?}", valid.problems);
    assert_eq!(valid.files, 3);
    let rows = [&db.patients, &db.admissions, &db.vitals].iter().map(|t| t.lines().count() as u64 - 1).sum::<u64>();
    assert_eq!(valid.rows, rows, "every table's rows read");

    let mut vitals: Vec<String> = db.vitals.lines().map(str::to_string).collect();
    let mut fields: Vec<&str> = vitals[3].split(',').collect();
    fields[3] = "fast";
    vitals[3] = fields.join(",");
    db.vitals = vitals.join("\n") + "\n";
    db.admissions = db.admissions.replacen("hadm_id,", "admission,", 1);
    write_database(dir.path(), &db);
    let found = input::validate(&spec, &Domain::from_spec(&spec), 10).await;
    assert!(!found.is_valid());
    let file_of = |p: &DataError| match p {
        DataError::Value { file, column, .. } => format!("{file}:{column}"),
        DataError::MissingColumn { file, column } => format!("{file}:{column}"),
        other => other.to_string(),
    };
    let problems: Vec<String> = found.problems.iter().map(file_of).collect();
    assert!(problems.iter().any(|p| p.ends_with("admissions.csv:hadm_id")), "{problems:?}");
    assert!(problems.iter().any(|p| p.ends_with("vitals.csv:heart_rate")), "{problems:?}");
}

/// The evaluation of a database (`eval::database`): a database against itself scores the
/// floor exactly (every distance 0, the same lag-1, every row with its parent, the same
/// utility whichever copy trains); a synthetic database with every patient's admissions
/// cut to the first scores the held-out share of patients with two or more admissions as
/// the TVD of admissions per patient; and charts moved under another patient's admission
/// are counted without their parent, one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_evaluation_scores_its_floor_cut_children_and_broken_keys_exactly() {
    use rhosynth_shared::eval::EvalLimits;
    use rhosynth_shared::eval::database::{Databases, Label, REJOINED, evaluate, load, spec_files};
    let dir = tempfile::tempdir().unwrap();
    let db = database_csv(300, 3);
    write_database(dir.path(), &db);
    let spec =
        JobSpec::parse(&with_intervals(&database_job(dir.path(), (3, 8), "order_by = \"charttime\"")), "db").unwrap();
    let layout = Layout::of(&Database::of_spec(&spec));
    let files = spec_files(&spec);
    let label = Label::parse(&layout, "admissions.outcome=died").unwrap();
    let loaded = || load(&spec, &files);
    let databases =
        Databases { train: loaded().await.unwrap(), test: loaded().await.unwrap(), synthetic: loaded().await.unwrap() };
    let report = evaluate(&layout, &databases, Some(&label), None, &EvalLimits::default()).unwrap();
    assert_eq!(report.tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["patients", "admissions", "vitals"]);
    for t in &report.tables {
        let distances = t.children.iter().map(|c| &c.tvd).chain(&t.cross).chain(&t.means).chain(&t.transitions);
        for d in distances {
            assert_eq!((d.synthetic, d.train), (0.0, 0.0), "{}: {}", t.name, d.what);
        }
        assert_eq!((t.integrity.with_parent, t.integrity.without_parent), (1.0, 0), "{}", t.name);
        assert!((t.fidelity.hist - 1.0).abs() < 1e-12, "{}", t.name);
        for l in &t.lag1 {
            assert_eq!((l.synthetic, l.train), (l.held_out, l.held_out), "{}", l.column);
        }
        for w in &t.within {
            assert_eq!((w.held_out, w.synthetic), (1.0, 1.0), "{}", w.column);
        }
    }
    let vitals = &report.tables[2];
    assert_eq!(vitals.lag1.iter().map(|l| l.column.as_str()).collect::<Vec<_>>(), ["heart_rate", "resp_rate", "spo2"]);
    assert!(vitals.lag1[0].held_out > 0.3, "the simulated heart rate persists: {:?}", vitals.lag1[0]);
    assert_eq!(vitals.within.len(), 1);
    assert!(!vitals.cross.is_empty() && !vitals.means.is_empty() && vitals.transitions.is_empty());
    assert_eq!(report.tables[1].transitions.len(), 2, "admission type and outcome");
    // Per patient, the synthetic patients are the training ones: every one a copy, at
    // distance 0.
    assert_eq!((report.privacy.exact_copy_rate, report.privacy.dcr_synthetic_median), (1.0, 0.0));
    let utility = report.utility.as_ref().unwrap();
    let auc = |on: &str| utility.scores.iter().filter(|s| s.trained_on == on).map(|s| s.roc_auc).collect::<Vec<_>>();
    assert_eq!(auc("synthetic"), auc("real (train)"));
    assert!(auc("synthetic").iter().all(|a| *a > 0.6), "the label is predictable: {utility:?}");
    // The same tables with each row under a parent drawn at random: what ties a patient to
    // the deaths of its admissions is gone, and the models trained on them predict less.
    let (rejoined, synthetic) = (auc(REJOINED), auc("synthetic"));
    assert!(rejoined.iter().zip(&synthetic).all(|(r, s)| *r < s - 0.05), "{rejoined:?} against {synthetic:?}");
    // Each attribute's link to the children's summaries: the same in every copy.
    for l in report.tables.iter().flat_map(|t| &t.links) {
        let same = |x: f64| x.total_cmp(&l.held_out).is_eq();
        assert!(same(l.synthetic) && same(l.train), "{l:?}");
    }
    assert_eq!(report.links_error(), Some((0.0, 0.0)));
    let link = |t: usize, attribute: &str, summary: &str| {
        let found = report.tables[t].links.iter().find(|l| l.attribute == attribute && l.summary == summary);
        found.unwrap_or_else(|| panic!("{attribute} × {summary}")).held_out
    };
    let (heart_rate, charts) =
        (link(1, "patients.comorbidity", "__mean.vitals.heart_rate"), link(1, "dischtime", "__n.vitals"));
    assert!(heart_rate > 0.2 && charts > 0.2, "the simulated links: η {heart_rate:.2}, r {charts:.2}");

    // Each patient's first admission only (by time, as the cap keeps them), and three
    // charts moved to another patient's admission.
    let admissions = rows(&db.admissions);
    let mut first: BTreeMap<&str, &Vec<String>> = BTreeMap::new();
    for a in &admissions {
        let kept = first.entry(&a[1]).or_insert(a);
        if seconds(&a[2]) < seconds(&kept[2]) {
            *kept = a;
        }
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    admissions.iter().for_each(|a| *counts.entry(&a[1]).or_default() += 1);
    let several = counts.values().filter(|n| **n >= 2).count() as f64 / rows(&db.patients).len() as f64;
    let cut = dir.path().join("cut");
    std::fs::create_dir_all(&cut).unwrap();
    let mut text = format!("{}\n", db.admissions.lines().next().unwrap());
    first.values().for_each(|a| text.push_str(&format!("{}\n", a.join(","))));
    std::fs::write(cut.join("admissions.csv"), text).unwrap();
    let (from, to) = (&first.values().next().unwrap()[0], &first.values().last().unwrap()[0]);
    let mut moved = 0;
    let vitals_text: Vec<String> = db
        .vitals
        .lines()
        .map(|line| {
            let mut fields: Vec<&str> = line.split(',').collect();
            if moved < 3 && fields[1] == from.as_str() {
                moved += 1;
                fields[1] = to;
            }
            fields.join(",")
        })
        .collect();
    assert_eq!(moved, 3);
    std::fs::write(cut.join("vitals.csv"), vitals_text.join("\n") + "\n").unwrap();
    let mut synthetic = files.clone();
    synthetic[1] = vec![cut.join("admissions.csv").display().to_string()];
    synthetic[2] = vec![cut.join("vitals.csv").display().to_string()];
    let databases = Databases { synthetic: load(&spec, &synthetic).await.unwrap(), ..databases };
    let report = evaluate(&layout, &databases, None, None, &EvalLimits::default()).unwrap();
    let per_patient = &report.tables[0].children[0].tvd;
    assert!((per_patient.synthetic - several).abs() < 1e-12, "{} vs {several}", per_patient.synthetic);
    assert!(several > 0.2, "{several}");
    // Without their parent: the three moved, and the charts of every admission cut.
    let firsts: std::collections::HashSet<&str> = first.values().map(|a| a[0].as_str()).collect();
    let orphans = rows(&db.vitals).iter().filter(|v| !firsts.contains(v[1].as_str())).count() as u64;
    let integrity = &report.tables[2].integrity;
    assert_eq!(integrity.without_parent, 3 + orphans);
    let share = 1.0 - (3 + orphans) as f64 / integrity.rows_read as f64;
    assert!((integrity.with_parent - share).abs() < 1e-12 && report.tables[1].integrity.with_parent == 1.0);
}
