//! The gRPC protocol between the dpsynth coordinator and its workers (`dpsynth.proto`).

tonic::include_proto!("dpsynth.v1");

/// Version of the protocol in `dpsynth.proto`; peers of another version are refused.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest chunk of tensor bytes sent in one message.
pub const CHUNK_BYTES: usize = 1 << 20;
