//! [`ServerCore`]: one capsule server's protocol logic, single-threaded, deterministic, no I/O.
//!
//! Inputs: verified records (the verifier runs elsewhere, in parallel; it needs no data key),
//! fabric messages (repair requests, heads hints), ticks, and the outcome of each group commit.
//! Outputs: messages to publish, ranges of the store to serve, and batches to persist.
//!
//! The rule that matters: an ack is built only from a [`Synced`] proof, which only the disk
//! layer ([`crate::disk`]) makes, after the `fsync` of the batch that
//! [`ServerCore::take_batch`] handed out returned successfully. [`ServerCore::on_synced`] takes
//! that proof; re-acks repeat durable heads under the newest one. Without a `Synced` there is
//! no ack, so none can precede its fsync.

use crate::disk::medium::Synced;
use psl_capsule::{KeyStatement, Kind, Link, Record, Verified, Verifier};
use psl_crypto::{Hash256, SigningKey};
use psl_scl::wire::ACK_ENTRIES_MAX;
use psl_scl::{Ack, AckEntry, Msg, Orderer, OrdererConfig};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// How many applied hashes a capsule server's orderer keeps per writer (its
/// `OrdererConfig::chain_window`, the default in [`ServerConfig`]): 4096 hashes, 128 KiB a
/// writer, where keeping every one cost 32 bytes a record for ever (320 MB at 10 million
/// records). The store holds the whole chain; the orderer needs hashes only to tell a copy from
/// an equivocation, and what names a seq names a recent one: SYNC and EOE links name heads of
/// the last epochs, a writer has at most `window_records` (1024) records in flight, and repairs
/// ask for up to `repair_chunk` (512) seqs from a receiver's next seq. An older record is
/// refused as a duplicate without a comparison (its slot is durable already), so the server
/// reports equivocation evidence only within these newest 4096 seqs of each writer.
pub const SERVER_CHAIN_WINDOW: usize = 4096;

/// The tunables of a [`ServerCore`]: ordering, group-commit and backlog bounds, repair
/// answering, anti-entropy and re-ack intervals (milliseconds where named `_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Per-writer ordering, hold-back and gap repair (the same engine as a node's; by default
    /// keeping only the newest [`SERVER_CHAIN_WINDOW`] applied hashes per writer).
    pub orderer: OrdererConfig,
    /// Most records in one group commit (one write, one fsync).
    pub batch_records_max: usize,
    /// Records ordered but not yet persisted; at the bound the runtime stops taking input.
    pub ready_records_max: usize,
    /// Most records served (repair answers) per tick.
    pub answers_per_tick: usize,
    /// Most pending repair requests (oldest dropped).
    pub answering_max: usize,
    /// How often the server publishes its durable heads (anti-entropy) while they move.
    pub heads_interval_ms: u64,
    /// The longest wait between two heads hints: while nothing new is durable, the wait
    /// doubles from `heads_interval_ms` up to this (Trickle, as a node's:
    /// `psl_scl::NodeConfig::heads_idle_ms`).
    pub heads_idle_ms: u64,
    /// Most repair requests per tick caused by peers' heads hints.
    pub hint_requests_per_tick: usize,
    /// How soon acks are first repeated for writers whose durable head moved recently (acks
    /// travel on a lossy fabric); each repeat after that waits twice as long as the one
    /// before, until the head moves again.
    pub reack_interval_ms: u64,
    /// How recently a writer's durable head must have moved for its ack to be repeated.
    pub reack_window_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            orderer: OrdererConfig { chain_window: Some(SERVER_CHAIN_WINDOW), ..OrdererConfig::default() },
            batch_records_max: 4096,
            ready_records_max: 65_536,
            answers_per_tick: 1024,
            answering_max: 1024,
            heads_interval_ms: 250,
            heads_idle_ms: psl_scl::node::HEADS_IDLE_MS_DEFAULT,
            hint_requests_per_tick: 64,
            reack_interval_ms: 200,
            reack_window_ms: 5_000,
        }
    }
}

/// Something the server's runtime must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send these bytes on the fabric.
    Publish(Vec<u8>),
    /// Read writer `writer`'s records `from_seq ..= to_seq` (all durable) from the store and
    /// publish each as a record message.
    Serve {
        /// The writer whose records to serve.
        writer: u32,
        /// First seq to serve.
        from_seq: u64,
        /// Last seq to serve (inclusive).
        to_seq: u64,
    },
    /// A writer's records could not be obtained for `withholding_after_ms`.
    Withholding {
        /// The writer whose records are missing.
        writer: u32,
        /// First seq of the gap.
        from_seq: u64,
        /// Last seq of the gap (inclusive).
        to_seq: u64,
    },
    /// Two different signed records for one (writer, seq).
    Equivocation {
        /// The writer that signed both.
        writer: u32,
        /// The slot both claim.
        seq: u64,
        /// Hash of the record known first.
        a: Hash256,
        /// Hash of the conflicting record.
        b: Hash256,
    },
    /// A group commit failed: nothing more is acked; the runtime must stop (a restart reopens
    /// and re-verifies the store).
    Fatal(String),
}

/// Counters (plain numbers; the runtime copies them out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Records whose signature verified and that were handed to the orderer.
    pub records_verified: u64,
    /// Records refused: failed verification, revoked or retired key, dropped by the orderer,
    /// uncertified past the wait, or revoked between ordering and their group commit.
    pub records_rejected: u64,
    /// Records dropped because the server already stored, ordered or held them.
    pub duplicates: u64,
    /// Records held back until the records before them in their writer's chain arrive.
    pub records_held: u64,
    /// Records written and fsync'd by group commits.
    pub records_persisted: u64,
    /// Group commits completed (one write and one fsync each).
    pub commits: u64,
    /// Ack messages published (first acks and re-acks).
    pub acks_sent: u64,
    /// Repair requests published for gaps in a writer's chain.
    pub repair_requests_sent: u64,
    /// Records handed to the runtime to serve in answer to repair requests.
    pub records_served: u64,
    /// Records refused because they claim a capsule server's writer index.
    pub server_range_refused: u64,
    /// Gaps reported as withholding ([`Output::Withholding`]).
    pub withholding_reports: u64,
    /// Pairs of different signed records found for one (writer, seq).
    pub equivocations: u64,
    /// Records refused because their writer's certificate never came (certified capsules).
    pub uncertified: u64,
    /// Key statements (certificates, revocations) refused from the fabric.
    pub statements_refused: u64,
}

impl ServerStats {
    /// The counters as Prometheus text (`psl_server_*_total`), what `--metrics` serves.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::new();
        psl_scl::metrics::render_counters(
            &mut out,
            "psl_server",
            &[
                ("records_verified", "records verified and handed to the orderer", self.records_verified),
                (
                    "records_rejected",
                    "records refused (verification, revoked or retired key, orderer)",
                    self.records_rejected,
                ),
                ("duplicates", "records dropped as already stored, ordered or held", self.duplicates),
                ("records_held", "records held back until their chain's earlier records arrive", self.records_held),
                ("records_persisted", "records written and fsync'd by group commits", self.records_persisted),
                ("commits", "group commits (one write and one fsync each)", self.commits),
                ("acks_sent", "ack messages published", self.acks_sent),
                ("repair_requests_sent", "repair requests published for gaps", self.repair_requests_sent),
                ("records_served", "records served in answer to repair requests", self.records_served),
                (
                    "server_range_refused",
                    "records refused for claiming a server's writer index",
                    self.server_range_refused,
                ),
                ("withholding_reports", "gaps reported as withholding", self.withholding_reports),
                ("equivocations", "pairs of different signed records found for one (writer, seq)", self.equivocations),
                ("uncertified", "records refused because their writer's certificate never came", self.uncertified),
                ("statements_refused", "key statements refused from the fabric", self.statements_refused),
            ],
        );
        out
    }
}

/// One capsule server's protocol state machine: orders verified records, hands out batches
/// for group commit, acks what a [`Synced`] proof covers, answers repairs, exchanges heads.
pub struct ServerCore {
    verifier: Arc<Verifier>,
    key: SigningKey,
    /// This server's writer index (its key's child index).
    me: u32,
    cfg: ServerConfig,
    orderer: Orderer<Verified<Record>>,
    ready: VecDeque<Verified<Record>>,
    /// Summary of the batch handed out and not yet persisted: writer -> (from, to, hash of to).
    in_flight: Option<BTreeMap<u32, (u64, u64, Hash256)>>,
    /// The writers of the batch in flight with a record other than an epoch's (RTS, EOE,
    /// SYNC): the ones whose acks are repeated (`changed`), since someone may wait for them.
    in_flight_data: BTreeSet<u32>,
    /// How many batches with such a record were persisted: the heads hints' Trickle starts
    /// over when it moves.
    data_batches: u64,
    /// What is on disk, fsync'd: writer -> (next seq, hash of the newest).
    durable: BTreeMap<u32, (u64, Hash256)>,
    /// When each writer's durable head last moved (for re-acks).
    changed: BTreeMap<u32, u64>,
    answering: VecDeque<(u32, u64, u64)>,
    hinted: BTreeMap<u32, u64>,
    last_heads_at: Option<u64>,
    /// The current wait between heads hints, and `data_batches` at the last.
    heads_every_ms: u64,
    heads_persisted: u64,
    last_reack_at: u64,
    /// The current wait between re-acks (doubling from `reack_interval_ms`).
    reack_every_ms: u64,
    /// Newest SYNC ordered: (epoch, link).
    latest_sync: Option<(u64, Link)>,
    /// The newest sync's proof: every head in `durable` that an ack names was made durable
    /// by it or an earlier sync (a sync covers everything written before it).
    synced: Option<Synced>,
    failed: Option<String>,
    /// The core's counters, updated as it goes.
    pub stats: ServerStats,
    /// This server's own certificate (a certified capsule), announced at start and repeated
    /// (`psl_scl::announce`): servers write no records, so nodes learn the key
    /// that signs its acks this way.
    announce: psl_scl::announce::Announcer,
}

impl std::fmt::Debug for ServerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerCore(server={}, writers={})", self.me, self.durable.len())
    }
}

impl ServerCore {
    /// `me` is the server's writer index (`psl_scl::server_writer(id)`), `key` its signing key.
    pub fn new(verifier: Arc<Verifier>, key: SigningKey, me: u32, cfg: ServerConfig) -> ServerCore {
        ServerCore {
            verifier,
            key,
            me,
            cfg,
            orderer: Orderer::new(cfg.orderer),
            ready: VecDeque::new(),
            in_flight: None,
            in_flight_data: BTreeSet::new(),
            data_batches: 0,
            durable: BTreeMap::new(),
            changed: BTreeMap::new(),
            answering: VecDeque::new(),
            hinted: BTreeMap::new(),
            last_heads_at: None,
            heads_every_ms: cfg.heads_interval_ms,
            heads_persisted: 0,
            last_reack_at: 0,
            reack_every_ms: cfg.reack_interval_ms,
            latest_sync: None,
            synced: None,
            failed: None,
            stats: ServerStats::default(),
            announce: psl_scl::announce::Announcer::new(),
        }
    }

    /// Sets the statements this server announces (its own certificate), installing them too.
    pub fn set_announcements(&mut self, statements: Vec<KeyStatement>) {
        for (writer, e) in self.verifier.install_own(&statements) {
            tracing::error!(writer, "own certificate refused: {e}");
        }
        self.announce.set(statements);
    }

    /// At start: what the store already holds (re-verified when it was opened) is durable.
    /// The writer's stored chain is `next_seq` records long; `tail` holds the hashes of its
    /// newest records, oldest first, ending at seq `next_seq - 1`: at least
    /// [`ServerCore::adopt_tail_len`] of them (all, for a shorter chain). `epoch` is the newest
    /// record's epoch. A writer already known, an empty chain or an empty tail adopts nothing.
    pub fn adopt(&mut self, writer: u32, next_seq: u64, tail: &[Hash256], epoch: u64, now: u64) {
        if let Some(last) = tail.last() {
            if self.orderer.adopt(writer, next_seq, tail, epoch, now) {
                self.durable.insert(writer, (next_seq, *last));
            }
        }
    }

    /// How many of a chain's newest hashes [`ServerCore::adopt`] wants: the orderer's
    /// `chain_window` (at least 1, the head), or every one (`usize::MAX`) without a window.
    pub fn adopt_tail_len(&self) -> usize {
        self.cfg.orderer.chain_window.map_or(usize::MAX, |w| w.max(1))
    }

    /// At start: the newest SYNC in the store.
    pub fn adopt_sync(&mut self, epoch: u64, link: Link) {
        if self.latest_sync.is_none_or(|(e, _)| epoch > e) {
            self.latest_sync = Some((epoch, link));
        }
    }

    /// This server's writer index (the one its acks are signed under).
    pub fn server_writer(&self) -> u32 {
        self.me
    }

    /// The verifier (public keys, certificates, rotations) records are checked with.
    pub fn verifier(&self) -> &Arc<Verifier> {
        &self.verifier
    }

    /// The per-writer orderer (chain order, held-back records, gaps).
    pub fn orderer(&self) -> &Orderer<Verified<Record>> {
        &self.orderer
    }

    /// What is durable: writer -> (next seq, hash of the newest record).
    pub fn durable(&self) -> &BTreeMap<u32, (u64, Hash256)> {
        &self.durable
    }

    /// The newest SYNC this server has ordered (not necessarily persisted yet).
    pub fn latest_sync(&self) -> Option<(u64, Link)> {
        self.latest_sync
    }

    /// Whether the runtime should stop taking input until batches are persisted.
    pub fn congested(&self) -> bool {
        self.ready.len() >= self.cfg.ready_records_max
    }

    /// Why a group commit failed, if one did (the core then acks nothing more).
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Before spending a signature check: drop records already stored, ordered or held, and
    /// records claiming a server's writer index. Returns `true` if dropped.
    pub fn precheck(&mut self, rec: &Record) -> bool {
        if psl_scl::server_id(rec.header().writer).is_some() {
            self.stats.server_range_refused += 1;
            return true;
        }
        if self.orderer.known(rec).is_some() {
            self.stats.duplicates += 1;
            return true;
        }
        false
    }

    /// A record failed verification (or decoding): it is never stored.
    pub fn on_rejected(&mut self) {
        self.stats.records_rejected += 1;
    }

    /// A verified record: order it; whatever becomes ready in chain order waits for the next
    /// group commit.
    pub fn on_verified(&mut self, rec: Verified<Record>, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        if psl_scl::server_id(rec.header().writer).is_some() {
            self.stats.server_range_refused += 1;
            return out;
        }
        self.stats.records_verified += 1;
        // Verified in parallel, possibly before this server learnt a revocation of its writer
        // (or a rotation retiring its key): checked again before it is held, stored or acked.
        let verifier = &self.verifier;
        let recheck = |r: &Record| verifier.recheck(r.header()).err().map(|e| psl_scl::RejectReason::from_verifier(&e));
        let d = self.orderer.deliver(rec, now, recheck);
        if d.rejected.is_some_and(|r| matches!(r, psl_scl::RejectReason::Revoked | psl_scl::RejectReason::RetiredKey)) {
            self.stats.records_rejected += 1;
        }
        self.stats.records_rejected += d.dropped.len() as u64;
        if d.rejected.is_some_and(|r| r == psl_scl::RejectReason::Duplicate) {
            self.stats.duplicates += 1;
        }
        if d.held {
            self.stats.records_held += 1;
        }
        for (writer, seq, a, b) in d.conflicts {
            tracing::warn!(writer, seq, %a, %b, "equivocation: two signed records for one slot");
            self.stats.equivocations += 1;
            out.push(Output::Equivocation { writer, seq, a, b });
        }
        for r in d.ready {
            let h = r.header();
            // A SYNC (or EOE) names records that exist: note them so gaps get repaired, and so
            // a record other than the one named is caught.
            if !h.links.is_empty() && (h.kind == Kind::Sync || h.kind == Kind::Control) {
                for l in &h.links {
                    if let Some((writer, seq, a, b)) = self.orderer.note_link(l, now) {
                        self.stats.equivocations += 1;
                        out.push(Output::Equivocation { writer, seq, a, b });
                    }
                }
            }
            if h.kind == Kind::Sync && self.latest_sync.is_none_or(|(e, _)| h.epoch > e) {
                self.latest_sync = Some((h.epoch, r.link()));
            }
            self.ready.push_back(r);
        }
        out
    }

    /// The next group commit: records in chain order per writer, at most `batch_records_max`.
    /// `None` while a batch is in flight, after a failure, or with nothing to write.
    pub fn take_batch(&mut self) -> Option<Vec<Verified<Record>>> {
        if self.in_flight.is_some() || self.failed.is_some() || self.ready.is_empty() {
            return None;
        }
        let n = self.ready.len().min(self.cfg.batch_records_max.max(1));
        // Ordered, but not stored yet: a revocation learnt since refuses them here, so nothing
        // it covers is stored or acked. Within one writer and key generation a revocation
        // refuses a suffix of the chain, so what is stored still extends each chain.
        let verifier = &self.verifier;
        let before = n;
        let batch: Vec<Verified<Record>> =
            self.ready.drain(..n).filter(|r| verifier.recheck(r.header()).is_ok()).collect();
        self.stats.records_rejected += (before - batch.len()) as u64;
        if batch.is_empty() {
            return None;
        }
        let mut summary: BTreeMap<u32, (u64, u64, Hash256)> = BTreeMap::new();
        self.in_flight_data.clear();
        for r in &batch {
            let h = r.header();
            if !matches!(h.kind, psl_capsule::Kind::Sync | psl_capsule::Kind::Control) {
                self.in_flight_data.insert(h.writer);
            }
            let e = summary.entry(h.writer).or_insert((h.seq, h.seq, r.hash()));
            e.1 = h.seq;
            e.2 = r.hash();
        }
        self.in_flight = Some(summary);
        Some(batch)
    }

    /// The batch from [`ServerCore::take_batch`] is durable: `synced` is the disk layer's proof
    /// that the fsync covering it returned `Ok` (`records` is what the write took). Then, and
    /// only then, the batch is acked.
    pub fn on_synced(&mut self, synced: Synced, records: usize, now: u64) -> Vec<Output> {
        let Some(summary) = self.in_flight.take() else { return Vec::new() };
        self.stats.records_persisted += records as u64;
        self.stats.commits += 1;
        let mut entries = Vec::with_capacity(summary.len());
        let data = std::mem::take(&mut self.in_flight_data);
        if !data.is_empty() {
            self.data_batches += 1;
            // Repeats start over: the first one after `reack_interval_ms`.
            if self.reack_every_ms != self.cfg.reack_interval_ms {
                self.last_reack_at = now;
            }
            self.reack_every_ms = self.cfg.reack_interval_ms;
        }
        for (w, (from, to, hash)) in summary {
            self.durable.insert(w, (to + 1, hash));
            // An epoch record's ack is not repeated: nobody waits for it (flow windows and
            // durable syncs count data), and the next ack of the chain covers it.
            if data.contains(&w) {
                self.changed.insert(w, now);
            }
            entries.push(AckEntry { writer: w, from_seq: from, to_seq: to, hash });
        }
        let out = self.acks(&entries, &synced);
        self.stats.acks_sent += out.len() as u64;
        self.synced = Some(synced);
        out
    }

    /// The write or the sync of the batch from [`ServerCore::take_batch`] failed: nothing more
    /// is acked (the runtime must stop; a restart reopens and re-verifies the store).
    pub fn on_commit_failed(&mut self, e: String) -> Vec<Output> {
        if self.in_flight.take().is_none() {
            return Vec::new();
        }
        tracing::error!("group commit failed, no more acks until restart: {e}");
        self.failed = Some(e.clone());
        vec![Output::Fatal(e)]
    }

    /// The server's ack messages for `entries`: the one place it signs acks, and it needs the
    /// proof that what they name is durable.
    fn acks(&self, entries: &[AckEntry], _synced: &Synced) -> Vec<Output> {
        let name = self.verifier.name();
        entries
            .chunks(ACK_ENTRIES_MAX)
            .map(|c| Output::Publish(Msg::Ack(Ack::sign(name, self.me, c.to_vec(), &self.key)).encode()))
            .collect()
    }

    /// A message from the fabric that is not a record.
    pub fn on_message(&mut self, msg: Msg) {
        let name = self.verifier.name();
        match msg {
            // A server never wrote the records: it answers only a request to every holder.
            Msg::Repair { capsule, writer, from_seq, to_seq, origin_only: false } if capsule == name => {
                let to = to_seq.min(from_seq.saturating_add(self.cfg.orderer.repair_chunk.max(1) - 1));
                if !self.answering.contains(&(writer, from_seq, to)) {
                    self.answering.push_back((writer, from_seq, to));
                }
                while self.answering.len() > self.cfg.answering_max {
                    self.answering.pop_front();
                }
            }
            Msg::Heads { capsule, heads, .. } if capsule == name => {
                for (w, s) in heads {
                    let next = self.orderer.next_seq(w);
                    if psl_scl::server_id(w).is_none() && s >= next && !self.verifier.hint_refused(w, next) {
                        let e = self.hinted.entry(w).or_insert(s);
                        *e = (*e).max(s);
                    }
                }
                while self.hinted.len() > psl_scl::wire::HEADS_MAX {
                    self.hinted.pop_last();
                }
            }
            Msg::Certs { capsule, statements } if capsule == name => {
                let mut revoked = false;
                for st in &statements {
                    match self.verifier.install_statement(st) {
                        Ok(new) => {
                            if new {
                                // Someone new is about: it may lack our certificate too.
                                self.announce.hurry();
                            }
                            revoked |= new && matches!(st, KeyStatement::Revoke(_));
                        }
                        Err(e) => {
                            tracing::debug!(writer = st.writer(), "key statement refused: {e}");
                            self.stats.statements_refused += 1;
                        }
                    }
                }
                if revoked {
                    // Records held for ordering that the revocation refuses are never stored.
                    let verifier = &self.verifier;
                    let recheck = |r: &Record| {
                        verifier.recheck(r.header()).err().map(|e| psl_scl::RejectReason::from_verifier(&e))
                    };
                    self.stats.records_rejected += self.orderer.purge_all(&recheck).len() as u64;
                }
            }
            // Other servers' acks and records are not this method's business.
            _ => {}
        }
    }

    /// When (ms) a tick has timed work to do, if the server is quiet (no repair owed or asked
    /// for, no gap, no held record, nothing hinted), so that its runtime may sleep until then
    /// when no input comes: the next heads hint, re-ack or announcement. `None`: not quiet.
    pub fn quiet_until(&self) -> Option<u64> {
        let busy = !self.answering.is_empty()
            || !self.hinted.is_empty()
            || !self.orderer.gaps().is_empty()
            || self.verifier.holds_any()
            || self.data_batches != self.heads_persisted;
        if busy {
            return None;
        }
        let mut at = self.last_heads_at.map_or(0, |t| t.saturating_add(self.heads_every_ms));
        if !self.changed.is_empty() {
            at = at.min(self.last_reack_at.saturating_add(self.reack_every_ms));
        }
        if let Some(t) = self.announce.next_due() {
            at = at.min(t);
        }
        Some(at)
    }

    /// Time passes: repair requests for gaps, pulls driven by peers' heads (anti-entropy), our
    /// own heads, re-acks, and answers to repair requests (from durable records only).
    pub fn on_tick(&mut self, now: u64) -> Vec<Output> {
        let mut out = Vec::new();
        let name = self.verifier.name();
        out.extend(self.announce.due(name, now).into_iter().map(|m| Output::Publish(m.encode())));
        let expired = self.verifier.expire_held(now).len() as u64;
        self.stats.uncertified += expired;
        self.stats.records_rejected += expired;
        let work = self.orderer.tick_with_hints(&mut self.hinted, self.cfg.hint_requests_per_tick, now);
        self.stats.repair_requests_sent += work.repairs.len() as u64;
        self.stats.withholding_reports += work.withholding.len() as u64;
        for (writer, from_seq, to_seq) in work.repairs {
            let origin_only = self.orderer.first_ask(writer, from_seq, now);
            out.push(Output::Publish(Msg::Repair { capsule: name, writer, from_seq, to_seq, origin_only }.encode()));
        }
        for (writer, from_seq, to_seq) in work.withholding {
            out.push(Output::Withholding { writer, from_seq, to_seq });
        }
        let persisted = self.data_batches;
        if persisted != self.heads_persisted {
            self.heads_every_ms = self.cfg.heads_interval_ms;
        }
        if self.last_heads_at.is_none_or(|t| now.saturating_sub(t) >= self.heads_every_ms) {
            self.last_heads_at = Some(now);
            if persisted == self.heads_persisted {
                self.heads_every_ms =
                    (self.heads_every_ms * 2).min(self.cfg.heads_idle_ms.max(self.cfg.heads_interval_ms));
            }
            self.heads_persisted = persisted;
            let heads: Vec<(u32, u64)> =
                self.durable.iter().map(|(w, (next, _))| (*w, next - 1)).take(psl_scl::wire::HEADS_MAX).collect();
            if !heads.is_empty() {
                out.push(Output::Publish(Msg::Heads { capsule: name, heads, sender: None }.encode()));
            }
        }
        if !self.changed.is_empty() && now.saturating_sub(self.last_reack_at) >= self.reack_every_ms {
            self.last_reack_at = now;
            self.reack_every_ms =
                (self.reack_every_ms * 2).min(self.cfg.reack_window_ms.max(self.cfg.reack_interval_ms));
            let window = self.cfg.reack_window_ms;
            self.changed.retain(|_, t| now.saturating_sub(*t) <= window);
            let entries: Vec<AckEntry> = self
                .changed
                .keys()
                .filter_map(|w| {
                    self.durable.get(w).map(|(next, hash)| AckEntry {
                        writer: *w,
                        from_seq: next - 1,
                        to_seq: next - 1,
                        hash: *hash,
                    })
                })
                .collect();
            if let (false, None, Some(synced)) = (entries.is_empty(), &self.failed, &self.synced) {
                let acks = self.acks(&entries, synced);
                self.stats.acks_sent += acks.len() as u64;
                out.extend(acks);
            }
        }
        let mut budget = self.cfg.answers_per_tick as u64;
        while budget > 0 {
            let Some((w, from, to)) = self.answering.pop_front() else { break };
            let Some((next, _)) = self.durable.get(&w).copied() else { continue };
            if from >= next {
                continue;
            }
            let to = to.min(next - 1);
            let end = to.min(from + budget - 1);
            out.push(Output::Serve { writer: w, from_seq: from, to_seq: end });
            self.stats.records_served += end - from + 1;
            budget -= end - from + 1;
            if end < to {
                self.answering.push_front((w, end + 1, to));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use psl_capsule::{new_capsule_with, Author, Limits, Revocation, WriterKeys};
    use psl_crypto::OwnerKey;

    /// The attacker holds a leaked writer key: its records were verified (in parallel, before
    /// the server learnt the revocation), one is ordered and waiting for its group commit and one
    /// is held for a missing predecessor. The revocation arrives first on the fabric. Nothing it
    /// covers may be stored or acked.
    #[test]
    fn adversary_records_verified_before_their_revocation_are_not_stored_or_acked() {
        let owner = OwnerKey::from_seed(&[41; 32]).unwrap();
        let app = owner.app(2).unwrap();
        let meta =
            new_capsule_with(&owner, 2, "server-revocation", 0, Limits::default(), WriterKeys::Certified).unwrap();
        let verifier = Arc::new(Verifier::new(meta.clone(), None));
        let key = app.writer(psl_scl::server_writer(0).unwrap()).unwrap();
        let mut core = ServerCore::new(verifier, key, 0, ServerConfig::default());
        let w = 0x10009;
        let mut a = Author::new(&meta, &app, w).unwrap();
        let v = Verifier::new(meta.clone(), None);
        let cert = v.verify(a.write_own_cert().unwrap().unwrap()).unwrap();
        let one = v.verify(a.write_ops([("one", Some("1"))]).unwrap()).unwrap();
        let two = v.verify(a.write_ops([("two", Some("2"))]).unwrap()).unwrap();
        let three = v.verify(a.write_ops([("three", Some("3"))]).unwrap()).unwrap();
        let four = v.verify(a.write_ops([("four", Some("4"))]).unwrap()).unwrap();
        core.on_verified(cert, 0);
        core.on_verified(one, 0);
        core.on_verified(two, 0);
        core.on_verified(four, 0);
        assert_eq!(core.orderer().held_total(), 1, "seq 4 waits for seq 3");
        // The leader revokes the writer from seq 2: seq 2 is ordered, not yet stored.
        let rev = Revocation::issue(&app, meta.name(), 0, w, u64::MAX, 2).unwrap();
        core.on_message(Msg::Certs { capsule: meta.name(), statements: vec![KeyStatement::Revoke(rev)] });
        assert_eq!(core.orderer().held_total(), 0, "the held seq 4 was dropped");
        core.on_verified(three, 1);
        let mut disk = crate::disk::tests::MemDisk::default();
        let Some(Ok(n)) = crate::disk::commit_write(&mut core, &mut disk, 2) else {
            panic!("the records before the revocation")
        };
        let stored: Vec<u64> = disk.written.iter().map(|r| r.header().seq).collect();
        assert_eq!(stored, vec![0, 1], "a revoked record was handed out to be stored");
        let out = crate::disk::commit_synced(&mut core, &mut disk, n, 2);
        let acked = crate::disk::tests::acked(&out);
        assert!(acked.iter().all(|(_, to)| *to < 2), "an ack covers a revoked record: {acked:?}");
        assert!(core.take_batch().is_none());
    }

    /// A restarted server adopts a chain longer than its window from its disk: it keeps only
    /// the newest `SERVER_CHAIN_WINDOW` hashes, takes the next record, refuses an old one as a
    /// duplicate without reporting evidence, and still reports equivocation inside the window.
    #[test]
    fn a_server_adopts_a_long_chains_tail_and_goes_on_from_its_head() {
        let owner = OwnerKey::from_seed(&[44; 32]).unwrap();
        let app = owner.app(2).unwrap();
        let meta = new_capsule_with(&owner, 2, "server-window", 0, Limits::default(), WriterKeys::Derived).unwrap();
        let verifier = Arc::new(Verifier::new(meta.clone(), None));
        let me = psl_scl::server_writer(0).unwrap();
        let w = 0x1000a;
        let n = SERVER_CHAIN_WINDOW as u64 + 100;
        let mut a = Author::new(&meta, &app, w).unwrap();
        let mut disk = crate::disk::tests::MemDisk::default();
        for i in 0..n {
            disk.durable.push(verifier.verify(a.write_ops([(format!("k{i}").as_str(), Some("v"))]).unwrap()).unwrap());
        }
        let next = verifier.verify(a.write_ops([("next", Some("v"))]).unwrap()).unwrap();
        // A second record for `seq`, signed by the writer's key after the same predecessor.
        let other_at = |seq: u64| {
            let p = disk.durable[seq as usize - 1].clone();
            let mut b = Author::new(&meta, &app, w).unwrap();
            let h = p.header();
            b.resume(&psl_capsule::Head { writer: w, seq: h.seq, hash: p.hash(), lamport: h.lamport, epoch: h.epoch });
            verifier.verify(b.write_ops([("forged", Some("x"))]).unwrap()).unwrap()
        };
        let (old, recent) = (other_at(5), other_at(n - 10));

        let mut core = ServerCore::new(verifier.clone(), app.writer(me).unwrap(), me, ServerConfig::default());
        assert_eq!(core.adopt_tail_len(), SERVER_CHAIN_WINDOW);
        crate::disk::adopt(&mut core, &disk, 0).unwrap();
        let head = disk.durable.last().unwrap().hash();
        assert_eq!(core.durable()[&w], (n, head));
        assert_eq!(core.orderer().next_seq(w), n);
        assert_eq!(core.orderer().applied_hash(w, 99), None, "below the window");
        assert_eq!(core.orderer().applied_hash(w, 100), Some(disk.durable[100].hash()));

        // The next record links to the adopted head: ordered, stored, acked.
        assert!(!core.precheck(&next));
        assert!(core.on_verified(next, 1).is_empty());
        let out = crate::disk::commit_all(&mut core, &mut disk, 2);
        assert_eq!(crate::disk::tests::acked(&out), vec![(n, n)]);
        assert_eq!(core.durable()[&w].0, n + 1);

        // Old records: a copy, or another record for the slot, are duplicates; no evidence.
        let copy = disk.durable[5].clone();
        assert!(core.precheck(&copy) && core.precheck(&old));
        assert_eq!(core.stats.duplicates, 2);
        assert!(core.on_verified(old, 3).is_empty(), "no equivocation reported below the window");
        assert_eq!((core.stats.duplicates, core.stats.equivocations), (3, 0));
        assert!(core.take_batch().is_none(), "nothing to store");

        // Inside the window a second record for a slot is still evidence.
        assert!(!core.precheck(&recent));
        let out = core.on_verified(recent.clone(), 4);
        let want = Output::Equivocation {
            writer: w,
            seq: n - 10,
            a: disk.durable[(n - 10) as usize].hash(),
            b: recent.hash(),
        };
        assert_eq!(out, vec![want]);
        assert_eq!(core.stats.equivocations, 1);
    }
}
