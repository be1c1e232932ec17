//! The wire protocol, version 1: one definition shared by the SDK and the server.
//!
//! - [`ids`]: validated identifiers, counters (`Epoch`, `Seq`), server time, redacted tokens.
//! - [`messages`]: every frame and HTTP body.
//! - [`codec`]: versioned encoding, bounded decoding with typed errors, the signed bytes of an
//!   assignment.
//! - [`json`]: the JSON reader and writer underneath (no serde: see there why), and [`Json`], an
//!   app's payload kept as text.

pub mod codec;
pub mod ids;
pub mod json;
pub mod messages;
mod wire;

pub use codec::{decode_client, decode_server, encode_client, encode_server, DecodeError};
pub use ids::*;
pub use json::Json;
pub use messages::*;
