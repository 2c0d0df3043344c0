//! The node's Lamport clock: `tick()` before each local op, `observe(l)` for each verified
//! remote record, so that `lamport = max(local, received) + 1` at the next tick.

use std::sync::atomic::{AtomicU64, Ordering};

/// A Lamport clock shared by a node's threads: an atomic counter that only moves up.
#[derive(Debug, Default)]
pub struct LamportClock(AtomicU64);

impl LamportClock {
    /// A clock whose current value is `start` (the next `tick()` returns `start + 1`).
    pub fn new(start: u64) -> LamportClock {
        LamportClock(AtomicU64::new(start))
    }

    /// The next local timestamp (strictly greater than any returned or observed before).
    #[inline]
    pub fn tick(&self) -> u64 {
        self.0.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Moves the clock up to `seen` (never down).
    #[inline]
    pub fn observe(&self, seen: u64) {
        self.0.fetch_max(seen, Ordering::AcqRel);
    }

    /// The current value: the newest timestamp ticked or observed, without advancing.
    #[inline]
    pub fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_pass_everything_observed() {
        let c = LamportClock::new(0);
        assert_eq!(c.tick(), 1);
        c.observe(10);
        assert_eq!(c.tick(), 11);
        c.observe(3);
        assert_eq!(c.tick(), 12);
    }
}
