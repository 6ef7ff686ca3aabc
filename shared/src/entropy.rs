//! Private randomness from the operating system: ChaCha20 keyed with 256 bits of OS
//! entropy, for everything that must not be guessed (which units or rows are sampled,
//! per-round seeds). Privacy *noise* is drawn only by `rhosynth-privacy`'s release module.

use rand::SeedableRng;
use rand::TryRng;
use rand::rngs::{ChaCha20Rng, SysRng};

use crate::accounting::PrivacyError;

/// ChaCha20 keyed with 256 bits from the OS entropy source: for all private randomness
/// (noise, which units or rows are sampled) and for seeds nobody may guess.
pub fn os_rng() -> Result<ChaCha20Rng, PrivacyError> {
    ChaCha20Rng::try_from_rng(&mut SysRng).map_err(|e| PrivacyError::Entropy(format!("cannot read OS entropy: {e}")))
}

/// 256 bits from the OS entropy source.
pub fn os_seed() -> Result<[u8; 32], PrivacyError> {
    let mut seed = [0u8; 32];
    SysRng.try_fill_bytes(&mut seed).map_err(|e| PrivacyError::Entropy(format!("cannot read OS entropy: {e}")))?;
    Ok(seed)
}
