//! DP-2Stage's invariants: ghost clipping over a unit's rows as text equals a per-unit
//! backward loop (LoRA adapters and full fine-tuning); stage 1 draws its rows uniformly
//! from the declared domain alone and learns them; every sampled row parses; a worker
//! reads the checkpoint and encodes its rows off the runtime its heartbeats need.

use std::time::Duration;

use rand::rngs::{ChaCha8Rng, ChaCha20Rng};
use rand::{RngExt, SeedableRng};

use super::model::{TextModel, TextModelSpec, TextRows};
use super::pretrain::{PseudoTraining, pretrain, pseudo_rows};
use super::prompting::Prompting;
use super::row_text::RowText;
use super::row_text::tests::tokenizer;
use super::sampler::TextSampler;
use crate::data::EncodedBatch;
use crate::data::domain::{Binning, ColumnDomain, Domain, Encoding};
use crate::data::partition::{PartitionKey, PartitionWriter};
use crate::decoder::{DecoderConfig, Family, LoraConfig};
use crate::dpsgd::ghost::Plain;
use crate::dpsgd::layers::Layer;
use crate::dpsgd::params::TrainableLayers;
use crate::dpsgd::{DpModel, RoundSettings, clipped_gradient_sum, compute_device};
use crate::spec::ColumnKind;
use crate::storage;
use crate::testing::runtime_held;

/// A target with three categories and an integer 1..=10, one bin a value.
pub(crate) fn domain() -> Domain {
    let categories = ["a", "b", "c"].map(String::from).to_vec();
    Domain {
        columns: vec![
            ColumnDomain {
                name: "c".into(),
                encoding: Encoding::Categorical { categories, other: false },
                missing: false,
            },
            ColumnDomain {
                name: "n".into(),
                encoding: Encoding::Numeric {
                    kind: ColumnKind::Integer,
                    min: 1.0,
                    max: 10.0,
                    binning: Binning::Integer((1..=10).map(|v| (v, v)).collect()),
                },
                missing: false,
            },
        ],
    }
}

/// A small Llama-family model (random weights) over the test tokenizer, as stage 2 trains it.
pub(crate) fn model(lora: Option<LoraConfig>) -> TextModel {
    let device = compute_device();
    let tokenizer = tokenizer();
    let domain = domain();
    let text = RowText::new(&domain, Some(0), &tokenizer).unwrap();
    let decoder = DecoderConfig::new(tokenizer.vocabulary(), 64, 16, 4, 2, 24)
        .with_family(Family::Llama)
        .with_kv_heads(Some(2))
        .init(&device);
    let spec = TextModelSpec { domain, text, blocks: None, lora, value_weight: 0.65, prompting: None };
    let mut model = TextModel::new(&spec, decoder, &device).unwrap();
    // Seeded weights in burn's scales (its initialisers draw from their own generator), so
    // the tests' draws are reproducible: linears U(±1/√inputs) (LoRA's B too, which would
    // otherwise leave A without a gradient), embeddings U(±0.05), norms γ = 1 and β = 0.
    let mut rng = ChaCha8Rng::from_seed([5; 32]);
    let mut start = Vec::new();
    for layer in model.layers() {
        match layer {
            Layer::Linear(l) => {
                let bound = 1.0 / (l.weight.dims()[0] as f32).sqrt();
                start.extend((0..layer.parameter_count()).map(|_| rng.random_range(-bound..bound)));
            }
            Layer::Embedding(_) => start.extend((0..layer.parameter_count()).map(|_| rng.random_range(-0.05f32..0.05))),
            Layer::Norm(n) => {
                let width = n.gamma.dims()[0];
                start.extend((0..layer.parameter_count()).map(|i| if i < width { 1.0 } else { 0.0 }));
            }
        }
    }
    model.load_parameters(&start).unwrap();
    model
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Units of one to three rows (HARMONIC's: each after its prompt): each unit's clipped
/// gradient is its rows' summed gradient, clipped once.
pub(crate) fn check_against_naive(model: &TextModel, what: &str) {
    let device = compute_device();
    let mut rng = ChaCha8Rng::from_seed([6; 32]);
    let domain = &model.spec.domain;
    let examples = TextRows {
        units: [1, 3, 2, 1, 2, 3]
            .iter()
            .map(|&n| {
                (0..n)
                    .map(|_| {
                        let bins: Vec<usize> = domain.columns.iter().map(|c| rng.random_range(0..c.bins())).collect();
                        model.spec.example(&bins, None)
                    })
                    .collect()
            })
            .collect(),
    };
    let seed = [0; 32];
    let tracked = TextModel { decoder: model.tracked(), spec: model.spec.clone() };
    let naive: Vec<Vec<f64>> = (0..examples.units.len())
        .map(|u| {
            let grads = tracked.losses(&examples, &[u], &seed, &device, &mut Plain).losses.sum().backward();
            tracked.flat_gradient(&grads).into_iter().map(f64::from).collect()
        })
        .collect();
    let norms: Vec<f64> = naive.iter().map(|g| norm(g)).collect();
    let mut sorted = norms.clone();
    sorted.sort_by(f64::total_cmp);
    assert!(sorted[0] > 0.0, "{what}: every unit has a gradient");
    let clip = sorted[sorted.len() / 2];
    let mut expected = vec![0.0; model.parameter_count()];
    for (g, n) in naive.iter().zip(&norms) {
        let c = (clip / n).min(1.0);
        expected.iter_mut().zip(g).for_each(|(e, v)| *e += c * v);
    }
    let all: Vec<usize> = (0..examples.units.len()).collect();
    let settings = RoundSettings::new(0, 1.0, clip, seed, 4).unwrap();
    let got = clipped_gradient_sum(model, &examples, &all, &settings, &device).unwrap();
    let diff: Vec<f64> = got.sum.iter().zip(&expected).map(|(a, b)| a - b).collect();
    let err = norm(&diff) / norm(&expected);
    assert!(err < 1e-4, "{what}: clipped sum differs from the per-unit loop: relative error {err:e}");
}

#[test]
fn ghost_clipping_of_a_units_rows_equals_a_per_unit_loop() {
    let lora = LoraConfig::new(4, 8.0, ["qkv", "output", "up", "down", "head"].map(String::from).to_vec());
    check_against_naive(&model(Some(lora)), "LoRA");
    check_against_naive(&model(None), "full fine-tuning");
}

/// Pseudo rows are uniform over each column's bins (6,000 rows: each share within
/// 5 binomial standard errors of 1/k).
#[test]
fn stage_one_rows_are_uniform_over_the_declared_domain() {
    let domain = domain();
    let rows = pseudo_rows(&domain, 6000, &mut ChaCha8Rng::seed_from_u64(3));
    for (c, column) in domain.columns.iter().enumerate() {
        let k = column.bins();
        let p = 1.0 / k as f64;
        let tolerance = 5.0 * (p * (1.0 - p) / 6000.0).sqrt();
        for bin in 0..k {
            let share = rows.iter().filter(|r| r[c] == bin).count() as f64 / 6000.0;
            assert!((share - p).abs() < tolerance, "column {c}, bin {bin}: {share} against {p}");
        }
    }
}

/// Stage 1 learns the rows (its loss falls), is reproducible from its non-private seed, and
/// the trained model's constrained decoding draws rows that all parse, each column's values
/// spread over its domain as the pseudo rows were.
#[test]
fn stage_one_learns_the_format_and_every_sampled_row_parses() {
    let training = PseudoTraining { rows: 512, batch: 32, epochs: 12.0, learning_rate: 3e-3 };
    let mut trained = model(None);
    let losses = pretrain(&mut trained, &training, 7).unwrap();
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    let (first, last) = (mean(&losses[..10]), mean(&losses[losses.len() - 10..]));
    assert!(last < 0.5 * first, "stage 1 loss {first} → {last}");
    let (mut a, mut b) = (model(None), model(None));
    pretrain(&mut a, &training, 7).unwrap();
    pretrain(&mut b, &training, 7).unwrap();
    assert_eq!(a.parameters(), b.parameters(), "stage 1 is a function of the spec and its seed");

    let sampler = TextSampler { decoder: trained.decoder, spec: trained.spec.clone(), temperature: 1.0 };
    let rows = sampler.draw_bins(600, &mut ChaCha20Rng::seed_from_u64(9));
    assert_eq!(rows.len(), 600);
    for (c, column) in sampler.spec.domain.columns.iter().enumerate() {
        let k = column.bins();
        let shares: Vec<f64> = (0..k).map(|bin| rows.iter().filter(|r| r[c] == bin).count() as f64 / 600.0).collect();
        eprintln!("column {c}: {shares:.3?}");
        for (bin, share) in shares.iter().enumerate() {
            assert!(*share > 0.3 / k as f64 && *share < 3.0 / k as f64, "column {c}, bin {bin}: share {share}");
        }
    }
}

/// What the spec alone decides is refused at submission, before any checkpoint is read.
#[test]
fn bad_parameters_are_refused_from_the_spec_alone() {
    let job = |section: &str| crate::testing::demo_job(&crate::testing::generator("dp2stage", section));
    let check = |section: &str| {
        let spec = job(section);
        super::plan::check(&spec, &Domain::from_spec(&spec)).map(drop).map_err(|e| e.to_string())
    };
    assert!(check("checkpoint = \"m.gguf\"").is_ok());
    // Without `lora` every parameter trains; `lora = {}` takes the adapters' defaults.
    let parsed = |section: &str| match job(section).generator {
        crate::generators::GeneratorSpec::Dp2stage(p) => p.lora,
        _ => unreachable!(),
    };
    assert_eq!(parsed("checkpoint = \"m.gguf\""), None);
    assert_eq!(parsed("checkpoint = \"m.gguf\"\nlora = {}"), Some(crate::generators::dp2stage::LoraParams::default()));
    for (section, says) in [
        ("", "checkpoint"),
        ("checkpoint = \"m.gguf\"\nvalue_weight = 1.5", "value_weight"),
        ("checkpoint = \"m.gguf\"\nblocks = 0", "blocks"),
        ("checkpoint = \"m.gguf\"\nlora = { rank = 4, alpha = 8.0, targets = [\"q_proj\"] }", "q_proj"),
        ("checkpoint = \"m.gguf\"\npseudo_rows = 0", "pseudo_rows"),
        ("checkpoint = \"m.gguf\"\npseudo_epochs = 1e15", "bounded"),
        ("checkpoint = \"m.gguf\"\nlora = { rank = 100000 }", "rank"),
        ("checkpoint = \"m.gguf\"\nmax_rows_per_unit = 10000", "max_rows_per_unit"),
    ] {
        let err = check(section).unwrap_err();
        assert!(err.contains(says), "{section}: {err}");
    }
}

/// Workers and the sampler read the checkpoint the job was planned with, or nothing: a
/// file whose bytes changed since is refused (SmolLM2's GGUF file, when it is there).
#[tokio::test]
async fn a_checkpoint_that_changed_since_the_plan_is_refused() {
    let Ok(path) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: set RHOSYNTH_SMOLLM2_GGUF (.ci/run fetches it)");
        return;
    };
    let fetched = crate::decoder::checkpoint::fetch(&path).await.unwrap();
    let domain = domain();
    let text = RowText::new(&domain, Some(0), &fetched.tokenizer).unwrap();
    let model = TextModelSpec { domain, text, blocks: Some(1), lora: None, value_weight: 0.65, prompting: None };
    let pseudo = PseudoTraining { rows: 1, batch: 1, epochs: 1.0, learning_rate: 1e-3 };
    let spec = super::Dp2StageModelSpec {
        checkpoint: path,
        checkpoint_sha256: fetched.sha256,
        model,
        max_rows_per_unit: 1,
        pseudo,
    };
    let device = compute_device();
    assert_eq!(spec.load_model(&device).await.unwrap().decoder.blocks.len(), 1);
    let changed = super::Dp2StageModelSpec { checkpoint_sha256: "0".repeat(64), ..spec };
    let err = changed.load_model(&device).await.err().expect("refused").to_string();
    assert!(err.contains("changed since the job was planned"), "{err}");
}

/// A worker's rows become prompted examples (HARMONIC's nearest-row searches) off the
/// runtime: 20,000 rows against 10,000 reference rows keep it busy for a while, and the
/// ticker is never held for more than a tenth of that.
#[tokio::test(flavor = "current_thread")]
async fn encoding_a_workers_rows_leaves_the_runtime_free() {
    let domain = domain();
    let rows = 20_000;
    let batch = EncodedBatch {
        units: (0..rows).map(|r| format!("u{r}")).collect(),
        values: vec![
            (0..rows).map(|r| Some((r % 3) as f64)).collect(),
            (0..rows).map(|r| Some((1 + r * 7 % 10) as f64)).collect(),
        ],
    };
    let dir = tempfile::tempdir().unwrap();
    let scratch = storage::open(dir.path().to_str().unwrap()).unwrap();
    let mut writer = PartitionWriter::new(&scratch, "rows", &domain, 1, PartitionKey::generate().unwrap()).unwrap();
    writer.write(batch).await.unwrap();
    let urls = writer.finish().await.unwrap().urls;
    let mut model = model(None).spec;
    let reference = (0..10_000u32).map(|i| vec![i % 3, (i * 3) % 10]).collect();
    model.prompting = Some(Prompting { reference, neighbours: 3, source: "test".into() });
    let spec = super::Dp2StageModelSpec {
        checkpoint: "unused.gguf".into(),
        checkpoint_sha256: String::new(),
        model,
        max_rows_per_unit: 1,
        pseudo: PseudoTraining { rows: 1, batch: 1, epochs: 1.0, learning_rate: 1e-3 },
    };
    let (examples, took, longest) = runtime_held(spec.load_rows(&urls)).await;
    let examples = examples.unwrap();
    assert_eq!(examples.units.len(), rows);
    assert!(examples.units.iter().all(|u| u.len() == 1 && u[0].prompt > 0), "every row after its prompt");
    eprintln!("encoding took {took:?}, the runtime held for at most {longest:?}");
    assert!(took > Duration::from_millis(200), "encoding took {took:?}: too quick to tell");
    assert!(longest < took / 10, "the runtime was held for {longest:?} of {took:?}");
}

/// Reading SmolLM2's checkpoint (hashing and parsing 98 MB, building its tokenizer) and
/// building the model leave the runtime free (when the file is there).
#[tokio::test(flavor = "current_thread")]
async fn loading_a_checkpoint_leaves_the_runtime_free() {
    let Ok(path) = std::env::var("RHOSYNTH_SMOLLM2_GGUF") else {
        eprintln!("SKIPPED: set RHOSYNTH_SMOLLM2_GGUF (.ci/run fetches it)");
        return;
    };
    let (fetched, took, longest) = runtime_held(crate::decoder::checkpoint::fetch(&path)).await;
    let fetched = fetched.unwrap();
    assert!(took > Duration::from_millis(100), "reading took {took:?}: too quick to tell");
    assert!(longest < took / 10, "reading the checkpoint held the runtime for {longest:?} of {took:?}");
    let domain = domain();
    let text = RowText::new(&domain, Some(0), &fetched.tokenizer).unwrap();
    let model = TextModelSpec { domain, text, blocks: Some(2), lora: None, value_weight: 0.65, prompting: None };
    let spec = super::Dp2StageModelSpec {
        checkpoint: path,
        checkpoint_sha256: fetched.sha256,
        model,
        max_rows_per_unit: 1,
        pseudo: PseudoTraining { rows: 1, batch: 1, epochs: 1.0, learning_rate: 1e-3 },
    };
    let device = compute_device();
    let (built, took, longest) = runtime_held(spec.load_model(&device)).await;
    assert_eq!(built.unwrap().decoder.blocks.len(), 2);
    assert!(longest < took / 10, "building the model held the runtime for {longest:?} of {took:?}");
}

/// A step's work never follows which labels a unit's rows hold (their token lengths are
/// private): every row is padded to the spec's longest, so one-row units of the shortest
/// and the longest row cost the same positions.
#[test]
fn every_row_is_padded_to_the_specs_longest() {
    let model = model(None);
    let device = compute_device();
    let rows: Vec<_> =
        (0..10).flat_map(|n| (0..3).map(move |c| vec![c, n])).map(|b| model.spec.example(&b, None)).collect();
    let lengths: Vec<usize> = rows.iter().map(|r| r.tokens.len()).collect();
    let (shortest, longest) = (lengths.iter().min().unwrap(), lengths.iter().max().unwrap());
    assert!(shortest < longest, "the test needs rows of different lengths: {lengths:?}");
    let examples = TextRows { units: rows.into_iter().map(|r| vec![r]).collect() };
    let positions: Vec<usize> = (0..examples.units.len())
        .map(|u| model.losses(&examples, &[u], &[0; 32], &device, &mut Plain).units.len())
        .collect();
    assert!(positions.iter().all(|&p| p == model.spec.longest() - 1), "{positions:?} (rows {lengths:?})");
}
