//! Canary units: outlying but valid rows, designed from the declared domain alone (never
//! from the data), so that a release that depends on one too much shows it.
//!
//! A canary's row takes, in every numeric column, a value in its lowest or highest bin (a
//! coin per column) and, in every categorical column, a declared category drawn uniformly:
//! a combination real rows rarely have, and distinct canaries rarely share. A canary of
//! several rows (a unit with a history) repeats that row, its `order_by` value apart (drawn
//! anew per row, sorted), so every row of it pulls the release the same way.

use rand::{CryptoRng, Rng, RngExt};

use crate::data::domain::{ColumnDomain, Domain, Encoding};
use crate::output::{SyntheticUnits, SyntheticValue};

/// `count` canary units of `rows` rows each, as synthetic units in the domain's columns.
/// The design is public (any generator may be used; the audit's soundness rests on the
/// inclusion coins alone).
pub fn design(
    domain: &Domain,
    order_by: Option<usize>,
    count: usize,
    rows: usize,
    rng: &mut impl Rng,
) -> SyntheticUnits {
    let mut units = SyntheticUnits::default();
    for _ in 0..count {
        let base: Vec<SyntheticValue> = domain.columns.iter().map(|c| outlying(c, rng)).collect();
        let mut order = Vec::new();
        if let Some(d) = order_by {
            let column = &domain.columns[d];
            order = (0..rows).map(|_| column.draw(rng.random_range(0..column.value_bins()), rng)).collect();
            let key = |v: &SyntheticValue| column.encoded(v).unwrap_or(f64::NAN);
            order.sort_by(|a, b| key(a).total_cmp(&key(b)));
        }
        units.push((0..rows).map(|r| {
            let mut row = base.clone();
            if let Some(d) = order_by {
                row[d] = order[r].clone();
            }
            row
        }));
    }
    units
}

/// Which canaries go into the job's input: each independently with probability ½, from a
/// CSPRNG keyed by the OS (the audit's guarantee rests on nobody predicting these coins).
pub fn include(count: usize, rng: &mut impl CryptoRng) -> Vec<bool> {
    (0..count).map(|_| rng.random::<bool>()).collect()
}

fn outlying(column: &ColumnDomain, rng: &mut impl Rng) -> SyntheticValue {
    let bins = column.value_bins();
    let bin = match &column.encoding {
        Encoding::Categorical { categories, .. } => rng.random_range(0..categories.len().max(1)),
        Encoding::Numeric { .. } => {
            if rng.random::<bool>() {
                bins - 1
            } else {
                0
            }
        }
    };
    column.draw(bin, rng)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::ChaCha8Rng;

    use super::*;

    fn domain() -> Domain {
        crate::testing::schema_domain(
            r#"unit_column = "id"
order_by = "t"
[[schema.columns]]
name = "id"
kind = "identifier"
[[schema.columns]]
name = "t"
kind = "integer"
min = 0
max = 1000
[[schema.columns]]
name = "age"
kind = "integer"
min = 17
max = 90
bins = 8
[[schema.columns]]
name = "colour"
kind = "categorical"
categories = ["red", "green", "blue"]"#,
        )
    }

    #[test]
    fn canaries_sit_in_extreme_bins_and_repeat_but_for_their_order() {
        let domain = domain();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let units = design(&domain, Some(0), 200, 4, &mut rng);
        assert_eq!((units.units(), units.rows.len()), (200, 800));
        let age = &domain.columns[1];
        let last = age.value_bins() - 1;
        let (mut low, mut high) = (0, 0);
        for unit in units.rows.chunks(4) {
            let bin = age.bin_of(&unit[0][1]).unwrap();
            assert!(bin == 0 || bin == last, "age bin {bin}");
            (low, high) = (low + usize::from(bin == 0), high + usize::from(bin != 0));
            assert!(
                matches!(&unit[0][2], SyntheticValue::Category(c) if ["red", "green", "blue"].contains(&c.as_str()))
            );
            assert!(unit.iter().all(|r| r[1..] == unit[0][1..]), "rows differ beyond the order column");
            let order = |r: &[SyntheticValue]| domain.columns[0].encoded(&r[0]).unwrap();
            assert!(unit.windows(2).all(|w| order(&w[0]) <= order(&w[1])), "order not sorted");
        }
        // A fair coin per canary: 200 draws, 5 standard deviations (√50 ≈ 7) around 100.
        assert!((low as i64 - 100).abs() < 36 && low + high == 200, "{low} low, {high} high");
    }

    #[test]
    fn inclusion_is_a_fair_coin() {
        let mut rng = crate::entropy::os_rng().unwrap();
        let included = include(10_000, &mut rng);
        let n = included.iter().filter(|&&b| b).count() as f64;
        // Binomial(10⁴, ½): standard deviation 50; 6 of them.
        assert!((n - 5000.0).abs() < 300.0, "{n}");
    }
}
