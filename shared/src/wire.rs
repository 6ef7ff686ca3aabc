//! Task parameters on the wire: a JSON header (the round's settings) followed by model
//! weights as raw little-endian f32, so a large model is not written as JSON numbers.

use serde::{Deserialize, Serialize};

/// Task parameters that do not decode.
#[derive(Debug, thiserror::Error)]
#[error("task parameters: {0}")]
pub struct WireError(String);

/// Parameters travel as raw little-endian f32 after a length-prefixed JSON header.
pub fn encode_task<H: Serialize>(header: &H, parameters: &[f32]) -> Vec<u8> {
    let json = serde_json::to_vec(header).expect("serialisable header");
    let mut out = Vec::with_capacity(4 + json.len() + 4 * parameters.len());
    out.extend((json.len() as u32).to_le_bytes());
    out.extend(json);
    for p in parameters {
        out.extend(p.to_le_bytes());
    }
    out
}

/// Inverse of [`encode_task`].
pub fn decode_task<H: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<(H, Vec<f32>), WireError> {
    let bad = |m: &str| WireError(m.to_string());
    let len = u32::from_le_bytes(bytes.get(..4).ok_or_else(|| bad("truncated"))?.try_into().expect("4 bytes")) as usize;
    let json = bytes.get(4..4 + len).ok_or_else(|| bad("truncated header"))?;
    let header = serde_json::from_slice(json).map_err(|e| WireError(e.to_string()))?;
    let rest = &bytes[4 + len..];
    if !rest.len().is_multiple_of(4) {
        return Err(bad("parameter bytes are not a multiple of 4"));
    }
    Ok((header, rest.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Header {
        round: u64,
    }

    #[test]
    fn tasks_round_trip_and_reject_malformed_bytes() {
        let bytes = encode_task(&Header { round: 7 }, &[1.5, -2.0]);
        let (h, w): (Header, Vec<f32>) = decode_task(&bytes).unwrap();
        assert_eq!((h, w), (Header { round: 7 }, vec![1.5, -2.0]));
        assert!(decode_task::<Header>(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode_task::<Header>(&[1, 0]).is_err());
    }
}
