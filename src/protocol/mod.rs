//! The wire protocol, version 1: one definition shared by the SDK and the server.
//!
//! - [`ids`]: validated identifiers, counters (`Epoch`, `Seq`), server time, redacted tokens.
//! - [`messages`]: every frame and HTTP body as serde types.
//! - [`codec`]: versioned encoding, bounded decoding with typed errors, the signed bytes of an
//!   assignment.

pub mod codec;
mod de;
pub mod ids;
pub mod messages;

pub use codec::{decode_client, decode_server, encode_client, encode_server, DecodeError};
pub use ids::*;
pub use messages::*;
