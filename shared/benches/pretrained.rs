//! A real pretrained model on this CPU (flex backend): SmolLM2-135M-Instruct from its GGUF
//! file (`RHOSYNTH_SMOLLM2_GGUF`; `.ci/run` shows where it comes from). Measures the load
//! time, then for the whole model with LoRA adapters, and for its first blocks over Adult's
//! row vocabulary (rows as text, `generators::dp2stage::row_text`) with LoRA and fully fine-tuned:
//! the forward pass in tokens/s and one DP-SGD step (ghost norms and the clipped sum)
//! against the ordinary backward pass of the same batch and trainable parameters, measured
//! in the same run, with their ratio and the projected cost of an epoch over Adult's rows.
//! Run with `cargo bench -p rhosynth-shared --bench pretrained`.

use std::time::{Duration, Instant};

use burn::module::{Module, ParamGroup};
use bytes::Bytes;
use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::decoder::model::TokenBatch;
use rhosynth_shared::decoder::tokenizer::TextTokenizer;
use rhosynth_shared::decoder::{Checkpoint, Decoder, LoraConfig, next_token_losses};
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::dpsgd::ghost::{GhostTape, Hook, Plain, clipped_sum};
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::generators::dp2stage::row_text::RowText;
use rhosynth_shared::spec::JobSpec;

/// Units per step.
const UNITS: usize = 8;
/// Adult's training rows, for the projection.
const ROWS: usize = 30_162;
/// Blocks kept of the pretrained model for the small configuration.
const BLOCKS: usize = 4;

/// A batch: `UNITS` sequences of `length` tokens.
struct Batch {
    tokens: Vec<u32>,
    length: usize,
}

fn losses(decoder: &Decoder, batch: &Batch, hook: &mut impl Hook) -> burn::tensor::Tensor<1> {
    let n = batch.length - 1;
    let inputs: Vec<u32> = batch.tokens.chunks(batch.length).flat_map(|s| s[..n].to_vec()).collect();
    let targets: Vec<u32> = batch.tokens.chunks(batch.length).flat_map(|s| s[1..].to_vec()).collect();
    let logits = decoder.forward(&TokenBatch { tokens: &inputs, sequences: UNITS, length: n, lagged: &[] }, hook);
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

/// Forward, ordinary backward and DP step of one configuration.
fn measure(name: &str, model: &Decoder, batch: &Batch) {
    let tokens = (UNITS * batch.length) as f64;
    let forward = median(
        || {
            model
                .forward(
                    &TokenBatch { tokens: &batch.tokens, sequences: UNITS, length: batch.length, lagged: &[] },
                    &mut Plain,
                )
                .into_data();
        },
        3,
    );
    // The baseline tracks what DP-SGD trains: the adapters, or every parameter.
    let tracked = if model.adapted() {
        model.clone().freeze().unfreeze_group(ParamGroup::from_predicate("adapter")).train()
    } else {
        model.clone().train()
    };
    let plain = median(
        || {
            let grads = losses(&tracked, batch, &mut Plain).sum().backward();
            tracked.flat_gradient(&grads);
        },
        3,
    );
    let units: Vec<usize> = (0..UNITS).flat_map(|u| std::iter::repeat_n(u, batch.length - 1)).collect();
    let dp = median(
        || {
            let mut tape = GhostTape::default();
            let l = losses(model, batch, &mut tape);
            clipped_sum(model, tape, l, &units, UNITS, 1.0).expect("a clipped sum");
        },
        3,
    );
    println!(
        "| {name} | {} | {:.0} | {:.2} / {:.2} s ({:.2}×) | {:.0} | {:.1} h |",
        model.parameter_count(),
        tokens / forward.as_secs_f64(),
        plain.as_secs_f64(),
        dp.as_secs_f64(),
        dp.as_secs_f64() / plain.as_secs_f64(),
        tokens / dp.as_secs_f64(),
        dp.as_secs_f64() * ROWS as f64 / UNITS as f64 / 3600.0,
    );
}

fn main() {
    let Ok(path) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
        eprintln!("set RHOSYNTH_SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf");
        return;
    };
    let device = compute_device();
    let started = Instant::now();
    let checkpoint =
        Checkpoint::gguf(Bytes::from(std::fs::read(&path).expect("the model file"))).expect("a GGUF model");
    let base = checkpoint.load(&device).expect("SmolLM2 loads");
    let tokenizer = TextTokenizer::from_gguf(checkpoint.gguf_file().expect("a GGUF file")).expect("its tokenizer");
    println!("load: {:.2} s ({} blocks, width {})", started.elapsed().as_secs_f64(), base.blocks.len(), base.width());
    println!();
    println!(
        "| configuration ({UNITS} units a step) | trainable parameters | forward tokens/s | ordinary / DP step | DP tokens/s | epoch over Adult |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    let mut rng = ChaCha8Rng::from_seed([1; 32]);
    let random =
        Batch { tokens: (0..UNITS * 64).map(|_| rng.random_range(0..base.vocabulary() as u32)).collect(), length: 64 };
    let lora = LoraConfig::new(8, 16.0, vec!["qkv".into(), "output".into()]);
    let adapted = base.clone().with_adapters(&lora, &device).expect("adapters");
    measure("all 30 blocks, LoRA r = 8 (qkv, output), 64 random tokens", &adapted, &random);

    // Adult's rows as text (uniform bins: only their lengths and tokens matter here).
    let spec = JobSpec::parse(include_str!("../../examples/adult-pate.toml"), "adult").expect("the Adult spec");
    let domain = Domain::from_spec(&spec);
    let text = RowText::new(&domain, domain.index_of("income"), &tokenizer).expect("Adult as text");
    let vocabulary = text.vocabulary();
    let rows: Vec<Vec<u32>> = (0..UNITS)
        .map(|_| {
            let bins: Vec<usize> = domain.columns.iter().map(|c| rng.random_range(0..c.bins())).collect();
            text.encode(&bins).tokens
        })
        .collect();
    let length = rows.iter().map(Vec::len).min().expect("rows");
    let adult = Batch { tokens: rows.iter().flat_map(|r| r[..length].to_vec()).collect(), length };
    let small = base.truncated(BLOCKS).restricted(vocabulary);
    let name = format!("first {BLOCKS} blocks, Adult's {} tokens, {length}-token rows", vocabulary.len());
    measure(&format!("{name}, LoRA"), &small.clone().with_adapters(&lora, &device).expect("adapters"), &adult);
    measure(&format!("{name}, full fine-tuning"), &small.untied(), &adult);
}
