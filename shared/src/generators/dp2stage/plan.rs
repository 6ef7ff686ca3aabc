//! The model, stage 1 and the privacy parameters that do not depend on the data. What
//! the spec alone decides is checked at submission (`check`); how rows read needs the
//! checkpoint's tokenizer, which is public (`Dp2StagePlan::new`).

use super::model::TextModelSpec;
use super::pretrain::PseudoTraining;
use super::task::Dp2StageModelSpec;
use crate::accounting::accountant::AccountingOptions;
use crate::calibration::CalibrationPlan;
use crate::data::domain::Domain;
use crate::decoder::LoraConfig;
use crate::decoder::model::TARGETS;
use crate::decoder::tokenizer::TextTokenizer;
use crate::dpsgd::plan::{RunPlan, run_plan};
use crate::generators::row_text::RowText;
use crate::generators::{PlanError, require_columns, require_positive};
use crate::spec::{Dp2StageParams, GeneratorSpec, JobSpec};

/// This generator's name in plan errors.
const GENERATOR: &str = "dp2stage";

/// Bounds of what the coordinator computes before admission (stage 1) and of a unit's
/// forward pass.
const MAX_PSEUDO_ROWS: usize = 1_000_000;
const MAX_PSEUDO_BATCH: usize = 4096;
const MAX_PSEUDO_STEPS: f64 = 100_000.0;
const MAX_ROWS_PER_UNIT: u32 = 64;
const MAX_LORA_RANK: usize = 256;

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// A DP-2Stage job's plan. The run's sampling rate depends on the DP unit count and is
/// fixed later.
#[derive(Clone, Debug)]
pub struct Dp2StagePlan {
    pub model: Dp2StageModelSpec,
    pub params: Dp2StageParams,
    pub run: RunPlan,
}

/// The spec's parameters, checked without the checkpoint.
pub fn check(spec: &JobSpec, domain: &Domain) -> Result<Dp2StageParams, PlanError> {
    let GeneratorSpec::Dp2stage(params) = spec.generator.clone() else {
        return Err(invalid("the job's generator is another"));
    };
    run_plan!(GENERATOR, params)?;
    if params.checkpoint.trim().is_empty() {
        return Err(invalid("checkpoint: name the pretrained model (a .gguf file or a Hugging Face folder)"));
    }
    require_positive(
        GENERATOR,
        &[
            ("temperature", params.temperature),
            ("pseudo_epochs", params.pseudo_epochs),
            ("pseudo_learning_rate", params.pseudo_learning_rate),
        ],
    )?;
    if !(0.0..=1.0).contains(&params.value_weight) {
        return Err(invalid("value_weight is λ: need 0 ≤ value_weight ≤ 1"));
    }
    if params.pseudo_rows == 0 || params.pseudo_batch == 0 || params.max_rows_per_unit == 0 || params.blocks == Some(0)
    {
        return Err(invalid("pseudo_rows, pseudo_batch, max_rows_per_unit and blocks must be ≥ 1"));
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
    require_columns(GENERATOR, domain)?;
    Ok(params)
}

impl Dp2StagePlan {
    /// `tokenizer`: the checkpoint's, which fixes how rows read; `sha256`: what was read.
    pub fn new(
        spec: &JobSpec,
        domain: &Domain,
        options: &AccountingOptions,
        tokenizer: &TextTokenizer,
        sha256: &str,
    ) -> Result<Self, PlanError> {
        let params = check(spec, domain)?;
        let mut run = run_plan!(GENERATOR, params)?;
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
        let model = Dp2StageModelSpec {
            checkpoint: params.checkpoint.clone(),
            checkpoint_sha256: sha256.to_string(),
            model: TextModelSpec {
                domain: domain.clone(),
                text,
                blocks: params.blocks,
                lora,
                value_weight: params.value_weight,
            },
            max_rows_per_unit: params.max_rows_per_unit,
            pseudo,
        };
        Ok(Self { model, params, run })
    }
}
