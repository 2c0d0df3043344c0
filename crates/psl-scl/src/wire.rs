//! Messages on the fabric. The fabric is untrusted: these bytes may be dropped, duplicated,
//! reordered, altered or forged. Records authenticate themselves; a repair request is only a
//! hint (answering it costs bandwidth, so answers are rate-limited).
//!
//! ```text
//! u8 version (1) | u8 type | [32] capsule name | payload
//!   type 1, record:          the record's bytes
//!   type 2, repair request:  u32 writer | u64 from_seq | u64 to_seq (inclusive)
//!   type 3, heads hint:      u16 n | n × (u32 writer | u64 seq)     (n <= HEADS_MAX)
//! ```
//!
//! A heads hint says "I have applied these writers up to these seqs". It is unauthenticated,
//! so it never creates a gap (no withholding report can follow from it): it only makes the
//! receiver ask, at a bounded rate, for records it may lack. It closes the last path to
//! divergence: a record of a writer that crashed, which only some nodes received.

use psl_capsule::CapsuleName;
use psl_crypto::Hash256;
use std::sync::Arc;

pub const WIRE_VERSION: u8 = 1;
const TYPE_RECORD: u8 = 1;
const TYPE_REPAIR: u8 = 2;
const TYPE_HEADS: u8 = 3;
/// Most entries in one heads hint.
pub const HEADS_MAX: usize = 4096;
const PREFIX_LEN: usize = 2 + 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// A record's exact bytes (not yet verified).
    Record { capsule: CapsuleName, bytes: Arc<[u8]> },
    /// Please re-send records `from_seq ..= to_seq` of `writer`.
    Repair { capsule: CapsuleName, writer: u32, from_seq: u64, to_seq: u64 },
    /// Hint: the sender has applied each `(writer, seq)` listed.
    Heads { capsule: CapsuleName, heads: Vec<(u32, u64)> },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message of {0} bytes is too short for its header")]
    Short(usize),
    #[error("unsupported message version {0}")]
    Version(u8),
    #[error("unknown message type {0}")]
    Type(u8),
    #[error("repair request payload is {0} bytes, expected 20")]
    RepairLen(usize),
    #[error("repair request range {from}..={to} is empty")]
    RepairRange { from: u64, to: u64 },
    #[error("heads hint: {0}")]
    Heads(&'static str),
}

impl Msg {
    pub fn capsule(&self) -> CapsuleName {
        match self {
            Msg::Record { capsule, .. } | Msg::Repair { capsule, .. } | Msg::Heads { capsule, .. } => *capsule,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(PREFIX_LEN + 32);
        b.push(WIRE_VERSION);
        match self {
            Msg::Record { capsule, bytes } => {
                b.reserve(bytes.len());
                b.push(TYPE_RECORD);
                b.extend_from_slice(&capsule.0 .0);
                b.extend_from_slice(bytes);
            }
            Msg::Repair { capsule, writer, from_seq, to_seq } => {
                b.push(TYPE_REPAIR);
                b.extend_from_slice(&capsule.0 .0);
                b.extend_from_slice(&writer.to_le_bytes());
                b.extend_from_slice(&from_seq.to_le_bytes());
                b.extend_from_slice(&to_seq.to_le_bytes());
            }
            Msg::Heads { capsule, heads } => {
                assert!(heads.len() <= HEADS_MAX, "callers cap hints at HEADS_MAX");
                b.push(TYPE_HEADS);
                b.extend_from_slice(&capsule.0 .0);
                b.extend_from_slice(&(heads.len() as u16).to_le_bytes());
                for (w, s) in heads {
                    b.extend_from_slice(&w.to_le_bytes());
                    b.extend_from_slice(&s.to_le_bytes());
                }
            }
        }
        b
    }

    /// Decodes a message. The record payload is not decoded here (the verifier does that,
    /// under the capsule's limits); its size is bounded by the fabric's frame limit.
    pub fn decode(b: &[u8]) -> Result<Msg, WireError> {
        if b.len() < PREFIX_LEN {
            return Err(WireError::Short(b.len()));
        }
        if b[0] != WIRE_VERSION {
            return Err(WireError::Version(b[0]));
        }
        let mut name = [0u8; 32];
        name.copy_from_slice(&b[2..34]);
        let capsule = CapsuleName(Hash256(name));
        let p = &b[PREFIX_LEN..];
        match b[1] {
            TYPE_RECORD => Ok(Msg::Record { capsule, bytes: p.into() }),
            TYPE_REPAIR => {
                if p.len() != 20 {
                    return Err(WireError::RepairLen(p.len()));
                }
                let writer = u32::from_le_bytes(p[0..4].try_into().expect("4 bytes"));
                let from_seq = u64::from_le_bytes(p[4..12].try_into().expect("8 bytes"));
                let to_seq = u64::from_le_bytes(p[12..20].try_into().expect("8 bytes"));
                if to_seq < from_seq {
                    return Err(WireError::RepairRange { from: from_seq, to: to_seq });
                }
                Ok(Msg::Repair { capsule, writer, from_seq, to_seq })
            }
            TYPE_HEADS => {
                if p.len() < 2 {
                    return Err(WireError::Heads("missing count"));
                }
                let n = u16::from_le_bytes([p[0], p[1]]) as usize;
                if n > HEADS_MAX {
                    return Err(WireError::Heads("too many entries"));
                }
                if p.len() != 2 + 12 * n {
                    return Err(WireError::Heads("length does not match the count"));
                }
                let heads = p[2..]
                    .chunks_exact(12)
                    .map(|c| {
                        (
                            u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")),
                            u64::from_le_bytes(c[4..12].try_into().expect("8 bytes")),
                        )
                    })
                    .collect();
                Ok(Msg::Heads { capsule, heads })
            }
            t => Err(WireError::Type(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(name in any::<[u8; 32]>(), bytes in proptest::collection::vec(any::<u8>(), 0..300), w in any::<u32>(), a in any::<u64>(), n in 0u64..1000) {
            let capsule = CapsuleName(Hash256(name));
            let heads: Vec<(u32, u64)> = bytes.iter().map(|b| ((*b as u32).wrapping_mul(w), a ^ *b as u64)).collect();
            for m in [Msg::Record { capsule, bytes: bytes.clone().into() }, Msg::Repair { capsule, writer: w, from_seq: a / 2, to_seq: a / 2 + n }, Msg::Heads { capsule, heads }] {
                prop_assert_eq!(Msg::decode(&m.encode()), Ok(m));
            }
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = Msg::decode(&bytes);
        }
    }
}
