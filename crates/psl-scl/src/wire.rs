//! Messages on the fabric. The fabric is untrusted: these bytes may be dropped, duplicated,
//! reordered, altered or forged. Records authenticate themselves; a repair request is only a
//! hint (answering it costs bandwidth, so answers are rate-limited).
//!
//! ```text
//! u8 version (1) | u8 type | [32] capsule name | payload
//!   type 1, record:          the record's bytes
//!   type 2, repair request:  u32 writer | u64 from_seq | u64 to_seq (inclusive)
//!                            [| u8 flags: 1 = origin only]     (20 or 21 bytes)
//!   type 3, heads hint:      u16 n | n × (u32 writer | u64 seq) [| u64 sender]  (n <= HEADS_MAX)
//!   type 4, ack:             u32 server | u16 n | n × (u32 writer | u64 from_seq | u64 to_seq
//!                            | [32] hash of to_seq) | [64] signature    (1 <= n <= ACK_ENTRIES_MAX)
//!   type 10, key statements:  a statement list as in a Cert record's body (writer certificates
//!                            and revocations, each signed by the application key)
//!   type 11, epoch wanted:   empty (exactly the prefix)
//! ```
//!
//! Key statements authenticate themselves like records (the application key signs each), so
//! anyone may relay them. In a capsule that certifies writers, every node and server announces
//! its own writers' certificates this way at start and then periodically, so that a process
//! that joins late, or missed a Cert record, learns the keys of writers (and servers, which
//! write no records) without reading the log first.
//!
//! An ack is a capsule server's signed statement "writer `writer`'s chain up to `to_seq`, whose
//! record `to_seq` has this hash, is on my disk, fsync'd" (`from_seq` only says which part the
//! fsync just covered). `server` is the writer index of the server's signing key (see
//! [`crate::server_writer`]); the signature is ECDSA secp256k1 over [`ack_digest`], which
//! covers every byte of the message before the signature, behind a domain tag, so that it can
//! never be mistaken for a record signature. See `docs/protocol/durability.md`.
//!
//! An epoch-wanted hint says "a node waits for the next epochs" (a `sync()` barrier). The
//! coordinators take it as activity: an idle capsule's coordinator opens its next epoch at the
//! busy pace instead of waiting out `epoch_idle_ms` (`crate::coordinator`, "Idle epochs").
//! It is unauthenticated and carries nothing: forged or replayed, it makes epochs run at the
//! pace a busy capsule runs them anyway.
//!
//! A heads hint says "I have applied these writers up to these seqs". It is unauthenticated,
//! so it never creates a gap (no withholding report can follow from it): it only makes the
//! receiver ask, at a bounded rate, for records it may lack. It closes the last path to
//! divergence: a record of a writer that crashed, which only some nodes received.

use psl_capsule::{CapsuleName, KeyStatement};
use psl_crypto::{sha256, Hash256, Signature, SigningKey, VerifyingKey};
use std::sync::Arc;

/// The wire format version, the first byte of every message (CapsuleDB's included).
pub const WIRE_VERSION: u8 = 1;
const TYPE_RECORD: u8 = 1;
const TYPE_REPAIR: u8 = 2;
const TYPE_HEADS: u8 = 3;
const TYPE_ACK: u8 = 4;
/// The repair request's optional flags byte: only the records' writer answers.
const REPAIR_ORIGIN_ONLY: u8 = 1;
/// Types 5 to 9 are CapsuleDB's (`crate::dbwire`).
const TYPE_CERTS: u8 = 10;
const TYPE_EPOCH_WANTED: u8 = 11;
/// Most entries in one ack.
pub const ACK_ENTRIES_MAX: usize = 1024;
const ACK_ENTRY_LEN: usize = 4 + 8 + 8 + 32;
/// Domain separation of ack signatures from record signatures.
const ACK_DOMAIN: &[u8] = b"psl-ack-v1";
/// Most entries in one heads hint.
pub const HEADS_MAX: usize = 4096;
const PREFIX_LEN: usize = 2 + 32;

/// A message on the fabric (wire types 1 to 4, 10 and 11; see the module docs for the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// A record's exact bytes (not yet verified).
    Record {
        /// The capsule the record claims to belong to.
        capsule: CapsuleName,
        /// The encoded record, undecoded.
        bytes: Arc<[u8]>,
    },
    /// Please re-send records `from_seq ..= to_seq` of `writer`. With `origin_only`, only the
    /// node that wrote them answers (a requester's first try; see `docs/protocol/scl.md` §6).
    Repair {
        /// The capsule whose records are asked for.
        capsule: CapsuleName,
        /// The writer whose records are asked for.
        writer: u32,
        /// The first seq asked for.
        from_seq: u64,
        /// The last seq asked for (inclusive; not below `from_seq`).
        to_seq: u64,
        /// Only the records' own writer's node should answer.
        origin_only: bool,
    },
    /// Hint: the sender has applied each `(writer, seq)` listed. `sender` (a node's random
    /// peer id) lets writers pace themselves to the peers that hint (flow control toward peer
    /// nodes, `NodeCore::flow_next`); capsule servers send none.
    Heads {
        /// The capsule the hint is about.
        capsule: CapsuleName,
        /// `(writer, seq)`: the newest seq of the writer the sender applied (at most
        /// [`HEADS_MAX`] entries).
        heads: Vec<(u32, u64)>,
        /// The sending node's random peer id (`None` from capsule servers).
        sender: Option<u64>,
    },
    /// A capsule server's signed durability ack (see the module documentation).
    Ack(Ack),
    /// Writer certificates and revocations (1 to `psl_capsule::certs::STATEMENTS_PER_RECORD_MAX`).
    Certs {
        /// The capsule the statements are for.
        capsule: CapsuleName,
        /// The statements, each signed by the application key.
        statements: Vec<KeyStatement>,
    },
    /// Hint: a node waits for the next epochs (see the module docs).
    EpochWanted {
        /// The capsule whose coordinator should open an epoch.
        capsule: CapsuleName,
    },
}

/// One acked range: writer `writer`'s records `from_seq ..= to_seq` are durable at the server,
/// and so is every earlier record of that writer (servers store chains in order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckEntry {
    /// The writer whose chain is acked.
    pub writer: u32,
    /// The first seq the server's latest fsync covered (informative only).
    pub from_seq: u64,
    /// The last seq acked (inclusive): the writer's chain up to it is durable at the server.
    pub to_seq: u64,
    /// Hash of record `to_seq`: the ack names the exact chain it covers.
    pub hash: Hash256,
}

/// A capsule server's signed durability ack (wire type 4; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The capsule whose records are acked.
    pub capsule: CapsuleName,
    /// The server's writer index (its key's BIP32 child index).
    pub server: u32,
    /// The acked ranges (1 to [`ACK_ENTRIES_MAX`]).
    pub entries: Vec<AckEntry>,
    /// The server's ECDSA signature over [`ack_digest`].
    pub signature: Signature,
}

/// What an ack's signature covers: SHA-256 over a domain tag, then the message bytes from the
/// version byte up to (not including) the signature.
pub fn ack_digest(capsule: &CapsuleName, server: u32, entries: &[AckEntry]) -> Hash256 {
    let body = ack_body(capsule, server, entries);
    sha256(&[ACK_DOMAIN, &body])
}

fn ack_body(capsule: &CapsuleName, server: u32, entries: &[AckEntry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(PREFIX_LEN + 6 + entries.len() * ACK_ENTRY_LEN + 64);
    b.push(WIRE_VERSION);
    b.push(TYPE_ACK);
    b.extend_from_slice(&capsule.0 .0);
    b.extend_from_slice(&server.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    for e in entries {
        b.extend_from_slice(&e.writer.to_le_bytes());
        b.extend_from_slice(&e.from_seq.to_le_bytes());
        b.extend_from_slice(&e.to_seq.to_le_bytes());
        b.extend_from_slice(&e.hash.0);
    }
    b
}

impl Ack {
    /// Signs `entries` (at most [`ACK_ENTRIES_MAX`], at least one) as server `server`.
    pub fn sign(capsule: CapsuleName, server: u32, entries: Vec<AckEntry>, key: &SigningKey) -> Ack {
        assert!(!entries.is_empty() && entries.len() <= ACK_ENTRIES_MAX, "callers split acks");
        let signature = key.sign(&ack_digest(&capsule, server, &entries));
        Ack { capsule, server, entries, signature }
    }

    /// Checks the signature against the server's public key.
    pub fn verify(&self, key: &VerifyingKey) -> bool {
        key.verify(&ack_digest(&self.capsule, self.server, &self.entries), &self.signature).is_ok()
    }
}

/// Why [`Msg::decode`] refused a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message (of this many bytes) is shorter than the 34-byte common prefix.
    #[error("message of {0} bytes is too short for its header")]
    Short(usize),
    /// The first byte (given) is not [`WIRE_VERSION`].
    #[error("unsupported message version {0}")]
    Version(u8),
    /// The type byte (given) is not 1 to 4 or 10 (CapsuleDB's 5 to 9 included: see
    /// [`crate::dbwire`]).
    #[error("unknown message type {0}")]
    Type(u8),
    /// A repair request's payload (of this many bytes) is neither 20 bytes nor 21 ending in
    /// flags 1.
    #[error("repair request payload is {0} bytes, expected 20, or 21 ending in flags 1")]
    RepairLen(usize),
    /// A repair request whose `to_seq` is below its `from_seq`.
    #[error("repair request range {from}..={to} is empty")]
    RepairRange {
        /// The request's `from_seq`.
        from: u64,
        /// The request's `to_seq`.
        to: u64,
    },
    /// A malformed heads hint: no count, over [`HEADS_MAX`] entries, or a length that does not
    /// match the count.
    #[error("heads hint: {0}")]
    Heads(&'static str),
    /// A malformed ack: too short, 0 or over [`ACK_ENTRIES_MAX`] entries, a length that does not
    /// match the count, or an empty range.
    #[error("ack: {0}")]
    Ack(&'static str),
    /// An epoch-wanted hint with a payload (it has none).
    #[error("epoch-wanted hint: {0} bytes after the prefix, want 0")]
    EpochWantedLen(usize),
    /// A key statement list that does not decode.
    #[error("key statements: {0}")]
    Certs(psl_capsule::DecodeError),
}

impl Msg {
    /// The capsule the message names.
    pub fn capsule(&self) -> CapsuleName {
        match self {
            Msg::Record { capsule, .. }
            | Msg::Repair { capsule, .. }
            | Msg::Heads { capsule, .. }
            | Msg::Certs { capsule, .. }
            | Msg::EpochWanted { capsule } => *capsule,
            Msg::Ack(a) => a.capsule,
        }
    }

    /// The message's bytes; panics on counts or ranges [`Msg::decode`] would refuse (a bug of
    /// the sender).
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
            Msg::Repair { capsule, writer, from_seq, to_seq, origin_only } => {
                assert!(from_seq <= to_seq, "a repair request names a non-empty range (the decoder refuses others)");
                b.push(TYPE_REPAIR);
                b.extend_from_slice(&capsule.0 .0);
                b.extend_from_slice(&writer.to_le_bytes());
                b.extend_from_slice(&from_seq.to_le_bytes());
                b.extend_from_slice(&to_seq.to_le_bytes());
                if *origin_only {
                    b.push(REPAIR_ORIGIN_ONLY);
                }
                assert_eq!(b.len(), PREFIX_LEN + 20 + usize::from(*origin_only), "repair request length");
            }
            Msg::Heads { capsule, heads, sender } => {
                assert!(heads.len() <= HEADS_MAX, "callers cap hints at HEADS_MAX");
                b.push(TYPE_HEADS);
                b.extend_from_slice(&capsule.0 .0);
                b.extend_from_slice(&(heads.len() as u16).to_le_bytes());
                for (w, s) in heads {
                    b.extend_from_slice(&w.to_le_bytes());
                    b.extend_from_slice(&s.to_le_bytes());
                }
                if let Some(id) = sender {
                    b.extend_from_slice(&id.to_le_bytes());
                }
                let want = PREFIX_LEN + 2 + 12 * heads.len() + if sender.is_some() { 8 } else { 0 };
                assert_eq!(b.len(), want, "heads hint length");
            }
            Msg::Ack(a) => {
                // What the decoder enforces: 1 to ACK_ENTRIES_MAX entries, each a non-empty range.
                assert!(
                    !a.entries.is_empty() && a.entries.len() <= ACK_ENTRIES_MAX,
                    "an ack holds 1 to ACK_ENTRIES_MAX entries (Ack::sign checks; callers split acks)"
                );
                debug_assert!(a.entries.iter().all(|e| e.from_seq <= e.to_seq), "an ack entry names a non-empty range");
                b = ack_body(&a.capsule, a.server, &a.entries);
                b.extend_from_slice(&a.signature.0);
                assert_eq!(b.len(), PREFIX_LEN + 6 + ACK_ENTRY_LEN * a.entries.len() + 64, "ack length");
            }
            Msg::Certs { capsule, statements } => {
                b.push(TYPE_CERTS);
                b.extend_from_slice(&capsule.0 .0);
                // `encode_list` asserts the statement count the decoder accepts.
                b.extend_from_slice(&KeyStatement::encode_list(statements));
            }
            Msg::EpochWanted { capsule } => {
                b.push(TYPE_EPOCH_WANTED);
                b.extend_from_slice(&capsule.0 .0);
            }
        }
        // Every message leaves as our own decoder reads it (a full decode: debug builds only).
        debug_assert!(Msg::decode(&b).as_ref() == Ok(self), "an encoded message must decode to itself");
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
                let origin_only = match p.get(20) {
                    None if p.len() == 20 => false,
                    Some(&REPAIR_ORIGIN_ONLY) if p.len() == 21 => true,
                    _ => return Err(WireError::RepairLen(p.len())),
                };
                let writer = u32::from_le_bytes(p[0..4].try_into().expect("4 bytes"));
                let from_seq = u64::from_le_bytes(p[4..12].try_into().expect("8 bytes"));
                let to_seq = u64::from_le_bytes(p[12..20].try_into().expect("8 bytes"));
                if to_seq < from_seq {
                    return Err(WireError::RepairRange { from: from_seq, to: to_seq });
                }
                Ok(Msg::Repair { capsule, writer, from_seq, to_seq, origin_only })
            }
            TYPE_HEADS => {
                if p.len() < 2 {
                    return Err(WireError::Heads("missing count"));
                }
                let n = u16::from_le_bytes([p[0], p[1]]) as usize;
                if n > HEADS_MAX {
                    return Err(WireError::Heads("too many entries"));
                }
                let sender = match p.len().checked_sub(2 + 12 * n) {
                    Some(0) => None,
                    Some(8) => Some(u64::from_le_bytes(p[p.len() - 8..].try_into().expect("8 bytes"))),
                    _ => return Err(WireError::Heads("length does not match the count")),
                };
                let heads = p[2..2 + 12 * n]
                    .chunks_exact(12)
                    .map(|c| {
                        (
                            u32::from_le_bytes(c[0..4].try_into().expect("4 bytes")),
                            u64::from_le_bytes(c[4..12].try_into().expect("8 bytes")),
                        )
                    })
                    .collect();
                Ok(Msg::Heads { capsule, heads, sender })
            }
            TYPE_ACK => {
                if p.len() < 6 + 64 {
                    return Err(WireError::Ack("too short"));
                }
                let server = u32::from_le_bytes(p[0..4].try_into().expect("4 bytes"));
                let n = u16::from_le_bytes([p[4], p[5]]) as usize;
                if n == 0 || n > ACK_ENTRIES_MAX {
                    return Err(WireError::Ack("entry count out of range"));
                }
                if p.len() != 6 + ACK_ENTRY_LEN * n + 64 {
                    return Err(WireError::Ack("length does not match the count"));
                }
                let mut entries = Vec::with_capacity(n);
                for c in p[6..6 + ACK_ENTRY_LEN * n].chunks_exact(ACK_ENTRY_LEN) {
                    let writer = u32::from_le_bytes(c[0..4].try_into().expect("4 bytes"));
                    let from_seq = u64::from_le_bytes(c[4..12].try_into().expect("8 bytes"));
                    let to_seq = u64::from_le_bytes(c[12..20].try_into().expect("8 bytes"));
                    if to_seq < from_seq {
                        return Err(WireError::Ack("empty range"));
                    }
                    let mut hash = [0u8; 32];
                    hash.copy_from_slice(&c[20..52]);
                    entries.push(AckEntry { writer, from_seq, to_seq, hash: Hash256(hash) });
                }
                let mut sig = [0u8; 64];
                sig.copy_from_slice(&p[p.len() - 64..]);
                Ok(Msg::Ack(Ack { capsule, server, entries, signature: Signature(sig) }))
            }
            TYPE_CERTS => {
                let statements = KeyStatement::decode_list(p).map_err(WireError::Certs)?;
                Ok(Msg::Certs { capsule, statements })
            }
            TYPE_EPOCH_WANTED if p.is_empty() => Ok(Msg::EpochWanted { capsule }),
            TYPE_EPOCH_WANTED => Err(WireError::EpochWantedLen(p.len())),
            t => Err(WireError::Type(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ack_signature_covers_every_field() {
        let owner = psl_crypto::OwnerKey::generate();
        let app = owner.app(1).unwrap();
        let w = crate::server_writer(2).unwrap();
        let key = app.writer(w).unwrap();
        let capsule = CapsuleName(Hash256([7; 32]));
        let e = AckEntry { writer: 0x10000, from_seq: 3, to_seq: 9, hash: Hash256([1; 32]) };
        let ack = Ack::sign(capsule, w, vec![e], &key);
        let pk = app.public().writer(w).unwrap();
        assert!(ack.verify(&pk));
        let Msg::Ack(back) = Msg::decode(&Msg::Ack(ack.clone()).encode()).unwrap() else { panic!("an ack") };
        assert!(back.verify(&pk));
        for m in [
            Ack { server: w + 1, ..ack.clone() },
            Ack { capsule: CapsuleName(Hash256([8; 32])), ..ack.clone() },
            Ack { entries: vec![AckEntry { to_seq: 10, ..e }], ..ack.clone() },
            Ack { entries: vec![AckEntry { hash: Hash256([2; 32]), ..e }], ..ack.clone() },
        ] {
            assert!(!m.verify(&pk));
        }
        // Another server's key does not verify it.
        assert!(!ack.verify(&app.public().writer(w + 1).unwrap()));
    }

    #[test]
    fn key_statements_round_trip() {
        let owner = psl_crypto::OwnerKey::from_seed(&[4; 32]).unwrap();
        let app = owner.app(1).unwrap();
        let capsule = CapsuleName(Hash256([7; 32]));
        let statements = vec![
            KeyStatement::Cert(psl_capsule::WriterCert::issue(&app, capsule, 0, 0x10000, 0).unwrap()),
            KeyStatement::Revoke(psl_capsule::Revocation::issue(&app, capsule, 0, 0x10001, 4, 17).unwrap()),
        ];
        let m = Msg::Certs { capsule, statements };
        assert_eq!(Msg::decode(&m.encode()), Ok(m.clone()));
        let bytes = m.encode();
        assert!(Msg::decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn repair_requests_carry_an_optional_origin_only_flag_and_refuse_other_flags() {
        let capsule = CapsuleName(Hash256([7; 32]));
        let any = Msg::Repair { capsule, writer: 3, from_seq: 5, to_seq: 9, origin_only: false };
        let origin = Msg::Repair { capsule, writer: 3, from_seq: 5, to_seq: 9, origin_only: true };
        assert_eq!(any.encode().len(), 34 + 20);
        assert_eq!(origin.encode().len(), 34 + 21);
        assert_eq!(Msg::decode(&origin.encode()), Ok(origin.clone()));
        for flags in [0u8, 2, 255] {
            let mut b = any.encode();
            b.push(flags);
            assert_eq!(Msg::decode(&b), Err(WireError::RepairLen(21)));
        }
        let mut b = origin.encode();
        b.push(1);
        assert_eq!(Msg::decode(&b), Err(WireError::RepairLen(22)));
    }

    #[test]
    #[should_panic(expected = "non-empty range")]
    fn encoding_an_empty_repair_range_is_a_bug() {
        let capsule = CapsuleName(Hash256([7; 32]));
        let _ = Msg::Repair { capsule, writer: 1, from_seq: 5, to_seq: 4, origin_only: false }.encode();
    }

    #[test]
    #[should_panic(expected = "1 to ACK_ENTRIES_MAX")]
    fn encoding_an_ack_without_entries_is_a_bug() {
        let capsule = CapsuleName(Hash256([7; 32]));
        let _ = Msg::Ack(Ack { capsule, server: 1, entries: Vec::new(), signature: Signature([0; 64]) }).encode();
    }

    #[test]
    fn decoders_name_each_bound_they_refuse() {
        let capsule = CapsuleName(Hash256([7; 32]));
        let prefix = |t: u8| {
            let mut b = vec![WIRE_VERSION, t];
            b.extend_from_slice(&capsule.0 .0);
            b
        };
        // Repair: an empty range.
        let mut b = prefix(TYPE_REPAIR);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&5u64.to_le_bytes());
        b.extend_from_slice(&4u64.to_le_bytes());
        assert_eq!(Msg::decode(&b), Err(WireError::RepairRange { from: 5, to: 4 }));
        // Heads: over HEADS_MAX, and a count the bytes do not hold.
        let mut b = prefix(TYPE_HEADS);
        b.extend_from_slice(&(HEADS_MAX as u16 + 1).to_le_bytes());
        assert_eq!(Msg::decode(&b), Err(WireError::Heads("too many entries")));
        let mut b = prefix(TYPE_HEADS);
        b.extend_from_slice(&2u16.to_le_bytes());
        b.extend_from_slice(&[0; 12]);
        assert_eq!(Msg::decode(&b), Err(WireError::Heads("length does not match the count")));
        // Ack: no entries, and an entry with an empty range.
        let mut b = prefix(TYPE_ACK);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&[0; 64]);
        assert_eq!(Msg::decode(&b), Err(WireError::Ack("entry count out of range")));
        let mut b = prefix(TYPE_ACK);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&9u64.to_le_bytes());
        b.extend_from_slice(&8u64.to_le_bytes());
        b.extend_from_slice(&[0; 32 + 64]);
        assert_eq!(Msg::decode(&b), Err(WireError::Ack("empty range")));
        // Epoch wanted: anything after the prefix.
        let mut b = prefix(TYPE_EPOCH_WANTED);
        assert_eq!(Msg::decode(&b), Ok(Msg::EpochWanted { capsule }));
        b.push(0);
        assert_eq!(Msg::decode(&b), Err(WireError::EpochWantedLen(1)));
    }

    proptest! {
        #[test]
        fn round_trip(name in any::<[u8; 32]>(), bytes in proptest::collection::vec(any::<u8>(), 0..300), w in any::<u32>(), a in any::<u64>(), n in 0u64..1000) {
            let capsule = CapsuleName(Hash256(name));
            let heads: Vec<(u32, u64)> = bytes.iter().map(|b| ((*b as u32).wrapping_mul(w), a ^ *b as u64)).collect();
            for m in [Msg::Record { capsule, bytes: bytes.clone().into() }, Msg::Repair { capsule, writer: w, from_seq: a / 2, to_seq: a / 2 + n, origin_only: n % 2 == 0 }, Msg::Heads { capsule, heads: heads.clone(), sender: None }, Msg::Heads { capsule, heads, sender: Some(a) }, Msg::EpochWanted { capsule }] {
                prop_assert_eq!(Msg::decode(&m.encode()), Ok(m));
            }
        }

        #[test]
        fn ack_round_trip(name in any::<[u8; 32]>(), server in any::<u32>(), raw in proptest::collection::vec((any::<u32>(), any::<u64>(), 0u64..1000, any::<[u8; 32]>()), 1..40), sig in proptest::collection::vec(any::<u8>(), 64)) {
            let capsule = CapsuleName(Hash256(name));
            let entries: Vec<AckEntry> = raw.iter().map(|(w, a, n, h)| AckEntry { writer: *w, from_seq: a / 2, to_seq: a / 2 + n, hash: Hash256(*h) }).collect();
            let mut s = [0u8; 64];
            s.copy_from_slice(&sig);
            let m = Msg::Ack(Ack { capsule, server, entries, signature: Signature(s) });
            let bytes = m.encode();
            prop_assert_eq!(bytes.len(), 34 + 6 + 52 * raw.len() + 64);
            prop_assert_eq!(Msg::decode(&bytes), Ok(m));
            // Any truncation is refused, never a panic.
            for cut in [1usize, 2, 52, 64] {
                if cut < bytes.len() {
                    prop_assert!(Msg::decode(&bytes[..bytes.len() - cut]).is_err());
                }
            }
        }

        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = Msg::decode(&bytes);
        }
    }
}
