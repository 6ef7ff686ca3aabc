//! Graphical models over discrete columns fitted to noisy marginals (Private-PGM): what
//! turns a set of released, mutually inconsistent noisy tables into one distribution that
//! agrees with all of them as well as it can, and rows drawn from it.

mod conditioning;
pub mod factor;
pub mod given;
pub mod junction;
pub mod model;

pub use factor::Factor;
pub use given::Given;
pub use junction::JunctionTree;
pub use model::{GraphicalModel, Measurement};

#[cfg(test)]
mod tests;
