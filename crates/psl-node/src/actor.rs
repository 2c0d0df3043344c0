//! Writer actors: each owns one writer's [`Author`] (its signing key and chain state) and
//! shares the writer's bounded queue (`psl_scl::engine::queue::WriterQueue`) with `put`. A put
//! is admitted, stamped with the node's Lamport clock, applied to the memtable and queued under
//! the queue's lock, so each queue holds its ops in increasing Lamport order; the actor waits
//! as the queue's seal policy says (a fuller batch, up to `flush_delay`; acks), takes one
//! record's ops, seals them and hands the record to the core thread. The decisions are the
//! engine's; this thread only waits and wakes.

use crate::flow::{FlowOptions, Window};
use crate::msg::CoreMsg;
use crossbeam_channel::{Receiver, Sender};
use parking_lot::{Condvar, Mutex};
use psl_capsule::{Author, Link, RotationCert};
use psl_crypto::{DataKey, SigningKey};
use psl_scl::engine::queue::{SealPolicy, SealStep, Taken, WriterQueue};
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
    /// What the writer has in flight to the capsule servers (flow control); the same window
    /// the queue holds, reachable without its lock.
    pub flow: Arc<Window>,
    /// The writer's queue of client writes and its seal policy (`psl_scl::engine::queue`):
    /// puts on any thread and the actor take turns under this lock.
    pub state: Mutex<WriterQueue>,
    /// Signalled when ops or control arrive.
    pub work: Condvar,
    /// Signalled when space frees up.
    pub space: Condvar,
    pub ctl_waiting: AtomicBool,
}

impl ActorQueue {
    pub fn new(writer: u32, cap: usize, policy: SealPolicy, flow: FlowOptions) -> ActorQueue {
        let flow = Arc::new(Window::new(flow));
        ActorQueue {
            writer,
            state: Mutex::new(WriterQueue::new(writer, cap, policy, flow.clone())),
            flow,
            work: Condvar::new(),
            space: Condvar::new(),
            ctl_waiting: AtomicBool::new(false),
        }
    }

    /// Wakes the actor for a control message already sent on its channel.
    pub fn poke(&self) {
        self.ctl_waiting.store(true, Ordering::Release);
        let _g = self.state.lock();
        self.work.notify_one();
    }
}

/// The actor's clock for the seal policy: µs on the node's monotonic clock (`mono_ms`'s base).
fn mono_us(at: Instant) -> u64 {
    at.saturating_duration_since(crate::mono::mono_base()).as_micros() as u64
}

/// The instant of a time `mono_us` gave (`t_us` in the future of `now`).
fn instant_of(now: Instant, now_us: u64, t_us: u64) -> Instant {
    now + Duration::from_micros(t_us.saturating_sub(now_us))
}

/// How long an idle writer waits for an op before it looks at its control channel again.
/// Only a backstop: every control message pokes the queue's condvar ([`ActorQueue::poke`]),
/// and every put notifies it, so nothing waits for this to run out.
const IDLE_WAIT: Duration = Duration::from_millis(1_000);

pub(crate) struct Actor {
    pub queue: Arc<ActorQueue>,
    pub author: Author,
    pub ctl: Receiver<ActorCtl>,
    pub core: Sender<CoreMsg>,
    pub clock: Arc<psl_scl::LamportClock>,
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
            if let Some(taken) = self.take_batch() {
                self.seal(taken);
            }
        }
    }

    /// Waits as the queue's seal policy says (`WriterQueue::seal_step`: for a first op, a
    /// fuller batch or acks), then takes one record's ops; `None` to serve control messages
    /// first (one is waiting, or no op came within [`IDLE_WAIT`]). The ops taken are counted in flight
    /// (flow control) before the queue's lock is released.
    fn take_batch(&mut self) -> Option<Taken> {
        let q = &self.queue;
        let mut st = q.state.lock();
        let mut idle_waited = false;
        let taken = loop {
            let urgent = q.ctl_waiting.load(Ordering::Acquire);
            let now = Instant::now();
            let now_us = mono_us(now);
            match st.seal_step(now_us, urgent) {
                SealStep::Idle if urgent || idle_waited => return None,
                SealStep::Idle => {
                    idle_waited = true;
                    q.work.wait_for(&mut st, IDLE_WAIT);
                }
                SealStep::WaitUntilUs(t) => {
                    q.work.wait_until(&mut st, instant_of(now, now_us, t));
                }
                SealStep::Seal { ops } => break st.take(ops),
            }
        };
        drop(st);
        q.space.notify_all();
        Some(taken)
    }

    /// Seals every queued op, then returns a Lamport time ticked after all of them: the queue is
    /// taken empty and the clock ticked under the queue's lock, which every put stamps and
    /// queues under, so no op stamped before the returned time is left to be sealed after an
    /// EOE that carries it (the chain would go back in time: test `node_chain_lamport`).
    fn drain_all_then_tick(&mut self) -> u64 {
        let (batches, at) = {
            let mut st = self.queue.state.lock();
            let mut batches = Vec::new();
            let now_us = mono_us(Instant::now());
            while let Some(b) = st.take_batch_now(now_us) {
                batches.push(b);
            }
            (batches, self.clock.tick())
        };
        self.queue.space.notify_all();
        for taken in batches {
            self.seal(taken);
        }
        at
    }

    fn drain_all(&mut self) {
        loop {
            let next = self.queue.state.lock().take_batch_now(mono_us(Instant::now()));
            self.queue.space.notify_all();
            match next {
                Some(taken) => self.seal(taken),
                None => return,
            }
        }
    }

    fn seal(&mut self, taken: Taken) {
        let n = taken.ops.len();
        match psl_scl::engine::writer::seal_batch(&mut self.author, &self.queue.flow, taken) {
            Ok(rec) => self.send(CoreMsg::Local { rec, body: None, ops: n }),
            // Ops were checked against the limits at `put`; failing here is a bug, and the ops
            // stay applied locally only. Say so loudly.
            Err(e) => tracing::error!(writer = self.queue.writer, ops = n, "cannot seal a batch: {e}"),
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
    fn a_wait_the_policy_names_ends_at_that_time() {
        let now = Instant::now();
        let now_us = mono_us(now);
        assert_eq!(instant_of(now, now_us, now_us + 1_500), now + Duration::from_micros(1_500));
        assert_eq!(instant_of(now, now_us, now_us.saturating_sub(5)), now, "a time passed is now");
    }
}
