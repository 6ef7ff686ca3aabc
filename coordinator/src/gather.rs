//! Fan-out and gather, once for every generator: a round is one task per group of
//! partitions with the same parameters; each result is checked before it counts, a lost
//! worker's task comes back with a new attempt (the scheduler refuses the old one), a
//! result that is not for this round fails the job, and the sum is taken in task order
//! once every result is in, so it is the same, bit for bit, on any number of workers.
//! Nothing about an incomplete round is released.

use std::collections::BTreeMap;
use std::sync::Arc;

use rhosynth_privacy::release::Private;
use rhosynth_proto::task::Work;
use rhosynth_shared::data::DataError;
use tokio::sync::mpsc;

use crate::context::JobError;
use crate::scheduler::{Scheduler, TaskDef, TaskEvent};
use crate::telemetry::Telemetry;

/// One round's tasks: one per group of partitions, all doing the same work, each
/// answering with the tensor `tensor` of `len` values.
pub struct Round<'r> {
    pub work: Work,
    pub groups: &'r [Vec<String>],
    pub tensor: &'static str,
    pub len: usize,
}

/// A worker's answer for one group, as a check sees it.
pub struct Answer<'a> {
    /// The group's index in the round.
    pub group: usize,
    pub values: &'a [f64],
    /// Units the worker says contributed (a claim: checks cap it by what they know).
    pub claimed_units: u64,
    pub worker: &'a str,
}

/// A job's rounds. Its tasks are cancelled when it is dropped, however the job ends.
pub struct Gather<'a> {
    scheduler: &'a Scheduler,
    telemetry: &'a Telemetry,
    job_id: String,
    events: Option<mpsc::UnboundedReceiver<TaskEvent>>,
}

impl<'a> Gather<'a> {
    pub fn new(scheduler: &'a Scheduler, telemetry: &'a Telemetry, job_id: &str) -> Self {
        Self { scheduler, telemetry, job_id: job_id.to_string(), events: None }
    }

    /// Runs one round; `check` decides whether each answer may count (its reason goes to
    /// the operator's log), `on_result(done, total)` follows progress. Returns the answers'
    /// element-wise sum in task order.
    pub async fn round(
        &mut self,
        round: Round<'_>,
        check: impl Fn(Answer<'_>) -> Result<(), String>,
        on_result: impl FnMut(usize, usize),
    ) -> Result<Private<Vec<f64>>, JobError> {
        let work = Arc::new(round.work);
        let tasks = round.groups.iter().map(|urls| (work.clone(), urls.clone())).collect();
        let mut answers: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        let take = |group: usize, worker: &str, claimed_units: u64, values: Vec<f64>| {
            if values.len() != round.len {
                return Err(format!("expected {} values, got {}", round.len, values.len()));
            }
            check(Answer { group, values: &values, claimed_units, worker })?;
            answers.insert(group, values);
            Ok(())
        };
        self.run(tasks, round.tensor, take, on_result).await?;
        let mut sum = vec![0.0; round.len];
        for values in answers.values() {
            sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
        }
        Ok(Private::new(sum))
    }

    /// Tasks each with its own work and partitions (a shard's reading, a partition's
    /// merge), each answering with the tensor `tensor`: `take(task, worker, values)` takes
    /// each answer as it comes, in any order, or refuses it (the job fails).
    pub async fn each(
        &mut self,
        tasks: Vec<(Work, Vec<String>)>,
        tensor: &'static str,
        mut take: impl FnMut(usize, &str, Vec<f64>) -> Result<(), String>,
        on_result: impl FnMut(usize, usize),
    ) -> Result<(), JobError> {
        let tasks = tasks.into_iter().map(|(work, urls)| (Arc::new(work), urls)).collect();
        self.run(tasks, tensor, |task, worker, _, values| take(task, worker, values), on_result).await
    }

    async fn run(
        &mut self,
        tasks: Vec<(Arc<Work>, Vec<String>)>,
        tensor: &'static str,
        mut take: impl FnMut(usize, &str, u64, Vec<f64>) -> Result<(), String>,
        mut on_result: impl FnMut(usize, usize),
    ) -> Result<(), JobError> {
        let total = tasks.len();
        // Never an id an earlier round (of any of the job's gathers) had.
        let first = self.scheduler.task_ids(total);
        // Only a shard's reader reads the input: another task's failure is never the input's.
        let reads_input: Vec<bool> = tasks.iter().map(|(work, _)| matches!(**work, Work::ReadShard(_))).collect();
        let tasks = tasks
            .into_iter()
            .enumerate()
            .map(|(i, (work, urls))| TaskDef {
                job_id: self.job_id.clone(),
                task_id: first + i as u64,
                work,
                partition_urls: urls,
            })
            .collect();
        let events = self.scheduler.submit_round(&self.job_id, tasks, &mut self.events);
        let mut answered = vec![false; total];
        let mut done = 0;
        while done < total {
            match events.recv().await {
                Some(TaskEvent::Done(mut result)) => {
                    let bad = |reason: String| JobError::BadResult {
                        worker: result.worker.clone(),
                        task_id: result.task_id,
                        reason,
                    };
                    let task = result
                        .task_id
                        .checked_sub(first)
                        .map(|g| g as usize)
                        .filter(|g| *g < total)
                        .ok_or_else(|| bad("a result for a task of another round".into()))?;
                    // A task answers once (the scheduler refuses a second answer too).
                    if answered[task] {
                        continue;
                    }
                    let index = result
                        .tensors
                        .iter()
                        .position(|(name, _)| name == tensor)
                        .ok_or_else(|| bad(format!("no '{tensor}' tensor")))?;
                    let values = result.tensors.swap_remove(index).1;
                    take(task, &result.worker, result.units, values).map_err(bad)?;
                    self.telemetry.task_done(result.seconds);
                    answered[task] = true;
                    done += 1;
                    on_result(done, total);
                }
                Some(TaskEvent::Requeued { task_id, worker }) => {
                    tracing::warn!(task = task_id, worker, "worker lost mid-round; its partitions are redone");
                }
                Some(TaskEvent::Failed { task_id, worker, error, input_mismatch: true })
                    if task_id.checked_sub(first).is_some_and(|t| reads_input.get(t as usize) == Some(&true)) =>
                {
                    // What the coordinator's own reading would have failed on: the
                    // submitter is told the input does not match, the operator where.
                    let file = format!("worker {worker}, task {task_id}");
                    return Err(JobError::Data(DataError::Read { file, message: error }));
                }
                Some(TaskEvent::Failed { task_id, worker, error, .. }) => {
                    return Err(JobError::Task { worker, task_id, error });
                }
                None => return Err(JobError::SchedulerStopped),
            }
        }
        Ok(())
    }
}

impl Gather<'_> {
    /// After a failed round whose tasks write to the scratch store (a shard's buckets, a
    /// merged partition): forgets its queued tasks and waits, up to `limit`, for those
    /// still running to end, so that the job's cleanup, after this, deletes what they wrote.
    pub async fn settle(&self, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            self.scheduler.cancel_queued(&self.job_id);
            if !self.scheduler.runs(&self.job_id) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    job = self.job_id,
                    "tasks still running after the wait: what they write may outlive the job"
                );
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Gather<'_> {
    fn drop(&mut self) {
        self.scheduler.cancel(&self.job_id);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rhosynth_proto::Capabilities;

    use super::*;
    use crate::scheduler::TaskResult;

    fn answer(task: &TaskDef, worker: &str, value: f64) -> TaskResult {
        let tensors = vec![("t".to_string(), vec![value])];
        TaskResult { task_id: task.task_id, worker: worker.to_string(), units: 1, tensors, seconds: 0.0 }
    }

    /// Takes `n` tasks as `worker`, waiting for them to be queued.
    async fn take(scheduler: &Scheduler, worker: &str, n: usize) -> Vec<(TaskDef, u32)> {
        let mut taken = Vec::new();
        while taken.len() < n {
            match scheduler.poll(worker) {
                Some(task) => taken.push(task),
                None => tokio::task::yield_now().await,
            }
        }
        taken
    }

    fn sum(values: Private<Vec<f64>>) -> Vec<f64> {
        let mut out = Vec::new();
        values
            .check(|v| {
                out = v.clone();
                Ok::<(), ()>(())
            })
            .unwrap();
        out
    }

    /// A result from an earlier round, or from an attempt that was requeued, never counts:
    /// the scheduler refuses it, and the round's sum is its own tasks' only.
    #[tokio::test]
    async fn late_and_requeued_results_never_count() {
        let scheduler = Scheduler::new(Duration::from_millis(30));
        let telemetry = Telemetry::default();
        let w1 = scheduler.register("one", Capabilities::default());
        let groups = vec![vec!["p0".to_string()], vec!["p1".to_string()]];
        let round = || Round { work: Work::CountTables(Default::default()), groups: &groups, tensor: "t", len: 1 };
        let mut gather = Gather::new(&scheduler, &telemetry, "job");

        let first = async {
            let tasks = take(&scheduler, &w1, 2).await;
            for (task, attempt) in &tasks {
                scheduler.complete("job", *attempt, answer(task, &w1, 1.0 + task.task_id as f64)).unwrap();
            }
            tasks
        };
        let (sum1, old) = tokio::join!(gather.round(round(), |_| Ok(()), |_, _| {}), first);
        assert_eq!(sum(sum1.unwrap()), [3.0]);

        let second = async {
            let tasks = take(&scheduler, &w1, 2).await;
            // Round 1's answer again, and this round's under a wrong attempt: refused.
            let (late, attempt) = &old[0];
            assert!(scheduler.complete("job", *attempt, answer(late, &w1, 100.0)).is_err());
            assert!(scheduler.complete("job", tasks[0].1 + 1, answer(&tasks[0].0, &w1, 100.0)).is_err());
            for (task, attempt) in &tasks {
                scheduler.complete("job", *attempt, answer(task, &w1, 10.0)).unwrap();
            }
        };
        let (sum2, ()) = tokio::join!(gather.round(round(), |_| Ok(()), |_, _| {}), second);
        assert_eq!(sum(sum2.unwrap()), [20.0]);

        // The worker goes silent holding both tasks: they come back with a new attempt, and
        // its answer to the old one is refused once another worker has taken them.
        let third = async {
            let lost = take(&scheduler, &w1, 2).await;
            tokio::time::sleep(Duration::from_millis(60)).await;
            scheduler.reap();
            let w2 = scheduler.register("two", Capabilities::default());
            let retried = take(&scheduler, &w2, 2).await;
            assert!(retried.iter().all(|(_, attempt)| *attempt == 2));
            assert!(scheduler.complete("job", lost[0].1, answer(&lost[0].0, &w1, 100.0)).is_err());
            for (task, attempt) in &retried {
                scheduler.complete("job", *attempt, answer(task, &w2, 5.0)).unwrap();
            }
        };
        let (sum3, ()) = tokio::join!(gather.round(round(), |_| Ok(()), |_, _| {}), third);
        assert_eq!(sum(sum3.unwrap()), [10.0]);
    }
}
