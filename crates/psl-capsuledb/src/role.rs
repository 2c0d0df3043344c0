//! The CapsuleDB role: a receive-only SCL node (it joins the fabric and applies every verified
//! write like any worker) whose memtable journals each update into a [`CapsuleDb`]; the tree
//! freezes and compacts into signed, encrypted block and index records; the role answers
//! workers' read requests and publishes its frontier (what workers may evict).
//!
//! Threads:
//! - *apply*: drains the node's update journal into the tree; when the index changes (a freeze,
//!   maybe compactions) it records the newest index and multicasts a signed frontier (`heads`)
//!   naming that index; it also freezes an idle memtable after `idle_flush` so that workers'
//!   pinned keys become evictable, and re-sends the frontier every `heads_every`. Every
//!   `ack_every`, while its backlog (journaled and spilled updates) is within
//!   `ack_backlog_max`, it signs and multicasts an ack of what the node has applied, which
//!   paces the writers (flow control: a CapsuleDB that falls behind stops acking, and the
//!   writers wait for it instead of its queues overflowing). While nothing changes (no update,
//!   no head moved, the index the same), its repeats of the frontier and of the full ack wait
//!   twice as long each time, up to `heads_idle` (Trickle, as the nodes' heads hints), and
//!   the thread itself sleeps up to [`APPLY_IDLE_WAIT_MAX`] between looks: an update wakes
//!   it at once.
//! - *answer*: takes read requests, groups them by key, reads each key once (memtable, L0
//!   newest first, one block per level) and multicasts signed, sealed answers with the
//!   original `(lamport, writer)` version of each key, the data record that wrote it (the
//!   proof a worker checks, `dbwire`), and every request id it answers.
//!
//! Records: every update the journal hands over names the data record it came from; the tree
//! keeps that record's hash with the entry, and the role keeps the record's bytes in a cache
//! bounded in bytes ([`RoleOptions::record_cache_bytes_max`]), and without capsule servers
//! (which hold every record) also in the tree's own stores (`Reader::keep_record`). An answer takes each
//! record from the cache, else from the stores (`Reader::record`: the directories, then the
//! capsule servers by `GET`). A key whose record cannot be found is not answered (the
//! worker's get times out; `RoleStats::unproven`).

use crate::db::{CapsuleDb, Reader};
use crate::servers::Publisher;
use crate::store::DirStore;
use crate::{Error, RecordHash, Version};
use psl_crypto::{DataKey, SigningKey};
use psl_node::Node;
use psl_scl::dbwire::{
    AnswerBody, AnswerEntry, DbAnswer, DbHeads, DbMsg, DbRequest, DbScan, DbScanAnswer, Proof, ScanBody,
    ANSWER_BODY_BYTES_MAX, ANSWER_KEYS_MAX, ANSWER_RECORD_BYTES_MAX, ANSWER_REQS_MAX, DB_HEADS_MAX,
    SCAN_BODY_BYTES_MAX,
};
use psl_scl::wire::{Ack, AckEntry, ACK_ENTRIES_MAX};
use psl_scl::Msg;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Timers and limits of the role.
#[derive(Debug, Clone, Copy)]
pub struct RoleOptions {
    /// Freeze a non-empty memtable that has not changed the index for this long.
    pub idle_flush: Duration,
    /// Re-send the frontier (and a full ack) this soon after a change.
    pub heads_every: Duration,
    /// ... and at least this often while nothing changes (the wait doubles from
    /// `heads_every`).
    pub heads_idle: Duration,
    /// Most journaled updates applied per lock hold.
    pub apply_batch_max: usize,
    /// How often to ack what the node has taken in (`Duration::ZERO`: never; writers then are
    /// not paced by CapsuleDB).
    pub ack_every: Duration,
    /// Acks are held while more updates than this wait for the tree (journaled or spilled).
    pub ack_backlog_max: usize,
    /// Bytes of data records kept in memory to prove answers (least recently used out; an
    /// answer for a record not kept fetches it from the stores).
    pub record_cache_bytes_max: usize,
}

impl Default for RoleOptions {
    fn default() -> Self {
        RoleOptions {
            idle_flush: Duration::from_millis(500),
            heads_every: Duration::from_millis(250),
            heads_idle: Duration::from_millis(psl_scl::node::HEADS_IDLE_MS_DEFAULT),
            apply_batch_max: 4096,
            ack_every: Duration::from_millis(ACK_EVERY_MS_DEFAULT),
            ack_backlog_max: ACK_BACKLOG_MAX_DEFAULT,
            record_cache_bytes_max: RECORD_CACHE_BYTES_MAX_DEFAULT,
        }
    }
}

/// The apply thread's wait for updates when it has nothing to do: its wait doubles from
/// `ack_every` (20 ms) up to this while nothing happens (an update wakes it at once).
pub const APPLY_IDLE_WAIT_MAX: Duration = Duration::from_millis(500);

/// Default interval between CapsuleDB's acks: short beside a writer's flow window (16,384
/// ops), so that a healthy CapsuleDB never makes a writer wait.
pub const ACK_EVERY_MS_DEFAULT: u64 = 20;
/// Default backlog (updates waiting for the tree) above which the acks are held.
pub const ACK_BACKLOG_MAX_DEFAULT: usize = 4096;
/// Default bytes of data records the role keeps in memory to prove its answers.
pub const RECORD_CACHE_BYTES_MAX_DEFAULT: usize = 64 << 20;

/// Records by hash, and the bytes they hold.
type Kept = (lru::LruCache<RecordHash, Arc<[u8]>>, usize);

/// Data records by hash, least recently used out past a byte bound.
pub struct RecordCache {
    inner: parking_lot::Mutex<Kept>,
    bytes_max: usize,
}

impl RecordCache {
    /// An empty cache keeping at most `bytes_max` bytes of records.
    pub fn new(bytes_max: usize) -> RecordCache {
        RecordCache { inner: parking_lot::Mutex::new((lru::LruCache::unbounded(), 0)), bytes_max }
    }

    /// Keeps `bytes` under `hash`; returns whether it was not kept already.
    pub fn insert(&self, hash: RecordHash, bytes: Arc<[u8]>) -> bool {
        let mut g = self.inner.lock();
        let (map, used) = &mut *g;
        if map.get(&hash).is_some() {
            return false;
        }
        if bytes.len() > self.bytes_max {
            return true;
        }
        *used += bytes.len();
        map.put(hash, bytes);
        while *used > self.bytes_max {
            match map.pop_lru() {
                Some((_, b)) => *used -= b.len(),
                None => break,
            }
        }
        true
    }

    /// The bytes of record `hash`, if kept (marks it recently used).
    pub fn get(&self, hash: &RecordHash) -> Option<Arc<[u8]>> {
        self.inner.lock().0.get(hash).cloned()
    }

    /// Bytes kept.
    pub fn bytes(&self) -> usize {
        self.inner.lock().1
    }
}

/// Counters of the role.
#[derive(Debug, Default)]
pub struct RoleStats {
    /// Journaled updates applied to the tree.
    pub applied: AtomicU64,
    /// Read requests taken (gets and scans).
    pub requests: AtomicU64,
    /// Signed answers multicast (gets and scans).
    pub answers: AtomicU64,
    /// Keys read that the tree does not hold.
    pub misses: AtomicU64,
    /// Failures: writes or reads the tree refused, requests that do not open, records not
    /// kept, freezes or index pointer updates that failed.
    pub errors: AtomicU64,
    /// Signed frontiers (`heads`) multicast.
    pub heads_sent: AtomicU64,
    /// Acks multicast (flow control).
    pub acks_sent: AtomicU64,
    /// Acks held back because the backlog was above `ack_backlog_max`.
    pub acks_held: AtomicU64,
    /// Keys not answered because the record that wrote their version could not be found.
    pub unproven: AtomicU64,
}

impl RoleStats {
    /// The counters as Prometheus text (`psl_capsuledb_*_total`), what `--metrics` serves.
    pub fn render_prometheus(&self) -> String {
        let c = |v: &AtomicU64| v.load(Ordering::Relaxed);
        let mut out = String::new();
        psl_scl::metrics::render_counters(
            &mut out,
            "psl_capsuledb",
            &[
                ("applied", "journaled updates applied to the tree", c(&self.applied)),
                ("requests", "read requests taken (gets and scans)", c(&self.requests)),
                ("answers", "signed answers multicast", c(&self.answers)),
                ("misses", "keys read that the tree does not hold", c(&self.misses)),
                ("errors", "writes, reads, requests, freezes or pointer updates that failed", c(&self.errors)),
                ("heads_sent", "signed frontiers multicast", c(&self.heads_sent)),
                ("acks_sent", "acks multicast (flow control)", c(&self.acks_sent)),
                ("acks_held", "acks held back above the backlog bound", c(&self.acks_held)),
                ("unproven", "keys not answered: the record that wrote their version was not found", c(&self.unproven)),
            ],
        );
        out
    }
}

/// What the last acks said: per writer, the newest seq acked.
struct AckState {
    sent: BTreeMap<u32, u64>,
    last: Instant,
    last_full: Instant,
    /// The wait between full acks: `heads_every`, doubling up to `heads_idle` while no head
    /// moves.
    full_every: Duration,
}

/// What signs answers and heads: CapsuleDB's writer index and key, and the data key that
/// seals answers and opens requests.
pub struct RoleKeys {
    /// CapsuleDB's writer index in the capsule.
    pub writer: u32,
    /// The key that signs answers, heads and acks.
    pub signing: SigningKey,
    /// The capsule's data key: seals answers, opens requests.
    pub data_key: DataKey,
}

/// The running CapsuleDB role: its tree, its node, and the apply and answer threads.
pub struct Role {
    db: Arc<parking_lot::Mutex<CapsuleDb>>,
    node: Arc<Node>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stats: Arc<RoleStats>,
    serving: Arc<AtomicBool>,
}

impl std::fmt::Debug for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Role({:?})", self.node)
    }
}

struct Shared {
    db: Arc<parking_lot::Mutex<CapsuleDb>>,
    /// Reads without the database lock (they never wait for a compaction).
    reader: Reader,
    node: Arc<Node>,
    keys: RoleKeys,
    pointers: Vec<Arc<DirStore>>,
    stats: Arc<RoleStats>,
    stop: Arc<AtomicBool>,
    /// Whether read requests are answered (held, not answered, until a restart's replay is done).
    serving: Arc<AtomicBool>,
    /// With the capsule servers: where journaled updates wait while the tree waits for acks.
    publisher: Option<Arc<Publisher>>,
    /// The data records the tree's entries name (see the module docs).
    records: RecordCache,
}

impl Shared {
    fn heads(&self, db: &CapsuleDb) -> Vec<u8> {
        let frontier: Vec<(u32, u64)> = db.frontier().iter().map(|(w, l)| (*w, *l)).take(DB_HEADS_MAX).collect();
        let seq = db.index_seq();
        // The role's own (bounded) memtable may drop what the tree holds, too.
        self.node.memtable().raise_floor(&frontier, seq);
        DbMsg::Heads(DbHeads::sign(self.node.capsule(), self.keys.writer, seq, frontier, &self.keys.signing)).encode()
    }

    /// After the index changed: record it as the newest, then tell the workers.
    fn index_changed(&self, db: &CapsuleDb) -> Result<(), Error> {
        for p in &self.pointers {
            p.set_newest(&db.newest_index()).map_err(|e| Error::Store(e.to_string()))?;
        }
        let h = self.heads(db);
        if self.node.publish(h).is_ok() {
            self.stats.heads_sent.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Acks what the node has applied (every writer whose head moved, all of them every
    /// `heads_every`), unless the backlog toward the tree is above `ack_backlog_max`. The
    /// acks name each writer's newest applied record and its hash; writers count them for
    /// their own chains only (`NodeCore::flow_next`), never toward durability.
    /// Returns whether a head had moved since the last ack.
    fn ack(&self, st: &mut AckState, opts: &RoleOptions) -> bool {
        if opts.ack_every.is_zero() || st.last.elapsed() < opts.ack_every {
            return false;
        }
        st.last = Instant::now();
        let backlog = self.node.memtable().journal_len() + self.publisher.as_ref().map_or(0, |p| p.spilled());
        if backlog > opts.ack_backlog_max {
            self.stats.acks_held.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let heads = self.node.applied_heads();
        let moved = heads.iter().any(|l| st.sent.get(&l.writer).is_none_or(|s| *s < l.seq));
        if moved {
            st.full_every = opts.heads_every;
        }
        let full = st.last_full.elapsed() >= st.full_every;
        if full {
            st.last_full = Instant::now();
            if !moved {
                st.full_every = (st.full_every * 2).min(opts.heads_idle.max(opts.heads_every));
            }
        }
        let entries: Vec<AckEntry> = heads
            .iter()
            .filter(|l| full || st.sent.get(&l.writer).is_none_or(|s| *s < l.seq))
            .map(|l| AckEntry {
                writer: l.writer,
                from_seq: st.sent.get(&l.writer).map_or(0, |s| s + 1).min(l.seq),
                to_seq: l.seq,
                hash: l.hash,
            })
            .collect();
        for chunk in entries.chunks(ACK_ENTRIES_MAX) {
            let a = Ack::sign(self.node.capsule(), self.keys.writer, chunk.to_vec(), &self.keys.signing);
            if self.node.publish(Msg::Ack(a).encode()).is_ok() {
                self.stats.acks_sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        for e in entries {
            st.sent.insert(e.writer, e.to_seq);
        }
        moved
    }

    fn apply_loop(&self, opts: RoleOptions) {
        let mut last_change = Instant::now();
        let mut last_heads = Instant::now();
        let mut heads_wait = opts.heads_every;
        let mut acks = AckState {
            sent: BTreeMap::new(),
            last: Instant::now(),
            last_full: Instant::now(),
            full_every: opts.heads_every,
        };
        let busy_wait = if opts.ack_every.is_zero() { Duration::from_millis(20) } else { opts.ack_every };
        let mut wait = busy_wait;
        while !self.stop.load(Ordering::Acquire) {
            let moved = self.ack(&mut acks, &opts);
            // With servers, what was spilled while the tree waited for acks comes first.
            let batch = match &self.publisher {
                Some(p) => p.next_updates(&self.node, opts.apply_batch_max, wait),
                None => self.node.memtable().drain_journal(opts.apply_batch_max, wait),
            };
            // Busy (an update, a head moved, a memtable to freeze): look again soon; else
            // less and less often.
            let busy = moved || !batch.is_empty();
            let mut db = self.db.lock();
            wait = if busy || db.memtable_len() > 0 { busy_wait } else { (wait * 2).min(APPLY_IDLE_WAIT_MAX) };
            let before = db.index_seq();
            for (key, version, value, origin) in batch {
                let record = match origin {
                    Some((hash, bytes)) => {
                        // Without the capsule servers nothing else keeps the record: the
                        // tree's own stores do (a directory frames each record once).
                        if self.records.insert(hash.0, bytes.clone()) && self.publisher.is_none() {
                            if let Err(e) = self.reader.keep_record(hash.0, &bytes) {
                                tracing::warn!("capsuledb: keeping a data record: {e}");
                                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        hash.0
                    }
                    None => [0; 32],
                };
                let v = Version { lamport: version.lamport, writer: version.writer, record };
                if let Err(e) = db.apply(&key, v, value.map(|v| v.to_vec())) {
                    tracing::error!("capsuledb: applying a write failed: {e}");
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
                self.stats.applied.fetch_add(1, Ordering::Relaxed);
            }
            if db.index_seq() == before && db.memtable_len() > 0 && last_change.elapsed() >= opts.idle_flush {
                if let Err(e) = db.flush() {
                    tracing::error!("capsuledb: freezing the memtable failed: {e}");
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            if db.index_seq() != before {
                last_change = Instant::now();
                last_heads = Instant::now();
                heads_wait = opts.heads_every;
                if let Err(e) = self.index_changed(&db) {
                    tracing::error!("capsuledb: recording the newest index failed: {e}");
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                }
            } else if last_heads.elapsed() >= heads_wait {
                last_heads = Instant::now();
                heads_wait = (heads_wait * 2).min(opts.heads_idle.max(opts.heads_every));
                let h = self.heads(&db);
                drop(db);
                if self.node.publish(h).is_ok() {
                    self.stats.heads_sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Answers one scan: the range read from the tree (its memtable, level 0 and every level,
    /// newest version per key, tombstones included), cut at [`SCAN_BODY_BYTES_MAX`].
    fn answer_scan(&self, q: &DbScan) {
        let query = match q.open(&self.keys.data_key) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("capsuledb: scan refused: {e}");
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let seq = self.reader.index_seq();
        let (found, mut more) = match self.reader.scan(&query.prefix, query.after.as_deref(), query.limit as usize) {
            Ok(x) => x,
            Err(e) => {
                tracing::error!("capsuledb: scan failed: {e}");
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let mut proofs = Proofs::default();
        let mut entries = Vec::with_capacity(found.len());
        for (k, (v, val)) in found {
            let Some((record, added)) = proofs.record_of(self, &v) else {
                // A page must not skip a key: no answer (the scan times out).
                tracing::error!("capsuledb: scan: the record that wrote a key is not found");
                self.stats.unproven.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let len = k.len() + 20 + added;
            if !entries.is_empty() && proofs.bytes + len > SCAN_BODY_BYTES_MAX {
                more = true;
                proofs.unadd(added);
                break;
            }
            proofs.bytes += len;
            let version = psl_scl::Version { lamport: v.lamport, writer: v.writer };
            entries.push((k, Proof { version, deleted: val.is_none(), record }));
        }
        let body = ScanBody { more, records: proofs.records, entries };
        let a = DbScanAnswer::seal(
            self.node.capsule(),
            self.keys.writer,
            seq,
            q.req_id,
            &body,
            &self.keys.data_key,
            rand::random(),
            &self.keys.signing,
        );
        if self.node.publish(DbMsg::ScanAnswer(a).encode()).is_ok() {
            self.stats.answers.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn answer_loop(&self) {
        let Some(rx) = self.node.db_requests().cloned() else { return };
        while !self.stop.load(Ordering::Acquire) {
            if !self.serving.load(Ordering::Acquire) {
                // Requests wait in the bounded queue (requesters re-send what is dropped).
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            // The stop flag is checked at least this often.
            let Ok(first) = rx.recv_timeout(Duration::from_millis(250)) else { continue };
            // Group what is queued by key: one read and one answer per key.
            let mut by_key: BTreeMap<Vec<u8>, Vec<u64>> = BTreeMap::new();
            for r in std::iter::once(first).chain(rx.try_iter().take(4096)) {
                self.stats.requests.fetch_add(1, Ordering::Relaxed);
                let g = match r {
                    DbRequest::Get(g) => g,
                    DbRequest::Scan(q) => {
                        self.answer_scan(&q);
                        continue;
                    }
                };
                match g.open(&self.keys.data_key) {
                    Ok(k) => by_key.entry(k).or_default().push(g.req_id),
                    Err(e) => {
                        tracing::debug!("capsuledb: request refused: {e}");
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            // The index seq first: each read goes through that index or a newer one.
            let seq = self.reader.index_seq();
            // Signed answers for the keys queued together: each up to `ANSWER_KEYS_MAX` keys and
            // `ANSWER_BODY_BYTES_MAX` bytes, records included (one entry always fits).
            let mut batches: Vec<Batch> = Vec::new();
            let mut cur = Batch::default();
            for (key, reqs) in by_key {
                let found = match self.reader.get_cell(&key) {
                    Ok(found) => found,
                    Err(e) => {
                        // Unreadable from every store: no answer (the worker's get times out
                        // with a clear error rather than read a wrong value).
                        tracing::error!("capsuledb: read failed: {e}");
                        self.stats.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                if found.is_none() {
                    self.stats.misses.fetch_add(1, Ordering::Relaxed);
                }
                let mut added = cur.add(self, &key, &found, &reqs);
                if added == Add::Full {
                    batches.push(std::mem::take(&mut cur));
                    added = cur.add(self, &key, &found, &reqs);
                }
                if added != Add::Added {
                    tracing::error!("capsuledb: the record that wrote a key is not found: not answered");
                    self.stats.unproven.fetch_add(1, Ordering::Relaxed);
                }
            }
            if !cur.entries.is_empty() {
                batches.push(cur);
            }
            for batch in batches {
                let body = AnswerBody { records: batch.proofs.records, entries: batch.entries };
                for chunk in batch.reqs.chunks(ANSWER_REQS_MAX) {
                    let a = DbAnswer::seal(
                        self.node.capsule(),
                        self.keys.writer,
                        seq,
                        chunk.to_vec(),
                        &body,
                        &self.keys.data_key,
                        rand::random(),
                        &self.keys.signing,
                    );
                    if self.node.publish(DbMsg::Answer(a).encode()).is_ok() {
                        self.stats.answers.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    /// The bytes of the data record `hash`: the cache, else the stores (kept again).
    fn record_bytes(&self, hash: &RecordHash) -> Option<Arc<[u8]>> {
        if let Some(b) = self.records.get(hash) {
            return Some(b);
        }
        let b: Arc<[u8]> = self.reader.record(hash)?.into();
        self.records.insert(*hash, b.clone());
        Some(b)
    }
}

/// One answer being built: its request ids, its entries and their records.
#[derive(Default)]
struct Batch {
    reqs: Vec<u64>,
    entries: Vec<AnswerEntry>,
    proofs: Proofs,
}

#[derive(Debug, PartialEq, Eq)]
enum Add {
    Added,
    /// Not added: the answer is full (start the next one).
    Full,
    /// Not added: the record that wrote the version cannot be carried.
    Unproven,
}

impl Batch {
    fn add(&mut self, s: &Shared, key: &[u8], found: &Option<crate::Cell>, reqs: &[u64]) -> Add {
        let (proof, added) = match found {
            None => (None, 0),
            Some((v, val)) => match self.proofs.record_of(s, v) {
                Some((record, added)) => {
                    let version = psl_scl::Version { lamport: v.lamport, writer: v.writer };
                    (Some(Proof { version, deleted: val.is_none(), record }), added)
                }
                None => return Add::Unproven,
            },
        };
        let len = key.len() + 16 + added;
        let full = self.entries.len() >= ANSWER_KEYS_MAX || self.proofs.bytes + len > ANSWER_BODY_BYTES_MAX;
        if !self.entries.is_empty() && full {
            self.proofs.unadd(added);
            return Add::Full;
        }
        self.proofs.bytes += len;
        self.reqs.extend(reqs.iter().take(ANSWER_REQS_MAX));
        self.entries.push(AnswerEntry { key: key.to_vec(), found: proof });
        Add::Added
    }
}

/// The records one answer carries, each once, and the body's size so far.
#[derive(Default)]
struct Proofs {
    records: Vec<Vec<u8>>,
    index: BTreeMap<RecordHash, u16>,
    bytes: usize,
}

impl Proofs {
    /// The index in this answer of the record that wrote `v` (added if new) and the bytes it
    /// added; `None` if the record is unknown, not found or too large to carry.
    fn record_of(&mut self, s: &Shared, v: &Version) -> Option<(u16, usize)> {
        if !v.has_record() {
            return None;
        }
        if let Some(i) = self.index.get(&v.record) {
            return Some((*i, 0));
        }
        let bytes = s.record_bytes(&v.record)?;
        if bytes.len() > ANSWER_RECORD_BYTES_MAX {
            return None;
        }
        let i = u16::try_from(self.records.len()).ok()?;
        self.index.insert(v.record, i);
        self.records.push(bytes.to_vec());
        Some((i, 4 + bytes.len()))
    }

    /// Takes back the record the last `record_of` added (`added` > 0): it goes to the next
    /// answer.
    fn unadd(&mut self, added: usize) {
        if added > 0 && self.records.pop().is_some() {
            let n = self.records.len();
            self.index.retain(|_, i| (*i as usize) < n);
        }
    }
}

impl Role {
    /// Runs the role on `node` (started with `NodeOptions::capsuledb_role`) over `db`.
    /// Every store in `pointers` records the newest index after every change (for restarts).
    pub fn start(
        node: Node,
        db: CapsuleDb,
        keys: RoleKeys,
        pointers: Vec<Arc<DirStore>>,
        opts: RoleOptions,
    ) -> Result<Role, Error> {
        Self::start_shared(Arc::new(node), db, keys, pointers, opts, true, None)
    }

    /// Like [`Role::start`] on a node shared with others (CapsuleDB's records go out through
    /// it: `publisher`, whose spilled journal updates the apply thread takes first). With
    /// `serving` false, read requests are held until [`Role::serve`] (after a restart's
    /// replay); the tree takes live writes meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub fn start_shared(
        node: Arc<Node>,
        db: CapsuleDb,
        keys: RoleKeys,
        pointers: Vec<Arc<DirStore>>,
        opts: RoleOptions,
        serving: bool,
        publisher: Option<Arc<Publisher>>,
    ) -> Result<Role, Error> {
        if node.db_requests().is_none() {
            return Err(Error::Invalid("the node was not started with NodeOptions::capsuledb_role"));
        }
        let mut db = db;
        db.start_compactor()?;
        let reader = db.reader();
        let db = Arc::new(parking_lot::Mutex::new(db));
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::new(AtomicBool::new(serving));
        let stats = Arc::new(RoleStats::default());
        let shared = Arc::new(Shared {
            db: db.clone(),
            reader,
            node: node.clone(),
            keys,
            pointers,
            stats: stats.clone(),
            stop: stop.clone(),
            serving: serving.clone(),
            publisher,
            records: RecordCache::new(opts.record_cache_bytes_max),
        });
        {
            let d = db.lock();
            shared.index_changed(&d)?;
        }
        let mut threads = Vec::new();
        let s = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("capsuledb-apply".into())
                .spawn(move || s.apply_loop(opts))
                .map_err(|e| Error::Store(format!("spawning a thread: {e}")))?,
        );
        let s = shared;
        threads.push(
            std::thread::Builder::new()
                .name("capsuledb-answer".into())
                .spawn(move || s.answer_loop())
                .map_err(|e| Error::Store(format!("spawning a thread: {e}")))?,
        );
        Ok(Role { db, node, stop, threads, stats, serving })
    }

    /// Starts answering read requests (see [`Role::start_shared`]).
    pub fn serve(&self) {
        self.serving.store(true, Ordering::Release);
    }

    /// The tree the role feeds.
    pub fn db(&self) -> &Arc<parking_lot::Mutex<CapsuleDb>> {
        &self.db
    }

    /// The SCL node the role receives writes and requests on.
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// The role's counters.
    pub fn stats(&self) -> &RoleStats {
        &self.stats
    }

    /// Stops the threads; the node stops when the last reference to it goes.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.node.memtable().close_journal();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_threads();
        }
    }
}
