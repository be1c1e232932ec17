//! Browser bindings (wasm32 only). Only the protocol version is exported so far; the driver and
//! the `HostView` binding are the browser SDK's work (see the README's status section).

use wasm_bindgen::prelude::*;

/// The major wire-protocol version this build speaks.
#[wasm_bindgen(js_name = protocolVersion)]
pub fn protocol_version() -> u32 {
    crate::protocol::PROTOCOL_VERSION
}
