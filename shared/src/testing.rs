//! Helpers for tests in this and the other workspace crates (feature `test-support`, a
//! dev-dependency feature only).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Runs `work` on the current runtime beside a ticker meant to tick every 2 ms, and returns
/// its output, how long it took, and the longest the ticker was held up meanwhile. A
/// worker's heartbeats share its runtime (in a standalone run, with the coordinator's), and
/// a worker silent past the coordinator's timeout is declared lost and its task redone: on
/// a one-thread runtime, work that holds the thread shows as a long hold-up.
pub async fn runtime_held<T>(work: impl Future<Output = T>) -> (T, Duration, Duration) {
    let longest = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let longest = longest.clone();
        async move {
            let mut last = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(2)).await;
                longest.fetch_max(last.elapsed().as_micros() as u64, Ordering::Relaxed);
                last = Instant::now();
            }
        }
    });
    // The ticker starts its first sleep before the work, and ends one after it.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let started = Instant::now();
    let out = work.await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(10)).await;
    ticker.abort();
    (out, took, Duration::from_micros(longest.load(Ordering::Relaxed)))
}
