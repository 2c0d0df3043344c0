//! [`WriterQueue`]: one data writer's client writes, from the moment a write is admitted to the
//! moment a batch of them is taken to be sealed into one record. It is the engine's per-writer
//! part, and a client write is an event into it:
//!
//! - [`WriterQueue::admit`]: may a write go now (room in the queue and in the flow window), or
//!   wait, and until when;
//! - [`WriterQueue::write`]: stamp the write (newer than every version its node shows), apply it
//!   to the memtable and queue its op; says whether it wakes the writer;
//! - [`WriterQueue::seal_step`]: the seal policy: seal now (how many ops), or wait for a fuller
//!   batch or for acks, and until when;
//! - [`WriterQueue::take`]: the ops of one record, counted in flight in the flow window.
//!
//! It holds no lock and does no I/O. The runtime keeps each writer's queue under a mutex that
//! puts on many threads and the writer's actor share (waits happen on condition variables
//! beside it, as the queue says), so puts to different writers run in parallel and a put costs
//! no thread hand-off. The simulator holds the same queues inline and seals when they say.
//! Time is the caller's monotonic clock in microseconds (flush delays are sub-millisecond).

use super::write::{self, Admission, StampError};
use crate::memtable::{Memtable, Version};
use crate::window::{Reserved, Window};
use crate::LamportClock;
use psl_capsule::{Action, Op};
use std::collections::VecDeque;
use std::sync::Arc;

/// When a writer seals its queued ops into a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealPolicy {
    /// Most ops in one record (at least 1).
    pub batch_ops_max: usize,
    /// Most encoded op bytes in one record (the capsule's record limit less header room), so
    /// that a batch of large values is split instead of failing to seal. A single op larger
    /// than this still goes alone (the write's limits were checked when it was admitted).
    pub batch_bytes_max: usize,
    /// How long a batch that is not full waits for more ops, from when the writer first saw it.
    pub flush_delay_us: u64,
    /// The shortest time from one seal to the next for a batch that is not full (0: none).
    /// Under a steady load a writer then seals at most one record per interval, so the work
    /// every role does per record (above all, a signature check in each) is spread over more
    /// ops as the load grows; a write after a quiet spell still waits only `flush_delay_us`.
    pub seal_interval_us: u64,
}

/// What a writer does next with its queue ([`WriterQueue::seal_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealStep {
    /// Nothing queued: wait for a write (or a control message).
    Idle,
    /// Wait for more ops (a batch to fill) or for acks (the window's records are in flight), at
    /// most until this time (µs); then ask again.
    WaitUntilUs(u64),
    /// Take the first `ops` queued ops ([`WriterQueue::take`]) and seal them now.
    Seal {
        /// How many ops the record carries.
        ops: usize,
    },
}

/// One record's worth of ops taken from a queue ([`WriterQueue::take`]).
#[derive(Debug)]
pub struct Taken {
    /// The ops, in Lamport order.
    pub ops: Vec<Op>,
    /// They are one atomic batch ([`WriterQueue::write_atomic`]): seal them as
    /// [`psl_capsule::Body::Atomic`].
    pub atomic: bool,
    /// Their place in the flow window ([`Window::sealed`] or [`Window::unseal`]).
    pub reserved: Reserved,
}

/// One data writer's queue of client writes and its seal policy (module docs).
#[derive(Debug)]
pub struct WriterQueue {
    writer: u32,
    ops: VecDeque<Op>,
    /// The atomic batches queued, oldest first: (first op's Lamport time, op count). Each is
    /// sealed alone, whole, in one record.
    atomic: VecDeque<(u64, usize)>,
    cap: usize,
    policy: SealPolicy,
    window: Arc<Window>,
    /// When the writer first saw the current batch not full (µs): its flush delay runs from
    /// there.
    batch_since_us: Option<u64>,
    /// When the writer first found its records' window full for the current batch (µs): it
    /// waits for acks at most the window's stall from there.
    acks_since_us: Option<u64>,
    /// When the policy last said seal (µs): the next batch that is not full waits at least
    /// `seal_interval_us` from there.
    last_seal_us: Option<u64>,
}

impl WriterQueue {
    /// An empty queue for `writer` holding at most `cap` ops (at least one full batch), sealed
    /// under `policy` and paced by `window` (shared with whoever feeds it acks).
    pub fn new(writer: u32, cap: usize, policy: SealPolicy, window: Arc<Window>) -> WriterQueue {
        let policy = SealPolicy { batch_ops_max: policy.batch_ops_max.max(1), ..policy };
        WriterQueue {
            writer,
            ops: VecDeque::new(),
            atomic: VecDeque::new(),
            cap: cap.max(policy.batch_ops_max),
            policy,
            window,
            batch_since_us: None,
            acks_since_us: None,
            last_seal_us: None,
        }
    }

    /// The writer this queue feeds.
    pub fn writer(&self) -> u32 {
        self.writer
    }

    /// Ops queued and not yet taken.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether no op is queued.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The ops queued, oldest (lowest Lamport time) first.
    pub fn queued(&self) -> impl Iterator<Item = &Op> {
        self.ops.iter()
    }

    /// Most ops the queue holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The seal policy.
    pub fn policy(&self) -> SealPolicy {
        self.policy
    }

    /// The writer's flow window.
    pub fn window(&self) -> &Arc<Window> {
        &self.window
    }

    /// Whether a write may go at once, with no wait: the fast path of [`WriterQueue::admit`],
    /// which touches no clock.
    #[inline]
    pub fn has_room(&self) -> bool {
        self.ops.len() < self.cap && self.window.has_room(self.ops.len())
    }

    /// A client write's admission at `now_ms` for a caller that gives up at `deadline_ms`
    /// (both ms on the caller's clock): see [`write::admit`]. Ask again after every wait.
    pub fn admit(&self, now_ms: u64, deadline_ms: u64) -> Admission {
        write::admit(self.ops.len(), self.cap, &self.window, now_ms, deadline_ms)
    }

    /// A client write of `key` (`None`: a delete), admitted: stamped and applied to `memtable`
    /// by [`write::stamp`] (`below`: the caller's fence, `u64::MAX` for none), then queued.
    /// Returns its version and whether it wakes the writer ([`write::wakes_writer`]). On an
    /// error nothing was applied or queued.
    #[inline]
    pub fn write(
        &mut self,
        memtable: &Memtable,
        clock: &LamportClock,
        key: &[u8],
        value: Option<&[u8]>,
        below: u64,
    ) -> Result<(Version, bool), StampError> {
        let version = write::stamp(memtable, clock, key, value, self.writer, below)?;
        let action = match value {
            Some(v) => Action::Put(v.to_vec()),
            None => Action::Delete,
        };
        self.ops.push_back(Op { lamport: version.lamport, key: key.to_vec(), action });
        Ok((version, write::wakes_writer(self.ops.len(), self.policy.batch_ops_max)))
    }

    /// An atomic batch of writes (`ops`: key and value, `None`: a delete), admitted: stamped
    /// and applied to `memtable` as one ([`Memtable::write_atomic`]: each op newer than every
    /// version of its key the node shows, and every op's time below `below`), then queued to
    /// be sealed alone in one [`psl_capsule::Body::Atomic`] record. The caller checks the
    /// batch fits one record ([`WriterQueue::fits_one_record`]). Returns the ops' versions;
    /// it always wakes the writer. On an error nothing was applied or queued.
    pub fn write_atomic(
        &mut self,
        memtable: &Memtable,
        clock: &LamportClock,
        ops: &[(&[u8], Option<&[u8]>)],
        below: u64,
    ) -> Result<Vec<Version>, StampError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<crate::memtable::AtomicWrite<'_>> = ops.iter().map(|(k, v)| (*k, v.map(Arc::from))).collect();
        let writer = self.writer;
        let versions = memtable.write_atomic(&values, |held| write::stamp_held(clock, held, writer, below))?;
        self.atomic.push_back((versions[0].lamport, ops.len()));
        for ((key, value), version) in ops.iter().zip(&versions) {
            let action = match value {
                Some(v) => Action::Put(v.to_vec()),
                None => Action::Delete,
            };
            self.ops.push_back(Op { lamport: version.lamport, key: key.to_vec(), action });
        }
        Ok(versions)
    }

    /// Whether `ops` (key, value) fit one record under the seal policy: at most
    /// `batch_ops_max` ops and `batch_bytes_max` encoded bytes (one op always fits).
    pub fn fits_one_record(&self, ops: &[(&[u8], Option<&[u8]>)]) -> bool {
        let bytes: usize = ops.iter().map(|(k, v)| Op::encoded_len_of(k, *v)).sum();
        ops.len() <= 1 || (ops.len() <= self.policy.batch_ops_max && bytes <= self.policy.batch_bytes_max)
    }

    /// The seal policy at `now_us`: seal when a batch is full, or when the flush delay since
    /// the writer first saw the batch has passed and the seal interval since the last seal
    /// too; but while the window has `window_records`
    /// records in flight, first wait (up to the window's stall) for acks, the batch growing
    /// meanwhile. `urgent` (a control message waits: an epoch, an EOE, a flush) seals at once.
    pub fn seal_step(&mut self, now_us: u64, urgent: bool) -> SealStep {
        if self.ops.is_empty() {
            self.batch_since_us = None;
            self.acks_since_us = None;
            return SealStep::Idle;
        }
        if !urgent {
            // A queued atomic batch is whole: it (and the ops before it) need not wait to fill.
            if self.ops.len() < self.policy.batch_ops_max && self.atomic.is_empty() {
                let since = *self.batch_since_us.get_or_insert(now_us);
                let mut due = since.saturating_add(self.policy.flush_delay_us);
                if let Some(last) = self.last_seal_us {
                    due = due.max(last.saturating_add(self.policy.seal_interval_us));
                }
                if now_us < due {
                    return SealStep::WaitUntilUs(due);
                }
            }
            if self.window.records_full() {
                let since = *self.acks_since_us.get_or_insert(now_us);
                let due = since.saturating_add(self.window.stall.as_micros() as u64);
                if now_us < due {
                    return SealStep::WaitUntilUs(due);
                }
            }
        }
        self.last_seal_us = Some(now_us);
        SealStep::Seal { ops: self.fitting() }
    }

    /// How many of the first queued ops fit one record: at most `batch_ops_max`, at most
    /// `batch_bytes_max` encoded bytes, and at least one (when any is queued); an atomic
    /// batch at the front whole, and never a plain op with one.
    fn fitting(&self) -> usize {
        let next_atomic = self.atomic.front().copied();
        if let Some((first, n)) = next_atomic {
            if self.ops.front().is_some_and(|o| o.lamport == first) {
                return n;
            }
        }
        let mut bytes = 0;
        let mut n = 0;
        for op in self.ops.iter().take(self.policy.batch_ops_max) {
            if next_atomic.is_some_and(|(first, _)| op.lamport >= first) {
                break;
            }
            bytes += op.encoded_len();
            if n > 0 && bytes > self.policy.batch_bytes_max {
                break;
            }
            n += 1;
        }
        n
    }

    /// Takes the first `ops` queued ops for one record (as [`WriterQueue::seal_step`] said:
    /// an atomic batch is taken whole or not at all, and alone), counted in the flow window
    /// before they leave the queue (so an ack cannot come before they are counted). The
    /// batch's timers start again. Pair the [`Reserved`] with [`Window::sealed`] or
    /// [`Window::unseal`].
    pub fn take(&mut self, ops: usize) -> Taken {
        let fit = self.fitting();
        let mut n = ops.min(self.ops.len());
        let atomic =
            self.atomic.front().is_some_and(|&(first, _)| self.ops.front().is_some_and(|o| o.lamport == first));
        if atomic {
            n = fit;
            self.atomic.pop_front();
        } else {
            n = n.min(fit.max(1));
        }
        let batch: Vec<Op> = self.ops.drain(..n).collect();
        self.batch_since_us = None;
        self.acks_since_us = None;
        let reserved = self.window.reserve(n);
        Taken { ops: batch, atomic, reserved }
    }

    /// The next record's worth of ops at `now_us`, whatever the policy says (a flush, an EOE):
    /// `None` when the queue is empty. It counts as a seal for the seal interval.
    pub fn take_batch_now(&mut self, now_us: u64) -> Option<Taken> {
        if self.ops.is_empty() {
            return None;
        }
        self.last_seal_us = Some(now_us);
        let n = self.fitting();
        Some(self.take(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::FlowOptions;
    use std::time::Duration;

    fn queue(batch_ops_max: usize, batch_bytes_max: usize, flow: FlowOptions) -> WriterQueue {
        let policy = SealPolicy { batch_ops_max, batch_bytes_max, flush_delay_us: 500, seal_interval_us: 0 };
        WriterQueue::new(7, 64, policy, Arc::new(Window::new(flow)))
    }

    fn off() -> FlowOptions {
        FlowOptions { window_ops: 0, ..Default::default() }
    }

    fn put(q: &mut WriterQueue, m: &Memtable, c: &LamportClock, key: &[u8], value: &[u8]) -> bool {
        q.write(m, c, key, Some(value), u64::MAX).expect("applied").1
    }

    #[test]
    fn under_a_steady_load_a_writer_seals_once_per_seal_interval_and_after_a_quiet_spell_at_its_flush_delay() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let policy =
            SealPolicy { batch_ops_max: 64, batch_bytes_max: 1 << 20, flush_delay_us: 500, seal_interval_us: 2_000 };
        let mut q = WriterQueue::new(7, 1024, policy, Arc::new(Window::new(off())));
        // A lone write: its flush delay only (no seal before).
        put(&mut q, &m, &c, b"a", b"1");
        assert_eq!(q.seal_step(0, false), SealStep::WaitUntilUs(500));
        assert_eq!(q.seal_step(500, false), SealStep::Seal { ops: 1 });
        q.take(1);
        // A steady load, one op every 100 µs: each batch waits for the interval from the last
        // seal, not only its flush delay, so every record carries about 20 ops.
        let (mut t, mut seals) = (500, Vec::new());
        while t < 20_500 {
            t += 100;
            put(&mut q, &m, &c, format!("k{t}").as_bytes(), b"v");
            if let SealStep::Seal { ops } = q.seal_step(t, false) {
                seals.push((t, ops));
                q.take(ops);
            }
        }
        assert!(seals.windows(2).all(|w| w[1].0 - w[0].0 >= 2_000), "{seals:?}");
        assert!(seals.len() >= 9 && seals.iter().skip(1).all(|&(_, n)| n >= 19), "{seals:?}");
        // A full batch does not wait for the interval, nor does an urgent seal.
        let now = seals.last().unwrap().0 + 10;
        let queued = q.len();
        for i in queued..64 {
            put(&mut q, &m, &c, format!("full{i}").as_bytes(), b"v");
        }
        assert_eq!(q.seal_step(now, false), SealStep::Seal { ops: 64 });
        q.take(64);
        put(&mut q, &m, &c, b"u", b"1");
        assert_eq!(q.seal_step(now + 1, true), SealStep::Seal { ops: 1 });
        q.take(1);
        // After a quiet spell longer than the interval, a write waits its flush delay only.
        put(&mut q, &m, &c, b"late", b"1");
        assert_eq!(q.seal_step(now + 10_000, false), SealStep::WaitUntilUs(now + 10_500));
        // A forced seal (a flush, an EOE) counts as a seal: the next batch waits the interval.
        assert_eq!(q.take_batch_now(now + 10_100).map(|t| t.ops.len()), Some(1));
        put(&mut q, &m, &c, b"after", b"1");
        assert_eq!(q.seal_step(now + 10_200, false), SealStep::WaitUntilUs(now + 12_100));
    }

    #[test]
    fn a_batch_that_is_not_full_waits_its_flush_delay_from_when_the_writer_saw_it() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let mut q = queue(4, 1 << 20, off());
        assert_eq!(q.seal_step(0, false), SealStep::Idle);
        assert!(put(&mut q, &m, &c, b"a", b"1"), "the first op wakes the writer");
        assert_eq!(q.seal_step(1_000, false), SealStep::WaitUntilUs(1_500));
        assert!(!put(&mut q, &m, &c, b"b", b"2"));
        assert_eq!(q.seal_step(1_400, false), SealStep::WaitUntilUs(1_500), "the delay does not restart");
        assert_eq!(q.seal_step(1_500, false), SealStep::Seal { ops: 2 });
        let ops = q.take(2).ops;
        assert_eq!(ops.iter().map(|o| o.key.clone()).collect::<Vec<_>>(), vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(ops[0].lamport < ops[1].lamport, "a queue holds its ops in Lamport order");
        assert_eq!(q.seal_step(1_600, false), SealStep::Idle);
    }

    #[test]
    fn a_full_batch_or_an_urgent_writer_seals_at_once_and_a_record_is_split_by_bytes() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let mut q = queue(3, 1 << 20, off());
        let wakes: Vec<bool> = (0..4u8).map(|i| put(&mut q, &m, &c, &[b'k', i], b"v")).collect();
        assert_eq!(wakes, [true, false, true, false], "woken at the first op and at a full batch");
        assert_eq!(q.seal_step(0, false), SealStep::Seal { ops: 3 });
        let _ = q.take(3);
        assert_eq!(q.seal_step(0, true), SealStep::Seal { ops: 1 }, "urgent: no flush delay");
        let _ = q.take(1);
        // Ops of 100-byte values against a 250-byte record: two per record, never zero.
        let mut q = queue(10, 250, off());
        for i in 0..5u8 {
            put(&mut q, &m, &c, &[b'x', i], &[0u8; 100]);
        }
        assert_eq!(q.seal_step(0, true), SealStep::Seal { ops: 2 });
        let mut q = queue(10, 50, off());
        put(&mut q, &m, &c, b"big", &[0u8; 100]);
        assert_eq!(q.seal_step(0, true), SealStep::Seal { ops: 1 }, "an op larger than the bound goes alone");
    }

    #[test]
    fn with_its_records_in_flight_a_writer_waits_for_acks_up_to_the_stall() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let flow = FlowOptions { window_ops: 1_000, window_records: 1, stall: Duration::from_millis(2) };
        let mut q = queue(1, 1 << 20, flow);
        put(&mut q, &m, &c, b"a", b"1");
        let SealStep::Seal { ops } = q.seal_step(0, false) else { panic!("a full batch seals") };
        let r = q.take(ops).reserved;
        q.window().sealed(r, 1);
        put(&mut q, &m, &c, b"b", b"2");
        assert_eq!(q.seal_step(10, false), SealStep::WaitUntilUs(2_010), "one record in flight: wait for its ack");
        assert_eq!(q.seal_step(10, true), SealStep::Seal { ops: 1 }, "a control message does not wait");
        assert!(q.window().acked(1));
        assert_eq!(q.seal_step(20, false), SealStep::Seal { ops: 1 }, "the ack frees the window");
        let r = q.take(1).reserved;
        q.window().sealed(r, 2);
        put(&mut q, &m, &c, b"c", b"3");
        assert_eq!(q.seal_step(100, false), SealStep::WaitUntilUs(2_100));
        assert_eq!(q.seal_step(2_100, false), SealStep::Seal { ops: 1 }, "acks stalled: seal anyway");
    }

    #[test]
    fn an_atomic_batch_is_sealed_alone_and_whole_between_plain_ops() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let mut q = queue(4, 1 << 20, off());
        put(&mut q, &m, &c, b"p1", b"1");
        put(&mut q, &m, &c, b"p2", b"2");
        let batch: Vec<(&[u8], Option<&[u8]>)> = (0..6).map(|_| (&b"k"[..], Some(&b"v"[..]))).collect();
        assert!(!q.fits_one_record(&batch), "six ops against four a record");
        let batch = [(&b"a"[..], Some(&b"1"[..])), (b"b", None), (b"c", Some(b"3"))];
        assert!(q.fits_one_record(&batch));
        let versions = q.write_atomic(&m, &c, &batch, u64::MAX).expect("applied");
        assert!(versions.windows(2).all(|w| w[0] < w[1]));
        put(&mut q, &m, &c, b"p3", b"3");
        // An atomic batch queued: no flush delay; the plain ops before it go first, without it.
        assert_eq!(q.seal_step(0, false), SealStep::Seal { ops: 2 });
        let t = q.take(2);
        assert!(!t.atomic);
        assert_eq!(t.ops.iter().map(|o| o.key.clone()).collect::<Vec<_>>(), [b"p1".to_vec(), b"p2".to_vec()]);
        // Asked for fewer ops, the batch is still taken whole.
        let t = q.take(1);
        assert!(t.atomic);
        assert_eq!(
            t.ops.iter().map(|o| o.key.clone()).collect::<Vec<_>>(),
            [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
        );
        assert_eq!(
            t.ops.iter().map(|o| o.lamport).collect::<Vec<_>>(),
            versions.iter().map(|v| v.lamport).collect::<Vec<_>>()
        );
        let t = q.take_batch_now(0).expect("the plain op after it");
        assert!(!t.atomic && t.ops.len() == 1);
        assert_eq!(m.get(b"b"), None);
        assert_eq!(m.get(b"c").as_deref(), Some(&b"3"[..]));
        // A fenced batch applies and queues nothing.
        let fenced = [(&b"x"[..], Some(&b"1"[..])), (b"y", Some(b"2"))];
        assert!(q.write_atomic(&m, &c, &fenced, c.now() + 2).is_err());
        assert!(q.is_empty() && m.entry(b"x").is_none() && m.entry(b"y").is_none());
    }

    #[test]
    fn a_write_is_admitted_only_with_room_in_the_queue_and_a_fenced_one_queues_nothing() {
        let (m, c) = (Memtable::new(), LamportClock::new(0));
        let policy = SealPolicy { batch_ops_max: 2, batch_bytes_max: 1 << 20, flush_delay_us: 0, seal_interval_us: 0 };
        let mut q = WriterQueue::new(1, 2, policy, Arc::new(Window::new(off())));
        assert!(q.has_room());
        put(&mut q, &m, &c, b"a", b"1");
        put(&mut q, &m, &c, b"b", b"2");
        assert!(!q.has_room());
        assert_eq!(q.admit(0, 10), Admission::WaitForSpace);
        assert_eq!(q.admit(10, 10), Admission::Backpressure);
        let _ = q.take_batch_now(0).expect("two ops");
        assert_eq!(q.admit(0, 10), Admission::Go { opened: false });
        assert!(q.write(&m, &c, b"z", Some(b"1"), 1).is_err());
        assert!(q.is_empty() && m.entry(b"z").is_none());
    }
}
