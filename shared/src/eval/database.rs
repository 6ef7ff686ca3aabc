//! Evaluation of a synthetic database (`rhosynth eval` of a spec with `[[tables]]`): per
//! table its fidelity, its keys' integrity, its rows per parent row, its values against
//! its ancestors' (cross-table marginals), a sequence's dynamics and the values inside
//! their intervals; per unit, train-on-synthetic / test-on-real of a label joined from
//! the tables.
//!
//! Every database (training, held-out, synthetic) is read as a job reads its input: by
//! unit, joined by keys and capped by the spec's public rule ([`partition_database`] into
//! one partition in a private temporary folder, then [`read_units`]). A measure therefore
//! sees what the generator saw, and a synthetic row whose parent is absent (or belongs to
//! another unit) is counted, not joined. Cross-table measures compare the synthetic
//! database with the held-out one, beside the training database's distance to the same
//! held-out one: the real data's own floor, what a perfect generator would score.
//!
//! Like every evaluation, this reads private data and is not differentially private.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::fidelity::{self, Fidelity};
use super::longitudinal::pearson;
use super::privacy::{self, PrivacyDiagnostics};
use super::utility::{self, Utility};
use super::{EvalError, EvalLimits, NOTICE, RowCounts, SampleUse, Sampling, StageTiming};
use crate::data::DataError;
use crate::data::database::view::{COUNT_PREFIX, ColumnAt};
use crate::data::database::{Database, DroppedRows, Layout, UnitRows, View, partition_database, read_units};
use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::data::partition::PartitionKey;
use crate::data::table::Table;
use crate::spec::{ColumnKind, JobSpec, TableSpec};
use crate::storage;

/// A database's files, by table in the layout's order (the root first).
pub type TableFiles = Vec<Vec<String>>;

/// A view's rows (of one database, one table).
type ViewRows = [Vec<Option<f64>>];

/// What `rhosynth eval` reports of a database.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DatabaseReport {
    /// Always first: "NOT DIFFERENTIALLY PRIVATE — DO NOT PUBLISH." and why.
    pub notice: String,
    /// Always `false`.
    pub differentially_private: bool,
    /// The formal guarantee, from the synthetic release's manifest when there is one.
    pub guarantee: Option<serde_json::Value>,
    /// Units read (sampled under `limits.database_units` beyond it).
    pub units: RowCounts,
    pub tables: Vec<TableEvaluation>,
    /// Train on synthetic, test on real, per unit (with `--label`).
    pub utility: Option<Utility>,
    /// Distances to the closest record and the membership attack, per unit: over each
    /// unit's row of features (the utility's, the label left out), its whole subtree in one
    /// row.
    pub privacy: PrivacyDiagnostics,
    pub limits: EvalLimits,
    pub sampling: Vec<SampleUse>,
    pub timings: Vec<StageTiming>,
}

/// One table's measures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TableEvaluation {
    pub name: String,
    pub parent: Option<String>,
    /// Rows kept under the caps (of the units read).
    pub rows: RowCounts,
    /// What reading the synthetic table left out (a child's integrity).
    pub integrity: Integrity,
    /// Its own columns, synthetic against the training rows (as a one-table evaluation).
    pub fidelity: Fidelity,
    /// Per child table, the distribution of its rows per row of this one.
    pub children: Vec<ChildCounts>,
    /// Joint distributions of an attribute of this table or an ancestor with a count of a
    /// child table's rows, or of an ancestor's attribute with this table's own value: TVD
    /// to the held-out database's.
    pub cross: Vec<Distance>,
    /// An own numeric value's mean per bin of an ancestor's attribute: the mean absolute
    /// error to the held-out database's means (weighted by the held-out bins' rows), in the
    /// value's unit.
    pub means: Vec<Distance>,
    /// A sequence's (a table with `order_by`) lag-1 correlation of each numeric value
    /// between siblings.
    pub lag1: Vec<Lag1>,
    /// A sequence's categorical transitions: TVD of the (previous, next) pairs.
    pub transitions: Vec<Distance>,
    /// Each value with an interval (`within`): the share of rows inside it.
    pub within: Vec<Inside>,
    /// Each attribute of this table or an ancestor against each summary of this table's
    /// children (their count, each plain numeric value's mean): what ties a row to its
    /// children, measured in each database.
    #[serde(default)]
    pub links: Vec<Link>,
}

/// An attribute of a row (or of its ancestor) against a summary of the row's children:
/// Pearson's correlation with a numeric attribute, the correlation ratio η with a
/// categorical one, over the rows with both.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Link {
    pub attribute: String,
    pub summary: String,
    pub held_out: f64,
    pub train: f64,
    pub synthetic: f64,
}

/// What the utility calls models trained on the synthetic tables re-joined at random.
pub const REJOINED: &str = "synthetic, re-joined at random";

impl DatabaseReport {
    /// The mean absolute difference of the links (`TableEvaluation::links`) from the
    /// held-out database's, over every table's: (synthetic, train); `None` without any.
    pub fn links_error(&self) -> Option<(f64, f64)> {
        let finite = |l: &&Link| [l.held_out, l.train, l.synthetic].iter().all(|v| v.is_finite());
        let links: Vec<&Link> = self.tables.iter().flat_map(|t| &t.links).filter(finite).collect();
        let n = links.len() as f64;
        let error = |f: fn(&Link) -> f64| links.iter().map(|l| (f(l) - l.held_out).abs()).sum::<f64>() / n;
        (n > 0.0).then(|| (error(|l| l.synthetic), error(|l| l.train)))
    }
}

/// Rows of a table that reading left out, and the share of child rows with their parent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Integrity {
    pub rows_read: u64,
    /// Whose parent row is absent (not in the parent table, of another unit, or left out
    /// for another reason than a cap).
    pub without_parent: u64,
    /// Whose own key an earlier row already holds.
    pub duplicate_keys: u64,
    /// Beyond their parent's cap, or under a row a cap dropped.
    pub over_cap: u64,
    /// That broke the table's schema.
    pub bad: u64,
    /// Share of the rows read whose parent exists (1 for the root): must be 1.
    pub with_parent: f64,
}

impl TableEvaluation {
    /// The mean of the cross-table TVDs: (synthetic, train); `None` without any.
    pub fn cross_mean(&self) -> Option<(f64, f64)> {
        let n = self.cross.len() as f64;
        let mean = |f: fn(&Distance) -> f64| self.cross.iter().map(f).sum::<f64>() / n;
        (n > 0.0).then(|| (mean(|d| d.synthetic), mean(|d| d.train)))
    }
}

impl Integrity {
    /// Of a table whose reading kept `kept` rows and left out `dropped`.
    fn of(kept: u64, dropped: &DroppedRows) -> Self {
        let rows_read = kept + dropped.over_cap + dropped.without_parent + dropped.bad;
        Self {
            rows_read,
            without_parent: dropped.without_parent,
            duplicate_keys: dropped.duplicate_keys,
            over_cap: dropped.over_cap,
            bad: dropped.bad,
            with_parent: if rows_read == 0 { 1.0 } else { 1.0 - dropped.without_parent as f64 / rows_read as f64 },
        }
    }
}

/// A child table's rows per row of its parent: the held-out and synthetic distributions
/// over the counts' bins (one per count up to 32 of them; `labels`), their TVD, and the
/// training table's TVD to the held-out (the floor).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChildCounts {
    pub child: String,
    pub labels: Vec<String>,
    pub held_out: Vec<f64>,
    pub synthetic: Vec<f64>,
    pub tvd: Distance,
}

/// One measure's distance to the held-out database: of the synthetic one, and of the
/// training one (the floor).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Distance {
    /// What is compared, e.g. "admissions.admission_type × heart_rate".
    pub what: String,
    pub synthetic: f64,
    pub train: f64,
}

/// Lag-1 correlation of a sequence's value, in each database.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Lag1 {
    pub column: String,
    pub held_out: f64,
    pub train: f64,
    pub synthetic: f64,
}

/// The share of a value's rows inside their interval (rows with it and both ends known).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Inside {
    pub column: String,
    pub held_out: f64,
    pub synthetic: f64,
}

/// The unit's label for train-on-synthetic, test-on-real: whether any of its rows of a
/// table holds a category (`admissions.outcome=died`), or the root's value does.
#[derive(Clone, Debug, PartialEq)]
pub struct Label {
    pub table: usize,
    pub column: usize,
    pub code: f64,
    pub text: String,
}

impl Label {
    /// Parses `TABLE.COLUMN=CATEGORY` against the layout.
    pub fn parse(layout: &Layout, text: &str) -> Result<Self, EvalError> {
        let bad = |reason: String| EvalError::Label { label: text.to_string(), reason };
        let (column, category) =
            text.split_once('=').ok_or_else(|| bad("expected TABLE.COLUMN=CATEGORY".to_string()))?;
        let (table, column) =
            column.split_once('.').ok_or_else(|| bad("expected TABLE.COLUMN=CATEGORY".to_string()))?;
        let t = layout
            .tables
            .iter()
            .position(|t| t.name.eq_ignore_ascii_case(table))
            .ok_or_else(|| bad(format!("no table '{table}'")))?;
        let c = layout.tables[t].domain.index_of(column).filter(|&c| c < layout.tables[t].values());
        let c = c.ok_or_else(|| bad(format!("table '{}' has no column '{column}'", layout.tables[t].name)))?;
        let Encoding::Categorical { categories, .. } = &layout.tables[t].domain.columns[c].encoding else {
            return Err(bad(format!("'{column}' is not categorical")));
        };
        let code = categories
            .iter()
            .position(|k| k == category)
            .ok_or_else(|| bad(format!("'{category}' is not one of {categories:?}")))?;
        Ok(Self {
            table: t,
            column: c,
            code: code as f64,
            text: format!("{}.{column} = {category}", layout.tables[t].name),
        })
    }
}

/// One database read whole: its units (each table's rows in the order of their places)
/// and what reading left out of each table.
pub struct LoadedDatabase {
    pub units: Vec<UnitRows>,
    pub dropped: Vec<DroppedRows>,
}

/// Reads the database in `files` (by table, in the layout's order) with the spec's tables,
/// joined and capped as a job reads them, through one partition in a private temporary
/// folder.
pub async fn load(spec: &JobSpec, files: &TableFiles) -> Result<LoadedDatabase, EvalError> {
    let root_input = spec.input.of_files(&files[0]);
    let tables: Vec<TableSpec> = spec
        .tables
        .iter()
        .zip(&files[1..])
        .map(|(table, urls)| TableSpec { input: table.input.of_files(urls), ..table.clone() })
        .collect();
    let db = Database { root_input: &root_input, tables: &tables, ..Database::of_spec(spec) };
    // Owner-only (0700): the rows read are private.
    let dir = tempfile::tempdir().map_err(|e| EvalError::Io(format!("a temporary folder: {e}")))?;
    let scratch = storage::open(&dir.path().to_string_lossy())?;
    let key = PartitionKey::generate()?;
    let partitioned = partition_database(&db, &scratch, "eval", 1, key).await?;
    let urls: Vec<String> = partitioned.iter().map(|t| t.partitions.urls[0].clone()).collect();
    let (units, mut dropped) = read_units(&Layout::of(&db), &urls).await?;
    for (d, table) in dropped.iter_mut().zip(&partitioned) {
        d.bad = table.bad;
    }
    Ok(LoadedDatabase { units: units.into_values().collect(), dropped })
}

/// The three databases an evaluation compares.
pub struct Databases {
    pub train: LoadedDatabase,
    pub test: LoadedDatabase,
    pub synthetic: LoadedDatabase,
}

/// Evaluates `synthetic` against `train` and held-out `test` under `limits`; with a
/// label, per unit train-on-synthetic / test-on-real. Each stage is logged as it starts and
/// ends.
pub fn evaluate<'d>(
    layout: &Layout,
    databases: &'d Databases,
    label: Option<&Label>,
    guarantee: Option<serde_json::Value>,
    limits: &EvalLimits,
) -> Result<DatabaseReport, EvalError> {
    let mut sampling = Sampling::new(limits.seed);
    let mut timings = Vec::new();
    let mut pick = |name: &str, db: &'d LoadedDatabase| -> Vec<&'d UnitRows> {
        let rows = sampling.sample("database: units", name, db.units.len(), limits.database_units);
        rows.into_iter().map(|r| &db.units[r]).collect()
    };
    let (train, test, synthetic) =
        (pick("train", &databases.train), pick("test", &databases.test), pick("synthetic", &databases.synthetic));
    let synthetic_units = synthetic.clone();
    let units = RowCounts { train: train.len(), test: test.len(), synthetic: synthetic.len() };
    let mut tables = Vec::with_capacity(layout.tables.len());
    for t in 0..layout.tables.len() {
        let started = Instant::now();
        tracing::info!("evaluation: table '{}' started", layout.tables[t].name);
        // The synthetic database's integrity over all its rows, sampled or not.
        let kept = databases.synthetic.units.iter().map(|u| u.tables[t].len() as u64).sum();
        let integrity = Integrity::of(kept, &databases.synthetic.dropped[t]);
        let units = [train.as_slice(), test.as_slice(), synthetic.as_slice()];
        let table = evaluate_table(layout, t, units, integrity, limits, &mut sampling)?;
        tables.push(table);
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!("evaluation: table '{}' done ({seconds:.1} s)", layout.tables[t].name);
        timings.push(StageTiming { stage: format!("table {}", layout.tables[t].name), seconds });
    }
    // One row of features per unit, read once: the privacy diagnostics' records (the label
    // left out) and the utility's rows.
    let read = [train.as_slice(), test.as_slice(), synthetic.as_slice()];
    let (domain, features) = unit_features(layout, label, read)?;
    let started = Instant::now();
    tracing::info!("evaluation: empirical privacy started");
    let features_only = usize::from(label.is_some());
    let records = Domain { columns: domain.columns[..domain.columns.len() - features_only].to_vec() };
    let [train_records, test_records, synthetic_records] = features
        .each_ref()
        .map(|table| Table { units: table.units.clone(), columns: table.columns[..records.columns.len()].to_vec() });
    let privacy = privacy::evaluate(&records, &train_records, &test_records, &synthetic_records, limits, &mut sampling);
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!("evaluation: empirical privacy done ({seconds:.1} s)");
    timings.push(StageTiming { stage: "empirical privacy".into(), seconds });
    let utility = label.and_then(|_| {
        let started = Instant::now();
        tracing::info!("evaluation: utility started");
        let [train, test, synthetic] = &features;
        // The baseline: the same synthetic tables with each child row under a parent row
        // drawn at random (a seeded permutation: the evaluation's, not private noise).
        let rejoined = rejoined(layout, &synthetic_units, limits.seed);
        let rejoined: Vec<&UnitRows> = rejoined.iter().collect();
        let rejoined = match unit_features(layout, label, [&[], &[], &rejoined]) {
            Ok((_, [.., rejoined])) => Some(rejoined),
            Err(e) => {
                tracing::warn!("evaluation: the re-joined baseline left out: {e}");
                None
            }
        };
        let mut trained = vec![("synthetic", "synthetic", synthetic), ("real (train)", "train", train)];
        trained.extend(rejoined.as_ref().map(|table| (REJOINED, "synthetic re-joined", table)));
        let target = (domain.columns.len() - 1, "yes");
        let utility = utility::evaluate(&domain, target, test, &trained, limits, &mut sampling);
        let seconds = started.elapsed().as_secs_f64();
        tracing::info!("evaluation: utility done ({seconds:.1} s)");
        timings.push(StageTiming { stage: "utility".into(), seconds });
        utility
    });
    Ok(DatabaseReport {
        notice: NOTICE.to_string(),
        differentially_private: false,
        guarantee,
        units,
        tables,
        utility,
        privacy,
        limits: *limits,
        sampling: sampling.uses,
        timings,
    })
}

/// One table's measures over the units of train, test (held-out) and synthetic.
fn evaluate_table(
    layout: &Layout,
    t: usize,
    [train, test, synthetic]: [&[&UnitRows]; 3],
    integrity: Integrity,
    limits: &EvalLimits,
    sampling: &mut Sampling,
) -> Result<TableEvaluation, EvalError> {
    let table = &layout.tables[t];
    let rows = |units: &[&UnitRows]| units.iter().map(|u| u.tables[t].len()).sum::<usize>();
    // Own columns as written, synthetic against the training rows.
    let own = Domain { columns: table.domain.columns[..table.values()].to_vec() };
    let own_table = |units: &[&UnitRows]| {
        let rows: Vec<&Vec<Option<f64>>> = units.iter().flat_map(|u| &u.tables[t]).collect();
        Table {
            units: vec![String::new(); rows.len()],
            columns: (0..table.values()).map(|c| rows.iter().map(|r| r[c]).collect()).collect(),
        }
    };
    let fidelity = fidelity::evaluate(&own, &own_table(train), &own_table(synthetic), limits, sampling);

    let view = View { table: t };
    let domain = view.domain(layout);
    let view_rows = |units: &[&UnitRows]| -> Result<Vec<Vec<Option<f64>>>, DataError> {
        let mut out = Vec::new();
        for unit in units {
            out.extend(view.rows(layout, unit)?);
        }
        Ok(out)
    };
    let [train_rows, test_rows, synthetic_rows] = [view_rows(train)?, view_rows(test)?, view_rows(synthetic)?];
    let compare = |what: String, measure: &dyn Fn(&ViewRows) -> Vec<f64>| {
        let held_out = measure(&test_rows);
        Distance {
            what,
            synthetic: tvd(&held_out, &measure(&synthetic_rows)),
            train: tvd(&held_out, &measure(&train_rows)),
        }
    };
    let column = |d: usize| (d, &domain.columns[d]);
    let own_columns = 0..table.values();
    let ancestors = view.ancestor_columns(layout);
    let counts: Vec<usize> =
        (0..domain.columns.len()).filter(|&d| domain.columns[d].name.starts_with(COUNT_PREFIX)).collect();

    let children = counts
        .iter()
        .map(|&d| {
            // A count is never missing: its distribution over the count bins alone.
            let bins = domain.columns[d].value_bins();
            let measure = |rows: &ViewRows| joint(rows, None, column(d))[..bins].to_vec();
            ChildCounts {
                child: domain.columns[d].name[COUNT_PREFIX.len()..].to_string(),
                labels: (0..bins).map(|b| domain.columns[d].bin_label(b)).collect(),
                held_out: measure(&test_rows),
                synthetic: measure(&synthetic_rows),
                tvd: compare(
                    format!("{} per {} row", &domain.columns[d].name[COUNT_PREFIX.len()..], table.name),
                    &measure,
                ),
            }
        })
        .collect();

    // Attribute × children (own or ancestor attribute × a child count), ancestor × own value.
    let mut pairs: Vec<(usize, usize)> = Vec::new();
    pairs.extend(own_columns.clone().chain(ancestors.clone()).flat_map(|a| counts.iter().map(move |&n| (a, n))));
    pairs.extend(ancestors.clone().flat_map(|a| own_columns.clone().map(move |o| (a, o))));
    let kept_pairs = sampling.sample("cross-table pairs", &table.name, pairs.len(), limits.fidelity_pairs);
    let cross = kept_pairs
        .into_iter()
        .map(|p| {
            let (a, b) = pairs[p];
            let what = format!("{} × {}", domain.columns[a].name, domain.columns[b].name);
            compare(what, &|rows: &ViewRows| joint(rows, Some(column(a)), column(b)))
        })
        .collect();

    // Ancestor attribute bins × the mean of an own numeric value (not a time, not a place).
    let numeric: Vec<usize> = own_columns
        .clone()
        .filter(|&c| {
            let plain = matches!(table.domain.columns[c].encoding, Encoding::Numeric { kind, .. } if kind != ColumnKind::Datetime);
            plain && layout.within(t, c).is_none()
        })
        .collect();
    let means = ancestors
        .clone()
        .flat_map(|a| numeric.iter().map(move |&c| (a, c)))
        .map(|(a, c)| {
            let held_out = group_means(&test_rows, column(a), c);
            let error = |rows: &ViewRows| mean_error(&held_out, &group_means(rows, column(a), c));
            Distance {
                what: format!("{} × mean {}", domain.columns[a].name, domain.columns[c].name),
                synthetic: error(&synthetic_rows),
                train: error(&train_rows),
            }
        })
        .collect();

    // A sequence's dynamics: each own value against the previous sibling's.
    let (mut lag1, mut transitions) = (Vec::new(), Vec::new());
    if table.order_by.is_some() {
        let previous = view.previous_columns(layout);
        for c in own_columns.clone().filter(|&c| Some(c) != table.order_by) {
            let before = previous.start + c;
            if numeric.contains(&c) {
                let r = |rows: &ViewRows| correlation(rows, before, c);
                lag1.push(Lag1 {
                    column: domain.columns[c].name.clone(),
                    held_out: r(&test_rows),
                    train: r(&train_rows),
                    synthetic: r(&synthetic_rows),
                });
            } else if matches!(domain.columns[c].encoding, Encoding::Categorical { .. }) {
                let what = format!("{} → {}", domain.columns[before].name, domain.columns[c].name);
                // A first row's previous value is missing: the first state is a transition too.
                transitions.push(compare(what, &|rows: &ViewRows| joint(rows, Some(column(before)), column(c))));
            }
        }
    }

    let within = (own_columns.clone())
        .filter(|&c| layout.within(t, c).is_some())
        .map(|c| {
            Ok(Inside {
                column: table.domain.columns[c].name.clone(),
                held_out: inside(layout, t, c, test)?,
                synthetic: inside(layout, t, c, synthetic)?,
            })
        })
        .collect::<Result<_, DataError>>()?;

    // Attributes (own and ancestors') × the children's summaries (counts and means).
    let summaries: Vec<usize> =
        (view.child_columns(layout).iter().map(|c| c.count)).chain(view.mean_columns(layout)).collect();
    let links = (own_columns.clone().chain(ancestors.clone()))
        .flat_map(|a| summaries.iter().map(move |&s| (a, s)))
        .map(|(a, s)| {
            let r = |rows: &ViewRows| link(rows, column(a), s);
            Link {
                attribute: domain.columns[a].name.clone(),
                summary: domain.columns[s].name.clone(),
                held_out: r(&test_rows),
                train: r(&train_rows),
                synthetic: r(&synthetic_rows),
            }
        })
        .collect();

    Ok(TableEvaluation {
        name: table.name.clone(),
        parent: table.parent.map(|p| layout.tables[p].name.clone()),
        rows: RowCounts { train: rows(train), test: rows(test), synthetic: rows(synthetic) },
        integrity,
        fidelity,
        children,
        cross,
        means,
        lag1,
        transitions,
        within,
        links,
    })
}

/// The bins a measure counts a view value in: its column's bins and one for missing.
fn slots(column: &ColumnDomain) -> usize {
    column.value_bins() + 1
}

fn slot(column: &ColumnDomain, value: Option<f64>) -> usize {
    value.map_or(column.value_bins(), |v| column.bin(Some(v)))
}

/// The joint distribution of two view columns (of one, with `a` absent) over `rows`,
/// normalised; all zeros without rows.
fn joint(rows: &ViewRows, a: Option<(usize, &ColumnDomain)>, b: (usize, &ColumnDomain)) -> Vec<f64> {
    let width = slots(b.1);
    let mut p = vec![0.0; a.map_or(1, |a| slots(a.1)) * width];
    for row in rows {
        let i = a.map_or(0, |(d, c)| slot(c, row[d]));
        p[i * width + slot(b.1, row[b.0])] += 1.0;
    }
    fidelity::normalise(p)
}

/// Total variation distance; NaN when either distribution is empty.
fn tvd(p: &[f64], q: &[f64]) -> f64 {
    let empty = |d: &[f64]| d.iter().all(|x| *x == 0.0);
    if empty(p) || empty(q) {
        return f64::NAN;
    }
    // Not 1 − Σ min(p, q): that rounds identical distributions to −2·10⁻¹⁶.
    0.5 * p.iter().zip(q).map(|(a, b)| (a - b).abs()).sum::<f64>()
}

/// Per bin of view column `by`: the rows with view value `value` present, and its mean.
fn group_means(rows: &ViewRows, by: (usize, &ColumnDomain), value: usize) -> Vec<(f64, f64)> {
    let mut sums = vec![(0.0, 0.0); slots(by.1)];
    for row in rows {
        if let Some(v) = row[value] {
            let s = &mut sums[slot(by.1, row[by.0])];
            *s = (s.0 + 1.0, s.1 + v);
        }
    }
    sums.into_iter().map(|(n, sum)| (n, if n > 0.0 { sum / n } else { f64::NAN })).collect()
}

/// Mean absolute difference of the group means, weighted by the held-out groups' rows,
/// over the groups both have; NaN when they share none.
fn mean_error(held_out: &[(f64, f64)], other: &[(f64, f64)]) -> f64 {
    let shared: Vec<(f64, f64)> = held_out
        .iter()
        .zip(other)
        .filter(|((n, _), (m, _))| *n > 0.0 && *m > 0.0)
        .map(|((n, a), (_, b))| (*n, (a - b).abs()))
        .collect();
    let weight: f64 = shared.iter().map(|(n, _)| n).sum();
    if weight == 0.0 { f64::NAN } else { shared.iter().map(|(n, e)| n * e).sum::<f64>() / weight }
}

/// Pearson correlation of view columns `x` and `y` over the rows with both; NaN below two
/// rows or without variance.
fn correlation(rows: &ViewRows, x: usize, y: usize) -> f64 {
    let pairs: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r[x]?, r[y]?))).collect();
    pearson(&pairs).unwrap_or(f64::NAN)
}

/// An attribute (view column `a`) against a numeric summary (view column `s`) over the
/// rows with both: Pearson's correlation with a numeric attribute, the correlation ratio
/// with a categorical one; NaN below two rows or without variance.
fn link(rows: &ViewRows, (a, attribute): (usize, &ColumnDomain), s: usize) -> f64 {
    let pairs: Vec<(f64, f64)> = rows.iter().filter_map(|r| Some((r[a]?, r[s]?))).collect();
    match &attribute.encoding {
        Encoding::Numeric { .. } => pearson(&pairs).unwrap_or(f64::NAN),
        Encoding::Categorical { .. } if pairs.len() < 2 => f64::NAN,
        Encoding::Categorical { .. } => fidelity::correlation_ratio(&pairs, attribute.value_bins()),
    }
}

/// The synthetic `units` with every child row under a parent row of its parent table
/// drawn at random: each table's parents permuted among its rows (seeded by `seed`), so
/// every table keeps its rows and every parent its number of children, and nothing ties
/// a row to its children but chance. Tables in layout order: a row moves with its new
/// place, and its children are permuted among the moved rows.
fn rejoined(layout: &Layout, units: &[&UnitRows], seed: u64) -> Vec<UnitRows> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;

    // A baseline's permutation of synthetic rows, repeatable by the evaluation's seed.
    // public randomness: no noise, and no private row is drawn
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(seed);
    let mut out: Vec<UnitRows> =
        units.iter().map(|_| UnitRows { tables: vec![Vec::new(); layout.tables.len()] }).collect();
    // Per table, each row's place (unit, index) before and after.
    let mut moved: Vec<std::collections::HashMap<(usize, usize), (usize, usize)>> =
        vec![Default::default(); layout.tables.len()];
    for (u, unit) in units.iter().enumerate() {
        out[u].tables[0] = unit.tables[0].clone();
        moved[0].extend((0..unit.tables[0].len()).map(|i| ((u, i), (u, i))));
    }
    for t in 1..layout.tables.len() {
        let (p, own) = (layout.tables[t].parent.expect("a child table"), layout.tables[t].values());
        let mut rows = Vec::new();
        let mut parents = Vec::new();
        for (u, unit) in units.iter().enumerate() {
            for (i, row) in unit.tables[t].iter().enumerate() {
                let Some(&parent) = row[own + 1].and_then(|k| moved[p].get(&(u, k as usize))) else { continue };
                rows.push(((u, i), row[..own].to_vec()));
                parents.push(parent);
            }
        }
        parents.shuffle(&mut rng);
        // Under each parent in the order read, each with its places in its new unit.
        let mut placed: Vec<(usize, (usize, usize))> = parents.into_iter().enumerate().collect();
        placed.sort_by_key(|&(order, parent)| (parent, order));
        let mut rows: Vec<Option<_>> = rows.into_iter().map(Some).collect();
        for (order, (u, parent)) in placed {
            let (old, mut values) = rows[order].take().expect("each row placed once");
            let index = out[u].tables[t].len();
            values.extend([Some(index as f64), Some(parent as f64)]);
            out[u].tables[t].push(values);
            moved[t].insert(old, (u, index));
        }
    }
    out
}

/// The share of rows of table `t` whose value `c` lies inside its interval, over the rows
/// with the value and its ends; NaN without such rows.
fn inside(layout: &Layout, t: usize, c: usize, units: &[&UnitRows]) -> Result<f64, DataError> {
    let within = layout.within(t, c).expect("a column with an interval");
    let (mut known, mut inside) = (0u64, 0u64);
    for unit in units {
        for row in &unit.tables[t] {
            let chain = layout.chain(unit, t, row)?;
            let value = |at: ColumnAt| chain[at.table].and_then(|r| r[at.column]);
            let (Some(x), start, end) = (row[c], within.start.map(value), within.end.map(value)) else { continue };
            if start == Some(None) || end == Some(None) {
                continue;
            }
            known += 1;
            inside += u64::from(start.flatten().is_none_or(|s| s <= x) && end.flatten().is_none_or(|e| x <= e));
        }
    }
    Ok(if known == 0 { f64::NAN } else { inside as f64 / known as f64 })
}

/// Per unit, one row of features and, with a label, the label (the last column,
/// "yes"/"no"): the root's own values; per table below it, its rows' count and the mean of
/// each own value as views hold it (a place in an interval: a stay's length, not its
/// date), a category's share for a categorical one; the label's own column is left out.
/// The domain is public: made from the layout alone.
fn unit_features(
    layout: &Layout,
    label: Option<&Label>,
    databases: [&[&UnitRows]; 3],
) -> Result<(Domain, [Table; 3]), DataError> {
    let number = |name: String, min: f64, max: f64| ColumnDomain {
        name,
        encoding: Encoding::Numeric { kind: ColumnKind::Continuous, min, max, binning: Binning::Real(vec![min, max]) },
        missing: true,
    };
    let labelled = |t: usize, c: usize| label.is_some_and(|l| (t, c) == (l.table, l.column));
    // The features each table contributes, and how to make them from its view values.
    let mut columns: Vec<ColumnDomain> = Vec::new();
    for (t, table) in layout.tables.iter().enumerate() {
        if t > 0 {
            columns.push(number(format!("{COUNT_PREFIX}{}", table.name), 0.0, layout.reach(t) as f64));
        }
        for c in (0..table.values()).filter(|&c| !labelled(t, c)) {
            let viewed = layout.view_column(t, c);
            let name = format!("{}.{}", table.name, viewed.name);
            match (&viewed.encoding, t) {
                (_, 0) => columns.push(ColumnDomain { name, ..viewed }),
                (Encoding::Numeric { min, max, .. }, _) => columns.push(number(name, *min, *max)),
                (Encoding::Categorical { categories, other }, _) => {
                    let kinds = categories.iter().cloned().chain(other.then(|| "__other__".to_string()));
                    columns.extend(kinds.map(|k| number(format!("{name} = {k}"), 0.0, 1.0)));
                }
            }
        }
    }
    if let Some(label) = label {
        let yes_no = vec!["no".to_string(), "yes".to_string()];
        columns.push(ColumnDomain {
            name: label.text.clone(),
            encoding: Encoding::Categorical { categories: yes_no, other: false },
            missing: false,
        });
    }
    let domain = Domain { columns };

    let features = |units: &[&UnitRows]| -> Result<Table, DataError> {
        let mut out = Table { units: Vec::with_capacity(units.len()), columns: vec![Vec::new(); domain.columns.len()] };
        for unit in units {
            let mut row: Vec<Option<f64>> = Vec::with_capacity(domain.columns.len());
            let mut positive = false;
            for (t, table) in layout.tables.iter().enumerate() {
                let viewed = View { table: t }.rows(layout, unit)?;
                if t > 0 {
                    row.push(Some(viewed.len() as f64));
                }
                positive |=
                    label.is_some_and(|l| t == l.table && unit.tables[t].iter().any(|r| r[l.column] == Some(l.code)));
                for c in (0..table.values()).filter(|&c| !labelled(t, c)) {
                    let values = || viewed.iter().filter_map(|r| r[c]);
                    let present = values().count();
                    match (&layout.tables[t].domain.columns[c].encoding, t) {
                        (_, 0) => row.push(viewed[0][c]),
                        (Encoding::Numeric { .. }, _) => {
                            row.push((present > 0).then(|| values().sum::<f64>() / present as f64));
                        }
                        (Encoding::Categorical { categories, other }, _) => {
                            let kinds = categories.len() + usize::from(*other);
                            row.extend((0..kinds).map(|k| {
                                (present > 0)
                                    .then(|| values().filter(|v| *v == k as f64).count() as f64 / present as f64)
                            }));
                        }
                    }
                }
            }
            if label.is_some() {
                row.push(Some(f64::from(u8::from(positive))));
            }
            out.units.push(String::new());
            out.columns.iter_mut().zip(row).for_each(|(column, value)| column.push(value));
        }
        Ok(out)
    };
    let [train, test, synthetic] = databases;
    Ok((domain.clone(), [features(train)?, features(test)?, features(synthetic)?]))
}

/// The table a `TABLE=URL` argument names, and its URL (`None`: not such an argument, a
/// URL that holds a `=` included).
fn table_entry<'e>(layout: &Layout, entry: &'e str) -> Option<(usize, &'e str)> {
    let (name, url) = entry.split_once('=')?;
    Some((layout.tables.iter().position(|t| t.name.eq_ignore_ascii_case(name.trim()))?, url))
}

/// The files of each table from `TABLE=URL` arguments (a table named more than once has
/// several files), in the layout's order; every table must have some.
pub fn files_by_table(layout: &Layout, argument: &'static str, entries: &[String]) -> Result<TableFiles, EvalError> {
    let refuse = |reason: String| EvalError::DatabaseFiles { argument, reason };
    let mut files: TableFiles = vec![Vec::new(); layout.tables.len()];
    for entry in entries {
        let (t, url) = table_entry(layout, entry)
            .ok_or_else(|| refuse(format!("'{entry}' is not TABLE=URL with a table of the spec")))?;
        files[t].push(url.to_string());
    }
    if let Some(missing) = files.iter().position(Vec::is_empty) {
        return Err(refuse(format!("no files for table '{}'", layout.tables[missing].name)));
    }
    Ok(files)
}

/// The spec's own inputs, by table: the training database by default.
pub fn spec_files(spec: &JobSpec) -> TableFiles {
    std::iter::once(spec.input.urls.clone()).chain(spec.tables.iter().map(|t| t.input.urls.clone())).collect()
}

/// A database release's files by table (in the layout's order, its parts checked against
/// the manifest), and its guarantee.
pub async fn release_files(layout: &Layout, url: &str) -> Result<(TableFiles, serde_json::Value), EvalError> {
    let (manifest, tables) = crate::data::table::read_database_release(url).await?;
    let refuse = |reason: String| EvalError::DatabaseFiles { argument: "synthetic", reason };
    let names: Vec<String> = tables.iter().map(|(name, _)| name.clone()).collect();
    let declared: Vec<&str> = layout.tables.iter().map(|t| t.name.as_str()).collect();
    let mut files: TableFiles = vec![Vec::new(); layout.tables.len()];
    for (name, parts) in tables {
        let t = declared.iter().position(|d| *d == name);
        let t = t.ok_or_else(|| refuse(format!("the release holds a table '{name}' the spec does not declare")))?;
        files[t] = parts;
    }
    // Every declared table once: a release lists each, with no parts when no row was drawn.
    if names.len() != declared.len() || declared.iter().any(|d| !names.iter().any(|n| n == d)) {
        return Err(refuse(format!("the release lists tables {names:?}, the spec declares {declared:?}")));
    }
    let guarantee = serde_json::to_value(&manifest.privacy).map_err(|e| EvalError::Io(e.to_string()))?;
    Ok((files, guarantee))
}

/// Reads the three databases, evaluates under `limits`, and writes `report.json` and
/// `report.html` to `out` (refused in or under a release, before anything is read).
/// `synthetic` is a database release's prefix, or `TABLE=URL` entries.
pub async fn run(
    spec: &JobSpec,
    train: &TableFiles,
    test: &TableFiles,
    synthetic: &[String],
    label: Option<&str>,
    out: &str,
    limits: &EvalLimits,
) -> Result<DatabaseReport, EvalError> {
    // Children counted, never as rates (an evaluation compares how many rows a row has),
    // and their means held whatever the generator's view held: measures of the tables.
    let layout = Layout { rates: false, means: true, ..Layout::of(&Database::of_spec(spec)) };
    let label = label.map(|text| Label::parse(&layout, text)).transpose()?;
    for entry in synthetic {
        let url = table_entry(&layout, entry).map_or(entry.as_str(), |(_, url)| url);
        super::check_report_location(out, url).await?;
    }
    let (synthetic, guarantee) = match synthetic {
        [release] if table_entry(&layout, release).is_none() => {
            let (files, guarantee) = release_files(&layout, release).await?;
            (files, Some(guarantee))
        }
        entries => (files_by_table(&layout, "synthetic", entries)?, None),
    };
    let started = Instant::now();
    tracing::info!("evaluation: loading the databases");
    let databases = Databases {
        train: load(spec, train).await?,
        test: load(spec, test).await?,
        synthetic: load(spec, &synthetic).await?,
    };
    // No row counts in the log: the databases' sizes are private figures too.
    tracing::info!("evaluation: databases loaded ({:.1} s)", started.elapsed().as_secs_f64());
    let span = tracing::Span::current();
    let limits = *limits;
    let report = tokio::task::spawn_blocking(move || {
        let _entered = span.enter();
        evaluate(&layout, &databases, label.as_ref(), guarantee, &limits)
    })
    .await
    .map_err(|e| EvalError::Io(format!("evaluation worker: {e}")))??;
    let json = serde_json::to_vec_pretty(&report).map_err(|e| EvalError::Io(e.to_string()))?;
    super::write_report(out, json, super::report::database_html(&report)).await?;
    tracing::info!("evaluation: report written to {out} (not differentially private: do not publish)");
    Ok(report)
}
