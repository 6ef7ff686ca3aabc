//! PATE-TabTransGAN on the coordinator: per iteration, generate the teachers' fake rows
//! and the queries, collect every task's vote counts, check them, release them with the
//! charged noise (GNMax), read the labels off the noisy counts for the student, then
//! train the student and the generator on the recent answers. After the last iteration,
//! the label queries: the teachers' target classifiers vote on rows drawn as the output
//! is, and a label model is fit to the noisy histograms.
//!
//! The whole run is charged before the first iteration (`PatePlan::mechanisms`), so the
//! number of answered queries is fixed in advance by the data-independent cost. A worker
//! lost mid-iteration only delays it: its task is requeued, and the noise is drawn once
//! all counts are in, so nothing is answered twice.

use std::sync::Arc;
use std::time::Instant;

use rhosynth_privacy::ledger::Ledger;
use rhosynth_privacy::release::{Private, Releases};
use rhosynth_proto::task::Work;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::entropy::os_seed;
use rhosynth_shared::generators::pate::PateRelease;
use rhosynth_shared::generators::pate::answers::{
    Threshold, label_shares, largest_votes, realness_answers, realness_votes,
};
use rhosynth_shared::generators::pate::gan::PateGan;
use rhosynth_shared::generators::pate::task::validate_votes;
use rhosynth_shared::generators::pate::teacher::TargetModel;
use rhosynth_shared::generators::pate::{PatePlan, PateSampler, Question, VoteTask};

use super::{Admission, Charged, Draws, Fitted, Generator, calibration};
use crate::context::{JobContext, JobError, Partitions, blocking, release_count, set_stage};
use crate::gather::{Answer, Gather, Round};

/// A planned PATE run (its privacy cost is already charged).
struct VoteRun<'a> {
    partitions: &'a [String],
    plan: &'a PatePlan,
    /// ε charged for the whole run (progress reports).
    epsilon: f64,
}

/// What the run released, for the manifest and logs.
struct VoteSummary {
    /// Answers released: all of the plan's queries without a confidence threshold, those
    /// that cleared it with one.
    released: u64,
    /// Share of real-or-generated answers that came out "real".
    real_share: f64,
}

/// Runs every planned iteration, then the label queries; returns the trained models (the
/// label model when the plan has label queries).
async fn train<'a>(
    ctx: &JobContext<'a>,
    gather: &mut Gather<'a>,
    run: &VoteRun<'_>,
    releases: &mut Releases,
    mut gan: PateGan,
) -> Result<(PateGan, Option<TargetModel>, VoteSummary), JobError> {
    let plan = run.plan;
    let params = &plan.params;
    let (fake_rows, queries) = (params.fake_rows as usize, params.queries_per_iteration as usize);
    let width = plan.encoding.width;
    let mut rounds = VoteRounds {
        plan,
        gather,
        groups: run.partitions.chunks(params.teachers_per_task as usize).map(<[String]>::to_vec).collect(),
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
        let real = rounds.ask(Question::Realness, fake_rows, &generated).await?;
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
        ctx.progress_mut().tasks_done = done;
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
            let counts = rounds.ask(Question::Target, 0, &queries).await?;
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
            ctx.progress_mut().tasks_done = plan.iterations + 1;
            tracing::info!(labels = n, epsilon_charged = run.epsilon, "PATE target labels released");
            model
        }
    };
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
struct VoteRounds<'p, 'g, 'a> {
    plan: &'p PatePlan,
    gather: &'g mut Gather<'a>,
    groups: Vec<Vec<String>>,
}

impl VoteRounds<'_, '_, '_> {
    /// One round: every group of teachers answers `question` on `generated` (`fake_rows`
    /// rows to train against, then the queries); returns the vote counts summed over all
    /// teachers, each task's counts checked.
    async fn ask(
        &mut self,
        question: Question,
        fake_rows: usize,
        generated: &[f32],
    ) -> Result<Private<Vec<f64>>, JobError> {
        let plan = self.plan;
        let header = VoteTask {
            encoding: plan.encoding.clone(),
            teacher: plan.teacher_config(),
            seed: os_seed()?,
            question,
            fake_rows,
            queries: generated.len() / plan.encoding.width - fake_rows,
        };
        let len = header.queries * header.votes_per_query();
        let round = Round {
            work: Work::TeacherVotes(header.task(generated.to_vec())),
            groups: &self.groups,
            tensor: "votes",
            len,
        };
        let groups = &self.groups;
        let check = |a: Answer<'_>| validate_votes(a.values, len, groups[a.group].len(), header.whole_votes());
        self.gather.round(round, check, |_, _| {}).await
    }
}

/// PATE-TabTransGAN: the plan fixes σ and how many iterations of queries the job's ε pays
/// for (data-independent GNMax cost); all of it, and the unit count when the output is
/// sized by it, is charged before the first vote is aggregated. Teachers vote on the
/// workers; the noisy labels train the student and generator here; the generator is
/// sampled into the output.
pub struct Pate {
    plan: PatePlan,
}

impl Generator for Pate {
    async fn plan(ctx: &JobContext<'_>, ledger: &Ledger) -> Result<Self, JobError> {
        Ok(Self { plan: PatePlan::new(ctx.spec(), ctx.domain, ledger.options())? })
    }

    fn admission(&self) -> Admission {
        Admission::Cost(self.plan.mechanisms())
    }

    async fn fit(self, ctx: &JobContext<'_>, ledger: &mut Ledger, partitions: &Partitions) -> Result<Fitted, JobError> {
        let plan = self.plan;
        tracing::info!(
            teachers = plan.teachers,
            sigma = plan.sigma,
            iterations = plan.iterations,
            queries = plan.queries(),
            "PATE plan: the job's ε pays for this many answered queries"
        );
        let mechanisms = plan.mechanisms();
        let receipt = ctx.charge(ledger, &ctx.charge_request(mechanisms.clone())).await?;
        let mut releases = Releases::paid_by(&receipt)?;
        let mut public_inputs = Vec::new();
        // The plan charged the unit count only when the spec does not size the output.
        let released_rows = if plan.count {
            let noise = plan.params.count_noise_multiplier;
            let noisy_units = release_count(&mut releases, partitions, noise)?;
            public_inputs
                .push(format!("privacy units: {noisy_units} (Gaussian release, noise multiplier {noise}; charged)"));
            Some(noisy_units as u64)
        } else {
            None
        };

        let mut gather = ctx.gather();
        set_stage(ctx.progress, "teachers voting (PATE)");
        // The label queries are one more round of tasks.
        ctx.progress_mut().tasks_total = plan.iterations + u32::from(plan.label_queries > 0);
        let gan = PateGan::new(plan.encoding.clone(), plan.params.clone(), compute_device().autodiff(), os_seed()?);
        let run =
            VoteRun { partitions: &partitions.groups.concat(), plan: &plan, epsilon: receipt.admission.cost.epsilon };
        let (gan, labels, summary) = train(ctx, &mut gather, &run, &mut releases, gan).await?;
        let calibration =
            calibration::release(ctx, &mut gather, partitions, &mut releases, plan.calibration.as_ref()).await?;
        tracing::info!(
            asked = plan.queries(),
            released = summary.released,
            real_share = summary.real_share,
            "PATE training done"
        );
        let threshold = match plan.threshold {
            Some(Threshold { count: t, sigma: s }) => format!(
                "; confident GNMax (threshold {t} teachers, σ₁ = {s}): each query charged as answered, {} cleared the threshold and were released",
                summary.released
            ),
            None => String::new(),
        };
        public_inputs.push(format!(
            "PATE: {} teachers, GNMax σ = {} on the vote counts, {} answered queries ({} iterations × {} real-or-generated, {} target labels){threshold}",
            plan.teachers,
            plan.sigma,
            plan.queries(),
            plan.iterations,
            plan.params.queries_per_iteration,
            plan.label_queries
        ));
        let sampler = Box::new(PateSampler { gan, labels, encoding: plan.encoding });
        let sampler = calibration::apply(calibration, sampler, &mut public_inputs);
        let cost = receipt.admission.cost.clone();
        Ok(Fitted {
            sampler: Draws::Table(sampler),
            released_count: released_rows,
            charged: Charged { receipt, cost, mechanisms, public_inputs },
        })
    }
}
