//! The coordinator's side of PATE: per iteration, generate the teachers' fake rows and
//! the queries, collect every task's vote counts, check them, release them with the
//! charged noise (GNMax), read the labels off the noisy counts for the student, then train the student and the
//! generator on the recent answers. After the last iteration, the label queries: the
//! teachers' target classifiers vote on rows drawn as the output is, and a label model is
//! fit to the noisy histograms.
//!
//! The whole run is charged before the first iteration (`PatePlan::mechanisms`), so the
//! number of answered queries is fixed in advance by the data-independent cost. A worker
//! lost mid-iteration only delays it: its task is requeued, and the noise is drawn once
//! all counts are in, so nothing is answered twice.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use dpsynth_privacy::release::{Private, Releases};
use dpsynth_shared::dpsgd::encode_task;
use dpsynth_shared::entropy::os_seed;
use dpsynth_shared::generators::pate::gan::PateGan;
use dpsynth_shared::generators::pate::teacher::TargetModel;
use dpsynth_shared::generators::pate::{
    self, PatePlan, Question, VoteTask, label_shares, largest_votes, realness_answers, realness_votes, validate_votes,
};
use dpsynth_shared::spec::PateRelease;
use tokio::sync::mpsc;

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
    /// Answers released: all of the plan's queries without a confidence threshold, those
    /// that cleared it with one.
    pub released: u64,
    /// Share of real-or-generated answers that came out "real".
    pub real_share: f64,
}

/// Runs every planned iteration, then the label queries; returns the trained models (the
/// label model when the plan has label queries).
pub async fn train(
    run: &VoteRun<'_>,
    releases: &mut Releases,
    mut gan: PateGan,
    scheduler: &Scheduler,
    telemetry: &Telemetry,
    progress: &ProgressHandle,
) -> Result<(PateGan, Option<TargetModel>, VoteSummary), JobError> {
    let plan = run.plan;
    let params = &plan.params;
    let (fake_rows, queries) = (params.fake_rows as usize, params.queries_per_iteration as usize);
    let width = plan.encoding.width;
    let mut rounds = VoteRounds {
        run,
        scheduler,
        telemetry,
        groups: run.partitions.chunks(params.teachers_per_task as usize).collect(),
        events: None,
        next_task: 0,
    };
    let mut released_x: Vec<f32> = Vec::with_capacity(plan.queries() as usize * width);
    let mut released_y: Vec<f32> = Vec::with_capacity(plan.queries() as usize);
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
        let real = rounds.ask(Question::Realness, fake_rows, &generated, iteration).await?;
        let keep = confidence(plan, releases, real.map(|r| largest_votes(r, 1, plan.teachers)), queries)?;
        // The release (charged before the first iteration).
        let how = plan.params.release;
        let votes = real.map(|r| realness_votes(r, plan.teachers, how));
        let noisy = match how {
            PateRelease::Label => releases.gnmax(votes, 2, plan.sigma)?,
            PateRelease::VoteShare => releases.gaussian_each(votes, 1.0, plan.share_noise())?,
        };
        let answers = realness_answers(&noisy, plan.teachers, how);
        for (i, answer) in answers.into_iter().enumerate().filter(|(i, _)| keep[*i]) {
            released_y.push(answer);
            released_x.extend_from_slice(&generated[(fake_rows + i) * width..(fake_rows + i + 1) * width]);
        }

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
            released = released_y.len(),
            epsilon_charged = run.epsilon,
            student_loss = losses.0,
            generator_loss = losses.1,
            vote_s = voted,
            train_s = round_started.elapsed().as_secs_f64() - voted,
            eta_s,
            "PATE progress"
        );
    }
    let mut labelled = 0;
    let labels = match (plan.label_queries, plan.encoding.target_classes()) {
        (0, _) | (_, None) => None,
        (n, Some(classes)) => {
            // Label queries are drawn as the output will be: the label model is fit where
            // it is used.
            let n = n as usize;
            let (back, queries) = blocking(move || {
                let queries = gan.sample_output(n);
                (gan, queries)
            })
            .await?;
            gan = back;
            let counts = rounds.ask(Question::Target, 0, &queries, plan.iterations).await?;
            let keep = confidence(plan, releases, counts.map(|c| largest_votes(c, classes, plan.teachers)), n)?;
            let shares = label_shares(&releases.gnmax(counts, classes as u32, plan.sigma)?, classes);
            let w = plan.encoding.width;
            let (queries, shares): (Vec<f32>, Vec<f64>) = {
                let kept = (0..n).filter(|&i| keep[i]);
                (
                    kept.clone().flat_map(|i| queries[i * w..(i + 1) * w].iter().copied()).collect(),
                    kept.flat_map(|i| shares[i * classes..(i + 1) * classes].iter().copied()).collect(),
                )
            };
            labelled = shares.len() as u64 / classes as u64;
            let (encoding, config) = (plan.encoding.clone(), plan.teacher_config());
            let model = blocking(move || TargetModel::fit(&encoding, &config, &queries, &shares)).await?;
            progress.lock().unwrap_or_else(|e| e.into_inner()).tasks_done = plan.iterations + 1;
            tracing::info!(labels = n, epsilon_charged = run.epsilon, "PATE target labels released");
            model
        }
    };
    scheduler.cancel(run.job_id);
    let realness = released_y.len() as u64;
    let real_share = released_y.iter().map(|&y| f64::from(y)).sum::<f64>() / realness.max(1) as f64;
    let summary = VoteSummary { released: realness + labelled, real_share };
    Ok((gan, labels, summary))
}

/// Which queries clear the confidence threshold, from each one's largest vote count
/// released with the check's noise (all, without a threshold).
fn confidence(
    plan: &PatePlan,
    releases: &mut Releases,
    largest: Private<Vec<f64>>,
    queries: usize,
) -> Result<Vec<bool>, JobError> {
    Ok(match plan.threshold {
        Some(threshold) => threshold.clears(&releases.gaussian_each(largest, 1.0, threshold.sigma)?),
        None => vec![true; queries],
    })
}

/// Sends vote rounds to the teachers and collects their counts.
struct VoteRounds<'a> {
    run: &'a VoteRun<'a>,
    scheduler: &'a Scheduler,
    telemetry: &'a Telemetry,
    groups: Vec<&'a [String]>,
    events: Option<mpsc::UnboundedReceiver<TaskEvent>>,
    next_task: u64,
}

impl VoteRounds<'_> {
    /// One round: every group of teachers answers `question` on `generated` (`fake_rows`
    /// rows to train against, then the queries); returns the vote counts summed over all
    /// teachers, checked and in task order (the same on any cluster). A lost worker's task
    /// is requeued; nothing is released until every count is in.
    async fn ask(
        &mut self,
        question: Question,
        fake_rows: usize,
        generated: &[f32],
        iteration: u32,
    ) -> Result<Private<Vec<f64>>, JobError> {
        let plan = self.run.plan;
        let header = VoteTask {
            encoding: plan.encoding.clone(),
            teacher: plan.teacher_config(),
            seed: os_seed()?,
            question,
            fake_rows,
            queries: generated.len() / plan.encoding.width - fake_rows,
        };
        let expected = header.queries * header.votes_per_query();
        let task_params = Arc::new(encode_task(&header, generated));
        let first_task = self.next_task;
        self.next_task += self.groups.len() as u64;
        let tasks: Vec<TaskDef> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, urls)| TaskDef {
                job_id: self.run.job_id.to_string(),
                task_id: first_task + i as u64,
                kind: pate::TASK_KIND.to_string(),
                params: task_params.clone(),
                partition_urls: urls.to_vec(),
            })
            .collect();
        let rx = self.scheduler.submit_round(self.run.job_id, tasks, &mut self.events);
        let mut counts: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        while counts.len() < self.groups.len() {
            match rx.recv().await {
                Some(TaskEvent::Done(mut result)) => {
                    let bad = |reason: String| JobError::BadResult {
                        worker: result.worker.clone(),
                        task_id: result.task_id,
                        reason,
                    };
                    let Some(index) = result.tensors.iter().position(|(n, _)| n == "votes") else {
                        return Err(bad("no 'votes' tensor".into()));
                    };
                    let teachers = result
                        .task_id
                        .checked_sub(first_task)
                        .and_then(|i| self.groups.get(i as usize))
                        .ok_or_else(|| bad("a result for a task of another round".into()))?
                        .len();
                    let votes = result.tensors.swap_remove(index).1;
                    validate_votes(&votes, expected, teachers, header.whole_votes()).map_err(bad)?;
                    self.telemetry.task_done(result.seconds);
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
        let mut total = vec![0.0; expected];
        for votes in counts.values() {
            total.iter_mut().zip(votes).for_each(|(t, v)| *t += v);
        }
        Ok(Private::new(total))
    }
}

/// Runs model work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, JobError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| JobError::Other(e.to_string()))
}
