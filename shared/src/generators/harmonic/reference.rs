//! The public reference set HARMONIC's prompts are made of, and its nearest rows to a
//! row. Read by the coordinator when it plans (a public table or a rhosynth release, never
//! the job's input) and sent to workers with the model.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::data::DataError;
use crate::data::domain::{Domain, Encoding};
use crate::eval::{load_first, read_release};
use crate::output::Manifest;
use crate::spec::JobSpec;

#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    #[error("reference {url}: {source}")]
    Read { url: String, source: DataError },
    #[error("reference {url}: {message}")]
    Invalid { url: String, message: String },
}

/// A temporary directory only its owner may enter, whatever the umask.
fn private_dir() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new().prefix("rhosynth-reference-").permissions(std::fs::Permissions::from_mode(0o700)).tempdir()
}

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
    /// Reads the first `rows` rows of the reference set at `url` (a rhosynth release, whose
    /// manifest lists its parts and is returned with the SHA-256 of its bytes, or files in
    /// the job's input format) in the job's schema. A release's parts are read from private
    /// copies made as they were checked against the manifest. `source` names the URL and
    /// the SHA-256 of the rows read; whoever plans the job states the guarantee they carry.
    pub async fn load(
        spec: &JobSpec,
        domain: &Domain,
        url: &str,
        rows: usize,
        neighbours: usize,
    ) -> Result<(Self, Option<(Manifest, String)>), ReferenceError> {
        let read = |source: DataError| ReferenceError::Read { url: url.to_string(), source };
        let copies = private_dir().map_err(|e| read(DataError::Read { file: url.into(), message: e.to_string() }))?;
        let release = read_release(url, Some(copies.path()), Some(rows as u64)).await.map_err(read)?;
        let (parts, manifest) = (release.parts, release.manifest);
        let table = load_first(spec, domain, &parts, rows).await.map_err(read)?;
        drop(copies);
        let reference: Vec<Vec<u32>> = (0..table.rows().min(rows))
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
        let mut hash = Sha256::new();
        reference.iter().flatten().for_each(|b| hash.update(b.to_le_bytes()));
        let source = format!("{url}, {} rows (SHA-256 of their bins {:x})", reference.len(), hash.finalize());
        Ok((Self { reference, neighbours, source }, manifest))
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
