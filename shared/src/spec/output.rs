//! `[output]`: where and how much a job writes.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputSpec {
    /// Output prefix (path, `file://` or `s3://`); `--output` overrides it. `{dataset_id}`
    /// and `{job_id}` are filled in. Default: `./rhosynth-out/{dataset_id}/{job_id}`; a
    /// served job that names none writes under its submitter's `output_root`.
    #[serde(default = "default_output_url")]
    pub url: String,
    /// Synthetic rows; default: the DP estimate of the input's size released by the job.
    /// (A generator of whole histories counts units instead: `units`.)
    #[serde(default)]
    pub rows: Option<u64>,
    /// Synthetic units (histories), for a generator of whole histories; default: the DP
    /// estimate of the input's unit count released by the job.
    #[serde(default)]
    pub units: Option<u64>,
    #[serde(default = "default_rows_per_part")]
    pub rows_per_part: u64,
}

fn default_rows_per_part() -> u64 {
    50_000
}

/// Where a job that names no output writes: its own folder under the working directory.
pub const DEFAULT_OUTPUT_URL: &str = "./rhosynth-out/{dataset_id}/{job_id}";

fn default_output_url() -> String {
    DEFAULT_OUTPUT_URL.to_string()
}

impl Default for OutputSpec {
    fn default() -> Self {
        Self { url: default_output_url(), rows: None, units: None, rows_per_part: default_rows_per_part() }
    }
}

impl OutputSpec {
    /// The prefix with its dataset and job filled in.
    pub fn url_for(&self, dataset_id: &str, job_id: &str) -> String {
        self.url.replace("{dataset_id}", dataset_id).replace("{job_id}", job_id)
    }

    /// What every job's prefix starts with (up to a `{job_id}`): for overlap checks.
    pub fn root(&self, dataset_id: &str) -> String {
        let url = self.url.replace("{dataset_id}", dataset_id);
        url.split("{job_id}").next().unwrap_or_default().to_string()
    }

    /// Whether the spec names no output (the default).
    pub fn is_default(&self) -> bool {
        self.url == DEFAULT_OUTPUT_URL
    }
}
