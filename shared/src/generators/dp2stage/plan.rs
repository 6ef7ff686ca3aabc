//! The model, stage 1 and the privacy parameters that do not depend on the data. What
//! the spec alone decides is checked at submission (`check`); how rows read needs the
//! checkpoint's tokenizer, which is public (`Dp2StagePlan::new`).

use super::model::TextModelSpec;
use super::pretrain::PseudoTraining;
use super::prompting::Prompting;
use super::row_text::RowText;
use super::task::Dp2StageModelSpec;
use crate::accounting::accountant::AccountingOptions;
use crate::calibration::CalibrationPlan;
use crate::data::domain::Domain;
use crate::decoder::LoraConfig;
use crate::decoder::model::TARGETS;
use crate::decoder::tokenizer::TextTokenizer;
use crate::dpsgd::plan::RunPlan;
use crate::generators::dp2stage::LanguageModelParams;
use crate::generators::reference::check_location;
use crate::generators::{GeneratorSpec, PlanError, require_columns, require_positive};
use crate::spec::JobSpec;

/// Bounds of what the coordinator computes before admission (stage 1) and of a unit's
/// forward pass.
const MAX_PSEUDO_ROWS: usize = 1_000_000;
const MAX_PSEUDO_BATCH: usize = 4096;
const MAX_PSEUDO_STEPS: f64 = 100_000.0;
const MAX_ROWS_PER_UNIT: u32 = 64;
const MAX_LORA_RANK: usize = 256;
/// HARMONIC: bounds of the reference set sent with the model (rows, bins in all) and of a
/// prompt.
const MAX_REFERENCE_ROWS: usize = 100_000;
const MAX_REFERENCE_CELLS: usize = 5_000_000;
const MAX_NEIGHBOURS: usize = 16;
/// Most tokens a unit's examples take together (one forward pass on a worker), so that a
/// worker's memory never depends on how many rows the sampled units really have.
const MAX_UNIT_TOKENS: usize = 32_768;

/// A DP-2Stage job's plan. The run's sampling rate depends on the DP unit count and is
/// fixed later.
#[derive(Clone, Debug)]
pub struct Dp2StagePlan {
    pub model: Dp2StageModelSpec,
    pub params: LanguageModelParams,
    pub run: RunPlan,
}

/// Checks the spec's parameters (DP-2Stage's or HARMONIC's) without the checkpoint or the
/// reference set: how rows read needs the checkpoint's tokenizer, checked when the job
/// runs.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<(), PlanError> {
    checked_params(spec, domain).map(drop)
}

/// The spec's parameters, checked as [`check`] does.
fn checked_params(spec: &JobSpec, domain: &Domain) -> Result<LanguageModelParams, PlanError> {
    let generator = spec.generator.name().as_str();
    let invalid = |message: String| PlanError::new(generator, message);
    let (GeneratorSpec::Dp2stage(params) | GeneratorSpec::Harmonic(params)) = spec.generator.clone() else {
        return Err(invalid("the job's generator is another".into()));
    };
    RunPlan::new(generator, &params.run)?;
    let harmonic = matches!(spec.generator, GeneratorSpec::Harmonic(_));
    if harmonic && params.reference.is_none() {
        return Err(invalid(
            "reference: name the public reference set prompts are made of (a public table or a rhosynth release in \
             this job's schema, e.g. a marginals job's output; never private data)"
                .into(),
        ));
    }
    if (harmonic && !(1..=MAX_NEIGHBOURS).contains(&params.neighbours))
        || !(1..=MAX_REFERENCE_ROWS).contains(&params.reference_rows)
        || params.reference_rows.saturating_mul(domain.columns.len()) > MAX_REFERENCE_CELLS
    {
        return Err(invalid(format!(
            "need 1 ≤ neighbours ≤ {MAX_NEIGHBOURS}, 1 ≤ reference_rows ≤ {MAX_REFERENCE_ROWS} and reference_rows × \
             columns ≤ {MAX_REFERENCE_CELLS}"
        )));
    }
    if let Some(reference) = &params.reference {
        check_location(spec, reference).map_err(invalid)?;
    }
    if params.checkpoint.trim().is_empty() {
        return Err(invalid("checkpoint: name the pretrained model (a .gguf file or a Hugging Face folder)".into()));
    }
    require_positive(
        generator,
        &[
            ("temperature", params.temperature),
            ("pseudo_epochs", params.pseudo_epochs),
            ("pseudo_learning_rate", params.pseudo_learning_rate),
        ],
    )?;
    if !(0.0..=1.0).contains(&params.value_weight) {
        return Err(invalid("value_weight is λ: need 0 ≤ value_weight ≤ 1".into()));
    }
    if params.pseudo_rows == 0 || params.pseudo_batch == 0 || params.max_rows_per_unit == 0 || params.blocks == Some(0)
    {
        return Err(invalid("pseudo_rows, pseudo_batch, max_rows_per_unit and blocks must be ≥ 1".into()));
    }
    // Stage 1 runs on the coordinator before the charge: its size is bounded here.
    let steps = params.pseudo_epochs * params.pseudo_rows as f64 / params.pseudo_batch as f64;
    if params.pseudo_rows > MAX_PSEUDO_ROWS || params.pseudo_batch > MAX_PSEUDO_BATCH || steps > MAX_PSEUDO_STEPS {
        return Err(invalid(format!(
            "stage 1 is bounded: pseudo_rows ≤ {MAX_PSEUDO_ROWS}, pseudo_batch ≤ {MAX_PSEUDO_BATCH}, \
             pseudo_epochs · pseudo_rows / pseudo_batch ≤ {MAX_PSEUDO_STEPS}"
        )));
    }
    if params.max_rows_per_unit > MAX_ROWS_PER_UNIT {
        return Err(invalid(format!("max_rows_per_unit ≤ {MAX_ROWS_PER_UNIT}: a unit's rows are one forward pass")));
    }
    if let Some(lora) = &params.lora {
        let alpha = lora.alpha.is_finite() && lora.alpha > 0.0;
        if lora.rank == 0 || lora.rank > MAX_LORA_RANK || lora.targets.is_empty() || !alpha {
            return Err(invalid(format!("lora needs 1 ≤ rank ≤ {MAX_LORA_RANK}, alpha > 0 and at least one target")));
        }
        if let Some(t) = lora.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
            return Err(invalid(format!("lora target {t:?} is none of {TARGETS:?}")));
        }
    }
    require_columns(generator, domain)?;
    Ok(params)
}

impl Dp2StagePlan {
    /// `tokenizer`: the checkpoint's, which fixes how rows read; `sha256`: what was read;
    /// `prompting`: the public reference set (HARMONIC's prompts; DP-2Stage's stage-1
    /// table, k = 0).
    pub fn new(
        spec: &JobSpec,
        domain: &Domain,
        options: &AccountingOptions,
        tokenizer: &TextTokenizer,
        sha256: &str,
        prompting: Option<Prompting>,
    ) -> Result<Self, PlanError> {
        let params = checked_params(spec, domain)?;
        let generator = spec.generator.name().as_str();
        let invalid = |message: String| PlanError::new(generator, message);
        if prompting.is_some() != params.reference.is_some() {
            return Err(invalid("a reference set read goes with the spec's `reference`, and only with it".into()));
        }
        let mut run = RunPlan::new(generator, &params.run)?;
        run.calibration = CalibrationPlan::new(spec, domain, options)?.map(Box::new);
        let target = spec.schema.target.as_ref().and_then(|t| domain.index_of(t));
        let text = RowText::new(domain, target, tokenizer).map_err(|e| invalid(e.to_string()))?;
        let lora = params.lora.as_ref().map(|l| LoraConfig::new(l.rank, l.alpha, l.targets.clone()));
        let pseudo = PseudoTraining {
            rows: params.pseudo_rows,
            batch: params.pseudo_batch,
            epochs: params.pseudo_epochs,
            learning_rate: params.pseudo_learning_rate,
        };
        let model = TextModelSpec {
            domain: domain.clone(),
            text,
            blocks: params.blocks,
            lora,
            value_weight: params.value_weight,
            prompting,
        };
        let unit_tokens = model.longest().saturating_mul(params.max_rows_per_unit as usize);
        if unit_tokens > MAX_UNIT_TOKENS {
            return Err(invalid(format!(
                "a unit's examples take up to {unit_tokens} tokens (max_rows_per_unit × an example's); at most \
                 {MAX_UNIT_TOKENS}: lower max_rows_per_unit or neighbours"
            )));
        }
        let model = Dp2StageModelSpec {
            checkpoint: params.checkpoint.clone(),
            checkpoint_sha256: sha256.to_string(),
            model,
            max_rows_per_unit: params.max_rows_per_unit,
            pseudo,
        };
        Ok(Self { model, params, run })
    }
}
