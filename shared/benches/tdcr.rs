//! TDCR nearest-table search at the scale the evaluation must handle: 10⁴ synthetic query
//! tables against 10⁵ training tables (3 features, 4–30 rows each, random walks), beside
//! a brute-force baseline on a subset measured in the same run. The data are simulated.
//! Run with `cargo bench -p rhosynth-shared --bench tdcr`.

use std::time::Instant;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rhosynth_shared::eval::longitudinal::{SeqTable, dtw, nearest};

fn tables(rng: &mut ChaCha8Rng, n: usize) -> Vec<Vec<Vec<f64>>> {
    (0..n)
        .map(|_| {
            let len = rng.random_range(4..=30);
            let level: f64 = rng.random_range(60.0..120.0);
            (0..3)
                .map(|f| {
                    let mut x = level + 20.0 * f64::from(f);
                    (0..len)
                        .map(|_| {
                            x += rng.random_range(-3.0..3.0);
                            x
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let train = tables(&mut rng, 100_000);
    let synthetic = tables(&mut rng, 10_000);
    let index: Vec<SeqTable> = train.iter().cloned().map(SeqTable::new).collect();
    let queries: Vec<SeqTable> = synthetic.iter().cloned().map(SeqTable::new).collect();

    // Brute force (every DTW in full) for 20 queries, to price the baseline per query.
    let start = Instant::now();
    for q in &synthetic[..20] {
        let _ = train
            .iter()
            .map(|r| {
                q.iter().zip(r).map(|(a, b)| dtw(a, b, f64::INFINITY).map_or(0.0, |(c, l)| c / l as f64)).sum::<f64>()
            })
            .fold(f64::INFINITY, f64::min);
    }
    let brute_per_query = start.elapsed().as_secs_f64() / 20.0;

    let start = Instant::now();
    let distances = nearest(&queries, &index);
    let pruned = start.elapsed().as_secs_f64();
    let median = {
        let mut d = distances.clone();
        d.sort_by(f64::total_cmp);
        d[d.len() / 2]
    };
    println!(
        "TDCR 10^4 x 10^5: {pruned:.1} s pruned (median distance {median:.3}); brute force would take ≈ {:.0} s \
         ({:.0}x slower; {brute_per_query:.2} s per query measured on 20)",
        brute_per_query * 10_000.0,
        brute_per_query * 10_000.0 / pruned
    );
}
