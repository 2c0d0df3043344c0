//! [`NodeCore`]: one node's protocol logic, single-threaded and deterministic.
//!
//! Inputs: verified records (the verifier runs elsewhere, in parallel), rejections, repair
//! requests, this node's own sealed records, and ticks. Outputs: messages to publish and
//! requests to the node's writers (enter an epoch, write an EOE, write an RTS or a SYNC).
//! Writers (one [`psl_capsule::Author`] each) live outside: in crypto actor threads in the
//! runtime, inline in the simulator.

use crate::announce::Announcer;
pub use crate::announce::CERTS_ANNOUNCE_MS;
use crate::barrier::Barriers;
pub use crate::barrier::SyncTicket;
use crate::coordinator::{CoordinatorAction, CoordinatorSm};
use crate::durability::Durability;
pub use crate::durability::{DurableStatus, DurableTicket, QuorumDurable};
use crate::flow::Flow;
pub use crate::flow::PEERS_MAX;
use crate::memtable::{Memtable, Version};
use crate::metrics::{Metrics, RejectReason};
use crate::orderer::{Orderer, OrdererAction, OrdererConfig};
use crate::rejoin::{Rejoin, RejoinStep};
use crate::repair::Repair;
use crate::wire::{Ack, Msg};
use crate::LamportClock;
use psl_capsule::{
    Action, Body, CapsuleName, ControlCode, KeyStatement, Kind, Link, Opened, Record, RotationCert, RotationError,
    Verified, Verifier,
};
use psl_crypto::{DataKey, Hash256};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A node's repair cache bound by default ([`NodeConfig::cache_bytes_max`]).
pub const CACHE_BYTES_MAX_DEFAULT: usize = 128 << 20;

/// A node core's bounds, rates and roles (times in milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeConfig {
    /// The receive orderer's bounds and repair timers.
    pub orderer: OrdererConfig,
    /// Records kept to answer repair requests (oldest evicted first).
    pub cache_records_max: usize,
    /// Bytes of records kept to answer repair requests: the cache is held to both bounds, so
    /// a node's repair cache stays within a known memory budget whatever the batch sizes
    /// (records evicted from it are still on the capsule servers, which answer repairs too).
    pub cache_bytes_max: usize,
    /// Whether applied data ops go into the memtable. A coordinator turns it off: it orders
    /// records, signs SYNCs and answers repairs from its cache, but no one reads values from
    /// it, and a memtable of every key would be its largest cost in memory.
    pub keep_values: bool,
    /// Most records sent in answer to repair requests per tick.
    pub repair_answers_per_tick: usize,
    /// How often the node publishes a heads hint (see [`crate::wire`]) while its heads move.
    pub heads_interval_ms: u64,
    /// The longest wait between two heads hints: while the node applies nothing, the wait
    /// doubles from `heads_interval_ms` up to this (Trickle, RFC 6206: a hint repeated to
    /// peers that already agree is wasted; one after a change, a data op applied, is not).
    pub heads_idle_ms: u64,
    /// Most repair requests a tick sends because of heads hints.
    pub hint_requests_per_tick: usize,
    /// After a start, how long a node that owns a long-lived writer (a coordinator) asks its
    /// peers for that writer's chain before writing again (0: write at once). See
    /// [`Output::Resume`].
    pub rejoin_ms: u64,
    /// Capsule servers `n` (ids `0 .. n`; 0: none). A write is durable once a majority,
    /// `n / 2 + 1` (f + 1 for n = 2f + 1), of them has acked it. See
    /// `docs/protocol/durability.md`.
    pub servers: u32,
    /// CapsuleDB's writer index (the one that signs its answers and frontiers), on a node that
    /// uses CapsuleDB: its signed acks of what it has taken in pace this node's writers beside
    /// the servers' quorum ([`NodeCore::flow_next`]). They never count toward durability.
    pub capsuledb: Option<u32>,
    /// This node's peer id in its heads hints (0: untagged, and no pacing by peers): peers
    /// that hint a tagged id pace this node's writers ([`NodeCore::flow_next`]). The runtime
    /// draws it at random.
    pub peer_id: u64,
    /// How often a node with a peer id hints the heads that moved (flow control toward peers).
    pub flow_hint_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            orderer: OrdererConfig::default(),
            cache_records_max: 1 << 20,
            cache_bytes_max: CACHE_BYTES_MAX_DEFAULT,
            keep_values: true,
            repair_answers_per_tick: 4096,
            heads_interval_ms: 250,
            heads_idle_ms: HEADS_IDLE_MS_DEFAULT,
            hint_requests_per_tick: 64,
            rejoin_ms: 0,
            servers: 0,
            capsuledb: None,
            peer_id: 0,
            flow_hint_ms: 50,
        }
    }
}

/// Something the node's runtime must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send these bytes on the fabric.
    Publish(Vec<u8>),
    /// Every local writer: the next record links to this SYNC and carries its epoch.
    EnterEpoch {
        /// The SYNC record just applied.
        sync: Link,
        /// Its epoch, now in force.
        epoch: u64,
    },
    /// Every local data writer: flush pending ops, then write an EOE for `epoch` linking
    /// `heads` (the newest record this node has applied of every other writer: an authenticated
    /// anti-entropy hint, so that a record only some nodes received still reaches everyone).
    WriteEoe {
        /// The epoch the applied RTS opened.
        epoch: u64,
        /// Newest applied record of each other data writer (not this node's, not
        /// coordinators'), at most `links_per_record_max - 1` of them.
        heads: Vec<Link>,
    },
    /// The local coordinator writer: write an RTS / a SYNC.
    WriteRts {
        /// The epoch the RTS opens.
        epoch: u64,
    },
    /// The local coordinator writer: write a SYNC closing `epoch` that links `heads`.
    WriteSync {
        /// The epoch the SYNC closes.
        epoch: u64,
        /// Each writer's EOE, or its newest applied record (see [`CoordinatorAction::WriteSync`]).
        heads: Vec<Link>,
    },
    /// The rejoin period is over: continue this own writer's chain after `head` (a restarted
    /// coordinator, whose writer index has no incarnation, must never re-use a seq).
    Resume(psl_capsule::Head),
    /// A writer's records could not be obtained for `withholding_after_ms`.
    Withholding {
        /// The writer reported.
        writer: u32,
        /// The first missing seq.
        from_seq: u64,
        /// The highest seq known to exist (inclusive).
        to_seq: u64,
    },
    /// Two different signed records for one (writer, seq).
    Equivocation {
        /// The equivocating writer.
        writer: u32,
        /// The slot with two records.
        seq: u64,
        /// The hash already held (applied, or named by a SYNC or EOE).
        a: Hash256,
        /// The conflicting hash offered.
        b: Hash256,
    },
}

/// One node's protocol logic (orderer, optional coordinator, repair cache, barriers, acks): pure
/// state, fed events, returning [`Output`]s. [`NodeEngine`](crate::NodeEngine) drives it.
pub struct NodeCore {
    verifier: Arc<Verifier>,
    memtable: Arc<Memtable>,
    clock: Arc<LamportClock>,
    metrics: Arc<Metrics>,
    cfg: NodeConfig,
    orderer: Orderer,
    coordinator: Option<CoordinatorSm>,
    /// This node's data writers.
    local: BTreeSet<u32>,
    /// This node's coordinator writer, if it is a coordinator.
    coordinator_writer: Option<u32>,
    /// The repair cache, the repair answers owed, the hints not yet asked for.
    repair: Repair,
    /// The pending `sync()` barriers.
    barriers: Barriers,
    /// Ids of durability barriers.
    next_ticket: u64,
    /// Newest SYNC applied: epoch and links.
    last_sync: Option<(u64, Vec<Link>)>,
    last_heads_at: u64,
    /// The current wait between full heads hints (`heads_interval_ms` doubling up to
    /// `heads_idle_ms` while nothing is applied), and the applied-ops count at the last.
    heads_every_ms: u64,
    heads_applied: u64,
    /// When this node last asked for an epoch for its pending barriers (`None`: not since
    /// they began).
    epoch_wanted_at: Option<u64>,
    /// The rejoin period after a start, and the own coordinator chain's head it resumes from.
    rejoin: Rejoin,
    /// The servers' acks of own writers' records and the durability barriers on them.
    durability: Durability,
    /// The newest unverified ack per server, verified at the next tick: acks are cumulative,
    /// so one signature check per server per tick stands for all those that came meanwhile
    /// (a server acks every group commit, a front end would otherwise verify thousands a second).
    pending_acks: BTreeMap<u32, Ack>,
    /// CapsuleDB's acks and peers' tagged hints of own writers (flow control), and the own
    /// heads hinted to the peers.
    flow: Flow,
    /// The core's clock at the last tick.
    now_ms: u64,
    /// Incoming messages waiting for the core, as the runtime last said.
    inbound_backlog: usize,
    /// The application key generation this node's coordinator writer holds keys for.
    coordinator_key_gen: u32,
    /// Certificates of this node's own writers (a certified capsule), announced on the fabric
    /// every [`CERTS_ANNOUNCE_MS`] so that late joiners learn them (`wire` module docs).
    announce: Announcer,
}

/// The default [`NodeConfig::heads_idle_ms`] (and the capsule servers'): 4 s.
pub const HEADS_IDLE_MS_DEFAULT: u64 = 4_000;

/// How often a node with a pending `sync()` barrier asks for an epoch
/// ([`Msg::EpochWanted`]): the hint is unreliable, so it is repeated while the barrier waits.
pub const EPOCH_WANTED_EVERY_MS: u64 = 250;

/// The key of CapsuleDB's pending ack beside the servers' ids (which are below 2^15).
const DB_ACKER: u32 = u32::MAX;

/// Above this many incoming messages waiting, hints make no repair requests.
pub const INBOUND_BACKLOG_HINTS_MAX: usize = 64;

impl std::fmt::Debug for NodeCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NodeCore(writers={:?}, epoch={})", self.local, self.orderer.current_epoch())
    }
}

impl NodeCore {
    /// A core at epoch 0 applying to `memtable` and ticking `clock`; `local_writers` are this
    /// node's data writers, `coordinator` its coordinator's writer index and state machine.
    pub fn new(
        verifier: Arc<Verifier>,
        memtable: Arc<Memtable>,
        clock: Arc<LamportClock>,
        metrics: Arc<Metrics>,
        local_writers: impl IntoIterator<Item = u32>,
        coordinator: Option<(u32, CoordinatorSm)>,
        cfg: NodeConfig,
    ) -> NodeCore {
        let (coordinator_writer, coordinator) = match coordinator {
            Some((w, c)) => (Some(w), Some(c)),
            None => (None, None),
        };
        NodeCore {
            verifier,
            memtable,
            clock,
            metrics,
            orderer: Orderer::new(cfg.orderer),
            coordinator,
            local: local_writers.into_iter().collect(),
            coordinator_writer,
            repair: Repair::new(cfg.cache_records_max, cfg.cache_bytes_max),
            barriers: Barriers::default(),
            next_ticket: 0,
            last_sync: None,
            last_heads_at: 0,
            heads_every_ms: cfg.heads_interval_ms,
            heads_applied: 0,
            epoch_wanted_at: None,
            rejoin: Rejoin::new(cfg.rejoin_ms, coordinator_writer),
            durability: Durability::new(cfg.servers),
            pending_acks: BTreeMap::new(),
            flow: Flow::new(),
            now_ms: 0,
            inbound_backlog: 0,
            coordinator_key_gen: 0,
            announce: Announcer::new(),
            cfg,
        }
    }

    /// Sets the certificates (and any revocations) this node announces: its own writers'.
    /// Each is installed in the verifier too. Ignored in a capsule that derives writer keys.
    pub fn set_announcements(&mut self, statements: Vec<KeyStatement>) {
        for (writer, e) in self.verifier.install_own(&statements) {
            tracing::error!(writer, "own certificate refused: {e}");
        }
        self.announce.set(statements);
    }

    /// Adds a statement (the leader's revocation of a writer) to what this node announces,
    /// installs it, and announces at the next tick. Its carrying into the log is the runtime's
    /// (a coordinator writes a Cert record with it).
    pub fn add_announcement(&mut self, s: KeyStatement) -> Result<(), psl_capsule::CertError> {
        if self.verifier.install_statement(&s)? && matches!(s, KeyStatement::Revoke(_)) {
            self.purge_refused();
        }
        self.note_effect_epoch(&s);
        self.announce.add(s);
        Ok(())
    }

    /// Key statements from the fabric (a `Msg::Certs`): each is checked and installed; a bad one
    /// is counted as a `certificate` rejection. Returns how many were new: the caller then
    /// releases records held back for them (`Verifier::release_held`).
    pub fn on_statements(&mut self, statements: &[KeyStatement]) -> usize {
        let mut new = 0;
        let mut revoked = false;
        for s in statements {
            match self.verifier.install_statement(s) {
                Ok(true) => {
                    new += 1;
                    self.note_effect_epoch(s);
                    revoked |= matches!(s, KeyStatement::Revoke(_));
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(writer = s.writer(), "key statement refused: {e}");
                    self.metrics.reject(RejectReason::Certificate);
                }
            }
        }
        if revoked {
            self.purge_refused();
        }
        new
    }

    /// A revocation takes effect at its epoch: a coordinator here keeps epochs at the busy pace
    /// until then, so that it does not wait out idle epochs.
    fn note_effect_epoch(&mut self, s: &KeyStatement) {
        if let (KeyStatement::Revoke(r), Some(c)) = (s, &mut self.coordinator) {
            c.keep_busy_until(r.from_epoch.saturating_add(1));
        }
    }

    /// Drops the records held for ordering that the verifier refuses now (a revocation learnt
    /// after they were verified), so they are never applied and hold no memory.
    fn purge_refused(&mut self) {
        let verifier = &self.verifier;
        let recheck = |r: &Record| verifier.recheck(r.header()).err().map(|e| RejectReason::from_verifier(&e));
        for r in self.orderer.purge_all(&recheck) {
            self.metrics.reject(r);
        }
    }

    /// The capsule's verifier (keys, certificates, rotations, held-back records).
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    /// The receive orderer.
    pub fn orderer(&self) -> &Orderer {
        &self.orderer
    }

    /// The epoch in force: that of the newest SYNC applied (0 before any).
    pub fn epoch(&self) -> u64 {
        self.orderer.current_epoch()
    }

    /// This node's own writers (its data writers, and those added by own records sealed
    /// elsewhere, such as CapsuleDB's).
    pub fn local_writers(&self) -> &BTreeSet<u32> {
        &self.local
    }

    /// The coordinator state machine, on a node that runs a coordinator.
    pub fn coordinator(&self) -> Option<&CoordinatorSm> {
        self.coordinator.as_ref()
    }

    /// The newest SYNC applied, if any: its epoch and links.
    pub fn last_sync(&self) -> Option<&(u64, Vec<Link>)> {
        self.last_sync.as_ref()
    }

    /// Cheap pre-check before verification: a record this node already holds is counted and
    /// dropped without a signature check (see [`Orderer::known`]). Returns `true` if dropped.
    pub fn precheck(&mut self, rec: &Record) -> bool {
        if self.verifier.retired(rec.header()).is_some() {
            // Signed (or claiming to be) under an application key retired at its epoch: refused
            // before any signature check, whoever holds the old key.
            self.metrics.reject(RejectReason::RetiredKey);
            return true;
        }
        if crate::server_id(rec.header().writer).is_some() {
            // Capsule servers' keys sign acks only, never records (see `SERVER_WRITER_BASE`):
            // a server must not be able to inject writes.
            self.metrics.reject(RejectReason::Writer);
            return true;
        }
        if self.verifier.revoked(rec.header()).is_some() {
            // A revoked writer's record: refused before any signature check.
            self.metrics.reject(RejectReason::Revoked);
            return true;
        }
        match self.orderer.known(rec) {
            Some(r) => {
                self.metrics.reject(r);
                true
            }
            None => false,
        }
    }

    /// A message arrived that failed verification (or decoding).
    pub fn on_rejected(&mut self, reason: RejectReason) {
        self.metrics.reject(reason);
    }

    /// A verified record arrived from the fabric.
    pub fn on_verified(&mut self, rec: Verified<Opened>, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        if crate::server_id(rec.record.header().writer).is_some() {
            self.metrics.reject(RejectReason::Writer);
            return out;
        }
        // Verified in parallel, possibly before this node installed the rotation that retires
        // its key or the revocation that refuses its writer: checked again here, before it is
        // held or applied, and for every held record it releases.
        let verifier = &self.verifier;
        let recheck = |r: &Record| verifier.recheck(r.header()).err().map(|e| RejectReason::from_verifier(&e));
        let d = self.orderer.deliver(rec, now, recheck);
        if let Some(r) = d.rejected {
            self.metrics.reject(r);
        }
        for (writer, seq, a, b) in d.conflicts {
            tracing::warn!(writer, seq, %a, %b, "equivocation: two signed records for one slot");
            out.push(Output::Equivocation { writer, seq, a, b });
        }
        for r in d.dropped {
            self.metrics.reject(r);
        }
        if d.held {
            Metrics::add(&self.metrics.records_held, 1);
        }
        for r in d.ready {
            self.apply(&r, now, &mut out);
        }
        self.check_syncs();
        out
    }

    /// One of this node's own records, just sealed: cache it, advance the chain, publish it.
    /// Its data ops were applied to the memtable when they were put.
    pub fn on_local_record(&mut self, rec: Record, body: &Body, now: u64) -> Vec<Output> {
        self.check_own_key(&rec);
        let mut out = Vec::new();
        self.orderer.advance_own(&rec, now);
        self.rejoin.note_head(&rec);
        let bytes = self.repair.cache(&rec);
        self.metrics.repair_cache_bytes.store(bytes as u64, Ordering::Relaxed);
        Metrics::add(&self.metrics.records_written, 1);
        if let Some(ops) = body.data_ops() {
            Metrics::add(&self.metrics.ops_written, ops.len() as u64);
        }
        out.push(Output::Publish(Msg::Record { capsule: self.verifier.name(), bytes: rec.shared_bytes() }.encode()));
        self.after_apply(&rec, body, now, &mut out);
        self.check_syncs();
        out
    }

    /// An own record sealed outside the writer actors (CapsuleDB's db-block and db-index
    /// records): its writer becomes one of this node's own (so servers' acks for it are counted
    /// by [`NodeCore::on_ack`] and durability barriers can wait for it), its chain advances, and
    /// it is published. It is not cached: its writer keeps it until it is durable and
    /// publishes it again if needed. A record that does not extend the writer's chain as this
    /// node knows it is refused (logged; nothing is published).
    pub fn on_own_record(&mut self, rec: &Record, now: u64) -> Vec<Output> {
        self.check_own_key(rec);
        let h = rec.header();
        let extends = h.seq == self.orderer.next_seq(h.writer)
            && (h.seq == 0 || self.orderer.applied_hash(h.writer, h.seq - 1) == Some(h.prev));
        if !extends {
            tracing::error!(writer = h.writer, seq = h.seq, "own record does not extend its chain: not published");
            return Vec::new();
        }
        self.local.insert(h.writer);
        self.orderer.advance_own(rec, now);
        Metrics::add(&self.metrics.records_written, 1);
        if let Some(c) = &mut self.coordinator {
            c.on_activity(now);
        }
        vec![Output::Publish(Msg::Record { capsule: self.verifier.name(), bytes: rec.shared_bytes() }.encode())]
    }

    /// Like [`NodeCore::on_local_record`] for a data record of `ops` ops, without its body
    /// (the writer thread keeps the plaintext; the core needs only the count).
    pub fn on_local_data(&mut self, rec: Record, ops: usize, now: u64) -> Vec<Output> {
        debug_assert_eq!(rec.header().kind, Kind::Data);
        self.check_own_key(&rec);
        let mut out = Vec::new();
        self.orderer.advance_own(&rec, now);
        Metrics::add(&self.metrics.records_written, 1);
        Metrics::add(&self.metrics.ops_written, ops as u64);
        if let Some(c) = &mut self.coordinator {
            // A coordinator on a node with data writers (the embedded deployment).
            c.on_activity(now);
        }
        out.push(Output::Publish(Msg::Record { capsule: self.verifier.name(), bytes: rec.shared_bytes() }.encode()));
        let bytes = self.repair.cache(&rec);
        self.metrics.repair_cache_bytes.store(bytes as u64, Ordering::Relaxed);
        out
    }

    /// An application key rotation: from the leader (with the new data key, on the attested
    /// channel) or from a `Rotate` control record in the log (certificate only). The certificate
    /// must carry the capsule owner's signature. From its epoch on, records under an older key
    /// generation are refused as `retired-key`. Idempotent.
    pub fn install_rotation(&mut self, cert: &RotationCert, data_key: Option<DataKey>) -> Result<bool, RotationError> {
        let r = self.verifier.install_rotation(cert, data_key);
        match &r {
            Ok(true) => {
                if let Some(c) = &mut self.coordinator {
                    // The new key takes effect there: get there at the busy pace.
                    c.keep_busy_until(cert.from_epoch.saturating_add(1));
                }
                if cert.from_epoch <= self.orderer.current_epoch() {
                    tracing::warn!(
                        key_gen = cert.key_gen,
                        from_epoch = cert.from_epoch,
                        epoch = self.orderer.current_epoch(),
                        "key rotation learnt after its epoch began: records applied before stay applied"
                    );
                }
                tracing::info!(
                    key_gen = cert.key_gen,
                    from_epoch = cert.from_epoch,
                    "application key rotation installed"
                );
                self.metrics.key_gen.store(self.verifier.key_gen_newest() as u64, Ordering::Relaxed);
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(key_gen = cert.key_gen, "rotation certificate refused: {e}");
                self.metrics.reject(RejectReason::KeyGeneration);
            }
        }
        r
    }

    /// The runtime handed this node's coordinator writer its key under generation `key_gen`
    /// (`Author::schedule_rotation`). Until it does, the coordinator opens no epoch at or after
    /// the rotation epoch (see [`CoordinatorSm::hold_from`]).
    pub fn set_coordinator_key_gen(&mut self, key_gen: u32) {
        self.coordinator_key_gen = self.coordinator_key_gen.max(key_gen);
    }

    /// An own record under a retired key generation is a runtime bug (a writer that was not
    /// given its rotated key before the rotation epoch): every peer refuses it while this node
    /// has already applied its ops. Loud, and counted, so that it is seen.
    fn check_own_key(&self, rec: &Record) {
        if let Some(reason) = self.verifier.retired(rec.header()) {
            let h = rec.header();
            tracing::error!(writer = h.writer, seq = h.seq, "own record under a retired application key: {reason}");
            self.metrics.reject(RejectReason::RetiredKey);
        }
    }

    /// The epoch before which the coordinator must hold, if it lacks a rotated key.
    fn coordinator_hold(&self) -> Option<u64> {
        if self.verifier.key_gen_newest() <= self.coordinator_key_gen {
            return None;
        }
        let certs = self.verifier.rotation_certs();
        certs.get(self.coordinator_key_gen as usize).map(|c| c.from_epoch)
    }

    /// Whether this node wrote `writer`'s records (one of its writers, or its coordinator's).
    fn is_origin(&self, writer: u32) -> bool {
        self.local.contains(&writer) || self.coordinator_writer == Some(writer)
    }

    /// A repair request arrived: queue the records we hold in that range.
    pub fn on_repair(&mut self, writer: u32, from_seq: u64, to_seq: u64) {
        self.repair.on_request(writer, from_seq, to_seq, self.cfg.orderer.repair_chunk);
    }

    /// A message from the fabric that is not a record (records go through the verifier).
    pub fn on_message(&mut self, msg: Msg) {
        match msg {
            Msg::Repair { capsule, writer, from_seq, to_seq, origin_only } if capsule == self.verifier.name() => {
                if !origin_only || self.is_origin(writer) {
                    self.on_repair(writer, from_seq, to_seq)
                }
            }
            Msg::Heads { capsule, heads, sender } if capsule == self.verifier.name() => {
                if let Some(id) = sender.filter(|id| *id != 0 && *id != self.cfg.peer_id) {
                    self.on_peer_heads(id, &heads);
                }
                for (w, s) in heads {
                    // Unauthenticated claims: none about a capsule server's writer (servers
                    // write no records), and none that only a revoked writer could fulfil.
                    let next = self.orderer.next_seq(w);
                    if s >= next && crate::server_id(w).is_none() && !self.verifier.hint_refused(w, next) {
                        self.repair.on_hint(w, s);
                    }
                }
            }
            Msg::Ack(a) if a.capsule == self.verifier.name() => self.on_ack(a),
            Msg::Certs { capsule, statements } if capsule == self.verifier.name() => {
                if self.on_statements(&statements) > 0 {
                    // Someone new is about: it may lack our certificates too.
                    self.announce.hurry();
                }
            }
            Msg::EpochWanted { capsule } if capsule == self.verifier.name() => {
                let now = self.now_ms;
                if let Some(c) = &mut self.coordinator {
                    c.on_activity(now);
                }
            }
            Msg::Repair { .. } | Msg::Heads { .. } | Msg::Ack(_) | Msg::Certs { .. } | Msg::EpochWanted { .. } => {
                self.metrics.reject(RejectReason::Capsule)
            }
            Msg::Record { .. } => {}
        }
    }

    /// How many incoming messages wait for the core (the runtime's queues), before a tick.
    pub fn set_inbound_backlog(&mut self, msgs: usize) {
        self.inbound_backlog = msgs;
    }

    /// A tagged heads hint from peer `id`: how far it has applied this node's own writers.
    /// Unauthenticated, like every hint: it can only make the writers wait (at most one stall
    /// per pause, like dropping messages would) or not wait.
    fn on_peer_heads(&mut self, id: u64, heads: &[(u32, u64)]) {
        let local = &self.local;
        self.flow.on_peer_heads(id, heads, self.now_ms, |w| local.contains(&w));
    }

    /// A capsule server's ack, or CapsuleDB's. Only entries for this node's own writers matter;
    /// the signature is checked only if one of them would advance what that server is known to
    /// hold (so repeated and foreign acks cost no signature check), and at the next tick
    /// ([`NodeCore::on_tick`]), once for the newest ack of each server. An entry counts only if
    /// its hash is the own chain's record at that seq.
    pub fn on_ack(&mut self, a: Ack) {
        let id = if self.cfg.capsuledb == Some(a.server) {
            DB_ACKER
        } else {
            let n = self.cfg.servers;
            if n == 0 {
                // This node counts no server acks (a coordinator, or a node run without
                // servers), yet a fabric that floods every message brings it every server's:
                // not a rejection.
                return;
            }
            match crate::server_id(a.server).filter(|id| *id < n) {
                Some(id) => id,
                None if self.cfg.capsuledb.is_none() && crate::server_id(a.server).is_none() => {
                    // Another node's CapsuleDB (this node uses none): not for it.
                    return;
                }
                None => {
                    self.metrics.reject(RejectReason::Writer);
                    return;
                }
            }
        };
        let known = if id == DB_ACKER { Some(self.flow.db_acked()) } else { self.durability.acked(id) };
        let useful = a.entries.iter().any(|e| {
            self.local.contains(&e.writer) && known.and_then(|m| m.get(&e.writer)).is_none_or(|next| e.to_seq >= *next)
        });
        if !useful {
            return;
        }
        // The newer ack stands for the older unless it leaves out an own writer the older one
        // acked further: then the older is checked now rather than lost.
        if let Some(old) = self.pending_acks.get(&id) {
            let covered = old
                .entries
                .iter()
                .filter(|e| self.local.contains(&e.writer))
                .all(|e| a.entries.iter().any(|n| n.writer == e.writer && n.to_seq >= e.to_seq));
            if !covered {
                if let Some(old) = self.pending_acks.remove(&id) {
                    self.apply_ack(id, old);
                }
            }
        }
        self.pending_acks.insert(id, a);
    }

    /// Checks the pending acks' signatures and counts their entries.
    fn apply_pending_acks(&mut self) {
        for (id, a) in std::mem::take(&mut self.pending_acks) {
            self.apply_ack(id, a);
        }
    }

    fn apply_ack(&mut self, id: u32, a: Ack) {
        match self.verifier.writer_key(a.server) {
            Ok(k) if a.verify(&k) => {}
            Err(r) if r.wants_cert() => {
                // The server's certificate has not arrived yet (it is announced every second);
                // its next ack covers this one.
                self.metrics.reject(RejectReason::Uncertified);
                return;
            }
            Err(psl_capsule::Reason::Revoked { .. }) => {
                self.metrics.reject(RejectReason::Revoked);
                return;
            }
            _ => {
                tracing::debug!(server = id, "ack with a bad signature");
                self.metrics.reject(RejectReason::Signature);
                return;
            }
        }
        for e in a.entries.iter().filter(|e| self.local.contains(&e.writer)) {
            if self.orderer.applied_hash(e.writer, e.to_seq) != Some(e.hash) {
                tracing::warn!(
                    server = id,
                    writer = e.writer,
                    seq = e.to_seq,
                    "server or CapsuleDB acked a record this node did not write"
                );
                continue;
            }
            if id == DB_ACKER {
                self.flow.db_record(e.writer, e.to_seq + 1, self.now_ms);
            } else {
                self.durability.record(id, e.writer, e.to_seq + 1);
            }
        }
    }

    /// How far own writer `writer` may count its records as taken in (flow control, see
    /// `psl_node::flow`): every record below the returned seq is durable at a quorum of the
    /// servers (if there are any), taken in by CapsuleDB (if this node uses it and it is
    /// live), and applied by every peer that paces (below). CapsuleDB counts while its acks
    /// moved within the last `stall_ms` (or the node started less than `stall_ms` ago) or it
    /// is not behind: a CapsuleDB that stopped acking (down, or cut off) stops pacing the
    /// writers after one stall instead of holding them, and paces them again at its next ack
    /// that moves.
    ///
    /// A peer (a node whose tagged heads hints name this writer) paces it while it is behind
    /// by at most `peer_lag_max` records and its applied next seq for the writer moved within
    /// the last `stall_ms`: a peer that is down, paused or cut off stops pacing after one
    /// stall, and one far behind (just started, catching up by repair) does not pace until it
    /// is near. A pacing peer releases `peer_slack` records beyond what it last hinted: its
    /// hints come periodically, so a peer that keeps up always looks a little behind, and
    /// only one that falls further back slows the writer. Without any of these, every record
    /// this node applied is released.
    pub fn flow_next(&self, writer: u32, stall_ms: u64, peer_slack: u64, peer_lag_max: u64) -> u64 {
        let own = self.orderer.next_seq(writer);
        let servers = (self.cfg.servers > 0).then(|| self.durable_next(writer));
        let uses_db = self.cfg.capsuledb.is_some();
        self.flow.next(writer, own, servers, uses_db, self.now_ms, stall_ms, peer_slack, peer_lag_max)
    }

    /// Peers whose tagged hints this node keeps (at most [`PEERS_MAX`]); whether each paces a
    /// writer now is decided per writer by [`NodeCore::flow_next`].
    pub fn peers_tracked(&self) -> usize {
        self.flow.peers()
    }

    /// Majority of the configured servers.
    pub fn quorum(&self) -> usize {
        self.durability.quorum()
    }

    /// Own writer `writer`'s durable next seq: every record below it is acked by a quorum.
    pub fn durable_next(&self, writer: u32) -> u64 {
        self.durability.durable_next(writer)
    }

    /// Starts a durability barrier: done once, for every own writer, the records below
    /// `next_seqs[writer]` are acked by a quorum of servers (acks come only after their fsync).
    pub fn begin_durable(&mut self, next_seqs: BTreeMap<u32, u64>) -> DurableTicket {
        let id = self.next_ticket;
        self.next_ticket += 1;
        self.durability.begin(id, next_seqs)
    }

    /// The proof that a durability barrier is done, or where it stands.
    pub fn durable_proof(&self, t: &DurableTicket) -> Result<QuorumDurable, DurableStatus> {
        self.durability.proof(t)
    }

    /// Where a durability barrier stands; one a RESET forgot has no acks (it is never done).
    pub fn durable_status(&self, t: &DurableTicket) -> DurableStatus {
        self.durability.status(t)
    }

    /// Forgets a durability barrier (done, or its caller gave up).
    pub fn end_durable(&mut self, t: &DurableTicket) {
        self.durability.end(t);
    }

    /// The node's Lamport clock (shared with its writers).
    pub fn clock(&self) -> &Arc<LamportClock> {
        &self.clock
    }

    /// Whether the rejoin period is over (writers may write).
    pub fn rejoined(&self) -> bool {
        self.rejoin.rejoined()
    }

    /// A restarted coordinator's persisted newest seq: the rejoin period lasts until this node
    /// has applied its own coordinator chain through `seq` (learnt back from peers and servers),
    /// however long that takes, so the coordinator continues after it and never re-signs a slot.
    pub fn hold_rejoin_until(&mut self, seq: u64) {
        self.rejoin.hold_until(seq);
    }

    /// Time passes: repair requests, repair answers, the coordinator's epoch clock.
    pub fn on_tick(&mut self, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        self.now_ms = self.now_ms.max(now);
        self.apply_pending_acks();
        self.tick_rejoin(now, &mut out);
        let name = self.verifier.name();
        self.tick_repair_requests(name, now, &mut out);
        self.tick_announce_certs(name, now, &mut out);
        for _ in self.verifier.expire_held(now) {
            // Held back for a certificate that never came (see `Verifier::hold`).
            self.metrics.reject(RejectReason::Uncertified);
        }
        self.tick_heads(name, now, &mut out);
        self.tick_repair_answers(name, &mut out);
        self.tick_epoch_wanted(name, now, &mut out);
        self.tick_coordinator(now, &mut out);
        out
    }

    /// Tick step: while `sync()` barriers wait, asks the coordinators for epochs every
    /// [`EPOCH_WANTED_EVERY_MS`] (an idle capsule's epochs are slow; see
    /// [`crate::coordinator`]). A coordinator on this node takes it directly.
    fn tick_epoch_wanted(&mut self, name: CapsuleName, now: u64, out: &mut Vec<Output>) {
        if !self.barriers.pending() {
            self.epoch_wanted_at = None;
            return;
        }
        if self.epoch_wanted_at.is_some_and(|t| now.saturating_sub(t) < EPOCH_WANTED_EVERY_MS) {
            return;
        }
        self.epoch_wanted_at = Some(now);
        if let Some(c) = &mut self.coordinator {
            c.on_activity(now);
        }
        out.push(Output::Publish(Msg::EpochWanted { capsule: name }.encode()));
    }

    /// The earliest time (ms) at which a tick has timed work to do, if the node is quiet:
    /// nothing pending that a tick retries or times out (repairs, held records, acks to
    /// verify, repair answers owed, barriers, a rejoin), so that a runtime with no new event
    /// may sleep until then; nor anything applied since the last full heads hint (the moved
    /// heads go out between full hints). `None`: not quiet; tick at the regular pace.
    pub fn quiet_until(&self) -> Option<u64> {
        let busy = !self.rejoin.rejoined()
            || self.data_moves() != self.heads_applied
            || self.barriers.pending()
            || !self.pending_acks.is_empty()
            || self.durability.waiting()
            || self.repair.owes_answers()
            || self.repair.has_hints()
            || !self.orderer.gaps().is_empty()
            || self.verifier.holds_any();
        if busy {
            return None;
        }
        let mut at = self.last_heads_at.saturating_add(self.heads_every_ms);
        if let Some(t) = self.announce.next_due() {
            at = at.min(t);
        }
        if let Some(c) = &self.coordinator {
            if let Some(t) = c.next_due() {
                at = at.min(t);
            }
        }
        Some(at)
    }

    /// Tick step: until rejoined, waits out the rejoin delay and own floor (resuming the
    /// coordinator's chain), probing for the own writers' records meanwhile.
    fn tick_rejoin(&mut self, now: u64, out: &mut Vec<Output>) {
        let orderer = &self.orderer;
        match self.rejoin.tick(now, self.cfg.orderer.repair_retry_ms, |w| orderer.next_seq(w)) {
            RejoinStep::Idle => {}
            RejoinStep::Probe => out.extend(self.probe_own(now)),
            RejoinStep::Rejoined => {
                if let Some(w) = self.coordinator_writer {
                    if let Some(l) = self.orderer.heads().get(&w) {
                        out.extend(self.rejoin.resume(l).map(Output::Resume));
                    }
                }
            }
        }
    }

    /// Tick step: asks for missing records (gaps and hints) and reports withholding writers.
    fn tick_repair_requests(&mut self, name: CapsuleName, now: u64, out: &mut Vec<Output>) {
        // A node with a backlog of incoming messages is behind, not missing records: what its
        // peers hint is most likely queued for it, so it does not ask for it (an answer would
        // go to everyone and fill their queues). Gaps proven by later records still are.
        let hint_budget =
            if self.inbound_backlog > INBOUND_BACKLOG_HINTS_MAX { 0 } else { self.cfg.hint_requests_per_tick };
        let work = self.orderer.tick_with_hints(self.repair.hints_mut(), hint_budget, now);
        Metrics::add(&self.metrics.repair_requests_sent, work.repairs.len() as u64);
        Metrics::add(&self.metrics.withholding_reports, work.withholding.len() as u64);
        for (writer, from_seq, to_seq) in work.repairs {
            let origin_only = self.orderer.first_ask(writer, from_seq, now);
            if origin_only {
                Metrics::add(&self.metrics.repair_requests_origin, 1);
            }
            out.push(Output::Publish(Msg::Repair { capsule: name, writer, from_seq, to_seq, origin_only }.encode()));
        }
        for (writer, from_seq, to_seq) in work.withholding {
            out.push(Output::Withholding { writer, from_seq, to_seq });
        }
    }

    /// Tick step: re-announces the certificate statements to announce, every `CERTS_ANNOUNCE_MS`.
    fn tick_announce_certs(&mut self, name: CapsuleName, now: u64, out: &mut Vec<Output>) {
        out.extend(self.announce.due(name, now).into_iter().map(|m| Output::Publish(m.encode())));
    }

    /// Tick step: publishes all heads every heads interval, and the moved ones (flow hints) between.
    fn tick_heads(&mut self, name: CapsuleName, now: u64, out: &mut Vec<Output>) {
        let sender = (self.cfg.peer_id != 0).then_some(self.cfg.peer_id);
        // Trickle: back to the regular interval as soon as a data op was applied. (Epoch
        // records alone do not count: a node that misses the last of them learns it from the
        // next epoch's records or from a later hint.)
        let applied = self.data_moves();
        if applied != self.heads_applied {
            self.heads_every_ms = self.cfg.heads_interval_ms;
        }
        if now.saturating_sub(self.last_heads_at) >= self.heads_every_ms {
            self.last_heads_at = now;
            if applied == self.heads_applied {
                self.heads_every_ms =
                    (self.heads_every_ms * 2).min(self.cfg.heads_idle_ms.max(self.cfg.heads_interval_ms));
            }
            self.heads_applied = applied;
            let heads: Vec<(u32, u64)> =
                self.orderer.heads().into_values().map(|l| (l.writer, l.seq)).take(crate::wire::HEADS_MAX).collect();
            self.flow.hinted_all(now, &heads);
            if !heads.is_empty() {
                out.push(Output::Publish(Msg::Heads { capsule: name, heads, sender }.encode()));
            }
        } else if sender.is_some() {
            // Between full hints, the heads that moved: what pacing writers need to know.
            let orderer = &self.orderer;
            let heads = || orderer.heads().into_values();
            if let Some(moved) = self.flow.moved(now, self.cfg.flow_hint_ms, heads, crate::wire::HEADS_MAX) {
                if !moved.is_empty() {
                    out.push(Output::Publish(Msg::Heads { capsule: name, heads: moved, sender }.encode()));
                }
            }
        }
    }

    /// Tick step: answers queued repair requests from the cache, up to the per-tick budget.
    fn tick_repair_answers(&mut self, name: CapsuleName, out: &mut Vec<Output>) {
        let answers = self.repair.answers(name, self.cfg.repair_answers_per_tick);
        Metrics::add(&self.metrics.repair_records_sent, answers.len() as u64);
        out.extend(answers.into_iter().map(|m| Output::Publish(m.encode())));
    }

    /// Tick step: runs the coordinator's epoch clock (once rejoined), turning its actions into outputs.
    fn tick_coordinator(&mut self, now: u64, out: &mut Vec<Output>) {
        let hold = if self.coordinator.is_some() { self.coordinator_hold() } else { None };
        if let Some(c) = self.coordinator.as_mut().filter(|_| self.rejoin.rejoined()) {
            c.hold_from(hold);
            let heads: BTreeMap<u32, Link> = self
                .orderer
                .heads()
                .into_iter()
                .filter(|(w, _)| !self.verifier.metadata().meta.policy.is_coordinator(*w))
                .collect();
            let links_max = self.verifier.metadata().meta.policy.limits.links_per_record_max as usize;
            for a in c.tick(now, &heads, links_max) {
                out.push(match a {
                    CoordinatorAction::WriteRts { epoch } => Output::WriteRts { epoch },
                    CoordinatorAction::WriteSync { epoch, heads } => Output::WriteSync { epoch, heads },
                });
            }
        }
    }

    /// Data ops applied and written so far: what restarts the heads hints' Trickle.
    fn data_moves(&self) -> u64 {
        self.metrics.ops_applied.load(Ordering::Relaxed) + self.metrics.ops_written.load(Ordering::Relaxed)
    }

    /// Asks peers for this node's own writers' records (after a restart, before writing again).
    pub fn probe_own(&mut self, now: u64) -> Vec<Output> {
        let name = self.verifier.name();
        let own: Vec<u32> = self.local.iter().copied().chain(self.coordinator_writer).collect();
        own.into_iter()
            .map(|w| match self.orderer.probe(w, now) {
                OrdererAction::Repair { writer, from_seq, to_seq }
                | OrdererAction::Withholding { writer, from_seq, to_seq } => {
                    // The own chain: asked of every holder (this node is its origin).
                    Output::Publish(
                        Msg::Repair { capsule: name, writer, from_seq, to_seq, origin_only: false }.encode(),
                    )
                }
            })
            .collect()
    }

    /// Starts a `sync()` barrier. `next_seqs` are the own writers' next seqs after flushing
    /// every op put before the call. The barrier completes after two SYNCs: the first links a
    /// record each own writer wrote after the call (so the coordinator's next RTS comes after
    /// the call, and every live writer's answer to it follows every op it had accepted before
    /// the call); the second closes that next epoch, and the node has applied everything it
    /// links. A node without data writers has no post-call record to wait for: any SYNC
    /// applied after the call counts as the first, so its barrier is best effort.
    pub fn begin_sync(&mut self, next_seqs: BTreeMap<u32, u64>) -> SyncTicket {
        // Asked for at the next tick (`tick_epoch_wanted`).
        self.epoch_wanted_at = None;
        self.barriers.begin(next_seqs)
    }

    /// Whether the barrier has completed (and forgets it if so).
    pub fn sync_done(&mut self, t: &SyncTicket) -> bool {
        self.barriers.done(t)
    }

    /// Abandons a barrier (a caller that timed out).
    pub fn cancel_sync(&mut self, t: &SyncTicket) {
        self.barriers.cancel(t);
    }

    /// The barriers' step after records were applied: the newest SYNC's links all applied?
    fn check_syncs(&mut self) {
        let Some((epoch, links)) = &self.last_sync else { return };
        self.barriers.check(*epoch, self.orderer.covers(links));
    }

    fn apply(&mut self, r: &Verified<Opened>, now: u64, out: &mut Vec<Output>) {
        let h = r.record.header();
        // Only applied records are cached: a repair answer never sends a conflicting copy.
        // CapsuleDB's blocks and indexes are not: they are large, no node reads them, and the
        // capsule servers (and CapsuleDB itself, until they are durable) answer repairs for them.
        if !is_db_kind(h.kind) {
            let bytes = self.repair.cache(&r.record);
            self.metrics.repair_cache_bytes.store(bytes as u64, Ordering::Relaxed);
        }
        self.rejoin.note_head(&r.record);
        self.clock.observe(h.lamport);
        Metrics::add(&self.metrics.records_applied, 1);
        if let Some(ops) = r.body.data_ops() {
            // A node that keeps no values (a coordinator) orders and counts the ops, and
            // stores none.
            if self.cfg.keep_values {
                // The record each op came from: journaled for CapsuleDB (one Arc per record).
                let origin = (r.record.hash(), r.record.shared_bytes());
                let updates = ops.iter().map(|op| {
                    let value = match &op.action {
                        Action::Put(x) => Some(Arc::<[u8]>::from(x.as_slice())),
                        Action::Delete => None,
                    };
                    (op.key.as_slice(), Version { lamport: op.lamport, writer: h.writer }, value)
                });
                if matches!(r.body, Body::Atomic(_)) {
                    // An atomic batch: this node's readers see every op of it or none.
                    let all: Vec<crate::memtable::AtomicUpdate<'_>> = updates.collect();
                    self.memtable.apply_atomic(&all, Some(&origin));
                } else {
                    for (key, v, value) in updates {
                        self.memtable.apply_from(key, v, value, Some(&origin));
                    }
                }
            }
            Metrics::add(&self.metrics.ops_applied, ops.len() as u64);
        }
        self.after_apply(&r.record, &r.body, now, out);
    }

    /// Protocol effects of a record applied in order (remote or own).
    fn after_apply(&mut self, rec: &Record, body: &Body, now: u64, out: &mut Vec<Output>) {
        let h = rec.header();
        let policy = self.verifier.metadata().meta.policy;
        let is_coord = policy.is_coordinator(h.writer);
        // CapsuleDB's block writer never answers an RTS: the coordinator must not wait for its
        // EOE (nor link its chain in SYNCs).
        if !is_coord && !is_db_kind(h.kind) {
            if let Some(c) = &mut self.coordinator {
                c.observe_writer(h.writer);
            }
        }
        if let Some(c) = &mut self.coordinator {
            // Every record but an epoch's own (RTS, EOE, SYNC) needs an epoch to be linked
            // by a SYNC: it keeps the busy pace (see `coordinator`, "Idle epochs").
            match body {
                Body::Control { code: ControlCode::Rts, .. } if is_coord => c.on_rts(),
                Body::Control { code: ControlCode::Rts | ControlCode::Eoe, .. } => {}
                _ if h.kind == Kind::Sync => {}
                _ => c.on_activity(now),
            }
        }
        match body {
            Body::Control { code: ControlCode::Rts, payload } if is_coord => {
                if let Some(epoch) = payload_epoch(payload) {
                    if epoch > self.orderer.current_epoch() && !self.local.is_empty() {
                        // One link is reserved for the epoch's SYNC, which the author puts first.
                        let max = (policy.limits.links_per_record_max as usize).saturating_sub(1);
                        let heads: Vec<Link> = self
                            .orderer
                            .heads()
                            .into_values()
                            .filter(|l| !self.local.contains(&l.writer) && !policy.is_coordinator(l.writer))
                            .take(max)
                            .collect();
                        out.push(Output::WriteEoe { epoch, heads });
                    }
                }
            }
            Body::Control { code: ControlCode::Eoe, payload } if !is_coord => {
                for l in &h.links {
                    if let Some((writer, seq, a, b)) = self.orderer.note_link(l, now) {
                        tracing::warn!(writer, seq, %a, %b, "EOE links a record other than the one applied");
                        self.metrics.reject(RejectReason::Equivocation);
                        out.push(Output::Equivocation { writer, seq, a, b });
                    }
                }
                if let (Some(epoch), Some(c)) = (payload_epoch(payload), &mut self.coordinator) {
                    c.on_eoe(epoch, rec.link());
                }
            }
            Body::Control { code: ControlCode::Rotate, payload } => {
                // The certificate authenticates itself (the owner's signature); any writer may
                // carry it into the log, where late joiners and auditors find it.
                match RotationCert::decode(payload) {
                    Ok(cert) => {
                        let _ = self.install_rotation(&cert, None);
                    }
                    Err(e) => {
                        tracing::warn!(
                            writer = h.writer,
                            seq = h.seq,
                            "rotate record with a malformed certificate: {e}"
                        );
                        self.metrics.reject(RejectReason::Body);
                    }
                }
            }
            Body::Sync { .. } if h.kind == Kind::Sync => {
                let epoch = h.epoch;
                if epoch <= self.orderer.current_epoch() {
                    // An older or equal epoch: never accept two SYNCs for one epoch.
                    self.metrics.reject(RejectReason::StaleSync);
                    return;
                }
                self.orderer.set_epoch(epoch);
                self.metrics.epoch.store(epoch, Ordering::Relaxed);
                Metrics::add(&self.metrics.syncs_applied, 1);
                for l in &h.links {
                    if let Some((writer, seq, a, b)) = self.orderer.note_link(l, now) {
                        tracing::warn!(writer, seq, %a, %b, "SYNC links a record other than the one applied");
                        self.metrics.reject(RejectReason::Equivocation);
                        out.push(Output::Equivocation { writer, seq, a, b });
                    }
                }
                if let Some(c) = &mut self.coordinator {
                    c.on_sync(epoch, now);
                }
                out.push(Output::EnterEpoch { sync: rec.link(), epoch });
                self.last_sync = Some((epoch, h.links.clone()));
                let links = h.links.clone();
                self.barriers.on_sync(epoch, &links);
            }
            _ => {}
        }
    }

    /// Forgets all replicated state (RESET): memtable, chains, cache, barriers.
    pub fn reset(&mut self, now: u64) {
        self.memtable.clear();
        self.orderer.clear();
        self.repair.clear();
        self.barriers.clear();
        self.last_sync = None;
        self.durability.forget_barriers();
        self.flow.reset();
        if let Some(c) = &mut self.coordinator {
            c.reset(now);
        }
    }
}

/// CapsuleDB's records (`db-block`, `db-index`): ordered like any chain, never applied as ops.
fn is_db_kind(k: Kind) -> bool {
    matches!(k, Kind::DbBlock | Kind::DbIndex)
}

/// The epoch number an RTS or EOE carries (8 bytes, little-endian).
pub fn payload_epoch(p: &[u8]) -> Option<u64> {
    p.try_into().ok().map(u64::from_le_bytes)
}

/// The payload of an RTS or EOE for `epoch` (8 bytes, little-endian; see [`payload_epoch`]).
pub fn epoch_payload(epoch: u64) -> Vec<u8> {
    epoch.to_le_bytes().to_vec()
}

/// A test core running the primary coordinator `cw` on a fast epoch clock (10 ms epochs, EOEs
/// due after 5 ms).
#[cfg(test)]
pub(crate) fn coordinator_core(meta: &psl_capsule::SignedMetadata, app: &psl_crypto::AppKey, cw: u32) -> NodeCore {
    let cfg = crate::CoordinatorConfig { epoch_ms: 10, eoe_timeout_ms: 5, ..crate::CoordinatorConfig::default() };
    NodeCore::new(
        Arc::new(Verifier::new(meta.clone(), Some(app.data_key()))),
        Arc::new(Memtable::new()),
        Arc::new(LamportClock::new(0)),
        Arc::new(Metrics::default()),
        [],
        Some((cw, CoordinatorSm::new(cfg, 0))),
        NodeConfig::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule, Author, Limits};
    use psl_crypto::OwnerKey;

    fn core(owner: &OwnerKey) -> (NodeCore, Arc<Metrics>, Arc<Memtable>, psl_capsule::SignedMetadata) {
        core_with(owner, NodeConfig::default())
    }

    fn core_with(
        owner: &OwnerKey,
        cfg: NodeConfig,
    ) -> (NodeCore, Arc<Metrics>, Arc<Memtable>, psl_capsule::SignedMetadata) {
        let meta = new_capsule(owner, 1, "node-rotation", 0, Limits::default()).unwrap();
        let verifier = Arc::new(Verifier::new(meta.clone(), Some(owner.app(1).unwrap().data_key())));
        let metrics = Arc::new(Metrics::default());
        let memtable = Arc::new(Memtable::new());
        let c =
            NodeCore::new(verifier, memtable.clone(), Arc::new(LamportClock::new(0)), metrics.clone(), [], None, cfg);
        (c, metrics, memtable, meta)
    }

    fn sync_link() -> Link {
        Link { writer: psl_capsule::DEFAULT_COORDINATOR, seq: 0, hash: Hash256([3; 32]) }
    }

    #[test]
    fn precheck_refuses_and_counts_retired_key_records_before_any_signature_check() {
        let owner = OwnerKey::from_seed(&[7; 32]).unwrap();
        let (mut c, metrics, memtable, meta) = core(&owner);
        let app = owner.app(1).unwrap();
        let cert = RotationCert::issue(&owner, &meta, 1, 2, 5).unwrap();
        assert!(c.install_rotation(&cert, Some(owner.app(2).unwrap().data_key())).unwrap());
        assert_eq!(metrics.key_gen.load(Ordering::Relaxed), 1);
        let mut a = Author::new(&meta, &app, 0x10000).unwrap();
        a.enter_epoch(sync_link(), 4);
        let ok = a.write_ops([("a", Some("before"))]).unwrap();
        assert!(!c.precheck(&ok));
        a.enter_epoch(sync_link(), 5);
        let retired = a.write_ops([("b", Some("after"))]).unwrap();
        assert!(c.precheck(&retired));
        assert_eq!(metrics.rejected(RejectReason::RetiredKey), 1);
        // Even one that somehow got verified is not applied.
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let opened = v.verify_open(retired).unwrap();
        assert!(c.on_verified(opened, 0).is_empty());
        assert_eq!(metrics.rejected(RejectReason::RetiredKey), 2);
        assert!(memtable.get(b"b").is_none());
    }

    /// A certified capsule's node: the verifier has the data key and knows no writer yet.
    fn certified_core(owner: &OwnerKey) -> (NodeCore, Arc<Metrics>, Arc<Memtable>, psl_capsule::SignedMetadata) {
        let meta = psl_capsule::new_capsule_with(
            owner,
            1,
            "node-revocation",
            0,
            Limits::default(),
            psl_capsule::WriterKeys::Certified,
        )
        .unwrap();
        let verifier = Arc::new(Verifier::new(meta.clone(), Some(owner.app(1).unwrap().data_key())));
        let metrics = Arc::new(Metrics::default());
        let memtable = Arc::new(Memtable::new());
        let c = NodeCore::new(
            verifier,
            memtable.clone(),
            Arc::new(LamportClock::new(0)),
            metrics.clone(),
            [],
            None,
            NodeConfig::default(),
        );
        (c, metrics, memtable, meta)
    }

    /// The attacker holds a leaked writer key and a record it signed before the revocation, and
    /// delays it on the fabric: the record is verified (in parallel, before the node learns the
    /// revocation), then the revocation is installed, then the record reaches the core.
    #[test]
    fn adversary_a_record_verified_before_its_revocation_is_not_applied() {
        let owner = OwnerKey::from_seed(&[31; 32]).unwrap();
        let (mut c, metrics, memtable, meta) = certified_core(&owner);
        let app = owner.app(1).unwrap();
        let w = 0x10007;
        let mut a = Author::new(&meta, &app, w).unwrap();
        let cert = a.write_own_cert().unwrap().unwrap();
        let before = a.write_ops([("honest", Some("1"))]).unwrap();
        let forged = a.write_ops([("forged", Some("x"))]).unwrap();
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let (cert, before, forged) =
            (v.verify_open(cert).unwrap(), v.verify_open(before).unwrap(), v.verify_open(forged).unwrap());
        c.on_verified(cert, 0);
        c.on_verified(before, 0);
        assert!(memtable.get(b"honest").is_some());
        // The leader revokes the writer from seq 2 on (its chain's next record).
        let rev = psl_capsule::Revocation::issue(&app, meta.name(), 0, w, u64::MAX, 2).unwrap();
        assert_eq!(c.on_statements(&[KeyStatement::Revoke(rev)]), 1);
        c.on_verified(forged, 1);
        assert!(memtable.get(b"forged").is_none(), "a revoked writer's record was applied");
        assert_eq!(metrics.rejected(RejectReason::Revoked), 1);
        assert_eq!(c.orderer().next_seq(w), 2);
    }

    /// The same, through the orderer's hold-back: a later record waits for a missing one, the
    /// revocation arrives, then the missing one: only what the revocation allows is applied, and
    /// the refused record is dropped from the hold.
    #[test]
    fn adversary_a_held_record_released_after_its_revocation_is_not_applied() {
        let owner = OwnerKey::from_seed(&[32; 32]).unwrap();
        let (mut c, metrics, memtable, meta) = certified_core(&owner);
        let app = owner.app(1).unwrap();
        let w = 0x10008;
        let mut a = Author::new(&meta, &app, w).unwrap();
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let cert = v.verify_open(a.write_own_cert().unwrap().unwrap()).unwrap();
        let one = v.verify_open(a.write_ops([("one", Some("1"))]).unwrap()).unwrap();
        let two = v.verify_open(a.write_ops([("two", Some("2"))]).unwrap()).unwrap();
        let three = v.verify_open(a.write_ops([("three", Some("3"))]).unwrap()).unwrap();
        c.on_verified(cert, 0);
        c.on_verified(three, 0);
        c.on_verified(two, 0);
        assert_eq!(c.orderer().held_total(), 2, "seq 2 and 3 wait for seq 1");
        let rev = psl_capsule::Revocation::issue(&app, meta.name(), 0, w, u64::MAX, 3).unwrap();
        c.add_announcement(KeyStatement::Revoke(rev)).unwrap();
        assert_eq!(c.orderer().held_total(), 1, "the revoked seq 3 left the hold at once");
        c.on_verified(one, 1);
        assert!(memtable.get(b"one").is_some());
        assert!(memtable.get(b"two").is_some());
        assert!(memtable.get(b"three").is_none(), "a held record was applied after its revocation");
        assert_eq!(metrics.rejected(RejectReason::Revoked), 1);
        assert_eq!(c.orderer().held_total(), 0);
        assert!(!c.orderer().has_gaps(), "no repair is asked for a revoked record");
    }

    #[test]
    fn rotate_record_installs_the_certificate_and_a_forged_one_is_counted() {
        let owner = OwnerKey::from_seed(&[8; 32]).unwrap();
        let thief = OwnerKey::from_seed(&[9; 32]).unwrap();
        let (mut c, metrics, _, meta) = core(&owner);
        let app = owner.app(1).unwrap();
        let mut a = Author::new(&meta, &app, 0x10000).unwrap();
        // A certificate that is not the owner's: applied as a record, refused as a rotation.
        let mut forged =
            RotationCert::issue(&thief, &new_capsule(&thief, 1, "x", 0, Limits::default()).unwrap(), 1, 2, 9).unwrap();
        forged.capsule = meta.name();
        let body = Body::Control { code: ControlCode::Rotate, payload: forged.encode() };
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let rec = a.write_control(body, vec![]).unwrap();
        c.on_verified(v.verify_open(rec).unwrap(), 0);
        assert_eq!(c.verifier.key_gen_newest(), 0);
        assert_eq!(metrics.rejected(RejectReason::KeyGeneration), 1);
        // The owner's certificate in a Rotate record installs the new generation's public key.
        let cert = RotationCert::issue(&owner, &meta, 1, 2, 9).unwrap();
        let body = Body::Control { code: ControlCode::Rotate, payload: cert.encode() };
        let rec = a.write_control(body, vec![]).unwrap();
        c.on_verified(v.verify_open(rec).unwrap(), 0);
        assert_eq!(c.verifier.rotation_certs(), vec![cert]);
        assert_eq!(metrics.key_gen.load(Ordering::Relaxed), 1);
        // Garbage in a Rotate record is counted, nothing installed.
        let rec = a.write_control(Body::Control { code: ControlCode::Rotate, payload: vec![1, 2, 3] }, vec![]).unwrap();
        c.on_verified(v.verify_open(rec).unwrap(), 0);
        assert_eq!(metrics.rejected(RejectReason::Body), 1);
        assert_eq!(c.verifier.key_gen_newest(), 1);
    }

    /// Records published as record messages among `out`, as (writer, seq).
    fn published_records(out: &[Output], limits: &Limits) -> Vec<(u32, u64)> {
        out.iter()
            .filter_map(|o| match o {
                Output::Publish(b) => match Msg::decode(b) {
                    Ok(Msg::Record { bytes, .. }) => {
                        Record::decode(&bytes, limits).ok().map(|r| (r.header().writer, r.header().seq))
                    }
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    #[test]
    fn db_records_are_ordered_but_not_cached_and_own_ones_extend_their_chain() {
        let owner = OwnerKey::from_seed(&[10; 32]).unwrap();
        let (mut c, _, memtable, meta) = core(&owner);
        let app = owner.app(1).unwrap();
        let limits = meta.meta.policy.limits;
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        // Another node's CapsuleDB block and a worker's data record.
        let mut db = Author::new(&meta, &app, 0x20000).unwrap();
        let mut wr = Author::new(&meta, &app, 0x30000).unwrap();
        c.on_verified(v.verify_open(db.write_body(Body::DbBlock(vec![1, 2, 3])).unwrap()).unwrap(), 0);
        c.on_verified(v.verify_open(wr.write_ops([(b"k".to_vec(), Some(b"v".to_vec()))]).unwrap()).unwrap(), 0);
        assert_eq!(c.orderer().next_seq(0x20000), 1, "the block is ordered");
        assert_eq!(memtable.len(), 1, "only the data op is applied");
        // A repair request for both: only the data record is served (blocks are not cached).
        c.on_repair(0x20000, 0, 0);
        c.on_repair(0x30000, 0, 0);
        let out = c.on_tick(1);
        assert_eq!(published_records(&out, &limits), vec![(0x30000, 0)]);
        // Own db records: published, the writer becomes local (acks count); one that skips a
        // seq is refused.
        let mut own = Author::new(&meta, &app, 0x40000).unwrap();
        let r0 = own.write_body(Body::DbIndex(vec![9])).unwrap();
        let r1 = own.write_body(Body::DbBlock(vec![8])).unwrap();
        let r2 = own.write_body(Body::DbIndex(vec![7])).unwrap();
        assert_eq!(published_records(&c.on_own_record(&r0, 2), &limits), vec![(0x40000, 0)]);
        assert!(c.local_writers().contains(&0x40000));
        assert!(c.on_own_record(&r2, 3).is_empty(), "seq 2 does not extend seq 0");
        assert_eq!(published_records(&c.on_own_record(&r1, 4), &limits), vec![(0x40000, 1)]);
        assert_eq!(c.orderer().next_seq(0x40000), 2);
    }

    #[test]
    fn coordinator_neither_waits_for_nor_links_a_db_writer() {
        let owner = OwnerKey::from_seed(&[11; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "node-db-coord", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let cw = meta.meta.policy.coordinator_at(0).unwrap();
        let mut c = coordinator_core(&meta, &app, cw);
        let mut db = Author::new(&meta, &app, 0x20000).unwrap();
        let mut wr = Author::new(&meta, &app, 0x30000).unwrap();
        c.on_verified(v.verify_open(db.write_body(Body::DbBlock(vec![1])).unwrap()).unwrap(), 0);
        c.on_verified(v.verify_open(wr.write_ops([(b"k".to_vec(), Some(b"v".to_vec()))]).unwrap()).unwrap(), 0);
        // RTS, then (no EOE arrives) the SYNC at the EOE deadline: it links the data writer only.
        let mut sync = None;
        for now in (0..200).step_by(5) {
            for o in c.on_tick(now) {
                if let Output::WriteSync { heads, .. } = o {
                    sync.get_or_insert(heads);
                }
            }
        }
        let heads = sync.expect("a SYNC was due");
        assert_eq!(heads.iter().map(|l| l.writer).collect::<Vec<_>>(), vec![0x30000]);
    }

    #[test]
    fn a_node_that_keeps_no_values_orders_counts_and_serves_records_but_stores_none() {
        let owner = OwnerKey::from_seed(&[12; 32]).unwrap();
        let (mut c, metrics, memtable, meta) =
            core_with(&owner, NodeConfig { keep_values: false, ..Default::default() });
        let app = owner.app(1).unwrap();
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        let mut wr = Author::new(&meta, &app, 0x30000).unwrap();
        for i in 0..3u8 {
            let rec = wr.write_ops([(vec![b'k', i], Some(vec![i; 10])), (vec![b'j', i], None)]).unwrap();
            c.on_verified(v.verify_open(rec).unwrap(), 0);
        }
        assert_eq!(c.orderer().next_seq(0x30000), 3, "every record is ordered");
        assert_eq!(metrics.ops_applied.load(Ordering::Relaxed), 6, "and its ops counted");
        assert_eq!(memtable.len(), 0, "no value is kept");
        c.on_repair(0x30000, 0, 2);
        let out = c.on_tick(1);
        assert_eq!(published_records(&out, &meta.meta.policy.limits), vec![(0x30000, 0), (0x30000, 1), (0x30000, 2)]);
    }

    #[test]
    fn the_repair_cache_keeps_to_its_byte_bound_by_evicting_the_oldest() {
        let owner = OwnerKey::from_seed(&[13; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "node-rotation", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let mut wr = Author::new(&meta, &app, 0x30000).unwrap();
        let recs: Vec<Record> =
            (0..10u8).map(|i| wr.write_ops([(vec![b'k', i], Some(vec![i; 200]))]).unwrap()).collect();
        let one = recs[0].bytes().len();
        // Room for three and a half records: the newest three stay.
        let bound = one * 7 / 2;
        let (mut c, metrics, memtable, _) =
            core_with(&owner, NodeConfig { cache_bytes_max: bound, ..Default::default() });
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        for r in &recs {
            c.on_verified(v.verify_open(r.clone()).unwrap(), 0);
            let held = metrics.repair_cache_bytes.load(Ordering::Relaxed) as usize;
            assert!(held <= bound, "the cache holds {held} bytes, over its bound of {bound}");
        }
        assert_eq!(memtable.len(), 10, "eviction from the cache does not touch the memtable");
        let sizes: usize = recs[7..].iter().map(|r| r.bytes().len()).sum();
        assert_eq!(metrics.repair_cache_bytes.load(Ordering::Relaxed) as usize, sizes);
        c.on_repair(0x30000, 0, 9);
        let out = c.on_tick(1);
        assert_eq!(
            published_records(&out, &meta.meta.policy.limits),
            vec![(0x30000, 7), (0x30000, 8), (0x30000, 9)],
            "only the newest records are served from the cache"
        );
    }

    #[test]
    fn a_first_repair_request_is_answered_by_the_records_writer_only_and_a_second_by_every_holder() {
        let owner = OwnerKey::from_seed(&[15; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "node-rotation", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let mut wr = Author::new(&meta, &app, 0x30000).unwrap();
        let recs: Vec<Record> = (0..3u8).map(|i| wr.write_ops([(vec![b'k', i], Some(vec![i; 20]))]).unwrap()).collect();
        let (mut c, _, _, _) = core_with(&owner, NodeConfig::default());
        let v = Verifier::new(meta.clone(), Some(app.data_key()));
        for r in &recs {
            c.on_verified(v.verify_open(r.clone()).unwrap(), 0);
        }
        let ask =
            |origin_only| Msg::Repair { capsule: meta.name(), writer: 0x30000, from_seq: 0, to_seq: 2, origin_only };
        // This node holds the records but did not write them: it leaves a first try to their writer.
        c.on_message(ask(true));
        assert!(published_records(&c.on_tick(1), &meta.meta.policy.limits).is_empty());
        c.on_message(ask(false));
        assert_eq!(published_records(&c.on_tick(2), &meta.meta.policy.limits).len(), 3);

        // The requester's side: the first request at a seq is origin-only, a repeat is not, and
        // after a repeat the writer's requests go to every holder for a while.
        let mut o: Orderer<Verified<Opened>> = Orderer::new(OrdererConfig::default());
        o.note_link(&Link { writer: 0x30000, seq: 9, hash: Hash256([1; 32]) }, 0);
        assert!(o.first_ask(0x30000, 0, 100));
        assert!(!o.first_ask(0x30000, 0, 250), "no answer from the origin: ask everyone");
        assert!(!o.first_ask(0x30000, 5, 300), "the origin stays skipped for a while");
        assert!(o.first_ask(0x30000, 6, 250 + crate::orderer::ORIGIN_QUIET_MS));
        assert!(!o.first_ask(0x40000, 0, 0), "an unknown writer is asked of everyone");
    }

    #[test]
    fn tagged_peer_hints_pace_own_writers_while_near_and_moving() {
        let owner = OwnerKey::from_seed(&[16; 32]).unwrap();
        let meta = new_capsule(&owner, 1, "node-rotation", 0, Limits::default()).unwrap();
        let app = owner.app(1).unwrap();
        let w = 0x10000;
        let verifier = Arc::new(Verifier::new(meta.clone(), Some(app.data_key())));
        let cfg = NodeConfig { peer_id: 99, ..NodeConfig::default() };
        let mut c = NodeCore::new(
            verifier,
            Arc::new(Memtable::new()),
            Arc::new(LamportClock::new(0)),
            Arc::new(Metrics::default()),
            [w],
            None,
            cfg,
        );
        let mut a = Author::new(&meta, &app, w).unwrap();
        for i in 0..10u8 {
            c.on_local_data(a.write_ops([(vec![b'k', i], Some(vec![i]))]).unwrap(), 1, 0);
        }
        let hint = |sender, seq| Msg::Heads { capsule: meta.name(), heads: vec![(w, seq), (0x20000, 3)], sender };
        // This node tags its own hints: between full hints, the heads that moved.
        let sent: Vec<Msg> = c
            .on_tick(100)
            .into_iter()
            .filter_map(|o| match o {
                Output::Publish(b) => Msg::decode(&b).ok(),
                _ => None,
            })
            .collect();
        assert!(sent.iter().any(|m| matches!(m, Msg::Heads { sender: Some(99), heads, .. } if heads == &vec![(w, 9)])));
        assert_eq!(c.flow_next(w, 1000, 0, 64), 10, "no peer yet: everything applied is released");
        c.on_message(hint(Some(7), 4));
        c.on_message(hint(None, 1)); // untagged (a capsule server's): not a peer
        c.on_message(hint(Some(99), 0)); // this node's own id: ignored
        c.on_message(hint(Some(8), 30)); // a peer that claims to be ahead never holds a writer
        assert_eq!(c.flow_next(w, 1000, 0, 64), 5, "peer 7 applied seqs 0..=4");
        assert_eq!(c.flow_next(w, 1000, 0, 4), 10, "too far behind to pace");
        c.on_tick(1_050);
        assert_eq!(c.flow_next(w, 1000, 0, 64), 5);
        c.on_tick(1_100);
        assert_eq!(c.flow_next(w, 1000, 0, 64), 10, "silent for a stall: no longer pacing");
        c.on_message(hint(Some(7), 6));
        assert_eq!(c.flow_next(w, 1000, 0, 64), 7, "moving again: pacing again");
        assert_eq!(c.flow_next(w, 1000, 2, 64), 9, "with slack, two records beyond the hint");
        assert_eq!(c.flow_next(w, 1000, 5, 64), 10, "never beyond what this node applied");
        // At most PEERS_MAX peers: the one silent longest is forgotten.
        for id in 1_000..1_000 + PEERS_MAX as u64 {
            c.on_message(hint(Some(id), 8));
        }
        assert_eq!(c.peers_tracked(), PEERS_MAX);
        // A forged hint at the last seq is taken without overflow, and holds no writer back.
        let before = c.flow_next(w, 1000, 0, 64);
        c.on_message(hint(Some(2_000), u64::MAX));
        assert_eq!(c.flow_next(w, 1000, 0, 64), before);
    }

    #[test]
    fn acks_reach_a_node_without_servers_harmlessly_and_count_against_one_that_has_fewer() {
        let owner = OwnerKey::from_seed(&[14; 32]).unwrap();
        let app = owner.app(1).unwrap();
        let w = crate::server_writer(5).unwrap();
        let (mut c, metrics, _, meta) = core(&owner);
        let e = crate::wire::AckEntry { writer: 0x10000, from_seq: 0, to_seq: 0, hash: Hash256([1; 32]) };
        let ack = crate::wire::Ack::sign(meta.name(), w, vec![e], &app.writer(w).unwrap());
        c.on_ack(ack.clone());
        c.on_tick(10);
        assert_eq!(metrics.rejected(RejectReason::Writer), 0, "a node that waits for no server ignores acks");
        let (mut c, metrics, _, _) = core_with(&owner, NodeConfig { servers: 3, ..Default::default() });
        c.on_ack(ack);
        c.on_tick(10);
        assert_eq!(metrics.rejected(RejectReason::Writer), 1, "server 5 is not one of this node's 3");
    }

    #[test]
    fn a_reset_never_answers_a_waiting_durable_sync_as_done() {
        let owner = OwnerKey::generate();
        let (mut core, _m, _t, _meta) = core_with(&owner, NodeConfig { servers: 3, ..NodeConfig::default() });
        // Five records of an own writer to make durable.
        let t = core.begin_durable(BTreeMap::from([(0x30000, 5)]));
        assert!(core.durable_proof(&t).is_err(), "no server acked yet");
        // A RESET forgets every barrier; the caller still waiting must not hear "durable".
        core.reset(0);
        assert!(!core.durable_status(&t).done(), "a forgotten barrier counted as done");
        let st = core.durable_proof(&t).expect_err("a forgotten barrier has no proof");
        assert!(!st.done(), "{st:?}");
    }
}
