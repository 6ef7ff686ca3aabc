use super::grid::{GRID_CELLS, Grid};
use super::profile::{ColumnProfile, Shape, header, profile};
use super::*;
use crate::data::source::CsvOptions;
use crate::spec::JobSpec;

/// A file of 30 patients with 1 to 3 visits: an id, an integer age (20 + p), a decimal
/// score, a colour (red twice as common as blue), a note only one row holds.
fn write_visits(dir: &std::path::Path) -> String {
    let mut text = String::from("patient,age,score,colour,note\n");
    for p in 0..30 {
        for v in 0..(1 + p % 3) {
            let colour = if p % 3 == 0 { "blue" } else { "red" };
            let note = if p == 7 && v == 0 { "unique remark" } else { "" };
            text.push_str(&format!("p{p},{},{}.5,{colour},{note}\n", 20 + p, p % 7));
        }
    }
    let path = dir.join("visits.csv");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[tokio::test]
async fn a_units_rows_are_bounded_and_counted_once_per_value() {
    let dir = tempfile::tempdir().unwrap();
    let url = write_visits(dir.path());
    let profile = profile(&url, &names(), &CsvOptions::default(), Some("patient"), 1).await.unwrap();
    let names: Vec<&str> = profile.columns.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["age", "score", "colour", "note"]);
    // One row a patient: 30 rows whatever the visits.
    let age = &profile.columns[0];
    assert_eq!(age.shapes, [30.0, 0.0, 0.0, 0.0]);
    assert_eq!(age.numbers.len(), 30);
    assert_eq!(profile.columns[1].shapes[Shape::Decimal as usize], 30.0);
    let colour = &profile.columns[2].values;
    assert_eq!((colour["blue"], colour["red"]), (10.0, 20.0));
    // Patient 7 has two visits: the kept one holds the note or not.
    assert!(profile.columns[3].shapes[Shape::Missing as usize] >= 29.0);

    // Without a unit column every row is a unit.
    let rows = profile_rows(&url).await;
    assert_eq!(rows.columns[1].shapes[Shape::Integer as usize], 60.0, "patient is then a column");
}

async fn profile_rows(url: &str) -> Profile {
    profile(url, &names(), &CsvOptions::default(), None, 1).await.unwrap()
}

/// A line that is not a row on its own (another number of fields, a quote left open, not
/// UTF-8) and a row without a unit id (as the options spell missing) are left out, with no
/// error, and leave every other line as it was: an open quote does not swallow the lines
/// after it. Lines may end in \n, \r\n or \r.
#[tokio::test]
async fn a_line_left_out_leaves_the_others_as_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.csv");
    let mut text: Vec<u8> = b"patient,age,score,colour,note\r\np1,30,1.5,red,\np2,31,2.5\r".to_vec();
    text.extend_from_slice(b"p4,\"oops,9,9.5,blue,x\n,99,9.5,blue,x\n?,98,9.5,blue,x\np5,97,\xff,blue,x\n");
    text.extend_from_slice(b"\"p3\",32,3.5,\"green, light\",\rp6.,33,1.0,red,\n");
    std::fs::write(&path, text).unwrap();
    let options = CsvOptions {
        null_values: vec![String::new(), "?".into()],
        strip_suffix: Some(".".into()),
        ..CsvOptions::default()
    };
    let url = path.to_str().unwrap();
    assert_eq!(header(url, &options).await.unwrap(), names());
    let profile = profile(url, &names(), &options, Some("patient"), 1).await.unwrap();
    let mut ages = profile.columns[0].numbers.clone();
    ages.sort_by(f64::total_cmp);
    assert_eq!(ages, [30.0, 32.0, 33.0], "p1, p3 and p6 only");
    assert!(profile.columns[2].values.contains_key("green, light"), "quoted fields keep their commas");
}

#[tokio::test]
async fn a_header_line_is_read_alone_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wide.csv");
    std::fs::write(&path, format!("{}\n1\n", "x".repeat(70 * 1024))).unwrap();
    let refused = header(path.to_str().unwrap(), &CsvOptions::default()).await.unwrap_err().to_string();
    assert!(refused.contains("no header line ends within"), "{refused}");
    // A byte-order mark is not part of the first name.
    std::fs::write(&path, "\u{feff}a,b\n1,2\n").unwrap();
    assert_eq!(header(path.to_str().unwrap(), &CsvOptions::default()).await.unwrap(), ["a", "b"]);
}

/// A gzip or zstd file is drafted from its rows, as the job reads them (before, its
/// compressed bytes were read as lines and every one left out: a draft of no rows).
#[tokio::test]
async fn a_compressed_file_drafts_as_its_text() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let plain = write_visits(dir.path());
    let text = std::fs::read(&plain).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&text).unwrap();
    let files = [("visits.csv.gz", gz.finish().unwrap()), ("visits.csv.zst", zstd::encode_all(&text[..], 3).unwrap())];
    let options = CsvOptions::default();
    let expected = profile(&plain, &names(), &options, Some("patient"), 3).await.unwrap();
    assert!(!expected.columns[0].numbers.is_empty());
    for (name, bytes) in files {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let url = path.to_str().unwrap();
        assert_eq!(header(url, &options).await.unwrap(), names(), "{name}");
        let drafted = profile(url, &names(), &options, Some("patient"), 3).await.unwrap();
        // The same statistics (numbers in the order units come out of a map: sorted here).
        let sorted = |p: &Profile| {
            let mut p = p.clone();
            p.columns.iter_mut().for_each(|c| c.numbers.sort_by(f64::total_cmp));
            p
        };
        assert_eq!(sorted(&drafted), sorted(&expected), "{name}");
    }
}

fn names() -> Vec<String> {
    ["patient", "age", "score", "colour", "note"].map(String::from).to_vec()
}

#[tokio::test]
async fn an_exact_draft_holds_the_data_as_it_is_and_parses_only_once_unmarked() {
    let dir = tempfile::tempdir().unwrap();
    let url = write_visits(dir.path());
    let profile = profile(&url, &names(), &CsvOptions::default(), Some("patient"), 3).await.unwrap();
    let draft = draft(&profile, Some("patient"), &mut Exact, &DraftOptions::default()).unwrap();
    assert!(
        matches!(&draft.columns[0], DraftColumn::Numeric { integer: true, min, max, .. } if *min == 20.0 && *max == 49.0)
    );
    let DraftColumn::Numeric { bins: Some(edges), .. } = &draft.columns[0] else { panic!("age has bins") };
    assert_eq!((edges[0], *edges.last().unwrap()), (20.0, 49.0));
    assert!(edges.windows(2).all(|w| w[0] < w[1]), "{edges:?}");
    assert!(
        matches!(&draft.columns[1], DraftColumn::Numeric { integer: false, min, max, .. } if *min == 0.5 && *max == 6.5)
    );
    assert_eq!(
        draft.columns[2],
        DraftColumn::Categorical { name: "colour".into(), categories: vec!["blue".into(), "red".into()], other: false }
    );
    let text = render(&draft, &url, "visits", &Provenance::Exact, &DraftJob::default());
    assert!(text.contains("PRIVATE"), "{text}");
    // It is not a spec until the marker is deleted, deliberately.
    let refused = JobSpec::parse(&text, "draft").unwrap_err().to_string();
    assert!(refused.contains(PRIVATE_MARKER), "{refused}");
    let edited: String = text.lines().filter(|l| !l.starts_with(PRIVATE_MARKER)).map(|l| format!("{l}\n")).collect();
    let spec = JobSpec::parse(&edited, "draft").unwrap_or_else(|e| panic!("{e}\n{edited}"));
    assert_eq!(spec.schema.unit_column.as_deref(), Some("patient"));
    assert_eq!(spec.schema.columns.len(), 5);
}

#[test]
fn bins_fall_at_the_grids_quantiles() {
    // Uniform over [0, 256): four bins at 64, 128, 192.
    let grid = Grid::new(0.0, 256.0, true);
    assert_eq!(grid.bin_edges(&[1.0; GRID_CELLS], 4, 0.0), vec![0.0, 64.0, 128.0, 192.0, 256.0]);
    // Everything in the first cell: the quantiles collapse onto one edge.
    let mut counts = vec![0.0; GRID_CELLS];
    counts[0] = 100.0;
    assert_eq!(grid.bin_edges(&counts, 4, 0.0), vec![0.0, 1.0, 256.0]);
    // Found by tests/schema_draft.rs: far from zero, the last grid cell's edge lies above
    // hi by rounding (lo + (hi − lo)/n·n ≠ hi), was kept and hi dropped, and the draft's
    // own bins then failed to parse (edges must end at max).
    let (lo, hi) = (-1_048_576.0, 53.817_370_576_237_73);
    let mut last = vec![0.0; GRID_CELLS];
    last[GRID_CELLS - 1] = 100.0;
    assert!(lo + (hi - lo) / GRID_CELLS as f64 * GRID_CELLS as f64 > hi);
    // (The heavy last cell is a bin of its own.)
    let far = Grid::new(lo, hi, false);
    assert_eq!(far.bin_edges(&last, 4, 0.0), vec![lo, far.start(GRID_CELLS - 1), hi]);
    let continuous = Grid::new(0.0, 10.0, false);
    assert_eq!((continuous.cell(-5.0), continuous.cell(10.0)), (0, GRID_CELLS - 1));
}

/// A grid's cells tile its range: every value lies in the cell whose bounds hold it, and
/// an integer column's lower bound has a cell of its own.
#[test]
fn a_grids_cells_hold_their_values() {
    for grid in [Grid::new(0.0, 2048.0, true), Grid::new(19.0, 64.0, true), Grid::new(-3.5, 7.25, false)] {
        assert!((1..=GRID_CELLS).all(|i| grid.start(i) > grid.start(i - 1)), "{grid:?}");
        for k in 0..=1000 {
            let x = grid.start(0) + (grid.start(GRID_CELLS) - grid.start(0)) * f64::from(k) / 1000.0;
            let i = grid.cell(x);
            assert!(grid.start(i) <= x && (x < grid.start(i + 1) || i == GRID_CELLS - 1), "{grid:?} {x} in {i}");
        }
    }
    let integers = Grid::new(0.0, 2048.0, true);
    assert_eq!((integers.cell(0.0), integers.cell(0.5), integers.cell(1.0)), (0, 0, 1));
}

/// A value many rows share keeps a bin of its own (a release draws uniformly within a
/// bin): 40 hours a week, or the zeros of a zero-inflated amount, are drawn as themselves
/// instead of spread over their neighbours.
#[test]
fn a_value_many_rows_share_is_a_bin_of_its_own() {
    let draft_of = |numbers: Vec<f64>| {
        let column = ColumnProfile {
            name: "x".into(),
            shapes: [numbers.len() as f64, 0.0, 0.0, 0.0],
            numbers,
            ..ColumnProfile::default()
        };
        let profile = Profile { columns: vec![column] };
        match &draft(&profile, None, &mut Exact, &DraftOptions::default()).unwrap().columns[0] {
            DraftColumn::Numeric { bins: Some(bins), .. } => bins.clone(),
            other => panic!("{other:?}"),
        }
    };
    // Hours a week: 19 to 64, nearly half at 40.
    let hours: Vec<f64> = (0..2000).map(|i| if i % 2 == 0 { 40.0 } else { f64::from(19 + i % 46) }).collect();
    let bins = draft_of(hours);
    let at = bins.iter().position(|&e| e == 40.0).unwrap_or_else(|| panic!("{bins:?}"));
    assert_eq!(bins[at + 1], 41.0, "{bins:?}");
    // An amount: 95% zeros, the rest spread to 2048.
    let amounts: Vec<f64> = (0..2000).map(|i| if i % 20 == 0 { f64::from(i) } else { 0.0 }).collect();
    let bins = draft_of(amounts);
    assert_eq!(bins[..2], [0.0, 1.0], "{bins:?}");
    // Noise alone makes no bin of its own: 100 bins over counts that are noise (σ = 36),
    // where a bin's share is below what noise reaches, with the noisy draft's floor.
    let sigma = 36.0;
    let floor = sigma * 4.47; // the noisy draft's: Φ⁻¹(1 − 0.001/256)·σ
    let noise: Vec<f64> = (0..GRID_CELLS).map(|i| sigma * (2.5 * ((i * 7919 % 256) as f64 / 256.0 - 0.5))).collect();
    let grid = Grid::new(0.0, 2048.0, true);
    let quantiles_alone = grid.bin_edges(&noise, 100, f64::INFINITY);
    assert_ne!(grid.bin_edges(&noise, 100, 0.0), quantiles_alone, "the test's noise reaches a bin's share");
    assert_eq!(grid.bin_edges(&noise, 100, floor), quantiles_alone);
}

/// Compression keeps the values at or above the share, at most `max_categories`, and
/// always the most common one; whatever it drops goes to `__other__`.
#[test]
fn rare_values_go_to_other_and_the_most_common_stays() {
    let column = |counts: &[(&str, f64)]| ColumnProfile {
        name: "c".into(),
        shapes: [0.0, 0.0, counts.iter().map(|(_, c)| c).sum(), 0.0],
        values: counts.iter().map(|(v, c)| (v.to_string(), *c)).collect(),
        numbers: Vec::new(),
    };
    let profile = Profile { columns: vec![column(&[("a", 60.0), ("b", 30.0), ("c", 9.0), ("d", 1.0)])] };
    let drafted = |min_share, max_categories| {
        let options = DraftOptions { min_share, max_categories, ..DraftOptions::default() };
        draft(&profile, None, &mut Exact, &options).unwrap().columns.remove(0)
    };
    let categorical = |list: &[&str], other| DraftColumn::Categorical {
        name: "c".into(),
        categories: list.iter().map(|v| v.to_string()).collect(),
        other,
    };
    assert_eq!(drafted(0.0, 100), categorical(&["a", "b", "c", "d"], false));
    assert_eq!(drafted(0.05, 100), categorical(&["a", "b", "c"], true));
    assert_eq!(drafted(0.05, 2), categorical(&["a", "b"], true));
    assert_eq!(drafted(0.99, 100), categorical(&["a"], true));
}
