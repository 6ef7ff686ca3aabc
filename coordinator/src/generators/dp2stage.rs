//! The language-model generators on the coordinator, DP-2Stage and HARMONIC: DP-SGD
//! generators (`super::dpsgd`) over a public pretrained checkpoint. The plan reads the
//! checkpoint and its tokenizer (public, from the spec's URL) and the public
//! reference set; stage 1 on public examples (DP-2Stage: pseudo rows from the declared
//! domain, or the rows of a named reference set; HARMONIC: the reference set, each row
//! after its nearest others) runs after admission and before anything is
//! charged; stage 2 is the engine's DP-SGD run; rows are drawn by constrained decoding.

use rhosynth_privacy::ledger::Ledger;
use rhosynth_proto::gradient_sum::Model;
use rhosynth_shared::data::domain::Domain;
use rhosynth_shared::decoder::CheckpointError;
use rhosynth_shared::decoder::checkpoint::fetch;
use rhosynth_shared::dpsgd::compute_device;
use rhosynth_shared::dpsgd::params::TrainableLayers;
use rhosynth_shared::dpsgd::plan::RunPlan;
use rhosynth_shared::entropy::os_seed;
use rhosynth_shared::generators::dp2stage::plan::check;
use rhosynth_shared::generators::dp2stage::pretrain::pretrain;
use rhosynth_shared::generators::dp2stage::{Dp2StageModelSpec, Dp2StagePlan, LanguageModelParams, TextSampler};
use rhosynth_shared::generators::harmonic::Prompting;
use rhosynth_shared::generators::{GeneratorName, GeneratorSpec, PlanError, Sampler};
use rhosynth_shared::output::Manifest;
use rhosynth_shared::spec::JobSpec;
use rhosynth_shared::storage;

use super::dpsgd::{DpSgdGenerator, RoundModel, Trained};
use crate::context::{JobError, blocking};

/// A language-model generator: HARMONIC when its examples are prompted with reference
/// rows, DP-2Stage otherwise.
pub struct LanguageModel<const HARMONIC: bool>;

pub type Dp2Stage = LanguageModel<false>;
pub type Harmonic = LanguageModel<true>;

impl<const HARMONIC: bool> LanguageModel<HARMONIC> {
    const GENERATOR: GeneratorName = if HARMONIC { GeneratorName::Harmonic } else { GeneratorName::Dp2stage };

    /// Reading the operator's checkpoint failed (its store, not the job's data).
    fn read_error(e: impl std::fmt::Display) -> JobError {
        JobError::Model(format!("{}: {e}", Self::GENERATOR.as_str()))
    }

    /// What public information alone decides (the spec against the checkpoint, stage 1).
    fn plan_error(e: impl std::fmt::Display) -> JobError {
        JobError::Plan(PlanError::new(Self::GENERATOR.as_str(), e.to_string()))
    }

    /// What guarantee the reference set at `url` carries, for the manifest. Anything at,
    /// in or around one of this dataset's releases must be that release as this ledger
    /// holds it, whatever its manifest says: charged and released *there* (else its cost
    /// could be missing from the data's total, or the files be another's), with the
    /// manifest whose SHA-256 the ledger recorded (so neither a part nor the manifest was
    /// changed since); the output's guarantee is then both charges composed. Elsewhere, a
    /// release of another dataset carries that dataset's guarantee, and a table without a
    /// manifest is the operator's public data.
    fn reference_guarantee(
        url: &str,
        read: &str,
        manifest: Option<(Manifest, String)>,
        ledger: &Ledger,
    ) -> Result<String, JobError> {
        if storage::nested(url, ledger.url()) {
            return Err(Self::plan_error("reference overlaps the job's ledger"));
        }
        let released_here = ledger.release_locations().find(|(_, location)| storage::nested(url, location));
        let (m, manifest_sha256) = match (manifest, released_here) {
            (None, None) => return Ok(format!("{read}: public data, as declared")),
            (None, Some((charge, _))) => {
                return Err(Self::plan_error(format!(
                    "reference: {url} holds files of this dataset's release (ledger entry {charge}) without its \
                     manifest; a release is read with the manifest it was released with"
                )));
            }
            (Some(manifest), _) => manifest,
        };
        let p = &m.privacy;
        let release = format!(
            "{read}: a rhosynth release of dataset {} by job {} (ε = {}, δ = {}, ledger entry {})",
            p.dataset_id, m.job_id, p.epsilon, p.delta, p.ledger_entry
        );
        if p.dataset_id != ledger.dataset_id() && released_here.is_none() {
            return Ok(format!("{release}; another dataset's release carries that dataset's guarantee"));
        }
        let charged = p.dataset_id == ledger.dataset_id()
            && ledger.charged(p.ledger_entry).is_some_and(|(request, _)| request.job_id == m.job_id);
        let here = ledger
            .release_location(p.ledger_entry)
            .is_some_and(|location| storage::canonical_url(location) == storage::canonical_url(url));
        if !(charged && here) {
            return Err(Self::plan_error(format!(
                "reference: a release of this dataset (job {}, ledger entry {}) that this ledger did not charge and \
                 release at {url}: its cost could be missing from the data's total",
                m.job_id, p.ledger_entry
            )));
        }
        if ledger.published(p.ledger_entry) != Some(manifest_sha256.as_str()) {
            return Err(Self::plan_error(format!(
                "reference: the manifest at {url} is not the one this ledger recorded when entry {} was released \
                 (changed since, or released before manifests were recorded)",
                p.ledger_entry
            )));
        }
        Ok(format!("{release}; this output's guarantee is both charges composed, as this ledger holds them"))
    }

    fn params(spec: &JobSpec) -> Result<&LanguageModelParams, JobError> {
        match &spec.generator {
            GeneratorSpec::Dp2stage(p) if !HARMONIC => Ok(p),
            GeneratorSpec::Harmonic(p) if HARMONIC => Ok(p),
            _ => Err(JobError::Internal(format!("not a {} job", Self::GENERATOR.as_str()))),
        }
    }
}

impl<const HARMONIC: bool> DpSgdGenerator for LanguageModel<HARMONIC> {
    const NAME: GeneratorName = Self::GENERATOR;
    type Model = Dp2StageModelSpec;

    /// Reads the public checkpoint and fixes how rows read with its tokenizer; reads the
    /// public reference set (HARMONIC's prompts, or DP-2Stage's stage-1 table).
    async fn plan(spec: &JobSpec, domain: &Domain, ledger: &Ledger) -> Result<(Dp2StageModelSpec, RunPlan), JobError> {
        let params = Self::params(spec)?;
        check(spec, domain)?;
        let fetched = fetch(&params.checkpoint).await.map_err(Self::read_error)?;
        // The reference set is public (a declared table or release): what reading it found
        // may be shown.
        let prompting = match &params.reference {
            Some(url) => {
                let (mut prompting, manifest) = Prompting::load(
                    spec,
                    domain,
                    url,
                    params.reference_rows,
                    if HARMONIC { params.neighbours } else { 0 },
                )
                .await
                .map_err(Self::plan_error)?;
                prompting.source = Self::reference_guarantee(url, &prompting.source, manifest, ledger)?;
                Some(prompting)
            }
            None => None,
        };
        let plan = Dp2StagePlan::new(spec, domain, ledger.options(), &fetched.tokenizer, &fetched.sha256, prompting)?;
        // What the spec asks of the checkpoint is checked here, before admission.
        let config = fetched.checkpoint.config();
        let text = &plan.model.model.text;
        if params.blocks.is_some_and(|k| k > config.layers) {
            return Err(Self::plan_error(format!(
                "blocks = {}: the checkpoint has {}",
                params.blocks.unwrap_or_default(),
                config.layers
            )));
        }
        let longest = plan.model.model.longest();
        if longest > config.positions {
            return Err(Self::plan_error(format!(
                "an example is up to {longest} tokens; the model's context is {}",
                config.positions
            )));
        }
        if text.vocabulary().last().is_some_and(|&t| t as usize >= config.vocabulary) {
            return Err(Self::plan_error("the checkpoint's tokenizer and model do not belong together"));
        }
        Ok((plan.model, plan.run))
    }

    /// Stage 1 on a blocking thread: the checkpoint (the bytes the plan read) trained on
    /// public examples with a non-private seed; no private data.
    async fn initial_parameters(model: &Dp2StageModelSpec) -> Result<Vec<f32>, JobError> {
        let device = compute_device();
        let mut text_model = model.load_model(&device).await.map_err(|e| match e {
            CheckpointError::Format(message) => Self::plan_error(message),
            other => Self::read_error(other),
        })?;
        let pseudo = model.pseudo.clone();
        let seed = u64::from_le_bytes(os_seed().map_err(Self::read_error)?[..8].try_into().expect("8 bytes"));
        blocking(move || -> Result<Vec<f32>, JobError> {
            let losses = pretrain(&mut text_model, &pseudo, seed).map_err(Self::plan_error)?;
            let parameters = text_model.parameters();
            if !parameters.iter().all(|p| p.is_finite()) {
                return Err(Self::plan_error("stage 1 diverged (non-finite weights): lower pseudo_learning_rate"));
            }
            tracing::info!(
                seed,
                steps = losses.len(),
                first_loss = losses.first().copied().unwrap_or_default(),
                last_loss = losses.last().copied().unwrap_or_default(),
                generator = Self::GENERATOR.as_str(),
                "stage 1 (public examples) trained"
            );
            Ok(parameters)
        })
        .await?
    }

    fn domain(model: &Dp2StageModelSpec) -> &Domain {
        &model.model.domain
    }

    /// The same model every round: encoded once.
    fn round_model<'a>(model: &Dp2StageModelSpec, _: &'a JobSpec, _: f64) -> Result<RoundModel<'a>, JobError> {
        let wire = rhosynth_proto::Dp2StageModel::from(model);
        Ok(Box::new(move |_| Model::Dp2stage(wire.clone())))
    }

    fn public_inputs(model: &Dp2StageModelSpec) -> Vec<String> {
        let mut inputs = vec![format!("checkpoint: {} (SHA-256 {})", model.checkpoint, model.checkpoint_sha256)];
        if let Some(p) = &model.model.prompting {
            let used = if HARMONIC { format!("prompts (k = {}) and stage 1", p.neighbours) } else { "stage 1".into() };
            inputs.push(format!("reference set of the {used}: {}", p.source));
        }
        inputs
    }

    async fn sampler(trained: Trained<'_, '_, Dp2StageModelSpec>) -> Result<Box<dyn Sampler>, JobError> {
        let temperature = Self::params(trained.ctx.spec())?.temperature;
        let mut model = trained.model.load_model(&compute_device()).await.map_err(Self::read_error)?;
        model.load_parameters(&trained.parameters).map_err(|e| JobError::Model(e.to_string()))?;
        Ok(Box::new(TextSampler { decoder: model.decoder, spec: trained.model.model, temperature }))
    }
}

#[cfg(test)]
mod tests {
    use rhosynth_privacy::ledger::{Budget, ChargeRequest};
    use rhosynth_shared::accounting::accountant::{Accountant, AccountingOptions};
    use rhosynth_shared::accounting::mechanism::{Adjacency, Mechanism};

    use super::*;

    fn manifest(job_id: &str, ledger_entry: u64) -> Manifest {
        serde_json::from_value(serde_json::json!({
            "format": "rhosynth.manifest.v1", "rhosynth_version": "test", "job_id": job_id,
            "generator": "marginals", "created_at": "2026-11-26T00:00:00Z", "rows": 0, "columns": [],
            "parts": [], "privacy": {"epsilon": 1.0, "delta": 1e-6, "accountant": "rdp", "mechanisms": [],
            "dataset_id": "d", "ledger_url": "l", "ledger_entry": ledger_entry, "public_inputs": []}
        }))
        .unwrap()
    }

    /// A release of this dataset is a reference only as released: charged and released
    /// there, with the manifest whose SHA-256 the ledger recorded (a release rewritten
    /// whole, manifest and parts, is refused), and files of a release without its
    /// manifest are not public data.
    #[tokio::test]
    async fn a_reference_is_the_release_the_ledger_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let location = storage::open(dir.path().join("ledger").to_str().unwrap()).unwrap();
        let budget = Budget { epsilon: 10.0, delta: 1e-6 };
        let mut ledger =
            Ledger::init(&location, "d", budget, Adjacency::AddRemove, AccountingOptions::default()).await.unwrap();
        let mechanisms = vec![Mechanism::Gaussian {
            l2_sensitivity: 1.0,
            noise_multiplier: 10.0,
            releases: 1,
            adjacency: Adjacency::AddRemove,
        }];
        let request = ChargeRequest { job_id: "j".into(), mechanisms, accountant: Accountant::Rdp, delta: 1e-6 };
        let receipt = ledger.charge(&request).await.unwrap();
        let release = dir.path().join("releases/one").display().to_string();
        ledger.record_release(receipt.seq, &release).await.unwrap();
        ledger.record_published(receipt.seq, "aa").await.unwrap();
        let guarantee = |url: &str, m: Option<(Manifest, String)>| {
            Harmonic::reference_guarantee(url, "read", m, &ledger).map_err(|e| e.submitter_message())
        };

        let ok = guarantee(&release, Some((manifest("j", receipt.seq), "aa".into()))).unwrap();
        assert!(ok.contains("both charges composed"), "{ok}");
        let rewritten = guarantee(&release, Some((manifest("j", receipt.seq), "bb".into()))).unwrap_err();
        assert!(rewritten.contains("not the one this ledger recorded"), "{rewritten}");
        for url in [release.clone(), format!("{release}/part-00000.parquet")] {
            let bare = guarantee(&url, None).unwrap_err();
            assert!(bare.contains("without its manifest"), "{bare}");
        }
        // A manifest claiming another dataset, at or around this dataset's release: still
        // this dataset's release, and not the one recorded.
        let mut forged = manifest("j", receipt.seq);
        forged.privacy.dataset_id = "other".into();
        let parent = dir.path().join("releases").display().to_string();
        for url in [&release, &parent] {
            let err = guarantee(url, Some((forged.clone(), "cc".into()))).unwrap_err();
            assert!(err.contains("this ledger did not charge and release"), "{err}");
        }
        let elsewhere = dir.path().join("elsewhere").display().to_string();
        let other = guarantee(&elsewhere, Some((forged, "cc".into()))).unwrap();
        assert!(other.contains("another dataset's release"), "{other}");
        let public = guarantee(&dir.path().join("public.csv").display().to_string(), None).unwrap();
        assert!(public.contains("public data"), "{public}");
    }
}
