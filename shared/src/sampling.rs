//! Sampling helpers: an index by weight (public randomness: synthesis from released
//! statistics, simulation) and a reservoir (keeping a uniform subset of a unit's rows, with
//! a private, OS-keyed generator). Never used to draw privacy noise.

use rand::{Rng, RngExt};

/// An index drawn with probability proportional to `weights` (which sum to 1).
pub fn pick(weights: &[f64], rng: &mut impl Rng) -> usize {
    let u: f64 = rng.random();
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if u < acc {
            return i;
        }
    }
    weights.len() - 1
}

/// A uniform random subset of at most `capacity` of the items offered (Algorithm R): how a
/// unit's contribution is bounded to `max_rows_per_unit` rows whatever its history length.
#[derive(Clone, Debug)]
pub struct Reservoir<T> {
    seen: u64,
    kept: Vec<T>,
}

impl<T> Default for Reservoir<T> {
    fn default() -> Self {
        Self { seen: 0, kept: Vec::new() }
    }
}

impl<T> Reservoir<T> {
    /// Offers one more item; keeps it with probability capacity / items seen.
    pub fn offer(&mut self, item: T, capacity: usize, rng: &mut impl Rng) {
        #[cfg(feature = "planted-bugs")]
        let capacity = if crate::planted::units_unbounded() { usize::MAX } else { capacity };
        self.seen += 1;
        if self.kept.len() < capacity {
            self.kept.push(item);
        } else {
            let j = rng.random_range(0..self.seen) as usize;
            if j < capacity {
                self.kept[j] = item;
            }
        }
    }

    pub fn kept(&self) -> &[T] {
        &self.kept
    }

    pub fn into_kept(self) -> Vec<T> {
        self.kept
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::ChaCha8Rng;

    use super::Reservoir;

    /// Each of n items is kept with probability m / n: over many draws, every item's share
    /// is within 5 standard errors of m / n.
    #[test]
    fn a_reservoir_keeps_a_uniform_subset() {
        let (n, m, draws) = (10, 3, 20_000);
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut kept = vec![0u32; n];
        for _ in 0..draws {
            let mut r = Reservoir::default();
            (0..n).for_each(|i| r.offer(i, m, &mut rng));
            assert_eq!(r.kept().len(), m);
            r.into_kept().into_iter().for_each(|i| kept[i] += 1);
        }
        let p = m as f64 / n as f64;
        let sd = (p * (1.0 - p) / draws as f64).sqrt();
        assert!(kept.iter().all(|&k| (f64::from(k) / draws as f64 - p).abs() < 5.0 * sd), "{kept:?}");
    }
}
