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
///
/// A hold-up leaves out the time the thread sat ready on the kernel's run queue: on a
/// loaded machine (CI runs many tests on two cores) the kernel may leave a free runtime
/// unscheduled for longer than the work's tenth, and that is no hold by the work. Time
/// the thread ran, or slept in a blocking call, counts.
pub async fn runtime_held<T>(work: impl Future<Output = T>) -> (T, Duration, Duration) {
    let longest = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let longest = longest.clone();
        async move {
            let (mut last, mut queued) = (Instant::now(), time_queued());
            loop {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let now_queued = time_queued();
                let held = last.elapsed().saturating_sub(now_queued.saturating_sub(queued));
                longest.fetch_max(held.as_micros() as u64, Ordering::Relaxed);
                (last, queued) = (Instant::now(), now_queued);
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

/// How long this thread has waited, ready, on the kernel's run queue (the second field of
/// Linux's `/proc/thread-self/schedstat`); zero where the kernel does not say, so that
/// every gap counts whole.
fn time_queued() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|stat| stat.split_whitespace().nth(1)?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
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

/// A database job's text over the files `rhosynth simulate --relational` writes into
/// `dir` (patients → admissions → vitals), admissions ordered by time and capped at
/// `caps.0` a patient, vitals capped at `caps.1` an admission with `vitals_order` (an
/// `order_by` line, or none for the keyed sample). No generator takes it yet: parse it with
/// [`database_spec`].
pub fn database_job(dir: &std::path::Path, (admissions_cap, vitals_cap): (u32, u32), vitals_order: &str) -> String {
    let file = |name: &str| dir.join(name).display().to_string();
    format!(
        r#"
[job]
dataset_id = "db"
[input]
urls = [{patients:?}]
[schema]
table = "patients"
unit_column = "subject_id"
columns = [
  {{ name = "subject_id", kind = "identifier" }},
  {{ name = "age", kind = "integer", min = 18, max = 90 }},
  {{ name = "sex", kind = "categorical", categories = ["F", "M"] }},
  {{ name = "comorbidity", kind = "categorical", categories = ["none", "mild", "severe"] }},
]

[[tables]]
name = "admissions"
key = "hadm_id"
parent = {{ table = "patients", key = "subject_id" }}
order_by = "admittime"
max_per_parent = {admissions_cap}
input = {{ urls = [{admissions:?}] }}
columns = [
  {{ name = "hadm_id", kind = "identifier" }},
  {{ name = "subject_id", kind = "identifier" }},
  {{ name = "admittime", kind = "datetime", min = "2024-01-01", max = "2030-01-01" }},
  {{ name = "dischtime", kind = "datetime", min = "2024-01-01", max = "2030-01-01" }},
  {{ name = "admission_type", kind = "categorical", categories = ["emergency", "urgent", "elective"] }},
  {{ name = "outcome", kind = "categorical", categories = ["home", "transfer", "died"] }},
]

[[tables]]
name = "vitals"
parent = {{ table = "admissions", key = "hadm_id" }}
{vitals_order}
max_per_parent = {vitals_cap}
input = {{ urls = [{vitals:?}] }}
columns = [
  {{ name = "subject_id", kind = "identifier" }},
  {{ name = "hadm_id", kind = "identifier" }},
  {{ name = "charttime", kind = "datetime", min = "2024-01-01", max = "2030-01-01" }},
  {{ name = "heart_rate", kind = "continuous", min = 20, max = 250 }},
  {{ name = "resp_rate", kind = "continuous", min = 4, max = 60 }},
  {{ name = "spo2", kind = "continuous", min = 50, max = 100 }},
]

[privacy]
epsilon = 4.0
delta = 1e-6
[generator]
name = "database"
"#,
        patients = file("patients.csv"),
        admissions = file("admissions.csv"),
        vitals = file("vitals.csv"),
    )
}

/// The simulated database with its times declared inside their intervals: a discharge at
/// or after its admission, a chart inside its admission.
pub fn with_intervals(text: &str) -> String {
    let (disch, chart) = (
        "name = \"dischtime\", kind = \"datetime\", min = \"2024-01-01\", max = \"2030-01-01\"",
        "name = \"charttime\", kind = \"datetime\", min = \"2024-01-01\", max = \"2030-01-01\"",
    );
    assert!(text.contains(disch) && text.contains(chart));
    text.replace(disch, &format!("{disch}, within = \"admittime..\""))
        .replace(chart, &format!("{chart}, within = \"admissions.admittime..dischtime\""))
}

/// [`database_job`] as a spec, parsed and checked.
pub fn database_spec(dir: &std::path::Path, caps: (u32, u32), vitals_order: &str) -> crate::spec::JobSpec {
    crate::spec::JobSpec::parse(&database_job(dir, caps, vitals_order), "database.toml").expect("a database job")
}

/// A file under `../shared/data` (beside the repository), if present; missing, the test
/// is skipped loudly, and fails in CI (`CI=true`).
pub fn shared_data(relative: &str) -> Option<std::path::PathBuf> {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the repository root");
    let path = repo.join("../shared/data").join(relative);
    if path.exists() {
        return Some(path.canonicalize().expect("canonical path"));
    }
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{} missing in CI", path.display());
    eprintln!("\n*** SKIPPED: {} not found ***\n", path.display());
    None
}

/// Writes a simulated database's three files into `dir`, as [`database_job`] reads them.
pub fn write_database(dir: &std::path::Path, db: &crate::simulate::database::Database) {
    for (name, text) in [("patients.csv", &db.patients), ("admissions.csv", &db.admissions), ("vitals.csv", &db.vitals)]
    {
        std::fs::write(dir.join(name), text).expect("a writable test folder");
    }
}

/// A partition's rows as read back, in order: each row's unit and its encoded values.
pub async fn partition_rows(url: &str, domain: &crate::data::domain::Domain) -> Vec<(String, Vec<Option<f64>>)> {
    let mut rows = Vec::new();
    crate::data::partition::read_partition(url, domain, |batch| {
        for (r, unit) in batch.units.into_iter().enumerate() {
            rows.push((unit, batch.values.iter().map(|column| column[r]).collect()));
        }
        Ok(())
    })
    .await
    .expect("a partition written by the test");
    rows
}

/// Spearman's correlation of pairs: Pearson's of their ranks (ties at their mean rank), so
/// a few stays drawn in a long, near-empty bin do not decide it.
pub fn rank_correlation(pairs: &[(f64, f64)]) -> f64 {
    let ranks = |key: &dyn Fn(&(f64, f64)) -> f64| {
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by(|&a, &b| key(&pairs[a]).total_cmp(&key(&pairs[b])));
        let mut ranks = vec![0.0; pairs.len()];
        let mut start = 0;
        while start < order.len() {
            let tied = order[start..].iter().take_while(|&&i| key(&pairs[i]) == key(&pairs[order[start]])).count();
            let mean = start as f64 + (tied as f64 - 1.0) / 2.0;
            order[start..start + tied].iter().for_each(|&i| ranks[i] = mean);
            start += tied;
        }
        ranks
    };
    let (a, b) = (ranks(&|p| p.0), ranks(&|p| p.1));
    crate::eval::longitudinal::pearson(&a.into_iter().zip(b).collect::<Vec<_>>()).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A blocking call on the runtime holds it, sleeping or not.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocking_call_on_the_runtime_is_held() {
        let ((), took, longest) = runtime_held(async { std::thread::sleep(Duration::from_millis(300)) }).await;
        assert!(longest >= Duration::from_millis(300), "held {longest:?} of {took:?}");
    }

    /// A runtime the kernel leaves waiting behind busier threads is not held by the work:
    /// the runtime's thread, at the lowest priority, shares one CPU with sixteen spinning
    /// threads while the work waits on another thread. Its ticks come up to a tenth of
    /// a second apart (70 to 110 ms of 510 to 550 in three runs when every gap counted
    /// whole), nearly all of it on the run queue.
    #[test]
    fn a_runtime_the_kernel_leaves_waiting_is_not_held() {
        if std::fs::metadata("/proc/thread-self/schedstat").is_err() {
            eprintln!("SKIPPED: this kernel does not say how long a thread waits to run");
            return;
        }
        let cpu = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set), 0);
            (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set)).unwrap()
        };
        let pin = move || unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set), 0);
        };
        let spinning = Arc::new(AtomicBool::new(true));
        let spinners: Vec<_> = (0..16)
            .map(|_| {
                let spinning = spinning.clone();
                std::thread::spawn(move || {
                    pin();
                    while spinning.load(Ordering::Relaxed) {}
                })
            })
            .collect();
        // The work: half a second's sleep on a thread of its own, free to run anywhere.
        let (start, started) = std::sync::mpsc::channel();
        let (done, slept) = tokio::sync::oneshot::channel();
        let sleeper = std::thread::spawn(move || {
            started.recv().unwrap();
            std::thread::sleep(Duration::from_millis(500));
            done.send(()).unwrap();
        });
        // The runtime on a thread of its own: a thread's CPU and priority cannot be given back.
        let (took, longest) = std::thread::spawn(move || {
            pin();
            assert_eq!(unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) }, 0);
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let work = async move {
                start.send(()).unwrap();
                slept.await.unwrap()
            };
            let ((), took, longest) = runtime.block_on(runtime_held(work));
            (took, longest)
        })
        .join()
        .unwrap();
        spinning.store(false, Ordering::Relaxed);
        spinners.into_iter().for_each(|s| s.join().unwrap());
        sleeper.join().unwrap();
        assert!(longest < took / 10, "held {longest:?} of {took:?}");
    }
}
