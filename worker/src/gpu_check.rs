//! `rhosynth-worker --check-gpu`: what this node's GPU does with our models, as one JSON
//! object on stdout (`bench/gpu/check.sh`): the device and driver; whether a DP step's
//! clipped gradient sum on the GPU equals the CPU's (the DP-FinDiff denoiser and the
//! sequence transformer, uniform and ragged units); the DP step's time against the
//! non-private step's on the GPU, and against the CPU's DP step. No noise is drawn here: a
//! worker's step is a noise-free sum, and the coordinator alone adds noise, on its CPU. A
//! flag of the worker, not a binary of its own: each CUDA binary carries all of LLVM, and
//! the device bundle must stay small.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rhosynth_shared::dpsgd::{compute_device, cpu_device, cuda};
use rhosynth_shared::workloads::{Workload, median_time, paired_medians, relative_distance};
use serde_json::{Value, json};

/// The bound on a GPU sum's distance from the CPU's, relative to the CPU's norm.
const TOLERANCE: f64 = 1e-5;
/// The clipping norm of every step (the examples' default).
const CLIP: f64 = 1.0;
/// Unix seconds after which no further speed shape starts (`CHECK_DEADLINE`, set by
/// check.sh to leave its jobs their time).
const DEADLINE: &str = "CHECK_DEADLINE";

/// Prints the summary for `gpu` (the worker asked the driver first).
pub fn run(gpu: cuda::CudaDevice) -> anyhow::Result<()> {
    eprintln!("checking {} (driver {})", gpu.name, gpu.driver);
    let summary = json!({
        "device": gpu,
        "backend": "burn 0.22.1 on CubeCL CUDA (kernels through LLVM's NVPTX backend)",
        "noise": "none on the GPU: workers return noise-free clipped sums, and the coordinator draws all noise on its CPU",
        "dp_step": "a worker's DP step: per-unit gradients (ghost norms) clipped and summed; the coordinator's noise and optimizer step are not timed",
        "correctness": correctness(),
        "speed": speed(),
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}

/// Runs `check`, turning a panic (a kernel CubeCL refuses, an f64 the device lacks) into
/// an entry that says so: one failing shape must not hide the others.
fn guarded(what: &str, check: impl FnOnce() -> anyhow::Result<Value>) -> Value {
    eprintln!("{what}");
    match catch_unwind(AssertUnwindSafe(check)) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => json!({ "error": format!("{e:#}") }),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic without a message".into());
            json!({ "error": format!("panicked: {message}") })
        }
    }
}

/// The same model (the CPU's parameters copied to the GPU) and the same units: the clipped
/// sums' distance, relative to the CPU sum's norm.
fn correctness() -> Vec<Value> {
    let cases = [
        ("denoiser", "uniform", Workload::denoiser(256, 256, false)),
        ("denoiser", "ragged", Workload::denoiser(256, 256, true)),
        ("transformer", "uniform", Workload::transformer(64, 32, false)),
        ("transformer", "ragged", Workload::transformer(64, 32, true)),
    ];
    cases
        .into_iter()
        .map(|(model, layout, workload)| {
            let result = guarded(&format!("correctness: {model}, {layout}"), || {
                let cpu = workload.model(&cpu_device(), None)?;
                let gpu = workload.model(&compute_device(), Some(&cpu.parameters()))?;
                let relative = relative_distance(&cpu.clipped_step(CLIP)?.sum, &gpu.clipped_step(CLIP)?.sum);
                Ok(json!({
                    "parameters": cpu.parameter_count(),
                    "relative_error": relative,
                    "pass": relative <= TOLERANCE,
                }))
            });
            json!({ "model": model, "layout": layout, "units": workload.units(), "tolerance": TOLERANCE, "result": result })
        })
        .collect()
}

/// DP over non-private step time on the GPU (medians of alternating runs), and the CPU's
/// DP step on the same shape against the GPU's; shapes not started past the deadline.
fn speed() -> Vec<Value> {
    let deadline = std::env::var(DEADLINE).ok().and_then(|d| d.parse::<u64>().ok());
    let past = || deadline.is_some_and(|d| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() >= d);
    type Make = fn(usize, usize, bool) -> Workload;
    let denoisers = [256, 512, 1024]
        .into_iter()
        .flat_map(|width| [256, 1024, 4096].map(|batch| ("denoiser", Workload::denoiser as Make, width, batch)));
    let transformers = [256, 512].map(|width| ("transformer", Workload::transformer as Make, width, 256));
    denoisers
        .chain(transformers)
        .map(|(model, make, width, batch)| {
            if past() {
                return json!({ "model": model, "width": width, "batch": batch, "skipped": "past the check's deadline" });
            }
            let result = guarded(&format!("speed: {model} width {width}, batch {batch}"), || {
                let workload = make(width, batch, false);
                let gpu = workload.model(&compute_device(), None)?;
                let dp = || {
                    std::hint::black_box(gpu.clipped_step(CLIP).expect("a DP step on the GPU"));
                };
                let (plain, dp) = paired_medians(5, 11, gpu.plain_step(), dp);
                let cpu = workload.model(&cpu_device(), Some(&gpu.parameters()))?;
                let cpu_dp = median_time(1, 3, || {
                    std::hint::black_box(cpu.clipped_step(CLIP).expect("a DP step on the CPU"));
                });
                let ms = |t: Duration| t.as_secs_f64() * 1e3;
                Ok(json!({
                    "parameters": gpu.parameter_count(),
                    "gpu_non_private_ms": ms(plain),
                    "gpu_dp_ms": ms(dp),
                    "dp_over_non_private": dp.as_secs_f64() / plain.as_secs_f64(),
                    "cpu_dp_ms": ms(cpu_dp),
                    "gpu_speedup_over_cpu": cpu_dp.as_secs_f64() / dp.as_secs_f64(),
                }))
            });
            json!({ "model": model, "width": width, "batch": batch, "result": result })
        })
        .collect()
}
