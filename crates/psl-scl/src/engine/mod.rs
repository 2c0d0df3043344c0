//! [`NodeEngine`]: one node's whole protocol behaviour behind one interface, free of I/O.
//!
//! Events go in as method calls (a record or message from the fabric, a verification result,
//! an own record from a data writer, a tick, a statement, a rotation); [`Command`]s come out
//! ([`NodeEngine::next_command`]): publish bytes, verify a record elsewhere, have the data
//! writers enter an epoch or write an EOE. The engine owns the [`NodeCore`] (orderer,
//! coordinator state machine, repair cache, barriers, acks) and the coordinator's writer,
//! which it drives itself: RTS, SYNC, Cert and Rotate records are sealed, logged
//! ([`CoordinatorLog`]) and applied here. The threaded runtime (`psl-node`'s core thread) and
//! the seeded simulator (`psl-sim`) run this same engine; only threads, queues, the fabric and
//! the disk differ.
//!
//! Modules:
//! - [`writer`]: a data writer's own duties (its introduction, its EOE), shared by the
//!   runtime's writer actors and the simulator's inline writers.
//! - [`write`](mod@write): the local write path's rules about time (a write supersedes what its node
//!   shows; what CapsuleDB answers passes the clock first), shared with the runtime's `put`.
//! - [`asks`]: reads that went to CapsuleDB: the requests waiting, CapsuleDB's answer taken in
//!   (an event), and a waiting reader's policy (wait, ask again, give up).
//! - [`queue`]: a data writer's queue, where a client write goes in (admitted, stamped,
//!   queued) and the seal policy takes batches out; the runtime keeps it under a lock that its
//!   callers' threads and the writer's actor share, the simulator inline.
//! - `coordinator_writer`: the coordinator's writer and its own-chain log.
//! - `replies`: the runtime's callers waiting on `sync()` and durable-sync barriers (answered
//!   by command, at completion or deadline) and the own writers' flow windows (paced at every
//!   tick, woken by command).

pub mod asks;
mod coordinator_writer;
pub mod queue;
mod replies;
pub mod write;
pub mod writer;

pub use coordinator_writer::{CoordinatorLog, CoordinatorWriteError};
pub use replies::WAITERS_MAX;

use crate::metrics::RejectReason;
use crate::node::{epoch_payload, NodeCore, Output};
use crate::wire::Msg;
use coordinator_writer::CoordinatorWriter;
use psl_capsule::{
    Author, Body, ControlCode, KeyStatement, Kind, Link, Opened, Record, RotationCert, Verified, Verifier,
};
use psl_crypto::{DataKey, Hash256, SigningKey};
use std::collections::VecDeque;
use std::sync::Arc;

/// Something the runtime must do for the engine.
#[derive(Debug)]
pub enum Command {
    /// Send these bytes on the fabric.
    Publish(Vec<u8>),
    /// Verify this record (it passed the precheck) and hand back the result:
    /// [`NodeEngine::on_verified`] / [`NodeEngine::on_rejected`], or
    /// [`NodeEngine::verify_now`] when the verifiers are busy. Only from an engine built with
    /// `verify_elsewhere`; otherwise it verifies inline.
    Verify(Record),
    /// Every local data writer: the next record links to this SYNC and carries its epoch.
    EnterEpoch {
        /// The SYNC record that closed the previous epoch.
        sync: Link,
        /// The epoch now entered (the SYNC's).
        epoch: u64,
    },
    /// Every local data writer: seal the ops it holds, then write an EOE for `epoch`
    /// ([`writer::end_of_epoch`]); the first writer links `heads`, the others nothing.
    WriteEoe {
        /// The epoch the EOE ends (the RTS's).
        epoch: u64,
        /// The records the first writer's EOE links.
        heads: Vec<Link>,
    },
    /// The coordinator's writer signed (and logged) this record: for observers (the
    /// simulator's checker keeps every honest record).
    Signed {
        /// The coordinator's writer index.
        writer: u32,
        /// The record's sequence number in the coordinator's chain.
        seq: u64,
        /// The record's hash.
        hash: Hash256,
    },
    /// A protocol fault seen: a writer withholding records, or an equivocation.
    Report(Output),
    /// Answer the `sync()` caller of `ticket` ([`NodeEngine::begin_sync`]): its barrier is
    /// done, or (`done` false) its deadline passed and it failed.
    SyncAnswer {
        /// The caller's ticket.
        ticket: u64,
        /// Whether the barrier completed.
        done: bool,
    },
    /// Answer the durable-sync caller of `ticket` ([`NodeEngine::begin_durable`]): the
    /// quorum's proof, or where the barrier stood at its deadline.
    DurableAnswer {
        /// The caller's ticket.
        ticket: u64,
        /// The proof, or the status at the deadline.
        result: Result<crate::QuorumDurable, crate::DurableStatus>,
    },
    /// Own writer `writer`'s flow window moved: wake its waiting writes and its writer.
    WakeWriter {
        /// The writer whose window moved.
        writer: u32,
    },
}

/// A node's view of application key rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationState {
    /// The epoch this node is in.
    pub epoch: u64,
    /// Newest application key generation the node's verifier knows (0: never rotated).
    pub key_gen_newest: u32,
    /// The generation in force at `epoch`.
    pub key_gen_in_force: u32,
    /// The epoch the newest generation takes effect at (0 for generation 0).
    pub from_epoch: u64,
    /// The generation the node's coordinator writer holds keys for (none: no coordinator).
    pub coordinator_key_gen: Option<u32>,
}

/// An application key rotation for the engine.
pub struct Rotation {
    /// The rotation certificate: the new generation and the epoch it takes effect at.
    pub cert: RotationCert,
    /// The application's data key under the new generation, if this node has it (a coordinator
    /// needs it).
    pub data_key: Option<DataKey>,
    /// The coordinator writer's key under the new generation (a node running a coordinator).
    pub coordinator: Option<SigningKey>,
    /// Refuse (install nothing) if the rotation epoch has already begun here: the leader's
    /// coordinator must learn a rotation before its epoch, or some record of that epoch could
    /// already be under the old key.
    pub refuse_if_begun: bool,
}

/// Verifies and opens one record (the precheck passed): the verify pool's work, or the
/// engine's when there is none. `Ok(None)`: held back until its writer's certificate arrives
/// (a certified capsule; see `Verifier::hold`), stamped with `now_ms`.
pub fn verify(v: &Verifier, rec: Record, now_ms: u64) -> Result<Option<Box<Verified<Opened>>>, RejectReason> {
    v.verify_open_or_hold(rec, now_ms).map(|o| o.map(Box::new)).map_err(|rej| {
        tracing::debug!("rejected: {rej}");
        RejectReason::from_verifier(&rej.reason)
    })
}

/// One node's protocol engine: events in, [`Command`]s out (see the module docs). Owns the
/// [`NodeCore`] and, on a coordinator's node, the coordinator's writer.
pub struct NodeEngine {
    core: NodeCore,
    verifier: Arc<Verifier>,
    coordinator: Option<CoordinatorWriter>,
    verify_elsewhere: bool,
    /// What the runtime must do next. Bounded by what one event yields (the core's outputs are
    /// bounded per event and per tick: repair answers, hint requests, one record per coordinator
    /// duty), since every runtime drains it after each event.
    commands: VecDeque<Command>,
    /// The runtime's callers waiting on barriers, and the own writers' flow windows.
    waiters: replies::Waiters,
}

impl std::fmt::Debug for NodeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeEngine")
            .field("core", &self.core)
            .field("coordinator", &self.coordinator.as_ref().map(|c| c.author.writer()))
            .field("commands", &self.commands.len())
            .finish()
    }
}

impl NodeEngine {
    /// An engine around `core`. `coordinator`: the writer of the coordinator `core` runs (if it
    /// runs one) and the log its records go to before publication. `verify_elsewhere`: incoming
    /// records come out as [`Command::Verify`] instead of being verified inline.
    pub fn new(
        core: NodeCore,
        coordinator: Option<(Author, Option<Box<dyn CoordinatorLog>>)>,
        verify_elsewhere: bool,
    ) -> NodeEngine {
        debug_assert_eq!(
            coordinator.is_some(),
            core.coordinator().is_some(),
            "a coordinator writer comes with a coordinator state machine"
        );
        NodeEngine {
            verifier: core.verifier().clone(),
            core,
            coordinator: coordinator.map(|(a, log)| CoordinatorWriter::new(a, log)),
            verify_elsewhere,
            commands: VecDeque::new(),
            waiters: replies::Waiters::default(),
        }
    }

    /// When (ms on the engine's clock) the runtime must tick next if no event comes first, when
    /// nothing is pending: see [`NodeCore::quiet_until`]. `None`: tick at the regular pace.
    pub fn quiet_until(&self) -> Option<u64> {
        if self.anyone_waits() || !self.commands.is_empty() {
            return None;
        }
        self.core.quiet_until()
    }

    /// The next thing the runtime must do.
    pub fn next_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// The core, to read its state.
    pub fn core(&self) -> &NodeCore {
        &self.core
    }

    /// The core, for what the runtime asks of it directly: barriers (`begin_sync`,
    /// `begin_durable`), acks' bookkeeping, flow control, a reset.
    pub fn core_mut(&mut self) -> &mut NodeCore {
        &mut self.core
    }

    /// The capsule's verifier the engine checks records with (shared with the verify pool).
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    /// The coordinator writer's index, while it runs here.
    pub fn coordinator_writer(&self) -> Option<u32> {
        self.coordinator.as_ref().map(|c| c.author.writer())
    }

    // ---- events from the fabric and the verifiers

    /// A decoded record from the fabric (or released from the hold-back).
    pub fn on_record(&mut self, rec: Record, now: u64) {
        if self.core.precheck(&rec) {
            return;
        }
        if self.verify_elsewhere {
            self.commands.push_back(Command::Verify(rec));
        } else {
            self.verify_now(rec, now);
        }
    }

    /// Verifies a record here (no verifiers, or theirs is full).
    pub fn verify_now(&mut self, rec: Record, now: u64) {
        match verify(&self.verifier, rec, now) {
            Ok(Some(v)) => self.on_verified(*v, now),
            Ok(None) => {}
            Err(r) => self.core.on_rejected(r),
        }
    }

    /// A message from the fabric as bytes: a record, or anything else [`Msg`] carries.
    pub fn on_bytes(&mut self, bytes: &[u8], now: u64) {
        match Msg::decode(bytes) {
            Err(_) => self.core.on_rejected(RejectReason::BadMessage),
            Ok(Msg::Record { capsule, .. }) if capsule != self.verifier.name() => {
                self.core.on_rejected(RejectReason::Capsule)
            }
            Ok(Msg::Record { bytes, .. }) => {
                let limits = self.verifier.metadata().meta.policy.limits;
                match Record::decode(&bytes, &limits) {
                    Err(_) => self.core.on_rejected(RejectReason::Encoding),
                    Ok(rec) => self.on_record(rec, now),
                }
            }
            Ok(m) => self.on_message(m, now),
        }
    }

    /// A message other than a record (repairs, heads hints, acks, certificates).
    pub fn on_message(&mut self, msg: Msg, now: u64) {
        let certs = matches!(msg, Msg::Certs { .. });
        self.core.on_message(msg);
        if certs {
            self.release_held(now);
        }
    }

    /// A record verified and opened (by the verify pool or inline): applied by the core; a Cert
    /// record also releases the records held back for certificates.
    pub fn on_verified(&mut self, v: Verified<Opened>, now: u64) {
        let certs = v.record.header().kind == Kind::Cert;
        let out = self.core.on_verified(v, now);
        self.outputs(out, now);
        if certs {
            self.release_held(now);
        }
    }

    /// A record the verify pool refused, counted under `r`.
    pub fn on_rejected(&mut self, r: RejectReason) {
        self.core.on_rejected(r);
    }

    /// New certificates were installed: records held back for them are verified again.
    fn release_held(&mut self, now: u64) {
        for rec in self.verifier.release_held() {
            self.on_record(rec, now);
        }
    }

    // ---- events from this node's writers and roles

    /// An own record from a data writer: `body` for non-data records (its Cert, its EOEs);
    /// `ops` data ops otherwise.
    pub fn on_local(&mut self, rec: Record, body: Option<&Body>, ops: usize, now: u64) {
        let out = match body {
            None => self.core.on_local_data(rec, ops, now),
            Some(b) => self.core.on_local_record(rec, b, now),
        };
        self.outputs(out, now);
    }

    /// An own record sealed outside the writers (CapsuleDB's blocks and indexes).
    pub fn on_own(&mut self, rec: &Record, now: u64) {
        let out = self.core.on_own_record(rec, now);
        self.outputs(out, now);
    }

    /// A record of the coordinator's chain read back from its log at start: applied as if
    /// received. Returns whether it verified here.
    pub fn restore_own(&mut self, rec: Record) -> Result<bool, RejectReason> {
        self.core.clock().observe(rec.header().lamport);
        match verify(&self.verifier, rec, 0)? {
            Some(v) => {
                let out = self.core.on_verified(*v, 0);
                self.outputs(out, 0);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Time passes (`now` in ms): the core's timers (repairs, coordinator epochs, hints,
    /// announcements) run.
    pub fn on_tick(&mut self, now: u64) {
        let out = self.core.on_tick(now);
        self.outputs(out, now);
        self.pace_windows();
    }

    // ---- the leader's requests

    /// Installs and announces statements (a revocation); a coordinator also writes them into
    /// its chain (Cert records of at most 64). Returns the node's epoch.
    pub fn statements(&mut self, list: Vec<KeyStatement>, now: u64) -> Result<u64, String> {
        for st in &list {
            self.core.add_announcement(st.clone()).map_err(|e| format!("statement refused: {e}"))?;
        }
        let mut work = VecDeque::new();
        self.introduce_coordinator(now, &mut work);
        for chunk in list.chunks(psl_capsule::certs::STATEMENTS_PER_RECORD_MAX) {
            let body = Body::Certs(chunk.to_vec());
            let statements = chunk.to_vec();
            match self.coordinator_write("Cert", |_: &Record| body, now, &mut work, true, |a| a.write_certs(statements))
            {
                Ok(_) => {}
                Err(e @ CoordinatorWriteError::Seal { .. }) => {
                    self.drain(work, now);
                    return Err(e.to_string());
                }
                Err(CoordinatorWriteError::Persist { .. }) => break,
            }
        }
        self.drain(work, now);
        Ok(self.core.epoch())
    }

    /// Where this node stands in application key rotation.
    pub fn rotation_state(&self) -> RotationState {
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
            coordinator_key_gen: self.coordinator.as_ref().map(|c| c.key_gen()),
        }
    }

    /// Installs a rotation: the certificate in the verifier, then the coordinator's key, whose
    /// writer then carries the certificate into the log as a `Rotate` control record.
    pub fn rotate(&mut self, r: Rotation, now: u64) -> Result<RotationState, String> {
        let cert = r.cert;
        if r.refuse_if_begun && cert.from_epoch <= self.core.epoch() && self.verifier.key_gen_newest() < cert.key_gen {
            return Err(format!(
                "rotation epoch {} has already begun here (epoch {})",
                cert.from_epoch,
                self.core.epoch()
            ));
        }
        self.core.install_rotation(&cert, r.data_key.clone()).map_err(|e| format!("certificate refused: {e}"))?;
        let Some(key) = r.coordinator else { return Ok(self.rotation_state()) };
        // A shadow that never wrote yet introduces itself first (its certificate, under the
        // generation in force), so that its Rotate record is not the first of its chain: a
        // reader meets the certificate before any record it signs.
        let mut work = VecDeque::new();
        self.introduce_coordinator(now, &mut work);
        self.drain(work, now);
        let c = self.coordinator.as_mut().ok_or("this node runs no coordinator")?;
        if c.schedule_rotation(&cert, key, r.data_key)? {
            self.core.set_coordinator_key_gen(cert.key_gen);
            // The certificate in the log, for nodes the leader did not reach and auditors.
            let body = Body::Control { code: ControlCode::Rotate, payload: cert.encode() };
            let mut work = VecDeque::new();
            let b = body.clone();
            if let Err(e) = self.coordinator_write(
                "Rotate",
                |_: &Record| body,
                now,
                &mut work,
                true,
                |a| a.write_control(b, Vec::new()),
            ) {
                tracing::error!("{e}");
            }
            self.drain(work, now);
        }
        Ok(self.rotation_state())
    }

    // ---- what the core asks for

    /// Turns the core's outputs into commands, acting itself on the coordinator's duties.
    fn outputs(&mut self, out: Vec<Output>, now: u64) {
        self.drain(out.into(), now);
    }

    fn drain(&mut self, mut work: VecDeque<Output>, now: u64) {
        while let Some(o) = work.pop_front() {
            match o {
                Output::Publish(bytes) => self.commands.push_back(Command::Publish(bytes)),
                Output::EnterEpoch { sync, epoch } => {
                    if let Some(c) = &mut self.coordinator {
                        c.author.enter_epoch(sync, epoch);
                    }
                    self.commands.push_back(Command::EnterEpoch { sync, epoch });
                }
                Output::WriteEoe { epoch, heads } => self.commands.push_back(Command::WriteEoe { epoch, heads }),
                Output::WriteRts { epoch } => {
                    self.introduce_coordinator(now, &mut work);
                    let body = Body::Control { code: ControlCode::Rts, payload: epoch_payload(epoch) };
                    let b = body.clone();
                    if let Err(e) =
                        self.coordinator_write("RTS", |_: &Record| body, now, &mut work, true, |a| a.write_body(b))
                    {
                        tracing::error!("{e}");
                    }
                }
                Output::WriteSync { epoch, heads } => {
                    let Some(c) = &self.coordinator else { continue };
                    if epoch <= c.author.epoch() {
                        continue;
                    }
                    self.introduce_coordinator(now, &mut work);
                    // The body names the application key of the generation it was sealed under.
                    let verifier = self.verifier.clone();
                    let body = move |rec: &Record| Body::Sync {
                        app_key_fp: verifier.app_key_fp(rec.header().key_gen).unwrap_or_default(),
                    };
                    if let Err(e) =
                        self.coordinator_write("SYNC", body, now, &mut work, true, |a| a.write_sync_epoch(epoch, heads))
                    {
                        tracing::error!("{e}");
                    }
                }
                Output::Resume(head) => {
                    if let Some(c) = &mut self.coordinator {
                        c.resume(&head);
                    }
                }
                o @ (Output::Withholding { .. } | Output::Equivocation { .. }) => {
                    self.commands.push_back(Command::Report(o))
                }
            }
        }
    }

    /// Before the coordinator's first record in this process, in a certified capsule, a Cert
    /// record with its own certificate: servers and auditors learn its key from the log.
    fn introduce_coordinator(&mut self, now: u64, work: &mut VecDeque<Output>) {
        let Some(c) = &mut self.coordinator else { return };
        if c.introduced {
            return;
        }
        c.introduced = true;
        let Some(cert) = c.author.cert().cloned() else { return };
        let body = Body::Certs(vec![KeyStatement::Cert(cert.clone())]);
        let r = self.coordinator_write(
            "own Cert",
            |_: &Record| body,
            now,
            work,
            false,
            |a| a.write_certs(vec![KeyStatement::Cert(cert)]),
        );
        if let Err(e) = r {
            tracing::error!("{e}");
        }
    }

    /// Seals, logs and applies one coordinator record. `tick`: the record takes its Lamport
    /// time from the node's clock first. A record that cannot be logged stops the writer.
    fn coordinator_write(
        &mut self,
        what: &'static str,
        body: impl FnOnce(&Record) -> Body,
        now: u64,
        work: &mut VecDeque<Output>,
        tick: bool,
        seal: impl FnOnce(&mut Author) -> Result<Record, psl_capsule::SealError>,
    ) -> Result<(), CoordinatorWriteError> {
        let clock = self.core.clock().clone();
        let Some(c) = &mut self.coordinator else { return Ok(()) };
        let sealed = c.write(what, |a| {
            if tick {
                a.observe(clock.tick());
            }
            seal(a)
        });
        match sealed {
            Ok(rec) => {
                let h = rec.header();
                clock.observe(h.lamport);
                self.commands.push_back(Command::Signed { writer: h.writer, seq: h.seq, hash: rec.hash() });
                let body = body(&rec);
                work.extend(self.core.on_local_record(rec, &body, now));
                Ok(())
            }
            Err(e) => {
                if matches!(e, CoordinatorWriteError::Persist { .. }) {
                    self.coordinator = None;
                }
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LamportClock, Memtable, Metrics, NodeConfig};
    use psl_capsule::{new_capsule_with, Limits, Revocation, WriterKeys};
    use psl_crypto::{AppKey, OwnerKey};
    use std::sync::Mutex;

    /// An own-chain log in memory, or one whose disk fails.
    #[derive(Clone, Default)]
    struct MemLog {
        records: Arc<Mutex<Vec<Record>>>,
        fail: bool,
    }

    impl CoordinatorLog for MemLog {
        fn append(&mut self, rec: &Record) -> Result<(), String> {
            if self.fail {
                return Err("disk full".into());
            }
            self.records.lock().expect("test lock").push(rec.clone());
            Ok(())
        }
    }

    fn setup(seed: u8, keys: WriterKeys) -> (psl_capsule::SignedMetadata, AppKey) {
        let owner = OwnerKey::from_seed(&[seed; 32]).expect("seed");
        let meta = new_capsule_with(&owner, 1, "engine", 0, Limits::default(), keys).expect("capsule");
        (meta, owner.app(1).expect("app key"))
    }

    /// An engine running the primary coordinator, logging to `log`.
    fn coordinator_engine(meta: &psl_capsule::SignedMetadata, app: &AppKey, log: MemLog) -> NodeEngine {
        let cw = meta.meta.policy.coordinator_at(0).expect("rank 0");
        let core = crate::node::coordinator_core(meta, app, cw);
        let author = Author::new(meta, app, cw).expect("coordinator writer");
        NodeEngine::new(core, Some((author, Some(Box::new(log)))), false)
    }

    fn drain(e: &mut NodeEngine) -> Vec<Command> {
        std::iter::from_fn(|| e.next_command()).collect()
    }

    fn published_records(cmds: &[Command], limits: &Limits) -> Vec<Record> {
        cmds.iter()
            .filter_map(|c| match c {
                Command::Publish(b) => match Msg::decode(b) {
                    Ok(Msg::Record { bytes, .. }) => Record::decode(&bytes, limits).ok(),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_coordinator_record_is_published_only_after_its_log_holds_it() {
        let (meta, app) = setup(21, WriterKeys::Certified);
        let log = MemLog::default();
        let mut e = coordinator_engine(&meta, &app, log.clone());
        let mut cmds = Vec::new();
        for now in (0..100).step_by(5) {
            e.on_tick(now);
            cmds.extend(drain(&mut e));
        }
        let limits = meta.meta.policy.limits;
        let published = published_records(&cmds, &limits);
        assert!(!published.is_empty(), "the coordinator wrote RTS and SYNC records");
        let logged: Vec<Hash256> = log.records.lock().expect("test lock").iter().map(|r| r.hash()).collect();
        for r in &published {
            assert!(logged.contains(&r.hash()), "seq {} published but not logged", r.header().seq);
        }
        let signed = cmds.iter().filter(|c| matches!(c, Command::Signed { .. })).count();
        assert_eq!(signed, logged.len(), "every logged record is reported signed, once");
    }

    #[test]
    fn a_coordinator_whose_log_fails_stops_and_publishes_nothing_of_its_own() {
        let (meta, app) = setup(22, WriterKeys::Certified);
        let mut e = coordinator_engine(&meta, &app, MemLog { fail: true, ..MemLog::default() });
        let cw = e.coordinator_writer().expect("runs a coordinator");
        let mut cmds = Vec::new();
        for now in (0..100).step_by(5) {
            e.on_tick(now);
            cmds.extend(drain(&mut e));
        }
        assert_eq!(e.coordinator_writer(), None, "the writer stopped at the first record it could not log");
        let limits = meta.meta.policy.limits;
        assert!(published_records(&cmds, &limits).iter().all(|r| r.header().writer != cw));
        assert!(!cmds.iter().any(|c| matches!(c, Command::Signed { .. })));
    }

    #[test]
    fn a_revocation_is_carried_into_the_coordinators_chain() {
        let (meta, app) = setup(23, WriterKeys::Certified);
        let log = MemLog::default();
        let mut e = coordinator_engine(&meta, &app, log.clone());
        let rev = Revocation::issue(&app, meta.name(), 0, 0x30000, 1, 0).expect("revocation");
        e.statements(vec![KeyStatement::Revoke(rev.clone())], 0).expect("installed");
        let records = log.records.lock().expect("test lock").clone();
        // Another node that reads only the log learns the revocation from it.
        let follower = NodeCore::new(
            Arc::new(Verifier::new(meta.clone(), Some(app.data_key()))),
            Arc::new(Memtable::new()),
            Arc::new(LamportClock::new(0)),
            Arc::new(Metrics::default()),
            [],
            None,
            NodeConfig::default(),
        );
        let mut f = NodeEngine::new(follower, None, false);
        assert!(f.verifier().revocations().is_empty());
        for r in records {
            f.on_record(r, 0);
        }
        assert!(!f.verifier().revocations().is_empty(), "the follower learned the revocation from the chain");
        assert!(drain(&mut e).iter().any(|c| matches!(c, Command::Publish(_))));
    }

    #[test]
    fn records_go_to_the_verifiers_only_when_the_runtime_has_them() {
        let (meta, app) = setup(24, WriterKeys::Derived);
        let mut writer = Author::new(&meta, &app, 0x30000).expect("writer");
        let rec = writer.write_ops([(b"k".to_vec(), Some(b"v".to_vec()))]).expect("sealed");
        for elsewhere in [true, false] {
            let memtable = Arc::new(Memtable::new());
            let core = NodeCore::new(
                Arc::new(Verifier::new(meta.clone(), Some(app.data_key()))),
                memtable.clone(),
                Arc::new(LamportClock::new(0)),
                Arc::new(Metrics::default()),
                [],
                None,
                NodeConfig::default(),
            );
            let mut e = NodeEngine::new(core, None, elsewhere);
            e.on_record(rec.clone(), 0);
            let cmds = drain(&mut e);
            let asked = cmds.iter().filter(|c| matches!(c, Command::Verify(_))).count();
            assert_eq!(asked, usize::from(elsewhere));
            assert_eq!(memtable.entry(b"k").is_some(), !elsewhere, "applied at once only when verified inline");
        }
    }
}
