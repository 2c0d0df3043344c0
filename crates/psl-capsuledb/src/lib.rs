//! CapsuleDB: an LSM tree whose immutable blocks and whose indexes are DataCapsule records.
//!
//! - [`bloom`]: a small Bloom filter (k probes from two 64-bit hashes).
//! - [`codec`]: the bounded, versioned block and index encodings (never panic on garbage).
//! - [`lsm`]: the pure LSM core (L0, sorted levels, compaction planning, streaming merge,
//!   installation, reads through an index snapshot); no I/O: it hands the blocks of a run to
//!   [`Blocks`] in batches ([`Blocks::save_many`]).
//! - [`db`]: [`CapsuleDb`], the memtable and the core on top of [`BlockStore`]s holding sealed,
//!   signed records (a batch of blocks sealed in chain order, then signed on a small pool of
//!   threads); the background compaction thread; [`Reader`] handles that read without waiting
//!   for compactions; the block and entry caches.
//! - [`store`]: [`DirStore`], a directory's append-only log of CRC-framed records plus the
//!   pointer to the newest index.
//! - [`servers`]: CapsuleDB on the capsule servers: [`servers::ServerStore`] (reads a record by
//!   hash from one server), [`servers::Publisher`] (the role's records go out on the fabric and
//!   `sync` waits for a majority of the servers' acks), [`servers::Survey`] (the newest index
//!   and the next block-writer incarnation after a restart), [`servers::replay`] (the writes
//!   above the loaded index's frontier, fetched from fresh servers and applied).
//! - [`role`]: [`role::Role`], the `psl capsuledb` role: a receive-only SCL node feeding the
//!   tree, answering workers' read requests, publishing the frontier workers may evict below.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod bloom;
pub mod codec;
pub mod db;
pub mod lsm;
pub mod role;
pub mod servers;
pub mod store;

pub use bloom::Bloom;
pub use codec::{Block, BlockRef, CodecError, Index};
pub use db::{BlockStore, CapsuleDb, MemStore, Reader, Stats};
pub use lsm::{Blocks, Config};
pub use servers::{Publisher, ServerStore};
pub use store::DirStore;

/// The version of a write, ordered as in SCL's memtable: Lamport time, then writer index; and
/// the hash of the data record that wrote it (all zero: unknown, e.g. a write made through
/// [`CapsuleDb::put`] directly). A writer's Lamport times grow along its chain, so
/// `(lamport, writer)` names one op and the record hash only breaks ties between equivocating
/// copies. The role answers with that record, which proves the version (`dbwire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    /// The write's Lamport time.
    pub lamport: u64,
    /// Index of the writer that made it.
    pub writer: u32,
    /// Hash of the data record that wrote it (all zero: unknown).
    pub record: RecordHash,
}

impl Version {
    /// A version with no known record.
    pub const fn new(lamport: u64, writer: u32) -> Version {
        Version { lamport, writer, record: [0; 32] }
    }

    /// Whether the record that wrote it is known.
    pub fn has_record(&self) -> bool {
        self.record != [0; 32]
    }
}

/// A value (`Some`) or a tombstone (`None`) at a version.
pub type Cell = (Version, Option<Vec<u8>>);

/// 32-byte record hash: the pointer an index keeps to a block.
pub type RecordHash = [u8; 32];

/// What a CapsuleDB operation failed on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A block or index record's payload does not decode.
    #[error("codec: {0}")]
    Codec(#[from] CodecError),
    /// A bad argument or configuration (a key or value out of bounds, no store), or data that
    /// contradicts itself (a block that does not match its index entry, a broken index chain).
    #[error("invalid argument: {0}")]
    Invalid(&'static str),
    /// Sealing and signing a new record failed.
    #[error("sealing a record failed: {0}")]
    Seal(String),
    /// Every store was tried and none returned a copy of the record that checks.
    #[error("record {hash} not readable from any store ({tried} tried): {last}")]
    Unavailable {
        /// The record's hash, hex.
        hash: String,
        /// How many stores were tried.
        tried: usize,
        /// Why the last copy was rejected (or that no store holds it).
        last: String,
    },
    /// Writing or syncing failed on every store, or a compaction, thread or replay step
    /// failed (the message says which).
    #[error("no store took the record: {0}")]
    Store(String),
    /// [`CapsuleDb::get_at`] or [`CapsuleDb::get_cell_at`] asked for an index sequence number
    /// the chain of indexes does not hold.
    #[error("snapshot {0} is not kept")]
    UnknownSnapshot(u64),
}
