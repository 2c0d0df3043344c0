//! The local write path's two rules about time, shared by the runtime (a `put` runs on its
//! caller's thread, against the concurrent memtable and clock) and the simulator:
//!
//! - [`stamp`]: a local write takes a Lamport time newer than every version of its key the node
//!   shows, or it would be sealed and sent but applied nowhere (last writer wins) while its
//!   caller was told it was stored.
//! - [`learn`]: a version the node learns from CapsuleDB passes the clock before the memtable
//!   shows it, so that a write after the read supersedes what was read.

use crate::memtable::{Memtable, Version};
use crate::LamportClock;
use std::sync::Arc;

/// How many Lamport times a write takes at most before [`StampError::Superseded`]: each retry
/// needs another writer's newer version of the key to arrive between two ticks.
pub const WRITE_TRIES_MAX: u32 = 16;

/// Why a local write was not applied (nothing was written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    /// The clock's next time is at or above the caller's fence `below`.
    #[error("the write would get Lamport time {lamport}, not below the caller's fence {below}: nothing was written")]
    Fenced {
        /// The Lamport time the clock gave the write.
        lamport: u64,
        /// The caller's fence: the write's time had to be below it.
        below: u64,
    },
    /// Every one of [`WRITE_TRIES_MAX`] times taken was superseded by another writer's newer
    /// version of the key before the write applied.
    #[error("other writers kept writing this key newer than each of {tries} Lamport times this write took: nothing was written; retry")]
    Superseded {
        /// How many Lamport times the write took ([`WRITE_TRIES_MAX`]).
        tries: u32,
    },
}

/// Stamps a local write of `key` (`None`: a delete) by `writer` and applies it to the memtable:
/// returns its version, newer than every version of the key the node showed. The clock passes
/// every version the node applies or learns, so the first tick is normally enough; a version
/// that arrived between the tick and the apply is observed and the write takes a later time.
/// `below`: a fence the write's time must stay under (`u64::MAX`: none).
pub fn stamp(
    memtable: &Memtable,
    clock: &LamportClock,
    key: &[u8],
    value: Option<&[u8]>,
    writer: u32,
    below: u64,
) -> Result<Version, StampError> {
    let mut tries = 0;
    loop {
        tries += 1;
        let lamport = clock.tick();
        if lamport >= below {
            return Err(StampError::Fenced { lamport, below });
        }
        let version = Version { lamport, writer };
        if memtable.apply(key, version, value.map(Arc::from)) {
            return Ok(version);
        }
        if tries >= WRITE_TRIES_MAX {
            return Err(StampError::Superseded { tries });
        }
        if let Some(held) = memtable.entry(key) {
            clock.observe(held.version.lamport);
        }
    }
}

/// CapsuleDB's answer for `key` (its version and value, or absent) taken in: the clock passes
/// the answer's version before the memtable can show it, then the memtable learns it (see
/// [`Memtable::learn`]: `None` if the answer is older than the frontier the node evicted under).
pub fn learn(
    memtable: &Memtable,
    clock: &LamportClock,
    key: &[u8],
    found: Option<(Version, Option<Arc<[u8]>>)>,
    index_seq: u64,
) -> Option<bool> {
    if let Some((v, _)) = &found {
        clock.observe(v.lamport);
    }
    memtable.learn(key, found, index_seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_after_learning_a_newer_version_supersedes_it() {
        let m = Memtable::new();
        let clock = LamportClock::new(0);
        let learned = Version { lamport: 50, writer: 9 };
        // The key is held (unsure is not needed: learn inserts an absent key's answer).
        assert!(m.apply(b"k", Version { lamport: 1, writer: 9 }, Some(Arc::from(&b"old"[..]))));
        assert_eq!(learn(&m, &clock, b"k", Some((learned, Some(Arc::from(&b"new"[..])))), 0), Some(true));
        let v = stamp(&m, &clock, b"k", Some(b"mine"), 3, u64::MAX).expect("applied");
        assert!(v > learned, "{v:?} must supersede {learned:?}");
        assert_eq!(m.entry(b"k").map(|e| e.version), Some(v));
    }

    #[test]
    fn a_write_whose_clock_lags_the_memtable_ticks_past_it() {
        let m = Memtable::new();
        let clock = LamportClock::new(0);
        // A version the clock never observed (the bug the rule closes).
        assert!(m.apply(b"k", Version { lamport: 7, writer: 9 }, None));
        let v = stamp(&m, &clock, b"k", Some(b"x"), 3, u64::MAX).expect("applied");
        assert!(v.lamport > 7);
    }

    #[test]
    fn a_fenced_write_writes_nothing() {
        let m = Memtable::new();
        let clock = LamportClock::new(10);
        assert_eq!(stamp(&m, &clock, b"k", Some(b"x"), 3, 5), Err(StampError::Fenced { lamport: 11, below: 5 }));
        assert!(m.entry(b"k").is_none());
    }
}
