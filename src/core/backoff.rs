//! Reconnect and write-retry delays as pure functions of an attempt number and a random source.

/// A source of randomness, injected so that schedules are reproducible in tests.
pub trait Entropy {
    fn next_u64(&mut self) -> u64;
}

/// SplitMix64: small, fast, and good enough for jitter and idempotency keys (which need to be
/// unique, not secret). Seed it from `crypto.getRandomValues` in the browser.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl Entropy for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff and Jitter").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first attempt's delay.
    pub base_ms: u64,
    /// No delay ever exceeds this (except a longer server `Retry-After`, which is honoured).
    pub cap_ms: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base_ms: 250,
            cap_ms: 15_000,
        }
    }
}

impl Backoff {
    /// The ceiling for `attempt` (0-based): `min(cap, base · 2^attempt)`.
    pub fn ceiling_ms(&self, attempt: u32) -> u64 {
        let exp = self.base_ms.saturating_mul(1u64 << attempt.min(32));
        exp.min(self.cap_ms)
    }

    /// Full jitter: uniform in `[0, ceiling(attempt)]`.
    pub fn delay_ms(&self, attempt: u32, rng: &mut impl Entropy) -> u64 {
        let ceiling = self.ceiling_ms(attempt);
        rng.next_u64() % ceiling.saturating_add(1)
    }

    /// The delay before retrying a write: full jitter, but never sooner than the server's
    /// `Retry-After`.
    pub fn retry_delay_ms(
        &self,
        attempt: u32,
        retry_after_ms: Option<u64>,
        rng: &mut impl Entropy,
    ) -> u64 {
        self.delay_ms(attempt, rng).max(retry_after_ms.unwrap_or(0))
    }
}
