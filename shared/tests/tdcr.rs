//! The pruned TDCR nearest-neighbour search returns exactly what brute force does.

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rhosynth_shared::eval::longitudinal::{SeqTable, dtw, nearest};

fn random_tables(rng: &mut ChaCha8Rng, n: usize) -> Vec<Vec<Vec<f64>>> {
    (0..n)
        .map(|_| {
            (0..3)
                .map(|f| {
                    let len = rng.random_range(0..12);
                    let mut x = f64::from(f) * 10.0 + rng.random_range(-5.0..5.0);
                    (0..len)
                        .map(|_| {
                            x += rng.random_range(-1.0..1.0);
                            x
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn brute_force(q: &[Vec<f64>], references: &[Vec<Vec<f64>>]) -> f64 {
    references
        .iter()
        .map(|r| {
            q.iter()
                .zip(r)
                .map(|(a, b)| {
                    let (cost, len) = dtw(a, b, f64::INFINITY).unwrap();
                    cost / len as f64
                })
                .sum::<f64>()
        })
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn pruned_search_equals_brute_force() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let references = random_tables(&mut rng, 400);
    let queries = random_tables(&mut rng, 60);
    let index: Vec<SeqTable> = references.iter().cloned().map(SeqTable::new).collect();
    let fast = nearest(&queries.iter().cloned().map(SeqTable::new).collect::<Vec<_>>(), &index);
    for (q, got) in queries.iter().zip(fast) {
        let want = brute_force(q, &references);
        assert!((got - want).abs() <= 1e-9 * want.max(1.0), "{got} vs {want}");
    }
}
