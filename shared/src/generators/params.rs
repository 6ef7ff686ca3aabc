//! What the job's lifecycle asks of every generator's parameters (`[generator.<name>]`),
//! whichever the generator: each folder's `params.rs` answers it, and the generator list
//! (`super::generator_list!`) dispatches to it, so a generator cannot leave one out.

/// A generator's parameters, as the spec holds them.
pub trait GeneratorParams {
    /// Checks what needs no schema (when the spec is parsed).
    fn validate(&self) -> Result<(), String>;

    /// Bins of numeric columns that declare none (the public domain's discretisation).
    fn default_bins(&self) -> u32;

    /// Whether the generator draws whole histories (its output is counted in units), not
    /// rows.
    fn draws_histories(&self) -> bool;

    /// The public inputs the spec names for the generator to read.
    fn public_inputs(&self) -> PublicInputs<&String>;

    /// The same, to bind declared ids to their URLs.
    fn public_inputs_mut(&mut self) -> PublicInputs<&mut String>;
}

/// The public inputs a spec names for its generator: a pretrained model's checkpoint, a
/// reference set (a public table or a charged release).
pub struct PublicInputs<S> {
    pub checkpoint: Option<S>,
    pub reference: Option<S>,
}

impl<S> PublicInputs<S> {
    /// None.
    pub fn none() -> Self {
        Self { checkpoint: None, reference: None }
    }
}

/// Bins of numeric columns that declare none, unless a generator's `default_bins` says.
pub const DEFAULT_BINS: u32 = 32;

/// Most steps a flattened history may have (`history_rows`).
pub const MAX_HISTORY_ROWS: u32 = 1000;

/// Bins of the gap between consecutive order values, unless a generator's `gap_bins` says.
pub const DEFAULT_GAP_BINS: u32 = 20;

/// Most bins of the gap between consecutive order values (`gap_bins`).
pub const MAX_GAP_BINS: u32 = 64;
