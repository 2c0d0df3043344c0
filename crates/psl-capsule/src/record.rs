//! The record: header, sealed body, signature. See `docs/formats/datacapsule.md` for the layout.

use crate::codec::{DecodeError, Put, Reader};
use crate::limits::Limits;
use crate::meta::CapsuleName;
use psl_crypto::{sha256, Hash256, Signature, SALT_LEN, SIGNATURE_LEN};
use std::sync::Arc;

/// The record encoding version, byte 0 of every record; the decoder refuses any other.
pub const RECORD_VERSION: u8 = 1;
/// Bytes of a header with no links.
pub const HEADER_FIXED_LEN: usize = 116;
/// Bytes of one link.
pub const LINK_LEN: usize = 44;
const HASH_DOMAIN: &[u8] = b"psl/record/v1";

/// A record's kind (header byte 1), which fixes its body layout and who may write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum Kind {
    /// A batch of key-value ops; its links may name only the coordinator's SYNC of its epoch.
    Data = 1,
    /// A SYNC, written only by a coordinator, linking each writer's last record of the epoch.
    Sync = 2,
    /// A control message (RTS, EOE, RESET, ROTATE): a code and a payload.
    Control = 3,
    /// A CapsuleDB block.
    DbBlock = 4,
    /// A CapsuleDB index.
    DbIndex = 5,
    /// Writer certificates and revocations ([`crate::certs`]): the one kind whose body is
    /// stored in the clear, so that verifiers without the data key learn writer keys.
    Cert = 6,
}

impl Kind {
    /// The kind of a header's kind byte; `None` for a byte outside 1 to 6.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Sync,
            3 => Kind::Control,
            4 => Kind::DbBlock,
            5 => Kind::DbIndex,
            6 => Kind::Cert,
            _ => return None,
        })
    }

    /// Whether bodies of this kind are stored in the clear rather than sealed: only
    /// [`Kind::Cert`], whose statements are public keys and signatures meant for every verifier.
    pub fn is_public(self) -> bool {
        self == Kind::Cert
    }

    /// The kind's stable kebab-case name (`data`, `sync`, `control`, `db-block`, `db-index`,
    /// `cert`), as printed and serialized.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Data => "data",
            Kind::Sync => "sync",
            Kind::Control => "control",
            Kind::DbBlock => "db-block",
            Kind::DbIndex => "db-index",
            Kind::Cert => "cert",
        }
    }
}

/// A hash pointer to another record, naming its writer and seq so that a reader can check
/// the target without fetching it first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Link {
    /// Writer index of the target record.
    pub writer: u32,
    /// Seq of the target record in its writer's chain.
    pub seq: u64,
    /// Record hash of the target (see [`record_hash`]).
    pub hash: Hash256,
}

/// The plaintext, signed header of a record. Its encoding is the AEAD's associated data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The record's kind.
    pub kind: Kind,
    /// Name of the capsule the record belongs to; the verifier refuses any other.
    pub capsule: CapsuleName,
    /// Writer index `w < 2^31`. The signing key is the BIP32 child `m/a'/w` (derived writer
    /// keys) or the hardened child `m/a'/w'` (certified writer keys).
    pub writer: u32,
    /// Generation of the application key whose writer key signed the record and whose data key
    /// sealed its body (0 = the key named in the metadata).
    pub key_gen: u32,
    /// Per-writer sequence number, dense from 0.
    pub seq: u64,
    /// Lamport timestamp: of the last op for data records (checked against the body); for other
    /// kinds, the writer's clock when it wrote the record.
    pub lamport: u64,
    /// Number of the newest SYNC the writer had seen.
    pub epoch: u64,
    /// Random salt from which the body's one-time key is derived.
    pub salt: [u8; SALT_LEN],
    /// Hash of this writer's record `seq - 1`; zero when `seq == 0`.
    pub prev: Hash256,
    /// Other hash pointers: for a SYNC, each writer's last record of the epoch; for the first
    /// record of a writer in an epoch, the SYNC that opened it.
    pub links: Vec<Link>,
}

impl Header {
    /// Bytes of the encoded header: `116 + 44 × links`.
    pub fn encoded_len(&self) -> usize {
        HEADER_FIXED_LEN + LINK_LEN * self.links.len()
    }

    pub(crate) fn encode_into(&self, b: &mut Vec<u8>) {
        assert!(self.links.len() <= u16::MAX as usize, "links are checked against limits before encoding");
        let start = b.len();
        b.put_u8(RECORD_VERSION);
        b.put_u8(self.kind as u8);
        b.put_u16(self.links.len() as u16);
        b.extend_from_slice(&self.capsule.0 .0);
        b.put_u32(self.writer);
        b.put_u32(self.key_gen);
        b.put_u64(self.seq);
        b.put_u64(self.lamport);
        b.put_u64(self.epoch);
        b.extend_from_slice(&self.salt);
        b.extend_from_slice(&self.prev.0);
        for l in &self.links {
            b.put_u32(l.writer);
            b.put_u64(l.seq);
            b.extend_from_slice(&l.hash.0);
        }
        assert_eq!(b.len() - start, self.encoded_len(), "header encoding length");
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>, limits: &Limits) -> Result<Header, DecodeError> {
        let v = r.u8("record version")?;
        if v != RECORD_VERSION {
            return Err(DecodeError::Version { what: "record", found: v, supported: RECORD_VERSION });
        }
        let k = r.u8("record kind")?;
        let kind = Kind::from_u8(k).ok_or(DecodeError::Tag { field: "record kind", value: k as u64 })?;
        let nlinks = r.u16("link count")? as u64;
        if nlinks > limits.links_per_record_max as u64 {
            return Err(DecodeError::Limit {
                field: "link count",
                len: nlinks,
                max: limits.links_per_record_max as u64,
            });
        }
        let capsule = CapsuleName(Hash256(r.array("capsule")?));
        let writer = r.u32("writer")?;
        let key_gen = r.u32("key generation")?;
        let seq = r.u64("seq")?;
        let lamport = r.u64("lamport")?;
        let epoch = r.u64("epoch")?;
        let salt = r.array("salt")?;
        let prev = Hash256(r.array("prev")?);
        // The count is bounded above and each link is read from bytes already present.
        let need = nlinks as usize * LINK_LEN;
        if r.remaining() < need {
            return Err(DecodeError::Truncated { field: "links", offset: r.pos(), need, have: r.remaining() });
        }
        let mut links = Vec::with_capacity(nlinks as usize);
        for _ in 0..nlinks {
            links.push(Link {
                writer: r.u32("link writer")?,
                seq: r.u64("link seq")?,
                hash: Hash256(r.array("link hash")?),
            });
        }
        Ok(Header { kind, capsule, writer, key_gen, seq, lamport, epoch, salt, prev, links })
    }

    /// Decodes a header that must fill `bytes` exactly.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Header, DecodeError> {
        let mut r = Reader::new(bytes);
        let h = Header::decode_from(&mut r, limits)?;
        r.finish("header")?;
        Ok(h)
    }
}

/// The record hash: `SHA-256("psl/record/v1" || header || u32 body_len || SHA-256(body))`.
/// Hashing the body's digest rather than the body lets a membership proof carry only headers.
pub fn record_hash(header_bytes: &[u8], body_len: u32, body_digest: &Hash256) -> Hash256 {
    sha256(&[HASH_DOMAIN, header_bytes, &body_len.to_le_bytes(), &body_digest.0])
}

/// A decoded record: its exact bytes, the parsed header and its hash. Decoding checks only the
/// encoding; a `Record` has not been verified (see [`crate::Verifier`]).
#[derive(Clone)]
pub struct Record {
    raw: Arc<[u8]>,
    header: Header,
    header_len: usize,
    body_len: usize,
    body_digest: Hash256,
    hash: Hash256,
}

/// A decoded record but for its bytes.
struct Parts {
    header: Header,
    header_len: usize,
    body_len: usize,
    body_digest: Hash256,
    hash: Hash256,
}

impl Parts {
    fn with_raw(self, raw: Arc<[u8]>) -> Record {
        let Parts { header, header_len, body_len, body_digest, hash } = self;
        Record { raw, header, header_len, body_len, body_digest, hash }
    }
}

/// A record assembled but for its signature ([`Record::assemble_unsigned`]): its hash is
/// final (it does not cover the signature), so the next record of the chain can link to it
/// before it is signed.
pub(crate) struct Unsigned {
    /// Header, body length and body; the signature's 64 bytes are reserved, not written.
    raw: Vec<u8>,
    parts: Parts,
}

impl Unsigned {
    /// The record hash, the digest the signature is over.
    pub(crate) fn hash(&self) -> Hash256 {
        self.parts.hash
    }

    /// Bytes of the record once signed.
    pub(crate) fn signed_len(&self) -> usize {
        self.raw.len() + SIGNATURE_LEN
    }

    /// The second stage of `Record::assemble`: appends `sig` (over [`Unsigned::hash`]).
    /// Asserts a record within [`Limits::CEILING`] and (debug builds) that the bytes decode to
    /// this header and hash.
    pub(crate) fn finish(self, sig: Signature) -> Record {
        let Unsigned { mut raw, parts } = self;
        raw.extend_from_slice(&sig.0);
        assert!(raw.len() <= Limits::CEILING.record_bytes_max as usize, "a record over every capsule's limit");
        debug_assert!(
            Record::decode_parts(&raw, &Limits::CEILING)
                .is_ok_and(|p| p.header == parts.header && p.header_len == parts.header_len && p.hash == parts.hash),
            "an assembled record must decode to its header and hash"
        );
        parts.with_raw(raw.into())
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Record({} {} w{} s{} {} B)",
            self.hash.short(),
            self.header.kind.name(),
            self.header.writer,
            self.header.seq,
            self.raw.len()
        )
    }
}

impl PartialEq for Record {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}
impl Eq for Record {}

impl Record {
    /// Assembles a record from a header, a sealed body and a signature (tests; writers go
    /// through the two stages, [`Record::assemble_unsigned`] then [`Unsigned::finish`]).
    ///
    /// The caller (`Draft::seal`) has checked the capsule's limits; what is asserted here is
    /// what every reader checks whatever the capsule: the chain rule the verifier applies
    /// (seq 0 has a zero `prev`, every later seq a non-zero one), a non-hardened writer index,
    /// a body length its u32 field holds, a record within [`Limits::CEILING`], and (debug
    /// builds) that the bytes decode to this header and hash. Two stages since the hash does
    /// not cover the signature: a writer may hash a run of records in chain order and sign them
    /// afterwards.
    #[cfg(test)]
    pub(crate) fn assemble(header: Header, body: &[u8], signature_of: impl FnOnce(&Hash256) -> Signature) -> Record {
        let unsigned = Record::assemble_unsigned(header, body);
        let sig = signature_of(&unsigned.hash());
        unsigned.finish(sig)
    }

    /// The first stage of `Record::assemble`: the bytes but for the signature, and the record
    /// hash. Asserts the chain rule, the writer index and the body length.
    pub(crate) fn assemble_unsigned(header: Header, body: &[u8]) -> Unsigned {
        assert_eq!(header.seq == 0, header.prev.is_zero(), "seq 0 has a zero prev, every later seq a non-zero one");
        assert!(header.writer < 1 << 31, "a record's writer is a non-hardened child index");
        assert!(body.len() <= u32::MAX as usize, "record body length does not fit its u32 field");
        let header_len = header.encoded_len();
        let mut raw = Vec::with_capacity(header_len + 4 + body.len() + SIGNATURE_LEN);
        header.encode_into(&mut raw);
        debug_assert_eq!(raw.len(), header_len);
        raw.put_u32(body.len() as u32);
        raw.extend_from_slice(body);
        let body_digest = sha256(&[body]);
        let hash = record_hash(&raw[..header_len], body.len() as u32, &body_digest);
        Unsigned { raw, parts: Parts { header, header_len, body_len: body.len(), body_digest, hash } }
    }

    /// Decodes exactly `bytes` as one record under `limits`. Never panics; allocates only the
    /// links vector (bounded by `links_per_record_max`) and one copy of `bytes`.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Record, DecodeError> {
        Record::decode_parts(bytes, limits).map(|p| p.with_raw(bytes.into()))
    }

    /// Like [`Record::decode`], keeping `bytes` as the record's bytes (no copy).
    pub fn decode_shared(bytes: Arc<[u8]>, limits: &Limits) -> Result<Record, DecodeError> {
        Record::decode_parts(&bytes, limits).map(|p| p.with_raw(bytes.clone()))
    }

    fn decode_parts(bytes: &[u8], limits: &Limits) -> Result<Parts, DecodeError> {
        if bytes.len() as u64 > limits.record_bytes_max as u64 {
            return Err(DecodeError::Limit {
                field: "record",
                len: bytes.len() as u64,
                max: limits.record_bytes_max as u64,
            });
        }
        let mut r = Reader::new(bytes);
        let header = Header::decode_from(&mut r, limits)?;
        let header_len = r.pos();
        let body_len = r.u32("body length")? as u64;
        let body = r.bounded(body_len, limits.record_bytes_max as u64, "body")?;
        let _sig: [u8; SIGNATURE_LEN] = r.array("signature")?;
        r.finish("record")?;
        let body_digest = sha256(&[body]);
        let hash = record_hash(&bytes[..header_len], body.len() as u32, &body_digest);
        Ok(Parts { header, header_len, body_len: body.len(), body_digest, hash })
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The record hash, its identity: covers the header, body length and body digest, not the
    /// signature (see [`record_hash`]).
    pub fn hash(&self) -> Hash256 {
        self.hash
    }

    /// The exact bytes of the record, as signed and stored.
    pub fn bytes(&self) -> &[u8] {
        &self.raw
    }

    /// The record's exact bytes as a shared buffer (a reference count, no copy).
    pub fn shared_bytes(&self) -> Arc<[u8]> {
        self.raw.clone()
    }

    /// The header's encoding: the AEAD's associated data.
    pub fn header_bytes(&self) -> &[u8] {
        &self.raw[..self.header_len]
    }

    /// The sealed body (ciphertext followed by the GCM tag); for a public kind, the plaintext.
    pub fn body(&self) -> &[u8] {
        &self.raw[self.header_len + 4..self.header_len + 4 + self.body_len]
    }

    /// SHA-256 of the body as stored (sealed, or clear for a Cert record), as the record hash uses it.
    pub fn body_digest(&self) -> Hash256 {
        self.body_digest
    }

    /// Length of the body as stored, in bytes (for a sealed body, ciphertext plus 16-byte tag).
    pub fn body_len(&self) -> u32 {
        self.body_len as u32
    }

    /// The writer's 64-byte compact ECDSA signature over the record hash (the last 64 bytes);
    /// not checked here.
    pub fn signature(&self) -> Signature {
        let mut s = [0u8; SIGNATURE_LEN];
        s.copy_from_slice(&self.raw[self.raw.len() - SIGNATURE_LEN..]);
        Signature(s)
    }

    /// The link this record's successor (or a SYNC) uses to point at it.
    pub fn link(&self) -> Link {
        Link { writer: self.header.writer, seq: self.header.seq, hash: self.hash }
    }

    /// The key-derivation context for the body: capsule, writer, seq.
    pub(crate) fn seal_context(capsule: &CapsuleName, writer: u32, seq: u64) -> [u8; 44] {
        let mut c = [0u8; 44];
        c[..32].copy_from_slice(&capsule.0 .0);
        c[32..36].copy_from_slice(&writer.to_le_bytes());
        c[36..].copy_from_slice(&seq.to_le_bytes());
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(seq: u64, prev: Hash256) -> Header {
        Header {
            kind: Kind::Data,
            capsule: CapsuleName(Hash256([1; 32])),
            writer: 5,
            key_gen: 0,
            seq,
            lamport: 1,
            epoch: 0,
            salt: [2; SALT_LEN],
            prev,
            links: vec![Link { writer: 9, seq: 3, hash: Hash256([4; 32]) }],
        }
    }

    #[test]
    fn an_assembled_record_decodes_to_its_header_and_hash() {
        let r = Record::assemble(header(1, Hash256([3; 32])), b"body", |_| Signature([7; SIGNATURE_LEN]));
        let back = Record::decode(r.bytes(), &Limits::default()).unwrap();
        assert_eq!((back.header(), back.hash(), back.body()), (r.header(), r.hash(), &b"body"[..]));
    }

    #[test]
    #[should_panic(expected = "seq 0 has a zero prev")]
    fn assembling_seq_0_with_a_prev_is_a_bug() {
        let _ = Record::assemble(header(0, Hash256([3; 32])), b"body", |_| Signature([7; SIGNATURE_LEN]));
    }

    #[test]
    #[should_panic(expected = "seq 0 has a zero prev")]
    fn assembling_a_later_seq_without_a_prev_is_a_bug() {
        let _ = Record::assemble(header(4, Hash256::ZERO), b"body", |_| Signature([7; SIGNATURE_LEN]));
    }

    #[test]
    #[should_panic(expected = "non-hardened")]
    fn assembling_a_hardened_writer_is_a_bug() {
        let h = Header { writer: 1 << 31, ..header(0, Hash256::ZERO) };
        let _ = Record::assemble(h, b"body", |_| Signature([7; SIGNATURE_LEN]));
    }
}
