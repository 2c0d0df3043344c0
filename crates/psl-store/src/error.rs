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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{}: {what} failed{}: {source}", path.display(), at(offset))]
    Io {
        path: PathBuf,
        what: &'static str,
        offset: Option<u64>,
        #[source]
        source: io::Error,
    },

    #[error("{}: already holds a store (or a records log without metadata); refusing to overwrite it", path.display())]
    AlreadyExists { path: PathBuf },

    #[error("{}: another process holds this store (a running server writing it, or a check or export reading it)", path.display())]
    Locked { path: PathBuf },

    #[error("{}: no store here (metadata.bin is missing)", path.display())]
    NotAStore { path: PathBuf },

    #[error("{}: key rotation certificate refused: {why}", path.display())]
    Rotation { path: PathBuf, why: String },

    #[error("{}: metadata rejected: {source}", path.display())]
    Metadata {
        path: PathBuf,
        #[source]
        source: MetadataError,
    },

    #[error("{}: the data key given is not this capsule's (its fingerprint differs from the metadata's)", path.display())]
    WrongDataKey { path: PathBuf },

    #[error("record or file of capsule {found} offered to the store of capsule {expected}")]
    WrongCapsule { expected: CapsuleName, found: CapsuleName },

    #[error("record {hash} is {len} bytes, over the capsule's record_bytes_max of {max}")]
    RecordTooLarge { hash: Hash256, len: usize, max: u32 },

    #[error("writer {writer}: gap: the next seq is {expected}, the record offered has seq {got}")]
    Gap { writer: u32, expected: u64, got: u64 },

    #[error("writer {writer}, seq {seq}: equivocation: the store holds {stored}, the record offered is {offered}")]
    Equivocation { writer: u32, seq: u64, stored: Hash256, offered: Hash256 },

    #[error("writer {writer}, seq {seq}: broken chain: the record's prev is {got_prev}, but the writer's head is {expected_prev}")]
    BrokenChain { writer: u32, seq: u64, expected_prev: Hash256, got_prev: Hash256 },

    /// A record refused by the store's verifier: by [`crate::DiskStore::import`] (`index` is the
    /// record's position in the file) or, for a store holding the data key, by
    /// [`crate::DiskStore::append`] when its body does not open (`index` in the batch).
    #[error("record #{index} refused: {source}")]
    Rejected {
        index: usize,
        #[source]
        source: Box<Rejected>,
    },

    #[error("capsule file: {0}")]
    File(#[from] FileError),

    #[error("{} at offset {offset}: read-back of record {hash} failed: {fault}", path.display())]
    ReadBack { path: PathBuf, offset: u64, hash: Hash256, fault: FrameFault },

    #[error("{}: appends refused: {reason}; run DiskStore::repair to rewrite the log", path.display())]
    Damaged { path: PathBuf, reason: String },

    #[error("{}: appends refused: the store was opened read-only", path.display())]
    ReadOnly { path: PathBuf },

    #[error("{}: appends refused: {reason}; reopen the store", path.display())]
    Poisoned { path: PathBuf, reason: String },
}

impl StoreError {
    pub(crate) fn io(path: impl Into<PathBuf>, what: &'static str, offset: Option<u64>, source: io::Error) -> Self {
        StoreError::Io { path: path.into(), what, offset, source }
    }
}
