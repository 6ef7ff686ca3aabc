//! Tasks on the wire: each task kind is a typed message of `dpsynth.proto`. A configuration
//! fixed for the whole job (a domain, an encoding, a model's architecture) travels in it as
//! JSON of the shared type that defines it, so it has one definition.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A task that does not decode.
#[derive(Debug, thiserror::Error)]
#[error("task: {0}")]
pub struct WireError(String);

impl WireError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// A configuration as the JSON a task carries.
pub fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("task configurations serialise")
}

/// Inverse of [`to_json`]; `what` names the field in errors.
pub fn from_json<T: DeserializeOwned>(what: &str, json: &str) -> Result<T, WireError> {
    serde_json::from_str(json).map_err(|e| WireError(format!("{what}: {e}")))
}

/// A 32-byte seed.
pub fn seed(bytes: &[u8]) -> Result<[u8; 32], WireError> {
    bytes.try_into().map_err(|_| WireError(format!("a seed has 32 bytes, not {}", bytes.len())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_round_trip_and_malformed_ones_are_refused() {
        let json = to_json(&vec![1.5, -2.0]);
        assert_eq!(from_json::<Vec<f64>>("weights", &json).unwrap(), vec![1.5, -2.0]);
        assert!(from_json::<Vec<f64>>("weights", &json[1..]).unwrap_err().to_string().contains("weights"));
        assert_eq!(seed(&[7; 32]).unwrap(), [7; 32]);
        assert!(seed(&[7; 31]).is_err());
    }
}
