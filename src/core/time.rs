//! Local monotonic time, as an input.

use core::fmt;

/// A point on the local monotonic clock, in milliseconds (e.g. `performance.now()` rounded).
///
/// The core never reads a clock: every input carries the `Instant` at which it happened. This
/// type cannot be compared with [`crate::protocol::ServerTime`], which is the server's store clock.
///
/// It must count the time the machine spent suspended: lease deadlines are anchored on it, and
/// a clock that stood still through a sleep would keep a lease `Held` past its real end (the
/// browser driver adds the wall clock's lead over `performance.now()`, which stops in a sleep
/// on some platforms, and calls `handle_wake`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(pub u64);

impl Instant {
    pub const ZERO: Self = Self(0);

    pub fn from_millis(ms: u64) -> Self {
        Self(ms)
    }
    pub fn as_millis(self) -> u64 {
        self.0
    }
    /// `self + ms`, saturating.
    pub fn add_ms(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }
    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub fn ms_since(self, earlier: Instant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Instant({}ms)", self.0)
    }
}
