//! A worker's rows as model inputs: encoded to features and grouped by privacy unit, each
//! unit keeping at most `max_rows_per_unit` rows. DP-SGD trains on them, PATE's teachers
//! fit on them.

use std::collections::HashMap;
use std::ops::Range;

use super::domain::Domain;
use super::partition::read_partition;
use super::{DataError, EncodedBatch};
use crate::entropy::os_rng;
use crate::sampling::Reservoir;

/// A worker's private examples, grouped by unit: each unit's rows are contiguous.
#[derive(Clone, Debug, Default)]
pub struct Examples {
    /// Features, row-major (rows × width).
    pub x: Vec<f32>,
    pub width: usize,
    /// Per unit: its id and its rows.
    pub units: Vec<(String, Range<usize>)>,
}

impl Examples {
    /// Reads partitions and encodes rows; a unit keeps at most `max_rows_per_unit` rows (a
    /// uniform subset drawn with a CSPRNG), so it contributes at most that many rows to the
    /// one example it forms.
    pub async fn load(
        urls: &[String],
        domain: &Domain,
        max_rows_per_unit: u32,
        width: usize,
        encode: impl Fn(&EncodedBatch, usize, &mut [f32]),
    ) -> Result<Self, DataError> {
        let mut rng = os_rng().map_err(|e| DataError::Internal(e.to_string()))?;
        let m = max_rows_per_unit.max(1) as usize;
        let mut order: Vec<String> = Vec::new();
        let mut kept: HashMap<String, Reservoir<Vec<f32>>> = HashMap::new();
        for url in urls {
            read_partition(url, domain, |batch| {
                for (r, unit) in batch.units.iter().enumerate() {
                    let mut row = vec![0f32; width];
                    encode(&batch, r, &mut row);
                    let rows = kept.entry(unit.clone()).or_insert_with(|| {
                        order.push(unit.clone());
                        Reservoir::default()
                    });
                    rows.offer(row, m, &mut rng);
                }
                Ok(())
            })
            .await?;
        }
        let mut examples = Examples { x: Vec::new(), width, units: Vec::with_capacity(order.len()) };
        for unit in order {
            let rows = kept.remove(&unit).expect("listed when first seen").into_kept();
            let start = examples.x.len() / width;
            examples.units.push((unit, start..start + rows.len()));
            examples.x.extend(rows.into_iter().flatten());
        }
        Ok(examples)
    }
}
