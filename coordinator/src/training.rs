//! The coordinator's side of distributed DP-SGD: per round, broadcast the weights, collect
//! every partition's clipped gradient sum, check it, release it with the charged noise,
//! divide by the expected batch and step the optimizer on the f64 master copy.
//!
//! A worker lost mid-round only delays the round: its task goes back to the queue with a
//! new attempt and another worker takes the partition over; the round's noise is drawn
//! once all sums are in, so nothing about an incomplete round is ever released.

use std::time::Instant;

use rhosynth_privacy::release::Releases;
use rhosynth_proto::task::Work;
use rhosynth_shared::dpsgd::optimizer::Optimizer;
use rhosynth_shared::dpsgd::run::RunParams;
use rhosynth_shared::dpsgd::{self, RoundSettings};
use rhosynth_shared::entropy::os_seed;

use crate::checkpoint::Checkpointer;
use crate::context::{JobContext, JobError, Partitions};
use crate::gather::{Answer, Gather, Round};

/// A planned DP-SGD run (its privacy cost is already charged).
pub struct TrainingRun<'a> {
    /// Units in each partition bound a worker's claim of how many it sampled.
    pub partitions: &'a Partitions,
    /// The run's one allowance: it pays for every round's noise.
    pub releases: &'a mut Releases,
    /// The run table: the clip and the micro-batch.
    pub settings: &'a RunParams,
    pub rate: f64,
    pub noise_multiplier: f64,
    /// q·N̂: the divisor of every noisy sum.
    pub expected_batch: f64,
    pub steps: u64,
    /// ε charged for the whole run (progress reports).
    pub epsilon: f64,
}

/// Trains `parameters` in place from `optimizer.step` to `run.steps` (the run's releases
/// already spent for the steps before it) through the job's
/// `gather` (its task ids continue across every round of the job); `model(round)` is
/// the model the workers train in that round, `checkpointer` saves the run every so many
/// rounds.
pub async fn train<M: Clone + serde::Serialize>(
    ctx: &JobContext<'_>,
    gather: &mut Gather<'_>,
    run: &mut TrainingRun<'_>,
    parameters: &mut [f64],
    optimizer: &mut Optimizer,
    model: impl Fn(u64) -> String,
    checkpointer: &Checkpointer<'_, M>,
) -> Result<(), JobError> {
    let started = Instant::now();
    let first_step = optimizer.step;
    let mut last_report = Instant::now();
    let groups = &run.partitions.groups;
    while optimizer.step < run.steps {
        let round = optimizer.step;
        let seed = os_seed()?;
        let settings = RoundSettings::new(round, run.rate, run.settings.clip, seed, run.settings.micro_batch)
            .map_err(|e| JobError::Internal(e.to_string()))?;
        let weights: Vec<f32> = parameters.iter().map(|&v| v as f32).collect();
        let round_tasks = Round {
            work: Work::GradientSum(ctx.spec().generator.name().gradient_sum(&settings, model(round), weights)),
            groups,
            tensor: "gradient_sum",
            len: parameters.len(),
        };
        // A partition's own unit count caps the worker's claim of how many it sampled.
        let check = |a: Answer<'_>| {
            run.partitions.units_per_partition.check(|units| {
                dpsgd::validate(a.values, a.claimed_units.min(units[a.group]), a.values.len(), run.settings.clip)
            })
        };
        let gradient = gather.round(round_tasks, check, |_, _| {}).await?;
        let mut gradient = run.releases.dp_sgd_step(gradient, run.settings.clip, run.noise_multiplier, run.rate)?;
        gradient.iter_mut().for_each(|g| *g /= run.expected_batch);
        optimizer.step(parameters, &gradient);
        checkpointer.after_round(optimizer, parameters).await?;

        let done = optimizer.step;
        ctx.progress_mut().tasks_done = done as u32;
        if last_report.elapsed().as_secs_f64() >= 5.0 || done == run.steps {
            last_report = Instant::now();
            let per_round = started.elapsed().as_secs_f64() / (done - first_step) as f64;
            let eta_s = (per_round * (run.steps - done) as f64).round();
            tracing::info!(round = done, rounds = run.steps, eta_s, epsilon_charged = run.epsilon, "DP-SGD progress");
        }
    }
    Ok(())
}
