//! The index: where each record's frame is, each writer's chain by seq, and which chain slot
//! a hash names. It holds hashes and offsets only, never record bytes.
//!
//! An index is either held in memory whole (`Index::default`: read-only opens and
//! checks) or **spilled** to files beside the log (`Index::spilled`: every writable store),
//! so that a store's memory does not grow with its records. A spilled index keeps in memory
//! per writer only its newest `chain_window` entries and its head, plus the hashes of records
//! not yet in a run (at most `recent_max`); everything else is in the index directory
//! (`docs/formats/store.md` has the byte layouts):
//!
//! - `chain-<writer>`: one 48-byte entry per seq, `hash ‖ offset u64 ‖ len u32 ‖ crc32`, so
//!   that slot `seq` is at `seq × 48`;
//! - `run-<id>`: sorted runs of 20-byte entries `hash prefix u64 BE ‖ writer u32 ‖ seq u64`,
//!   written when `recent_max` hashes have gathered and merged two at a time while the newer
//!   is at least half the older (so there are about log2(records / recent_max) runs); a
//!   lookup binary-searches each run's in-memory fences (one per 4 KiB block) and reads one
//!   or two blocks;
//! - `checkpoint`: what the index covered when it was last made durable (`Checkpoint`).
//!
//! Index files are derived data and are never trusted for content: every record found
//! through them is read back from the log and checked against its hash (and its signature)
//! before it is returned, and a chain entry carries a CRC. Damage in them makes a lookup
//! fail or miss; the log, from which they are rebuilt, stays the truth.

use psl_capsule::{CapsuleName, Head, Kind, Record};
use psl_crypto::Hash256;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::fsutil::{read_exact_at, replace_atomic, sync_dir, write_all_at};

/// Where a record's frame is in `records.log`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Offset of the frame header.
    pub offset: u64,
    /// Record bytes (the frame is 8 bytes longer).
    pub len: u32,
}

/// One chain slot: the record's hash and where its frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub hash: Hash256,
    pub loc: Loc,
}

/// Bytes of a chain entry on disk.
pub(crate) const ENTRY_BYTES: u64 = 48;
/// Bytes of a run entry on disk.
const RUN_ENTRY_BYTES: u64 = 20;
/// Run entries per block (one fence per block): 4,080 bytes.
const RUN_BLOCK_ENTRIES: u64 = 204;

impl Entry {
    fn encode(&self) -> [u8; ENTRY_BYTES as usize] {
        let mut b = [0u8; ENTRY_BYTES as usize];
        b[..32].copy_from_slice(&self.hash.0);
        b[32..40].copy_from_slice(&self.loc.offset.to_le_bytes());
        b[40..44].copy_from_slice(&self.loc.len.to_le_bytes());
        let crc = crc32fast::hash(&b[..44]);
        b[44..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Entry> {
        let crc = u32::from_le_bytes(b.get(44..48)?.try_into().ok()?);
        if crc32fast::hash(&b[..44]) != crc {
            return None;
        }
        let hash = Hash256(b[..32].try_into().ok()?);
        let offset = u64::from_le_bytes(b[32..40].try_into().ok()?);
        let len = u32::from_le_bytes(b[40..44].try_into().ok()?);
        Some(Entry { hash, loc: Loc { offset, len } })
    }
}

fn prefix(h: &Hash256) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.0[..8]);
    u64::from_be_bytes(b)
}

/// How much of a spilled index stays in memory, and how often it is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// Newest chain entries kept in memory per writer (48 bytes each): appends, duplicate
    /// checks and repairs name recent seqs.
    pub chain_window: usize,
    /// Hashes of records not yet in a run kept in memory (about 60 bytes each) before they are
    /// written out as a sorted run.
    pub recent_max: usize,
    /// Records appended between checkpoints (a checkpoint is also written with every new run).
    pub checkpoint_records: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig { chain_window: 4096, recent_max: 1 << 16, checkpoint_records: 1 << 16 }
    }
}

/// One writer's chain: its length and head, and its newest entries.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chain {
    len: u64,
    head: Hash256,
    pub lamport: u64,
    pub epoch: u64,
    /// Entries of seqs `mem_base..len`, oldest first (all of them when not spilled).
    mem: VecDeque<Entry>,
    mem_base: u64,
    /// Entries `0..written` are in the chain file (spilled indexes only).
    written: u64,
}

impl Chain {
    pub fn next_seq(&self) -> u64 {
        self.len
    }

    pub fn head_hash(&self) -> Hash256 {
        self.head
    }
}

/// Why a verified record found in the log could not join its writer's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanCause {
    /// Its seq is past the writer's next seq: an earlier record is missing (damaged).
    Gap {
        /// The writer's next seq: the seq its chain ends before.
        expected: u64,
    },
    /// Its seq is the next one but its `prev` is not the writer's head.
    Prev {
        /// Hash of the writer's head, which `prev` should have named.
        expected: Hash256,
    },
    /// Another record already holds its (writer, seq) slot.
    SlotTaken {
        /// Hash of the record loaded in that slot.
        stored: Hash256,
    },
    /// A revocation found in the log refuses it (its writer, from that epoch or seq on): it was
    /// stored before the revocation was known. It and its writer's later records are not loaded.
    Revoked {
        /// The revocation's epoch bound: the writer's records of this epoch or later are refused.
        from_epoch: u64,
        /// The revocation's seq bound: the writer's records from this seq on are refused
        /// (`u64::MAX`: no seq bound).
        from_seq: u64,
    },
}

/// [`Orphan::index`] of a record cut by a revocation found later in the log: the open keeps
/// no frame numbers once a record is loaded, so only its offset is named.
pub const FRAME_INDEX_UNKNOWN: u64 = u64::MAX;

/// A record that verified but was not loaded, because it cannot extend its writer's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Position of the frame in the log, from 0 ([`FRAME_INDEX_UNKNOWN`] if not known).
    pub index: u64,
    /// Byte offset of the frame header in `records.log`.
    pub offset: u64,
    /// The record's writer.
    pub writer: u32,
    /// The record's seq in its writer's chain.
    pub seq: u64,
    /// The record's hash.
    pub hash: Hash256,
    /// Why it could not join its writer's chain.
    pub cause: OrphanCause,
}

impl fmt::Display for Orphan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.index == FRAME_INDEX_UNKNOWN {
            write!(f, "records.log frame at offset {}: ", self.offset)?;
        } else {
            write!(f, "records.log frame #{} at offset {}: ", self.index, self.offset)?;
        }
        write!(f, "record {} (writer {}, seq {}) is orphaned: ", self.hash, self.writer, self.seq)?;
        match &self.cause {
            OrphanCause::Gap { expected } => {
                write!(f, "the writer's chain ends before seq {expected}")
            }
            OrphanCause::Prev { expected } => {
                write!(f, "its prev does not point at the writer's head {expected}")
            }
            OrphanCause::SlotTaken { stored } => {
                write!(f, "the slot is already held by record {stored}")
            }
            OrphanCause::Revoked { from_epoch, from_seq } => {
                write!(f, "its writer is revoked from epoch {from_epoch} or seq {from_seq} on")
            }
        }
    }
}

pub(crate) enum Placement {
    Extends,
    Duplicate,
    Orphan(OrphanCause),
}

/// A sorted run of `(hash prefix, writer, seq)` on disk.
#[derive(Debug)]
struct Run {
    id: u64,
    file: File,
    entries: u64,
    /// The prefix of the first entry of each block.
    fences: Vec<u64>,
}

impl Run {
    fn path(dir: &Path, id: u64) -> PathBuf {
        dir.join(format!("run-{id:08}"))
    }

    /// Opens run `id` and loads its fences; its size must be `entries` entries.
    fn open(dir: &Path, id: u64, entries: u64) -> io::Result<Run> {
        let file = File::open(Run::path(dir, id))?;
        let size = file.metadata()?.len();
        if entries.checked_mul(RUN_ENTRY_BYTES) != Some(size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("run {id} is {size} bytes, the checkpoint says {entries} entries"),
            ));
        }
        let blocks = entries.div_ceil(RUN_BLOCK_ENTRIES);
        let mut fences = Vec::with_capacity(blocks as usize);
        let mut b = [0u8; 8];
        for i in 0..blocks {
            read_exact_at(&file, &mut b, i * RUN_BLOCK_ENTRIES * RUN_ENTRY_BYTES)?;
            fences.push(u64::from_be_bytes(b));
        }
        Ok(Run { id, file, entries, fences })
    }

    /// Writes a run from entries sorted by prefix (the first error stops it), fsyncs it, and
    /// opens it.
    fn write(dir: &Path, id: u64, sorted: impl Iterator<Item = io::Result<(u64, u32, u64)>>) -> io::Result<Run> {
        let path = Run::path(dir, id);
        let f = OpenOptions::new().write(true).create(true).truncate(true).open(&path)?;
        let mut w = BufWriter::with_capacity(1 << 16, f);
        let mut entries = 0u64;
        for item in sorted {
            let (p, writer, seq) = item?;
            w.write_all(&p.to_be_bytes())?;
            w.write_all(&writer.to_le_bytes())?;
            w.write_all(&seq.to_le_bytes())?;
            entries += 1;
        }
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        drop(f);
        Run::open(dir, id, entries)
    }

    /// The `(writer, seq)` of every entry whose prefix is `p`.
    fn find(&self, p: u64) -> io::Result<Vec<(u32, u64)>> {
        let mut out = Vec::new();
        if self.entries == 0 {
            return Ok(out);
        }
        // The first block that may hold `p`: the one before the first fence at or above it.
        let mut block = self.fences.partition_point(|&f| f < p).saturating_sub(1) as u64;
        let mut buf = vec![0u8; (RUN_BLOCK_ENTRIES * RUN_ENTRY_BYTES) as usize];
        while block < self.fences.len() as u64 {
            let first = block * RUN_BLOCK_ENTRIES;
            let n = (self.entries - first).min(RUN_BLOCK_ENTRIES);
            let bytes = &mut buf[..(n * RUN_ENTRY_BYTES) as usize];
            read_exact_at(&self.file, bytes, first * RUN_ENTRY_BYTES)?;
            for e in bytes.chunks_exact(RUN_ENTRY_BYTES as usize) {
                let ep = u64::from_be_bytes(e[..8].try_into().expect("8 bytes"));
                if ep > p {
                    return Ok(out);
                }
                if ep == p {
                    let writer = u32::from_le_bytes(e[8..12].try_into().expect("4 bytes"));
                    let seq = u64::from_le_bytes(e[12..20].try_into().expect("8 bytes"));
                    out.push((writer, seq));
                }
            }
            block += 1;
        }
        Ok(out)
    }

    /// Every entry, in order (for a merge).
    fn stream(&self) -> RunStream<'_> {
        RunStream { run: self, next: 0, buf: Vec::new(), at: 0 }
    }
}

struct RunStream<'a> {
    run: &'a Run,
    next: u64,
    buf: Vec<(u64, u32, u64)>,
    at: usize,
}

impl RunStream<'_> {
    fn peek(&mut self) -> io::Result<Option<(u64, u32, u64)>> {
        if self.at == self.buf.len() {
            if self.next == self.run.entries {
                return Ok(None);
            }
            let n = (self.run.entries - self.next).min(RUN_BLOCK_ENTRIES * 16);
            let mut bytes = vec![0u8; (n * RUN_ENTRY_BYTES) as usize];
            read_exact_at(&self.run.file, &mut bytes, self.next * RUN_ENTRY_BYTES)?;
            self.buf = bytes
                .chunks_exact(RUN_ENTRY_BYTES as usize)
                .map(|e| {
                    (
                        u64::from_be_bytes(e[..8].try_into().expect("8 bytes")),
                        u32::from_le_bytes(e[8..12].try_into().expect("4 bytes")),
                        u64::from_le_bytes(e[12..20].try_into().expect("8 bytes")),
                    )
                })
                .collect();
            self.at = 0;
            self.next += n;
        }
        Ok(Some(self.buf[self.at]))
    }
}

/// Two runs' entries merged in order.
struct Merge<'a> {
    a: RunStream<'a>,
    b: RunStream<'a>,
}

impl Iterator for Merge<'_> {
    type Item = io::Result<(u64, u32, u64)>;

    fn next(&mut self) -> Option<Self::Item> {
        let (x, y) = match (self.a.peek(), self.b.peek()) {
            (Ok(x), Ok(y)) => (x, y),
            (Err(e), _) | (_, Err(e)) => return Some(Err(e)),
        };
        let take_a = match (x, y) {
            (Some(x), Some(y)) => x <= y,
            (x, _) => x.is_some(),
        };
        let s = if take_a { &mut self.a } else { &mut self.b };
        let next = if take_a { x } else { y }?;
        s.at += 1;
        Some(Ok(next))
    }
}

/// The files of a spilled index. Cloning shares the handles: a clone is a snapshot that stays
/// readable while the original appends (chain files only grow while a store is open; runs
/// are immutable and a replaced one stays open in every snapshot holding it).
#[derive(Debug, Clone)]
struct Spill {
    dir: PathBuf,
    cfg: IndexConfig,
    chain_files: BTreeMap<u32, Arc<File>>,
    /// Oldest first.
    runs: Vec<Arc<Run>>,
    next_run: u64,
    /// Run files replaced by merges: deleted once a checkpoint no longer names them.
    obsolete: Vec<u64>,
    /// Whether a run was written since the last checkpoint.
    runs_changed: bool,
}

impl Spill {
    fn chain_path(&self, writer: u32) -> PathBuf {
        self.dir.join(format!("chain-{writer}"))
    }

    fn chain_file(&mut self, writer: u32) -> io::Result<Arc<File>> {
        if let Some(f) = self.chain_files.get(&writer) {
            return Ok(f.clone());
        }
        let f = Arc::new(
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(self.chain_path(writer))?,
        );
        self.chain_files.insert(writer, f.clone());
        Ok(f)
    }
}

/// What a checkpoint of a spilled index records: the log prefix the index files describe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    /// The capsule the store holds.
    pub capsule: CapsuleName,
    /// Bytes of log described (a whole number of frames, every one loaded).
    pub log_end: u64,
    /// Frames in that prefix.
    pub frames: u64,
    /// Per writer: chain length, head hash, lamport, epoch.
    pub chains: Vec<(u32, u64, Hash256, u64, u64)>,
    /// Per writer, how many of its entries are in runs (the rest are found again from the chain
    /// files at open).
    pub in_runs: Vec<(u32, u64)>,
    /// (epoch, seq, hash) of the newest SYNC.
    pub latest_sync: Option<(u64, u64, Hash256)>,
    /// Runs, oldest first: (id, entries).
    pub runs: Vec<(u64, u64)>,
    /// Where the certificate records are, in log order (installed in the verifier at open).
    pub certs: Vec<Loc>,
}

const CHECKPOINT_MAGIC: &[u8; 8] = b"PSLIDX1\0";
/// The checkpoint's file name in the index directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
const CHECKPOINT_TMP: &str = "checkpoint.tmp";
/// Most writers, runs and certificate records a checkpoint may name (a bound for decoding).
const CHECKPOINT_ITEMS_MAX: u64 = 1 << 24;
/// Most bytes of a checkpoint file read (a larger one is not used).
const CHECKPOINT_BYTES_MAX: u64 = 64 << 20;

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(CHECKPOINT_MAGIC);
        b.extend_from_slice(&self.capsule.0 .0);
        b.extend_from_slice(&self.log_end.to_le_bytes());
        b.extend_from_slice(&self.frames.to_le_bytes());
        b.extend_from_slice(&(self.chains.len() as u64).to_le_bytes());
        for (w, len, head, lamport, epoch) in &self.chains {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&head.0);
            b.extend_from_slice(&lamport.to_le_bytes());
            b.extend_from_slice(&epoch.to_le_bytes());
        }
        b.extend_from_slice(&(self.in_runs.len() as u64).to_le_bytes());
        for (w, n) in &self.in_runs {
            b.extend_from_slice(&w.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        match &self.latest_sync {
            Some((e, s, h)) => {
                b.push(1);
                b.extend_from_slice(&e.to_le_bytes());
                b.extend_from_slice(&s.to_le_bytes());
                b.extend_from_slice(&h.0);
            }
            None => b.push(0),
        }
        b.extend_from_slice(&(self.runs.len() as u64).to_le_bytes());
        for (id, n) in &self.runs {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&(self.certs.len() as u64).to_le_bytes());
        for l in &self.certs {
            b.extend_from_slice(&l.offset.to_le_bytes());
            b.extend_from_slice(&l.len.to_le_bytes());
        }
        let crc = crc32fast::hash(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a checkpoint; `None` for anything that is not a whole, intact one.
    pub fn decode(bytes: &[u8]) -> Option<Checkpoint> {
        let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32fast::hash(body) != u32::from_le_bytes(crc.try_into().ok()?) {
            return None;
        }
        let mut r = Reader(body);
        if r.take(8)? != CHECKPOINT_MAGIC {
            return None;
        }
        let capsule = CapsuleName(Hash256(r.take(32)?.try_into().ok()?));
        let log_end = r.u64()?;
        let frames = r.u64()?;
        let n = r.count()?;
        let mut chains = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            chains.push((r.u32()?, r.u64()?, r.hash()?, r.u64()?, r.u64()?));
        }
        let n = r.count()?;
        let mut in_runs = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            in_runs.push((r.u32()?, r.u64()?));
        }
        let latest_sync = match r.take(1)?[0] {
            0 => None,
            1 => Some((r.u64()?, r.u64()?, r.hash()?)),
            _ => return None,
        };
        let n = r.count()?;
        let mut runs = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            runs.push((r.u64()?, r.u64()?));
        }
        let n = r.count()?;
        let mut certs = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            certs.push(Loc { offset: r.u64()?, len: r.u32()? });
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(Checkpoint { capsule, log_end, frames, chains, in_runs, latest_sync, runs, certs })
    }

    /// Reads the checkpoint in `dir`, if there is an intact one.
    pub fn read(dir: &Path) -> Option<Checkpoint> {
        use std::io::Read;
        let f = File::open(dir.join(CHECKPOINT_FILE)).ok()?;
        let mut bytes = Vec::new();
        f.take(CHECKPOINT_BYTES_MAX + 1).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 > CHECKPOINT_BYTES_MAX {
            return None;
        }
        Checkpoint::decode(&bytes)
    }
}

/// Decodes the bytes of an index checkpoint file and re-encodes what decoded: `Some` exactly
/// for an intact checkpoint (the fuzz target's entry: decoding never panics, and a decoded
/// checkpoint re-encodes to its input).
pub fn checkpoint_roundtrip(bytes: &[u8]) -> Option<Vec<u8>> {
    Checkpoint::decode(bytes).map(|c| c.encode())
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (a, b) = self.0.split_at_checked(n)?;
        self.0 = b;
        Some(a)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn hash(&mut self) -> Option<Hash256> {
        Some(Hash256(self.take(32)?.try_into().ok()?))
    }
    fn count(&mut self) -> Option<usize> {
        let n = self.u64()?;
        (n <= CHECKPOINT_ITEMS_MAX).then_some(n as usize)
    }
}

/// The index of a store (see the module documentation).
#[derive(Debug, Default, Clone)]
pub(crate) struct Index {
    chains: BTreeMap<u32, Chain>,
    /// (epoch, seq, hash) of the newest SYNC.
    pub latest_sync: Option<(u64, u64, Hash256)>,
    /// Hash -> slot of every record not yet in a run (all of them when not spilled).
    recent: HashMap<Hash256, (u32, u64)>,
    /// Records indexed.
    count: u64,
    /// Where the certificate records are, in log order.
    certs: Vec<Loc>,
    spill: Option<Spill>,
    /// Records pushed since the last checkpoint.
    since_checkpoint: u64,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl Index {
    /// A new, empty spilled index in `dir`: whatever index files were there are removed first.
    pub fn spilled(dir: &Path, cfg: IndexConfig) -> io::Result<Index> {
        wipe(dir)?;
        fs::create_dir_all(dir)?;
        sync_dir(dir)?;
        Ok(Index {
            spill: Some(Spill {
                dir: dir.to_path_buf(),
                cfg,
                chain_files: BTreeMap::new(),
                runs: Vec::new(),
                next_run: 0,
                obsolete: Vec::new(),
                runs_changed: false,
            }),
            ..Index::default()
        })
    }

    /// A spilled index resumed from its checkpoint `ck` in `dir` (files the checkpoint does not
    /// name are removed; chain files are cut to the lengths it names). Errors when a file it
    /// names is missing or too short: the caller then rebuilds from the log.
    pub fn resume(dir: &Path, cfg: IndexConfig, ck: &Checkpoint) -> io::Result<Index> {
        // The checkpoint is read from disk: every number in it is checked before it sizes a
        // read or an allocation, and nothing is changed on disk until all of it checked out.
        let mut runs = Vec::new();
        for &(id, n) in &ck.runs {
            runs.push(Arc::new(Run::open(dir, id, n)?));
        }
        let next_run = match ck.runs.iter().map(|r| r.0).max() {
            Some(id) => id.checked_add(1).ok_or_else(|| invalid(format!("run id {id} leaves no next id")))?,
            None => 0,
        };
        let mut idx = Index { latest_sync: ck.latest_sync, certs: ck.certs.clone(), ..Index::default() };
        let in_runs: BTreeMap<u32, u64> = ck.in_runs.iter().copied().collect();
        let mut files = BTreeMap::new();
        let mut cuts = Vec::new();
        for &(w, len, head, lamport, epoch) in &ck.chains {
            let path = dir.join(format!("chain-{w}"));
            let file = Arc::new(OpenOptions::new().read(true).write(true).open(&path)?);
            let size = file.metadata()?.len();
            let bytes = len.checked_mul(ENTRY_BYTES).filter(|b| *b <= size).ok_or_else(|| {
                invalid(format!("chain file of writer {w} holds {size} bytes, fewer than {len} entries"))
            })?;
            // Entries not in a run go back into the recent map: fewer than `recent_max` when
            // the checkpoint was written (it writes a run first when there are more).
            let covered = in_runs.get(&w).copied().unwrap_or(0).min(len);
            if idx.recent.len() as u64 + (len - covered) > cfg.recent_max as u64 {
                return Err(invalid(format!("the checkpoint leaves more than {} hashes out of runs", cfg.recent_max)));
            }
            for (i, e) in read_entries(&file, w, covered, len)?.into_iter().enumerate() {
                idx.recent.insert(e.hash, (w, covered + i as u64));
            }
            let base = len.saturating_sub(cfg.chain_window as u64);
            let mem: VecDeque<Entry> = read_entries(&file, w, base, len)?.into();
            if mem.back().map(|e| e.hash) != (len > 0).then_some(head) {
                return Err(invalid(format!("chain file of writer {w} does not end at the checkpoint's head")));
            }
            if size > bytes {
                cuts.push((file.clone(), bytes));
            }
            idx.count = idx.count.checked_add(len).ok_or_else(|| invalid("record count overflows".into()))?;
            idx.chains.insert(w, Chain { len, head, lamport, epoch, mem, mem_base: base, written: len });
            files.insert(w, file);
        }
        // All checked: cut chain files back to the lengths named (entries written after the
        // checkpoint), and remove what it does not name (runs replaced since, chains of a log
        // rebuilt since).
        for (file, bytes) in cuts {
            file.set_len(bytes)?;
        }
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            let keep = match (name.strip_prefix("run-"), name.strip_prefix("chain-")) {
                (Some(id), _) => id.parse::<u64>().is_ok_and(|id| ck.runs.iter().any(|r| r.0 == id)),
                (_, Some(w)) => w.parse::<u32>().is_ok_and(|w| idx.chains.contains_key(&w)),
                _ => true,
            };
            if !keep {
                fs::remove_file(dir.join(name))?;
            }
        }
        idx.spill = Some(Spill {
            dir: dir.to_path_buf(),
            cfg,
            chain_files: files,
            runs,
            next_run,
            obsolete: Vec::new(),
            runs_changed: false,
        });
        Ok(idx)
    }

    /// Whether the index lives in files beside the log.
    pub fn is_spilled(&self) -> bool {
        self.spill.is_some()
    }

    /// Records indexed.
    pub fn len(&self) -> u64 {
        self.count
    }

    pub fn chain(&self, writer: u32) -> Option<&Chain> {
        self.chains.get(&writer)
    }

    /// Writers with at least one record.
    pub fn writers(&self) -> impl Iterator<Item = u32> + '_ {
        self.chains.keys().copied()
    }

    /// The entry of slot `(writer, seq)`, if the chain reaches it.
    pub fn entry(&self, writer: u32, seq: u64) -> io::Result<Option<Entry>> {
        let Some(c) = self.chains.get(&writer) else { return Ok(None) };
        if seq >= c.len {
            return Ok(None);
        }
        if seq >= c.mem_base {
            return Ok(c.mem.get((seq - c.mem_base) as usize).copied());
        }
        let file = self.chain_file(writer)?;
        Ok(read_entries(&file, writer, seq, seq + 1)?.pop())
    }

    /// The entries of `writer`'s seqs `from..to` (clamped to the chain).
    pub fn entries(&self, writer: u32, from: u64, to: u64) -> io::Result<Vec<Entry>> {
        let Some(c) = self.chains.get(&writer) else { return Ok(Vec::new()) };
        let to = to.min(c.len);
        if from >= to {
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity((to - from) as usize);
        if from < c.mem_base {
            let file = self.chain_file(writer)?;
            out = read_entries(&file, writer, from, to.min(c.mem_base))?;
        }
        if to > c.mem_base {
            let lo = from.max(c.mem_base);
            out.extend(c.mem.range((lo - c.mem_base) as usize..(to - c.mem_base) as usize).copied());
        }
        Ok(out)
    }

    /// `writer`'s entries from seq 0, as `(seq, entry)`, read from the chain file 4,096 at a
    /// time (a whole chain never sits in memory at once).
    pub fn walk(&self, writer: u32) -> impl Iterator<Item = io::Result<(u64, Entry)>> + '_ {
        const CHUNK: u64 = 4096;
        let len = self.chain(writer).map_or(0, |c| c.len);
        (0..len.div_ceil(CHUNK)).flat_map(move |i| {
            let items: Vec<io::Result<(u64, Entry)>> = match self.entries(writer, i * CHUNK, (i + 1) * CHUNK) {
                Ok(es) => es.into_iter().enumerate().map(|(j, e)| Ok((i * CHUNK + j as u64, e))).collect(),
                Err(e) => vec![Err(e)],
            };
            items
        })
    }

    fn chain_file(&self, writer: u32) -> io::Result<Arc<File>> {
        self.spill
            .as_ref()
            .and_then(|s| s.chain_files.get(&writer).cloned())
            .ok_or_else(|| invalid(format!("writer {writer}'s older chain entries are in no file")))
    }

    /// The hash at slot `(writer, seq)`.
    pub fn hash_at(&self, writer: u32, seq: u64) -> io::Result<Option<Hash256>> {
        Ok(self.entry(writer, seq)?.map(|e| e.hash))
    }

    /// The slot and location of the record with `hash`.
    pub fn lookup(&self, hash: &Hash256) -> io::Result<Option<(u32, u64, Loc)>> {
        if let Some(&(w, s)) = self.recent.get(hash) {
            if let Some(e) = self.entry(w, s)? {
                if e.hash == *hash {
                    return Ok(Some((w, s, e.loc)));
                }
            }
        }
        if let Some(spill) = &self.spill {
            let p = prefix(hash);
            for run in spill.runs.iter().rev() {
                for (w, s) in run.find(p)? {
                    // A slot cut by a revocation at open may be named by a run still: the chain
                    // entry decides.
                    if let Some(e) = self.entry(w, s)? {
                        if e.hash == *hash {
                            return Ok(Some((w, s, e.loc)));
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    /// Where `rec` would go if appended now.
    pub fn place(&self, rec: &Record) -> io::Result<Placement> {
        let h = rec.header();
        let (next, head) = self.chain(h.writer).map(|c| (c.next_seq(), c.head_hash())).unwrap_or((0, Hash256::ZERO));
        Ok(if h.seq < next {
            // The hash fixes writer and seq: the record is stored iff its slot holds it.
            let stored = self.hash_at(h.writer, h.seq)?.unwrap_or(Hash256::ZERO);
            if stored == rec.hash() {
                Placement::Duplicate
            } else {
                Placement::Orphan(OrphanCause::SlotTaken { stored })
            }
        } else if h.seq > next {
            Placement::Orphan(OrphanCause::Gap { expected: next })
        } else if h.prev != head {
            Placement::Orphan(OrphanCause::Prev { expected: head })
        } else {
            Placement::Extends
        })
    }

    /// Adds a record that extends its writer's chain. A spilled index writes it out with the
    /// next [`Index::flush`].
    pub fn push(&mut self, rec: &Record, loc: Loc) {
        let h = rec.header();
        let hash = rec.hash();
        let chain = self.chains.entry(h.writer).or_default();
        assert_eq!(chain.next_seq(), h.seq, "index push out of chain order");
        assert_eq!(chain.head_hash(), h.prev, "index push does not extend the chain");
        chain.mem.push_back(Entry { hash, loc });
        chain.len += 1;
        chain.head = hash;
        chain.lamport = h.lamport;
        chain.epoch = h.epoch;
        self.recent.insert(hash, (h.writer, h.seq));
        self.count += 1;
        self.since_checkpoint += 1;
        if h.kind == Kind::Cert {
            self.certs.push(loc);
        }
        if h.kind == Kind::Sync && self.latest_sync.is_none_or(|(e, s, _)| (h.epoch, h.seq) > (e, s)) {
            self.latest_sync = Some((h.epoch, h.seq, hash));
        }
    }

    /// Whether a spilled index holds more in memory than its bounds allow (time to flush).
    pub fn wants_flush(&self) -> bool {
        let Some(s) = &self.spill else { return false };
        self.recent.len() >= s.cfg.recent_max
            || self.chains.values().any(|c| c.mem.len() >= 2 * s.cfg.chain_window.max(1))
    }

    /// Spilled index: writes new chain entries to their files, trims each chain's window, and
    /// writes the recent hashes out as a run once there are `recent_max` of them (merging
    /// runs). Not durable until [`Index::checkpoint`]. A no-op in memory.
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(spill) = &mut self.spill else { return Ok(()) };
        let window = spill.cfg.chain_window as u64;
        for (&w, c) in self.chains.iter_mut() {
            if c.written < c.len {
                let file = spill.chain_file(w)?;
                let from = (c.written - c.mem_base) as usize;
                let mut buf = Vec::with_capacity((c.len - c.written) as usize * ENTRY_BYTES as usize);
                for e in c.mem.range(from..) {
                    buf.extend_from_slice(&e.encode());
                }
                write_all_at(&file, &buf, c.written * ENTRY_BYTES)?;
                c.written = c.len;
            }
            while c.len - c.mem_base > window && c.mem_base < c.written {
                c.mem.pop_front();
                c.mem_base += 1;
            }
        }
        if self.recent.len() >= spill.cfg.recent_max {
            let mut sorted: Vec<(u64, u32, u64)> = self.recent.iter().map(|(h, &(w, s))| (prefix(h), w, s)).collect();
            sorted.sort_unstable();
            let id = spill.next_run;
            spill.next_run += 1;
            spill.runs.push(Arc::new(Run::write(&spill.dir, id, sorted.into_iter().map(Ok))?));
            spill.runs_changed = true;
            self.recent.clear();
            self.recent.shrink_to(spill.cfg.recent_max);
            merge_runs(spill)?;
        }
        Ok(())
    }

    /// Whether a spilled index is due a checkpoint (enough records since the last, or a new run).
    pub fn checkpoint_due(&self) -> bool {
        self.spill.as_ref().is_some_and(|s| s.runs_changed || self.since_checkpoint >= s.cfg.checkpoint_records)
    }

    /// Spilled index: flushes, makes the chain files durable and writes a checkpoint saying that
    /// the index files describe the log's first `log_end` bytes (`frames` frames), then removes
    /// runs no checkpoint names any more. The caller guarantees that this prefix of the log is
    /// durable and every frame in it is loaded (no damage, no orphan). A no-op in memory.
    pub fn checkpoint(&mut self, capsule: CapsuleName, log_end: u64, frames: u64) -> io::Result<()> {
        if self.spill.is_none() {
            return Ok(());
        }
        self.flush()?;
        let Some(spill) = &mut self.spill else { return Ok(()) };
        for f in spill.chain_files.values() {
            f.sync_data()?;
        }
        // Entries in `recent` are each chain's newest ones, not yet in a run.
        let mut pending: BTreeMap<u32, u64> = BTreeMap::new();
        for (w, _) in self.recent.values() {
            *pending.entry(*w).or_default() += 1;
        }
        let in_run = |w: &u32, c: &Chain| (*w, c.len - pending.get(w).copied().unwrap_or(0));
        let ck = Checkpoint {
            capsule,
            log_end,
            frames,
            chains: self.chains.iter().map(|(&w, c)| (w, c.len, c.head, c.lamport, c.epoch)).collect(),
            in_runs: self.chains.iter().map(|(w, c)| in_run(w, c)).collect(),
            latest_sync: self.latest_sync,
            runs: spill.runs.iter().map(|r| (r.id, r.entries)).collect(),
            certs: self.certs.clone(),
        };
        replace_atomic(&spill.dir, &spill.dir.join(CHECKPOINT_FILE), &spill.dir.join(CHECKPOINT_TMP), &ck.encode())?;
        for id in std::mem::take(&mut spill.obsolete) {
            let _ = fs::remove_file(Run::path(&spill.dir, id));
        }
        spill.runs_changed = false;
        self.since_checkpoint = 0;
        Ok(())
    }

    /// Removes the checkpoint (the index files then describe nothing until the next one): done
    /// before anything changes what the checkpoint describes (a revocation cutting chains).
    pub fn drop_checkpoint(&mut self) -> io::Result<()> {
        if let Some(s) = &self.spill {
            match fs::remove_file(s.dir.join(CHECKPOINT_FILE)) {
                Ok(()) => sync_dir(&s.dir)?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Cuts `writer`'s chain to its first `seq` records, returning the entries removed, oldest
    /// first. The caller sets the chain's head fields (`lamport`, `epoch`) and the newest SYNC
    /// from the records kept. Only while opening (a snapshot never sees a chain shrink).
    pub fn truncate(&mut self, writer: u32, seq: u64) -> io::Result<Vec<Entry>> {
        let Some(c) = self.chains.get(&writer) else { return Ok(Vec::new()) };
        let len = c.len;
        if seq >= len {
            return Ok(Vec::new());
        }
        let cut = self.entries(writer, seq, len)?;
        // Keep in memory the window, and at least every entry not yet in the chain file.
        let keep_from = seq.saturating_sub(self.window() as u64).min(c.written);
        let new_tail = self.entries(writer, keep_from, seq)?;
        for e in &cut {
            self.recent.remove(&e.hash);
        }
        self.count -= cut.len() as u64;
        let c = self.chains.get_mut(&writer).expect("checked above");
        c.len = seq;
        c.head = new_tail.last().map(|e| e.hash).unwrap_or(Hash256::ZERO);
        c.mem_base = seq - new_tail.len() as u64;
        c.mem = new_tail.into();
        c.written = c.written.min(seq);
        if let Some(spill) = &self.spill {
            if let Some(f) = spill.chain_files.get(&writer) {
                f.set_len(c.written * ENTRY_BYTES)?;
            }
        }
        if seq == 0 {
            self.chains.remove(&writer);
        }
        if self.latest_sync.is_some_and(|(_, _, h)| cut.iter().any(|e| e.hash == h)) {
            self.latest_sync = None;
        }
        Ok(cut)
    }

    /// Sets `writer`'s head fields (after a cut, from its new newest record).
    pub fn set_head_fields(&mut self, writer: u32, lamport: u64, epoch: u64) {
        if let Some(c) = self.chains.get_mut(&writer) {
            c.lamport = lamport;
            c.epoch = epoch;
        }
    }

    /// A new, empty index of the same kind: spilled into the same directory with the same
    /// bounds (its files removed first), or in memory.
    pub fn fresh_like(&self) -> io::Result<Index> {
        match &self.spill {
            Some(s) => Index::spilled(&s.dir, s.cfg),
            None => Ok(Index::default()),
        }
    }

    fn window(&self) -> usize {
        self.spill.as_ref().map_or(usize::MAX, |s| s.cfg.chain_window)
    }

    /// Every writer's head.
    pub fn heads(&self) -> BTreeMap<u32, Head> {
        self.chains
            .iter()
            .filter(|(_, c)| c.len > 0)
            .map(|(&writer, c)| {
                (writer, Head { writer, seq: c.len - 1, hash: c.head, lamport: c.lamport, epoch: c.epoch })
            })
            .collect()
    }

    /// Cheap self-consistency: the counts agree and each chain's window ends at its head.
    pub fn consistent(&self) -> bool {
        let total: u64 = self.chains.values().map(|c| c.len).sum();
        total == self.count
            && self.chains.values().all(|c| {
                c.mem_base + c.mem.len() as u64 == c.len
                    && c.mem.back().map(|e| e.hash).unwrap_or(Hash256::ZERO) == c.head
                    && c.written <= c.len
            })
    }
}

/// Reads entries `from..to` of a chain file.
fn read_entries(file: &File, writer: u32, from: u64, to: u64) -> io::Result<Vec<Entry>> {
    if from >= to {
        return Ok(Vec::new());
    }
    let mut buf = vec![0u8; ((to - from) * ENTRY_BYTES) as usize];
    read_exact_at(file, &mut buf, from * ENTRY_BYTES)?;
    buf.chunks_exact(ENTRY_BYTES as usize)
        .enumerate()
        .map(|(i, b)| {
            Entry::decode(b)
                .ok_or_else(|| invalid(format!("chain entry {} of writer {writer} fails its CRC", from + i as u64)))
        })
        .collect()
}

/// Merges the two newest runs while the newer holds at least half as many entries as the
/// older, so that run sizes fall geometrically and a record's hash is rewritten about
/// log2(records / recent_max) times in all.
fn merge_runs(spill: &mut Spill) -> io::Result<()> {
    while spill.runs.len() >= 2 {
        let n = spill.runs.len();
        let (older, newer) = (&spill.runs[n - 2], &spill.runs[n - 1]);
        if newer.entries * 2 < older.entries {
            break;
        }
        let merged = Merge { a: older.stream(), b: newer.stream() };
        let run = Arc::new(Run::write(&spill.dir, spill.next_run, merged)?);
        spill.next_run += 1;
        let old: Vec<u64> = spill.runs.drain(n - 2..).map(|r| r.id).collect();
        spill.obsolete.extend(old);
        spill.runs.push(run);
        spill.runs_changed = true;
    }
    Ok(())
}

/// Removes a spilled index's files from `dir` (the directory stays).
pub(crate) fn wipe(dir: &Path) -> io::Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    // The checkpoint first: without it the rest describes nothing.
    match fs::remove_file(dir.join(CHECKPOINT_FILE)) {
        Ok(()) => sync_dir(dir)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    for e in entries {
        let e = e?;
        if e.file_type()?.is_file() {
            fs::remove_file(e.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hash() -> impl Strategy<Value = Hash256> {
        any::<[u8; 32]>().prop_map(Hash256)
    }

    fn checkpoint() -> impl Strategy<Value = Checkpoint> {
        (
            hash(),
            any::<(u64, u64)>(),
            prop::collection::vec((any::<u32>(), any::<u64>(), hash(), any::<u64>(), any::<u64>()), 0..6),
            prop::collection::vec(any::<(u32, u64)>(), 0..6),
            prop::option::of((any::<u64>(), any::<u64>(), hash())),
            prop::collection::vec(any::<(u64, u64)>(), 0..6),
            prop::collection::vec(any::<(u64, u32)>().prop_map(|(offset, len)| Loc { offset, len }), 0..6),
        )
            .prop_map(|(c, (log_end, frames), chains, in_runs, latest_sync, runs, certs)| Checkpoint {
                capsule: CapsuleName(c),
                log_end,
                frames,
                chains,
                in_runs,
                latest_sync,
                runs,
                certs,
            })
    }

    proptest! {
        #[test]
        fn checkpoints_round_trip_and_any_change_is_refused(ck in checkpoint(), at in any::<prop::sample::Index>()) {
            let bytes = ck.encode();
            prop_assert_eq!(Checkpoint::decode(&bytes), Some(ck));
            let mut bad = bytes.clone();
            let i = at.index(bad.len());
            bad[i] ^= 1;
            prop_assert_eq!(Checkpoint::decode(&bad), None);
            prop_assert_eq!(Checkpoint::decode(&bytes[..bytes.len() - 1]), None);
        }

        #[test]
        fn chain_entries_round_trip_and_a_flip_is_caught(h in hash(), offset in any::<u64>(), len in any::<u32>(), at in 0usize..48) {
            let e = Entry { hash: h, loc: Loc { offset, len } };
            let mut b = e.encode();
            prop_assert_eq!(Entry::decode(&b), Some(e));
            b[at] ^= 0x10;
            prop_assert_eq!(Entry::decode(&b), None);
        }
    }

    /// A checkpoint is on the disk, which an attacker may write (with a valid CRC): lengths
    /// that overflow, a claim that nothing is in a run (every hash back into memory), run
    /// sizes that overflow: each an error (the open then re-verifies the log), never a panic
    /// or an allocation the bounds do not allow.
    #[test]
    fn a_hostile_checkpoint_is_an_error_not_a_panic_or_a_huge_allocation() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = IndexConfig { chain_window: 4, recent_max: 16, checkpoint_records: 16 };
        let mut idx = Index::spilled(dir.path(), cfg).unwrap();
        let owner = psl_crypto::OwnerKey::from_seed(&[3; 32]).unwrap();
        let meta = psl_capsule::new_capsule(&owner, 1, "hostile", 0, Default::default()).unwrap();
        let mut a = psl_capsule::Author::new(&meta, &owner.app(1).unwrap(), 1).unwrap();
        for i in 0..40u64 {
            let r = a.write_ops([(format!("k{i}"), Some("v"))]).unwrap();
            idx.push(&r, Loc { offset: i * 300, len: 292 });
        }
        idx.checkpoint(meta.name(), 40 * 300, 40).unwrap();
        let good = Checkpoint::read(dir.path()).unwrap();
        assert!(Index::resume(dir.path(), cfg, &good).is_ok());
        let mut bad = Vec::new();
        let (w, _, head, l, e) = good.chains[0];
        bad.push(Checkpoint { chains: vec![(w, u64::MAX / 3, head, l, e)], ..good.clone() });
        bad.push(Checkpoint { chains: vec![(w, u64::MAX, head, l, e)], ..good.clone() });
        bad.push(Checkpoint { in_runs: vec![(w, 0)], ..good.clone() });
        bad.push(Checkpoint { runs: vec![(good.runs[0].0, u64::MAX / 7)], ..good.clone() });
        for (i, ck) in bad.iter().enumerate() {
            assert!(Index::resume(dir.path(), cfg, ck).is_err(), "hostile checkpoint {i} accepted");
            // Resume removes nothing the good checkpoint names before it fails.
            assert!(Index::resume(dir.path(), cfg, &good).is_ok(), "after hostile checkpoint {i}");
        }
    }

    #[test]
    fn runs_find_every_entry_across_block_boundaries_and_merge_in_order() {
        let dir = tempfile::tempdir().unwrap();
        // Many equal prefixes around block boundaries.
        let a: Vec<(u64, u32, u64)> = (0..1000u64).map(|i| (i / 3 * 2, 1, i)).collect();
        let b: Vec<(u64, u32, u64)> = (0..700u64).map(|i| (i / 2 * 3, 2, i)).collect();
        let ra = Run::write(dir.path(), 0, a.iter().copied().map(Ok)).unwrap();
        for p in [0u64, 2, 135, 136, 137, 665, 666, 1000] {
            let want: Vec<(u32, u64)> = a.iter().filter(|e| e.0 == p).map(|e| (e.1, e.2)).collect();
            assert_eq!(ra.find(p).unwrap(), want, "prefix {p}");
        }
        let rb = Run::write(dir.path(), 1, b.iter().copied().map(Ok)).unwrap();
        let mut spill = Spill {
            dir: dir.path().to_path_buf(),
            cfg: IndexConfig::default(),
            chain_files: BTreeMap::new(),
            runs: vec![Arc::new(ra), Arc::new(rb)],
            next_run: 2,
            obsolete: Vec::new(),
            runs_changed: false,
        };
        merge_runs(&mut spill).unwrap();
        assert_eq!(spill.runs.len(), 1);
        assert_eq!(spill.obsolete, vec![0, 1]);
        let mut all: Vec<(u64, u32, u64)> = a.iter().chain(b.iter()).copied().collect();
        all.sort_unstable();
        let mut got = Vec::new();
        let mut st = spill.runs[0].stream();
        while let Some(e) = st.peek().unwrap() {
            got.push(e);
            st.at += 1;
        }
        assert_eq!(got, all);
    }
}
