//! `[schema]`: the table's public domain, column by column.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::datetime::{check_datetime_format, parse_datetime};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaSpec {
    /// The privacy unit (e.g. a patient id); absent ⇒ each row is a unit.
    #[serde(default)]
    pub unit_column: Option<String>,
    /// Column the synthetic data is most often used to predict.
    #[serde(default)]
    pub target: Option<String>,
    /// The target's positive class for utility metrics (default: its last category).
    #[serde(default)]
    pub positive_class: Option<String>,
    /// Column ordering each unit's rows (e.g. a visit day), for longitudinal evaluation.
    #[serde(default)]
    pub order_by: Option<String>,
    /// The table's name: a database job's root, which its `[[tables]]` name as parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<String>,
    pub columns: Vec<ColumnSpec>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnKind {
    /// Real numbers within declared bounds.
    Continuous,
    /// Integers within declared bounds.
    Integer,
    /// One of the declared categories.
    Categorical,
    /// A timestamp within declared bounds (ISO 8601: a date, or a date and time after `T` or
    /// a space, with or without seconds, `Z` or an offset; or the column's `format`).
    Datetime,
    /// An identifier: never synthesised from data (the unit column gets synthetic ids).
    Identifier,
}

/// What to do with a value that is missing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingPolicy {
    /// Missing is a value of its own, measured and synthesised like the others.
    #[default]
    Keep,
    /// A missing value is an input error.
    Reject,
}

/// What to do with a category that is not declared.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownPolicy {
    /// An undeclared category is an input error.
    #[default]
    Reject,
    /// Undeclared categories go to an explicit `__other__` bucket.
    Other,
}

/// Name of the bucket for undeclared categories.
pub const OTHER_CATEGORY: &str = "__other__";

/// A public bound: a number, or a date/time for datetime columns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bound {
    Number(f64),
    Text(String),
}

/// Public discretisation of a numeric column for count-based generators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bins {
    /// This many equal-width bins between the bounds.
    Count(u32),
    /// Explicit increasing edges, first = min and last = max.
    Edges(Vec<f64>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnSpec {
    pub name: String,
    pub kind: ColumnKind,
    #[serde(default)]
    pub min: Option<Bound>,
    #[serde(default)]
    pub max: Option<Bound>,
    #[serde(default)]
    pub categories: Option<Vec<String>>,
    #[serde(default)]
    pub unknown: UnknownPolicy,
    #[serde(default)]
    pub missing: MissingPolicy,
    #[serde(default)]
    pub bins: Option<Bins>,
    /// A datetime column's format in the files (chrono syntax, e.g. `"%d/%m/%Y %H:%M"`),
    /// for values no common form reads ([`parse_datetime`]); bounds stay in the common forms.
    #[serde(default)]
    pub format: Option<String>,
    /// A database table's numeric or datetime column that lies inside an interval of its
    /// row's or its ancestors' values (`spec::tables::Within`), e.g.
    /// `"admissions.admittime..admissions.dischtime"` or `"admittime.."`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
}

impl ColumnSpec {
    /// Declared numeric bounds (datetime bounds in epoch seconds).
    pub fn bounds(&self) -> Option<(f64, f64)> {
        let value = |b: &Option<Bound>| match (b, self.kind) {
            (Some(Bound::Number(x)), ColumnKind::Continuous | ColumnKind::Integer) => Some(*x),
            (Some(Bound::Text(s)), ColumnKind::Datetime) => parse_datetime(s),
            _ => None,
        };
        Some((value(&self.min)?, value(&self.max)?))
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        if self.format.is_some() && self.kind != ColumnKind::Datetime {
            return Err(format!("column '{name}': only datetime columns take a `format`"));
        }
        if let Some(format) = &self.format {
            check_datetime_format(format).map_err(|why| format!("column '{name}': `format` {why}"))?;
        }
        match self.kind {
            ColumnKind::Continuous | ColumnKind::Integer | ColumnKind::Datetime => {
                let (lo, hi) = self.bounds().ok_or_else(|| {
                    let example = if self.kind == ColumnKind::Datetime { "\"2020-01-01\"" } else { "numbers" };
                    format!("column '{name}' needs public bounds `min` and `max` ({example})")
                })?;
                // Beyond 2⁵³ integers and epoch seconds are not exact in f64.
                const EXACT: f64 = 9_007_199_254_740_992.0;
                if !(lo < hi && lo.abs() <= EXACT && hi.abs() <= EXACT) {
                    return Err(format!("column '{name}': min must be below max, both finite and within ±2⁵³"));
                }
                if self.kind == ColumnKind::Integer && lo.ceil() > hi.floor() {
                    return Err(format!("column '{name}': no integer lies between min and max"));
                }
                if self.bins == Some(Bins::Count(0)) {
                    return Err(format!("column '{name}': bins must be at least 1"));
                }
                if let Some(Bins::Edges(edges)) = &self.bins {
                    let increasing = edges.windows(2).all(|w| w[0] < w[1]);
                    if edges.len() < 2 || !increasing || edges[0] != lo || *edges.last().unwrap() != hi {
                        return Err(format!("column '{name}': bin edges must increase from min ({lo}) to max ({hi})"));
                    }
                }
                if self.categories.is_some() {
                    return Err(format!("column '{name}': only categorical columns take `categories`"));
                }
            }
            ColumnKind::Categorical => {
                let categories = self
                    .categories
                    .as_ref()
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| format!("column '{name}' needs its public list of `categories`"))?;
                let mut seen = HashSet::new();
                if let Some(dup) = categories.iter().find(|c| !seen.insert(c.as_str())) {
                    return Err(format!("column '{name}': category '{dup}' is declared twice"));
                }
                if categories.iter().any(|c| c == OTHER_CATEGORY) {
                    return Err(format!("column '{name}': '{OTHER_CATEGORY}' is reserved"));
                }
            }
            ColumnKind::Identifier => {}
        }
        Ok(())
    }
}
