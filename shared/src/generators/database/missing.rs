//! Missing values only where the release says there are some: a view's own column whose
//! released one-way tables put its missing count within noise of none draws none. Without
//! this rule, a table with no missing value gets some in every release: the noise of the
//! missing cell's measurement, kept by the fitted model (41 discharge times of 20,000
//! admissions at ε = 4). Post-processing of released measurements: free, and public.

use crate::data::domain::Domain;
use crate::pgm::{GraphicalModel, Measurement};

/// How many standard deviations of a column's one-way measurements its released missing
/// count must reach to be drawn: a column with none reaches it in 0.13% of releases (one
/// side of a Gaussian), and one with fewer than about three noise deviations of missing
/// rows draws none.
pub const MISSING_NOISE_Z: f64 = 3.0;

/// `model` (over `domain`, a view whose own columns are its first `own`) given that each
/// own column whose missing count the one-way `measurements` hold within
/// [`MISSING_NOISE_Z`] deviations of none is not missing; and those columns.
pub fn without_phantoms(
    domain: &Domain,
    own: usize,
    model: GraphicalModel,
    measurements: &[Measurement],
) -> (GraphicalModel, Vec<usize>) {
    let ruled_out: Vec<(usize, Vec<bool>)> = (0..own)
        .filter(|&c| domain.columns[c].missing)
        .filter_map(|c| {
            let missing = domain.columns[c].value_bins();
            // The one-way measurements of the column, pooled by their precision.
            let (weighted, precision) =
                (measurements.iter().filter(|m| m.vars == [c])).fold((0.0, 0.0), |(sum, precision), m| {
                    let w = 1.0 / (m.sigma * m.sigma);
                    (sum + w * m.counts[missing], precision + w)
                });
            let within_noise = precision > 0.0 && weighted / precision < MISSING_NOISE_Z / precision.sqrt();
            within_noise.then(|| (c, (0..=missing).map(|bin| bin != missing).collect()))
        })
        .collect();
    let columns = ruled_out.iter().map(|(c, _)| *c).collect();
    match ruled_out.is_empty() {
        true => (model, columns),
        false => (model.conditioned(&ruled_out), columns),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ColumnKind, ColumnSpec, MissingPolicy, UnknownPolicy};

    fn column(name: &str, missing: MissingPolicy) -> ColumnSpec {
        ColumnSpec {
            name: name.into(),
            kind: ColumnKind::Categorical,
            min: None,
            max: None,
            categories: Some(vec!["a".into(), "b".into()]),
            unknown: UnknownPolicy::Reject,
            missing,
            bins: None,
            format: None,
            within: None,
        }
    }

    /// Two columns with a missing bin, one declared without: released with noise σ = 10, a
    /// missing count of 25 (2.5σ) is ruled out and drawn never, one of 40 (4σ) kept and
    /// drawn at its rate, and the one declared `reject` has no missing bin to draw.
    #[test]
    fn a_missing_count_within_noise_of_none_is_never_drawn() {
        let domain = Domain::of_columns(
            &[column("x", MissingPolicy::Keep), column("y", MissingPolicy::Keep), column("z", MissingPolicy::Reject)],
            8,
        );
        let one_way = |c: usize, counts: Vec<f64>| Measurement { vars: vec![c], counts, sigma: 10.0 };
        let measurements = [
            one_way(0, vec![500.0, 475.0, 25.0]),
            one_way(1, vec![480.0, 480.0, 40.0]),
            one_way(2, vec![500.0, 500.0]),
        ];
        let model = GraphicalModel::fit(&[3, 3, 2], &measurements, 200);
        let (model, ruled_out) = without_phantoms(&domain, 3, model, &measurements);
        assert_eq!(ruled_out, [0]);
        let [x, y] = [0, 1].map(|c| model.marginal(&[c]).values);
        assert!(x[2] < 1e-9 && (x[0] + x[1] - 1000.0).abs() < 1.0, "x: {x:?}");
        assert!((y[2] - 40.0).abs() < 1.0, "y keeps its missing rows: {y:?}");
        // Pooled: two measurements of 25 each at σ = 10 are 25 ± 7.1, past 3 deviations.
        let twice = [measurements[0].clone(), measurements[0].clone()];
        let model = GraphicalModel::fit(&[3, 3, 2], &twice, 10);
        assert!(without_phantoms(&domain, 3, model, &twice).1.is_empty());
    }
}
