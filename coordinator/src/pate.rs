//! The coordinator's side of PATE: per iteration, generate the teachers' fake rows and
//! the queries, collect every task's vote counts, check them, add the GNMax noise (here
//! and only here), release the labels to the student, then train the student and the
//! generator on everything released so far.
//!
//! The whole run is charged before the first iteration (`PatePlan::mechanisms`), so the
//! number of answered queries is fixed in advance by the data-independent cost. A worker
//! lost mid-iteration only delays it: its task is requeued, and the noise is drawn once
//! all counts are in, so nothing is answered twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use dpsynth_shared::dpsgd::encode_task;
use dpsynth_shared::generators::pate::gan::PateGan;
use dpsynth_shared::generators::pate::{self, PatePlan, VoteTask, release, validate_votes};
use dpsynth_shared::privacy::noise::{Noise, os_seed};

use crate::job::{JobError, ProgressHandle};
use crate::scheduler::{Scheduler, TaskDef, TaskEvent};
use crate::telemetry::Telemetry;

/// A planned PATE run (its privacy cost is already charged).
pub struct VoteRun<'a> {
    pub job_id: &'a str,
    pub partitions: &'a [String],
    pub plan: &'a PatePlan,
    /// ε charged for the whole run (progress reports).
    pub epsilon: f64,
}

/// What the run released, for the manifest and logs.
pub struct VoteSummary {
    pub answered: u64,
    /// Share of answers that came out "real".
    pub real_share: f64,
}

/// Runs every planned iteration; returns the trained models.
pub async fn train(
    run: &VoteRun<'_>,
    mut gan: PateGan,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: &ProgressHandle,
) -> Result<(PateGan, VoteSummary), JobError> {
    let plan = run.plan;
    let params = &plan.params;
    let (fake_rows, queries) = (params.fake_rows as usize, params.queries_per_iteration as usize);
    let width = plan.encoding.width;
    let groups: Vec<&[String]> = run.partitions.chunks(params.teachers_per_task as usize).collect();
    let mut noise = Noise::from_os()?;
    let mut released_x: Vec<f32> = Vec::with_capacity(plan.queries() as usize * width);
    let mut released_y: Vec<f32> = Vec::with_capacity(plan.queries() as usize);
    let mut events = None;
    let started = Instant::now();
    for iteration in 0..plan.iterations {
        let round_started = Instant::now();
        let (back, generated) = blocking(move || {
            let mut generated = gan.sample(fake_rows);
            generated.extend(gan.queries(queries));
            (gan, generated)
        })
        .await?;
        gan = back;
        let header = VoteTask {
            encoding: plan.encoding.clone(),
            teacher: plan.teacher_config(),
            seed: os_seed()?,
            fake_rows,
            queries,
        };
        let task_params = Arc::new(encode_task(&header, &generated));
        let first_task = u64::from(iteration) * groups.len() as u64;
        let tasks: Vec<TaskDef> = groups
            .iter()
            .enumerate()
            .map(|(i, urls)| TaskDef {
                job_id: run.job_id.to_string(),
                task_id: first_task + i as u64,
                kind: pate::TASK_KIND.to_string(),
                params: task_params.clone(),
                partition_urls: urls.to_vec(),
            })
            .collect();
        let rx = scheduler.submit_round(run.job_id, tasks, &mut events);
        let mut counts: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        while counts.len() < groups.len() {
            match rx.recv().await {
                Some(TaskEvent::Done(mut result)) => {
                    let bad = |reason: String| JobError::BadResult {
                        worker: result.worker.clone(),
                        task_id: result.task_id,
                        reason,
                    };
                    let Some(index) = result.tensors.iter().position(|(n, _)| n == "real_votes") else {
                        return Err(bad("no 'real_votes' tensor".into()));
                    };
                    let teachers = result
                        .task_id
                        .checked_sub(first_task)
                        .and_then(|i| groups.get(i as usize))
                        .ok_or_else(|| bad("a result for a task of another iteration".into()))?
                        .len();
                    let votes = result.tensors.swap_remove(index).1;
                    validate_votes(&votes, queries, teachers, params.vote).map_err(bad)?;
                    telemetry.task_done(result.seconds);
                    counts.insert(result.task_id, votes);
                }
                Some(TaskEvent::Requeued { task_id, worker }) => {
                    tracing::warn!(
                        task = task_id,
                        worker,
                        iteration,
                        "worker lost mid-iteration; its teachers vote again"
                    );
                }
                Some(TaskEvent::Failed { task_id, worker, error }) => {
                    return Err(JobError::Task { worker, task_id, error });
                }
                None => return Err(JobError::Other("scheduler stopped".into())),
            }
        }
        // Summed in task order: the same on any cluster.
        let mut real = vec![0.0; queries];
        for votes in counts.values() {
            real.iter_mut().zip(votes).for_each(|(r, v)| *r += v);
        }
        // The release (charged before the first iteration).
        released_y.extend(release(&real, plan.teachers, plan.sigma, plan.params.release, &mut noise));
        released_x.extend_from_slice(&generated[fake_rows * width..]);

        let voted = round_started.elapsed().as_secs_f64();
        // Teachers judge against the current generator: older answers go stale as it moves.
        let recent = released_y.len().min(params.student_window as usize * queries);
        let x = Arc::new(released_x[(released_y.len() - recent) * width..].to_vec());
        let y = Arc::new(released_y[released_y.len() - recent..].to_vec());
        let (back, losses) = blocking(move || {
            let losses = gan.fit_round(&x, &y);
            (gan, losses)
        })
        .await?;
        gan = back;

        let done = iteration + 1;
        progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_done = done;
        let eta_s = (started.elapsed().as_secs_f64() / f64::from(done) * f64::from(plan.iterations - done)).round();
        tracing::info!(
            iteration = done,
            iterations = plan.iterations,
            answered = released_y.len(),
            epsilon_charged = run.epsilon,
            student_loss = losses.0,
            generator_loss = losses.1,
            vote_s = voted,
            train_s = round_started.elapsed().as_secs_f64() - voted,
            eta_s,
            "PATE progress"
        );
    }
    scheduler.cancel(run.job_id);
    let answered = released_y.len() as u64;
    let real_share = released_y.iter().map(|&y| f64::from(y)).sum::<f64>() / answered.max(1) as f64;
    Ok((gan, VoteSummary { answered, real_share }))
}

/// Runs model work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, JobError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| JobError::Other(e.to_string()))
}
