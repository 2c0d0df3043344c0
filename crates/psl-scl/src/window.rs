//! [`Window`]: flow control from the capsule servers back to a node's writers (the runtime's
//! `put` and writer actors share one per writer; time is the caller's, in milliseconds): each writer may have at most
//! `window_ops` ops sealed and not yet durable at a quorum of servers, plus those still queued.
//! A `put` beyond the window waits for acks, so a writer runs at the pace of the servers' quorum
//! (the queues toward them stay bounded and nothing is dropped into a repair storm) instead of
//! the pace of its clients.
//!
//! The bound follows the quorum, not every server: a slow or hostile minority cannot hold the
//! writers back (it catches up by repair, as a restarted server does). When acks stop moving for
//! `stall` while a writer waits (no quorum reachable: servers down or cut off), the window opens:
//! writes go on as they would without servers, `sync_durable` fails as before, and the window
//! closes again at the next ack that moves.
//!
//! On a node that uses CapsuleDB, CapsuleDB's acks (what it has taken in) pace the writers
//! too, and so do peer nodes through their tagged heads hints: the window is released up to
//! `NodeCore::flow_next`, the lowest of the quorum's, a live CapsuleDB's and the pacing peers'
//! next seq (one whose acks or hints stalled for `stall` stops counting until they move).
//! Beside ops, at most `window_records` records are in flight: the receivers' queues count
//! messages.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// How far a writer may run ahead of its servers' acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowOptions {
    /// Ops per writer sealed or queued and not yet acked by what paces it (a quorum of
    /// capsule servers, a live CapsuleDB, the pacing peers); 0 turns flow control off.
    pub window_ops: usize,
    /// Records per writer sealed and not yet acked: a bound in messages, for the receivers'
    /// queues (which count messages), when records are small (`batch_ops_max` 1, or a
    /// trickle of writes). Only with `window_ops` above 0.
    pub window_records: usize,
    /// How long a writer waits for acks that do not move before it opens the window.
    pub stall: Duration,
}

impl Default for FlowOptions {
    fn default() -> Self {
        FlowOptions {
            window_ops: WINDOW_OPS_DEFAULT,
            window_records: WINDOW_RECORDS_DEFAULT,
            stall: Duration::from_millis(STALL_MS_DEFAULT),
        }
    }
}

/// Default window: far above what a writer has in flight at the servers' pace on a healthy
/// deployment (a few milliseconds of group commit), so it only bites when they fall behind.
pub const WINDOW_OPS_DEFAULT: usize = 16_384;
/// Default bound on records in flight: a quarter of a fabric receive queue (4,096 messages).
pub const WINDOW_RECORDS_DEFAULT: usize = 1_024;
/// Default stall before the window opens.
pub const STALL_MS_DEFAULT: u64 = 1_000;
/// Most records tracked per writer; beyond it the newest entries merge (a merged entry is freed
/// when its last record is acked: conservative, never early).
const TRACKED_RECORDS_MAX: usize = 4_096;

/// One writer's ops in flight. Lives beside the writer's op queue: the actor reserves what it
/// takes from the queue (under the queue's lock, so `queued + unacked` never dips while a batch
/// is being sealed) and records the sealed record's seq, the core retires what a quorum acked,
/// `put` reads the total under the queue's lock.
#[derive(Debug)]
pub struct Window {
    /// [`FlowOptions::window_ops`].
    pub window_ops: usize,
    /// [`FlowOptions::window_records`], at least 1.
    pub window_records: usize,
    /// [`FlowOptions::stall`].
    pub stall: Duration,
    /// Ops taken from the queue and not yet durable at a quorum.
    unacked_ops: AtomicUsize,
    /// Records sealed and not yet durable at a quorum.
    unacked_records: AtomicUsize,
    /// The window is open: acks stopped moving while a writer waited.
    open: AtomicBool,
    state: parking_lot::Mutex<FlowState>,
}

#[derive(Debug, Default)]
struct FlowState {
    /// Sealed records not yet durable, oldest first: (the writer's next seq after it, its ops,
    /// the records it stands for: 1, or more once entries merged).
    inflight: VecDeque<(u64, usize, usize)>,
    /// The quorum's durable next seq for this writer, as last told by the core.
    durable_next: u64,
    /// When (ms) a `put` first waited for acks since they last moved.
    waiting_since: Option<u64>,
    /// Bumped each time the window opens: reservations of an earlier generation were dropped
    /// with the count.
    generation: u64,
}

/// Ops a writer took from its queue, counted in flight (`ops` is 0 when flow control is off
/// or open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub struct Reserved {
    generation: u64,
    ops: usize,
}

/// What [`Window::admit`] tells a waiting `put`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Room in the window (or flow control is off or open).
    Go,
    /// Wait for acks, at most until this time (ms, the caller's clock); then ask again.
    WaitUntilMs(u64),
}

impl Window {
    /// A closed, empty window with options `o`.
    pub fn new(o: FlowOptions) -> Window {
        Window {
            window_ops: o.window_ops,
            window_records: o.window_records.max(1),
            stall: o.stall,
            unacked_ops: AtomicUsize::new(0),
            unacked_records: AtomicUsize::new(0),
            open: AtomicBool::new(false),
            state: parking_lot::Mutex::new(FlowState::default()),
        }
    }

    /// The options this window runs with (`window_records` at least 1).
    pub fn options(&self) -> FlowOptions {
        FlowOptions { window_ops: self.window_ops, window_records: self.window_records, stall: self.stall }
    }

    /// Ops reserved or sealed and not yet acked.
    #[inline]
    pub fn unacked_ops(&self) -> usize {
        self.unacked_ops.load(Ordering::Acquire)
    }

    /// Whether the window is open (acks stalled while a writer waited).
    #[inline]
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    fn release(&self, ops: usize) {
        let _ = self.unacked_ops.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(ops)));
    }

    fn release_records(&self, n: usize) {
        let _ = self.unacked_records.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| Some(u.saturating_sub(n)));
    }

    /// Records sealed and not yet acked.
    #[inline]
    pub fn unacked_records(&self) -> usize {
        self.unacked_records.load(Ordering::Acquire)
    }

    /// The fast path of `put`, without the lock: flow control is off or open, or the window has
    /// room for one more op beside `queued`.
    #[inline]
    pub fn has_room(&self, queued: usize) -> bool {
        self.window_ops == 0 || self.is_open() || queued + self.unacked_ops() < self.window_ops
    }

    /// Whether the writer has `window_records` records in flight: its actor then waits (up to
    /// `stall`) before it seals the next one, and the ops queue up into larger records meanwhile.
    #[inline]
    pub fn records_full(&self) -> bool {
        self.window_ops > 0 && !self.is_open() && self.unacked_records() >= self.window_records
    }

    /// Whether a `put` that finds `queued` ops in the writer's queue may add one now. Called
    /// under the queue's lock. `Go` when the window has room, is off or is open; else when to
    /// ask again: the stall deadline, counted from the first wait since acks last moved. At
    /// it the window opens, the call answers `Go` and sets `opened` (for the caller to count
    /// and report).
    pub fn admit(&self, queued: usize, now_ms: u64, opened: &mut bool) -> Admit {
        if self.has_room(queued) {
            return Admit::Go;
        }
        let mut st = self.state.lock();
        let since = *st.waiting_since.get_or_insert(now_ms);
        let deadline = since.saturating_add(self.stall.as_millis() as u64);
        if now_ms < deadline {
            return Admit::WaitUntilMs(deadline);
        }
        st.waiting_since = None;
        st.inflight.clear();
        st.generation += 1;
        self.unacked_ops.store(0, Ordering::Release);
        self.unacked_records.store(0, Ordering::Release);
        self.open.store(true, Ordering::Release);
        *opened = true;
        Admit::Go
    }

    /// The actor took `ops` ops from the queue for a record. Called under the queue's lock.
    pub fn reserve(&self, ops: usize) -> Reserved {
        if self.window_ops == 0 || self.is_open() || ops == 0 {
            return Reserved { generation: 0, ops: 0 };
        }
        let generation = self.state.lock().generation;
        self.unacked_ops.fetch_add(ops, Ordering::AcqRel);
        Reserved { generation, ops }
    }

    /// The reserved ops were sealed; the writer's next seq is now `next_seq`. Called before the
    /// record is handed to the core, so its ack cannot come first.
    pub fn sealed(&self, r: Reserved, next_seq: u64) {
        if r.ops == 0 {
            return;
        }
        let mut st = self.state.lock();
        if st.generation != r.generation {
            return; // the window opened meanwhile and dropped the count
        }
        self.unacked_records.fetch_add(1, Ordering::AcqRel);
        if st.inflight.len() >= TRACKED_RECORDS_MAX {
            if let Some(last) = st.inflight.back_mut() {
                *last = (next_seq, last.1 + r.ops, last.2 + 1);
                return;
            }
        }
        st.inflight.push_back((next_seq, r.ops, 1));
    }

    /// Sealing failed: the reserved ops are not in flight.
    pub fn unseal(&self, r: Reserved) {
        if r.ops > 0 && self.state.lock().generation == r.generation {
            self.release(r.ops);
        }
    }

    /// A quorum holds every record of the writer below `durable_next`. Returns whether it
    /// moved (the caller then wakes the waiting `put`s). Acks that move close an open window.
    pub fn acked(&self, durable_next: u64) -> bool {
        if self.window_ops == 0 {
            return false;
        }
        let mut st = self.state.lock();
        if durable_next <= st.durable_next {
            return false;
        }
        st.durable_next = durable_next;
        st.waiting_since = None;
        let (mut freed, mut records) = (0, 0);
        while st.inflight.front().is_some_and(|(next, _, _)| *next <= durable_next) {
            if let Some((_, n, r)) = st.inflight.pop_front() {
                freed += n;
                records += r;
            }
        }
        self.release(freed);
        self.release_records(records);
        self.open.store(false, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(window_ops: usize) -> Window {
        Window::new(FlowOptions { window_ops, window_records: 1_000_000, stall: Duration::from_millis(100) })
    }

    /// The actor's side: take `ops` from the queue, seal them as the record ending before `next`.
    fn seal(f: &Window, ops: usize, next: u64) {
        let r = f.reserve(ops);
        f.sealed(r, next);
    }

    #[test]
    fn the_window_counts_queued_and_sealed_ops_until_a_quorum_acks_them() {
        let f = flow(10);
        let now = 1_000;
        let mut opened = false;
        assert_eq!(f.admit(9, now, &mut opened), Admit::Go);
        seal(&f, 4, 1);
        seal(&f, 4, 2);
        assert_eq!(f.unacked_ops(), 8);
        assert_eq!(f.admit(1, now, &mut opened), Admit::Go);
        assert_eq!(f.admit(2, now, &mut opened), Admit::WaitUntilMs(now + 100));
        // An ack for the first record frees its ops; an old one changes nothing.
        assert!(f.acked(1));
        assert!(!f.acked(1));
        assert_eq!(f.unacked_ops(), 4);
        assert_eq!(f.admit(5, now, &mut opened), Admit::Go);
        assert!(f.acked(2));
        assert_eq!(f.unacked_ops(), 0);
        // A reservation counts at once (before its record is sealed); a failed seal frees it.
        let r = f.reserve(7);
        assert_eq!(f.unacked_ops(), 7);
        f.unseal(r);
        assert_eq!(f.unacked_ops(), 0);
        assert!(!opened);
    }

    #[test]
    fn small_records_are_bounded_in_number_too() {
        let f = Window::new(FlowOptions { window_ops: 1_000, window_records: 3, stall: Duration::from_millis(100) });
        let now = 1_000;
        let mut opened = false;
        for next in 1..=3 {
            assert!(!f.records_full());
            assert_eq!(f.admit(0, now, &mut opened), Admit::Go);
            seal(&f, 1, next);
        }
        assert_eq!((f.unacked_ops(), f.unacked_records()), (3, 3));
        assert!(f.records_full());
        assert!(f.acked(2));
        assert_eq!((f.unacked_ops(), f.unacked_records()), (1, 1));
        assert!(!f.records_full());
        // Merged entries free every record they stand for.
        let tracked = Window::new(FlowOptions { window_ops: 1_000, window_records: 1_000_000, stall: Duration::ZERO });
        for next in 1..=(TRACKED_RECORDS_MAX as u64 + 10) {
            seal(&tracked, 1, next);
        }
        assert_eq!(tracked.unacked_records(), TRACKED_RECORDS_MAX + 10);
        assert!(tracked.acked(TRACKED_RECORDS_MAX as u64 + 10));
        assert_eq!(tracked.unacked_records(), 0);
    }

    #[test]
    fn acks_that_stall_open_the_window_and_the_next_ack_that_moves_closes_it() {
        let f = flow(4);
        let t0 = 5_000;
        let ms = |n| t0 + n;
        let mut opened = false;
        // A reservation taken before the window opens is dropped with the count.
        let before = f.reserve(4);
        // The stall is measured from the first wait, not from the last ack.
        assert_eq!(f.admit(0, t0, &mut opened), Admit::WaitUntilMs(ms(100)));
        assert_eq!(f.admit(0, ms(50), &mut opened), Admit::WaitUntilMs(ms(100)));
        assert_eq!(f.admit(0, ms(100), &mut opened), Admit::Go);
        assert!(opened && f.is_open());
        assert_eq!(f.unacked_ops(), 0);
        // Open: writes go on uncounted.
        seal(&f, 4, 2);
        assert_eq!(f.unacked_ops(), 0);
        assert_eq!(f.admit(100, ms(101), &mut opened), Admit::Go);
        // Acks move again: the window closes and bounds the writer anew; the old reservation,
        // sealed late, is not counted twice.
        assert!(f.acked(1));
        assert!(!f.is_open());
        f.sealed(before, 1);
        seal(&f, 4, 3);
        assert_eq!(f.unacked_ops(), 4);
        assert_eq!(f.admit(0, ms(200), &mut opened), Admit::WaitUntilMs(ms(300)));
        assert!(f.acked(3));
        assert_eq!(f.unacked_ops(), 0);
    }

    #[test]
    fn tracked_records_merge_beyond_their_bound_and_free_only_when_the_last_is_acked() {
        let f = flow(usize::MAX / 2);
        for seq in 1..=(TRACKED_RECORDS_MAX as u64 + 10) {
            seal(&f, 1, seq);
        }
        assert_eq!(f.state.lock().inflight.len(), TRACKED_RECORDS_MAX);
        assert!(f.acked(TRACKED_RECORDS_MAX as u64));
        assert_eq!(f.unacked_ops(), 11, "the merged tail is still in flight");
        assert!(f.acked(TRACKED_RECORDS_MAX as u64 + 10));
        assert_eq!(f.unacked_ops(), 0);
    }

    #[test]
    fn a_zero_window_is_off() {
        let f = flow(0);
        let mut opened = false;
        seal(&f, 1_000_000, 1);
        assert_eq!(f.unacked_ops(), 0);
        assert_eq!(f.admit(usize::MAX / 2, 0, &mut opened), Admit::Go);
        assert!(!f.acked(5));
    }
}
