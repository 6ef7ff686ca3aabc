//! A HyperLogLog sketch of a partition's units (Flajolet et al. 2007, with linear counting
//! for small counts), by their keyed digests: what a shard's reader reports of the units it
//! wrote to each bucket, in fixed memory whatever their number. Merged over the shards, it
//! estimates each partition's units within a stated error, so the count its owner makes
//! (exact, and the one the job uses) can be checked without the coordinator holding a unit.

/// 2¹² registers: a relative standard error of 1.04/√4096 ≈ 1.6%.
const PRECISION: u32 = 12;
pub const REGISTERS: usize = 1 << PRECISION;

/// Standard errors of the estimate within which an owner's count is accepted: a false
/// alarm has probability about 2·10⁻⁹ (normal tails at 6σ).
const ACCEPTED_ERRORS: f64 = 6.0;

#[derive(Clone, Debug, PartialEq)]
pub struct UnitSketch {
    registers: Vec<u8>,
}

impl Default for UnitSketch {
    fn default() -> Self {
        Self { registers: vec![0; REGISTERS] }
    }
}

impl UnitSketch {
    /// Adds a unit by its keyed digest: its high 64 bits, which the partition (chosen by the
    /// low 64) does not constrain.
    pub fn insert(&mut self, digest: u128) {
        let hash = (digest >> 64) as u64;
        let register = (hash >> (64 - PRECISION)) as usize;
        let rest = hash << PRECISION;
        let rank = (rest.leading_zeros().min(64 - PRECISION) + 1) as u8;
        self.registers[register] = self.registers[register].max(rank);
    }

    /// The sketch of the union of both sketches' units.
    pub fn merge(&mut self, other: &UnitSketch) {
        self.registers.iter_mut().zip(&other.registers).for_each(|(a, b)| *a = (*a).max(*b));
    }

    /// The estimated number of distinct units.
    pub fn estimate(&self) -> f64 {
        let m = REGISTERS as f64;
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let sum: f64 = self.registers.iter().map(|&r| 2f64.powi(-i32::from(r))).sum();
        let raw = alpha * m * m / sum;
        let empty = self.registers.iter().filter(|&&r| r == 0).count();
        if raw <= 2.5 * m && empty > 0 { m * (m / empty as f64).ln() } else { raw }
    }

    /// Whether `units` (an exact count) is what this sketch's units could be: within
    /// [`ACCEPTED_ERRORS`] standard errors of the estimate, and a unit either way for
    /// the smallest counts.
    pub fn accepts(&self, units: u64) -> bool {
        let estimate = self.estimate();
        let error = 1.04 / (REGISTERS as f64).sqrt() * estimate.max(units as f64);
        (units as f64 - estimate).abs() <= ACCEPTED_ERRORS * error + 1.0
    }

    /// The registers, as a tensor carries them.
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.registers.iter().map(|&r| f64::from(r))
    }

    /// A sketch from a tensor's [`REGISTERS`] values; refused unless each is a register's.
    pub fn from_values(values: &[f64]) -> Result<Self, String> {
        if values.len() != REGISTERS {
            return Err(format!("a sketch of {} registers, not {REGISTERS}", values.len()));
        }
        let highest = f64::from(64 - PRECISION + 1);
        let registers = values
            .iter()
            .map(|&v| {
                (v.fract() == 0.0 && (0.0..=highest).contains(&v))
                    .then_some(v as u8)
                    .ok_or_else(|| "a sketch register out of range".to_string())
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { registers })
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    use super::*;

    fn digest(unit: u64) -> u128 {
        u128::from_le_bytes(Sha256::digest(unit.to_le_bytes())[..16].try_into().unwrap())
    }

    /// Estimates within the stated error from a handful of units to 10⁶, however the units
    /// are split over merged sketches and repeated; an owner's count off by a fifth is
    /// refused at every size past the smallest.
    #[test]
    fn the_estimate_is_within_its_stated_error() {
        for n in [1u64, 7, 100, 1_000, 5_000, 10_000, 15_000, 20_000, 25_000, 300_000, 1_000_000] {
            let mut shards = vec![UnitSketch::default(); 3];
            for unit in 0..n {
                // Each unit's rows in up to two shards.
                shards[(unit % 3) as usize].insert(digest(unit));
                shards[(unit % 2) as usize].insert(digest(unit));
            }
            let mut merged = UnitSketch::default();
            shards.iter().for_each(|s| merged.merge(s));
            let relative = (merged.estimate() - n as f64).abs() / n as f64;
            assert!(relative <= 4.0 * 1.04 / 64.0 + 1.0 / n as f64, "{n}: estimate {}", merged.estimate());
            assert!(merged.accepts(n), "{n}");
            if n >= 100 {
                assert!(!merged.accepts(n + n / 5) && !merged.accepts(n - n / 5), "{n}: a fifth off is accepted");
            }
            assert_eq!(UnitSketch::from_values(&merged.values().collect::<Vec<_>>()).unwrap(), merged);
        }
        assert!(UnitSketch::from_values(&[0.5; REGISTERS]).is_err());
    }
}
