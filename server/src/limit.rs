//! Token buckets: one per connection (frames, resumes), and keyed tables of them (HTTP requests
//! per client address, commands per participant in a room); and counts of open sockets, in all
//! and per client address (WebSocket sessions, HTTP connections not upgraded).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Open sockets, in all and per client address (as [`crate::http::client_key`] keys it); an
/// address with none has no entry, so the map holds at most as many entries as sockets are open.
#[derive(Default)]
pub struct Sockets {
    total: AtomicUsize,
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

impl Sockets {
    /// Sockets open now.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

/// One socket counted in its [`Sockets`] until dropped.
pub struct Counted {
    sockets: Arc<Sockets>,
    address: IpAddr,
}

impl Counted {
    /// Counts a socket from `address`; also says how many are open in all and from `address`,
    /// this one included.
    pub fn new(sockets: &Arc<Sockets>, address: IpAddr) -> (Self, usize, usize) {
        let total = sockets.total.fetch_add(1, Ordering::Relaxed) + 1;
        let mut by_address = sockets.by_address.lock().expect("address lock");
        let n = by_address.entry(address).or_insert(0);
        *n += 1;
        let from_address = *n;
        let counted = Counted {
            sockets: sockets.clone(),
            address,
        };
        (counted, total, from_address)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.sockets.total.fetch_sub(1, Ordering::Relaxed);
        let mut by_address = self.sockets.by_address.lock().expect("address lock");
        if let Some(n) = by_address.get_mut(&self.address) {
            *n -= 1;
            if *n == 0 {
                by_address.remove(&self.address);
            }
        }
    }
}

/// A token bucket for a rate.
pub struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    at: Instant,
    /// Refusals since a token was last taken (see `admit`).
    refused: u32,
}

impl Bucket {
    pub fn new(rate: f64, burst: f64) -> Self {
        Bucket {
            tokens: burst,
            rate,
            burst,
            at: Instant::now(),
            refused: 0,
        }
    }

    /// Takes a token, or says in how many milliseconds to try again: the k-th refusal in a row
    /// is told about k tokens' time, so that a burst of refused commands comes back spread at the
    /// rate instead of all at once.
    pub fn admit(&mut self) -> Result<(), u64> {
        if self.take() {
            self.refused = 0;
            return Ok(());
        }
        self.refused = self.refused.saturating_add(1);
        Err((1000.0 * (f64::from(self.refused) - self.tokens) / self.rate).ceil() as u64)
    }

    /// Takes `n` tokens, or says in how many milliseconds there will be as many (taking none).
    pub fn spend(&mut self, n: f64) -> Result<(), u64> {
        self.refill(Instant::now());
        if self.tokens >= n {
            self.tokens -= n;
            return Ok(());
        }
        Err((1000.0 * (n - self.tokens) / self.rate).ceil() as u64)
    }

    /// Gives back `n` tokens spent on something that did not happen after all.
    pub fn refund(&mut self, n: f64) {
        self.tokens = (self.tokens + n).min(self.burst);
    }

    pub fn take(&mut self) -> bool {
        self.refill(Instant::now());
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, now: Instant) {
        self.tokens =
            (self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
    }

    /// Refilled to the brim at `now`: no different from a new bucket.
    fn full(&self, now: Instant) -> bool {
        self.tokens + now.duration_since(self.at).as_secs_f64() * self.rate >= self.burst
    }
}

/// Keys a [`Limiter`] keeps a bucket for at most.
pub const MAX_BUCKETS: usize = 100_000;

/// A token bucket per key, the same rate for all, in bounded memory. A key's bucket outlives the
/// connections that spent it: a client that reconnects does not get a fresh burst.
pub struct Limiter<K> {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq> Limiter<K> {
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a token from `key`'s bucket, or says in how many milliseconds to try again
    /// ([`Bucket::admit`]).
    pub fn admit(&self, key: K) -> Result<(), u64> {
        self.bucket(key, Bucket::admit)
    }

    /// Takes `n` tokens from `key`'s bucket ([`Bucket::spend`]).
    pub fn spend(&self, key: K, n: f64) -> Result<(), u64> {
        self.bucket(key, |b| b.spend(n))
    }

    /// Gives back `n` tokens to `key`'s bucket.
    pub fn refund(&self, key: K, n: f64) {
        self.bucket(key, |b| b.refund(n))
    }

    fn bucket<T>(&self, key: K, f: impl FnOnce(&mut Bucket) -> T) -> T {
        let mut map = self.buckets.lock().expect("limiter lock");
        if map.len() >= MAX_BUCKETS {
            // Buckets refilled to the brim are no different from new ones; only if that frees
            // nothing are all reset (which only ever lets more in).
            let now = Instant::now();
            map.retain(|_, b| !b.full(now));
            if map.len() >= MAX_BUCKETS / 2 {
                map.clear();
            }
        }
        f(map
            .entry(key)
            .or_insert_with(|| Bucket::new(self.rate, self.burst)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_drops_idle_buckets_not_busy_ones() {
        let l = Limiter::new(1e-9, 2.0);
        {
            let mut map = l.buckets.lock().unwrap();
            for i in 0..MAX_BUCKETS as u32 {
                // 60% refilled to the brim (idle), the rest spent.
                let mut b = Bucket::new(1e-9, 2.0);
                if i % 5 >= 3 {
                    b.tokens = 0.0;
                }
                map.insert(i, b);
            }
        }
        assert!(l.admit(u32::MAX).is_ok());
        assert_eq!(l.buckets.lock().unwrap().len(), MAX_BUCKETS * 2 / 5 + 1);
        // A spent key is still refused (a reset would have let it in again).
        assert!(l.admit(4).is_err());
        // With no idle bucket to drop, the table is reset: bounded memory first.
        let l = Limiter::new(1e-9, 2.0);
        for i in 0..MAX_BUCKETS as u32 {
            let _ = l.admit(i);
        }
        assert!(l.admit(u32::MAX).is_ok());
        assert_eq!(l.buckets.lock().unwrap().len(), 1);
    }

    /// Bytes, not tokens: what does not fit waits as long as the missing part takes to refill
    /// (taking nothing), and a refund gives back what was spent, never past the burst.
    #[test]
    fn a_spend_past_the_bucket_waits_for_the_difference_and_a_refund_gives_it_back() {
        let mut b = Bucket::new(1000.0, 10_000.0);
        assert!(b.spend(6_000.0).is_ok());
        let wait = b.spend(6_000.0).unwrap_err();
        assert!((1_900..=2_000).contains(&wait), "{wait}");
        b.refund(6_000.0);
        assert!(b.spend(10_000.0).is_ok());
        b.refund(20_000.0);
        assert!(b.spend(10_001.0).is_err(), "refunded past the burst");
    }

    #[test]
    fn refusals_in_a_row_are_told_to_come_back_spread_at_the_rate() {
        // A token every 1,000 s: the k-th refusal is told about k × 1,000,000 ms (less the
        // little the bucket refilled meanwhile, whatever the machine's speed).
        let mut b = Bucket::new(0.001, 1.0);
        assert!(b.admit().is_ok());
        let waits: Vec<u64> = (0..3).map(|_| b.admit().unwrap_err()).collect();
        for (k, w) in waits.iter().enumerate() {
            let told = (k as u64 + 1) * 1_000_000;
            assert!((told - 60_000..=told).contains(w), "{waits:?}");
        }
    }
}
