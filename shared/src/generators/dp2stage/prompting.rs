//! The public reference set (`generators::reference`) as bins, and its nearest rows to a
//! row: HARMONIC's prompts, and the rows of DP-2Stage's stage 1 when a spec names a
//! reference. Sent to workers with the model.

use serde::{Deserialize, Serialize};

use crate::data::domain::{Domain, Encoding};
use crate::generators::reference::{ReferenceError, ReferenceTable};
use crate::output::Manifest;
use crate::spec::JobSpec;

/// Each example's k nearest rows of the reference set, as bins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prompting {
    /// The reference rows' bins, by column as the domain orders them.
    pub reference: Vec<Vec<u32>>,
    /// k.
    pub neighbours: usize,
    /// Where the reference set came from, what was read and the guarantee it carries (for
    /// the manifest).
    pub source: String,
}

impl Prompting {
    /// The first `rows` rows of the reference set at `url` as bins (`ReferenceTable`),
    /// with a release's manifest and the SHA-256 of its bytes.
    pub async fn load(
        spec: &JobSpec,
        domain: &Domain,
        url: &str,
        rows: usize,
        neighbours: usize,
    ) -> Result<(Self, Option<(Manifest, String)>), ReferenceError> {
        let ReferenceTable { table, read, manifest } = ReferenceTable::load(spec, domain, url, rows).await?;
        let reference: Vec<Vec<u32>> = (0..table.rows())
            .map(|r| domain.columns.iter().zip(&table.columns).map(|(c, values)| c.bin(values[r]) as u32).collect())
            .collect();
        let invalid = |message: String| ReferenceError::Invalid { url: url.to_string(), message };
        if reference.len() <= neighbours {
            return Err(invalid(format!("{} rows: need more than neighbours = {neighbours}", reference.len())));
        }
        for (c, column) in domain.columns.iter().enumerate() {
            if reference.iter().any(|row| row[c] as usize >= column.bins()) {
                return Err(invalid(format!("column {} has missing values the schema has no bin for", column.name)));
            }
        }
        Ok((Self { reference, neighbours, source: read }, manifest))
    }

    /// The k reference rows nearest to `row` (bins), `exclude` left out, farthest first:
    /// distance is the sum over columns of 1 for another category and |Δbin| / (bins − 1)
    /// for a numeric column's value bins. Ties go to the earlier row.
    pub fn nearest(&self, domain: &Domain, row: &[usize], exclude: Option<usize>) -> Vec<usize> {
        // DP-2Stage's stage-1 table asks for none: no search over the reference rows.
        if self.neighbours == 0 {
            return Vec::new();
        }
        let mut scored: Vec<(f64, usize)> = self
            .reference
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != exclude)
            .map(|(i, other)| (distance(domain, row, other), i))
            .collect();
        let k = self.neighbours.min(scored.len());
        if k == 0 {
            return Vec::new();
        }
        let order = |a: &(f64, usize), b: &(f64, usize)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        scored.select_nth_unstable_by(k - 1, order);
        scored.truncate(k);
        scored.sort_by(|a, b| order(b, a));
        scored.into_iter().map(|(_, i)| i).collect()
    }

    /// Reference row `i` as bins.
    pub fn row(&self, i: usize) -> Vec<usize> {
        self.reference[i].iter().map(|&b| b as usize).collect()
    }
}

fn distance(domain: &Domain, a: &[usize], b: &[u32]) -> f64 {
    domain
        .columns
        .iter()
        .zip(a.iter().zip(b))
        .map(|(column, (&x, &y))| {
            let y = y as usize;
            let value_bins = column.value_bins();
            match &column.encoding {
                _ if x == y => 0.0,
                Encoding::Numeric { .. } if x < value_bins && y < value_bins && value_bins > 1 => {
                    x.abs_diff(y) as f64 / (value_bins - 1) as f64
                }
                _ => 1.0,
            }
        })
        .sum()
}
