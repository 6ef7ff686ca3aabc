//! A rhosynth worker: registers with the coordinator, heartbeats, pulls tasks, reads only
//! the partitions a task names and returns only the bounded aggregate it asks for. It
//! never adds noise and never sends rows.

pub mod execute;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use rhosynth_proto::coordinator_client::CoordinatorClient;
use rhosynth_proto::result_chunk::Part;
use rhosynth_proto::task::Work;
use rhosynth_proto::{
    Capabilities, Dtype, HeartbeatRequest, PROTOCOL_VERSION, PollTaskRequest, RegisterWorkerRequest,
    ReportFailureRequest, ResultChunk, ResultHeader, Task, TensorChunk, TensorMeta,
};
use tonic::Code;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

/// Counters this worker exposes on `/metrics`.
#[derive(Default)]
pub struct WorkerMetrics {
    tasks: AtomicU64,
    failures: AtomicU64,
    /// Wall seconds of the last task, as f64 bits. (Not units per second: how many units a
    /// task saw is private.)
    last_seconds: AtomicU64,
}

impl WorkerMetrics {
    pub fn render(&self) -> String {
        let mut e = rhosynth_shared::metrics::Exposition::default();
        e.counter("rhosynth_worker_tasks_total", "Tasks completed.", &[], self.tasks.load(Ordering::Relaxed) as f64);
        e.counter(
            "rhosynth_worker_task_failures_total",
            "Tasks failed.",
            &[],
            self.failures.load(Ordering::Relaxed) as f64,
        );
        e.gauge(
            "rhosynth_worker_last_task_seconds",
            "Wall time of the last task.",
            &[],
            f64::from_bits(self.last_seconds.load(Ordering::Relaxed)),
        );
        e.finish()
    }
}

/// Worker settings, with defaults for a local cluster.
#[derive(Clone)]
pub struct WorkerConfig {
    /// Coordinator gRPC URL, e.g. `http://127.0.0.1:50051`.
    pub coordinator_url: String,
    /// Name reported to the coordinator (the pod name on Kubernetes).
    pub name: String,
    /// How long one poll may wait at the coordinator for work (long polling).
    pub poll_interval: Duration,
    pub metrics: Arc<WorkerMetrics>,
    /// Mutual TLS to the coordinator: its CA and this worker's certificate and key.
    pub tls: Option<ClientTlsConfig>,
}

impl WorkerConfig {
    pub fn new(coordinator_url: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            coordinator_url: coordinator_url.into(),
            name: name.into(),
            poll_interval: Duration::from_secs(1),
            metrics: Arc::default(),
            tls: None,
        }
    }
}

/// What this machine offers.
pub fn capabilities() -> Capabilities {
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024);
    Capabilities {
        cpu_cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        gpus: 0,
        memory_bytes,
    }
}

async fn connect(url: &str, tls: Option<&ClientTlsConfig>) -> Channel {
    let mut backoff = Duration::from_millis(100);
    loop {
        let endpoint = Endpoint::from_shared(url.to_string()).and_then(|e| match tls {
            Some(tls) => e.tls_config(tls.clone()),
            None => Ok(e),
        });
        match endpoint {
            Ok(endpoint) => match endpoint.connect_timeout(Duration::from_secs(5)).connect().await {
                Ok(channel) => return channel,
                Err(e) => tracing::warn!(url, error = %e, "coordinator not reachable; retrying"),
            },
            Err(e) => tracing::error!(url, error = %e, "invalid coordinator URL"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Runs the worker until the coordinator refuses it (incompatible protocol).
/// Connection losses are retried forever.
pub async fn run(config: WorkerConfig) -> anyhow::Result<()> {
    loop {
        let channel = connect(&config.coordinator_url, config.tls.as_ref()).await;
        // Round tasks carry the model's weights; results carry gradient sums.
        let mut client = CoordinatorClient::new(channel)
            .max_decoding_message_size(rhosynth_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(rhosynth_proto::MAX_MESSAGE_BYTES);
        let registered = client
            .register_worker(RegisterWorkerRequest {
                protocol_version: PROTOCOL_VERSION,
                worker_name: config.name.clone(),
                capabilities: Some(capabilities()),
                rhosynth_version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .await;
        let registration = match registered {
            Ok(r) => r.into_inner(),
            // Another protocol, or not admitted: retrying cannot help.
            Err(status) if matches!(status.code(), Code::FailedPrecondition | Code::Unauthenticated) => {
                bail!("the coordinator refused this worker: {}", status.message())
            }
            Err(status) => {
                tracing::warn!(error = %status, "registration failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let worker_id = registration.worker_id;
        tracing::info!(worker = worker_id, coordinator = config.coordinator_url, "registered");
        let heartbeat = tokio::spawn(heartbeat(
            client.clone(),
            worker_id.clone(),
            Duration::from_millis(u64::from(registration.heartbeat_interval_ms.max(50))),
        ));
        let outcome = serve_tasks(&mut client, &worker_id, &config).await;
        heartbeat.abort();
        if let Err(e) = outcome {
            tracing::warn!(worker = worker_id, error = %e, "lost the coordinator; reconnecting");
        }
    }
}

/// Heartbeats until the coordinator forgets this worker or stops answering.
async fn heartbeat(mut client: CoordinatorClient<Channel>, worker_id: String, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        match client.heartbeat(HeartbeatRequest { worker_id: worker_id.clone() }).await {
            Ok(r) if r.get_ref().known => {}
            Ok(_) => return,
            Err(e) => tracing::debug!(error = %e, "heartbeat failed"),
        }
    }
}

/// Polls and executes tasks; returns when the coordinator no longer knows this worker.
async fn serve_tasks(
    client: &mut CoordinatorClient<Channel>,
    worker_id: &str,
    config: &WorkerConfig,
) -> anyhow::Result<()> {
    let mut executor = execute::Executor::default();
    loop {
        let wait_ms = config.poll_interval.as_millis().min(u128::from(u32::MAX)) as u32;
        let polled = client.poll_task(PollTaskRequest { worker_id: worker_id.to_string(), wait_ms }).await;
        let task = match polled {
            Ok(r) => r.into_inner().task,
            Err(status) if status.code() == Code::NotFound => {
                bail!("coordinator forgot this worker")
            }
            Err(status) => return Err(status).context("polling for work"),
        };
        // No task within the wait: poll again.
        let Some(task) = task else { continue };
        // DP-SGD rounds are thousands of short tasks: logged at debug level.
        match &task.work {
            Some(Work::GradientSum(_)) => {
                tracing::debug!(job = task.job_id, task = task.task_id, attempt = task.attempt, "round task started")
            }
            work => {
                let work = match work {
                    Some(Work::CountTables(_)) => "count tables",
                    Some(Work::TeacherVotes(_)) => "teacher votes",
                    Some(Work::SelectionVotes(_)) => "selection votes",
                    Some(Work::HistoryStatistics(_)) => "history statistics",
                    Some(Work::ReadShard(_)) => "read shard",
                    Some(Work::MergePartition(_)) => "merge partition",
                    _ => "unknown",
                };
                tracing::info!(job = task.job_id, task = task.task_id, attempt = task.attempt, work, "task started")
            }
        }
        let started = Instant::now();
        match executor.execute(&task).await {
            Ok(aggregate) => {
                let seconds = started.elapsed().as_secs_f64();
                config.metrics.last_seconds.store(seconds.to_bits(), Ordering::Relaxed);
                config.metrics.tasks.fetch_add(1, Ordering::Relaxed);
                submit(client, worker_id, &task, aggregate).await?
            }
            Err(e) => {
                config.metrics.failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(job = task.job_id, task = task.task_id, error = %e, "task failed");
                client
                    .report_failure(ReportFailureRequest {
                        worker_id: worker_id.to_string(),
                        job_id: task.job_id.clone(),
                        task_id: task.task_id,
                        attempt: task.attempt,
                        error: e.to_string(),
                        input_mismatch: execute::is_input_mismatch(&e),
                    })
                    .await?;
            }
        }
    }
}

/// Streams the aggregate back: a header, then each tensor's bytes in bounded chunks.
pub async fn submit(
    client: &mut CoordinatorClient<Channel>,
    worker_id: &str,
    task: &Task,
    aggregate: execute::Aggregate,
) -> anyhow::Result<()> {
    let header = ResultHeader {
        worker_id: worker_id.to_string(),
        job_id: task.job_id.clone(),
        task_id: task.task_id,
        attempt: task.attempt,
        units: aggregate.units,
        tensors: aggregate
            .tensors
            .iter()
            .map(|(name, values)| TensorMeta {
                name: name.clone(),
                shape: vec![values.len() as u64],
                dtype: Dtype::F64 as i32,
            })
            .collect(),
    };
    let mut chunks = vec![ResultChunk { part: Some(Part::Header(header)) }];
    for (index, (_, values)) in aggregate.tensors.iter().enumerate() {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        for piece in bytes.chunks(rhosynth_proto::CHUNK_BYTES) {
            chunks.push(ResultChunk {
                part: Some(Part::Data(TensorChunk { tensor_index: index as u32, data: piece.to_vec() })),
            });
        }
    }
    match client.submit_result(tokio_stream::iter(chunks)).await {
        Ok(_) => {
            tracing::debug!(job = task.job_id, task = task.task_id, "result submitted");
            Ok(())
        }
        // The coordinator gave this attempt to someone else (we were declared dead): drop it.
        Err(status) if status.code() == Code::FailedPrecondition => {
            tracing::warn!(error = %status.message(), "result refused");
            Ok(())
        }
        Err(status) => Err(status).context("submitting a result"),
    }
}
