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
    /// Task ids grow across rounds: one from an earlier round is never this round's.
    next_task: u64,
}

impl<'a> Gather<'a> {
    pub fn new(scheduler: &'a Scheduler, telemetry: &'a Telemetry, job_id: &str) -> Self {
        Self { scheduler, telemetry, job_id: job_id.to_string(), events: None, next_task: 0 }
    }

    /// Runs one round; `check` decides whether each answer may count (its reason goes to
    /// the operator's log), `on_result(done, total)` follows progress. Returns the answers'
    /// element-wise sum in task order.
    pub async fn round(
        &mut self,
        round: Round<'_>,
        check: impl Fn(Answer<'_>) -> Result<(), String>,
        mut on_result: impl FnMut(usize, usize),
    ) -> Result<Private<Vec<f64>>, JobError> {
        let first = self.next_task;
        let total = round.groups.len();
        self.next_task += total as u64;
        let work = Arc::new(round.work);
        let tasks = round
            .groups
            .iter()
            .enumerate()
            .map(|(i, urls)| TaskDef {
                job_id: self.job_id.clone(),
                task_id: first + i as u64,
                work: work.clone(),
                partition_urls: urls.clone(),
            })
            .collect();
        let events = self.scheduler.submit_round(&self.job_id, tasks, &mut self.events);
        let mut answers: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        while answers.len() < total {
            match events.recv().await {
                Some(TaskEvent::Done(mut result)) => {
                    let bad = |reason: String| JobError::BadResult {
                        worker: result.worker.clone(),
                        task_id: result.task_id,
                        reason,
                    };
                    let group = result
                        .task_id
                        .checked_sub(first)
                        .map(|g| g as usize)
                        .filter(|g| *g < total)
                        .ok_or_else(|| bad("a result for a task of another round".into()))?;
                    // A task answers once (the scheduler refuses a second answer too).
                    if answers.contains_key(&group) {
                        continue;
                    }
                    let index = result
                        .tensors
                        .iter()
                        .position(|(name, _)| name == round.tensor)
                        .ok_or_else(|| bad(format!("no '{}' tensor", round.tensor)))?;
                    let values = result.tensors.swap_remove(index).1;
                    if values.len() != round.len {
                        return Err(bad(format!("expected {} values, got {}", round.len, values.len())));
                    }
                    let answer = Answer { group, values: &values, claimed_units: result.units, worker: &result.worker };
                    check(answer).map_err(bad)?;
                    self.telemetry.task_done(result.seconds);
                    answers.insert(group, values);
                    on_result(answers.len(), total);
                }
                Some(TaskEvent::Requeued { task_id, worker }) => {
                    tracing::warn!(task = task_id, worker, "worker lost mid-round; its partitions are redone");
                }
                Some(TaskEvent::Failed { task_id, worker, error }) => {
                    return Err(JobError::Task { worker, task_id, error });
                }
                None => return Err(JobError::SchedulerStopped),
            }
        }
        let mut sum = vec![0.0; round.len];
        for values in answers.values() {
            sum.iter_mut().zip(values).for_each(|(s, v)| *s += v);
        }
        Ok(Private::new(sum))
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
