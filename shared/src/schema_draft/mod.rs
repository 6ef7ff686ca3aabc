//! `rhosynth schema draft`: a job spec drafted from a CSV file, for a data owner who has no
//! public metadata yet. Every domain in a spec must be public (a category list or a bound
//! read off the private rows leaks them), so a draft is either released with DP — values by
//! partition selection, bounds and bins from noisy histograms, charged to the dataset's
//! ledger — or written from the data as it is, each domain marked private, to be replaced
//! with public metadata before any release.
//!
//! What is measured is one [`Measure`]: exact here, noisy on the coordinator (the only
//! place noise is drawn). The rules that turn measurements into a draft are the same.

pub mod grid;
pub mod profile;

use std::fmt::Write;

use crate::generators::GeneratorName;

use grid::{GRID_CELLS, Grid};
use profile::{ColumnProfile, Profile, Shape};

/// Public rules of a draft.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftOptions {
    /// Bins (quantiles) per numeric column.
    pub bins: u32,
    /// Most categories kept per column; the rest go to `__other__`.
    pub max_categories: usize,
    /// A released category below this share of its column's released count goes to
    /// `__other__` (domain compression).
    pub min_share: f64,
    /// A column is categorical when more than this share of its present cells is text.
    pub text_share: f64,
}

impl Default for DraftOptions {
    fn default() -> Self {
        Self { bins: 10, max_categories: 100, min_share: 0.001, text_share: 0.05 }
    }
}

/// How the draft reads a column's statistics: each method returns what may be shown.
pub trait Measure {
    type Error;
    /// Rows by [`Shape`].
    fn shapes(&mut self, column: &ColumnProfile) -> Result<[f64; 4], Self::Error>;
    /// Values and their unit counts; a value left out was not released.
    fn categories(&mut self, column: &ColumnProfile) -> Result<Vec<(String, f64)>, Self::Error>;
    /// The numbers' range, `None` when none can be given.
    fn bounds(&mut self, column: &ColumnProfile) -> Result<Option<(f64, f64)>, Self::Error>;
    /// Counts of the numbers (clamped to the grid's range) in the grid's cells.
    fn grid(&mut self, column: &ColumnProfile, grid: &Grid) -> Result<Vec<f64>, Self::Error>;
    /// A count that noise alone gives some cell of [`Self::grid`] only rarely (public: from
    /// the noise's scale), so that no bin is made of noise.
    fn grid_noise_floor(&self) -> f64;
    /// Whether [`Self::categories`] lists every value (else a value may exist unlisted,
    /// and the draft sends unlisted values to `__other__`).
    fn lists_every_value(&self) -> bool;
}

/// The statistics as they are: for the data owner's eyes only.
pub struct Exact;

impl Measure for Exact {
    type Error = std::convert::Infallible;

    fn shapes(&mut self, column: &ColumnProfile) -> Result<[f64; 4], Self::Error> {
        Ok(column.shapes)
    }

    fn categories(&mut self, column: &ColumnProfile) -> Result<Vec<(String, f64)>, Self::Error> {
        Ok(column.values.iter().map(|(v, c)| (v.clone(), *c)).collect())
    }

    fn bounds(&mut self, column: &ColumnProfile) -> Result<Option<(f64, f64)>, Self::Error> {
        let lo = column.numbers.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = column.numbers.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Ok(lo.is_finite().then_some((lo, hi)))
    }

    fn grid(&mut self, column: &ColumnProfile, grid: &Grid) -> Result<Vec<f64>, Self::Error> {
        let mut counts = vec![0.0; GRID_CELLS];
        column.numbers.iter().for_each(|&x| counts[grid.cell(x)] += 1.0);
        Ok(counts)
    }

    fn grid_noise_floor(&self) -> f64 {
        0.0
    }

    fn lists_every_value(&self) -> bool {
        true
    }
}

/// One drafted column.
#[derive(Clone, Debug, PartialEq)]
pub enum DraftColumn {
    Categorical {
        name: String,
        categories: Vec<String>,
        other: bool,
    },
    Numeric {
        name: String,
        integer: bool,
        min: f64,
        max: f64,
        bins: Option<Vec<f64>>,
    },
    /// No value is common enough to release: free text or an identifier.
    Identifier {
        name: String,
    },
}

/// A drafted schema: the unit column (an identifier) and the columns in file order.
#[derive(Clone, Debug, PartialEq)]
pub struct Draft {
    pub unit_column: Option<String>,
    pub columns: Vec<DraftColumn>,
}

/// Drafts every column from what `measure` shows of it.
pub fn draft<M: Measure>(
    profile: &Profile,
    unit_column: Option<&str>,
    measure: &mut M,
    options: &DraftOptions,
) -> Result<Draft, M::Error> {
    let columns = profile.columns.iter().map(|c| draft_column(c, measure, options)).collect::<Result<_, _>>()?;
    Ok(Draft { unit_column: unit_column.map(str::to_string), columns })
}

fn draft_column<M: Measure>(
    column: &ColumnProfile,
    measure: &mut M,
    options: &DraftOptions,
) -> Result<DraftColumn, M::Error> {
    let name = column.name.clone();
    let shapes = measure.shapes(column)?.map(|c| c.max(0.0));
    let present = shapes[Shape::Integer as usize] + shapes[Shape::Decimal as usize] + shapes[Shape::Text as usize];
    let numeric = present > 0.0 && shapes[Shape::Text as usize] <= options.text_share * present;
    if numeric && let Some((lo, hi)) = measure.bounds(column)? {
        let integer = shapes[Shape::Decimal as usize] <= options.text_share * present;
        let (lo, hi) = widen(lo, hi, integer);
        // An integer column with fewer values than bins keeps one bin per value.
        let bins = if integer && hi - lo < f64::from(options.bins) {
            None
        } else {
            let grid = Grid::new(lo, hi, integer);
            let counts = measure.grid(column, &grid)?;
            Some(grid.bin_edges(&counts, options.bins, measure.grid_noise_floor())).filter(|b| b.len() > 2)
        };
        return Ok(DraftColumn::Numeric { name, integer, min: lo, max: hi, bins });
    }
    let mut released = measure.categories(column)?;
    if released.is_empty() {
        return Ok(DraftColumn::Identifier { name });
    }
    released.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let total: f64 = released.iter().map(|(_, c)| c.max(0.0)).sum();
    let all = released.len();
    // Sorted by count, the values at or above the share are a prefix; the most common
    // value always stays (a column lists at least one).
    let common = released.iter().filter(|(_, c)| *c >= options.min_share * total).count();
    released.truncate(common.clamp(1, options.max_categories.max(1)));
    let other = released.len() < all || !measure.lists_every_value();
    let mut categories: Vec<String> = released.into_iter().map(|(v, _)| v).collect();
    categories.sort();
    Ok(DraftColumn::Categorical { name, categories, other })
}

/// Bounds as a domain takes them: whole numbers for an integer column, and hi > lo.
fn widen(lo: f64, hi: f64, integer: bool) -> (f64, f64) {
    let (lo, hi) = if integer { (lo.floor(), hi.ceil()) } else { (lo, hi) };
    (lo, if hi > lo { hi } else { lo + 1.0 })
}

/// The line that keeps a draft of private domains from parsing as a spec (an unknown
/// field), so that using it takes a deliberate edit.
pub const PRIVATE_MARKER: &str = "private_domains";

/// What the draft's header says of where its domains come from.
pub enum Provenance {
    /// Read from the data as it is: private.
    Exact,
    /// Released with DP under a ledger charge.
    Released { epsilon: f64, delta: f64, dataset_id: String, charge_seq: u64 },
}

/// The draft as a job spec (TOML) that parses, to be completed by hand.
pub fn render(draft: &Draft, input_url: &str, dataset_id: &str, provenance: &Provenance, job: &DraftJob) -> String {
    let quote = |s: &str| toml::Value::String(s.to_string()).to_string();
    let private = matches!(provenance, Provenance::Exact);
    let mark =
        if private { "  # PRIVATE: read from the data; replace with public metadata before any release" } else { "" };
    let mut out = String::new();
    let _ = writeln!(out, "# Spec draft written by `rhosynth schema draft` from {input_url}.");
    match provenance {
        Provenance::Exact => {
            let _ = writeln!(
                out,
                "# Every domain below (categories, bounds, bins) was read from the data as it is: it is\n\
                 # PRIVATE. Replace each with public metadata (a codebook, a published range) before a\n\
                 # job releases anything, or draft again with --epsilon to release them with DP."
            );
        }
        Provenance::Released { epsilon, delta, dataset_id, charge_seq } => {
            let _ = writeln!(
                out,
                "# Domains released with (ε = {epsilon}, δ = {delta:e})-DP, charged to the ledger of '{dataset_id}'\n\
                 # (entry {charge_seq}): categories by partition selection (rarer values go to __other__),\n\
                 # bounds and bins from noisy histograms. Check them against what you know."
            );
        }
    }
    let _ = writeln!(out, "\n[job]\ndataset_id = {}\n\n[input]\nurls = [{}]\n", quote(dataset_id), quote(input_url));
    let _ = writeln!(out, "[schema]");
    if private {
        // Not a spec field: the draft does not parse until someone deletes this line.
        let _ = writeln!(
            out,
            "{PRIVATE_MARKER} = \"replace every domain marked PRIVATE with public metadata, then delete this line\""
        );
    }
    if let Some(unit) = &draft.unit_column {
        let _ = writeln!(out, "unit_column = {}", quote(unit));
        let _ = writeln!(out, "\n[[schema.columns]]\nname = {}\nkind = \"identifier\"", quote(unit));
    }
    let number = |x: f64, integer: bool| if integer { format!("{x:.0}") } else { format!("{x}") };
    for column in &draft.columns {
        let _ = writeln!(out);
        match column {
            DraftColumn::Categorical { name, categories, other } => {
                let list: Vec<String> = categories.iter().map(|c| quote(c)).collect();
                let _ = writeln!(out, "[[schema.columns]]\nname = {}\nkind = \"categorical\"{mark}", quote(name));
                let _ = writeln!(out, "categories = [{}]{mark}", list.join(", "));
                if *other {
                    let _ = writeln!(out, "unknown = \"other\"  # values not listed go to __other__");
                }
            }
            DraftColumn::Numeric { name, integer, min, max, bins } => {
                let kind = if *integer { "integer" } else { "continuous" };
                let _ = writeln!(out, "[[schema.columns]]\nname = {}\nkind = \"{kind}\"{mark}", quote(name));
                let _ = writeln!(out, "min = {}{mark}\nmax = {}{mark}", number(*min, *integer), number(*max, *integer));
                if let Some(edges) = bins {
                    let edges: Vec<String> = edges.iter().map(|e| number(*e, *integer)).collect();
                    let _ = writeln!(out, "bins = [{}]{mark}", edges.join(", "));
                }
            }
            DraftColumn::Identifier { name } => {
                let why = if private {
                    format!("'{name}' holds no value")
                } else {
                    format!("No value of '{name}' is shared by enough units to be released: free text or an id")
                };
                let _ = writeln!(out, "# {why}.\n[[schema.columns]]\nname = {}\nkind = \"identifier\"", quote(name));
            }
        }
    }
    let _ = writeln!(
        out,
        "\n[privacy]\nepsilon = {}  # the job's charge, when it runs\ndelta = 1e-6{}\n\n[generator]\nname = {}\n\n\
         # [output] url: where the release goes; default ./rhosynth-out/{{dataset_id}}/{{job_id}}.",
        job.epsilon,
        job.ledger.as_ref().map_or(String::new(), |l| format!("\nledger = {}  # the draft's own", quote(l))),
        quote(job.generator.as_str()),
    );
    out
}

/// The job a draft is ready to run: its generator, the ε it will be charged, and the
/// ledger store a released draft was charged to (the job's too).
#[derive(Clone, Debug, PartialEq)]
pub struct DraftJob {
    pub generator: GeneratorName,
    pub epsilon: f64,
    pub ledger: Option<String>,
}

impl Default for DraftJob {
    fn default() -> Self {
        Self { generator: GeneratorName::Aim, epsilon: 1.0, ledger: None }
    }
}

#[cfg(test)]
mod tests;
