//! Writer actors: each owns one writer's [`Author`] (its signing key and chain state) and a
//! bounded op queue. `put` stamps an op with the node's Lamport clock and applies it to the
//! memtable under the queue's lock, so each queue holds its ops in increasing Lamport order;
//! the actor takes up to `batch_ops_max` of them (waiting up to `flush_delay` for a batch to
//! fill), seals one record and hands it to the core thread.

use crate::flow::Reserved;
use crate::msg::CoreMsg;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use psl_capsule::{Author, Link, Op, RotationCert};
use psl_crypto::{DataKey, SigningKey};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Control messages for a writer actor, served before ops.
pub(crate) enum ActorCtl {
    EnterEpoch(Link, u64),
    WriteEoe {
        epoch: u64,
        heads: Vec<Link>,
    },
    /// Seal everything queued, then answer with the writer's next seq.
    Flush(Sender<u64>),
    /// An application key rotation: the writer's key and the data key of the next generation,
    /// used from the certificate's epoch on (`Author::schedule_rotation`). Answers with the
    /// outcome.
    Rotate {
        cert: Box<RotationCert>,
        key: SigningKey,
        data_key: DataKey,
        reply: Sender<Result<(), String>>,
    },
    Stop,
}

pub(crate) struct ActorQueue {
    pub writer: u32,
    /// What the writer has in flight to the capsule servers (flow control).
    pub flow: Arc<crate::flow::Window>,
    pub ops: Mutex<VecDeque<Op>>,
    /// Signalled when ops or control arrive.
    pub work: Condvar,
    /// Signalled when space frees up.
    pub space: Condvar,
    pub cap: usize,
    /// Ops in one full batch: `put` wakes the actor at the first op (to start its flush
    /// timer) and whenever a full batch is waiting, not in between.
    pub batch_ops: usize,
    pub ctl_waiting: AtomicBool,
}

impl ActorQueue {
    pub fn new(writer: u32, cap: usize, batch_ops: usize, flow: crate::flow::FlowOptions) -> ActorQueue {
        ActorQueue {
            writer,
            flow: Arc::new(crate::flow::Window::new(flow)),
            ops: Mutex::new(VecDeque::new()),
            work: Condvar::new(),
            space: Condvar::new(),
            cap,
            batch_ops: batch_ops.max(1),
            ctl_waiting: AtomicBool::new(false),
        }
    }

    /// Wakes the actor for a control message already sent on its channel.
    pub fn poke(&self) {
        self.ctl_waiting.store(true, Ordering::Release);
        let _g = self.ops.lock();
        self.work.notify_one();
    }
}

pub(crate) struct Actor {
    pub queue: Arc<ActorQueue>,
    pub author: Author,
    pub ctl: Receiver<ActorCtl>,
    pub core: Sender<CoreMsg>,
    pub batch_ops_max: usize,
    /// Most body bytes in one record (the capsule's record limit less header room), so that a
    /// batch of large values is split instead of failing to seal.
    pub batch_bytes_max: usize,
    pub flush_delay: Duration,
    pub clock: Arc<psl_scl::LamportClock>,
}

/// How many of the first ops of `ops` fit one record: at most `max_ops`, at most `max_bytes`
/// of encoded ops, and at least one.
fn fitting(ops: &VecDeque<Op>, max_ops: usize, max_bytes: usize) -> usize {
    let mut bytes = 0;
    let mut n = 0;
    for op in ops.iter().take(max_ops) {
        bytes += op.encoded_len();
        if n > 0 && bytes > max_bytes {
            break;
        }
        n += 1;
    }
    n
}

impl Actor {
    pub fn run(mut self) {
        // In a certified capsule, a fresh writer's first record is its own certificate.
        match psl_scl::engine::writer::introduction(&mut self.author, &self.clock) {
            Some(Ok((rec, body))) => self.send(CoreMsg::Local { rec, body: Some(body), ops: 0 }),
            Some(Err(e)) => tracing::error!(writer = self.queue.writer, "cannot seal the Cert record: {e}"),
            None => {}
        }
        loop {
            self.queue.ctl_waiting.store(false, Ordering::Release);
            while let Ok(c) = self.ctl.try_recv() {
                match c {
                    ActorCtl::EnterEpoch(link, epoch) => self.author.enter_epoch(link, epoch),
                    ActorCtl::WriteEoe { epoch, heads } => {
                        let at = self.drain_all_then_tick();
                        match psl_scl::engine::writer::end_of_epoch(&mut self.author, &self.clock, at, epoch, heads) {
                            Ok((rec, body)) => self.send(CoreMsg::Local { rec, body: Some(body), ops: 0 }),
                            Err(e) => tracing::error!(writer = self.queue.writer, "cannot seal EOE: {e}"),
                        }
                    }
                    ActorCtl::Rotate { cert, key, data_key, reply } => {
                        let r = self
                            .author
                            .schedule_rotation(&cert, key, data_key)
                            .map_err(|e| format!("writer {}: key generation {}: {e}", self.queue.writer, cert.key_gen));
                        let _ = reply.send(r);
                    }
                    ActorCtl::Flush(reply) => {
                        self.drain_all();
                        let _ = reply.send(self.author.next_seq());
                    }
                    ActorCtl::Stop => return,
                }
            }
            let (batch, r) = self.take_batch();
            if !batch.is_empty() {
                self.seal(batch, r);
            }
        }
    }

    /// Waits for ops, then for a full batch or `flush_delay`, whichever first. The ops taken
    /// are counted in flight (flow control) before the queue's lock is released.
    fn take_batch(&mut self) -> (Vec<Op>, Reserved) {
        let q = &self.queue;
        let none = (Vec::new(), q.flow.reserve(0));
        let mut ops = q.ops.lock();
        if ops.is_empty() {
            if q.ctl_waiting.load(Ordering::Acquire) {
                return none;
            }
            q.work.wait_for(&mut ops, Duration::from_millis(20));
            if ops.is_empty() {
                return none;
            }
        }
        if ops.len() < self.batch_ops_max {
            let deadline = Instant::now() + self.flush_delay;
            while ops.len() < self.batch_ops_max && !q.ctl_waiting.load(Ordering::Acquire) {
                if q.work.wait_until(&mut ops, deadline).timed_out() {
                    break;
                }
            }
        }
        // Flow control in messages: with `window_records` records in flight, wait (up to a
        // stall) for acks; the batch grows meanwhile.
        if q.flow.records_full() {
            let deadline = Instant::now() + q.flow.stall;
            while q.flow.records_full() && !q.ctl_waiting.load(Ordering::Acquire) {
                if q.work.wait_until(&mut ops, deadline).timed_out() {
                    break;
                }
            }
        }
        let n = fitting(&ops, self.batch_ops_max, self.batch_bytes_max);
        let batch: Vec<Op> = ops.drain(..n).collect();
        let r = q.flow.reserve(n);
        drop(ops);
        q.space.notify_all();
        (batch, r)
    }

    /// Seals every queued op, then returns a Lamport time ticked after all of them: the queue is
    /// taken empty and the clock ticked under the queue's lock, which every put stamps and
    /// queues under, so no op stamped before the returned time is left to be sealed after an
    /// EOE that carries it (the chain would go back in time: test `node_chain_lamport`).
    fn drain_all_then_tick(&mut self) -> u64 {
        let (batches, at) = {
            let mut ops = self.queue.ops.lock();
            let mut batches = Vec::new();
            loop {
                let n = fitting(&ops, self.batch_ops_max, self.batch_bytes_max);
                if n == 0 {
                    break;
                }
                let batch: Vec<Op> = ops.drain(..n).collect();
                batches.push((batch, self.queue.flow.reserve(n)));
            }
            (batches, self.clock.tick())
        };
        self.queue.space.notify_all();
        for (batch, r) in batches {
            self.seal(batch, r);
        }
        at
    }

    fn drain_all(&mut self) {
        loop {
            let (batch, r): (Vec<Op>, Reserved) = {
                let mut ops = self.queue.ops.lock();
                let n = fitting(&ops, self.batch_ops_max, self.batch_bytes_max);
                (ops.drain(..n).collect(), self.queue.flow.reserve(n))
            };
            self.queue.space.notify_all();
            if batch.is_empty() {
                return;
            }
            self.seal(batch, r);
        }
    }

    fn seal(&mut self, batch: Vec<Op>, r: Reserved) {
        let n = batch.len();
        match self.author.write_stamped(batch) {
            Ok(rec) => {
                // Tracked before the core can publish it, so its ack cannot come first.
                self.queue.flow.sealed(r, self.author.next_seq());
                self.send(CoreMsg::Local { rec, body: None, ops: n })
            }
            // Ops were checked against the limits at `put`; failing here is a bug, and the ops
            // stay applied locally only. Say so loudly.
            Err(e) => {
                self.queue.flow.unseal(r);
                tracing::error!(writer = self.queue.writer, ops = n, "cannot seal a batch: {e}")
            }
        }
    }

    fn send(&self, m: CoreMsg) {
        // Blocks while the core is busy: backpressure from the core to the writers.
        let _ = self.core.send(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_wakes_the_actor_to_start_a_batch_and_when_one_is_full() {
        let off = crate::flow::FlowOptions { window_ops: 0, ..Default::default() };
        let q = ActorQueue::new(1, 4096, 512, off);
        let wakes: Vec<usize> = (1..=1536).filter(|&n| psl_scl::engine::write::wakes_writer(n, q.batch_ops)).collect();
        assert_eq!(wakes, vec![1, 512, 1024, 1536]);
        // A batch of one op: every put is a full batch.
        let one = ActorQueue::new(1, 16, 0, off);
        assert!((1..=16).all(|n| psl_scl::engine::write::wakes_writer(n, one.batch_ops)));
    }
}
