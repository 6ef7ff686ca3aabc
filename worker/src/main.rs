//! `rhosynth-worker`: one per CPU/GPU pod.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use rhosynth_worker::{WorkerConfig, run};

#[cfg(feature = "cuda")]
mod gpu_check;

#[derive(Parser)]
#[command(
    name = "rhosynth-worker",
    version,
    about = "rhosynth worker: computes bounded aggregates over its partitions"
)]
struct Args {
    /// Coordinator gRPC URL.
    #[arg(long, env = "RHOSYNTH_COORDINATOR", default_value = "http://127.0.0.1:50051")]
    coordinator: String,
    /// Name reported to the coordinator (defaults to the host name).
    #[arg(long, env = "RHOSYNTH_WORKER_NAME")]
    name: Option<String>,
    /// Serve Prometheus `/metrics` and `/healthz` on this address.
    #[arg(long, env = "RHOSYNTH_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The CA that signed the coordinator's certificate (PEM); enables TLS.
    #[arg(long, env = "RHOSYNTH_TLS_CA", requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// This worker's client certificate, signed by the workers' CA (PEM).
    #[arg(long, env = "RHOSYNTH_TLS_CERT", requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// This worker's key (PEM).
    #[arg(long, env = "RHOSYNTH_TLS_KEY", requires = "tls_ca")]
    tls_key: Option<PathBuf>,
    /// Check this node's GPU against the CPU (a DP step's clipped sums and times; one JSON
    /// object on stdout) and exit, instead of serving.
    #[cfg(feature = "cuda")]
    #[arg(long)]
    check_gpu: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    rhosynth_shared::logging::init();
    rhosynth_shared::process::private_files();
    rhosynth_shared::process::refuse_legacy_environment()?;
    let args = Args::parse();
    // A GPU worker asks the driver first: without one, CubeCL would panic at the first task.
    #[cfg(feature = "cuda")]
    {
        let gpu = rhosynth_shared::dpsgd::cuda::probe().context("this worker runs its models on CUDA")?;
        if args.check_gpu {
            return tokio::task::spawn_blocking(|| gpu_check::run(gpu)).await?;
        }
        tracing::info!(gpu = %gpu.name, driver = %gpu.driver, "models run on CUDA");
    }
    let name = args
        .name
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    let mut config = WorkerConfig::new(args.coordinator, name);
    if let (Some(ca), Some(cert), Some(key)) = (&args.tls_ca, &args.tls_cert, &args.tls_key) {
        config.tls = Some(rhosynth_proto::tls::client_config(ca, Some((cert, key))).context("reading the TLS files")?);
    }
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let metrics = config.metrics.clone();
        tokio::spawn(rhosynth_shared::metrics::serve(listener, Arc::new(move || metrics.render())));
        tracing::info!(%addr, "metrics listening");
    }
    run(config).await
}
