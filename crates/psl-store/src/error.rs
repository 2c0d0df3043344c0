//! Every way a store operation can fail. Messages name the file, the offset and what failed.

use crate::frame::FrameFault;
use psl_capsule::file::FileError;
use psl_capsule::{CapsuleName, MetadataError, Rejected};
use psl_crypto::Hash256;
use std::io;
use std::path::PathBuf;

fn at(offset: &Option<u64>) -> String {
    offset.map(|o| format!(" at offset {o}")).unwrap_or_default()
}

/// Why a [`crate::DiskStore`] operation (create, open, append, import, read-back, check,
/// repair, rotation) failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file-system call on one of the store's files failed (open, read, write, fsync, stat,
    /// rename, lock).
    #[error("{}: {what} failed{}: {source}", path.display(), at(offset))]
    Io {
        /// The file or directory the call was made on.
        path: PathBuf,
        /// The operation that failed, e.g. `"fsync"` or `"appending frames"`.
        what: &'static str,
        /// Byte offset in the file where it failed, when the operation was positional.
        offset: Option<u64>,
        /// The underlying I/O error.
        #[source]
        source: io::Error,
    },

    /// [`crate::DiskStore::create`] found a `metadata.bin`, or a non-empty `records.log`,
    /// already in the directory.
    #[error("{}: already holds a store (or a records log without metadata); refusing to overwrite it", path.display())]
    AlreadyExists {
        /// The existing file (`metadata.bin` or `records.log`).
        path: PathBuf,
    },

    /// Another process (or another `DiskStore` in this one) holds the directory's `LOCK` file:
    /// returned when opening for writing while a writer or a reader holds the lock.
    #[error("{}: another process holds this store (a running server writing it, or a check or export reading it)", path.display())]
    Locked {
        /// The `LOCK` file.
        path: PathBuf,
    },

    /// The directory has no `metadata.bin`, so it holds no store to open.
    #[error("{}: no store here (metadata.bin is missing)", path.display())]
    NotAStore {
        /// The directory that was to be opened.
        path: PathBuf,
    },

    /// `rotations.bin` is malformed, or an application key rotation certificate does not
    /// install in the verifier (on open or in [`crate::DiskStore::install_rotation`]).
    #[error("{}: key rotation certificate refused: {why}", path.display())]
    Rotation {
        /// The store's `rotations.bin`.
        path: PathBuf,
        /// Why the file or the certificate was refused.
        why: String,
    },

    /// `metadata.bin` is larger than any metadata can be, does not decode, or its owner
    /// signature does not verify.
    #[error("{}: metadata rejected: {source}", path.display())]
    Metadata {
        /// The `metadata.bin` read.
        path: PathBuf,
        /// Why the metadata was refused.
        #[source]
        source: MetadataError,
    },

    /// The data key given to create or open has a fingerprint other than the one in the
    /// capsule's metadata.
    #[error("{}: the data key given is not this capsule's (its fingerprint differs from the metadata's)", path.display())]
    WrongDataKey {
        /// The store's `metadata.bin`.
        path: PathBuf,
    },

    /// A record appended, or a capsule file imported, belongs to another capsule.
    #[error("record or file of capsule {found} offered to the store of capsule {expected}")]
    WrongCapsule {
        /// The capsule this store holds.
        expected: CapsuleName,
        /// The capsule the record or file names.
        found: CapsuleName,
    },

    /// An appended record's encoding is larger than the capsule's `record_bytes_max`.
    #[error("record {hash} is {len} bytes, over the capsule's record_bytes_max of {max}")]
    RecordTooLarge {
        /// The record's hash.
        hash: Hash256,
        /// The record's encoded size, in bytes.
        len: usize,
        /// The capsule's limit, in bytes.
        max: u32,
    },

    /// An appended record's seq is past its writer's next seq: an earlier record is missing.
    #[error("writer {writer}: gap: the next seq is {expected}, the record offered has seq {got}")]
    Gap {
        /// The writer whose chain the record was to extend.
        writer: u32,
        /// The seq the writer's next record must have.
        expected: u64,
        /// The seq of the record offered.
        got: u64,
    },

    /// An appended record takes a (writer, seq) slot the store (or the batch) already holds
    /// with a different record.
    #[error("writer {writer}, seq {seq}: equivocation: the store holds {stored}, the record offered is {offered}")]
    Equivocation {
        /// The writer of both records.
        writer: u32,
        /// The seq both records claim.
        seq: u64,
        /// Hash of the record already in that slot.
        stored: Hash256,
        /// Hash of the conflicting record offered.
        offered: Hash256,
    },

    /// An appended record has its writer's next seq, but its `prev` is not the hash of the
    /// writer's newest record (a zero hash for seq 0).
    #[error("writer {writer}, seq {seq}: broken chain: the record's prev is {got_prev}, but the writer's head is {expected_prev}")]
    BrokenChain {
        /// The writer whose chain the record was to extend.
        writer: u32,
        /// The record's seq.
        seq: u64,
        /// Hash of the writer's head, which `prev` must equal.
        expected_prev: Hash256,
        /// The `prev` the record carries.
        got_prev: Hash256,
    },

    /// A record refused by the store's verifier: by [`crate::DiskStore::import`] (`index` is the
    /// record's position in the file) or, for a store holding the data key, by
    /// [`crate::DiskStore::append`] when its body does not open (`index` in the batch).
    #[error("record #{index} refused: {source}")]
    Rejected {
        /// Position of the record in the capsule file or in the appended batch, from 0.
        index: usize,
        /// The verifier's verdict.
        #[source]
        source: Box<Rejected>,
    },

    /// The bytes given to [`crate::import_into`] do not parse as a capsule file.
    #[error("capsule file: {0}")]
    File(#[from] FileError),

    /// A record read back from the log (`get`, `range`, export, repair) is no longer the
    /// intact, verified record the index recorded at that offset.
    #[error("{} at offset {offset}: read-back of record {hash} failed: {fault}", path.display())]
    ReadBack {
        /// The store's `records.log`.
        path: PathBuf,
        /// Byte offset of the frame header in the log.
        offset: u64,
        /// Hash of the record the index expects there.
        hash: Hash256,
        /// What is wrong with the frame now.
        fault: FrameFault,
    },

    /// Appends are refused because the log has unreadable regions (found on open) or its
    /// length differs from what the store wrote; cleared by [`crate::DiskStore::repair`].
    #[error("{}: appends refused: {reason}; run DiskStore::repair to rewrite the log", path.display())]
    Damaged {
        /// The store's `records.log`.
        path: PathBuf,
        /// What damage was found.
        reason: String,
    },

    /// An append, import, repair or rotation on a store opened with
    /// [`crate::DiskStore::open_readonly`].
    #[error("{}: appends refused: the store was opened read-only", path.display())]
    ReadOnly {
        /// The log (or `rotations.bin`) that would have been written.
        path: PathBuf,
    },

    /// Appends and repairs are refused because an fsync, a rollback of a failed append, or a
    /// repair failed midway, so the store's view of the file cannot be trusted; cleared by
    /// reopening the store.
    #[error("{}: appends refused: {reason}; reopen the store", path.display())]
    Poisoned {
        /// The store's `records.log`.
        path: PathBuf,
        /// Which operation failed, and how.
        reason: String,
    },
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, what: &'static str, offset: Option<u64>, source: io::Error) -> Self {
        StoreError::Io { path: path.into(), what, offset, source }
    }
}
