//! Standalone mode: the coordinator and N workers in one process, talking real gRPC over
//! 127.0.0.1 (like Ballista's standalone mode) — the same code paths as a cluster.

use dpsynth_worker::WorkerConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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
                    if let Err(e) = dpsynth_worker::run(config).await {
                        tracing::error!(error = %e, "worker stopped");
                    }
                })
            })
            .collect();
        Ok(Self { service, url, stop, server, workers })
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
