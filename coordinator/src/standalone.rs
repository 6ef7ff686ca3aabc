//! Standalone mode: the coordinator and N workers in one process, talking real gRPC over
//! 127.0.0.1 (like Ballista's standalone mode) — the same code paths as a cluster.

use std::time::Duration;

use rhosynth_proto::{JobState, JobStatus};
use rhosynth_worker::WorkerConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::job::JobRequest;
use crate::server::serve;
use crate::service::{CoordinatorConfig, CoordinatorService};

/// A running in-process cluster.
pub struct Standalone {
    pub service: CoordinatorService,
    /// The coordinator's gRPC URL.
    pub url: String,
    stop: oneshot::Sender<()>,
    server: JoinHandle<()>,
    workers: Vec<JoinHandle<()>>,
}

impl Standalone {
    /// Starts the coordinator on an ephemeral loopback port and `workers` workers.
    pub async fn start(config: CoordinatorConfig, workers: usize) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let service = CoordinatorService::new(config);
        let (stop, stopped) = oneshot::channel::<()>();
        let server_service = service.clone();
        let server = tokio::spawn(async move {
            // Loopback inside one process: no TLS; access as the config says (`run` and
            // `audit`: workers only).
            if let Err(e) = serve(listener, server_service, None, async {
                let _ = stopped.await;
            })
            .await
            {
                tracing::error!(error = %e, "coordinator server stopped");
            }
        });
        let workers = (0..workers)
            .map(|i| {
                let config = WorkerConfig::new(url.clone(), format!("local-{i}"));
                tokio::spawn(async move {
                    if let Err(e) = rhosynth_worker::run(config).await {
                        tracing::error!(error = %e, "worker stopped");
                    }
                })
            })
            .collect();
        Ok(Self { service, url, stop, server, workers })
    }

    /// Starts `request`'s job and polls it every 200 ms until it ends, showing each status
    /// to `progress`: its final status, or why it could not start (or vanished).
    pub async fn run_job(
        &self,
        request: JobRequest,
        mut progress: impl FnMut(&JobStatus),
    ) -> Result<JobStatus, String> {
        let job_id = request.job_id.clone();
        self.service.start_job(request).map_err(|status| status.message().to_string())?;
        loop {
            let status = self.service.job_status(&job_id).ok_or("the job vanished")?;
            progress(&status);
            if status.state != JobState::Running as i32 {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the workers and the server.
    pub async fn shutdown(self) {
        for w in &self.workers {
            w.abort();
        }
        let _ = self.stop.send(());
        let _ = self.server.await;
    }
}
