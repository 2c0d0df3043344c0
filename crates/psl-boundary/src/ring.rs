//! The single-producer single-consumer rings: [`duplex`] (the pair the boundary uses),
//! [`ring`] (one alone), [`Producer`], [`Consumer`].
//!
//! # Layout: one cache line per crossing, and one per request and answer
//!
//! Each slot holds a *sequence word* next to the item, in one 32-byte cell:
//!
//! - the producer writes the item at position `p` into slot `p mod slots`, then stores
//!   `seq = p + 1` (Release);
//! - the consumer at position `p` polls that slot's `seq` (Acquire); when it reads `p + 1` the
//!   item beside it is complete, and it moves the item out.
//!
//! So the consumer learns that an item exists and reads it from one cache line. A ring that
//! publishes a separate `tail` index (like `rtrb`) makes the consumer fetch two lines one after
//! the other, the index and then the slot.
//!
//! The two rings of a [`duplex`] pair (one per direction) share one slot array: cell `k` of
//! each direction sit side by side in one 64-byte line (a `Pair`). A record that crosses at
//! position `k` and the answer that comes back at position `k` of the other ring therefore
//! use the *same* line: the answering side writes into the line it has just read, so it
//! already owns it, and the round trip costs what two threads bouncing one counter through one
//! cache line cost (the floor). With the two directions in separate arrays the measured
//! crossing was ~1.3–1.6x that floor (each writer must first take back a line the other side
//! is polling; `bench_crossings` reports it as `ring_unpaired`); paired, ~0.95–1.2x. The price: one item per line per direction instead of two, so
//! one-way streaming is RFO-bound at ~25–30 M items/s here (unpaired: ~70 M/s), and when both
//! directions stream at once with their positions close, the two producers share lines. Both
//! rates are hundreds of times what the sealing pipeline produces (one signature, ~34 µs, per
//! record and core).
//!
//! The producer never reads slots. It learns about free space from the consumer's position,
//! which the consumer publishes (Release) in its own padded line after every pop (once per
//! batch in [`Consumer::pop_batch`]). The producer keeps a cached copy and re-reads the shared
//! one only when the cached copy says the ring is full, so in steady state it touches no line
//! the consumer writes. Counters live in padded lines written by one side only, after the item
//! is published, so they never delay a crossing.
//!
//! # Why `unsafe`, and why it is sound
//!
//! The slots are `UnsafeCell<MaybeUninit<T>>`: moving items in and out without a lock or a
//! per-slot atomic pointer swap is the point of the ring. The protocol invariant, per ring
//! (lane), with `head` the consumer's position and `tail` the producer's (both monotonically
//! increasing, never more than `capacity <= slots` apart):
//!
//! * positions in `head..tail` hold initialised items with `seq == position + 1`; every other
//!   slot is uninitialised (or holds an item already moved out) and its `seq` differs from
//!   `position + 1` for the next position that maps to it;
//! * only the ring's one [`Producer`] writes its slots, only at `tail`, and only after it has
//!   seen (via an Acquire load of the consumer's Release-published `head`) that
//!   `tail - head < capacity`, so the previous occupant of that slot (position
//!   `tail - slots <= tail - capacity < head`) was already moved out, and that move
//!   happened-before this write;
//! * only the ring's one [`Consumer`] reads its slots, only at `head`, and only after an
//!   Acquire load of `seq == head + 1`, which synchronises with the producer's Release store
//!   after the write;
//! * the two lanes of a pair are disjoint cells: an end of one ring never touches the other
//!   ring's cells (it selects its lane by a fixed index).
//!
//! Uniqueness of the ends is enforced by the types: [`ring`] and [`duplex`] create exactly one
//! `Producer` and one `Consumer` per ring; neither is `Clone`; the operations take `&mut self`;
//! and both are `!Sync`, so a handle can be moved to another thread but never shared.

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::sync::{Parker, Unparker};
use serde::Serialize;

use crate::backoff::{self, BackoffPolicy, Limit, Poll};
use crate::padded::CachePadded;
use crate::SealedRecord;

/// The error of a push into a full ring: the item, handed back unchanged.
pub struct Full<T = SealedRecord>(pub T);

impl<T> Full<T> {
    /// The item that could not be pushed.
    pub fn into_inner(self) -> T {
        self.0
    }
}

// Not derived: the item is opaque (a sealed record); printing it would only flood logs.
impl<T> fmt::Debug for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Full(..)")
    }
}

impl<T> fmt::Display for Full<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ring full")
    }
}

impl<T> std::error::Error for Full<T> {}

/// A snapshot of one ring's counters. Each counter is written by one side only, so a snapshot
/// taken while both sides run may be a few operations stale, but it never goes backwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RingStats {
    /// The most items that can be in the ring at once.
    pub capacity: u64,
    /// Items pushed so far.
    pub pushed: u64,
    /// Items popped so far.
    pub popped: u64,
    /// Push calls that found the ring full (a [`Producer::push`] returning [`Full`], or a
    /// blocking push that had to wait; each call counts once, however long it waited).
    pub full_events: u64,
    /// Items in the ring: `pushed - popped`.
    pub in_flight: u64,
    /// Times one end woke the other from a park (rings with a doorbell only; see
    /// [`BackoffPolicy::doorbell`]).
    pub doorbells: u64,
}

/// One slot: the sequence word and the item, side by side.
#[repr(C, align(32))]
struct Slot<T> {
    /// `position + 1` once the item for `position` is written.
    seq: AtomicU64,
    item: UnsafeCell<MaybeUninit<T>>,
}

/// Slot `k` of both rings of a pair, in one cache line (for items up to 24 bytes).
#[repr(C, align(64))]
struct Pair<T> {
    lanes: [Slot<T>; 2],
}

impl<T> Pair<T> {
    fn empty() -> Self {
        let slot = || Slot { seq: AtomicU64::new(0), item: UnsafeCell::new(MaybeUninit::uninit()) };
        Pair { lanes: [slot(), slot()] }
    }
}

/// Written by the producer only, on every push.
#[derive(Default)]
struct ProducerLine {
    pushed: AtomicU64,
    full_events: AtomicU64,
    /// Times the producer woke the parked consumer.
    doorbells: AtomicU64,
}

/// Written by the consumer only, on every pop.
#[derive(Default)]
struct ConsumerLine {
    /// The consumer's position: items popped so far. The producer's source of free space.
    head: AtomicU64,
    /// Times the consumer woke the parked producer.
    doorbells: AtomicU64,
}

/// The doorbell's flags: each raised by one end just before it parks, and lowered by the peer
/// that rings it (or by the end itself when it wakes). Written only around a park, so while both
/// ends are busy this line is read-only and stays in both caches.
#[derive(Default)]
struct Parked {
    consumer: AtomicBool,
    producer: AtomicBool,
}

/// Liveness: written once by each end (when dropped), read by blocked waiters on every poll,
/// so it sits apart from the lines written per operation.
#[derive(Default)]
struct Liveness {
    producer: AtomicBool,
    consumer: AtomicBool,
}

/// The ring's control block: positions, counters, liveness, the doorbell. Separate from the
/// slots so that a [`RingMonitor`] can read counters without keeping undelivered items alive.
struct Control {
    capacity: u64,
    alive: CachePadded<Liveness>,
    producer: CachePadded<ProducerLine>,
    consumer: CachePadded<ConsumerLine>,
    parked: CachePadded<Parked>,
    /// Wake the consumer's and the producer's [`Parker`].
    wake_consumer: Unparker,
    wake_producer: Unparker,
}

impl Control {
    fn stats(&self) -> RingStats {
        // Read `popped` first: both only grow and `popped <= pushed` at every instant, so
        // reading `pushed` second keeps the snapshot's `in_flight` from underflowing.
        let popped = self.consumer.head.load(Ordering::Acquire);
        let pushed = self.producer.pushed.load(Ordering::Acquire);
        RingStats {
            capacity: self.capacity,
            pushed,
            popped,
            full_events: self.producer.full_events.load(Ordering::Relaxed),
            in_flight: pushed.saturating_sub(popped),
            doorbells: self.producer.doorbells.load(Ordering::Relaxed)
                + self.consumer.doorbells.load(Ordering::Relaxed),
        }
    }
}

/// The slots of two rings (lanes 0 and 1), shared by their four ends.
struct Slots<T> {
    cells: Box<[Pair<T>]>,
    /// Each lane's control block, to read its consumer's final position when the last end is
    /// dropped.
    controls: [Arc<Control>; 2],
}

// SAFETY: `Slots` is `!Sync` only because of the `UnsafeCell`s. Shared access to them is
// confined, per lane, to that lane's unique `Producer` and unique `Consumer` under the protocol
// in the module docs: a cell is written only by the producer while no consumer can read it,
// and read only by the consumer after the producer's write happened-before (seq
// Release/Acquire), and it is rewritten only after the consumer's read happened-before (head
// Release/Acquire); the ends of one lane never touch the other lane's cells. The items
// themselves move between threads, so `T: Send` is required (and is all that is required: no
// `&T` is ever shared).
unsafe impl<T: Send> Sync for Slots<T> {}

impl<T> Drop for Slots<T> {
    fn drop(&mut self) {
        // All ends are gone (each held an `Arc` to `self`; dropping an `Arc` synchronises, so
        // all their writes are visible). Drop the items pushed but never popped: in each lane
        // they are exactly the positions from its consumer's `head` on whose `seq` is
        // `position + 1`.
        let mask = self.cells.len() - 1;
        for lane in 0..2 {
            let mut pos = self.controls[lane].consumer.head.load(Ordering::Acquire);
            for _ in 0..self.cells.len() {
                let cell = &mut self.cells[(pos as usize) & mask].lanes[lane];
                if *cell.seq.get_mut() != pos.wrapping_add(1) {
                    break;
                }
                // SAFETY: by the invariant, `seq == pos + 1` at a position `>= head` means the
                // producer wrote an item here that the consumer never moved out; it is dropped
                // exactly once because `pos` only advances, and at most `cells.len()`
                // positions are visited.
                unsafe { cell.item.get_mut().assume_init_drop() };
                pos = pos.wrapping_add(1);
            }
        }
    }
}

/// Creates a ring holding at most `capacity` items (exactly; the slot array is rounded up to
/// a power of two). Returns its only producer and its only consumer.
///
/// This is one lane of a [`duplex`] pair whose other lane stays unused (64 bytes a slot).
///
/// # Panics
/// If `capacity` is 0 or absurdly large (more than 2^40 items).
pub fn ring<T: Send>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    ring_with_backoff(capacity, BackoffPolicy::default())
}

/// [`ring`] with a given policy for both ends' blocking operations.
pub fn ring_with_backoff<T: Send>(capacity: usize, backoff: BackoffPolicy) -> (Producer<T>, Consumer<T>) {
    let (lane0, _unused) = duplex_with_backoff(capacity, [backoff; 2]);
    lane0
}

/// Creates two rings of `capacity` items each whose slot `k` share a cache line (see the
/// [module docs](self)): `(ring 0 ends, ring 1 ends)`, each `(producer, consumer)`. Meant for
/// the two directions of one conversation: ring 0 one way, ring 1 back.
///
/// # Panics
/// If `capacity` is 0 or absurdly large (more than 2^40 items).
#[allow(clippy::type_complexity)]
pub fn duplex<T: Send>(capacity: usize) -> ((Producer<T>, Consumer<T>), (Producer<T>, Consumer<T>)) {
    duplex_with_backoff(capacity, [BackoffPolicy::default(); 2])
}

/// [`duplex`] with a policy for each ring's ends (index 0 for ring 0); ends can change theirs
/// later with `set_backoff`. A ring whose policy has [`BackoffPolicy::doorbell`] gets a
/// doorbell for good: its ends check each other's parked flag after every push and pop, and
/// those whose policy says so park instead of sleeping.
#[allow(clippy::type_complexity)]
pub fn duplex_with_backoff<T: Send>(
    capacity: usize,
    backoff: [BackoffPolicy; 2],
) -> ((Producer<T>, Consumer<T>), (Producer<T>, Consumer<T>)) {
    assert!(capacity > 0, "a ring needs room for at least one item");
    assert!(capacity <= 1 << 40, "ring capacity {capacity} is not sensible");
    let slots = capacity.next_power_of_two();
    // Each end's parker, made with the control block that holds the other end's way to wake it.
    let mut parkers = [[Parker::new(), Parker::new()], [Parker::new(), Parker::new()]].map(|p| p.map(Some));
    let control = |parkers: &[Option<Parker>; 2]| {
        let unparker = |i: usize| parkers[i].as_ref().map(|p| p.unparker().clone()).expect("parker made above");
        let c = Control {
            capacity: capacity as u64,
            alive: CachePadded::default(),
            producer: CachePadded::default(),
            consumer: CachePadded::default(),
            parked: CachePadded::default(),
            wake_producer: unparker(0),
            wake_consumer: unparker(1),
        };
        c.alive.producer.store(true, Ordering::Relaxed);
        c.alive.consumer.store(true, Ordering::Relaxed);
        Arc::new(c)
    };
    let controls = [control(&parkers[0]), control(&parkers[1])];
    let shared = Arc::new(Slots { cells: (0..slots).map(|_| Pair::empty()).collect(), controls: controls.clone() });
    let mut ends = |lane: usize| {
        let [producer_parker, consumer_parker] = std::mem::take(&mut parkers[lane]);
        let producer = Producer {
            slots: Arc::clone(&shared),
            control: Arc::clone(&controls[lane]),
            lane,
            mask: slots - 1,
            capacity: capacity as u64,
            tail: 0,
            cached_head: 0,
            full_events: 0,
            doorbells: 0,
            doorbell: backoff[lane].doorbell,
            backoff: backoff[lane],
            parker: producer_parker.expect("each parker is taken once"),
            _not_sync: PhantomData,
        };
        let consumer = Consumer {
            slots: Arc::clone(&shared),
            control: Arc::clone(&controls[lane]),
            lane,
            mask: slots - 1,
            head: 0,
            doorbells: 0,
            doorbell: backoff[lane].doorbell,
            backoff: backoff[lane],
            parker: consumer_parker.expect("each parker is taken once"),
            _not_sync: PhantomData,
        };
        (producer, consumer)
    };
    (ends(0), ends(1))
}

/// The waiting half of the doorbell (see the [`backoff`](crate::backoff) module): raise `flag`,
/// fence, and park for at most `nap` only if `still_waiting()`, checked after the fence
/// (Dekker's pattern with [`ring_bell`]: either that check sees the peer's push or pop, or the peer
/// sees the flag); then lower the flag.
fn park(flag: &AtomicBool, parker: &Parker, nap: Duration, still_waiting: impl FnOnce() -> bool) {
    flag.store(true, Ordering::Relaxed);
    fence(Ordering::SeqCst);
    if still_waiting() {
        parker.park_timeout(nap);
    }
    flag.store(false, Ordering::Relaxed);
}

/// The ringing half, after a push or pop: fence, and wake the peer if its `flag` is raised.
/// True if this call woke it.
#[inline(always)]
fn ring_bell(flag: &AtomicBool, peer: &Unparker) -> bool {
    fence(Ordering::SeqCst);
    flag.load(Ordering::Relaxed) && wake(flag, peer)
}

#[cold]
fn wake(flag: &AtomicBool, peer: &Unparker) -> bool {
    let parked = flag.swap(false, Ordering::Relaxed);
    if parked {
        peer.unpark();
    }
    parked
}

/// The writing end of a ring. `Send`, not `Sync`, not `Clone`: there is exactly one.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<psl_boundary::Producer>();
/// ```
///
/// ```compile_fail
/// let (p, _c) = psl_boundary::ring::ring::<u64>(4);
/// let _second = p.clone();
/// ```
pub struct Producer<T = SealedRecord> {
    slots: Arc<Slots<T>>,
    control: Arc<Control>,
    /// Which ring of the pair (0 or 1).
    lane: usize,
    mask: usize,
    capacity: u64,
    /// Items pushed: the next position to write.
    tail: u64,
    /// The consumer's position as last read; never ahead of the real one.
    cached_head: u64,
    full_events: u64,
    doorbells: u64,
    /// Whether the ring has a doorbell (fixed when it is made, the same at both ends).
    doorbell: bool,
    backoff: BackoffPolicy,
    parker: Parker,
    /// `Cell` is `Send + !Sync`: this keeps the handle from being shared between threads.
    _not_sync: PhantomData<Cell<()>>,
}

impl<T: Send> Producer<T> {
    /// Pushes `item` if there is room; otherwise hands it back in [`Full`] (and counts a full
    /// event). Never blocks. Does not check whether the consumer still exists: items left in
    /// the ring are dropped when the last end of the pair is gone.
    #[inline]
    pub fn push(&mut self, item: T) -> Result<(), Full<T>> {
        match self.try_push(item) {
            Ok(()) => Ok(()),
            Err(item) => {
                self.note_full();
                Err(Full(item))
            }
        }
    }

    /// Pushes `item`, waiting while the ring is full (spin, yield, then sleep; see
    /// [`BackoffPolicy`]) for at most `timeout`. Hands the item back if the time runs out, or
    /// at once if the ring is full and the consumer is gone (nothing will ever make room).
    #[inline]
    pub fn push_blocking(&mut self, item: T, timeout: Duration) -> Result<(), Full<T>> {
        // The clock is read only once the ring is found full: reading it on every push would
        // cost more than the push (~50 cycles here).
        match self.try_push(item) {
            Ok(()) => Ok(()),
            Err(item) => self.wait_push(item, Limit::After(timeout)),
        }
    }

    /// [`Producer::push_blocking`] with an absolute deadline.
    #[inline]
    pub fn push_until(&mut self, item: T, deadline: Instant) -> Result<(), Full<T>> {
        match self.try_push(item) {
            Ok(()) => Ok(()),
            Err(item) => self.wait_push(item, Limit::At(deadline)),
        }
    }

    /// The slow path of the blocking pushes: the ring was full.
    #[cold]
    fn wait_push(&mut self, item: T, limit: Limit) -> Result<(), Full<T>> {
        self.note_full();
        let policy = self.backoff;
        let mut held = (self, Some(item));
        let pushed = backoff::wait_with(
            &policy,
            limit,
            &mut held,
            |(p, held)| {
                let item = held.take().expect("the item is held between polls");
                match p.try_push(item) {
                    Ok(()) => Poll::Ready(()),
                    Err(item) => {
                        *held = Some(item);
                        if p.control.alive.consumer.load(Ordering::Acquire) {
                            Poll::Pending
                        } else {
                            Poll::Abandoned
                        }
                    }
                }
            },
            |(p, _), nap| p.pause(nap),
        );
        match (pushed, held.1) {
            (Some(()), _) => Ok(()),
            (None, Some(item)) => Err(Full(item)),
            (None, None) => unreachable!("an item that was not pushed is still held"),
        }
    }

    /// Waits at most `nap` for room: parks (the consumer's next pop rings) on a doorbell ring
    /// whose policy says so, else sleeps.
    fn pause(&mut self, nap: Duration) {
        if !(self.doorbell && self.backoff.doorbell) {
            std::thread::sleep(nap);
            return;
        }
        let (c, tail, capacity) = (&self.control, self.tail, self.capacity);
        park(&c.parked.producer, &self.parker, nap, || {
            tail.wrapping_sub(c.consumer.head.load(Ordering::Acquire)) >= capacity
                && c.alive.consumer.load(Ordering::Acquire)
        });
    }

    /// After a push on a doorbell ring: wakes the consumer if it is parked.
    #[inline(always)]
    fn ring_consumer(&mut self) {
        if self.doorbell && ring_bell(&self.control.parked.consumer, &self.control.wake_consumer) {
            self.doorbells += 1;
            self.control.producer.doorbells.store(self.doorbells, Ordering::Relaxed);
        }
    }

    #[inline(always)]
    fn try_push(&mut self, item: T) -> Result<(), T> {
        if self.tail.wrapping_sub(self.cached_head) >= self.capacity {
            self.cached_head = self.control.consumer.head.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.cached_head) >= self.capacity {
                return Err(item);
            }
        }
        let cell = &self.slots.cells[(self.tail as usize) & self.mask].lanes[self.lane & 1];
        // SAFETY: we are the only producer (see the module docs), and `tail - head < capacity
        // <= slots` with `head` Acquire-loaded from the consumer's Release store, so the
        // consumer has finished moving out this cell's previous item (position `tail - slots`)
        // and will not read the cell until it sees the `seq` store below. Writing a
        // `MaybeUninit` never drops the old (moved-out) bytes.
        unsafe { (*cell.item.get()).write(item) };
        self.tail = self.tail.wrapping_add(1);
        cell.seq.store(self.tail, Ordering::Release);
        // After publishing: a counter store must not delay the item's visibility.
        self.control.producer.pushed.store(self.tail, Ordering::Release);
        self.ring_consumer();
        Ok(())
    }

    #[cold]
    fn note_full(&mut self) {
        self.full_events += 1;
        self.control.producer.full_events.store(self.full_events, Ordering::Relaxed);
    }

    /// The most items the ring holds.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// Items that can be pushed now without blocking (a lower bound: the consumer may be
    /// popping concurrently).
    pub fn free_slots(&self) -> usize {
        let head = self.control.consumer.head.load(Ordering::Acquire);
        (self.capacity - self.tail.wrapping_sub(head)) as usize
    }

    /// True once the consumer has been dropped: nothing pushed from now on will be read.
    pub fn is_abandoned(&self) -> bool {
        !self.control.alive.consumer.load(Ordering::Acquire)
    }

    /// This ring's counters.
    pub fn stats(&self) -> RingStats {
        self.control.stats()
    }

    /// A read-only view of this ring's counters that any thread may hold.
    pub fn monitor(&self) -> RingMonitor {
        RingMonitor { control: Arc::clone(&self.control) }
    }

    /// Replaces the policy of [`Producer::push_blocking`].
    pub fn set_backoff(&mut self, policy: BackoffPolicy) {
        self.backoff = policy;
    }
}

impl<T> Drop for Producer<T> {
    fn drop(&mut self) {
        // Release: a consumer that sees `false` also sees every item pushed before.
        self.control.alive.producer.store(false, Ordering::Release);
        // A parked consumer learns at once that its wait can never end.
        self.control.wake_consumer.unpark();
    }
}

impl<T> fmt::Debug for Producer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Producer").field("stats", &self.control.stats()).finish()
    }
}

/// The reading end of a ring. `Send`, not `Sync`, not `Clone`: there is exactly one.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<psl_boundary::Consumer>();
/// ```
///
/// ```compile_fail
/// let (_p, c) = psl_boundary::ring::ring::<u64>(4);
/// let _second = c.clone();
/// ```
pub struct Consumer<T = SealedRecord> {
    slots: Arc<Slots<T>>,
    control: Arc<Control>,
    /// Which ring of the pair (0 or 1).
    lane: usize,
    mask: usize,
    /// Items popped: the next position to read.
    head: u64,
    doorbells: u64,
    /// Whether the ring has a doorbell (fixed when it is made, the same at both ends).
    doorbell: bool,
    backoff: BackoffPolicy,
    parker: Parker,
    /// `Cell` is `Send + !Sync`: this keeps the handle from being shared between threads.
    _not_sync: PhantomData<Cell<()>>,
}

impl<T: Send> Consumer<T> {
    /// Takes the oldest item, if any. Never blocks.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        let item = self.take()?;
        self.control.consumer.head.store(self.head, Ordering::Release);
        self.ring_producer();
        Some(item)
    }

    /// Moves up to `max` items, oldest first, to the end of `out`; returns how many. Publishes
    /// the freed room to the producer once for the whole batch.
    pub fn pop_batch(&mut self, out: &mut Vec<T>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            match self.take() {
                Some(item) => out.push(item),
                None => break,
            }
            n += 1;
        }
        if n > 0 {
            self.control.consumer.head.store(self.head, Ordering::Release);
            self.ring_producer();
        }
        n
    }

    /// Takes the oldest item, waiting while the ring is empty (spin first, then yield, then
    /// sleep; see [`BackoffPolicy`]) for at most `timeout`. Returns `None` if the time runs
    /// out, or at once once the ring is empty and the producer is gone.
    #[inline]
    pub fn wait_pop(&mut self, timeout: Duration) -> Option<T> {
        if let Some(item) = self.pop() {
            return Some(item);
        }
        self.wait_pop_inner(Limit::After(timeout))
    }

    /// [`Consumer::wait_pop`] with an absolute deadline.
    #[inline]
    pub fn wait_pop_until(&mut self, deadline: Instant) -> Option<T> {
        if let Some(item) = self.pop() {
            return Some(item);
        }
        self.wait_pop_inner(Limit::At(deadline))
    }

    /// The slow path of the waiting pops: the ring was empty.
    fn wait_pop_inner(&mut self, limit: Limit) -> Option<T> {
        let policy = self.backoff;
        backoff::wait_with(
            &policy,
            limit,
            self,
            |c| {
                if let Some(item) = c.pop() {
                    return Poll::Ready(item);
                }
                if c.control.alive.producer.load(Ordering::Acquire) {
                    return Poll::Pending;
                }
                // The producer is gone, and its Release store of `alive` made all its pushes
                // visible to the Acquire load above: one last look, then give up.
                match c.pop() {
                    Some(item) => Poll::Ready(item),
                    None => Poll::Abandoned,
                }
            },
            |c, nap| c.pause(nap),
        )
    }

    /// True if the item at `head` is there (without taking it).
    #[inline(always)]
    fn ready(&self) -> bool {
        let cell = &self.slots.cells[(self.head as usize) & self.mask].lanes[self.lane & 1];
        cell.seq.load(Ordering::Acquire) == self.head.wrapping_add(1)
    }

    /// Waits at most `nap` for an item: parks (the producer's next push rings) on a doorbell
    /// ring whose policy says so, else sleeps.
    fn pause(&mut self, nap: Duration) {
        if !(self.doorbell && self.backoff.doorbell) {
            std::thread::sleep(nap);
            return;
        }
        let parked = &self.control.parked.consumer;
        park(parked, &self.parker, nap, || !self.ready() && self.control.alive.producer.load(Ordering::Acquire));
    }

    /// After a pop on a doorbell ring: wakes the producer if it is parked on a full ring.
    #[inline(always)]
    fn ring_producer(&mut self) {
        if self.doorbell && ring_bell(&self.control.parked.producer, &self.control.wake_producer) {
            self.doorbells += 1;
            self.control.consumer.doorbells.store(self.doorbells, Ordering::Relaxed);
        }
    }

    /// Moves the item at `head` out, without publishing the new position.
    #[inline(always)]
    fn take(&mut self) -> Option<T> {
        let cell = &self.slots.cells[(self.head as usize) & self.mask].lanes[self.lane & 1];
        if cell.seq.load(Ordering::Acquire) != self.head.wrapping_add(1) {
            return None;
        }
        // SAFETY: we are the only consumer; `seq == head + 1` (Acquire) synchronises with the
        // producer's Release store made after it wrote this cell's item for position `head`,
        // so the item is initialised and complete; the producer will not touch the cell again
        // until it has seen our position pass `head` (published after this read), and we
        // advance `head` right below, so the item is moved out exactly once.
        let item = unsafe { (*cell.item.get()).assume_init_read() };
        self.head = self.head.wrapping_add(1);
        Some(item)
    }

    /// Items waiting in the ring now (a lower bound: the producer may be pushing).
    pub fn len(&self) -> usize {
        let pushed = self.control.producer.pushed.load(Ordering::Acquire);
        pushed.wrapping_sub(self.head) as usize
    }

    /// True if no item is waiting now.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most items the ring holds.
    pub fn capacity(&self) -> usize {
        self.control.capacity as usize
    }

    /// True once the producer has been dropped (items it pushed may still be waiting).
    pub fn is_abandoned(&self) -> bool {
        !self.control.alive.producer.load(Ordering::Acquire)
    }

    /// This ring's counters.
    pub fn stats(&self) -> RingStats {
        self.control.stats()
    }

    /// A read-only view of this ring's counters that any thread may hold.
    pub fn monitor(&self) -> RingMonitor {
        RingMonitor { control: Arc::clone(&self.control) }
    }

    /// Replaces the policy of [`Consumer::wait_pop`].
    pub fn set_backoff(&mut self, policy: BackoffPolicy) {
        self.backoff = policy;
    }
}

impl<T> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.control.alive.consumer.store(false, Ordering::Release);
        // A parked producer learns at once that its wait can never end.
        self.control.wake_producer.unpark();
    }
}

impl<T> fmt::Debug for Consumer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer").field("stats", &self.control.stats()).finish()
    }
}

/// A read-only, shareable view of one ring's counters (for metrics). It holds no items: the
/// items left in a ring are dropped when the last end of its pair goes, monitors or not.
#[derive(Clone)]
pub struct RingMonitor {
    control: Arc<Control>,
}

impl RingMonitor {
    /// The ring's counters now.
    pub fn stats(&self) -> RingStats {
        self.control.stats()
    }

    /// True while both ends exist.
    pub fn is_connected(&self) -> bool {
        self.control.alive.producer.load(Ordering::Acquire) && self.control.alive.consumer.load(Ordering::Acquire)
    }
}

impl fmt::Debug for RingMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RingMonitor").field("stats", &self.control.stats()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn assert_send<T: Send>() {}

    #[test]
    fn a_pair_of_record_slots_is_one_line() {
        assert_eq!(std::mem::size_of::<Slot<SealedRecord>>(), 32);
        assert_eq!(std::mem::size_of::<Pair<SealedRecord>>(), 64);
        assert_eq!(std::mem::align_of::<Pair<SealedRecord>>(), 64);
    }

    #[test]
    fn handles_are_send() {
        assert_send::<Producer>();
        assert_send::<Consumer>();
        assert_send::<Producer<u64>>();
        assert_send::<RingMonitor>();
        fn assert_sync<T: Sync>() {}
        assert_sync::<RingMonitor>();
    }

    #[test]
    fn capacity_is_exact_not_rounded() {
        let (mut p, mut c) = ring::<u32>(3);
        for i in 0..3 {
            p.push(i).unwrap();
        }
        assert_eq!(p.push(9).unwrap_err().into_inner(), 9);
        assert_eq!(p.free_slots(), 0);
        assert_eq!(c.pop(), Some(0));
        assert_eq!(p.free_slots(), 1);
        p.push(3).unwrap();
        assert!(p.push(10).is_err());
        let mut out = Vec::new();
        assert_eq!(c.pop_batch(&mut out, 10), 3);
        assert_eq!(out, vec![1, 2, 3]);
        assert_eq!(c.pop(), None);
        let s = c.stats();
        assert_eq!((s.pushed, s.popped, s.full_events, s.in_flight, s.capacity), (4, 4, 2, 0, 3));
    }

    #[test]
    fn wraps_around_many_laps_in_order() {
        let (mut p, mut c) = ring::<u64>(5);
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        while next_out < 10_000 {
            while p.push(next_in).is_ok() {
                next_in += 1;
            }
            // Pop an uneven number each round so the positions drift across the slot array.
            for _ in 0..(next_out % 4 + 1) {
                if let Some(v) = c.pop() {
                    assert_eq!(v, next_out);
                    next_out += 1;
                }
            }
        }
        assert_eq!(c.stats().pushed, next_in);
    }

    #[test]
    fn pop_batch_respects_max() {
        let (mut p, mut c) = ring::<u8>(8);
        for i in 0..8 {
            p.push(i).unwrap();
        }
        let mut out = vec![100];
        assert_eq!(c.pop_batch(&mut out, 3), 3);
        assert_eq!(out, vec![100, 0, 1, 2]);
        assert_eq!(c.pop_batch(&mut out, 0), 0);
        assert_eq!(c.len(), 5);
        assert_eq!(c.pop_batch(&mut out, usize::MAX), 5);
        assert!(c.is_empty());
    }

    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn undelivered_items_dropped_exactly_once() {
        for (pushes, pops) in [(0, 0), (3, 0), (4, 2), (4, 4), (7, 3)] {
            let drops = Arc::new(AtomicUsize::new(0));
            let (mut p, mut c) = ring::<Counted>(4);
            let mut created = 0;
            let mut popped = 0;
            for _ in 0..pushes {
                // Either it goes into the ring, or it comes back in `Full` and is dropped here.
                let _ = p.push(Counted(Arc::clone(&drops)));
                created += 1;
                if popped < pops {
                    if let Some(item) = c.pop() {
                        drop(item);
                        popped += 1;
                    }
                }
            }
            let monitor = p.monitor();
            drop(p);
            drop(c);
            assert_eq!(drops.load(Ordering::SeqCst), created, "pushes {pushes} pops {pops}");
            // The monitor outlives the ring's items and still reads the counters.
            assert!(!monitor.is_connected());
            assert_eq!(monitor.stats().popped, popped as u64);
        }
    }

    #[test]
    fn duplex_lanes_are_independent_rings() {
        let drops = Arc::new(AtomicUsize::new(0));
        let ((mut tx0, mut rx0), (mut tx1, mut rx1)) = duplex::<Counted>(2);
        tx0.push(Counted(Arc::clone(&drops))).unwrap();
        tx0.push(Counted(Arc::clone(&drops))).unwrap();
        assert!(tx0.push(Counted(Arc::clone(&drops))).is_err()); // lane 0 full, dropped here
        tx1.push(Counted(Arc::clone(&drops))).unwrap(); // lane 1 still has room
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(rx1.pop().is_some()); // dropped at once
        assert!(rx1.pop().is_none());
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        assert!(rx0.pop().is_some());
        let (s0, s1) = (rx0.stats(), tx1.stats());
        assert_eq!((s0.pushed, s0.popped, s0.full_events), (2, 1, 1));
        assert_eq!((s1.pushed, s1.popped, s1.full_events), (1, 1, 0));
        tx1.push(Counted(Arc::clone(&drops))).unwrap();
        // Lane 0 keeps one item and lane 1 one: both dropped with the last end.
        drop((tx0, rx0, tx1));
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        drop(rx1);
        assert_eq!(drops.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn duplex_both_directions_across_threads() {
        let ((mut a_tx, mut b_rx), (mut b_tx, mut a_rx)) = duplex::<u64>(3);
        const N: u64 = 10_000;
        let t = std::thread::spawn(move || {
            // Echo with a twist, so the two lanes carry different values.
            for i in 0..N {
                let v = b_rx.wait_pop(Duration::from_secs(30)).expect("a stalled");
                assert_eq!(v, i);
                b_tx.push_blocking(v * 2, Duration::from_secs(30)).unwrap();
            }
        });
        let mut got = 0;
        for i in 0..N {
            a_tx.push_blocking(i, Duration::from_secs(30)).unwrap();
            // Keep up to two in flight to mix full and empty rings.
            if i % 3 != 0 {
                while let Some(v) = a_rx.pop() {
                    assert_eq!(v, got * 2);
                    got += 1;
                }
            }
        }
        while got < N {
            assert_eq!(a_rx.wait_pop(Duration::from_secs(30)), Some(got * 2));
            got += 1;
        }
        t.join().unwrap();
    }

    #[test]
    fn zero_sized_items() {
        let (mut p, mut c) = ring::<()>(2);
        p.push(()).unwrap();
        p.push(()).unwrap();
        assert!(p.push(()).is_err());
        assert_eq!(c.pop(), Some(()));
        assert_eq!(c.pop(), Some(()));
        assert_eq!(c.pop(), None);
    }

    #[test]
    fn abandoned_ends_stop_waits() {
        let (mut p, c) = ring::<u8>(1);
        p.push(1).unwrap();
        drop(c);
        assert!(p.is_abandoned());
        let t = Instant::now();
        assert_eq!(p.push_blocking(2, Duration::from_secs(30)).unwrap_err().into_inner(), 2);
        assert!(t.elapsed() < Duration::from_secs(10));

        let (mut p, mut c) = ring::<u8>(2);
        p.push(5).unwrap();
        drop(p);
        assert!(c.is_abandoned());
        assert_eq!(c.wait_pop(Duration::from_secs(30)), Some(5));
        let t = Instant::now();
        assert_eq!(c.wait_pop(Duration::from_secs(30)), None);
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn cross_thread_transfer_in_order() {
        let (mut p, mut c) = ring::<u64>(4);
        const N: u64 = 20_000;
        let t = std::thread::spawn(move || {
            for i in 0..N {
                p.push_blocking(i, Duration::from_secs(30)).unwrap();
            }
        });
        let mut out = Vec::new();
        while (out.len() as u64) < N {
            if c.pop_batch(&mut out, 3) == 0 {
                out.push(c.wait_pop(Duration::from_secs(30)).expect("producer stalled"));
            }
        }
        t.join().unwrap();
        assert!(out.iter().copied().eq(0..N));
    }

    /// A policy that parks at once and would stay parked for an hour: only the doorbell (or
    /// abandonment) can end a wait in time.
    fn park_for_an_hour() -> BackoffPolicy {
        BackoffPolicy {
            spin_polls: 0,
            yield_polls: 0,
            min_sleep: Duration::from_secs(3600),
            max_sleep: Duration::from_secs(3600),
            doorbell: true,
        }
    }

    /// Runs `f` on a thread and fails the test if it has not finished within 60 s (a lost
    /// wake-up would leave it parked for an hour).
    fn within_a_minute<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what}: still waiting after 60 s"))
    }

    #[test]
    fn a_push_rings_a_parked_consumer_awake() {
        let (mut p, mut c) = ring_with_backoff::<u32>(4, park_for_an_hour());
        let consumer = std::thread::spawn(move || (c.wait_pop(Duration::from_secs(7200)), c));
        // Let it run out of polls and park (if it has not yet, the push simply finds it awake).
        std::thread::sleep(Duration::from_millis(100));
        p.push(7).unwrap();
        let (got, c) = within_a_minute("the parked consumer", move || consumer.join().unwrap());
        assert_eq!(got, Some(7));
        assert!(c.stats().doorbells <= 1);
    }

    #[test]
    fn a_pop_rings_a_producer_parked_on_a_full_ring() {
        let (mut p, mut c) = ring_with_backoff::<u32>(1, park_for_an_hour());
        p.push(1).unwrap();
        let producer = std::thread::spawn(move || (p.push_blocking(2, Duration::from_secs(7200)).is_ok(), p));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(c.pop(), Some(1));
        let (pushed, _p) = within_a_minute("the parked producer", move || producer.join().unwrap());
        assert!(pushed);
        assert_eq!(c.pop(), Some(2));
    }

    #[test]
    fn dropping_the_peer_wakes_a_parked_end() {
        let (p, mut c) = ring_with_backoff::<u32>(4, park_for_an_hour());
        let consumer = std::thread::spawn(move || c.wait_pop(Duration::from_secs(7200)));
        std::thread::sleep(Duration::from_millis(100));
        drop(p);
        assert_eq!(within_a_minute("the abandoned consumer", move || consumer.join().unwrap()), None);

        let (mut p, c) = ring_with_backoff::<u32>(1, park_for_an_hour());
        p.push(1).unwrap();
        let producer = std::thread::spawn(move || p.push_blocking(2, Duration::from_secs(7200)).is_err());
        std::thread::sleep(Duration::from_millis(100));
        drop(c);
        assert!(within_a_minute("the abandoned producer", move || producer.join().unwrap()));
    }

    /// Both ends park whenever they must wait, in bursts that make them do so often: every
    /// item arrives in order and no wake-up is lost (each would cost an hour).
    #[test]
    fn parking_both_ways_loses_no_wake_up() {
        let (mut p, mut c) = ring_with_backoff::<u64>(8, park_for_an_hour());
        const N: u64 = 20_000;
        let out = within_a_minute("the transfer", move || {
            let t = std::thread::spawn(move || {
                for i in 0..N {
                    p.push_blocking(i, Duration::from_secs(7200)).unwrap();
                    if i % 997 == 0 {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            });
            let mut out = Vec::with_capacity(N as usize);
            while (out.len() as u64) < N {
                if c.pop_batch(&mut out, 5) == 0 {
                    out.push(c.wait_pop(Duration::from_secs(7200)).expect("producer stalled"));
                }
                if out.len() % 1499 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            t.join().unwrap();
            (out, c.stats())
        });
        assert!(out.0.iter().copied().eq(0..N));
        assert!(out.1.doorbells > 0, "the bursts made the ends park: {:?}", out.1);
    }

    #[test]
    fn without_a_doorbell_no_one_rings() {
        let (mut p, mut c) = ring::<u64>(2);
        let t = std::thread::spawn(move || c.wait_pop(Duration::from_secs(30)).map(|v| (v, c.stats())));
        std::thread::sleep(Duration::from_millis(20));
        p.push(1).unwrap();
        let (v, stats) = t.join().unwrap().expect("the sleeping consumer polls and finds it");
        assert_eq!((v, stats.doorbells), (1, 0));
    }
}
