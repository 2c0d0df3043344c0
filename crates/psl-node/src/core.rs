//! The core thread: the runtime around the [`NodeEngine`]. It owns the engine and is the only
//! producer of the outbound ring; it carries the engine's commands to the writer actors, the
//! verify actors and the fabric.
//!
//! It listens to the writer actors (own records), the verify actors (results), the API (sync
//! barriers) and, only while the verify queue has room, the dispatcher (incoming records):
//! so it never blocks on a full verify queue while the verifiers block on it.

use crate::actor::{ActorCtl, ActorQueue};
pub(crate) use crate::msg::{CoreMsg, RotationState};
use crate::ring::CoreRing;
use crossbeam_channel::{Receiver, Select, Sender, TrySendError};
use psl_capsule::Record;
use psl_scl::{Command, DurableStatus, Metrics, NodeEngine, QuorumDurable};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where to answer the callers waiting on barriers, by the engine's ticket (the engine decides
/// when: `Command::SyncAnswer`, `Command::DurableAnswer`).
#[derive(Default)]
pub(crate) struct Replies {
    sync: HashMap<u64, Sender<()>>,
    durable: HashMap<u64, Sender<Result<QuorumDurable, DurableStatus>>>,
}

/// The longest a quiet core sleeps between ticks when nothing comes (any message wakes it).
const QUIET_TICK_MAX: Duration = Duration::from_millis(500);

pub(crate) struct Core {
    pub engine: NodeEngine,
    pub actors: Vec<(Arc<ActorQueue>, Sender<ActorCtl>)>,
    pub local_rx: Receiver<CoreMsg>,
    pub results_rx: Receiver<CoreMsg>,
    pub api_rx: Receiver<CoreMsg>,
    pub incoming_rx: Receiver<CoreMsg>,
    /// The verify actors' queue; `None`: the engine verifies each record itself, which on a
    /// node sharing a few cores saves two thread hand-offs per record.
    pub verify_tx: Option<Sender<Record>>,
    pub ring: CoreRing,
    pub metrics: Arc<Metrics>,
    pub tick: Duration,
    pub start: Instant,
    /// The CapsuleDB role's node: the newest applied record of every writer, refreshed every
    /// tick, read without asking the core ([`crate::Node::applied_heads`]: the role's apply
    /// thread must never wait for a core that may be waiting for it on a full journal).
    pub applied: Option<Arc<parking_lot::Mutex<Vec<psl_capsule::Link>>>>,
    /// The callers waiting on barriers.
    pub replies: Replies,
}

impl Core {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// `at` on the engine's clock (ms since the core started).
    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_millis() as u64
    }

    pub fn run(mut self) {
        for (q, _) in &self.actors {
            self.engine.pace_writer(q.writer, q.flow.clone());
        }
        let mut next_tick = Instant::now() + self.tick;
        loop {
            let msg = self.receive(next_tick.saturating_duration_since(Instant::now()));
            if msg.is_some() {
                // An event: back to the regular pace (it may have left work for the ticks).
                next_tick = next_tick.min(Instant::now() + self.tick);
            }
            if Instant::now() >= next_tick {
                self.tick();
                next_tick = self.next_tick();
            }
            // Barriers complete on acks and SYNCs (messages) and time out on their own clock.
            let now = self.now();
            self.engine.answer_waiters(now);
            self.commands(now);
            let Some(msg) = msg else { continue };
            match msg {
                CoreMsg::Sync { next_seqs, reply, deadline } => {
                    let t = self.engine.begin_sync(next_seqs, self.ms(deadline));
                    self.replies.sync.insert(t, reply);
                }
                CoreMsg::SyncDurable { next_seqs, reply, deadline } => {
                    let t = self.engine.begin_durable(next_seqs, self.ms(deadline));
                    self.replies.durable.insert(t, reply);
                }
                CoreMsg::Stop => return,
                msg => self.handle(msg, now),
            }
            self.engine.answer_waiters(now);
            self.commands(now);
        }
    }

    /// The next message from the writer actors, the verify actors, the API or (only while the
    /// verify queue has room) the dispatcher; `None` after `timeout`.
    fn receive(&self, timeout: Duration) -> Option<CoreMsg> {
        let room = self.verify_tx.as_ref().is_none_or(|tx| !tx.is_full());
        let mut sel = Select::new();
        let i_local = sel.recv(&self.local_rx);
        // Without verify actors nothing sends results, and a receiver with no senders left
        // would always be ready.
        let i_res = if self.verify_tx.is_some() { Some(sel.recv(&self.results_rx)) } else { None };
        let i_api = sel.recv(&self.api_rx);
        let i_in = if room { Some(sel.recv(&self.incoming_rx)) } else { None };
        let op = sel.select_timeout(timeout).ok()?;
        let i = op.index();
        let rx = if i == i_local {
            &self.local_rx
        } else if Some(i) == i_res {
            &self.results_rx
        } else if i == i_api {
            &self.api_rx
        } else {
            debug_assert_eq!(Some(i), i_in);
            &self.incoming_rx
        };
        op.recv(rx).ok()
    }

    /// Time passes: the engine's tick, then acks counted into the flow windows (one signature
    /// check per server per tick) and the applied heads for the CapsuleDB role.
    fn tick(&mut self) {
        let now = self.now();
        let backlog = self.incoming_rx.len() + self.verify_tx.as_ref().map_or(0, |t| t.len());
        self.engine.core_mut().set_inbound_backlog(backlog);
        self.engine.on_tick(now);
        self.commands(now);
        if let Some(a) = &self.applied {
            *a.lock() = self.engine.core().orderer().heads().into_values().collect();
        }
    }

    /// When to tick next after a tick: at the regular pace, or, when the engine is quiet, at
    /// its next timed duty (at most [`QUIET_TICK_MAX`] away). Any event wakes the core before.
    fn next_tick(&self) -> Instant {
        let now = Instant::now();
        let wait = match self.engine.quiet_until() {
            None => self.tick,
            Some(at) => Duration::from_millis(at.saturating_sub(self.ms(now))).clamp(self.tick, QUIET_TICK_MAX),
        };
        now + wait
    }

    /// One message for the engine (barriers and `Stop` are the loop's).
    fn handle(&mut self, msg: CoreMsg, now: u64) {
        match msg {
            CoreMsg::Local { rec, body, ops } => self.engine.on_local(rec, body.as_ref(), ops, now),
            CoreMsg::Incoming(rec) => self.engine.on_record(rec, now),
            CoreMsg::Message(m) => self.engine.on_message(m, now),
            CoreMsg::Verified(v) => self.engine.on_verified(*v, now),
            CoreMsg::Rejected(r) => self.engine.on_rejected(r),
            CoreMsg::Reset(reply) => {
                self.engine.core_mut().reset(now);
                let _ = reply.send(());
            }
            CoreMsg::Publish(bytes) => self.ring.push(bytes, &self.metrics),
            CoreMsg::Own(rec) => self.engine.on_own(&rec, now),
            CoreMsg::Rotate(r, reply) => {
                let res = self.engine.rotate(*r, now);
                self.commands(now);
                let _ = reply.send(res);
            }
            CoreMsg::RotationState(reply) => {
                let _ = reply.send(self.engine.rotation_state());
            }
            CoreMsg::NextSeq(w, reply) => {
                let _ = reply.send(self.engine.core().orderer().next_seq(w));
            }
            CoreMsg::Statement(st, reply) => {
                let r = self.engine.statements(st, now);
                self.commands(now);
                let _ = reply.send(r);
            }
            CoreMsg::Sync { .. } | CoreMsg::SyncDurable { .. } | CoreMsg::Stop => {
                debug_assert!(false, "the run loop handles barriers and Stop")
            }
        }
    }

    /// Carries out what the engine asked for.
    pub fn commands(&mut self, now: u64) {
        while let Some(c) = self.engine.next_command() {
            match c {
                Command::Publish(bytes) => self.ring.push(bytes, &self.metrics),
                // The verify actors, or here when there are none or their queue is full (room
                // was checked before receiving from the fabric: only records released from the
                // hold-back can find it full).
                Command::Verify(rec) => match &self.verify_tx {
                    Some(tx) => match tx.try_send(rec) {
                        Ok(()) => {}
                        Err(TrySendError::Full(rec)) => self.engine.verify_now(rec, now),
                        Err(TrySendError::Disconnected(_)) => self.engine.on_rejected(psl_scl::RejectReason::Overload),
                    },
                    None => self.engine.verify_now(rec, now),
                },
                Command::EnterEpoch { sync, epoch } => {
                    for (q, tx) in &self.actors {
                        if tx.send(ActorCtl::EnterEpoch(sync, epoch)).is_ok() {
                            q.poke();
                        }
                    }
                }
                Command::WriteEoe { epoch, heads } => {
                    for (i, (q, tx)) in self.actors.iter().enumerate() {
                        let heads = if i == 0 { heads.clone() } else { Vec::new() };
                        if tx.send(ActorCtl::WriteEoe { epoch, heads }).is_ok() {
                            q.poke();
                        }
                    }
                }
                Command::Signed { .. } => {}
                Command::Report(o) => tracing::debug!("protocol fault: {o:?}"),
                Command::SyncAnswer { ticket, done } => {
                    // Not done: the reply is dropped, and the caller's wait fails at its deadline.
                    if let (Some(reply), true) = (self.replies.sync.remove(&ticket), done) {
                        let _ = reply.send(());
                    }
                }
                Command::DurableAnswer { ticket, result } => {
                    if let Some(reply) = self.replies.durable.remove(&ticket) {
                        let _ = reply.send(result);
                    }
                }
                Command::WakeWriter { writer } => {
                    if let Some((q, _)) = self.actors.iter().find(|(q, _)| q.writer == writer) {
                        let _g = q.state.lock();
                        q.space.notify_all();
                        // The actor may wait for records in flight to be acked.
                        q.work.notify_all();
                    }
                }
            }
        }
    }
}
