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

fn invalid(message: impl Into<String>) -> PlanError {
    PlanError::new(GENERATOR, message)
}

/// A DP-2Stage job's plan. The run's sampling rate depends on the DP unit count and is
/// fixed later.
#[derive(Clone, Debug)]
pub struct Dp2StagePlan {
    pub model: Dp2StageModelSpec,
    pub pseudo: PseudoTraining,
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
    if let Some(lora) = &params.lora {
        if lora.rank == 0 || lora.targets.is_empty() || !(lora.alpha.is_finite() && lora.alpha > 0.0) {
            return Err(invalid("lora needs rank ≥ 1, alpha > 0 and at least one target"));
        }
        if let Some(t) = lora.targets.iter().find(|t| !TARGETS.contains(&t.as_str())) {
            return Err(invalid(format!("lora target {t:?} is none of {TARGETS:?}")));
        }
    }
    require_columns(GENERATOR, domain)?;
    Ok(params)
}

impl Dp2StagePlan {
    /// `tokenizer`: the checkpoint's, which fixes how rows read.
    pub fn new(
        spec: &JobSpec,
        domain: &Domain,
        options: &AccountingOptions,
        tokenizer: &TextTokenizer,
    ) -> Result<Self, PlanError> {
        let params = check(spec, domain)?;
        let mut run = run_plan!(GENERATOR, params)?;
        run.calibration = CalibrationPlan::new(spec, domain, options)?.map(Box::new);
        let target = spec.schema.target.as_ref().and_then(|t| domain.index_of(t));
        let text = RowText::new(domain, target, tokenizer).map_err(|e| invalid(e.to_string()))?;
        let lora = params.lora.as_ref().map(|l| LoraConfig::new(l.rank, l.alpha, l.targets.clone()));
        let model = Dp2StageModelSpec {
            checkpoint: params.checkpoint.clone(),
            model: TextModelSpec {
                domain: domain.clone(),
                text,
                blocks: params.blocks,
                lora,
                value_weight: params.value_weight,
            },
            max_rows_per_unit: params.max_rows_per_unit,
        };
        let pseudo = PseudoTraining {
            rows: params.pseudo_rows,
            batch: params.pseudo_batch,
            epochs: params.pseudo_epochs,
            learning_rate: params.pseudo_learning_rate,
        };
        Ok(Self { model, pseudo, params, run })
    }
}
