//! The local write path's two rules about time, shared by the runtime (a `put` runs on its
//! caller's thread, against the concurrent memtable and clock) and the simulator:
//!
//! - [`stamp`]: a local write takes a Lamport time newer than every version of its key the node
//!   shows, or it would be sealed and sent but applied nowhere (last writer wins) while its
//!   caller was told it was stored.
//! - [`learn`]: a version the node learns from CapsuleDB passes the clock before the memtable
//!   shows it, so that a write after the read supersedes what was read.
//!
//! And the client write's two decisions at its writer's queue, taken under the queue's lock:
//! [`admit`] (go, wait for the writer to take ops, wait for acks, or give up) and
//! [`wakes_writer`] (whether the op just queued wakes the writer). The runtime only waits and
//! wakes as they say.

use crate::memtable::{Memtable, Version};
use crate::window::Window;
use crate::LamportClock;
use std::sync::Arc;

/// What a client write does next at its writer's queue ([`admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Stamp and queue the op now. `opened`: the flow window has just opened, because acks
    /// stalled while a write waited (the runtime counts it and says so once).
    Go {
        /// The window opened at this call.
        opened: bool,
    },
    /// The queue holds its capacity: wait (until the deadline) for the writer to take ops.
    WaitForSpace,
    /// The flow window is full: wait for acks that move it, at most until `until_ms` (the
    /// window's stall deadline or the caller's, whichever is first).
    WaitForAcks {
        /// When to ask again (ms, the caller's clock).
        until_ms: u64,
    },
    /// The caller's deadline passed with the queue or the window still full: nothing written.
    Backpressure,
}

/// A client write's admission at its writer's queue, which holds `queued` ops of at most
/// `queue_cap`, against the writer's flow `window`, at `now_ms`, for a caller that gives up at
/// `deadline_ms` (both ms on the caller's clock). Called under the queue's lock, again after
/// every wait.
pub fn admit(queued: usize, queue_cap: usize, window: &Window, now_ms: u64, deadline_ms: u64) -> Admission {
    if queued >= queue_cap {
        return if now_ms >= deadline_ms { Admission::Backpressure } else { Admission::WaitForSpace };
    }
    let mut opened = false;
    match window.admit(queued, now_ms, &mut opened) {
        crate::window::Admit::Go => Admission::Go { opened },
        crate::window::Admit::WaitUntilMs(_) if now_ms >= deadline_ms => Admission::Backpressure,
        crate::window::Admit::WaitUntilMs(t) => Admission::WaitForAcks { until_ms: t.min(deadline_ms) },
    }
}

/// Whether a write that leaves `queued` ops in its writer's queue wakes the writer: at the
/// first op (it may be asleep) and at every full batch of `batch_ops` (it may be waiting for
/// one to fill); in between it is awake or about to seal.
#[inline]
pub fn wakes_writer(queued: usize, batch_ops: usize) -> bool {
    queued == 1 || queued.is_multiple_of(batch_ops.max(1))
}

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
#[inline]
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

/// The next version of an atomic batch's op ([`crate::memtable::Memtable::write_atomic`],
/// which calls this under the locks of the batch's keys): a tick of `clock`, past `held` (the
/// version the key holds, if any) and below `below`.
pub fn stamp_held(clock: &LamportClock, held: Option<Version>, writer: u32, below: u64) -> Result<Version, StampError> {
    if let Some(h) = held {
        clock.observe(h.lamport);
    }
    let lamport = clock.tick();
    if lamport >= below {
        return Err(StampError::Fenced { lamport, below });
    }
    Ok(Version { lamport, writer })
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
    fn a_write_waits_for_space_then_for_acks_and_gives_up_at_its_deadline() {
        use crate::window::{FlowOptions, Window};
        use std::time::Duration;
        let w = Window::new(FlowOptions { window_ops: 4, window_records: 100, stall: Duration::from_millis(100) });
        // A full queue: wait for the writer, until the deadline.
        assert_eq!(admit(8, 8, &w, 0, 50), Admission::WaitForSpace);
        assert_eq!(admit(8, 8, &w, 50, 50), Admission::Backpressure);
        // Room in the queue and in the window.
        assert_eq!(admit(3, 8, &w, 0, 50), Admission::Go { opened: false });
        // The window full: wait for acks, bounded by the caller's deadline and the stall.
        assert_eq!(admit(4, 8, &w, 0, 50), Admission::WaitForAcks { until_ms: 50 });
        assert_eq!(admit(4, 8, &w, 10, 500), Admission::WaitForAcks { until_ms: 100 });
        assert_eq!(admit(4, 8, &w, 50, 50), Admission::Backpressure);
        // Acks stalled past the stall from the first wait: the window opens, once.
        assert_eq!(admit(4, 8, &w, 100, 500), Admission::Go { opened: true });
        assert_eq!(admit(4, 8, &w, 101, 500), Admission::Go { opened: false });
    }

    #[test]
    fn a_writer_is_woken_at_its_first_op_and_at_each_full_batch() {
        let woken: Vec<usize> = (1..=10).filter(|q| wakes_writer(*q, 4)).collect();
        assert_eq!(woken, [1, 4, 8]);
        assert!(wakes_writer(3, 0), "a zero batch counts as one");
    }

    #[test]
    fn a_fenced_write_writes_nothing() {
        let m = Memtable::new();
        let clock = LamportClock::new(10);
        assert_eq!(stamp(&m, &clock, b"k", Some(b"x"), 3, 5), Err(StampError::Fenced { lamport: 11, below: 5 }));
        assert!(m.entry(b"k").is_none());
    }
}
