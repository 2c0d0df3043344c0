//! A durable on-disk replica of one DataCapsule: [`DiskStore`].
//!
//! Module map:
//! - [`store`]: [`DiskStore`]: create, open (re-verify, recover), append (group commit), read back
//!   (`get`, `range`, chain order), `check`, `repair`.
//! - [`exchange`]: export to and import from the portable capsule file; [`import_into`].
//! - [`frame`]: the frame format of `records.log` and the resynchronising scanner.
//! - [`index`]: the index (per-writer chains of hash and offset, hash → slot), spilled to
//!   files under `index/` for a writable store so that memory does not grow with the log,
//!   with checkpoints; no record bytes.
//! - [`report`]: what open, append, check and repair report.
//! - [`error`]: the error type, [`StoreError`].
//! - `fsutil`: positional I/O, directory fsync, atomic file creation.
//!
//! # On disk
//!
//! A store is a directory holding
//! - `metadata.bin`: the capsule's signed metadata, written once at creation (temp file, fsync,
//!   rename, directory fsync). Its owner signature is checked on every open.
//! - `records.log`: an append-only log of frames `u32 LE len ‖ u32 LE crc32(record) ‖ record`.
//! - `rotations.bin` (only once the application key was rotated): the owner-signed rotation
//!   certificates, replaced atomically by `DiskStore::install_rotation` and installed in the
//!   verifier on every open, so that records of later key generations verify again.
//! - `index/` (writable stores): the spilled index and its checkpoint ([`index`]), derived from
//!   the log and rebuilt from it whenever it cannot be trusted; byte layouts in
//!   `docs/formats/store.md`.
//!
//! # The chain-order rule, and why a crash cannot break a replica
//!
//! A record of writer `w` is appended only if its seq is `w`'s next seq and its `prev` is the
//! hash of `w`'s newest record (a zero hash for seq 0). So, in file order, each writer's records
//! appear as its chain `0, 1, 2, ...`. Consequently **every prefix of the log holds a prefix of
//! every writer's chain**: a crash at any point of a write, which loses or tears the end of the
//! log, leaves a valid replica, merely an older one. A batch is acknowledged only after its one
//! `fsync`, so nothing acknowledged is lost. (`open` loads records in file order under the same
//! rule, so even a log damaged in the middle loads as a set of chain prefixes.)
//!
//! # Recovery rules (on open)
//!
//! (With [`OpenVerify::FromCheckpoint`], the prefix of the log an intact index checkpoint
//! describes is only walked and CRC-checked, its certificate records re-verified; the rules
//! below then apply to the rest. A checkpoint exists only for a prefix that loaded clean.)
//!
//! Every frame is CRC-checked, decoded under the capsule's limits and re-verified (signature,
//! capsule, and with the data key, decryption and body). A verified record is loaded only if it
//! extends its writer's chain; otherwise it is reported as *orphaned*. Where no valid frame
//! starts, the scanner searches for the next one (every record carries the capsule name at a
//! fixed offset; then the length, CRC and decoding must check out) and classifies the bytes in
//! between:
//!
//! | found | meaning | action |
//! | --- | --- | --- |
//! | no valid frame until EOF | torn tail: an incomplete last frame, a last frame with a bad CRC or an undecodable record, junk after it | truncate at the start of the bad frame (`torn_tail_bytes`), fsync |
//! | the next valid frame starts exactly where this frame's length says it ends | damaged frame, framing intact (bad CRC or undecodable record) | report (index, offset, reason), skip; its writer's later records are orphaned; appends continue |
//! | CRC and decoding fine, verification fails | damaged frame (the CRC vouches for the length), even as the last frame: a torn write cannot produce it | as above, never truncated |
//! | the next valid frame starts elsewhere | unreadable region: the length field is corrupt (or a hole of zeros) | report, resume at the next valid frame, **do not truncate**; refuse appends (`StoreError::Damaged`) until [`DiskStore::repair`] |
//!
//! So a corrupt length in the middle never destroys the data behind it: only bytes that cannot
//! hold any valid frame are ever cut off. Appends are refused after an unreadable region because
//! the log is no longer a clean sequence of frames, and acknowledged frames must not depend on a
//! heuristic search to be found again. [`DiskStore::repair`] rewrites the log from every record
//! that still verifies and connects to its chain (keeping the old file as a hard link
//! `records.log.damaged-<n>`); appends then resume. An unreadable region can also follow a
//! crash without any corruption: writeback may persist a batch's later pages before an earlier
//! one, leaving a zero-filled hole. Nothing of that batch was acknowledged, and repair keeps what
//! did reach the disk.
//!
//! Damage is detected, never silently repaired: a damaged frame stays in the log, and in every
//! open report and check, until `repair` is called. Reads (`get`, `range`, `export`, ...) read
//! each frame back from disk and re-verify it (CRC, decoding, hash, verifier), so a byte changed
//! after open is an error, never returned data.
//!
//! # Trust in appended records
//!
//! `append` takes [`psl_capsule::Verified`] records and does not check their signatures again
//! (that costs ~30 µs a record); it checks capsule, size and chain extension, and, when the
//! store holds the data key, opens each body, since a record that passed a verifier without the
//! key could otherwise turn into a damaged frame on the next open.
//!
//! A writable `DiskStore` holds an exclusive lock on `LOCK` in its directory, so a second
//! writer (another process, or a second open in this one) is refused with `StoreError::Locked`.

#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used))]
pub mod error;
pub mod exchange;
pub mod frame;
mod fsutil;
pub mod index;
pub mod report;
pub mod store;

pub use error::StoreError;
pub use exchange::import_into;
pub use frame::{DamagedFrame, FrameFault, TornTail, Unreadable, FRAME_HEADER_LEN, MIN_RECORD_LEN};
pub use index::{IndexConfig, Orphan, OrphanCause, FRAME_INDEX_UNKNOWN};
pub use report::{AppendOutcome, CheckReport, LostRecord, OpenReport, RepairReport};
pub use store::{
    read_metadata, DiskStore, OpenVerify, StoreOptions, INDEX_DIR, LOCK_FILE, LOG_FILE, METADATA_FILE, ROTATIONS_FILE,
};
