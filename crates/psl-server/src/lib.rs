//! The DataCapsule server: verified, durable, chain-ordered storage of one capsule's records,
//! signed acks only after the fsync that covers them, reads, and anti-entropy between servers.
//!
//! Module map:
//! - [`core`]: [`ServerCore`], the protocol state machine (no I/O): ordering (the SCL
//!   `Orderer`, with hold-back and gap repair), batches for group commit, acks only with a
//!   [`Synced`] proof, repair answers, heads exchange and pulls.
//! - [`runtime`]: [`Server`], the thin threaded runtime: fabric in/out, a verify pool (public
//!   keys only, no data key), one core thread that owns the [`psl_store::DiskStore`].
//! - [`disk`]: the commit path (write, then sync, then ack) around the core, over the [`Disk`]
//!   trait: the real [`psl_store::DiskStore`], or the simulator's disk that loses unsynced
//!   writes on a crash. Its `medium` module, below the core, holds the trait, [`Synced`] (the
//!   proof of a sync that only its sync path makes and every ack needs) and the
//!   [`FsyncPolicy`].
//! - [`read`]: reads for other processes over TCP (heads, latest SYNC, a record by hash, a
//!   writer's range, a membership proof), the [`read::ReadClient`], and [`read::fetch_fresh`]
//!   (whole capsule from the first server whose copy is fresh; the restart path of a node).
//! - [`freshness`]: [`check_fresh`], how a reader that knows a newer SYNC catches a server
//!   serving a stale prefix.
//!
//! The protocol is described in `docs/protocol/durability.md`.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod core;
pub mod disk;
pub mod freshness;
pub mod read;
pub mod runtime;

pub use crate::core::{Output, ServerConfig, ServerCore, ServerStats, SERVER_CHAIN_WINDOW};
pub use disk::{Disk, FsyncPolicy, Synced};
pub use freshness::{check_fresh, ServerView, Stale};
pub use runtime::{open_store, Server, ServerError, ServerOptions, StartReport};

/// Derives server `id`'s signing key from the application key. In production the leader hands
/// each server its key after attestation; deriving it from the owner's tree here is the
/// development path (`psl capsule-server --owner`).
pub fn server_key(app: &psl_crypto::AppKey, id: u32) -> Option<psl_crypto::SigningKey> {
    psl_scl::server_writer(id).and_then(|w| app.writer(w).ok())
}

/// Server `id`'s signing key under the capsule's writer-key scheme and, in a capsule that
/// certifies writers, its certificate (`ServerOptions::cert`): the development path's way to
/// equip a server from the owner's tree.
pub fn server_credentials(
    meta: &psl_capsule::SignedMetadata,
    app: &psl_crypto::AppKey,
    id: u32,
) -> Option<(psl_crypto::SigningKey, Option<psl_capsule::WriterCert>)> {
    psl_scl::server_writer(id).and_then(|w| psl_capsule::writer_credentials(meta, app, w).ok())
}
