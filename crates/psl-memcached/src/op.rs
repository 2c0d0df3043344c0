//! What one front end asks of a key's home: a read-modify-write command ([`Rmw`]) and what it
//! did ([`Outcome`]). Both travel between front ends (in process, or over the peer channel), so
//! they sit below the store that runs them, the peer channel that carries them and home
//! failover that routes them.

use crate::proto::StoreMode;
use std::sync::Arc;

/// A read-modify-write operation, run at the key's home front end.
#[derive(Debug, Clone, Copy)]
pub enum Rmw<'a> {
    /// `mode` Set/Add/Replace/Append/Prepend (Cas is Set with `cas`).
    Store {
        mode: StoreMode,
        flags: u32,
        exptime: i64,
        cas: Option<u64>,
        data: &'a [u8],
    },
    Delete {
        cas: Option<u64>,
    },
    /// incr/decr; `create` = (initial, exptime) on a miss (meta `N`), `ttl` updates the expiry.
    Arith {
        incr: bool,
        delta: u64,
        create: Option<(u64, i64)>,
        ttl: Option<i64>,
        cas: Option<u64>,
    },
    /// Touch (`exptime`), and/or create an empty item on a miss (`vivify`): returns the item.
    Touch {
        exptime: Option<i64>,
        vivify: Option<i64>,
    },
}

/// What a [`Rmw`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Stored {
        cas: u64,
    },
    NotStored,
    Exists,
    NotFound,
    Deleted,
    Number {
        value: u64,
        cas: u64,
        ttl: i64,
    },
    /// An item (encoded, see [`crate::item`]) and its CAS; `won` when a meta `N` created it.
    Item {
        value: Arc<[u8]>,
        cas: u64,
        won: bool,
    },
    NonNumeric,
    TooLarge,
    Failed(String),
    /// The key's home front end (another process) could not be reached in time.
    Unavailable(String),
    /// The key is not in this node's memtable (evicted) and CapsuleDB did not answer in time.
    Unreadable(String),
}
