//! What the coordinator exposes on `/metrics`: jobs by state, tasks and their latency,
//! live workers, and ε spent and remaining per dataset (public: the ledger's totals).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rhosynth_shared::metrics::Exposition;

#[derive(Default)]
pub struct Telemetry {
    tasks_done: AtomicU64,
    task_seconds: Mutex<f64>,
    /// Per dataset: (ε spent, ε budget).
    datasets: Mutex<BTreeMap<String, (f64, f64)>>,
}

impl Telemetry {
    pub fn task_done(&self, seconds: f64) {
        self.tasks_done.fetch_add(1, Ordering::Relaxed);
        *self.task_seconds.lock().unwrap_or_else(|e| e.into_inner()) += seconds;
    }

    pub fn dataset(&self, dataset: &str, spent: f64, budget: f64) {
        self.datasets.lock().unwrap_or_else(|e| e.into_inner()).insert(dataset.to_string(), (spent, budget));
    }

    /// Adds this coordinator's samples to a scrape.
    pub fn render(&self, e: &mut Exposition) {
        e.counter(
            "rhosynth_tasks_completed_total",
            "Tasks (rounds of worker aggregation) completed.",
            &[],
            self.tasks_done.load(Ordering::Relaxed) as f64,
        );
        e.counter(
            "rhosynth_task_seconds_total",
            "Seconds from hand-out to result, summed over completed tasks (divide by tasks for latency).",
            &[],
            *self.task_seconds.lock().unwrap_or_else(|e| e.into_inner()),
        );
        for (dataset, (spent, budget)) in self.datasets.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let labels = [("dataset", dataset.as_str())];
            e.gauge("rhosynth_epsilon_spent", "Privacy budget ε spent by the dataset (ledger total).", &labels, *spent);
            e.gauge(
                "rhosynth_epsilon_remaining",
                "Privacy budget ε the dataset has left.",
                &labels,
                (budget - spent).max(0.0),
            );
        }
    }
}
