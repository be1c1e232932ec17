//! The store clock: what `hl_now()` returns in the store's SQL ([`crate::store::NOW`]), ms since
//! the Unix epoch, by which every lease, fence and capability is timed.
//!
//! It is the machine's boot clock (Linux `CLOCK_BOOTTIME`: it never steps, and it counts a
//! suspend) plus an offset fixed once per boot: the wall clock minus the boot clock at the first
//! store opened on the database since the machine started, kept in the `clock` table so that
//! every process on the file reads the same clock. SQLite's own `julianday('now')` is the wall
//! clock, which NTP (or an operator) can step: a step forward of more than the SDK's margin (1 %
//! of a lease plus 250 ms) made every live lease look run out at once, and the sweeper granted
//! successors while the old hosts' SDKs, which time their leases on their own monotonic clocks,
//! still held theirs: two hosts. A step of the wall clock after the anchor moves nothing here,
//! so this clock may differ from the wall clock by the steps since boot; join tokens, minted by
//! the app's backend on its wall clock, are still checked against the wall clock.
//!
//! Where the boot clock or the boot id cannot be read (not Linux) the store clock is the wall
//! clock, as before.

use std::sync::atomic::{AtomicI64, Ordering};

/// Where [`StoreClock`] reads time (in ns, so that the anchor loses nothing to rounding and the
/// store clock reads as the wall clock did at the anchor): the system's clocks, or a test's.
pub trait ClockSource: Send + Sync + 'static {
    /// The wall clock, ns since the Unix epoch.
    fn wall_ns(&self) -> i64;
    /// The boot clock, ns since the machine started; `None` where there is none.
    fn boot_ns(&self) -> Option<i64>;
    /// What tells this boot from the others (Linux's `boot_id`); `None` where there is none.
    fn boot_id(&self) -> Option<String>;
}

/// The system's clocks.
pub struct SystemClock;

impl ClockSource for SystemClock {
    fn wall_ns(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
    }

    #[cfg(target_os = "linux")]
    fn boot_ns(&self) -> Option<i64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        // (`time_t` and `c_long` are 32 bits on some Linux targets.)
        #[allow(clippy::unnecessary_cast)]
        let ns = (ts.tv_sec as i64).saturating_mul(1_000_000_000) + ts.tv_nsec as i64;
        (rc == 0).then_some(ns)
    }

    #[cfg(not(target_os = "linux"))]
    fn boot_ns(&self) -> Option<i64> {
        None
    }

    fn boot_id(&self) -> Option<String> {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id = id.trim();
        (!id.is_empty()).then(|| id.to_string())
    }
}

/// Not anchored yet: the wall clock.
const UNANCHORED: i64 = i64::MIN;

/// The store clock of one store (see the module's documentation).
pub struct StoreClock {
    source: Box<dyn ClockSource>,
    /// Wall minus boot (ns) at this boot's anchor, or [`UNANCHORED`].
    offset: AtomicI64,
}

impl StoreClock {
    pub fn new(source: impl ClockSource) -> Self {
        Self {
            source: Box::new(source),
            offset: AtomicI64::new(UNANCHORED),
        }
    }

    /// This boot and the offset (ns) the store should keep for it if it has none yet: `None`
    /// where the store clock is the wall clock.
    pub fn proposal(&self) -> Option<(String, i64)> {
        let id = self.source.boot_id()?;
        // The two clocks read back to back (the file read first), so that nothing between them
        // puts the store clock ahead of the wall clock.
        let boot = self.source.boot_ns()?;
        Some((id, self.source.wall_ns().saturating_sub(boot)))
    }

    /// The store clock minus the wall clock, ms: the wall clock's steps since the anchor.
    pub fn skew_ms(&self) -> i64 {
        self.now_ms() - self.source.wall_ns().div_euclid(1_000_000)
    }

    /// Takes the offset (ns) the store keeps for this boot.
    pub fn anchor(&self, offset: i64) {
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// Ms since the Unix epoch on the store clock.
    pub fn now_ms(&self) -> i64 {
        let ns = match (self.offset.load(Ordering::Relaxed), self.source.boot_ns()) {
            (UNANCHORED, _) | (_, None) => self.source.wall_ns(),
            (offset, Some(boot)) => offset.saturating_add(boot),
        };
        ns.div_euclid(1_000_000)
    }
}
