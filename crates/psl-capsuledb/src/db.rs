//! [`CapsuleDb`]: the LSM core with every block and every index stored as a signed, encrypted
//! DataCapsule record (`db-block` / `db-index`) in one or more [`BlockStore`]s.
//!
//! A read fetches the record by hash from the first store, decodes it, runs it through the
//! [`Verifier`] (signature, decryption), and checks that its hash is the pointer the index
//! holds and its kind is the expected one. Any failure counts as a rejected copy and the next
//! store is tried.

use crate::codec::{Block, BlockRef, Index};
use crate::lsm::{get_in_index, Blocks, Config, Tree};
use crate::{Cell, Error, RecordHash, Version};
use lru::LruCache;
use psl_capsule::replica::Head;
use psl_capsule::{Author, Body, Limits, Record, Verifier};
use psl_crypto::Hash256;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

/// Somewhere sealed record bytes are kept, addressed by record hash. Stores are untrusted:
/// whatever they return is verified.
pub trait BlockStore: Send + Sync {
    fn put(&self, hash: RecordHash, bytes: Vec<u8>) -> std::io::Result<()>;
    fn get(&self, hash: &RecordHash) -> Option<Vec<u8>>;
    /// Makes every record put so far durable. Called before and after each index record, so
    /// that an index is never durable before the blocks it points at (and a store may batch).
    fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An in-memory store (tests, and the shape of a capsule server's record map).
#[derive(Debug, Default)]
pub struct MemStore {
    map: Mutex<HashMap<RecordHash, Vec<u8>>>,
}

impl MemStore {
    pub fn new() -> Arc<MemStore> {
        Arc::new(MemStore::default())
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

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
    pub records_written: u64,
    pub block_fetches: u64,
    pub cache_hits: u64,
    /// Copies that failed decoding, verification, the hash check or the kind check.
    pub rejected_copies: u64,
    /// Stores that did not hold a requested record.
    pub missing_copies: u64,
}

struct Io {
    stores: Vec<Arc<dyn BlockStore>>,
    verifier: Verifier,
    limits: Limits,
    author: Author,
    cache: LruCache<RecordHash, Arc<Block>>,
    stats: Stats,
}

enum Want {
    Block,
    Index,
}

impl Io {
    fn write(&mut self, body: Body) -> Result<RecordHash, Error> {
        let rec = self.author.write_body(body).map_err(|e| Error::Seal(e.to_string()))?;
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
        self.stats.records_written += 1;
        Ok(hash)
    }

    /// Syncs every store; it is enough that one succeeds (as for writes).
    fn sync(&mut self) -> Result<(), Error> {
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

    /// Fetches, verifies and opens the record `hash`, trying each store in order.
    fn fetch(&mut self, hash: &RecordHash, want: Want) -> Result<(Record, Vec<u8>), Error> {
        let mut last = String::from("no store holds it");
        for s in &self.stores {
            let Some(bytes) = s.get(hash) else {
                self.stats.missing_copies += 1;
                continue;
            };
            let checked = Record::decode(&bytes, &self.limits)
                .map_err(|e| format!("decode: {e}"))
                .and_then(|rec| self.verifier.verify_open(rec).map_err(|e| format!("verify: {e}")))
                .and_then(|opened| {
                    let opened = opened.into_inner();
                    if opened.record.hash().0 != *hash {
                        return Err("record hash differs from the pointer".to_string());
                    }
                    match (want_kind(&want), opened.body) {
                        (true, Body::DbBlock(b)) | (false, Body::DbIndex(b)) => Ok((opened.record, b)),
                        _ => Err("record is not of the expected kind".to_string()),
                    }
                });
            match checked {
                Ok(x) => return Ok(x),
                Err(e) => {
                    self.stats.rejected_copies += 1;
                    last = e;
                }
            }
        }
        Err(Error::Unavailable { hash: Hash256(*hash).to_hex(), tried: self.stores.len(), last })
    }

    fn load_index(&mut self, hash: &RecordHash) -> Result<(Record, Index), Error> {
        let (rec, body) = self.fetch(hash, Want::Index)?;
        Ok((rec, Index::decode(&body)?))
    }
}

fn want_kind(w: &Want) -> bool {
    matches!(w, Want::Block)
}

impl Blocks for Io {
    fn load(&mut self, r: &BlockRef) -> Result<Arc<Block>, Error> {
        if let Some(b) = self.cache.get(&r.hash) {
            self.stats.cache_hits += 1;
            return Ok(b.clone());
        }
        self.stats.block_fetches += 1;
        let (_, body) = self.fetch(&r.hash, Want::Block)?;
        let b = Arc::new(Block::decode(&body)?);
        if b.entries.len() != r.entries as usize
            || b.entries.first().map(|e| &e.0) != Some(&r.min)
            || b.entries.last().map(|e| &e.0) != Some(&r.max)
        {
            return Err(Error::Invalid("block does not match its index entry"));
        }
        self.cache.put(r.hash, b.clone());
        Ok(b)
    }

    fn save(&mut self, b: &Block) -> Result<RecordHash, Error> {
        let hash = self.write(Body::DbBlock(b.encode()))?;
        self.cache.put(hash, Arc::new(b.clone()));
        Ok(hash)
    }
}

/// The database. Single-threaded: wrap it in a lock to share it.
pub struct CapsuleDb {
    tree: Tree,
    io: Io,
    newest: RecordHash,
    /// Known snapshots, newest first; `walk_from` is the next older index to load, if any.
    snapshots: Vec<(u64, RecordHash)>,
    walk_from: Option<RecordHash>,
}

impl std::fmt::Debug for CapsuleDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CapsuleDb(seq={}, memtable={})", self.tree.index().seq, self.tree.memtable_len())
    }
}

impl CapsuleDb {
    fn io(config: &Config, stores: Vec<Arc<dyn BlockStore>>, verifier: Verifier, author: Author) -> Result<Io, Error> {
        config.validate()?;
        if stores.is_empty() {
            return Err(Error::Invalid("at least one store"));
        }
        let limits = verifier.metadata().meta.policy.limits;
        let cap = NonZeroUsize::new(config.cache_blocks_max.max(1)).unwrap_or(NonZeroUsize::MIN);
        Ok(Io { stores, verifier, limits, author, cache: LruCache::new(cap), stats: Stats::default() })
    }

    /// A new, empty database; writes index 0. `author` writes the records, `verifier` (which
    /// must hold the data key) checks them on the way back.
    pub fn create(
        config: Config,
        stores: Vec<Arc<dyn BlockStore>>,
        verifier: Verifier,
        author: Author,
    ) -> Result<CapsuleDb, Error> {
        let io = Self::io(&config, stores, verifier, author)?;
        let mut db =
            CapsuleDb { tree: Tree::new(config)?, io, newest: [0; 32], snapshots: Vec::new(), walk_from: None };
        db.write_index()?;
        Ok(db)
    }

    /// Reopens from the newest index record; blocks are fetched lazily on reads. Writes made
    /// after that index (the memtable) are not in it: the caller replays them.
    pub fn open(
        config: Config,
        stores: Vec<Arc<dyn BlockStore>>,
        verifier: Verifier,
        author: Author,
        newest: RecordHash,
    ) -> Result<CapsuleDb, Error> {
        let mut io = Self::io(&config, stores, verifier, author)?;
        let (rec, index) = io.load_index(&newest)?;
        let h = rec.header();
        // Continue the writer's chain after the index (the last record it wrote before it).
        if h.writer == io.author.writer() && h.seq >= io.author.next_seq() {
            io.author.resume(&Head {
                writer: h.writer,
                seq: h.seq,
                hash: rec.hash(),
                lamport: h.lamport,
                epoch: h.epoch,
            });
        }
        let snapshots = vec![(index.seq, newest)];
        let walk_from = index.prev;
        Ok(CapsuleDb { tree: Tree::with_index(config, index)?, io, newest, snapshots, walk_from })
    }

    fn write_index(&mut self) -> Result<(), Error> {
        let mut index = self.tree.index().clone();
        index.prev = self.snapshots.first().map(|s| s.1);
        self.io.sync()?;
        let hash = self.io.write(Body::DbIndex(index.encode()))?;
        self.io.sync()?;
        self.newest = hash;
        self.snapshots.insert(0, (index.seq, hash));
        Ok(())
    }

    /// Puts (`Some`) or deletes (`None`) `key` at `version`.
    pub fn apply(&mut self, key: &[u8], version: Version, value: Option<Vec<u8>>) -> Result<(), Error> {
        if self.tree.apply(&mut self.io, key, version, value)? {
            self.write_index()?;
        }
        Ok(())
    }

    pub fn put(&mut self, key: &[u8], version: Version, value: Vec<u8>) -> Result<(), Error> {
        self.apply(key, version, Some(value))
    }

    pub fn delete(&mut self, key: &[u8], version: Version) -> Result<(), Error> {
        self.apply(key, version, None)
    }

    /// Freezes the memtable into a block and writes a new index (if the memtable held anything).
    pub fn flush(&mut self) -> Result<(), Error> {
        if self.tree.flush(&mut self.io)? {
            self.write_index()?;
        }
        Ok(())
    }

    /// The newest entry for `key` with its version: `Some((v, None))` is a tombstone.
    pub fn get_cell(&mut self, key: &[u8]) -> Result<Option<Cell>, Error> {
        self.tree.get(&mut self.io, key)
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
        let (_, index) = self.io.load_index(&hash)?;
        if index.seq != seq {
            return Err(Error::Invalid("index chain is inconsistent"));
        }
        get_in_index(&index, &mut self.io, key)
    }

    fn find_snapshot(&mut self, seq: u64) -> Result<RecordHash, Error> {
        loop {
            if let Some((_, h)) = self.snapshots.iter().find(|s| s.0 == seq) {
                return Ok(*h);
            }
            if self.snapshots.last().is_some_and(|s| s.0 < seq) || !self.walk_one()? {
                return Err(Error::UnknownSnapshot(seq));
            }
        }
    }

    fn walk_one(&mut self) -> Result<bool, Error> {
        let Some(h) = self.walk_from else { return Ok(false) };
        let (_, index) = self.io.load_index(&h)?;
        self.snapshots.push((index.seq, h));
        self.walk_from = index.prev;
        Ok(true)
    }

    /// Sequence numbers of every index kept, newest first (walks the chain of old indexes).
    pub fn snapshots(&mut self) -> Result<Vec<u64>, Error> {
        while self.walk_one()? {}
        Ok(self.snapshots.iter().map(|s| s.0).collect())
    }

    /// Hash of the newest index record: what [`CapsuleDb::open`] restarts from.
    pub fn newest_index(&self) -> RecordHash {
        self.newest
    }

    /// Per writer, the Lamport time up to which every write is in a stored block (see
    /// [`crate::Index::frontier`]): what a worker may evict, since this database can serve it.
    pub fn frontier(&self) -> &std::collections::BTreeMap<u32, u64> {
        self.tree.frontier()
    }

    /// Entries in the (unstored) memtable.
    pub fn memtable_len(&self) -> usize {
        self.tree.memtable_len()
    }

    pub fn index_seq(&self) -> u64 {
        self.tree.index().seq
    }

    pub fn index(&self) -> &Index {
        self.tree.index()
    }

    pub fn stats(&self) -> Stats {
        self.io.stats
    }

    /// Drops every cached block (so that the next reads go to the stores).
    pub fn clear_cache(&mut self) {
        self.io.cache.clear();
    }
}
