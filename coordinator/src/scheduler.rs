//! Worker registry and task queue. Workers pull tasks (long polling); a worker that stops
//! heartbeating is declared dead and its running tasks go back to the front of the queue
//! with a new attempt number, so a late result from the old attempt is refused and nothing
//! is counted twice.
//!
//! Partitions stick to workers: the first worker handed a partition owns it, and later
//! tasks on that partition (every DP-SGD round) go only to its owner, so its rows stay
//! where they were loaded. New partitions go to the live worker owning the fewest; a dead
//! worker's partitions are released to the others.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rhosynth_proto::Capabilities;
use rhosynth_proto::task::Work;
use tokio::sync::{Notify, mpsc};

/// One unit of work: what to compute (shared by the round's tasks), and the partitions it
/// reads.
#[derive(Clone, Debug)]
pub struct TaskDef {
    pub job_id: String,
    pub task_id: u64,
    pub work: Arc<Work>,
    pub partition_urls: Vec<String>,
}

/// A finished task's aggregate.
#[derive(Clone, Debug)]
pub struct TaskResult {
    pub task_id: u64,
    pub worker: String,
    pub units: u64,
    pub tensors: Vec<(String, Vec<f64>)>,
    /// Seconds from hand-out to result (set by the scheduler).
    pub seconds: f64,
}

/// What a job hears about its tasks.
#[derive(Debug)]
pub enum TaskEvent {
    Done(TaskResult),
    /// `input_mismatch`: the task's private input broke the job's schema.
    Failed {
        task_id: u64,
        worker: String,
        error: String,
        input_mismatch: bool,
    },
    Requeued {
        task_id: u64,
        worker: String,
    },
}

struct Worker {
    name: String,
    capabilities: Capabilities,
    last_seen: Instant,
}

struct Running {
    def: TaskDef,
    attempt: u32,
    worker: String,
    started: Instant,
}

#[derive(Default)]
struct Inner {
    workers: HashMap<String, Worker>,
    pending: VecDeque<(TaskDef, u32)>,
    running: HashMap<(String, u64), Running>,
    listeners: HashMap<String, mpsc::UnboundedSender<TaskEvent>>,
    /// (job, partition URL) → the worker that holds it.
    owners: HashMap<(String, String), String>,
    next_worker: u64,
}

impl Inner {
    fn owned_by(&self, worker: &str) -> usize {
        self.owners.values().filter(|w| *w == worker).count()
    }

    /// Whether `worker` may take `task`: it reads no partition (a shard of the input), it
    /// owns all its partitions, or they are unowned and no live worker owns fewer
    /// partitions than it does. A task whose partitions
    /// different workers hold (a round grouping them otherwise than an earlier one) goes to
    /// the one holding most of them (the first by id on a tie), which then holds them all:
    /// otherwise no worker could ever take it.
    fn may_take(&self, worker: &str, task: &TaskDef) -> bool {
        if task.partition_urls.is_empty() {
            return true;
        }
        let mut held: HashMap<&str, usize> = HashMap::new();
        let mut unowned = false;
        for url in &task.partition_urls {
            match self.owners.get(&(task.job_id.clone(), url.clone())) {
                Some(owner) => *held.entry(owner.as_str()).or_default() += 1,
                None => unowned = true,
            }
        }
        match held.len() {
            0 => self.workers.keys().all(|w| self.owned_by(w) >= self.owned_by(worker)),
            1 => {
                held.contains_key(worker)
                    && (!unowned || self.workers.keys().all(|w| self.owned_by(w) >= self.owned_by(worker)))
            }
            _ => held.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).is_some_and(|(w, _)| *w == worker),
        }
    }
}

/// Shared between the gRPC service, the jobs and the reaper.
pub struct Scheduler {
    inner: Mutex<Inner>,
    worker_timeout: Duration,
    /// Wakes long polls when tasks are queued.
    queued: Notify,
    /// The next task id: ids are never reused, so a late answer is never another task's.
    next_task: std::sync::atomic::AtomicU64,
}

impl Scheduler {
    pub fn new(worker_timeout: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            worker_timeout,
            queued: Notify::new(),
            next_task: Default::default(),
        }
    }

    /// `count` fresh task ids, consecutive; returns the first.
    pub fn task_ids(&self, count: usize) -> u64 {
        self.next_task.fetch_add(count as u64, std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn register(&self, name: &str, capabilities: Capabilities) -> String {
        let mut inner = self.lock();
        inner.next_worker += 1;
        // Not guessable: another worker cannot report results or failures under this id.
        let id = format!("w{}-{name}-{:016x}", inner.next_worker, rand::random::<u64>());
        tracing::info!(worker = id, cores = capabilities.cpu_cores, gpus = capabilities.gpus, "worker registered");
        inner.workers.insert(id.clone(), Worker { name: name.to_string(), capabilities, last_seen: Instant::now() });
        id
    }

    /// `false` when the worker is unknown (it must register again).
    pub fn heartbeat(&self, worker: &str) -> bool {
        match self.lock().workers.get_mut(worker) {
            Some(w) => {
                w.last_seen = Instant::now();
                true
            }
            None => false,
        }
    }

    pub fn live_workers(&self) -> Vec<(String, String, Capabilities)> {
        self.lock().workers.iter().map(|(id, w)| (id.clone(), w.name.clone(), w.capabilities)).collect()
    }

    /// Queues a job's tasks; the receiver hears about each of them.
    pub fn submit(&self, job_id: &str, tasks: Vec<TaskDef>) -> mpsc::UnboundedReceiver<TaskEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut inner = self.lock();
        inner.listeners.insert(job_id.to_string(), tx);
        inner.pending.extend(tasks.into_iter().map(|t| (t, 1)));
        drop(inner);
        self.queued.notify_waiters();
        rx
    }

    /// Queues more tasks for a job already submitted (the next DP-SGD round).
    fn enqueue(&self, tasks: Vec<TaskDef>) {
        self.lock().pending.extend(tasks.into_iter().map(|t| (t, 1)));
        self.queued.notify_waiters();
    }

    /// Queues one round of a job's tasks (DP-SGD rounds, PATE iterations): the first round
    /// registers the job's listener in `events`, later ones reuse it.
    pub fn submit_round<'a>(
        &self,
        job_id: &str,
        tasks: Vec<TaskDef>,
        events: &'a mut Option<mpsc::UnboundedReceiver<TaskEvent>>,
    ) -> &'a mut mpsc::UnboundedReceiver<TaskEvent> {
        if events.is_some() {
            self.enqueue(tasks);
            events.as_mut().expect("checked above")
        } else {
            events.insert(self.submit(job_id, tasks))
        }
    }

    /// Forgets a job's queued and running tasks.
    pub fn cancel(&self, job_id: &str) {
        let mut inner = self.lock();
        inner.pending.retain(|(t, _)| t.job_id != job_id);
        inner.running.retain(|(j, _), _| j != job_id);
        inner.listeners.remove(job_id);
        inner.owners.retain(|(job, _), _| job != job_id);
    }

    /// Forgets a job's queued tasks (a lost worker's task requeued later is forgotten on
    /// the next call), leaving those running to end.
    pub fn cancel_queued(&self, job_id: &str) {
        self.lock().pending.retain(|(t, _)| t.job_id != job_id);
    }

    /// Whether a task of the job is running on a worker.
    pub fn runs(&self, job_id: &str) -> bool {
        self.lock().running.keys().any(|(job, _)| job == job_id)
    }

    /// The next task for a known worker, waiting up to `wait` for one to be queued.
    pub async fn poll_wait(&self, worker: &str, wait: Duration) -> Option<(TaskDef, u32)> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.queued.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(task) = self.poll(worker) {
                return Some(task);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// The next task for a known worker.
    pub fn poll(&self, worker: &str) -> Option<(TaskDef, u32)> {
        let mut inner = self.lock();
        inner.workers.get_mut(worker)?.last_seen = Instant::now();
        let index = inner.pending.iter().position(|(def, _)| inner.may_take(worker, def))?;
        let (def, attempt) = inner.pending.remove(index).expect("found above");
        for url in &def.partition_urls {
            inner.owners.insert((def.job_id.clone(), url.clone()), worker.to_string());
        }
        let key = (def.job_id.clone(), def.task_id);
        inner
            .running
            .insert(key, Running { def: def.clone(), attempt, worker: worker.to_string(), started: Instant::now() });
        Some((def, attempt))
    }

    /// Whether `worker` runs this attempt: checked before a result's bytes are buffered.
    pub fn is_running(&self, worker: &str, job_id: &str, task_id: u64, attempt: u32) -> bool {
        let inner = self.lock();
        inner.running.get(&(job_id.to_string(), task_id)).is_some_and(|r| r.worker == worker && r.attempt == attempt)
    }

    /// Removes a running attempt; returns how long it ran.
    fn take_running(&self, worker: &str, job_id: &str, task_id: u64, attempt: u32) -> Result<f64, String> {
        let mut inner = self.lock();
        let key = (job_id.to_string(), task_id);
        match inner.running.get(&key) {
            Some(r) if r.worker == worker && r.attempt == attempt => {
                let seconds = r.started.elapsed().as_secs_f64();
                inner.running.remove(&key);
                Ok(seconds)
            }
            _ => Err(format!("task {task_id} attempt {attempt} of job {job_id} is not running on {worker}")),
        }
    }

    fn notify(&self, job_id: &str, event: TaskEvent) {
        if let Some(tx) = self.lock().listeners.get(job_id) {
            let _ = tx.send(event);
        }
    }

    /// Accepts a result only from the worker running that attempt.
    pub fn complete(&self, job_id: &str, attempt: u32, mut result: TaskResult) -> Result<(), String> {
        result.seconds = self.take_running(&result.worker, job_id, result.task_id, attempt)?;
        self.notify(job_id, TaskEvent::Done(result));
        Ok(())
    }

    pub fn fail(
        &self,
        (worker, job_id, task_id, attempt): (&str, &str, u64, u32),
        error: String,
        input_mismatch: bool,
    ) -> Result<(), String> {
        self.take_running(worker, job_id, task_id, attempt)?;
        self.notify(job_id, TaskEvent::Failed { task_id, worker: worker.to_string(), error, input_mismatch });
        Ok(())
    }

    /// Declares silent workers dead and requeues their running tasks.
    pub fn reap(&self) {
        let mut inner = self.lock();
        let now = Instant::now();
        let dead: Vec<String> = inner
            .workers
            .iter()
            .filter(|(_, w)| now.duration_since(w.last_seen) > self.worker_timeout)
            .map(|(id, _)| id.clone())
            .collect();
        let requeued = !dead.is_empty();
        for id in dead {
            inner.workers.remove(&id);
            inner.owners.retain(|_, owner| *owner != id);
            tracing::warn!(worker = id, "worker lost (no heartbeat); requeueing its tasks");
            let lost: Vec<(String, u64)> =
                inner.running.iter().filter(|(_, r)| r.worker == id).map(|(k, _)| k.clone()).collect();
            for key in lost {
                let r = inner.running.remove(&key).expect("listed above");
                if let Some(tx) = inner.listeners.get(&r.def.job_id) {
                    let _ = tx.send(TaskEvent::Requeued { task_id: r.def.task_id, worker: id.clone() });
                }
                inner.pending.push_front((r.def, r.attempt + 1));
            }
        }
        drop(inner);
        if requeued {
            self.queued.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(task_id: u64, partitions: &[&str]) -> TaskDef {
        TaskDef {
            job_id: "j".into(),
            task_id,
            work: Arc::new(Work::CountTables(Default::default())),
            partition_urls: partitions.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// A task that reads no partition (a shard of the input) goes to any free worker, even
    /// one holding more partitions than another: balancing partitions is no reason to
    /// leave it waiting.
    #[test]
    fn a_shard_goes_to_any_free_worker() {
        let scheduler = Scheduler::new(Duration::from_secs(60));
        let a = scheduler.register("a", Capabilities::default());
        let _b = scheduler.register("b", Capabilities::default());
        scheduler.enqueue(vec![task(0, &["p0"])]);
        scheduler.poll(&a).expect("a takes p0");
        scheduler.enqueue(vec![task(1, &[])]);
        assert_eq!(scheduler.poll(&a).expect("a takes the shard").0.task_id, 1);
    }

    /// One-partition tasks place p0 and p1 on different workers; a later task over both
    /// still runs (on one of them), and its worker then holds both.
    #[test]
    fn a_task_over_partitions_of_several_workers_still_runs() {
        let scheduler = Scheduler::new(Duration::from_secs(60));
        let a = scheduler.register("a", Capabilities::default());
        let b = scheduler.register("b", Capabilities::default());
        scheduler.enqueue(vec![task(0, &["p0"]), task(1, &["p1"])]);
        let first = scheduler.poll(&a).expect("a takes one").0;
        let second = scheduler.poll(&b).expect("b takes the other").0;
        assert_ne!(first.partition_urls, second.partition_urls);
        scheduler.enqueue(vec![task(2, &["p0", "p1"])]);
        let taken = [scheduler.poll(&a), scheduler.poll(&b)];
        let takers: Vec<usize> = (0..2).filter(|&i| taken[i].is_some()).collect();
        assert_eq!(takers.len(), 1, "exactly one worker takes it");
        let owner = [&a, &b][takers[0]];
        let inner = scheduler.lock();
        assert!(["p0", "p1"].iter().all(|p| inner.owners[&("j".to_string(), p.to_string())] == *owner));
    }
}
