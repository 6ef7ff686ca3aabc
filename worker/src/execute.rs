//! Task execution: one function per task kind, each returning a bounded aggregate.

use dpsynth_proto::Task;
use dpsynth_shared::data::partition::read_partition;
use dpsynth_shared::generators::marginals::{MarginalsTask, TASK_KIND};

/// Named f64 tensors plus the number of privacy units that contributed.
pub struct Aggregate {
    pub units: u64,
    pub tensors: Vec<(String, Vec<f64>)>,
}

pub async fn execute(task: &Task) -> anyhow::Result<Aggregate> {
    match task.kind.as_str() {
        TASK_KIND => marginals(task).await,
        other => {
            anyhow::bail!("unknown task kind {other:?}: this worker is older than its coordinator")
        }
    }
}

/// Contingency tables of bounded per-unit contributions over the task's partitions.
async fn marginals(task: &Task) -> anyhow::Result<Aggregate> {
    let spec: MarginalsTask = serde_json::from_slice(&task.params)?;
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
