//! How one memcached item is stored as one KV value of the secure store.
//!
//! ```text
//! offset size field
//! 0      1    format tag 0xC2 (0xC1 was the layout without the kept unique; it reads as missing)
//! 1      4    client flags (u32 LE)
//! 5      8    expiry: absolute Unix time in seconds (i64 LE); 0 = never; in the past = expired
//! 13     8    stored at: Unix time in microseconds (u64 LE), for `flush_all`
//! 21     8    kept CAS unique (u64 LE): 0 = the unique of the record version ([`cas_of`]);
//!             else the unique this item keeps because the write only touched it
//! 29     …    the payload (the client's data block)
//! ```
//! memcached 1.6 keeps an item's CAS unique across `touch`, `gat`, `gats` and `mg` with `T`
//! (they change the expiry only), while every command that changes the data (`set`, `cas`,
//! `append`, `prepend`, `incr`, `decr`, …) gives it a new one. A touch here is still a new
//! record version (sealed, signed, replicated like any write), so it carries the old unique in
//! the item: every front end that holds that version reports the same, unchanged unique.
//! A value that does not start with the tag or is shorter than the header is not an item of
//! this front end (another application wrote the key): it reads as missing.

/// The format tag, the first byte of every item this front end writes.
pub const TAG: u8 = 0xC2;
/// Header length in bytes (tag, flags, expiry, store time, kept unique); the payload follows.
pub const HEADER: usize = 29;

/// The 30-day boundary of memcached expiry times: above it a time is absolute.
pub const REL_MAX: i64 = 60 * 60 * 24 * 30;

/// A decoded item view over a stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemRef<'a> {
    /// The client's opaque flags.
    pub flags: u32,
    /// Absolute expiry in Unix seconds: 0 never, -1 (or any past time) expired.
    pub expiry: i64,
    /// When it was stored, in microseconds since the Unix epoch (compared with `flush_all` times).
    pub stored_us: u64,
    /// 0, or the unique kept through a touch.
    pub kept_cas: u64,
    /// The payload: the client's data block.
    pub data: &'a [u8],
}

/// An item with a new CAS unique (that of the record version it is written in).
pub fn encode(flags: u32, expiry: i64, stored_us: u64, parts: &[&[u8]]) -> Vec<u8> {
    encode_keeping(flags, expiry, stored_us, 0, parts)
}

/// An item that keeps the CAS unique `kept_cas` (a touch of an item whose unique it is).
pub fn encode_keeping(flags: u32, expiry: i64, stored_us: u64, kept_cas: u64, parts: &[&[u8]]) -> Vec<u8> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut v = Vec::with_capacity(HEADER + len);
    v.push(TAG);
    v.extend_from_slice(&flags.to_le_bytes());
    v.extend_from_slice(&expiry.to_le_bytes());
    v.extend_from_slice(&stored_us.to_le_bytes());
    v.extend_from_slice(&kept_cas.to_le_bytes());
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

/// Reads the item layout of a stored value; `None` if it is not an item of this front end
/// (shorter than [`HEADER`] or without [`TAG`]), which then reads as missing.
pub fn decode(v: &[u8]) -> Option<ItemRef<'_>> {
    if v.len() < HEADER || v[0] != TAG {
        return None;
    }
    let flags = u32::from_le_bytes(v[1..5].try_into().ok()?);
    let expiry = i64::from_le_bytes(v[5..13].try_into().ok()?);
    let stored_us = u64::from_le_bytes(v[13..21].try_into().ok()?);
    let kept_cas = u64::from_le_bytes(v[21..29].try_into().ok()?);
    Some(ItemRef { flags, expiry, stored_us, kept_cas, data: &v[HEADER..] })
}

/// The absolute expiry for a client's `exptime` at `now` (Unix seconds): 0 = never; negative
/// = already expired (stored as -1); up to 30 days = relative; above = absolute.
pub fn absolute_expiry(exptime: i64, now: i64) -> i64 {
    if exptime == 0 {
        0
    } else if exptime < 0 {
        -1
    } else if exptime <= REL_MAX {
        now.saturating_add(exptime)
    } else {
        exptime
    }
}

impl ItemRef<'_> {
    /// The item's CAS unique when it is held at record version `(lamport, writer)`.
    pub fn cas(&self, lamport: u64, writer: u32) -> u64 {
        if self.kept_cas != 0 {
            self.kept_cas
        } else {
            cas_of(lamport, writer)
        }
    }

    /// Expired at `now` (Unix seconds)?
    pub fn expired(&self, now: i64) -> bool {
        self.expiry != 0 && self.expiry <= now
    }

    /// Seconds left, -1 for never (the meta `t` flag).
    pub fn ttl_left(&self, now: i64) -> i64 {
        if self.expiry == 0 {
            -1
        } else {
            (self.expiry - now).max(0)
        }
    }
}

/// The CAS unique of a record version: the same on every front end that holds that version.
/// A 63-bit mix of `(lamport, writer)` (never 0): distinct versions of one key collide with
/// probability 2^-63. Kept below 2^63 because clients hold uniques in signed 64-bit integers
/// (Java) or format them into 20-character buffers (libmemcached fails on 20-digit values).
pub fn cas_of(lamport: u64, writer: u32) -> u64 {
    let mut z = lamport ^ (u64::from(writer)).rotate_left(40) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_expiry() {
        let v = encode(7, 100, 5, &[b"he", b"llo"]);
        let it = decode(&v).unwrap();
        assert_eq!((it.flags, it.expiry, it.stored_us, it.kept_cas, it.data), (7, 100, 5, 0, &b"hello"[..]));
        assert_eq!(it.cas(3, 4), cas_of(3, 4));
        let kept = encode_keeping(7, 100, 5, 99, &[b"x"]);
        assert_eq!(decode(&kept).unwrap().cas(3, 4), 99);
        assert!(decode(b"short").is_none());
        assert!(decode(&[0u8; 30]).is_none());
        assert_eq!(absolute_expiry(0, 1000), 0);
        assert_eq!(absolute_expiry(-5, 1000), -1);
        assert_eq!(absolute_expiry(10, 1000), 1010);
        assert_eq!(absolute_expiry(REL_MAX + 1, 1000), REL_MAX + 1);
        assert!(decode(&encode(0, -1, 0, &[])).unwrap().expired(1));
        assert!(!decode(&encode(0, 0, 0, &[])).unwrap().expired(i64::MAX));
    }

    #[test]
    fn cas_differs_by_version() {
        let mut seen = std::collections::HashSet::new();
        for l in 0..200u64 {
            for w in [0u32, 1, 65536, 65537, 0x7fff_ffff] {
                let c = cas_of(l, w);
                assert!(c > 0 && c < 1 << 63);
                assert!(seen.insert(c));
            }
        }
    }
}
