//! A real pretrained model on this CPU (flex backend): SmolLM2-135M-Instruct from its GGUF
//! file (`DPSYNTH_SMOLLM2_GGUF`; `.ci/run` shows where it comes from). Measures the load
//! time, the forward pass in tokens/s, and one DP-SGD step with LoRA adapters (ghost norms
//! and the clipped sum) against the ordinary backward pass of the same batch, measured in
//! the same run, with their ratio and the projected cost of an epoch over `ROWS` rows of
//! `TOKENS` tokens. Run with `cargo bench -p dpsynth-shared --bench pretrained`.

use std::time::{Duration, Instant};

use burn::module::{Module, ParamGroup};
use bytes::Bytes;
use dpsynth_shared::decoder::model::TokenBatch;
use dpsynth_shared::decoder::{Checkpoint, Decoder, LoraConfig, next_token_losses};
use dpsynth_shared::dpsgd::compute_device;
use dpsynth_shared::dpsgd::ghost::{GhostTape, Hook, Plain, clipped_sum};
use dpsynth_shared::dpsgd::params::TrainableLayers;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};

/// Units per step and tokens per unit (a serialized Adult row is about 60 tokens).
const UNITS: usize = 8;
const TOKENS: usize = 64;
/// Adult's training rows, for the projection.
const ROWS: usize = 30_162;

fn losses(decoder: &Decoder, tokens: &[u32], hook: &mut impl Hook) -> burn::tensor::Tensor<1> {
    let length = TOKENS - 1;
    let inputs: Vec<u32> = tokens.chunks(TOKENS).flat_map(|s| s[..length].to_vec()).collect();
    let targets: Vec<u32> = tokens.chunks(TOKENS).flat_map(|s| s[1..].to_vec()).collect();
    let logits = decoder.forward(&TokenBatch { tokens: &inputs, sequences: UNITS, length }, hook);
    let rows = inputs.len();
    next_token_losses(logits, &targets, vec![0.0; rows * decoder.vocabulary()], vec![1.0; rows], UNITS)
}

fn median(mut f: impl FnMut(), reps: usize) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[reps / 2]
}

fn main() {
    let Ok(path) = std::env::var("DPSYNTH_SMOLLM2_GGUF") else {
        eprintln!("set DPSYNTH_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let device = compute_device();
    let started = Instant::now();
    let checkpoint =
        Checkpoint::gguf(Bytes::from(std::fs::read(&path).expect("the model file"))).expect("a GGUF model");
    let base = checkpoint.load(&device).expect("SmolLM2 loads");
    println!("load: {:.2} s ({} layers, width {})", started.elapsed().as_secs_f64(), base.blocks.len(), base.width());
    let mut rng = ChaCha8Rng::from_seed([1; 32]);
    let tokens: Vec<u32> = (0..UNITS * TOKENS).map(|_| rng.random_range(0..base.vocabulary() as u32)).collect();
    let forward = median(
        || {
            let batch = TokenBatch { tokens: &tokens, sequences: UNITS, length: TOKENS };
            base.forward(&batch, &mut Plain).into_data();
        },
        3,
    );
    let per_step = (UNITS * TOKENS) as f64;
    println!(
        "forward: {:.2} s per {UNITS}×{TOKENS} tokens, {:.0} tokens/s",
        forward.as_secs_f64(),
        per_step / forward.as_secs_f64()
    );
    let lora = LoraConfig::new(8, 16.0, vec!["qkv".into(), "output".into()]);
    let adapted = base.with_adapters(&lora, &device).unwrap();
    println!("LoRA rank 8 on qkv and output: {} trainable parameters", adapted.parameter_count());
    // The baseline tracks the adapters only, as an ordinary LoRA fine-tune would.
    let tracked = adapted.clone().freeze().unfreeze_group(ParamGroup::from_predicate("adapter")).train();
    let plain = median(
        || {
            let grads = losses(&tracked, &tokens, &mut Plain).sum().backward();
            tracked.flat_gradient(&grads);
        },
        3,
    );
    let units: Vec<usize> = (0..UNITS).flat_map(|u| std::iter::repeat_n(u, TOKENS - 1)).collect();
    let dp = median(
        || {
            let mut tape = GhostTape::default();
            let l = losses(&adapted, &tokens, &mut tape);
            clipped_sum(&adapted, tape, l, &units, UNITS, 1.0).expect("a clipped sum");
        },
        3,
    );
    println!(
        "step of {UNITS} units: non-private backward {:.2} s, DP (ghost clipping) {:.2} s, ratio {:.2}",
        plain.as_secs_f64(),
        dp.as_secs_f64(),
        dp.as_secs_f64() / plain.as_secs_f64()
    );
    let epoch = dp.as_secs_f64() * ROWS as f64 / UNITS as f64;
    println!(
        "projected: {:.0} tokens/s under DP; one epoch over {ROWS} rows of {TOKENS} tokens ≈ {:.1} h on this CPU",
        per_step / dp.as_secs_f64(),
        epoch / 3600.0
    );
}
