//! [`CapsuleDb`]: the LSM core with every block and every index stored as a signed, encrypted
//! DataCapsule record (`db-block` / `db-index`) in one or more [`BlockStore`]s.
//!
//! Reading an index: the record is fetched by hash from the first store, decoded, run through
//! the [`Verifier`] (signature, decryption), its hash compared with the pointer and its kind
//! checked. Reading a block: the same, except that the signature is not checked again: the
//! block's record hash must equal the pointer held by the verified index, which by SHA-256's
//! collision resistance makes it the record the index's signer wrote (see
//! `docs/protocol/capsuledb.md` §3). Any failure counts as a rejected copy and the next store
//! is tried.
//!
//! Concurrency: readers ([`CapsuleDb::get_cell`], [`Reader`]) take a short read lock to look at
//! the memtable (and a memtable being frozen) and to take the current index (an `Arc`), then
//! read blocks without any lock. Writers (apply, freeze, and the installation of a compaction)
//! serialize on one mutex. With [`CapsuleDb::start_compactor`], compactions run in a background
//! thread: they read immutable input blocks and write new ones without holding any lock, then
//! take the writers' mutex briefly to install the result in a new index. Without it, a freeze
//! runs the compactions it makes necessary inline (deterministic: tests).
//!
//! Sealing: the records are one writer's chain, so the [`Author`] is behind its own mutex (a
//! freeze and a compaction may both write blocks). A batch of blocks ([`Blocks::save_many`]) is
//! sealed in chain order under it, then signed on [`sign_threads`] threads after the lock is
//! released (the record hash does not cover the signature; the bytes are those of sealing one
//! by one), then put to the stores.

use crate::codec::{Block, BlockRef, Index};
use crate::lsm::{self, get_in_index, newest, Blocks, Config};
use crate::{Cell, Error, RecordHash, Version};
use lru::LruCache;
use parking_lot::{Condvar, Mutex as PMutex, RwLock};
use psl_capsule::replica::Head;
use psl_capsule::{Author, Body, Limits, Record, SignPool, Verifier};
use psl_crypto::Hash256;
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Somewhere sealed record bytes are kept, addressed by record hash. Stores are untrusted:
/// whatever they return is verified.
pub trait BlockStore: Send + Sync {
    /// Stores the sealed record `bytes` under its hash.
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()>;
    /// The bytes held under `hash` (unverified), if any.
    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>>;
    /// Makes every record put so far durable. Called before and after each index record, so
    /// that an index is never durable before the blocks it points at (and a store may batch).
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
    /// Writer certificates and revocations the store knows (a capsule server's `CERTS`), for a
    /// record whose writer's certificate this process has not seen (an earlier incarnation's
    /// block writer). Unchecked: the verifier checks each. None by default.
    fn statements(&self) -> Vec<psl_capsule::KeyStatement> {
        Vec::new()
    }
}

/// One page of a scan: `(key, newest cell)` in key order, and whether more keys follow.
pub type ScanPage = (Vec<(Vec<u8>, Cell)>, bool);

/// An in-memory store (tests, and the shape of a capsule server's record map).
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<HashMap<RecordHash, Vec<u8>>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Arc<MemStore> {
        Arc::new(MemStore::default())
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flips the bits of byte `pos` (mod length) of a stored record; `false` if absent.
    pub fn tamper(&self, hash: &RecordHash, pos: usize) -> bool {
        let mut m = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(hash) {
            Some(b) if !b.is_empty() => {
                let i = pos % b.len();
                b[i] ^= 0xff;
                true
            }
            _ => false,
        }
    }

    /// Length of a stored record (0 if absent).
    pub fn get_len(&self, hash: &RecordHash) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(hash).map_or(0, |b| b.len())
    }

    /// The stored bytes of a record, as held.
    pub fn raw(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        self.get(hash)
    }

    /// Stores arbitrary bytes under `hash` (tests: a store lying about a record).
    pub fn put_raw(&self, hash: RecordHash, bytes: Vec<u8>) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert(hash, bytes);
    }

    /// A copy of the store as it is now (tests: what a crash at this moment leaves).
    pub fn snapshot(&self) -> Arc<MemStore> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Arc::new(MemStore { map: Mutex::new(map) })
    }

    /// Drops the record `hash`; `false` if absent (tests: a store losing a record).
    pub fn remove(&self, hash: &RecordHash) -> bool {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).remove(hash).is_some()
    }
}

impl BlockStore for MemStore {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).insert(hash, bytes);
        Ok(())
    }
    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).get(hash).cloned()
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Block and index records sealed and taken by at least one store.
    pub records_written: u64,
    /// Blocks fetched from the stores (cache misses).
    pub block_fetches: u64,
    /// Reads served from the block cache or the entry cache.
    pub cache_hits: u64,
    /// Copies that failed decoding, verification, the hash check or the kind check.
    pub rejected_copies: u64,
    /// Stores that did not hold a requested record.
    pub missing_copies: u64,
    /// Compactions installed (inline or in the background).
    pub compactions: u64,
    /// Times a freeze waited for the background compaction (level 0 at its stall bound).
    pub write_stalls: u64,
}

#[derive(Debug, Default)]
struct AtomicStats {
    records_written: AtomicU64,
    block_fetches: AtomicU64,
    cache_hits: AtomicU64,
    rejected_copies: AtomicU64,
    missing_copies: AtomicU64,
    compactions: AtomicU64,
    write_stalls: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl AtomicStats {
    fn get(&self) -> Stats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            records_written: l(&self.records_written),
            block_fetches: l(&self.block_fetches),
            cache_hits: l(&self.cache_hits),
            rejected_copies: l(&self.rejected_copies),
            missing_copies: l(&self.missing_copies),
            compactions: l(&self.compactions),
            write_stalls: l(&self.write_stalls),
        }
    }
}

/// Record I/O: shared by readers, the writer and the compaction thread.
struct Io {
    stores: Vec<Arc<dyn BlockStore>>,
    verifier: Verifier,
    limits: Limits,
    /// The record chain is one writer's: appends are serialized.
    author: PMutex<Author>,
    /// Puts sealed records in chain order.
    put_order: PutOrder,
    /// Signs batches of block records ([`Blocks::save_many`]) on [`sign_threads`] threads;
    /// started on the first write (a database that never writes starts no thread).
    signers: OnceLock<SignPool>,
    cache: PMutex<BlockCache>,
    /// `block hash ‖ key` to that block's entry for the key, or `None` (a Bloom false positive).
    rows: PMutex<LruCache<Vec<u8>, Option<Cell>>>,
    stats: AtomicStats,
}

/// Most threads a batch of block records is signed on ([`Blocks::save_many`]), the calling
/// thread included.
pub const SIGN_THREADS_MAX: usize = 4;

/// Threads a batch of block records is signed on: the cores this process may use, at most
/// [`SIGN_THREADS_MAX`]. Signing is CPU-bound, so more threads than cores would only wait.
pub fn sign_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, SIGN_THREADS_MAX)
}

/// The order in which sealed records are put to the stores: the chain's. Records are sealed
/// under the author's lock but signed and put after it (a freeze and a compaction sign at the
/// same time), and a store that publishes them (the role's, `crate::servers`) drops a record
/// that does not extend its chain. A writer takes a ticket (the first seq it seals) under the
/// author's lock and puts its records once every earlier seq is put.
struct PutOrder {
    /// The next seq to put; `None` until the first record is sealed.
    next: PMutex<Option<u64>>,
    turn: Condvar,
}

impl PutOrder {
    fn new() -> PutOrder {
        PutOrder { next: PMutex::new(None), turn: Condvar::new() }
    }

    /// Called under the author's lock with the seq the next record will have: the ticket.
    fn ticket(&self, next_seq: u64) -> u64 {
        let mut n = self.next.lock();
        // The first sealer under the author's lock holds the lowest seq.
        if n.is_none() {
            *n = Some(next_seq);
        }
        next_seq
    }

    /// Waits until the records from `first` on are next; the returned turn passes on to
    /// `first + count` when dropped (whatever the puts did, so a failed put blocks no one).
    fn wait_turn(&self, first: u64, count: u64) -> Turn<'_> {
        let mut n = self.next.lock();
        while *n != Some(first) {
            self.turn.wait(&mut n);
        }
        Turn { order: self, next: first + count }
    }
}

/// A writer's turn to put its records ([`PutOrder::wait_turn`]).
struct Turn<'a> {
    order: &'a PutOrder,
    next: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.order.next.lock() = Some(self.next);
        self.order.turn.notify_all();
    }
}

#[derive(Clone, Copy)]
enum Want {
    Block,
    Index,
}

impl Io {
    /// Seals `body` as one record and puts it to every store ([`Io::write_many`] of one).
    fn write(&self, body: Body) -> Result<RecordHash, Error> {
        self.write_many(vec![body])?.pop().ok_or(Error::Invalid("a record written gave no hash"))
    }

    /// The Cert record a certified writer's chain opens with, if `a` has written nothing yet.
    fn intro(a: &Author) -> Option<Body> {
        let c = a.cert().filter(|_| a.next_seq() == 0)?;
        Some(Body::Certs(vec![psl_capsule::KeyStatement::Cert(c.clone())]))
    }

    /// Seals `bodies` as consecutive records ([`Author::seal_bodies`], under the author's lock;
    /// the writer's certificate first if its chain is empty, in certified capsules: servers,
    /// nodes and auditors learn its key from the log), signs them on the pool's threads after
    /// the lock is released, and puts each to every store in chain order. Their hashes in
    /// order, the certificate's left out. The records are all sealed before any is stored: if
    /// one is taken by no store, the others are still put (the chain keeps as few holes as it
    /// can) and the first failure is returned.
    fn write_many(&self, mut bodies: Vec<Body>) -> Result<Vec<RecordHash>, Error> {
        let (batch, first, skip) = {
            let mut a = self.author.lock();
            let intro = Self::intro(&a);
            let skip = usize::from(intro.is_some());
            if let Some(c) = intro {
                bodies.insert(0, c);
            }
            let first = self.put_order.ticket(a.next_seq());
            (a.seal_bodies(bodies).map_err(|e| Error::Seal(e.to_string()))?, first, skip)
        };
        // Signed outside the writer's lock: a freeze and a compaction seal their batches in
        // turn but sign them at the same time; they are put in chain order.
        let recs = batch.sign(self.signers());
        let _turn = self.put_order.wait_turn(first, recs.len() as u64);
        let mut failed = None;
        for rec in &recs {
            if let Err(e) = self.store(rec) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(recs[skip..].iter().map(|r| r.hash().0).collect()),
        }
    }

    /// The signing pool, started on first use (with only the calling thread if the OS refuses
    /// threads: slower, not wrong).
    fn signers(&self) -> &SignPool {
        self.signers.get_or_init(|| {
            SignPool::new(sign_threads()).unwrap_or_else(|e| {
                tracing::warn!("capsuledb: signing on one thread, no helper thread started: {e}");
                SignPool::new(1).expect("a pool of one thread starts no thread")
            })
        })
    }

    /// Puts `rec` to every store; its hash.
    fn store(&self, rec: &Record) -> Result<RecordHash, Error> {
        let hash = rec.hash().0;
        // Written to every store; it is enough that one took it (reads try them all), but a
        // record no store took is an error: the index must never point at nothing.
        let mut stored = 0;
        let mut last = String::new();
        for s in &self.stores {
            match s.put(hash, rec.bytes().to_vec()) {
                Ok(()) => stored += 1,
                Err(e) => last = e.to_string(),
            }
        }
        if stored == 0 {
            return Err(Error::Store(last));
        }
        bump(&self.stats.records_written);
        Ok(hash)
    }

    /// Syncs every store; it is enough that one succeeds (as for writes).
    fn sync(&self) -> Result<(), Error> {
        let mut last = String::new();
        let mut ok = 0;
        for s in &self.stores {
            match s.sync() {
                Ok(()) => ok += 1,
                Err(e) => last = e.to_string(),
            }
        }
        if ok == 0 {
            return Err(Error::Store(last));
        }
        Ok(())
    }

    /// Fetches and opens the record `hash`, trying each store in order. An index is verified
    /// in full (signature, decryption); a block is reached only through a verified index's
    /// pointer, so its record hash equal to `hash` stands for the signature (module docs).
    fn fetch(&self, hash: &RecordHash, want: Want) -> Result<(Record, Vec<u8>), Error> {
        let mut last = String::from("no store holds it");
        for s in &self.stores {
            let Some(bytes) = s.get(hash) else {
                bump(&self.stats.missing_copies);
                continue;
            };
            let checked = Record::decode(&bytes, &self.limits).map_err(|e| format!("decode: {e}")).and_then(|rec| {
                if rec.hash().0 != *hash {
                    return Err("record hash differs from the pointer".to_string());
                }
                let body = match want {
                    Want::Block => {
                        self.verifier.open_pinned(&rec, &Hash256(*hash)).map_err(|e| format!("open: {e}"))?
                    }
                    Want::Index => {
                        let v = match self.verifier.verify_open(rec.clone()) {
                            Err(e) if e.reason.wants_cert() => {
                                self.learn_statements();
                                self.verifier.verify_open(rec.clone())
                            }
                            r => r,
                        };
                        v.map_err(|e| format!("verify: {e}"))?.into_inner().body
                    }
                };
                match (want, body) {
                    (Want::Block, Body::DbBlock(b)) | (Want::Index, Body::DbIndex(b)) => Ok((rec, b)),
                    _ => Err("record is not of the expected kind".to_string()),
                }
            });
            match checked {
                Ok(x) => return Ok(x),
                Err(e) => {
                    bump(&self.stats.rejected_copies);
                    last = e;
                }
            }
        }
        Err(Error::Unavailable { hash: Hash256(*hash).to_hex(), tried: self.stores.len(), last })
    }

    /// Installs what the stores know of writer certificates (each checked by the verifier).
    fn learn_statements(&self) {
        for s in &self.stores {
            for st in s.statements() {
                if let Err(e) = self.verifier.install_statement(&st) {
                    tracing::warn!("capsuledb: a store offered a key statement that does not verify: {e}");
                }
            }
        }
    }

    fn load_index(&self, hash: &RecordHash) -> Result<(Record, Index), Error> {
        let (rec, body) = self.fetch(hash, Want::Index)?;
        Ok((rec, Index::decode(&body)?))
    }

    fn fetch_block(&self, r: &BlockRef) -> Result<Arc<Block>, Error> {
        bump(&self.stats.block_fetches);
        let (_, body) = self.fetch(&r.hash, Want::Block)?;
        let b = Arc::new(Block::decode(&body)?);
        if b.entries.len() != r.entries as usize
            || b.entries.first().map(|e| &e.0) != Some(&r.min)
            || b.entries.last().map(|e| &e.0) != Some(&r.max)
        {
            return Err(Error::Invalid("block does not match its index entry"));
        }
        Ok(b)
    }
}

impl Blocks for Io {
    fn load(&self, r: &BlockRef) -> Result<Arc<Block>, Error> {
        if let Some(b) = self.cache.lock().get(&r.hash) {
            bump(&self.stats.cache_hits);
            return Ok(b.clone());
        }
        let b = self.fetch_block(r)?;
        self.cache.lock().put(r.hash, b.clone());
        Ok(b)
    }

    fn load_once(&self, r: &BlockRef) -> Result<Arc<Block>, Error> {
        // Compaction inputs: from the cache if there, but not added to it (they are about to
        // be replaced, and would push out the blocks point reads need).
        if let Some(b) = self.cache.lock().peek(&r.hash) {
            return Ok(b.clone());
        }
        self.fetch_block(r)
    }

    fn save(&self, b: &Block) -> Result<RecordHash, Error> {
        self.write(Body::DbBlock(b.encode()))
    }

    fn save_many(&self, blocks: &[Block]) -> Result<Vec<RecordHash>, Error> {
        if blocks.is_empty() {
            return Ok(Vec::new());
        }
        // Encoded before the writer's lock is taken.
        self.write_many(blocks.iter().map(|b| Body::DbBlock(b.encode())).collect())
    }

    fn get_entry(&self, r: &BlockRef, key: &[u8]) -> Result<Option<Cell>, Error> {
        let mut rk = [0u8; 32 + crate::codec::KEY_BYTES_MAX];
        let n = 32 + key.len().min(crate::codec::KEY_BYTES_MAX);
        rk[..32].copy_from_slice(&r.hash);
        rk[32..n].copy_from_slice(&key[..n - 32]);
        if key.len() <= crate::codec::KEY_BYTES_MAX {
            if let Some(c) = self.rows.lock().get(&rk[..n]) {
                bump(&self.stats.cache_hits);
                return Ok(c.clone());
            }
        }
        let c = self.load(r)?.get(key).cloned();
        if key.len() <= crate::codec::KEY_BYTES_MAX {
            self.rows.lock().put(rk[..n].to_vec(), c.clone());
        }
        Ok(c)
    }
}

/// Decoded blocks, least recently used out first, bounded by the entries they hold (not by
/// their number: a level-0 block is a whole memtable, many times a deeper level's block, and
/// the bound is what the memory estimate of `docs/protocol/capsuledb.md` §3 counts).
struct BlockCache {
    lru: LruCache<RecordHash, Arc<Block>>,
    entries: usize,
    entries_max: usize,
}

impl BlockCache {
    fn new(entries_max: usize) -> BlockCache {
        BlockCache { lru: LruCache::unbounded(), entries: 0, entries_max: entries_max.max(1) }
    }

    fn get(&mut self, h: &RecordHash) -> Option<&Arc<Block>> {
        self.lru.get(h)
    }

    fn peek(&self, h: &RecordHash) -> Option<&Arc<Block>> {
        self.lru.peek(h)
    }

    /// Caches `b` unless it alone is over the bound; evicts the least recently used blocks
    /// until the bound holds again.
    fn put(&mut self, h: RecordHash, b: Arc<Block>) {
        let n = b.entries.len();
        if n > self.entries_max {
            return;
        }
        if let Some(old) = self.lru.put(h, b) {
            self.entries -= old.entries.len();
        }
        self.entries += n;
        while self.entries > self.entries_max {
            match self.lru.pop_lru() {
                Some((_, old)) => self.entries -= old.entries.len(),
                None => break,
            }
        }
        debug_assert!(self.entries <= self.entries_max);
    }

    fn clear(&mut self) {
        self.lru.clear();
        self.entries = 0;
    }
}

/// A memtable's entries, sorted by key.
type Run = Vec<(Vec<u8>, Cell)>;

/// What readers look at: the memtable, a memtable being frozen, and the current index.
struct Mem {
    active: BTreeMap<Vec<u8>, Cell>,
    /// A memtable being written out as a level-0 block: still read until the index holding
    /// that block is published (in the same critical section that clears this).
    frozen: Option<Arc<Run>>,
    index: Arc<Index>,
    /// `index`'s level-0 runs ([`lsm::l0_run_ranges`]), found once per index.
    l0_runs: Arc<Vec<std::ops::Range<usize>>>,
}

/// The writers' state (apply, freeze, compaction installs), under [`Inner::w`].
struct WriteSide {
    /// Highest Lamport time applied per writer since the last freeze.
    pending_frontier: BTreeMap<u32, u64>,
    /// The newest index record (`None` before `create` wrote index 0).
    newest: Option<RecordHash>,
    /// A compaction job is planned or running in the background thread.
    compacting: bool,
    /// The background compaction's last failure (cleared by its next success).
    compact_error: Option<String>,
}

/// Known snapshots, newest first; `walk_from` is the next older index to load, if any.
struct History {
    snapshots: Vec<(u64, RecordHash)>,
    walk_from: Option<RecordHash>,
}

struct Inner {
    config: Config,
    io: Io,
    mem: RwLock<Mem>,
    w: PMutex<WriteSide>,
    /// Signalled when an index is published or the compactor goes idle or fails.
    changed: Condvar,
    history: PMutex<History>,
    background: AtomicBool,
    stop: AtomicBool,
}

/// Level 0 may hold this many times `l0_blocks_max` blocks while a background compaction runs;
/// a freeze beyond it waits (backpressure on the applier, so memory and read cost stay bounded).
const L0_STALL_FACTOR: usize = 2;

impl Inner {
    fn index(&self) -> Arc<Index> {
        self.mem.read().index.clone()
    }

    fn get_cell(&self, key: &[u8]) -> Result<Option<Cell>, Error> {
        let (mem, index) = {
            let m = self.mem.read();
            let a = m.active.get(key).cloned();
            let f = m
                .frozen
                .as_ref()
                .and_then(|f| f.binary_search_by(|(k, _)| k.as_slice().cmp(key)).ok().map(|i| f[i].1.clone()));
            (newest(a, f), (m.index.clone(), m.l0_runs.clone()))
        };
        let (index, l0) = index;
        Ok(newest(mem, lsm::get_in_index_with_runs(&index, &l0, &self.io, key)?))
    }

    /// The first `limit` keys that start with `prefix` and sort above `after`, with their
    /// newest cells (tombstones included) in key order, and whether more follow: the memtable,
    /// a frozen memtable and every run of the index, each asked for its first `limit + 1`.
    fn scan(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, Error> {
        let n = limit.saturating_add(1);
        let (mut acc, index, l0) = {
            let m = self.mem.read();
            let mut acc: BTreeMap<Vec<u8>, Cell> = BTreeMap::new();
            let take = |acc: &mut BTreeMap<Vec<u8>, Cell>, it: &mut dyn Iterator<Item = (&Vec<u8>, &Cell)>| {
                for (k, c) in it.filter(|(k, _)| lsm::scan_wants(k, prefix, after)).take(n) {
                    match acc.get_mut(k) {
                        Some(x) if c.0 > x.0 => *x = c.clone(),
                        Some(_) => {}
                        None => {
                            acc.insert(k.clone(), c.clone());
                        }
                    }
                }
            };
            let lo = match after {
                Some(a) if a > prefix => a.to_vec(),
                _ => prefix.to_vec(),
            };
            take(&mut acc, &mut m.active.range(lo.clone()..).take_while(|(k, _)| k.starts_with(prefix)));
            if let Some(f) = &m.frozen {
                let i = f.partition_point(|(k, _)| k.as_slice() < lo.as_slice());
                take(&mut acc, &mut f[i..].iter().take_while(|(k, _)| k.starts_with(prefix)).map(|(k, c)| (k, c)));
            }
            (acc, m.index.clone(), m.l0_runs.clone())
        };
        for (k, c) in lsm::scan_in_index(&index, &l0, &self.io, prefix, after, n)? {
            match acc.get_mut(&k) {
                Some(x) if c.0 > x.0 => *x = c,
                Some(_) => {}
                None => {
                    acc.insert(k, c);
                }
            }
        }
        let more = acc.len() > limit;
        Ok((acc.into_iter().take(limit).collect(), more))
    }

    /// Writes `index` as the newest index record (blocks synced first, then the index, then
    /// synced again) and publishes it to readers; `clear_frozen` drops the frozen memtable in
    /// the same critical section (its block is in `index`).
    fn write_index(&self, w: &mut WriteSide, mut index: Index, clear_frozen: bool) -> Result<(), Error> {
        index.prev = w.newest;
        self.io.sync()?;
        let hash = self.io.write(Body::DbIndex(index.encode()))?;
        self.io.sync()?;
        w.newest = Some(hash);
        self.history.lock().snapshots.insert(0, (index.seq, hash));
        {
            let mut m = self.mem.write();
            m.l0_runs = Arc::new(index.levels.first().map(|l| lsm::l0_run_ranges(l)).unwrap_or_default());
            m.index = Arc::new(index);
            if clear_frozen {
                m.frozen = None;
            }
        }
        self.changed.notify_all();
        Ok(())
    }

    fn apply(&self, key: &[u8], version: Version, value: Option<Vec<u8>>) -> Result<(), Error> {
        lsm::check_kv(key, value.as_deref())?;
        let mut w = self.w.lock();
        let f = w.pending_frontier.entry(version.writer).or_insert(0);
        *f = (*f).max(version.lamport);
        let len = {
            let mut m = self.mem.write();
            match m.active.get(key) {
                Some((v, _)) if *v > version => {}
                _ => {
                    m.active.insert(key.to_vec(), (version, value));
                }
            }
            m.active.len()
        };
        if len > self.config.memtable_entries_max {
            self.freeze(&mut w)?;
        }
        Ok(())
    }

    /// Freezes the memtable into level 0 (if non-empty) and writes a new index; without a
    /// background compactor, first runs the compactions the freeze makes necessary. Returns
    /// `true` when the index changed.
    fn freeze(&self, w: &mut parking_lot::MutexGuard<'_, WriteSide>) -> Result<bool, Error> {
        let background = self.background.load(Ordering::Acquire);
        if background {
            let stall = self.config.l0_blocks_max.saturating_mul(L0_STALL_FACTOR);
            let mut stalled = false;
            while self.index().levels.first().map_or(0, |l| lsm::l0_runs(l).count()) >= stall
                && !self.stop.load(Ordering::Acquire)
            {
                if let Some(e) = &w.compact_error {
                    return Err(Error::Store(format!("level 0 is full and compaction fails: {e}")));
                }
                if !stalled {
                    stalled = true;
                    bump(&self.io.stats.write_stalls);
                }
                self.changed.wait_for(w, Duration::from_millis(50));
            }
        }
        let entries = {
            let mut m = self.mem.write();
            if m.active.is_empty() {
                return Ok(false);
            }
            let e: Arc<Run> = Arc::new(std::mem::take(&mut m.active).into_iter().collect());
            m.frozen = Some(e.clone());
            e
        };
        match self.freeze_entries(w, &entries, background) {
            Ok(()) => {
                w.pending_frontier.clear();
                Ok(true)
            }
            Err(e) => {
                // Back into the memtable (newer versions applied meanwhile win): nothing lost.
                let mut m = self.mem.write();
                for (k, c) in entries.iter() {
                    match m.active.get(k) {
                        Some((v, _)) if *v >= c.0 => {}
                        _ => {
                            m.active.insert(k.clone(), c.clone());
                        }
                    }
                }
                m.frozen = None;
                Err(e)
            }
        }
    }

    fn freeze_entries(&self, w: &mut WriteSide, entries: &[(Vec<u8>, Cell)], background: bool) -> Result<(), Error> {
        let refs = lsm::freeze(&self.config, &self.io, entries)?;
        let mut index = (*self.index()).clone();
        for (wr, l) in &w.pending_frontier {
            let f = index.frontier.entry(*wr).or_insert(0);
            *f = (*f).max(*l);
        }
        if index.levels.is_empty() {
            index.levels.push(Vec::new());
        }
        for r in refs.into_iter().rev() {
            index.levels[0].insert(0, r);
        }
        if !background {
            while let Some(job) = lsm::plan(&self.config, &index) {
                let out = lsm::merge(&self.config, &self.io, &job, &|| false)?
                    .ok_or(Error::Invalid("an inline compaction cannot be stopped"))?;
                lsm::install(&mut index, &job, out)?;
                bump(&self.io.stats.compactions);
            }
        }
        index.seq += 1;
        self.write_index(w, index, true)
    }

    /// The background compaction thread: plans a job from the current index, merges without
    /// holding a lock, installs the result under the writers' mutex in a new index.
    fn compact_loop(&self) {
        while !self.stop.load(Ordering::Acquire) {
            let job = {
                let mut w = self.w.lock();
                match lsm::plan(&self.config, &self.index()) {
                    Some(job) => {
                        w.compacting = true;
                        job
                    }
                    None => {
                        w.compacting = false;
                        self.changed.notify_all();
                        // Every new index (and the stop) notifies: this only bounds a wait
                        // that nothing would end.
                        self.changed.wait_for(&mut w, Duration::from_millis(1_000));
                        continue;
                    }
                }
            };
            let res = lsm::merge(&self.config, &self.io, &job, &|| self.stop.load(Ordering::Acquire));
            let mut w = self.w.lock();
            let res = res.and_then(|out| {
                let Some(out) = out else { return Ok(()) };
                let mut index = (*self.index()).clone();
                lsm::install(&mut index, &job, out)?;
                index.seq += 1;
                self.write_index(&mut w, index, false)?;
                bump(&self.io.stats.compactions);
                Ok(())
            });
            match res {
                Ok(()) => w.compact_error = None,
                Err(e) => {
                    tracing::error!("capsuledb: background compaction failed: {e}");
                    w.compact_error = Some(e.to_string());
                    self.changed.notify_all();
                    // Retry later (a store may come back).
                    self.changed.wait_for(&mut w, Duration::from_millis(200));
                }
            }
        }
    }
}

/// A handle for concurrent readers (e.g. the role's answer thread): reads never wait for a
/// compaction, only for the short critical sections that publish a new index or apply a write.
#[derive(Clone)]
pub struct Reader {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "capsuledb::Reader(seq={})", self.index_seq())
    }
}

impl Reader {
    /// The newest entry for `key` with its version: `Some((v, None))` is a tombstone.
    pub fn get_cell(&self, key: &[u8]) -> Result<Option<Cell>, Error> {
        self.inner.get_cell(key)
    }

    /// The sequence number of the index reads currently go through.
    pub fn index_seq(&self) -> u64 {
        self.inner.index().seq
    }

    /// Keeps a data record (the proof of the entries it wrote, `dbwire`) in every store that
    /// takes it; synced with the next index. For stores that hold nothing else of the capsule
    /// (directories, memory): the role does not call it with the capsule servers, which hold
    /// every record already.
    pub fn keep_record(&self, hash: RecordHash, bytes: &[u8]) -> Result<(), Error> {
        let mut last = String::new();
        let mut kept = 0;
        for s in &self.inner.io.stores {
            match s.put(hash, bytes.to_vec()) {
                Ok(()) => kept += 1,
                Err(e) => last = e.to_string(),
            }
        }
        if kept == 0 {
            return Err(Error::Store(last));
        }
        Ok(())
    }

    /// The record `hash` from the first store that holds it with that hash (a capsule server
    /// holds every data record of the capsule; a directory store those the role kept there).
    /// Not verified beyond its hash: whoever uses it verifies it (a worker checks an answer's
    /// records with its own verifier).
    pub fn record(&self, hash: &RecordHash) -> Option<Vec<u8>> {
        let io = &self.inner.io;
        io.stores.iter().find_map(|s| {
            let bytes = s.get(hash)?;
            let rec = Record::decode(&bytes, &io.limits).ok()?;
            (rec.hash().0 == *hash).then_some(bytes)
        })
    }

    /// The first `limit` keys starting with `prefix` and above `after`, in key order, with
    /// their newest entries (tombstones included), and whether more such keys exist.
    pub fn scan(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Result<ScanPage, Error> {
        self.inner.scan(prefix, after, limit)
    }
}

/// The database. Writes take `&mut self` (one applier); [`CapsuleDb::reader`] gives handles
/// that read concurrently.
pub struct CapsuleDb {
    inner: Arc<Inner>,
    compactor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CapsuleDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CapsuleDb(seq={}, memtable={})", self.index_seq(), self.memtable_len())
    }
}

impl Drop for CapsuleDb {
    fn drop(&mut self) {
        self.stop_compactor();
    }
}

impl CapsuleDb {
    fn make_io(
        config: &Config,
        stores: Vec<Arc<dyn BlockStore>>,
        verifier: Verifier,
        author: Author,
    ) -> Result<Io, Error> {
        config.validate()?;
        if stores.is_empty() {
            return Err(Error::Invalid("at least one store"));
        }
        let limits = verifier.metadata().meta.policy.limits;
        if let Some(c) = author.cert() {
            // Its own records are read back through this verifier (a certified capsule).
            verifier
                .install_statement(&psl_capsule::KeyStatement::Cert(c.clone()))
                .map_err(|_| Error::Invalid("the writer's certificate does not verify"))?;
        }
        let nz = |n: usize| NonZeroUsize::new(n.max(1)).unwrap_or(NonZeroUsize::MIN);
        let blocks = nz(config.cache_blocks_max / 2);
        let rows = nz(config.cache_blocks_max.saturating_mul(config.block_entries_max) / 4);
        Ok(Io {
            stores,
            verifier,
            limits,
            author: PMutex::new(author),
            put_order: PutOrder::new(),
            signers: OnceLock::new(),
            cache: PMutex::new(BlockCache::new(blocks.get().saturating_mul(config.block_entries_max))),
            rows: PMutex::new(LruCache::new(rows)),
            stats: AtomicStats::default(),
        })
    }

    fn from_parts(config: Config, io: Io, index: Index, newest: Option<RecordHash>) -> CapsuleDb {
        let history =
            History { snapshots: newest.map(|h| vec![(index.seq, h)]).unwrap_or_default(), walk_from: index.prev };
        let inner = Inner {
            config,
            io,
            mem: RwLock::new(Mem {
                active: BTreeMap::new(),
                frozen: None,
                l0_runs: Arc::new(index.levels.first().map(|l| lsm::l0_run_ranges(l)).unwrap_or_default()),
                index: Arc::new(index),
            }),
            w: PMutex::new(WriteSide {
                pending_frontier: BTreeMap::new(),
                newest,
                compacting: false,
                compact_error: None,
            }),
            changed: Condvar::new(),
            history: PMutex::new(history),
            background: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        };
        CapsuleDb { inner: Arc::new(inner), compactor: None }
    }

    /// A new, empty database; writes index 0. `author` writes the records, `verifier` (which
    /// must hold the data key) checks them on the way back.
    pub fn create(
        config: Config,
        stores: Vec<Arc<dyn BlockStore>>,
        verifier: Verifier,
        author: Author,
    ) -> Result<CapsuleDb, Error> {
        let io = Self::make_io(&config, stores, verifier, author)?;
        let db = Self::from_parts(config, io, Index::default(), None);
        {
            let mut w = db.inner.w.lock();
            db.inner.write_index(&mut w, Index::default(), false)?;
        }
        Ok(db)
    }

    /// Reopens from the newest index record; blocks are fetched lazily on reads. Writes made
    /// after that index (the memtable) are not in it: the caller replays them. A compaction
    /// that was running when the previous process stopped left only unreferenced blocks; the
    /// index names the tree as it was before it.
    pub fn open(
        config: Config,
        stores: Vec<Arc<dyn BlockStore>>,
        verifier: Verifier,
        author: Author,
        newest: RecordHash,
    ) -> Result<CapsuleDb, Error> {
        let io = Self::make_io(&config, stores, verifier, author)?;
        let (rec, index) = io.load_index(&newest)?;
        let h = rec.header();
        {
            // Continue the writer's chain after the index (the last record it wrote before it).
            let mut a = io.author.lock();
            if h.writer == a.writer() && h.seq >= a.next_seq() {
                a.resume(&Head { writer: h.writer, seq: h.seq, hash: rec.hash(), lamport: h.lamport, epoch: h.epoch });
            }
        }
        Ok(Self::from_parts(config, io, index, Some(newest)))
    }

    /// Runs compactions in a background thread from now on: a freeze only writes its level-0
    /// block and a new index, and waits only when level 0 holds `2 * l0_blocks_max` blocks
    /// (backpressure). Reads never wait for a compaction. Idempotent.
    pub fn start_compactor(&mut self) -> Result<(), Error> {
        if self.compactor.is_some() {
            return Ok(());
        }
        self.inner.background.store(true, Ordering::Release);
        let inner = self.inner.clone();
        let t = std::thread::Builder::new()
            .name("capsuledb-compact".into())
            .spawn(move || inner.compact_loop())
            .map_err(|e| Error::Store(format!("spawning the compaction thread: {e}")))?;
        self.compactor = Some(t);
        Ok(())
    }

    fn stop_compactor(&mut self) {
        if let Some(t) = self.compactor.take() {
            self.inner.stop.store(true, Ordering::Release);
            self.inner.changed.notify_all();
            let _ = t.join();
        }
    }

    /// Waits until the background compactor has nothing left to do (at once without one).
    /// Fails if its last attempt failed.
    pub fn wait_compactions(&self) -> Result<(), Error> {
        if self.compactor.is_none() {
            return Ok(());
        }
        let mut w = self.inner.w.lock();
        loop {
            if let Some(e) = &w.compact_error {
                return Err(Error::Store(format!("background compaction failed: {e}")));
            }
            if !w.compacting && lsm::plan(&self.inner.config, &self.inner.index()).is_none() {
                return Ok(());
            }
            self.inner.changed.wait_for(&mut w, Duration::from_millis(50));
        }
    }

    /// A background compaction is planned or running (tests: crash points).
    pub fn compacting(&self) -> bool {
        self.inner.w.lock().compacting
    }

    /// A handle reading concurrently with this database's writes and compactions.
    pub fn reader(&self) -> Reader {
        Reader { inner: self.inner.clone() }
    }

    /// Puts (`Some`) or deletes (`None`) `key` at `version`. An older version than the one the
    /// memtable holds for the key is ignored; reads and compactions keep the highest
    /// `(lamport, writer)` wherever it sits, so writes may arrive in any version order.
    pub fn apply(&mut self, key: &[u8], version: Version, value: Option<Vec<u8>>) -> Result<(), Error> {
        self.inner.apply(key, version, value)
    }

    /// Puts `value` under `key` at `version` ([`CapsuleDb::apply`]).
    pub fn put(&mut self, key: &[u8], version: Version, value: Vec<u8>) -> Result<(), Error> {
        self.apply(key, version, Some(value))
    }

    /// Writes a tombstone for `key` at `version` ([`CapsuleDb::apply`]).
    pub fn delete(&mut self, key: &[u8], version: Version) -> Result<(), Error> {
        self.apply(key, version, None)
    }

    /// Freezes the memtable into a block and writes a new index (if the memtable held anything).
    pub fn flush(&mut self) -> Result<(), Error> {
        let mut w = self.inner.w.lock();
        self.inner.freeze(&mut w)?;
        Ok(())
    }

    /// The newest entry for `key` with its version: `Some((v, None))` is a tombstone.
    pub fn get_cell(&mut self, key: &[u8]) -> Result<Option<Cell>, Error> {
        self.inner.get_cell(key)
    }

    /// The current value of `key` (`None` if absent or deleted).
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.get_cell(key)?.and_then(|c| c.1))
    }

    /// `key` as of index `seq` (memtable writes after that index are not seen).
    pub fn get_at(&mut self, seq: u64, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.get_cell_at(seq, key)?.and_then(|c| c.1))
    }

    /// `key` with its version as of index `seq`.
    pub fn get_cell_at(&mut self, seq: u64, key: &[u8]) -> Result<Option<Cell>, Error> {
        let hash = self.find_snapshot(seq)?;
        let (_, index) = self.inner.io.load_index(&hash)?;
        if index.seq != seq {
            return Err(Error::Invalid("index chain is inconsistent"));
        }
        get_in_index(&index, &self.inner.io, key)
    }

    fn find_snapshot(&self, seq: u64) -> Result<RecordHash, Error> {
        let mut h = self.inner.history.lock();
        loop {
            if let Some((_, hash)) = h.snapshots.iter().find(|s| s.0 == seq) {
                return Ok(*hash);
            }
            if h.snapshots.last().is_some_and(|s| s.0 < seq) || !self.walk_one(&mut h)? {
                return Err(Error::UnknownSnapshot(seq));
            }
        }
    }

    fn walk_one(&self, h: &mut History) -> Result<bool, Error> {
        let Some(from) = h.walk_from else { return Ok(false) };
        let (_, index) = self.inner.io.load_index(&from)?;
        h.snapshots.push((index.seq, from));
        h.walk_from = index.prev;
        Ok(true)
    }

    /// Sequence numbers of every index kept, newest first (walks the chain of old indexes).
    pub fn snapshots(&mut self) -> Result<Vec<u64>, Error> {
        let mut h = self.inner.history.lock();
        while self.walk_one(&mut h)? {}
        Ok(h.snapshots.iter().map(|s| s.0).collect())
    }

    /// Hash of the newest index record: what [`CapsuleDb::open`] restarts from.
    pub fn newest_index(&self) -> RecordHash {
        self.inner.w.lock().newest.unwrap_or_default()
    }

    /// Per writer, the Lamport time up to which every write is in a stored block (see
    /// [`crate::Index::frontier`]): what a worker may evict, since this database can serve it.
    pub fn frontier(&self) -> BTreeMap<u32, u64> {
        self.inner.index().frontier.clone()
    }

    /// Entries in the (unstored) memtable.
    pub fn memtable_len(&self) -> usize {
        self.inner.mem.read().active.len()
    }

    /// Sequence number of the current index.
    pub fn index_seq(&self) -> u64 {
        self.inner.index().seq
    }

    /// The current index (a snapshot: later changes publish a new one).
    pub fn index(&self) -> Arc<Index> {
        self.inner.index()
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.inner.io.stats.get()
    }

    /// Drops every cached block (so that the next reads go to the stores).
    pub fn clear_cache(&mut self) {
        self.inner.io.cache.lock().clear();
        self.inner.io.rows.lock().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(n: usize) -> Arc<Block> {
        let cell = (Version::new(1, 1), Some(vec![0u8]));
        Arc::new(Block { entries: (0..n).map(|i| ((i as u32).to_be_bytes().to_vec(), cell.clone())).collect() })
    }

    fn h(i: u8) -> RecordHash {
        [i; 32]
    }

    #[test]
    fn block_cache_is_bounded_by_entries_least_recently_used_out_first() {
        let mut c = BlockCache::new(10);
        c.put(h(1), block(4));
        c.put(h(2), block(4));
        assert!(c.get(&h(1)).is_some()); // 1 is now the most recently used
        c.put(h(3), block(4)); // 12 > 10: the least recently used (2) goes
        assert!(c.peek(&h(2)).is_none());
        assert!(c.peek(&h(1)).is_some() && c.peek(&h(3)).is_some());
        assert_eq!(c.entries, 8);
        // The same block again is counted once.
        c.put(h(3), block(4));
        assert_eq!(c.entries, 8);
        // A block larger than the whole bound is not cached and evicts nothing.
        c.put(h(4), block(11));
        assert!(c.peek(&h(4)).is_none());
        assert_eq!(c.entries, 8);
        // One as large as the bound pushes out everything else.
        c.put(h(5), block(10));
        assert_eq!(c.entries, 10);
        assert!(c.peek(&h(1)).is_none() && c.peek(&h(3)).is_none());
        c.clear();
        assert_eq!(c.entries, 0);
        assert!(c.peek(&h(5)).is_none());
    }
}
