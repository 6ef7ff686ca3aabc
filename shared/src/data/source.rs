//! Where a table is read from and how: the files, their format, the CSV dialect and what a
//! row that breaks the schema does. A job's `[input]` is one; the evaluation's held-out
//! files, the audit's tables and a generator's reference set are others (`of_files`).
//! Every reader takes one (`data::input::InputReader`).

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Csv,
    Parquet,
}

impl Format {
    /// By file extension: `.parquet`/`.pq` is Parquet, anything else CSV.
    pub fn detect(url: &str) -> Format {
        let lower = url.to_ascii_lowercase();
        if lower.ends_with(".parquet") || lower.ends_with(".pq") { Format::Parquet } else { Format::Csv }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Files to read: paths, `file://` or `s3://` URLs.
    pub urls: Vec<String>,
    /// Autodetected from the extension when absent.
    #[serde(default)]
    pub format: Option<Format>,
    #[serde(default)]
    pub csv: CsvOptions,
    /// What a row that breaks the schema does (absent: `fail`).
    #[serde(default)]
    pub bad_rows: Option<BadRows>,
}

impl Source {
    /// This section's dialect reading other files (a held-out set, a release, a reference
    /// set): each file's format from its extension, and rhosynth's own Parquet output as
    /// written (its values are spelled exactly as declared: no suffix to strip).
    pub fn of_files(&self, urls: &[String]) -> Source {
        let mut input = self.clone();
        input.urls = urls.to_vec();
        input.format = None;
        if urls.iter().all(|u| Format::detect(u) == Format::Parquet) {
            input.csv.strip_suffix = None;
        }
        input
    }

    /// This section reading one of its own files: a shard's (`data::shard`), in the same
    /// format and dialect.
    pub fn of_shard(&self, url: &str) -> Source {
        Source { urls: vec![url.to_string()], ..self.clone() }
    }
}

/// What reading does with a row whose values break the schema (an undeclared category
/// under `unknown = "reject"`, a missing value under `missing = "reject"`, a value that does
/// not parse, a missing unit id).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BadRows {
    /// The job stops with an error naming file, column and row (the data owner's `run`).
    #[default]
    Fail,
    /// The row is left out and counted in the operator's log. Leaving out a row depends on
    /// that row alone, so the job's guarantee covers it.
    Skip,
    /// The value is read as missing and counted in the operator's log; the row stays (a row
    /// without its unit id is left out). A coordinator serving declared datasets reads
    /// this way, with every column keeping missing values and undeclared categories in
    /// `__other__`: then the rows a job reads, and the work it does, do not depend on the
    /// schema its submitter chose (a failure, or a count of rows kept, would tell it whether
    /// rows break that schema).
    AsMissing,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CsvOptions {
    pub delimiter: char,
    /// Whether the first line names the columns. Without a header, the schema's columns
    /// are the file's columns, in order.
    pub has_header: bool,
    /// Spellings of a missing value (after trimming).
    pub null_values: Vec<String>,
    /// Lines starting with this are skipped (e.g. `|` in Adult's test file).
    pub comment: Option<char>,
    /// Strip spaces around values (Adult writes `, `).
    pub trim: bool,
    /// Suffix removed from values before matching (Adult's test labels end with `.`).
    pub strip_suffix: Option<String>,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self {
            delimiter: ',',
            has_header: true,
            null_values: vec![String::new(), "NA".into()],
            comment: None,
            trim: true,
            strip_suffix: None,
        }
    }
}

impl CsvOptions {
    /// Refuses a dialect the reader cannot follow: a delimiter or comment character that is
    /// not one ASCII byte, or that is a line break or the quote (they would be read as such,
    /// and a file's byte ranges cut where its records do not end, `data::csv_split`).
    pub fn check(&self) -> Result<(), String> {
        let usable = |c: char| c.is_ascii() && !matches!(c, '\r' | '\n' | '"');
        if !usable(self.delimiter) {
            return Err(format!(
                "[input.csv] delimiter {:?} must be an ASCII character other than CR, LF and '\"'",
                self.delimiter
            ));
        }
        if let Some(comment) = self.comment
            && (!usable(comment) || comment == self.delimiter)
        {
            return Err(format!(
                "[input.csv] comment {comment:?} must be an ASCII character other than CR, LF, '\"' and the delimiter"
            ));
        }
        Ok(())
    }

    /// A cell's text as every reader of this file takes it (trimmed, suffix stripped),
    /// `None` when it spells a missing value.
    pub fn normalise<'a>(&self, cell: &'a str) -> Option<&'a str> {
        let mut v = cell;
        if self.trim {
            v = v.trim();
        }
        if let Some(suffix) = &self.strip_suffix {
            v = v.strip_suffix(suffix.as_str()).unwrap_or(v);
        }
        if self.null_values.iter().any(|n| n == v) { None } else { Some(v) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A delimiter or comment the reader cannot follow is refused; common ones are not.
    #[test]
    fn a_dialect_whose_characters_the_reader_cannot_follow_is_refused() {
        let with = |delimiter: char, comment: Option<char>| CsvOptions { delimiter, comment, ..Default::default() };
        for good in [with(',', None), with('\t', Some('#')), with(';', Some('|'))] {
            assert_eq!(good.check(), Ok(()), "{good:?}");
        }
        for bad in [with('\n', None), with('\r', None), with('"', None), with('é', None), with(',', Some(','))] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        assert!(with(',', Some('\n')).check().is_err());
    }
}
