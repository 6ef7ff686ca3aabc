//! HARMONIC's invariants: prompts are the nearest public reference rows by the declared
//! distance; a prompted example trains only its answer (one private row); stage 1's
//! examples are reference rows after their other nearest reference rows; every row sampled
//! after a prompt parses; the spec must name a reference set.

use burn::tensor::activation::log_softmax;
use rand::SeedableRng;
use rand::rngs::{ChaCha8Rng, ChaCha20Rng};

use crate::decoder::TokenBatch;
use crate::dpsgd::DpModel;
use crate::dpsgd::compute_device;
use crate::dpsgd::ghost::Plain;
use crate::generators::dp2stage::model::TextRows;
use crate::generators::dp2stage::pretrain::{PseudoTraining, pretrain};
use crate::generators::dp2stage::tests::{check_against_naive, domain, model};
use crate::generators::dp2stage::{Prompting, TextModel, TextSampler};

/// Rows (c, n) of the test domain (c: 3 categories, n: 1..=10, bin = n − 1).
fn reference() -> Prompting {
    let rows = [(0, 1), (0, 2), (1, 5), (1, 6), (2, 9), (2, 10), (0, 9), (1, 1)];
    Prompting { reference: rows.iter().map(|&(c, n)| vec![c, n - 1]).collect(), neighbours: 2, source: "test".into() }
}

#[test]
fn prompts_are_the_nearest_reference_rows_farthest_first() {
    let (domain, p) = (domain(), reference());
    // (b, 4): (b, 5) at 1/9, then (b, 6) at 2/9; (b, 1) at 3/9 is third.
    assert_eq!(p.nearest(&domain, &[1, 3], None), vec![3, 2]);
    // (b, 5) is row 2: at distance 0 it is the nearest unless left out, then (b, 1) at 4/9.
    assert_eq!(p.nearest(&domain, &p.row(2), None), vec![3, 2]);
    assert_eq!(p.nearest(&domain, &p.row(2), Some(2)), vec![7, 3]);
    // (c, 1): (c, 9) at 8/9, then (a, 1), (c, 10) and (b, 1) tie at 1: the earliest row.
    assert_eq!(p.nearest(&domain, &[2, 0], None), vec![0, 4]);
}

/// An example's loss is its answer's: the prompt's tokens carry no weight (the loss equals
/// the mean λ-weighted log-loss of the answer's tokens, computed here by hand).
#[test]
fn a_prompted_example_trains_only_its_answer() {
    let mut m = model(None);
    m.spec.prompting = Some(reference());
    let row = vec![1, 4];
    let example = m.spec.example(&row, None);
    let answer = m.spec.text.encode(&row);
    assert_eq!(&example.tokens[example.prompt..], &answer.tokens[..], "the answer is the row");
    let context: Vec<u32> = [3, 2].iter().flat_map(|&n| m.spec.text.encode(&reference().row(n)).tokens).collect();
    assert_eq!(&example.tokens[..example.prompt], &context[..], "the prompt is its nearest reference rows");

    let examples = TextRows { units: vec![vec![example.clone()]] };
    let device = compute_device();
    let got: f32 = m.losses(&examples, &[0], &[0; 32], &device, &mut Plain).losses.into_scalar();
    let t = &example.tokens;
    let batch = TokenBatch { tokens: &t[..t.len() - 1], sequences: 1, length: t.len() - 1, lagged: &[] };
    let logp = log_softmax(m.decoder.forward(&batch, &mut Plain), 1).into_data().try_to_vec::<f32>().unwrap();
    let vocabulary = m.decoder.vocabulary();
    let (mut sum, mut weights) = (0.0f64, 0.0f64);
    for p in example.prompt.max(1) - 1..t.len() - 1 {
        let w = if example.value[p + 1] { 0.65 } else { 0.35 };
        sum -= w * f64::from(logp[p * vocabulary + t[p + 1] as usize]);
        weights += w;
    }
    let expected = sum / weights;
    assert!((f64::from(got) - expected).abs() < 1e-4 * expected.abs(), "loss {got} against the answer's {expected}");
}

/// A unit of several prompted rows is still one clipped gradient: ghost clipping equals
/// the per-unit loop.
#[test]
fn a_unit_of_prompted_rows_is_clipped_once() {
    let mut m = model(None);
    m.spec.prompting = Some(reference());
    check_against_naive(&m, "prompted rows");
}

/// Stage 1 reads only the reference set: each example is a reference row after its
/// nearest other reference rows; it learns them, and every row sampled after a prompt of
/// reference rows parses.
#[test]
fn stage_one_trains_on_reference_rows_and_prompted_rows_parse() {
    let mut m: TextModel = model(None);
    let p = reference();
    m.spec.prompting = Some(p.clone());
    let examples = m.spec.public_examples(200, &mut ChaCha8Rng::seed_from_u64(1));
    for e in &examples {
        let i = (0..p.reference.len())
            .find(|&i| *e == m.spec.example(&p.row(i), Some(i)))
            .expect("a reference row after its nearest other reference rows");
        assert!(!p.nearest(&m.spec.domain, &p.row(i), Some(i)).contains(&i));
    }
    let training = PseudoTraining { rows: 256, batch: 32, epochs: 8.0, learning_rate: 3e-3 };
    let losses = pretrain(&mut m, &training, 7).unwrap();
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(mean(&losses[losses.len() - 8..]) < 0.5 * mean(&losses[..8]), "stage 1 learns");
    let sampler = TextSampler { decoder: m.decoder, spec: m.spec, temperature: 1.0 };
    let rows = sampler.draw_bins(300, &mut ChaCha20Rng::seed_from_u64(3));
    assert_eq!(rows.len(), 300);
    let domain = domain();
    assert!(rows.iter().all(|r| r.iter().zip(&domain.columns).all(|(&b, c)| b < c.bins())));
    // Trained on the reference rows only, the model writes mostly reference rows.
    let known =
        rows.iter().filter(|r| p.reference.iter().any(|q| q.iter().zip(r.iter()).all(|(&a, &b)| a as usize == b)));
    assert!(known.count() > 150, "rows like the reference set's");
}

/// DP-2Stage with a reference set (k = 0): stage 1's examples are the reference rows as
/// they are, and sampling has no prompt.
#[test]
fn a_public_table_for_stage_one_is_read_without_prompts() {
    let mut m = model(None);
    let p = Prompting { neighbours: 0, ..reference() };
    m.spec.prompting = Some(p.clone());
    for e in m.spec.public_examples(50, &mut ChaCha8Rng::seed_from_u64(2)) {
        assert_eq!(e.prompt, 0);
        assert!((0..p.reference.len()).any(|i| e == m.spec.text.encode(&p.row(i))), "a reference row");
    }
    assert!(m.spec.sampling_prompt(&mut ChaCha8Rng::seed_from_u64(3)).is_empty());
    assert_eq!(m.spec.longest(), m.spec.text.longest());
}

/// HARMONIC needs a reference set (DP-2Stage may name one), and k is bounded.
#[test]
fn the_spec_names_a_reference_set() {
    let check = |name: &str, section: &str| {
        let spec =
            crate::testing::demo_job(&crate::testing::generator(name, &format!("checkpoint = \"m.gguf\"\n{section}")));
        let domain = crate::data::domain::Domain::from_spec(&spec);
        crate::generators::dp2stage::plan::check(&spec, &domain).map(drop).map_err(|e| e.to_string())
    };
    assert!(check("harmonic", "reference = \"out/marginals\"").is_ok());
    // DP-2Stage may name one for stage 1 (its k is unused).
    assert!(check("dp2stage", "reference = \"out/marginals\"\nneighbours = 0").is_ok());
    for (name, section, says) in [
        ("harmonic", "", "harmonic generator: reference"),
        ("harmonic", "reference = \"r\"\nneighbours = 0", "neighbours"),
        ("harmonic", "reference = \"r\"\nneighbours = 17", "neighbours"),
        ("harmonic", "reference = \"r\"\nreference_rows = 0", "reference_rows"),
        ("harmonic", "reference = \"./rhosynth-out/demo/input\"", "overlaps the job's private data"),
        ("harmonic", "reference = \"releases/../rhosynth-out/demo/input\"", "`..`"),
    ] {
        let err = check(name, section).unwrap_err();
        assert!(err.contains(says), "{name} {section}: {err}");
    }
}

/// A release written before the project was renamed (`dpsynth demo --patients 30`:
/// format `dpsynth.manifest.v1`, `dpsynth_version`) is still read as a reference set, with
/// its manifest; a manifest of another format is refused.
#[tokio::test]
async fn a_release_written_under_the_old_name_is_a_reference() {
    let spec = crate::spec::JobSpec::parse(include_str!("../../../../examples/demo.toml"), "demo").unwrap();
    let domain = crate::data::domain::Domain::from_spec(&spec);
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/dpsynth-release");
    let (prompting, manifest) = Prompting::load(&spec, &domain, fixture, 100, 2).await.unwrap();
    let (manifest, _) = manifest.expect("the release's manifest");
    assert_eq!((manifest.format.as_str(), manifest.rhosynth_version.as_str()), ("dpsynth.manifest.v1", "0.1.0"));
    assert_eq!((manifest.privacy.dataset_id.as_str(), manifest.privacy.ledger_entry), ("demo-icu-vitals", 1));
    assert_eq!(prompting.reference.len(), manifest.rows as usize);

    let dir = tempfile::tempdir().unwrap();
    for file in ["_manifest.json", "part-00000.parquet"] {
        std::fs::copy(format!("{fixture}/{file}"), dir.path().join(file)).unwrap();
    }
    let text = std::fs::read_to_string(dir.path().join("_manifest.json")).unwrap();
    std::fs::write(dir.path().join("_manifest.json"), text.replace("dpsynth.manifest.v1", "other.manifest.v9"))
        .unwrap();
    let err = Prompting::load(&spec, &domain, dir.path().to_str().unwrap(), 100, 2).await.unwrap_err().to_string();
    assert!(err.contains("format \"other.manifest.v9\""), "{err}");
}
