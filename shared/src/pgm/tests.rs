use rand::SeedableRng;
use rand::rngs::ChaCha20Rng;
use rand_distr::{Distribution, Normal};

use super::model::rounded_cells;
use super::{Factor, GraphicalModel, Measurement};

/// A joint distribution over `domain` (ascending cell weights, normalised), as counts.
fn joint(domain: &[usize], total: f64) -> Factor {
    let all: Vec<usize> = (0..domain.len()).collect();
    let mut f = Factor::filled(&all, domain, 0.0);
    f.values.iter_mut().enumerate().for_each(|(i, v)| *v = 1.0 + ((i * 37) % 17) as f64);
    let sum: f64 = f.values.iter().sum();
    f.values.iter_mut().for_each(|v| *v *= total / sum);
    f
}

fn measure(truth: &Factor, vars: &[usize], sigma: f64, noise: &mut impl FnMut() -> f64) -> Measurement {
    let counts = truth.sum_to(vars).values.into_iter().map(|c| c + sigma * noise()).collect();
    Measurement { vars: vars.to_vec(), counts, sigma }
}

#[test]
fn exact_measurements_are_reproduced() {
    // A chain and a triangle (a cycle: the tree needs the clique {2, 3, 4}).
    let domain = [3, 2, 4, 2, 3];
    let truth = joint(&domain, 10_000.0);
    let sets = [vec![0, 1], vec![1, 2], vec![2, 3], vec![3, 4], vec![2, 4]];
    let measurements: Vec<Measurement> = sets.iter().map(|s| measure(&truth, s, 1.0, &mut || 0.0)).collect();
    let model = GraphicalModel::fit(&domain, &measurements, 2000);
    assert!((model.total - 10_000.0).abs() < 1e-6);
    for m in &measurements {
        let fitted = model.marginal(&m.vars);
        for (a, b) in fitted.values.iter().zip(&m.counts) {
            // Consistent measurements are matched to well under a count.
            assert!((a - b).abs() < 0.5, "{:?}: {a} vs {b}", m.vars);
        }
    }
}

#[test]
fn reconciling_noisy_tables_beats_the_raw_one_way_table() {
    // Column 0 measured alone and inside two pairs, all with the same σ: the fitted
    // marginal pools three noisy views of it, so its error is well below one view's.
    let domain = [4, 3, 3];
    let truth = joint(&domain, 5_000.0);
    let exact = truth.sum_to(&[0]);
    let normal = Normal::new(0.0, 1.0).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let (mut raw, mut fitted) = (0.0, 0.0);
    for _ in 0..100 {
        let mut noise = || normal.sample(&mut rng);
        let measurements = vec![
            measure(&truth, &[0], 20.0, &mut noise),
            measure(&truth, &[0, 1], 20.0, &mut noise),
            measure(&truth, &[0, 2], 20.0, &mut noise),
        ];
        let model = GraphicalModel::fit(&domain, &measurements, 500);
        let estimate = model.marginal(&[0]);
        for i in 0..4 {
            raw += (measurements[0].counts[i] - exact.values[i]).powi(2);
            fitted += (estimate.values[i] - exact.values[i]).powi(2);
        }
    }
    // Least squares over the three views: a pair's view of a cell of column 0 sums three
    // noisy cells (variance 3σ²), so the pooled variance is σ²/(1 + 1/3 + 1/3) = 0.6σ²
    // against σ² raw. Each sum holds 400 squared errors (relative sd √(2/400) ≈ 0.07),
    // so 0.8 is about three standard deviations of the ratio above 0.6.
    assert!(fitted < raw * 0.8, "fitted {fitted} vs raw {raw}");
}

#[test]
fn samples_follow_the_fitted_pairs() {
    let domain = [3, 4, 2];
    let truth = joint(&domain, 1.0);
    let measurements: Vec<Measurement> =
        [vec![0, 1], vec![1, 2]].iter().map(|s| measure(&truth, s, 1.0, &mut || 0.0)).collect();
    let model = GraphicalModel::fit(&domain, &measurements, 2000);
    let n = 40_000;
    let rows = model.sample(n, &mut ChaCha20Rng::seed_from_u64(3));
    for m in &measurements {
        let expected = model.marginal(&m.vars);
        let total: f64 = expected.values.iter().sum();
        for (cell, weight) in expected.values.iter().enumerate() {
            let p = weight / total;
            let (a, b) = (cell / domain[m.vars[1]], cell % domain[m.vars[1]]);
            let seen = rows.iter().filter(|r| r[m.vars[0]] == a && r[m.vars[1]] == b).count() as f64 / n as f64;
            // Five binomial standard errors.
            assert!(
                (seen - p).abs() < 5.0 * (p * (1.0 - p) / n as f64).sqrt(),
                "{:?} cell {cell}: {seen} vs {p}",
                m.vars
            );
        }
    }
}

#[test]
fn marginals_across_cliques_match_the_chain_they_came_from() {
    // A Markov chain 0 → 1 → 2 → 3 → 4 is in the model family of its adjacent pairs, so
    // fitting exact pair tables recovers it and every other marginal follows.
    let domain = [2, 3, 2, 3, 2];
    let all: Vec<usize> = (0..domain.len()).collect();
    let mut truth = Factor::filled(&all, &domain, 0.0);
    for (i, v) in truth.values.iter_mut().enumerate() {
        let mut rest = i;
        let mut x = [0; 5];
        for d in (0..5).rev() {
            x[d] = rest % domain[d];
            rest /= domain[d];
        }
        // p(x0) Π p(x_{i+1} | x_i), each factor positive and uneven.
        *v = (1.0 + x[0] as f64) * (1..5).map(|d| 1.0 + ((x[d - 1] * 2 + x[d] * 3 + d) % 5) as f64).product::<f64>();
    }
    let sum: f64 = truth.values.iter().sum();
    truth.values.iter_mut().for_each(|v| *v *= 10_000.0 / sum);
    let measurements: Vec<Measurement> = (0..4).map(|d| measure(&truth, &[d, d + 1], 1.0, &mut || 0.0)).collect();
    let model = GraphicalModel::fit(&domain, &measurements, 3000);
    for set in [vec![0, 2], vec![0, 4], vec![1, 3, 4], vec![0, 2, 4], vec![0, 1, 2, 3, 4]] {
        let fitted = model.marginal(&set);
        let exact = truth.sum_to(&set);
        assert_eq!(fitted.vars, set);
        for (a, b) in fitted.values.iter().zip(&exact.values) {
            assert!((a - b).abs() < 1.0, "{set:?}: {a} vs {b}");
        }
    }
}

#[test]
fn joined_marginals_equal_variable_elimination_and_reach_every_pair() {
    // A cycle 0-1-2-3-0 (a chord is added), a triple {3, 4, 5}, and 6 measured alone:
    // several cliques, separators of one and two variables, and an empty one.
    let domain = [2, 3, 2, 4, 2, 3, 3];
    let truth = joint(&domain, 10_000.0);
    let sets = [vec![0, 1], vec![1, 2], vec![2, 3], vec![0, 3], vec![3, 4, 5], vec![6]];
    let measurements: Vec<Measurement> = sets.iter().map(|s| measure(&truth, s, 1.0, &mut || 0.0)).collect();
    let model = GraphicalModel::fit(&domain, &measurements, 50);
    let n = domain.len();
    let mut asked: Vec<Vec<usize>> = Vec::new();
    for a in 0..n {
        for b in a + 1..n {
            asked.push(vec![a, b]);
            asked.extend((b + 1..n).map(|c| vec![a, b, c]));
        }
    }
    let answers = model.marginals_of(&asked);
    let mut unreached = 0;
    for (set, answer) in asked.iter().zip(answers) {
        let Some(answer) = answer else {
            // Only a triple none of whose pairs shares a clique is left out.
            assert_eq!(set.len(), 3, "{set:?}");
            assert!(!model.reaches(set));
            unreached += 1;
            continue;
        };
        assert!(model.reaches(set));
        let expected = model.marginal(set);
        assert_eq!(answer.vars, expected.vars);
        for (a, b) in answer.values.iter().zip(&expected.values) {
            assert!((a - b).abs() < 1e-9 * model.total, "{set:?}: {a} vs {b}");
        }
    }
    // {1, 4, 6}: 1 shares no clique with 4 or 6, nor 4 with 6.
    assert!(!model.reaches(&[1, 4, 6]));
    assert!(unreached > 0);
}

/// Rows are drawn by rounding, not by independent draws: with one clique, every cell
/// holds n·p rows rounded down or up (independent draws would miss by √(n·p) or so).
#[test]
fn sampled_counts_are_the_models_counts_rounded() {
    let domain = [3, 4];
    let truth = joint(&domain, 1.0);
    let measurements = vec![measure(&truth, &[0, 1], 1.0, &mut || 0.0)];
    let model = GraphicalModel::fit(&domain, &measurements, 500);
    let expected = model.marginal(&[0, 1]);
    let total: f64 = expected.values.iter().sum();
    for (seed, n) in [(1, 997), (2, 10_000), (3, 5)] {
        let rows = model.sample(n, &mut ChaCha20Rng::seed_from_u64(seed));
        assert_eq!(rows.len(), n);
        for (cell, weight) in expected.values.iter().enumerate() {
            let target = n as f64 * weight / total;
            let seen = rows.iter().filter(|r| r[0] * 4 + r[1] == cell).count() as f64;
            assert!(seen == target.floor() || seen == target.ceil(), "n = {n}, cell {cell}: {seen} rows for {target}");
        }
    }
}

/// Each cell's count is ⌊n·p⌋ or ⌈n·p⌉, n in all, and n·p on average (2,000 draws: within
/// five standard errors of a count that is one of two values).
#[test]
fn rounded_cells_are_unbiased() {
    let weights = [0.5, 2.25, 0.0, 1.0, 3.125];
    let total: f64 = weights.iter().sum();
    let n = 13;
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    let mut sums = [0.0; 5];
    let draws = 2000;
    for _ in 0..draws {
        let cells = rounded_cells(weights.iter().copied().enumerate(), n, &mut rng);
        assert_eq!(cells.len(), n);
        for (i, w) in weights.iter().enumerate() {
            let target = n as f64 * w / total;
            let count = cells.iter().filter(|&&c| c == i).count() as f64;
            assert!(count == target.floor() || count == target.ceil(), "cell {i}: {count} for {target}");
            sums[i] += count;
        }
    }
    for (i, w) in weights.iter().enumerate() {
        let target = n as f64 * w / total;
        let f = target - target.floor();
        let tolerance = 5.0 * (f * (1.0 - f) / draws as f64).sqrt() + 1e-9;
        assert!(
            (sums[i] / draws as f64 - target).abs() <= tolerance,
            "cell {i}: mean {} for {target}",
            sums[i] / draws as f64
        );
    }
}

/// One row drawn given some variables' values follows the model conditioned on them (the
/// law `conditioned` then `sample` of one row draws from), over a tree of several cliques
/// (a cycle makes the clique {2, 3, 4}) with given variables inside and between them, one
/// clique wholly given, on a joint whose pairs are far from independent: per set of given
/// values (one plan per set of variables, drawn with several value sets), the chi-square
/// statistic of 40,000 draws against the exact conditional stays
/// below df + 5·√(2·df) (about 5 standard deviations above its mean).
#[test]
fn a_row_drawn_given_values_follows_the_conditioned_model() {
    let domain = [3, 2, 4, 2, 3, 2];
    let all: Vec<usize> = (0..domain.len()).collect();
    let sets = [vec![0, 1], vec![1, 2], vec![2, 3], vec![3, 4], vec![2, 4], vec![4, 5]];
    // Each measured pair's values tend to share their parity (e^1.5 against 1), and the
    // first values of each variable are likelier: a distribution the pairs model exactly.
    let mut truth = Factor::filled(&all, &domain, 0.0);
    for (i, v) in truth.values.iter_mut().enumerate() {
        let mut x = vec![0; domain.len()];
        let mut rest = i;
        for k in (0..domain.len()).rev() {
            x[k] = rest % domain[k];
            rest /= domain[k];
        }
        let agree = sets.iter().filter(|s| x[s[0]] % 2 == x[s[1]] % 2).count() as f64;
        *v = (1.5 * agree - 0.3 * x.iter().sum::<usize>() as f64).exp();
    }
    let measurements: Vec<Measurement> = sets.iter().map(|s| measure(&truth, s, 1.0, &mut || 0.0)).collect();
    let model = GraphicalModel::fit(&domain, &measurements, 500);
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    // One plan per set of variables, drawn with every value set of that set (a plan holds
    // no values).
    let planned_for: Vec<Vec<usize>> = vec![vec![1, 3], vec![2], vec![0, 4, 5], vec![]];
    let plans: Vec<_> = planned_for.iter().map(|vars| model.given(vars)).collect();
    for given in [vec![(1, 1), (3, 0)], vec![(2, 3)], vec![(1, 0), (3, 1)], vec![(0, 2), (4, 1), (5, 0)], vec![]] {
        let allowed: Vec<(usize, Vec<bool>)> =
            given.iter().map(|&(v, value)| (v, (0..domain[v]).map(|k| k == value).collect())).collect();
        let free: Vec<usize> = (0..domain.len()).filter(|v| !given.iter().any(|g| g.0 == *v)).collect();
        let exact = model.conditioned(&allowed).marginal(&free);
        let (vars, values): (Vec<usize>, Vec<usize>) = given.iter().copied().unzip();
        let planned = &plans[planned_for.iter().position(|p| *p == vars).expect("planned")];
        let total: f64 = exact.values.iter().sum();
        let n = 40_000;
        let mut counts = vec![0.0; exact.values.len()];
        for _ in 0..n {
            let row = planned.draw(&model, &values, &mut rng);
            assert!(given.iter().all(|&(v, value)| row[v] == value), "{given:?}: {row:?}");
            let cell = free.iter().zip(&exact.sizes).fold(0, |acc, (&v, &size)| acc * size + row[v]);
            counts[cell] += 1.0;
        }
        let chi2: f64 = counts
            .iter()
            .zip(&exact.values)
            .map(|(c, w)| {
                let expected = n as f64 * w / total;
                (c - expected).powi(2) / expected
            })
            .sum();
        let df = (counts.len() - 1) as f64;
        assert!(chi2 <= df + 5.0 * (2.0 * df).sqrt(), "{given:?}: χ² {chi2:.1} on {df} degrees of freedom");
    }
}
