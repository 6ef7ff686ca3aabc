//! `dpsynth-worker`: one per CPU/GPU pod.

use clap::Parser;
use dpsynth_worker::{WorkerConfig, run};

#[derive(Parser)]
#[command(name = "dpsynth-worker", version, about = "dpsynth worker: computes bounded aggregates over its partitions")]
struct Args {
    /// Coordinator gRPC URL.
    #[arg(long, env = "DPSYNTH_COORDINATOR", default_value = "http://127.0.0.1:50051")]
    coordinator: String,
    /// Name reported to the coordinator (defaults to the host name).
    #[arg(long, env = "DPSYNTH_WORKER_NAME")]
    name: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let name = args
        .name
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("worker-{}", std::process::id()));
    run(WorkerConfig::new(args.coordinator, name)).await
}
