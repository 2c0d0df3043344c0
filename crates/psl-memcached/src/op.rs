//! What one front end asks of a key's home: a read-modify-write command ([`Rmw`]) and what it
//! did ([`Outcome`]). Both travel between front ends (in process, or over the peer channel), so
//! they sit below the store that runs them, the peer channel that carries them and home
//! failover that routes them.

use crate::proto::StoreMode;
use psl_scl::Version;
use std::sync::Arc;

/// A read-modify-write operation, run at the key's home front end.
#[derive(Debug, Clone, Copy)]
pub enum Rmw<'a> {
    /// `mode` Set/Add/Replace/Append/Prepend (Cas is Set with `cas`).
    Store {
        /// How the item is stored: `Set` overwrites; `Add` needs a miss, `Replace`, `Append`
        /// and `Prepend` a hit (else `NotStored`). `Append`/`Prepend` keep the old flags and expiry.
        mode: StoreMode,
        /// The client's opaque flags, stored with the item and returned by reads.
        flags: u32,
        /// memcached expiry: 0 never, negative already expired, up to 30 days relative
        /// seconds, above an absolute Unix time (see [`crate::item::absolute_expiry`]).
        exptime: i64,
        /// Store only if the item's CAS unique is this one (`cas`, meta `C`): a different
        /// unique gives `Exists`, a miss `NotFound`.
        cas: Option<u64>,
        /// The client's data block (the payload, without the item header).
        data: &'a [u8],
    },
    /// `delete` with a condition (meta `md` with `C`): `Deleted`, `NotFound` or `Exists`.
    Delete {
        /// Delete only if the item's CAS unique is this one, else `Exists`.
        cas: Option<u64>,
    },
    /// incr/decr; `create` = (initial, exptime) on a miss (meta `N`), `ttl` updates the expiry.
    Arith {
        /// `incr` (wraps at 2^64) when true, `decr` (stops at 0) when false.
        incr: bool,
        /// The amount added or subtracted.
        delta: u64,
        /// On a miss, create the counter with `(initial value, exptime)` instead of `NotFound`.
        create: Option<(u64, i64)>,
        /// New memcached exptime for the counter (meta `T`); `None` keeps its expiry.
        ttl: Option<i64>,
        /// Apply only if the item's CAS unique is this one (meta `C`), else `Exists`.
        cas: Option<u64>,
    },
    /// Touch (`exptime`), and/or create an empty item on a miss (`vivify`): returns the item.
    Touch {
        /// New memcached exptime; the CAS unique is kept. `None`: only read (and vivify).
        exptime: Option<i64>,
        /// On a miss, create an empty item with this memcached exptime (meta `N`), returned
        /// with `won` set.
        vivify: Option<i64>,
    },
    /// A read whose CAS unique a client will compare against (`gets`, `mg` with `c`), run at
    /// the home so that the unique is the newest the home has: the live item (`Item`) or
    /// `NotFound`. `have` is the version of the forwarder's own copy of the key: when the home
    /// has not applied that version yet (the forwarder's own write still on its way), the
    /// answer is `Behind` and the forwarder answers from its copy, so a client still reads its
    /// own writes.
    Read {
        /// The version of the key the forwarder holds, if any.
        have: Option<Version>,
    },
}

/// What a [`Rmw`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Written (`STORED`, meta `HD`); `flush_all` reports this too.
    Stored {
        /// CAS unique of the version written; 0 when the caller did not ask for it.
        cas: u64,
    },
    /// The mode's condition failed (`NOT_STORED`): `add` of a live key, or `replace`,
    /// `append`, `prepend` of a missing one.
    NotStored,
    /// The item's CAS unique differs from the one given (`EXISTS`).
    Exists,
    /// No live item under the key (`NOT_FOUND`).
    NotFound,
    /// The item was deleted (`DELETED`).
    Deleted,
    /// A counter's new value after `incr`/`decr` (or its initial value when created).
    Number {
        /// The counter's value now.
        value: u64,
        /// CAS unique of the version written.
        cas: u64,
        /// Seconds until the counter expires, -1 for never.
        ttl: i64,
    },
    /// An item (encoded, see [`crate::item`]) and its CAS; `won` when a meta `N` created it.
    Item {
        /// The encoded item (header and payload).
        value: Arc<[u8]>,
        /// The item's CAS unique (kept through a touch).
        cas: u64,
        /// The item was just created on a miss (meta `W` flag).
        won: bool,
    },
    /// `incr`/`decr` of a value that is not a decimal 64-bit unsigned number.
    NonNumeric,
    /// The item would exceed the item size limit or the node's value limit
    /// (`SERVER_ERROR object too large for cache`).
    TooLarge,
    /// The node refused or failed the write (the reason); the client gets
    /// `SERVER_ERROR out of memory storing object`.
    Failed(String),
    /// The key's home front end (another process) could not be reached in time.
    Unavailable(String),
    /// The key is not in this node's memtable (evicted) and CapsuleDB did not answer in time.
    Unreadable(String),
    /// [`Rmw::Read`]: the home has not applied the forwarder's version of the key yet.
    Behind,
}
