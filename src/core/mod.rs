//! The sans-I/O core: no clock, no sockets, no timers, no browser.
//!
//! [`HostView`] is the state machine the browser binding drives and the server's native tools
//! (load generator, simulations) drive too. [`order`] holds the one election order that the server
//! uses to elect and the SDK uses for its provisional view.

pub mod backoff;
pub mod error;
pub mod order;
pub mod time;
pub mod view;

pub use backoff::{Backoff, Entropy, SplitMix64};
pub use error::CommandError;
pub use order::{elect, election_cmp, provisional_coordinator, sort_members};
pub use time::Instant;
pub use view::{
    Config, Event, HostView, LeaseState, Phase, Source, Stats, Violation, MAX_RETRY_AFTER_MS,
    PIPELINE,
};
