//! The DataCapsule: an append-only log of encrypted, signed, hash-linked records with a
//! 256-bit name. Pure formats and checks; no I/O.
//!
//! Module map:
//! - [`meta`]: canonical metadata, owner-signed; the capsule name is its SHA-256.
//! - [`record`]: record header, kinds, links, the exact byte layout and the record hash.
//! - [`body`]: plaintext bodies (batches of ops, SYNC, control, CapsuleDB payloads).
//! - [`seal`]: turning a [`Draft`] into a sealed, signed [`Record`].
//! - [`author`]: a writer's chain state (seq, prev, Lamport time, epoch links) on top of `seal`.
//! - [`signers`]: [`SignPool`], threads that sign a batch of records an [`Author`] sealed in
//!   chain order ([`Author::write_bodies`]).
//! - [`verify`]: the [`Verifier`], the only maker of [`Verified`] values, and rejection reasons.
//! - [`replica`]: an in-memory replica (a grow-only set) with chain, link and equivocation checks.
//! - [`certs`]: [`WriterCert`] and [`Revocation`], the application-key-signed statements by
//!   which a capsule with hardened ([`WriterKeys::Certified`]) writer keys learns and drops writers.
//! - [`client`]: [`ClientCert`], the owner-signed credential a client shows the HTTPS API, and
//!   the digests its requests are signed over.
//! - [`rotation`]: [`RotationCert`], the owner-signed announcement of a new application key
//!   generation and the epoch from which it is in force (older generations retire there).
//! - [`proof`]: membership proofs from a signed head down to a record.
//! - [`file`](mod@file): the portable `.capsule` file; [`audit`]: every check of a whole file, each problem named.
//! - [`limits`], [`codec`]: size limits and the bounded decoder they are enforced by.
//!
//! The byte formats are specified in `docs/formats/datacapsule.md`.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod audit;
pub mod author;
pub mod body;
pub mod certs;
pub mod client;
pub mod codec;
pub mod file;
pub mod limits;
pub mod meta;
pub mod proof;
pub mod record;
pub mod replica;
pub mod rotation;
pub mod seal;
pub mod signers;
pub mod verify;

pub use audit::{audit_file, audit_file_rotated, Audit, Problem};
pub use author::{Author, SealedBatch};
pub use body::{Action, Body, ControlCode, Op, ATOMIC_FLAG};
pub use certs::{writer_credentials, CertError, KeyStatement, Revocation, WriterCert};
pub use client::{ClientCert, ClientCertError, Permissions};
pub use codec::DecodeError;
pub use file::CapsuleFile;
pub use limits::Limits;
pub use meta::{CapsuleName, Metadata, MetadataError, Policy, SignedMetadata, WriterKeys};
pub use proof::{MembershipProof, ProofError, ProofOutcome, ProofStep};
pub use record::{Header, Kind, Link, Record};
pub use replica::{ChainProblem, Head, Replica};
pub use rotation::{RotationCert, RotationError, ROTATION_CERT_LEN};
pub use seal::{Draft, SealError};
pub use signers::SignPool;
pub use verify::{Opened, Reason, Rejected, Verified, Verifier};

/// How many coordinators (a primary and shadows) a new capsule allows, unless told otherwise.
pub const DEFAULT_COORDINATORS: u8 = 3;

/// Writer index the primary coordinator signs SYNC records with, unless a capsule's policy says
/// otherwise; shadows use the indices just below it.
pub const DEFAULT_COORDINATOR: u32 = (1 << 31) - 1;

/// First writer index reserved for capsule servers' keys. Server `id` signs its acks with the
/// application's child key at index `SERVER_WRITER_BASE + id` (`id < SERVERS_MAX`), i.e.
/// indices 32 768 to 65 535: below every worker writer (`writer_index` in `psl-scl` starts at
/// 2^16) and far from the coordinators' default indices (just below 2^31). Servers never write
/// records: a record signed with a key in this range is refused by servers and nodes, and never
/// heads or appears in a membership proof ([`MembershipProof::verify`]). Re-exported by
/// `psl-scl`.
pub const SERVER_WRITER_BASE: u32 = 1 << 15;
/// Most capsule servers (ids `0 .. SERVERS_MAX`).
pub const SERVERS_MAX: u32 = 1 << 15;

/// The writer index of capsule server `id`'s signing key.
pub fn server_writer(id: u32) -> Option<u32> {
    (id < SERVERS_MAX).then_some(SERVER_WRITER_BASE + id)
}

/// The server id of a writer index in the servers' range.
pub fn server_id(writer: u32) -> Option<u32> {
    (SERVER_WRITER_BASE..SERVER_WRITER_BASE + SERVERS_MAX).contains(&writer).then(|| writer - SERVER_WRITER_BASE)
}

/// Builds and signs metadata for a new capsule under `owner`'s application `app_index`, with
/// writer keys derived from the application public key (version-1 metadata).
pub fn new_capsule(
    owner: &psl_crypto::OwnerKey,
    app_index: u32,
    label: &str,
    created_ms: u64,
    limits: Limits,
) -> Result<SignedMetadata, MetadataError> {
    new_capsule_with(owner, app_index, label, created_ms, limits, WriterKeys::Derived)
}

/// Like [`new_capsule`], choosing how writer keys are made: [`WriterKeys::Certified`] gives
/// hardened writer keys, each known to verifiers by a [`WriterCert`].
pub fn new_capsule_with(
    owner: &psl_crypto::OwnerKey,
    app_index: u32,
    label: &str,
    created_ms: u64,
    limits: Limits,
    writer_keys: WriterKeys,
) -> Result<SignedMetadata, MetadataError> {
    let app = owner.app(app_index).map_err(|_| {
        MetadataError::Decode(DecodeError::Invalid { field: "application index", why: "must be below 2^31" })
    })?;
    let meta = Metadata {
        owner: owner.public(),
        app_index,
        app: app.public(),
        created_ms,
        label: label.to_string(),
        policy: Policy {
            coordinator: DEFAULT_COORDINATOR,
            coordinators: DEFAULT_COORDINATORS,
            limits,
            data_key_fp: app.data_key().fingerprint(),
            writer_keys,
        },
    };
    SignedMetadata::sign(meta, &owner.signing_key())
}
