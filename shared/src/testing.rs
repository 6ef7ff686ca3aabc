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

/// The demo job (`examples/demo.toml`): the spec tests in every crate start from.
pub const DEMO: &str = include_str!("../../examples/demo.toml");

/// `[generator]` naming `name`, with `section` (TOML lines, possibly none, possibly a
/// `[generator.<name>.run]` table after them) under `[generator.<name>]`.
pub fn generator(name: &str, section: &str) -> String {
    format!("[generator]\nname = \"{name}\"\n\n[generator.{name}]\n{section}")
}

/// `spec` (a job spec's text) with its generator sections, up to `[output]`, replaced by
/// `generator`.
pub fn with_generator(spec: &str, generator: &str) -> String {
    let start = spec.find("[generator]").expect("a spec with a [generator] section");
    let end = spec.find("[output]").expect("an [output] section after it");
    format!("{}{generator}\n\n{}", &spec[..start], &spec[end..])
}

/// A job spec's text over `schema` (the TOML after `[schema]`: options and columns) with
/// `generator` (as [`generator`] writes it), at ε = 1, δ = 1e-5, reading `x.csv`, writing
/// under `out`: for tests of what a schema alone decides (domains, encodings, plans). Edit
/// it with `str::replace` (or append sections) before parsing.
pub fn schema_job(schema: &str, generator: &str) -> String {
    format!(
        "[job]\ndataset_id = \"t\"\n[input]\nurls = [\"x.csv\"]\n[schema]\n{schema}\n[privacy]\nepsilon = 1.0\n\
         delta = 1e-5\n\n{generator}\n\n[output]\nurl = \"out\"\n"
    )
}

/// The domain of [`schema_job`] over `schema`, with the marginals generator.
pub fn schema_domain(schema: &str) -> crate::data::domain::Domain {
    let text = schema_job(schema, &generator("marginals", ""));
    crate::data::domain::Domain::from_spec(&crate::spec::JobSpec::parse(&text, "test").expect("a valid schema"))
}

/// The demo job with `generator` as its generator sections.
pub fn demo_job(generator: &str) -> crate::spec::JobSpec {
    crate::spec::JobSpec::parse(&with_generator(DEMO, generator), "examples/demo.toml").expect("a valid spec")
}
