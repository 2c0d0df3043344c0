//! CapsuleDB on the capsule servers.
//!
//! - [`Publisher`]: the role's db-block and db-index records go out on the fabric through the
//!   role's node (`Node::publish_own`), like every other record, so the capsule servers verify,
//!   store, fsync and ack them; [`BlockStore::sync`] waits until a majority of the servers
//!   acked every record published so far (re-publishing the unacked ones while it waits).
//! - [`ServerStore`]: a [`BlockStore`] over one server's read address: `get` reads the record
//!   by hash (`GET`), unverified here: [`crate::CapsuleDb`] verifies, decrypts and compares it
//!   with its index entry, counts a copy that fails, and reads the next store (the next server).
//! - [`Survey`]: what the servers hold (heads, newest SYNC): the incarnation the restarted role's
//!   block writer takes, the newest index to restart from, which servers are fresh.
//! - [`replay`]: after a restart, every data record with writes above the loaded index's
//!   frontier, fetched per writer by seq range from a fresh server, verified, and applied to the
//!   tree with its original `(lamport, writer)` versions.
//!
//! Block writers: the role `id` writes its records as `writer_index(id, incarnation,
//! BLOCK_ACTOR)`, a new incarnation at every start (above every one the servers hold), so a
//! restarted role never signs a second record for a `(writer, seq)` slot (its answers and
//! frontiers keep the fixed writer `writer_index(id, 0, 15)` that workers are configured with).

use crate::db::{BlockStore, CapsuleDb};
use crate::{Error, RecordHash, Version};
use psl_capsule::{Action, Body, Kind, Link, Record, Verified, Verifier};
use psl_crypto::Hash256;
use psl_node::{Node, NodeError};
use psl_server::read::{ReadClient, RANGE_RECORDS_MAX};
use psl_server::{check_fresh, ServerView};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The actor slot of CapsuleDB's block writers (the answer writer is slot 15).
pub const BLOCK_ACTOR: u32 = 14;
/// Records per `RANGE` request while walking a chain backwards.
const WALK_CHUNK: u64 = 256;
/// A server that could not be reached is not asked again for this long.
const DOWN_FOR: Duration = Duration::from_secs(1);

/// Role `id`'s block writer in `incarnation`.
pub fn block_writer(id: u32, incarnation: u32) -> Option<u32> {
    psl_scl::writer_index(id, incarnation, BLOCK_ACTOR)
}

/// The incarnation of `w` if it is one of role `id`'s block writers.
pub fn block_incarnation(id: u32, w: u32) -> Option<u32> {
    (w >> 16 == id && w & 0xf == BLOCK_ACTOR).then_some((w >> 4) & 0xfff)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn io_err(msg: String) -> std::io::Error {
    std::io::Error::other(msg)
}

/// A published record not yet acked by a majority: (seq, hash, bytes).
type Pending = (u64, RecordHash, Arc<[u8]>);

/// Publishes the role's records through its node and waits for the servers' acks.
pub struct Publisher {
    node: OnceLock<Arc<Node>>,
    writer: u32,
    /// Published and not yet acked by a majority: (seq, hash, bytes), in chain order. Bounded
    /// by what one index change writes (a freeze, or a compaction's output blocks).
    pending: Mutex<Vec<Pending>>,
    durable_timeout: Duration,
    retry_every: Duration,
    /// Journaled updates taken out of the node's journal while waiting for acks (see
    /// [`Publisher::take_spill`]).
    spill: Mutex<Vec<psl_scl::memtable::Update>>,
    /// Held by whoever takes updates out of the journal (the role's apply thread, or the
    /// helper of a waiting `sync`), so that the spill always precedes what is still journaled.
    draining: Mutex<()>,
    /// Records published again because a majority's acks did not come in time.
    pub republished: AtomicU64,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Publisher(writer={}, pending={})", self.writer, lock(&self.pending).len())
    }
}

impl Publisher {
    /// Records of `writer`; [`BlockStore::sync`] gives up after `durable_timeout`.
    pub fn new(writer: u32, durable_timeout: Duration) -> Arc<Publisher> {
        Arc::new(Publisher {
            node: OnceLock::new(),
            writer,
            pending: Mutex::new(Vec::new()),
            durable_timeout,
            retry_every: Duration::from_millis(500),
            spill: Mutex::new(Vec::new()),
            draining: Mutex::new(()),
            republished: AtomicU64::new(0),
        })
    }

    /// The node records go out through (once; it must count acks from the servers:
    /// `NodeConfig::servers`).
    pub fn attach(&self, node: Arc<Node>) {
        let _ = self.node.set(node);
    }

    /// The writer index whose records this publisher sends.
    pub fn writer(&self) -> u32 {
        self.writer
    }

    fn node(&self) -> std::io::Result<&Arc<Node>> {
        self.node.get().ok_or_else(|| io_err("capsuledb: no node to publish records through".into()))
    }

    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        let node = self.node()?;
        let rec = Record::decode(&bytes, &node.limits())
            .map_err(|e| io_err(format!("capsuledb: an own record does not decode: {e}")))?;
        let seq = rec.header().seq;
        if rec.header().writer != self.writer {
            return Err(io_err(format!(
                "capsuledb: record of writer {} handed to writer {}",
                rec.header().writer,
                self.writer
            )));
        }
        let shared = rec.shared_bytes();
        node.publish_own(rec).map_err(|e| io_err(format!("capsuledb: publishing a record: {e}")))?;
        lock(&self.pending).push((seq, hash, shared));
        Ok(())
    }

    fn published(&self, hash: &RecordHash) -> bool {
        lock(&self.pending).iter().any(|p| p.1 == *hash)
    }

    fn is_durable(&self) -> bool {
        lock(&self.pending).is_empty()
    }

    /// Updates spilled while `sync` waited for acks, not yet taken by the apply thread.
    pub fn spilled(&self) -> usize {
        lock(&self.spill).len()
    }

    /// The next journaled updates for the tree, in journal order: first what was spilled while
    /// [`BlockStore::sync`] waited for acks, else up to `max` from `node`'s journal (waiting up
    /// to `timeout` for the first).
    pub fn next_updates(&self, node: &Node, max: usize, timeout: Duration) -> Vec<psl_scl::memtable::Update> {
        let _g = lock(&self.draining);
        let spilled = std::mem::take(&mut *lock(&self.spill));
        if !spilled.is_empty() {
            return spilled;
        }
        node.memtable().drain_journal(max, timeout)
    }

    /// Waits until a majority of the servers acked every record published so far.
    ///
    /// The caller holds the database (the role's apply thread, or the replay), so nobody
    /// drains the node's journal meanwhile; a full journal would block the node's core, which
    /// must keep processing the servers' acks. So while it waits, a helper moves the journal
    /// into the spill (memory bounded by what the node takes in during at most
    /// `durable_timeout`).
    fn sync(&self) -> std::io::Result<()> {
        if lock(&self.pending).is_empty() {
            return Ok(());
        }
        let node = self.node()?;
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let _g = lock(&self.draining);
                    let batch = node.memtable().drain_journal(4096, Duration::from_millis(10));
                    if !batch.is_empty() {
                        lock(&self.spill).extend(batch);
                    }
                }
            });
            let r = self.wait_acked(node);
            done.store(true, Ordering::Release);
            r
        })
    }

    fn wait_acked(&self, node: &Arc<Node>) -> std::io::Result<()> {
        let Some(next) = lock(&self.pending).last().map(|p| p.0 + 1) else { return Ok(()) };
        let deadline = Instant::now() + self.durable_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = self.retry_every.min(left).max(Duration::from_millis(1));
            match node.wait_durable(BTreeMap::from([(self.writer, next)]), wait) {
                Ok(()) => {
                    lock(&self.pending).retain(|p| p.0 >= next);
                    return Ok(());
                }
                Err(NodeError::DurableTimeout { .. }) if Instant::now() < deadline => {
                    // Lost on the fabric, or a server missed it: send what is unacked again
                    // (servers drop duplicates by hash before any signature check).
                    let again: Vec<Arc<[u8]>> = lock(&self.pending).iter().map(|p| p.2.clone()).collect();
                    for bytes in again {
                        let m = psl_scl::Msg::Record { capsule: node.capsule(), bytes }.encode();
                        if node.publish(m).is_ok() {
                            self.republished.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => {
                    return Err(io_err(format!(
                        "capsuledb: records of writer {} below seq {next} are not durable on a majority of the capsule servers: {e}",
                        self.writer
                    )))
                }
            }
        }
    }
}

/// One capsule server as a [`BlockStore`]: reads by hash from its read address. Writes go
/// through the shared [`Publisher`] (once per record, however many server stores there are):
/// `put` is `Ok` once the record is published, `sync` once a majority of the servers acked it.
pub struct ServerStore {
    addr: SocketAddr,
    publisher: Arc<Publisher>,
    /// Only the first server store publishes; the others report the publisher's state.
    primary: bool,
    client: Mutex<Option<ReadClient>>,
    down_until: Mutex<Option<Instant>>,
    /// Failed connections and failed reads to this server.
    pub read_errors: AtomicU64,
}

impl std::fmt::Debug for ServerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ServerStore({}, primary={})", self.addr, self.primary)
    }
}

impl ServerStore {
    /// One store per server read address, all writing through `publisher`.
    pub fn for_servers(addrs: &[SocketAddr], publisher: &Arc<Publisher>) -> Vec<Arc<ServerStore>> {
        addrs
            .iter()
            .enumerate()
            .map(|(i, a)| {
                Arc::new(ServerStore {
                    addr: *a,
                    publisher: publisher.clone(),
                    primary: i == 0,
                    client: Mutex::new(None),
                    down_until: Mutex::new(None),
                    read_errors: AtomicU64::new(0),
                })
            })
            .collect()
    }

    /// The server's read address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl BlockStore for ServerStore {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        if self.primary {
            return self.publisher.put(hash, bytes);
        }
        if self.publisher.published(&hash) {
            Ok(())
        } else {
            Err(io_err("capsuledb: the record was not published to the capsule servers".into()))
        }
    }

    fn sync(&self) -> std::io::Result<()> {
        if self.primary {
            return self.publisher.sync();
        }
        if self.publisher.is_durable() {
            Ok(())
        } else {
            Err(io_err("capsuledb: records not yet durable on a majority of the capsule servers".into()))
        }
    }

    fn statements(&self) -> Vec<psl_capsule::KeyStatement> {
        if lock(&self.down_until).is_some_and(|t| Instant::now() < t) {
            return Vec::new();
        }
        match ReadClient::connect(self.addr).and_then(|mut c| c.statements()) {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(server = %self.addr, "capsuledb: reading the server's certificates: {e}");
                Vec::new()
            }
        }
    }

    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        if lock(&self.down_until).is_some_and(|t| Instant::now() < t) {
            return None;
        }
        let mut c = lock(&self.client);
        // A kept connection may have been closed by a restarted server: one reconnect.
        for _ in 0..2 {
            if c.is_none() {
                match ReadClient::connect(self.addr) {
                    Ok(x) => *c = Some(x),
                    Err(e) => {
                        tracing::warn!(server = %self.addr, "capsuledb: {e}");
                        self.read_errors.fetch_add(1, Ordering::Relaxed);
                        *lock(&self.down_until) = Some(Instant::now() + DOWN_FOR);
                        return None;
                    }
                }
            }
            match c.as_mut().map(|x| x.get_unverified(&Hash256(*hash))) {
                Some(Ok(found)) => return found,
                Some(Err(e)) => {
                    tracing::warn!(server = %self.addr, "capsuledb: reading a record: {e}");
                    self.read_errors.fetch_add(1, Ordering::Relaxed);
                    *c = None;
                    // The server answered (it refused, e.g. a copy its own store found
                    // damaged): the next store is read. Only a broken connection is retried.
                    if !matches!(e, psl_server::read::ReadError::Io { .. }) {
                        return None;
                    }
                }
                None => return None,
            }
        }
        None
    }
}

/// One server as the survey saw it.
#[derive(Debug, Clone)]
pub struct Reached {
    /// The server's read address.
    pub addr: SocketAddr,
    /// writer -> (newest durable seq, its hash): the server's claims.
    pub heads: BTreeMap<u32, (u64, Hash256)>,
    /// The newest SYNC it stores (verified): epoch and links.
    pub sync: Option<(u64, Vec<Link>)>,
}

/// What the capsule servers hold, read from every reachable one.
#[derive(Debug, Default)]
pub struct Survey {
    /// The servers that answered.
    pub reached: Vec<Reached>,
    /// The servers that did not, with the error.
    pub skipped: Vec<(SocketAddr, String)>,
    /// The newest verified SYNC any server holds: epoch and links.
    pub newest_sync: Option<(u64, Vec<Link>)>,
    /// The SYNC freshness is judged against, if not `newest_sync`: [`survey_fresh`] pins the
    /// first round's, so that a server catching up is not chasing a target that moves every
    /// epoch.
    pub pinned_sync: Option<(u64, Vec<Link>)>,
    /// Surveys [`survey_fresh`] took, and how long it waited (0 and zero for one [`survey`]).
    pub rounds: u32,
    /// How long [`survey_fresh`] took, to the end of its last survey (zero for one [`survey`]).
    pub waited: Duration,
}

/// [`survey`], again until at least `need` servers are fresh ([`Survey::fresh`]: a server
/// stores a SYNC before, or after, records it links, and one that was just restarted catches
/// up by anti-entropy, so a moment's view may be short) or `within` passed; the wait between
/// surveys doubles from 100 ms to 1 s, with a log line per retry (the same rule and patience
/// as a node's recovery, `psl_server::read::fetch_quorum_within`). Freshness is judged against
/// the SYNC of the first round that found one, pinned (as a node's recovery does; see there
/// why that is complete): under a live coordinator the newest SYNC moves every epoch, and a
/// server catching up would never reach it (`psl chaos` seed 1000). Returns the last survey
/// either way, and how long it waited.
pub fn survey_fresh(addrs: &[SocketAddr], public: &Verifier, need: usize, within: Duration) -> Survey {
    let started = Instant::now();
    let deadline = started + within;
    let mut wait = Duration::from_millis(100);
    let mut rounds = 0u32;
    let mut pinned: Option<(u64, Vec<Link>)> = None;
    loop {
        rounds += 1;
        let mut s = survey(addrs, public);
        if pinned.is_none() {
            pinned = s.newest_sync.clone();
        }
        s.pinned_sync = pinned.clone();
        s.rounds = rounds;
        s.waited = started.elapsed();
        let fresh = s.fresh().len();
        if fresh >= need.max(1) || Instant::now() + wait > deadline {
            return s;
        }
        let stale: Vec<String> = s.stale_reasons().iter().map(|(a, e)| format!("{a}: {e}")).collect();
        tracing::warn!(
            round = rounds,
            fresh,
            need,
            left_ms = deadline.saturating_duration_since(Instant::now()).as_millis() as u64,
            "capsuledb: waiting for fresh capsule servers ({fresh} of {need} so far); retrying in {} ms: {}",
            wait.as_millis(),
            stale.join("; ")
        );
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_secs(1));
    }
}

/// Reads heads and the newest SYNC from every server (`public` needs no data key).
pub fn survey(addrs: &[SocketAddr], public: &Verifier) -> Survey {
    let mut s = Survey::default();
    for a in addrs {
        let got = ReadClient::connect(*a).and_then(|mut c| {
            let sync = c.latest_sync(public)?;
            let heads = c.heads()?;
            Ok((sync, heads))
        });
        match got {
            Ok((sync, heads)) => {
                let sync = sync.map(|r| (r.header().epoch, r.header().links.clone()));
                if let Some((e, links)) = &sync {
                    if s.newest_sync.as_ref().is_none_or(|(ne, _)| e > ne) {
                        s.newest_sync = Some((*e, links.clone()));
                    }
                }
                s.reached.push(Reached { addr: *a, heads, sync });
            }
            Err(e) => s.skipped.push((*a, e.to_string())),
        }
    }
    s
}

impl Survey {
    /// The incarnation for role `id`'s block writer: above every one any reached server holds.
    /// Heads are unverified claims, so the highest claimed incarnation counts only once one of
    /// its records verifies (a lying server cannot use up the 4096 incarnations); a claim that
    /// does not is passed over for the next highest.
    pub fn next_incarnation(&self, id: u32, public: &Verifier) -> Result<u32, Error> {
        let mut claims: Vec<(u32, u32, u64, SocketAddr)> = self
            .reached
            .iter()
            .flat_map(|r| r.heads.iter().map(move |(w, (seq, _))| (*w, *seq, r.addr)))
            .filter_map(|(w, seq, addr)| block_incarnation(id, w).map(|inc| (inc, w, seq, addr)))
            .collect();
        claims.sort_by_key(|c| std::cmp::Reverse(c.0));
        let proven = claims.into_iter().find(|(_, w, seq, addr)| {
            let ok = ReadClient::connect(*addr)
                .and_then(|mut c| c.range(public, *w, *seq, *seq))
                .is_ok_and(|r| r.len() == 1);
            if !ok {
                tracing::warn!(server = %addr, writer = w, seq, "capsuledb: a claimed block-writer head does not verify");
            }
            ok
        });
        let next = proven.map_or(0, |c| c.0 + 1);
        if next >= 1 << 12 {
            return Err(Error::Invalid("CapsuleDB's block writer used every incarnation (4096)"));
        }
        Ok(next)
    }

    /// The SYNC freshness is judged against: the newest verified SYNC any reached server holds
    /// (signed by a coordinator, so no server can claim a newer one than exists). The rule is
    /// `psl_server::check_fresh`'s, as for a node's recovery: a server is fresh if it holds
    /// every record that SYNC links, whichever SYNC record it stored last, so a server one
    /// epoch behind under a fast epoch clock is not refused for it.
    pub fn target(&self) -> Option<&(u64, Vec<Link>)> {
        self.pinned_sync.as_ref().or(self.newest_sync.as_ref())
    }

    /// The servers whose heads reach every record [`Survey::target`] links (and, where a head
    /// is the linked seq, with the linked hash). Heads are claims: [`replay`] checks every
    /// linked hash in what it reads, so a server that claims more than it holds fails there
    /// and the next holder is read.
    pub fn fresh(&self) -> Vec<&Reached> {
        self.reached.iter().filter(|r| self.stale_reason(r).is_none()).collect()
    }

    fn stale_reason(&self, r: &Reached) -> Option<String> {
        let (_, links) = self.target()?;
        let hash_at = |w: u32, s: u64| r.heads.get(&w).filter(|h| h.0 == s).map(|h| h.1);
        check_fresh(&ServerView { heads: &r.heads, hash_at: &hash_at }, links).err().map(|e| format!("stale: {e}"))
    }

    /// Why each reached server that is not fresh is not, and the servers not reached.
    pub fn stale_reasons(&self) -> Vec<(SocketAddr, String)> {
        let mut out: Vec<(SocketAddr, String)> =
            self.reached.iter().filter_map(|r| self.stale_reason(r).map(|e| (r.addr, e))).collect();
        out.extend(self.skipped.iter().cloned());
        out
    }

    /// The newest db-index record of role `id`: in its newest incarnation that wrote one, the
    /// last index on its chain (read from the server holding the longest chain first).
    pub fn newest_index(&self, id: u32, public: &Verifier) -> Result<Option<RecordHash>, Error> {
        // incarnation -> (writer, [(head seq, server)])
        let mut chains: BTreeMap<u32, (u32, Vec<(u64, SocketAddr)>)> = BTreeMap::new();
        for r in &self.reached {
            for (w, (seq, _)) in &r.heads {
                if let Some(inc) = block_incarnation(id, *w) {
                    chains.entry(inc).or_insert((*w, Vec::new())).1.push((*seq, r.addr));
                }
            }
        }
        let mut last_err = None;
        for (_, (w, mut holders)) in chains.into_iter().rev() {
            holders.sort_by_key(|h| std::cmp::Reverse(h.0));
            for (head, addr) in holders {
                match last_index_on_chain(addr, public, w, head) {
                    Ok(Some(h)) => return Ok(Some(h)),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(server = %addr, writer = w, "capsuledb: reading the block chain: {e}");
                        last_err = Some(e);
                    }
                }
            }
        }
        match last_err {
            Some(e) => Err(Error::Store(format!("no server answered for CapsuleDB's indexes: {e}"))),
            None => Ok(None),
        }
    }
}

fn last_index_on_chain(addr: SocketAddr, public: &Verifier, w: u32, head: u64) -> Result<Option<RecordHash>, String> {
    let mut c = ReadClient::connect(addr).map_err(|e| e.to_string())?;
    let mut hi = head;
    loop {
        let lo = hi.saturating_sub(WALK_CHUNK - 1);
        let recs = c.range(public, w, lo, hi).map_err(|e| e.to_string())?;
        if recs.len() as u64 != hi - lo + 1 {
            return Err(format!("writer {w}: asked seqs {lo}..={hi}, got {} records", recs.len()));
        }
        if let Some(r) = recs.iter().rev().find(|r| r.header().kind == Kind::DbIndex) {
            return Ok(Some(r.hash().0));
        }
        if lo == 0 {
            return Ok(None);
        }
        hi = lo - 1;
    }
}

/// What [`replay`] did.
#[derive(Debug, Default, Clone)]
pub struct ReplayReport {
    /// Writers whose records above the frontier were applied.
    pub writers: usize,
    /// Data records applied.
    pub records: usize,
    /// Puts and deletes applied.
    pub ops: usize,
    /// Servers read from, and those passed over (stale, unreachable, lying) with why.
    pub servers: Vec<SocketAddr>,
    /// The servers passed over, with why.
    pub skipped: Vec<(SocketAddr, String)>,
}

/// Applies to `db` every write the servers hold above `frontier` (the loaded index's: per
/// writer, the Lamport time up to which its writes are in the index's blocks).
///
/// At least `need` servers must be fresh ([`Survey::fresh`]); per writer, the replay reads up to the highest head any
/// fresh server claims, so with `need = f + 1` every write acknowledged durable is covered.
/// A writer's records are applied in chain order, from its first record above the frontier,
/// so a freeze in the middle of the replay (or interleaved with live records, which a fresh
/// node also applies in chain order) never raises the frontier past a write not yet applied.
/// Coordinators' chains and role `id`'s block writers are skipped; so is any chain that holds
/// db records. Each RANGE answer is verified (signatures, chain links, the newest SYNC's links
/// where they fall in the range) and the bodies opened with `keyed`'s data key.
pub fn replay(
    db: &parking_lot::Mutex<CapsuleDb>,
    survey: &Survey,
    frontier: &BTreeMap<u32, u64>,
    public: &Verifier,
    keyed: &Verifier,
    id: u32,
    need: usize,
) -> Result<ReplayReport, Error> {
    let mut report = ReplayReport { skipped: survey.stale_reasons(), ..Default::default() };
    let fresh = survey.fresh();
    if fresh.len() < need.max(1) {
        let why: Vec<String> = report.skipped.iter().map(|(a, e)| format!("{a}: {e}")).collect();
        let sync =
            survey.target().map_or("no SYNC known".to_string(), |(e, _)| format!("the newest SYNC, epoch {e:#x}"));
        return Err(Error::Store(format!(
            "replay needs {} fresh capsule servers (each holding every record {sync} links), found {} after \
             waiting {} ms ({} surveys); {}",
            need.max(1),
            fresh.len(),
            survey.waited.as_millis(),
            survey.rounds,
            why.join("; ")
        )));
    }
    let policy = public.metadata().meta.policy;
    // writer -> servers claiming it, highest head first.
    let mut writers: BTreeMap<u32, Vec<(u64, SocketAddr)>> = BTreeMap::new();
    for r in &fresh {
        for (w, (seq, _)) in &r.heads {
            writers.entry(*w).or_default().push((*seq, r.addr));
        }
    }
    let links: Vec<Link> = survey.target().map(|s| s.1.clone()).unwrap_or_default();
    let mut used = std::collections::BTreeSet::new();
    for (w, mut holders) in writers {
        if policy.is_coordinator(w) || psl_scl::server_id(w).is_some() || block_incarnation(id, w).is_some() {
            continue;
        }
        holders.sort_by_key(|h| std::cmp::Reverse(h.0));
        let floor = frontier.get(&w).copied();
        let mut done = false;
        for (head, addr) in holders {
            match fetch_tail(addr, public, w, head, floor, &links) {
                Ok(chunks) => {
                    let (records, ops) = apply_tail(db, public, keyed, chunks, floor)?;
                    if records > 0 {
                        report.writers += 1;
                    }
                    report.records += records;
                    report.ops += ops;
                    used.insert(addr);
                    done = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(server = %addr, writer = w, "capsuledb replay: {e}");
                    report.skipped.push((addr, format!("writer {w}: {e}")));
                }
            }
        }
        if !done {
            return Err(Error::Store(format!("replay: no fresh server served writer {w}'s records")));
        }
    }
    report.servers = used.into_iter().collect();
    Ok(report)
}

/// Writer `w`'s records from its first one above `floor` to `head`, as RANGE chunks (newest
/// chunk first). Empty if the chain holds db records (not a data writer).
fn fetch_tail(
    addr: SocketAddr,
    public: &Verifier,
    w: u32,
    head: u64,
    floor: Option<u64>,
    links: &[Link],
) -> Result<Vec<Vec<Verified<Record>>>, String> {
    let mut c = ReadClient::connect(addr).map_err(|e| e.to_string())?;
    // The revocations the server knows, before any record is applied (statements carry the
    // application key's signature: the server can withhold them, not forge them).
    c.learn_certs(public).map_err(|e| e.to_string())?;
    let mut chunks: Vec<Vec<Verified<Record>>> = Vec::new();
    let mut hi = head;
    let chunk = RANGE_RECORDS_MAX.min(1024);
    loop {
        let lo = hi.saturating_sub(chunk - 1);
        let recs = c.range(public, w, lo, hi).map_err(|e| e.to_string())?;
        if recs.len() as u64 != hi - lo + 1 {
            return Err(format!("asked seqs {lo}..={hi}, got {} records", recs.len()));
        }
        if let (Some(newer), Some(last)) = (chunks.last(), recs.last()) {
            if newer[0].header().prev != last.hash() {
                return Err(format!("seq {} does not link to seq {}", hi + 1, hi));
            }
        }
        for l in links.iter().filter(|l| l.writer == w && (lo..=hi).contains(&l.seq)) {
            if recs[(l.seq - lo) as usize].hash() != l.hash {
                return Err(format!("seq {} differs from the one the newest SYNC links", l.seq));
            }
        }
        if recs.iter().any(|r| matches!(r.header().kind, Kind::DbBlock | Kind::DbIndex)) {
            return Ok(Vec::new());
        }
        let below = lo == 0 || floor.is_some_and(|f| recs[0].header().lamport <= f);
        chunks.push(recs);
        if below {
            return Ok(chunks);
        }
        hi = lo - 1;
    }
}

fn apply_tail(
    db: &parking_lot::Mutex<CapsuleDb>,
    public: &Verifier,
    keyed: &Verifier,
    chunks: Vec<Vec<Verified<Record>>>,
    floor: Option<u64>,
) -> Result<(usize, usize), Error> {
    let (mut records, mut ops_applied) = (0, 0);
    for chunk in chunks.into_iter().rev() {
        let mut db = db.lock();
        for rec in chunk {
            let h = rec.header();
            if h.kind != Kind::Data || floor.is_some_and(|f| h.lamport <= f) {
                continue;
            }
            // Verified as it arrived; a revocation learnt since (from this answer's Cert
            // records or another server) refuses it now: never applied.
            if let Err(reason) = public.recheck(h).and_then(|()| keyed.recheck(h)) {
                tracing::warn!(writer = h.writer, seq = h.seq, "capsuledb replay: refused at apply time: {reason}");
                continue;
            }
            let writer = h.writer;
            // The record proves these writes in the role's answers (the servers hold it).
            let record = rec.hash().0;
            let (Body::Data(ops) | Body::Atomic(ops)) =
                keyed.open(&rec).map_err(|e| Error::Store(format!("replay: opening a record: {e}")))?
            else {
                continue;
            };
            for op in ops {
                let value = match op.action {
                    Action::Put(v) => Some(v),
                    Action::Delete => None,
                };
                db.apply(&op.key, Version { lamport: op.lamport, writer, record }, value)?;
                ops_applied += 1;
            }
            records += 1;
        }
    }
    Ok((records, ops_applied))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reached(port: u16, sync_epoch: Option<u64>) -> Reached {
        Reached {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            heads: BTreeMap::new(),
            sync: sync_epoch.map(|e| (e, Vec::new())),
        }
    }

    #[test]
    fn block_writers_name_their_incarnation() {
        for inc in [0, 1, 77, 4095] {
            let w = block_writer(30_000, inc).unwrap();
            assert_eq!(block_incarnation(30_000, w), Some(inc));
            assert_eq!(block_incarnation(30_001, w), None);
        }
        assert_eq!(block_writer(30_000, 4096), None);
        // The answer writer (slot 15) and workers' writers are not block writers.
        assert_eq!(block_incarnation(30_000, psl_scl::writer_index(30_000, 0, 15).unwrap()), None);
        assert_eq!(block_incarnation(30_000, psl_scl::writer_index(30_000, 3, 1).unwrap()), None);
    }

    #[test]
    fn freshness_is_holding_what_the_newest_sync_links() {
        let link = |writer, seq| Link { writer, seq, hash: Hash256([seq as u8; 32]) };
        let head = |seq: u64| (seq, Hash256([seq as u8; 32]));
        let mut s = Survey {
            reached: vec![reached(1, Some(9)), reached(2, Some(8)), reached(3, Some(4)), reached(4, None)],
            ..Survey::default()
        };
        // The newest SYNC (epoch 9) links writer 7's seq 5.
        s.newest_sync = Some((9, vec![link(7, 5)]));
        s.reached[0].heads.insert(7, head(6));
        // One epoch behind, but holding the linked record: fresh.
        s.reached[1].heads.insert(7, head(5));
        // Behind the link: stale, whatever SYNC it holds.
        s.reached[2].heads.insert(7, head(4));
        // Another record at the linked slot: stale.
        s.reached[3].heads.insert(7, (5, Hash256([99; 32])));
        assert_eq!(s.target().map(|t| t.0), Some(9));
        let fresh: Vec<u16> = s.fresh().iter().map(|r| r.addr.port()).collect();
        assert_eq!(fresh, vec![1, 2]);
        let stale: Vec<u16> = s.stale_reasons().iter().map(|(a, _)| a.port()).collect();
        assert_eq!(stale, vec![3, 4]);
        // Pinned to an older SYNC (the wait's first; epoch 8 links writer 7's seq 4): the
        // server catching up from seq 4 is fresh against it, although newer SYNCs have moved on
        // (and so is the one holding another record at seq 5: the linked seq 4's hash is
        // checked when the replay reads it).
        s.pinned_sync = Some((8, vec![link(7, 4)]));
        assert_eq!(s.target().map(|t| t.0), Some(8));
        let fresh: Vec<u16> = s.fresh().iter().map(|r| r.addr.port()).collect();
        assert_eq!(fresh, vec![1, 2, 3, 4]);
        s.pinned_sync = None;
        // Nothing known: every reached server is fresh.
        s.newest_sync = None;
        assert_eq!(s.fresh().len(), 4);
        assert_eq!(s.next_incarnation(30_000, &Verifier::new(test_meta(), None)).unwrap(), 0);
    }

    fn test_meta() -> psl_capsule::SignedMetadata {
        let owner = psl_crypto::OwnerKey::from_seed(&[3; 32]).unwrap();
        psl_capsule::new_capsule(&owner, 1, "servers-unit", 0, psl_capsule::Limits::default()).unwrap()
    }
}
