//! Lambda values and how they are stored in the shared store.
//!
//! A lambda stores three kinds of value: text (a JS string), JSON (what `putJSON` wrote: the
//! JSON text of a value) and bytes (a `Uint8Array` or `ArrayBuffer`). The store itself holds
//! bytes, so the kind travels inside the stored value. The layout is SecureCached's item
//! (`docs/protocol/memcached.md` §2) with the kind in the memcached client flags, so that a
//! memcached client reading the same key gets the payload and flags it understands (pymemcache's
//! default serializer decodes flag 16 as text), and a lambda reading an item a memcached client
//! wrote gets its data back as text or bytes by the same flags:
//!
//! ```text
//! offset size field
//! 0      1    tag 0xC2 (SecureCached's item layout)
//! 1      4    client flags (u32 LE): bytes 0, text 16 (FLAG_TEXT), JSON 48 (FLAG_TEXT | FLAG_JSON)
//! 5      8    expiry (i64 LE): 0 = never (a lambda's values never expire)
//! 13     8    stored at: Unix microseconds (u64 LE), so that a memcached flush_all covers it
//! 21     8    kept CAS unique (u64 LE): 0 (the unique of the record version)
//! 29     …    the payload: the UTF-8 text, the JSON text, or the bytes
//! ```
//!
//! Reading ([`decode`]): an item whose flags have [`FLAG_JSON`] (and [`FLAG_TEXT`]) is JSON,
//! one with [`FLAG_TEXT`] is text, any other is bytes (a text or JSON payload that is not UTF-8
//! reads as bytes, never as a mangled string); an expired item (a memcached client set an
//! expiry) reads as missing. A value that is not an item (written by `psl kv`, or by another
//! application) reads as text if it is UTF-8 and as bytes otherwise. So bytes survive bit for
//! bit, text and JSON come back as they went in, and nothing is ever misread as another kind.
//!
//! Limits: a payload may be at most the store's value limit (the capsule's `value_bytes_max`,
//! 1 MiB by default) less the [`ITEM_HEADER`] bytes: [`payload_max`].

/// SecureCached's item tag (`psl-memcached/src/item.rs`).
pub const ITEM_TAG: u8 = 0xC2;
/// Bytes before the payload.
pub const ITEM_HEADER: usize = 29;
/// The memcached client flag for text (pymemcache's `FLAG_TEXT`).
pub const FLAG_TEXT: u32 = 1 << 4;
/// Set (with [`FLAG_TEXT`]) on a JSON value.
pub const FLAG_JSON: u32 = 1 << 5;

/// A lambda's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvValue {
    /// A string (stored with [`FLAG_TEXT`]).
    Text(String),
    /// JSON text (what `JSON.stringify` made of the value).
    Json(String),
    /// Raw bytes (a `Uint8Array`/`ArrayBuffer` in JS; stored with no flag).
    Bytes(Vec<u8>),
}

impl KvValue {
    /// The payload's length in bytes (what the size limit counts).
    pub fn payload_len(&self) -> usize {
        match self {
            KvValue::Text(s) | KvValue::Json(s) => s.len(),
            KvValue::Bytes(b) => b.len(),
        }
    }

    /// `"string"`, `"json"` or `"bytes"` (the `type` a lambda sees).
    pub fn kind(&self) -> &'static str {
        match self {
            KvValue::Text(_) => "string",
            KvValue::Json(_) => "json",
            KvValue::Bytes(_) => "bytes",
        }
    }

    fn flags(&self) -> u32 {
        match self {
            KvValue::Text(_) => FLAG_TEXT,
            KvValue::Json(_) => FLAG_TEXT | FLAG_JSON,
            KvValue::Bytes(_) => 0,
        }
    }

    fn payload(&self) -> &[u8] {
        match self {
            KvValue::Text(s) | KvValue::Json(s) => s.as_bytes(),
            KvValue::Bytes(b) => b,
        }
    }
}

/// The largest payload that fits a store whose values may be `store_value_max` bytes.
pub fn payload_max(store_value_max: usize) -> usize {
    store_value_max.saturating_sub(ITEM_HEADER)
}

/// The stored form of `v`, written at `stored_us` (Unix microseconds).
pub fn encode(v: &KvValue, stored_us: u64) -> Vec<u8> {
    let p = v.payload();
    let mut out = Vec::with_capacity(ITEM_HEADER + p.len());
    out.push(ITEM_TAG);
    out.extend_from_slice(&v.flags().to_le_bytes());
    out.extend_from_slice(&0i64.to_le_bytes());
    out.extend_from_slice(&stored_us.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(p);
    out
}

/// What a stored value reads as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A live value (a foreign value without the item header reads as text, or bytes if not UTF-8).
    Value(KvValue),
    /// An item whose expiry has passed (a memcached client set one): reads as missing.
    Expired,
}

/// Reads a stored value at `now_s` (Unix seconds). Total: any bytes decode to something.
pub fn decode(stored: &[u8], now_s: i64) -> Decoded {
    let text_or_bytes = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => KvValue::Text(s.to_string()),
        Err(_) => KvValue::Bytes(b.to_vec()),
    };
    if stored.len() < ITEM_HEADER || stored[0] != ITEM_TAG {
        return Decoded::Value(text_or_bytes(stored));
    }
    let word = |o: usize| -> [u8; 8] {
        let mut w = [0u8; 8];
        w.copy_from_slice(&stored[o..o + 8]);
        w
    };
    let flags = u32::from_le_bytes([stored[1], stored[2], stored[3], stored[4]]);
    let expiry = i64::from_le_bytes(word(5));
    if expiry != 0 && expiry <= now_s {
        return Decoded::Expired;
    }
    let payload = &stored[ITEM_HEADER..];
    Decoded::Value(match std::str::from_utf8(payload) {
        Ok(s) if flags & FLAG_JSON != 0 && flags & FLAG_TEXT != 0 => KvValue::Json(s.to_string()),
        Ok(s) if flags & FLAG_TEXT != 0 => KvValue::Text(s.to_string()),
        _ => KvValue::Bytes(payload.to_vec()),
    })
}

/// Unix time now: (seconds, microseconds).
pub fn unix_now() -> (i64, u64) {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (d.as_secs() as i64, d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_kind_round_trips_and_foreign_values_read_sensibly() {
        let all: Vec<u8> = (0..=255u8).collect();
        for v in [
            KvValue::Text("héllo".into()),
            KvValue::Json(r#"{"a":[1,2]}"#.into()),
            KvValue::Bytes(all.clone()),
            KvValue::Bytes(Vec::new()),
            KvValue::Text(String::new()),
        ] {
            let e = encode(&v, 7);
            assert_eq!(e.len(), ITEM_HEADER + v.payload_len());
            assert_eq!(decode(&e, 0), Decoded::Value(v));
        }
        // Not an item: UTF-8 is text, anything else bytes.
        assert_eq!(decode(b"plain", 0), Decoded::Value(KvValue::Text("plain".into())));
        assert_eq!(decode(&[0xff, 0], 0), Decoded::Value(KvValue::Bytes(vec![0xff, 0])));
        // A text-flagged item that is not UTF-8 is bytes, not a mangled string.
        let mut e = encode(&KvValue::Text("x".into()), 0);
        e.push(0xff);
        assert_eq!(decode(&e, 0), Decoded::Value(KvValue::Bytes(vec![b'x', 0xff])));
        // An item a memcached client gave an expiry: missing once it passed.
        let mut e = encode(&KvValue::Text("t".into()), 0);
        e[5..13].copy_from_slice(&100i64.to_le_bytes());
        assert_eq!(decode(&e, 99), Decoded::Value(KvValue::Text("t".into())));
        assert_eq!(decode(&e, 100), Decoded::Expired);
        assert_eq!(payload_max(1 << 20), (1 << 20) - 29);
    }

    proptest! {
        #[test]
        fn decode_is_total_and_bytes_round_trip(b in proptest::collection::vec(any::<u8>(), 0..200), t in any::<i64>()) {
            let _ = decode(&b, t);
            prop_assert_eq!(decode(&encode(&KvValue::Bytes(b.clone()), 1), 0), Decoded::Value(KvValue::Bytes(b)));
        }
    }
}
