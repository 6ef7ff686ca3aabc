//! `[generator]`: which generator, and at most its own section of parameters (each
//! generator's parameters live in its folder, `params.rs`).

use serde::{Deserialize, Serialize};

use super::aim::AimParams;
use super::dp2stage::LanguageModelParams;
use super::findiff::FinDiffParams;
use super::history_copula::HistoryCopulaParams;
use super::marginals::MarginalsParams;
use super::pate::PateParams;
use super::sequence::SequenceParams;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GeneratorName {
    Marginals,
    Aim,
    Findiff,
    Pate,
    Sequence,
    Dp2stage,
    Harmonic,
    HistoryCopula,
}

impl std::str::FromStr for GeneratorName {
    type Err = String;

    /// A name as `[generator] name` spells it.
    fn from_str(s: &str) -> Result<Self, String> {
        let name = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s);
        Self::deserialize(name).map_err(|e| e.to_string())
    }
}

impl GeneratorName {
    pub fn as_str(self) -> &'static str {
        match self {
            GeneratorName::Marginals => "marginals",
            GeneratorName::Aim => "aim",
            GeneratorName::Findiff => "findiff",
            GeneratorName::Pate => "pate",
            GeneratorName::Sequence => "sequence",
            GeneratorName::Dp2stage => "dp2stage",
            GeneratorName::Harmonic => "harmonic",
            GeneratorName::HistoryCopula => "history_copula",
        }
    }

    /// Whether the DP-SGD engine trains the generator's model.
    pub fn trained_by_dpsgd(self) -> bool {
        matches!(
            self,
            GeneratorName::Findiff | GeneratorName::Sequence | GeneratorName::Dp2stage | GeneratorName::Harmonic
        )
    }
}

/// The generator and its parameters. In TOML, `[generator] name = "…"` and at most the
/// named generator's own section (`[generator.pate]`): a section of another generator is
/// refused, never silently ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "GeneratorSection", into = "GeneratorSection")]
pub enum GeneratorSpec {
    Marginals(MarginalsParams),
    Aim(AimParams),
    Findiff(FinDiffParams),
    Pate(PateParams),
    Sequence(SequenceParams),
    Dp2stage(LanguageModelParams),
    Harmonic(LanguageModelParams),
    HistoryCopula(HistoryCopulaParams),
}

/// Bins of numeric columns that declare none, for every generator but marginals (whose
/// `default_bins` sets it).
pub const DEFAULT_BINS: u32 = 32;

impl GeneratorSpec {
    pub fn name(&self) -> GeneratorName {
        match self {
            GeneratorSpec::Marginals(_) => GeneratorName::Marginals,
            GeneratorSpec::Aim(_) => GeneratorName::Aim,
            GeneratorSpec::Findiff(_) => GeneratorName::Findiff,
            GeneratorSpec::Pate(_) => GeneratorName::Pate,
            GeneratorSpec::Sequence(_) => GeneratorName::Sequence,
            GeneratorSpec::Dp2stage(_) => GeneratorName::Dp2stage,
            GeneratorSpec::Harmonic(_) => GeneratorName::Harmonic,
            GeneratorSpec::HistoryCopula(_) => GeneratorName::HistoryCopula,
        }
    }

    /// The public reference set the generator reads when it plans (HARMONIC's prompts,
    /// DP-2Stage's and the sequence model's stage 1), if the spec names one.
    pub fn reference(&self) -> Option<&str> {
        match self {
            GeneratorSpec::Dp2stage(p) | GeneratorSpec::Harmonic(p) => p.reference.as_deref(),
            GeneratorSpec::Sequence(p) => p.reference.as_deref(),
            _ => None,
        }
    }

    /// Whether the generator draws whole histories (its output is counted in units), not
    /// rows.
    pub fn draws_histories(&self) -> bool {
        match self {
            GeneratorSpec::Sequence(_) | GeneratorSpec::HistoryCopula(_) => true,
            GeneratorSpec::Marginals(p) => p.history_rows.is_some(),
            _ => false,
        }
    }

    /// Checks the generator's parameters where that needs no schema.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            GeneratorSpec::Marginals(p) => p.validate(),
            GeneratorSpec::Aim(p) => p.validate(),
            GeneratorSpec::Findiff(_)
            | GeneratorSpec::Pate(_)
            | GeneratorSpec::Sequence(_)
            | GeneratorSpec::Dp2stage(_)
            | GeneratorSpec::Harmonic(_)
            | GeneratorSpec::HistoryCopula(_) => Ok(()),
        }
    }

    /// Bins of numeric columns that declare none (the public domain's discretisation).
    pub fn default_bins(&self) -> u32 {
        match self {
            GeneratorSpec::Marginals(p) => p.default_bins,
            GeneratorSpec::Aim(p) => p.default_bins,
            _ => DEFAULT_BINS,
        }
    }
}

/// `[generator]` as written.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GeneratorSection {
    name: GeneratorName,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marginals: Option<MarginalsParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aim: Option<AimParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    findiff: Option<FinDiffParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pate: Option<PateParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sequence: Option<SequenceParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dp2stage: Option<LanguageModelParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    harmonic: Option<LanguageModelParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history_copula: Option<HistoryCopulaParams>,
}

impl TryFrom<GeneratorSection> for GeneratorSpec {
    type Error = String;

    fn try_from(s: GeneratorSection) -> Result<Self, String> {
        let given = [
            (GeneratorName::Marginals, s.marginals.is_some()),
            (GeneratorName::Aim, s.aim.is_some()),
            (GeneratorName::Findiff, s.findiff.is_some()),
            (GeneratorName::Pate, s.pate.is_some()),
            (GeneratorName::Sequence, s.sequence.is_some()),
            (GeneratorName::Dp2stage, s.dp2stage.is_some()),
            (GeneratorName::Harmonic, s.harmonic.is_some()),
            (GeneratorName::HistoryCopula, s.history_copula.is_some()),
        ];
        if let Some((other, _)) = given.iter().find(|(n, present)| *present && *n != s.name) {
            return Err(format!(
                "[generator.{}] belongs to another generator; this job's generator is \"{}\"",
                other.as_str(),
                s.name.as_str()
            ));
        }
        Ok(match s.name {
            GeneratorName::Marginals => GeneratorSpec::Marginals(s.marginals.unwrap_or_default()),
            GeneratorName::Aim => GeneratorSpec::Aim(s.aim.unwrap_or_default()),
            GeneratorName::Findiff => GeneratorSpec::Findiff(s.findiff.unwrap_or_default()),
            GeneratorName::Pate => GeneratorSpec::Pate(s.pate.unwrap_or_default()),
            GeneratorName::Sequence => GeneratorSpec::Sequence(s.sequence.unwrap_or_default()),
            GeneratorName::Dp2stage => GeneratorSpec::Dp2stage(s.dp2stage.unwrap_or_default()),
            GeneratorName::Harmonic => GeneratorSpec::Harmonic(s.harmonic.unwrap_or_default()),
            GeneratorName::HistoryCopula => GeneratorSpec::HistoryCopula(s.history_copula.unwrap_or_default()),
        })
    }
}

impl From<GeneratorSpec> for GeneratorSection {
    fn from(spec: GeneratorSpec) -> Self {
        let name = spec.name();
        let mut section = GeneratorSection {
            name,
            marginals: None,
            aim: None,
            findiff: None,
            pate: None,
            sequence: None,
            dp2stage: None,
            harmonic: None,
            history_copula: None,
        };
        match spec {
            GeneratorSpec::Marginals(p) => section.marginals = Some(p),
            GeneratorSpec::Aim(p) => section.aim = Some(p),
            GeneratorSpec::Findiff(p) => section.findiff = Some(p),
            GeneratorSpec::Pate(p) => section.pate = Some(p),
            GeneratorSpec::Sequence(p) => section.sequence = Some(p),
            GeneratorSpec::Dp2stage(p) => section.dp2stage = Some(p),
            GeneratorSpec::Harmonic(p) => section.harmonic = Some(p),
            GeneratorSpec::HistoryCopula(p) => section.history_copula = Some(p),
        }
        section
    }
}

/// Most steps a flattened history may have (`history_rows`).
pub const MAX_HISTORY_ROWS: u32 = 1000;

/// Bins of the gap between consecutive order values, unless a generator's `gap_bins` says.
pub const DEFAULT_GAP_BINS: u32 = 20;

/// Most bins of the gap between consecutive order values (`gap_bins`).
pub const MAX_GAP_BINS: u32 = 64;
