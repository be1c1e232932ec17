//! hostlease: exactly one authoritative host per room for browser apps built on WebRTC.
//!
//! - [`protocol`]: the wire format shared with the server.
//! - [`core`]: the sans-I/O host-view state machine (no clock, no sockets, no timers).
//! - `web` (wasm32 only): the browser bindings and driver.

pub mod core;
pub mod protocol;

#[cfg(target_arch = "wasm32")]
mod web;
