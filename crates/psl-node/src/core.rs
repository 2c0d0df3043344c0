//! The core thread: owns the [`NodeCore`] and the coordinator's writer, and is the only
//! producer of the outbound ring.
//!
//! It listens to the writer actors (own records), the verify actors (results), the API (sync
//! barriers) and, only while the verify queue has room, the dispatcher (incoming records):
//! so it never blocks on a full verify queue while the verifiers block on it.

use crate::actor::{ActorCtl, ActorQueue};
use crate::ring::CoreRing;
use crossbeam_channel::{Receiver, Select, Sender};
use psl_capsule::{Author, Body, ControlCode, Opened, Record, Verified};
use psl_scl::{DurableStatus, DurableTicket, Metrics, Msg, NodeCore, Output, RejectReason, SyncTicket};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) enum CoreMsg {
    /// An own record from a writer actor (`body` for non-data records).
    Local {
        rec: Record,
        body: Option<Body>,
        ops: usize,
    },
    /// A decoded record from the network, not yet verified.
    Incoming(Record),
    /// A non-record message from the network.
    Message(Msg),
    Verified(Box<Verified<Opened>>),
    Rejected(RejectReason),
    /// A `sync()` barrier; abandoned at `deadline` (the caller has given up by then).
    Sync {
        next_seqs: BTreeMap<u32, u64>,
        reply: Sender<()>,
        deadline: Instant,
    },
    /// A `sync_durable()` barrier: answered `Ok` once a quorum of servers acked every own
    /// record below `next_seqs`, or `Err(status)` at `deadline`.
    SyncDurable {
        next_seqs: BTreeMap<u32, u64>,
        reply: Sender<Result<(), DurableStatus>>,
        deadline: Instant,
    },
    /// A RESET: forget all replicated state.
    Reset(Sender<()>),
    /// Bytes to multicast as they are (CapsuleDB requests, answers and frontiers).
    Publish(Vec<u8>),
    /// An own record sealed outside the writer actors (CapsuleDB's blocks and indexes).
    Own(Record),
    Stop,
}

/// A `sync_durable()` caller: its barrier, where to answer, and when it gives up.
type DurableWaiter = (DurableTicket, Sender<Result<(), DurableStatus>>, Instant);

pub(crate) struct Core {
    pub core: NodeCore,
    pub coordinator: Option<Author>,
    pub actors: Vec<(Arc<ActorQueue>, Sender<ActorCtl>)>,
    pub local_rx: Receiver<CoreMsg>,
    pub results_rx: Receiver<CoreMsg>,
    pub api_rx: Receiver<CoreMsg>,
    pub incoming_rx: Receiver<CoreMsg>,
    pub verify_tx: Sender<Record>,
    pub ring: CoreRing,
    pub metrics: Arc<Metrics>,
    pub tick: Duration,
    pub start: Instant,
}

impl Core {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub fn run(mut self) {
        let mut waiting: Vec<(SyncTicket, Sender<()>, Instant)> = Vec::new();
        let mut durable: Vec<DurableWaiter> = Vec::new();
        let mut next_tick = Instant::now() + self.tick;
        loop {
            let timeout = next_tick.saturating_duration_since(Instant::now());
            let room = !self.verify_tx.is_full();
            let msg = {
                let mut sel = Select::new();
                let i_local = sel.recv(&self.local_rx);
                let i_res = sel.recv(&self.results_rx);
                let i_api = sel.recv(&self.api_rx);
                let i_in = if room { Some(sel.recv(&self.incoming_rx)) } else { None };
                match sel.select_timeout(timeout) {
                    Ok(op) => {
                        let i = op.index();
                        let rx = if i == i_local {
                            &self.local_rx
                        } else if i == i_res {
                            &self.results_rx
                        } else if i == i_api {
                            &self.api_rx
                        } else {
                            debug_assert_eq!(Some(i), i_in);
                            &self.incoming_rx
                        };
                        op.recv(rx).ok()
                    }
                    Err(_) => None,
                }
            };
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.tick;
                let now = self.now();
                let out = self.core.on_tick(now);
                self.outputs(out);
            }
            // Durability barriers complete on acks (messages) and time out on their own clock.
            if !durable.is_empty() {
                let now_i = Instant::now();
                durable.retain(|(t, reply, deadline)| {
                    let st = self.core.durable_status(t);
                    if st.done() {
                        let _ = reply.send(Ok(()));
                    } else if now_i >= *deadline {
                        let _ = reply.send(Err(st));
                    } else {
                        return true;
                    }
                    self.core.end_durable(t);
                    false
                });
            }
            let Some(msg) = msg else { continue };
            let now = self.now();
            match msg {
                CoreMsg::Local { rec, body, ops } => {
                    let out = match body {
                        None => self.core.on_local_data(rec, ops, now),
                        Some(b) => self.core.on_local_record(rec, &b, now),
                    };
                    self.outputs(out);
                }
                CoreMsg::Incoming(rec) => {
                    if !self.core.precheck(&rec) {
                        // Room was checked before receiving, and the core is the only sender.
                        if self.verify_tx.try_send(rec).is_err() {
                            self.core.on_rejected(RejectReason::Overload);
                        }
                    }
                }
                CoreMsg::Message(m) => self.core.on_message(m),
                CoreMsg::Verified(v) => {
                    let out = self.core.on_verified(*v, now);
                    self.outputs(out);
                }
                CoreMsg::Rejected(r) => self.core.on_rejected(r),
                CoreMsg::Sync { next_seqs, reply, deadline } => {
                    let t = self.core.begin_sync(next_seqs);
                    waiting.push((t, reply, deadline));
                }
                CoreMsg::SyncDurable { next_seqs, reply, deadline } => {
                    let t = self.core.begin_durable(next_seqs);
                    durable.push((t, reply, deadline));
                }
                CoreMsg::Reset(reply) => {
                    self.core.reset(now);
                    let _ = reply.send(());
                }
                CoreMsg::Publish(bytes) => self.ring.push(bytes, &self.metrics),
                CoreMsg::Own(rec) => {
                    let out = self.core.on_own_record(&rec, now);
                    self.outputs(out);
                }
                CoreMsg::Stop => return,
            }
            // Barriers complete when SYNCs apply; answer the callers whose barrier is done, and
            // forget those whose caller gave up.
            let now_i = Instant::now();
            waiting.retain(|(t, reply, deadline)| {
                if self.core.sync_done(t) {
                    let _ = reply.send(());
                    false
                } else if now_i >= *deadline {
                    self.core.cancel_sync(t);
                    false
                } else {
                    true
                }
            });
        }
    }

    fn outputs(&mut self, out: Vec<Output>) {
        let mut work: std::collections::VecDeque<Output> = out.into();
        while let Some(o) = work.pop_front() {
            match o {
                Output::Publish(bytes) => self.ring.push(bytes, &self.metrics),
                Output::EnterEpoch { sync, epoch } => {
                    for (q, tx) in &self.actors {
                        if tx.send(ActorCtl::EnterEpoch(sync, epoch)).is_ok() {
                            q.poke();
                        }
                    }
                    if let Some(c) = &mut self.coordinator {
                        c.enter_epoch(sync, epoch);
                    }
                }
                Output::WriteEoe { epoch, heads } => {
                    for (i, (q, tx)) in self.actors.iter().enumerate() {
                        let heads = if i == 0 { heads.clone() } else { Vec::new() };
                        if tx.send(ActorCtl::WriteEoe { epoch, heads }).is_ok() {
                            q.poke();
                        }
                    }
                }
                Output::WriteRts { epoch } => {
                    if let Some(c) = &mut self.coordinator {
                        let body =
                            Body::Control { code: ControlCode::Rts, payload: psl_scl::node::epoch_payload(epoch) };
                        c.observe(self.core.clock().tick());
                        match c.write_body(body.clone()) {
                            Ok(rec) => {
                                self.core.clock().observe(rec.header().lamport);
                                let now = self.start.elapsed().as_millis() as u64;
                                work.extend(self.core.on_local_record(rec, &body, now));
                            }
                            Err(e) => tracing::error!("cannot seal RTS: {e}"),
                        }
                    }
                }
                Output::WriteSync { epoch, heads } => {
                    if let Some(c) = &mut self.coordinator {
                        if epoch <= c.epoch() {
                            continue;
                        }
                        c.observe(self.core.clock().tick());
                        match c.write_sync_epoch(epoch, heads) {
                            Ok(rec) => {
                                self.core.clock().observe(rec.header().lamport);
                                let body = Body::Sync { app_key_fp: Default::default() };
                                let now = self.start.elapsed().as_millis() as u64;
                                work.extend(self.core.on_local_record(rec, &body, now));
                            }
                            Err(e) => tracing::error!("cannot seal SYNC: {e}"),
                        }
                    }
                }
                Output::Resume(head) => {
                    if let Some(c) = self.coordinator.as_mut().filter(|c| c.writer() == head.writer) {
                        c.resume(&head);
                    }
                }
                Output::Withholding { .. } | Output::Equivocation { .. } => {}
            }
        }
    }
}
