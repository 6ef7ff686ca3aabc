//! Task execution: one function per kind of work, each returning a bounded aggregate.
//!
//! DP-SGD rounds keep the worker's partitions (encoded rows or ordered histories) and
//! model in memory between rounds (raw rows stay here), and run the model on a blocking
//! thread.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use rhosynth_proto::task::Work;
use rhosynth_proto::{
    CountTables, GradientSum, HistoryStatistics, MergePartition, ReadShard, SelectionVotes, Task, TeacherVotes,
};
use rhosynth_shared::data::DataError;
use rhosynth_shared::data::EncodedBatch;
use rhosynth_shared::data::histories::{ValueRows, read_histories};
use rhosynth_shared::data::partition::{PartitionKey, PartitionReader};
use rhosynth_shared::data::shard::{self, Shard, ShardError, ShardJob};
use rhosynth_shared::dpsgd::trainable::{Trainable, WithTrainable};
use rhosynth_shared::dpsgd::{self, DpModel, RoundSettings, compute_device};
use rhosynth_shared::entropy::os_rng;
use rhosynth_shared::generators::GeneratorName;
use rhosynth_shared::generators::history_copula::HistoryStatisticsTask;
use rhosynth_shared::generators::marginals::MarginalsTask;
use rhosynth_shared::generators::pate::VoteTask;
use rhosynth_shared::generators::sequence::selection::SelectionTask;
use rhosynth_shared::wire::from_json;

/// Named f64 tensors plus the number of privacy units that contributed (for a vote
/// round: the number of teachers).
pub struct Aggregate {
    pub units: u64,
    pub tensors: Vec<(String, Vec<f64>)>,
}

/// State a worker keeps for the job it is training: its partitions as the job's rounds
/// read them, and the model (rebuilt only when the job changes).
#[derive(Default)]
pub struct Executor {
    job: String,
    partitions: HashMap<String, Arc<dyn Any + Send + Sync>>,
    model: Option<Arc<dyn Any + Send + Sync>>,
}

impl Executor {
    pub async fn execute(&mut self, task: &Task) -> anyhow::Result<Aggregate> {
        // Before any work reads the cached partitions or model: they may be another job's.
        self.enter_job(task);
        match &task.work {
            Some(Work::CountTables(work)) => count_tables(task, work).await,
            Some(Work::GradientSum(work)) => self.gradient_sum(task, work).await,
            Some(Work::TeacherVotes(work)) => self.teacher_votes(task, work).await,
            Some(Work::SelectionVotes(work)) => self.selection_votes(task, work).await,
            Some(Work::HistoryStatistics(work)) => self.history_statistics(task, work).await,
            Some(Work::ReadShard(work)) => read_shard(work).await,
            Some(Work::MergePartition(work)) => merge_partition(task, work).await,
            None => anyhow::bail!("a task with no work this worker knows: the worker is older than its coordinator"),
        }
    }

    /// Forgets the previous job's rows and model when a task of another job arrives.
    fn enter_job(&mut self, task: &Task) {
        if self.job != task.job_id {
            *self = Executor { job: task.job_id.clone(), ..Executor::default() };
        }
    }

    /// The task's partitions, loaded once per job (`load` reads one partition).
    async fn partitions<T, F, Fut>(&mut self, task: &Task, load: F) -> anyhow::Result<Vec<Arc<T>>>
    where
        T: Send + Sync + 'static,
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, DataError>>,
    {
        let mut parts = Vec::new();
        for url in &task.partition_urls {
            if !self.partitions.contains_key(url) {
                let loaded = load(url.clone()).await?;
                tracing::info!(partition = url, "partition loaded");
                self.partitions.insert(url.clone(), Arc::new(loaded));
            }
            let part = self.partitions[url].clone().downcast::<T>();
            parts.push(part.map_err(|_| anyhow::anyhow!("the job's rounds read partition {url} in two ways"))?);
        }
        Ok(parts)
    }

    /// The job's model, built on its first round.
    async fn model<M, F, Fut>(&mut self, build: F) -> anyhow::Result<Arc<Mutex<M>>>
    where
        M: Send + 'static,
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<M>>,
    {
        if self.model.is_none() {
            self.model = Some(Arc::new(Mutex::new(build().await?)));
        }
        let model = self.model.clone().expect("built above");
        model.downcast::<Mutex<M>>().map_err(|_| anyhow::anyhow!("the job's rounds train two kinds of model"))
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

    /// A private selection round: every unit's votes for its nearest candidates, summed
    /// over the task's partitions.
    async fn selection_votes(&mut self, task: &Task, work: &SelectionVotes) -> anyhow::Result<Aggregate> {
        let selection = Arc::new(SelectionTask::try_from(work)?);
        let parts = {
            let selection = selection.clone();
            self.partitions(task, move |url| {
                let selection = selection.clone();
                async move { selection.model.load_histories(&[url]).await }
            })
            .await?
        };
        tokio::task::spawn_blocking(move || {
            let mut total = vec![0f64; selection.candidate_count()];
            let mut units = 0;
            for histories in &parts {
                let (votes, voted) = selection.votes(histories);
                total.iter_mut().zip(votes).for_each(|(t, v)| *t += v);
                units += voted;
            }
            Ok(Aggregate { units, tensors: vec![("votes".to_string(), total)] })
        })
        .await?
    }

    /// A history copula round: each unit's bounded statistics, summed over the task's
    /// partitions (histories loaded once, read by both rounds).
    async fn history_statistics(&mut self, task: &Task, work: &HistoryStatistics) -> anyhow::Result<Aggregate> {
        let round = Arc::new(HistoryStatisticsTask::try_from(work)?);
        let parts = {
            let layout = round.layout.clone();
            self.partitions(task, move |url| {
                let layout = layout.clone();
                async move { read_histories::<ValueRows>(&[url], &layout.domain, &layout.value_layout()).await }
            })
            .await?
        };
        tokio::task::spawn_blocking(move || {
            let mut total = vec![0f64; round.len()];
            let mut units = 0;
            for histories in &parts {
                let (sum, counted) = round.sum(histories);
                total.iter_mut().zip(sum).for_each(|(t, v)| *t += v);
                units += counted;
            }
            Ok(Aggregate { units, tensors: vec![("statistics".to_string(), total)] })
        })
        .await?
    }

    /// One DP-SGD round over the task's partitions: the clipped gradient sum, of the
    /// model the named generator's rounds train.
    async fn gradient_sum(&mut self, task: &Task, work: &GradientSum) -> anyhow::Result<Aggregate> {
        let settings = RoundSettings::try_from(work)?;
        let unknown =
            || anyhow::anyhow!("a DP-SGD round of \"{}\", a model this worker does not train", work.generator);
        let generator: GeneratorName = work.generator.parse().map_err(|_| unknown())?;
        generator.with_trainable(Round { executor: self, task, work, settings }).ok_or_else(unknown)?.await
    }

    /// A DP-SGD round of model `T`: built on the job's first round, its partitions read once.
    async fn train<T: Trainable>(
        &mut self,
        task: &Task,
        work: &GradientSum,
        settings: RoundSettings,
    ) -> anyhow::Result<Aggregate> {
        let round: Arc<T> = Arc::new(from_json("DP-SGD model", &work.model_json)?);
        let device = compute_device();
        let model = self.model(|| async { Ok(round.build(&device).await?) }).await?;
        let parts = {
            let round = round.clone();
            self.partitions(task, move |url| {
                let round = round.clone();
                async move { round.load(&[url]).await }
            })
            .await?
        };
        let parameters = work.weights.clone();
        clipped_round(model, parts, parameters, settings, move |m| round.prepare(m)).await
    }
}

/// [`Executor::train`] of the round's model, whichever it is.
struct Round<'a> {
    executor: &'a mut Executor,
    task: &'a Task,
    work: &'a GradientSum,
    settings: RoundSettings,
}

impl<'a> WithTrainable for Round<'a> {
    type Output = Pin<Box<dyn Future<Output = anyhow::Result<Aggregate>> + Send + 'a>>;

    fn with<T: Trainable>(self) -> Self::Output {
        Box::pin(self.executor.train::<T>(self.task, self.work, self.settings))
    }
}

/// The clipped gradient sum of one round over `parts`, on a blocking thread: the
/// round's weights loaded (and `prepare`d) into the job's model, units Poisson-sampled
/// from an OS-keyed CSPRNG (which units are sampled is private randomness).
async fn clipped_round<M: DpModel + Send + 'static>(
    model: Arc<Mutex<M>>,
    parts: Vec<Arc<M::Examples>>,
    parameters: Vec<f32>,
    settings: RoundSettings,
    prepare: impl FnOnce(&mut M) + Send + 'static,
) -> anyhow::Result<Aggregate>
where
    M::Examples: Send + Sync + 'static,
{
    tokio::task::spawn_blocking(move || -> anyhow::Result<Aggregate> {
        let device = compute_device();
        let mut model = model.lock().unwrap_or_else(|e| e.into_inner());
        model.load_parameters(&parameters)?;
        prepare(&mut model);
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

/// Contingency tables of bounded per-unit contributions over the task's partitions.
/// Counting is CPU work (every row into every table): it runs on a blocking thread, fed a
/// batch at a time (a database view's units whole in each), so the runtime keeps heartbeating (a
/// standalone run shares it with the coordinator) however long the count takes, and a
/// table's partition is never held whole.
async fn count_tables(task: &Task, work: &CountTables) -> anyhow::Result<Aggregate> {
    let spec = Arc::new(MarginalsTask::try_from(work)?);
    let (batches, mut incoming) = tokio::sync::mpsc::channel::<EncodedBatch>(1);
    let counting = {
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<Aggregate> {
            let mut counter = spec.counter()?;
            while let Some(batch) = incoming.blocking_recv() {
                counter.add(&batch);
            }
            let (counts, units) = counter.finish();
            Ok(Aggregate { units, tensors: vec![("counts".to_string(), counts)] })
        })
    };
    // A database view reads one partition of every table at a time.
    let group = spec.database.as_ref().map_or(1, |view| view.layout.tables.len());
    if !task.partition_urls.len().is_multiple_of(group) {
        anyhow::bail!("{} partition files for a view of {group} tables", task.partition_urls.len());
    }
    // A send fails only when the counter stopped: its error is the task's.
    'partitions: for urls in task.partition_urls.chunks(group) {
        match &spec.database {
            Some(view) => {
                let mut reader = view.reader(urls).await?;
                while let Some(batch) = reader.next_batch().await? {
                    if batches.send(batch).await.is_err() {
                        break 'partitions;
                    }
                }
            }
            None => {
                let mut reader = PartitionReader::open(&urls[0], &spec.domain).await?;
                while let Some(batch) = reader.next_batch().await? {
                    if batches.send(batch).await.is_err() {
                        break 'partitions;
                    }
                }
            }
        }
    }
    drop(batches);
    counting.await?
}

/// One shard of the private input into its buckets (`data::shard`). An input that breaks
/// the schema fails the task as a [`ShardError::Input`], which the worker reports as such.
async fn read_shard(work: &ReadShard) -> anyhow::Result<Aggregate> {
    let job: ShardJob = from_json("the shard job", &work.job_json)?;
    let shard = Shard::try_from(work)?;
    let key = PartitionKey::from_bytes(&work.key)?;
    let counts = shard::read_shard(&job, &shard, work.shard, key).await?;
    Ok(Aggregate { units: 0, tensors: vec![("shard".to_string(), counts.to_tensor(&job))] })
}

/// Whether a task failed on its private input breaking the job's schema.
pub fn is_input_mismatch(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref::<ShardError>(), Some(ShardError::Input(_)))
}

/// The task's partition merged from its buckets, and its census (`data::shard`).
async fn merge_partition(task: &Task, work: &MergePartition) -> anyhow::Result<Aggregate> {
    let job: ShardJob = from_json("the shard job", &work.job_json)?;
    let [url] = task.partition_urls.as_slice() else {
        anyhow::bail!("a merge of {} partitions: one at a time", task.partition_urls.len());
    };
    let census = shard::merge_partition(&job, url, &work.shards).await?;
    Ok(Aggregate { units: census.units, tensors: vec![("census".to_string(), census.to_tensor())] })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rhosynth_shared::data::domain::{ColumnDomain, Domain, Encoding};
    use rhosynth_shared::data::partition::{PartitionKey, PartitionWriter};
    use rhosynth_shared::storage;
    use rhosynth_shared::testing::runtime_held;

    use super::*;

    /// A long count (one batch into every triple of 32 columns: 4960 tables) leaves the
    /// runtime free: on a one-thread runtime a ticker meant to tick every 2 ms is never
    /// held up for long, as a heartbeat must not be (a standalone run's coordinator and
    /// workers share one runtime; a count on it stalled their heartbeats past the
    /// worker timeout, and the coordinator redid the task again and again).
    #[tokio::test(flavor = "current_thread")]
    async fn counting_tables_leaves_the_runtime_free() {
        let columns = 32;
        let domain = Domain {
            columns: (0..columns)
                .map(|c| ColumnDomain {
                    name: format!("c{c}"),
                    encoding: Encoding::Categorical {
                        categories: (0..4).map(|v| v.to_string()).collect(),
                        other: false,
                    },
                    missing: false,
                })
                .collect(),
        };
        let rows = 40_000;
        let batch = EncodedBatch {
            units: (0..rows).map(|r| format!("u{r}")).collect(),
            values: (0..columns).map(|c| (0..rows).map(|r| Some(((r * (c + 1)) % 4) as f64)).collect()).collect(),
        };
        let dir = tempfile::tempdir().unwrap();
        let scratch = storage::open(dir.path().to_str().unwrap()).unwrap();
        let mut writer =
            PartitionWriter::new(&scratch, "count", &domain, 1, PartitionKey::generate().unwrap()).unwrap();
        writer.write(batch).await.unwrap();
        let urls = writer.finish().await.unwrap().urls;
        let mut tables = Vec::new();
        for a in 0..columns {
            for b in a + 1..columns {
                tables.extend((b + 1..columns).map(|c| vec![a, b, c]));
            }
        }
        let spec =
            MarginalsTask { domain, tables, max_rows_per_unit: 1, row_level: true, history: None, database: None };
        let task = Task { partition_urls: urls, ..Task::default() };

        let (aggregate, took, longest) = runtime_held(count_tables(&task, &CountTables::from(&spec))).await;
        let aggregate = aggregate.unwrap();
        // Every table sums to the rows.
        let counts = &aggregate.tensors[0].1;
        assert_eq!(counts.len(), spec.cells());
        assert_eq!(counts[..64].iter().sum::<f64>(), rows as f64);
        // The count takes a while (unoptimised, about half a second), and the ticker is never
        // held up for more than a small share of it.
        assert!(took > Duration::from_millis(200), "the count took {took:?}: too quick to tell");
        assert!(longest > Duration::ZERO, "the ticker ticked");
        assert!(longest < took / 10, "the runtime was held for {longest:?} of a {took:?} count");
    }

    /// A task of another job resets the cache before its work runs, whatever the work:
    /// a sequence round asks for the model before its partitions, and must not get the
    /// previous job's.
    #[tokio::test]
    async fn a_new_jobs_task_forgets_the_previous_jobs_model_first() {
        let mut executor = Executor { job: "a".into(), ..Executor::default() };
        executor.model(|| async { Ok(7u32) }).await.unwrap();
        executor.partitions.insert("part".into(), Arc::new(1u8));
        let task = Task { job_id: "b".into(), work: None, ..Task::default() };
        assert!(executor.execute(&task).await.is_err(), "no work");
        assert_eq!(executor.job, "b");
        assert!(executor.model.is_none() && executor.partitions.is_empty());
        // Another model type is now a fresh build, not "two kinds of model".
        assert_eq!(*executor.model(|| async { Ok(3u64) }).await.unwrap().lock().unwrap(), 3);
    }
}
