//! Task execution: one function per kind of work, each returning a bounded aggregate.
//!
//! DP-SGD rounds keep the worker's encoded partitions and model in memory between rounds
//! (raw rows stay here), and run the model on a blocking thread.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dpsynth_proto::gradient_sum::Model;
use dpsynth_proto::task::Work;
use dpsynth_proto::{CountTables, GradientSum, Task, TeacherVotes};
use dpsynth_shared::data::DataError;
use dpsynth_shared::data::examples::Examples;
use dpsynth_shared::data::partition::read_partition;
use dpsynth_shared::dpsgd::params::TrainableLayers;
use dpsynth_shared::dpsgd::{self, RoundSettings, compute_device};
use dpsynth_shared::entropy::os_rng;
use dpsynth_shared::generators::findiff::{FinDiffModel, FinDiffRound};
use dpsynth_shared::generators::marginals::MarginalsTask;
use dpsynth_shared::generators::pate::VoteTask;

/// Named f64 tensors plus the number of privacy units that contributed (for a vote
/// round: the number of teachers).
pub struct Aggregate {
    pub units: u64,
    pub tensors: Vec<(String, Vec<f64>)>,
}

/// State a worker keeps for the job it is training: its examples per partition and the
/// model (rebuilt only when the job changes).
#[derive(Default)]
pub struct Executor {
    job: String,
    examples: HashMap<String, Arc<Examples>>,
    model: Option<Arc<Mutex<FinDiffModel>>>,
}

impl Executor {
    pub async fn execute(&mut self, task: &Task) -> anyhow::Result<Aggregate> {
        match &task.work {
            Some(Work::CountTables(work)) => count_tables(task, work).await,
            Some(Work::GradientSum(work)) => self.gradient_sum(task, work).await,
            Some(Work::TeacherVotes(work)) => self.teacher_votes(task, work).await,
            None => anyhow::bail!("a task with no work this worker knows: the worker is older than its coordinator"),
        }
    }

    /// The task's partitions, loaded once per job (`load` encodes one partition).
    async fn partitions<F, Fut>(&mut self, task: &Task, load: F) -> anyhow::Result<Vec<Arc<Examples>>>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<Examples, DataError>>,
    {
        if self.job != task.job_id {
            // A new job: forget the previous one's rows and model.
            *self = Executor { job: task.job_id.clone(), ..Executor::default() };
        }
        let mut parts = Vec::new();
        for url in &task.partition_urls {
            if !self.examples.contains_key(url) {
                let examples = load(url.clone()).await?;
                tracing::info!(partition = url, "partition loaded");
                self.examples.insert(url.clone(), Arc::new(examples));
            }
            parts.push(self.examples[url].clone());
        }
        Ok(parts)
    }

    /// One PATE vote round: each partition's teacher fit and voting; the vote counts per
    /// query (per target value for label questions) summed over the task's teachers.
    async fn teacher_votes(&mut self, task: &Task, work: &TeacherVotes) -> anyhow::Result<Aggregate> {
        let round = Arc::new(VoteTask::try_from(work)?);
        let generated = work.rows.clone();
        let parts = {
            let round = round.clone();
            self.partitions(task, move |url| {
                let round = round.clone();
                async move { round.load_examples(&[url]).await }
            })
            .await?
        };
        let urls = task.partition_urls.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<Aggregate> {
            let mut votes = vec![0f64; round.queries * round.votes_per_query()];
            for (url, real) in urls.iter().zip(&parts) {
                let teacher = round.teacher_votes(url, real, &generated).map_err(anyhow::Error::msg)?;
                votes.iter_mut().zip(teacher).for_each(|(v, t)| *v += t);
            }
            Ok(Aggregate { units: urls.len() as u64, tensors: vec![("votes".to_string(), votes)] })
        })
        .await?
    }

    /// One DP-SGD round over the task's partitions: the clipped gradient sum.
    async fn gradient_sum(&mut self, task: &Task, work: &GradientSum) -> anyhow::Result<Aggregate> {
        let settings = RoundSettings::try_from(work)?;
        let round = match &work.model {
            Some(Model::Findiff(model)) => FinDiffRound::try_from(model)?,
            None => anyhow::bail!("a DP-SGD round with no model this worker knows: it is older than its coordinator"),
        };
        let parameters = work.weights.clone();
        let model_spec = Arc::new(round.model.clone());
        let parts = self
            .partitions(task, move |url| {
                let spec = model_spec.clone();
                async move { spec.load_examples(&[url]).await }
            })
            .await?;
        let device = compute_device();
        let model = match &self.model {
            Some(m) => m.clone(),
            None => {
                let m = Arc::new(Mutex::new(FinDiffModel::new(&round.model, &device)));
                self.model = Some(m.clone());
                m
            }
        };
        tokio::task::spawn_blocking(move || -> anyhow::Result<Aggregate> {
            let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
            model.load_parameters(&parameters)?;
            model.set_timestep_exponent(round.timestep_exponent);
            // Which units are sampled is private randomness: OS-keyed CSPRNG.
            let mut rng = os_rng()?;
            let mut sum = vec![0f64; model.parameter_count()];
            let mut units = 0;
            for examples in &parts {
                let c = dpsgd::contribute(&*model, examples, &settings, &mut rng, &device)?;
                sum.iter_mut().zip(&c.sum).for_each(|(s, v)| *s += v);
                units += c.units;
            }
            Ok(Aggregate { units, tensors: vec![("gradient_sum".to_string(), sum)] })
        })
        .await?
    }
}

/// Contingency tables of bounded per-unit contributions over the task's partitions.
async fn count_tables(task: &Task, work: &CountTables) -> anyhow::Result<Aggregate> {
    let spec = MarginalsTask::try_from(work)?;
    let mut counter = spec.counter()?;
    for url in &task.partition_urls {
        read_partition(url, &spec.domain, |batch| {
            counter.add(&batch);
            Ok(())
        })
        .await?;
    }
    let (counts, units) = counter.finish();
    Ok(Aggregate { units, tensors: vec![("counts".to_string(), counts)] })
}
