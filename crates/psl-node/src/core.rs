//! The core thread: owns the [`NodeCore`] and the coordinator's writer, and is the only
//! producer of the outbound ring.
//!
//! It listens to the writer actors (own records), the verify actors (results), the API (sync
//! barriers) and, only while the verify queue has room, the dispatcher (incoming records):
//! so it never blocks on a full verify queue while the verifiers block on it.

use crate::actor::{ActorCtl, ActorQueue};
pub(crate) use crate::msg::{CoreMsg, CoreRotation, RotationState};
use crate::ring::CoreRing;
use crossbeam_channel::{Receiver, Select, Sender};
use psl_capsule::{Author, Body, ControlCode, Opened, Record, Verified, Verifier};
use psl_scl::{DurableStatus, DurableTicket, Metrics, Msg, NodeCore, Output, RejectReason, SyncTicket};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Verifies and opens one incoming record: a verify actor's work, or the core's when the node
/// has none. `Ok(None)`: held back until its writer's certificate arrives (a certified capsule;
/// see `Verifier::hold`), stamped with `now_ms` on the core's clock.
pub(crate) fn verify(v: &Verifier, rec: Record, now_ms: u64) -> Result<Option<Box<Verified<Opened>>>, RejectReason> {
    v.verify_open_or_hold(rec, now_ms).map(|o| o.map(Box::new)).map_err(|rej| {
        tracing::debug!("rejected: {rej}");
        RejectReason::from_verifier(&rej.reason)
    })
}

/// A `sync_durable()` caller: its barrier, where to answer, and when it gives up.
type DurableWaiter = (DurableTicket, Sender<Result<(), DurableStatus>>, Instant);

pub(crate) struct Core {
    pub core: NodeCore,
    pub verifier: Arc<Verifier>,
    pub coordinator: Option<Author>,
    /// The coordinator's own-chain log: each record it signs is appended (fsync'd) before it
    /// is published.
    pub chain_log: Option<crate::chainlog::ChainLog>,
    /// The generation the coordinator writer has been given keys for (it switches to them only
    /// at the rotation epoch; `Author::key_gen` is the one it signs with now).
    pub coordinator_next_gen: u32,
    pub actors: Vec<(Arc<ActorQueue>, Sender<ActorCtl>)>,
    pub local_rx: Receiver<CoreMsg>,
    pub results_rx: Receiver<CoreMsg>,
    pub api_rx: Receiver<CoreMsg>,
    pub incoming_rx: Receiver<CoreMsg>,
    /// The verify actors' queue; `None`: the core verifies each record itself, which on a
    /// node sharing a few cores saves two thread hand-offs per record.
    pub verify_tx: Option<Sender<Record>>,
    pub ring: CoreRing,
    pub metrics: Arc<Metrics>,
    pub tick: Duration,
    pub start: Instant,
    /// Whether the coordinator writer has carried its own certificate into its chain in this
    /// process (a certified capsule): it does so before its first other record.
    pub coordinator_introduced: bool,
    /// The CapsuleDB role's node: the newest applied record of every writer, refreshed every
    /// tick, read without asking the core ([`crate::Node::applied_heads`]: the role's apply
    /// thread must never wait for a core that may be waiting for it on a full journal).
    pub applied: Option<Arc<parking_lot::Mutex<Vec<psl_capsule::Link>>>>,
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
            let room = self.verify_tx.as_ref().is_none_or(|tx| !tx.is_full());
            let msg = {
                let mut sel = Select::new();
                let i_local = sel.recv(&self.local_rx);
                // Without verify actors nothing sends results, and a receiver with no senders
                // left would always be ready.
                let i_res = if self.verify_tx.is_some() { Some(sel.recv(&self.results_rx)) } else { None };
                let i_api = sel.recv(&self.api_rx);
                let i_in = if room { Some(sel.recv(&self.incoming_rx)) } else { None };
                match sel.select_timeout(timeout) {
                    Ok(op) => {
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
                    Err(_) => None,
                }
            };
            if Instant::now() >= next_tick {
                next_tick = Instant::now() + self.tick;
                let now = self.now();
                let backlog = self.incoming_rx.len() + self.verify_tx.as_ref().map_or(0, |t| t.len());
                self.core.set_inbound_backlog(backlog);
                let out = self.core.on_tick(now);
                self.outputs(out);
                // Acks are counted at the tick (one signature check per server per tick).
                self.flow_acked();
                if let Some(a) = &self.applied {
                    *a.lock() = self.core.orderer().heads().into_values().collect();
                }
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
                CoreMsg::Incoming(rec) => self.incoming(rec, now, false),
                CoreMsg::Message(m) => {
                    let certs = matches!(m, Msg::Certs { .. });
                    self.core.on_message(m);
                    if certs {
                        self.release_held(now);
                    }
                }
                CoreMsg::Verified(v) => self.verified(*v, now),
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
                CoreMsg::Rotate(r, reply) => {
                    let res = self.rotate(*r, now);
                    let _ = reply.send(res);
                }
                CoreMsg::RotationState(reply) => {
                    let _ = reply.send(self.rotation_state());
                }
                CoreMsg::NextSeq(w, reply) => {
                    let _ = reply.send(self.core.orderer().next_seq(w));
                }
                CoreMsg::Statement(st, reply) => {
                    let r = self.statement(st);
                    let _ = reply.send(r);
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

    /// Tells each writer's flow window what a quorum of servers now holds, CapsuleDB has taken
    /// in and the pacing peers have applied ([`NodeCore::flow_next`]), and wakes the `put`s
    /// waiting for room when it moved.
    fn flow_acked(&self) {
        for (q, _) in &self.actors {
            let stall_ms = q.flow.stall.as_millis() as u64;
            // A peer may lag a window's records behind its last hint before it slows the
            // writer; one further behind than 64 windows is catching up by repair and does not
            // pace.
            let slack = q.flow.window_records as u64;
            let peer_lag_max = 64 * slack;
            if q.flow.window_ops > 0 && q.flow.acked(self.core.flow_next(q.writer, stall_ms, slack, peer_lag_max)) {
                let _g = q.ops.lock();
                q.space.notify_all();
                // The actor may wait for records in flight to be acked.
                q.work.notify_all();
            }
        }
    }

    /// A record from the fabric (or released from the hold-back): precheck, then verification
    /// by the verify actors, or here when there are none or (`inline`) their queue is full.
    fn incoming(&mut self, rec: Record, now: u64, inline: bool) {
        if self.core.precheck(&rec) {
            return;
        }
        let rec = match &self.verify_tx {
            Some(tx) => match tx.try_send(rec) {
                Ok(()) => return,
                Err(e) if inline => e.into_inner(),
                // Room was checked before receiving, and the core is the only sender.
                Err(_) => {
                    self.core.on_rejected(RejectReason::Overload);
                    return;
                }
            },
            None => rec,
        };
        match verify(&self.verifier, rec, now) {
            Ok(Some(v)) => self.verified(*v, now),
            Ok(None) => {}
            Err(r) => self.core.on_rejected(r),
        }
    }

    fn verified(&mut self, v: Verified<Opened>, now: u64) {
        let certs = v.record.header().kind == psl_capsule::Kind::Cert;
        let out = self.core.on_verified(v, now);
        self.outputs(out);
        if certs {
            self.release_held(now);
        }
    }

    /// New certificates were installed: records held back for them are verified again.
    fn release_held(&mut self, now: u64) {
        for rec in self.verifier.release_held() {
            self.incoming(rec, now, true);
        }
    }

    /// Before the coordinator's first record in this process, in a certified capsule, a Cert
    /// record with its own certificate: servers and auditors learn its key from the log.
    fn introduce_coordinator(&mut self, work: &mut std::collections::VecDeque<Output>) {
        if self.coordinator_introduced {
            return;
        }
        let Some(c) = &mut self.coordinator else { return };
        self.coordinator_introduced = true;
        let Some(sealed) = c.write_own_cert() else { return };
        match sealed {
            Ok(rec) if !Self::persist(&mut self.chain_log, &rec) => self.coordinator = None,
            Ok(rec) => {
                self.core.clock().observe(rec.header().lamport);
                let body = Body::Certs(c.cert().cloned().map(psl_capsule::KeyStatement::Cert).into_iter().collect());
                let now = self.start.elapsed().as_millis() as u64;
                work.extend(self.core.on_local_record(rec, &body, now));
            }
            Err(e) => tracing::error!("cannot seal the coordinator's Cert record: {e}"),
        }
    }

    /// Installs and announces statements; a coordinator also writes them into its chain (Cert
    /// records of at most 64). Returns the node's epoch.
    fn statement(&mut self, list: Vec<psl_capsule::KeyStatement>) -> Result<u64, String> {
        for st in &list {
            self.core.add_announcement(st.clone()).map_err(|e| format!("statement refused: {e}"))?;
        }
        let mut work = std::collections::VecDeque::new();
        self.introduce_coordinator(&mut work);
        for chunk in list.chunks(psl_capsule::certs::STATEMENTS_PER_RECORD_MAX) {
            let Some(c) = &mut self.coordinator else { break };
            let body = Body::Certs(chunk.to_vec());
            c.observe(self.core.clock().tick());
            match c.write_certs(chunk.to_vec()) {
                Ok(rec) if !Self::persist(&mut self.chain_log, &rec) => self.coordinator = None,
                Ok(rec) => {
                    self.core.clock().observe(rec.header().lamport);
                    let now = self.now();
                    work.extend(self.core.on_local_record(rec, &body, now));
                }
                Err(e) => return Err(format!("cannot seal the Cert record: {e}")),
            }
        }
        self.outputs(work.into());
        Ok(self.core.epoch())
    }

    fn rotation_state(&self) -> RotationState {
        let v = &self.verifier;
        let epoch = self.core.epoch();
        let newest = v.key_gen_newest();
        let from_epoch = match newest {
            0 => 0,
            g => v.rotation_certs().get(g as usize - 1).map(|c| c.from_epoch).unwrap_or(0),
        };
        RotationState {
            epoch,
            key_gen_newest: newest,
            key_gen_in_force: v.key_gen_at(epoch),
            from_epoch,
            coordinator_key_gen: self.coordinator.as_ref().map(|c| c.key_gen().max(self.coordinator_next_gen)),
        }
    }

    /// Installs a rotation (see [`CoreRotation`]): the certificate in the verifier, then the
    /// coordinator's key, whose writer then carries the certificate into the log as a `Rotate`
    /// control record.
    fn rotate(&mut self, r: CoreRotation, now: u64) -> Result<RotationState, String> {
        let cert = r.cert;
        if r.refuse_if_begun && cert.from_epoch <= self.core.epoch() && self.verifier.key_gen_newest() < cert.key_gen {
            return Err(format!(
                "rotation epoch {} has already begun here (epoch {})",
                cert.from_epoch,
                self.core.epoch()
            ));
        }
        self.core.install_rotation(&cert, r.data_key.clone()).map_err(|e| format!("certificate refused: {e}"))?;
        if let Some(key) = r.coordinator {
            // A shadow that never wrote yet introduces itself first (its certificate, under
            // the generation in force), so that its Rotate record is not the first of its
            // chain: a reader meets the certificate before any record it signs.
            let mut work = std::collections::VecDeque::new();
            self.introduce_coordinator(&mut work);
            self.outputs(work.into());
            let c = self.coordinator.as_mut().ok_or("this node runs no coordinator")?;
            if c.key_gen() < cert.key_gen && self.coordinator_next_gen < cert.key_gen {
                let dk = r.data_key.ok_or("the coordinator's rotation needs the new data key")?;
                c.schedule_rotation(&cert, key, dk).map_err(|e| format!("coordinator key: {e}"))?;
                self.coordinator_next_gen = cert.key_gen;
                self.core.set_coordinator_key_gen(cert.key_gen);
                // The certificate in the log, for nodes the leader did not reach and auditors.
                let body = Body::Control { code: ControlCode::Rotate, payload: cert.encode() };
                c.observe(self.core.clock().tick());
                match c.write_control(body.clone(), Vec::new()) {
                    Ok(rec) if !Self::persist(&mut self.chain_log, &rec) => {
                        self.coordinator = None;
                    }
                    Ok(rec) => {
                        self.core.clock().observe(rec.header().lamport);
                        let out = self.core.on_local_record(rec, &body, now);
                        self.outputs(out);
                    }
                    Err(e) => tracing::error!("cannot seal the Rotate record: {e}"),
                }
            }
        }
        Ok(self.rotation_state())
    }

    /// Appends a coordinator record to the own-chain log before it may be published. False if
    /// that failed: the record is dropped unpublished and the caller stops the coordinator
    /// writer (a shadow takes over), since it could no longer tell after a restart which seqs
    /// it had let out.
    fn persist(log: &mut Option<crate::chainlog::ChainLog>, rec: &Record) -> bool {
        let Some(log) = log else { return true };
        match log.append(rec.bytes()) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(
                    writer = rec.header().writer,
                    seq = rec.header().seq,
                    "coordinator stopped: cannot persist its own record before publishing it: {e}"
                );
                false
            }
        }
    }

    /// What the core said while the own-chain log was restored (before the thread started).
    pub fn restored(&mut self, out: Vec<Output>) {
        self.outputs(out);
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
                    self.introduce_coordinator(&mut work);
                    if let Some(c) = &mut self.coordinator {
                        let body =
                            Body::Control { code: ControlCode::Rts, payload: psl_scl::node::epoch_payload(epoch) };
                        c.observe(self.core.clock().tick());
                        match c.write_body(body.clone()) {
                            Ok(rec) if !Self::persist(&mut self.chain_log, &rec) => {
                                self.coordinator = None;
                            }
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
                    if self.coordinator.as_ref().is_some_and(|c| epoch > c.epoch()) {
                        self.introduce_coordinator(&mut work);
                    }
                    if let Some(c) = &mut self.coordinator {
                        if epoch <= c.epoch() {
                            continue;
                        }
                        c.observe(self.core.clock().tick());
                        match c.write_sync_epoch(epoch, heads) {
                            Ok(rec) if !Self::persist(&mut self.chain_log, &rec) => {
                                self.coordinator = None;
                            }
                            Ok(rec) => {
                                self.core.clock().observe(rec.header().lamport);
                                let body = Body::Sync {
                                    app_key_fp: self.verifier.app_key_fp(rec.header().key_gen).unwrap_or_default(),
                                };
                                let now = self.start.elapsed().as_millis() as u64;
                                work.extend(self.core.on_local_record(rec, &body, now));
                            }
                            Err(e) => tracing::error!("cannot seal SYNC: {e}"),
                        }
                    }
                }
                Output::Resume(head) => {
                    // Never back: a writer that already signed past `head` keeps its place.
                    if let Some(c) =
                        self.coordinator.as_mut().filter(|c| c.writer() == head.writer && head.seq >= c.next_seq())
                    {
                        c.resume(&head);
                    }
                }
                Output::Withholding { .. } | Output::Equivocation { .. } => {}
            }
        }
    }
}
