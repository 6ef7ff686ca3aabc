//! The coordinator's side of distributed DP-SGD: per round, broadcast the weights, collect
//! every partition's clipped gradient sum, check it, release it with the charged noise,
//! divide by the expected batch and step the optimizer on the f64 master copy.
//!
//! A worker lost mid-round only delays the round: its task goes back to the queue with a
//! new attempt and another worker takes the partition over; the round's noise is drawn
//! once all sums are in, so nothing about an incomplete round is ever released.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use dpsynth_privacy::ledger::ChargeReceipt;
use dpsynth_privacy::release::{Private, Releases};
use dpsynth_shared::dpsgd::optimizer::Optimizer;
use dpsynth_shared::dpsgd::{self, RoundSettings};
use dpsynth_shared::entropy::os_seed;

use crate::checkpoint::Checkpointer;
use crate::job::{JobError, ProgressHandle};
use crate::scheduler::{Scheduler, TaskDef, TaskEvent};
use crate::telemetry::Telemetry;

/// A planned DP-SGD run (its privacy cost is already charged).
pub struct TrainingRun<'a> {
    pub job_id: &'a str,
    pub partitions: &'a [String],
    /// Units in each partition: they bound a worker's claim of how many it sampled.
    pub partition_units: &'a Private<Vec<u64>>,
    /// The run's charge: it pays for every round's noise.
    pub receipt: &'a ChargeReceipt,
    pub rate: f64,
    pub clip: f64,
    pub noise_multiplier: f64,
    /// q·N̂: the divisor of every noisy sum.
    pub expected_batch: f64,
    pub micro_batch: usize,
    pub steps: u64,
    /// ε charged for the whole run (progress reports).
    pub epsilon: f64,
}

/// Trains `parameters` in place from `optimizer.step` to `run.steps`.
/// `task_params(settings, weights)` encodes one round's task; `checkpointer` saves the
/// run every so many rounds.
#[allow(clippy::too_many_arguments)]
pub async fn train(
    run: &TrainingRun<'_>,
    parameters: &mut [f64],
    optimizer: &mut Optimizer,
    task_params: impl Fn(&RoundSettings, &[f32]) -> Vec<u8>,
    checkpointer: &Checkpointer<'_>,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: &ProgressHandle,
) -> Result<(), JobError> {
    let mut releases = Releases::paid_by(run.receipt)?;
    releases.resume_after(optimizer.step)?;
    let started = Instant::now();
    let first_step = optimizer.step;
    let mut last_report = Instant::now();
    let mut events = None;
    let p = run.partitions.len();
    while optimizer.step < run.steps {
        let round = optimizer.step;
        let seed = os_seed()?;
        let settings = RoundSettings { round, rate: run.rate, clip: run.clip, seed, micro_batch: run.micro_batch };
        let weights: Vec<f32> = parameters.iter().map(|&v| v as f32).collect();
        let params = Arc::new(task_params(&settings, &weights));
        let tasks: Vec<TaskDef> = run
            .partitions
            .iter()
            .enumerate()
            .map(|(i, url)| TaskDef {
                job_id: run.job_id.to_string(),
                task_id: round * p as u64 + i as u64,
                kind: dpsgd::TASK_KIND.to_string(),
                params: params.clone(),
                partition_urls: vec![url.clone()],
            })
            .collect();
        let rx = scheduler.submit_round(run.job_id, tasks, &mut events);
        let mut sums: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        while sums.len() < p {
            match rx.recv().await {
                Some(TaskEvent::Done(mut result)) => {
                    let Some(index) = result.tensors.iter().position(|(n, _)| n == "gradient_sum") else {
                        return Err(bad(&result.worker, result.task_id, "no 'gradient_sum' tensor".into()));
                    };
                    let sum = result.tensors.swap_remove(index).1;
                    if result.task_id / p as u64 != round {
                        return Err(bad(&result.worker, result.task_id, "a result for another round".into()));
                    }
                    run.partition_units
                        .check(|units| {
                            let units = result.units.min(units[(result.task_id % p as u64) as usize]);
                            dpsgd::validate(&sum, units, parameters.len(), run.clip)
                        })
                        .map_err(|reason| bad(&result.worker, result.task_id, reason))?;
                    telemetry.task_done(result.seconds);
                    sums.insert(result.task_id, sum);
                }
                Some(TaskEvent::Requeued { task_id, worker }) => {
                    tracing::warn!(task = task_id, worker, round, "worker lost mid-round; its partition is redone");
                }
                Some(TaskEvent::Failed { task_id, worker, error }) => {
                    return Err(JobError::Task { worker, task_id, error });
                }
                None => return Err(JobError::Other("scheduler stopped".into())),
            }
        }
        // In task order: the same sum on any cluster.
        let mut gradient = vec![0.0; parameters.len()];
        for sum in sums.values() {
            gradient.iter_mut().zip(sum).for_each(|(g, s)| *g += s);
        }
        let mut gradient = releases.dp_sgd_step(Private::new(gradient), run.clip, run.noise_multiplier)?;
        gradient.iter_mut().for_each(|g| *g /= run.expected_batch);
        optimizer.step(parameters, &gradient);
        checkpointer.after_round(optimizer, parameters).await?;

        let done = optimizer.step;
        {
            let mut progress = progress.lock().unwrap_or_else(|e| e.into_inner());
            progress.tasks_done = done as u32;
        }
        if last_report.elapsed().as_secs_f64() >= 5.0 || done == run.steps {
            last_report = Instant::now();
            let per_round = started.elapsed().as_secs_f64() / (done - first_step) as f64;
            let eta_s = (per_round * (run.steps - done) as f64).round();
            tracing::info!(round = done, rounds = run.steps, eta_s, epsilon_charged = run.epsilon, "DP-SGD progress");
        }
    }
    scheduler.cancel(run.job_id);
    Ok(())
}

fn bad(worker: &str, task_id: u64, reason: String) -> JobError {
    JobError::BadResult { worker: worker.to_string(), task_id, reason }
}
