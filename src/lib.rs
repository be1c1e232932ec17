//! hostlease: exactly one authoritative host per room for browser apps built on WebRTC.
//!
//! - [`protocol`]: the wire format shared with the server.
//! - [`core`]: the sans-I/O host-view state machine (no clock, no sockets, no timers).
//! - `web` (wasm32 only): the browser bindings and driver.
//!
//! The crate needs only `alloc`. The browser bundle (the `bundle` feature, wasm32 only) builds it
//! without `std`, with a panic handler that traps at once: std's panic machinery (message
//! formatting, the hook) cost the bundle 1.8 KB of its 43 KB (brotli).
#![cfg_attr(all(target_arch = "wasm32", feature = "bundle"), no_std)]

extern crate alloc;

pub mod core;
pub mod protocol;

#[cfg(target_arch = "wasm32")]
mod web;

/// What `std`'s prelude would give, for a crate that may be built without it.
#[allow(unused_imports)]
mod prelude {
    pub use alloc::borrow::ToOwned;
    pub use alloc::boxed::Box;
    pub use alloc::string::{String, ToString};
    pub use alloc::vec::Vec;
    pub use alloc::{format, vec};
}
